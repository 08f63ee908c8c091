"""Speed claims checked (ortbuild.gating.measure.speed): a reduced precision or a fusion measured slower than the
artifact it derives from, in one `ortbuild test` run, is a warning with the measured ratio, judged by the p50 confidence
intervals (no overlap: slower; overlap: noise, no warning).

The judging is tested on recorded numbers (synthetic samples of known medians). The one real run asserts only
what cannot flip with the machine's load: the warning appears exactly when the recorded samples' intervals,
computed here by exact binomial sums (not by ortbuild.gating.measure.percentiles), say slower (with what the load did,
said in it)."""

from __future__ import annotations

import json
import math
import random
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from ortbuild.gating.measure import speed
from ortbuild.gating.timing_records import DataSetLatency, LatencyDoc
from ortbuild.project import config, plan
from tests.conftest import MODELS, here_runtime, run_cli

PROJECT = """
[project]
name = "speed"
version = "1"

[models.net]
path = "{models}/tiny_cnn.onnx"
inputs = "{models}/tiny_cnn.inputs.npz"
calibration = "{models}/tiny_cnn.calib.npz"

[models.enc]
path = "{models}/tiny_transformer.onnx"
inputs = "{models}/tiny_transformer.inputs.npz"

[targets.cpu-fp32]
runtime = "{runtime}"
providers = ["CPUExecutionProvider"]
session = {{ intra_op_num_threads = 1 }}
latency = {{ p90_ms = 1000 }}

[targets.cpu-portable]
extends = "cpu-fp32"
optimization = "basic"
models = ["net"]

[targets.cpu-int8]
extends = "cpu-fp32"
precision = "int8-static"
models = ["net"]
quantization = {{ format = "qdq", calibration_method = "minmax" }}

[targets.cpu-int8-ft]
extends = "cpu-int8"
latency = {{ faster_than = {{ target = "cpu-fp32", ratio = 1 }} }}

[targets.cpu-fused]
extends = "cpu-fp32"
models = ["enc"]
fusion = {{ model_type = "bert" }}

[targets.mac-int8]
runtime = "{runtime}"
providers = ["CoreMLExecutionProvider", "CPUExecutionProvider"]
precision = "int8-dynamic"
models = ["net"]
"""


@pytest.fixture(scope="module")
def jobs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, plan.Job]:
    path = tmp_path_factory.mktemp("speed") / "targets.toml"
    path.write_text(PROJECT.format(models=MODELS, runtime=here_runtime()))
    return {j.name: j for j in plan.jobs(config.load(path))}


def _samples(median: float, n: int = 400, seed: int = 0, spread: float = 0.05) -> list[float]:
    rng = random.Random(seed)
    return [median * rng.lognormvariate(0, spread) for _ in range(n)]


def _latency(samples: list[float], name: str = "test_data_set_0", confidence: float = 0.99,
             **extra: Any) -> LatencyDoc:
    entry: DataSetLatency = {"name": name, "samples_ms": samples, "unstable": [], **extra}  # type: ignore[typeddict-item]
    return {"confidence": confidence, "data_sets": [entry]}


# ------------------------------------------------------------------------------------------- which pairs

def test_each_reduced_precision_and_fusion_is_paired_with_what_it_derives_from(jobs: dict[str, plan.Job]) -> None:
    found = {(c.mine.name, c.kind): c.than.name for c in speed.claims(list(jobs.values()))}
    assert found == {
        ("cpu-int8/net", "precision"): "cpu-fp32/net",      # not cpu-portable: its optimization level differs
        ("cpu-int8-ft/net", "precision"): "cpu-fp32/net",
        ("cpu-fused/enc", "fusion"): "cpu-fp32/enc",
        # mac-int8: other providers, no fp32 artifact of its own; fp32 artifacts claim nothing
    }
    without = [j for n, j in jobs.items() if n != "cpu-fp32/net"]  # the closest fp32 left: the portable one
    found = {(c.mine.name, c.kind): c.than.name for c in speed.claims(without)}
    assert found[("cpu-int8/net", "precision")] == "cpu-portable/net"
    assert not speed.claims([jobs["cpu-int8/net"], jobs["mac-int8/net"]])


# ------------------------------------------------------------------------------------------- judging

def test_the_interval_is_the_order_statistics_of_the_median() -> None:
    xs = [float(i) for i in range(1, 101)]
    assert speed.interval(xs, 0.99) == speed.Interval(50.0, *_exact_bounds(xs, 0.99), 0.99)
    assert speed.interval([1.0, 2.0, 3.0], 0.99) is None  # too few samples to bound a median at 99%
    assert speed.interval([], 0.99) is None


