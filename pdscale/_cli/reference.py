"""``pdscale spec-reference``: every field of a spec, as markdown."""

from __future__ import annotations

import argparse
from typing import Any

from pdscale._cli._common import EXIT_OK


def _cmd_spec_reference(args: argparse.Namespace) -> int:
    from pdscale._reference import spec_reference

    print(spec_reference(), end="")
    return EXIT_OK


def register(sub: Any) -> None:
    """Add this module's command(s) to the ``pdscale`` parser."""
    p = sub.add_parser("spec-reference", help="print the spec reference (markdown)",
                       description="Every field of a spec file, generated from the models "
                                   "pdscale validates against (docs/spec-reference.md).")
    p.set_defaults(func=_cmd_spec_reference)
