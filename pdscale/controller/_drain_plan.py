"""The pure core of a scale-down drain (the steps in :mod:`controller._drain`'s docstring):
which replicas to remove, whether each has finished its work, and the plan for this tick.
Replicas, their work, ``now`` and the settings in; what to do out. No I/O, no clock."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Literal

from pdscale.spec import Role
from pdscale.telemetry import PodWork

__all__ = [
    "DrainConfig",
    "DrainOutcome",
    "DrainPlan",
    "DrainProgress",
    "Removal",
    "Replica",
    "Victim",
    "choose_victims",
    "describe_work",
    "is_idle",
    "plan_drain",
    "work_load",
]


Removal = Literal["chosen", "highest_ordinal"]
"""How the workload removes replicas when its count is lowered: the ones pdscale marks
(Deployments and what they run, through the deletion cost) or its highest ordinals
(StatefulSets, LeaderWorkerSets)."""


@dataclass(frozen=True)
class Replica:
    """One replica of a pool as the backend sees it (a pod, or a worker process)."""

    name: str
    ready: bool
    created_s: float
    draining_since_s: float | None = None
    """Out of routing by pdscale since then; None when not draining."""
    routed: bool = True
    """False when it is out of routing for another reason (a ``drain_instance`` reaction)."""
    ordinal: int | None = None
    """Its index where the workload removes the highest first."""
    drain_reason: str = ""
    killed: bool = False
    """The backend had to kill it at the drain's bound (process actuator)."""


@dataclass(frozen=True)
class DrainConfig:
    timeout_s: float
    """Most time a replica drains; then it is removed with what it still holds."""
    settle_s: float = 10.0
    """Idle counts only on samples taken this long after the replica left routing."""
    removal: Removal = "chosen"
    reversible: bool = True
    """The mark can be undone (a label); False: marking is removing (SIGTERM)."""
    leftover_marks: bool = False
    """The backend sets no mark of its own (Kubernetes with ``stop_routing: false``): a pod
    found marked draining is an earlier configuration's drain, taken back into routing."""

    @property
    def abandon_after_s(self) -> float:
        """A drain whose removal keeps failing is taken back into routing after this."""
        return 2 * self.timeout_s


@dataclass(frozen=True)
class Victim:
    name: str
    why: str
    work: PodWork | None = None


@dataclass(frozen=True)
class DrainProgress:
    name: str
    since_s: float
    elapsed_s: float
    work: PodWork | None
    waiting_for: str


@dataclass(frozen=True)
class DrainOutcome:
    name: str
    outcome: Literal["drained", "timeout", "taken_back", "abandoned", "gone"]
    since_s: float | None
    duration_s: float | None
    held: PodWork | None
    """What it still held when the drain ended (the timeout's cost)."""
    why: str


@dataclass(frozen=True)
class DrainPlan:
    stop_routing: tuple[Victim, ...] = ()
    resume_routing: tuple[tuple[str, str], ...] = ()
    """(name, why) of draining replicas to take back into routing."""
    remove: tuple[str, ...] = ()
    """Replicas to remove now (drained, timed out, never ready, or any victim of an
    irreversible backend)."""
    replicas_after: int | None = None
    """The count to write once ``remove`` are prepared; None: no write."""
    finished: tuple[DrainOutcome, ...] = ()
    in_progress: tuple[DrainProgress, ...] = ()
    held: tuple[str, ...] = ()
    """Why fewer replicas were chosen than asked for (that part of the scale-down waits)."""


def work_load(work: PodWork | None) -> float | None:
    """Running plus waiting requests; None when neither is known."""
    if work is None:
        return None
    parts = [v for v in (work.running, work.waiting) if v is not None]
    return sum(parts) if parts else None


def describe_work(work: PodWork | None) -> str:
    """Its work in words (running, waiting, KV in use), or that it is unknown."""
    if work is None or (work_load(work) is None and work.kv_usage is None):
        return "work unknown"
    bits = []
    if work.running is not None:
        bits.append(f"{work.running:g} running")
    if work.waiting is not None:
        bits.append(f"{work.waiting:g} waiting")
    if work.kv_usage is not None:
        bits.append(f"KV {work.kv_usage:.0%}")
    return ", ".join(bits)


