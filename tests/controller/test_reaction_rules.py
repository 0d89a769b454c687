"""The reaction rules shipped in the examples (the defaults) match alerts pdscale generates."""

from __future__ import annotations

import re

from pdscale.alerts import alert_defs
from pdscale.controller._webhook import AlertReceiver
from pdscale.spec import ReactionAction, ReactionSettings, Spec


def test_examples_spell_out_the_default_reactions(example: tuple[str, Spec]) -> None:
    _, spec = example
    assert spec.reactions == ReactionSettings()


def test_every_reaction_rule_matches_a_generated_critical_alert(example: tuple[str, Spec]
                                                                ) -> None:
    _, spec = example
    names = {d.name for d in alert_defs(spec)}
    for rule in spec.reactions.rules:
        pattern = rule.match_re.get("alertname")
        wanted = rule.match.get("alertname")
        matched = {n for n in names if (wanted is None or n == wanted)
                   and (pattern is None or re.fullmatch(pattern, n))}
        assert matched, f"{rule.action.value} rule matches no generated alert"
    acted = {n for n in names for rule in spec.reactions.rules
             if rule.action is not ReactionAction.NOTIFY_ONLY
             and re.fullmatch(rule.match_re.get("alertname", ".*"), n)
             and rule.match.get("alertname", n) == n}
    # The latency, queue and hardware alerts all have a reaction.
    assert {"LLMTimeToFirstTokenHigh", "LLMInterTokenLatencyHigh", "LLMQueueBacklogHigh",
            "LLMGPUXidError"} <= acted


def test_a_missing_group_the_controller_does_not_read_only_pages() -> None:
    """Without a DCGM exporter the gpu group is absent for good: holding scale-down on it
    would keep every pool at its peak forever. Only the controller's inputs hold."""
    from pdscale.controller._webhook import AlertmanagerAlert
    from pdscale.spec import parse_spec
    from tests.controller.test_api import SPEC

    spec = parse_spec(SPEC.replace("PORT", "9").split("reactions:")[0])
    outcomes = {}
    for group in ("latency", "queue", "tokens", "kv", "errors", "gpu"):
        receiver = _receiver(spec)
        alert = AlertmanagerAlert.model_validate({
            "status": "firing", "fingerprint": group, "startsAt": "2026-12-03T10:00:00Z",
            "labels": {"alertname": "LLMPoolMetricsAbsent", "severity": "critical",
                       "signal_group": group, "pdscale_service": "chat",
                       "pdscale_pool": "decode"}})
        outcomes[group] = receiver.process(alert).action
    assert outcomes == {"latency": "hold_scale_down", "queue": "hold_scale_down",
                        "tokens": "hold_scale_down", "kv": "notify_only",
                        "errors": "notify_only", "gpu": "notify_only"}


def _receiver(spec: Spec) -> AlertReceiver:
    from pdscale.controller._reconciler import Overrides
    from pdscale.telemetry import ControllerTelemetry

    return AlertReceiver(spec, overrides=Overrides(), now=lambda: 0.0,
                         telemetry=ControllerTelemetry(spec, identity="t"),
                         current_replicas=lambda key: 2)
