"""The public traces by short name, the folder that holds them, and a trace argument resolved
against it.

A trace argument (``--trace``) is a path, as it always was, or a short name (``azure-code``) or
file name (``azure_llm_2023_code.csv``) looked up in the traces folder: ``--traces DIR``, else
``$PDSCALE_TRACES``, else a per-user data folder. The catalog below names each trace's public
source, pinned to a commit, its licence, and the SHA-256 of every file ``pdscale trace fetch``
builds from it (simulator._fetch), so a fetched copy is checked against the copies the
benchmarks were run on.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from pdscale.simulator._trace import TraceError

TRACES_ENV = "PDSCALE_TRACES"
"""Environment variable naming the traces folder when ``--traces`` is not given."""

BASE_URL_ENV = "PDSCALE_TRACES_BASE_URL"
"""Environment variable replacing :data:`DEFAULT_BASE_URL` (a mirror, or a test server)."""

DEFAULT_BASE_URL = "https://raw.githubusercontent.com"
"""Where the sources are downloaded from: ``{base}/{repository}/{commit}/{path}``."""


@dataclass(frozen=True)
class TraceFile:
    """One file a public trace puts in the traces folder."""

    name: str
    """File name in the traces folder, as the benchmarks read it."""
    sha256: str
    """SHA-256 of the file's content: of the decompressed bytes for ``.gz``, since a gzip
    header carries the name and time of whoever compressed it (and deflate's output can
    change with the zlib version), so only the content is reproducible everywhere."""
    derived: bool = False
    """Computed from the source files (``*_DERIVED.csv``), not source data."""


@dataclass(frozen=True)
class PublicTrace:
    """A public trace: where it comes from and what fetching it writes."""

    name: str
    """Short name, accepted by ``--trace`` and ``pdscale trace fetch``."""
    summary: str
    """One line: what the trace is."""
    repository: str
    """GitHub ``owner/name`` of the source."""
    commit: str
    """The source's commit, pinned so a later change upstream cannot change the files."""
    source: str
    """The source path in the repository; for ServeGen, the folder of per-client files."""
    licence: str
    build: str
    """``verbatim`` (copied), ``gzip`` (copied, gzipped) or ``servegen`` (per-client files
    concatenated with a ``client_id`` column, and their aggregate rate derived)."""
    files: tuple[TraceFile, ...]
    """What fetching writes; the first is the trace ``--trace NAME`` replays."""
    clients: int = 0
    """ServeGen: the number of per-client files, ``chunk-0-trace.csv`` upward."""

    @property
    def paths(self) -> tuple[str, ...]:
        """The source files' paths in the repository, in the order they are combined."""
        if self.build == "servegen":
            return tuple(f"{self.source}/chunk-{i}-trace.csv" for i in range(self.clients))
        return (self.source,)

    @property
    def source_label(self) -> str:
        """The source as one line: ``repository : path``."""
        path = (f"{self.source}/chunk-{{0..{self.clients - 1}}}-trace.csv"
                if self.build == "servegen" else self.source)
        return f"{self.repository} : {path}"

    def url(self, path: str, base_url: str = DEFAULT_BASE_URL) -> str:
        """The download address of one source path."""
        return f"{base_url.rstrip('/')}/{self.repository}/{self.commit}/{path}"


_AZURE = "Azure/AzurePublicDataset"
_AZURE_COMMIT = "790921015d50dd6aae7f7e47f39ba0e235ad6b08"
_MOONCAKE = "kvcache-ai/Mooncake"
_MOONCAKE_COMMIT = "3cca71daccf2a7afb8fe3f0295358f70e3a69fdb"
_SERVEGEN = "alibaba/ServeGen"
_SERVEGEN_COMMIT = "f891d1189eb32b3868dfc443800c4150548c282a"


def _servegen(model: str, folder: str, clients: int, summary: str, rates_sha256: str,
              aggregate_sha256: str) -> PublicTrace:
    return PublicTrace(
        name=f"servegen-{model}", summary=summary, repository=_SERVEGEN,
        commit=_SERVEGEN_COMMIT, source=f"data/{folder}/{model}", licence="Apache-2.0",
        build="servegen", clients=clients,
        files=(TraceFile(f"servegen_{model}_client_rates.csv.gz", rates_sha256),
               TraceFile(f"servegen_{model}_aggregate_rate_DERIVED.csv", aggregate_sha256,
                         derived=True)))


