"""The sampling engine's looks, retry and outcome, shared by every scenario that judges a distribution of times
(latency, single-stream: ortbuild.gating.measure.sampling, which holds the plan; offline, server, multi-stream:
ortbuild.gating.measure.loadgen; cold start in fresh processes: ortbuild.gating.measure.startup; generation:
ortbuild.gating.measure.generation, through sampling.gate). A scenario takes the samples; the engine looks.

Looks: at checkpoints fixed in advance (the first look, then each doubling, and the plan's end), each budget's
verdict from binomial order statistics (ortbuild.gating.measure.percentiles), the error 1 - c of each direction
split over that direction's looks, 1/(k(k+1)) of it to the k-th, a look spending a share only when it can decide
in that direction at that sample count; before a run's minimum a look can FAIL but not PASS, and spends nothing
of the PASS direction's error.

The retry: a FAIL the conditions of its attempt could explain (Measured.suspects: for latency, load above the
CPUs or a drifting median; for the load scenarios, other work competing; ortbuild.gating.measure.load's rule) is
measured again once the load has fallen, both attempts' looks sharing one error budget; a FAIL that persists so
becomes INCONCLUSIVE, "rerun on a quiet machine".
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from typing import Generic, Protocol, TypeVar

from ortbuild.gating.measure.percentiles import (
    Budget,
    PercentileVerdict,
    Spending,
    checkpoints,
    retry_said,
    sequential_verdict,
    with_estimate,
)
from ortbuild.gating.timing_records import RetryDoc, WaitDoc
from ortbuild.status import Verdict

PASS, FAIL, INCONCLUSIVE = Verdict.PASS, Verdict.FAIL, Verdict.INCONCLUSIVE


class Looks:
    """The looks of one attempt: the checkpoints fixed in advance (`first`, each doubling, and the plan's `end`),
    `due(n)`: whether n samples call for one, and each budget's verdict at the last, each look spending its
    share of the error from `spending` (shared by the attempts of one outcome)."""

    def __init__(self, budgets: Sequence[Budget], confidence: float, spending: dict[str, Spending], first: int,
                 end: int) -> None:
        self.budgets, self.confidence, self.spending = budgets, confidence, spending
        self.at = checkpoints(first, end)
        self.next = next(self.at)
        self.count = 0
        self.verdicts: dict[str, PercentileVerdict] = {}

    def due(self, n: int) -> bool:
        if n < self.next:
            return False
        while self.next <= n:
            self.next = next(self.at)
        return True

    def judge(self, values_of: Callable[[Budget], tuple[list[float], float]], can_pass: bool = True) -> bool:
        """Look: each budget's verdict on its values and limit (`values_of`); before a run's minimum (`can_pass`
        False) it can FAIL but not PASS, and spends nothing of the PASS direction's error. Whether every budget
        is decided."""
        self.count += 1
        self.verdicts = {}
        for b in self.budgets:
            values, limit = values_of(b)
            spent = self.spending.setdefault(b.kind, Spending())
            trial = spent if can_pass else Spending(spent.passes, spent.fails)
            v = sequential_verdict(values, b.percentile, limit, self.confidence, trial)
            spent.fails = trial.fails
            self.verdicts[b.kind] = replace(v, verdict=INCONCLUSIVE) if v.verdict is PASS and not can_pass else v
        return bool(self.budgets) and all(v.verdict is not INCONCLUSIVE for v in self.verdicts.values())

    def judge_values(self, values: list[float], can_pass: bool = True) -> bool:
        """judge, every budget on the same `values` (a scenario's one series) against its own limit."""
        return self.judge(lambda b: (values, b.limit), can_pass)

    def failed(self) -> list[str]:
        return [k for k, v in self.verdicts.items() if v.verdict is FAIL]

    def final(self) -> dict[str, PercentileVerdict]:
        """The verdicts of the last look, an undecided one with how many more samples would decide it."""
        return {k: with_estimate(v) for k, v in self.verdicts.items()}


# ------------------------------------------------------------------------------------------------ retry

class Measured(Protocol):
    """One attempt of a scenario, as the retry needs it: its verdicts, the budgets whose FAIL the conditions it
    was measured under could explain, and those conditions in words: as said before the retry, in the retry's
    `why` (after "p99 FAIL "), and in the note of a FAIL that persists (after "FAIL measured ")."""

    @property
    def verdicts(self) -> dict[str, PercentileVerdict]: ...

    def suspects(self, budgets: Sequence[Budget], cpus: int) -> list[str]: ...

    def conditions(self, cpus: int) -> tuple[str, str, str]: ...


A = TypeVar("A", bound=Measured)


def gate_verdict(verdicts: Sequence[Verdict | None]) -> Verdict | None:
    """FAIL if any failed, else INCONCLUSIVE if any was undecided, else PASS (None: nothing judged)."""
    found = {v for v in verdicts if v is not None}
    return FAIL if FAIL in found else INCONCLUSIVE if INCONCLUSIVE in found else PASS if found else None


@dataclass
class Retried(Generic[A]):
    """The verdicts of one scenario on one data set, after the retry a FAIL under load gets."""

    attempts: list[A]
    verdicts: dict[str, PercentileVerdict]
    retry: RetryDoc | None = None    # why it was measured again, how long it waited

    @property
    def final(self) -> A:
        return self.attempts[-1]

    def verdict(self) -> Verdict | None:
        return gate_verdict([v.verdict for v in self.verdicts.values()])


def retried(measure: Callable[[dict[str, Spending]], A], budgets: Sequence[Budget], wait_s: float, cpus: int,
            wait: Callable[[float, int], WaitDoc], say: Callable[[str], None] = lambda _: None) -> Retried[A]:
    """Measure and decide; a FAIL the conditions of its attempt could explain is measured again after waiting
    (`wait`, at most `wait_s`: the plan's retry_wait_seconds) for the load to fall, the looks of both attempts
    sharing one error budget (`measure` is given it). A FAIL that persists so is INCONCLUSIVE ("...; rerun on a
    quiet machine"). `say`: the retry, said before the wait."""
    spending: dict[str, Spending] = {}
    first = measure(spending)
    out = Retried([first], dict(first.verdicts))
    suspects = first.suspects(budgets, cpus)
    if not suspects:
        return out
    said, why, _ = first.conditions(cpus)
    say(retry_said(suspects, said, wait_s))
    waited = wait(wait_s, cpus)
    out.retry = {"why": f"{', '.join(suspects)} FAIL {why}", **waited}
    again = measure(spending)
    out.attempts.append(again)
    out.verdicts = dict(again.verdicts)
    for kind in again.suspects(budgets, cpus):
        out.verdicts[kind] = replace(out.verdicts[kind], verdict=INCONCLUSIVE, more_samples=None,
                                     note=f"FAIL measured {again.conditions(cpus)[2]}, twice (waited "
                                          f"{waited['waited_s']:g} s for the load to fall); rerun on a quiet machine")
    return out
