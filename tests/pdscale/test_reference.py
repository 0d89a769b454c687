"""docs/spec-reference.md is generated from the spec models and kept current."""

from __future__ import annotations

from pdscale._reference import spec_reference
from pdscale.spec import Spec
from tests.conftest import ROOT


def test_committed_reference_is_current() -> None:
    committed = (ROOT / "docs" / "spec-reference.md").read_text()
    assert committed == spec_reference(), (
        "the spec changed: regenerate with `.venv/bin/pdscale spec-reference > "
        "docs/spec-reference.md`")


def test_every_spec_field_is_in_the_reference() -> None:
    text = spec_reference()
    for name, field in Spec.model_fields.items():
        assert f"| `{field.alias or name}` |" in text
    for section in ("ControllerSettings", "ReactionRule", "PoolSpec", "TieredThreshold"):
        assert f"## {section}" in text


def test_every_field_says_what_it_means_and_durations_say_so() -> None:
    """84 of 140 fields had an empty meaning (their docstrings were not read), and durations
    were listed as int although a spec writes `60s`."""
    rows = [line for line in spec_reference().splitlines() if line.startswith("| `")]
    assert len(rows) > 100
    empty = [row.split("|")[1].strip() for row in rows if row.rstrip().endswith("|  |")]
    assert empty == []
    by_field = {row.split("|")[1].strip(): row.split("|")[2].strip() for row in rows}
    assert by_field["`cold_start`"] == "duration" and by_field["`tick`"] == "duration"
    assert by_field["`min_replicas`"] == "int"
