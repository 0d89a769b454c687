"""`pdscale up` / `pdscale down`: the local stack on loopback, started, used and stopped."""

from __future__ import annotations

import json
import subprocess
import sys
import time
import urllib.request
from pathlib import Path
from typing import Any

import pytest

from pdscale._servers import alive
from tests.conftest import ROOT, need_tool

pytestmark = pytest.mark.e2e


def _pdscale(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "pdscale", *args], capture_output=True,
                          text=True, timeout=180, cwd=ROOT)


def _get(url: str) -> Any:
    with urllib.request.urlopen(url, timeout=5) as resp:
        return json.loads(resp.read())


def test_up_runs_the_loop_and_down_stops_it(tmp_path: Path) -> None:
    """The stack with ``--otlp``: the simulated pods are scraped by Prometheus and export
    request spans to the controller, which reads gauges from one and latency from the other
    (the stack without ``--otlp`` differs only in the spec's signal_sources:
    tests/pdscale/test_cli.py renders both)."""
    need_tool("prometheus")
    need_tool("prometheus-alertmanager")
    folder = tmp_path / "stack"
    up = _pdscale("up", "--dir", str(folder), "--speed", "20", "--otlp")
    state = json.loads((folder / "up.json").read_text()) if (folder / "up.json").exists() \
        else None
    try:
        assert up.returncode == 0, up.stderr
        assert state is not None
        urls = {p["name"]: p["url"] for p in state["processes"]}
        assert set(urls) == {"simulator", "prometheus", "alertmanager", "controller"}
        for url in urls.values():
            assert url in up.stdout  # every URL is printed
        # A second `up` on the same folder refuses.
        again = _pdscale("up", "--dir", str(folder))
        assert again.returncode == 2 and "pdscale down" in again.stderr
        # The controller decides on real data: Prometheus scrapes the simulator, the recorded
        # series reach the controller, and its decisions are not degraded.
        deadline = time.monotonic() + 60
        status: Any = None
        while time.monotonic() < deadline:
            status = _get(f"{urls['controller']}/v1/status")
            causes = {p["cause"] for p in status["pools"].values()}
            if status["pools"] and "degraded" not in causes:
                break
            time.sleep(1)
        assert status is not None and status["pools"]
        assert "degraded" not in {p["cause"] for p in status["pools"].values()}, status
        # Latency came from the pods' spans, the gauges from Prometheus.
        assert "/v1/traces" in up.stdout and status["otlp"]["accepted_spans"] > 0, status["otlp"]
        assert not status["otlp"]["dropped"], status["otlp"]
        for pool, latency in (("prefill", "ttft_p95_s"), ("decode", "itl_p95_s")):
            answered = status["signal_sources"][f"llama-chat/{pool}"]
            assert answered[latency] == "otlp" and answered["queue_depth"] == "prometheus"
        spans = _get(f"{urls['simulator']}/status")["spans"]
        assert spans["prefill"] > 0 and spans["decode"] > 0
        # Prometheus scrapes the controller's own metrics too.
        targets = _get(f"{urls['prometheus']}/api/v1/targets")["data"]["activeTargets"]
        assert {t["labels"]["job"] for t in targets} == {"simulator", "pdscale"}
    finally:
        down = _pdscale("down", "--dir", str(folder))
    assert down.returncode == 0
    assert state is not None
    for p in state["processes"]:
        assert not alive(p["pid"]), p["name"]
    assert not (folder / "up.json").exists()
    assert "nothing is up" in _pdscale("down", "--dir", str(folder)).stderr
