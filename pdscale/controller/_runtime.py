"""The controller process: reconcile loop, lease loop, alert worker, assembled from a spec.

``pdscale run`` builds a :class:`Controller` with the in-cluster (or kubeconfig) Kubernetes
client and the spec's Prometheus, serves the HTTP API (``controller._api``) and starts the
loops in background threads. Tests build it against the Kubernetes stand-in and a real
Prometheus, with an injected clock.
"""

from __future__ import annotations

import logging
import os
import socket
import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from kubernetes import client as k8s

from pdscale.controller._cluster import ClusterSource, SourcedReader, warm_from_history
from pdscale.controller._constraints import Constraints
from pdscale.controller._drain import Drainer, PrometheusWork
from pdscale.controller._interface import Policy, PoolKey
from pdscale.controller._kube import (
    KubeDrainBackend,
    KubePodLabeler,
    KubeScaleActuator,
    ScaleRef,
    ScaleStatus,
)
from pdscale.controller._leader import LeaseElector
from pdscale.controller._model import build_forecasts, build_policy
from pdscale.controller._reconciler import AdapterError, Clock, Reconciler, SystemClock
from pdscale.controller._simbackend import SimBackend
from pdscale.controller._webhook import AlertReceiver, WebhookAuthenticator
from pdscale.spec import Spec
from pdscale.telemetry import (
    ControllerTelemetry,
    OtlpStore,
    PrometheusAuth,
    PrometheusQueryError,
    PrometheusReader,
    PrometheusUnavailable,
    Signal,
)

__all__ = ["Controller", "KubeConfigError", "is_loopback", "kube_client", "reader_from_spec",
           "serve"]

log = logging.getLogger("pdscale.controller")


class KubeConfigError(Exception):
    """No usable Kubernetes configuration (not in a cluster, or a bad kubeconfig)."""


def kube_client(kubeconfig: str | None) -> k8s.ApiClient:
    """The API client: from ``kubeconfig`` when given, else the in-cluster ServiceAccount."""
    from kubernetes import config
    from kubernetes.config.config_exception import ConfigException

    try:
        if kubeconfig:
            if not Path(kubeconfig).is_file():
                raise KubeConfigError(f"kubeconfig {kubeconfig} does not exist")
            api: k8s.ApiClient = config.new_client_from_config(  # type: ignore[no-untyped-call]
                config_file=kubeconfig)
            return api
        config.load_incluster_config()  # type: ignore[no-untyped-call]
    except ConfigException as exc:
        raise KubeConfigError(str(exc)) from exc
    except Exception as exc:
        import yaml

        if kubeconfig and isinstance(exc, yaml.YAMLError | OSError | ValueError | TypeError
                                     | AttributeError | KeyError):
            # Not YAML, or not a kubeconfig's shape: the client's own errors say little.
            first = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
            raise KubeConfigError(f"kubeconfig {kubeconfig} is not a readable kubeconfig "
                                  f"({type(exc).__name__}: {first})") from exc
        raise
    return k8s.ApiClient()


def serve(controller: Controller, host: str, port: int, *, log_level: str = "info") -> str | None:
    """Run the loops and the HTTP API until SIGTERM or Ctrl-C; stop cleanly (the lease is
    handed back). Returns the name of the signal that stopped it."""
    import signal

    import uvicorn

    from pdscale.controller._api import create_app

    server = uvicorn.Server(uvicorn.Config(create_app(controller), host=host, port=port,
                                           log_level=log_level.lower(), access_log=False))
    # uvicorn shuts down on SIGTERM/SIGINT, then re-raises the signal to the handler it found:
    # with these, that ends here instead of killing the process mid-cleanup.
    stopping: list[int] = []
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda signum, _frame: stopping.append(signum))
    controller.start()
    try:
        server.run()
    finally:
        controller.stop()
    return signal.Signals(stopping[0]).name if stopping else None


