"""Live mode's request spans (``simulator._livespans``): each pod ends one vLLM-shaped span a
request, and the OTLP store reads them back as the simulator measured them."""

from __future__ import annotations

import numpy as np
import pytest
from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from pdscale.simulator import EventSimulator, synthetic_trace
from pdscale.simulator._live import LiveCluster
from pdscale.simulator._livespans import SpanExport
from pdscale.simulator._simulate import SimOptions, prepare
from pdscale.spec import Role, load_spec
from pdscale.telemetry import OtlpStore, Signal
from tests.conftest import ROOT
from tests.telemetry.otlp_fixtures import REFERENCE

T0 = 1_700_000_000.0


def test_each_pod_ends_a_vllm_span_a_request_that_the_store_reads_back() -> None:
    spec = load_spec(ROOT / "examples" / "vllm.yaml")
    service = spec.services[0]
    prepared = prepare(spec, SimOptions(duration_s=300, cold_start_s=20, mode="event"))
    sim = EventSimulator(prepared.setup, synthetic_trace(duration_s=300, mean_rps=8, seed=5))
    cluster = LiveCluster.for_service(sim, service, speed=10.0)
    memory = InMemorySpanExporter()
    cluster.spans = SpanExport(sim, endpoint="unused", namespace=service.namespace,
                               pod_prefix=cluster.pod_prefix, speed=10.0,
                               processor=SimpleSpanProcessor(memory))
    cluster.start(0.0)
    for wall in np.arange(1.0, 24.0, 1.0):  # 230 simulated seconds, stepped as serve_live does
        cluster.step(float(wall))
    spans = list(memory.get_finished_spans())
    first = np.flatnonzero(~np.isnan(sim.first_token))
    done = np.flatnonzero(~np.isnan(sim.finish))
    assert len(done) > 500
    # One span per request per pool, none twice, none before its time.
    assert cluster.spans.spans == {Role.PREFILL: len(first), Role.DECODE: len(done)}
    assert len(spans) == len(first) + len(done)
    ids = [(s.resource.attributes["k8s.pod.name"].rsplit("-", 1)[0],
            s.attributes["gen_ai.request.id"]) for s in spans]
    assert len(set(ids)) == len(ids)
    # vLLM's span: its name, and every attribute vLLM writes on a prefill pod's span.
    vllm = REFERENCE["vllm"]
    required = {k for k, v in vllm["attributes"].items() if not v.startswith("optional")}
    prefill = [s for s in spans if s.resource.attributes["k8s.pod.name"].startswith(
        service.pools[Role.PREFILL].target.name + "-")]
    assert prefill and all(s.name == vllm["span_name"] for s in spans)
    assert required <= set(prefill[0].attributes)
    # The store reads the spans as the simulator measured: TTFT from arrival to the first
    # token, at the prefill pool; the decode pool's mean output length.
    store = OtlpStore(spec, started_s=T0 - 600)
    got = store.ingest_traces(encode_spans(spans), now_s=max(s.end_time for s in spans) / 1e9)
    assert got.accepted == len(spans) and not got.dropped
    at = max(s.end_time for s in spans) / 1e9
    row = store.read(spec, [Signal.TTFT_P50_S, Signal.TTFT_QUEUE_P95_S,
                            Signal.TTFT_TRANSFER_P95_S, Signal.GENERATION_TOKENS_PER_S,
                            Signal.REQUEST_RATE], at_s=at)
    key = (service.name, Role.PREFILL)
    ttft = sim.first_token[first] - sim.arrival[first]
    assert row[key][Signal.TTFT_P50_S].value == pytest.approx(float(np.median(ttft)), rel=0.05)
    assert row[key][Signal.TTFT_TRANSFER_P95_S].value > 0  # the KV transfer is in TTFT
    dec = row[(service.name, Role.DECODE)]
    assert dec[Signal.GENERATION_TOKENS_PER_S].value / dec[Signal.REQUEST_RATE].value == \
        pytest.approx(float(sim.output[done].mean()), rel=0.05)
