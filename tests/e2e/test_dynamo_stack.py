"""A real NVIDIA Dynamo 1.6.1 stack on loopback (frontend and router, mocker workers, no GPU):
it answers streaming chat, the replayer measures it, the process actuator scales its pools
(cold start, drain, replacement), Prometheus scrapes it with PodMonitor-like labels, and
``pdscale up --engine dynamo`` / ``pdscale down`` leave no process behind.

Needs .venv-dynamo (scripts/dynamo-setup.sh; scripts/test.sh runs it): skipped without it
outside CI, failed without it in CI."""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest

from pdscale._servers import alive
from pdscale.controller._kube import ScaleStatus
from pdscale.controller._process import sum_metric
from pdscale.simulator._replay import ReplayOptions, replay, vocabulary_from_model
from pdscale.simulator._stack import DynamoNotInstalled, DynamoStack, dynamo_python
from pdscale.simulator._trace import Trace
from pdscale.spec import Role, ServiceSpec, load_spec
from tests.conftest import ROOT, free_port, need_tool
from tests.e2e.prom import api, prometheus

pytestmark = pytest.mark.e2e

P, D = Role.PREFILL, Role.DECODE


@pytest.fixture(scope="module")
def python() -> Path:
    try:
        return dynamo_python()
    except DynamoNotInstalled as exc:
        if os.environ.get("CI"):
            pytest.fail(f"{exc} (CI runs scripts/test.sh, which installs it)")
        pytest.skip(str(exc))


@pytest.fixture(scope="module")
def service() -> ServiceSpec:
    return load_spec(ROOT / "examples" / "dynamo.yaml").services[0]


@pytest.fixture
def make_stack(python: Path, service: ServiceSpec,
               tmp_path: Path) -> Iterator[Any]:
    """Start stacks in the test's folder; stop them all after, whatever happened."""
    stacks: list[DynamoStack] = []

    def make(**kw: Any) -> DynamoStack:
        stack = DynamoStack(service, tmp_path / f"stack{len(stacks)}", python=python, **kw)
        stacks.append(stack)
        return stack.start()

    yield make
    for stack in stacks:
        stack.stop(grace_s=5)


def _pids(stack: DynamoStack) -> list[int]:
    assert stack.actuator is not None and stack.frontend_pid is not None
    return [stack.frontend_pid] + [w.pid for r in Role
                                   for w in stack.actuator.workers(stack.keys()[r])]


def _chat(url: str, model: str, prompt: str, max_tokens: int) -> tuple[list[str], dict[str, Any]]:
    """One streaming chat completion: the content chunks and the usage."""
    body = {"model": model, "messages": [{"role": "user", "content": prompt}],
            "max_tokens": max_tokens, "stream": True, "stream_options": {"include_usage": True}}
    chunks: list[str] = []
    usage: dict[str, Any] = {}
    with httpx.Client(timeout=30, trust_env=False) as client, \
            client.stream("POST", f"{url}/v1/chat/completions", json=body) as resp:
        assert resp.status_code == 200, resp.read()
        assert resp.headers["content-type"].startswith("text/event-stream")
        for line in resp.iter_lines():
            if not line.startswith("data:") or line.endswith("[DONE]"):
                continue
            chunk = json.loads(line[5:])
            usage = chunk.get("usage") or usage
            chunks += [c["delta"]["content"] for c in chunk["choices"]
                       if c["delta"].get("content")]
    return chunks, usage


def _metric(port: int, name: str) -> float:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=2) as resp:
        return sum_metric(resp.read().decode(), name) or 0.0


def _trace(n: int, span_s: float, prompt: int, output: int) -> Trace:
    return Trace(name=f"{n} requests", arrival_s=np.linspace(0.0, span_s, n),
                 prompt_tokens=np.full(n, prompt, dtype=np.int64),
                 output_tokens=np.full(n, output, dtype=np.int64))


def _until(predicate: Any, timeout_s: float, what: str, detail: Any = None) -> None:
    deadline = time.monotonic() + timeout_s
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout_s:g} s waiting for {what}"
                                 + (f"; {detail()}" if detail else ""))
        time.sleep(0.1)


def _streams_on_every_worker(act: Any, key: Any, *, every_request: int | None = None,
                             timeout_s: float = 20.0) -> None:
    """Wait until every worker of the pool has requests in flight (by its own metrics), and
    with ``every_request`` until that many are in flight in all (every request of the trace
    sent and streaming): the replayer's streams are flowing, however late a loaded machine
    started them."""
    def loads() -> dict[str, float]:
        return {w.name: _metric(w.port, "dynamo_component_inflight_requests")
                for w in act.workers(key) if w.phase != "draining"}

    def flowing() -> bool:
        now = loads()
        return all(v > 0 for v in now.values()) and (
            every_request is None or sum(now.values()) >= every_request)

    _until(flowing, timeout_s, "streams in flight on every worker"
           + (f", {every_request} in all" if every_request else ""),
           lambda: f"in flight: {loads()}")


