"""The controller's HTTP API and the Alertmanager webhook receiver, in process (FastAPI's test
client), with Kubernetes behind the API stand-in and a Prometheus that is down."""

from __future__ import annotations

import base64
import json
import os
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient
from hypothesis import given, settings
from hypothesis import strategies as st
from kubernetes import client as k8s

from pdscale.controller._api import create_app
from pdscale.controller._runtime import Controller, reader_from_spec
from pdscale.spec import Role, Spec, parse_spec
from pdscale.telemetry import Signal
from tests.conftest import free_port
from tests.controller.kube_standin import ApiState, api_standin
from tests.controller.memory_cluster import ManualClock

SPEC = """
version: 1
services:
  - name: chat
    namespace: llm
    engine: vllm
    model_name: llama
    slo: {ttft_p95_s: 0.5, itl_p95_s: 0.05}
    pools:
      prefill: {target: {name: chat-prefill}, min_replicas: 2, max_replicas: 20}
      decode: {target: {name: chat-decode}, min_replicas: 2, max_replicas: 20}
controller:
  prometheus: {url: "http://127.0.0.1:PORT", timeout: 1}
reactions:
  cooldown: 60s
  max_actions: 5
  window: 10m
  auth: {bearer_token_file: "@TOKEN@", bearer_token_env: PDSCALE_TEST_WEBHOOK_TOKEN,
         basic_auth_file: "@BASIC@"}
"""
P = ("chat", Role.PREFILL)
D = ("chat", Role.DECODE)


class Env:
    def __init__(self, client: TestClient, controller: Controller, state: ApiState,
                 clock: ManualClock, token_file: Path) -> None:
        self.client, self.controller, self.state = client, controller, state
        self.clock, self.token_file = clock, token_file

    def post(self, body: Any, token: str | None = "s3cret", **headers: str) -> Any:
        h = {"Content-Type": "application/json", **headers}
        if token is not None:
            h["Authorization"] = f"Bearer {token}"
        data = body if isinstance(body, bytes) else json.dumps(body).encode()
        return self.client.post("/v1/alerts/alertmanager", content=data, headers=h)


def make_spec(tmp_path: Path, extra: str = "") -> Spec:
    token, basic = tmp_path / "token", tmp_path / "basic"
    token.write_text("s3cret\n")
    basic.write_text("alertmanager:pa55")
    text = (SPEC.replace("PORT", str(free_port())).replace("@TOKEN@", str(token))
            .replace("@BASIC@", str(basic)))
    return parse_spec(text + extra)


SHORT = {Signal.TTFT_P95_RECENT_S: 5.0, Signal.ITL_P95_RECENT_S: 1.0, Signal.QUEUE_DEPTH: 50.0}
"""Every pool short of capacity now: the last minute's latency far over its SLO and a long
queue (what a scale_up reaction checks before it acts, ``controller._present``)."""


class ShortOfCapacity:
    """An observation source that shows :data:`SHORT` on every pool over what ``source``
    read (a Prometheus that is down here: the policy still holds every pool)."""

    def __init__(self, source: Any) -> None:
        self.source = source

    def observe(self, now_s: float) -> Any:
        from dataclasses import replace

        from pdscale.controller import Observation

        result = self.source.observe(now_s)
        pools = {k: replace(p, signals={**p.signals, **SHORT})
                 for k, p in result.observation.pools.items()}
        return replace(result, observation=Observation(now_s, pools))


def short_pool(key: Any) -> Any:
    """The pool as the loop would have read it while short of capacity."""
    from pdscale.controller import PoolObservation, PoolReplicas

    return PoolObservation(key, PoolReplicas(2, 0, 0, 2, 2, 20), dict(SHORT), 0.0)


