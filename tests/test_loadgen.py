"""The load generator's statistics, on callables of known latency (a sleep releases the GIL as ONNX Runtime's run
does): the Poisson schedule, latency from scheduled arrival (queueing counts), a rate above capacity FAILs and one
far below PASSes, multi-stream's slowest sample, offline's samples per second, and the load-aware retry."""

from __future__ import annotations

import itertools
import time

import numpy as np
import pytest

from ortbuild.gating.measure import loadgen, server
from ortbuild.gating.measure.load import Load
from ortbuild.gating.measure.load_verdicts import Outcome, Run, judged, scenario_plan, summary
from ortbuild.gating.measure.percentiles import Budget, PercentileVerdict
from ortbuild.gating.measure.sampling import Plan
from ortbuild.status import Verdict

QUIET = {"read": lambda: 0.0, "own": lambda: 0}  # the generator's statistics apart from this machine's load


def sleeper(ms: float) -> loadgen.Call:
    return lambda: time.sleep(ms / 1e3)


def test_the_schedule_is_poisson_at_the_rate_and_fixed_by_its_seed() -> None:
    arrivals = loadgen.schedule(200.0, 7, 20_000, 1.0)
    gaps = np.diff(np.concatenate([[0.0], arrivals]))
    assert len(arrivals) >= 20_000
    assert abs(gaps.mean() - 1 / 200) < 0.03 / 200            # mean gap 1/qps (standard error ~0.7%)
    assert abs(gaps.std() / gaps.mean() - 1) < 0.03            # exponential: coefficient of variation 1
    assert abs((gaps > 2 / 200).mean() - np.exp(-2)) < 0.01    # P(gap > 2/qps) = e^-2
    longer = loadgen.schedule(200.0, 7, 30_000, 1.0)
    assert np.array_equal(longer[:len(arrivals)], arrivals)    # one seed, one load
    assert not np.array_equal(loadgen.schedule(200.0, 8, 100, 0.0)[:100], arrivals[:100])
    assert loadgen.schedule(10.0, 0, 5, 3.0)[-1] >= 3.0         # covers min_seconds


def test_far_below_capacity_passes_with_latency_near_the_service_time() -> None:
    plan = Plan(0.99, min_seconds=1.0, min_queries=0, retry_wait_seconds=0.0)
    run = loadgen.server(sleeper(2), 150.0, [Budget("p99", 0.99, 100.0)], plan, {}, workers=2, **QUIET)
    assert run.verdicts["p99"].verdict is Verdict.PASS
    assert run.verdicts["p99"].samples >= 528                  # the first PASS look at 0.99 needs 528 queries
    assert min(run.values) >= 2.0 and summary(run.values)["p50_ms"] < 10
    assert 120 < float(str(run.facts["achieved_qps"])) < 180


def test_above_capacity_fails_early_because_queueing_counts() -> None:
    """One worker of 10 ms each cannot serve 200 QPS: the queue grows, and latency from arrival with it."""
    plan = Plan(0.99, min_seconds=5.0, min_queries=0, retry_wait_seconds=0.0)
    t0 = time.perf_counter()
    run = loadgen.server(sleeper(10), 200.0, [Budget("p99", 0.99, 40.0)], plan, {}, workers=1, **QUIET)
    assert run.verdicts["p99"].verdict is Verdict.FAIL
    assert run.early and time.perf_counter() - t0 < 4.0        # decided before the minimum, not after it
    assert max(run.values) > 4 * 10                            # waiting in the queue counts


def test_no_budget_measures_to_the_plan_end() -> None:
    plan = Plan(0.99, min_seconds=0.5, min_queries=60, retry_wait_seconds=0.0)
    run = loadgen.server(sleeper(1), 200.0, [], plan, {}, workers=2, **QUIET)
    assert run.verdicts == {} and len(run.values) >= 100


def test_multi_stream_latency_is_the_slowest_sample_of_each_query() -> None:
    counter = itertools.count()

    def call() -> None:  # one sample of every query of 3 takes 6 ms, the others 1 ms
        time.sleep(0.006 if next(counter) % 3 == 0 else 0.001)

    plan = Plan(0.99, min_seconds=0.2, min_queries=0, retry_wait_seconds=0.0)
    run = loadgen.multi_stream(call, 3, [Budget("p99", 0.99, 60.0)], plan, {}, **QUIET)
    assert min(run.values) >= 6.0
    assert run.verdicts["p99"].verdict is Verdict.PASS


