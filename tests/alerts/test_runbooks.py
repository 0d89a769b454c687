"""The runbooks are the alert catalog's: every alert the rules can produce has one, every
runbook is an alert that exists, the panels they cite are on the dashboards, and the committed
pages are what ``pdscale runbooks`` generates."""

from __future__ import annotations

import re
from functools import cache
from pathlib import Path

import pytest

from pdscale.alerts import (
    RUNBOOKS,
    alerting_groups,
    alerts_table,
    runbooks_page,
    with_alerts_table,
)
from pdscale.alerts._runbooks import ALERTS_TABLE_BEGIN, ALERTS_TABLE_END, summary
from pdscale.cli import main
from pdscale.dashboards import build_dashboards
from pdscale.spec import Spec, parse_spec
from tests.conftest import EXAMPLES, ROOT

DRAINS = "\ncontroller:\n  drain: {enabled: true, timeout: 2m}\n"


@cache
def _variants() -> tuple[tuple[str, Spec], ...]:
    """Every example, and the examples without a controller section with drains on (the one
    setting that adds an alert, PDScaleDrainTimingOut, and a panel)."""
    out = []
    for path in EXAMPLES:
        text = path.read_text()
        out.append((path.stem, parse_spec(text)))
        if not re.search(r"^controller:", text, flags=re.MULTILINE):
            out.append((f"{path.stem}+drain", parse_spec(text + DRAINS)))
    return tuple(out)


def _rules(spec: Spec) -> list[dict[str, object]]:
    return [r for g in alerting_groups(spec) for r in g["rules"]]


def _produced() -> dict[str, set[tuple[str, str]]]:
    """Alert name -> the (label, value) pairs its rules carry, over every variant."""
    out: dict[str, set[tuple[str, str]]] = {}
    for _, spec in _variants():
        for rule in _rules(spec):
            labels = rule["labels"]
            assert isinstance(labels, dict)
            out.setdefault(str(rule["alert"]), set()).update(labels.items())
    return out


def test_the_committed_runbooks_page_is_generated() -> None:
    committed = (ROOT / "docs" / "runbooks.md").read_text()
    assert committed == runbooks_page(), (
        "docs/runbooks.md differs from the alert catalog: edit pdscale/alerts/_runbooks.py and "
        "regenerate with `.venv/bin/pdscale runbooks --out docs/runbooks.md`")


def test_the_committed_alert_table_is_generated() -> None:
    committed = (ROOT / "docs" / "alerts.md").read_text()
    assert committed == with_alerts_table(committed), (
        "the alert table of docs/alerts.md differs from the alert catalog: edit "
        "pdscale/alerts/_runbooks.py and regenerate with `.venv/bin/pdscale runbooks --table "
        "--out docs/alerts.md`")


@pytest.mark.parametrize("example", EXAMPLES, ids=[p.stem for p in EXAMPLES])
def test_every_alert_of_an_example_has_a_runbook(example: Path) -> None:
    names = {str(r["alert"]) for r in _rules(parse_spec(example.read_text()))}
    assert sorted(names - {b.alert for b in RUNBOOKS}) == []


def test_every_runbook_is_an_alert_the_rules_produce() -> None:
    produced = _produced()
    assert sorted({b.alert for b in RUNBOOKS} - set(produced)) == []
    assert sorted(set(produced) - {b.alert for b in RUNBOOKS}) == []
    assert len(RUNBOOKS) == len({b.alert for b in RUNBOOKS}), "one runbook per alert name"


def test_every_case_is_a_label_value_the_rules_produce() -> None:
    produced = _produced()
    for book in RUNBOOKS:
        assert bool(book.cases) == (book.case_label is not None), book.alert
        for case in book.cases:
            assert (book.case_label, case.value) in produced[book.alert], (book.alert, case)


def test_each_stage_has_its_advice() -> None:
    """Every TTFT stage points somewhere different: each has its own case."""
    (book,) = [b for b in RUNBOOKS if b.alert == "LLMTimeToFirstTokenStageHigh"]
    stages = {v for k, v in _produced()[book.alert] if k == "stage"}
    assert stages == {c.value for c in book.cases}


