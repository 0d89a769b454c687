"""The code's structural targets, measured on the tree.

    .venv/bin/python bench/structure.py

Functions over 80 lines and modules over 600 lines in pdscale/controller/, pdscale/simulator/
and pdscale/'s own modules; `from pdscale.<part>._private import` across parts outside a part's
own __init__. The capacity arithmetic written once is a test (tests/controller/test_perf.py).
Prints a table and writes bench/results/structure.json.
"""

from __future__ import annotations

import ast
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SIZED = ("controller", "simulator", "pdscale")
SUBPACKAGES = ("telemetry", "forecasting", "controller", "alerts", "dashboards", "simulator")
"""pdscale's parts; a module of pdscale/ outside them belongs to the part called pdscale."""


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
            for node in ast.walk(tree):
                if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                    lines = (node.end_lineno or node.lineno) - node.lineno + 1
                    if lines > 80:
                        long_functions.append(f"{rel}:{node.lineno} {node.name} ({lines})")
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
    out = ROOT / "bench" / "results" / "structure.json"
    out.write_text(json.dumps({"bench": "structure", **found,
                               "targets": {k: 0 for k in found}}, indent=2) + "\n")
    print(f"wrote {out.relative_to(ROOT)}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
