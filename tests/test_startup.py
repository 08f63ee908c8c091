"""Cold-start and peak-memory budgets (`latency.cold_start_ms`, `memory.peak_mb`): their config (validation,
inheritance through `extends` and overrides), the sequential verdict over fresh processes with fake measurements
(PASS, FAIL, INCONCLUSIVE at the cap or the time limit), and `ortbuild test` end to end on tiny_cnn: an
impossible budget fails naming the figure and the budget, a generous one passes, no budget starts no process."""

from __future__ import annotations

import base64
import json
import subprocess
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from ortbuild.errors import ConfigError
from ortbuild.gating.measure import startup
from ortbuild.project import config
from ortbuild.status import Verdict
from tests.conftest import run_cli

TARGET = """
[targets.t]
runtime = "RUNTIME"
providers = ["CPUExecutionProvider"]
"""


# ------------------------------------------------------------------------------------------------- config

@pytest.mark.parametrize(("table", "message"), [
    ("latency = { cold_start_ms = -1 }", "[targets.t.latency.cold_start_ms] must be a number from 0 to 3.6e+06, "
                                         "got -1"),
    ('latency = { cold_start_ms = "fast" }', "[targets.t.latency.cold_start_ms] must be a number"),
    ("memory = { peak_mb = -5 }", "[targets.t.memory.peak_mb] must be a number from 0 to 1.04858e+06, got -5"),
    ("memory = { peak_mb = true }", "[targets.t.memory.peak_mb] must be a number"),
    ("memory = { peak = 100 }", "[targets.t.memory] unknown key 'peak' (did you mean 'peak_mb'?)"),
    ("memory = 100", "[targets.t.memory] must be a table, got an integer"),
    ('[[targets.t.overrides]]\nmodels = ["tiny_cnn"]\nmemory = { peak_mb = nan }', "peak_mb] must be a number"),
])
def test_bad_budgets_are_config_errors(make_project: Callable[..., Path], table: str, message: str) -> None:
    path = make_project(TARGET + table + "\n")
    with pytest.raises(ConfigError) as e:
        config.load(path)
    assert message in e.value.message
    assert e.value.exit_code == 3


def test_budgets_inherit_through_extends_and_overrides(make_project: Callable[..., Path]) -> None:
    path = make_project(TARGET + """
latency = { cold_start_ms = 500, p90_ms = 50 }
memory = { peak_mb = 300 }

[targets.child]
extends = "t"
latency = { p90_ms = 20 }

[[targets.child.overrides]]
models = ["tiny_transformer"]
memory = { peak_mb = 900 }

[targets.none]
runtime = "RUNTIME"
providers = ["CPUExecutionProvider"]
""", models=("tiny_cnn", "tiny_transformer"))
    targets = config.load(path).targets

    def budgets(target: str, model: str) -> dict[str, float]:
        gates = targets[target].settings[model].gates
        assert gates is not None
        return gates.startup_budgets

    assert budgets("t", "tiny_cnn") == {"cold_start": 500.0, "memory": 300.0}
    assert budgets("child", "tiny_cnn") == {"cold_start": 500.0, "memory": 300.0}       # through extends
    assert budgets("child", "tiny_transformer") == {"cold_start": 500.0, "memory": 900.0}  # an override
    assert budgets("none", "tiny_cnn") == {}                                            # default: not measured


# ----------------------------------------------------------------------------------- the verdict, faked

def _sample(ms: float, mb: float = 100.0) -> startup.Sample:
    return startup.Sample(cold_start_ms=ms, import_ms=ms * 0.8, session_ms=ms * 0.15, first_run_ms=ms * 0.05,
                          peak_rss_bytes=int(mb * startup.MIB))


def _fake(values: Iterator[startup.Sample]) -> tuple[Callable[[], startup.Sample], list[int]]:
    calls: list[int] = []

    def measure() -> startup.Sample:
        calls.append(1)
        return next(values)
    return measure, calls


def _cycle(*samples: startup.Sample) -> Iterator[startup.Sample]:
    while True:
        yield from samples


