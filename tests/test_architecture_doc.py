"""docs/architecture.md is kept true: every module path and every public name it cites must
exist, so a change that moves a stage has to move the map too."""

from __future__ import annotations

import importlib
import re

from tests.conftest import ROOT

DOC = ROOT / "docs" / "architecture.md"


def test_every_module_named_exists() -> None:
    text = DOC.read_text()
    paths = set(re.findall(r"`((?:pdscale|bench)/[\w/]*(?:\.py)?)`", text))
    assert len(paths) > 20
    missing = sorted(p for p in paths if not (ROOT / p).exists())
    assert missing == []


def test_every_public_name_cited_exists() -> None:
    names = {"pdscale.controller": ["Reconciler", "ObservationSource", "Observation", "Policy",
                            "PoolDecision", "Cause", "ForecastStage", "PoolForecast",
                            "NoForecast", "Refits", "PdscalePolicy", "Overrides",
                            "DecisionRecord", "Actuator"],
             "pdscale.simulator": ["World", "EventWorld", "FluidWorld", "SimClock", "run_world"],
             "pdscale.telemetry": ["Signal", "derive_signals", "RATE_WINDOW"],
             "pdscale.errors": ["RetryLater", "GiveUp"]}
    text = DOC.read_text()
    for module, cited in names.items():
        imported = importlib.import_module(module)
        for name in cited:
            assert re.search(rf"\b{name}\b", text), f"{name} is no longer cited"
            assert hasattr(imported, name), f"{module}.{name} is cited but gone"
