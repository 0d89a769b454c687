"""The alert loop end to end, every server real and on loopback: the simulator in live mode, a
real Prometheus scraping it with the generated rules, the distribution's Alertmanager with the
generated configuration pointing at the controller, and the controller (its HTTP API served by
uvicorn; Kubernetes behind the API stand-in, whose scale writes are forwarded to the
simulator).

The controller reads the same Prometheus, where a ``scale_up`` reaction checks that the
shortage it answers shows now; its policy holds every pool, so only alert reactions move
them: what scales the prefill pool here is the alert.

Timing changes from the generated configuration, all made here: alert ``for`` durations of 0s
(spec thresholds), Alertmanager's group interval 2s instead of 30s, and a 1 s scrape and rule
interval. The TTFT alert is on a 5-minute p95, so it stays firing for minutes after the pool
recovers; resolution is exercised with a second alert sent to Alertmanager's API (firing, then
resolved), the way Prometheus sends them, for a hold (which checks no shortage).
"""

from __future__ import annotations

import json
import threading
import time
import urllib.request
from collections import deque
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import uvicorn
from kubernetes import client as k8s

from pdscale._servers import write_rule_files
from pdscale.alerts import alert_files, alertmanager_config
from pdscale.controller._api import create_app
from pdscale.controller._reconciler import SystemClock
from pdscale.controller._runtime import Controller, reader_from_spec
from pdscale.simulator import EventSimulator
from pdscale.simulator._live import LiveCluster, serve_live
from pdscale.simulator._simulate import SimOptions, prepare
from pdscale.simulator._trace import Trace
from pdscale.spec import Role, parse_spec
from tests.conftest import free_port, need_tool
from tests.controller.kube_standin import ApiState, api_standin
from tests.e2e.prom import alertmanager, eventually, prometheus

pytestmark = pytest.mark.e2e
SPEED = 10.0

SPEC = """
version: 1
services:
  - name: chat
    namespace: llm
    engine: vllm
    model_name: meta-llama/Llama-3.1-8B-Instruct
    slo: {ttft_p95_s: 0.5, itl_p95_s: 0.05}
    pools:
      prefill: {target: {name: chat-prefill}, min_replicas: 2, max_replicas: 16,
                cold_start: 20s}
      decode: {target: {name: chat-decode}, min_replicas: 2, max_replicas: 16,
               cold_start: 20s}
alerts:
  evaluation_interval: 1s
  thresholds:
    ttft_high: {warning: {value: 1.0, for: 0s}, critical: {value: 2.0, for: 0s}}
    queue_backlog: {warning: {value: 5, for: 0s}, critical: {value: 20, for: 0s}}
  webhook: {url: "http://127.0.0.1:@PORT@/v1/alerts/alertmanager",
            credentials_file: "@TOKEN@"}
controller:
  prometheus: {url: "http://127.0.0.1:@DEAD@", timeout: 1s}
reactions:
  cooldown: 0s
  max_actions: 10
  window: 10m
  auth: {bearer_token_file: "@TOKEN@"}
  rules:
    - match: {severity: critical}
      match_re: {alertname: "LLMTimeToFirstTokenHigh|LLMQueueBacklogHigh"}
      action: scale_up
      to: 10
      hold: 10m
    - match: {severity: critical, alertname: LLMPoolTargetDown}
      action: hold_scale_down
      hold: 10m
"""


class _Hold:
    """Keeps every pool where it is: only alert reactions change the replicas."""

    name = "hold"

    def decide(self, observation: Any) -> dict[Any, Any]:
        from pdscale.controller import PoolDecision

        return {key: PoolDecision(pool.replicas.desired, ("held by the test",))
                for key, pool in observation.pools.items()}