class _Timer(threading.Thread):
    """A thread whose exception fails the test (re-raised by :meth:`join`)."""

    def __init__(self, target: Any, *args: Any) -> None:
        super().__init__(target=target, args=args, daemon=True)
        self.error: BaseException | None = None

    def run(self) -> None:
        try:
            super().run()
        except BaseException as exc:
            self.error = exc

    def join(self, timeout: float | None = None) -> None:
        super().join(timeout)
        if self.error is not None:
            raise self.error


def test_stack_answers_streaming_chat_and_stops_by_pid(make_stack: Any,
                                                      service: ServiceSpec) -> None:
    stack = make_stack()
    words = vocabulary_from_model(stack.model_dir)
    chunks, usage = _chat(stack.frontend_url, service.model_name, " ".join(words[:37]), 9)
    assert len(chunks) == 9
    assert usage["prompt_tokens"] == 37 and usage["completion_tokens"] == 9
    # The frontend counts a request when it lets go of the stream, which can be a moment
    # after the client has read the last chunk: wait for the count, then check it.
    _until(lambda: _metric(stack.frontend_port, "dynamo_frontend_requests_total") > 0, 10,
           "the frontend to count the request")
    assert _metric(stack.frontend_port, "dynamo_frontend_requests_total") == 1
    pids = _pids(stack)
    assert len(pids) == 3 and all(alive(p) for p in pids)
    stopped = stack.stop()
    assert len(stopped) == 3
    assert not any(alive(p) for p in pids)
    assert not stack.state_file.exists()


def test_replayer_measures_ttft_and_itl(make_stack: Any, service: ServiceSpec) -> None:
    stack = make_stack()
    result = replay(_trace(12, 3.0, 300, 30), stack.frontend_url, service.model_name,
                    vocabulary_from_model(stack.model_dir), slo_ttft_s=0.5, slo_itl_s=0.05,
                    options=ReplayOptions(duration_s=4.0, max_rps=10),
                    replicas=stack.replica_counts)
    s = result.summary
    failed = [(r.index, r.error) for r in result.requests if not r.finished]
    assert s["requests"] == s["finished"] == 12 and s["errors"] == 0, failed
    assert s["prompt_token_mismatches"] == 0 and s["output_tokens"] == 12 * 30
    # The mocker's prefill (~17 ms for 300 tokens) plus the frontend's overhead; its decode
    # steps of a few milliseconds.
    assert 0.01 < s["ttft_p50_s"] < 0.5
    assert 0.001 < s["itl_p50_s"] < 0.05
    assert s["slo_attainment"] > 0.5
    assert s["pools"]["decode"]["mean_replicas"] == pytest.approx(1.0)
    assert s["gpu_hours"] > 0
    assert all(r.ttft_s is not None and r.itl_mean_s is not None for r in result.requests)


def test_scale_up_routes_to_the_new_worker_only_after_its_cold_start(
        make_stack: Any, service: ServiceSpec) -> None:
    stack = make_stack(cold_start_s={P: 0.0, D: 3.0})
    act, key = stack.actuator, stack.keys()[D]
    t0 = time.monotonic()
    act.set_replicas(key, 2, ["test"])
    assert act.read_status(key) == ScaleStatus(2, 2, 1)
    time.sleep(1.5)
    assert act.read_status(key).ready == 1  # still in its cold start
    stack.wait_routable(counts={P: 1, D: 2}, timeout_s=30)
    assert time.monotonic() - t0 >= 3.0
    new = max(act.workers(key), key=lambda w: w.created_s)
    assert new.healthy
    result = replay(_trace(10, 0.5, 50, 20), stack.frontend_url, service.model_name,
                    vocabulary_from_model(stack.model_dir), slo_ttft_s=0.5, slo_itl_s=0.05,
                    options=ReplayOptions(duration_s=1.0, max_rps=20))
    assert result.summary["errors"] == 0
    assert _metric(new.port, "dynamo_component_requests_total") > 0


