"""What alert reactions impose on the reconcile loop's decisions: floors on a pool's replicas
and holds on its scale-down, each with an expiry and the alert that caused it (the webhook
writes them, :class:`controller.Reconciler` applies them every tick)."""

from __future__ import annotations

import logging
import threading
from collections import deque
from dataclasses import dataclass, replace
from typing import Any

from pdscale.controller._interface import Cause, Observation, PoolDecision, PoolKey, PoolObservation
from pdscale.controller._present import Shortage, ShortageCheck

__all__ = ["Overrides"]

log = logging.getLogger("pdscale.controller")


@dataclass
class _Override:
    until_s: float
    floor: int
    why: str
    check: ShortageCheck | None = None
    """The shortage it answers: it stands only while this holds (a scale_up reaction's)."""


class Overrides:
    """What alert reactions impose on the decisions: floors and scale-down holds, with expiry.

    A floor or hold with a shortage check (a ``scale_up`` reaction's) ends on the first tick
    whose observation no longer shows the shortage, whatever the alert does; the others end
    when their alert resolves or their hold passes. Thread-safe: the webhook writes, the tick
    reads."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._floors: dict[PoolKey, dict[str, _Override]] = {}
        self._holds: dict[PoolKey, dict[str, _Override]] = {}
        self.ended: deque[dict[str, Any]] = deque(maxlen=50)
        """Floors and holds that ended because their shortage cleared, newest last."""

    def floor(self, key: PoolKey, replicas: int, until_s: float, cause_id: str, why: str,
              check: ShortageCheck | None = None) -> None:
        with self._lock:
            self._floors.setdefault(key, {})[cause_id] = _Override(until_s, replicas, why, check)

    def hold(self, key: PoolKey, until_s: float, cause_id: str, why: str,
             check: ShortageCheck | None = None) -> None:
        with self._lock:
            self._holds.setdefault(key, {})[cause_id] = _Override(until_s, 0, why, check)

    def release(self, cause_id: str) -> int:
        """End every floor and hold an alert caused (it resolved); returns how many ended."""
        ended = 0
        with self._lock:
            for table in (self._floors, self._holds):
                for per_pool in table.values():
                    if per_pool.pop(cause_id, None) is not None:
                        ended += 1
        return ended

    def active(self, now_s: float) -> dict[str, list[dict[str, Any]]]:
        with self._lock:
            self._expire(now_s)
            out = {name: [{"pool": f"{k[0]}/{k[1].value}", "cause": cid, "until": o.until_s,
                           "floor": o.floor if name == "floors" else None, "why": o.why,
                           "while": None if o.check is None else o.check.condition.value}
                          for k, per in table.items() for cid, o in per.items()]
                   for name, table in (("floors", self._floors), ("holds", self._holds))}
            out["ended"] = list(self.ended)
            return out

    def _expire(self, now_s: float) -> None:
        for table in (self._floors, self._holds):
            for per_pool in table.values():
                for cid in [c for c, o in per_pool.items() if o.until_s <= now_s]:
                    del per_pool[cid]

    def _end_cleared(self, key: PoolKey, pool: PoolObservation, now_s: float
                     ) -> dict[str, Shortage]:
        """End the pool's floors and holds whose shortage no longer shows; returns the
        shortage read for each check that still holds, by cause."""
        seen: dict[str, Shortage] = {}
        for table in (self._floors, self._holds):
            for cid, o in list(table.get(key, {}).items()):
                if o.check is None:
                    continue
                if cid not in seen:
                    seen[cid] = o.check(pool)
                if seen[cid].holds:
                    continue
                del table[key][cid]
                what = f"floor {o.floor}" if table is self._floors else "scale-down hold"
                self.ended.append({"time": now_s, "pool": f"{key[0]}/{key[1].value}",
                                   "cause": cid, "what": what, "why": o.why,
                                   "cleared": seen[cid].reason})
                log.info("%s/%s: %s from %s ended: the shortage cleared (%s)", key[0],
                         key[1].value, what, o.why, seen[cid].reason)
        return {cid: sh for cid, sh in seen.items() if sh.holds}

    def apply(self, decisions: dict[PoolKey, PoolDecision], observation: Observation) -> None:
        now = observation.now_s
        with self._lock:
            self._expire(now)
            for key, d in list(decisions.items()):
                pool = observation.pools.get(key)
                if pool is None:
                    continue
                short = self._end_cleared(key, pool, now)
                r = pool.replicas
                floors = self._floors.get(key, {})
                if floors:
                    cid, top = max(floors.items(), key=lambda item: item[1].floor)
                    floor = min(top.floor, r.max_replicas)
                    if floor >= d.desired_replicas:
                        capped = f" (asked {top.floor}, capped at the pool's max)" \
                            if floor < top.floor else ""
                        now_short = f" while {short[cid].reason}" if cid in short else ""
                        reason = (f"reaction: floor {floor}{capped} from {top.why}"
                                  f"{now_short}")
                        if floor > d.desired_replicas:
                            d = replace(d, desired_replicas=floor, cause=Cause.REACTION,
                                        reasons=(*d.reasons, reason),
                                        detail={**d.detail, "reaction_floor": floor})
                        else:
                            d = replace(d, reasons=(*d.reasons, reason),
                                        detail={**d.detail, "reaction_floor": floor})
                holds = self._holds.get(key, {})
                if holds and d.desired_replicas < r.active:
                    why = next(iter(holds.values())).why
                    d = replace(d, desired_replicas=r.active, cause=Cause.REACTION,
                                reasons=(*d.reasons, f"reaction: scale-down held ({why})"),
                                detail={**d.detail, "reaction_hold": True})
                decisions[key] = d