def test_a_generous_budget_passes_and_an_impossible_one_fails_at_the_first_look() -> None:
    measure, calls = _fake(_cycle(_sample(150.0, 66.0), _sample(160.0, 67.0)))
    out = startup.judge(measure, {"cold_start": 2000.0, "memory": 1.0}, 0.99)
    assert len(calls) == startup.FIRST_LOOK == 8 and out.looks == 1 and out.stopped == "decided"
    assert out.verdicts["cold_start"].verdict is Verdict.PASS
    assert out.verdicts["memory"].verdict is Verdict.FAIL
    lines = startup.failure_lines("t/m", "t", out, {"cold_start": 2000.0, "memory": 1.0})
    assert lines[0].startswith("memory: t/m peak RSS median 66.0 MB (at least 66.0 MB with 99% confidence) over 8 "
                               "fresh processes > budget 1 MB"), lines
    assert "hint: raise memory.peak_mb in [targets.t]" in lines[1]
    summary = startup.summary(out, {"cold_start": 2000.0, "memory": 1.0})
    assert summary["processes"] == 8 and summary["cold_start_ms"] == {"p50": 150.0, "min": 150.0, "max": 160.0}
    assert summary["peak_rss_mb"]["p50"] == 66.0 and summary["session_ms"] == {"p50": 22.5}
    assert [(v["kind"], v["budget"], v["verdict"]) for v in summary["verdicts"]] == [
        ("cold_start", 2000.0, Verdict.PASS), ("memory", 1.0, Verdict.FAIL)]
    assert "note" not in summary
    json.dumps(summary)


def test_a_cold_start_fail_names_the_figure_its_parts_and_the_fix() -> None:
    measure, _ = _fake(_cycle(_sample(812.4)))
    out = startup.judge(measure, {"cold_start": 500.0}, 0.99)
    lines = startup.failure_lines("cpu-fp32/tiny_cnn", "cpu-fp32", out, {"cold_start": 500.0})
    assert lines[0] == ("cold start: cpu-fp32/tiny_cnn median 812.4 ms (at least 812.4 ms with 99% confidence) "
                        "over 8 fresh processes > budget 500 ms")
    assert "import of the loader and onnxruntime 649.9 ms" in lines[1]
    assert "hint: raise latency.cold_start_ms in [targets.cpu-fp32]" in lines[2]


def test_a_median_on_the_budget_is_inconclusive_at_the_cap() -> None:
    measure, calls = _fake(_cycle(_sample(90.0), _sample(110.0)))   # half above 100 ms, half below
    out = startup.judge(measure, {"cold_start": 100.0}, 0.99)
    assert len(calls) == startup.MAX_PROCESSES == 32 and out.looks == 3 and out.stopped == "cap"   # 8, 16, 32
    v = out.verdicts["cold_start"]
    assert v.verdict is Verdict.INCONCLUSIVE and "processes" in v.note
    summary = startup.summary(out, {"cold_start": 100.0})
    assert summary["note"].startswith("cold start: ") and "undecided after 32 processes" in summary["note"]
    assert startup.failure_lines("t/m", "t", out, {"cold_start": 100.0}) == []


def test_the_time_limit_stops_before_a_look_that_would_end_past_it() -> None:
    now = [0.0]

    def clock() -> float:
        return now[0]

    taken: list[int] = []

    def measure() -> startup.Sample:
        now[0] += 10.0                                               # 10 s a process: 8 take 80 s, 16 would 160
        taken.append(1)
        return _sample(90.0 if len(taken) % 2 else 110.0)
    out = startup.judge(measure, {"cold_start": 100.0}, 0.99, max_seconds=120.0, clock=clock)
    assert len(taken) == 8 and out.looks == 1 and out.stopped == "time"
    assert out.verdicts["cold_start"].verdict is Verdict.INCONCLUSIVE
    assert "120 s reached" in startup.summary(out, {"cold_start": 100.0})["note"]


def test_a_process_that_fails_fails_every_budget() -> None:
    out = startup.Outcome([], {}, error="a fresh process failed to load and run the artifact (exit 1): boom")
    budgets = {"cold_start": 100.0, "memory": 50.0}
    assert startup.verdict_of(out, "cold_start") is Verdict.FAIL and startup.verdict_of(out, "memory") is Verdict.FAIL
    summary = startup.summary(out, budgets)
    assert [v["verdict"] for v in summary["verdicts"]] == [Verdict.FAIL, Verdict.FAIL] and "boom" in summary["error"]
    assert "boom" in startup.failure_lines("t/m", "t", out, budgets)[0]


