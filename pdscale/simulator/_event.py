"""Discrete-event, iteration-level simulation of one service's prefill and decode pools.

Design (what is modelled, and the shortcuts that keep it fast):

* Prefill: chunked prefill. An instance's iteration takes up to ``max_prefill_tokens_per_iter``
  uncached prompt tokens, continuing its own partly-done prompts first, then new requests: from
  the pool's shared queue with the least-loaded router (idle workers pull from it), or from its
  own queue with the round-robin router (each request to the next ready worker, whatever its
  load: Dynamo 1.6.1's frontend with its default ``--router-mode round-robin``, measured on the
  loopback stack) and with the prefix-aware router. An
  iteration costs ``a`` plus each chunk's linear and attention cost (:mod:`._profiles`).
  Prefix caching: each instance keeps an LRU of 512-token block hashes as large as its KV
  cache; a request's leading blocks found there are not recomputed.
* A request reaches the prefill pool after the frontend has handled its prompt (the profile's
  ``frontend_ms_per_1k_tokens``, zero for most): requests that arrive together reach the
  workers shortest first, as on the loopback stack (its mocker profile: 0.2 ms per 1,000 prompt
  tokens before the prefill; the rest of its per-token overhead is after it, as KV transfer).
* KV transfer to decode after the prompt is done: ``latency + bytes / bandwidth``.
* Decode: continuous batching. Between two changes to a batch (a join, a finish, KV running
  out) every step has the same batch size and the resident KV grows by B tokens a step, so the
  simulator jumps over those steps in closed form (a sum of an arithmetic series) instead of
  stepping one by one: events are proportional to requests, not to tokens. A request joins at
  the next step boundary; its first token is the end of its first step; admission needs room
  for its context in the KV cache; when the cache would overflow, the newest sequence is
  preempted (vLLM's recompute preemption) and re-admitted later at the cost of re-prefilling
  its context on the decode instance. The decode pool's code is :mod:`._decode`.
* TTFT = arrival to the first token from decode (the frontend's share, prefill queueing and
  compute, the engine's non-GPU overhead, the KV transfer, waiting for admission, the first
  step). A request meets
  the ITL SLO when its mean inter-token time (TPOT) is within it; ``itl_p95_s`` is over tokens.
* Replicas: starting (billed from the request, ready after the cold start), ready, draining
  (finishes its work, takes none), gone. Failures remove a replica at a given time; its
  requests are redone elsewhere.
"""

from __future__ import annotations

import heapq
import math
from collections import deque
from collections.abc import Callable, Sequence

import numpy as np
import numpy.typing as npt

from pdscale.simulator._decode import _DecodePool
from pdscale.simulator._setup import ColdStarts, PoolSetup, SimSetup, _Ev, hist_quantile
from pdscale.simulator._setup import _DecodeReplica as _DecodeReplica
from pdscale.simulator._setup import _PrefillReplica as _PrefillReplica
from pdscale.simulator._setup import _Replica as _Replica
from pdscale.simulator._setup import _State as _State
from pdscale.simulator._setup import _Waiting as _Waiting
from pdscale.simulator._trace import MOONCAKE_BLOCK_TOKENS, Trace
from pdscale.spec import Role

__all__ = ["EventSimulator", "PoolSetup", "SimSetup", "hist_quantile"]

_MAX_DRAIN_S = 6 * 3600.0
IntArray = npt.NDArray[np.int64]
FloatArray = npt.NDArray[np.float64]