def test_scale_down_drains_in_flight_requests(make_stack: Any, service: ServiceSpec) -> None:
    stack = make_stack(replicas={P: 1, D: 2})
    act, key = stack.actuator, stack.keys()[D]
    loads: dict[str, float] = {}
    victims: list[Any] = []

    def scale_down() -> None:
        # Every request sent (over 0.3 s), the streams flowing (each lasts about 2 s).
        _streams_on_every_worker(act, key, every_request=12)
        loads.update({w.name: _metric(w.port, "dynamo_component_inflight_requests")
                      for w in act.workers(key)})
        act.set_replicas(key, 1, ["test"])
        victims.extend(w for w in act.workers(key) if w.phase == "draining")

    timer = _Timer(scale_down)
    timer.start()
    result = replay(_trace(12, 0.3, 50, 300), stack.frontend_url, service.model_name,
                    vocabulary_from_model(stack.model_dir), slo_ttft_s=0.5, slo_itl_s=0.05,
                    options=ReplayOptions(duration_s=1.0, max_rps=40))
    timer.join()
    assert len(victims) == 1
    victim = victims[0]
    assert loads[victim.name] > 0  # it had streams in flight when it got SIGTERM
    assert result.summary["errors"] == 0, result.summary["error_kinds"]
    assert result.summary["finished"] == 12

    def drained() -> bool:
        act.sync()  # reaps the exited worker, as the controller's status reads do
        return victim.name not in [w.name for w in act.workers(key)]

    _until(drained, 15, "the drained worker to exit")
    assert not alive(victim.pid)
    assert act.read_status(key) == ScaleStatus(1, 1, 1)


def test_a_sigkilled_worker_is_reported_and_replaced(make_stack: Any,
                                                    service: ServiceSpec) -> None:
    stack = make_stack(cold_start_s={P: 0.0, D: 1.0}, migration_limit=3)
    act, key = stack.actuator, stack.keys()[D]
    stack.supervise(interval_s=0.2)
    dead = act.workers(key)[0]
    os.killpg(dead.pid, signal.SIGKILL)
    _until(lambda: any(e[2] == "WorkerExited" and dead.name in e[3] for e in act.events), 10,
           "the actuator to report the dead worker")
    _until(lambda: [w.phase for w in act.workers(key)] == ["ready"], 30,
           "the replacement to be ready")
    replacement = act.workers(key)[0]
    assert replacement.name != dead.name and replacement.pid != dead.pid
    chunks, _ = _chat(stack.frontend_url, service.model_name, "bab bad", 5)
    assert len(chunks) == 5


def test_prometheus_sees_the_stack_with_podmonitor_labels(make_stack: Any, service: ServiceSpec,
                                                         tmp_path: Path) -> None:
    need_tool("prometheus")
    stack = make_stack(cold_start_s={P: 0.0, D: 0.5})
    stack.actuator.sync()
    _chat(stack.frontend_url, service.model_name, "bab bad baf", 4)
    config = {"global": {"scrape_interval": "1s"}, "scrape_configs": stack.scrape_configs(
        interval="1s")}
    work = tmp_path / "prom"
    work.mkdir()
    with prometheus(config, work, free_port()) as url:
        def series(query: str) -> list[dict[str, str]]:
            return [r["metric"] for r in api(url, "/api/v1/query", {"query": query})
                    ["data"]["result"]]

        ns = service.namespace
        _until(lambda: series(f'dynamo_frontend_requests_total{{namespace="{ns}"}}'), 20,
               "the frontend's series")
        fe = series(f'dynamo_frontend_requests_total{{namespace="{ns}"}}')[0]
        assert fe["pod"] == stack.frontend_pod() and fe["model"] == service.model_name
        for role in Role:
            pool = service.pools[role]
            query = (f'dynamo_component_requests_total{{namespace="{ns}",'
                     f'pod=~"{pool.pod_regex}",dynamo_component="{pool.selector.dynamo_component}"}}')
            _until(lambda q=query: series(q), 20, f"the {role.value} worker's series")
            assert {m["role"] for m in series(query)} == {role.value}
        # A new worker is scraped without a reload (file_sd), under its own pod name.
        stack.actuator.set_replicas(stack.keys()[D], 2, ["test"])
        stack.supervise(interval_s=0.2)
        pods = f'dynamo_component_uptime_seconds{{namespace="{ns}",role="decode"}}'
        _until(lambda: len(series(pods)) == 2, 30, "the second decode worker's series")
        names = sorted(m["pod"] for m in series(pods))
        assert all(re.fullmatch(service.pools[D].pod_regex, n) for n in names)


def _get_json(url: str) -> Any:
    with urllib.request.urlopen(url, timeout=5) as resp:
        return json.loads(resp.read())