def is_loopback(host: str) -> bool:
    """True for a loopback address or ``localhost``; False for wildcards and everything else."""
    import ipaddress

    if host.strip("[]").lower() in ("localhost", "localhost."):
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def reader_from_spec(spec: Spec, url: str | None = None) -> PrometheusReader:
    p = spec.controller.prometheus
    basic = None
    if p.basic_auth_file:
        text = Path(p.basic_auth_file).read_text(encoding="utf-8").strip()
        user, sep, password = text.partition(":")
        if not sep:
            raise ValueError(f"{p.basic_auth_file}: expected 'user:password'")
        basic = (user, password)
    auth = PrometheusAuth(
        bearer_token_file=Path(p.bearer_token_file) if p.bearer_token_file else None,
        basic_auth=basic, ca_bundle=Path(p.ca_bundle) if p.ca_bundle else None,
        headers=dict(p.headers))
    return PrometheusReader(url or p.url, auth=auth, timeout_s=float(p.timeout),
                            stale_after_s=float(p.stale_after))


@dataclass
class Controller:
    spec: Spec
    api: k8s.ApiClient | None
    """None only with ``sim_url`` or ``backend`` (no Kubernetes)."""
    reader: PrometheusReader
    clock: Clock = field(default_factory=SystemClock)
    identity: str = field(default_factory=lambda: os.environ.get("POD_NAME")
                          or socket.gethostname())
    dry_run: bool | None = None
    """None: the spec's controller.dry_run."""
    leader_election: bool | None = None
    """None: the spec's controller.leader_election.enabled."""
    span_processors: tuple[Any, ...] = ()
    sim_url: str | None = None
    """Drive the simulator's live mode at this URL instead of Kubernetes (``pdscale up``)."""
    backend: Any = None
    """A scaling backend with the Kubernetes actuator's calls (``read_statuses``,
    ``set_replicas``, ``event``, ``prime``, ``dry_run``) used instead of Kubernetes, e.g.
    :class:`controller._process.ProcessActuator` for pools of local processes (bare hosts,
    the loopback Dynamo stack). No Lease then."""
    policy: Policy | None = None
    """The scaling policy; None: pdscale's (``build_policy(spec)``). Another policy (a
    baseline such as an HPA-like reactive one, for benchmarks) gets the same loop, guards,
    actuator and records; forecast warm-up and refits apply to pdscale's only."""
    extra_signals: tuple[Signal, ...] = ()
    """Signals read each tick beyond pdscale's own, for a policy that needs them (an HPA
    reads KV-cache usage, for example)."""

    def __post_init__(self) -> None:
        spec = self.spec
        c = spec.controller
        dry = c.dry_run if self.dry_run is None else self.dry_run
        self.telemetry = ControllerTelemetry(spec, identity=self.identity,
                                             span_processors=self.span_processors)
        targets = {(s.name, role): ScaleRef(s.namespace, p.target)
                   for s in spec.services for role, p in s.pools.items()}
        self.kube: Any
        if self.backend is not None:
            self.kube = self.backend
            self.kube.dry_run = dry
            self.leader_election = False
        elif self.sim_url is not None:
            self.kube = SimBackend(self.sim_url, spec.services[0].name)
            self.leader_election = False
        else:
            assert self.api is not None, "a Kubernetes API client, sim_url or backend"
            self.kube = KubeScaleActuator(self.api, targets, dry_run=dry)
        self.otlp_store: OtlpStore | None = None
        self.otlp_receiver: Any = None
        """The OTLP receiver (``controller._otlp_receiver.OtlpReceiver``) when the spec
        enables it or reads a signal from it."""
        self.otlp_listen: tuple[str, int | None, int | None] | None = None
        """(host, HTTP port, gRPC port) the receiver listens on; set by :meth:`expose_otlp`."""
        if c.otlp_receiving:
            from pdscale.controller._otlp_receiver import OtlpReceiver

            o = c.otlp
            self.otlp_store = OtlpStore(spec, started_s=self.clock.now(),
                                        resolution_s=float(o.resolution),
                                        stale_after_s=float(o.stale_after),
                                        max_clock_skew_s=float(o.max_clock_skew))
            self.otlp_receiver = OtlpReceiver(self.otlp_store, o, now=self.clock.now,
                                              telemetry=self.telemetry)
            self.telemetry.export_span_histograms(self.otlp_store)
        self.signal_reader = SourcedReader(spec, self.reader, self.otlp_store)
        self.forecasts = build_forecasts(spec)
        if self.policy is None:
            self.policy = build_policy(spec, forecasts=self.forecasts)
        elect = c.leader_election.enabled if self.leader_election is None \
            else self.leader_election
        self.elector: LeaseElector | None = None
        # A dry run writes nothing, the Lease included: taking part in the election would
        # make a laptop's `--dry-run` the leader and stand the cluster's controller by.
        if elect and c.mode == "act" and not dry and self.api is not None:
            namespace = (c.leader_election.namespace or os.environ.get("POD_NAMESPACE")
                         or "pdscale-system")
            self.elector = LeaseElector(self.api, namespace, c.leader_election.lease_name,
                                        self.identity, float(c.leader_election.lease_duration),
                                        self.clock.now)
        self.reconciler = Reconciler(
            self.policy, ClusterSource(spec, self.signal_reader, self.kube,
                                       extra_signals=self.extra_signals),
            self.kube, self.clock,
            constraints=Constraints.from_spec(spec), telemetry=self.telemetry,
            tick_s=float(c.tick), mode=c.mode, dry_run=dry,
            is_leader=self.elector.is_leader if self.elector else (lambda: True),
            forecasts=self.forecasts, drainer=self._drainer())
        self.authenticator = WebhookAuthenticator(spec.reactions.auth)
        self.receiver = AlertReceiver(
            spec, overrides=self.reconciler.overrides, now=self.clock.now,
            telemetry=self.telemetry, current_replicas=self._current_replicas,
            observe=self.reconciler.observe_pool,
            request_tick=self.reconciler.request_tick,
            pods=KubePodLabeler(self.api) if self.api is not None else self.kube,
            events=self.kube, dry_run=dry,
            is_leader=self.elector.is_leader if self.elector else (lambda: True))
        self.webhook_refusal: str | None = None
        """Why the webhook refuses every delivery (unauthenticated on a non-loopback
        address); None when it serves. Set by :meth:`expose`."""
        self.warm_result: dict[str, Any] | None = None
        self._stop = threading.Event()
        self._threads: list[threading.Thread] = []

    def _drainer(self) -> Drainer | None:
        """Scale-down drains (controller.drain) for the Kubernetes actuator (pods, work from
        Prometheus) or a backend that offers them itself (the process actuator). With drains
        off, Kubernetes pools still get a cleanup drainer that takes back drains an earlier
        configuration left on the pods (it stops at the first refusal to list pods)."""
        c = self.spec.controller
        if c.mode != "act":
            return None
        backend: Any
        if isinstance(self.kube, KubeScaleActuator):
            drain = self.spec.reactions.drain
            backend = KubeDrainBackend(
                self.kube, {(s.name, role): p.pod_regex for s in self.spec.services
                            for role, p in s.pools.items()},
                serving_label=drain.label, drained_value=drain.value,
                routing_mark=c.drain.stop_routing)
            work: Any = PrometheusWork(self.reader, self.spec)
        elif c.drain.enabled and hasattr(self.kube, "pool_replicas"):
            backend = work = self.kube
        else:
            return None

        def work_failed(key: PoolKey, exc: Exception) -> None:
            kind = "unavailable" if isinstance(exc, PrometheusUnavailable) else "rejected"
            self.reconciler._error(AdapterError("prometheus", kind, f"per-pod work: {exc}",
                                                key, self.clock.now()))

        return Drainer(backend, work, timeout_s=float(c.drain.timeout),
                       settle_s=float(c.drain.settle), telemetry=self.telemetry,
                       enabled=c.drain.enabled, on_error=work_failed)

    def expose(self, host: str, *, allow_unauthenticated: bool = False) -> str | None:
        """Decide whether the webhook may serve on ``host``: without authentication it serves
        only on a loopback address, unless ``allow_unauthenticated`` (or
        ``reactions.auth.allow_unauthenticated``) says the exposure is deliberate. Returns the
        refusal (also logged and shown on /v1/status), or None."""
        allowed = allow_unauthenticated or self.spec.reactions.auth.allow_unauthenticated
        if self.authenticator.configured or allowed or is_loopback(host):
            self.webhook_refusal = None
            if not self.authenticator.configured:
                log.warning("the Alertmanager webhook accepts unauthenticated requests on %s "
                            "(%s)", host, "allowed explicitly" if allowed else "loopback only")
            return None
        self.webhook_refusal = (
            f"the Alertmanager webhook is disabled: no authentication is configured and the API "
            f"listens on {host}, where anyone who reaches the port could scale or drain pools. "
            "Set spec.reactions.auth (a bearer token file, as deploy/ does), listen on "
            "127.0.0.1, or pass --allow-unauthenticated-webhook if the exposure is deliberate")
        log.warning("%s", self.webhook_refusal)
        return self.webhook_refusal

    def expose_otlp(self, host: str, *, http_port: int | None = None,
                    grpc_port: int | None = None,
                    allow_unauthenticated: bool = False) -> str | None:
        """Where the OTLP receiver listens (ports default to the spec's), with the webhook's
        rule on authentication; returns the refusal, or None. No receiver: None."""
        if self.otlp_receiver is None:
            return None
        o = self.spec.controller.otlp
        self.otlp_listen = (host, o.http_port if http_port is None else http_port,
                            o.grpc_port if grpc_port is None else grpc_port)
        refusal: str | None = self.otlp_receiver.expose(
            host, allow_unauthenticated=allow_unauthenticated)
        return refusal

    def _current_replicas(self, key: PoolKey) -> int | None:
        last = self.reconciler.last.get(key)
        if last is not None:
            return max(last.current, last.desired)
        status = self.kube.read_statuses([key]).get(key)
        return status.desired if isinstance(status, ScaleStatus) else None

    # -- lifecycle --------------------------------------------------------------------------

    def warm(self) -> dict[str, Any]:
        """Fetch demand history so forecasts are useful at once; failure means going cold."""
        # The Kubernetes client builds its validators on first use (about a second each):
        # pay that here, before ready, not in the first tick or the first alert reaction.
        self.kube.prime()
        now = self.clock.now()
        if not self.spec.controller.signal_sources.uses("prometheus"):
            self.warm_result = {"ok": True, "points": {}, "skipped": "no signal is read from "
                                "Prometheus: the forecasters start from the OTLP data"}
            return self.warm_result
        try:
            taken = warm_from_history(self.spec, self.reader, self.forecasts, now_s=now,
                                      history_s=float(self.spec.controller.prometheus.history))
            self.warm_result = {"ok": True, "points": {f"{k[0]}/{k[1].value}": n
                                                       for k, n in taken.items()}}
            for key in self.forecasts.pending_refits(now):
                self.forecasts.refit(key, now)
            for key in self.forecasts.stale_forecasts(now, within_s=0.0):
                self.forecasts.refresh_forecast(key, now)
        except (PrometheusUnavailable, PrometheusQueryError) as exc:
            self.reconciler.errors.append(AdapterError("prometheus", "unavailable",
                                                       f"history warm-up: {exc}", None, now))
            self.telemetry.record_error("prometheus", "warmup")
            self.warm_result = {"ok": False, "error": str(exc)}
            log.warning("history warm-up failed, starting cold: %s", exc)
        except Exception as exc:  # a forecaster or an adapter bug: start cold, never die
            log.exception("history warm-up failed, starting cold")
            self.reconciler.errors.append(AdapterError("forecaster", "error",
                                                       f"history warm-up: {type(exc).__name__}:"
                                                       f" {exc}", None, now))
            self.telemetry.record_error("forecaster", "error")
            self.warm_result = {"ok": False, "error": f"{type(exc).__name__}: {exc}"}
        return self.warm_result

    def lease_step(self) -> bool:
        if self.elector is None:
            return True
        leader = self.elector.step()
        failure = self.elector.failure
        if failure is not None:
            self.telemetry.record_error(failure.adapter, getattr(failure, "kind", "error"))
            log.warning("%s", failure)
        self.telemetry.leader.set(1 if leader else 0, {})
        return leader

    def start(self) -> None:
        """Warm up, then run the lease, reconcile and alert loops in background threads."""
        self._stop.clear()
        self.receiver.start()
        if self.otlp_receiver is not None:
            host, http_port, grpc_port = self.otlp_listen or ("127.0.0.1", None, None)
            self.otlp_receiver.start(host, http_port=http_port, grpc_port=grpc_port)

        def lease_loop() -> None:
            assert self.elector is not None
            renew = float(self.spec.controller.leader_election.renew_every)
            while not self._stop.is_set():
                self.lease_step()
                self.clock.wait(renew, self._stop)

        def main_loop() -> None:
            self.warm()
            self.reconciler.run(self._stop)

        if self.elector is not None:
            self._threads.append(threading.Thread(target=lease_loop, name="pdscale-lease",
                                                  daemon=True))
        self._threads.append(threading.Thread(target=main_loop, name="pdscale-reconcile",
                                              daemon=True))
        for t in self._threads:
            t.start()

    def stop(self) -> None:
        self._stop.set()
        self.reconciler.stop()
        for t in self._threads:
            t.join(timeout=10)
        self._threads.clear()
        self.receiver.stop()
        if self.otlp_receiver is not None:
            self.otlp_receiver.stop()
        if self.elector is not None:
            self.elector.release()
        self.reconciler.close()
        self.telemetry.shutdown()

    # -- state for the API ------------------------------------------------------------------

    @property
    def alive(self) -> bool:
        """False when a started loop thread died, or the last tick is far overdue."""
        if any(not t.is_alive() for t in self._threads) and not self._stop.is_set():
            return False
        last = self.reconciler.last_tick
        if self._threads and last is not None:
            return self.clock.now() - last.started_s < 10 * self.reconciler.tick_s + 60
        return True

    def readiness(self) -> tuple[bool, str]:
        if self.warm_result is None:
            return False, "warming up from Prometheus history"
        if self.reconciler.last_tick is None:
            return False, "no tick yet"
        return True, "ready"

    def status(self) -> dict[str, Any]:
        c = self.spec.controller
        snap = self.reconciler.snapshot()
        return {
            "identity": self.identity,
            "mode": c.mode,
            "dry_run": self.reconciler.dry_run,
            "leader": self.elector.is_leader() if self.elector else True,
            "leader_election": None if self.elector is None else {
                "lease": f"{self.elector.namespace}/{self.elector.name}",
                "last_error": self.elector.last_error},
            "prometheus": self.reader.url,
            "otlp": None if self.otlp_receiver is None else {
                **self.otlp_receiver.snapshot(),
                "pools": {f"{k[0]}/{k[1].value}": v for k, v in
                          (self.otlp_store.pool_status(self.clock.now())
                           if self.otlp_store is not None else {}).items()}},
            "signal_sources": {f"{k[0]}/{k[1].value}": {s.value: src for s, src in v.items()}
                               for k, v in self.signal_reader.answered.items()},
            "signal_ages_s": {f"{k[0]}/{k[1].value}": {s.value: age for s, age in v.items()}
                              for k, v in self.signal_reader.ages.items()},
            "warm_up": self.warm_result,
            "gpu_budget": self.spec.gpu_budget,
            "tick_s": self.reconciler.tick_s,
            **snap,
            "overrides": self.reconciler.overrides.active(self.clock.now()),
            "drains": None if self.reconciler.drainer is None
            else self.reconciler.drainer.snapshot(self.clock.now()),
            "workers": self.kube.report() if hasattr(self.kube, "report") else None,
            "webhook": {"auth": self.authenticator.describe(),
                        "serving": self.webhook_refusal is None,
                        "refusal": self.webhook_refusal, **self.receiver.snapshot()},
        }
