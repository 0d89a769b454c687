"""Writing generated output so that a failure never leaves a half-written folder.

Everything is rendered in memory first; files go into a temporary sibling folder that is
renamed over the target at the end. A target that exists must be empty or carry the marker
file of an earlier pdscale run, so pointing ``--out`` at the wrong folder cannot delete a
user's files.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Mapping
from pathlib import Path

MARKER = ".pdscale-generated"


class OutputError(Exception):
    """The output folder cannot be written; the message says why and what to do."""


def resolved(target: Path) -> Path:
    """The folder ``target`` names, links followed: a link given as ``--out`` keeps pointing
    at the output, which is replaced where it lives (renaming the link itself would leave the
    folder it names untouched and put a real folder in its place)."""
    return Path(os.path.realpath(target))


def check_target(target: Path) -> None:
    """Raise OutputError unless ``target`` may be replaced: new, empty, or pdscale's own output
    (its marker at the top, or only pdscale-written folders in it, as an older ``generate
    all`` left them), and not the working directory or a folder holding it. Commands call
    this before long work, so a bad ``--out`` fails at once."""
    given = target
    target = resolved(Path(target))
    cwd = Path.cwd().resolve()
    if target == cwd or target in cwd.parents:
        raise OutputError(f"--out {given} is the current folder or holds it; pdscale replaces "
                          "its output folder as a whole, so choose a folder below it, e.g. "
                          "--out ./pdscale-out")
    if not target.exists():
        parent = target.parent if str(target.parent) else Path(".")
        existing = next((p for p in (parent, *parent.parents) if p.exists()), Path("."))
        if not existing.is_dir() or not os.access(existing, os.W_OK):
            raise OutputError(f"cannot create {target}: {existing} is not a writable folder; "
                              "choose another --out")
        return
    if not target.is_dir():
        raise OutputError(f"{target} exists and is not a folder; choose another --out")
    entries = list(target.iterdir())
    if (target / "up.json").exists():
        raise OutputError(f"{target} holds the state of a `pdscale up` stack (up.json); stop it "
                          f"with `pdscale down --dir {given}` or choose another --out")
    ours = MARKER in {p.name for p in entries} or all(
        p.is_dir() and (p / MARKER).exists() for p in entries)
    if entries and not ours:
        raise OutputError(
            f"{target} is not empty and was not written by pdscale; choose a new or empty "
            "folder for --out (pdscale replaces its output folder as a whole)")
    if not os.access(target.parent if str(target.parent) else Path("."), os.W_OK):
        raise OutputError(f"cannot replace {target}: its folder is not writable; choose "
                          "another --out")


def write_tree(target: Path, files: Mapping[str, str | bytes]) -> None:
    """Replace ``target`` with exactly ``files`` ({relative path: text or bytes}),
    atomically."""
    check_target(target)
    target = resolved(Path(target))
    parent = target.parent
    try:
        parent.mkdir(parents=True, exist_ok=True)
        staging = Path(tempfile.mkdtemp(prefix=f".{target.name}.", dir=parent))
    except OSError as exc:
        raise OutputError(f"cannot create a folder in {parent}: {exc.strerror}; check the path "
                          "and its permissions") from exc
    try:
        for rel, text in sorted(files.items()):
            path = staging / rel
            path.parent.mkdir(parents=True, exist_ok=True)
            if isinstance(text, bytes):
                path.write_bytes(text)
            else:
                path.write_text(text, encoding="utf-8")
        (staging / MARKER).write_text("This folder is replaced as a whole by pdscale.\n",
                                      encoding="utf-8")
        os.chmod(staging, 0o755)
        if target.exists():
            old = Path(tempfile.mkdtemp(prefix=f".{target.name}.old.", dir=parent))
            try:
                os.rename(target, old / "tree")
                try:
                    os.rename(staging, target)
                except OSError:
                    os.rename(old / "tree", target)  # put the previous output back
                    raise
            finally:
                shutil.rmtree(old, ignore_errors=True)  # the previous output, or nothing
        else:
            os.rename(staging, target)
    except OSError as exc:
        shutil.rmtree(staging, ignore_errors=True)
        raise OutputError(f"cannot write {target}: {exc.strerror}; nothing was changed") from exc
