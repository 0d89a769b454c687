"""The wheel installs one import package, ``pdscale``, and its command runs from it.

Built without network (no build isolation: the test environment's setuptools) and installed,
without dependencies, into a fresh virtual environment that reads the test environment's
site-packages for them through a ``.pth`` path line (a path line adds a folder to ``sys.path``
without running the ``.pth`` files in it, so the editable install of this checkout stays out).
"""

from __future__ import annotations

import shutil
import subprocess
import sys
import sysconfig
import venv
import zipfile
from pathlib import Path

import pytest

from tests.conftest import ROOT


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("wheel")
    # From a copy of what the sdist holds, so no build/ folder of the checkout leaks in.
    src = out / "src"
    shutil.copytree(ROOT / "pdscale", src / "pdscale",
                    ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(ROOT / name, src / name)
    subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation",
                    "--no-index", "-q", "-w", str(out), str(src)], check=True,
                   capture_output=True, text=True)
    (built,) = out.glob("pdscale-*.whl")
    return built


def test_the_wheel_holds_only_pdscale_at_the_top_level(wheel: Path) -> None:
    names = zipfile.ZipFile(wheel).namelist()
    top = {name.split("/")[0] for name in names if not name.split("/")[0].endswith(".dist-info")}
    assert top == {"pdscale"}
    for part in ("controller", "telemetry", "forecasting", "alerts", "dashboards", "simulator"):
        assert f"pdscale/{part}/__init__.py" in names
    assert any(n.startswith("pdscale/controller/profiles/") and n.endswith(".yaml")
               for n in names), "the shipped performance profiles are package data"
    assert "pdscale/py.typed" in names


def test_the_installed_wheel_runs_and_exposes_only_pdscale(wheel: Path, tmp_path: Path) -> None:
    env_dir = tmp_path / "venv"
    venv.EnvBuilder(with_pip=False).create(env_dir)
    python = env_dir / "bin" / "python"
    purelib = Path(subprocess.run(
        [str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
        check=True, capture_output=True, text=True).stdout.strip())
    (purelib / "test-env-deps.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    subprocess.run([sys.executable, "-m", "pip", "--python", str(python), "install", "-q",
                    "--no-deps", "--no-index", str(wheel)], check=True, capture_output=True,
                   text=True)
    assert not (purelib / "controller").exists()
    installed = {p.name for p in purelib.iterdir() if not p.name.endswith((".dist-info", ".pth"))
                 and p.name != "__pycache__"}
    assert "pdscale" in installed
    assert not installed & {"controller", "telemetry", "forecasting", "alerts", "dashboards",
                            "simulator"}
    helped = subprocess.run([str(env_dir / "bin" / "pdscale"), "--help"], check=True,
                            capture_output=True, text=True)
    assert "usage: pdscale" in helped.stdout
    where = subprocess.run(
        [str(python), "-c", "import pdscale.controller, importlib.util as u; "
         "print(pdscale.controller.__file__); "
         "print([n for n in ('controller', 'simulator', 'telemetry', 'forecasting', 'alerts', "
         "'dashboards') if u.find_spec(n) is not None])"],
        check=True, capture_output=True, text=True, cwd=tmp_path).stdout.splitlines()
    assert where[0].startswith(str(purelib))
    assert where[1] == "[]"
