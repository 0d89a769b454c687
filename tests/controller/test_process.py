"""The process actuator on fakes (spawn, prober, signals, clock): the scale status it reports,
cold start as a delayed launch, drain choice, replacement with back-off, SIGKILL escalation,
state and scrape-target files. The real thing runs in tests/e2e/test_dynamo_stack.py."""

from __future__ import annotations

import json
import signal
import threading
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from pdscale.controller._kube import KubeRejected, ScaleStatus
from pdscale.controller._process import ProcessActuator, WorkerTemplate, sum_metric
from pdscale.spec import Role

P = ("svc", Role.PREFILL)
D = ("svc", Role.DECODE)


@dataclass
class FakeClock:
    t: float = 1000.0

    def now(self) -> float:
        return self.t

    def wait(self, seconds: float, stop: threading.Event) -> bool:
        self.t += seconds
        return stop.is_set()


@dataclass
class FakeProc:
    pid: int
    argv: list[str]
    env: dict[str, str]
    code: int | None = None

    def poll(self) -> int | None:
        return self.code


@dataclass
class World:
    """Fake processes: spawned, signalled, probed."""

    procs: dict[int, FakeProc] = field(default_factory=dict)
    signals: list[tuple[int, int]] = field(default_factory=list)
    healthy_pids: set[int] = field(default_factory=set)
    loads: dict[int, float] = field(default_factory=dict)
    port_pid: dict[int, int] = field(default_factory=dict)
    next_pid: int = 4_000_000
    next_port: int = 20000

    def spawn(self, argv: Sequence[str], env: Mapping[str, str], log: Path | None) -> FakeProc:
        self.next_pid += 1
        proc = FakeProc(self.next_pid, list(argv), dict(env))
        self.procs[proc.pid] = proc
        self.port_pid[int(env["PORT"])] = proc.pid
        return proc

    def port(self) -> int:
        self.next_port += 1
        return self.next_port

    def send(self, pid: int, sig: int) -> bool:
        self.signals.append((pid, sig))
        return True

    def healthy(self, port: int, template: WorkerTemplate) -> bool:
        return self.port_pid[port] in self.healthy_pids

    def load(self, port: int, template: WorkerTemplate) -> float | None:
        return self.loads.get(self.port_pid[port])


def template(cold: float = 30.0, prefix: str = "dec") -> WorkerTemplate:
    return WorkerTemplate(argv=("worker", "--port", "{port}", "--name", "{name}"),
                          name_prefix=prefix, env={"PORT": "{port}"}, cold_start_s=cold,
                          scrape_labels={"namespace": "ns", "role": "decode"},
                          launcher_python="/usr/bin/python3")


def actuator(world: World, clock: FakeClock, tmp_path: Path, **kw: object) -> ProcessActuator:
    return ProcessActuator({D: template(), P: template(5.0, "pre")}, clock=clock,
                           state_file=tmp_path / "workers.json", targets_dir=tmp_path / "t",
                           prober=world, spawn=world.spawn, ports=world.port,
                           send_signal=world.send, **kw)  # type: ignore[arg-type]


def test_start_is_immediate_and_scale_up_waits_for_the_cold_start(tmp_path: Path) -> None:
    world, clock = World(), FakeClock()
    act = actuator(world, clock, tmp_path)
    act.start({D: 1, P: 1})
    first = world.procs[min(world.procs)]
    assert first.argv[:2] == ["worker", "--port"]  # no launcher: an existing deployment
    assert first.argv[2] == first.env["PORT"]
    assert act.read_status(D) == ScaleStatus(1, 1, 0)
    world.healthy_pids.update(world.procs)
    assert act.read_status(D) == ScaleStatus(1, 1, 1)

    act.set_replicas(D, 3, ["forecast"])
    new = sorted(world.procs)[-2:]
    for pid in new:
        argv = world.procs[pid].argv
        # The launcher waits out the pool's cold start, then execs the worker (same PID).
        assert argv[:2] == ["/usr/bin/python3", "-c"] and "execvp" in argv[2]
        assert float(argv[3]) == 30.0 and argv[4] == "worker"
    assert act.read_status(D) == ScaleStatus(3, 3, 1)
    assert [w.name for w in act.workers(D)] == ["dec-0", "dec-1", "dec-2"]
    assert act.events[-1][2] == "PdscaleScaled" and "forecast" in act.events[-1][3]
    world.healthy_pids.update(new)
    assert act.read_status(D) == ScaleStatus(3, 3, 3)


