"""``pdscale trace fetch``, ``trace list`` and the traces folder: downloads from a real HTTP
server on loopback serving fake upstream files; the builders against the shared copies."""

from __future__ import annotations

import dataclasses
import gzip
import hashlib
import re
import threading
from collections.abc import Iterator
from functools import partial
from http.server import SimpleHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from pdscale.cli import main
from pdscale.simulator import (
    PUBLIC_TRACES,
    TRACES_ENV,
    PublicTrace,
    TraceError,
    TraceFetchError,
    TraceFile,
    TraceUnavailable,
    fetch_trace,
    resolve_trace,
    traces_dir,
)
from pdscale.simulator._fetch import build_files, content_sha256, gzip_bytes
from tests.conftest import ROOT, SHARED

TRACES = SHARED / "traces"
needs_shared = pytest.mark.skipif(not TRACES.exists(),
                                  reason="../shared/traces is absent (only in the project's CI)")


class _Quiet(SimpleHTTPRequestHandler):
    def log_message(self, format: str, *args: object) -> None:
        """Keep the test output free of access-log lines."""


@pytest.fixture
def upstream(tmp_path: Path) -> Iterator[tuple[Path, str]]:
    """A folder served over HTTP on 127.0.0.1 as ``{repository}/{commit}/{path}``, and its
    base URL."""
    root = tmp_path / "upstream"
    root.mkdir()
    server = ThreadingHTTPServer(("127.0.0.1", 0), partial(_Quiet, directory=str(root)))
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield root, f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()
        thread.join()


def _publish(root: Path, trace: PublicTrace, path: str, data: bytes) -> None:
    target = root / trace.repository / trace.commit / path
    target.parent.mkdir(parents=True, exist_ok=True)
    target.write_bytes(data)


def _sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


# ServeGen's per-client files as published: no header, CRLF line ends.
CLIENTS = [b"0,1.5,2.0,Gamma,0.25,2.0\r\n600,0,0,,0,0\r\n",
           b"0,0.25,1.0,Weibull,1.0,4.0\r\n600,0.1,1.2,Gamma,0.7,14.0\r\n",
           b"0,0,0,,0,0\r\n600,0.2,1.1,Weibull,0.9,5.0\r\n"]
RATES = (b"client_id,window_start_s,rate_rps,cv,arrival_dist,dist_param1,dist_param2\n"
         b"0,0,1.5,2.0,Gamma,0.25,2.0\n0,600,0,0,,0,0\n"
         b"1,0,0.25,1.0,Weibull,1.0,4.0\n1,600,0.1,1.2,Gamma,0.7,14.0\n"
         b"2,0,0,0,,0,0\n2,600,0.2,1.1,Weibull,0.9,5.0\n")
AGGREGATE = b"window_start_s,total_rate_rps,active_clients\n0,1.75,2\n600,0.3,2\n"

TINY_SERVEGEN = PublicTrace(
    name="servegen-tiny", summary="three clients", repository="fake/ServeGen", commit="c0ffee",
    source="data/language/tiny", licence="Apache-2.0", build="servegen", clients=3,
    files=(TraceFile("servegen_tiny_client_rates.csv.gz", _sha(RATES)),
           TraceFile("servegen_tiny_aggregate_rate_DERIVED.csv", _sha(AGGREGATE),
                     derived=True)))


def test_fetch_servegen_concatenates_clients_and_derives_the_aggregate(
        upstream: tuple[Path, str], tmp_path: Path) -> None:
    root, base = upstream
    for i, data in enumerate(CLIENTS):
        _publish(root, TINY_SERVEGEN, f"data/language/tiny/chunk-{i}-trace.csv", data)
    lines: list[str] = []
    out = tmp_path / "traces" / "new"
    written = fetch_trace(TINY_SERVEGEN, out, base_url=base, progress=lines.append)
    assert [p.name for p in written] == [f.name for f in TINY_SERVEGEN.files]
    assert gzip.decompress((out / "servegen_tiny_client_rates.csv.gz").read_bytes()) == RATES
    assert (out / "servegen_tiny_aggregate_rate_DERIVED.csv").read_bytes() == AGGREGATE
    assert sorted(p.name for p in out.iterdir()) == sorted(f.name for f in TINY_SERVEGEN.files)
    assert len(lines) == 3 and lines[0].endswith(
        "/fake/ServeGen/c0ffee/data/language/tiny/chunk-0-trace.csv")


