"""The catalog held against the engines' released metric lists and a running Dynamo's scrapes
(shared/reference/engine-metrics/): every raw series the generated recording rules read (and so
every alert, dashboard panel and controller input built on them) exists in that engine's
release under its exposed name, with the right type for how it is read (counters and
histogram parts through rate(), gauges as they are), and is selected only by labels the engine
or the spec's declared scrape labels provide. A selector on a label nothing provides matches
nothing, and an empty result fires no alert and moves no replica."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from pdscale.spec import Engine, Role, ServiceSpec, Spec
from pdscale.telemetry import SeriesRef, engine_signals, pool_expr, series_refs, slo_bucket_ref
from tests.conftest import SHARED
from tests.telemetry.reference_lists import Exposed, family_of, released, scrape

LISTS = SHARED / "reference" / "engine-metrics"


@pytest.fixture(scope="module")
def lists() -> dict[str, dict[str, Exposed]]:
    if not (LISTS / "real_metrics_vllm.txt").is_file():
        pytest.skip(f"the engines' released metric lists are not at {LISTS} (shared/ is "
                    "absent here; set PDSCALE_SHARED to its path)")
    return released(LISTS)


def _reads(service: ServiceSpec) -> list[tuple[Role, str, SeriesRef]]:
    """(role, expression, raw series) for everything the recording rules read."""
    out = []
    for role in Role:
        for signal in sorted(engine_signals(service, role)):
            expr = pool_expr(signal, service, role)
            out += [(role, expr, ref) for ref in series_refs(signal, service, role)]
    for kind, role in (("ttft", Role.PREFILL), ("itl", Role.DECODE)):
        bucket = slo_bucket_ref(service, kind)  # type: ignore[arg-type]
        if bucket is not None:
            count = SeriesRef(bucket.metric.removesuffix("_bucket") + "_count",
                              tuple(m for m in bucket.matchers if m[0] != "le"),
                              bucket.source, False)
            out += [(role, f"rate({bucket.selector()}[5m])", bucket),
                    (role, f"rate({count.selector()}[5m])", count)]
    return out


def _through_rate(expr: str, metric: str) -> bool:
    """Read as a counter: through rate() or increase(), or as the difference of two instants
    clamped at 0 (the dispersion's per-window tokens, where a reset loses one window)."""
    m = re.escape(metric)
    return re.search(r"(rate|increase)\(" + m + r"\{", expr) is not None or \
        re.search(r"clamp_min\(" + m + r"\{[^}]*\}( offset \w+)? - " + m + r"\{", expr) \
        is not None


def reference_problems(service: ServiceSpec, reads: list[tuple[Role, str, SeriesRef]],
                       lists: dict[str, dict[str, Exposed]]) -> list[str]:
    problems = []
    scrape_labels = set(service.scrape_labels)
    for role, expr, ref in reads:
        where = f"{service.name}/{role.value} {ref.selector()}"
        if ref.metric == "up":
            continue
        family = family_of(ref.metric)
        if family is None:
            problems.append(f"{where}: not an engine series")
            continue
        exposed = lists[family].get(ref.metric)
        if exposed is None:
            problems.append(f"{where}: {ref.metric} is not an exposed series of {family}'s "
                            "release")
            continue
        rated = _through_rate(expr, ref.metric)
        part = re.search(r"_(bucket|sum|count)$", ref.metric)
        if exposed.type == "counter" and not rated:
            problems.append(f"{where}: a counter read without rate()")
        if exposed.type == "gauge" and rated:
            problems.append(f"{where}: a gauge read through rate()")
        if exposed.type == "histogram" and not (part and rated):
            problems.append(f"{where}: histogram parts are read through rate()")
        if exposed.type not in ("counter", "gauge", "histogram", "unverified"):
            problems.append(f"{where}: unexpected type {exposed.type}")
        if exposed.labels is not None:
            allowed = exposed.labels | scrape_labels | ({"le"} if ref.metric.endswith(
                "_bucket") else set())
            for label, _op, _value in ref.matchers:
                if label not in allowed:
                    problems.append(f"{where}: {family} does not emit '{label}' on "
                                    f"{ref.metric} and the scrape does not add it")
    return problems


def _dynamo_scrape_problems(service: ServiceSpec,
                            reads: list[tuple[Role, str, SeriesRef]]) -> list[str]:
    """A Dynamo pool's series exist in a running frontend's or worker's scrape, with every
    engine-side label the selector uses."""
    scrapes = {name: scrape(LISTS / f"dynamo_scrape_{name}_under_load.txt")
               for name in ("frontend", "prefill_worker", "decode_worker")}
    problems = []
    for role, _expr, ref in reads:
        if ref.source in ("gpu", "tgt") or ref.optional:
            continue
        process = "frontend" if ref.source == "fe" else f"{role.value}_worker"
        seen = scrapes[process].get(ref.metric)
        if seen is None:
            problems.append(f"{service.name}/{role.value}: {ref.metric} is not in a running "
                            f"Dynamo {process}'s scrape")
            continue
        for label, _op, _value in ref.matchers:
            if label in service.scrape_labels or label == "le":
                continue
            if seen.labels is not None and label not in seen.labels:
                problems.append(f"{service.name}/{role.value}: a running {process} emits "
                                f"{ref.metric} without '{label}'")
    return problems


def test_every_series_read_exists_in_the_release_with_its_type_and_labels(
        example: tuple[str, Spec], lists: dict[str, dict[str, Exposed]]) -> None:
    _, spec = example
    for service in spec.services:
        reads = _reads(service)
        assert reads
        assert reference_problems(service, reads, lists) == []
        if service.engine is Engine.DYNAMO:
            assert _dynamo_scrape_problems(service, reads) == []


def test_a_selector_on_a_label_nothing_provides_is_found(
        example: tuple[str, Spec], lists: dict[str, dict[str, Exposed]]) -> None:
    """The check is real: the old Dynamo frontend selector (dynamo_namespace), a gauge read
    through rate() and a counter without _total are each reported."""
    _, spec = example
    service = spec.services[0]
    role, expr, ref = next(r for r in _reads(service) if r[2].source in ("eng", "fe"))
    bad_label = SeriesRef(ref.metric, (*ref.matchers, ("dynamo_namespace", "=", "x")),
                          ref.source, ref.optional)
    assert any("dynamo_namespace" in p for p in
               reference_problems(service, [(role, expr, bad_label)], lists))
    gauge = next(r for r in _reads(service) if not _through_rate(r[1], r[2].metric)
                 and r[2].metric != "up" and family_of(r[2].metric) != "dcgm")
    assert any("gauge read through rate" in p for p in reference_problems(
        service, [(gauge[0], f"rate({gauge[2].selector()}[5m])", gauge[2])], lists))
    counter = next(r for r in _reads(service) if r[2].metric.endswith("_total"))
    renamed = SeriesRef(counter[2].metric.removesuffix("_total"), counter[2].matchers,
                        counter[2].source, False)
    assert any("not an exposed series" in p for p in reference_problems(
        service, [(counter[0], counter[1].replace(counter[2].metric, renamed.metric),
                   renamed)], lists))


def test_the_lists_are_read(lists: dict[str, dict[str, Exposed]]) -> None:
    assert lists["vllm"]["vllm:request_success_total"].labels == {
        "model_name", "engine", "finished_reason"}
    assert lists["vllm"]["vllm:num_requests_waiting"].type == "gauge"
    assert lists["sglang"]["sglang:num_queue_reqs"].labels is not None
    assert "priority" in lists["sglang"]["sglang:num_queue_reqs"].labels  # type: ignore[operator]
    frontend = lists["dynamo"]["dynamo_frontend_time_to_first_token_seconds_bucket"]
    assert frontend.type == "histogram" and "dynamo_namespace" not in (frontend.labels or ())
    worker = lists["dynamo"]["dynamo_component_inflight_requests"]
    assert {"dynamo_namespace", "dynamo_component"} <= (worker.labels or frozenset())


def test_shared_folder_resolves_from_a_worktree() -> None:
    # Tests read ../shared relative to the repository (or PDSCALE_SHARED).
    assert isinstance(SHARED, Path)
