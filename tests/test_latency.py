"""The latency verdicts: binomial order statistics, decided and undecided cases, relative budgets; the
sequential plan (early stopping with the error split over the looks), and FAILs measured under load."""

from __future__ import annotations

import math
import os
import random
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from ortbuild.gating.measure import load, percentiles
from ortbuild.gating.measure import sampling as latency


def _binom_cdf(k: int, n: int, p: float) -> float:
    """P(X <= k) for X ~ Binomial(n, p), summed term by term (exact binomial coefficients; n up to ~1000)."""
    return sum(math.comb(n, i) * p ** i * (1 - p) ** (n - i) for i in range(max(k + 1, 0)))


def _relative_verdict(mine: list[float], reference: list[float], ratio: float,
                      c: float) -> percentiles.PercentileVerdict:
    """"reference median / my median >= ratio" as the gate decides it: a relative budget's values (the median
    of ratio * mine_i / reference_i must be at most 1) under the percentile verdict."""
    budget = percentiles.Budget("relative", 0.5, ratio, "reference")
    scaled, limit = budget.values({"mine": mine, "reference": reference}, "mine")
    return percentiles.percentile_verdict(scaled, 0.5, limit, c)


def _samples(n: int, median: float = 1.0, seed: int = 0) -> list[float]:
    rng = random.Random(seed)
    return [median * rng.lognormvariate(0, 0.1) for _ in range(n)]


def test_order_statistics_match_loadgen() -> None:
    # MLPerf LoadGen's early stopping: 64 samples can bound p90 at 99% confidence, p99 needs 459+
    assert percentiles.upper_rank(64, 0.9, 0.99) == 63
    assert percentiles.upper_rank(43, 0.9, 0.99) is None
    assert percentiles.min_samples_to_bound(0.9, 0.99) == 44 and percentiles.min_samples_to_bound(0.99, 0.99) == 459
    assert percentiles.planned_samples([0.99], 0.99, 0) == 689 and percentiles.planned_samples([], 0.99, 0) == 100
    assert percentiles.planned_samples([0.9], 0.99, 250) == 250
    # the bound really holds: P(Binom(n, p) <= k-1) >= c
    k = percentiles.upper_rank(1000, 0.9, 0.99)
    assert k is not None and _binom_cdf(k - 1, 1000, 0.9) >= 0.99 > _binom_cdf(k - 2, 1000, 0.9)


def test_budget_well_above_passes_below_fails() -> None:
    xs = _samples(300)
    assert percentiles.percentile_verdict(xs, 0.9, 2.0, 0.99).verdict == latency.PASS
    v = percentiles.percentile_verdict(xs, 0.9, 0.5, 0.99)  # an absolute budget below what is measured
    assert v.verdict == latency.FAIL and v.exceeding == 300 and v.lower is not None and v.lower > 0.5


def test_budget_at_the_percentile_is_inconclusive_with_how_many_more_samples() -> None:
    xs = sorted(_samples(300))
    near = percentiles.percentile_verdict(xs, 0.9, xs[275], 0.99)  # between p90 and its 99% upper bound
    assert near.verdict == latency.INCONCLUSIVE
    assert near.more_samples is not None and near.more_samples > 0 and "more samples" in near.note
    # that many more samples at the observed exceedance rate decide it (the same samples, repeated)
    more = xs * math.ceil((300 + near.more_samples) / 300)
    assert percentiles.percentile_verdict(more, 0.9, near.budget, 0.99).verdict == latency.PASS
    too_few = percentiles.percentile_verdict(xs[:20], 0.99, 10.0, 0.99)
    assert too_few.verdict == latency.INCONCLUSIVE and too_few.upper is None


def test_a_verdict_as_json_holds_every_field_in_order() -> None:
    """PercentileVerdict.as_json is written out (typed): it says what dataclasses.asdict would, in the fields'
    order (a field added to the verdict and left out of as_json fails here)."""
    import dataclasses

    xs = sorted(_samples(300))
    for v in (percentiles.percentile_verdict(xs, 0.9, xs[275], 0.99),
              percentiles.percentile_verdict(xs[:20], 0.99, 10, 0.99)):
        assert latency.as_json(v) == dataclasses.asdict(v)
        assert list(latency.as_json(v)) == [f.name for f in dataclasses.fields(v)]


