"""A real Prometheus loads the generated rules for every example, scrapes engine-named series
from a small exporter on loopback, evaluates every rule without error, and accepts every
dashboard query."""

from __future__ import annotations

import json
import re
import time
from typing import Any

import pytest

from pdscale._servers import write_rule_files
from pdscale.alerts import alert_files, alerting_groups, recording_groups
from pdscale.dashboards import build_dashboards, panel_queries
from pdscale.spec import Engine, Role, Spec, load_spec
from pdscale.telemetry import dynamo_label_namespace
from tests.conftest import EXAMPLES, free_port, need_tool
from tests.e2e.prom import api, exporter, prometheus

pytestmark = pytest.mark.e2e


def _regex_sample(regex: str) -> str:
    sample = regex.replace(".*", "0")
    assert re.fullmatch(regex, sample), regex
    return sample


def _targets(spec: Spec, address: str) -> list[dict[str, Any]]:
    """One scrape target per pool (a stand-in pod), plus Dynamo frontends."""
    configs = []
    for service in spec.services:
        for role in Role:
            pool = service.pools[role]
            engine = service.engine.value
            series: dict[str, str] = dict(pool.selector.match_labels)
            if service.engine in (Engine.VLLM, Engine.SGLANG):
                series["model_name"] = service.model_name
            if service.engine is Engine.DYNAMO:
                # As Dynamo 1.6.1 exports them: a prefill worker has only the runtime's
                # dynamo_component_* series, a decode worker re-exports its backend's.
                assert service.dynamo is not None
                # The runtime writes DYN_NAMESPACE with '-' as '_'.
                runtime = {"dynamo_namespace": dynamo_label_namespace(service.dynamo.namespace),
                           "dynamo_component": pool.selector.dynamo_component or "prefill",
                           "dynamo_endpoint": "generate"}
                series = {"model_name": service.model_name} if role is Role.DECODE \
                    else runtime
                if role is Role.DECODE:  # and the decode worker's own runtime series
                    engine = service.dynamo.backend
                    configs.append({"targets": [address], "labels": {
                        "namespace": service.namespace, "pod": _regex_sample(pool.pod_regex),
                        "__param_engine": "dynamo_worker",
                        "__param_labels": json.dumps(runtime)}})
                else:
                    engine = "dynamo_worker"
            configs.append({"targets": [address], "labels": {
                "namespace": service.namespace, "pod": _regex_sample(pool.pod_regex),
                "__param_engine": engine, "__param_labels": json.dumps(series)}})
        if service.engine is Engine.DYNAMO:
            assert service.dynamo is not None
            configs.append({"targets": [address], "labels": {
                "namespace": service.namespace, "pod": f"{service.name}-frontend-0",
                "__param_engine": "dynamo",
                "__param_labels": json.dumps({"model": service.model_name})}})
    return configs


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Any:
    need_tool("prometheus")
    workdir = tmp_path_factory.mktemp("prom")
    specs = [load_spec(p) for p in EXAMPLES]
    rule_files = [path for i, spec in enumerate(specs)
                  for path in write_rule_files(alert_files(spec), workdir / f"ex{i}")]
    with exporter(free_port()) as address:
        config = {
            "global": {"scrape_interval": "1s", "evaluation_interval": "1s"},
            "rule_files": rule_files,
            "scrape_configs": [{"job_name": "engines", "static_configs": [
                t for spec in specs for t in _targets(spec, address)]}],
        }
        with prometheus(config, workdir, free_port()) as url:
            yield url, specs


def _all_pools(url: str) -> bool:
    """Every pool of every example has its recorded queue depth (all targets scraped and a
    rule evaluation since), not just some of them."""
    pools = sum(len(s.pools) for p in EXAMPLES for s in load_spec(p).services)
    rows = api(url, "/api/v1/query",
               {"query": "count(pdscale_pool:requests_waiting:sum)"})["data"]["result"]
    return bool(rows) and int(float(rows[0]["value"][1])) == pools


def _wait_rules_evaluated(url: str, timeout_s: float = 40.0) -> list[dict[str, Any]]:
    deadline = time.monotonic() + timeout_s
    while True:
        groups = api(url, "/api/v1/rules")["data"]["groups"]
        rules = [r for g in groups for r in g["rules"]]
        series = api(url, "/api/v1/query",
                     {"query": "count(pdscale_pool:requests:rate5m)"})["data"]["result"]
        if rules and all(r.get("lastEvaluation", "").startswith("20") for r in rules) \
                and series and _all_pools(url):
            return rules
        if time.monotonic() > deadline:
            raise TimeoutError("rules were not evaluated in time")
        time.sleep(1)


def test_every_rule_evaluates_without_error(stack: Any) -> None:
    url, specs = stack
    rules = _wait_rules_evaluated(url)
    generated = sum(len(g["rules"]) for spec in specs
                    for g in recording_groups(spec) + alerting_groups(spec))
    assert len(rules) == generated
    bad = [(r.get("name"), r.get("lastError")) for r in rules if r["health"] != "ok"]
    assert not bad


def test_recorded_series_exist_for_every_pool(stack: Any) -> None:
    url, specs = stack
    _wait_rules_evaluated(url)
    result = api(url, "/api/v1/query", {"query": "pdscale_pool:requests_waiting:sum"})
    seen = {(s["metric"]["pdscale_service"], s["metric"]["pdscale_pool"])
            for s in result["data"]["result"]}
    for spec in specs:
        for service in spec.services:
            for role in Role:
                assert (service.name, role.value) in seen
    # A value computed through the pod selector: two GPUs' worth of memory is not seen twice.
    gpu = api(url, "/api/v1/query", {"query": "pdscale_pool:gpu_memory_used:max_ratio"})
    assert gpu["data"]["result"]
    for s in gpu["data"]["result"]:
        assert float(s["value"][1]) == pytest.approx(40000 / 120000)


