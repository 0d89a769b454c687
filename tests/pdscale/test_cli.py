from __future__ import annotations

from pathlib import Path

import pytest

from pdscale._io import MARKER
from pdscale.cli import main
from tests.conftest import ROOT

VLLM = str(ROOT / "examples" / "vllm.yaml")


def test_validate_ok(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["validate", VLLM]) == 0
    assert "valid (2 service(s), 4 pool(s))" in capsys.readouterr().out


def test_validate_invalid_exits_2_and_lists_problems(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    spec = tmp_path / "bad.yaml"
    spec.write_text(Path(VLLM).read_text().replace("max_replicas: 16", "max_replicas: 0")
                    .replace("engine: vllm", "engine: vlm", 1))
    assert main(["validate", str(spec)]) == 2
    err = capsys.readouterr().err
    assert "services[0].engine" in err
    assert "services[0].pools.prefill.max_replicas" in err
    assert "Fix:" in err


def test_generate_invalid_spec_writes_nothing(tmp_path: Path) -> None:
    spec = tmp_path / "bad.yaml"
    spec.write_text("services: []\n")
    out = tmp_path / "out"
    assert main(["generate", "all", str(spec), "--out", str(out)]) == 2
    assert not out.exists()


def test_generate_all_then_regenerate_in_place(tmp_path: Path) -> None:
    out = tmp_path / "out"
    assert main(["generate", "all", VLLM, "--out", str(out)]) == 0
    first = {p.relative_to(out): p.read_bytes() for p in out.rglob("*") if p.is_file()}
    assert (out / MARKER).exists()  # one tree: alerts and dashboards replaced together
    assert (out / "dashboards" / "pdscale-overview.json").exists()
    assert main(["generate", "all", VLLM, "--out", str(out)]) == 0
    second = {p.relative_to(out): p.read_bytes() for p in out.rglob("*") if p.is_file()}
    assert first == second
    leftovers = [p.name for p in tmp_path.iterdir() if p.name.startswith(".")]
    assert leftovers == []


def test_generate_refuses_a_folder_it_did_not_write(tmp_path: Path,
                                                    capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "mine"
    out.mkdir()
    (out / "notes.txt").write_text("keep me")
    assert main(["generate", "alerts", VLLM, "--out", str(out)]) == 2  # bad input, as anywhere
    assert (out / "notes.txt").read_text() == "keep me"
    assert "not written by pdscale" in capsys.readouterr().err


def test_unwritable_output_leaves_nothing(tmp_path: Path,
                                          capsys: pytest.CaptureFixture[str]) -> None:
    blocker = tmp_path / "a-file"
    blocker.write_text("not a folder")
    assert main(["generate", "alerts", VLLM, "--out", str(blocker / "out")]) == 2
    assert "is not a writable folder" in capsys.readouterr().err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a-file"]


def test_generate_all_writes_all_or_nothing(tmp_path: Path,
                                            capsys: pytest.CaptureFixture[str]) -> None:
    """A user's folder where the dashboards would go: nothing is written, alerts included
    (it used to write alerts/ and then fail on dashboards/)."""
    out = tmp_path / "out"
    (out / "dashboards").mkdir(parents=True)
    (out / "dashboards" / "mine.json").write_text("{}")
    assert main(["generate", "all", VLLM, "--out", str(out)]) == 2
    assert "not written by pdscale" in capsys.readouterr().err
    assert sorted(p.name for p in out.iterdir()) == ["dashboards"]
    assert [p.name for p in (out / "dashboards").iterdir()] == ["mine.json"]


def test_the_current_folder_as_out_is_refused_and_nothing_is_left(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    """`--out .` in an empty folder used to fail on the rename and leave a `..old.*` folder
    behind, after which every run refused the folder as not pdscale's."""
    here = tmp_path / "empty"
    here.mkdir()
    monkeypatch.chdir(here)
    for out in (".", str(here), ".."):
        assert main(["generate", "all", VLLM, "--out", out]) == 2
        assert "is the current folder or holds it" in capsys.readouterr().err
    assert list(here.iterdir()) == [] and sorted(p.name for p in tmp_path.iterdir()) == ["empty"]
    assert main(["generate", "all", VLLM, "--out", "out"]) == 0  # a folder below it works


def test_a_link_given_as_out_keeps_pointing_at_the_replaced_output(tmp_path: Path) -> None:
    real = tmp_path / "real"
    assert main(["generate", "dashboards", VLLM, "--out", str(real)]) == 0
    (real / "pdscale-overview.json").write_text("stale")
    link = tmp_path / "link"
    link.symlink_to(real)
    assert main(["generate", "dashboards", VLLM, "--out", str(link)]) == 0
    assert link.is_symlink() and link.resolve() == real.resolve()
    assert (real / "pdscale-overview.json").read_text() != "stale"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["link", "real"]


def test_a_pdscale_up_folder_is_not_replaced_by_generate(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """`up` leaves the same marker as generate: its folder, with the PIDs it must stop in
    up.json, must not be replaced wholesale by another command's --out."""
    stack = tmp_path / "stack"
    stack.mkdir()
    (stack / MARKER).write_text("")
    (stack / "up.json").write_text('{"processes": []}')
    assert main(["generate", "dashboards", VLLM, "--out", str(stack)]) == 2
    assert "pdscale down --dir" in capsys.readouterr().err
    assert (stack / "up.json").exists()


def test_an_older_generate_all_output_is_replaced(tmp_path: Path) -> None:
    """Before the output became one tree, generate all left a marker in each subfolder."""
    out = tmp_path / "out"
    for sub in ("alerts", "dashboards"):
        (out / sub).mkdir(parents=True)
        (out / sub / MARKER).write_text("")
    assert main(["generate", "all", VLLM, "--out", str(out)]) == 0
    assert (out / MARKER).exists() and (out / "alerts" / "alertmanager.yaml").exists()


def test_failure_midway_keeps_previous_output(tmp_path: Path,
                                              monkeypatch: pytest.MonkeyPatch) -> None:
    out = tmp_path / "out"
    assert main(["generate", "dashboards", VLLM, "--out", str(out)]) == 0
    before = sorted(p.name for p in out.iterdir())

    import pdscale._io as io

    real_write = Path.write_text
    calls = {"n": 0}

    def flaky(self: Path, *args: object, **kwargs: object) -> int:
        calls["n"] += 1
        if calls["n"] == 5:
            raise OSError(28, "No space left on device")
        return real_write(self, *args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(io.Path, "write_text", flaky)
    assert main(["generate", "dashboards", VLLM, "--out", str(out)]) == 1
    monkeypatch.undo()
    assert sorted(p.name for p in out.iterdir()) == before
    assert [p for p in tmp_path.iterdir() if p.name.startswith(".")] == []


def test_query_prints_promql(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["query", VLLM, "--service", "llama-chat", "--pool", "prefill",
                 "--signal", "ttft_p95_s"]) == 0
    out = capsys.readouterr().out
    assert "vllm:time_to_first_token_seconds_bucket" in out
    assert 'pdscale_service="llama-chat"' in out


def test_query_unknown_signal_names_engine_and_signals(
        capsys: pytest.CaptureFixture[str]) -> None:
    spec = str(ROOT / "examples" / "sglang.yaml")
    assert main(["query", spec, "--service", "qwen-sglang", "--pool", "decode",
                 "--signal", "external_prefix_cache_hit_ratio"]) == 2
    err = capsys.readouterr().err
    assert "not exported by engine 'sglang'" in err
    assert "kv_cache_usage_ratio" in err


def test_query_unknown_service(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["query", VLLM, "--service", "nope", "--pool", "decode",
                 "--signal", "queue_depth"]) == 2
    assert "llama-chat, llama-batch" in capsys.readouterr().err


def test_signals_lists_every_engine(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["signals"]) == 0
    out = capsys.readouterr().out
    for engine in ("vllm:", "sglang:", "dynamo:", "tgi:"):
        assert engine in out


def test_help_lists_commands(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_info:
        main(["--help"])
    assert exit_info.value.code == 0
    out = capsys.readouterr().out
    for word in ("validate", "generate", "signals", "query", "exit codes"):
        assert word in out


def test_generate_recommend(tmp_path: Path) -> None:
    out = tmp_path / "rec"
    assert main(["generate", "recommend", VLLM, "--out", str(out),
                 "--prometheus-url", "http://prom:9090"]) == 0
    keda = sorted(p.name for p in (out / "keda").iterdir())
    assert keda == sorted(f"{n}-pdscale.yaml" for n in (
        "llama-chat-prefill", "llama-chat-decode", "llama-batch-p", "llama-batch-d"))
    assert "http://prom:9090" in (out / "keda" / keda[0]).read_text()
    assert len(list((out / "hpa").iterdir())) == 4


def test_the_local_stack_is_rendered_by_a_pure_function(tmp_path: Path) -> None:
    """pdscale up's configuration: the same inputs give the same stack, nothing is written,
    and every process points at the others' loopback ports."""
    from pdscale._cli.up import local_spec, local_stack
    from pdscale.spec import load_spec, parse_spec

    spec = load_spec(ROOT / "examples" / "vllm.yaml")
    ports = {"simulator": 1001, "prometheus": 1002, "alertmanager": 1003, "controller": 1004}
    urls = {k: f"http://127.0.0.1:{v}" for k, v in ports.items()}
    raw = local_spec(spec, urls=urls, speed=10.0)
    assert len(raw["services"]) == 1 and raw["controller"]["tick"] == 2
    assert raw["controller"]["leader_election"]["enabled"] is False
    import yaml

    local = parse_spec(yaml.safe_dump(raw))

    def render() -> object:
        return local_stack(spec, local, ports=ports, folder=tmp_path, rule_files=["r.yml"],
                           binaries={"prometheus": "/bin/prom", "alertmanager": "/bin/am"},
                           python="py", speed=10.0, duration_s=600.0, scale=1.0)

    stack = render()
    assert stack == render() and list(tmp_path.iterdir()) == []
    assert [name for name, _, _ in stack.commands] == ["simulator", "prometheus",  # type: ignore[attr-defined]
                                                       "alertmanager", "controller"]
    targets = [c["static_configs"][0]["targets"][0]
               for c in stack.prometheus["scrape_configs"]]  # type: ignore[attr-defined]
    assert targets == ["127.0.0.1:1001", "127.0.0.1:1004"]
    controller = dict((n, a) for n, a, _ in stack.commands)["controller"]  # type: ignore[attr-defined]
    assert "http://127.0.0.1:1001" in controller and "127.0.0.1:1004" in controller
    # Without --otlp every signal is Prometheus' and the receiver is off.
    assert local.controller.signal_sources.default == "prometheus"
    assert not local.controller.signal_sources.signals and not local.controller.otlp.enabled
    simulator = dict((n, a) for n, a, _ in stack.commands)["simulator"]  # type: ignore[attr-defined]
    assert "--otlp-endpoint" not in simulator


def test_up_otlp_points_the_pods_spans_at_the_controllers_receiver(tmp_path: Path) -> None:
    """``pdscale up --otlp``: the simulator exports spans to the receiver's loopback port, and
    the controller reads latency from them, everything else from Prometheus."""
    import yaml

    from pdscale._cli.up import SPAN_SIGNALS, local_spec, local_stack
    from pdscale.spec import load_spec, parse_spec

    spec = load_spec(ROOT / "examples" / "vllm.yaml")
    ports = {"simulator": 1001, "prometheus": 1002, "alertmanager": 1003, "controller": 1004,
             "otlp": 1005}
    urls = {k: f"http://127.0.0.1:{v}" for k, v in ports.items()}
    local = parse_spec(yaml.safe_dump(local_spec(spec, urls=urls, speed=10.0)))
    assert local.controller.otlp.enabled and local.controller.otlp.http_port == 1005
    assert local.controller.otlp.grpc_port == 0
    sources = local.controller.signal_sources
    assert sources.default == "prometheus" and set(sources.signals) == set(SPAN_SIGNALS)
    assert {sources.source(s) for s in SPAN_SIGNALS} == {"otlp"}
    stack = local_stack(spec, local, ports=ports, folder=tmp_path, rule_files=["r.yml"],
                        binaries={"prometheus": "/bin/prom", "alertmanager": "/bin/am"},
                        python="py", speed=10.0, duration_s=600.0, scale=1.0)
    simulator = list(dict((n, a) for n, a, _ in stack.commands)["simulator"])
    assert simulator[simulator.index("--otlp-endpoint") + 1] == \
        "http://127.0.0.1:1005/v1/traces"


def test_otlp_options_are_refused_where_nothing_exports_spans(
        capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    assert main(["up", "--engine", "dynamo", "--otlp", "--dir", str(tmp_path / "d")]) == 2
    assert "--otlp applies to --engine sim only" in capsys.readouterr().err
    example = str(ROOT / "examples" / "vllm.yaml")
    assert main(["simulate", "--spec", example, "--otlp-endpoint",
                 "http://127.0.0.1:4318/v1/traces", "--out", str(tmp_path / "s")]) == 2
    assert "add --live" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main(["simulate", "--spec", example, "--live", "--otlp-endpoint", "127.0.0.1:4318",
              "--out", str(tmp_path / "s")])
    assert "expected an OTLP/HTTP URL" in capsys.readouterr().err


def test_simulate_idle_before_starts_on_measured_idle_pools(tmp_path: Path) -> None:
    """--idle-before: the first sample is the idle pools' zeros, and the HPA baseline scales
    down on it at t=0; by default that sample is no data and nothing is decided on it."""
    import json

    firsts = {}
    for flag in ([], ["--idle-before"]):
        out = tmp_path / ("idle" if flag else "cut")
        assert main(["simulate", "--spec", str(ROOT / "examples" / "vllm.yaml"),
                     "--policy", "reactive", "--mode", "event", "--duration", "120", "--scale", "3",
                     "--initial-replicas", "3,3", "--no-plots", *flag, "--out", str(out)]) == 0
        decisions = json.loads((out / "decisions.json").read_text())
        firsts[bool(flag)] = [d for d in decisions if float(d["t"]) == 0.0]
    assert firsts[False] == []
    assert firsts[True] and all(d["to"] < d["from"] for d in firsts[True])


def test_simulate_starts_cold_unless_told_and_refuses_a_bad_start(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Adaptive policies start at the pools' minimum replicas, never at the future's need;
    --initial-replicas sets the start; a malformed pair is refused before anything runs."""
    import json

    starts = {}
    for flag in ([], ["--initial-replicas", "4,2"]):
        out = tmp_path / ("given" if flag else "cold")
        assert main(["simulate", "--spec", str(ROOT / "examples" / "vllm.yaml"),
                     "--policy", "oracle", "--mode", "event", "--duration", "120",
                     "--no-plots", *flag, "--out", str(out)]) == 0
        starts[bool(flag)] = json.loads((out / "summary.json").read_text())["initial_replicas"]
    assert starts[False] == {"prefill": 2, "decode": 2}  # the spec's min_replicas
    assert starts[True] == {"prefill": 4, "decode": 2}
    with pytest.raises(SystemExit) as stop:
        main(["simulate", "--spec", str(ROOT / "examples" / "vllm.yaml"),
              "--initial-replicas", "4", "--out", str(tmp_path / "bad")])
    assert stop.value.code == 2
    assert "expected PREFILL,DECODE" in capsys.readouterr().err
    assert not (tmp_path / "bad").exists()