def is_idle(replica: Replica, work: PodWork | None, *, role: Role, since_s: float,
            settle_s: float) -> tuple[bool | None, str]:
    """Whether a replica that left routing at ``since_s`` has finished its work: True, False
    (it still holds some) or None (not known yet), with what it waits for."""
    load = work_load(work)
    if not replica.ready and not load:
        return True, "never ready: nothing to drain"
    if work is None or work.sample_time_s is None:
        return None, "a per-pod sample (none yet)"
    if work.sample_time_s < since_s + settle_s:
        return None, (f"a sample taken {settle_s:g} s after it left routing (routers learn "
                      "late)")
    if load is None:
        return None, "its running/waiting requests (not exported for this pod)"
    if load > 0:
        return False, f"{describe_work(work)} to finish"
    if role is Role.PREFILL and work.kv_usage is not None and work.kv_usage > 0:
        return False, f"decode to pull its KV (KV {work.kv_usage:.0%} in use)"
    return True, "idle"


def choose_victims(candidates: Sequence[Replica], work: Mapping[str, PodWork], n: int, *,
                   serving: Sequence[Replica]) -> tuple[list[Victim], list[str]]:
    """Up to ``n`` replicas to remove from ``candidates`` (none of them draining), in the
    order of the module docstring, and why fewer were chosen. ``serving`` are the ready,
    routed replicas not draining: those that take new work while the victims drain."""
    if n <= 0:
        return [], []
    starting = sorted((r for r in candidates if not r.ready), key=lambda r: -r.created_s)
    unrouted = sorted((r for r in candidates if r.ready and not r.routed),
                      key=lambda r: -r.created_s)
    ready = [r for r in candidates if r.ready and r.routed]

    def known_key(r: Replica) -> tuple[float, float, float]:
        w = work.get(r.name)
        kv = w.kv_usage if w is not None and w.kv_usage is not None else 0.0
        return (work_load(w) or 0.0, kv, -r.created_s)

    known = sorted((r for r in ready if work_load(work.get(r.name)) is not None), key=known_key)
    unknown = sorted((r for r in ready if work_load(work.get(r.name)) is None),
                     key=lambda r: -r.created_s)
    chosen: list[Victim] = []
    held: list[str] = []
    staying = list(serving)
    n_ready = len(ready)
    for r in (*starting, *unrouted, *known, *unknown):
        if len(chosen) == n:
            break
        w = work.get(r.name)
        if not r.ready:
            chosen.append(Victim(r.name, "starting (not ready): it has served nothing", w))
            continue
        if not r.routed:
            chosen.append(Victim(r.name, f"already out of routing (another drain); "
                                 f"{describe_work(w)}", w))
            continue
        others = [x for x in staying if x.name != r.name]
        if not others:
            held.append(f"{r.name} is the last ready replica in routing: kept")
            continue
        kv = w.kv_usage if w is not None else None
        kv_others = [work[x.name].kv_usage if x.name in work else None for x in others]
        free = [1 - v for v in kv_others if v is not None]
        if kv is not None and len(free) == len(others) and kv > sum(free):
            held.append(f"{r.name} holds {kv:.0%} of a replica's KV cache and the replicas "
                        f"that stay have {sum(free):.0%} free between them: kept")
            continue
        if work_load(w) is None:
            why = (f"work unknown (no fresh per-pod sample), chosen after the {len(known)} "
                   "replica(s) whose work is known")
        else:
            why = f"least work of {n_ready} ready: {describe_work(w)}"
        chosen.append(Victim(r.name, why, w))
        staying = others
    return chosen, held


TakeBack = Callable[[Replica, str], None]


