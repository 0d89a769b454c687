"""``pdscale check``: every series the alerts, dashboards and controller read, checked against a
live Prometheus (:mod:`pdscale._check`)."""

from __future__ import annotations

import argparse
import time
from typing import Any

from pdscale._cli._common import (
    EXIT_BAD_INPUT,
    EXIT_FAILURE,
    EXIT_OK,
    err,
    http_url,
    load_checked,
)


def _cmd_check(args: argparse.Namespace) -> int:
    """Live check of every series the alerts, dashboards and controller read (pdscale._check)."""
    from pdscale._check import check_spec, controller_ready, render_json, render_table
    from pdscale.controller import reader_from_spec
    from pdscale.telemetry import PrometheusQueryError, PrometheusUnavailable, instant_rows

    spec = load_checked(args.spec)
    if spec is None:
        return EXIT_BAD_INPUT
    url = args.prometheus or spec.controller.prometheus.url
    names = [s.name for s in spec.services]
    if args.service and args.service not in names:
        err(f"--service: no service named {args.service!r}; the spec has {', '.join(names)}")
        return EXIT_BAD_INPUT
    services = [args.service] if args.service else None
    sources_ok: bool | None = None
    if args.controller:
        code = _check_sources(spec, args.controller, services, as_json=args.json)
        if code == EXIT_BAD_INPUT:
            return code
        sources_ok = code == EXIT_OK
        if not spec.controller.signal_sources.uses("prometheus"):
            print("Prometheus not checked: the spec reads no signal from it")
            return code
    try:
        reader = reader_from_spec(spec, url)
    except (OSError, ValueError) as exc:
        err(f"spec.controller.prometheus: {exc}")
        return EXIT_BAD_INPUT
    at_s = time.time()
    try:
        rows = check_spec(spec, lambda q: instant_rows(reader, q, at_s=at_s), at_s=at_s,
                          stale_after_s=float(spec.controller.prometheus.stale_after),
                          services=services)
    except PrometheusUnavailable as exc:
        err(f"Prometheus at {url} did not answer ({exc}); nothing was checked. Fix: start it, "
            "or pass the right --prometheus URL")
        return EXIT_FAILURE
    except PrometheusQueryError as exc:
        err(f"Prometheus at {url} refused the query ({exc}). Fix: check the URL (the API is "
            "at <url>/api/v1/query) and spec.controller.prometheus credentials")
        return EXIT_BAD_INPUT
    print(render_json(rows, url=url, at_s=at_s) if args.json else render_table(rows))
    return EXIT_OK if controller_ready(rows) and sources_ok is not False else EXIT_FAILURE


def _check_sources(spec: Any, controller: str, services: list[str] | None, *,
                   as_json: bool) -> int:
    """Which source answered each signal at a running controller, and how fresh (from its
    /v1/status); exit 0 when every signal the controller needs has a fresh source."""
    import json
    import urllib.request
    from dataclasses import asdict

    from pdscale._check import render_sources, source_rows, sources_ready

    url = controller.rstrip("/") + "/v1/status"
    try:
        with urllib.request.urlopen(url, timeout=10) as resp:
            status = json.loads(resp.read())
    except (OSError, ValueError) as exc:
        err(f"the controller at {controller} did not answer /v1/status ({exc}). Fix: pass the "
            "URL of pdscale run's API (--listen), e.g. http://localhost:8080")
        return EXIT_FAILURE
    rows = source_rows(spec, status, services=services,
                       stale_after_s=max(float(spec.controller.prometheus.stale_after),
                                         float(spec.controller.otlp.stale_after)))
    ready = sources_ready(rows)
    if as_json:
        print(json.dumps({"controller": controller, "sources_ready": ready,
                          "sources": [asdict(r) for r in rows]}, indent=2, sort_keys=True))
    else:
        print(render_sources(rows, controller=controller))
    return EXIT_OK if ready else EXIT_FAILURE


def register(sub: Any) -> None:
    """Add this module's command(s) to the ``pdscale`` parser."""
    p = sub.add_parser(
        "check", help="check every series the alerts, dashboards and controller read against "
                      "a live Prometheus",
        description="For every service, pool and signal: does each series exist, how many "
                    "pods report it, how old is it, does the SLO's bucket exist; where a "
                    "selector matches nothing, which matcher removed it and how to fix it. "
                    "Exit 0 when everything the controller needs is present, 1 otherwise, 2 "
                    "for bad input.")
    p.add_argument("spec", help="path to the spec YAML")
    p.add_argument("--prometheus", metavar="URL", type=http_url,
                   help="an http(s) URL such as http://localhost:9090 (default: "
                        "spec.controller.prometheus.url)")
    p.add_argument("--controller", metavar="URL", type=http_url,
                   help="also ask a running pdscale run (its API, e.g. http://localhost:8080) "
                        "which source answered each pool's signals and how fresh; a spec that "
                        "reads nothing from Prometheus is checked this way only")
    p.add_argument("--service", help="check one service only")
    p.add_argument("--json", action="store_true", help="machine-readable output")
    p.set_defaults(func=_cmd_check)
