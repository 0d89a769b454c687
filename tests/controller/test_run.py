"""``pdscale run`` as a process: a kubeconfig pointing at the API stand-in, a Prometheus that
is down, leader election on a Lease, the HTTP API, and a clean stop on SIGTERM."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path
from typing import Any

from tests.conftest import ROOT, free_port
from tests.controller.kube_standin import ApiState, api_standin


def _get(url: str) -> tuple[int, Any]:
    try:
        with urllib.request.urlopen(url, timeout=2) as resp:
            return resp.status, json.loads(resp.read())
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read() or b"null")


def _kubeconfig(path: Path, server: str) -> Path:
    path.write_text(json.dumps({
        "apiVersion": "v1", "kind": "Config", "current-context": "c",
        "clusters": [{"name": "s", "cluster": {"server": server}}],
        "users": [{"name": "u", "user": {"token": "t"}}],
        "contexts": [{"name": "c", "context": {"cluster": "s", "user": "u"}}]}))
    return path


def test_run_serves_leads_and_stops_cleanly(tmp_path: Path) -> None:
    state = ApiState()
    for name in ("llama-chat-prefill", "llama-chat-decode"):
        state.add("llm", "deployments", name, 2)
    for name in ("llama-batch-p", "llama-batch-d"):
        state.add("llm-batch", "leaderworkersets", name, 1)
    port = free_port()
    with api_standin(state) as server:
        cmd = [sys.executable, "-m", "pdscale", "run", "--spec",
               str(ROOT / "examples" / "vllm.yaml"), "--kubeconfig",
               str(_kubeconfig(tmp_path / "kubeconfig", server)), "--listen",
               f"127.0.0.1:{port}", "--prometheus-url", f"http://127.0.0.1:{free_port()}",
               "--identity", "pdscale-0", "--log-level", "warning"]
        env = {**os.environ, "POD_NAMESPACE": "pdscale-system"}
        proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                text=True, env=env, cwd=tmp_path)
        try:
            base = f"http://127.0.0.1:{port}"
            deadline = time.monotonic() + 60
            status: Any = None
            while time.monotonic() < deadline:
                try:
                    code, status = _get(f"{base}/v1/status")
                    if code == 200 and status["ticks"] >= 1 and status["leader"]:
                        break
                except OSError:
                    pass
                assert proc.poll() is None, proc.stdout.read() if proc.stdout else ""
                time.sleep(0.3)
            assert status is not None and status["leader"] and status["ticks"] >= 1
            assert status["identity"] == "pdscale-0"
            lease = state.leases[("pdscale-system", "pdscale-leader")]["spec"]
            assert lease["holderIdentity"] == "pdscale-0"
            # Prometheus is down: every pool holds, nothing was scaled, and it says why.
            assert {p["cause"] for p in status["pools"].values()} == {"degraded"}
            assert state.writes == 0
            assert _get(f"{base}/healthz")[0] == 200
            assert _get(f"{base}/readyz")[0] == 200
            with urllib.request.urlopen(f"{base}/metrics", timeout=2) as resp:
                metrics = resp.read().decode()
            assert "pdscale_leader" in metrics and "pdscale_desired_replicas{" in metrics
        finally:
            proc.send_signal(signal.SIGTERM)
            try:
                out, _ = proc.communicate(timeout=30)
            except subprocess.TimeoutExpired:
                proc.kill()
                raise
        assert proc.returncode == 0, out
        assert "controlling 4 pool(s) of 2 service(s)" in out
        # The lease was handed back on the way out, for a standby to take at once.
        released = state.leases[("pdscale-system", "pdscale-leader")]["spec"]
        assert released.get("holderIdentity") is None and released["leaseDurationSeconds"] == 1


def test_run_outside_a_cluster_without_kubeconfig_says_what_to_do() -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("KUBERNETES_")}
    out = subprocess.run([sys.executable, "-m", "pdscale", "run", "--spec",
                          str(ROOT / "examples" / "vllm.yaml")], capture_output=True,
                         text=True, env=env, timeout=60)
    assert out.returncode == 2
    assert "--kubeconfig" in out.stderr


def test_run_on_a_busy_port_exits_2_before_starting(tmp_path: Path) -> None:
    import socket

    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen(1)
        port = busy.getsockname()[1]
        out = subprocess.run(
            [sys.executable, "-m", "pdscale", "run", "--spec", str(ROOT / "examples" / "vllm.yaml"),
             "--sim-url", "http://127.0.0.1:9", "--listen", f"127.0.0.1:{port}"],
            capture_output=True, text=True, timeout=60, cwd=tmp_path)
    assert out.returncode == 2, out.stderr
    assert f"cannot listen on 127.0.0.1:{port}" in out.stderr and "--listen" in out.stderr
    assert "API on" not in out.stderr  # no URL printed for a server that never ran


def test_run_unauthenticated_on_all_interfaces_refuses_the_webhook(tmp_path: Path) -> None:
    """examples/vllm.yaml has no reactions.auth: on 0.0.0.0 the webhook is disabled, says so
    on stderr and /v1/status, and a critical alert changes nothing (traffic here is loopback)."""
    port = free_port()
    cmd = [sys.executable, "-m", "pdscale", "run", "--spec", str(ROOT / "examples" / "vllm.yaml"),
           "--sim-url", f"http://127.0.0.1:{free_port()}", "--listen", f"0.0.0.0:{port}",
           "--log-level", "warning"]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            cwd=tmp_path)
    try:
        base = f"http://127.0.0.1:{port}"
        deadline = time.monotonic() + 60
        status: Any = None
        while time.monotonic() < deadline and status is None:
            try:
                code, body = _get(f"{base}/v1/status")
                status = body if code == 200 else None
            except OSError:
                assert proc.poll() is None, proc.stdout.read() if proc.stdout else ""
                time.sleep(0.3)
        assert status is not None
        assert status["webhook"]["serving"] is False
        assert "no authentication" in status["webhook"]["refusal"]
        body = json.dumps({"version": "4", "status": "firing", "alerts": [{
            "status": "firing", "labels": {"alertname": "LLMGPUXidError", "severity": "critical",
                                           "pdscale_service": "llama-chat",
                                           "pdscale_pool": "prefill", "pod": "llama-chat-p-1"},
            "startsAt": "2026-12-03T10:00:00Z", "fingerprint": "x"}]}).encode()
        req = urllib.request.Request(f"{base}/v1/alerts/alertmanager", data=body,
                                     headers={"Content-Type": "application/json"})
        try:
            urllib.request.urlopen(req, timeout=5)
            raise AssertionError("the webhook accepted an unauthenticated alert on 0.0.0.0")
        except urllib.error.HTTPError as exc:
            assert exc.code == 403
        assert _get(f"{base}/v1/status")[1]["webhook"]["received"] == 0
    finally:
        proc.send_signal(signal.SIGTERM)
        out, _ = proc.communicate(timeout=30)
    assert "warning: the Alertmanager webhook is disabled" in out
