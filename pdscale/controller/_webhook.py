"""Alertmanager webhook: critical alerts become safe, bounded actions; warnings are recorded.

Flow: the HTTP handler checks credentials, size and content type, validates the payload
(version "4", unknown fields accepted) and hands the alerts to :meth:`AlertReceiver.submit`,
which deduplicates on (fingerprint, startsAt, status) and queues them; a worker thread acts.
The handler answers at once: Alertmanager drops 4xx and retries 5xx, so 4xx is for payloads
that will never work and 503 only for a full queue.

Reactions (``spec.reactions.rules``, first match wins, critical alerts only):

* ``scale_up``: only while the shortage the rule answers (``condition``: the pool's latency
  p95 over the last minute above its SLO, or a queue) shows in the pool's signals, read when
  the alert is processed (``controller._present``): a floor of current + step (or ``to``),
  capped at the pool's max, with a scale-down hold, until that shortage clears or ``hold``
  passes (or the alert resolves); the reconciler ticks at once, skipping scale-up
  stabilisation. An alert whose shortage does not show now (a budget-burn alert after the
  load has passed) is recorded and adds nothing (``no_shortage``), and is not remembered as
  handled, so a later delivery of it acts if the shortage comes back.
* ``hold_scale_down``: the pool does not shrink until the alert resolves or ``hold`` passes.
* ``drain_instance``: the alert's pod gets the drain label (its Service and workload select on
  the serving value, so traffic stops and the workload starts a replacement); scale-down of its
  pool is held meanwhile. Only pods matching the pool's pod regex are touched.
* ``notify_only``: recorded, nothing else.

Guards, in order: leadership, global kill switch, per-pool cooldown, at most ``max_actions``
per ``window`` across all pools, dry run. Only an action taken (applied, or a dry run's) uses
the cooldown and the budget: a refused drain or a failed write gives them back, so it cannot
delay the next alert's action by a repeat interval. ``hold_scale_down`` neither waits for nor
uses them: it only keeps a pool from shrinking, for at most its hold. An adapter's error while
acting is recorded ``failed`` like a failed write. Every reaction is recorded with the alert
that caused it (``/v1/status``, ``/v1/decisions``, ``pdscale_alert_reactions_total``, a
Kubernetes Event).

Only the leader acts. With two controller replicas behind one Service, Alertmanager's delivery
lands on either; the standby refuses it with 503 (:class:`NotLeader`), which Alertmanager
retries with backoff and so, within a retry or two, delivers to the leader. Forwarding to the
leader was rejected: the Lease names the holder's identity, not an address, and a forward
would be a second network hop that can fail in its own ways. An alert queued on the leader that
loses the lease before acting is recorded ``not_leader`` and forgotten by the dedupe table, so
the next delivery (a retry or Alertmanager's repeat) acts on whichever replica leads then.

Dry run, from ``reactions.dry_run`` or from the controller's own dry run (``pdscale run
--dry-run`` or ``controller.dry_run``), stops every write: no floor, no hold, no pod label, no
Event.

Dedupe: Alertmanager delivers at least once (HA peers, retries, the repeat interval). An
alert's (fingerprint, startsAt, status) counts as handled only once it was acted on or
deliberately dropped for good (a warning, no matching rule, no pool, refused, dry run). An
alert refused for a reason that passes (cooldown, rate limit, kill switch, not the leader, a
failed write) is forgotten, so Alertmanager's next repeat of it acts.
"""

from __future__ import annotations

import base64
import contextlib
import hmac
import logging
import os
import queue
import re
import threading
from collections import OrderedDict, deque
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal, Protocol

from pydantic import BaseModel, ConfigDict, Field

from pdscale.controller._interface import PoolKey, PoolObservation
from pdscale.controller._present import ShortageCheck
from pdscale.controller._reconciler import Overrides
from pdscale.spec import ReactionAction, ReactionRule, ReactionSettings, Role, Spec, WebhookAuth
from pdscale.telemetry import ControllerTelemetry

