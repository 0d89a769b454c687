"""Reading the catalog's signals for every pool from Prometheus (or a PromQL-compatible store).

Design:

* One instant query per signal covers every pool of the spec (the recorded series carry the
  pool labels) and returns each series' sample time too: the number of queries per tick does
  not depend on the number of pools.
* Every call has a timeout and an explicit evaluation time; nothing reads the clock here.
* A missing series is ``None`` (no data), never zero; a series older than ``stale_after_s`` is
  reported with its age and its value withheld.
* Authentication: a bearer token read from a file (re-read when the file changes, so secrets
  rotate without a restart) or given directly, basic auth, a CA bundle, and extra headers
  (for example a tenant id for Mimir).
* Errors: :class:`PrometheusUnavailable` (retry later: connection, timeout, 5xx) and
  :class:`PrometheusQueryError` (give up: the query or the credentials are wrong).
* History: chunked range queries (Prometheus caps a series at 11,000 points a query) to warm
  the forecasters at start-up, so a restarted controller is useful at once.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import requests

from pdscale.errors import GiveUp, RetryLater
from pdscale.spec import PoolKey, Role, ServiceSpec, Spec
from pdscale.telemetry._catalog import Signal, engine_signals, pool_expr, recorded_name

__all__ = ["POD_WORK_SIGNALS", "PodWork", "PrometheusAuth", "PrometheusQueryError",
           "PrometheusReader", "PrometheusUnavailable", "SignalValue", "instant_rows",
           "pod_work_query", "read_pod_work"]

MAX_POINTS_PER_QUERY = 10_000
_STAMP = "pdscale_sample_time"


class PrometheusUnavailable(RetryLater):
    """Prometheus could not answer (connection, timeout, 5xx). Retry on the next tick."""

    adapter = "prometheus"


class PrometheusQueryError(GiveUp):
    """Prometheus refused the query or the credentials (4xx). Retrying will not help."""

    adapter = "prometheus"


@dataclass(frozen=True)
class PrometheusAuth:
    bearer_token_file: Path | None = None
    bearer_token: str | None = None
    basic_auth: tuple[str, str] | None = None
    ca_bundle: Path | None = None
    headers: Mapping[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class SignalValue:
    value: float | None
    """None when the series is missing or stale."""
    age_s: float | None
    """Seconds since the newest sample behind it; None when missing."""


ClientFactory = Callable[[str, dict[str, str], tuple[str, str] | None, requests.Session,
                          float], Any]


def _default_client(url: str, headers: dict[str, str], auth: tuple[str, str] | None,
                    session: requests.Session, timeout_s: float) -> Any:
    # Imported here: the client pulls in pandas, which nothing else at import time needs.
    from prometheus_api_client import PrometheusConnect
    from urllib3.util.retry import Retry

    # One quick retry: the next tick retries anyway, and the client's default (3 retries with
    # exponential backoff) would spend most of a 15 s tick on a Prometheus that is down.
    retry = Retry(total=1, backoff_factor=0.1, status_forcelist=(502, 503, 504))
    return PrometheusConnect(url=url, headers=headers, auth=auth, session=session,
                             timeout=timeout_s, retry=retry)


class PrometheusReader:
    def __init__(self, url: str, *, auth: PrometheusAuth | None = None, timeout_s: float = 5.0,
                 stale_after_s: float = 120.0,
                 client_factory: ClientFactory = _default_client) -> None:
        self.url = url.rstrip("/")
        self.auth = auth or PrometheusAuth()
        self.timeout_s = timeout_s
        self.stale_after_s = stale_after_s
        self._factory = client_factory
        self._client: Any = None
        self._token_mtime: float | None = None
        self.queries = 0

    # -- connection -----------------------------------------------------------------------

    def _token(self) -> str | None:
        path = self.auth.bearer_token_file
        if path is None:
            return self.auth.bearer_token
        try:
            return path.read_text(encoding="utf-8").strip()
        except OSError as exc:
            raise PrometheusQueryError(f"cannot read the bearer token file {path}: "
                                       f"{exc.strerror}; check the mounted secret") from exc

    def client(self) -> Any:
        """The API client, rebuilt when the token file changed (rotation without restart)."""
        mtime = None
        if self.auth.bearer_token_file is not None:
            try:
                mtime = self.auth.bearer_token_file.stat().st_mtime
            except OSError:
                mtime = None
        if self._client is None or mtime != self._token_mtime:
            headers = dict(self.auth.headers)
            token = self._token()
            if token:
                headers["Authorization"] = f"Bearer {token}"
            session = requests.Session()
            if self.auth.ca_bundle is not None:
                session.verify = str(self.auth.ca_bundle)
            self._client = self._factory(self.url, headers, self.auth.basic_auth, session,
                                         self.timeout_s)
            self._token_mtime = mtime
        return self._client

    def _call(self, fn: Callable[[], Any]) -> Any:
        from prometheus_api_client.exceptions import PrometheusApiClientException

        self.queries += 1
        try:
            return fn()
        except PrometheusApiClientException as exc:
            text = _short(str(exc))
            if any(f"Status Code {code}" in text for code in range(500, 600)):
                raise PrometheusUnavailable(f"{self.url}: {text}") from exc
            raise PrometheusQueryError(f"{self.url}: {text}") from exc
        except requests.exceptions.RetryError as exc:
            raise PrometheusUnavailable(f"{self.url} kept failing ({_cause(exc)})") from exc
        except requests.Timeout as exc:
            raise PrometheusUnavailable(f"{self.url} did not answer within "
                                        f"{self.timeout_s:g}s") from exc
        except requests.ConnectionError as exc:
            if "timed out" in str(exc).lower():  # a read timeout after the adapter's retry
                raise PrometheusUnavailable(f"{self.url} did not answer within "
                                            f"{self.timeout_s:g}s") from exc
            raise PrometheusUnavailable(f"cannot connect to {self.url} ({_cause(exc)}; is "
                                        "Prometheus up?)") from exc
        except (ValueError, KeyError, TypeError) as exc:
            # An answer that is not the Prometheus API's JSON (a Grafana or proxy page).
            raise PrometheusQueryError(
                f"{self.url} answered with something other than the Prometheus HTTP API "
                f"({type(exc).__name__}: {str(exc)[:120]}); is it Prometheus' base URL?"
            ) from exc

    # -- instant reads --------------------------------------------------------------------

    @staticmethod
    def _pool_matcher(spec: Spec) -> str:
        names = "|".join(s.name for s in spec.services)
        return f'pdscale_service=~"{names}"'

    def read(self, spec: Spec, signals: Sequence[Signal], *, at_s: float
             ) -> dict[PoolKey, dict[Signal, SignalValue]]:
        """The signals of every pool at time ``at_s``: one query per signal."""
        matcher = self._pool_matcher(spec)
        out: dict[PoolKey, dict[Signal, SignalValue]] = {
            (s.name, role): {} for s in spec.services for role in Role}
        params = {"time": f"{at_s:.3f}"}
        client = self.client()
        for sig in signals:
            name = recorded_name(sig)
            series = f"{name}{{{matcher}}}"
            # One query gives each series' value and, tagged, the time of its newest sample.
            query = (f'{series} or label_replace(timestamp({series}), "{_STAMP}", "1", "", "")')

            def instant(query: str = query) -> Any:
                return client.custom_query(query, params=params)

            values: dict[PoolKey, float] = {}
            stamps: dict[PoolKey, float] = {}
            for row in self._call(instant):
                m = row["metric"]
                try:
                    pool = (m["pdscale_service"], Role(m["pdscale_pool"]))
                except (KeyError, ValueError):
                    continue
                (stamps if _STAMP in m else values)[pool] = float(row["value"][1])
            for pool, value in values.items():
                if pool not in out:
                    continue
                age = at_s - stamps[pool] if pool in stamps else None
                fresh = age is not None and age <= self.stale_after_s and math.isfinite(value)
                out[pool][sig] = SignalValue(value if fresh else None, age)
        for pool_signals in out.values():
            for sig in signals:
                pool_signals.setdefault(sig, SignalValue(None, None))
        return out

    # -- history ----------------------------------------------------------------------------

    def history(self, spec: Spec, signal: Signal, *, start_s: float, end_s: float,
                step_s: float) -> dict[PoolKey, tuple[list[float], list[float]]]:
        """A signal's history for every pool, fetched in chunks of at most 10,000 points."""
        if step_s <= 0 or end_s <= start_s:
            raise PrometheusQueryError("history needs step_s > 0 and end_s > start_s")
        name = recorded_name(signal)
        query = f"{name}{{{self._pool_matcher(spec)}}}"
        out: dict[PoolKey, tuple[list[float], list[float]]] = {}
        client = self.client()
        for lo, hi in _chunks(start_s, end_s, step_s):

            def ranged(lo: float = lo, hi: float = hi) -> Any:
                return client.custom_query_range(
                    query, start_time=datetime.fromtimestamp(lo, UTC),
                    end_time=datetime.fromtimestamp(hi, UTC), step=f"{step_s:g}s")

            rows = self._call(ranged)
            for row in rows:
                m = row["metric"]
                try:
                    pool = (m["pdscale_service"], Role(m["pdscale_pool"]))
                except (KeyError, ValueError):
                    continue
                times, values = out.setdefault(pool, ([], []))
                for ts, raw in row["values"]:
                    t = float(ts)
                    if times and t <= times[-1]:
                        continue  # chunk boundaries overlap by one step
                    times.append(t)
                    values.append(float(raw))
        return out


