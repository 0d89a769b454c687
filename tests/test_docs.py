"""The README stays a front door and the docs stay the manual.

The README is the package's long description and the first page a user reads: a pitch, install,
a quick start and links, under 300 lines; the manual is the MkDocs site in docs/, which
`mkdocs build --strict` checks in scripts/test.sh. History lives in git and CHANGELOG.md, so no
tracked file narrates the order in which changes were made.
"""

from __future__ import annotations

import re
import shutil
import subprocess
import tomllib

import pytest

from tests.conftest import ROOT

README_MAX_LINES = 300
# Spelled in two parts so that this file does not match itself.
LOG_WORD = "sit" + "ting"


def test_the_readme_is_a_front_door() -> None:
    lines = (ROOT / "README.md").read_text().splitlines()
    assert len(lines) < README_MAX_LINES, (
        f"README.md has {len(lines)} lines; keep it under {README_MAX_LINES} and move "
        "reference material into docs/")


def test_the_readme_is_the_package_description() -> None:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    assert project["readme"] == "README.md"


def test_no_tracked_file_narrates_its_history() -> None:
    git = shutil.which("git")
    if git is None or not (ROOT / ".git").exists():
        pytest.skip("not a git checkout: the tracked files are unknown")
    found = subprocess.run([git, "grep", "-I", "-i", "-l", "-e", LOG_WORD],
                           cwd=ROOT, capture_output=True, text=True, check=False)
    assert found.returncode in (0, 1), found.stderr
    assert found.stdout.split() == [], (
        f"tracked files speak of '{LOG_WORD}': describe the project as it is; the history "
        "of changes belongs in git and CHANGELOG.md")


def test_every_alert_with_a_runbook_is_on_the_alerts_page() -> None:
    runbooks = (ROOT / "docs" / "runbooks.md").read_text()
    alerts = {line[3:].strip() for line in runbooks.splitlines() if line.startswith("## ")}
    assert len(alerts) > 15
    page = (ROOT / "docs" / "alerts.md").read_text()
    rows = set(re.findall(r"^\| `(\w+)` \|", page, flags=re.MULTILINE))
    assert sorted(alerts - rows) == []
    assert sorted(rows - alerts) == []