def test_relative_budget_from_paired_samples() -> None:
    ref = _samples(400, median=2.0, seed=3)
    fast = [r / 1.8 * random.Random(i).uniform(0.97, 1.03) for i, r in enumerate(ref)]
    assert _relative_verdict(fast, ref, 1.5, 0.99).verdict == latency.PASS
    assert _relative_verdict(fast, ref, 4.0, 0.99).verdict == latency.FAIL  # an impossible ratio


@pytest.mark.parametrize("p", [0.5, 0.9, 0.99])
def test_lower_bound_is_below_upper_bound(p: float) -> None:
    lo, up = percentiles.lower_rank(2000, p, 0.99), percentiles.upper_rank(2000, p, 0.99)
    assert lo is not None and up is not None and lo < math.ceil(p * 2000) <= up


# ------------------------------------------------------------------------------ the sequential plan


class FakeClock:
    """perf_counter for sample(): each run advances it by the duration the test gives."""

    def __init__(self) -> None:
        self.t = 0.0

    def __call__(self) -> float:
        return self.t

    def run(self, durations_ms: Iterator[float]) -> Callable[[], None]:
        def call() -> None:
            self.t += next(durations_ms) / 1e3
        return call


def _lognormal(median: float, seed: int) -> Iterator[float]:
    rng = random.Random(seed)
    while True:
        yield median * rng.lognormvariate(0, 0.1)


def _sample(budgets: list[percentiles.Budget], durations: dict[str, Iterator[float]], plan: latency.Plan,
            load: float = 1.0) -> latency.Attempt:
    clock = FakeClock()
    return latency.sample({n: clock.run(d) for n, d in durations.items()}, "a", budgets, plan, clock=clock,
                          read=lambda: load)


def test_look_shares_add_up_to_the_stated_error() -> None:
    assert percentiles.look_confidence(0.99, 1) == pytest.approx(0.995)
    assert percentiles.look_confidence(0.99, 2) == pytest.approx(1 - 0.01 / 6)
    assert sum(1 - percentiles.look_confidence(0.99, k) for k in range(1, 100_000)) == pytest.approx(0.01, rel=1e-4)
    looks = percentiles.checkpoints(20, 100)
    assert [next(looks) for _ in range(6)] == [20, 40, 80, 100, 160, 320]
    looks = percentiles.checkpoints(250, 250)
    assert [next(looks) for _ in range(3)] == [250, 500, 1000]


def test_an_impossible_budget_fails_at_the_first_look() -> None:
    # min_seconds is a minute of (fake) time: a decided verdict does not wait for it
    a = _sample(percentiles.budgets_of({0.9: 0.0001}), {"a": _lognormal(0.25, 0)}, latency.Plan(min_seconds=60))
    v = a.verdicts["p90"]
    assert v.verdict == latency.FAIL and v.samples == 20 < 100 and a.early and a.looks == 1
    assert v.confidence == 0.99 and v.lower_confidence == pytest.approx(0.995)  # the first look's share
    assert a.seconds < 0.01


def test_a_clear_pass_stops_early_and_an_undecided_budget_runs_the_plan() -> None:
    a = _sample(percentiles.budgets_of({0.9: 1000.0}), {"a": _lognormal(1.0, 1)}, latency.Plan(min_seconds=60))
    v = a.verdicts["p90"]
    # p90 can be bounded from above at its first PASS look's confidence 0.995 from 51 samples: the look at 80
    assert v.verdict == latency.PASS and v.samples == 80 and a.early
    assert v.upper_confidence == pytest.approx(0.995) and v.lower_confidence is not None and v.lower_confidence > 0.995
    # p90 of this lognormal is 1.137 (median 1): a budget on it cannot be decided, the plan runs to its end
    # (at least 100 samples and min_seconds, at a look: 2 s of 1 ms runs -> the look at 2560)
    a = _sample(percentiles.budgets_of({0.9: 1.137}), {"a": _lognormal(1.0, 2)}, latency.Plan(min_seconds=2))
    v = a.verdicts["p90"]
    assert v.verdict == latency.INCONCLUSIVE and not a.early and v.samples == 2560 and "more samples" in v.note
    # no budget: a brief sample (BRIEF_RUNS runs at most), the percentiles reported, min_seconds not waited for
    a = _sample([], {"a": _lognormal(1.0, 3)}, latency.Plan(min_seconds=60))
    assert len(a.series["a"].samples) == latency.BRIEF_RUNS == 50 and a.verdicts == {} and not a.early
    a = _sample([], {"a": _lognormal(1.0, 3)}, latency.Plan(min_samples=5, min_seconds=0))
    assert len(a.series["a"].samples) == 5 and a.looks == 0
    # min_samples: the first look (no verdict earlier)
    a = _sample(percentiles.budgets_of({0.9: 0.0001}), {"a": _lognormal(0.25, 0)}, latency.Plan(min_samples=250))
    assert a.verdicts["p90"].samples == 250


