"""What the spec loader used to accept and later stages rejected (or crashed on), each found by
trying pdscale as a new user and as an attacker would; and a fuzz of the loader."""

from __future__ import annotations

import re
import time
from pathlib import Path
from typing import Any

import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from pdscale.alerts import ScenarioError, alert_files
from pdscale.cli import main
from pdscale.spec import Spec, SpecError, load_spec, parse_spec, regex_examples
from tests.conftest import ROOT

BASE = (ROOT / "examples" / "vllm.yaml").read_text()


def _problems(text: str) -> list[str]:
    with pytest.raises(SpecError) as info:
        parse_spec(text)
    return [str(p) for p in info.value.problems]


def test_booleans_are_not_numbers() -> None:
    (problem,) = set(_problems(BASE.replace("min_replicas: 2", "min_replicas: true", 1)))
    assert problem.startswith("services[0].pools.prefill.min_replicas: expected a number")
    assert "expected expected" not in problem


def test_a_key_given_twice_is_refused() -> None:
    text = BASE.replace("version: 1", "version: 1\nversion: 1", 1)
    line = text.splitlines().index("version: 1") + 2
    (problem,) = _problems(text)
    assert problem.startswith(f"line {line}, column 1")
    assert "'version' is given twice" in problem and "keep one of the two" in problem


def test_non_utf8_a_directory_and_a_huge_file_are_problems_not_tracebacks(
        tmp_path: Path) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_bytes(b"version: 1\n\xff\xfe\n")
    with pytest.raises(SpecError, match="line 2: expected UTF-8 text; got the byte 0xff"):
        load_spec(bad)
    with pytest.raises(SpecError, match="a directory"):
        load_spec(tmp_path)
    big = tmp_path / "big.yaml"
    big.write_text("# " + "x" * (1 << 20))
    with pytest.raises(SpecError, match="at most 1048576 bytes"):
        load_spec(big)


def test_an_alias_bomb_is_refused_at_once() -> None:
    lines = ["a: &a [x, x, x, x, x, x, x, x, x]"]
    for i in range(1, 9):
        prev = "a" if i == 1 else f"b{i - 1}"
        lines.append(f"b{i}: &b{i} [" + ", ".join([f"*{prev}"] * 9) + "]")
    text = "\n".join(lines) + "\nversion: 1\nservices: *b8\n"
    assert len(text) < 600
    started = time.process_time()
    (problem,) = _problems(text)
    assert "YAML aliases expanded" in problem
    # 9^9 values if walked: refused long before (a bound on work, not a timing target).
    assert time.process_time() - started < 30


def test_a_kind_without_scale_is_refused() -> None:
    (problem,) = _problems(BASE.replace("kind: Deployment, name: llama-chat-prefill",
                                        "kind: Pod, name: llama-chat-prefill"))
    assert problem.startswith("services[0].pools.prefill.target.kind")
    assert "got Pod (apps/v1)" in problem
    # A custom resource with /scale (LeaderWorkerSet in the example) stays accepted.
    assert isinstance(parse_spec(BASE), Spec)


def test_overlapping_pod_regexes_blame_the_wide_one() -> None:
    text = BASE.replace('pod_regex: "llama-batch-p-.*"', 'pod_regex: "llama-batch-.*"')
    (problem,) = _problems(text)
    assert problem.startswith("services[1].pools.prefill.selector.pod_regex")
    assert "services[1].pools.decode's pods" in problem


def test_a_regex_that_matches_no_pod_name_is_refused() -> None:
    (problem,) = _problems(BASE.replace('pod_regex: "llama-batch-p-.*"',
                                        'pod_regex: "(?=x)llama-batch-p-.*"'))
    assert "matches pod names" in problem


def test_a_model_name_that_cannot_be_quoted_is_refused() -> None:
    (problem,) = _problems(BASE.replace("model_name: meta-llama/Llama-3.1-8B-Instruct",
                                        'model_name: "llama\\"8b"', 1))
    assert problem.startswith("services[0].model_name")


def test_validate_refuses_what_generate_would(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                              capsys: pytest.CaptureFixture[str]) -> None:
    """validate renders everything generate would, so a refusal there is a refusal here."""
    import pdscale.alerts as alerts

    spec = tmp_path / "spec.yaml"
    spec.write_text(BASE)
    assert main(["validate", str(spec)]) == 0

    def refuse(*_: Any, **__: Any) -> dict[str, str]:
        raise ScenarioError("LLMQueueGrowing llama-chat/prefill: the warning tier never fires")

    monkeypatch.setattr(alerts, "alert_files", refuse)
    assert main(["validate", str(spec)]) == 2
    assert "the warning tier never fires" in capsys.readouterr().err


def test_a_cold_start_of_seconds_still_generates_two_tiers(tmp_path: Path) -> None:
    spec = parse_spec(BASE.replace("cold_start: 60s", "cold_start: 5s"))
    rules = yaml.safe_load(alert_files(spec)["rules/llama-chat.rules.yml"])
    stuck = [r for g in rules["groups"] for r in g["rules"]
             if r.get("alert") == "LLMPoolScalingStuck"]
    fors = {r["labels"]["severity"]: r["for"] for r in stuck}
    assert fors["warning"] != fors["critical"]


