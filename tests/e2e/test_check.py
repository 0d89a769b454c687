"""``pdscale check`` against a real Prometheus scraping the live simulator, with the failures
of issue 13 reproduced on purpose: a label only the scrape provides removed from some Dynamo
frontend series, an SLO threshold that is not one of Dynamo's real bucket boundaries, a label
removed from one vLLM series; and a Prometheus that refuses the query or is down."""

from __future__ import annotations

import contextlib
import io
import json
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from pdscale.cli import main
from pdscale.simulator import EventSimulator, synthetic_trace
from pdscale.simulator._live import LiveCluster, serve_live
from pdscale.simulator._simulate import SimOptions, prepare
from pdscale.spec import Role, Spec, load_spec, parse_spec
from tests.conftest import ROOT, free_port, need_tool
from tests.e2e.prom import api, eventually, prometheus

pytestmark = pytest.mark.e2e


@contextlib.contextmanager
def _live(spec: Spec) -> Iterator[tuple[str, EventSimulator]]:
    prepared = prepare(spec, SimOptions(duration_s=3600, cold_start_s=20, mode="event"))
    sim = EventSimulator(prepared.setup, synthetic_trace(duration_s=3600, mean_rps=4, seed=3))
    cluster = LiveCluster.for_service(sim, spec.services[0], speed=10.0)
    port: list[int] = []
    stop, ready = threading.Event(), threading.Event()
    thread = threading.Thread(target=serve_live, args=(cluster,), daemon=True, kwargs={
        "port": 0, "stop": stop, "ready": ready, "on_port": port.append})
    thread.start()
    try:
        assert ready.wait(10)
        yield f"127.0.0.1:{port[0]}", sim
    finally:
        stop.set()
        thread.join(timeout=10)


def _blank(names: str, label: str) -> dict[str, Any]:
    """A metric relabelling that removes ``label`` from the series named by ``names``."""
    return {"source_labels": ["__name__"], "regex": names, "target_label": label,
            "replacement": ""}


def _dynamo_spec(tmp: Path) -> Path:
    raw = yaml.safe_load((ROOT / "examples" / "dynamo.yaml").read_text())
    service = raw["services"][0]
    # The user believes the frontend has a 0.5 s boundary (the planner's default target): it
    # validates against the stated buckets, but the running frontend has Dynamo's defaults.
    service["slo"]["ttft_p95_s"] = 0.5
    service["histogram_buckets"] = {"ttft": [0.1, 0.25, 0.5, 1.0]}
    path = tmp / "dynamo.yaml"
    path.write_text(yaml.safe_dump(raw, sort_keys=False))
    load_spec(path)
    return path


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    need_tool("prometheus")
    tmp = tmp_path_factory.mktemp("check")
    dynamo_path = _dynamo_spec(tmp)
    vllm_path = ROOT / "examples" / "vllm.yaml"
    with _live(load_spec(dynamo_path)) as (dynamo, dyn_sim), \
            _live(load_spec(vllm_path)) as (vllm, vllm_sim):
        config = {
            "global": {"scrape_interval": "1s", "evaluation_interval": "1s"},
            "scrape_configs": [
                {"job_name": "dynamo", "honor_labels": True,
                 "static_configs": [{"targets": [dynamo]}],
                 # The frontend's ITL and output tokens arrive without `namespace`, as they do
                 # when the scrape config does not add it (the process never does).
                 "metric_relabel_configs": [_blank(
                     "dynamo_frontend_(inter_token_latency_seconds_.*|output_tokens_total)",
                     "namespace")]},
                {"job_name": "vllm", "honor_labels": True,
                 "static_configs": [{"targets": [vllm]}],
                 "metric_relabel_configs": [_blank("vllm:kv_cache_usage_perc", "pod")]},
            ]}
        with prometheus(config, tmp, free_port()) as url:
            # Both targets up, and a few samples of every series: three scrapes of each job
            # (counted, not slept for: a loaded machine scrapes late).
            def scrapes() -> dict[str, float]:
                rows = api(url, "/api/v1/query", {
                    "query": "count_over_time(up[5m]) and on (job) (up == 1)"})["data"]["result"]
                return {r["metric"]["job"]: float(r["value"][1]) for r in rows}

            eventually(lambda: len(scrapes()) == 2 and min(scrapes().values()) >= 3, 30,
                       "three scrapes of both live simulators, each up",
                       lambda: f"scrapes of jobs that are up: {scrapes()}")
            yield {"url": url, "dynamo": dynamo_path, "vllm": vllm_path, "live": dynamo,
                   "sims": {"dynamo": dyn_sim, "vllm": vllm_sim}, "tmp": tmp}