def _constant(ms: float) -> Iterator[float]:
    while True:
        yield ms


def test_without_a_budget_latency_is_measured_briefly_bounded_by_runs_and_by_time() -> None:
    """No budget, nothing to judge: at most BRIEF_RUNS runs or BRIEF_SECONDS, whichever comes first, never the
    hundreds of samples a p99 needs (a 3 s model took 100 x 3 s here before). Counted in runs, on a fake clock."""
    def samples(ms: float, plan: latency.Plan | None = None) -> int:
        return len(_sample([], {"a": _constant(ms)}, plan or latency.Plan()).series["a"].samples)

    assert samples(0.2) == 50                   # a fast model: the run cap
    assert samples(300.0) == 4                  # 300 ms runs: the first past 1 s of (fake) time
    assert samples(3000.0) == 1                 # a 3 s model: one run, never none
    assert samples(3000.0, latency.Plan(min_samples=3)) == 3  # min_samples asks for more: taken
    # a budget still samples to a verdict: p90 1000x the latency passes at its first PASS look, 80
    a = _sample(percentiles.budgets_of({0.9: 3e6}), {"a": _constant(3000.0)}, latency.Plan())
    assert len(a.series["a"].samples) == 80 and a.verdicts["p90"].verdict == latency.PASS


def test_warm_up_is_bounded_by_time_and_estimates_a_run() -> None:
    clock = FakeClock()
    count = 0

    def call() -> None:
        nonlocal count
        count += 1
        clock.t += 3.0                          # a 3 s model

    warmed = latency.warm_up({"a": call}, 5, latency.BRIEF_SECONDS, clock=clock)
    assert count == 2 and warmed.first_ms == {"a": 3000.0} and warmed.run_ms == {"a": 3000.0}  # first + 1
    count = 0
    warmed = latency.warm_up({"a": call}, 5, clock=clock)  # with a budget: every warm-up run
    assert count == 6 and warmed.round_seconds() == 3.0


def test_the_line_before_sampling_says_what_each_budget_needs_and_how_long() -> None:
    from ortbuild.gating.measure.sampling import said_before as latency_plan_said

    warmed = latency.Warmed({"a": 3500.0}, {"a": 3000.0})  # the estimate: the warm-up runs' median
    said = latency_plan_said("test_data_set_0", percentiles.budgets_of({0.99: 5000.0}), latency.Plan(), warmed)
    assert said == ("latency on test_data_set_0 (3.0 s a run): p99 budget needs at least 640 samples to PASS "
                    "(about 32 min); undecided, at most 689 (about 34 min); a FAIL can stop at 20")
    quick = latency.plan_of(0.99, 0, 1.0, 30.0, quick=True)  # 90%: p99 from 299 samples, the look at 320
    said = latency_plan_said("d", percentiles.budgets_of({0.9: 1.0, 0.99: 1.0}), quick,
                             latency.Warmed({}, {"a": 400.0}))
    assert "p90 budget needs at least 40 samples to PASS, p99 budget needs at least 320 samples to PASS " \
           "(about 2 min)" in said
    few = latency.Plan(min_samples=100)
    assert "the plan ends at 100 samples, fewer than a PASS needs" in latency_plan_said(
        "d", percentiles.budgets_of({0.99: 1.0}), few, warmed)
    assert latency_plan_said("d", [], latency.Plan(), warmed) == \
        "latency on d: no budget: a brief measurement (at most 50 runs or 1 s), reported, not judged"


