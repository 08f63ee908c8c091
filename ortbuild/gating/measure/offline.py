"""The `throughput` gate: samples per second at a batch, as MLPerf Offline ([targets.X.latency.offline], and a
golden data set's own [targets.X.latency.data_sets.NAME.offline] over it: Latency.scenario).

A sample is one golden data set's feed. Where every input's first axis is dynamic, `batch` of them are stacked
along it into one `run` call ("stacked"), and a pool of `workers` such calls runs back to back on one session;
else (a fixed first axis, a scalar input, or a stacked run the model refuses) single-sample runs do
("concurrent"), at most a pool's worth at a time (`workers`, else the CPUs; never more than `batch`). The report
says which.

Throughput is MLPerf's: the samples completed over the run's time. The verdict is distribution-free: the run is
cut into fixed windows of `window_seconds`, each call's samples spread over the windows its time overlaps, and
"the median window rate is at least `min_samples_per_second`" is judged by the binomial bounds latency uses on
a percentile (on each window's milliseconds per sample, 1000 / its rate, at p50), with the same sequential looks
(the first at 8 windows, then doubling; a PASS only after `min_seconds`) and the same load awareness. The median
window rather than the mean: one stalled window (a page fault storm, another process) moves it by one rank.
Confidence: with the default 20 windows (10 s of 0.5 s) a PASS at 0.99 needs the 4th slowest window at or above
the budget; 8 windows can FAIL a rate far below it.
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any, Literal

from ortbuild import machine
from ortbuild.errors import GateFailed, first_line
from ortbuild.gating.measure import loadgen
from ortbuild.gating.measure.engine import gate_verdict
from ortbuild.gating.measure.load_verdicts import Run, entry, judged, scenario_plan, verdict_doc
from ortbuild.gating.measure.percentiles import Budget, Spending, duration
from ortbuild.gating.measure.sampling import Plan
from ortbuild.project.sections import Offline
from ortbuild.status import Verdict

if TYPE_CHECKING:
    from ortbuild.gating.protocol import Context


def stacked(model: Any, inputs: dict[str, Any], batch: int) -> dict[str, Any] | None:
    """`batch` copies of the feed stacked along the first axis, where every input's first axis is dynamic and the
    model runs the stacked feed; None otherwise."""
    import numpy as np

    specs = {i["name"]: i.get("shape") for i in model.inputs}
    for name, value in inputs.items():
        shape = specs.get(name)
        if np.ndim(value) == 0 or not shape or (isinstance(shape[0], int) and shape[0] > 0):
            return None
    feed = {k: np.concatenate([np.asarray(v)] * batch, axis=0) for k, v in inputs.items()}
    try:
        model.run(feed)
    except Exception as e:  # a dimension the session fixed (free dimensions), a graph that assumes one row
        if _out_of_memory_error(e):
            raise  # not a refusal of the stacked batch: _out_of_memory says so
        return None
    return feed


MEMORY_SHARE = 0.8  # of the memory available, what the stacked batches in flight may take
PROBE = 32          # samples of the stacked batch run first, to size what the whole batch will take


def _stacked_within_memory(job: str, model: Any, inputs: dict[str, Any], batch: int,
                           workers: int) -> dict[str, Any] | None:
    """stacked(), sized as it grows: a probe of min(batch, PROBE) samples is stacked and run first; where the batch
    is larger, what that call took (the resident set's growth, less its feed), scaled to the batch for `workers`
    calls, plus the stacked feed, must fit before the whole batch is stacked and run once; then what one call of
    the whole batch really took (a model whose memory grows faster than its batch shows here), times the other
    workers, must fit beside it. Each in MEMORY_SHARE of the memory available, else GateFailed before the timed
    runs."""
    size = min(batch, PROBE)
    before = machine.resident()
    feed = stacked(model, inputs, size)
    if feed is None:
        return None
    took = max(machine.resident() - before - _nbytes(feed), 0)
    if batch > size:
        _must_fit(job, batch, workers, workers * took * batch / size + _nbytes(feed) * batch / size,
                  f"a batch of {size} took {took / (1 << 20):.1f} MiB")
        del feed
        before = machine.resident()
        feed = stacked(model, inputs, batch)
        if feed is None:
            return None
        took += max(machine.resident() - before - _nbytes(feed), 0)
    _must_fit(job, batch, workers, (workers - 1) * took, f"one call of it took {took / (1 << 20):.1f} MiB")
    return feed


def _nbytes(feed: dict[str, Any]) -> int:
    return sum(int(v.nbytes) for v in feed.values())


def _must_fit(job: str, batch: int, workers: int, need: float, evidence: str) -> None:
    avail = machine.available_memory()
    if need > MEMORY_SHARE * avail:
        raise GateFailed(f"offline: {job}: {workers} concurrent calls of batch {batch} would need about "
                         f"{need / (1 << 30):.1f} GiB more ({evidence}), and {avail / (1 << 30):.1f} GiB is "
                         "available here", "lower [latency.offline] batch or workers")


def _out_of_memory_error(e: BaseException) -> bool:
    """Python's MemoryError, or ONNX Runtime's arena failing to allocate (its message; no exception type of its own)."""
    return isinstance(e, MemoryError) or "Failed to allocate memory" in str(e)


@contextlib.contextmanager
def _out_of_memory(job: str, batch: int, workers: int) -> Iterator[None]:
    """ONNX Runtime's failure to allocate (its arena, under a memory limit) or Python's MemoryError during the
    offline run: a gate error naming the keys to lower, not an internal error."""
    try:
        # the address space capped at what is mapped now plus the memory available: a call larger than the machine
        # (memory that grows faster than the batch, which no probe foresees) fails to allocate, never swaps or is
        # killed
        with machine.memory_cap(int(MEMORY_SHARE * machine.available_memory()) + (1 << 30)):
            yield
    except Exception as e:
        if _out_of_memory_error(e):
            raise GateFailed(f"offline: {job}: batch {batch} on {workers} workers ran out of memory ({first_line(e)})",
                             "lower [latency.offline] batch or workers") from None
        raise


def rates(v: dict[str, object]) -> dict[str, object]:
    """A verdict on milliseconds per sample, in samples per second too."""
    def rate(ms: object) -> float | None:
        return round(1e3 / ms, 3) if isinstance(ms, float) and ms > 0 else None

    return {**v, "observed_rate": rate(v["observed"]), "rate_lower": rate(v["upper"]), "rate_upper": rate(v["lower"])}


def budget_of(off: Offline) -> dict[str, object]:
    return {"batch": off.batch, "min_samples_per_second": off.min_samples_per_second}


def gate(ctx: Context) -> tuple[Verdict | Literal["-"], dict[str, object], list[str]]:
    gates = ctx.job.settings.gates
    if gates is None:
        return "-", {}, []
    lat = gates.latency
    runs = [(i, ds, off) for i, ds in enumerate(ctx.golden.sets)
            if (off := lat.scenario("offline", ds.name)) is not None]
    if not runs:  # no table for this scenario, the target's or this model's data sets'
        return loadgen.no_data_set(lat, "offline")
    model = ctx.open()
    entries: list[dict[str, object]] = []
    lines: list[str] = []
    found: list[Verdict | None] = []
    for i, ds, off in runs:
        want = off.min_samples_per_second
        budgets = [Budget("rate", 0.5, 1e3 / float(want))] if want else []
        plan = scenario_plan(lat.confidence, off.min_seconds, 0, lat.retry_wait_seconds, ctx.quick)
        workers = off.workers or loadgen.cpus()
        with _out_of_memory(ctx.job.name, off.batch, workers):
            feed = _stacked_within_memory(ctx.job.name, model, ds.inputs, off.batch, workers) if off.batch > 1 else None
            mode = "stacked" if feed is not None else "concurrent"
            # concurrent single-sample runs: at most a pool's worth at once (`workers`, else the CPUs), never a thread
            # per sample of the batch: the batch is the samples in flight, the pool how many run at a time
            per_call = off.batch if feed is not None else 1
            if feed is None:
                workers = min(workers, off.batch) if off.batch > 1 else workers

            def run(f: dict[str, Any] = feed if feed is not None else ds.inputs) -> object:
                return model.run(f)

            # outputs under load: a stacked batch against one run of it on its own, a single feed against the
            # accuracy run's outputs
            check, call = loadgen.checked(ctx, i, run, run() if feed is not None else None)

            def measure(spending: dict[str, Spending], call: loadgen.Call = call, per_call: int = per_call,
                        workers: int = workers, budgets: list[Budget] = budgets, plan: Plan = plan,
                        window: float = off.window_seconds) -> Run:
                return loadgen.offline(call, per_call, workers, budgets, plan, window, spending)

            loadgen.warm(run, lat.warmup_runs, timed=0)
            least = max(loadgen.FIRST_WINDOWS, math.ceil(plan.min_seconds / off.window_seconds))  # as loadgen.offline
            said = (f"a budget needs at least {least} windows of {off.window_seconds:g} s to PASS (about "
                    f"{duration(least * off.window_seconds)}); undecided, at most {2 * least} (about "
                    f"{duration(2 * least * off.window_seconds)}); a FAIL can stop at {loadgen.FIRST_WINDOWS}"
                    if budgets else f"no budget: about {duration(2 * least * off.window_seconds)}, reported, "
                    "not judged")
            ctx.progress(ctx.job.name,
                         f"throughput on {ds.name} (batch {off.batch} ({mode}), {workers} workers): {said}")
            outcome = judged(measure, budgets, plan,
                                     say=ctx.teller(f"throughput on {ds.name}"))
        e = entry(ds.name, outcome)
        e["verdicts"] = [rates({"kind": k, **verdict_doc(v)}) for k, v in outcome.verdicts.items()]
        window_rates = sorted(1e3 / x for x in outcome.final.values)
        e.update({"batch": off.batch, "mode": mode, "samples_per_call": per_call,
                  "median_window_rate": round(window_rates[len(window_rates) // 2], 3) if window_rates else None})
        entries.append(e)
        found += [outcome.verdict(), loadgen.judge_outputs(check, ctx.job.name, e, lines)]
        for b in budgets:
            v = outcome.verdicts[b.kind]
            if v.verdict is Verdict.FAIL:
                lines.append(f"throughput: {ctx.job.name} ({ds.name}) batch {off.batch} ({mode}): median window "
                             f"{1e3 / v.observed:.1f} samples/s (at most {1e3 / (v.lower or v.observed):.1f} with "
                             f"{v.confidence:.0%} confidence) < budget {want:g} samples/s ({v.exceeding} of "
                             f"{v.samples} windows of {off.window_seconds:g} s below it); over the run "
                             f"{outcome.final.facts['samples_per_second']} samples/s")
    off = runs[0][2]  # the summary and the figures: the first judged data set's
    want = off.min_samples_per_second
    plan = scenario_plan(lat.confidence, off.min_seconds, 0, lat.retry_wait_seconds, ctx.quick)
    rate = entries[0].get("median_window_rate")
    said = (f"{rate:.0f}/s" if isinstance(rate, float) else "-/s") + (f" >= {want:g}/s" if want else "") \
        + f" (batch {off.batch})"
    verdict, section = loadgen.section(
        gate_verdict(found), entries, said, budget_of(lat.offline) if lat.offline is not None else {},
        per_data_set={ds.name: budget_of(o) for _, ds, o in runs},
        batch=off.batch, min_samples_per_second=want, confidence=plan.confidence, min_seconds=plan.min_seconds,
        window_seconds=off.window_seconds, quick=ctx.quick)
    return verdict, section, lines
