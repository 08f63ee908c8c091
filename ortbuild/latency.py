"""Latency measurement and distribution-free verdicts on percentiles.

Method (docs/testing.md): session creation and the first run are timed and reported apart; `warmup_runs`
untimed runs follow; then a sample plan fixed in advance (at least `min_samples` and `min_seconds`), with
the runs of several artifacts interleaved (A B, B A, ...) when they are compared. The verdict on "the p-th
percentile is at most B ms" uses binomial order statistics, as MLPerf LoadGen's early stopping does: the
k-th smallest of n samples is an upper confidence bound on the percentile when P(Binom(n, p) <= k-1) >= c.
PASS when the upper bound is within the budget, FAIL when the lower bound is above it, else INCONCLUSIVE,
with how many more samples (at the observed exceedance rate) would decide.
"""

from __future__ import annotations

import math
import os
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import Any

PASS, FAIL, INCONCLUSIVE = "PASS", "FAIL", "INCONCLUSIVE"
MAX_SAMPLES_ASKED = 200_000  # "more samples" beyond this cannot decide: the budget sits on the percentile


def _log_pmf(k: int, n: int, p: float) -> float:
    if p <= 0.0:
        return 0.0 if k == 0 else -math.inf
    if p >= 1.0:
        return 0.0 if k == n else -math.inf
    return (math.lgamma(n + 1) - math.lgamma(k + 1) - math.lgamma(n - k + 1)
            + k * math.log(p) + (n - k) * math.log1p(-p))


def binom_cdf(k: int, n: int, p: float) -> float:
    """P(X <= k) for X ~ Binomial(n, p)."""
    if k < 0:
        return 0.0
    if k >= n:
        return 1.0
    return min(1.0, sum(math.exp(_log_pmf(i, n, p)) for i in range(k + 1)))


def upper_rank(n: int, p: float, c: float) -> int | None:
    """The smallest k (1-based) whose order statistic x_(k) bounds the p-th percentile from above with
    confidence c: P(Binom(n, p) <= k - 1) >= c. None when n samples cannot bound it."""
    acc = 0.0
    for k in range(1, n + 1):
        acc += math.exp(_log_pmf(k - 1, n, p))
        if acc >= c:
            return k
    return None


def lower_rank(n: int, p: float, c: float) -> int | None:
    """The largest k whose order statistic x_(k) bounds the p-th percentile from below with confidence c:
    P(Binom(n, p) >= k) >= c. None when n samples cannot bound it."""
    acc = 0.0  # P(X >= k), accumulated from k = n down
    for k in range(n, 0, -1):
        acc += math.exp(_log_pmf(k, n, p))
        if acc >= c:
            return k
    return None


def min_samples_to_bound(p: float, c: float) -> int:
    """The fewest samples whose maximum bounds the p-th percentile with confidence c (p90: 44, p99: 459)."""
    return math.ceil(math.log(1 - c) / math.log(p))


def planned_samples(budgeted: list[float], c: float, min_samples: int) -> int:
    """min_samples, or (0) at least 100 and 1.5x what can bound the tightest budgeted percentile."""
    if min_samples:
        return min_samples
    need = max((min_samples_to_bound(p, c) for p in budgeted), default=0)
    return max(100, math.ceil(1.5 * need))


@dataclass(frozen=True)
class PercentileVerdict:
    percentile: float                # 0.5, 0.9, 0.99
    budget: float                    # same unit as the samples
    observed: float                  # nearest-rank empirical percentile
    upper: float | None              # confidence bounds (None: too few samples)
    lower: float | None
    exceeding: int                   # samples above the budget
    samples: int
    confidence: float
    verdict: str
    more_samples: int | None = None  # INCONCLUSIVE: how many more would decide at the observed rate
    note: str = ""


def _decided(n: int, exceeding: int, p: float, c: float) -> str | None:
    """The verdict of n samples of which `exceeding` are above the budget."""
    up, lo = upper_rank(n, p, c), lower_rank(n, p, c)
    if up is not None and n - exceeding >= up:
        return PASS  # x_(up) <= budget: at least `up` samples are within it
    if lo is not None and n - exceeding < lo:
        return FAIL  # x_(lo) > budget
    return None


