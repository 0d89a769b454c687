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
