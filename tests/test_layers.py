"""The layering is an import-linter `layers` contract (.importlinter): every package lies in a
layer, so its new modules are covered. pdscale/ is split between the top layer (its command
line and wiring) and the bottom one (the spec, the errors): each of its modules must be named
in the contract, or a new one would escape it."""

from __future__ import annotations

import configparser

from tests.conftest import ROOT


def test_every_pdscale_module_is_in_a_layer() -> None:
    config = configparser.ConfigParser()
    config.read(ROOT / ".importlinter")
    layers = config["importlinter:contract:layers"]["layers"]
    named = {item.strip().strip("()") for line in layers.strip().splitlines()
             for item in line.replace("|", ":").split(":")}
    modules = {f"pdscale.{p.stem}" for p in (ROOT / "pdscale").glob("*.py")
               if p.stem != "__init__"}
    modules |= {f"pdscale.{p.name}" for p in (ROOT / "pdscale").iterdir()
                if p.is_dir() and (p / "__init__.py").exists()}
    assert modules - named == set(), "name the new module in .importlinter's layers"
    for package in ("simulator", "controller", "alerts", "dashboards", "telemetry",
                    "forecasting"):
        assert f"pdscale.{package}" in named
