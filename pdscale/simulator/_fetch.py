"""Download a public trace from its source and rebuild the files the benchmarks read.

The builders are pure functions of the downloaded bytes; the download is one injected function
(urllib by default). A trace's files are built in memory, checked against the catalog's
SHA-256 (simulator._tracedir), and only then written, each to a temporary file renamed into
place, so a failed download, a mismatch or Ctrl-C leaves the folder as it was.

Rebuilding follows the shared traces' README: Azure is copied, Mooncake is gzipped, and
ServeGen's per-client files (``chunk-N-trace.csv``: window start, rate, CV, distribution and
its two parameters, CRLF lines, no header) are concatenated with ``client_id`` N in front and
a header, and summed per window into the ``*_aggregate_rate_DERIVED.csv`` (total rate rounded
to 6 decimals, and the number of clients with a positive rate). Gzip is written at level 9
with no name and time 0, which reproduces the shared copies that were written that way
byte for byte; the hashes are of the content, which any gzip reproduces.
"""

from __future__ import annotations

import csv
import gzip
import hashlib
import io
import os
import secrets
import urllib.error
import urllib.request
import zlib
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path

from pdscale.simulator._trace import TraceError
from pdscale.simulator._tracedir import (
    BASE_URL_ENV,
    DEFAULT_BASE_URL,
    PUBLIC_TRACES,
    PublicTrace,
    TraceFile,
)

Download = Callable[[str], bytes]
"""Fetch one URL's body; raises TraceUnavailable when it cannot."""

DOWNLOAD_TIMEOUT_S = 60.0
"""Seconds a source may stay silent before its download fails (the largest is 13 MB)."""

SERVEGEN_HEADER = "client_id,window_start_s,rate_rps,cv,arrival_dist,dist_param1,dist_param2"
AGGREGATE_HEADER = "window_start_s,total_rate_rps,active_clients"


class TraceFetchError(Exception):
    """A trace could not be fetched. Give up: the source's content is not what was published
    (its hash differs), or the folder cannot be written; the message names which and what
    to do.

    Subclass :class:`TraceUnavailable`: the source could not be reached or answered an
    error; retry later, or check the base URL."""


class TraceUnavailable(TraceFetchError):
    """A source could not be downloaded (no connection, timeout, HTTP error)."""


def urllib_download(url: str, *, timeout_s: float = DOWNLOAD_TIMEOUT_S) -> bytes:
    """GET ``url`` with urllib; HTTP errors and unreachable hosts become TraceUnavailable
    naming the URL."""
    try:
        with urllib.request.urlopen(url, timeout=timeout_s) as response:
            body: bytes = response.read()
            return body
    except urllib.error.HTTPError as exc:
        raise TraceUnavailable(f"{url}: HTTP {exc.code} {exc.reason}; check the base URL "
                               f"(--base-url or ${BASE_URL_ENV}) or try again later") from exc
    except (urllib.error.URLError, TimeoutError, OSError) as exc:
        reason = getattr(exc, "reason", None) or exc
        raise TraceUnavailable(f"{url}: cannot download ({reason}); check the network and "
                               f"the base URL (--base-url or ${BASE_URL_ENV}), then try "
                               "again") from exc


# Builders -------------------------------------------------------------------------------------


def gzip_bytes(data: bytes) -> bytes:
    """Gzip at level 9 with no file name and time 0: the same bytes on every run."""
    compressor = zlib.compressobj(9, zlib.DEFLATED, 31, 9)
    return compressor.compress(data) + compressor.flush()


def servegen_client_rates(client_files: Sequence[bytes]) -> bytes:
    """ServeGen's per-client ``chunk-N-trace.csv`` files as one CSV, ``client_id`` N (the
    file's place in ``client_files``) in front of each row, LF line ends, a header."""
    out = [SERVEGEN_HEADER + "\n"]
    for client, data in enumerate(client_files):
        for line in data.decode("ascii").splitlines():
            if line.strip():
                out.append(f"{client},{line}\n")
    return "".join(out).encode("ascii")


def servegen_aggregate_rate(client_rates: bytes) -> bytes:
    """Per window: the sum of ``rate_rps`` over clients (in file order, rounded to 6
    decimals) and the number of clients with a positive rate."""
    total: dict[int, float] = {}
    active: dict[int, int] = {}
    for row in csv.DictReader(io.StringIO(client_rates.decode("ascii"))):
        window = int(row["window_start_s"])
        rate = float(row["rate_rps"])
        total[window] = total.get(window, 0.0) + rate
        active[window] = active.get(window, 0) + (rate > 0)
    lines = [AGGREGATE_HEADER] + [f"{w},{round(total[w], 6)!r},{active[w]}"
                                  for w in sorted(total)]
    return ("\n".join(lines) + "\n").encode("ascii")


