"""The sampling engine (ortbuild.gating.measure.engine, with sampling's plan) on synthetic scenarios: a deterministic
sample source under a fake clock and a fake load reading, through early stop on a clear PASS, a clear FAIL, an
INCONCLUSIVE at the plan's end, and the load-aware retry; and a scenario of its own (not latency) on the same
looks and retry."""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field

from ortbuild.gating.measure import engine, sampling
from ortbuild.gating.measure.percentiles import Budget, PercentileVerdict, Spending, budgets_of, planned_samples
from ortbuild.gating.timing_records import WaitDoc
from ortbuild.status import Verdict


class Source:
    """A deterministic sample source: each call takes the next of `ms` (cycled) on a fake clock, and the
    machine's load reads `load`."""

    def __init__(self, ms: Sequence[float], load: float = 0.0) -> None:
        self.ms, self.i, self.now, self.load = list(ms), 0, 0.0, load
        self.waits: list[tuple[float, int]] = []

    def clock(self) -> float:
        return self.now

    def call(self) -> object:
        self.now += self.ms[self.i % len(self.ms)] / 1e3
        self.i += 1
        return None

    def read(self) -> float:
        return self.load

    def gate(self, budgets: list[Budget], plan: sampling.Plan,
             wait: Callable[[float, int], WaitDoc] | None = None) -> sampling.Outcome:
        return sampling.gate({"a": self.call}, "a", budgets, plan, clock=self.clock, read=self.read, cpus=2,
                             wait=wait or self.wait)

    def wait(self, seconds: float, cpus: int) -> WaitDoc:
        self.waits.append((seconds, cpus))
        return {"quiet": True, "load": self.load, "waited_s": 0.0}


def test_a_clear_pass_stops_early_at_a_look() -> None:
    src = Source([1.0])
    budgets = budgets_of({0.9: 10.0})
    out = src.gate(budgets, sampling.Plan(min_seconds=0))
    a = out.final
    assert out.verdicts["p90"].verdict is Verdict.PASS and out.verdict() is Verdict.PASS
    assert a.early and a.looks >= 2  # the first look (20) cannot PASS a p90 at 0.99; a later one does
    assert len(a.series["a"].samples) < planned_samples([0.9], 0.99, 0)  # before the plan's end
    assert out.retry is None and src.waits == []


def test_a_clear_fail_stops_at_the_first_look() -> None:
    src = Source([100.0])
    out = src.gate(budgets_of({0.9: 10.0}), sampling.Plan(min_seconds=0))
    a = out.final
    assert out.verdicts["p90"].verdict is Verdict.FAIL and out.verdict() is Verdict.FAIL
    assert a.early and a.looks == 1 and len(a.series["a"].samples) == sampling.FIRST_LOOK
    assert out.retry is None  # a quiet machine: nothing explains the FAIL, no retry


def test_a_percentile_on_the_budget_is_inconclusive_at_the_plans_end() -> None:
    src = Source([1.0, 3.0])  # half the samples above 2 ms: the median sits on the budget
    out = src.gate(budgets_of({0.5: 2.0}), sampling.Plan(min_samples=40, min_seconds=0))
    a = out.final
    v = out.verdicts["p50"]
    assert v.verdict is Verdict.INCONCLUSIVE and out.verdict() is Verdict.INCONCLUSIVE
    assert not a.early and len(a.series["a"].samples) == 40 and a.looks == 1
    assert v.more_samples is None and "more samples will not decide" in v.note


def test_a_fail_under_load_is_measured_again_once_the_load_falls() -> None:
    src = Source([30.0], load=8.0)  # 8 runnable threads on 2 CPUs: 30 ms, 2 x 4 times faster, meets 20 ms
    said: list[str] = []

    def wait(seconds: float, cpus: int) -> WaitDoc:
        src.ms, src.load = [1.0], 0.0  # the load falls: the runs are fast again
        return src.wait(seconds, cpus)

    plan = sampling.Plan(min_seconds=0, retry_wait_seconds=5.0)
    out = sampling.gate({"a": src.call}, "a", budgets_of({0.9: 20.0}), plan, clock=src.clock, read=src.read,
                        cpus=2, wait=wait, say=said.append)
    first, again = out.attempts
    assert first.verdicts["p90"].verdict is Verdict.FAIL and first.series["a"].load == 8.0
    assert again.verdicts["p90"].verdict is Verdict.PASS and out.verdicts["p90"].verdict is Verdict.PASS
    assert src.waits == [(5.0, 2)]
    assert out.retry is not None and out.retry["why"].startswith("p90 FAIL under load 8.0 above the 2 CPUs")
    assert said == [f"p90 FAIL under {'; '.join(first.series['a'].instability())}: waiting up to 5 s for the load "
                    "to fall, then measuring again"]