def _more_needed(n: int, exceeding: int, p: float, c: float) -> int | None:
    """Extra samples that would decide, if the exceedance rate stayed as observed (None: not within the cap)."""
    rate = exceeding / n

    def decides(m: int) -> bool:
        return _decided(m, round(rate * m), p, c) is not None

    hi = n
    while not decides(hi):
        hi *= 2
        if hi > MAX_SAMPLES_ASKED:
            return None
    lo = max(n, hi // 2)
    while lo < hi:  # the smallest deciding count (close enough: the rate is an estimate anyway)
        mid = (lo + hi) // 2
        if decides(mid):
            hi = mid
        else:
            lo = mid + 1
    return hi - n


def nearest_rank(sorted_samples: list[float], p: float) -> float:
    return sorted_samples[max(0, math.ceil(p * len(sorted_samples)) - 1)]


def percentile_verdict(samples: list[float], p: float, budget: float, c: float) -> PercentileVerdict:
    xs = sorted(samples)
    n = len(xs)
    up, lo = upper_rank(n, p, c), lower_rank(n, p, c)
    exceeding = sum(x > budget for x in xs)
    verdict = _decided(n, exceeding, p, c) or INCONCLUSIVE
    more, note = None, ""
    if verdict == INCONCLUSIVE:
        more = _more_needed(n, exceeding, p, c)
        note = (f"about {more} more samples would decide" if more is not None else
                "the percentile sits on the budget: more samples will not decide; give the budget headroom")
    return PercentileVerdict(p, budget, nearest_rank(xs, p), xs[up - 1] if up else None, xs[lo - 1] if lo else None,
                             exceeding, n, c, verdict, more, note)


@dataclass
class Series:
    """The timings of one artifact in one run, in milliseconds."""

    name: str
    session_ms: float = 0.0
    first_run_ms: float = 0.0
    samples: list[float] = field(default_factory=list)

    def summary(self) -> dict[str, Any]:
        xs = sorted(self.samples)
        mean = sum(xs) / len(xs)
        sd = math.sqrt(sum((x - mean) ** 2 for x in xs) / max(1, len(xs) - 1))
        return {"samples": len(xs), "min_ms": xs[0], "p50_ms": nearest_rank(xs, 0.5), "p90_ms": nearest_rank(xs, 0.9),
                "p99_ms": nearest_rank(xs, 0.99), "max_ms": xs[-1], "mean_ms": mean, "cov": sd / mean if mean else 0.0,
                "session_ms": self.session_ms, "first_run_ms": self.first_run_ms}

    def instability(self) -> list[str]:
        """Why these samples should not be trusted as they are (empty: stable)."""
        why = []
        third = len(self.samples) // 3
        if third >= 10:
            first = sorted(self.samples[:third])[third // 2]
            last = sorted(self.samples[-third:])[third // 2]
            drift = abs(last - first) / min(first, last)
            if drift > 0.10:
                why.append(f"median drifted {drift:.0%} between the first and last third of the run")
        load = os.getloadavg()[0]
        cpus = os.cpu_count() or 1
        if load > cpus:
            why.append(f"load average {load:.1f} above the {cpus} CPUs: other work competed")
        return why


def measure(opens: dict[str, Callable[[], Callable[[], object]]], samples: int, min_seconds: float,
            warmup_runs: int) -> dict[str, Series]:
    """Time each artifact: `opens` maps a name to a function that creates its session and returns one inference.

    Session creation and the first run are timed apart, then `warmup_runs` untimed runs, then at least
    `samples` timed runs each and `min_seconds` in all, interleaved (A B, B A, ...) between the artifacts.
    """
    series = {name: Series(name) for name in opens}
    calls: dict[str, Callable[[], object]] = {}
    for name, open_ in opens.items():
        t0 = time.perf_counter()
        calls[name] = open_()
        series[name].session_ms = (time.perf_counter() - t0) * 1e3
        t0 = time.perf_counter()
        calls[name]()
        series[name].first_run_ms = (time.perf_counter() - t0) * 1e3
        for _ in range(warmup_runs):
            calls[name]()
    order = list(opens)
    start, i = time.perf_counter(), 0
    while i < samples or time.perf_counter() - start < min_seconds:
        for name in (order if i % 2 == 0 else order[::-1]):
            t0 = time.perf_counter()
            calls[name]()
            series[name].samples.append((time.perf_counter() - t0) * 1e3)
        i += 1
    return series


def relative_verdict(mine: list[float], reference: list[float], ratio: float, c: float) -> PercentileVerdict:
    """"reference median / my median >= ratio" from paired, interleaved samples: the median of
    ratio * mine_i / reference_i must be at most 1 (a sign test, the same order statistics)."""
    scaled = [ratio * m / r for m, r in zip(mine, reference, strict=True)]
    return percentile_verdict(scaled, 0.5, 1.0, c)


def as_json(v: PercentileVerdict) -> dict[str, Any]:
    return asdict(v)
