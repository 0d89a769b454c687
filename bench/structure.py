"""The code's structural targets, measured on the tree.

    .venv/bin/python bench/structure.py

Functions over 80 lines and modules over 600 lines in pdscale/controller/, pdscale/simulator/
and pdscale/'s own modules; `from pdscale.<part>._private import` across parts outside a part's
own __init__; the decision core (the modules that size a pool) under 700 lines, docstrings
included, with no function over 60. The capacity arithmetic written once is a test
(tests/controller/test_perf.py). Prints a table and writes bench/results/structure.json.
"""

from __future__ import annotations

import ast
import json
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
SIZED = ("controller", "simulator", "pdscale")
SUBPACKAGES = ("telemetry", "forecasting", "controller", "alerts", "dashboards", "simulator")
"""pdscale's parts; a module of pdscale/ outside them belongs to the part called pdscale."""
CORE = ("_model", "_queueing")
"""The decision core, in pdscale/controller/: the policy (what a decision reads, and its
construction from a spec) and the queueing model."""
CORE_LINES, CORE_FUNCTION_LINES = 700, 60


def _functions(tree: ast.AST, longer_than: int) -> list[tuple[int, str, int]]:
    """(line, name, lines) of the functions over ``longer_than`` lines."""
    out = []
    for node in ast.walk(tree):
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            lines = (node.end_lineno or node.lineno) - node.lineno + 1
            if lines > longer_than:
                out.append((node.lineno, node.name, lines))
    return out


def core(root: Path = ROOT) -> dict[str, Any]:
    """The decision core's size: its lines, docstrings included, and its long functions."""
    lines, long_functions = 0, []
    for name in CORE:
        path = root / "pdscale" / "controller" / f"{name}.py"
        text = path.read_text()
        lines += text.count("\n")
        long_functions += [f"{path.relative_to(root).as_posix()}:{at} {fn} ({n})"
                           for at, fn, n in _functions(ast.parse(text), CORE_FUNCTION_LINES)]
    return {"modules": [f"pdscale/controller/{n}.py" for n in CORE], "lines": lines,
            "functions_over_60_lines": long_functions}


def _part(module: list[str]) -> str:
    """The part a dotted module path (split) belongs to: a subpackage of pdscale, or pdscale."""
    return module[1] if len(module) > 1 and module[1] in SUBPACKAGES else "pdscale"


def measure(root: Path = ROOT) -> dict[str, list[str]]:
    long_functions, long_modules, private = [], [], []
    for path in sorted((root / "pdscale").rglob("*.py")):
        rel = path.relative_to(root).as_posix()
        package = _part(list(path.relative_to(root).with_suffix("").parts))
        text = path.read_text()
        tree = ast.parse(text)
        if package in SIZED:
            if text.count("\n") > 600:
                long_modules.append(f"{rel} ({text.count(chr(10))} lines)")
            long_functions += [f"{rel}:{at} {fn} ({n})" for at, fn, n in _functions(tree, 80)]
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom) and node.module:
                parts = node.module.split(".")
                if parts[0] == "pdscale" and _part(parts) != package and \
                        any(p.startswith("_") for p in parts[1:]):
                    private.append(f"{rel}:{node.lineno} from {node.module}")
    return {"functions_over_80_lines": long_functions, "modules_over_600_lines": long_modules,
            "private_imports_across_packages": private}


def main() -> int:
    found = measure()
    print(f"{'target':<36}{'count':>6}")
    for name, items in found.items():
        print(f"{name:<36}{len(items):>6}")
        for item in items:
            print(f"    {item}")
    decision = core()
    print(f"{'decision core lines':<36}{decision['lines']:>6}  (target under {CORE_LINES})")
    for item in decision["functions_over_60_lines"]:
        print(f"    {item}")
    out = ROOT / "bench" / "results" / "structure.json"
    out.write_text(json.dumps({"bench": "structure", **found, "decision_core": decision,
                               "targets": {**{k: 0 for k in found},
                                           "decision_core_lines": CORE_LINES,
                                           "decision_core_functions_over_60_lines": 0}},
                              indent=2) + "\n")
    print(f"wrote {out.relative_to(ROOT)}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
