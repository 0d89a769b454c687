"""A reaction that adds capacity acts on the present: the shortage it answers must show in the
pool's recent signals when the alert arrives, and its floor ends when that shortage clears,
not when the alert resolves. A budget-burn alert after the load has passed adds nothing."""

from __future__ import annotations

from collections.abc import Mapping

import pytest

from pdscale.controller import (
    Cause,
    Observation,
    PoolDecision,
    PoolObservation,
    PoolReplicas,
)
from pdscale.controller._present import shortage_now
from pdscale.controller._reconciler import Overrides
from pdscale.controller._webhook import AlertmanagerAlert, AlertReceiver
from pdscale.spec import Role, ShortageCondition, Spec, parse_spec
from pdscale.telemetry import ControllerTelemetry, Signal

SPEC = """
version: 1
services:
  - name: chat
    namespace: llm
    engine: vllm
    model_name: llama
    slo: {ttft_p95_s: 0.5, itl_p95_s: 0.05}
    pools:
      prefill: {target: {name: chat-prefill}, min_replicas: 1, max_replicas: 8}
      decode: {target: {name: chat-decode}, min_replicas: 1, max_replicas: 8}
"""
P = ("chat", Role.PREFILL)
D = ("chat", Role.DECODE)

RECOVERED = {Signal.TTFT_P95_S: 3.0, Signal.TTFT_P95_RECENT_S: 0.11, Signal.QUEUE_DEPTH: 0.0}
"""After a load step: the 5-minute p95 still carries the step, the last minute is fine."""
OVERLOADED = {Signal.TTFT_P95_S: 3.0, Signal.TTFT_P95_RECENT_S: 2.4, Signal.QUEUE_DEPTH: 40.0}


def _pool(key: tuple[str, Role], signals: Mapping[Signal, float | None], *,
          ready: int = 7) -> PoolObservation:
    return PoolObservation(key, PoolReplicas(ready, 0, 0, ready, 1, 8), dict(signals), 0.0)


def _burn(fingerprint: str = "burn-1", status: str = "firing") -> AlertmanagerAlert:
    return AlertmanagerAlert.model_validate({
        "status": status, "fingerprint": fingerprint, "startsAt": "2026-12-05T09:36:00Z",
        "labels": {"alertname": "LLMTimeToFirstTokenSLOBudgetBurn", "severity": "critical",
                   "long": "6h", "short": "30m", "pdscale_service": "chat",
                   "pdscale_pool": "prefill"}})


class Loop:
    """The receiver with what the reconcile loop last read of each pool."""

    def __init__(self, spec: Spec, replicas: int = 7) -> None:
        self.seen: dict[tuple[str, Role], PoolObservation] = {}
        self.overrides = Overrides()
        self.replicas = replicas
        self.receiver = AlertReceiver(
            spec, overrides=self.overrides, now=lambda: 0.0,
            telemetry=ControllerTelemetry(spec, identity="t"),
            current_replicas=lambda key: self.replicas, observe=self.seen.get)

    def decide(self, signals: Mapping[Signal, float | None], desired: int) -> PoolDecision:
        """One tick's override step for prefill (``replicas`` ready), whose policy asked for
        ``desired``."""
        decisions = {P: PoolDecision(desired, ("need 2",), detail={"need": 2})}
        pool = _pool(P, signals, ready=self.replicas)
        self.overrides.apply(decisions, Observation(10.0, {P: pool}))
        return decisions[P]


@pytest.fixture
def loop() -> Loop:
    return Loop(parse_spec(SPEC))


def test_a_burn_alert_after_recovery_adds_nothing(loop: Loop) -> None:
    loop.seen[P] = _pool(P, RECOVERED)
    record = loop.receiver.process(_burn())
    assert (record.action, record.outcome) == ("scale_up", "no_shortage")
    assert "TTFT p95 over the last minute 0.11s within the SLO 0.5s" in record.message
    assert loop.overrides.active(0.0)["floors"] == []
    assert loop.decide(RECOVERED, 7).desired_replicas == 7


