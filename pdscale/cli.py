"""The ``pdscale`` command line (entry point ``pdscale.cli:run``); the commands live in
``pdscale._cli``, one module each."""

from __future__ import annotations

import contextlib
import os
import sys
from typing import NoReturn

from pdscale._cli import build_parser, main
from pdscale._cli._common import EXIT_INTERRUPTED

__all__ = ["build_parser", "main", "run"]


def run() -> NoReturn:
    """Run :func:`main` on the process's arguments and exit with its code; 130 after Ctrl-C.

    CPython 3.11 ends the process by SIGINT at exit once a KeyboardInterrupt has been raised
    inside ``exec`` of a string (``dataclasses`` builds methods that way while a module
    imports), even when the interrupt was caught and reported. After Ctrl-C the process
    therefore flushes its output and leaves with 130 directly."""
    try:
        code = main()
    except KeyboardInterrupt:  # Ctrl-C landing between the command's return and the exit
        code = EXIT_INTERRUPTED
    if code == EXIT_INTERRUPTED:
        for stream in (sys.stdout, sys.stderr):
            with contextlib.suppress(OSError, ValueError):  # closed, or a reader gone
                stream.flush()
        os._exit(code)
    sys.exit(code)


if __name__ == "__main__":  # pragma: no cover
    run()