def test_pdscale_up_dynamo_reports_owns_and_leaves_no_process(
        python: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """The stack as a user drives it: up, idle before the first request, a refused second up
    that writes nothing, --status, load, a worker killed (in the log and the status), the
    controller restarted, another started by hand, and down, which stops them all."""
    from pdscale._upstack import marked_processes
    from pdscale.cli import main

    need_tool("prometheus")
    folder = tmp_path / "up"

    def pdscale(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([sys.executable, "-m", "pdscale", *args], capture_output=True,
                              text=True, timeout=120, cwd=ROOT,
                              env={**os.environ, "PDSCALE_DYNAMO_PYTHON": str(python)})

    up = pdscale("up", "--engine", "dynamo", "--dir", str(folder))
    by_hand: subprocess.Popen[bytes] | None = None
    pids: list[int] = []
    try:
        assert up.returncode == 0, up.stderr
        state = json.loads((folder / "up.json").read_text())
        stack = json.loads((folder / "dynamo" / "stack.json").read_text())
        workers = json.loads((folder / "dynamo" / "workers.json").read_text())
        pids = [p["pid"] for p in state["processes"]] + [stack["frontend"]["pid"]] + [
            w["pid"] for pool in workers["pools"].values() for w in pool["workers"]]
        names = [p["name"] for p in state["processes"]]
        assert names == ["prometheus", "alertmanager", "controller"]
        assert len(pids) == 6 and all(alive(p) for p in pids)
        assert f"http://127.0.0.1:{stack['frontend']['port']}" in up.stdout
        for log in ("controller.log", "prometheus.log", "dynamo/logs/frontend.log"):
            assert str(folder / log) in up.stdout  # where every log is
        assert "profile dynamo-mocker-1.6.1, cold_start 2s" in up.stdout
        controller = next(p["url"] for p in state["processes"] if p["name"] == "controller")

        # Before the first request: idle, held, not degraded.
        def idle() -> bool:
            pools = _get_json(f"{controller}/v1/status")["pools"]
            return len(pools) == 2 and all(p["detail"].get("data_state") == "idle"
                                           for p in pools.values())

        _until(idle, 60, "both pools idle before the first request",
               lambda: _get_json(f"{controller}/v1/status")["pools"])
        assert all(p["cause"] == "steady" for p in
                   _get_json(f"{controller}/v1/status")["pools"].values())
        # A second up refuses and writes nothing (in this process: it starts nothing).
        before = {p.name: p.read_bytes() for p in folder.iterdir() if p.is_file()}
        capsys.readouterr()
        assert main(["up", "--engine", "dynamo", "--dir", str(folder)]) == 2
        assert "pdscale down" in capsys.readouterr().err
        assert {p.name: p.read_bytes() for p in folder.iterdir() if p.is_file()} == before
        assert main(["up", "--status", "--dir", str(folder)]) == 0
        listed = capsys.readouterr().out
        for pid in pids:
            assert f" {pid} " in listed
        # Load, with progress and a summary.
        load = pdscale("load", "--dir", str(folder), "--duration", "3", "--progress-every",
                       "1")
        assert load.returncode == 0, load.stderr
        assert " sent " in load.stdout and " finished, 0 failed" in load.stdout
        # A decode worker killed: a WARNING in controller.log, named in /v1/status.
        victim = workers["pools"]["llama-dynamo/decode"]["workers"][0]
        os.kill(victim["pid"], signal.SIGKILL)

        def reported() -> bool:
            log = (folder / "controller.log").read_text()
            exited = _get_json(f"{controller}/v1/status")["workers"]["llama-dynamo/decode"]
            return f"WARNING pdscale.controller: WorkerExited on llama-dynamo/decode: " \
                   f"{victim['name']}" in log and any(
                       x["name"] == victim["name"] and x["replacement"] == "ready"
                       for x in exited["exited"])

        _until(reported, 30, "the dead worker in the log and its ready replacement in the status",
               lambda: (folder / "controller.log").read_text()[-1500:])
        # The controller restarted through up; then another started by hand on its files.
        restarted = pdscale("up", "--restart", "controller", "--dir", str(folder))
        assert restarted.returncode == 0, restarted.stderr
        record = next(p for p in json.loads((folder / "up.json").read_text())["processes"]
                      if p["name"] == "controller")
        assert alive(record["pid"]) and record["pid"] not in pids
        argv = record["argv"]
        at = argv.index("--listen")
        by_hand = subprocess.Popen(  # its own port, and none of up's marker
            [*argv[:at], "--listen", f"127.0.0.1:{free_port()}", *argv[at + 2:]],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, cwd=tmp_path,
            env={k: v for k, v in os.environ.items() if k != "PDSCALE_UP_DIR"})
        _until(lambda: by_hand is not None and by_hand.pid in
               {m.pid for m in marked_processes(folder)}, 30,
               "the hand-started controller found as the stack's")
        pids += [record["pid"], by_hand.pid]
    finally:
        down = pdscale("down", "--dir", str(folder))
        if by_hand is not None:
            with contextlib.suppress(subprocess.TimeoutExpired):
                by_hand.wait(timeout=20)
            if by_hand.poll() is None:
                by_hand.kill()
    assert down.returncode == 0, down.stdout + down.stderr
    assert by_hand is not None and by_hand.returncode is not None
    assert f"stopped (pid {by_hand.pid}, not recorded in up.json" in down.stdout
    _until(lambda: not any(alive(p) for p in pids), 15, "every process to be gone")
    workers_now = json.loads((folder / "dynamo" / "workers.json").read_text())
    assert not any(alive(w["pid"]) for pool in workers_now["pools"].values()
                   for w in pool["workers"])
    assert not (folder / "up.json").exists()


def test_a_drained_scale_down_under_load_fails_nothing_and_stops_the_least_loaded(
        make_stack: Any, service: ServiceSpec) -> None:
    """pdscale's drain on the real stack: under steady load the drainer stops the decode
    worker with the fewest requests in flight (by the workers' own metrics), which finishes
    its streams and exits; no request fails or is cut. The same scale-down as Kubernetes does
    it without the drain (the newest worker, load ignored, SIGKILL after a short grace) cuts
    the streams of the worker it stops."""
    from collections.abc import Mapping

    from pdscale.controller._drain import Drainer
    from pdscale.telemetry import PodWork

    stack = make_stack(replicas={P: 1, D: 3}, cold_start_s={P: 0.0, D: 0.0}, kill_after_s=60)
    act, key = stack.actuator, stack.keys()[D]
    stack.supervise(interval_s=0.1)
    seen: list[Mapping[str, PodWork]] = []

    class Spy:
        def pod_work(self, k: Any, now_s: float) -> Mapping[str, PodWork]:
            seen.append(act.pod_work(k, now_s))
            return seen[-1]

    drainer = Drainer(act, Spy(), timeout_s=60, settle_s=0)
    stopped: list[str] = []

    def scale_down(drain: bool) -> None:
        _streams_on_every_worker(act, key)  # streams of ~4 s are flowing on every worker
        current = act.read_status(key).desired
        if drain:
            drainer.reach(key, current - 1, current=current, reasons=["test"],
                          now_s=time.time())
        else:
            act.set_replicas(key, current - 1, ["test"])
        stopped.extend(w.name for w in act.workers(key) if w.phase == "draining")

    def load_with(drain: bool) -> Any:
        stopped.clear()
        timer = _Timer(scale_down, drain)
        timer.start()
        result = replay(_trace(24, 2.5, 50, 500), stack.frontend_url, service.model_name,
                        vocabulary_from_model(stack.model_dir), slo_ttft_s=0.5,
                        slo_itl_s=0.05, options=ReplayOptions(duration_s=3.0, max_rps=40))
        timer.join()
        return result

    result = load_with(drain=True)
    assert len(stopped) == 1
    victim = stopped[0]
    loads = {name: w.running for name, w in seen[-1].items()}
    assert len(loads) == 3 and max(v or 0 for v in loads.values()) > 0
    assert loads[victim] == min(loads.values())  # the least loaded when it was chosen
    assert result.summary["errors"] == 0, result.summary["error_kinds"]
    assert all(r.output_tokens == r.max_tokens for r in result.requests)
    _until(lambda: victim not in [w.name for w in act.workers(key)], 20,
           "the drained worker to exit")
    step = drainer.reach(key, 2, current=2, reasons=[], now_s=time.time())
    assert any(f"{victim} drained and exited" in n for n in step.notes)

    # The same pool scaled down as Kubernetes would without the drain.
    act.set_replicas(key, 3, ["test"])
    stack.wait_routable(counts={P: 1, D: 3}, timeout_s=30)
    act.victim_order = "newest"
    act.kill_after_s = 0.5
    result = load_with(drain=False)
    assert len(stopped) == 1
    _until(lambda: stopped[0] not in [w.name for w in act.workers(key)], 20,
           "the killed worker to be gone")
    cut = [r for r in result.requests if r.error is not None or r.output_tokens < r.max_tokens]
    assert cut, "a SIGKILL half a second after SIGTERM cut no stream?"
    assert any(e[2] == "WorkerKilled" and stopped[0] in e[3] for e in act.events)
