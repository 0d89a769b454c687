"""Readers of shared/reference/engine-metrics/: the metrics each engine's release defines (type,
exposed series, labels) and the series a running Dynamo frontend and workers exposed."""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path

SGLANG_L = frozenset({"model_name", "engine_type", "tp_rank", "pp_rank", "moe_ep_rank",
                      "dp_rank", "priority"})
"""SGLang's collector labels 'L' (its list's header)."""
DCGM_LABELS = frozenset({"gpu", "UUID", "modelName", "Hostname", "hostname", "device",
                         "pci_bus_id", "namespace", "pod", "container"})
"""DCGM exporter labels with its Kubernetes pod mapping (shared/REFERENCE.md §1)."""
DYNAMO_FRONTEND_LABELS = frozenset({"model"})
DYNAMO_REQUEST_LABELS = frozenset({"model", "endpoint", "request_type", "status",
                                   "error_type"})


@dataclass
class Exposed:
    """One exposed series name: the type of the metric behind it and the labels it carries
    (None: the list does not say, so labels are not checked)."""

    name: str
    type: str
    labels: frozenset[str] | None
    sources: set[str] = field(default_factory=set)


def _words(text: str) -> set[str]:
    return set(re.findall(r"[A-Za-z_][A-Za-z0-9_]*", text))


def _labels(engine: str, text: str) -> frozenset[str] | None:
    text = text.strip()
    if engine == "vllm":
        if "subsystem labels" in text or not text.startswith("[") or "self." in text:
            return None
        return frozenset(_words(text))
    if engine == "sglang":
        if not (text.startswith("L") or text.startswith("[L")):
            return None
        return SGLANG_L | frozenset(_words(text) - {"L"})
    return None


def _tabular(path: Path, engine: str) -> dict[str, Exposed]:
    out: dict[str, Exposed] = {}
    for line in path.read_text().splitlines():
        if not line or line.startswith("#"):
            continue
        cols = line.split("\t")
        if len(cols) < 4:
            continue
        _defined, kind, exposed, labels = cols[:4]
        for name in exposed.split(","):
            out[name.strip()] = Exposed(name.strip(), kind, _labels(engine, labels),
                                        {"release list"})
    return out


_SERIES = re.compile(r"^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{([^}]*)\})?\s")
_TYPE = re.compile(r"^# TYPE (\S+) (\S+)")


def scrape(path: Path) -> dict[str, Exposed]:
    """Series names of a text exposition, with the type of their family and their labels."""
    types: dict[str, str] = {}
    out: dict[str, Exposed] = {}
    for line in path.read_text().splitlines():
        found = _TYPE.match(line)
        if found:
            types[found.group(1)] = found.group(2)
            continue
        found = _SERIES.match(line)
        if not found:
            continue
        name = found.group(1)
        family = re.sub(r"_(bucket|sum|count)$", "", name)
        kind = types.get(name) or types.get(family, "untyped")
        labels = frozenset(re.findall(r'(\w+)="', found.group(3) or ""))
        prev = out.get(name)
        merged = labels if prev is None or prev.labels is None else prev.labels | labels
        out[name] = Exposed(name, kind, merged, {path.name})
    return out


def _dynamo(root: Path) -> dict[str, Exposed]:
    out: dict[str, Exposed] = {}
    section_a = True
    for line in (root / "real_metrics_dynamo.txt").read_text().splitlines():
        if line.startswith("# Section B"):
            section_a = False
        if not section_a or not line or line.startswith("#"):
            continue
        name, kind = line.split("\t")[:2]
        labels = DYNAMO_REQUEST_LABELS if name.startswith(
            ("dynamo_frontend_requests_total", "dynamo_frontend_requests_started_total")) \
            else DYNAMO_FRONTEND_LABELS
        names = [f"{name}_bucket", f"{name}_sum", f"{name}_count"] if kind == "histogram" \
            else [name]
        for n in names:
            out[n] = Exposed(n, kind, labels, {"release list"})
    # What a running frontend and workers exposed (names, types and labels as scraped).
    for part in ("frontend", "prefill_worker", "decode_worker"):
        for name, exposed in scrape(root / f"dynamo_scrape_{part}_under_load.txt").items():
            if name in out:
                out[name].sources |= exposed.sources
            else:
                out[name] = exposed
    return out


def _dcgm(root: Path) -> dict[str, Exposed]:
    out = {}
    for line in (root / "real_metrics_dcgm.txt").read_text().splitlines():
        if line.startswith("DCGM_"):
            name, kind = line.split("\t")[:2]
            out[name] = Exposed(name, kind, DCGM_LABELS, {"default counters"})
    return out


def _tgi(root: Path) -> dict[str, Exposed]:
    out = {}
    for line in (root / "real_metrics_tgi.txt").read_text().splitlines():
        if line.startswith("tgi_"):
            out[line.strip()] = Exposed(line.strip(), "unverified", None, {"dashboard"})
    return out


def released(root: Path) -> dict[str, dict[str, Exposed]]:
    """Per engine family ('vllm', 'sglang', 'dynamo', 'dcgm', 'tgi'): exposed name -> facts."""
    return {
        "vllm": _tabular(root / "real_metrics_vllm.txt", "vllm"),
        "sglang": _tabular(root / "real_metrics_sglang.txt", "sglang"),
        "dynamo": _dynamo(root),
        "dcgm": _dcgm(root),
        "tgi": _tgi(root),
    }


def family_of(metric: str) -> str | None:
    for prefix, family in (("vllm:", "vllm"), ("sglang:", "sglang"), ("dynamo_", "dynamo"),
                           ("DCGM_", "dcgm"), ("tgi_", "tgi")):
        if metric.startswith(prefix):
            return family
    return None