def test_each_rule_carries_its_runbooks_summary() -> None:
    for _, spec in _variants():
        for rule in _rules(spec):
            labels, annotations = rule["labels"], rule["annotations"]
            assert isinstance(labels, dict) and isinstance(annotations, dict)
            case = labels.get("stage") or labels.get("signal_group")
            assert annotations["summary"] == summary(str(rule["alert"]), case)


def _panel_titles(model: dict[str, object]) -> set[str]:
    panels = list(model.get("panels", []))  # type: ignore[call-overload]
    titles = set()
    while panels:
        panel = panels.pop(0)
        panels.extend(panel.get("panels", []))
        titles.add(str(panel.get("title", "")))
    return titles


def test_every_cited_panel_is_on_its_dashboard() -> None:
    """Panels and rows, by the dashboard title after the prefix, over every variant (a panel
    that only some specs get, like the drain panel, is on the dashboards of one of them)."""
    boards: dict[str, set[str]] = {}
    for _, spec in _variants():
        prefix = f"{spec.dashboards.title_prefix} / "
        for doc in build_dashboards(spec):
            assert doc.title.startswith(prefix)
            boards.setdefault(doc.title[len(prefix):], set()).update(_panel_titles(doc.model))
    cited = [(book.alert, panel) for book in RUNBOOKS
             for panel in book.panels + tuple(p for c in book.cases for p in c.panels)]
    assert len(cited) > 20
    missing = [(alert, p.dashboard, p.title) for alert, p in cited
               if p.title not in boards.get(p.dashboard, set())]
    assert missing == [], f"cited panels that no dashboard has: {missing}"


def _prose(book: object) -> list[str]:
    from pdscale.alerts import Runbook

    assert isinstance(book, Runbook)
    return [book.summary, book.meaning, book.causes, book.action, *book.notes,
            *(c.text for c in book.cases)]


def test_prose_cites_panels_only_through_the_panel_lists() -> None:
    """No *italic* panel title in the text (the checked panel lists carry them), and every
    alert the text names in code is one with a runbook."""
    names = {b.alert for b in RUNBOOKS}
    for book in RUNBOOKS:
        for text in _prose(book):
            assert "*" not in re.sub(r"`[^`]*`", "", text), (book.alert, text)
            for cited in re.findall(r"`((?:LLM|PDScale)[A-Z]\w+)`", text):
                assert cited in names, (book.alert, cited)


def test_runbook_anchors_keep_the_alert_names() -> None:
    """runbook_url points at docs/runbooks.md#<lower-cased alert name>: one '## name' each."""
    headings = [line[3:] for line in runbooks_page().splitlines() if line.startswith("## ")]
    assert headings == [b.alert for b in RUNBOOKS]


def test_the_command_prints_and_writes_the_pages(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["runbooks"]) == 0
    assert capsys.readouterr().out == runbooks_page()
    assert main(["runbooks", "--table"]) == 0
    assert capsys.readouterr().out == alerts_table()
    page = tmp_path / "runbooks.md"
    assert main(["runbooks", "--out", str(page)]) == 0
    assert page.read_text() == runbooks_page()
    alerts = tmp_path / "alerts.md"
    alerts.write_text(f"# Alerts\n\nprose\n\n{ALERTS_TABLE_BEGIN}\nstale\n{ALERTS_TABLE_END}\n\n"
                      "more prose\n")
    assert main(["runbooks", "--table", "--out", str(alerts)]) == 0
    assert alerts.read_text() == (f"# Alerts\n\nprose\n\n{ALERTS_TABLE_BEGIN}\n\n"
                                  f"{alerts_table()}\n{ALERTS_TABLE_END}\n\nmore prose\n")


def test_the_table_needs_its_markers(tmp_path: Path,
                                     capsys: pytest.CaptureFixture[str]) -> None:
    alerts = tmp_path / "alerts.md"
    alerts.write_text("# Alerts\n\nno markers\n")
    assert main(["runbooks", "--table", "--out", str(alerts)]) == 2
    assert "markers" in capsys.readouterr().err
    assert alerts.read_text() == "# Alerts\n\nno markers\n"
    assert main(["runbooks", "--table", "--out", str(tmp_path / "none.md")]) == 2