def _trace() -> Trace:
    """4 req/s for a minute, then a surge to 80 req/s of 2,000-token prompts (two prefill
    replicas serve about 47), for an hour."""
    rng = np.random.default_rng(3)
    calm = np.sort(rng.uniform(0, 60, 240))
    surge = np.sort(rng.uniform(60, 3660, 80 * 3600))
    arrival = np.concatenate([calm, surge])
    n = len(arrival)
    return Trace("surge", arrival, np.full(n, 2000, dtype=np.int64),
                 np.full(n, 40, dtype=np.int64))


def _alerts(prom: str) -> Any:
    with urllib.request.urlopen(f"{prom}/api/v1/alerts", timeout=5) as resp:
        return [(a["labels"]["alertname"], a["labels"]["severity"], a["state"], a["value"])
                for a in json.loads(resp.read())["data"]["alerts"]]


def _post(url: str, body: bytes, headers: dict[str, str]) -> int:
    req = urllib.request.Request(url, data=body, method="POST", headers=headers)
    try:
        with urllib.request.urlopen(req, timeout=5) as resp:
            return int(resp.status)
    except urllib.error.HTTPError as exc:
        return int(exc.code)


@pytest.fixture
def loop(tmp_path: Path) -> Iterator[dict[str, Any]]:
    need_tool("prometheus")
    need_tool("prometheus-alertmanager")
    token = tmp_path / "webhook-token"
    token.write_text("e2e-secret\n")
    port = free_port()
    spec = parse_spec(SPEC.replace("@PORT@", str(port)).replace("@TOKEN@", str(token))
                      .replace("@DEAD@", str(free_port())))
    # The live simulator.
    prepared = prepare(spec, SimOptions(duration_s=3660, mode="event"))
    sim = EventSimulator(prepared.setup, _trace())
    service = spec.services[0]
    live = LiveCluster(sim, namespace=service.namespace, model_name=service.model_name,
                       pod_prefix={r: service.pools[r].target.name for r in Role}, speed=SPEED)
    live_port: list[int] = []
    stop_live, live_ready = threading.Event(), threading.Event()
    live_thread = threading.Thread(target=serve_live, args=(live,), daemon=True,
                                   kwargs={"port": 0, "stop": stop_live, "ready": live_ready,
                                           "on_port": live_port.append})
    live_thread.start()
    assert live_ready.wait(10)
    # Kubernetes: scale writes go on to the simulator's pools.
    state = ApiState()
    state.add("llm", "deployments", "chat-prefill", sim.desired[Role.PREFILL])
    state.add("llm", "deployments", "chat-decode", sim.desired[Role.DECODE])
    names = {service.pools[r].target.name: r for r in Role}
    state.on_scale = lambda ns, plural, name, replicas: live.scale(names[name].value, replicas)
    # Rules and Alertmanager config as generated, with the timing changes in the docstring.
    rules = write_rule_files(alert_files(spec), tmp_path)
    am_config = alertmanager_config(spec)
    am_config["route"]["routes"][0]["group_interval"] = "2s"
    am_port = free_port()
    with api_standin(state) as kube_url, \
            alertmanager(am_config, tmp_path, am_port) as am_url:
        prom_config = {
            "global": {"scrape_interval": "1s", "evaluation_interval": "1s"},
            "rule_files": rules,
            "alerting": {"alertmanagers": [{"static_configs": [
                {"targets": [f"127.0.0.1:{am_port}"]}]}]},
            "scrape_configs": [{"job_name": "sim", "honor_labels": True, "static_configs": [
                {"targets": [f"127.0.0.1:{live_port[0]}"]}]}],
        }
        with prometheus(prom_config, tmp_path, free_port()) as prom_url:
            kconf = k8s.Configuration(host=kube_url)
            kconf.retries = False
            with k8s.ApiClient(kconf) as api:
                controller = Controller(spec, api, reader_from_spec(spec, url=prom_url),
                                        clock=SystemClock(), identity="e2e",
                                        leader_election=False, policy=_Hold())
                server = uvicorn.Server(uvicorn.Config(create_app(controller),
                                                       host="127.0.0.1", port=port,
                                                       log_level="warning"))
                server_thread = threading.Thread(target=server.run, daemon=True)
                server_thread.start()
                eventually(lambda: server.started, 20, "controller API up")
                controller.start()
                try:
                    yield {"controller": controller, "live": live, "state": state,
                           "am": am_url, "prom": prom_url, "hook": spec.alerts.webhook.url,
                           "token": "e2e-secret"}
                finally:
                    controller.stop()
                    server.should_exit = True
                    server_thread.join(timeout=10)
    stop_live.set()
    live_thread.join(timeout=10)


