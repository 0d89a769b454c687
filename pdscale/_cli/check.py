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
    try:
        reader = reader_from_spec(spec, url)
    except (OSError, ValueError) as exc:
        err(f"spec.controller.prometheus: {exc}")
        return EXIT_BAD_INPUT
    at_s = time.time()
    try:
        rows = check_spec(spec, lambda q: instant_rows(reader, q, at_s=at_s), at_s=at_s,
                          stale_after_s=float(spec.controller.prometheus.stale_after),
                          services=[args.service] if args.service else None)
    except PrometheusUnavailable as exc:
        err(f"Prometheus at {url} did not answer ({exc}); nothing was checked. Fix: start it, "
            "or pass the right --prometheus URL")
        return EXIT_FAILURE
    except PrometheusQueryError as exc:
        err(f"Prometheus at {url} refused the query ({exc}). Fix: check the URL (the API is "
            "at <url>/api/v1/query) and spec.controller.prometheus credentials")
        return EXIT_BAD_INPUT
    print(render_json(rows, url=url, at_s=at_s) if args.json else render_table(rows))
    return EXIT_OK if controller_ready(rows) else EXIT_FAILURE


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
    p.add_argument("--service", help="check one service only")
    p.add_argument("--json", action="store_true", help="machine-readable output")
    p.set_defaults(func=_cmd_check)
