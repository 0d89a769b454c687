"""What every command shares: exit codes, loading a spec once, argument types, progress."""

from __future__ import annotations

import argparse
import re
import sys
import time
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path

from pdscale.spec import Role, Spec, SpecError, SpecProblem, load_spec

EXIT_OK, EXIT_FAILURE, EXIT_BAD_INPUT = 0, 1, 2

EXIT_INTERRUPTED = 130
"""Ctrl-C: 128 + SIGINT, as a shell reports a command the signal ended."""


def interrupted(out: str, *, wrote: bool) -> int:
    """Report Ctrl-C in one line (no traceback) and return the exit code for it."""
    print(f"pdscale: interrupted; {f'wrote {out} in full' if wrote else 'nothing written'}",
          file=sys.stderr)
    return EXIT_INTERRUPTED


@contextmanager
def held_interrupt() -> Iterator[list[int]]:
    """Hold Ctrl-C while the output is written and reported, so the folder is written whole
    (``write_tree`` stages it and renames it into place, which an interrupt between the two
    would leave half-done) and the message about it is true: yields a list that holds the
    signal if one came, for the caller to report afterwards."""
    import signal
    import threading

    caught: list[int] = []
    if threading.current_thread() is not threading.main_thread():
        yield caught
        return
    previous = signal.signal(signal.SIGINT, lambda signum, _frame: caught.append(signum))
    try:
        yield caught
    finally:
        signal.signal(signal.SIGINT, previous)


def write_output(out: str, files: Mapping[str, str | bytes], report: Callable[[], None]
                 ) -> int:
    """Write ``files`` as the ``--out`` folder, then ``report`` what was done, with Ctrl-C held
    until both are (:func:`held_interrupt`). EXIT_OK; EXIT_FAILURE when the folder cannot be
    written (nothing changed); EXIT_INTERRUPTED, once the output is whole, after Ctrl-C."""
    from pdscale._io import OutputError, write_tree

    with held_interrupt() as caught:
        try:
            write_tree(Path(out), files)
        except OutputError as exc:
            err(str(exc))
            return EXIT_FAILURE
        report()
    return interrupted(out, wrote=True) if caught else EXIT_OK


def err(message: str) -> None:
    print(f"pdscale: error: {message}", file=sys.stderr)


def example_spec(name: str) -> str:
    """The shipped example spec ``examples/<name>``: beside the working directory when it has
    one, else in the checkout pdscale runs from (a command's default --spec works from any
    folder), else the relative path (load_checked then says it is missing and to pass
    --spec)."""
    local = Path("examples") / name
    if local.is_file():
        return str(local)
    shipped = Path(__file__).resolve().parents[2] / "examples" / name
    return str(shipped) if shipped.is_file() else str(local)


def load_checked(path: str) -> Spec | None:
    """The spec, validated once for everything later stages need, as ``pdscale validate``
    does: its schema and cross-field checks, then what only other packages know (each pool's
    performance profile, alert thresholds whose generated tests can tell the tiers apart), so
    no command accepts a spec that ``validate`` refuses or fails on it after minutes of work."""
    try:
        spec = load_spec(path)
        problems = profile_problems(spec)
        if problems:
            raise SpecError(path, problems)
    except SpecError as exc:
        print(str(exc), file=sys.stderr)
        return None
    from pdscale.alerts import ScenarioError, alert_files

    try:
        alert_files(spec, source=Path(path).name)
    except ScenarioError as exc:
        print(f"{path}: 1 problem(s) in the spec\n  - alerts.thresholds: expected alerts whose "
              f"generated promtool tests can tell the tiers apart; got: {exc}", file=sys.stderr)
        return None
    return spec


def profile_problems(spec: Spec) -> list[SpecProblem]:
    from pdscale.controller import ProfileError, load_profile

    problems = []
    for i, service in enumerate(spec.services):
        for role, pool in service.pools.items():
            try:
                load_profile(pool.profile)
            except ProfileError as exc:
                problems.append(SpecProblem(
                    f"services[{i}].pools.{role.value}.profile",
                    "a shipped profile name or the path of a profile YAML file",
                    f"unknown profile {pool.profile!r}", str(exc).split(": ", 1)[-1]))
    return problems


