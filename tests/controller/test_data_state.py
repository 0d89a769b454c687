"""Degraded means degraded: the targets a planned scale-down removed, an idle pool before its
first request and a Prometheus outage each get their own state and reason, and an outage is
one short log line, not one a tick. A pool whose requests show only in its request spans is
not idle."""

from __future__ import annotations

import logging
from collections.abc import Sequence

import pytest

from pdscale.controller import build_forecasts, build_policy
from pdscale.controller._cluster import ClusterSource, SourcedReader
from pdscale.controller._constraints import Constraints
from pdscale.controller._kube import ScaleStatus
from pdscale.controller._reconciler import ERROR_REPEAT_S, Reconciler
from pdscale.spec import PoolKey, Role, Spec, load_spec, parse_spec
from pdscale.telemetry import (
    ControllerTelemetry,
    OtlpStore,
    PrometheusUnavailable,
    Signal,
    SignalValue,
)
from tests.conftest import ROOT
from tests.controller.memory_cluster import ManualClock
from tests.telemetry.otlp_fixtures import Req, trace_request, vllm_resource

SPEC = """
version: 1
services:
  - name: chat
    namespace: dynamo
    engine: dynamo
    model_name: tiny
    dynamo: {namespace: chat}
    slo: {ttft_p95_s: 0.47, itl_p95_s: 0.064}
    pools:
      prefill: {target: {name: chat-prefill}, min_replicas: 1, max_replicas: 8}
      decode: {target: {name: chat-decode}, min_replicas: 1, max_replicas: 8}
"""
P, D = ("chat", Role.PREFILL), ("chat", Role.DECODE)

HEALTHY = {Signal.SAMPLE_AGE_S: SignalValue(0.5, 0.5), Signal.TARGETS_UP: SignalValue(8, 0.5),
           Signal.TARGETS: SignalValue(8, 0.5),
           Signal.REQUEST_RATE: SignalValue(3.0, 0.5),
           Signal.PROMPT_TOKENS_PER_S: SignalValue(3000.0, 0.5),
           Signal.GENERATION_TOKENS_PER_S: SignalValue(300.0, 0.5)}


class Reader:
    """Prometheus as the source reads it: ``values`` for every pool, or down."""

    stale_after_s = 60.0

    def __init__(self) -> None:
        self.values: dict[Signal, SignalValue] = dict(HEALTHY)
        self.down = False

    def read(self, spec: Spec, signals: Sequence[Signal], *, at_s: float
             ) -> dict[PoolKey, dict[Signal, SignalValue]]:
        if self.down:
            raise PrometheusUnavailable("cannot connect to http://127.0.0.1:9090 (Connection "
                                        "refused; is Prometheus up?)")
        got = {s: self.values.get(s, SignalValue(None, None)) for s in signals}
        return {(svc.name, role): dict(got) for svc in spec.services for role in svc.pools}


class Pools:
    """The actuator's view: desired, existing and ready replicas per pool."""

    def __init__(self, replicas: int, keys: Sequence[PoolKey] = (P, D)) -> None:
        self.desired = dict.fromkeys(keys, replicas)
        self.events: list[tuple[PoolKey, str, str]] = []

    def read_statuses(self, keys: Sequence[PoolKey]) -> dict[PoolKey, ScaleStatus]:
        return {k: ScaleStatus(self.desired[k], self.desired[k], self.desired[k]) for k in keys}

    def set_replicas(self, key: PoolKey, replicas: int, reasons: Sequence[str]) -> None:
        self.desired[key] = replicas

    def event(self, key: PoolKey, reason: str, message: str) -> None:
        self.events.append((key, reason, message))


def _source(replicas: int = 8) -> tuple[ClusterSource, Reader, Pools]:
    reader, pools = Reader(), Pools(replicas)
    return ClusterSource(parse_spec(SPEC), reader, pools), reader, pools  # type: ignore[arg-type]


