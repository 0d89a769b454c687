"""Golden files: generated rules, Alertmanager config and dashboards for each example.

Regenerate after an intended change with: PDSCALE_UPDATE_GOLDEN=1 .venv/bin/pytest
tests/test_golden.py (then review the diff). promtool test files are not kept here: they are
large, and promtool runs them in tests/alerts/test_promtool.py.
"""

from __future__ import annotations

import os

from pdscale.alerts import alert_files
from pdscale.dashboards import dashboard_files
from pdscale.spec import Spec
from tests.conftest import ROOT

GOLDEN = ROOT / "tests" / "golden"


def _generated(name: str, spec: Spec) -> dict[str, str]:
    files = {f"alerts/{k}": v for k, v in alert_files(spec, source=f"{name}.yaml").items()
             if k.startswith("rules/") or k == "alertmanager.yaml"}
    files.update({f"dashboards/{k}": v for k, v in dashboard_files(spec).items()
                  if k.endswith(".json")})
    return files


def test_generated_output_matches_golden_files(example: tuple[str, Spec]) -> None:
    name, spec = example
    files = _generated(name, spec)
    root = GOLDEN / name
    if os.environ.get("PDSCALE_UPDATE_GOLDEN") == "1":
        for rel, text in files.items():
            (root / rel).parent.mkdir(parents=True, exist_ok=True)
            (root / rel).write_text(text)
    on_disk = {str(p.relative_to(root)): p.read_text() for p in root.rglob("*") if p.is_file()}
    assert sorted(on_disk) == sorted(files), "files differ; see the module docstring"
    for rel, text in files.items():
        assert on_disk[rel] == text, f"{name}/{rel} changed; see the module docstring"


def test_golden_folder_has_every_example() -> None:
    names = {p.stem for p in (ROOT / "examples").glob("*.yaml")}
    assert {p.name for p in GOLDEN.iterdir() if p.is_dir()} == names
