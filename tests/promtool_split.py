"""Run generated promtool test files one alert at a time, each against the rules it reads.

promtool evaluates every rule of a test file's rule files at every evaluation step of every
test group, whatever the group tests: a service's 69 scenarios replay its 180 rules about 1,400
times (48 s for one vLLM service). A scenario of one alert reads only that alert's rules and
the recording rules they read, so running each alert's groups against exactly those rules
checks the same expectations at a tenth of the cost. What is dropped cannot change a result:
an unrelated rule writes series no kept rule or check reads. ``promtool check rules`` still
reads the whole file, and tests/alerts/test_promtool.py runs one generated file unsplit.
"""

from __future__ import annotations

import re
import subprocess
from collections.abc import Iterable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import yaml

# The generated files are large (a megabyte a service): libyaml reads them ten times faster.
_Loader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
_Dumper = getattr(yaml, "CSafeDumper", yaml.SafeDumper)
_NAME = re.compile(r"[a-zA-Z_:][a-zA-Z0-9_:]*")


def _needed(rules: list[dict[str, Any]], exprs: Iterable[str]) -> set[int]:
    """Indices of the recording rules ``exprs`` read, directly or through one another."""
    recorded: dict[str, list[int]] = {}
    for i, rule in enumerate(rules):
        if "record" in rule:
            recorded.setdefault(rule["record"], []).append(i)
    keep: set[int] = set()
    todo = list(exprs)
    while todo:
        for name in _NAME.findall(todo.pop()):
            for i in recorded.get(name, []):
                if i not in keep:
                    keep.add(i)
                    todo.append(rules[i]["expr"])
    return keep


def _pruned(rule_doc: dict[str, Any], groups: list[dict[str, Any]]) -> dict[str, Any]:
    """``rule_doc`` keeping the alerts the test ``groups`` test and the recording rules their
    checks and those alerts read (order and rule groups as they were)."""
    alerts = {t["alertname"] for g in groups for t in g.get("alert_rule_test", [])}
    flat = [r for g in rule_doc["groups"] for r in g["rules"]]
    exprs = [r["expr"] for r in flat if r.get("alert") in alerts]
    exprs += [t["expr"] for g in groups for t in g.get("promql_expr_test", [])]
    if any("ALERTS" in e for e in exprs):  # reads other alerts' state: keep every rule
        return rule_doc
    keep_ids = {id(flat[i]) for i in _needed(flat, exprs)}
    groups = []
    for g in rule_doc["groups"]:
        rules = [r for r in g["rules"] if id(r) in keep_ids or r.get("alert") in alerts]
        if rules:
            groups.append({**g, "rules": rules})
    return {"groups": groups}


def split(tests_dir: Path, name: str, only: str | None = None) -> list[str]:
    """Write ``name``'s groups into one test file per alert (and one for checks of recording
    rules), each with its own pruned rule file beside it; their names, relative to
    ``tests_dir``. ``only``: write just the part of that alert (or ``recording``)."""
    doc = yaml.load((tests_dir / name).read_text(), _Loader)
    (rule_file,) = doc["rule_files"]
    rule_doc = yaml.load((tests_dir / rule_file).read_text(), _Loader)
    by_key: dict[str, list[dict[str, Any]]] = {}
    for group in doc["tests"]:
        alerts = sorted({t["alertname"] for t in group.get("alert_rule_test", [])})
        by_key.setdefault("+".join(alerts) or "recording", []).append(group)
    out = []
    stem = name.removesuffix(".yml")
    for i, (key, groups) in enumerate(sorted(by_key.items())):
        if only is not None and key != only:
            continue
        rules = f"{stem}.{i}-{key}.rules.yml"
        (tests_dir / rules).write_text(yaml.dump(_pruned(rule_doc, groups), Dumper=_Dumper,
                                                 sort_keys=False))
        test = f"{stem}.{i}-{key}.test.yml"
        (tests_dir / test).write_text(yaml.dump(
            {**doc, "rule_files": [rules], "tests": groups}, Dumper=_Dumper, sort_keys=False))
        out.append(test)
    return out


def run_split(promtool: str, tests_dir: Path, names: Iterable[str],
              workers: int = 4) -> list[subprocess.CompletedProcess[str]]:
    """Split each generated test file (:func:`split`) and run the parts, ``workers`` at a
    time; one completed process per part, with promtool's output."""
    parts = [part for name in names for part in split(tests_dir, name)]

    def run(part: str) -> subprocess.CompletedProcess[str]:
        # A bound on a hung promtool; a part takes seconds.
        return subprocess.run([promtool, "test", "rules", part], cwd=tests_dir,
                              capture_output=True, text=True, timeout=600, check=False)

    with ThreadPoolExecutor(workers) as pool:
        return list(pool.map(run, parts))
