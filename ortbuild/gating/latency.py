"""Latency measurement and distribution-free verdicts on percentiles.

Method (docs/testing.md): session creation and the first run are timed and reported apart; `warmup_runs`
untimed runs follow; then samples are taken sequentially, with the runs of several artifacts interleaved
(A B, B A, ...) when they are compared, and looked at only at checkpoints fixed in advance (the first look at
`min_samples` or FIRST_LOOK samples, then each doubling, and the plan's end). The verdict on "the p-th
percentile is at most B ms" uses binomial order statistics, as MLPerf LoadGen's early stopping does: the
k-th smallest of n samples is an upper confidence bound on the percentile when P(Binom(n, p) <= k-1) >= c.
PASS when the upper bound is within the budget, FAIL when the lower bound is above it, else INCONCLUSIVE,
with how many more samples (at the observed exceedance rate) would decide.

Looking more than once inflates the error, so the error 1 - c of each direction (a wrong PASS, a wrong FAIL)
is split over that direction's looks, 1/(k(k+1)) of it to the k-th (1/2, 1/6, 1/12, ...: the shares sum to 1
however many looks there are), and a look spends a share only when it can decide in that direction at that
sample count (which does not depend on the samples). Sampling stops at the first look that decides every
budget (the union bound keeps the chance of any wrong verdict within 1 - c), or at the plan's end.

A FAIL measured while the machine was loaded (more runnable threads than CPUs) or while the median drifted is
measured again once the load has fallen (waiting at most `retry_wait_seconds`); a FAIL that the load could
explain and that persists under load becomes INCONCLUSIVE. A FAIL that even the fastest sample, taken
LOAD_SLOWDOWN x max(1, load / CPUs) times faster, would still be (an impossible budget) stands.
"""

from __future__ import annotations

import math
import os
import time
from collections import deque
from collections.abc import Callable, Iterator, Mapping
from dataclasses import asdict, dataclass, field, replace
from typing import Any

PASS, FAIL, INCONCLUSIVE = "PASS", "FAIL", "INCONCLUSIVE"
MAX_SAMPLES_ASKED = 200_000  # "more samples" beyond this cannot decide: the budget sits on the percentile
FIRST_LOOK = 20              # the first look at the samples when min_samples is 0
LOAD_SLOWDOWN = 2.0          # a FAIL under load stands only if it stays a FAIL this much faster (x load / CPUs)
LOAD_EVERY_S = 0.01          # how often the load is read while sampling


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
    """The samples an undecided verdict runs to: min_samples, or (0) at least 100 and 1.5x what can bound
    the tightest budgeted percentile."""
    if min_samples:
        return min_samples
    need = max((min_samples_to_bound(p, c) for p in budgeted), default=0)
    return max(100, math.ceil(1.5 * need))


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
    verdict: str
    more_samples: int | None = None  # INCONCLUSIVE: how many more would decide at the observed rate
    note: str = ""
    upper_confidence: float | None = None  # what each bound was computed at: its look's share of the error
    lower_confidence: float | None = None


def _decided(n: int, exceeding: int, p: float, c_up: float, c_lo: float | None = None) -> str | None:
    """The verdict of n samples of which `exceeding` are above the budget."""
    up, lo = upper_rank(n, p, c_up), lower_rank(n, p, c_up if c_lo is None else c_lo)
    if up is not None and n - exceeding >= up:
        return PASS  # x_(up) <= budget: at least `up` samples are within it
    if lo is not None and n - exceeding < lo:
        return FAIL  # x_(lo) > budget
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
    verdict = _decided(n, exceeding, p, c_up, c_lo) or INCONCLUSIVE
    v = PercentileVerdict(p, budget, nearest_rank(xs, p), xs[up - 1] if up else None, xs[lo - 1] if lo else None,
                          exceeding, n, c, verdict, None, "", c_up, c_lo)
    return with_estimate(v) if estimate else v


