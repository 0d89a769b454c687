"""pdscale_data_staleness_seconds says when the controller has no data at all: an unknown age
of the engine samples keeps growing from the last one known (PDScaleControlPlaneDegraded fires
on it), never the last good age frozen."""

from __future__ import annotations

from pdscale.spec import Role, parse_spec
from pdscale.telemetry import ControllerTelemetry, Signal

SPEC = parse_spec("""
version: 1
services:
  - name: chat
    namespace: llm
    engine: vllm
    model_name: llama
    slo: {ttft_p95_s: 0.5, itl_p95_s: 0.05}
    pools:
      prefill: {target: {name: chat-prefill}, max_replicas: 4}
      decode: {target: {name: chat-decode}, max_replicas: 4}
""")
P = ("chat", Role.PREFILL)
D = ("chat", Role.DECODE)


def _ages(t: ControllerTelemetry) -> dict[tuple[str, str], float]:
    out = {}
    for line in t.render().decode().splitlines():
        if line.startswith("pdscale_data_staleness_seconds{"):
            labels = dict(part.split("=", 1) for part in
                          line[line.index("{") + 1:line.index("}")].split(","))
            out[(labels["pdscale_pool"].strip('"'), labels["signal"].strip('"'))] = \
                float(line.rsplit(" ", 1)[1])
    return out


def test_an_unknown_sample_age_grows_from_the_last_one_known() -> None:
    t = ControllerTelemetry(SPEC)
    t.record_staleness(P, Signal.SAMPLE_AGE_S, 4.0, now_s=100.0)
    t.record_staleness(P, Signal.TTFT_P95_S, 12.0, now_s=100.0)
    assert _ages(t) == {("prefill", "sample_age_s"): 4.0, ("prefill", "ttft_p95_s"): 12.0}
    # Prometheus unreachable from 115 s on: no age read, and none frozen at 4 s.
    t.record_staleness(P, Signal.SAMPLE_AGE_S, None, now_s=115.0)
    t.record_staleness(P, Signal.TTFT_P95_S, None, now_s=115.0)  # no sample, no age
    assert _ages(t) == {("prefill", "sample_age_s"): 19.0}
    t.record_staleness(P, Signal.SAMPLE_AGE_S, None, now_s=700.0)
    assert _ages(t) == {("prefill", "sample_age_s"): 604.0}  # over the critical 600 s
    t.record_staleness(P, Signal.SAMPLE_AGE_S, 3.0, now_s=715.0)  # data back
    assert _ages(t) == {("prefill", "sample_age_s"): 3.0}


def test_no_data_from_the_start_counts_from_the_first_tick() -> None:
    t = ControllerTelemetry(SPEC)
    t.record_staleness(D, Signal.SAMPLE_AGE_S, None, now_s=50.0)
    t.record_staleness(D, Signal.SAMPLE_AGE_S, None, now_s=250.0)
    assert _ages(t) == {("decode", "sample_age_s"): 200.0}


def test_a_failed_source_makes_every_reporting_pool_age() -> None:
    t = ControllerTelemetry(SPEC)
    t.record_staleness(P, Signal.SAMPLE_AGE_S, 2.0, now_s=0.0)
    t.record_staleness(D, Signal.SAMPLE_AGE_S, 5.0, now_s=0.0)
    t.record_staleness(D, Signal.ITL_P95_S, 7.0, now_s=0.0)
    t.staleness_unknown(300.0)
    assert _ages(t) == {("prefill", "sample_age_s"): 302.0,
                        ("decode", "sample_age_s"): 305.0, ("decode", "itl_p95_s"): 7.0}
    # A source that never reports ages (the simulator's) gets no series from it.
    quiet = ControllerTelemetry(SPEC)
    quiet.staleness_unknown(300.0)
    assert _ages(quiet) == {}
