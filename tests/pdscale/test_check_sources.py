"""``pdscale check --controller``: which source answered each signal at a running controller,
and how fresh (pdscale._check.source_rows over its /v1/status)."""

from __future__ import annotations

from typing import Any

from pdscale._check import render_sources, source_rows, sources_ready
from pdscale.spec import Spec, load_spec
from tests.conftest import ROOT

SPEC = ROOT / "examples" / "vllm-otlp.yaml"


def _status(prefill: dict[str, tuple[str | None, float | None]],
            decode: dict[str, tuple[str | None, float | None]]) -> dict[str, Any]:
    pools = {"llama-otel/prefill": prefill, "llama-otel/decode": decode}
    return {"signal_sources": {k: {s: v[0] for s, v in p.items()} for k, p in pools.items()},
            "signal_ages_s": {k: {s: v[1] for s, v in p.items()} for k, p in pools.items()}}


def _spec() -> Spec:
    return load_spec(SPEC)


def test_each_signal_names_its_configured_and_answering_source() -> None:
    status = _status(
        {"prompt_tokens_per_s": ("prometheus", 12.0), "ttft_p95_s": ("otlp", 3.0),
         "queue_depth": ("prometheus", 12.0), "itl_p95_s": (None, None)},
        {"generation_tokens_per_s": ("prometheus", 12.0), "itl_p95_s": ("prometheus", 12.0)})
    rows = {(r.pool, r.signal): r for r in source_rows(_spec(), status, stale_after_s=120)}
    ttft = rows[("prefill", "ttft_p95_s")]
    assert (ttft.configured, ttft.answered, ttft.age_s, ttft.status) == ("otlp", "otlp", 3.0,
                                                                         "ok")
    # itl_p95_s reads "both": on the decode pool Prometheus answered, spans had no value.
    itl = rows[("decode", "itl_p95_s")]
    assert (itl.configured, itl.answered) == ("both", "prometheus")
    assert rows[("prefill", "queue_depth")].needed_by == "controller (other)"
    assert rows[("prefill", "itl_p95_s")].status == "missing"  # not needed there: still ready
    assert sources_ready(list(rows.values()))


def test_a_needed_signal_without_a_fresh_source_fails_and_says_where_to_look() -> None:
    status = _status(
        {"prompt_tokens_per_s": ("prometheus", 12.0), "ttft_p95_s": (None, None)},
        {"generation_tokens_per_s": ("prometheus", 400.0), "itl_p95_s": ("otlp", 2.0)})
    rows = source_rows(_spec(), status, stale_after_s=120)
    assert not sources_ready(rows)
    by = {(r.pool, r.signal): r.status for r in rows}
    assert by[("prefill", "ttft_p95_s")] == "missing"
    assert by[("decode", "generation_tokens_per_s")] == "stale"
    text = render_sources(rows, controller="http://c:8080")
    assert "llama-otel/prefill ttft_p95_s: no source had a value; it is read from the OTLP " \
           "receiver" in text
    assert "llama-otel/decode generation_tokens_per_s: stale data; it is read from " \
           "Prometheus" in text
    assert "2 signal(s) the controller needs without a fresh source" in text


def test_a_controller_that_has_not_read_yet_lists_the_needed_signals_as_missing() -> None:
    rows = source_rows(_spec(), {}, stale_after_s=120)
    assert {(r.pool, r.signal) for r in rows} == {
        ("prefill", "prompt_tokens_per_s"), ("prefill", "ttft_p95_s"),
        ("decode", "generation_tokens_per_s"), ("decode", "itl_p95_s")}
    assert all(r.status == "missing" for r in rows) and not sources_ready(rows)


def test_the_prometheus_check_does_not_need_what_the_controller_reads_from_otlp() -> None:
    from pdscale._check import check_spec, controller_ready

    spec = _spec()
    # A Prometheus that has nothing: every engine series is missing.
    rows = check_spec(spec, lambda q: [], at_s=1000.0)
    needed = {(r.pool, r.signal) for r in rows if r.needed_by == "controller"}
    assert ("prefill", "ttft_p95_s") not in needed  # read from OTLP only
    assert ("decode", "itl_p95_s") in needed  # "both": Prometheus may answer it
    assert {r.needed_by for r in rows if r.signal == "ttft_p95_s"} == {
        "nothing (read from OTLP)"}
    assert not controller_ready(rows)  # the demand still comes from Prometheus