def test_scale_down_drains_not_ready_first_then_least_loaded(tmp_path: Path) -> None:
    world, clock = World(), FakeClock()
    act = actuator(world, clock, tmp_path)
    act.start({D: 3})
    a, b, c = sorted(world.procs)
    world.healthy_pids.update({a, b, c})
    act.sync()
    world.loads = {a: 5.0, b: 1.0, c: 3.0}
    clock.t += 1
    act.set_replicas(D, 4, ["up"])
    d = max(world.procs)  # still in its cold start
    clock.t += 1
    act.set_replicas(D, 2, ["down"])
    assert world.signals == [(d, signal.SIGTERM), (b, signal.SIGTERM)]
    assert act.read_status(D) == ScaleStatus(2, 2, 2)
    phases = {w.pid: w.phase for w in act.workers(D)}
    assert phases == {a: "ready", b: "draining", c: "ready", d: "draining"}
    # They exit: reaped, not replaced.
    world.procs[b].code = 0
    world.procs[d].code = -15
    assert act.read_status(D) == ScaleStatus(2, 2, 2)
    assert {w.pid for w in act.workers(D)} == {a, c}
    assert not [e for e in act.events if e[2] == "WorkerExited"]


def test_newest_drains_first_when_loads_are_unknown(tmp_path: Path) -> None:
    world, clock = World(), FakeClock()
    act = actuator(world, clock, tmp_path)
    act.start({D: 2})
    world.healthy_pids.update(world.procs)
    act.sync()
    act.set_replicas(D, 1, ["down"])
    assert world.signals == [(max(world.procs), signal.SIGTERM)]


def test_a_dead_worker_is_reported_and_replaced_with_the_cold_start(tmp_path: Path) -> None:
    world, clock = World(), FakeClock()
    act = actuator(world, clock, tmp_path)
    act.start({D: 2})
    world.healthy_pids.update(world.procs)
    act.sync()
    victim = min(world.procs)
    world.procs[victim].code = -9
    status = act.read_status(D)
    assert status == ScaleStatus(2, 2, 1)  # the replacement exists, not ready
    reasons = [(e[2], e[3]) for e in act.events]
    assert any(r == "WorkerExited" and "dec-0" in m and "killed by SIGKILL" in m
               for r, m in reasons)
    assert ("WorkerReplacing", "dec-2 started to replace dec-0; ready after its cold start "
            "(30 s) and its own start-up") in reasons
    replacement = world.procs[max(world.procs)]
    assert float(replacement.argv[3]) == 30.0  # a ready worker died: no back-off
    assert [w.name for w in act.workers(D)] == ["dec-1", "dec-2"]
    # Where a person looks: the status names the dead worker and its replacement's progress,
    # and a degraded pool's reason says it.
    clock.t += 12
    exited = act.report()["svc/decode"]["exited"]
    assert exited == [{"name": "dec-0", "pid": victim, "exit_status": "killed by SIGKILL",
                       "while": "ready", "at": 1000.0, "ago_s": 12.0, "replaced_by": "dec-2",
                       "replacement": "starting for 12 s (cold start 30 s)"}]
    assert act.losses(D) == "dec-0 exited (killed by SIGKILL) 12s ago, replacement dec-2 " \
                            "starting"
    world.healthy_pids.add(replacement.pid)
    act.sync()
    assert act.report()["svc/decode"]["exited"][0]["replacement"] == "ready"
    assert act.losses(D) is None
    assert act.events[-1][2] == "WorkerReplaced" and "replacing dec-0" in act.events[-1][3]


def test_crash_loop_backs_off(tmp_path: Path) -> None:
    world, clock = World(), FakeClock()
    act = actuator(world, clock, tmp_path, crash_backoff_s=10.0, max_backoff_s=25.0)
    act.start({P: 1})
    delays = []
    for _ in range(4):
        world.procs[max(world.procs)].code = 1  # exits before it was ever ready
        act.sync()
        delays.append(float(world.procs[max(world.procs)].argv[3]))
    assert delays == [15.0, 25.0, 30.0, 30.0]  # cold start 5 + 10, 20, 25 (capped)
    assert act.crashes(P) == 4
    world.healthy_pids.add(max(world.procs))
    act.sync()
    assert act.crashes(P) == 0


