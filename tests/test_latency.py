"""The latency verdicts: binomial order statistics, decided and undecided cases, relative budgets."""

from __future__ import annotations

import math
import random

import pytest

from ortbuild import latency


def _samples(n: int, median: float = 1.0, seed: int = 0) -> list[float]:
    rng = random.Random(seed)
    return [median * rng.lognormvariate(0, 0.1) for _ in range(n)]


def test_order_statistics_match_loadgen() -> None:
    # MLPerf LoadGen's early stopping: 64 samples can bound p90 at 99% confidence, p99 needs 459+
    assert latency.upper_rank(64, 0.9, 0.99) == 63
    assert latency.upper_rank(43, 0.9, 0.99) is None
    assert latency.min_samples_to_bound(0.9, 0.99) == 44 and latency.min_samples_to_bound(0.99, 0.99) == 459
    assert latency.planned_samples([0.99], 0.99, 0) == 689 and latency.planned_samples([], 0.99, 0) == 100
    assert latency.planned_samples([0.9], 0.99, 250) == 250
    # the bound really holds: P(Binom(n, p) <= k-1) >= c
    k = latency.upper_rank(1000, 0.9, 0.99)
    assert k is not None and latency.binom_cdf(k - 1, 1000, 0.9) >= 0.99 > latency.binom_cdf(k - 2, 1000, 0.9)


def test_budget_well_above_passes_below_fails() -> None:
    xs = _samples(300)
    assert latency.percentile_verdict(xs, 0.9, 2.0, 0.99).verdict == latency.PASS
    v = latency.percentile_verdict(xs, 0.9, 0.5, 0.99)  # an absolute budget below what is measured
    assert v.verdict == latency.FAIL and v.exceeding == 300 and v.lower is not None and v.lower > 0.5


def test_budget_at_the_percentile_is_inconclusive_with_how_many_more_samples() -> None:
    xs = sorted(_samples(300))
    near = latency.percentile_verdict(xs, 0.9, xs[275], 0.99)  # between p90 and its 99% upper bound
    assert near.verdict == latency.INCONCLUSIVE
    assert near.more_samples is not None and near.more_samples > 0 and "more samples" in near.note
    # that many more samples at the observed exceedance rate decide it (the same samples, repeated)
    more = xs * math.ceil((300 + near.more_samples) / 300)
    assert latency.percentile_verdict(more, 0.9, near.budget, 0.99).verdict == latency.PASS
    too_few = latency.percentile_verdict(xs[:20], 0.99, 10.0, 0.99)
    assert too_few.verdict == latency.INCONCLUSIVE and too_few.upper is None


def test_relative_budget_from_paired_samples() -> None:
    ref = _samples(400, median=2.0, seed=3)
    fast = [r / 1.8 * random.Random(i).uniform(0.97, 1.03) for i, r in enumerate(ref)]
    assert latency.relative_verdict(fast, ref, 1.5, 0.99).verdict == latency.PASS
    assert latency.relative_verdict(fast, ref, 4.0, 0.99).verdict == latency.FAIL  # an impossible ratio


def test_measure_interleaves_and_excludes_warmup() -> None:
    calls: list[str] = []

    def opener(name: str) -> object:
        def open_() -> object:
            calls.append(f"open {name}")
            return lambda: calls.append(name)
        return open_

    series = latency.measure({"a": opener("a"), "b": opener("b")}, samples=4, min_seconds=0,  # type: ignore[dict-item]
                             warmup_runs=2)
    assert calls[:8] == ["open a", "a", "a", "a", "open b", "b", "b", "b"]  # session, first, 2 warm-up: untimed
    assert calls[8:] == ["a", "b", "b", "a", "a", "b", "b", "a"]  # timed, interleaved A B, B A, ...
    assert [len(s.samples) for s in series.values()] == [4, 4]
    assert all(s.session_ms >= 0 and s.first_run_ms >= 0 for s in series.values())


@pytest.mark.parametrize("p", [0.5, 0.9, 0.99])
def test_lower_bound_is_below_upper_bound(p: float) -> None:
    lo, up = latency.lower_rank(2000, p, 0.99), latency.upper_rank(2000, p, 0.99)
    assert lo is not None and up is not None and lo < math.ceil(p * 2000) <= up