class Progress:
    """A progress bar on stderr for work that takes more than a couple of seconds."""

    def __init__(self, label: str) -> None:
        self.label = label
        self.started = time.perf_counter()
        self.shown = False
        self.last = -1

    def __call__(self, fraction: float) -> None:
        if time.perf_counter() - self.started < 2.0:
            return
        percent = int(fraction * 100)
        if percent == self.last:
            return
        self.last = percent
        bar = "#" * (percent // 4) + "." * (25 - percent // 4)
        end = "\r" if sys.stderr.isatty() else "\n"
        if sys.stderr.isatty() or percent % 10 == 0:
            print(f"{self.label} [{bar}] {percent:3d}%", end=end, file=sys.stderr, flush=True)
            self.shown = True

    def close(self) -> None:
        if self.shown and sys.stderr.isatty():
            print(file=sys.stderr)


def parse_failure(text: str) -> tuple[float, Role]:
    try:
        when, role = text.split(":")
        return float(when), Role(role)
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"expected SECONDS:prefill or SECONDS:decode, got {text!r}") from None


def out_ok(out: str) -> bool:
    """Check ``--out`` before the work that fills it (a simulation can take minutes)."""
    from pdscale._io import OutputError, check_target

    try:
        check_target(Path(out))
    except OutputError as exc:
        err(f"{exc}. Nothing was run.")
        return False
    return True


def fmt_s(value: float | None) -> str:
    return "n/a" if value is None else f"{value * 1000:.0f} ms" if value < 1 else f"{value:.2f} s"


def http_url(text: str) -> str:
    """An argparse type for an http(s) URL (``pdscale.spec``'s check): a URL without its
    scheme exits 2 at once instead of stopping the controller's loop later."""
    from pdscale._spec_types import check_http_url

    try:
        return check_http_url(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def parse_listen(text: str) -> tuple[str, int]:
    host, sep, port = text.rpartition(":")
    if not sep or not port.isdigit() or not 0 < int(port) < 65536:
        raise argparse.ArgumentTypeError(f"expected HOST:PORT such as 0.0.0.0:8080 or "
                                         f":8080, got {text!r}")
    return (host.strip("[]") or "0.0.0.0"), int(port)


def number(kind: str) -> Callable[[str], float]:
    """An argparse type for a finite number that is ``positive`` (> 0), ``non-negative``
    (>= 0) or a ``fraction`` (0 <= x < 1): out of range exits 2 with one line that says so."""
    import math

    def parse(text: str) -> float:
        try:
            value = float(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected a number, got {text!r}") from None
        ok = math.isfinite(value) and (
            value > 0 if kind == "positive" else value >= 0 if kind == "non-negative"
            else 0 <= value < 1)
        if not ok:
            want = {"positive": "a number > 0", "non-negative": "a number >= 0",
                    "fraction": "a fraction from 0 up to (not including) 1"}[kind]
            raise argparse.ArgumentTypeError(f"expected {want}, got {text}")
        return value

    parse.__name__ = kind  # argparse names the type in its messages
    return parse


POSITIVE, NON_NEGATIVE, FRACTION = (number(k) for k in ("positive", "non-negative",
                                                          "fraction"))


def DURATION(text: str) -> float:
    """An argparse type for a duration ("30s", "2m", "90"): seconds, at most a day."""
    from pdscale.spec import parse_duration

    try:
        value = parse_duration(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None
    if value > 86400:
        raise argparse.ArgumentTypeError(f"expected a duration of at most a day, got {text!r}")
    return float(value)


DURATION.__name__ = "duration"


def whole_number(text: str, minimum: int) -> int:
    """``text`` as a whole number of at least ``minimum``, or the error argparse shows."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"expected a whole number >= {minimum}, got {text!r}") from None
    if value < minimum:
        raise argparse.ArgumentTypeError(f"expected a whole number >= {minimum}, got {text}")
    return value


def seed(text: str) -> int:
    return whole_number(text, 0)


def count(text: str) -> int:
    """A count of at least one."""
    return whole_number(text, 1)


PROM_DURATION = re.compile(r"^([0-9]+(ms|s|m|h|d|w|y))+$")


def prom_window(text: str) -> str:
    if not PROM_DURATION.match(text) or not any(ch in "123456789" for ch in text):
        raise argparse.ArgumentTypeError(
            f"expected a Prometheus duration such as 30s, 5m or 1h30m, got {text!r}")
    return text
