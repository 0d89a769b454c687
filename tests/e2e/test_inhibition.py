"""The generated Alertmanager config's inhibition, in a real Alertmanager on loopback: a
critical alert mutes the same alert's warning on the same pool, and only there."""

from __future__ import annotations

import json
import time
import urllib.request
from pathlib import Path

import pytest

from pdscale.alerts import alertmanager_config
from pdscale.spec import parse_spec
from tests.conftest import ROOT, free_port, need_tool
from tests.e2e.prom import alertmanager, api, eventually

pytestmark = pytest.mark.e2e


def _alert(name: str, severity: str, pool: str, **labels: str) -> dict[str, object]:
    return {"labels": {"alertname": name, "severity": severity, "namespace": "llm",
                       "pdscale_service": "llama-chat", "pdscale_pool": pool, **labels},
            "annotations": {"summary": name}}


def test_one_gpus_critical_xid_mutes_only_its_own_warning(tmp_path: Path) -> None:
    need_tool("prometheus-alertmanager")
    spec = parse_spec((ROOT / "examples" / "vllm.yaml").read_text())
    config = alertmanager_config(spec)
    # Deliveries go nowhere (a closed loopback port): inhibition is decided before them.
    for receiver in config["receivers"]:
        for hook in receiver.get("webhook_configs", []):
            hook["url"] = f"http://127.0.0.1:{free_port()}/hook"
            hook.pop("http_config", None)
    alerts = [
        _alert("LLMGPUXidError", "critical", "decode", pod="decode-a", gpu="0"),
        _alert("LLMGPUXidError", "warning", "decode", pod="decode-a", gpu="0"),
        _alert("LLMGPUXidError", "warning", "decode", pod="decode-b", gpu="3"),
        _alert("LLMTimeToFirstTokenHigh", "critical", "prefill"),
        _alert("LLMTimeToFirstTokenHigh", "warning", "prefill"),
        _alert("LLMPoolMetricsAbsent", "critical", "prefill", signal_group="queue"),
        _alert("LLMPoolMetricsAbsent", "warning", "prefill", signal_group="latency"),
    ]
    with alertmanager(config, tmp_path, free_port()) as url:
        req = urllib.request.Request(f"{url}/api/v2/alerts", data=json.dumps(alerts).encode(),
                                     method="POST",
                                     headers={"Content-Type": "application/json"})
        with urllib.request.urlopen(req, timeout=5) as resp:
            assert resp.status == 200

        def states() -> dict[tuple[str, str, str], str] | None:
            got = api(url, "/api/v2/alerts")
            if len(got) < len(alerts):
                return None
            return {(a["labels"]["alertname"], a["labels"]["severity"],
                     a["labels"].get("pod") or a["labels"].get("signal_group") or "-"):
                    a["status"]["state"] for a in got}

        # Alertmanager's inhibitor learns the source alerts from its own subscription, a
        # moment after the POST: until then every alert reads "active". So wait for the
        # expected states, and on timeout show the states last seen.
        expected = {
            ("LLMGPUXidError", "critical", "decode-a"): "active",
            ("LLMGPUXidError", "warning", "decode-a"): "suppressed",
            ("LLMGPUXidError", "warning", "decode-b"): "active",  # another GPU: still sent
            ("LLMTimeToFirstTokenHigh", "critical", "-"): "active",
            ("LLMTimeToFirstTokenHigh", "warning", "-"): "suppressed",
            ("LLMPoolMetricsAbsent", "critical", "queue"): "active",
            ("LLMPoolMetricsAbsent", "warning", "latency"): "active",  # another signal group
        }
        eventually(lambda: states() == expected, 20,
                   "Alertmanager to hold every alert, inhibited as the config says",
                   detail=lambda: f"last seen {states()}")
        # Once the inhibitor has every source alert the answer is settled: it stays so.
        time.sleep(1.0)
        assert states() == expected
