"""``pdscale validate`` and ``pdscale generate``: check a spec; render its alerts, dashboards
and recommendation manifests into a folder, atomically."""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path
from typing import Any

from pdscale._cli._common import EXIT_BAD_INPUT, EXIT_FAILURE, EXIT_OK, err, load_checked, out_ok
from pdscale.spec import Spec


def _cmd_validate(args: argparse.Namespace) -> int:
    spec = load_checked(args.spec)
    if spec is None:
        return EXIT_BAD_INPUT
    # Everything `generate` renders is rendered here too (in memory), so a spec that
    # validates also generates; load_checked has rendered the alerts already.
    for what in ("dashboards", "recommend"):
        _generate(spec, what, Path(args.spec).name)
    from pdscale._notes import provenance_notes

    pools = sum(len(s.pools) for s in spec.services)
    print(f"{args.spec}: valid ({len(spec.services)} service(s), {pools} pool(s))")
    for note in provenance_notes(spec):
        print(note)
    return EXIT_OK


def _generate(spec: Spec, what: str, source: str, *,
              prometheus_url: str = "http://prometheus-operated.monitoring.svc:9090"
              ) -> dict[str, dict[str, str]]:
    """Rendered output per subfolder, all in memory before anything is written."""
    out: dict[str, dict[str, str]] = {}
    if what in ("alerts", "all"):
        from pdscale.alerts import alert_files

        out["alerts"] = alert_files(spec, source=source)
    if what in ("dashboards", "all"):
        from pdscale.dashboards import dashboard_files

        out["dashboards"] = dashboard_files(spec)
    if what == "recommend":
        from pdscale.alerts import dump_yaml
        from pdscale.controller import hpa_manifests, keda_manifests

        files: dict[str, str] = {}
        for kind, objs in (("keda", keda_manifests(spec, prometheus_url=prometheus_url)),
                           ("hpa", hpa_manifests(spec))):
            for obj in objs:
                files[f"{kind}/{obj['metadata']['name']}.yaml"] = dump_yaml(obj)
        out["recommend"] = files
    return out


def _cmd_generate(args: argparse.Namespace) -> int:
    from pdscale._io import OutputError, write_tree

    spec = load_checked(args.spec)
    if spec is None:
        print("nothing was written", file=sys.stderr)
        return EXIT_BAD_INPUT
    if not out_ok(args.out):  # a bad --out is bad input (exit 2), as for every command
        return EXIT_BAD_INPUT
    started = time.perf_counter()
    source = Path(args.spec).name
    # load_checked rendered the alerts: a threshold no promtool test can tell apart is
    # refused there, before anything is written.
    rendered = _generate(spec, args.what, source, prometheus_url=args.prometheus_url)
    out = Path(args.out)
    try:
        if args.what == "all":
            # One tree, one rename: alerts and dashboards appear together or not at all.
            write_tree(out, {f"{sub}/{rel}": text for sub, files in rendered.items()
                             for rel, text in files.items()})
        else:
            write_tree(out, rendered[args.what])
    except OutputError as exc:
        err(str(exc))
        return EXIT_FAILURE
    elapsed = time.perf_counter() - started
    for sub, files in rendered.items():
        where = out / sub if args.what == "all" else out
        print(f"{sub}: {len(files)} file(s) in {where}")
    print(f"generated in {elapsed:.2f}s")
    if "alerts" in rendered:
        tests = out / "alerts" / "tests" if args.what == "all" else out / "tests"
        print(f"check them: promtool check rules {tests.parent}/rules/*.yml && "
              f"(cd {tests} && promtool test rules *.test.yml)")
    return EXIT_OK


def register(sub: Any) -> None:
    """Add this module's command(s) to the ``pdscale`` parser."""
    p = sub.add_parser("validate", help="check a spec and list every problem",
                       description="Validate a spec; every problem is listed with its field "
                                   "path, what was expected, what was given and how to fix it.")
    p.add_argument("spec", help="path to the spec YAML")
    p.set_defaults(func=_cmd_validate)

    p = sub.add_parser("generate", help="generate alerts and/or dashboards from a spec",
                       description="Generate Prometheus rules, a PrometheusRule, an "
                                   "Alertmanager config and promtool tests (alerts), Grafana "
                                   "dashboards and ConfigMaps (dashboards), or both (all). The "
                                   "output folder is replaced as a whole, atomically; it must "
                                   "be new, empty, or an earlier pdscale output.")
    p.add_argument("what", choices=["alerts", "dashboards", "all", "recommend"],
                   help="recommend: KEDA ScaledObjects and HPAs that follow pdscale's "
                        "pdscale_desired_replicas, for teams that keep their autoscaler")
    p.add_argument("spec", help="path to the spec YAML")
    p.add_argument("--out", required=True, help="output folder")
    p.add_argument("--prometheus-url", default="http://prometheus-operated.monitoring.svc:9090",
                   help="recommend: the Prometheus KEDA queries")
    p.set_defaults(func=_cmd_generate)