def test_int8_at_0_84x_fp32s_speed_warns_with_the_ratio(jobs: dict[str, plan.Job]) -> None:
    measured = [(jobs["cpu-fp32/net"], _latency(_samples(1.76, seed=1))),
                (jobs["cpu-int8/net"], _latency(_samples(2.10, seed=2)))]
    fp32, int8 = speed.check(measured)
    assert fp32 == []
    (doc,) = int8
    assert doc["kind"] == "precision" and doc["what"] == "int8-static" and doc["than"] == "cpu-fp32/net"
    assert doc["speed_ratio"] == pytest.approx(1.76 / 2.10, abs=0.02) and doc["lower_ms"] > doc["than_upper_ms"]
    assert doc["faster_than"] == "" and doc["unstable"] == []
    msg = doc["message"]
    assert msg.startswith(f"int8-static is {doc['speed_ratio']:.2f}x the speed of cpu-fp32/net (p50 2.1")
    assert "at 99% confidence at least" in msg
    assert 'with latency.faster_than = { target = "cpu-fp32", ratio = 1 } in [targets.cpu-int8]' in msg
    assert json.loads(json.dumps(doc)) == doc  # as the report holds it


def test_no_warning_where_the_intervals_overlap_or_it_is_faster(jobs: dict[str, plan.Job]) -> None:
    same = [(jobs["cpu-fp32/net"], _latency(_samples(1.0, seed=3))),
            (jobs["cpu-int8/net"], _latency(_samples(1.0, seed=4)))]
    assert speed.check(same) == [[], []]
    faster = [(jobs["cpu-fp32/net"], _latency(_samples(2.0, seed=5))), (jobs["cpu-int8/net"], _latency(_samples(1.0)))]
    assert speed.check(faster) == [[], []]
    # 1% slower with a 5% spread: 400 samples cannot tell it from noise
    close = [(jobs["cpu-fp32/net"], _latency(_samples(1.0, seed=6))),
             (jobs["cpu-int8/net"], _latency(_samples(1.01, seed=7)))]
    assert speed.check(close) == [[], []]


def test_the_verdict_follows_the_intervals_exactly(jobs: dict[str, plan.Job]) -> None:
    """Over many synthetic pairs around the edge of what can be told apart, a warning comes exactly when the
    exact binomial bounds (computed here) do not overlap, and its numbers are those bounds."""
    warned = quiet = 0
    for seed in range(40):
        a, b = _samples(1.0, n=200, seed=100 + seed), _samples(1.0 + seed * 0.001, n=200, seed=200 + seed)
        (_, got) = speed.check([(jobs["cpu-fp32/net"], _latency(a)), (jobs["cpu-int8/net"], _latency(b))])
        lo_b, _ = _exact_bounds(b, 0.99)
        _, up_a = _exact_bounds(a, 0.99)
        assert bool(got) == (lo_b > up_a), seed
        if got:
            assert (got[0]["lower_ms"], got[0]["than_upper_ms"]) == (lo_b, up_a)
            warned += 1
        else:
            quiet += 1
    assert warned and quiet  # both sides of the edge were exercised


def test_a_measurement_under_load_says_so_and_missing_timings_are_not_compared(jobs: dict[str, plan.Job]) -> None:
    loaded = _latency(_samples(2.1), unstable=["load 3.0 above the 2 CPUs: other work competed"])
    (_, (doc,)) = speed.check([(jobs["cpu-fp32/net"], _latency(_samples(1.76))), (jobs["cpu-int8/net"], loaded)])
    assert doc["unstable"] == ["cpu-int8/net: load 3.0 above the 2 CPUs: other work competed"]
    assert ("ms; measured under load or drift, which alone can slow one: cpu-int8/net: load 3.0 above the 2 CPUs: "
            "other work competed); it fails where") in doc["message"]
    untimed: LatencyDoc = {}  # --gates accuracy, or an emulated platform
    assert speed.check([(jobs["cpu-fp32/net"], untimed), (jobs["cpu-int8/net"], _latency(_samples(2.1)))]) == [[], []]
    other_set = _latency(_samples(2.1), name="test_data_set_1")
    fp32 = _latency(_samples(1.76))
    assert speed.check([(jobs["cpu-fp32/net"], fp32), (jobs["cpu-int8/net"], other_set)]) == [[], []]


def test_a_slower_fusion_warns(jobs: dict[str, plan.Job]) -> None:
    (_, (doc,)) = speed.check([(jobs["cpu-fp32/enc"], _latency(_samples(1.0))),
                               (jobs["cpu-fused/enc"], _latency(_samples(1.3, seed=9)))])
    assert doc["kind"] == "fusion" and doc["what"] == "fusion bert" and doc["than"] == "cpu-fp32/enc"
    assert doc["message"].startswith("fusion bert is 0.7")


