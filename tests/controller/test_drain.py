"""The drain's pure core: which replica goes, when it has drained, what a plan does."""

from __future__ import annotations

import pytest

from pdscale.controller._drain import DrainConfig, Replica, choose_victims, is_idle, plan_drain
from pdscale.spec import Role
from pdscale.telemetry import PodWork

NOW = 1_000_000.0
CFG = DrainConfig(timeout_s=300, settle_s=10)


def _r(name: str, *, ready: bool = True, created: float = 0.0, since: float | None = None,
       routed: bool = True, ordinal: int | None = None) -> Replica:
    return Replica(name, ready, created, draining_since_s=since, routed=routed, ordinal=ordinal)


def _w(running: float | None, waiting: float | None = 0.0, kv: float | None = None,
       at: float = NOW) -> PodWork:
    return PodWork(running, waiting, kv, at)


def test_least_work_goes_first_starting_before_ready_unknown_last() -> None:
    replicas = [_r("a", created=1), _r("b", created=2), _r("c", created=3),
                _r("new", ready=False, created=9), _r("mystery", created=4)]
    work = {"a": _w(5), "b": _w(0, 1), "c": _w(0, 0, kv=0.2)}
    serving = [r for r in replicas if r.ready]
    chosen, held = choose_victims(replicas, work, 4, serving=serving)
    assert [v.name for v in chosen] == ["new", "c", "b", "a"]
    assert "served nothing" in chosen[0].why
    assert chosen[1].why == "least work of 4 ready: 0 running, 0 waiting, KV 20%"
    assert not held
    del work["a"]  # both unknown now: newest first, after every known one
    chosen, _ = choose_victims(replicas, work, 4, serving=serving)
    assert [v.name for v in chosen] == ["new", "c", "b", "mystery"]
    assert "work unknown" in chosen[-1].why


def test_equal_work_breaks_ties_by_kv_then_newest() -> None:
    replicas = [_r("old", created=1), _r("young", created=5), _r("kv", created=9)]
    work = {"old": _w(0, kv=0.0), "young": _w(0, kv=0.0), "kv": _w(0, kv=0.4)}
    chosen, _ = choose_victims(replicas, work, 1, serving=replicas)
    assert [v.name for v in chosen] == ["young"]


def test_a_replica_whose_kv_the_others_cannot_take_is_kept() -> None:
    # a prefill replica holding KV that decode has not pulled yet: no running request, the
    # least work, but 90 % of its KV in use, and b has only 70 % free.
    replicas = [_r("a"), _r("b")]
    work = {"a": _w(0, kv=0.9), "b": _w(2, kv=0.3)}
    chosen, held = choose_victims(replicas, work, 1, serving=replicas)
    assert chosen == []
    assert held[0] == ("a holds 90% of a replica's KV cache and the replicas that stay have "
                       "70% free between them: kept")
    work["a"] = _w(0, kv=0.6)
    chosen, held = choose_victims(replicas, work, 1, serving=replicas)
    assert [v.name for v in chosen] == ["a"] and not held


def test_the_last_ready_replica_in_routing_is_never_chosen() -> None:
    replicas = [_r("a"), _r("b", routed=False)]
    chosen, held = choose_victims(replicas, {"a": _w(0), "b": _w(2)}, 2, serving=[replicas[0]])
    assert [v.name for v in chosen] == ["b"]  # out of routing already: it goes first
    assert held == ["a is the last ready replica in routing: kept"]


@pytest.mark.parametrize(("work", "role", "expect"), [
    pytest.param(None, Role.DECODE, None, id="no-sample"),
    pytest.param(_w(0, at=NOW - 5), Role.DECODE, None, id="sample-before-settle"),
    pytest.param(_w(None, None, at=NOW + 20), Role.DECODE, None, id="not-exported"),
    pytest.param(_w(2, at=NOW + 20), Role.DECODE, False, id="running"),
    pytest.param(_w(0, 1, at=NOW + 20), Role.DECODE, False, id="waiting"),
    pytest.param(_w(0, kv=0.1, at=NOW + 20), Role.PREFILL, False, id="prefill-kv-not-pulled"),
    pytest.param(_w(0, kv=0.1, at=NOW + 20), Role.DECODE, True, id="decode-kv-irrelevant"),
    pytest.param(_w(0, kv=0.0, at=NOW + 20), Role.PREFILL, True, id="prefill-idle"),
])
def test_idle_only_on_a_sample_taken_after_routing_settled(
        work: PodWork | None, role: Role, expect: bool | None) -> None:
    idle, why = is_idle(_r("a", since=NOW), work, role=role, since_s=NOW, settle_s=10)
    assert idle is expect, why


def test_scale_down_marks_waits_then_removes_that_replica() -> None:
    replicas = [_r("a", created=1), _r("b", created=2), _r("c", created=3)]
    work = {"a": _w(4), "b": _w(1), "c": _w(6)}
    plan = plan_drain(role=Role.DECODE, current=3, target=2, replicas=replicas, work=work,
                      now_s=NOW, config=CFG)
    assert [v.name for v in plan.stop_routing] == ["b"]
    assert plan.replicas_after is None and not plan.remove
    # Next tick: b is out of routing, still finishing one request.
    replicas[1] = _r("b", created=2, since=NOW)
    later = NOW + 15
    work["b"] = _w(1, at=later)
    plan = plan_drain(role=Role.DECODE, current=3, target=2, replicas=replicas, work=work,
                      now_s=later, config=CFG)
    assert not plan.stop_routing and not plan.remove
    assert [p.name for p in plan.in_progress] == ["b"]
    assert "1 running" in plan.in_progress[0].waiting_for
    work["b"] = _w(0, at=later + 15)
    plan = plan_drain(role=Role.DECODE, current=3, target=2, replicas=replicas, work=work,
                      now_s=later + 15, config=CFG)
    assert plan.remove == ("b",) and plan.replicas_after == 2
    assert plan.finished[0].outcome == "drained" and plan.finished[0].duration_s == 30