def plan_drain(*, role: Role, current: int, target: int, replicas: Sequence[Replica],
               work: Mapping[str, PodWork], now_s: float, config: DrainConfig) -> DrainPlan:
    """What to do this tick to bring a pool from ``current`` replicas (its count now) to
    ``target`` without dropping work (see the module docstring). Pure."""
    if not config.reversible:
        leftovers = [r for r in replicas if config.leftover_marks and
                     r.draining_since_s is not None]
        if not leftovers:
            return _plan_irreversible(current=current, target=target, replicas=replicas,
                                      work=work, now_s=now_s, removal=config.removal)
        # Marked by a configuration that stopped routing (it would wait for an idle pod
        # forever here): back into routing, then planned as any other replica.
        why = ("back into routing: an earlier configuration's drain (this one removes "
               "without a routing mark)")
        taken = tuple(DrainOutcome(r.name, "taken_back", r.draining_since_s,
                                   now_s - (r.draining_since_s or now_s), work.get(r.name), why)
                      for r in leftovers)
        plan = _plan_irreversible(
            current=current, target=target,
            replicas=[replace(r, draining_since_s=None, routed=True)
                      if r in leftovers else r for r in replicas],
            work=work, now_s=now_s, removal=config.removal)
        return replace(plan, resume_routing=(*((r.name, why) for r in leftovers),
                                             *plan.resume_routing),
                       finished=(*taken, *plan.finished))
    draining = [r for r in replicas if r.draining_since_s is not None]
    finished: list[DrainOutcome] = []
    resume: list[tuple[str, str]] = []

    def take_back(r: Replica, why: str) -> None:
        resume.append((r.name, why))
        since = r.draining_since_s
        finished.append(DrainOutcome(r.name, "taken_back", since,
                                     None if since is None else now_s - since,
                                     work.get(r.name), why))

    if target >= current:
        for r in draining:
            take_back(r, f"back into routing: the pool's target is {target} (it has "
                         f"{current})")
        return DrainPlan(resume_routing=tuple(resume), finished=tuple(finished))
    excess = current - target
    if config.removal == "highest_ordinal":
        draining, new, held = _ordinal_victims(replicas, draining, work, excess, take_back)
    else:
        draining, new, held = _least_work_victims(replicas, draining, work, excess,
                                                  target=target, take_back=take_back)
    by_name = {r.name: r for r in replicas}
    done, progress = _follow(new, draining, by_name, work, role=role, now_s=now_s,
                             config=config, take_back=take_back)
    if config.removal == "highest_ordinal":
        remove = _ordinal_removals(draining, new, by_name, done, progress, now_s=now_s)
    else:
        remove = sorted(done)
    removed = set(remove)
    return DrainPlan(
        stop_routing=tuple(v for v in new if v.name not in removed),
        resume_routing=tuple(resume),
        remove=tuple(remove),
        replicas_after=current - len(remove) if remove else None,
        finished=(*finished, *(done[n] for n in remove)),
        in_progress=tuple(progress.values()), held=tuple(held))


def _ordinal_victims(replicas: Sequence[Replica], draining: list[Replica],
                     work: Mapping[str, PodWork], excess: int,
                     take_back: TakeBack) -> tuple[list[Replica], list[Victim], list[str]]:
    """The workload removes its highest ordinals: drain those, take back any other."""
    held: list[str] = []
    ranked = sorted((r for r in replicas if r.ordinal is not None),
                    key=lambda r: -(r.ordinal or 0))
    wanted = {r.name for r in ranked[:excess]}
    for r in draining:
        if r.name not in wanted:
            take_back(r, "back into routing: the workload removes its highest ordinals "
                         "and this is no longer one of those asked for")
    draining = [r for r in draining if r.name in wanted]
    new = [Victim(r.name, "highest ordinal (the workload removes its highest ordinals "
                          f"first); {describe_work(work.get(r.name))}", work.get(r.name))
           for r in ranked[:excess] if r.draining_since_s is None]
    if len(ranked) < excess:
        held.append(f"only {len(ranked)} replica(s) with an ordinal, {excess} asked for")
    return draining, new, held


def _least_work_victims(replicas: Sequence[Replica], draining: list[Replica],
                        work: Mapping[str, PodWork], excess: int, *, target: int,
                        take_back: TakeBack) -> tuple[list[Replica], list[Victim], list[str]]:
    """The workload removes the replicas pdscale marks: keep the drains with the least work
    left, choose the rest by :func:`choose_victims`."""
    if len(draining) > excess:
        # The target rose but still asks for a scale-down: keep draining those with the
        # least work left, take the others back (they would lose the most).
        by_work = sorted(draining, key=lambda r: (work_load(work.get(r.name)) or 0.0,
                                                  r.draining_since_s or 0.0))
        for r in by_work[excess:]:
            take_back(r, f"back into routing: the pool's target rose to {target}, fewer "
                         "replicas to remove")
        draining = by_work[:excess]
    candidates = [r for r in replicas if r.draining_since_s is None]
    serving = [r for r in candidates if r.ready and r.routed]
    new, held = choose_victims(candidates, work, excess - len(draining), serving=serving)
    return draining, new, held


