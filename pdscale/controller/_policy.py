"""pdscale's policy and forecast stage built from a spec, as ``pdscale run`` and the simulator
build them: each pool's profile, SLO (TTFT p95 for prefill, ITL p95 for decode), cold start
(``cold_start_p90_s``, or the caller's where it knows better, as the simulator does) and its
service's routing; the controller settings carry the rest."""

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
    return {(svc.name, role): (
        load_profile(pool.profile),
        svc.slo.ttft_p95_s if role is Role.PREFILL else svc.slo.itl_p95_s,
        (cold_start_s or {}).get((svc.name, role), pool.cold_start_p90_s))
        for svc in spec.services for role, pool in svc.pools.items()}


def build_forecasts(spec: Spec, *, cold_start_s: Mapping[PoolKey, float] | None = None
                    ) -> ForecastStage:
    """The forecast stage for every pool of the spec (its controller settings)."""
    tick = float(spec.controller.tick)
    leads = {key: cold + tick for key, (_, _, cold) in _pools(spec, cold_start_s).items()}
    return ForecastStage(leads, spec.controller)


def build_policy(spec: Spec, *, forecasts: ForecastStage | None,
                 cold_start_s: Mapping[PoolKey, float] | None = None) -> PdscalePolicy:
    """pdscale's policy for every pool of the spec; ``forecasts`` (from
    :func:`build_forecasts`; None: size on the current demand) is the stage the loop refits."""
    pools = _pools(spec, cold_start_s)
    return PdscalePolicy(spec.controller, {k: p for k, (p, _, _) in pools.items()},
                         {k: slo for k, (_, slo, _) in pools.items()},
                         {k: cold for k, (_, _, cold) in pools.items()}, forecasts=forecasts,
                         prefix_aware={svc.name for svc in spec.services
                                       if svc.routing == "prefix_aware"},
                         objective={svc.name: svc.slo.objective for svc in spec.services})