__all__ = ["AlertReceiver", "AlertmanagerAlert", "AlertmanagerPayload", "NotLeader",
           "WebhookAuthenticator"]

log = logging.getLogger("pdscale.webhook")


class AlertmanagerAlert(BaseModel):
    model_config = ConfigDict(extra="allow")

    status: Literal["firing", "resolved"]
    labels: dict[str, str] = Field(default_factory=dict)
    annotations: dict[str, str] = Field(default_factory=dict)
    startsAt: str = ""
    endsAt: str = ""
    generatorURL: str = ""
    fingerprint: str = Field(default="", max_length=256)


class AlertmanagerPayload(BaseModel):
    """Alertmanager's webhook payload, version 4 (unknown fields accepted)."""

    model_config = ConfigDict(extra="allow")

    version: Literal["4"]
    groupKey: str = ""
    truncatedAlerts: int = 0
    status: Literal["firing", "resolved"]
    receiver: str = ""
    groupLabels: dict[str, str] = Field(default_factory=dict)
    commonLabels: dict[str, str] = Field(default_factory=dict)
    commonAnnotations: dict[str, str] = Field(default_factory=dict)
    externalURL: str = ""
    alerts: list[AlertmanagerAlert] = Field(max_length=10_000)


# -- authentication ----------------------------------------------------------------------------


class _FileSecret:
    """A secret read from a file, re-read when the file changes (rotation without restart)."""

    def __init__(self, path: str) -> None:
        self.path = Path(path)
        self._stamp: tuple[float, int] | None = None
        self._value: str | None = None

    def get(self) -> str | None:
        try:
            st = self.path.stat()
        except OSError:
            return None
        stamp = (st.st_mtime, st.st_size)
        if stamp != self._stamp:
            try:
                self._value = self.path.read_text(encoding="utf-8").strip() or None
            except OSError:
                return None
            self._stamp = stamp
        return self._value


class WebhookAuthenticator:
    """Bearer token (file or environment) and/or basic auth (file 'user:password'). With none
    configured every request is accepted (the status page says so)."""

    def __init__(self, auth: WebhookAuth, environ: Mapping[str, str] | None = None) -> None:
        self._token_file = _FileSecret(auth.bearer_token_file) if auth.bearer_token_file else None
        self._basic_file = _FileSecret(auth.basic_auth_file) if auth.basic_auth_file else None
        self._env_name = auth.bearer_token_env
        self._environ = environ if environ is not None else os.environ

    @property
    def configured(self) -> bool:
        return bool(self._token_file or self._basic_file or self._env_name)

    def describe(self) -> str:
        kinds = [k for k, on in (("bearer token file", self._token_file),
                                 ("bearer token env", self._env_name),
                                 ("basic auth file", self._basic_file)) if on]
        return ", ".join(kinds) or "none (every request accepted)"

    def check(self, authorization: str | None) -> bool:
        if not self.configured:
            return True
        if not authorization:
            return False
        scheme, _, value = authorization.partition(" ")
        value = value.strip()
        ok = False
        if scheme.lower() == "bearer":
            for secret in (self._token_file.get() if self._token_file else None,
                           self._environ.get(self._env_name) if self._env_name else None):
                if secret and hmac.compare_digest(value.encode(), secret.encode()):
                    ok = True
        elif scheme.lower() == "basic" and self._basic_file is not None:
            secret = self._basic_file.get()
            try:
                given = base64.b64decode(value, validate=True).decode()
            except (ValueError, UnicodeDecodeError):
                return False
            ok = bool(secret) and hmac.compare_digest(given.encode(), (secret or "").encode())
        return ok


# -- reactions ---------------------------------------------------------------------------------


class NotLeader(Exception):
    """This replica is the standby: the delivery must go to the leader (answer 503)."""


RETRYABLE_OUTCOMES = frozenset({"cooldown", "rate_limited", "disabled", "not_leader", "failed",
                                "no_shortage"})