def test_offline_samples_per_second_and_its_verdicts() -> None:
    plan = Plan(0.99, min_seconds=2.0, min_queries=0, retry_wait_seconds=0.0)
    run = loadgen.offline(sleeper(5), 4, 2, [Budget("rate", 0.5, 1e3 / 400)], plan, 0.25, {}, **QUIET)
    rate = float(str(run.facts["samples_per_second"]))
    assert 900 < rate < 1600 + 1                              # 2 workers x 4 samples / 5 ms, less the sleep overhead
    assert run.verdicts["rate"].verdict is Verdict.PASS
    too_much = loadgen.offline(sleeper(5), 4, 2, [Budget("rate", 0.5, 1e3 / 10_000)], plan, 0.25, {}, **QUIET)
    assert too_much.verdicts["rate"].verdict is Verdict.FAIL
    assert too_much.early                                      # a FAIL needs no minimum


def test_a_fail_under_competing_load_is_retried_then_inconclusive_but_an_impossible_one_stands() -> None:
    plan = Plan(0.99, min_seconds=0.2, min_queries=0, retry_wait_seconds=0.0)
    busy = {"read": lambda: 8.0, "own": lambda: 0}            # 8 runnable threads of other processes on the machine

    said: list[str] = []

    def measure(budget: float) -> Outcome:
        b = [Budget("p99", 0.99, budget)]
        return judged(lambda s: loadgen.server(sleeper(10), 300.0, b, plan, s, workers=1, **busy), b, plan,
                              read=busy["read"], cpus=2, say=said.append)

    explained = measure(15.0)  # missed, but the fastest query 2 x 4 times faster would meet it
    assert explained.retry is not None and len(explained.attempts) == 2
    assert said == ["p99 FAIL under competing work (8.0 runnable threads of other processes on 2 CPUs): waiting up to "
                    "0 s for the load to fall, then measuring again"]
    assert explained.verdicts["p99"].verdict is Verdict.INCONCLUSIVE
    assert "rerun on a quiet machine" in explained.verdicts["p99"].note
    impossible = measure(0.05)  # not even 8 x faster than the fastest query
    assert impossible.retry is None and impossible.verdicts["p99"].verdict is Verdict.FAIL


def _outcome(verdict: Verdict, completed_qps: float = 1e9) -> Outcome:
    v = PercentileVerdict(0.99, 10.0, 5.0, None, None, 0, 600, 0.99, verdict)
    run = Run([1.0, 5.0], 1.0, {"p99": v}, 1, True, Load(), {"completed_qps": completed_qps})
    return Outcome([run], {"p99": v})


@pytest.mark.parametrize("peak", [37.0, 300.0, 2.5])
def test_find_peak_brackets_and_bisects_to_the_precision(peak: float) -> None:
    found = server.find_peak(lambda q: _outcome(Verdict.PASS if q <= peak else Verdict.FAIL, q), 20.0, 0.05)
    qps, worst = found["qps"], found["lowest_not_passing"]
    assert isinstance(qps, float) and isinstance(worst, float)
    assert qps <= peak < worst and (worst - qps) / qps <= 0.05
    tried = found["tried"]
    assert isinstance(tried, list) and len(tried) <= loadgen.MAX_PEAK_STEPS
    assert [t["qps"] for t in tried] == sorted(t["qps"] for t in tried)


def test_a_rate_whose_queries_complete_slower_than_offered_is_not_held() -> None:
    """A budget far above the run's length passes any rate (the queue grows unseen): the peak is the highest rate
    whose queries also complete at >= 90% of it (a capacity of 100/s here), not a doubling without end."""
    found = server.find_peak(lambda q: _outcome(Verdict.PASS, min(q, 100.0)), 20.0, 0.05)
    qps = found["qps"]
    assert isinstance(qps, float) and 100.0 / server.HOLD / 1.05 <= qps <= 100.0 / server.HOLD  # 111/s held
    tried = found["tried"]
    assert isinstance(tried, list) and any(t["verdict"] == "PASS" and not t["held"] for t in tried)