@contextmanager
def running(spec: Spec, token_file: Path, *, dry_run: bool | None = None,
            short: bool = True) -> Iterator[Env]:
    """The controller's app against the API stand-in (two pools, two pods), in process; with
    ``short`` every pool reads as short of capacity now (:class:`ShortOfCapacity`), so the
    webhook's scale_up reactions act."""
    state = ApiState()
    state.add("llm", "deployments", "chat-prefill", 2)
    state.add("llm", "deployments", "chat-decode", 2)
    state.add_pod("llm", "chat-prefill-7d9f-abcde", {"app": "chat-prefill",
                                                     "pdscale.io/serving": "true"})
    state.add_pod("llm", "other-app-1", {"app": "other"})
    clock = ManualClock()
    with api_standin(state) as url:
        config = k8s.Configuration(host=url)
        config.retries = False
        with k8s.ApiClient(config) as api:
            controller = Controller(spec, api, reader_from_spec(spec), clock=clock,
                                    identity="test-0", leader_election=False,
                                    dry_run=dry_run)
            if short:
                controller.reconciler.source = ShortOfCapacity(controller.reconciler.source)
                controller.receiver.observe = short_pool
            with TestClient(create_app(controller)) as client:
                yield Env(client, controller, state, clock, token_file)
            controller.reconciler.close()


@pytest.fixture
def env(tmp_path: Path) -> Iterator[Env]:
    with running(make_spec(tmp_path), tmp_path / "token") as e:
        yield e


def alert(name: str = "LLMTimeToFirstTokenHigh", severity: str = "critical",
          status: str = "firing", pool: str = "prefill", fingerprint: str = "f1",
          starts: str = "2026-12-02T10:00:00Z", **labels: str) -> dict[str, Any]:
    return {"status": status, "labels": {"alertname": name, "severity": severity,
                                         "namespace": "llm", "pdscale_service": "chat",
                                         "pdscale_pool": pool, **labels},
            "annotations": {"summary": "TTFT p95 high"}, "startsAt": starts,
            "endsAt": "0001-01-01T00:00:00Z", "generatorURL": "http://prom/graph",
            "fingerprint": fingerprint}


def payload(*alerts: dict[str, Any], **extra: Any) -> dict[str, Any]:
    return {"version": "4", "groupKey": "{}:{alertname=\"x\"}", "truncatedAlerts": 0,
            "status": alerts[0]["status"] if alerts else "firing", "receiver": "pdscale",
            "groupLabels": {}, "commonLabels": {}, "commonAnnotations": {},
            "externalURL": "http://am", "alerts": list(alerts), **extra}


# -- plain endpoints -------------------------------------------------------------------------


def test_health_readiness_status_metrics_and_a_degraded_tick(env: Env) -> None:
    assert env.client.get("/healthz").status_code == 200
    ready = env.client.get("/readyz")
    assert ready.status_code == 503 and "warming" in ready.json()["detail"]
    warm = env.controller.warm()  # Prometheus is down: the controller goes on cold
    assert warm["ok"] is False
    report = env.controller.reconciler.tick()
    assert env.client.get("/readyz").status_code == 200
    assert {e.adapter for e in report.errors} == {"prometheus"}
    # No data: hold, never scale down, and say so everywhere.
    assert all(d.cause == "degraded" and d.desired == 2 for d in report.decisions.values())
    status = env.client.get("/v1/status").json()
    assert status["pools"]["chat/prefill"]["cause"] == "degraded"
    assert status["recent_errors"][-1]["adapter"] == "prometheus"
    assert status["webhook"]["auth"].startswith("bearer token file")
    metrics = env.client.get("/metrics")
    assert metrics.headers["content-type"].startswith("text/plain")
    assert 'pdscale_decisions_total{' in metrics.text and 'reason="degraded"' in metrics.text
    assert _counter(metrics.text, "pdscale_adapter_errors_total",
                    adapter="prometheus", kind="unavailable") >= 1
    decisions = env.client.get("/v1/decisions", params={"pool": "decode"}).json()
    assert [d["pool"] for d in decisions["decisions"]] == ["decode"]
    assert env.client.get("/v1/forecast").json()["pools"] == {}
    assert env.client.get("/v1/decisions", params={"limit": 0}).status_code == 422
    # No engine sample's age is known: it grows from the first tick without one, so
    # PDScaleControlPlaneDegraded fires (the decision timestamp stays fresh while the
    # controller holds on no data).
    env.clock.t += 200
    env.controller.reconciler.tick()
    assert _counter(env.client.get("/metrics").text, "pdscale_data_staleness_seconds",
                    pdscale_pool="prefill", signal="sample_age_s") == 200