def test_the_same_burn_alert_during_a_real_overload_acts(loop: Loop) -> None:
    loop.seen[P] = _pool(P, RECOVERED)
    assert loop.receiver.process(_burn()).outcome == "no_shortage"
    # Not remembered as handled: Alertmanager's repeat of the same alert is queued again...
    assert loop.receiver.submit(_payload(_burn())) == (1, 0)
    loop.seen[P] = _pool(P, OVERLOADED)
    loop.receiver.drain_queue()
    record = loop.receiver.records[-1]
    assert record.outcome == "applied"
    # ... and the floor shows as applied: 7 + 2 asked, capped at the pool's max 8.
    assert record.message.startswith("floor 8 replicas (from 7; 9 asked, capped at "
                                     "max_replicas) while TTFT p95 over the last minute 2.4s")
    decided = loop.decide(OVERLOADED, 7)
    assert decided.desired_replicas == 8 and decided.cause is Cause.REACTION
    assert decided.reasons[-1].startswith(
        "reaction: floor 8 from LLMTimeToFirstTokenSLOBudgetBurn firing while TTFT p95 over "
        "the last minute 2.4s above the SLO 0.5s")


def test_the_floor_ends_when_the_shortage_clears_not_when_the_alert_resolves(
        loop: Loop) -> None:
    loop.replicas = 3
    loop.seen[P] = _pool(P, OVERLOADED, ready=3)
    assert loop.receiver.process(_burn()).outcome == "applied"
    assert loop.decide(OVERLOADED, 3).desired_replicas == 5
    assert loop.decide(OVERLOADED, 3).desired_replicas == 5  # still short: it stands
    # The last minute recovered; the alert (6 h / 30 min windows) still fires.
    cleared = loop.decide(RECOVERED, 3)
    assert cleared.desired_replicas == 3 and cleared.cause is not Cause.REACTION
    active = loop.overrides.active(10.0)
    assert active["floors"] == [] and active["holds"] == []
    assert active["ended"][-1]["cleared"].startswith("TTFT p95 over the last minute 0.11s")
    assert loop.decide(OVERLOADED, 3).desired_replicas == 3  # gone for good


def test_a_queue_alert_checks_the_queue_and_unread_signals_confirm_nothing(
        loop: Loop) -> None:
    backlog = AlertmanagerAlert.model_validate({
        "status": "firing", "fingerprint": "q1", "startsAt": "2026-12-05T09:00:00Z",
        "labels": {"alertname": "LLMQueueBacklogHigh", "severity": "critical",
                   "pdscale_service": "chat", "pdscale_pool": "decode"}})
    loop.seen[D] = _pool(D, {Signal.QUEUE_DEPTH: 3.0}, ready=2)
    record = loop.receiver.process(backlog)
    assert record.outcome == "no_shortage" and "3 waiting on 2 ready" in record.message
    loop.seen.pop(D)
    assert "has not been read recently" in loop.receiver.process(backlog).message
    loop.seen[D] = _pool(D, {Signal.QUEUE_DEPTH: 30.0}, ready=2)
    assert loop.receiver.process(backlog).outcome == "applied"


@pytest.mark.parametrize(("condition", "signals", "holds"), [
    (ShortageCondition.LATENCY, {Signal.TTFT_P95_RECENT_S: 0.6}, True),
    (ShortageCondition.LATENCY, {Signal.TTFT_P95_RECENT_S: 0.4, Signal.QUEUE_DEPTH: 90}, False),
    (ShortageCondition.LATENCY, {Signal.TTFT_P95_S: 9.0}, False),  # the 5-minute p95 only
    (ShortageCondition.QUEUE, {Signal.TTFT_P95_RECENT_S: 9.0, Signal.QUEUE_DEPTH: 4}, False),
    (ShortageCondition.QUEUE, {Signal.QUEUE_DEPTH: 5}, True),
    (ShortageCondition.LATENCY_OR_QUEUE, {Signal.QUEUE_DEPTH: 5}, True),
    (ShortageCondition.LATENCY_OR_QUEUE, {}, False),
], ids=["latency-over", "latency-within", "5m-only", "queue-short", "queue-long",
        "either-queue", "nothing-read"])
def test_the_shortage_read_from_the_pools_signals(condition: ShortageCondition,
                                                  signals: dict[Signal, float],
                                                  holds: bool) -> None:
    got = shortage_now(_pool(P, signals, ready=2), condition, role=Role.PREFILL, slo_s=0.5)
    assert got.holds is holds, got.reason


def test_condition_is_for_scale_up_only() -> None:
    from pdscale.spec import SpecError

    bad = SPEC + """
reactions:
  rules:
    - match: {alertname: LLMPoolTargetDown}
      action: hold_scale_down
      condition: latency
"""
    with pytest.raises(SpecError, match="'condition' applies to scale_up only"):
        parse_spec(bad)


def _payload(alert: AlertmanagerAlert) -> object:
    from pdscale.controller._webhook import AlertmanagerPayload

    return AlertmanagerPayload.model_validate({"version": "4", "status": alert.status,
                                               "alerts": [alert.model_dump()]})
