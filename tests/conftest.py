"""Shared fixtures: example specs, tools from the distribution, free loopback ports."""

from __future__ import annotations

import shutil
import socket
from pathlib import Path

import pytest

from pdscale.spec import Spec, load_spec

ROOT = Path(__file__).resolve().parent.parent
EXAMPLES = sorted((ROOT / "examples").glob("*.yaml"))
SHARED = ROOT.parent / "shared"


def example_ids() -> list[str]:
    return [p.stem for p in EXAMPLES]


@pytest.fixture(params=EXAMPLES, ids=example_ids())
def example(request: pytest.FixtureRequest) -> tuple[str, Spec]:
    path: Path = request.param
    return path.stem, load_spec(path)


def need_tool(name: str) -> str:
    path = shutil.which(name)
    if path is None:
        pytest.skip(f"{name} is not installed; the README's test command installs it "
                    "(scripts/system-deps.sh)")
    return path


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


# Property tests draw the same examples on every run: a failure in CI reproduces here.
from hypothesis import settings as _hypothesis_settings  # noqa: E402

_hypothesis_settings.register_profile("pdscale", derandomize=True, deadline=None)
_hypothesis_settings.load_profile("pdscale")