def test_find_peak_says_when_nothing_passes() -> None:
    found = server.find_peak(lambda q: _outcome(Verdict.INCONCLUSIVE), 20.0, 0.05)
    assert found["qps"] is None and "no rate passed" in str(found["note"])


def test_a_scenario_only_another_models_data_set_declares_leaves_a_section_saying_so() -> None:
    from ortbuild.project.sections import Latency, Server

    assert loadgen.no_data_set(Latency(), "server") == ("-", {}, [])  # not asked for: nothing in the record
    other = Latency(data_sets={"test_data_set_1": {"server": {"qps": 5, "p99_ms": 10}}})
    verdict, section, lines = loadgen.no_data_set(other, "server")
    assert verdict == "-" and not lines and "no golden data set of this model has a server table" in \
        str(section["summary"])  # kept in the record: the gate ran (release.unjudged does not refuse it)
    assert loadgen.no_data_set(Latency(server=Server(qps=5)), "multi_stream") == ("-", {}, [])


def test_the_line_before_the_queries_says_what_each_budget_needs_and_how_long() -> None:
    plan = scenario_plan(0.99, 10.0, 0, 30.0, quick=False)
    p99 = [Budget("p99", 0.99, 40.0)]
    # 50 QPS of a fast model: the rate sets the pace (640 queries at 50 QPS: 13 s), min_seconds the least
    said = server.said_before("test_data_set_0", 50.0, p99, plan, [1.0] * 20, 2)
    assert said == ("server on test_data_set_0 (Poisson arrivals at 50 QPS, 1 ms a run): p99 budget needs at least "
                    "640 queries to PASS (about 13 s); undecided, at most 689 (about 14 s); a FAIL can stop at 20; "
                    "a PASS after at least 10 s, and a retry if other work competed")
    # a 3 s model offered 5 QPS on 2 workers cannot keep up: its runs set the pace (640 x 3 s / 2: 16 min)
    said = server.said_before("d", 5.0, p99, plan, [3000.0] * 20, 2)
    assert "p99 budget needs at least 640 queries to PASS (about 16 min)" in said
    assert server.said_before("d", 50.0, [], plan, [1.0], 2) == (
        "server on d (Poisson arrivals at 50 QPS, 1 ms a run): no budget: 500 queries (about 10 s), reported, "
        "not judged")


@pytest.mark.parametrize("scenario", ["offline", "server", "multi_stream"])
def test_a_machine_that_cannot_start_the_threads_asked_for_is_a_gate_error_not_a_crash_or_a_hang(
        monkeypatch: pytest.MonkeyPatch, scenario: str) -> None:
    """The thread limit (`can't start new thread`) cannot be reached safely here (root has no RLIMIT_NPROC), so the
    fourth thread start raises as CPython does there: each scenario stops its threads and says which key to lower."""
    import threading

    from ortbuild.errors import GateFailed

    real, started = threading.Thread.start, itertools.count()

    def start(self: threading.Thread) -> None:
        if next(started) >= 3:
            raise RuntimeError("can't start new thread")
        real(self)

    monkeypatch.setattr(threading.Thread, "start", start)
    plan = Plan(0.99, min_seconds=0.5, min_queries=0, retry_wait_seconds=0.0)
    t0 = time.monotonic()
    with pytest.raises(GateFailed) as e:
        if scenario == "offline":
            loadgen.offline(sleeper(1), 1, 8, [], plan, 0.05, {}, **QUIET)
        elif scenario == "server":
            loadgen.server(sleeper(20), 1000.0, [], plan, {}, workers=8, **QUIET)
        else:
            loadgen.multi_stream(sleeper(1), 8, [], plan, {}, **QUIET)
    key = {"offline": "workers", "server": "workers", "multi_stream": "streams"}[scenario]
    assert f"{scenario}: this machine could not start 8 concurrent calls" in e.value.message
    assert e.value.hint == f"lower [latency.{scenario}] {key}" and time.monotonic() - t0 < 10