def _follow(new: Sequence[Victim], draining: Sequence[Replica], by_name: Mapping[str, Replica],
            work: Mapping[str, PodWork], *, role: Role, now_s: float, config: DrainConfig,
            take_back: TakeBack) -> tuple[dict[str, DrainOutcome], dict[str, DrainProgress]]:
    """Which victims are done (drained, never ready, timed out) and which still drain."""
    done: dict[str, DrainOutcome] = {}
    progress: dict[str, DrainProgress] = {}
    for v in new:
        r = by_name[v.name]
        if not r.ready and not work_load(v.work):
            done[v.name] = DrainOutcome(v.name, "drained", now_s, 0.0, v.work,
                                        f"removed at once: {v.why}")
    for r in draining:
        since = r.draining_since_s if r.draining_since_s is not None else now_s
        elapsed = now_s - since
        w = work.get(r.name)
        idle, waiting_for = is_idle(r, w, role=role, since_s=since, settle_s=config.settle_s)
        if idle:
            done[r.name] = DrainOutcome(r.name, "drained", since, elapsed, w,
                                        f"drained in {elapsed:.1f} s ({waiting_for})")
        elif elapsed >= config.abandon_after_s:
            take_back(r, f"back into routing: still here {elapsed:.0f} s after it left "
                         "routing, twice the drain timeout (does its removal keep failing?)")
        elif elapsed >= config.timeout_s:
            done[r.name] = DrainOutcome(
                r.name, "timeout", since, elapsed, w,
                f"drain timed out after {elapsed:.0f} s, removed still holding {describe_work(w)}")
        else:
            progress[r.name] = DrainProgress(r.name, since, elapsed, w, waiting_for)
    return done, progress


def _ordinal_removals(draining: Sequence[Replica], new: Sequence[Victim],
                      by_name: Mapping[str, Replica], done: dict[str, DrainOutcome],
                      progress: dict[str, DrainProgress], *, now_s: float) -> list[str]:
    """Only a run of finished replicas from the top can go: the workload takes its highest
    ordinals first, finished or not. The finished ones below wait (moved from ``done`` to
    ``progress``)."""
    victims = sorted((by_name[n] for n in [*(r.name for r in draining),
                                           *(v.name for v in new)]),
                     key=lambda r: -(r.ordinal or 0))
    remove: list[str] = []
    for r in victims:
        if r.name not in done:
            break
        remove.append(r.name)
    for name, f in list(done.items()):
        if name not in remove and by_name[name].draining_since_s is not None:
            progress[name] = DrainProgress(
                name, f.since_s or now_s, f.duration_s or 0.0, f.held,
                "the replicas above it (higher ordinals) to finish first")
            del done[name]
    return remove


def _plan_irreversible(*, current: int, target: int, replicas: Sequence[Replica],
                       work: Mapping[str, PodWork], now_s: float,
                       removal: Removal = "chosen") -> DrainPlan:
    """Marking is removing (SIGTERM drains and exits; or no routing mark at all): choose,
    remove at once, follow until gone."""
    draining = [r for r in replicas if r.draining_since_s is not None]
    progress = [DrainProgress(r.name, r.draining_since_s or now_s,
                              now_s - (r.draining_since_s or now_s), work.get(r.name),
                              "its process to finish its streams and exit")
                for r in draining]
    if target >= current:
        return DrainPlan(in_progress=tuple(progress),
                         replicas_after=target if target != current else None)
    candidates = [r for r in replicas if r.draining_since_s is None]
    if removal == "highest_ordinal":
        top = sorted((r for r in candidates if r.ordinal is not None),
                     key=lambda r: -(r.ordinal or 0))[:current - target]
        victims = [Victim(r.name, "highest ordinal (the workload removes its highest "
                                  f"ordinals first); {describe_work(work.get(r.name))}",
                          work.get(r.name)) for r in top]
        held: list[str] = []
    else:
        serving = [r for r in candidates if r.ready and r.routed]
        victims, held = choose_victims(candidates, work, current - target, serving=serving)
    names = tuple(v.name for v in victims)
    return DrainPlan(stop_routing=tuple(victims), remove=names,
                     replicas_after=current - len(names) if names else None,
                     in_progress=tuple(progress), held=tuple(held))
