"""The webhook's reactions follow leadership, dry run and authentication, and its dedupe
remembers only what it handled: each test here reproduces a defect found by driving the
controller over HTTP against the Kubernetes API stand-in (every one failed before the fix)."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
from fastapi.testclient import TestClient
from kubernetes import client as k8s

from pdscale.controller._api import create_app
from pdscale.controller._runtime import Controller, is_loopback, reader_from_spec
from pdscale.spec import Spec, parse_spec
from tests.controller.kube_standin import ApiState, api_standin
from tests.controller.memory_cluster import ManualClock
from tests.controller.test_api import (
    SPEC,
    Env,
    alert,
    make_spec,
    payload,
    running,
    short_pool,
)

POD = "chat-prefill-7d9f-abcde"


def _xid(fingerprint: str = "x1") -> dict[str, object]:
    return alert(name="LLMGPUXidError", fingerprint=fingerprint, pod=POD)


def _serving_label(state: ApiState) -> str | None:
    labels: dict[str, str] = state.pods[("llm", POD)]["metadata"]["labels"]
    return labels.get("pdscale.io/serving")


# -- dry run --------------------------------------------------------------------------------------


def test_controller_dry_run_stops_every_reaction_write(tmp_path: Path) -> None:
    """`pdscale run --dry-run` (the controller's dry run, reactions.dry_run left false): a
    critical XID alert and a critical TTFT alert are recorded as dry_run; no pod label, no
    floor, no hold, no Event."""
    spec = make_spec(tmp_path)
    assert spec.reactions.dry_run is False
    with running(spec, tmp_path / "token", dry_run=True) as env:
        assert env.post(payload(_xid())).status_code == 200
        assert env.post(payload(alert(fingerprint="t1", pool="decode"))).status_code == 200
        env.controller.receiver.drain_queue()
        outcomes = [(r.action, r.outcome) for r in env.controller.receiver.records]
        assert outcomes == [("drain_instance", "dry_run"), ("scale_up", "dry_run")]
        assert _serving_label(env.state) == "true"
        assert env.controller.reconciler.overrides.active(env.clock.now()) == {
            "floors": [], "holds": [], "ended": []}
        assert not env.state.events
        assert env.client.get("/v1/status").json()["webhook"]["dry_run"] is True


# -- leadership -----------------------------------------------------------------------------------


@contextmanager
def _pair(tmp_path: Path) -> Iterator[tuple[Env, Env]]:
    """Two controller replicas with leader election on one API stand-in, as deploy/ runs them."""
    spec = make_spec(tmp_path)
    state = ApiState()
    state.add("llm", "deployments", "chat-prefill", 2)
    state.add("llm", "deployments", "chat-decode", 2)
    state.add_pod("llm", POD, {"app": "chat-prefill", "pdscale.io/serving": "true"})
    clock = ManualClock()
    with api_standin(state) as url:
        config = k8s.Configuration(host=url)
        config.retries = False
        with k8s.ApiClient(config) as api:
            envs = []
            for name in ("pdscale-a", "pdscale-b"):
                c = Controller(spec, api, reader_from_spec(spec), clock=clock, identity=name,
                               leader_election=True)
                envs.append((c, TestClient(create_app(c))))
            (ca, ta), (cb, tb) = envs
            for c, _ in envs:
                c.receiver.observe = short_pool
            assert ca.lease_step() and not cb.lease_step()
            with ta, tb:
                yield (Env(ta, ca, state, clock, tmp_path / "token"),
                       Env(tb, cb, state, clock, tmp_path / "token"))
            ca.reconciler.close()
            cb.reconciler.close()


def test_only_the_leader_acts_the_standby_answers_503(tmp_path: Path) -> None:
    with _pair(tmp_path) as (leader, standby):
        for body in (payload(_xid()), payload(alert(fingerprint="t1", pool="decode"))):
            answer = standby.post(body)
            assert answer.status_code == 503, answer.text
            assert answer.headers["Retry-After"] == "1"
            assert "standby" in answer.json()["error"]
        standby.controller.receiver.drain_queue()
        assert not standby.controller.receiver.records  # nothing queued, nothing recorded
        assert standby.controller.reconciler.overrides.active(standby.clock.now()) == {
            "floors": [], "holds": [], "ended": []}
        assert _serving_label(standby.state) == "true"
        assert standby.client.get("/v1/status").json()["webhook"]["leader"] is False
        # Alertmanager retries; the delivery that reaches the leader acts.
        assert leader.post(payload(_xid())).status_code == 200
        assert leader.post(payload(alert(fingerprint="t1", pool="decode"))).status_code == 200
        leader.controller.receiver.drain_queue()
        assert [r.outcome for r in leader.controller.receiver.records] == ["applied",
                                                                          "applied"]
        assert _serving_label(leader.state) == "drained"
        floors = leader.controller.reconciler.overrides.active(leader.clock.now())["floors"]
        assert floors and floors[0]["floor"] == 4


def test_an_alert_queued_before_the_lease_was_lost_is_not_acted_on_and_acts_later(
        tmp_path: Path) -> None:
    with _pair(tmp_path) as (leader, _standby):
        assert leader.post(payload(alert(fingerprint="t1"))).status_code == 200
        leader.controller.elector._leader = False  # the lease lapsed before the worker ran
        leader.controller.receiver.drain_queue()
        assert leader.controller.receiver.records[-1].outcome == "not_leader"
        assert leader.controller.reconciler.overrides.active(leader.clock.now())["floors"] == []
        # Leadership back (or the other replica leads): the repeat is not a duplicate.
        leader.controller.elector._leader = True
        again = leader.post(payload(alert(fingerprint="t1"))).json()
        assert again["queued"] == 1 and again["duplicates"] == 0
        leader.controller.receiver.drain_queue()
        assert leader.controller.receiver.records[-1].outcome == "applied"


# -- authentication and exposure ------------------------------------------------------------------


def _unauthenticated_spec(extra: str = "") -> Spec:
    from tests.conftest import free_port

    text = SPEC.replace("PORT", str(free_port()))
    text = text[:text.index("  auth:")]
    return parse_spec(text + extra)


@pytest.mark.parametrize(("host", "loopback"), [
    ("0.0.0.0", False), ("::", False), ("10.0.0.5", False), ("pdscale.example", False),
    ("127.0.0.1", True), ("127.1.2.3", True), ("::1", True), ("[::1]", True),
    ("localhost", True)], ids=lambda v: str(v))
def test_loopback_addresses(host: str, loopback: bool) -> None:
    assert is_loopback(host) is loopback


def test_unauthenticated_on_all_interfaces_disables_the_webhook(tmp_path: Path) -> None:
    spec = _unauthenticated_spec()
    with running(spec, tmp_path / "token") as env:
        refusal = env.controller.expose("0.0.0.0")
        assert refusal is not None and "spec.reactions.auth" in refusal
        answer = env.post(payload(_xid()), token=None)
        assert answer.status_code == 403
        assert "--allow-unauthenticated-webhook" in answer.json()["detail"]
        env.controller.receiver.drain_queue()
        assert not env.controller.receiver.records
        assert _serving_label(env.state) == "true"
        hook = env.client.get("/v1/status").json()["webhook"]
        assert hook["serving"] is False and "no authentication" in hook["refusal"]
        # On loopback, or when told explicitly, it serves.
        assert env.controller.expose("127.0.0.1") is None
        assert env.post(payload(_xid()), token=None).status_code == 200
        assert env.controller.expose("0.0.0.0", allow_unauthenticated=True) is None
        assert env.client.get("/v1/status").json()["webhook"]["serving"] is True


def test_the_spec_can_allow_an_unauthenticated_webhook_explicitly(tmp_path: Path) -> None:
    spec = _unauthenticated_spec("  auth: {allow_unauthenticated: true}\n")
    with running(spec, tmp_path / "token") as env:
        assert env.controller.expose("0.0.0.0") is None


def test_with_authentication_the_webhook_serves_on_every_interface(tmp_path: Path) -> None:
    with running(make_spec(tmp_path), tmp_path / "token") as env:
        assert env.controller.expose("0.0.0.0") is None
        assert env.post(payload(_xid()), token=None).status_code == 401
        assert env.post(payload(_xid())).status_code == 200


# -- dedupe ---------------------------------------------------------------------------------------


def test_a_repeat_after_the_cooldown_acts(env: Env) -> None:
    """Alertmanager repeats a still-firing alert (same fingerprint and startsAt) every
    repeat_interval: one refused by the cooldown must act on a repeat after the cooldown."""
    receiver = env.controller.receiver
    env.post(payload(alert(fingerprint="a")))
    receiver.drain_queue()
    env.post(payload(alert(fingerprint="b")))  # same pool, within the 60 s cooldown
    receiver.drain_queue()
    assert [r.outcome for r in receiver.records] == ["applied", "cooldown"]
    # An HA peer's copy of the applied one stays a duplicate.
    assert env.post(payload(alert(fingerprint="a"))).json()["duplicates"] == 1
    env.clock.t += 61
    repeat = env.post(payload(alert(fingerprint="b"))).json()
    assert repeat["queued"] == 1
    receiver.drain_queue()
    assert receiver.records[-1].outcome == "applied"


def test_a_repeat_after_the_kill_switch_is_lifted_acts(env: Env) -> None:
    receiver = env.controller.receiver
    receiver.enabled = False
    env.post(payload(alert(fingerprint="k")))
    receiver.drain_queue()
    assert receiver.records[-1].outcome == "disabled"
    receiver.enabled = True
    assert env.post(payload(alert(fingerprint="k"))).json()["queued"] == 1
    receiver.drain_queue()
    assert receiver.records[-1].outcome == "applied"


@pytest.fixture
def env(tmp_path: Path) -> Iterator[Env]:
    with running(make_spec(tmp_path), tmp_path / "token") as e:
        yield e


def test_deeply_nested_json_is_a_400_not_a_500(env: Env) -> None:
    for body in (b"[" * 100_000 + b"]" * 100_000, b'{"a":' * 50_000 + b"1" + b"}" * 50_000):
        answer = env.post(body)
        assert answer.status_code == 400, answer.text
        assert "nested" in answer.json()["error"] or "JSON" in answer.json()["error"]


def test_a_refused_connection_is_not_reported_as_a_timeout() -> None:
    from pdscale.telemetry import PrometheusReader, PrometheusUnavailable
    from tests.conftest import free_port

    reader = PrometheusReader(f"http://127.0.0.1:{free_port()}", timeout_s=2)
    with pytest.raises(PrometheusUnavailable) as info:
        reader._call(lambda: reader.client().custom_query("up"))
    assert "cannot connect" in str(info.value) and "within" not in str(info.value)


# -- what uses the cooldown and the rate budget ---------------------------------------------------


def test_a_hold_does_not_delay_the_scale_up_that_follows(env: Env) -> None:
    """A critical target-down (a hold) on a pool, then within the cooldown a critical TTFT
    alert on the same pool: the scale-up acts now, not a repeat interval later."""
    receiver = env.controller.receiver
    env.post(payload(alert(name="LLMPoolTargetDown", fingerprint="down")))
    receiver.drain_queue()
    env.clock.t += 30
    env.post(payload(alert(fingerprint="ttft")))
    receiver.drain_queue()
    assert [(r.action, r.outcome) for r in receiver.records] == [
        ("hold_scale_down", "applied"), ("scale_up", "applied")]
    floors = env.controller.reconciler.overrides.active(env.clock.now())["floors"]
    assert [f["floor"] for f in floors] == [4]
    # The scale-up itself still starts the pool's cooldown.
    env.post(payload(alert(fingerprint="ttft-2")))
    receiver.drain_queue()
    assert receiver.records[-1].outcome == "cooldown"


def test_refused_drains_use_neither_the_cooldown_nor_the_budget(env: Env) -> None:
    """XID alerts on pods that are not the pool's are refused: five of them (the spec's
    max_actions) leave the pool's scale-up free to act at once."""
    receiver = env.controller.receiver
    for i in range(5):
        env.post(payload(alert(name="LLMGPUXidError", fingerprint=f"x{i}",
                               pod=f"someone-else-{i}")))
    receiver.drain_queue()
    assert {r.outcome for r in receiver.records} == {"refused"}
    env.post(payload(alert(fingerprint="ttft")))
    receiver.drain_queue()
    assert receiver.records[-1].outcome == "applied"