"""Outcomes that pass: the alert is not remembered as handled, so a later delivery acts."""
ACTED_OUTCOMES = frozenset({"applied", "dry_run"})
"""Outcomes that use the pool's cooldown and the rate budget (a dry run counts as the action it
stands for); a refused or failed action gives both back."""


class PodLabeler(Protocol):
    def label_pod(self, namespace: str, pod: str, label: str, value: str) -> None:
        ...


class EventRecorder(Protocol):
    def event(self, key: PoolKey, reason: str, message: str) -> None:
        ...


@dataclass(frozen=True)
class ReactionRecord:
    time_s: float
    alertname: str
    severity: str
    status: str
    fingerprint: str
    pool: PoolKey | None
    action: str
    outcome: str
    """applied, dry_run, disabled, cooldown, rate_limited, not_leader, no_pool, refused, failed,
    recorded, resolved, no_shortage (a scale_up whose shortage does not show now)."""
    message: str

    def as_dict(self) -> dict[str, Any]:
        return {"time": self.time_s, "alertname": self.alertname, "severity": self.severity,
                "status": self.status, "fingerprint": self.fingerprint,
                "pool": None if self.pool is None else f"{self.pool[0]}/{self.pool[1].value}",
                "action": self.action, "outcome": self.outcome, "message": self.message}