def test_targets_a_scale_down_removed_are_departing_not_degraded() -> None:
    source, reader, pools = _source()
    assert source.observe(0.0).observation.pools[P].data_state == "ok"
    pools.desired[P] = 6  # a planned scale-down: two workers leave
    reader.values[Signal.TARGETS_UP] = SignalValue(6, 0.5)
    pool = source.observe(5.0).observation.pools[P]
    assert (pool.data_state, pool.degraded) == ("departing", None)
    assert pool.note is not None and "2 of 8 scrape targets are replicas a scale-down removed" \
        in pool.note
    # One more target down than the plan removed: that one is not planned.
    reader.values[Signal.TARGETS_UP] = SignalValue(5, 0.5)
    pool = source.observe(10.0).observation.pools[P]
    assert pool.data_state == "degraded" and pool.degraded == "3 of 8 scrape targets down"
    # Long after the scale-down, targets still listed down are a degradation.
    reader.values[Signal.TARGETS_UP] = SignalValue(6, 0.5)
    assert source.observe(100.0).observation.pools[P].data_state == "degraded"


def test_an_idle_pool_before_its_first_request_is_idle_and_held() -> None:
    spec = parse_spec(SPEC)
    source, reader, pools = _source(1)
    for signal in (Signal.REQUEST_RATE, Signal.PROMPT_TOKENS_PER_S,
                   Signal.GENERATION_TOKENS_PER_S):
        reader.values.pop(signal)
    forecasts = build_forecasts(spec)
    rec = Reconciler(build_policy(spec, forecasts=forecasts), source, pools,  # type: ignore[arg-type]
                     ManualClock(), constraints=Constraints.from_spec(spec),
                     telemetry=ControllerTelemetry(spec), forecasts=forecasts,
                     refit_in_background=False)
    report = rec.tick()
    for key in (P, D):
        d = report.decisions[key]
        assert d.cause == "steady" and d.desired == 1, d.reasons
        assert d.detail["data_state"] == "idle"
        assert d.reasons[-1].startswith("idle: no request counted yet")
        assert not any(r.startswith("degraded") for r in d.reasons)


def test_a_pool_whose_requests_show_only_in_spans_is_not_idle() -> None:
    """examples/vllm-otlp.yaml: latency from the request spans, the request and token counts
    from Prometheus, which has none (an engine that exports them from its first request, a
    scrape that misses them). The spans show the prefill pool serving: it is decided on, not
    held as idle; the decode pool, with no span and no request series, still is idle."""
    spec = load_spec(ROOT / "examples" / "vllm-otlp.yaml")
    prefill, decode = ("llama-otel", Role.PREFILL), ("llama-otel", Role.DECODE)
    now = 1_700_000_000.0
    store = OtlpStore(spec, started_s=now - 600)
    reqs = [Req(end_s=now - 30 + i * 0.1, ttft_s=0.8, queue_s=0.5, prefill_s=0.2)
            for i in range(100)]
    pod = vllm_resource("llama-otel-prefill-0", namespace="llm-otel")
    assert store.ingest_traces(trace_request({pod: reqs}), now_s=now).accepted == 100
    prometheus = Reader()
    for signal in (Signal.REQUEST_RATE, Signal.PROMPT_TOKENS_PER_S,
                   Signal.GENERATION_TOKENS_PER_S):
        prometheus.values.pop(signal)
    reader = SourcedReader(spec, prometheus, store)  # type: ignore[arg-type]
    source = ClusterSource(spec, reader, Pools(1, (prefill, decode)))  # type: ignore[arg-type]
    pools = source.observe(now).observation.pools
    assert reader.answered[prefill][Signal.TTFT_P95_S] == "otlp"
    assert reader.answered[prefill][Signal.REQUEST_RATE] is None
    assert (pools[prefill].data_state, pools[prefill].note) == ("ok", None)
    assert pools[prefill].signals[Signal.TTFT_P95_S] == pytest.approx(0.8, rel=0.05)
    assert pools[decode].data_state == "idle"
    assert reader.served == {prefill}