def test_a_drain_past_the_bound_gets_sigkill_once(tmp_path: Path) -> None:
    world, clock = World(), FakeClock()
    act = actuator(world, clock, tmp_path, kill_after_s=30.0)
    act.start({D: 2})
    pid = max(world.procs)
    act.set_replicas(D, 1, ["down"])
    clock.t += 29
    act.sync()
    assert world.signals == [(pid, signal.SIGTERM)]
    clock.t += 2
    act.sync()
    act.sync()
    assert world.signals == [(pid, signal.SIGTERM), (pid, signal.SIGKILL)]
    assert any(e[2] == "WorkerKilled" for e in act.events)


def test_dry_run_records_without_acting(tmp_path: Path) -> None:
    world, clock = World(), FakeClock()
    act = actuator(world, clock, tmp_path, dry_run=True)
    act.set_replicas(D, 2, ["x"])
    assert act.writes == [(D, 2)] and not world.procs
    assert act.read_status(D) == ScaleStatus(0, 0, 0)


def test_unknown_pool_and_bad_counts_are_rejected(tmp_path: Path) -> None:
    act = actuator(World(), FakeClock(), tmp_path)
    other = ("other", Role.DECODE)
    assert isinstance(act.read_statuses([other])[other], KubeRejected)
    with pytest.raises(KubeRejected, match="no worker template"):
        act.set_replicas(other, 1, [])
    with pytest.raises(KubeRejected, match=">= 0"):
        act.set_replicas(D, -1, [])
    with pytest.raises(KubeRejected, match="pods to relabel"):
        act.label_pod("ns", "dec-0", "x", "y")


def test_state_and_scrape_target_files(tmp_path: Path) -> None:
    world, clock = World(), FakeClock()
    act = actuator(world, clock, tmp_path)
    act.start({D: 2})
    world.healthy_pids.add(min(world.procs))
    act.sync()
    state = json.loads((tmp_path / "workers.json").read_text())
    pool = state["pools"]["svc/decode"]
    assert pool["desired"] == 2 and [w["name"] for w in pool["workers"]] == ["dec-0", "dec-1"]
    assert {w["phase"] for w in pool["workers"]} == {"ready", "starting"}
    # Only workers that have been ready are scrape targets (a starting one is not up yet).
    targets = json.loads((tmp_path / "t" / "svc-decode.json").read_text())
    assert targets == [{"labels": {"namespace": "ns", "pod": "dec-0", "role": "decode"},
                        "targets": [f"127.0.0.1:{pool['workers'][0]['port']}"]}]


def test_template_validation() -> None:
    with pytest.raises(ValueError, match="'argv'"):
        WorkerTemplate(argv=(), name_prefix="x")
    with pytest.raises(ValueError, match="'cold_start_s'"):
        WorkerTemplate(argv=("x",), name_prefix="x", cold_start_s=-1)


def test_sum_metric() -> None:
    text = ('# HELP x\nx_total 3\nx{a="1"} 2\nx{a="2"} 1.5\nxy 9\n')
    assert sum_metric(text, "x") == 3.5
    assert sum_metric(text, "missing") is None


def test_the_controller_takes_it_instead_of_kubernetes(tmp_path: Path) -> None:
    from pdscale.controller._runtime import Controller, reader_from_spec
    from pdscale.spec import load_spec
    from tests.conftest import ROOT

    spec = load_spec(ROOT / "examples" / "dynamo.yaml")
    name = spec.services[0].name
    world, clock = World(), FakeClock()
    act = ProcessActuator({(name, Role.DECODE): template(), (name, Role.PREFILL): template()},
                          clock=clock, prober=world, spawn=world.spawn, ports=world.port,
                          send_signal=world.send)
    controller = Controller(spec, None, reader_from_spec(spec), clock=clock, backend=act,
                            dry_run=True)
    try:
        assert controller.kube is act and act.dry_run is True
        assert controller.elector is None
        # Its statuses reach the controller's observation source.
        act.dry_run = False
        act.start({(name, Role.DECODE): 2})
        assert controller.kube.read_statuses([(name, Role.DECODE)])[(name, Role.DECODE)] \
            == ScaleStatus(2, 2, 0)
    finally:
        controller.telemetry.shutdown()


