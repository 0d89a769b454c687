"""The ``pdscale`` command line (entry point ``pdscale.cli:main``); the commands live in
``pdscale._cli``, one module each."""

from __future__ import annotations

import sys

from pdscale._cli import build_parser, main

__all__ = ["build_parser", "main"]

if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
