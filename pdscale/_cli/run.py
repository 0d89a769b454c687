"""``pdscale run``: the controller, in a cluster or against one."""

from __future__ import annotations

import argparse
import sys
import threading
from pathlib import Path
from typing import Any

from pdscale._cli._common import (
    EXIT_BAD_INPUT,
    EXIT_OK,
    err,
    http_url,
    load_checked,
    parse_listen,
)


def _port_busy(host: str, port: int) -> str | None:
    """Why ``host:port`` cannot be listened on, or None (checked before anything starts, so a
    busy port is a clear error rather than a half-started controller)."""
    import socket

    family = socket.AF_INET6 if ":" in host.strip("[]") else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((host.strip("[]"), port))
        except OSError as exc:
            return exc.strerror or str(exc)
    return None


def _cmd_run(args: argparse.Namespace) -> int:
    import logging

    spec = load_checked(args.spec)
    if spec is None:
        return EXIT_BAD_INPUT
    logging.basicConfig(level=args.log_level.upper(),
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    logging.getLogger("urllib3").setLevel(logging.ERROR)  # pdscale logs the failure itself
    from pdscale.controller import (
        Controller,
        KubeConfigError,
        kube_client,
        reader_from_spec,
        serve,
    )

    backend = None
    if args.dynamo_stack:
        from pdscale._dynamo_up import StackUpError, process_backend

        try:
            backend = process_backend(spec, Path(args.dynamo_stack))
        except StackUpError as exc:
            err(str(exc))
            return EXIT_BAD_INPUT
    try:
        api = None if args.sim_url or backend is not None else kube_client(args.kubeconfig)
    except KubeConfigError as exc:
        err(f"no Kubernetes configuration: {str(exc).rstrip('.')}. In a cluster, run with "
             "a ServiceAccount (deploy/); outside one, pass --kubeconfig FILE")
        return EXIT_BAD_INPUT
    try:
        reader = reader_from_spec(spec, url=args.prometheus_url)
    except (OSError, ValueError) as exc:
        err(f"Prometheus credentials: {exc}; check spec.controller.prometheus")
        return EXIT_BAD_INPUT
    kwargs: dict[str, Any] = {}
    if args.identity:
        kwargs["identity"] = args.identity
    controller = Controller(spec, api, reader, dry_run=True if args.dry_run else None,
                            leader_election=False if args.no_leader_election else None,
                            sim_url=args.sim_url, backend=backend, **kwargs)
    host, port = args.listen
    busy = _port_busy(host, port)
    if busy:
        err(f"cannot listen on {host}:{port}: {busy}; stop what holds the port or pass "
             "--listen HOST:PORT with a free one")
        return EXIT_BAD_INPUT
    refusal = controller.expose(host, allow_unauthenticated=args.allow_unauthenticated_webhook)
    if refusal:
        print(f"pdscale: warning: {refusal}", file=sys.stderr, flush=True)
    otlp_note = _expose_otlp(args, spec, controller, host)
    if otlp_note is None:
        return EXIT_BAD_INPUT
    mode = "dry run" if controller.reconciler.dry_run else spec.controller.mode
    print(f"pdscale: controlling {sum(len(s.pools) for s in spec.services)} pool(s) of "
          f"{len(spec.services)} service(s) ({mode}); Prometheus {reader.url}{otlp_note}; API on "
          f"http://{host}:{port} (/v1/status, /metrics)", file=sys.stderr, flush=True)
    supervise = threading.Event()
    if backend is not None:  # between ticks the actuator reaps, replaces and probes workers
        threading.Thread(target=backend.run, args=(supervise, 1.0), name="pdscale-workers",
                         daemon=True).start()
    try:
        stopped_by = serve(controller, host, port, log_level=args.log_level)
    finally:
        supervise.set()
    print("pdscale: stopped" + (f" ({stopped_by})" if stopped_by else ""), file=sys.stderr)
    return EXIT_OK


def _expose_otlp(args: argparse.Namespace, spec: Any, controller: Any, host: str
                 ) -> str | None:
    """Start the controller's OTLP receiver where the spec has one: the note for the start-up
    line ("" without a receiver), None (after saying why) when a port is taken."""
    if controller.otlp_receiver is None:
        return ""
    o = spec.controller.otlp
    otlp_host = args.otlp_host or host
    http_port = o.http_port if args.otlp_http_port is None else args.otlp_http_port
    grpc_port = o.grpc_port if args.otlp_grpc_port is None else args.otlp_grpc_port
    for what, otlp_port in (("OTLP/HTTP", http_port), ("OTLP/gRPC", grpc_port)):
        busy = _port_busy(otlp_host, otlp_port) if otlp_port else None
        if busy:
            err(f"cannot listen on {otlp_host}:{otlp_port} for {what}: {busy}; pass "
                f"--otlp-{'http' if 'HTTP' in what else 'grpc'}-port with a free port "
                "(0 turns it off)")
            return None
    refusal = controller.expose_otlp(otlp_host, http_port=http_port, grpc_port=grpc_port,
                                     allow_unauthenticated=args.allow_unauthenticated_otlp)
    if refusal:
        print(f"pdscale: warning: {refusal}", file=sys.stderr, flush=True)
    return "; OTLP on " + ", ".join(f"{name} {otlp_host}:{p}" for name, p in
                                     (("http", http_port), ("grpc", grpc_port)) if p)


def register(sub: Any) -> None:
    """Add this module's command(s) to the ``pdscale`` parser."""
    p = sub.add_parser(
        "run", help="run the controller (in a cluster, or against one with --kubeconfig)",
        description="Run pdscale's controller: every tick it reads the pools' signals from "
                    "Prometheus, forecasts demand one cold start ahead, and sets the prefill "
                    "and decode replicas through the scale subresource of each pool's target. "
                    "Serves /healthz, /readyz, /metrics, /v1/status, /v1/decisions, "
                    "/v1/forecast and the Alertmanager webhook. Stops cleanly on SIGTERM.",
        epilog="examples:\n  pdscale run --spec /etc/pdscale/spec.yaml\n"
               "  pdscale run --spec examples/vllm.yaml --kubeconfig ~/.kube/config --dry-run "
               "--prometheus-url http://localhost:9090",
        formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--spec", required=True)
    p.add_argument("--dry-run", action="store_true",
                   help="decide and record, never scale or label anything")
    p.add_argument("--kubeconfig", help="default: the in-cluster ServiceAccount")
    p.add_argument("--listen", type=parse_listen, default=("0.0.0.0", 8080),
                   metavar="HOST:PORT", help="API address (default 0.0.0.0:8080). Without "
                   "spec.reactions.auth the Alertmanager webhook is served only on a loopback "
                   "address")
    p.add_argument("--allow-unauthenticated-webhook", action="store_true",
                   help="serve the webhook without authentication on a non-loopback address "
                        "(anyone who reaches the port can scale and drain pools)")
    p.add_argument("--prometheus-url", type=http_url, metavar="URL",
                   help="overrides spec.controller.prometheus.url (an http(s) URL such as "
                        "http://localhost:9090)")
    p.add_argument("--otlp-host", metavar="HOST",
                   help="address of the OTLP receiver (default: the --listen host); it runs "
                        "when spec.controller.otlp.enabled or a signal is read from otlp")
    p.add_argument("--otlp-http-port", type=int, metavar="PORT",
                   help="OTLP/HTTP port (default: spec.controller.otlp.http_port; 0: off)")
    p.add_argument("--otlp-grpc-port", type=int, metavar="PORT",
                   help="OTLP/gRPC port (default: spec.controller.otlp.grpc_port; 0: off)")
    p.add_argument("--allow-unauthenticated-otlp", action="store_true",
                   help="accept OTLP exports without authentication on a non-loopback address "
                        "(anyone who reaches the port can feed the signals pdscale scales on)")
    p.add_argument("--identity", help="leader-election identity (default: POD_NAME or the "
                                      "host name)")
    p.add_argument("--no-leader-election", action="store_true",
                   help="act without a Lease (one replica only)")
    p.add_argument("--sim-url", type=http_url, metavar="URL",
                   help="drive the simulator's live mode at this URL instead of Kubernetes "
                        "(what pdscale up does)")
    p.add_argument("--dynamo-stack", metavar="DIR",
                   help="scale the worker processes of a loopback Dynamo stack (the folder "
                        "`pdscale up --engine dynamo` keeps them in) instead of Kubernetes")
    p.add_argument("--log-level", default="info",
                   choices=["debug", "info", "warning", "error"])
    p.set_defaults(func=_cmd_run)
