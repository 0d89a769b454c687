"""pdscale scales a real NVIDIA Dynamo 1.6.1 stack on loopback, end to end: the frontend and
router with mocker workers, a real Prometheus with the generated rules scraping them as a
PodMonitor would, the controller reading its signals and scaling the pools through the process
actuator, real streaming requests from the replayer. Measured from the client's side.

* A prompt-heavy load step (6,000-token prompts, a few output tokens) overloads the prefill
  worker: prefill scales, decode does not.
* A decode-heavy one (long outputs, a KV cache of a few thousand tokens) fills the decode
  worker: decode scales, prefill does not.
* `pdscale check` finds every signal the Dynamo spec's controller needs.
* Prometheus killed under the running controller: no scale-down while blind, decisions again
  once it is back.

Needs .venv-dynamo (scripts/test.sh installs it): skipped without it outside CI, failed in CI.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import yaml

from pdscale._stackrun import StackRun
from pdscale.simulator._replay import ReplayOptions, ReplayResult, replay, vocabulary_from_model
from pdscale.simulator._stack import DynamoNotInstalled, dynamo_python
from pdscale.simulator._trace import Trace
from pdscale.spec import Role, Spec, parse_spec
from tests.conftest import ROOT, need_tool
from tests.e2e.prom import eventually

pytestmark = pytest.mark.e2e

P, D = ("chat", Role.PREFILL), ("chat", Role.DECODE)

SPEC = """
version: 1
services:
  - name: chat
    namespace: dynamo
    engine: dynamo
    model_name: tiny-chat
    dynamo: {namespace: chat, backend: vllm}
    gpu_metrics: false
    slo: {ttft_p95_s: 0.47, itl_p95_s: 0.064}
    pools:
      prefill:
        selector: {dynamo_component: prefill, pod_regex: "chat-prefill-.*"}
        target: {api_version: nvidia.com/v1alpha1, kind: DynamoGraphDeploymentScalingAdapter,
                 name: chat-prefill}
        min_replicas: 1
        max_replicas: 3
        cold_start: 4s
        profile: "@PROFILE@"
      decode:
        selector: {dynamo_component: backend, pod_regex: "chat-decode-.*"}
        target: {api_version: nvidia.com/v1alpha1, kind: DynamoGraphDeploymentScalingAdapter,
                 name: chat-decode}
        min_replicas: 1
        max_replicas: 3
        cold_start: 4s
        profile: "@PROFILE@"
alerts:
  evaluation_interval: 1s
controller:
  tick: 2s
  prometheus: {url: "http://127.0.0.1:9", timeout: 2s, stale_after: 30s, history: 1h}