def _check(*argv: str) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = main(["check", *argv])
    return code, out.getvalue(), err.getvalue()


def _rows(text: str) -> list[dict[str, Any]]:
    rows: list[dict[str, Any]] = json.loads(text)["rows"]
    return rows


def test_dynamo_failures_are_found_with_their_fix(stack: dict[str, Any]) -> None:
    code, out, _ = _check(str(stack["dynamo"]), "--prometheus", stack["url"], "--json")
    assert code == 1  # the controller's decode demand and ITL are missing
    rows = _rows(out)
    by = {(r["pool"], r["signal"], r["series"].split("{")[0]): r for r in rows}
    itl = by[("decode", "itl_p95_s", "dynamo_frontend_inter_token_latency_seconds_bucket")]
    assert itl["status"] == "missing" and itl["needed_by"] == "controller"
    assert "namespace" in itl["problem"] and "carry no 'namespace'" in itl["problem"]
    assert "only comes from the scrape" in itl["fix"]
    tokens = by[("decode", "generation_tokens_per_s", "dynamo_frontend_output_tokens_total")]
    assert tokens["status"] == "missing"
    # The SLO bucket the burn-rate alerts read does not exist: named with the real boundaries.
    bucket = next(r for r in rows if r["signal"] == "slo_ttft_bucket")
    assert bucket["status"] == "no-bucket"
    assert "0.47" in bucket["problem"] and "0.47, 1" in bucket["fix"]
    assert "DYN_METRICS_TTFT_MIN" in bucket["fix"]
    # The prefill pool's backlog comes from the worker runtime: every ready worker reports it.
    queue = by[("prefill", "queue_depth", "dynamo_component_inflight_requests")]
    assert queue["status"] == "ok"
    assert queue["pods"] == stack["sims"]["dynamo"].counts(Role.PREFILL)["ready"]
    ttft = by[("prefill", "ttft_p95_s", "dynamo_frontend_time_to_first_token_seconds_bucket")]
    assert ttft["status"] == "ok" and ttft["age_s"] < 30


def test_vllm_label_removed_on_one_series(stack: dict[str, Any]) -> None:
    code, out, _ = _check(str(stack["vllm"]), "--prometheus", stack["url"], "--service",
                          "llama-chat")
    # KV usage is read by alerts and dashboards, not the controller: exit 0, reported.
    assert code == 0, out
    assert "everything the controller needs is present" in out
    assert "pod=~\"llama-chat-decode-.*\" removed every series: they carry no 'pod'" in out
    _, js, _ = _check(str(stack["vllm"]), "--prometheus", stack["url"], "--service",
                      "llama-chat", "--json")
    rows = _rows(js)
    kv = [r for r in rows if r["signal"] == "kv_cache_usage_max_ratio"]
    assert kv and all(r["status"] == "missing" for r in kv)
    waiting = next(r for r in rows if r["pool"] == "decode" and r["signal"] == "queue_depth"
                   and r["status"] == "ok")
    assert waiting["pods"] == stack["sims"]["vllm"].counts(Role.DECODE)["ready"]
    # The capacity-wait breakdown (vLLM 0.34) is there; the error ratio reads finished_reason.
    assert any("reason=\"capacity\"" in r["series"] and r["status"] == "ok" for r in rows)


def test_a_pool_selector_that_matches_nothing_names_the_spec_field(
        stack: dict[str, Any], tmp_path: Path) -> None:
    raw = yaml.safe_load((ROOT / "examples" / "vllm.yaml").read_text())
    raw["services"] = raw["services"][:1]
    raw["services"][0]["model_name"] = "meta-llama/Llama-3.1-70B-Instruct"  # not served
    path = tmp_path / "wrong-model.yaml"
    path.write_text(yaml.safe_dump(raw, sort_keys=False))
    parse_spec(path.read_text())
    code, out, _ = _check(str(path), "--prometheus", stack["url"])
    assert code == 1
    assert "services[0].model_name" in out and "meta-llama/Llama-3.1-8B-Instruct" in out


def test_a_prometheus_that_refuses_or_is_down(stack: dict[str, Any]) -> None:
    code, out, err = _check(str(stack["vllm"]), "--prometheus", f"http://{stack['live']}")
    assert code == 2 and "refused the query" in err and not out
    code, out, err = _check(str(stack["vllm"]), "--prometheus",
                            f"http://127.0.0.1:{free_port()}")
    assert code == 1 and "did not answer" in err and not out
    with pytest.raises(SystemExit) as usage:  # a usage error, before anything is read
        _check(str(stack["vllm"]), "--prometheus", "localhost:9090")
    assert usage.value.code == 2