class AlertReceiver:
    def __init__(self, spec: Spec, *, overrides: Overrides, now: Callable[[], float],
                 telemetry: ControllerTelemetry,
                 current_replicas: Callable[[PoolKey], int | None],
                 observe: Callable[[PoolKey], PoolObservation | None] = lambda key: None,
                 request_tick: Callable[[], None] = lambda: None,
                 pods: PodLabeler | None = None, events: EventRecorder | None = None,
                 dry_run: bool = False, is_leader: Callable[[], bool] = lambda: True,
                 dedupe_size: int = 50_000, queue_size: int = 10_000,
                 history: int = 1000) -> None:
        self.spec = spec
        self.settings: ReactionSettings = spec.reactions
        self.overrides = overrides
        self.now = now
        self.telemetry = telemetry
        self.current_replicas = current_replicas
        self.observe = observe
        """The pool as its signals show it now (None: unread): where a scale_up checks its
        shortage."""
        self.request_tick = request_tick
        self.pods = pods
        self.events = events
        self.enabled = self.settings.enabled
        self.dry_run = dry_run or self.settings.dry_run
        """Either the controller's dry run or reactions.dry_run: no write of any kind."""
        self.is_leader = is_leader
        self._seen: OrderedDict[tuple[str, str, str], None] = OrderedDict()
        """Handled alerts, and those queued but not yet processed."""
        self._dedupe_size = dedupe_size
        self._queue: queue.Queue[AlertmanagerAlert | None] = queue.Queue(maxsize=queue_size)
        self._lock = threading.RLock()
        self._actions: deque[float] = deque()
        self._last_action: dict[PoolKey, float] = {}
        self.records: deque[ReactionRecord] = deque(maxlen=history)
        self.warnings: OrderedDict[str, dict[str, Any]] = OrderedDict()
        self.critical: OrderedDict[str, dict[str, Any]] = OrderedDict()
        self.received = 0
        self.duplicates = 0
        self._worker: threading.Thread | None = None
        self._pod_regex = {(s.name, role): re.compile(p.pod_regex)
                           for s in spec.services for role, p in s.pools.items()}
        self._namespaces = {s.name: s.namespace for s in spec.services}
        self._max = {(s.name, role): p.max_replicas for s in spec.services
                     for role, p in s.pools.items()}

    # -- intake (HTTP thread) ---------------------------------------------------------------

    def submit(self, payload: AlertmanagerPayload) -> tuple[int, int]:
        """Queue the payload's new alerts; returns (queued, duplicates). Raises queue.Full
        when the worker is behind and NotLeader on the standby (answer 503 to both:
        Alertmanager retries)."""
        if not self.is_leader():
            raise NotLeader
        with self._lock:
            keys: list[tuple[str, str, str]] = []
            keyset: set[tuple[str, str, str]] = set()
            fresh = []
            for alert in payload.alerts:
                key: tuple[str, str, str] = (
                    alert.fingerprint or _fallback_fingerprint(alert.labels), alert.startsAt,
                    alert.status)
                if key in self._seen or key in keyset:
                    self.duplicates += 1
                    if key in self._seen:
                        self._seen.move_to_end(key)
                    continue
                keys.append(key)
                keyset.add(key)
                fresh.append(alert)
            # All or nothing: a refused delivery is retried whole, so none of it may count as
            # seen.
            if self._queue.maxsize - self._queue.qsize() < len(fresh):
                raise queue.Full
            for key in keys:
                self._seen[key] = None
            while len(self._seen) > self._dedupe_size:
                self._seen.popitem(last=False)
            for alert in fresh:
                self._queue.put_nowait(alert)
            self.received += len(payload.alerts)
        return len(fresh), len(payload.alerts) - len(fresh)

    # -- worker -----------------------------------------------------------------------------

    def start(self) -> None:
        if self._worker is None:
            self._worker = threading.Thread(target=self._run, name="pdscale-webhook",
                                            daemon=True)
            self._worker.start()

    def stop(self) -> None:
        if self._worker is not None:
            self._queue.put(None)
            self._worker.join(timeout=5)
            self._worker = None

    def drain_queue(self) -> None:
        """Process everything queued on the calling thread (tests and benchmarks)."""
        while True:
            try:
                alert = self._queue.get_nowait()
            except queue.Empty:
                return
            if alert is not None:
                self.process(alert)

    def wait_idle(self, timeout_s: float = 5.0) -> bool:
        """True once the worker has processed everything queued so far."""
        done = threading.Event()

        def joiner() -> None:
            self._queue.join()
            done.set()

        threading.Thread(target=joiner, daemon=True).start()
        return done.wait(timeout_s)

    def _run(self) -> None:
        while True:
            alert = self._queue.get()
            try:
                if alert is None:
                    return
                self.process(alert)
            except Exception:
                log.exception("reaction failed")
            finally:
                self._queue.task_done()

    # -- one alert --------------------------------------------------------------------------

    def _pool(self, labels: Mapping[str, str]) -> PoolKey | None:
        service, pool = labels.get("pdscale_service"), labels.get("pdscale_pool")
        if service is None or pool is None or service not in self._namespaces:
            return None
        try:
            return (service, Role(pool))
        except ValueError:
            return None

    def _rule(self, labels: Mapping[str, str]) -> ReactionRule | None:
        for rule in self.settings.rules:
            if all(labels.get(k) == v for k, v in rule.match.items()) and \
                    all(re.fullmatch(p, labels.get(k, "")) for k, p in rule.match_re.items()):
                return rule
        return None

    def _record(self, alert: AlertmanagerAlert, pool: PoolKey | None, action: str,
                outcome: str, message: str) -> ReactionRecord:
        labels = alert.labels
        rec = ReactionRecord(self.now(), labels.get("alertname", ""),
                             labels.get("severity", ""), alert.status,
                             alert.fingerprint, pool, action, outcome, message)
        with self._lock:
            self.records.append(rec)
        self.telemetry.reactions.add(1, {"action": action, "alertname": rec.alertname,
                                         "outcome": outcome})
        if outcome in ("applied", "resolved", "failed") and pool is not None \
                and self.events is not None and not self.dry_run:
            try:
                self.events.event(pool, "PdscaleAlertReaction",
                                  f"{rec.alertname} ({alert.status}): {action} {outcome}: "
                                  f"{message}")
            except Exception as exc:  # an Event is a record, not a reason to fail
                log.warning("could not record the reaction as an Event: %s", exc)
        level = logging.WARNING if rec.severity == "critical" and alert.status == "firing" \
            else logging.INFO
        log.log(level, "alert %s %s on %s: %s %s (%s)", rec.alertname, alert.status,
                "-" if pool is None else f"{pool[0]}/{pool[1].value}", action, outcome,
                message)
        return rec

    def process(self, alert: AlertmanagerAlert) -> ReactionRecord:
        record = self._process(alert)
        if record.outcome in RETRYABLE_OUTCOMES:
            key = (alert.fingerprint or _fallback_fingerprint(alert.labels), alert.startsAt,
                   alert.status)
            with self._lock:
                self._seen.pop(key, None)
        return record

    def _process(self, alert: AlertmanagerAlert) -> ReactionRecord:
        labels = alert.labels
        severity = labels.get("severity", "")
        cause = alert.fingerprint or _fallback_fingerprint(labels)
        self.telemetry.alerts_received.add(1, {"severity": severity or "none",
                                               "status": alert.status})
        pool = self._pool(labels)
        summary = {"alertname": labels.get("alertname", ""), "labels": dict(labels),
                   "startsAt": alert.startsAt, "summary": alert.annotations.get("summary", "")}
        with self._lock:
            table = self.critical if severity == "critical" else self.warnings
            if alert.status == "firing":
                table[cause] = summary
                if len(table) > 1000:
                    table.popitem(last=False)
            else:
                table.pop(cause, None)
        if not self.is_leader():
            return self._record(alert, pool, "none", "not_leader",
                                "this replica lost the lease before acting; the next delivery "
                                "goes to the leader")
        if alert.status == "resolved":
            ended = self.overrides.release(cause)
            if ended:
                self.request_tick()
            return self._record(alert, pool, "release", "resolved",
                                f"alert resolved; ended {ended} hold(s)/floor(s)")
        if severity != "critical":
            return self._record(alert, pool, "notify_only", "recorded",
                                "warnings are recorded, never acted on")
        rule = self._rule(labels)
        if rule is None or rule.action is ReactionAction.NOTIFY_ONLY:
            return self._record(alert, pool, "notify_only", "recorded",
                                "no reaction rule matches" if rule is None else "rule says notify")
        action = rule.action.value
        if pool is None:
            return self._record(alert, None, action, "no_pool",
                                "the alert has no pdscale_service/pdscale_pool of this spec")
        if not self.enabled:
            return self._record(alert, pool, action, "disabled",
                                "reactions are switched off (kill switch)")
        now = self.now()
        # A hold only stops the pool shrinking, for at most its hold: it neither waits for the
        # cooldown or the rate budget nor uses them (holds on a target going down would
        # otherwise delay the scale-up of a latency alert that follows by a repeat interval).
        charged = rule.action is not ReactionAction.HOLD_SCALE_DOWN
        previous: float | None = None
        if charged:
            with self._lock:
                previous = self._last_action.get(pool)
                if previous is not None and now - previous < self.settings.cooldown:
                    return self._record(alert, pool, action, "cooldown",
                                        f"last action on this pool {now - previous:.0f}s ago, "
                                        f"cooldown {self.settings.cooldown}s")
                while self._actions and self._actions[0] <= now - self.settings.window:
                    self._actions.popleft()
                if len(self._actions) >= self.settings.max_actions:
                    return self._record(alert, pool, action, "rate_limited",
                                        f"{len(self._actions)} actions in the last "
                                        f"{self.settings.window}s (max "
                                        f"{self.settings.max_actions})")
                # Reserved now (one worker acts at a time), given back below unless it acted.
                self._actions.append(now)
                self._last_action[pool] = now
        try:
            record = self._act(alert, rule, pool, cause, now)
        except Exception as exc:  # an adapter's error: failed, retried on the next delivery
            log.exception("reaction to %s failed", alert.labels.get("alertname", "alert"))
            record = self._record(alert, pool, action, "failed",
                                  f"{type(exc).__name__}: {exc}")
        if charged and record.outcome not in ACTED_OUTCOMES:
            with self._lock:
                with contextlib.suppress(ValueError):
                    self._actions.remove(now)
                if self._last_action.get(pool) == now:
                    if previous is None:
                        self._last_action.pop(pool, None)
                    else:
                        self._last_action[pool] = previous
        return record

    def _act(self, alert: AlertmanagerAlert, rule: ReactionRule, pool: PoolKey, cause: str,
             now: float) -> ReactionRecord:
        name = alert.labels.get("alertname", "alert")
        action = rule.action.value
        dry = self.dry_run
        until = now + rule.hold
        if rule.action is ReactionAction.SCALE_UP:
            check = ShortageCheck.for_pool(self.spec, pool[0], pool[1], rule.shortage)
            shortage = check(self.observe(pool))
            if not shortage.holds:
                return self._record(alert, pool, action, "no_shortage",
                                    f"no {rule.shortage.value} shortage now ({shortage.reason})"
                                    ": nothing added")
            current = self.current_replicas(pool) or 0
            asked = rule.to if rule.to is not None else current + (rule.step or 1)
            floor = min(asked, self._max[pool])
            if floor <= current:
                why = f"the pool's max_replicas {self._max[pool]}" if asked > floor else \
                    f"the floor {floor} asked"
                return self._record(alert, pool, action, "refused",
                                    f"{current} replicas already, at least {why}: nothing "
                                    f"added ({shortage.reason})")
            capped = f"; {asked} asked, capped at max_replicas" if asked > floor else ""
            message = (f"floor {floor} replicas (from {current}{capped}) while "
                       f"{shortage.reason}; it ends when that clears, after {rule.hold}s at "
                       "most")
            if not dry:
                self.overrides.floor(pool, floor, until, cause, f"{name} firing", check)
                self.overrides.hold(pool, until, cause, f"{name} firing", check)
                self.request_tick()
            return self._record(alert, pool, action, "dry_run" if dry else "applied", message)
        if rule.action is ReactionAction.HOLD_SCALE_DOWN:
            message = f"scale-down held for up to {rule.hold}s or until resolved"
            if not dry:
                self.overrides.hold(pool, until, cause, f"{name} firing")
            return self._record(alert, pool, action, "dry_run" if dry else "applied", message)
        # drain_instance
        pod = alert.labels.get("pod")
        namespace = alert.labels.get("namespace") or self._namespaces[pool[0]]
        if not pod or not self._pod_regex[pool].fullmatch(pod):
            return self._record(alert, pool, action, "refused",
                                f"pod {pod!r} is not one of the pool's pods "
                                f"({self._pod_regex[pool].pattern}); nothing drained")
        if namespace != self._namespaces[pool[0]]:
            return self._record(alert, pool, action, "refused",
                                f"namespace {namespace!r} is not the service's")
        drain = self.settings.drain
        message = f"pod {namespace}/{pod} labelled {drain.label}={drain.value}"
        if dry:
            return self._record(alert, pool, action, "dry_run", message)
        if self.pods is None:
            return self._record(alert, pool, action, "failed", "no Kubernetes client to "
                                "label pods with (recommendation mode?)")
        try:
            self.pods.label_pod(namespace, pod, drain.label, drain.value)
        except Exception as exc:
            return self._record(alert, pool, action, "failed", f"{message}: {exc}")
        self.overrides.hold(pool, until, cause, f"{name}: replacing drained pod {pod}")
        self.request_tick()
        return self._record(alert, pool, action, "applied", message)

    # -- status -----------------------------------------------------------------------------

    def snapshot(self, limit: int = 50) -> dict[str, Any]:
        with self._lock:
            return {
                "enabled": self.enabled, "dry_run": self.dry_run,
                "leader": self.is_leader(),
                "received": self.received, "duplicates": self.duplicates,
                "queued": self._queue.qsize(),
                "firing_critical": list(self.critical.values())[-limit:],
                "firing_warnings": list(self.warnings.values())[-limit:],
                "recent": [r.as_dict() for r in list(self.records)[-limit:]],
            }


def _fallback_fingerprint(labels: Mapping[str, str]) -> str:
    return ",".join(f"{k}={v}" for k, v in sorted(labels.items()))