def test_missing_kubernetes_object_is_reported_and_others_go_on(env: Env) -> None:
    del env.state.objects[("llm", "deployments", "chat-decode")]
    report = env.controller.reconciler.tick()
    assert P in report.decisions and D not in report.decisions
    err = next(e for e in report.errors if e.adapter == "kubernetes")
    assert err.kind == "rejected" and "not found" in err.message and err.pool == D


def test_status_marks_a_decision_later_ticks_did_not_renew(env: Env) -> None:
    env.controller.reconciler.tick()
    pools = env.client.get("/v1/status").json()["pools"]
    assert pools["chat/decode"]["current"] is True
    del env.state.objects[("llm", "deployments", "chat-decode")]
    env.clock.t += 15
    env.controller.reconciler.tick()
    pools = env.client.get("/v1/status").json()["pools"]
    assert pools["chat/prefill"]["current"] is True
    stale = pools["chat/decode"]
    assert stale["current"] is False and stale["decision_age_s"] == 15
    assert "not found" in stale["why_not_current"]


# -- webhook: authentication and input checks -------------------------------------------------


def test_credentials(env: Env, monkeypatch: pytest.MonkeyPatch) -> None:
    body = payload(alert())
    assert env.post(body, token=None).status_code == 401
    assert env.post(body, token="wrong").status_code == 401
    assert env.post(body).status_code == 200
    # Rotation: the file changes, the old token stops working without a restart.
    env.token_file.write_text("n3w-token-longer")
    os.utime(env.token_file, (1, 1))
    assert env.post(payload(alert(fingerprint="f2")), token="s3cret").status_code == 401
    assert env.post(payload(alert(fingerprint="f2")), token="n3w-token-longer").status_code \
        == 200
    monkeypatch.setenv("PDSCALE_TEST_WEBHOOK_TOKEN", "from-env")
    assert env.post(payload(alert(fingerprint="f3")), token="from-env").status_code == 200
    basic = base64.b64encode(b"alertmanager:pa55").decode()
    ok = env.post(payload(alert(fingerprint="f4")), token=None, Authorization=f"Basic {basic}")
    assert ok.status_code == 200
    bad = base64.b64encode(b"alertmanager:nope").decode()
    assert env.post(body, token=None, Authorization=f"Basic {bad}").status_code == 401


def test_malformed_payloads_get_4xx_and_no_action(env: Env) -> None:
    assert env.post(b"{not json").status_code == 400
    assert env.post(payload(alert()), **{"Content-Type": "text/plain"}).status_code == 415
    wrong_version = env.post({**payload(alert()), "version": "3"})
    assert wrong_version.status_code == 422 and "version" in json.dumps(wrong_version.json())
    assert env.post({"version": "4"}).status_code == 422
    big = payload(*[alert(fingerprint=f"x{i}", note="y" * 2000) for i in range(600)])
    assert env.post(big).status_code == 413
    env.controller.receiver.drain_queue()
    assert not env.controller.receiver.records


def test_unknown_fields_are_accepted(env: Env) -> None:
    body = payload(alert(), routeLabels={"a": "b"}, notification_reason="new")
    body["alerts"][0]["extra"] = {"nested": True}
    answer = env.post(body)
    assert answer.status_code == 200 and answer.json()["queued"] == 1


# -- webhook: reactions ------------------------------------------------------------------------


