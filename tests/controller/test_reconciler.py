"""The reconcile loop on an injected clock against an in-memory cluster: failure isolation,
leadership, dry run, recommendation mode, alert overrides, refits off the tick path, metrics
and traces."""

from __future__ import annotations

import threading

import pytest
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from pdscale.controller import ForecastStage, build_forecasts, build_policy
from pdscale.controller._constraints import Constraints
from pdscale.controller._reconciler import Reconciler
from pdscale.spec import Role, Spec, parse_spec
from pdscale.telemetry import ControllerTelemetry, Signal
from tests.controller.memory_cluster import ManualClock, MemoryCluster

SPEC = """
version: 1
services:
  - name: chat
    namespace: llm
    engine: vllm
    model_name: llama
    slo: {ttft_p95_s: 0.5, itl_p95_s: 0.05}
    pools:
      prefill: {target: {name: chat-prefill}, min_replicas: 1, max_replicas: 20}
      decode: {target: {name: chat-decode}, min_replicas: 1, max_replicas: 20}
  - name: batch
    namespace: llm
    engine: vllm
    model_name: llama
    slo: {ttft_p95_s: 2.5, itl_p95_s: 0.1}
    pools:
      prefill: {target: {name: batch-prefill}, min_replicas: 1, max_replicas: 20}
      decode: {target: {name: batch-decode}, min_replicas: 1, max_replicas: 20}
"""

P = ("chat", Role.PREFILL)
D = ("chat", Role.DECODE)
BP = ("batch", Role.PREFILL)


def _spec(extra: str = "") -> Spec:
    return parse_spec(SPEC + extra)


def _reconciler(spec: Spec, *, leader: bool = True, mode: str = "act", dry_run: bool = False,
                exporter: InMemorySpanExporter | None = None
                ) -> tuple[Reconciler, MemoryCluster, ManualClock]:
    clock = ManualClock()
    cluster = MemoryCluster(spec, clock)
    processors = (SimpleSpanProcessor(exporter),) if exporter is not None else ()
    telemetry = ControllerTelemetry(spec, span_processors=processors)
    forecasts = build_forecasts(spec)
    rec = Reconciler(build_policy(spec, forecasts=forecasts), cluster, cluster, clock,
                     constraints=Constraints.from_spec(spec), telemetry=telemetry,
                     tick_s=15, mode=mode,  # type: ignore[arg-type]
                     dry_run=dry_run, is_leader=lambda: leader, forecasts=forecasts,
                     refit_in_background=True)
    return rec, cluster, clock


def _load(cluster: MemoryCluster, prefill: float, decode: float) -> None:
    for key in cluster.pools:
        cluster.set_demand(key, prefill if key[1] is Role.PREFILL else decode)


def test_scales_up_with_load_and_records_reasons() -> None:
    rec, cluster, _clock = _reconciler(_spec())
    _load(cluster, 200_000, 30_000)
    report = rec.tick()
    assert not report.errors and report.leader
    assert report.decisions[P].outcome == "applied"
    assert cluster.pools[P].desired > 1 and cluster.pools[D].desired > 1
    assert report.decisions[P].cause == "forecast"
    assert report.decisions[P].detail["demand"] == 200_000
    assert report.decisions[P].detail["need"] == cluster.pools[P].desired
    reasons = next(said for key, _, said in cluster.writes if key == P)
    assert any("predicted TTFT p99" in r for r in reasons)
    metrics = rec.telemetry.render().decode()
    assert 'pdscale_desired_replicas{' in metrics
    line = next(x for x in metrics.splitlines() if x.startswith("pdscale_desired_replicas{")
                and 'pdscale_service="chat"' in x and 'pdscale_pool="prefill"' in x)
    assert 'namespace="llm"' in line and 'model_name="llama"' in line
    assert float(line.rsplit(" ", 1)[1]) == cluster.pools[P].desired
    assert 'pdscale_decisions_total{' in metrics and 'reason="forecast"' in metrics