def test_faster_than_fails_it_and_the_warning_says_so(jobs: dict[str, plan.Job]) -> None:
    """The existing relative gate, on the same numbers (int8 at 0.84x fp32's speed, `faster_than` ratio 1 against
    fp32): paired and interleaved, it FAILs; the speed warning names that verdict."""
    from ortbuild.gating.gates import latency as latency_gate
    from ortbuild.gating.measure import percentiles
    from ortbuild.gating.measure import sampling as latency
    from tests.test_latency import FakeClock, _lognormal

    clock = FakeClock()
    calls = {"cpu-int8-ft": clock.run(_lognormal(2.10, 1)), "cpu-fp32": clock.run(_lognormal(1.76, 2))}
    budgets = percentiles.budgets_of({}, "cpu-fp32", 1.0)
    out = latency.gate(calls, "cpu-int8-ft", budgets, latency.Plan(min_samples=400, min_seconds=0), clock=clock,
                       read=lambda: 1.0, cpus=2)
    lines: list[str] = []
    entry = latency_gate.data_set_entry("cpu-int8-ft/net", "cpu-int8-ft", "test_data_set_0", out, budgets,
                                 {"cpu-int8-ft": 1.0, "cpu-fp32": 1.0}, {"cpu-int8-ft": 1.0, "cpu-fp32": 1.0}, lines)
    assert entry["relative"]["verdict"] == "FAIL" and lines and "below faster_than ratio 1" in lines[0]
    fp32 = _latency(out.final.series["cpu-fp32"].samples)
    (_, (doc,)) = speed.check([(jobs["cpu-fp32/net"], fp32), (jobs["cpu-int8-ft/net"],
                                                             {"confidence": 0.99, "data_sets": [entry]})])
    assert doc["faster_than"] == "FAIL"
    assert doc["message"].endswith("its latency.faster_than (ratio 1 against cpu-fp32) judged it FAIL")


# ------------------------------------------------------------------------------------------- a real run

def _exact_bounds(samples: list[float], c: float) -> tuple[float, float]:
    """The median's one-sided bounds at confidence c by exact binomial sums: the largest k with P(X >= k) >= c
    (lower) and the smallest k with P(X <= k - 1) >= c (upper), X ~ Binomial(n, 1/2)."""
    xs = sorted(samples)
    n = len(xs)
    total = 2 ** n
    below = [0] * (n + 2)  # below[k] = #outcomes with X <= k - 1
    for k in range(1, n + 2):
        below[k] = below[k - 1] + math.comb(n, k - 1)
    lower = max(k for k in range(1, n + 1) if (total - below[k]) / total >= c)
    upper = min(k for k in range(1, n + 1) if below[k] / total >= c)
    return xs[lower - 1], xs[upper - 1]


@pytest.mark.runtime
def test_a_real_run_warns_exactly_when_its_intervals_say_slower(make_project: Callable[..., Path]) -> None:
    """fp32 and int8 of the example CNN, timed in one run (with one thread int8 ran at about 1.1x fp32's speed
    here, with two at 0.89-0.99x): whatever the machine did, the warning is there exactly when the recorded
    samples' intervals do not overlap."""
    path = make_project("""
        [targets.cpu-fp32]
        runtime = "RUNTIME"
        providers = ["CPUExecutionProvider"]
        session = { intra_op_num_threads = 1 }
        latency = { p90_ms = 1000, min_seconds = 0.3 }

        [targets.cpu-int8]
        extends = "cpu-fp32"
        precision = "int8-static"
        quantization = { format = "qdq", calibration_method = "minmax" }
    """, models=("tiny_cnn",), calibration=True)
    proc = run_cli("test", "-c", str(path), "--json", cwd=path.parent)
    assert proc.returncode == 0, proc.stderr[-3000:]
    res = {r["target"]: r for r in json.loads(proc.stdout)["results"]}
    fp32, int8 = res["cpu-fp32"]["latency"], res["cpu-int8"]["latency"]
    c = min(fp32["confidence"], int8["confidence"])
    _, fp32_upper = _exact_bounds(fp32["samples_ms"], c)
    int8_lower, _ = _exact_bounds(int8["samples_ms"], c)
    expected = int8_lower > fp32_upper
    assert bool(res["cpu-int8"]["speed"]) == expected, (int8_lower, fp32_upper, res["cpu-int8"]["speed"])
    assert res["cpu-fp32"]["speed"] == []
    # the per-job report and dist/report.json record the same
    on_disk = json.loads((path.parent / "dist" / "cpu-int8" / "tiny_cnn" / "test-report.json").read_text())
    assert on_disk["result"]["speed"] == res["cpu-int8"]["speed"]
    row = next(r for r in json.loads((path.parent / "dist" / "report.json").read_text())["results"]
               if r["target"] == "cpu-int8")
    assert row["speed"] == res["cpu-int8"]["speed"]
    if expected:
        (doc,) = res["cpu-int8"]["speed"]
        assert (doc["lower_ms"], doc["than_upper_ms"]) == (int8_lower, fp32_upper)
        assert doc["speed_ratio"] < 1 and len(doc["unstable"]) == len(fp32["unstable"]) + len(int8["unstable"])
        proc = run_cli("summary", "test", "-c", str(path), cwd=path.parent)
        assert f"[cpu-int8/tiny_cnn] warning: {doc['message']}" in proc.stdout
