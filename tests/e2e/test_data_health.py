"""A scrape target dies under a running controller: a real Prometheus with the generated rules
scrapes two engine pods (one a pool), the controller ticks against it (Kubernetes behind the
API stand-in), and the prefill pod's exporter is stopped.

Before the fix the recorded rates kept a value for five minutes, falling as the window
emptied, with a staleness of one rule evaluation: the policy read falling demand with cause
``steady``. Now the pool is degraded as soon as Prometheus has failed one scrape and evaluated
the rules once (1 s each here), and it is never scaled down meanwhile; the other pool is not
affected."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client as k8s

from pdscale._servers import write_rule_files
from pdscale.alerts import alert_files
from pdscale.controller._reconciler import SystemClock
from pdscale.controller._runtime import Controller, reader_from_spec
from pdscale.spec import Role, parse_spec
from tests.conftest import free_port, need_tool
from tests.controller.kube_standin import ApiState, api_standin
from tests.e2e.prom import api, eventually, exporter, prometheus

pytestmark = pytest.mark.e2e

SPEC = """
version: 1
services:
  - name: chat
    namespace: llm
    engine: vllm
    model_name: llama
    slo: {ttft_p95_s: 0.5, itl_p95_s: 0.05}
    pools:
      prefill: {target: {name: chat-prefill}, min_replicas: 1, max_replicas: 16}
      decode: {target: {name: chat-decode}, min_replicas: 1, max_replicas: 16}
alerts:
  evaluation_interval: 1s
controller:
  prometheus: {url: "http://127.0.0.1:@PORT@", timeout: 2s, stale_after: 60s}
"""
P, D = ("chat", Role.PREFILL), ("chat", Role.DECODE)


def _job(address: str, pod: str) -> dict[str, Any]:
    """One pod as a PodMonitor would scrape it: its engine series, and ``up`` with the pod's
    namespace and name."""
    labels = {"namespace": "llm", "pod": pod, "model_name": "llama"}
    return {"job_name": pod, "honor_labels": True, "scrape_timeout": "900ms",
            "params": {"engine": ["vllm"], "labels": [json.dumps(labels)]},
            "static_configs": [{"targets": [str(address)],
                                "labels": {"namespace": "llm", "pod": pod}}]}


_UP = 'up{job="chat-prefill-0"}'


def _value(url: str, expr: str) -> float | None:
    rows = api(url, "/api/v1/query", {"query": expr})["data"]["result"]
    return float(rows[0]["value"][1]) if rows else None


def _evaluated_at(url: str) -> float:
    """When the rules last evaluated the prefill pool: the timestamp of a series its group
    records (a plain selector, so the sample's own time: the group's evaluation time, the same
    for every rule of the group); 0 before the first evaluation."""
    return _value(url, 'timestamp(pdscale_pool:targets:count{pdscale_service="chat", '
                       'pdscale_pool="prefill"})') or 0.0


def test_a_dead_target_is_degraded_within_a_scrape_and_an_evaluation(tmp_path: Path) -> None:
    need_tool("prometheus")
    prom_port = free_port()
    spec = parse_spec(SPEC.replace("@PORT@", str(prom_port)))
    state = ApiState()
    state.add("llm", "deployments", "chat-prefill", 4)
    state.add("llm", "deployments", "chat-decode", 4)
    with exporter(free_port()) as prefill_addr, exporter(free_port()) as decode_addr:
        config = {
            "global": {"scrape_interval": "1s", "evaluation_interval": "1s"},
            "rule_files": write_rule_files(alert_files(spec), tmp_path),
            "scrape_configs": [_job(prefill_addr, "chat-prefill-0"),
                               _job(decode_addr, "chat-decode-0")],
        }
        with prometheus(config, tmp_path, prom_port) as url, api_standin(state) as kube:
            kcfg = k8s.Configuration(host=kube)
            kcfg.retries = False
            with k8s.ApiClient(kcfg) as client:
                controller = Controller(spec, client, reader_from_spec(spec),
                                        clock=SystemClock(), identity="t",
                                        leader_election=False)
                rec = controller.reconciler
                try:
                    # Healthy first: fresh samples, every target up, nothing degraded.
                    def healthy() -> bool:
                        report = rec.tick()
                        return all(report.decisions[k].cause != "degraded" for k in (P, D))

                    eventually(healthy, 30, "a tick on healthy data")
                    age = api(url, "/api/v1/query", {
                        "query": 'pdscale_pool:sample_age:seconds{pdscale_pool="prefill"}'})
                    assert 0 <= float(age["data"]["result"][0]["value"][1]) < 5
                    # The prefill pod's exporter dies (its socket closes: scrapes fail).
                    prefill_addr.close()
                    # Wait for what the claim is about, not a wall-clock guess (a loaded
                    # machine scrapes and evaluates late): Prometheus has recorded one failed
                    # scrape of the pod, then evaluated the rules once after it. Then a tick.
                    def failed_scrape() -> bool:
                        return _value(url, _UP) == 0.0

                    eventually(failed_scrape, 20, "Prometheus to record a failed scrape of "
                               "chat-prefill-0", lambda: f"up is {_value(url, _UP)}")
                    failed = time.time()
                    eventually(lambda: _evaluated_at(url) > failed, 20,
                               "a rule evaluation after the failed scrape",
                               lambda: f"rules last evaluated at {_evaluated_at(url)}, the "
                                       f"failure seen at {failed}")
                    report = rec.tick()
                    prefill, decode = report.decisions[P], report.decisions[D]
                    assert prefill.cause == "degraded", prefill.reasons
                    why = " ".join(prefill.reasons)
                    assert "scrape targets down" in why or "no fresh engine sample" in why
                    assert prefill.desired >= 4  # never scaled down while blind
                    assert decode.cause != "degraded", decode.reasons
                    status = controller.status()["pools"]["chat/prefill"]
                    assert status["cause"] == "degraded" and status["current"] is True
                finally:
                    rec.close()