def test_a_fail_still_under_load_is_inconclusive_and_an_impossible_one_stands() -> None:
    src = Source([30.0], load=8.0)
    out = src.gate(budgets_of({0.9: 20.0}), sampling.Plan(min_seconds=0, retry_wait_seconds=5.0))
    assert len(out.attempts) == 2 and out.verdicts["p90"].verdict is Verdict.INCONCLUSIVE
    assert "FAIL measured under load 8.0 on 2 CPUs, twice" in out.verdicts["p90"].note
    impossible = Source([30.0], load=8.0).gate(budgets_of({0.9: 1.0}), sampling.Plan(min_seconds=0))
    assert impossible.retry is None and impossible.verdicts["p90"].verdict is Verdict.FAIL  # 30 / 8 > 1


# ---------------------------------------------------------------------- a scenario of its own on the engine

@dataclass
class Batch:
    """A synthetic scenario's attempt: its values and verdicts, and the load it ran under."""

    values: list[float]
    verdicts: dict[str, PercentileVerdict]
    load: float
    looks: int = 0
    seen: list[int] = field(default_factory=list)

    def suspects(self, budgets: Sequence[Budget], cpus: int) -> list[str]:
        return [b.kind for b in budgets if self.load > cpus and self.verdicts[b.kind].verdict is Verdict.FAIL]

    def conditions(self, cpus: int) -> tuple[str, str, str]:
        said = f"load {self.load:g} on {cpus} CPUs"
        return said, f"under {said}", f"under {said}"


def _measure(values: Iterator[float], load: Iterator[float], budgets: list[Budget], minimum: int,
             ) -> Callable[[dict[str, Spending]], Batch]:
    def measure(spending: dict[str, Spending]) -> Batch:
        looks = engine.Looks(budgets, 0.99, spending, 8, 64)
        xs: list[float] = []
        at = next(load)
        while True:
            xs.append(next(values))
            if looks.due(len(xs)) and (looks.judge_values(xs, len(xs) >= minimum) or len(xs) >= 64):
                return Batch(xs, looks.final(), at, looks.count)
    return measure


def test_a_scenario_of_its_own_gets_the_looks_the_minimum_and_the_retry() -> None:
    budgets = [Budget("p50", 0.5, 10.0)]
    fast = _measure(iter(lambda: 1.0, None), iter(lambda: 0.0, None), budgets, 32)
    out = engine.retried(fast, budgets, 0.0, 2, lambda s, c: {"quiet": True, "load": 0.0, "waited_s": 0.0})
    assert out.verdict() is Verdict.PASS and len(out.final.values) == 32  # no PASS before the minimum
    assert out.final.looks == 3                                           # 8, 16, 32

    slow_then_fast = iter([50.0] * 8 + [1.0] * 1000)
    waited: list[float] = []
    loaded = _measure(slow_then_fast, iter([5.0, 0.0]), budgets, 8)
    out = engine.retried(loaded, budgets, 3.0, 2,
                         lambda s, c: waited.append(s) or {"quiet": True, "load": 0.0, "waited_s": s})
    assert [a.verdicts["p50"].verdict for a in out.attempts] == [Verdict.FAIL, Verdict.PASS]
    assert waited == [3.0] and out.retry is not None and out.retry["why"] == "p50 FAIL under load 5 on 2 CPUs"
    assert engine.gate_verdict([Verdict.PASS, None, Verdict.INCONCLUSIVE]) is Verdict.INCONCLUSIVE
    assert engine.gate_verdict([None]) is None