@pytest.mark.parametrize("build", ["verbatim", "gzip"])
def test_fetch_copies_or_gzips_one_file(build: str, upstream: tuple[Path, str],
                                        tmp_path: Path) -> None:
    root, base = upstream
    body = b'{"timestamp": 0, "input_length": 10, "output_length": 2, "hash_ids": [0]}\n'
    name = "one.jsonl.gz" if build == "gzip" else "one.jsonl"
    trace = PublicTrace(name="one", summary="", repository="fake/one", commit="1", source="t.jsonl",
                        licence="MIT", build=build, files=(TraceFile(name, _sha(body)),))
    _publish(root, trace, "t.jsonl", body)
    (path,) = fetch_trace(trace, tmp_path, base_url=base)
    data = path.read_bytes()
    assert (gzip.decompress(data) if build == "gzip" else data) == body
    if build == "gzip":
        assert data[:10] == bytes.fromhex("1f8b0800000000000203")  # no name, time 0, level 9


def test_files_already_there_are_verified_not_downloaded(upstream: tuple[Path, str],
                                                         tmp_path: Path) -> None:
    root, base = upstream
    for i, data in enumerate(CLIENTS):
        _publish(root, TINY_SERVEGEN, f"data/language/tiny/chunk-{i}-trace.csv", data)
    fetch_trace(TINY_SERVEGEN, tmp_path, base_url=base)

    def no_download(url: str) -> bytes:
        raise AssertionError(f"downloaded {url} although the files were there")

    lines: list[str] = []
    fetch_trace(TINY_SERVEGEN, tmp_path, download=no_download, progress=lines.append)
    assert lines == [f"servegen-tiny: already in {tmp_path}, content verified"]


def test_a_hash_mismatch_is_reported_and_writes_nothing(
        upstream: tuple[Path, str], tmp_path: Path,
        capsys: pytest.CaptureFixture[str]) -> None:
    root, base = upstream
    azure = PUBLIC_TRACES["azure-code"]
    _publish(root, azure, azure.source, b"TIMESTAMP,ContextTokens,GeneratedTokens\n"
                                        b"2023-11-16 18:17:03.9799600,4808,10\n")
    out = tmp_path / "traces"
    code = main(["trace", "fetch", "azure-code", "--to", str(out), "--base-url", base])
    assert code == 1
    err = capsys.readouterr().err
    assert "azure_llm_2023_code.csv: content SHA-256" in err
    assert azure.files[0].sha256 in err and "nothing was written" in err
    assert not out.exists() or list(out.iterdir()) == []


def test_a_404_names_the_url(upstream: tuple[Path, str], tmp_path: Path,
                             capsys: pytest.CaptureFixture[str]) -> None:
    _root, base = upstream
    out = tmp_path / "traces"
    code = main(["trace", "fetch", "mooncake-synthetic", "--to", str(out),
                 "--base-url", base])
    assert code == 1
    trace = PUBLIC_TRACES["mooncake-synthetic"]
    err = capsys.readouterr().err
    assert f"{trace.url(trace.source, base)}: HTTP 404" in err
    assert not out.exists()


def test_an_unreachable_source_is_unavailable(tmp_path: Path) -> None:
    with pytest.raises(TraceUnavailable, match=r"http://127\.0\.0\.1:9/.*cannot download"):
        fetch_trace("azure-code", tmp_path, base_url="http://127.0.0.1:9")


def test_an_unknown_name_is_bad_input(tmp_path: Path,
                                      capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["trace", "fetch", "azure-chat", "--to", str(tmp_path)]) == 2
    assert "unknown trace(s) azure-chat; use any of azure-code" in capsys.readouterr().err
    with pytest.raises(TraceError, match="unknown trace 'azure-chat'"):
        fetch_trace("azure-chat", tmp_path)