def test_a_fail_stops_sampling_and_the_other_budgets_are_reported_undecided() -> None:
    # an impossible p50 with a generous p99: the p99 would need ~530 samples to PASS, but the p50 FAILs at the
    # first look and the gate's verdict is FAIL whatever the p99 says: sampling stops there
    clock, runs = FakeClock(), []
    step = clock.run(_lognormal(1.0, 8))

    def call() -> None:
        runs.append(1)
        step()
    a = latency.sample({"a": call}, "a", percentiles.budgets_of({0.5: 0.0001, 0.99: 1000.0}),
                       latency.Plan(min_seconds=60), clock=clock, read=lambda: 1.0)
    p50, p99 = a.verdicts["p50"], a.verdicts["p99"]
    assert len(runs) == 20 and a.looks == 1 and a.early and a.failed_on == ["p50"]
    assert p50.verdict == latency.FAIL and p50.samples == 20
    assert p99.verdict == latency.INCONCLUSIVE and p99.samples == 20 and p99.lower is not None  # its bounds, so far
    assert p99.upper is None  # 20 samples cannot bound a p99 from above
    assert p99.note.startswith("not decided: the gate had already failed on p50; ") and p99.more_samples
    # where no budget FAILs, sampling goes on until each is decided (the p99's PASS at its first possible look)
    runs.clear()
    a = latency.sample({"a": call}, "a", percentiles.budgets_of({0.5: 1000.0, 0.99: 1000.0}),
                       latency.Plan(min_seconds=0), clock=clock, read=lambda: 1.0)
    assert a.verdicts["p99"].verdict == latency.PASS and len(runs) > 500 and a.failed_on == []


def test_a_fail_under_load_that_stopped_sampling_is_still_measured_again() -> None:
    m = Machine(loaded_ms=3.0, quiet_ms=1.0, loaded=5.0, quiet=1.0)
    plan = latency.Plan(retry_wait_seconds=30, min_seconds=0)
    out = latency.gate({"a": m.call}, "a", percentiles.budgets_of({0.5: 2.0, 0.99: 1000.0}), plan, clock=m.clock,
                       read=m.read, wait=m.wait, cpus=2)
    first, again = out.attempts
    assert first.failed_on == ["p50"] and len(first.series["a"].samples) == 20 and m.waits == [(30, 2)]
    assert again.failed_on == []
    assert first.verdicts["p99"].verdict == latency.INCONCLUSIVE
    assert {k: v.verdict for k, v in out.verdicts.items()} == {"p50": latency.PASS, "p99": latency.PASS}
    # the FAIL persists under load: INCONCLUSIVE, and the p99 note no longer says the gate failed
    m = Machine(loaded_ms=3.0, quiet_ms=3.0, loaded=5.0, quiet=None)
    out = latency.gate({"a": m.call}, "a", percentiles.budgets_of({0.5: 2.0, 0.99: 1000.0}), plan, clock=m.clock,
                       read=m.read, wait=m.wait, cpus=2)
    assert [len(a.series["a"].samples) for a in out.attempts] == [20, 20]
    assert out.verdicts["p50"].verdict == out.verdicts["p99"].verdict == latency.INCONCLUSIVE
    assert out.verdicts["p99"].note.startswith("not decided: sampling stopped at the FAIL of p50 under load")
    # an impossible p50 stands without a retry, and stops the p99 at the first look
    m = Machine(loaded_ms=3.0, quiet_ms=1.0, loaded=5.0, quiet=1.0)
    out = latency.gate({"a": m.call}, "a", percentiles.budgets_of({0.5: 0.1, 0.99: 1000.0}), plan, clock=m.clock,
                       read=m.read, wait=m.wait, cpus=2)
    assert out.verdicts["p50"].verdict == latency.FAIL and m.waits == [] and len(out.final.series["a"].samples) == 20
    assert "already failed on p50" in out.verdicts["p99"].note


