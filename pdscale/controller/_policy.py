"""pdscale's policy and forecast stage, built from a spec as ``pdscale run`` and the simulator
build them.

Every pool is sized by the queueing model (:class:`~controller._model.PdscalePolicy`,
:mod:`controller._queueing`): its profile, its SLO (TTFT p95 for prefill, ITL p95 for decode)
its cold start (the pool's ``cold_start_p90_s``, or the caller's where it knows better, as
the simulator does) and its service's routing are all it is given; the controller settings
carry the rest.
"""

from __future__ import annotations

from collections.abc import Mapping

from pdscale.controller._forecast import ForecastStage
from pdscale.controller._interface import PoolKey
from pdscale.controller._model import PdscalePolicy
from pdscale.controller._profiles import InstanceProfile, load_profile
from pdscale.spec import Role, Spec

__all__ = ["build_forecasts", "build_policy"]


def _pools(spec: Spec, cold_start_s: Mapping[PoolKey, float] | None
           ) -> dict[PoolKey, tuple[InstanceProfile, float, float]]:
    """Each pool's profile, SLO and cold start p90."""
    out: dict[PoolKey, tuple[InstanceProfile, float, float]] = {}
    for svc in spec.services:
        for role, pool in svc.pools.items():
            key = (svc.name, role)
            slo = svc.slo.ttft_p95_s if role is Role.PREFILL else svc.slo.itl_p95_s
            cold = pool.cold_start_p90_s
            if cold_start_s and key in cold_start_s:
                cold = cold_start_s[key]
            out[key] = (load_profile(pool.profile), slo, cold)
    return out


def build_forecasts(spec: Spec, *, cold_start_s: Mapping[PoolKey, float] | None = None
                    ) -> ForecastStage:
    """The forecast stage for every pool of the spec (its controller settings)."""
    tick = float(spec.controller.tick)
    leads = {key: cold + tick for key, (_, _, cold) in _pools(spec, cold_start_s).items()}
    return ForecastStage(leads, spec.controller)


def build_policy(spec: Spec, *, forecasts: ForecastStage | None,
                 cold_start_s: Mapping[PoolKey, float] | None = None) -> PdscalePolicy:
    """pdscale's policy for every pool of the spec, configured by its ``controller``
    section; ``forecasts`` (from :func:`build_forecasts`, None: size on the current demand)
    is the stage the reconcile loop refits."""
    pools = _pools(spec, cold_start_s)
    return PdscalePolicy(spec.controller, {k: p for k, (p, _, _) in pools.items()},
                         {k: slo for k, (_, slo, _) in pools.items()},
                         {k: cold for k, (_, _, cold) in pools.items()}, forecasts=forecasts,
                         prefix_aware={svc.name for svc in spec.services
                                       if svc.routing == "prefix_aware"},
                         objective={svc.name: svc.slo.objective for svc in spec.services})
