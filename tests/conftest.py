"""Shared fixtures: example specs, tools from the distribution, free loopback ports."""

from __future__ import annotations

import importlib.util
import os
import shutil
import sys
from pathlib import Path
from types import ModuleType

import pytest

from pdscale._servers import free_port as free_port  # for the tests: one loopback port picker
from pdscale.spec import Spec, load_spec

ROOT = Path(__file__).resolve().parent.parent
EXAMPLES = sorted((ROOT / "examples").glob("*.yaml"))
# shared/ (reference data) sits beside the repository; a worktree elsewhere can point at it.
SHARED = Path(os.environ.get("PDSCALE_SHARED") or ROOT.parent / "shared")


def bench_module(name: str) -> ModuleType:
    """bench/<name>.py imported as module ``bench_<name>`` (bench/ is scripts, not a
    package)."""
    spec = importlib.util.spec_from_file_location(f"bench_{name}", ROOT / "bench" / f"{name}.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[f"bench_{name}"] = module
    spec.loader.exec_module(module)
    return module


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




# Property tests draw the same examples on every run: a failure in CI reproduces here.
from hypothesis import settings as _hypothesis_settings  # noqa: E402

_hypothesis_settings.register_profile("pdscale", derandomize=True, deadline=None)
_hypothesis_settings.load_profile("pdscale")