def _wrong_pass_rate(corrected: bool, runs: int = 300) -> float:
    """Uniform(0, 1) latencies (true p90 0.9) against a budget of 0.899: every PASS is wrong. Looks at 20, 40,
    ..., 1280 with the error split over them (corrected) or each at the full stated confidence."""
    wrong = 0
    for seed in range(runs):
        rng = random.Random(seed)
        xs: list[float] = []
        spent = percentiles.Spending()
        for n in (20, 40, 80, 160, 320, 640, 1280):
            xs += [rng.random() for _ in range(n - len(xs))]
            v = (percentiles.sequential_verdict(xs, 0.9, 0.899, 0.9, spent) if corrected else
                 percentiles.percentile_verdict(xs, 0.9, 0.899, 0.9, estimate=False))
            if v.verdict != latency.INCONCLUSIVE:
                wrong += v.verdict == latency.PASS
                break
    return wrong / runs


def test_the_sequential_plan_keeps_its_stated_confidence() -> None:
    # at confidence 0.9 (error 0.1, to be measurable in 300 runs), deciding at every look at the full
    # confidence passes a budget the percentile exceeds far more often than 10%; splitting the error over
    # the looks keeps it within
    naive, corrected = _wrong_pass_rate(False), _wrong_pass_rate(True)
    assert naive > 0.15 and corrected <= 0.1 and corrected < naive / 2, (naive, corrected)


def test_early_stop_keeps_the_relative_budget_interleaved_and_paired() -> None:
    calls: list[str] = []
    clock = FakeClock()
    fast, ref = _lognormal(1.0, 4), _lognormal(2.0, 5)

    def run(name: str, durations: Iterator[float]) -> Callable[[], None]:
        step = clock.run(durations)

        def call() -> None:
            calls.append(name)
            step()
        return call

    runs = {"a": run("a", fast), "b": run("b", ref)}
    first = latency.prepare(runs, warmup_runs=2)
    assert calls == ["a", "a", "a", "b", "b", "b"] and set(first) == {"a", "b"}  # first run, 2 warm-up: untimed
    calls.clear()
    a = latency.sample(runs, "a", percentiles.budgets_of({0.9: 1000.0}, "b", 1.5), latency.Plan(min_seconds=60),
                       clock=clock, read=lambda: 1.0)
    assert calls[:8] == ["a", "b", "b", "a", "a", "b", "b", "a"]  # timed, interleaved A B, B A, ...
    assert a.early and a.verdicts["relative"].verdict == latency.PASS and a.verdicts["p90"].verdict == latency.PASS
    assert len(a.series["a"].samples) == len(a.series["b"].samples) == a.verdicts["relative"].samples < 100
    # an impossible ratio fails early too, from the same pairs
    a = _sample(percentiles.budgets_of({}, "b", 100.0), {"a": _lognormal(1.0, 6), "b": _lognormal(2.0, 7)},
                latency.Plan(min_seconds=60))
    assert a.verdicts["relative"].verdict == latency.FAIL and a.verdicts["relative"].samples == 20


# ---------------------------------------------------------------------------------- FAILs under load


class Machine:
    """Latencies and load that change when the test's wait_for_quiet is called (the load falls)."""

    def __init__(self, loaded_ms: float, quiet_ms: float, loaded: float, quiet: float | None) -> None:
        self.clock = FakeClock()
        self.loaded = True
        self.load = {True: loaded, False: quiet if quiet is not None else loaded}
        self.ms = {True: loaded_ms, False: quiet_ms if quiet is not None else loaded_ms}
        self.waits: list[tuple[float, int]] = []
        self.rng = random.Random(0)

    def call(self) -> None:
        self.clock.t += self.ms[self.loaded] * self.rng.lognormvariate(0, 0.1) / 1e3

    def read(self) -> float:
        return self.load[self.loaded]

    def wait(self, seconds: float, cpus: int) -> dict[str, Any]:
        self.waits.append((seconds, cpus))
        self.loaded = False
        return {"quiet": self.load[False] <= cpus, "load": self.load[False], "waited_s": 3.0}

    def gate(self, budget_ms: float) -> latency.Outcome:
        self.said: list[str] = []
        return latency.gate({"a": self.call}, "a", percentiles.budgets_of({0.9: budget_ms}),
                            latency.Plan(retry_wait_seconds=30, min_seconds=0), clock=self.clock, read=self.read,
                            wait=self.wait, cpus=2, say=self.said.append)


