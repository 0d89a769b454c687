"""``pdscale spec-reference`` and ``pdscale runbooks``: the reference pages generated from the
code (every field of a spec; every alert's runbook and the alert table), as markdown."""

from __future__ import annotations

import argparse
import os
from pathlib import Path
from typing import Any

from pdscale._cli._common import EXIT_BAD_INPUT, EXIT_FAILURE, EXIT_OK, err


def _cmd_spec_reference(args: argparse.Namespace) -> int:
    from pdscale._reference import spec_reference

    print(spec_reference(), end="")
    return EXIT_OK


def _replace_file(path: Path, text: str) -> None:
    """Write ``path`` whole or not at all: a reader never sees half a page."""
    partial = path.with_name(f".{path.name}.partial")
    partial.write_text(text)
    os.replace(partial, path)


def _cmd_runbooks(args: argparse.Namespace) -> int:
    from pdscale.alerts import alerts_table, runbooks_page, with_alerts_table

    if args.out is None:
        print(alerts_table() if args.table else runbooks_page(), end="")
        return EXIT_OK
    out = Path(args.out)
    try:
        if args.table:
            try:
                text = with_alerts_table(out.read_text())
            except FileNotFoundError:
                err(f"{out} does not exist: --table --out replaces the alert table inside an "
                    "existing page (docs/alerts.md); without --out the table is printed")
                return EXIT_BAD_INPUT
            except ValueError as exc:
                err(f"{out}: {exc}")
                return EXIT_BAD_INPUT
        else:
            text = runbooks_page()
        _replace_file(out, text)
    except OSError as exc:
        err(f"cannot write {out}: {exc.strerror or exc}; check the path and its permissions")
        return EXIT_FAILURE
    return EXIT_OK


def register(sub: Any) -> None:
    """Add this module's command(s) to the ``pdscale`` parser."""
    p = sub.add_parser("spec-reference", help="print the spec reference (markdown)",
                       description="Every field of a spec file, generated from the models "
                                   "pdscale validates against (docs/spec-reference.md).")
    p.set_defaults(func=_cmd_spec_reference)

    p = sub.add_parser("runbooks", help="write the alert runbooks (markdown)",
                       description="Every alert's runbook (what it means, likely causes, what "
                                   "to do, which panels to open), generated from the alert "
                                   "catalog: docs/runbooks.md, or with --table the alert table "
                                   "of docs/alerts.md.")
    p.add_argument("--table", action="store_true",
                   help="the alert table instead of the runbooks page; with --out, replace "
                        "the table between its markers in that page and keep the rest")
    p.add_argument("--out", metavar="FILE",
                   help="write FILE instead of printing (docs/runbooks.md, or docs/alerts.md "
                        "with --table)")
    p.set_defaults(func=_cmd_runbooks)