def test_an_error_while_acting_is_a_failure_retried_on_the_next_delivery(env: Env) -> None:
    """Reading the pool's replicas raises (a connection error before the pool's first tick):
    the alert is recorded failed, gives back the cooldown and the budget, and Alertmanager's
    repeat of the same alert acts."""
    receiver = env.controller.receiver
    calls = {"n": 0}
    current = receiver.current_replicas

    def flaky(key: tuple[str, object]) -> int | None:
        calls["n"] += 1
        if calls["n"] == 1:
            raise ConnectionError("connection refused")
        return current(key)  # type: ignore[arg-type]

    receiver.current_replicas = flaky  # type: ignore[assignment]
    env.post(payload(alert(fingerprint="ttft")))
    receiver.drain_queue()
    failed = receiver.records[-1]
    assert (failed.outcome, failed.action) == ("failed", "scale_up")
    assert "ConnectionError: connection refused" in failed.message
    assert env.controller.reconciler.overrides.active(env.clock.now())["floors"] == []
    repeat = env.post(payload(alert(fingerprint="ttft"))).json()
    assert (repeat["queued"], repeat["duplicates"]) == (1, 0)
    receiver.drain_queue()  # same instant: no cooldown left over from the failure
    assert receiver.records[-1].outcome == "applied"


def test_a_dry_run_takes_no_part_in_the_election(tmp_path: Path) -> None:
    """`pdscale run --kubeconfig ... --dry-run` from a laptop used to take the cluster's Lease
    (renewing it is a write) and stand the in-cluster controller by: nothing scaled."""
    spec = make_spec(tmp_path)
    state = ApiState()
    state.add("llm", "deployments", "chat-prefill", 2)
    state.add("llm", "deployments", "chat-decode", 2)
    with api_standin(state) as url:
        config = k8s.Configuration(host=url)
        config.retries = False
        with k8s.ApiClient(config) as api:
            laptop = Controller(spec, api, reader_from_spec(spec), identity="laptop",
                                dry_run=True, leader_election=True)
            cluster = Controller(spec, api, reader_from_spec(spec), identity="pdscale-0",
                                 leader_election=True)
            assert laptop.elector is None and laptop.lease_step()  # decides and records
            assert not state.leases
            assert cluster.lease_step()
            assert [lease["spec"]["holderIdentity"] for lease in state.leases.values()] == [
                "pdscale-0"]
            laptop.reconciler.close()
            cluster.reconciler.close()