def test_the_key_goes_on_stdin_only(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    seen: dict[str, Any] = {}

    def run(args: list[str], **kw: Any) -> subprocess.CompletedProcess[str]:
        seen.update(args=args, **kw)
        line = json.dumps({"cold_start_ms": 5.0, "import_ms": 3.0, "session_ms": 1.5, "first_run_ms": 0.5,
                           "peak_rss_bytes": 1 << 26})
        return subprocess.CompletedProcess(args, 0, "a warning\n" + line + "\n", "")
    monkeypatch.setattr(subprocess, "run", run)
    key = bytes(range(100, 132))
    s = startup.measure_once(tmp_path / "l.py", tmp_path, tmp_path / "i.npz", key, tmp_path)
    assert s == startup.Sample(5.0, 3.0, 1.5, 0.5, 1 << 26) and s.peak_rss_mb == 64.0
    encoded = base64.b64encode(key).decode()
    assert seen["input"] == encoded and "env" not in seen
    assert not any(encoded in a or key.hex() in a for a in seen["args"])
    assert seen["args"][1] == "-B" and seen["cwd"] == tmp_path


# -------------------------------------------------------------------------------------------- end to end


@pytest.mark.runtime
def test_ortbuild_test_gates_cold_start_and_memory(make_project: Callable[..., Path]) -> None:
    path = make_project("""
        [targets.roomy]
        runtime = "RUNTIME"
        providers = ["CPUExecutionProvider"]
        latency = { cold_start_ms = 60000, min_seconds = 0.1 }
        memory = { peak_mb = 4096 }

        [targets.slow]
        extends = "roomy"
        latency = { cold_start_ms = 1 }

        [targets.fat]
        extends = "roomy"

        [[targets.fat.overrides]]
        models = ["tiny_cnn"]
        memory = { peak_mb = 1 }

        [targets.plain]
        runtime = "RUNTIME"
        providers = ["CPUExecutionProvider"]
        latency = { min_seconds = 0.1 }
    """)
    proc = run_cli("test", "-c", str(path), "--json", cwd=path.parent)
    assert proc.returncode == 9, proc.stderr[-3000:]
    res = {r["target"]: r for r in json.loads(proc.stdout)["results"]}
    assert {t: (r["status"], r["cold_start_verdict"], r["memory_verdict"]) for t, r in res.items()} == {
        "roomy": ("PASS", "PASS", "PASS"), "slow": ("FAIL", "FAIL", "PASS"), "fat": ("FAIL", "PASS", "FAIL"),
        "plain": ("PASS", "-", "-")}
    assert res["slow"]["failed_gates"] == ["cold_start"] and res["fat"]["failed_gates"] == ["memory"]
    slow, fat = "\n".join(res["slow"]["failures"]), "\n".join(res["fat"]["failures"])
    assert "cold start: slow/tiny_cnn median " in slow and " over 8 fresh processes > budget 1 ms" in slow, slow
    assert "hint: raise latency.cold_start_ms in [targets.slow]" in slow and "memory:" not in slow
    assert "memory: fat/tiny_cnn peak RSS median " in fat and "> budget 1 MB" in fat and "cold start" not in fat
    s = res["roomy"]["startup"]
    assert s["processes"] == 8 and s["stopped"] == "decided"
    assert 0 < s["cold_start_ms"]["min"] <= s["cold_start_ms"]["p50"] <= s["cold_start_ms"]["max"] < 60000
    assert s["session_ms"]["p50"] > 0 and s["first_run_ms"]["p50"] > 0
    assert 10 < s["peak_rss_mb"]["p50"] < 4096          # onnxruntime alone makes it tens of MB
    assert [(v["kind"], v["budget"], v["verdict"]) for v in s["verdicts"]] == [
        ("cold_start", 60000, "PASS"), ("memory", 4096, "PASS")]
    assert res["plain"]["startup"] == {}                # no budget: no process started
    assert not list(path.parent.glob("dist/*/tiny_cnn/loader/__pycache__"))
    # the release bundle records both gates' verdicts and budgets (not their figures); without budgets, nothing
    for target, want in (("roomy", {"cold_start": "PASS", "memory": "PASS"}), ("plain", {})):
        out = path.parent / "rel" / target
        proc = run_cli("release", "-c", str(path), "-t", target, "--to", str(out), cwd=path.parent)
        assert proc.returncode == 0, proc.stderr[-3000:]
        (index,) = out.rglob("*.release.json")
        tests = json.loads(index.read_text())["tests"]["tiny_cnn"]
        assert {g: tests[g] for g in ("cold_start", "memory") if g in tests} == want
        assert ("startup_budgets" in tests) == bool(want)
        if want:
            assert [(b["kind"], b["budget"]) for b in tests["startup_budgets"]] == [("cold_start", 60000),
                                                                                    ("memory", 4096)]
