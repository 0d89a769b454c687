"""What ``pdscale validate`` says about where each pool's series come from.

No engine emits ``namespace`` or ``pod``: a pool is identified only by the labels the user's
scrape configuration adds (a PodMonitor's by default). Saying so at validation time is the
cheapest place to catch a scrape that does not add them; ``pdscale check`` then proves it
against a live Prometheus.
"""

from __future__ import annotations

from pdscale import _engines
from pdscale.spec import Engine, Spec

__all__ = ["provenance_notes"]


def provenance_notes(spec: Spec) -> list[str]:
    """One line per service: engine version checked, and which selector labels come from the
    scrape configuration rather than the engine."""
    lines = []
    for i, service in enumerate(spec.services):
        version = _engines.ENGINE_VERSIONS[service.engine.value]
        engine = f"{service.engine.value} {version}" if version != "unverified" else \
            f"{service.engine.value} (metric names not verified against a release)"
        scrape = ", ".join(service.scrape_labels)
        extra = sorted({k for p in service.pools.values() for k in p.selector.match_labels
                        if k in service.scrape_labels})
        line = (f"note: services[{i}] ({service.name}, {engine}): pools are selected by "
                f"namespace and pod, which only your scrape config provides (declared scrape "
                f"labels: {scrape})")
        if extra:
            line += f"; match_labels {', '.join(extra)} must be relabelled onto every series"
        if service.engine is Engine.DYNAMO:
            line += ("; the Dynamo frontend emits only `model`, so its series are selected by "
                     "the scraped namespace and model")
        lines.append(line + ". Prove it live: pdscale check SPEC --prometheus URL")
    return lines