def test_ctrl_c_during_the_write_leaves_no_partial_file(
        upstream: tuple[Path, str], tmp_path: Path,
        monkeypatch: pytest.MonkeyPatch) -> None:
    root, base = upstream
    for i, data in enumerate(CLIENTS):
        _publish(root, TINY_SERVEGEN, f"data/language/tiny/chunk-{i}-trace.csv", data)

    def interrupt(src: str, dst: Path) -> None:
        raise KeyboardInterrupt

    monkeypatch.setattr("pdscale.simulator._fetch.os.replace", interrupt)
    out = tmp_path / "traces"
    with pytest.raises(KeyboardInterrupt):
        fetch_trace(TINY_SERVEGEN, out, base_url=base)
    assert list(out.iterdir()) == []


def test_fetch_help_lists_names_sources_and_licences(
        capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        main(["trace", "fetch", "--help"])
    out = capsys.readouterr().out
    for trace in PUBLIC_TRACES.values():
        assert trace.name in out and trace.source_label in out
    assert "CC-BY-4.0" in out and "Apache-2.0" in out


# The traces folder and --trace NAME ----------------------------------------------------------


def test_traces_dir_prefers_the_option_then_the_environment_then_the_default(
        tmp_path: Path) -> None:
    env = {TRACES_ENV: "/from/env", "XDG_DATA_HOME": "/xdg"}
    assert traces_dir("/opt", environ=env) == Path("/opt")
    assert traces_dir(None, environ=env, default=tmp_path) == Path("/from/env")
    assert traces_dir(None, environ={"XDG_DATA_HOME": "/xdg"}, default=tmp_path) == tmp_path
    assert traces_dir(None, environ={"XDG_DATA_HOME": "/xdg"}) == Path("/xdg/pdscale/traces")


def test_resolve_trace_by_short_name_file_name_or_path(tmp_path: Path) -> None:
    (tmp_path / "azure_llm_2023_code.csv").write_text("x")
    (tmp_path / "mine.csv").write_text("x")
    expected = str(tmp_path / "azure_llm_2023_code.csv")
    assert resolve_trace("azure-code", tmp_path) == expected
    assert resolve_trace("azure_llm_2023_code.csv", tmp_path) == expected
    assert resolve_trace("mine.csv", tmp_path) == str(tmp_path / "mine.csv")
    assert resolve_trace(expected, tmp_path / "elsewhere") == expected
    for given in ("synthetic", "scenario:steps"):
        assert resolve_trace(given, tmp_path) == given


def test_a_missing_public_trace_names_the_fetch_command(tmp_path: Path) -> None:
    command = f"`pdscale trace fetch servegen-m-large --to {tmp_path}`"
    with pytest.raises(TraceError, match=re.escape(command)):
        resolve_trace("servegen_m-large_client_rates.csv.gz", tmp_path)
    with pytest.raises(TraceError, match=r"no such file.*servegen-mm-image"):
        resolve_trace("nothing-here.csv", tmp_path)


def test_simulate_reads_a_short_name_from_the_traces_folder(
        tmp_path: Path, capsys: pytest.CaptureFixture[str],
        monkeypatch: pytest.MonkeyPatch) -> None:
    spec = str(ROOT / "examples" / "vllm.yaml")
    monkeypatch.setenv(TRACES_ENV, str(tmp_path))
    args = ["simulate", "--spec", spec, "--trace", "azure-code", "--duration", "60",
            "--no-plots", "--out", str(tmp_path / "out")]
    assert main(args) == 2
    assert (f"`pdscale trace fetch azure-code --to {tmp_path}`"
            in capsys.readouterr().err)
    (tmp_path / "azure_llm_2023_code.csv").write_text(
        "TIMESTAMP,ContextTokens,GeneratedTokens\n"
        + "".join(f"2023-11-16 18:17:{s:02d}.0000000,500,20\n" for s in range(30)))
    assert main(args) == 0
    assert "azure_llm_2023_code.csv" in capsys.readouterr().out


def test_trace_list_says_which_files_are_present(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "azure_llm_2023_code.csv").write_text("x")
    assert main(["trace", "list", "--traces", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert "azure_llm_2023_code.csv (present)" in out
    assert "mooncake_fast25_conversation_trace.jsonl.gz (missing)" in out
    assert "Azure/AzurePublicDataset : data/AzureLLMInferenceTrace_code.csv" in out


# The catalog and the builders against the shared copies ---------------------------------------


@needs_shared
@pytest.mark.parametrize("file", [f for t in PUBLIC_TRACES.values() for f in t.files],
                         ids=lambda f: f.name)
def test_catalog_hashes_are_the_shared_copies(file: TraceFile) -> None:
    assert content_sha256(file.name, (TRACES / file.name).read_bytes()) == file.sha256


def _sources_from_shared(trace: PublicTrace) -> list[bytes]:
    """The upstream files as published, recovered from the shared copies (ServeGen's
    per-client files split back out of the concatenation, with their CRLF line ends)."""
    data = (TRACES / trace.files[0].name).read_bytes()
    if trace.build == "gzip":
        return [gzip.decompress(data)]
    if trace.build == "verbatim":
        return [data]
    clients: list[list[bytes]] = [[] for _ in range(trace.clients)]
    for line in gzip.decompress(data).splitlines()[1:]:
        client, rest = line.split(b",", 1)
        clients[int(client)].append(rest + b"\r\n")
    return [b"".join(lines) for lines in clients]


# Gzip files the shared folder holds with a name and time in the header, which a rebuild
# (no name, time 0) cannot reproduce: their content is checked, not their bytes.
HEADER_DIFFERS = {"mooncake_fast25_conversation_trace.jsonl.gz",
                  "servegen_m-large_client_rates.csv.gz", "servegen_m-small_client_rates.csv.gz"}


@needs_shared
@pytest.mark.parametrize("name", list(PUBLIC_TRACES))
def test_builders_reproduce_the_shared_files(name: str) -> None:
    trace = PUBLIC_TRACES[name]
    built = build_files(trace, _sources_from_shared(trace))
    for file in trace.files:
        assert content_sha256(file.name, built[file.name]) == file.sha256
        shared = (TRACES / file.name).read_bytes()
        if file.name in HEADER_DIFFERS:
            assert gzip.decompress(built[file.name]) == gzip.decompress(shared)
        else:
            assert built[file.name] == shared, file.name


@needs_shared
def test_fetch_writes_the_published_azure_trace(
        upstream: tuple[Path, str], tmp_path: Path,
        capsys: pytest.CaptureFixture[str]) -> None:
    root, base = upstream
    azure = PUBLIC_TRACES["azure-code"]
    _publish(root, azure, azure.source, (TRACES / azure.files[0].name).read_bytes())
    out = tmp_path / "traces"
    assert main(["trace", "fetch", "azure-code", "--to", str(out), "--base-url", base]) == 0
    captured = capsys.readouterr()
    assert f"azure-code: {out / azure.files[0].name}" in captured.out
    assert azure.url(azure.source, base) in captured.err
    assert (out / azure.files[0].name).read_bytes() == (TRACES / azure.files[0].name
                                                         ).read_bytes()


def test_gzip_bytes_is_deterministic() -> None:
    assert gzip_bytes(b"abc") == gzip_bytes(b"abc")
    assert gzip.decompress(gzip_bytes(b"abc")) == b"abc"


def test_a_trace_with_the_wrong_number_of_sources_is_refused() -> None:
    with pytest.raises(ValueError, match="3 source files, got 1"):
        build_files(TINY_SERVEGEN, [b""])
    assert dataclasses.replace(TINY_SERVEGEN, clients=1).paths == (
        "data/language/tiny/chunk-0-trace.csv",)


def test_fetch_error_tree() -> None:
    assert issubclass(TraceUnavailable, TraceFetchError)


def test_ctrl_c_in_the_command_exits_130(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                         capsys: pytest.CaptureFixture[str]) -> None:
    def interrupt(*_args: object, **_kwargs: object) -> list[Path]:
        raise KeyboardInterrupt

    monkeypatch.setattr("pdscale.simulator.fetch_trace", interrupt)
    assert main(["trace", "fetch", "azure-code", "--to", str(tmp_path)]) == 130
    assert "interrupted; no file half-written" in capsys.readouterr().err
