"""Event mode's decode pool: continuous batching, stepped in closed form between two changes to
a batch (a join, a finish, KV running out), KV admission with vLLM's watermark, recompute
preemption, and where a prefilled request's KV goes. A mixin of
:class:`simulator._event.EventSimulator`, which describes the model and holds the state."""

from __future__ import annotations

import heapq
import math

import numpy as np
import numpy.typing as npt

from pdscale.simulator._setup import SimSetup, _DecodeReplica, _Ev, _Replica, _State

IntArray = npt.NDArray[np.int64]
FloatArray = npt.NDArray[np.float64]


class _DecodePool:
    """The decode half of :class:`simulator._event.EventSimulator`; the attributes and the two
    methods declared here are the simulator's."""

    setup: SimSetup
    now: float
    decode: list[_DecodeReplica]
    prompt: IntArray
    output: IntArray
    arrival: FloatArray
    first_token: FloatArray
    finish: FloatArray
    decoded_by: IntArray
    itl_edges: FloatArray
    itl_hist: FloatArray
    window_itl_hist: FloatArray
    window_generated: int
    window_finished: int
    window_first_tokens: list[float]
    preemptions: int
    finished: int
    rejected: int
    _progress: dict[int, int]
    _orphans: list[int]

    def _push(self, t: float, kind: _Ev, a: int, b: int) -> None: ...

    def _maybe_gone(self, r: _Replica) -> None: ...

    def _step_sum_ms(self, r: _DecodeReplica, m: int) -> float:
        p = self.setup.decode.profile
        b = len(r.members)
        base = p.decode_d0_ms + p.decode_d1_ms * b + p.decode_d2_ms * r.kv() / 1000
        return m * base + p.decode_d2_ms * b * m * (m - 1) / 2000

    def _max_steps_within(self, r: _DecodeReplica, dt_ms: float) -> int:
        p = self.setup.decode.profile
        b = len(r.members)
        base = p.decode_d0_ms + p.decode_d1_ms * b + p.decode_d2_ms * r.kv() / 1000
        alpha = p.decode_d2_ms * b / 2000
        beta = base - alpha
        if dt_ms <= 0:
            return 0
        if alpha <= 1e-15:
            n = int(dt_ms / base)
        else:
            n = int((-beta + math.sqrt(beta * beta + 4 * alpha * dt_ms)) / (2 * alpha))
        while n > 0 and self._step_sum_ms(r, n) > dt_ms + 1e-9:
            n -= 1
        while self._step_sum_ms(r, n + 1) <= dt_ms + 1e-9:
            n += 1
        return n

    def _run_steps(self, r: _DecodeReplica, m: int) -> None:
        if m <= 0 or not r.members:
            return
        total_ms = self._step_sum_ms(r, m)
        b = len(r.members)
        if r.first_pending:
            first = self._step_sum_ms(r, 1) / 1000.0
            for req in r.first_pending:
                self.first_token[req] = r.t_last + first
                self.window_first_tokens.append(r.t_last + first - float(self.arrival[req]))
            r.first_pending.clear()
        mean_step_s = total_ms / m / 1000.0
        bucket = int(np.searchsorted(self.itl_edges, mean_step_s))
        self.itl_hist[bucket] += m * b
        self.window_itl_hist[bucket] += m * b
        r.tokens += m * b
        if r.itl_hist is None:
            r.itl_hist = np.zeros(len(self.itl_edges) + 1)
        r.itl_hist[bucket] += m * b
        self.window_generated += m * b
        r.steps += m
        r.t_last += total_ms / 1000.0
        r.busy_s += total_ms / 1000.0

    def _steps_to_next_change(self, r: _DecodeReplica) -> int:
        while r.finish_heap and r.members.get(r.finish_heap[0][1]) != r.finish_heap[0][2]:
            heapq.heappop(r.finish_heap)  # drop stale entries so the next finish is exact
        k = r.finish_heap[0][0] - r.steps if r.finish_heap else 1 << 30
        cap = self.setup.decode.profile.kv_capacity_tokens
        b = len(r.members)
        room = (cap - r.kv()) // b if b else 1 << 30
        return int(max(0, min(k, room)))

    def _advance(self, r: _DecodeReplica, t: float) -> None:
        """Run the batch up to the first step boundary at or after ``t``."""
        if r.stall_s > 0 and r.members:
            r.t_last += r.stall_s
            r.busy_s += r.stall_s
            r.stall_s = 0.0
        while r.members and r.t_last < t:
            k = self._steps_to_next_change(r)
            if k == 0:
                self._preempt(r)
                continue
            if r.t_last + self._step_sum_ms(r, k) / 1000.0 <= t:
                self._run_steps(r, k)
            else:
                n = self._max_steps_within(r, (t - r.t_last) * 1000.0)
                self._run_steps(r, min(k, n + 1))
            self._collect_finished(r)
        if not r.members:
            r.t_last = max(r.t_last, t)

    def _collect_finished(self, r: _DecodeReplica) -> None:
        done = 0
        while r.finish_heap and r.finish_heap[0][0] <= r.steps:
            _, req, joined = heapq.heappop(r.finish_heap)
            if r.members.get(req) != joined:
                continue  # that join was preempted: a stale entry
            join = r.members.pop(req)
            r.ctx_offset -= int(self.prompt[req]) + self._generated_before(req) - join
            self.finish[req] = r.t_last
            done += 1
        self.finished += done
        self.window_finished += done

    def _generated_before(self, req: int) -> int:
        return self._progress.get(req, 0)

    def _preempt(self, r: _DecodeReplica) -> None:
        req = max(r.members, key=lambda q: r.members[q])
        join = r.members.pop(req)
        made = self._generated_before(req) + (r.steps - join)
        r.ctx_offset -= int(self.prompt[req]) + self._generated_before(req) - join
        self._progress[req] = made
        r.preempted += 1
        if req in r.first_pending:
            r.first_pending.remove(req)
        self.preemptions += 1
        r.waiting.appendleft(req)

    def _admit(self, r: _DecodeReplica) -> None:
        profile = self.setup.decode.profile
        cap = profile.kv_capacity_tokens
        watermark = cap // 100  # vLLM keeps ~1 % of blocks free when admitting
        while r.waiting and len(r.members) < profile.max_batch:
            req = r.waiting[0]
            made = self._generated_before(req)
            ctx = int(self.prompt[req]) + made
            if int(self.prompt[req]) + int(self.output[req]) > cap - watermark:
                # Can never fit on one replica (the engine rejects it): a failed request.
                r.waiting.popleft()
                self.rejected += 1
                self.finished += 1  # (vLLM rejects it at the API: not a request_success)
                continue
            if r.kv() + ctx + len(r.members) + 1 > cap - watermark:
                break
            r.waiting.popleft()
            r.members[req] = r.steps
            self.decoded_by[req] = r.id
            r.ctx_offset += ctx - r.steps
            heapq.heappush(r.finish_heap, (r.steps + int(self.output[req]) - made, req, r.steps))
            if made:
                r.stall_s += profile.prefill_ms(ctx) / 1000.0  # recompute the evicted KV
            elif np.isnan(self.first_token[req]):
                r.first_pending.append(req)

    def _schedule(self, r: _DecodeReplica) -> None:
        r.version += 1
        if not r.members:
            self._maybe_gone(r)
            return
        k = self._steps_to_next_change(r)
        t = r.t_last + r.stall_s + (self._step_sum_ms(r, k) / 1000.0 if k > 0 else 0.0)
        self._push(max(t, self.now), _Ev.DECODE, r.id, r.version)

    def _decode_event(self, r: _Replica) -> None:
        assert isinstance(r, _DecodeReplica)
        self._advance(r, self.now)
        if r.members and self._steps_to_next_change(r) == 0:
            self._preempt(r)
        self._admit(r)
        self._schedule(r)

    def _pick_decode(self) -> _DecodeReplica | None:
        ready = [r for r in self.decode if r.state is _State.READY]
        if not ready:
            return None
        return min(ready, key=lambda r: (r.kv() + r.waiting.tokens, len(r.members)))

    def _kv_arrive(self, req: int, recompute: bool = False) -> None:
        r = self._pick_decode()
        if r is None:
            self._orphans.append(req)
            return
        if recompute and req not in self._progress:
            self._progress[req] = 0
        self._advance(r, self.now)
        r.waiting.append(req)
        self._admit(r)
        self._schedule(r)

    def _decode_admit_from_peers(self, r: _DecodeReplica) -> None:
        """A new decode replica takes orphaned requests and some of its peers' waiting."""
        while self._orphans:
            r.waiting.append(self._orphans.pop(0))
        for peer in self.decode:
            if peer is r or peer.state is _State.GONE:
                continue
            while len(peer.waiting) > len(r.waiting) + 1:
                r.waiting.append(peer.waiting.pop())
        self._admit(r)
        self._schedule(r)
