"""Distribution-free verdicts on latency percentiles: binomial order statistics, and the sequential plan.

The verdict on "the p-th percentile is at most B ms" uses binomial order statistics, as MLPerf LoadGen's early
stopping does: the k-th smallest of n samples is an upper confidence bound on the percentile when
P(Binom(n, p) <= k-1) >= c. PASS when the upper bound is within the budget, FAIL when the lower bound is above
it, else INCONCLUSIVE, with how many more samples (at the observed exceedance rate) would decide.

Looking more than once inflates the error, so the error 1 - c of each direction (a wrong PASS, a wrong FAIL)
is split over that direction's looks, 1/(k(k+1)) of it to the k-th (1/2, 1/6, 1/12, ...: the shares sum to 1
however many looks there are), and a look spends a share only when it can decide in that direction at that
sample count (which does not depend on the samples). Measuring, and the looks a run takes:
ortbuild.gating.measure.sampling and ortbuild.gating.measure.engine.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable, Iterator, Mapping
from dataclasses import asdict, dataclass, replace
from typing import cast

from ortbuild.gating.timing_records import PercentileVerdictDoc
from ortbuild.status import Verdict

MAX_SAMPLES_ASKED = 200_000  # "more samples" beyond this cannot decide: the budget sits on the percentile


def _log_pmf(k: int, n: int, p: float) -> float:
    if p <= 0.0:
        return 0.0 if k == 0 else -math.inf
    if p >= 1.0:
        return 0.0 if k == n else -math.inf
    return (math.lgamma(n + 1) - math.lgamma(k + 1) - math.lgamma(n - k + 1)
            + k * math.log(p) + (n - k) * math.log1p(-p))


@functools.lru_cache(maxsize=4096)
def upper_rank(n: int, p: float, c: float) -> int | None:
    """The smallest k (1-based) whose order statistic x_(k) bounds the p-th percentile from above with
    confidence c: P(Binom(n, p) <= k - 1) >= c. None when n samples cannot bound it. (Summed from the side of
    the distribution the answer lies nearer: about n * min(p, 1 - p) terms, not n, for p90 and p99.)"""
    if p <= 0.5:
        acc = 0.0
        for k in range(1, n + 1):
            acc += math.exp(_log_pmf(k - 1, n, p))
            if acc >= c:
                return k
        return None
    # P(X <= k - 1) >= c  <=>  P(X >= k) <= 1 - c: the smallest such k, with the upper tail summed from k = n down
    tail, err = 0.0, 1.0 - c
    for k in range(n, 0, -1):
        tail += math.exp(_log_pmf(k, n, p))
        if tail > err:
            return k + 1 if k < n else None
    return 1


@functools.lru_cache(maxsize=4096)
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
    """The samples an undecided verdict runs to: min_samples, or (0) at least 100 and 1.5x what can bound
    the tightest budgeted percentile."""
    if min_samples:
        return min_samples
    need = max((min_samples_to_bound(p, c) for p in budgeted), default=0)
    return max(100, math.ceil(1.5 * need))


def fewest_to_pass(p: float, c: float, first: int, end: int) -> int:
    """The fewest samples at which a budget on the p-th percentile can PASS: the first checkpoint (the first look
    at `first`, doubling, the plan's `end` among them) with enough samples to bound the percentile at its first
    PASS look's share of the error (p90: 80 at 0.99 from a first look at 20; p99: 640)."""
    need = min_samples_to_bound(p, look_confidence(c, 1))
    return next(n for n in checkpoints(first, end) if n >= need)


def look_confidence(c: float, k: int) -> float:
    """The confidence of a direction's k-th look (1-based): it gets 1/(k(k+1)) of the error 1 - c."""
    return 1 - (1 - c) / (k * (k + 1))


def checkpoints(first: int, end: int) -> Iterator[int]:
    """The sample counts sampling is looked at: first, doubling from there, and the plan's end among them."""
    n = max(1, first)
    while True:
        if n > end > n // 2:  # the plan's end lies between the previous checkpoint and this one
            yield end
        yield n
        n *= 2


@dataclass(frozen=True)
class PercentileVerdict:
    percentile: float                # 0.5, 0.9, 0.99
    budget: float                    # same unit as the samples
    observed: float                  # nearest-rank empirical percentile
    upper: float | None              # confidence bounds (None: too few samples)
    lower: float | None
    exceeding: int                   # samples above the budget
    samples: int
    confidence: float                # the stated confidence of the verdict, every look of it accounted for
    verdict: Verdict
    more_samples: int | None = None  # INCONCLUSIVE: how many more would decide at the observed rate
    note: str = ""
    upper_confidence: float | None = None  # what each bound was computed at: its look's share of the error
    lower_confidence: float | None = None

    def as_json(self) -> PercentileVerdictDoc:
        """Every field, in order; PercentileVerdictDoc names the same (tests/test_latency.py)."""
        return cast(PercentileVerdictDoc, asdict(self))


def _decided(n: int, exceeding: int, p: float, c_up: float, c_lo: float | None = None) -> Verdict | None:
    """The verdict of n samples of which `exceeding` are above the budget."""
    up, lo = upper_rank(n, p, c_up), lower_rank(n, p, c_up if c_lo is None else c_lo)
    if up is not None and n - exceeding >= up:
        return Verdict.PASS  # x_(up) <= budget: at least `up` samples are within it
    if lo is not None and n - exceeding < lo:
        return Verdict.FAIL  # x_(lo) > budget
    return None


def _more_needed(n: int, exceeding: int, p: float, c_up: float, c_lo: float) -> int | None:
    """Extra samples that would decide, if the exceedance rate stayed as observed (None: not within the cap)."""
    rate = exceeding / n

    def decides(m: int) -> bool:
        return _decided(m, round(rate * m), p, c_up, c_lo) is not None

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


def _verdict(samples: list[float], p: float, budget: float, c: float, c_up: float, c_lo: float,
             estimate: bool = True) -> PercentileVerdict:
    xs = sorted(samples)
    n = len(xs)
    up, lo = upper_rank(n, p, c_up), lower_rank(n, p, c_lo)
    exceeding = sum(x > budget for x in xs)
    decided = _decided(n, exceeding, p, c_up, c_lo)
    verdict = Verdict.INCONCLUSIVE if decided is None else decided  # not `or`: FAIL is falsy
    v = PercentileVerdict(p, budget, nearest_rank(xs, p), xs[up - 1] if up else None, xs[lo - 1] if lo else None,
                          exceeding, n, c, verdict, None, "", c_up, c_lo)
    return with_estimate(v) if estimate else v


def with_estimate(v: PercentileVerdict) -> PercentileVerdict:
    """An INCONCLUSIVE verdict with how many more samples would decide it (at its bounds' confidences)."""
    if v.verdict is not Verdict.INCONCLUSIVE:
        return v
    c_up = v.confidence if v.upper_confidence is None else v.upper_confidence
    c_lo = v.confidence if v.lower_confidence is None else v.lower_confidence
    more = _more_needed(v.samples, v.exceeding, v.percentile, c_up, c_lo)
    return replace(v, more_samples=more, note=(
        f"about {more} more samples would decide" if more is not None else
        "the percentile sits on the budget: more samples will not decide; give the budget headroom"))


def percentile_verdict(samples: list[float], p: float, budget: float, c: float,
                       estimate: bool = True) -> PercentileVerdict:
    """The verdict of one look at `samples` (a plan fixed in advance) at confidence c (`estimate`: with how many
    more samples would decide an INCONCLUSIVE one)."""
    return _verdict(samples, p, budget, c, c, c, estimate)


@dataclass
class Spending:
    """How many looks one budget's verdict has taken in each direction (PASS, FAIL): its k-th look in a
    direction decides at look_confidence(c, k)."""

    passes: int = 0
    fails: int = 0


def sequential_verdict(samples: list[float], p: float, budget: float, c: float, spent: Spending) -> PercentileVerdict:
    """The verdict of one look of a sequential plan: each direction that can decide at this many samples spends
    its next share of the error (counted in `spent`). INCONCLUSIVE comes without the estimate (with_estimate)."""
    n = len(samples)
    c_up, c_lo = look_confidence(c, spent.passes + 1), look_confidence(c, spent.fails + 1)
    if upper_rank(n, p, c_up) is not None:
        spent.passes += 1
    if lower_rank(n, p, c_lo) is not None:
        spent.fails += 1
    return _verdict(samples, p, budget, c, c_up, c_lo, estimate=False)


@dataclass(frozen=True)
class Budget:
    """One verdict to reach: the `percentile` of my latency within `limit` ms, or (with a `reference`) the
    median of limit * mine_i / reference_i over the paired samples at most 1 (`faster_than`, ratio `limit`)."""

    kind: str                        # "p50", "p90", "p99" or "relative"
    percentile: float
    limit: float
    reference: str | None = None

    def values(self, series: Mapping[str, list[float]], mine: str) -> tuple[list[float], float]:
        """What the percentile test runs on, and its budget."""
        if self.reference is None:
            return series[mine], self.limit
        return [self.limit * m / r for m, r in zip(series[mine], series[self.reference], strict=True)], 1.0


def budgets_of(percentiles: Mapping[float, float], reference: str | None = None, ratio: float = 0.0) -> list[Budget]:
    """The budgets of {percentile: ms}, and a relative one when `reference` is given."""
    out = [Budget(f"p{round(p * 100)}", p, ms) for p, ms in percentiles.items()]
    return [*out, Budget("relative", 0.5, ratio, reference)] if reference is not None else out


def duration(seconds: float) -> str:
    """A duration as said before a phase: `0.4 s`, `34 s`, `26 min`, `1.5 h`."""
    if seconds < 10:
        return f"{seconds:.1g} s" if seconds < 1 else f"{seconds:.1f} s"
    if seconds < 90:
        return f"{seconds:.0f} s"
    return f"{seconds / 60:.0f} min" if seconds < 90 * 60 else f"{seconds / 3600:.1f} h"


def plan_said(budgets: list[Budget], confidence: float, first: int, end: int,
              seconds_for: Callable[[int], float], unit: str = "samples") -> str:
    """What sampling to a verdict takes, said before it starts: each budget's fewest `unit` to PASS, with the
    time they take (`seconds_for(n)`), the plan's end if undecided, and the first look, where a FAIL can stop it:
    "p99 budget needs at least 640 samples to PASS (about 32 min); undecided: ..."."""
    needs = {b.kind: fewest_to_pass(b.percentile, confidence, first, end) for b in budgets}
    most = max(needs.values())
    said = ", ".join(f"{k} budget needs at least {n} {unit} to PASS" for k, n in needs.items())
    said += f" (about {duration(seconds_for(most))})"
    if most > end:
        said += f"; the plan ends at {end} {unit}, fewer than a PASS needs (set min_samples 0 or higher)"
    else:
        said += f"; undecided, at most {end} (about {duration(seconds_for(end))})"
    return said + f"; a FAIL can stop at {first}"


def retry_said(failed: list[str], why: str, wait_s: float) -> str:
    """The line said before a retry: which budgets failed under what, and the wait for the load to fall."""
    return (f"{', '.join(failed)} FAIL under {why}: waiting up to {wait_s:g} s for the load to fall, then measuring "
            "again")