def test_a_fail_under_load_is_measured_again_once_the_load_falls() -> None:
    m = Machine(loaded_ms=3.0, quiet_ms=1.0, loaded=5.0, quiet=1.0)
    out = m.gate(2.0)
    assert m.waits == [(30, 2)] and [a.verdicts["p90"].verdict for a in out.attempts] == [latency.FAIL, latency.PASS]
    assert out.verdicts["p90"].verdict == latency.PASS and out.attempts[0].series["a"].load == 5.0
    assert out.retry["why"].startswith("p90 FAIL under load 5.0 above the 2 CPUs") and out.retry["quiet"]
    # said before the wait, so that a terminal is not left repeating the first run's line for 30 s
    assert m.said == ["p90 FAIL under load 5.0 above the 2 CPUs: other work competed: waiting up to 30 s for the load "
                      "to fall, then measuring again"]


def test_a_fail_that_persists_under_load_is_inconclusive() -> None:
    m = Machine(loaded_ms=3.0, quiet_ms=3.0, loaded=5.0, quiet=None)
    out = m.gate(2.0)
    v = out.verdicts["p90"]
    assert len(m.waits) == 1 and [a.verdicts["p90"].verdict for a in out.attempts] == [latency.FAIL] * 2
    assert v.verdict == latency.INCONCLUSIVE and "FAIL measured under load 5.0 on 2 CPUs" in v.note
    assert "rerun on a quiet machine" in v.note


def test_a_fail_the_load_cannot_explain_stands_and_a_quiet_fail_is_not_retried() -> None:
    # 3 ms runs under load 5 on 2 CPUs: at most 2 x 2.5 = 5x slower than quiet, never below 0.6 ms: a
    # budget of 0.1 ms fails whatever the load
    m = Machine(loaded_ms=3.0, quiet_ms=1.0, loaded=5.0, quiet=1.0)
    out = m.gate(0.1)
    assert out.verdicts["p90"].verdict == latency.FAIL and m.waits == [] and len(out.attempts) == 1
    m = Machine(loaded_ms=3.0, quiet_ms=3.0, loaded=1.0, quiet=None)
    out = m.gate(2.0)
    assert out.verdicts["p90"].verdict == latency.FAIL and m.waits == []


def test_a_fail_while_the_median_drifts_is_measured_again_then_inconclusive() -> None:
    clock = FakeClock()
    ramp = {"i": 0}

    def call() -> None:  # 1 ms, 1.01 ms, 1.02 ms, ...: the machine slows down as it runs (and again after the wait)
        clock.t += (1.0 + 0.01 * ramp["i"]) / 1e3
        ramp["i"] += 1

    def wait(seconds: float, cpus: int) -> dict[str, Any]:
        ramp["i"] = 0
        return {"quiet": True, "load": 1.0, "waited_s": 0.0}
    out = latency.gate({"a": call}, "a", percentiles.budgets_of({0.9: 1.2}), latency.Plan(min_seconds=0), clock=clock,
                       read=lambda: 1.0, wait=wait, cpus=2)
    assert [a.verdicts["p90"].verdict for a in out.attempts] == [latency.FAIL] * 2
    assert out.retry["why"].startswith("p90 FAIL under median drifted")
    v = out.verdicts["p90"]
    assert v.verdict == latency.INCONCLUSIVE and v.note.startswith("FAIL measured under drift (median drifted ")


def test_wait_for_quiet_polls_until_the_load_falls_and_no_longer() -> None:
    clock = FakeClock()

    def sleep(s: float) -> None:
        clock.t += s

    def read() -> float:
        return 4.0 if clock.t < 5 else 1.0
    out = load.wait_for_quiet(30, 2, read, clock, sleep)
    assert out["quiet"] and 5.0 < out["waited_s"] <= 6.1  # the last second's mean at most the CPU count
    clock.t = 0.0
    out = load.wait_for_quiet(3, 2, lambda: 4.0, clock, sleep)
    assert not out["quiet"] and out["load"] == 4.0 and 3.0 <= out["waited_s"] <= 3.2


