"""``pdscale check`` on the dispersion signal: its raw series exists at any scrape interval, but
the 5 s rate behind it reads empty unless the pods are scraped every 2.5 s or less. A coarse
scrape is reported (with the fix), not passed as ok while the tail model silently stays off."""

from __future__ import annotations

from pdscale._check import CheckRow, check_spec, controller_ready, render_table
from pdscale.spec import load_spec
from tests.conftest import ROOT


def _rows(share: float | None) -> list[CheckRow]:
    spec = load_spec(ROOT / "examples" / "vllm.yaml")
    asked = []

    def query(q: str) -> list[tuple[dict[str, str], float]]:
        asked.append(q)
        if q.startswith("timestamp("):
            return [({"pod": "p-0"}, 995.0)]
        if q.startswith("min(quantile_over_time(0.5, count_over_time("):
            return [] if share is None else [({}, share)]
        return []

    rows = check_spec(spec, query, at_s=1000.0, services=[spec.services[0].name])
    assert any(q.startswith("min(quantile_over_time(") and "prompt_tokens_total" in q
               for q in asked)
    return rows


def test_a_scrape_too_coarse_for_the_dispersion_is_reported_with_its_fix() -> None:
    for share in (None, 0.0, 1.0):  # no window with a sample, or one sample (a 5 s scrape)
        rows = _rows(share)
        coarse = [r for r in rows if r.signal == "prompt_tokens_dispersion"]
        assert coarse and all(r.status == "coarse" for r in coarse)
        assert f"held {share or 0:g} sample(s)" in coarse[0].problem
        assert "tail model" in coarse[0].problem
        assert all(r.pool == "prefill" and r.needed_by == "controller (tail model)"
                   for r in coarse)
    assert "every 2.5s or less" in coarse[0].fix
    # Everything else is there: the controller runs, without the tail model.
    assert controller_ready(rows)
    assert all(r.status == "ok" for r in rows if r.signal != "prompt_tokens_dispersion"
               and r.status != "absent-optional")
    table = render_table(rows)
    assert "prompt_tokens_dispersion" in table and "held 1 sample(s)" in table
    assert f", {len(coarse)} with a problem;" in table


def test_a_stale_series_is_stale_not_coarse() -> None:
    """A series no longer scraped has no recent windows: its staleness is the problem."""
    spec = load_spec(ROOT / "examples" / "vllm.yaml")

    def query(q: str) -> list[tuple[dict[str, str], float]]:
        if q.startswith("timestamp("):
            return [({"pod": "p-0"}, 700.0)]  # 300 s old
        return []

    rows = [r for r in check_spec(spec, query, at_s=1000.0, services=[spec.services[0].name])
            if r.signal == "prompt_tokens_dispersion"]
    assert rows and all(r.status == "stale" for r in rows)


def test_a_fine_scrape_passes() -> None:
    for share in (2.0, 5.0):  # every 2.5 s, every second
        rows = [r for r in _rows(share) if r.signal == "prompt_tokens_dispersion"]
        assert rows and all(r.status == "ok" and r.problem is None for r in rows)