def test_critical_scale_up_acts_once_then_resolves(env: Env) -> None:
    rec = env.controller.reconciler
    first = env.post(payload(alert()))
    assert first.json() == {"status": "accepted", "alerts": 1, "queued": 1, "duplicates": 0}
    again = env.post(payload(alert()))  # an HA peer delivers the same alert
    assert again.json()["duplicates"] == 1
    env.controller.receiver.drain_queue()
    records = env.controller.receiver.records
    assert [(r.action, r.outcome) for r in records] == [("scale_up", "applied")]
    floors = rec.overrides.active(env.clock.now())["floors"]
    assert floors[0]["floor"] == 4 and floors[0]["pool"] == "chat/prefill"  # 2 + step 2
    report = rec.tick()
    assert report.decisions[P].desired >= 4 and report.decisions[P].outcome == "applied"
    assert env.state.objects[("llm", "deployments", "chat-prefill")]["replicas"] >= 4
    assert any(e["reason"] == "PdscaleAlertReaction" for e in env.state.events)
    # Resolved: the hold and floor end.
    env.post(payload(alert(status="resolved")))
    env.controller.receiver.drain_queue()
    assert records[-1].outcome == "resolved"
    assert rec.overrides.active(env.clock.now()) == {"floors": [], "holds": [], "ended": []}
    shown = env.client.get("/v1/decisions").json()["reactions"]
    assert [r["outcome"] for r in shown] == ["applied", "resolved"]
    metrics = env.client.get("/metrics").text
    assert 'pdscale_alert_reactions_total{action="scale_up"' in metrics


def test_warnings_are_recorded_not_acted_on(env: Env) -> None:
    env.post(payload(alert(severity="warning")))
    env.controller.receiver.drain_queue()
    rec = env.controller.receiver.records[-1]
    assert (rec.action, rec.outcome) == ("notify_only", "recorded")
    status = env.client.get("/v1/status").json()["webhook"]
    assert status["firing_warnings"][0]["alertname"] == "LLMTimeToFirstTokenHigh"
    assert env.controller.reconciler.overrides.active(env.clock.now())["floors"] == []