def with_estimate(v: PercentileVerdict) -> PercentileVerdict:
    """An INCONCLUSIVE verdict with how many more samples would decide it (at its bounds' confidences)."""
    if v.verdict != INCONCLUSIVE:
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


def relative_verdict(mine: list[float], reference: list[float], ratio: float, c: float) -> PercentileVerdict:
    """"reference median / my median >= ratio" from paired, interleaved samples: the median of
    ratio * mine_i / reference_i must be at most 1 (a sign test, the same order statistics)."""
    scaled, limit = Budget("relative", 0.5, ratio, "reference").values({"mine": mine, "reference": reference}, "mine")
    return percentile_verdict(scaled, 0.5, limit, c)


# ------------------------------------------------------------------------------------------------- load

def runnable() -> float | None:
    """Threads running or ready to run on this machine right now, the reading one included (Linux's
    /proc/loadavg); None where the system does not say."""
    try:
        with open("/proc/loadavg") as f:
            return float(f.read().split()[3].split("/")[0])
    except (OSError, IndexError, ValueError):
        return None


def load_now(read: Callable[[], float | None] = runnable) -> float:
    """The load now: runnable threads, or where the system does not say, the 1-minute load average."""
    r = read()
    return r if r is not None else os.getloadavg()[0]


class LoadMeter:
    """The machine's load while sampling: the runnable threads, read at most every LOAD_EVERY_S, averaged."""

    def __init__(self, read: Callable[[], float | None] = runnable,
                 clock: Callable[[], float] = time.perf_counter) -> None:
        self.read, self.clock = read, clock
        self.readings: list[float] = []
        self.last = -math.inf

    def tick(self, force: bool = False) -> None:
        now = self.clock()
        if force or now - self.last >= LOAD_EVERY_S:
            self.last = now
            r = self.read()
            if r is not None:
                self.readings.append(r)

    def average(self) -> float | None:
        return sum(self.readings) / len(self.readings) if self.readings else None


def wait_for_quiet(max_seconds: float, cpus: int, read: Callable[[], float | None] = runnable,
                   clock: Callable[[], float] = time.monotonic, sleep: Callable[[float], None] = time.sleep,
                   window: float = 1.0, poll: float = 0.1) -> dict[str, Any]:
    """Poll the load until its average over `window` seconds is at most `cpus`, for at most `max_seconds`:
    {"quiet": whether it fell, "load": the last average, "waited_s": seconds waited}."""
    start = clock()
    recent: deque[tuple[float, float]] = deque()
    while True:
        now = clock()
        recent.append((now, load_now(read)))
        while recent[0][0] < now - window:
            recent.popleft()
        load = sum(x for _, x in recent) / len(recent)
        if now - start >= min(window, max_seconds) and load <= cpus:
            return {"quiet": True, "load": round(load, 2), "waited_s": round(now - start, 2)}
        if now - start >= max_seconds:
            return {"quiet": False, "load": round(load, 2), "waited_s": round(now - start, 2)}
        sleep(poll)


# ------------------------------------------------------------------------------------------ measurement

@dataclass
class Series:
    """The timings of one artifact in one run, in milliseconds."""

    name: str
    session_ms: float = 0.0
    first_run_ms: float = 0.0
    samples: list[float] = field(default_factory=list)
    load: float | None = None        # runnable threads on the machine while sampling (None: the load average)
    cpus: int = field(default_factory=lambda: os.cpu_count() or 1)

    def summary(self) -> dict[str, Any]:
        xs = sorted(self.samples)
        mean = sum(xs) / len(xs)
        sd = math.sqrt(sum((x - mean) ** 2 for x in xs) / max(1, len(xs) - 1))
        return {"samples": len(xs), "min_ms": xs[0], "p50_ms": nearest_rank(xs, 0.5), "p90_ms": nearest_rank(xs, 0.9),
                "p99_ms": nearest_rank(xs, 0.99), "max_ms": xs[-1], "mean_ms": mean, "cov": sd / mean if mean else 0.0,
                "session_ms": self.session_ms, "first_run_ms": self.first_run_ms}

    def machine_load(self) -> float:
        """The load while sampling (where it was not measured, the 1-minute load average now)."""
        return self.load if self.load is not None else os.getloadavg()[0]

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
        load = self.machine_load()
        if load > self.cpus:
            why.append(f"load {load:.1f} above the {self.cpus} CPUs: other work competed")
        return why