def test_another_actuator_adopts_the_recorded_workers_and_stops_them(tmp_path: Path) -> None:
    """Real processes (sleep): the state file hands the workers over, by PID and start time."""
    from pdscale._servers import alive

    healthy = World()
    healthy.healthy = lambda port, template: True  # type: ignore[method-assign]
    sleeper = WorkerTemplate(argv=("sleep", "60"), name_prefix="s", cold_start_s=1.0)
    state = tmp_path / "workers.json"
    first = ProcessActuator({D: sleeper}, state_file=state, prober=healthy)
    first.start({D: 2})
    pids = [w.pid for w in first.workers(D)]
    assert all(alive(p) for p in pids)
    second = ProcessActuator({D: sleeper}, state_file=state, prober=healthy)
    assert second.adopt() == 2
    assert second.read_status(D) == ScaleStatus(2, 2, 2)
    second.set_replicas(D, 3, ["up"])  # names go on from the recorded counter
    assert [w.name for w in second.workers(D)] == ["s-0", "s-1", "s-2"]
    stopped = second.stop(grace_s=2)
    assert sorted(stopped) == ["s-0", "s-1", "s-2"]
    first.stop(grace_s=1)  # reaps its children (already stopped by the second)
    assert not any(alive(p) for p in pids)


def test_the_drainer_stops_the_least_loaded_worker_and_follows_it_to_its_exit(
        tmp_path: Path) -> None:
    from pdscale.controller._drain import Drainer

    world, clock = World(), FakeClock()
    act = actuator(world, clock, tmp_path, kill_after_s=20.0)
    act.start({D: 3, P: 1})
    world.healthy_pids.update(world.procs)
    pids = sorted(pid for pid in world.procs if world.procs[pid].env["PORT"] in
                  {str(w.port) for w in act.workers(D)})
    world.loads.update({pids[0]: 4, pids[1]: 0, pids[2]: 7})
    drainer = Drainer(act, act, timeout_s=20, settle_s=0)
    step = drainer.reach(D, 2, current=3, reasons=["forecast"], now_s=clock.now())
    assert step.outcome == "applied"
    assert world.signals == [(pids[1], signal.SIGTERM)]  # the idle one, not the newest
    assert any("least work of 3 ready: 0 running" in n for n in step.notes)
    assert act.read_status(D) == ScaleStatus(2, 2, 2)
    # A scale-up during its drain cannot take it back (SIGTERM is final): new workers start.
    clock.t += 1
    step = drainer.reach(D, 3, current=2, reasons=["burst"], now_s=clock.now())
    assert step.outcome == "applied" and len(act.workers(D)) == 4
    world.procs[pids[1]].code = 0  # it finished its streams and exited
    clock.t += 1
    step = drainer.reach(D, 3, current=3, reasons=[], now_s=clock.now())
    assert any("drained and exited within 2.0 s" in n for n in step.notes)
    assert drainer.snapshot(clock.now())["recent"][-1]["outcome"] == "drained"
    # A worker still busy at the bound is killed; the drain records what it held.
    step = drainer.reach(D, 2, current=3, reasons=[], now_s=clock.now())
    victim = next(pid for pid, sig in world.signals[1:] if sig == signal.SIGTERM)
    world.loads[victim] = 3
    clock.t += 21
    act.sync()
    assert (victim, signal.SIGKILL) in world.signals
    world.procs[victim].code = -9
    step = drainer.reach(D, 2, current=2, reasons=[], now_s=clock.now())
    assert any("killed at the drain bound" in n and "3 running" in n for n in step.notes)
    assert drainer.timeouts_in_a_row(D) == 1


def test_newest_first_ignores_the_load_like_a_replicaset(tmp_path: Path) -> None:
    world, clock = World(), FakeClock()
    act = actuator(world, clock, tmp_path, victim_order="newest")
    act.start({D: 2, P: 1})
    world.healthy_pids.update(world.procs)
    ports = {str(w.port): w for w in act.workers(D)}
    by_pid = {pid: ports[p.env["PORT"]] for pid, p in world.procs.items() if p.env["PORT"] in ports}
    newest = max(by_pid, key=lambda pid: int(by_pid[pid].name.rsplit("-", 1)[1]))
    world.loads.update({pid: (9 if pid == newest else 0) for pid in by_pid})
    act.set_replicas(D, 1, ["test"])
    assert world.signals == [(newest, signal.SIGTERM)]