def test_guards_cooldown_rate_limit_kill_switch(env: Env) -> None:
    receiver = env.controller.receiver
    env.post(payload(alert(fingerprint="a")))
    env.post(payload(alert(fingerprint="b")))  # same pool within the cooldown
    receiver.drain_queue()
    assert [r.outcome for r in receiver.records] == ["applied", "cooldown"]
    # A flood of distinct critical alerts across both pools: at most max_actions act.
    for i in range(1000):
        env.clock.t += 61  # past every cooldown, within the 10-minute window for some
        receiver.process(receiver_alert(i))
    applied = [r for r in receiver.records if r.outcome == "applied"]
    assert len(applied) <= 1 + 5 * (1000 * 61 // 600 + 1)
    by_window = _max_in_window([r.time_s for r in applied], 600)
    assert by_window <= 5
    assert any(r.outcome == "rate_limited" for r in receiver.records)
    receiver.enabled = False
    env.clock.t += 3600
    receiver.process(receiver_alert(5000))
    assert receiver.records[-1].outcome == "disabled"


def receiver_alert(i: int) -> Any:
    from pdscale.controller._webhook import AlertmanagerAlert

    return AlertmanagerAlert.model_validate(
        alert(fingerprint=f"flood-{i}", pool="prefill" if i % 2 else "decode",
              name="LLMQueueBacklogHigh"))


def _max_in_window(times: list[float], window: float) -> int:
    best = 0
    for i, t in enumerate(times):
        best = max(best, sum(1 for u in times[i:] if u < t + window))
    return best


def test_drain_labels_only_the_pools_pods(env: Env) -> None:
    receiver = env.controller.receiver
    env.post(payload(alert(name="LLMGPUXidError", fingerprint="x1",
                           pod="chat-prefill-7d9f-abcde")))
    env.post(payload(alert(name="LLMGPUXidError", fingerprint="x2", pool="decode",
                           pod="other-app-1")))
    receiver.drain_queue()
    assert [(r.action, r.outcome) for r in receiver.records] == [
        ("drain_instance", "applied"), ("drain_instance", "refused")]
    labels = env.state.pods[("llm", "chat-prefill-7d9f-abcde")]["metadata"]["labels"]
    assert labels["pdscale.io/serving"] == "drained"
    assert "pdscale.io/serving" not in env.state.pods[("llm", "other-app-1")]["metadata"]["labels"]
    assert env.controller.reconciler.overrides.active(env.clock.now())["holds"]


def test_dry_run_records_and_does_nothing(tmp_path: Path) -> None:
    spec = make_spec(tmp_path, "")
    spec = spec.model_copy(update={"reactions": spec.reactions.model_copy(
        update={"dry_run": True})})
    with running(spec, tmp_path / "token") as dry:
        assert dry.post(payload(alert())).status_code == 200
        dry.controller.receiver.drain_queue()
        assert dry.controller.receiver.records[-1].outcome == "dry_run"
        assert dry.controller.reconciler.overrides.active(0)["floors"] == []
        assert not dry.state.events


# -- robustness ----------------------------------------------------------------------------------

label_st = st.dictionaries(st.sampled_from(["alertname", "severity", "pdscale_service",
                                            "pdscale_pool", "pod", "namespace", "x"]),
                           st.text(max_size=20), max_size=7)
alert_st = st.fixed_dictionaries({
    "status": st.sampled_from(["firing", "resolved", "weird"]),
    "labels": label_st,
    "startsAt": st.text(max_size=30),
    "fingerprint": st.text(max_size=20),
}, optional={"annotations": st.dictionaries(st.text(max_size=5), st.text(max_size=5)),
             "endsAt": st.one_of(st.none(), st.text(max_size=5), st.integers())})
payload_st = st.one_of(
    st.fixed_dictionaries({"version": st.sampled_from(["4", "3", 4]),
                           "status": st.sampled_from(["firing", "resolved", ""]),
                           "alerts": st.lists(alert_st, max_size=5)},
                          optional={"groupLabels": label_st, "truncatedAlerts": st.integers()}),
    st.recursive(st.none() | st.booleans() | st.integers() | st.text(max_size=10),
                 lambda inner: st.lists(inner, max_size=3)
                 | st.dictionaries(st.text(max_size=8), inner, max_size=3), max_leaves=10))


@settings(max_examples=150, deadline=None)
@given(body=payload_st)
def test_generated_payloads_never_crash_the_receiver(env_for_hypothesis: Env,
                                                     body: Any) -> None:
    answer = env_for_hypothesis.post(body)
    assert answer.status_code in (200, 400, 413, 415, 422)
    env_for_hypothesis.controller.receiver.drain_queue()  # processing must not raise either


@pytest.fixture(scope="module")
def env_for_hypothesis(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Env]:
    tmp = tmp_path_factory.mktemp("hyp")
    with running(make_spec(tmp), tmp / "token") as e:
        yield e


def _counter(text: str, name: str, **labels: str) -> float:
    """The value of one series in a Prometheus text exposition (0 when absent)."""
    for line in text.splitlines():
        if line.startswith(name + "{") and all(f'{k}="{v}"' in line for k, v in labels.items()):
            return float(line.rsplit(" ", 1)[1])
    return 0.0


def test_an_unexpected_warm_up_failure_starts_cold_and_the_loop_runs(
        env: Env, monkeypatch: pytest.MonkeyPatch) -> None:
    """Anything the warm-up raises besides Prometheus' own errors (an adapter or forecaster
    bug) used to end the reconcile thread before its first tick, with the process still
    serving and /healthz failing."""
    import pdscale.controller._runtime as runtime

    def broken(*_: Any, **__: Any) -> None:
        raise RuntimeError("forecaster exploded")

    monkeypatch.setattr(runtime, "warm_from_history", broken)
    warm = env.controller.warm()
    assert warm == {"ok": False, "error": "RuntimeError: forecaster exploded"}
    assert env.controller.reconciler.errors[-1].adapter == "forecaster"
    report = env.controller.reconciler.tick()  # the loop goes on, cold
    assert report.decisions