def prepare(calls: Mapping[str, Callable[[], object]], warmup_runs: int) -> dict[str, float]:
    """Time each artifact's first run (ms), then make `warmup_runs` untimed runs of each."""
    first: dict[str, float] = {}
    for name, call in calls.items():
        t0 = time.perf_counter()
        call()
        first[name] = (time.perf_counter() - t0) * 1e3
        for _ in range(warmup_runs):
            call()
    return first


@dataclass(frozen=True)
class Plan:
    """How one data set is sampled (the [latency] keys)."""

    confidence: float = 0.99
    min_samples: int = 0             # the first look (0: FIRST_LOOK); with budgets undecided, the plan's length
    min_seconds: float = 1.0         # with budgets undecided, sampling lasts at least this long
    retry_wait_seconds: float = 30.0  # a FAIL under load waits at most this long for the load to fall


@dataclass
class Attempt:
    """One sequential measurement of the artifacts on one input."""

    series: dict[str, Series]
    verdicts: dict[str, PercentileVerdict]  # by budget kind
    looks: int
    early: bool                      # stopped before the plan's end: every budget was decided
    seconds: float

    def as_json(self, mine: str) -> dict[str, Any]:
        s = self.series[mine]
        return {"samples": len(s.samples), "seconds": round(self.seconds, 3), "looks": self.looks,
                "stopped_early": self.early, "load": None if s.load is None else round(s.load, 2),
                "unstable": s.instability(), "p50_ms": s.summary()["p50_ms"], "p90_ms": s.summary()["p90_ms"],
                "verdicts": {k: v.verdict for k, v in self.verdicts.items()}}


def sample(calls: Mapping[str, Callable[[], object]], mine: str, budgets: list[Budget], plan: Plan,
           spending: dict[str, Spending] | None = None, clock: Callable[[], float] = time.perf_counter,
           read: Callable[[], float | None] = runnable, cpus: int | None = None) -> Attempt:
    """Time `calls` round by round, interleaved (A B, B A, ...), looking at the checkpoints: stop at the first
    look that decides every budget, else at the first look past the plan's end (its samples and min_seconds
    reached). Without budgets the plan is sampled to its end exactly (the percentiles are still reported)."""
    spending = spending if spending is not None else {}
    end = planned_samples([b.percentile for b in budgets], plan.confidence, plan.min_samples)
    looks_at = checkpoints(plan.min_samples or FIRST_LOOK, end)
    look = next(looks_at)
    series = {name: Series(name, cpus=cpus or os.cpu_count() or 1) for name in calls}
    order = list(calls)
    meter = LoadMeter(read, clock)
    meter.tick(force=True)
    start, i, looks = clock(), 0, 0
    verdicts: dict[str, PercentileVerdict] = {}
    decided = at_end = False
    while True:
        for name in (order if i % 2 == 0 else order[::-1]):
            t0 = clock()
            calls[name]()
            series[name].samples.append((clock() - t0) * 1e3)
        i += 1
        meter.tick()
        if not budgets and i >= end and clock() - start >= plan.min_seconds:
            break  # nothing to decide: no look needed
        if i < look:
            continue
        while look <= i:
            look = next(looks_at)
        looks += 1
        samples = {name: s.samples for name, s in series.items()}
        verdicts = {}
        for b in budgets:
            values, limit = b.values(samples, mine)
            verdicts[b.kind] = sequential_verdict(values, b.percentile, limit, plan.confidence,
                                                  spending.setdefault(b.kind, Spending()))
        decided = bool(budgets) and all(v.verdict != INCONCLUSIVE for v in verdicts.values())
        at_end = i >= end and clock() - start >= plan.min_seconds
        if decided or at_end:
            break
    seconds = clock() - start
    meter.tick(force=True)
    for s in series.values():
        s.load = meter.average()
    return Attempt(series, {k: with_estimate(v) for k, v in verdicts.items()}, looks, decided and not at_end, seconds)