def test_surge_alert_scales_prefill_then_resolves(loop: dict[str, Any]) -> None:
    controller: Controller = loop["controller"]
    live: LiveCluster = loop["live"]
    receiver = controller.receiver

    def applied() -> list[Any]:
        return [r for r in list(receiver.records)
                if r.action == "scale_up" and r.outcome == "applied"]

    first = eventually(applied, 90, "a critical alert delivered and acted on")[0]
    assert first.pool == ("chat", Role.PREFILL)
    assert first.alertname in ("LLMQueueBacklogHigh", "LLMTimeToFirstTokenHigh")
    # The reaction's floor reaches the simulator's prefill pool through the scale subresource.
    eventually(lambda: live.status()["pools"]["prefill"]["desired"] >= 10, 30,
                "prefill scaled to the reaction's floor in the simulator")
    decisions = eventually(
        lambda: [d for d in list(controller.reconciler.decisions)
                 if d.pool == ("chat", Role.PREFILL) and d.outcome == "applied"], 10,
        "the decision recorded")
    assert decisions[0].cause == "reaction"
    assert any("reaction" in r for r in decisions[0].reasons)
    # The webhook's worker posts the Event after recording the reaction, on its own thread,
    # while the tick it woke scales: the Event may land a moment after the decision.
    eventually(lambda: any(e["reason"] == "PdscaleAlertReaction"
                           for e in list(loop["state"].events)), 10,
               "the reaction recorded as a Kubernetes Event",
               lambda: f"events {[e['reason'] for e in list(loop['state'].events)]}")
    # It acted on a shortage read from Prometheus, and its floor stands only while that shows
    # (tests/controller/test_present.py ends one when it clears).
    assert "over the last minute" in first.message or "waiting on" in first.message
    floors = controller.reconciler.overrides.active(time.time())["floors"] + \
        controller.reconciler.overrides.active(time.time())["ended"]
    assert any(f["cause"] == first.fingerprint for f in floors)
    # Resolution. Live mode serves every pod from one scrape target, so a second alert goes in
    # through Alertmanager's API, as Prometheus sends them: firing, then resolved (endsAt
    # passed). A hold, which checks no shortage, stands until it resolves.
    labels = {"alertname": "LLMPoolTargetDown", "severity": "critical", "namespace": "llm",
              "pdscale_service": "chat", "pdscale_pool": "decode"}
    started = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(time.time() - 30))
    am = f"{loop['am']}/api/v2/alerts"
    firing = [{"labels": labels, "annotations": {}, "startsAt": started}]
    assert _post(am, json.dumps(firing).encode(), {"Content-Type": "application/json"}) == 200
    acted = eventually(lambda: [r for r in list(receiver.records)
                                 if r.alertname == "LLMPoolTargetDown"
                                 and r.outcome == "applied"], 30, "the hold alert acted on")
    fingerprint = acted[0].fingerprint
    assert any(o["cause"] == fingerprint for o in
               controller.reconciler.overrides.active(time.time())["holds"])
    ended = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(time.time() - 1))
    resolved = [{"labels": labels, "annotations": {}, "startsAt": started, "endsAt": ended}]
    assert _post(am, json.dumps(resolved).encode(), {"Content-Type": "application/json"}) == 200
    eventually(lambda: [r for r in list(receiver.records) if r.outcome == "resolved"
                         and r.fingerprint == fingerprint], 30,
                "Alertmanager delivered the resolution",
                lambda: [(r.alertname, r.status, r.outcome) for r in list(receiver.records)])
    active = controller.reconciler.overrides.active(time.time())
    assert all(o["cause"] != fingerprint for o in active["floors"] + active["holds"])
    status = controller.status()
    assert status["webhook"]["received"] >= 2
    metrics = controller.telemetry.render().decode()
    assert 'pdscale_alert_reactions_total{action="scale_up"' in metrics