def _substitute(expr: str) -> str:
    return (expr.replace("$namespace", ".*").replace("$model_name", ".*")
            .replace("$__rate_interval", "1m"))


def test_every_dashboard_query_is_accepted(stack: Any) -> None:
    url, specs = stack
    _wait_rules_evaluated(url)
    checked = 0
    for spec in specs:
        for doc in build_dashboards(spec):
            for title, ref, expr in panel_queries(doc.model):
                body = api(url, "/api/v1/query", {"query": _substitute(expr)})
                assert body["status"] == "success", f"{doc.uid}/{title}/{ref}: {body}"
                checked += 1
            for var in doc.model["templating"]["list"]:
                if var["type"] != "query":
                    continue
                match = re.fullmatch(r"label_values\((.+), (\w+)\)", var["query"])
                assert match, var["query"]
                body = api(url, f"/api/v1/label/{match.group(2)}/values",
                           {"match[]": _substitute(match.group(1))})
                assert body["status"] == "success" and body["data"]
    assert checked > 50


def test_panels_show_data_for_the_examples(stack: Any) -> None:
    url, specs = stack
    _wait_rules_evaluated(url)
    spec = next(s for s in specs if s.services[0].name == "llama-chat")
    doc = next(d for d in build_dashboards(spec) if d.uid.endswith("-decode"))
    kv = next(e for t, _, e in panel_queries(doc.model) if t == "KV-cache usage")
    body = api(url, "/api/v1/query", {"query": _substitute(kv)})
    assert body["data"]["result"], "the decode dashboard's KV panel has no data"


def test_reader_reads_every_pool_with_one_query_per_signal(stack: Any) -> None:
    from pdscale.telemetry import PrometheusReader, Signal

    url, specs = stack
    _wait_rules_evaluated(url)
    reader = PrometheusReader(url, timeout_s=5)
    signals = [Signal.QUEUE_DEPTH, Signal.KV_CACHE_USAGE_MAX_RATIO, Signal.TARGETS_UP,
               Signal.EXTERNAL_PREFIX_CACHE_HIT_RATIO]
    now = time.time()
    for spec in specs:
        before = reader.queries
        values = reader.read(spec, signals, at_s=now)
        assert reader.queries - before == len(signals)  # not a query per pool
        for service in spec.services:
            for role in Role:
                pool = values[(service.name, role)]
                assert pool[Signal.QUEUE_DEPTH].value is not None
                assert 0 <= (pool[Signal.QUEUE_DEPTH].age_s or 0) < 30
                if service.engine is not Engine.VLLM:  # vLLM-only signal: missing, not zero
                    ext = pool[Signal.EXTERNAL_PREFIX_CACHE_HIT_RATIO]
                    assert ext.value is None and ext.age_s is None


def test_reader_history_in_chunks(stack: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    import pdscale.telemetry._reader as reader_module
    from pdscale.telemetry import PrometheusReader, Signal

    url, specs = stack
    _wait_rules_evaluated(url)
    monkeypatch.setattr(reader_module, "MAX_POINTS_PER_QUERY", 4)
    reader = PrometheusReader(url)
    now = time.time()
    history = reader.history(specs[0], Signal.TARGETS, start_s=now - 12, end_s=now, step_s=1)
    assert reader.queries >= 4  # 12 s in chunks of 3 steps
    for times, values in history.values():
        assert times == sorted(set(times)) and len(times) == len(values)


def test_per_pod_work_and_the_drain_panel_against_a_real_prometheus(stack: Any) -> None:
    """The drain reads each pod's work with the catalog's expressions grouped by pod: a real
    Prometheus evaluates the query and answers per pod, with a fresh sample time; the drain
    panel's queries are accepted too."""
    from pdscale.telemetry import PrometheusReader, read_pod_work

    url, specs = stack
    _wait_rules_evaluated(url)
    reader = PrometheusReader(url, timeout_s=5)
    now = time.time()
    checked = 0
    for spec in specs:
        for service in spec.services:
            if service.engine not in (Engine.VLLM, Engine.SGLANG):
                continue  # Dynamo's re-exported series: see the catalog branch's selectors
            for role in Role:
                work = read_pod_work(reader, service, role, at_s=now)
                pod = _regex_sample(service.pools[role].pod_regex)
                assert set(work) == {pod}, (service.name, role, work)
                w = work[pod]
                assert w.running is not None and w.waiting is not None
                assert w.kv_usage is not None and 0 <= w.kv_usage <= 1
                assert w.sample_time_s is not None and now - w.sample_time_s < 30
                checked += 1
    assert checked >= 4
    from pdscale.spec import parse_spec

    text = EXAMPLES[0].read_text() + "\ncontroller:\n  drain: {enabled: true}\n"
    doc = next(d for d in build_dashboards(parse_spec(text)) if d.uid.endswith("autoscaler"))
    queries = [e for t, _, e in panel_queries(doc.model) if t == "Scale-down drains"]
    assert queries
    for expr in queries:
        body = api(url, "/api/v1/query", {"query": _substitute(expr)})
        assert body["status"] == "success", (expr, body)