"""


@pytest.fixture(scope="module")
def python() -> Path:
    need_tool("prometheus")
    try:
        return dynamo_python()
    except DynamoNotInstalled as exc:
        if os.environ.get("CI"):
            pytest.fail(f"{exc} (CI runs scripts/test.sh, which installs it)")
        pytest.skip(str(exc))


def _spec(tmp_path: Path, *, kv_tokens: int | None = None) -> Spec:
    profile = yaml.safe_load((ROOT / "pdscale" / "controller" / "profiles" /
                              "dynamo-mocker-1.6.1.yaml").read_text())
    if kv_tokens is not None:
        profile["kv_capacity_tokens"] = kv_tokens
        profile["name"] = "mocker-small-kv"
    path = tmp_path / "mocker.yaml"
    path.write_text(yaml.safe_dump(profile))
    return parse_spec(SPEC.replace("@PROFILE@", str(path)))


def _trace(rate: float, span_s: float, prompt: int, output: int) -> Trace:
    n = int(rate * span_s)
    return Trace(name="step", arrival_s=np.linspace(0.0, span_s, n),
                 prompt_tokens=np.full(n, prompt, dtype=np.int64),
                 output_tokens=np.full(n, output, dtype=np.int64))


def _load(run: StackRun, trace: Trace, seconds: float) -> tuple[threading.Thread, list[Any]]:
    out: list[ReplayResult] = []
    spec = run.spec.services[0].slo

    def go() -> None:
        out.append(replay(trace, run.stack.frontend_url, run.service.model_name,
                          vocabulary_from_model(run.stack.model_dir),
                          slo_ttft_s=spec.ttft_p95_s, slo_itl_s=spec.itl_p95_s,
                          options=ReplayOptions(duration_s=seconds, max_rps=40,
                                                request_timeout_s=60),
                          replicas=run.replica_counts))

    thread = threading.Thread(target=go, daemon=True)
    thread.start()
    return thread, out


def _decisions(run: StackRun) -> list[Any]:
    return list(run.pdscale.reconciler.decisions)


@pytest.fixture
def running(python: Path, tmp_path: Path) -> Iterator[Any]:
    runs: list[StackRun] = []

    def start(spec: Spec, **kw: Any) -> StackRun:
        run = StackRun(spec, tmp_path / f"run{len(runs)}", python=python, **kw)
        runs.append(run)
        return run.start()

    yield start
    for run in runs:
        run.stop()


def _warm(run: StackRun) -> None:
    """A few short requests so every frontend series exists, then a tick on real data."""
    thread, _ = _load(run, _trace(4, 2.0, 32, 8), 2.5)
    thread.join(timeout=30)

    def both_decided() -> bool:
        rows = {(d.pool, d.cause) for d in _decisions(run)[-6:]}
        return all(any(p == key and c != "degraded" for p, c in rows) for key in (P, D))

    eventually(both_decided, 45, "decisions on fresh data for both pools",
          lambda: [(d.pool[1].value, d.cause, d.reasons[-1:]) for d in _decisions(run)[-4:]])


def _summary(run: StackRun) -> str:
    return "; ".join(f"{d.pool[1].value}: {d.current}->{d.desired} {d.cause} "
                     f"{d.reasons[-1] if d.reasons else ''}" for d in _decisions(run)[-6:])


def test_a_prompt_heavy_step_scales_prefill_not_decode(running: Any, tmp_path: Path) -> None:
    run = running(_spec(tmp_path))
    _warm(run)
    start = len(_decisions(run))
    # 12 requests/s of 6,000-token prompts: one prefill worker serves about 8 (the mocker's
    # 123 ms a prompt), decode sees 4 tokens a request.
    thread, out = _load(run, _trace(12, 25.0, 6000, 4), 25.0)
    eventually(lambda: any(d.pool == P and d.desired >= 2 for d in _decisions(run)[start:]), 60,
          "prefill scaled up", lambda: _summary(run))
    # The new worker takes requests once its cold start (4 s) has passed.
    eventually(lambda: run.stack.actuator.read_status(P).ready >= 2, 30, "a second prefill worker")
    thread.join(timeout=90)
    decode = [d.desired for d in _decisions(run)[start:] if d.pool == D]
    assert decode and max(decode) == 1, _summary(run)
    assert run.stack.actuator.read_status(D).desired == 1
    result = out[0].summary
    assert result["errors"] == 0, result["error_kinds"]
    why = next(d for d in _decisions(run)[start:] if d.pool == P and d.desired >= 2)
    assert why.cause == "forecast", why.reasons


def test_a_decode_heavy_step_scales_decode_not_prefill(running: Any, tmp_path: Path) -> None:
    # 48 blocks of 64 tokens: about six 460-token sequences fit a decode worker.
    run = running(_spec(tmp_path, kv_tokens=48 * 64),
                  mocker_args=("--num-gpu-blocks-override", "48"))
    _warm(run)
    start = len(_decisions(run))
    # 4 requests/s of 400-token outputs: one decode worker holds about 6 (KV) at ~2.5 s each.
    thread, out = _load(run, _trace(4, 20.0, 64, 400), 20.0)
    eventually(lambda: any(d.pool == D and d.desired >= 2 for d in _decisions(run)[start:]), 60,
          "decode scaled up", lambda: _summary(run))
    thread.join(timeout=120)
    prefill = [d.desired for d in _decisions(run)[start:] if d.pool == P]
    assert prefill and max(prefill) == 1, _summary(run)
    assert out[0].summary["errors"] == 0, out[0].summary["error_kinds"]


def test_check_finds_every_signal_of_the_dynamo_spec(running: Any, tmp_path: Path,
                                                    capsys: pytest.CaptureFixture[str]) -> None:
    """Every series the spec reads is there; and the stack declares no GPU metrics, so the
    check lists no DCGM series it cannot find."""
    from pdscale.cli import main

    spec = _spec(tmp_path)
    run = running(spec, controller=False)
    thread, _ = _load(run, _trace(4, 3.0, 64, 16), 3.5)
    thread.join(timeout=30)
    spec_file = tmp_path / "spec.yaml"
    spec_file.write_text(SPEC.replace("@PROFILE@", str(tmp_path / "mocker.yaml")))
    assert run.prometheus_url is not None

    def checked() -> bool:
        return main(["check", str(spec_file), "--prometheus", run.prometheus_url]) == 0

    eventually(checked, 40, "pdscale check exits 0 against the real stack")
    out = capsys.readouterr().out
    assert "DCGM" not in out and " gpu_" not in out, out


def test_prometheus_down_holds_and_recovers(running: Any, tmp_path: Path,
                                            caplog: pytest.LogCaptureFixture) -> None:
    run = running(_spec(tmp_path), replicas={Role.PREFILL: 2, Role.DECODE: 2})
    _warm(run)
    caplog.set_level(logging.INFO, logger="pdscale")
    run.kill_prometheus()
    # Ticks that began once Prometheus had exited (a tick under way at the kill may have read
    # it before, and is recorded after: it was not blind). A record's time is its tick's start.
    killed = time.time()

    def blind() -> list[Any]:
        return [d for d in _decisions(run) if d.time_s >= killed]

    eventually(lambda: sum(1 for d in blind() if d.pool == P) >= 3, 30,
          "ticks while Prometheus is down", lambda: _summary(run))
    rows = blind()
    assert all(d.cause == "degraded" and d.desired >= d.current for d in rows), _summary(run)
    assert run.stack.actuator.read_status(P).desired == 2
    # The reason blames Prometheus, not the targets; the log says it once, in a short line.
    last = [d for d in rows if d.pool == P][-1]
    assert last.detail["data_state"] == "unavailable"
    assert any(r.startswith("degraded: Prometheus unreadable: cannot connect to") for r in
               last.reasons) and not any("targets down" in r for r in last.reasons), last.reasons
    said = [r.getMessage() for r in caplog.records
            if r.name == "pdscale.controller" and r.levelno >= logging.WARNING
            and "prometheus" in r.getMessage()]
    assert len(said) == 1 and len(said[0]) < 160, said
    run.restart_prometheus()
    back = len(_decisions(run))
    thread, _ = _load(run, _trace(4, 3.0, 32, 8), 3.5)
    thread.join(timeout=30)
    eventually(lambda: any(d.cause != "degraded" for d in _decisions(run)[back:]), 60,
          "decisions on data again", lambda: _summary(run))


class _Hold:
    """Keeps every pool where it is: only alert reactions change the replicas."""

    name = "hold"

    def decide(self, observation: Any) -> dict[Any, Any]:
        from pdscale.controller import PoolDecision

        return {key: PoolDecision(pool.replicas.desired, ("held by the test",))
                for key, pool in observation.pools.items()}


def _post(run: StackRun, alert: dict[str, Any], token: str) -> None:
    import httpx

    body = {"version": "4", "status": alert["status"], "receiver": "pdscale",
            "alerts": [alert]}
    answer = httpx.post(f"{run.api_url}/v1/alerts/alertmanager", json=body, timeout=10,
                        headers={"Authorization": f"Bearer {token}"}, trust_env=False)
    assert answer.status_code == 200, answer.text


def test_a_critical_alert_from_real_metrics_reaches_the_webhook_and_acts(
        running: Any, tmp_path: Path) -> None:
    """Prometheus evaluates the generated rules on the stack's own series, Alertmanager
    routes the critical tier to the controller's webhook, and the reaction's floor scales
    the prefill pool. A budget-burn alert (posted to the webhook: its 6 h window cannot
    fire here) adds nothing while TTFT is within the SLO, as after a recovery, and the same
    alert acts during the real overload. The policy holds every pool, so only the
    reactions move them."""
    from pdscale.telemetry import Signal
    from tests.conftest import free_port

    need_tool("prometheus-alertmanager")
    api = free_port()
    token = tmp_path / "token"
    token.write_text("stack-secret\n")
    raw = _spec(tmp_path).model_dump(mode="json", exclude_unset=True, by_alias=True)
    raw["services"][0]["pools"]["prefill"]["max_replicas"] = 5
    raw["alerts"].update({
        "webhook": {"url": f"http://127.0.0.1:{api}/v1/alerts/alertmanager",
                    "credentials_file": str(token)},
        "thresholds": {"queue_backlog": {"warning": {"value": 2, "for": "0s"},
                                         "critical": {"value": 4, "for": "0s"}}}})
    raw["reactions"] = {"cooldown": "0s", "auth": {"bearer_token_file": str(token)}, "rules": [
        {"match": {"alertname": "LLMQueueBacklogHigh", "severity": "critical",
                   "pdscale_pool": "prefill"},
         "action": "scale_up", "to": 3, "hold": "10m"},
        {"match": {"alertname": "LLMTimeToFirstTokenSLOBudgetBurn", "severity": "critical"},
         "action": "scale_up", "step": 1, "hold": "10m", "condition": "latency"}]}
    run = running(parse_spec(yaml.safe_dump(raw)), alertmanager=True, api_port=api,
                  # A repeat every few seconds: a delivery whose shortage has not shown in
                  # the controller's read yet (the alert fired on an earlier evaluation) is
                  # judged again on the next, as a production repeat_interval would, later.
                  alertmanager_overrides={"group_wait": "0s", "group_interval": "2s",
                                          "repeat_interval": "4s"},
                  policy=_Hold())
    _warm(run)
    receiver = run.pdscale.receiver
    burn = {"status": "firing", "fingerprint": "burn-6h", "startsAt": "2026-12-05T09:36:00Z",
            "endsAt": "0001-01-01T00:00:00Z",
            "labels": {"alertname": "LLMTimeToFirstTokenSLOBudgetBurn", "severity": "critical",
                       "long": "6h", "short": "30m", "pdscale_service": "chat",
                       "pdscale_pool": "prefill"}}

    def outcomes(name: str) -> list[str]:
        return [r.outcome for r in list(receiver.records) if r.alertname == name]

    def ttft_recent() -> float | None:
        pool = run.pdscale.reconciler.pool_observation(P)
        return None if pool is None else pool.signals.get(Signal.TTFT_P95_RECENT_S)

    # As after a recovery: requests Prometheus has seen within the SLO over the last minute.
    # A scrape, the recording rules' evaluation and a tick must follow the replay within that
    # minute; on a loaded machine they may not (60 s ran out once, under a full test run on
    # two slow cores), and then the requests have aged out of the window: replay again.
    def read_after_light_load() -> bool:
        thread, _ = _load(run, _trace(4, 3.0, 32, 8), 3.5)
        thread.join(timeout=30)
        try:
            eventually(lambda: ttft_recent() is not None, 40, "the last minute's TTFT read")
        except AssertionError:
            return False
        return True

    assert any(read_after_light_load() for _ in range(3)), \
        f"the last minute's TTFT never read after three light replays: {_summary(run)}"
    _post(run, burn, "stack-secret")
    eventually(lambda: outcomes(burn["labels"]["alertname"]), 10, "the burn alert processed")
    record = next(r for r in receiver.records if r.alertname == burn["labels"]["alertname"])
    assert record.outcome == "no_shortage", record.message
    assert "TTFT p95 over the last minute" in record.message and "within the SLO" in record.message
    assert run.pdscale.reconciler.overrides.active(time.time())["floors"] == []
    thread, out = _load(run, _trace(12, 20.0, 6000, 4), 20.0)

    def short_now() -> bool:
        ttft = ttft_recent()
        return ttft is not None and ttft > 0.47

    eventually(short_now, 40, "the last minute's TTFT p95 over the SLO under the overload",
               lambda: _summary(run))
    _post(run, burn, "stack-secret")  # the same alert again (Alertmanager's repeat)

    def acted(name: str) -> bool:
        return "applied" in outcomes(name)

    eventually(lambda: acted(burn["labels"]["alertname"]), 10,
               "the same burn alert applied during the overload",
               lambda: [(r.alertname, r.outcome, r.message) for r in list(receiver.records)])
    eventually(lambda: acted("LLMQueueBacklogHigh"), 60,
               "the critical backlog alert applied by the webhook",
               lambda: [(r.alertname, r.severity, r.outcome) for r in list(receiver.records)])
    eventually(lambda: any(d.pool == P and d.desired >= 3 and
                      any("reaction" in r for r in d.reasons) for d in _decisions(run)),
          20, "the reaction's floor in a decision", lambda: _summary(run))
    eventually(lambda: run.stack.actuator.read_status(P).desired >= 3, 10,
               "three prefill workers")
    thread.join(timeout=90)
    assert out[0].summary["errors"] == 0
    assert run.stack.actuator.read_status(D).desired == 1  # no reaction on decode


def test_a_killed_worker_is_replaced_and_no_tick_is_lost(
        running: Any, tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    import signal as sig

    run = running(_spec(tmp_path), replicas={Role.PREFILL: 1, Role.DECODE: 2})
    _warm(run)
    caplog.set_level(logging.INFO, logger="pdscale")
    act = run.stack.actuator
    victim = act.workers(D)[0]
    ticks = run.pdscale.reconciler.ticks
    thread, out = _load(run, _trace(3, 10.0, 32, 20), 10.0)
    os.kill(victim.pid, sig.SIGKILL)
    eventually(lambda: any(e[2] == "WorkerExited" and victim.name in e[3] for e in act.events), 15,
          "the dead worker reported")
    eventually(lambda: act.read_status(D).ready == 2 and victim.name not in
          {w.name for w in act.workers(D)}, 30, "a replacement decode worker ready")
    # Where a person looks: a WARNING in the controller's log, the status names the worker
    # and its replacement's progress.
    warned = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING
              and r.name == "pdscale.controller"]
    assert any(victim.name in m and "killed by SIGKILL" in m for m in warned), warned
    exited = run.pdscale.status()["workers"]["chat/decode"]["exited"]
    assert exited[-1]["name"] == victim.name and exited[-1]["replaced_by"] is not None
    assert exited[-1]["replacement"] == "ready"
    thread.join(timeout=60)
    elapsed_ticks = run.pdscale.reconciler.ticks - ticks
    assert elapsed_ticks >= 3  # the controller kept ticking through it
    assert not any(e.adapter == "source" for e in list(run.pdscale.reconciler.errors))
    # Without --migration-limit the dead worker's streams were cut: the client saw them.
    assert out[0].summary["finished"] + out[0].summary["errors"] == out[0].summary["requests"]


def test_the_controller_scales_down_under_load_and_fails_no_request(
        running: Any, tmp_path: Path) -> None:
    """Three decode workers for a light, steady load: the controller removes the spare ones
    (after a short stabilisation) while requests stream; SIGTERM drains them, so the client
    sees no failed or cut request."""
    raw = _spec(tmp_path).model_dump(mode="json", exclude_unset=True, by_alias=True)
    raw["controller"].update({"stabilisation": "10s"})
    run = running(parse_spec(yaml.safe_dump(raw)), replicas={Role.PREFILL: 1, Role.DECODE: 3})
    _warm(run)
    start = len(_decisions(run))
    thread, out = _load(run, _trace(3, 25.0, 64, 120), 25.0)
    eventually(lambda: any(d.pool == D and d.desired < d.current and d.outcome == "applied"
                           for d in _decisions(run)[start:]), 40,
               "a scale-down of decode under load", lambda: _summary(run))
    thread.join(timeout=90)
    summary = out[0].summary
    assert summary["errors"] == 0, summary["error_kinds"]
    assert summary["finished"] == summary["requests"] > 50
    assert run.stack.actuator.read_status(D).desired < 3
    # The workers the scale-down stopped were planned departures, never a degradation.
    after = [d for d in _decisions(run)[start:] if d.pool == D]
    assert not any(d.cause == "degraded" or "scrape targets down" in " ".join(d.reasons)
                   for d in after), _summary(run)