def test_duplicates_malformed_and_a_flood(loop: dict[str, Any]) -> None:
    controller: Controller = loop["controller"]
    receiver = controller.receiver
    hook, token = loop["hook"], loop["token"]
    headers = {"Content-Type": "application/json", "Authorization": f"Bearer {token}"}
    # A malformed payload: 4xx, nothing recorded. (The simulator's surge may be raising real
    # alerts meanwhile: count, do not expect zero.)
    received = receiver.received
    assert _post(hook, b'{"version": "4", "alerts": "nope"}', headers) == 422
    assert _post(hook, b"garbage", headers) == 400
    assert _post(hook, b"{}", {"Content-Type": "application/json"}) == 401
    assert receiver.received == received
    # The receiver keeps its last 1,000 records; the flood's, any redeliveries and the
    # surge's own alerts together may pass that, so this test keeps them all.
    receiver.records = deque(receiver.records, maxlen=100_000)
    # A flood of 1,000 distinct critical alerts through the real Alertmanager.
    now = time.time()
    alerts = [{"labels": {"alertname": "LLMQueueBacklogHigh", "severity": "critical",
                          "namespace": "llm", "pdscale_service": "chat",
                          "pdscale_pool": "prefill" if i % 2 else "decode", "shard": str(i)},
               "annotations": {"summary": "flood"},
               "startsAt": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(now))}
              for i in range(1000)]
    code = _post(f"{loop['am']}/api/v2/alerts", json.dumps(alerts).encode(),
                 {"Content-Type": "application/json"})
    assert code == 200
    eventually(lambda: receiver.received >= received + 1000, 60,
                "the flood delivered by Alertmanager")
    eventually(lambda: len({r.fingerprint for r in list(receiver.records)
                            if r.time_s >= now - 1 and r.alertname == "LLMQueueBacklogHigh"})
               >= 1000, 60, "every alert of the flood weighed")
    assert receiver.wait_idle(30)
    # Alertmanager may deliver the group in parts and resend it whole: count each alert
    # (fingerprint) once, by whether any of its deliveries was acted on or rate-limited.
    records = [r for r in list(receiver.records) if r.time_s >= now - 1]
    acted = {r.fingerprint for r in records if r.outcome == "applied"}
    assert len(acted) <= controller.spec.reactions.max_actions
    # Weighed and not acted on: over the rate limit; no shortage now (decode, which the surge
    # does not make short); or nothing to add (prefill already at the floor asked).
    limited = {r.fingerprint for r in records
               if r.outcome in ("rate_limited", "no_shortage", "refused")} - acted
    assert len(limited) >= 1000 - len(acted)
    # The same alert twice in one delivery counts once. Redelivered while the rate limit
    # holds, it is weighed again each time (so Alertmanager's repeat acts once the limit
    # allows), never remembered as handled.
    duplicates = receiver.duplicates
    dup = {"status": "firing", "labels": alerts[0]["labels"], "annotations": {},
           "startsAt": "2026-12-02T10:00:00Z", "fingerprint": "dup-1"}
    payload = {"version": "4", "status": "firing", "receiver": "pdscale", "alerts": [dup, dup]}
    body = json.dumps(payload).encode()
    assert _post(hook, body, headers) == 200
    assert receiver.wait_idle(5)
    assert receiver.duplicates == duplicates + 1
    assert _post(hook, body, headers) == 200
    assert receiver.wait_idle(5)
    assert receiver.duplicates == duplicates + 2
    dups = [r.outcome for r in list(receiver.records) if r.fingerprint == "dup-1"]
    assert len(dups) == 2 and set(dups) <= {"rate_limited", "cooldown", "no_shortage", "refused"}