def test_prometheus_down_costs_the_tick_not_the_process_and_never_scales_down() -> None:
    rec, cluster, clock = _reconciler(_spec())
    _load(cluster, 200_000, 30_000)
    rec.tick()
    before = {k: p.desired for k, p in cluster.pools.items()}
    cluster.prometheus_down = True
    for _ in range(40):  # 10 minutes: longer than the stabilisation window
        clock.t += 15
        report = rec.tick()
        assert any(e.adapter == "prometheus" for e in report.errors)
        assert all(d.cause == "degraded" for d in report.decisions.values())
    assert {k: p.desired for k, p in cluster.pools.items()} == before
    assert _counter(rec.telemetry.render().decode(), "pdscale_adapter_errors_total",
                    adapter="prometheus", kind="unavailable") >= 1
    status = rec.snapshot()
    assert status["recent_errors"][-1]["adapter"] == "prometheus"
    cluster.prometheus_down = False
    clock.t += 15
    assert not rec.tick().errors


def test_one_pool_failing_to_scale_does_not_stop_the_others() -> None:
    rec, cluster, _ = _reconciler(_spec())
    _load(cluster, 200_000, 30_000)
    cluster.reject.add(P)
    cluster.unavailable.add(D)
    report = rec.tick()
    assert report.decisions[P].outcome == "failed" and report.decisions[D].outcome == "failed"
    assert report.decisions[BP].outcome == "applied"
    kinds = {(e.adapter, e.kind, e.pool) for e in report.errors}
    assert ("kubernetes", "rejected", P) in kinds and ("kubernetes", "unavailable", D) in kinds


@pytest.mark.parametrize(("leader", "mode", "dry_run", "outcome"), [
    (False, "act", False, "standby"),
    (True, "act", True, "dry_run"),
    (True, "recommend", False, "recommend"),
])
def test_only_an_acting_leader_writes(leader: bool, mode: str, dry_run: bool,
                                      outcome: str) -> None:
    rec, cluster, _ = _reconciler(_spec(), leader=leader, mode=mode, dry_run=dry_run)
    _load(cluster, 200_000, 30_000)
    report = rec.tick()
    assert not cluster.writes
    assert report.decisions[P].outcome == outcome
    assert report.decisions[P].desired > 1  # decided all the same
    metrics = rec.telemetry.render().decode()
    assert "pdscale_desired_replicas{" in metrics  # recommendation mode exports this


def test_a_lease_lost_during_the_act_stops_the_writes_at_once() -> None:
    """Leadership was read once a tick, before every pool's writes: a lease lost while one
    pool's act took seconds left the old leader writing the next pools after the standby had
    taken over."""
    rec, cluster, _ = _reconciler(_spec())
    answers = iter([True, True, False, False, False, False])
    rec.is_leader = lambda: next(answers, False)
    _load(cluster, 200_000, 30_000)
    report = rec.tick()
    outcomes = [report.decisions[k].outcome for k in sorted(report.decisions, key=str)]
    assert outcomes[0] == "applied" and set(outcomes[1:]) == {"standby"}
    assert len(cluster.writes) == 1


def test_alert_floor_and_hold_then_release() -> None:
    rec, cluster, clock = _reconciler(_spec())
    _load(cluster, 1_000, 100)
    rec.tick()
    assert cluster.pools[P].desired == 1
    rec.overrides.floor(P, 5, clock.t + 600, "fp1", "LLMTimeToFirstTokenHigh firing")
    rec.overrides.hold(P, clock.t + 600, "fp1", "LLMTimeToFirstTokenHigh firing")
    clock.t += 15
    report = rec.tick()
    assert cluster.pools[P].desired == 5 and report.decisions[P].cause == "reaction"
    assert any("reaction" in r for r in report.decisions[P].reasons)
    rec.overrides.floor(P, 1, clock.t + 600, "fp2", "x")  # a lower floor changes nothing
    for _ in range(30):  # the hold (600 s) keeps the pool up although demand is low
        clock.t += 15
        rec.tick()
    assert cluster.pools[P].desired == 5
    assert rec.overrides.release("fp1") == 2
    for _ in range(60):
        clock.t += 15
        rec.tick()
    assert cluster.pools[P].desired < 5  # scale-down resumes, stepwise