_ERRNO = re.compile(r"\[Errno -?\d+\] ([^'\")\]]+)")


def _cause(exc: BaseException) -> str:
    """The root cause of a connection failure in a few words ("Connection refused"), not the
    library's whole chain (which repeats the request's URL-encoded query)."""
    found = _ERRNO.search(str(exc))
    if found is not None:
        return found.group(1).strip().rstrip(".")
    return "refused or unreachable"


def _short(text: str, limit: int = 160) -> str:
    """An error text cut to ``limit`` characters (an answer's body can be a whole page)."""
    text = " ".join(text.split())
    return text if len(text) <= limit else text[:limit - 3] + "..."


def _chunks(start_s: float, end_s: float, step_s: float) -> Iterable[tuple[float, float]]:
    span = step_s * (MAX_POINTS_PER_QUERY - 1)
    lo = start_s
    while lo < end_s:
        hi = min(end_s, lo + span)
        yield lo, hi
        lo = hi


def instant_rows(reader: PrometheusReader, query: str, *,
                 at_s: float) -> list[tuple[dict[str, str], float]]:
    """(labels, value) of every row of one instant query at ``at_s``, for diagnostics such as
    ``pdscale check``; errors as :meth:`PrometheusReader.read` raises them."""
    client = reader.client()
    params = {"time": f"{at_s:.3f}"}

    def instant() -> Any:
        return client.custom_query(query, params=params)

    rows = reader._call(instant)
    return [({str(k): str(v) for k, v in row["metric"].items()}, float(row["value"][1]))
            for row in rows]