def _busy(n: int) -> Callable[[], None]:
    def run() -> None:
        x = 0
        for i in range(n):
            x += i * i
    return run


@pytest.mark.serial  # its budget comes from a quiet run: no other test may load the machine
@pytest.mark.skipif(load.runnable() is None, reason="needs Linux's /proc/loadavg")
def test_under_cpu_burners_a_budget_the_quiet_run_meets_never_fails() -> None:
    run = _busy(30_000)  # about 1 ms of pure Python, one thread
    calls = {"w": run}
    latency.prepare(calls, 20)
    quiet = latency.sample(calls, "w", [], latency.Plan(min_samples=200, min_seconds=0))
    budget = 3 * quiet.series["w"].summary()["p90_ms"]
    assert percentiles.percentile_verdict(quiet.series["w"].samples, 0.9, budget, 0.99).verdict == latency.PASS
    cpus = os.cpu_count() or 1
    burn = "import time\nend = time.time() + 4\nwhile time.time() < end:\n    pass\n"
    burners = [subprocess.Popen([sys.executable, "-c", burn]) for _ in range(cpus + 1)]
    try:
        time.sleep(0.3)
        t0 = time.monotonic()
        out = latency.gate(calls, "w", percentiles.budgets_of({0.9: budget}),
                           latency.Plan(min_seconds=1.0, retry_wait_seconds=10))
        took = time.monotonic() - t0
    finally:
        for p in burners:
            p.kill()
            p.wait()
    first = out.attempts[0]
    print(f"quiet p90 {budget / 3:.3f} ms, budget {budget:.3f} ms; under load {first.series['w'].load}: "
          f"{[(a.verdicts['p90'].verdict, len(a.series['w'].samples), a.series['w'].load) for a in out.attempts]} "
          f"-> {out.verdicts['p90'].verdict} in {took:.1f} s; retry {out.retry}")
    assert first.series["w"].load is not None and first.series["w"].load > cpus  # it really ran under load
    assert out.verdicts["p90"].verdict in (latency.PASS, latency.INCONCLUSIVE)
    assert first.verdicts["p90"].verdict != latency.FAIL or out.retry  # a FAIL under load was measured again


def test_data_set_budgets_override_the_targets_key_by_key(tmp_path: Path) -> None:
    from ortbuild.errors import ConfigError
    from ortbuild.project import config
    from tests.conftest import model_table

    toml = ('[project]\nname = "t"\nversion = "1"\n\n' + model_table("tiny_cnn") + """
[targets.cpu]
runtime = "onnxruntime==1.31.1"
providers = ["CPUExecutionProvider"]
latency = { p90_ms = 50, p99_ms = 100, data_sets = { test_data_set_1 = { p90_ms = 200 } } }

[targets.child]
extends = "cpu"
latency = { data_sets = { test_data_set_1 = { p99_ms = 300 } } }
""")
    (tmp_path / "targets.toml").write_text(toml)
    project = config.load(tmp_path / "targets.toml")
    lat = project.targets["cpu"].settings["tiny_cnn"].gates.latency  # type: ignore[union-attr]
    assert lat.budgets("test_data_set_0") == lat.budgets() == {0.9: 50.0, 0.99: 100.0}
    assert lat.budgets("test_data_set_1") == {0.9: 200.0, 0.99: 100.0} and lat.retry_wait_seconds == 30
    child = project.targets["child"].settings["tiny_cnn"].gates.latency  # type: ignore[union-attr]
    assert child.budgets("test_data_set_1") == {0.9: 200.0, 0.99: 300.0}  # merged through extends
    (tmp_path / "targets.toml").write_text(toml.replace("p99_ms = 300", "p95_ms = 300"))
    with pytest.raises(ConfigError) as err:
        config.load(tmp_path / "targets.toml")
    assert err.value.where == "targets.child.latency.data_sets.test_data_set_1"
    assert "did you mean 'p99_ms'" in str(err.value)