def test_holds_expire_by_themselves() -> None:
    rec, _cluster, clock = _reconciler(_spec())
    rec.overrides.hold(P, clock.t + 60, "fp", "x")
    assert rec.overrides.active(clock.t)["holds"]
    clock.t += 61
    assert not rec.overrides.active(clock.t)["holds"]


def test_refits_run_off_the_tick_path() -> None:
    spec = _spec()
    rec, cluster, clock = _reconciler(spec)
    forecasts = rec.forecasts
    assert isinstance(forecasts, ForecastStage)
    times = [clock.t - 7200 + 60 * i for i in range(120)]
    forecasts.warm(P, times, [100_000.0 + 1000 * (i % 10) for i in range(120)])
    _load(cluster, 100_000, 10_000)
    report = rec.tick()
    assert report.decisions[P].forecast is None  # not fitted yet: sized on the demand
    # The tick scheduled the refit on the worker and did not fit inline.
    assert P in rec._refits
    rec.wait_for_refits()
    assert forecasts.forecasters[P].fitted is not None
    clock.t += 15
    report = rec.tick()
    # The decision carries the forecast it used, typed: what /v1/forecast shows; the load
    # sized for is the higher of it and the demand now.
    used = report.decisions[P].forecast
    assert used is not None
    assert report.decisions[P].detail["load"] == max(used.sized_value, 100_000.0)
    assert used.horizons_s[0] == 60.0 and used.trained_horizons_s == (60.0, 600.0)
    rec.close()


def test_each_tick_is_a_trace_with_its_steps() -> None:
    exporter = InMemorySpanExporter()
    rec, cluster, _ = _reconciler(_spec(), exporter=exporter)
    _load(cluster, 200_000, 30_000)
    rec.tick()
    spans = exporter.get_finished_spans()
    tick = next(s for s in spans if s.name == "pdscale.tick")
    children = {s.name for s in spans if s.parent is not None
                and s.parent.span_id == tick.context.span_id}
    assert {"observe", "decide", "act"} <= children
    assert tick.attributes is not None and tick.attributes["pdscale.pools"] == 4


def test_run_loop_ticks_on_the_clock_and_stops() -> None:
    rec, cluster, clock = _reconciler(_spec())
    _load(cluster, 200_000, 30_000)
    stop = threading.Event()
    start = clock.t
    original = rec.tick

    def counting_tick():  # type: ignore[no-untyped-def]
        report = original()
        if rec.ticks >= 5:
            stop.set()
        return report

    rec.tick = counting_tick  # type: ignore[method-assign]
    rec.run(stop)
    assert rec.ticks == 5
    assert clock.t - start == pytest.approx(4 * 15)


def test_budget_and_ratio_apply_in_the_loop() -> None:
    spec = _spec("gpu_budget: 10\n")
    rec, cluster, _ = _reconciler(spec)
    _load(cluster, 2_000_000, 300_000)
    report = rec.tick()
    assert sum(p.desired * p.gpus for p in cluster.pools.values()) <= 10
    assert any(d.cause == "budget" for d in report.decisions.values())