# -- per-pod work (scale-down drain) ------------------------------------------------------------

POD_WORK_SIGNALS: dict[str, Signal] = {
    "running": Signal.RUNNING_REQUESTS,
    "waiting": Signal.QUEUE_DEPTH,
    "kv_usage": Signal.KV_CACHE_USAGE_RATIO,
    "sample_age_s": Signal.SAMPLE_AGE_S,
}
"""What a replica holds, read per pod from the catalog's own expression for each signal."""
_POD_TAG = "pdscale_pod_signal"
_BY_NAMESPACE = re.compile(r"\bby \(namespace\)")


@dataclass(frozen=True)
class PodWork:
    """The work one replica holds, from its engine's series. Each value is None when the
    engine does not export it, the pod has no sample, or its newest sample is stale: never
    zero for missing."""

    running: float | None
    """Requests being processed."""
    waiting: float | None
    """Requests queued on the replica."""
    kv_usage: float | None
    """KV-cache blocks in use, 0-1 (a prefill replica keeps its blocks until decode has
    pulled them)."""
    sample_time_s: float | None
    """When the newest engine sample behind these was taken (the pool's liveness gauge)."""


def pod_work_query(service: ServiceSpec, role: Role) -> str | None:
    """One PromQL query for the work of every pod of the pool: the catalog's pool expression
    of each :data:`POD_WORK_SIGNALS` entry, aggregated by ``(namespace, pod)`` instead of by
    namespace, each tagged with ``pdscale_pod_signal``. None when the engine exports none."""
    have = engine_signals(service, role)
    parts = []
    for name, signal in POD_WORK_SIGNALS.items():
        if signal not in have:
            continue
        expr, n = _BY_NAMESPACE.subn("by (namespace, pod)", pool_expr(signal, service, role))
        if n == 0:
            continue  # not an aggregation by namespace: it cannot be split per pod
        parts.append(f'label_replace({expr}, "{_POD_TAG}", "{name}", "", "")')
    return " or ".join(parts) or None


def read_pod_work(reader: PrometheusReader, service: ServiceSpec, role: Role, *,
                  at_s: float) -> dict[str, PodWork]:
    """The work of every pod of one pool at ``at_s`` (one query), by pod name. A pod whose
    newest sample is older than the reader's ``stale_after_s`` has every value withheld.
    Errors as :meth:`PrometheusReader.read`."""
    query = pod_work_query(service, role)
    if query is None:
        return {}
    seen: dict[str, dict[str, float]] = {}
    for labels, value in instant_rows(reader, query, at_s=at_s):
        pod, name = labels.get("pod"), labels.get(_POD_TAG)
        if pod is None or name is None or not math.isfinite(value):
            continue
        seen.setdefault(pod, {})[name] = value
    out: dict[str, PodWork] = {}
    for pod, values in seen.items():
        age = values.get("sample_age_s")
        stamp = at_s - max(0.0, age) if age is not None else None
        fresh = age is not None and age <= reader.stale_after_s
        out[pod] = PodWork(
            running=values.get("running") if fresh else None,
            waiting=values.get("waiting") if fresh else None,
            kv_usage=values.get("kv_usage") if fresh else None,
            sample_time_s=stamp)
    return out