def build_files(trace: PublicTrace, sources: Sequence[bytes]) -> dict[str, bytes]:
    """The files ``trace`` puts in the traces folder, as written, from its sources' bytes
    (in the order of ``trace.paths``)."""
    if len(sources) != len(trace.paths):
        raise ValueError(f"{trace.name} has {len(trace.paths)} source files, got "
                         f"{len(sources)}")
    names = [f.name for f in trace.files]
    if trace.build == "verbatim":
        return {names[0]: sources[0]}
    if trace.build == "gzip":
        return {names[0]: gzip_bytes(sources[0])}
    if trace.build == "servegen":
        rates = servegen_client_rates(sources)
        return {names[0]: gzip_bytes(rates), names[1]: servegen_aggregate_rate(rates)}
    raise ValueError(f"{trace.name}: unknown build {trace.build!r}")


def content_sha256(name: str, data: bytes) -> str:
    """SHA-256 of a file's content: decompressed first when ``name`` ends in ``.gz``."""
    return hashlib.sha256(gzip.decompress(data) if name.endswith(".gz") else data).hexdigest()


def verify(files: Iterable[TraceFile], built: Mapping[str, bytes], source: str) -> None:
    """Raise TraceFetchError unless each built file's content hash is the catalog's."""
    for file in files:
        got = content_sha256(file.name, built[file.name])
        if got != file.sha256:
            raise TraceFetchError(
                f"{file.name}: content SHA-256 {got}, expected {file.sha256}: the source "
                f"({source}) is not the published version; nothing was written. Check the "
                f"base URL (--base-url or ${BASE_URL_ENV}) serves the pinned commit")


def present(trace: PublicTrace, folder: Path) -> bool:
    """Whether every file of ``trace`` is in ``folder`` with the expected content."""
    for file in trace.files:
        path = folder / file.name
        try:
            if content_sha256(file.name, path.read_bytes()) != file.sha256:
                return False
        except (OSError, EOFError, zlib.error):
            return False
    return True


# Fetch ----------------------------------------------------------------------------------------


def _write_all(folder: Path, built: Mapping[str, bytes]) -> list[Path]:
    """Write each file to a temporary name in ``folder``, then rename them all into place;
    the temporary files are removed whatever stops it (an error, Ctrl-C)."""
    staged: dict[str, str] = {}
    try:
        for name, data in built.items():
            # O_EXCL on a random name, as mkstemp does, but with the umask's permissions
            # (mkstemp's 0600 would leave a shared traces folder unreadable to others).
            tmp = str(folder / f".{name}.{secrets.token_hex(6)}.part")
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666)
            staged[name] = tmp
            with os.fdopen(fd, "wb") as out:
                out.write(data)
        written = []
        for name, tmp in staged.items():
            os.replace(tmp, folder / name)
            written.append(folder / name)
        return written
    finally:
        for tmp in staged.values():
            if os.path.exists(tmp):
                os.unlink(tmp)


def fetch_trace(trace: str | PublicTrace, folder: Path, *, base_url: str | None = None,
                download: Download | None = None, force: bool = False,
                environ: Mapping[str, str] | None = None,
                progress: Callable[[str], None] | None = None) -> list[Path]:
    """Download ``trace`` (a short name or a :class:`PublicTrace`) from its source, rebuild
    its files, check their hashes and write them into ``folder``; returns their paths.

    ``base_url`` (else ``$PDSCALE_TRACES_BASE_URL``, else GitHub's raw files) replaces the
    host part of each source URL. A trace whose files are already there with the expected
    content is not downloaded again unless ``force``. ``progress`` receives one line a
    download. Raises TraceError for an unknown name, TraceUnavailable when a source cannot
    be downloaded, TraceFetchError when a hash differs or the folder cannot be written."""
    if isinstance(trace, str):
        if trace not in PUBLIC_TRACES:
            raise TraceError(f"unknown trace {trace!r}; use one of {', '.join(PUBLIC_TRACES)}")
        trace = PUBLIC_TRACES[trace]
    env = os.environ if environ is None else environ
    base = base_url or env.get(BASE_URL_ENV) or DEFAULT_BASE_URL
    get = download or urllib_download
    say = progress or (lambda _line: None)
    if not force and present(trace, folder):
        say(f"{trace.name}: already in {folder}, content verified")
        return [folder / f.name for f in trace.files]
    sources = []
    paths = trace.paths
    for i, path in enumerate(paths, 1):
        url = trace.url(path, base)
        say(f"{trace.name}: [{i}/{len(paths)}] {url}")
        sources.append(get(url))
    try:
        built = build_files(trace, sources)
    except (UnicodeDecodeError, ValueError, KeyError) as exc:
        raise TraceFetchError(f"{trace.name}: the downloaded files from "
                              f"{trace.url(trace.source, base)} are not in the expected "
                              f"format ({exc}); nothing was written. Check the base URL "
                              f"(--base-url or ${BASE_URL_ENV})") from exc
    verify(trace.files, built, trace.url(trace.source, base))
    try:
        folder.mkdir(parents=True, exist_ok=True)
        return _write_all(folder, built)
    except OSError as exc:
        raise TraceFetchError(f"cannot write {trace.name} into {folder}: "
                              f"{exc.strerror or exc}; pick a writable folder with --to") \
            from exc
