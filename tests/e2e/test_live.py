"""The simulator's live mode scraped by a real Prometheus with the generated rules."""

from __future__ import annotations

import json
import threading
import urllib.request
from pathlib import Path
from typing import Any

import pytest

from pdscale._servers import write_rule_files
from pdscale.alerts import alert_files
from pdscale.simulator import EventSimulator, synthetic_trace
from pdscale.simulator._live import LiveCluster, serve_live
from pdscale.simulator._simulate import SimOptions, prepare
from pdscale.spec import Role, load_spec
from tests.conftest import ROOT, free_port, need_tool
from tests.e2e.prom import api, eventually, prometheus

pytestmark = pytest.mark.e2e
SPEED = 20.0


def _post(url: str, body: dict[str, Any]) -> dict[str, Any]:
    req = urllib.request.Request(url, data=json.dumps(body).encode(), method="POST",
                                 headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=5) as resp:
        result: dict[str, Any] = json.loads(resp.read())
        return result


def _query(url: str, expr: str) -> list[dict[str, Any]]:
    result: list[dict[str, Any]] = api(url, "/api/v1/query", {"query": expr})["data"]["result"]
    return result


def test_live_metrics_rules_and_scaling(tmp_path: Path) -> None:
    need_tool("prometheus")
    spec = load_spec(ROOT / "examples" / "vllm.yaml")
    prepared = prepare(spec, SimOptions(duration_s=1200, cold_start_s=20, mode="event"))
    assert prepared.trace is not None
    trace = synthetic_trace(duration_s=1200, mean_rps=8, seed=5)
    sim = EventSimulator(prepared.setup, trace)
    service = spec.services[0]
    cluster = LiveCluster(sim, namespace=service.namespace, model_name=service.model_name,
                          pod_prefix={r: service.pools[r].target.name for r in Role},
                          speed=SPEED)
    port: list[int] = []
    stop = threading.Event()
    ready = threading.Event()
    thread = threading.Thread(target=serve_live, args=(cluster,), daemon=True,
                              kwargs={"port": 0, "stop": stop, "ready": ready,
                                      "on_port": port.append})
    thread.start()
    try:
        assert ready.wait(10)
        live = f"http://127.0.0.1:{port[0]}"
        rules = write_rule_files(alert_files(spec), tmp_path)
        config = {
            "global": {"scrape_interval": "1s", "evaluation_interval": "1s"},
            "rule_files": rules,
            "scrape_configs": [{"job_name": "sim", "honor_labels": True,
                                "static_configs": [{"targets": [live.split("//")[1]]}]}],
        }
        with prometheus(config, tmp_path, free_port()) as url:
            # Engine series, one set per pod, and recorded pool series from them.
            pods = eventually(lambda: _query(url, 'count by (pod) (vllm:num_requests_running'
                                                   '{namespace="llm"})'))
            assert len(pods) == sum(sim.counts(r)["ready"] for r in Role)
            ttft = eventually(lambda: _query(
                url, 'pdscale_pool:time_to_first_token_seconds:p95_rate5m'
                     '{pdscale_service="llama-chat",pdscale_pool="prefill"}'))
            assert 0 < float(ttft[0]["value"][1]) < 60
            eventually(lambda: _query(url, 'pdscale_pool:requests:rate5m'
                                            '{pdscale_service="llama-chat"} > 0'))
            eventually(lambda: _query(url, 'pdscale_pool:gpu_utilization:avg'
                                            '{pdscale_pool="decode"}'))
            # Scale the decode pool through the HTTP actuator: pods appear after the cold
            # start (20 simulated seconds, 1 s of wall time at x20).
            before = sim.counts(Role.DECODE)["ready"]
            answer = _post(f"{live}/scale", {"pool": "decode", "replicas": before + 2})
            assert answer["desired"] == before + 2 and answer["starting"] == 2
            eventually(lambda: len(_query(
                url, 'count by (pod) (vllm:num_requests_running{pod=~"llama-chat-decode-.*"})'))
                == before + 2)
            bad = urllib.request.Request(f"{live}/scale", data=b'{"pool": "gpu"}', method="POST")
            with pytest.raises(urllib.error.HTTPError) as info:
                urllib.request.urlopen(bad, timeout=5)
            assert info.value.code == 400
    finally:
        stop.set()
        thread.join(timeout=10)
    assert not thread.is_alive()