def test_a_drain_that_times_out_is_removed_with_what_it_held() -> None:
    replicas = [_r("a"), _r("b", since=NOW - 301)]
    plan = plan_drain(role=Role.DECODE, current=2, target=1, replicas=replicas,
                      work={"a": _w(0), "b": _w(3)}, now_s=NOW, config=CFG)
    assert plan.remove == ("b",) and plan.replicas_after == 1
    (f,) = plan.finished
    assert f.outcome == "timeout" and f.held is not None and f.held.running == 3
    assert "still holding 3 running" in f.why


def test_a_drain_whose_removal_keeps_failing_is_taken_back() -> None:
    replicas = [_r("a"), _r("b", since=NOW - 601)]
    plan = plan_drain(role=Role.DECODE, current=2, target=1, replicas=replicas,
                      work={"a": _w(0), "b": _w(3)}, now_s=NOW, config=CFG)
    assert [n for n, _ in plan.resume_routing] == ["b"]
    assert plan.finished[0].outcome == "taken_back"


def test_scale_up_during_a_drain_takes_the_draining_replica_back() -> None:
    replicas = [_r("a"), _r("b", since=NOW - 5)]
    plan = plan_drain(role=Role.DECODE, current=2, target=3, replicas=replicas,
                      work={}, now_s=NOW, config=CFG)
    assert [n for n, _ in plan.resume_routing] == ["b"]
    assert plan.replicas_after is None  # the caller writes 3 as a plain scale-up


def test_target_rising_but_still_lower_takes_back_the_busiest_drain() -> None:
    replicas = [_r("a"), _r("b", since=NOW - 5), _r("c", since=NOW - 5), _r("d")]
    work = {"b": _w(5), "c": _w(1)}
    plan = plan_drain(role=Role.DECODE, current=4, target=3, replicas=replicas, work=work,
                      now_s=NOW, config=CFG)
    assert [n for n, _ in plan.resume_routing] == ["b"]
    assert not plan.stop_routing


def test_a_starting_replica_goes_at_once_without_a_drain() -> None:
    replicas = [_r("a"), _r("b"), _r("s", ready=False)]
    plan = plan_drain(role=Role.DECODE, current=3, target=2, replicas=replicas,
                      work={"a": _w(0), "b": _w(0)}, now_s=NOW, config=CFG)
    assert plan.remove == ("s",) and plan.replicas_after == 2 and not plan.stop_routing


def test_highest_ordinal_kinds_drain_their_top_ordinals_and_remove_from_the_top() -> None:
    cfg = DrainConfig(timeout_s=300, settle_s=10, removal="highest_ordinal")
    replicas = [_r("s-0", ordinal=0), _r("s-1", ordinal=1), _r("s-2", ordinal=2),
                _r("s-3", ordinal=3)]
    work = {"s-0": _w(0), "s-1": _w(0), "s-2": _w(9), "s-3": _w(9)}
    plan = plan_drain(role=Role.DECODE, current=4, target=2, replicas=replicas, work=work,
                      now_s=NOW, config=cfg)
    assert sorted(v.name for v in plan.stop_routing) == ["s-2", "s-3"]
    assert "highest ordinal" in plan.stop_routing[0].why
    # s-2 drained, s-3 not yet: the workload would take s-3 first, so nothing goes.
    replicas[2] = _r("s-2", ordinal=2, since=NOW)
    replicas[3] = _r("s-3", ordinal=3, since=NOW)
    t = NOW + 20
    work = {"s-2": _w(0, at=t), "s-3": _w(2, at=t)}
    plan = plan_drain(role=Role.DECODE, current=4, target=2, replicas=replicas, work=work,
                      now_s=t, config=cfg)
    assert not plan.remove
    assert {p.name for p in plan.in_progress} == {"s-2", "s-3"}
    work["s-3"] = _w(0, at=t)
    plan = plan_drain(role=Role.DECODE, current=4, target=2, replicas=replicas, work=work,
                      now_s=t, config=cfg)
    assert plan.remove == ("s-3", "s-2") and plan.replicas_after == 2


def test_irreversible_backends_remove_the_least_loaded_at_once() -> None:
    cfg = DrainConfig(timeout_s=30, settle_s=0, reversible=False)
    replicas = [_r("w-0", created=1), _r("w-1", created=2), _r("w-2", created=3, since=NOW)]
    plan = plan_drain(role=Role.DECODE, current=2, target=1, replicas=replicas,
                      work={"w-0": _w(0), "w-1": _w(3)}, now_s=NOW + 1, config=cfg)
    assert plan.remove == ("w-0",) and plan.replicas_after == 1
    assert [p.name for p in plan.in_progress] == ["w-2"]