PUBLIC_TRACES: Mapping[str, PublicTrace] = {t.name: t for t in (
    PublicTrace(
        name="azure-code", summary="Azure LLM inference 2023, code: 57 min, 8,819 requests",
        repository=_AZURE, commit=_AZURE_COMMIT, source="data/AzureLLMInferenceTrace_code.csv",
        licence="CC-BY-4.0", build="verbatim",
        files=(TraceFile("azure_llm_2023_code.csv",
                         "54e9a6d2a4bd06ba1e060304b900abbc74cbea53de96506e60fe5bb4f2277fb6"),)),
    PublicTrace(
        name="mooncake-conversation",
        summary="Mooncake FAST'25 conversation: 59 min, 12,031 requests, prefix hashes",
        repository=_MOONCAKE, commit=_MOONCAKE_COMMIT,
        source="FAST25-release/traces/conversation_trace.jsonl", licence="Apache-2.0",
        build="gzip",
        files=(TraceFile("mooncake_fast25_conversation_trace.jsonl.gz",
                         "b8cbb061a85206d729d91cdc2981f43c9e0d99209dce588d3af5f7934408b9df"),)),
    PublicTrace(
        name="mooncake-synthetic",
        summary="Mooncake FAST'25 synthetic long context: 17 min, 3,993 requests (Poisson "
                "arrivals)",
        repository=_MOONCAKE, commit=_MOONCAKE_COMMIT,
        source="FAST25-release/traces/synthetic_trace.jsonl", licence="Apache-2.0",
        build="gzip",
        files=(TraceFile("mooncake_fast25_synthetic_trace.jsonl.gz",
                         "bd070915a98fc0ed264d7cfef2ce746002eb3076a695ec31ba2674c0111ec131"),)),
    _servegen("m-large", "language", 162,
              "ServeGen m-large: 14 days of 600 s per-client rate windows, 162 clients",
              "d453fc242d919cc199c8c2fcccc42161c64eeb560ca518b7261be633ebe67d10",
              "9dfdfd05453bc181ae7f37b5e81c5757756496e4372be060d6fdb9e611ba7476"),
    _servegen("m-small", "language", 43,
              "ServeGen m-small: 14 days of 600 s per-client rate windows, 43 clients",
              "cb266de86eccadcf1e6e597be873e88e13ee3590ee35690561eb2c69017832ce",
              "a1c897dd81db269a3ce004b4fc446d7e552ecf68347218da7877d963d8e4900a"),
    _servegen("mm-image", "multimodal", 35,
              "ServeGen mm-image (image + text): 1 day of 600 s rate windows, 35 clients",
              "fcc504732819facf05877428159605076a6ed3f57fb6a3970961ad2a585c30cf",
              "afb4a1e1a95b17d11410574ee158abf20be5c3fd8262c8fdbe639edb01f4dd6b"),
)}
"""The public traces ``pdscale trace fetch`` can download, by short name. ServeGen's
token-length files (``*token_lengths_6h_DERIVED.csv``) are not among them: they were mixed from
per-client length files of which the largest were not available, so they cannot be rebuilt
from the source; without one, a ServeGen replay draws lengths from the synthetic mix and says
so."""


def default_traces_dir(environ: Mapping[str, str] | None = None) -> Path:
    """The per-user traces folder: ``$XDG_DATA_HOME/pdscale/traces``, by default
    ``~/.local/share/pdscale/traces``."""
    env = os.environ if environ is None else environ
    data = env.get("XDG_DATA_HOME") or str(Path.home() / ".local" / "share")
    return Path(data) / "pdscale" / "traces"


def traces_dir(option: str | Path | None = None, *, environ: Mapping[str, str] | None = None,
               default: Path | None = None) -> Path:
    """The traces folder: ``option`` (``--traces``), else ``$PDSCALE_TRACES``, else
    ``default``, else :func:`default_traces_dir`. A benchmark passes its checkout's folder
    as ``default``."""
    env = os.environ if environ is None else environ
    if option:
        return Path(option)
    if env.get(TRACES_ENV):
        return Path(env[TRACES_ENV])
    return default if default is not None else default_traces_dir(env)


def public_trace_for(name: str) -> tuple[PublicTrace, TraceFile] | None:
    """The public trace and file a short name or file name stands for; None if neither."""
    if name in PUBLIC_TRACES:
        trace = PUBLIC_TRACES[name]
        return trace, trace.files[0]
    for trace in PUBLIC_TRACES.values():
        for file in trace.files:
            if file.name == name:
                return trace, file
    return None


def fetch_command(name: str, folder: Path) -> str:
    """The command that downloads trace ``name`` into ``folder``."""
    return f"pdscale trace fetch {name} --to {folder}"


def resolve_trace(trace: str, folder: Path) -> str:
    """What ``--trace`` names, as ``load_trace`` takes it: ``synthetic`` and ``scenario:NAME``
    as given; an existing path as given; a short name or file name as the file in ``folder``.

    Raises TraceError when it is none of these, naming the command that fetches a public
    trace missing from ``folder``."""
    if trace == "synthetic" or trace.startswith("scenario:") or Path(trace).exists():
        return trace
    known = public_trace_for(trace)
    if known is not None:
        public, file = known
        path = folder / file.name
        if path.exists():
            return str(path)
        raise TraceError(
            f"trace {trace!r} ({file.name}) is not in {folder}: get it with "
            f"`{fetch_command(public.name, folder)}`, or point --traces (or "
            f"${TRACES_ENV}) at a folder holding it")
    if (folder / trace).exists():
        return str(folder / trace)
    raise TraceError(
        f"{trace}: no such file, nor in the traces folder {folder}; give a trace path, "
        f"'synthetic', 'scenario:NAME' or a public trace's name ({', '.join(PUBLIC_TRACES)}; "
        "`pdscale trace list` shows them)")