def test_an_unknown_profile_exits_2_before_any_command_runs(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    spec = tmp_path / "spec.yaml"
    spec.write_text(BASE.replace("profile: h100-80gb-llama-3.1-8b", "profile: nope", 1))
    assert main(["validate", str(spec)]) == 2
    err = capsys.readouterr().err
    assert "services[0].pools.prefill.profile" in err and "h100-80gb-llama-3.1-8b" in err
    assert main(["run", "--spec", str(spec), "--sim-url", "http://127.0.0.1:9"]) == 2


QUANTIFIED = ["llama-batch-p-[a-z0-9]{5}", "llama-batch-p-(a|b)-\\d+",
              "llama-batch-p-[^-]+-[a-z0-9]{5}"]


@pytest.mark.parametrize("regex", QUANTIFIED, ids=["quantifier", "group", "negated-class"])
def test_quantified_pod_regexes_generate_working_promtool_tests(
        regex: str, tmp_path: Path) -> None:
    """A pod regex with a brace quantifier used to raise KeyError: 'pod' in generate."""
    from tests.conftest import need_tool
    from tests.promtool_split import run_split

    promtool = need_tool("promtool")
    spec = parse_spec(BASE.replace('pod_regex: "llama-batch-p-.*"', f"pod_regex: '{regex}'"))
    files = alert_files(spec)
    for name, text in files.items():
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text(text)
    # Only the batch service's pods are selected by the regex; the chat service's tests (half
    # of promtool's work) read the same with any batch regex.
    tests = sorted(str(p.relative_to(tmp_path / "tests"))
                   for p in tmp_path.glob("tests/llama-batch*.yml"))
    assert len(tests) == 2, tests
    # The generated series name pods the regex selects, whatever its shape.
    pods = set(re.findall(r'pod=\\?"([^"\\]+)', "".join((tmp_path / "tests" / t).read_text()
                                                       for t in tests)))
    batch = {pod for pod in pods if pod.startswith("llama-batch-p-")}
    assert batch and all(re.fullmatch(regex, pod) for pod in batch), batch
    if regex != QUANTIFIED[0]:
        return  # promtool reads one shape's tests as it reads another's: run it once
    for result in run_split(promtool, tmp_path / "tests", tests):
        assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-2000:]


@pytest.mark.parametrize("pattern", ["llama-p-.*", "x-[a-z0-9]{5}", "a(b|c)+d", r"p\.q-\d{2,4}"])
def test_regex_examples_match_in_full(pattern: str) -> None:
    examples = regex_examples(pattern, 3)
    assert len(examples) == len(set(examples)) >= 2
    assert all(re.fullmatch(pattern, e) for e in examples)


# -- fuzz -------------------------------------------------------------------------------------

_RAW = yaml.safe_load(BASE)
_scalars = st.one_of(st.none(), st.booleans(), st.integers(-10, 10**6),
                     st.floats(allow_nan=True, allow_infinity=True), st.text(max_size=12))


def _paths(value: Any, prefix: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    out = [prefix]
    if isinstance(value, dict):
        for k, v in value.items():
            out += _paths(v, (*prefix, k))
    elif isinstance(value, list):
        for i, v in enumerate(value):
            out += _paths(v, (*prefix, i))
    return out


_ALL_PATHS = _paths(_RAW)[1:]


def _set(value: Any, path: tuple[Any, ...], new: Any) -> Any:
    import copy

    out = copy.deepcopy(value)
    node = out
    for key in path[:-1]:
        node = node[key]
    node[path[-1]] = new
    return out


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(edits=st.lists(st.tuples(st.sampled_from(_ALL_PATHS), _scalars), min_size=1,
                      max_size=3))
def test_fuzzed_specs_load_or_fail_with_problems(edits: list[tuple[tuple[Any, ...], Any]]
                                                 ) -> None:
    raw: Any = _RAW
    for path, value in edits:
        try:
            raw = _set(raw, path, value)
        except (KeyError, IndexError, TypeError):
            continue
    try:
        spec = parse_spec(yaml.safe_dump(raw))
    except SpecError as exc:
        assert exc.problems
        for p in exc.problems:
            assert "expected expected" not in str(p)
        return
    # Whatever loads either generates or is refused by `pdscale validate` with the reason
    # (thresholds whose tiers no test can tell apart): never a traceback.
    try:
        alert_files(spec)
    except ScenarioError as exc:
        assert "tier" in str(exc) or "longer than a promtool test can replay" in str(exc)


@settings(max_examples=150, deadline=None)
@given(text=st.text(max_size=300))
def test_arbitrary_text_is_a_spec_or_a_spec_error(text: str) -> None:
    try:
        parse_spec(text)
    except SpecError as exc:
        assert exc.problems


@pytest.mark.parametrize("argv", [
    ["simulate", "--duration", "60", "--out", "OUT"],
    ["demo", "--hours", "0.1", "--out", "OUT"],
    ["run", "--dry-run", "--prometheus-url", "http://127.0.0.1:9"],
], ids=lambda a: a[0])
def test_every_command_refuses_what_validate_refuses_before_any_work(
        argv: list[str], tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A threshold whose tiers no generated test can tell apart (critical after 8 days): the
    demo used to simulate for minutes and then die on it with a traceback."""
    spec = tmp_path / "spec.yaml"
    raw = yaml.safe_load(BASE)
    raw.setdefault("alerts", {}).setdefault("thresholds", {})["ttft_high"] = {
        "warning": {"value": 1.0, "for": "5m"}, "critical": {"value": 1.5, "for": "8d"}}
    spec.write_text(yaml.safe_dump(raw))
    assert main(["validate", str(spec)]) == 2
    first = capsys.readouterr().err
    out = tmp_path / "out"
    args = [a if a != "OUT" else str(out) for a in argv]
    assert main([args[0], "--spec", str(spec), *args[1:]]) == 2
    said = capsys.readouterr().err
    assert "alerts.thresholds" in said and said.strip() == first.strip()
    assert not out.exists()  # nothing written