def test_the_controller_exports_every_series_its_dashboards_and_alerts_read() -> None:
    """The autoscaler dashboard and the control-plane alert read pdscale's own series: after a
    tick with forecasts, staleness and an alert reaction, every one of them is exported."""
    from pdscale.alerts import alerting_groups
    from pdscale.controller._webhook import AlertmanagerAlert, AlertReceiver
    from pdscale.dashboards import build_dashboards, panel_queries
    from pdscale.telemetry import CONTROL_PLANE_METRICS, metric_names_in

    spec = _spec("gpu_budget: 40\n")
    rec, cluster, clock = _reconciler(spec)
    forecasts = rec.forecasts
    assert isinstance(forecasts, ForecastStage)
    times = [clock.t - 7200 + 60 * i for i in range(120)]
    for key in cluster.pools:
        forecasts.warm(key, times, [50_000.0 + 500 * (i % 7) for i in range(120)])
        forecasts.refit(key, clock.t)
    _load(cluster, 100_000, 20_000)
    original = cluster.observe

    def with_ages(now_s: float):  # type: ignore[no-untyped-def]
        result = original(now_s)
        result.staleness = {k: {Signal.PROMPT_TOKENS_PER_S: 12.0} for k in cluster.pools}
        return result

    cluster.observe = with_ages  # type: ignore[method-assign]
    rec.tick()
    receiver = AlertReceiver(spec, overrides=rec.overrides, now=clock.now,
                             telemetry=rec.telemetry, current_replicas=lambda key: 2)
    receiver.process(AlertmanagerAlert.model_validate({
        "status": "firing", "fingerprint": "f", "labels": {
            "alertname": "LLMQueueBacklogHigh", "severity": "critical",
            "pdscale_service": "chat", "pdscale_pool": "prefill"}}))
    exported = {line.split("{")[0].split(" ")[0]
                for line in rec.telemetry.render().decode().splitlines()
                if line and not line.startswith("#")}
    read: set[str] = set()
    for doc in build_dashboards(spec):
        for _, _, expr in panel_queries(doc.model):
            read |= metric_names_in(expr)
    for group in alerting_groups(spec):
        for rule in group["rules"]:
            read |= metric_names_in(rule["expr"])
    wanted = read & CONTROL_PLANE_METRICS
    assert wanted, "the dashboards and alerts read no control-plane series?"
    assert wanted <= exported, f"read but not exported: {sorted(wanted - exported)}"
    missing = CONTROL_PLANE_METRICS - exported
    assert not missing, f"catalogued but never exported: {sorted(missing)}"


def _counter(text: str, name: str, **labels: str) -> float:
    """The value of one series in a Prometheus text exposition (0 when absent)."""
    for line in text.splitlines():
        if line.startswith(name + "{") and all(f'{k}="{v}"' in line for k, v in labels.items()):
            return float(line.rsplit(" ", 1)[1])
    return 0.0


def test_data_health_reads_sample_age_and_targets() -> None:
    from pdscale.controller._cluster import data_health
    from pdscale.telemetry import Signal, SignalValue

    fresh = {Signal.SAMPLE_AGE_S: SignalValue(1.0, 0.5), Signal.TARGETS_UP: SignalValue(3, 0.5),
             Signal.TARGETS: SignalValue(3, 0.5)}
    assert data_health(fresh, 100.0, 60.0) == (1.5, None)
    partial = {**fresh, Signal.TARGETS_UP: SignalValue(2, 0.5)}
    assert data_health(partial, 100.0, 60.0) == (1.5, "1 of 3 scrape targets down")
    old = {**fresh, Signal.SAMPLE_AGE_S: SignalValue(90.0, 0.5)}
    age, why = data_health(old, 100.0, 60.0)
    assert age == 90.5 and why is not None and "90s old" in why
    gone = {**fresh, Signal.SAMPLE_AGE_S: SignalValue(None, None)}
    assert data_health(gone, 100.0, 60.0)[0] is None
    assert "no fresh engine sample" in (data_health(gone, 100.0, 60.0)[1] or "")


def test_a_degraded_pool_is_never_scaled_down_but_may_grow() -> None:
    from pdscale.controller._interface import (
        Observation,
        PoolDecision,
        PoolObservation,
        PoolReplicas,
    )
    from pdscale.controller._reconciler import hold_degraded
    from pdscale.spec import Role

    key = ("s", Role.PREFILL)
    replicas = PoolReplicas(ready=4, starting=0, draining=0, desired=4, min_replicas=1,
                            max_replicas=10)
    obs = Observation(0.0, {key: PoolObservation(key, replicas, {}, 0.0,
                                                 degraded="1 of 4 scrape targets down")})
    down = {key: PoolDecision(2, ("forecast",), "scale_down")}
    hold_degraded(down, obs)
    assert down[key].desired_replicas == 4 and down[key].cause == "degraded"
    assert "1 of 4 scrape targets down" in down[key].reasons[-1]
    up = {key: PoolDecision(6, ("forecast",), "forecast")}
    hold_degraded(up, obs)
    assert up[key].desired_replicas == 6 and up[key].cause == "forecast"
    assert up[key].detail["degraded"] == "1 of 4 scrape targets down"