def explained_by_load(budget: Budget, attempt: Attempt, mine: str, cpus: int) -> bool:
    """Whether the instability of `attempt` could explain a FAIL of `budget`: whether even its most favourable
    sample, LOAD_SLOWDOWN x max(1, load / CPUs) times faster, would meet the budget. (Contention only adds
    time; a budget below that is impossible on this machine, loaded or not.)"""
    values, limit = budget.values({n: s.samples for n, s in attempt.series.items()}, mine)
    load = attempt.series[mine].machine_load()
    return min(values) / (LOAD_SLOWDOWN * max(1.0, load / cpus)) <= limit


@dataclass
class Outcome:
    """The verdicts of one data set, after the retry a FAIL under load gets."""

    attempts: list[Attempt]
    verdicts: dict[str, PercentileVerdict]
    retry: dict[str, Any] = field(default_factory=dict)  # why it was measured again, how long it waited

    @property
    def final(self) -> Attempt:
        return self.attempts[-1]


def _suspects(attempt: Attempt, budgets: list[Budget], mine: str, cpus: int) -> list[str]:
    """The budgets whose FAIL the attempt's instability (load, drift) could explain."""
    if not attempt.series[mine].instability():
        return []
    return [b.kind for b in budgets if attempt.verdicts[b.kind].verdict == FAIL
            and explained_by_load(b, attempt, mine, cpus)]


def gate(calls: Mapping[str, Callable[[], object]], mine: str, budgets: list[Budget], plan: Plan, *,
         clock: Callable[[], float] = time.perf_counter, read: Callable[[], float | None] = runnable,
         wait: Callable[[float, int], dict[str, Any]] | None = None, cpus: int | None = None) -> Outcome:
    """Sample and decide; a FAIL the load or drift could explain is measured again after waiting (at most
    plan.retry_wait_seconds) for the load to fall, the looks of both attempts sharing one error budget. A FAIL
    that persists under load is INCONCLUSIVE ("measured under load N; rerun on a quiet machine")."""
    cpus = cpus or os.cpu_count() or 1
    spending: dict[str, Spending] = {}
    first = sample(calls, mine, budgets, plan, spending, clock, read, cpus)
    out = Outcome([first], dict(first.verdicts))
    suspects = _suspects(first, budgets, mine, cpus)
    if not suspects:
        return out
    waited = wait(plan.retry_wait_seconds, cpus) if wait else wait_for_quiet(plan.retry_wait_seconds, cpus, read)
    out.retry = {"why": f"{', '.join(suspects)} FAIL under {'; '.join(first.series[mine].instability())}",
                 **waited}
    again = sample(calls, mine, budgets, plan, spending, clock, read, cpus)
    out.attempts.append(again)
    out.verdicts = dict(again.verdicts)
    s = again.series[mine]
    for kind in _suspects(again, budgets, mine, cpus):
        what = (f"load {s.machine_load():.1f} on {cpus} CPUs" if s.machine_load() > cpus else
                f"drift ({'; '.join(s.instability())})")
        out.verdicts[kind] = replace(out.verdicts[kind], verdict=INCONCLUSIVE, more_samples=None,
                                     note=f"FAIL measured under {what}, twice (waited {waited['waited_s']:g} s for "
                                          "the load to fall); rerun on a quiet machine")
    return out


def as_json(v: PercentileVerdict) -> dict[str, Any]:
    return asdict(v)
