"""The statistics of the `eval` gate (ortbuild.gating.measure.task_eval): bounds on the drop of a task metric from
the fp32 source to the artifact, measured on the same samples (paired), each a one-sided bound at the target's
`confidence`.

Accuracy (exact). Each sample is right or wrong for the source and for the artifact. Let b be the samples the source
gets right and the artifact wrong, c the reverse (the discordant pairs; the concordant ones say nothing about the
difference), n all samples. The drop of accuracy is D = (b - c) / n, an estimate of p_b - p_c, where p_b and p_c
are the probabilities of the two kinds of discordance. b ~ Binomial(n, p_b) and c ~ Binomial(n, p_c), so with
a = (1 - confidence) / 2 and the exact Clopper-Pearson bounds U(x) (P(X <= x | U) = a) and L(x) (P(X >= x | L) = a):

    hi = U(b) - L(c)      P(p_b - p_c > hi) <= P(p_b > U(b)) + P(p_c < L(c)) <= 2a = 1 - confidence
    lo = L(b) - U(c)      likewise P(p_b - p_c < lo) <= 1 - confidence

(Bonferroni: no assumption on how b and c depend on each other). Clopper-Pearson bounds are exact (conservative)
for every n, however small, and b = c = 0 still gives hi = 1 - a^(1/n): 20 identical samples cannot show a drop
below 0.17 at 95%. The McNemar exact test's p-value (two-sided, b against Binomial(b + c, 1/2)) is reported beside.

Other metrics (bootstrap). The metric of the source and of the artifact on the same resampled indices (2000
resamples of n with replacement, fixed seed: the same numbers on every run), the drop of each resample, and its
(1 - confidence) and confidence quantiles as lo and hi (percentile bootstrap). It needs enough samples to see the
disagreements: below MIN_BOOTSTRAP samples the verdict is INCONCLUSIVE.

Verdict: PASS when hi <= max_drop, FAIL when lo > max_drop, else INCONCLUSIVE. numpy only (no scipy).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from ortbuild.status import Verdict

RESAMPLES = 2000
SEED = 20260
MIN_BOOTSTRAP = 100          # fewer samples: a bootstrap interval is too narrow to trust (INCONCLUSIVE)
MOST_SAMPLES = 100_000_000   # beyond this, "how many samples would decide" says "more than"
_STEPS = 80                  # bisection steps of a Clopper-Pearson bound: 2^-80, far below any float


@dataclass(frozen=True)
class Bounds:
    """The drop (source minus artifact, in the metric's units: positive is worse) and its one-sided bounds."""

    drop: float
    lo: float
    hi: float
    confidence: float

    def verdict(self, max_drop: float) -> Verdict:
        if self.hi <= max_drop:
            return Verdict.PASS
        if self.lo > max_drop:
            return Verdict.FAIL
        return Verdict.INCONCLUSIVE


# ------------------------------------------------------------------------------------- exact binomial bounds

def _log_choose(n: int, count: int) -> np.ndarray:
    """log C(n, k) for k = 0 .. count - 1 (a running sum of log((n - j) / (j + 1)))."""
    j = np.arange(count - 1, dtype=np.float64)
    return np.concatenate([[0.0], np.cumsum(np.log(n - j) - np.log(j + 1))])


def _logsumexp(x: np.ndarray) -> float:
    m = float(x.max())
    return m + math.log(float(np.exp(x - m).sum()))


def binom_cdf(x: int, n: int, p: float) -> float:
    """P(X <= x) for X ~ Binomial(n, p), summed over the shorter tail in log space (exact to float precision)."""
    if x < 0:
        return 0.0
    if x >= n or p <= 0.0:
        return 1.0
    if p >= 1.0:
        return 0.0
    lp, lq = math.log(p), math.log1p(-p)
    if x < n / 2:  # k = 0 .. x
        k = np.arange(x + 1, dtype=np.float64)
        return min(1.0, math.exp(_logsumexp(_log_choose(n, x + 1) + k * lp + (n - k) * lq)))
    j = np.arange(n - x, dtype=np.float64)  # the upper tail k = n - j > x, j = 0 .. n - x - 1
    return max(0.0, 1.0 - math.exp(_logsumexp(_log_choose(n, n - x) + (n - j) * lp + j * lq)))


def cp_upper(x: int, n: int, a: float) -> float:
    """The exact (Clopper-Pearson) one-sided upper bound of p from x successes in n: the p with P(X <= x) = a."""
    if x >= n:
        return 1.0
    lo, hi = x / n, 1.0
    for _ in range(_STEPS):
        mid = (lo + hi) / 2
        if binom_cdf(x, n, mid) > a:
            lo = mid
        else:
            hi = mid
    return hi


def cp_lower(x: int, n: int, a: float) -> float:
    """The exact one-sided lower bound: the p with P(X >= x) = a (0 for x = 0)."""
    if x <= 0:
        return 0.0
    return 1.0 - cp_upper(n - x, n, a)


def mcnemar_p(b: int, c: int) -> float:
    """The McNemar exact test's two-sided p-value of b against Binomial(b + c, 1/2) (1 when b = c = 0)."""
    m = b + c
    if m == 0:
        return 1.0
    return min(1.0, 2 * binom_cdf(min(b, c), m, 0.5))


def accuracy_bounds(b: int, c: int, n: int, confidence: float) -> Bounds:
    """The drop of accuracy (b - c) / n and its one-sided bounds at `confidence` (the module docstring)."""
    a = (1 - confidence) / 2
    return Bounds(drop=(b - c) / n, lo=cp_lower(b, n, a) - cp_upper(c, n, a),
                  hi=cp_upper(b, n, a) - cp_lower(c, n, a), confidence=confidence)


# ------------------------------------------------------------------------------------------- bootstrap

def bootstrap_bounds(drop_of: Callable[[np.ndarray], float], n: int, confidence: float,
                     resamples: int = RESAMPLES, seed: int = SEED) -> Bounds:
    """The drop on all n samples (`drop_of(indices)`) and the percentile-bootstrap bounds of it: the same resampled
    indices for the source and the artifact (paired), from a fixed seed."""
    rng = np.random.default_rng(seed)
    drops = np.array([drop_of(rng.integers(0, n, n)) for _ in range(resamples)])
    lo, hi = np.quantile(drops, [1 - confidence, confidence])
    return Bounds(drop=drop_of(np.arange(n)), lo=float(lo), hi=float(hi), confidence=confidence)


# ------------------------------------------------------------------------------- how many would decide

def needed(bounds: Bounds, n: int, max_drop: float, counts: tuple[int, int] | None = None) -> int | None:
    """About how many samples would probably decide an INCONCLUSIVE verdict, were the observed drop the true one
    (None: it sits on max_drop, no number can decide). The interval shrinks as 1/sqrt(samples) (its half-width
    on the side facing max_drop, scaled); with no discordant pair at all (`counts` = (0, 0)) the exact bound
    1 - a^(1/N) is solved for N instead."""
    d = bounds.drop
    if counts == (0, 0) and 0 < max_drop < 1:
        a = (1 - bounds.confidence) / 2
        return min(MOST_SAMPLES + 1, math.ceil(math.log(a) / math.log1p(-max_drop)))
    if d == max_drop:
        return None
    width = bounds.hi - d if d < max_drop else d - bounds.lo
    ratio = width / abs(max_drop - d)
    return min(MOST_SAMPLES + 1, max(n + 1, math.ceil(n * ratio * ratio)))