def test_a_prometheus_outage_says_prometheus_and_logs_one_short_line(
        caplog: pytest.LogCaptureFixture) -> None:
    spec = parse_spec(SPEC)
    source, reader, pools = _source(2)
    clock = ManualClock()

    class Hold:
        name = "hold"

        def decide(self, obs: object) -> dict[PoolKey, object]:
            return {}

    rec = Reconciler(Hold(), source, pools, clock,  # type: ignore[arg-type]
                     constraints=Constraints.from_spec(spec),
                     telemetry=ControllerTelemetry(spec), tick_s=5)
    reader.down = True
    caplog.set_level(logging.INFO, logger="pdscale.controller")
    for _ in range(12):  # a minute of ticks
        rec.tick()
        clock.t += 5
    pool = rec.last_observation.pools[P]  # type: ignore[union-attr]
    assert pool.data_state == "unavailable"
    assert pool.degraded is not None and pool.degraded.startswith(
        "Prometheus unreadable: cannot connect to http://127.0.0.1:9090 (Connection refused")
    assert "target" not in pool.degraded
    warned = [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]
    assert len(warned) == 1 and len(warned[0]) < 160, warned
    clock.t += ERROR_REPEAT_S  # a long outage says so again, with a count
    rec.tick()
    warned = [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]
    assert len(warned) == 2 and "again 12 times" in warned[-1], warned
    reader.down = False
    rec.tick()
    assert rec.last_observation.pools[P].data_state == "ok"  # type: ignore[union-attr]
    assert "prometheus: unavailable cleared after" in caplog.records[-1].getMessage()


def test_a_pool_held_above_its_need_says_why_once_in_the_log_and_an_event(
        caplog: pytest.LogCaptureFixture) -> None:
    from pdscale.controller import PoolDecision

    spec = parse_spec(SPEC)
    source, _reader, pools = _source(8)
    clock = ManualClock()
    why = ("holding 8 over the need 4: the need was 8 within the stabilisation window, 480 s "
           "of 600 s left")

    class Holding:
        name = "holding"

        def decide(self, obs: object) -> dict[PoolKey, PoolDecision]:
            return {P: PoolDecision(8, ("capacity ... -> need 4", why), detail={"need": 4}),
                    D: PoolDecision(8, ("need 8",), detail={"need": 8})}

    rec = Reconciler(Holding(), source, pools, clock,  # type: ignore[arg-type]
                     constraints=Constraints.from_spec(spec),
                     telemetry=ControllerTelemetry(spec), tick_s=5)
    caplog.set_level(logging.INFO, logger="pdscale.controller")
    for _ in range(5):
        rec.tick()
        clock.t += 5
    said = [r.getMessage() for r in caplog.records if "held above the need" in r.getMessage()]
    assert said == [f"chat/prefill: 8 replicas, held above the need: {why}"]
    assert pools.events == [(P, "PdscaleHeldAboveNeed", f"8 replicas, held above the need: {why}")]


def test_an_alert_reaction_reads_the_pool_now_and_a_flood_reads_once_a_second() -> None:
    """A scale_up checks its shortage on a fresh read, not on a tick up to a tick old; alerts
    arriving together share one read."""
    spec = parse_spec(SPEC)
    source, reader, pools = _source(2)
    reads: list[float] = []
    read = reader.read

    def counted(*args: object, **kw: object) -> object:
        reads.append(float(kw["at_s"]))  # type: ignore[arg-type]
        return read(*args, **kw)  # type: ignore[arg-type]

    reader.read = counted  # type: ignore[method-assign]
    clock = ManualClock()
    rec = Reconciler(type("Hold", (), {"name": "hold", "decide": lambda self, o: {}})(),
                     source, pools, clock, constraints=Constraints.from_spec(spec),  # type: ignore[arg-type]
                     telemetry=ControllerTelemetry(spec), tick_s=15)
    rec.tick()
    clock.t += 10  # the tick's read is 10 s old
    reader.values[Signal.TTFT_P95_RECENT_S] = SignalValue(2.0, 0.5)
    pool = rec.observe_pool(P)
    assert pool is not None and pool.signals[Signal.TTFT_P95_RECENT_S] == 2.0
    assert len(reads) == 2
    for _ in range(50):  # a flood within the same second
        rec.observe_pool(P)
    assert len(reads) == 2