class EventSimulator(_DecodePool):
    """Runs a trace through the pools; ``on_tick(sim, now)`` is called every ``tick_s``."""

    def __init__(self, setup: SimSetup, trace: Trace) -> None:
        self.setup = setup
        self.trace = trace
        self.cold_starts = ColdStarts(setup.seed)
        n = len(trace)
        self.prompt = trace.prompt_tokens.astype(np.int64)
        self.output = np.maximum(trace.output_tokens.astype(np.int64), 1)
        self.arrival = trace.arrival_s.astype(np.float64)
        self.cached = np.zeros(n, dtype=np.int64)
        self.done = np.zeros(n, dtype=np.int64)
        self.prefill_start = np.full(n, np.nan)
        """When each request's (last) prefill was taken up: its queue time ends there."""
        self.prefill_end = np.full(n, np.nan)
        self.failed: list[tuple[float, Role, bool]] = []
        """(time, pool, whether a ready replica was there to lose) of each failure that came
        due; one due after the run ended is not here."""
        self.prefilled: deque[tuple[float, int]] = deque()
        """(time, prompt tokens) of each prefill as it completes: when vLLM counts a
        request's prompt tokens (its prompt_tokens_total); the observer trims it."""
        self.first_token = np.full(n, np.nan)
        self.finish = np.full(n, np.nan)
        self.preemptions = 0
        self.finished = 0
        self.rejected = 0
        self.rerouted = 0
        self._owner: dict[int, _PrefillReplica] = {}
        self._next_worker = 0
        """The round-robin router's counter."""
        self._events: list[tuple[float, int, int, int, int]] = []
        self._seq = 0
        self.now = 0.0
        self._next_id = 0
        self.prefill: list[_PrefillReplica] = []
        self.decode: list[_DecodeReplica] = []
        self._prefill_by_id: dict[int, _PrefillReplica] = {}
        self._decode_by_id: dict[int, _DecodeReplica] = {}
        self.shared_queue: deque[int] = deque()
        self.desired = {Role.PREFILL: setup.prefill.initial_replicas,
                        Role.DECODE: setup.decode.initial_replicas}
        for _ in range(setup.prefill.initial_replicas):
            self._add(Role.PREFILL, ready_now=True)
        for _ in range(setup.decode.initial_replicas):
            self._add(Role.DECODE, ready_now=True)
        # Token-weighted ITL histogram (log buckets) and per-window accumulators.
        self.itl_edges = np.geomspace(1e-4, 100.0, 801)
        self.itl_hist = np.zeros(len(self.itl_edges) + 1)
        self.window_itl_hist = np.zeros(len(self.itl_edges) + 1)
        self.window_prompt_tokens = 0
        self.window_cached_tokens = 0
        self.window_generated = 0
        self.window_arrivals = 0
        self.window_finished = 0
        self.window_prefilled = 0
        self.window_first_tokens: list[float] = []
        self.on_tick: Callable[[EventSimulator, float], None] | None = None
        self._pending_chunks: dict[int, list[tuple[int, int]]] = {}
        self._progress: dict[int, int] = {}  # tokens generated before a preemption
        self._orphans: list[int] = []  # KV arrived while no decode replica was ready
        self._end_of_arrivals = 0.0
        self._last_report = 0.0
        self.on_arrival: Callable[[int], None] | None = None
        # Which replica prefilled each request (live metrics attribute TTFT to it).
        self.prefilled_by = np.zeros(n, dtype=np.int64)
        self.decoded_by = np.zeros(n, dtype=np.int64)

    # -- replicas -------------------------------------------------------------------------

    def pool(self, role: Role) -> Sequence[_Replica]:
        return self.prefill if role is Role.PREFILL else self.decode

    def pool_setup(self, role: Role) -> PoolSetup:
        return self.setup.prefill if role is Role.PREFILL else self.setup.decode

    def _add(self, role: Role, *, ready_now: bool = False) -> None:
        ps = self.pool_setup(role)
        ready = self.now if ready_now else self.now + self.cold_starts.draw(ps)
        state = _State.READY if ready_now else _State.STARTING
        self._next_id += 1
        r: _Replica
        if role is Role.PREFILL:
            pr = _PrefillReplica(self._next_id, state, self.now, ready)
            self.prefill.append(pr)
            self._prefill_by_id[pr.id] = pr
            r = pr
        else:
            dr = _DecodeReplica(self._next_id, state, self.now, ready, t_last=self.now,
                                waiting=_Waiting(self.prompt))
            self.decode.append(dr)
            self._decode_by_id[dr.id] = dr
            r = dr
        if not ready_now:
            self._push(ready, _Ev.READY, int(role is Role.DECODE), r.id)

    def counts(self, role: Role) -> dict[str, int]:
        out = {"ready": 0, "starting": 0, "draining": 0}
        for r in self.pool(role):
            if r.state is _State.READY:
                out["ready"] += 1
            elif r.state is _State.STARTING:
                out["starting"] += 1
            elif r.state is _State.DRAINING:
                out["draining"] += 1
        return out

    def set_replicas(self, role: Role, replicas: int) -> None:
        """Scale a pool: start replicas, or cancel starting ones and drain ready ones."""
        ps = self.pool_setup(role)
        replicas = max(ps.min_replicas, min(ps.max_replicas, replicas))
        self.desired[role] = replicas
        active = [r for r in self.pool(role) if r.state in (_State.READY, _State.STARTING)]
        if replicas > len(active):
            for _ in range(replicas - len(active)):
                self._add(role)
            return
        excess = len(active) - replicas
        for r in sorted(active, key=lambda r: (r.state is _State.READY, -r.requested_s)):
            if excess == 0:
                break
            excess -= 1
            if r.state is _State.STARTING:
                r.state, r.gone_s = _State.GONE, self.now
            else:
                r.state = _State.DRAINING
                self._maybe_gone(r)

    def _maybe_gone(self, r: _Replica) -> None:
        if r.state is not _State.DRAINING:
            return
        if isinstance(r, _PrefillReplica):
            if not r.busy and not r.active and not r.queue:
                r.state, r.gone_s = _State.GONE, self.now
        elif isinstance(r, _DecodeReplica) and not r.members and not r.waiting:
            r.state, r.gone_s = _State.GONE, self.now

    # -- events ---------------------------------------------------------------------------

    def _push(self, t: float, kind: _Ev, a: int, b: int) -> None:
        self._seq += 1
        heapq.heappush(self._events, (t, self._seq, int(kind), a, b))

    def run(self, *, progress: Callable[[float], None] | None = None) -> None:
        """Run the whole trace, then close the books."""
        self.start()
        self.advance(math.inf, progress=progress)
        self.close()

    def start(self) -> None:
        n = len(self.arrival)
        # A request reaches the prefill workers after the frontend has handled its prompt
        # (the profile's share per token; none for most profiles).
        profile = self.setup.prefill.profile
        seen = self.arrival + self.prompt * (profile.frontend_ms_per_1k_tokens / 1e6)
        for i in range(n):
            self._push(float(seen[i]), _Ev.ARRIVAL, i, 0)
        for t, role in self.setup.failures:
            self._push(t, _Ev.FAIL, int(role is Role.DECODE), 0)
        self._push(0.0, _Ev.TICK, 0, 0)
        self._end_of_arrivals = float(seen.max()) if n else 0.0
        self._last_report = 0.0

    @property
    def done_running(self) -> bool:
        return not self._events or self.now > self._end_of_arrivals + _MAX_DRAIN_S

    def advance(self, until: float, *, progress: Callable[[float], None] | None = None,
                settle: bool = True) -> None:
        """Process every event up to simulated time ``until`` (live mode steps with this);
        with ``settle`` the clock then reads ``until`` even if no event was due."""
        n = len(self.arrival)
        end_of_arrivals = self._end_of_arrivals
        while self._events and self._events[0][0] <= until:
            if (self.finished >= n  # a rejected request counts as finished
                    and self._events[0][0] > max(self.now, end_of_arrivals)
                    and (until == math.inf or not settle)):
                # Every request is answered: replicas still starting bill nothing more. (A
                # settling step, live mode's, runs its events in order instead: its clock
                # reads ``until`` after the step, and a skipped event would run in the past.)
                break
            t, _, kind, a, b = heapq.heappop(self._events)
            self.now = t
            if kind == _Ev.ARRIVAL:
                self.window_arrivals += 1
                if self.on_arrival is not None:
                    self.on_arrival(a)
                self._route_prefill(a)
            elif kind == _Ev.PREFILL_DONE:
                self._prefill_done(self._prefill_by_id[a])
            elif kind == _Ev.KV_ARRIVE:
                self._kv_arrive(a)
            elif kind == _Ev.DECODE:
                r = self._decode_by_id[a]
                if r.version == b and r.state is not _State.GONE:
                    self._decode_event(r)
            elif kind == _Ev.READY:
                self._ready(Role.DECODE if a else Role.PREFILL, b)
            elif kind == _Ev.FAIL:
                self._fail(Role.DECODE if a else Role.PREFILL)
            elif kind == _Ev.TICK:
                if self.on_tick is not None:
                    self.on_tick(self, t)
                self._reset_window()
                if t < end_of_arrivals or self.finished < n:
                    self._push(t + self.setup.tick_s, _Ev.TICK, 0, 0)
                if progress is not None and t - self._last_report >= 60:
                    self._last_report = t
                    progress(min(1.0, t / max(end_of_arrivals, 1e-9)))
            if self.now > end_of_arrivals + _MAX_DRAIN_S:
                break  # a pool that can never finish its work: stop, results show it
        if settle and until != math.inf and until > self.now:
            self.now = until

    def close(self) -> None:
        for replica in [*self.prefill, *self.decode]:
            if replica.gone_s is None:
                replica.gone_s = self.now

    def _reset_window(self) -> None:
        self.window_itl_hist[:] = 0
        self.window_prompt_tokens = 0
        self.window_cached_tokens = 0
        self.window_generated = 0
        self.window_arrivals = 0
        self.window_finished = 0
        self.window_prefilled = 0
        self.window_first_tokens = []

    def _ready(self, role: Role, rid: int) -> None:
        for r in self.pool(role):
            if r.id == rid and r.state is _State.STARTING:
                r.state = _State.READY
                if isinstance(r, _DecodeReplica):
                    r.t_last = self.now
                    self._decode_admit_from_peers(r)
                else:
                    assert isinstance(r, _PrefillReplica)
                    self._prefill_kick(r)

    def _fail(self, role: Role) -> None:
        victims = [r for r in self.pool(role) if r.state is _State.READY]
        self.failed.append((self.now, role, bool(victims)))
        if not victims:
            return
        r = max(victims, key=lambda r: r.requested_s)
        r.state, r.gone_s = _State.GONE, self.now
        if isinstance(r, _PrefillReplica):
            lost = list(r.active) + list(r.queue)
            r.active.clear()
            r.queue.clear()
            for req in lost:
                self.done[req] = 0
                self._owner.pop(req, None)
                self.rerouted += 1
                self._route_prefill(req)
        elif isinstance(r, _DecodeReplica):
            lost = list(r.members) + list(r.waiting)
            r.members.clear()
            r.waiting.clear()
            r.finish_heap.clear()
            for req in lost:
                self.rerouted += 1
                self._kv_arrive(req, recompute=True)
        self.set_replicas(role, self.desired[role])  # a controller would replace it

    # -- prefill --------------------------------------------------------------------------

    def _ready_prefill(self) -> list[_PrefillReplica]:
        return [r for r in self.prefill if r.state is _State.READY]

    def _route_prefill(self, req: int) -> None:
        ready = self._ready_prefill()
        if self.setup.router == "prefix" and ready and self.trace.hash_ids is not None:
            hashes = self.trace.hash_ids[req]
            least = min(r.queued_tokens for r in ready)

            def score(r: _PrefillReplica) -> tuple[int, int]:
                hit = 0
                for h in hashes:
                    if int(h) not in r.cache:
                        break
                    hit += 1
                # Prefer the cache, unless the replica is far busier than the least loaded.
                penalty = r.queued_tokens - least > 4 * self.setup.prefill.profile \
                    .max_prefill_tokens_per_iter
                return (0 if penalty else hit, -r.queued_tokens)

            self._enqueue(max(ready, key=score), req)
            return
        if self.setup.router == "round_robin" and ready:
            self._enqueue(ready[self._next_worker % len(ready)], req)
            self._next_worker += 1
            return
        self.shared_queue.append(req)
        for r in ready:
            if not r.busy:
                self._prefill_kick(r)
                break

    def _enqueue(self, r: _PrefillReplica, req: int) -> None:
        """To one worker's own queue (it alone serves it, draining or not)."""
        r.queue.append(req)
        r.queued_tokens += int(self.prompt[req])
        self._prefill_kick(r)

    def _cache_hit(self, r: _PrefillReplica, req: int) -> int:
        if self.trace.hash_ids is None:
            return 0
        hit = 0
        for h in self.trace.hash_ids[req]:
            key = int(h)
            if key not in r.cache:
                break
            r.cache.move_to_end(key)
            hit += 1
        return min(hit * MOONCAKE_BLOCK_TOKENS, int(self.prompt[req]) - 1)

    def _cache_insert(self, r: _PrefillReplica, req: int) -> None:
        if self.trace.hash_ids is None:
            return
        capacity = self.setup.prefill.profile.kv_capacity_tokens // MOONCAKE_BLOCK_TOKENS
        for h in self.trace.hash_ids[req]:
            r.cache[int(h)] = None
            r.cache.move_to_end(int(h))
        while len(r.cache) > capacity:
            r.cache.popitem(last=False)

    def _prefill_kick(self, r: _PrefillReplica) -> None:
        if r.busy or r.state not in (_State.READY, _State.DRAINING):
            return
        profile = self.setup.prefill.profile
        budget = profile.max_prefill_tokens_per_iter
        chunks: list[tuple[int, int]] = []
        spans: list[tuple[float, float]] = []  # (tokens done before, chunk) for the cost
        sources: list[deque[int]] = [r.queue]
        if r.state is _State.READY:
            # The shared queue first: with the round-robin and prefix routers it holds only
            # what arrived while no worker was ready, older than anything in a worker's own.
            sources.insert(0, self.shared_queue)
        for req in r.active:
            if budget <= 0:
                break
            left = int(self.prompt[req]) - int(self.cached[req]) - int(self.done[req])
            x = min(left, budget)
            spans.append((float(self.cached[req] + self.done[req]), x))
            chunks.append((req, x))
            budget -= x
        for source in sources:
            while budget > 0 and source:
                req = source.popleft()
                if source is r.queue:
                    r.queued_tokens -= int(self.prompt[req])
                self.cached[req] = self._cache_hit(r, req)
                self.prefill_start[req] = self.now
                self.window_prompt_tokens += int(self.prompt[req])
                self.window_prefilled += 1
                self.window_cached_tokens += int(self.cached[req])
                self._owner[req] = r
                r.active.append(req)
                left = int(self.prompt[req]) - int(self.cached[req])
                x = min(left, budget)
                spans.append((float(self.cached[req]), x))
                chunks.append((req, x))
                budget -= x
        if not chunks:
            self._maybe_gone(r)
            return
        r.busy = True
        duration = profile.iteration_ms(spans) / 1000.0
        r.busy_s += duration
        self._pending_chunks[r.id] = chunks
        self._push(self.now + duration, _Ev.PREFILL_DONE, r.id, 0)

    def _prefill_done(self, r: _Replica) -> None:
        assert isinstance(r, _PrefillReplica)
        r.busy = False
        chunks = self._pending_chunks.pop(r.id, [])
        profile = self.setup.prefill.profile
        if r.state is _State.GONE:
            return
        for req, x in chunks:
            self.done[req] += x
            if self.done[req] + self.cached[req] >= self.prompt[req]:
                r.active.remove(req)
                self._owner.pop(req, None)
                self._cache_insert(r, req)
                self.prefill_end[req] = self.now
                self.prefilled.append((self.now, int(self.prompt[req])))
                self.prefilled_by[req] = r.id
                delay = (profile.ttft_overhead_ms +
                         self.setup.decode.profile.kv_transfer_ms(float(self.prompt[req]))) / 1000
                self._push(self.now + delay, _Ev.KV_ARRIVE, req, 0)
        self._prefill_kick(r)
        if not r.busy:
            # Idle: help with the shared queue only through kick; nothing else to do.
            self._maybe_gone(r)

    # -- observations ---------------------------------------------------------------------

    def itl_quantile(self, q: float) -> float | None:
        return hist_quantile(self.itl_hist, self.itl_edges, q)
