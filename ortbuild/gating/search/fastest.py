"""Build to the fastest artifact that passes (`candidates` on a target): the declared precision and each candidate
(a precision, or a variant of one: its options tables laid over the target's) are built into a scratch directory
by the real pipeline, judged by the accuracy gate through their generated loaders (a failing one repaired by the
precision search where the target says `precision_search = "auto"`), and each passing one is timed against the fp32
artifact of the same job on this machine: both sessions open side by side, runs paired and interleaved on every
golden data set (tune_search.compare: the median of candidate/fp32 and its interval at the target's latency
confidence, the worst data set's). fp32 is built as the reference where no candidate is fp32.

The rule (`choose`): a reduced precision whose interval lies above 1 and whose median passes 1 + TIE is measured
slower than fp32 and never ships (where fp32 is a candidate, fp32 does; else the job fails with the ratio). Of the
others, those within TIE of the fastest are as fast, and the smallest artifact of them ships: an int8 that costs
nothing measurable ships over an fp32 four times its size, an int8 three times slower does not. The choice, every
candidate's ratio with its interval, and the CPU it was measured on (its x86-64 level and model) are written to
targets.lock (`applies`: the chosen precision and options; `choice`: how), the job rebuilt into dist/ through it
and judged again (base.Locking), as for the precision search. Bounded by the search's Budget (seconds): the timing
keeps MEASURE_SECONDS per candidate (at most TIMING_SHARE of the budget) from the repairs, each repair gets an equal
part of the rest; candidates left when it runs out are said to be not tried or not timed, the choice says which,
and the entry says `all_measured = false`.
"""

from __future__ import annotations

import math
import tempfile
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from ortbuild import emulation, logs, machine, paths
from ortbuild.errors import GateFailed, OrtbuildError, OutputsBroken, UsageError, first_line
from ortbuild.gating.measure import emulated
from ortbuild.gating.record import TestResult
from ortbuild.gating.runner import Tester
from ortbuild.gating.search import bisect, explain
from ortbuild.gating.search.base import Budget, Clock, Found, JobSearch
from ortbuild.gating.search.tune import Sessions, fitted, measure_pair, plan_of
from ortbuild.gating.search.tune_search import Comparison
from ortbuild.pipeline.build import Builder
from ortbuild.pipeline.job import JobResult
from ortbuild.pipeline.progress import Progress
from ortbuild.project import lock_entry, lockfile, speedup
from ortbuild.project.plan import Job
from ortbuild.status import JobStatus, PhaseStarted, Verdict

TIE = 0.05              # candidates whose median ratio is within this share of the fastest one's are as fast
MEASURE_SECONDS = 10.0  # of paired runs of one candidate against fp32, at most (fewer once the verdict is decided)
TIMING_SHARE = 0.5      # of the budget, at most, kept from the repairs for the timing (MEASURE_SECONDS a candidate)
FP32 = "fp32"


@dataclass(frozen=True)
class Option:
    """One candidate: what it lays over the declared settings (the lock's `applies`: {} for the declared one)."""

    label: str
    applies: Mapping[str, Any]
    precision: str
    shippable: bool = True           # False: fp32 built as the reference only (no candidate is fp32)


@dataclass
class Tried:
    """A candidate as built, judged and timed."""

    option: Option
    passed: bool = False
    worst: str = ""                  # the accuracy gate's summary, or why it was not built or judged
    size: int | None = None          # bytes of the artifact
    comparison: Comparison | None = None  # against fp32, paired (None: fp32 itself, or not timed)
    repaired: Mapping[str, Any] | None = None  # the lists the precision search kept in float for it
    note: str = ""                   # not tried (out of time), not timed (why)

    @property
    def ratio(self) -> float | None:
        """Its median time over fp32's: 1 for fp32, None where not timed."""
        if self.option.precision == FP32:
            return 1.0 if self.passed or not self.option.shippable else None
        return self.comparison.ratio if self.comparison is not None else None

    @property
    def slower(self) -> bool:
        """A reduced precision measured slower than fp32: the interval above 1 and the median past 1 + TIE."""
        c = self.comparison
        return c is not None and c.low is not None and c.low > 1.0 and c.ratio > 1.0 + TIE

    def timing(self) -> str:
        """"0.62x fp32's time [0.58, 0.66] at 90%" (or why it has none)."""
        c = self.comparison
        if self.option.precision == FP32:
            return "the reference"
        if c is None:
            return self.note or "not timed"
        bounds = f" [{c.low:.2f}, {c.high:.2f}]" if c.low is not None and c.high is not None else ""
        return (f"{c.ratio:.2f}x fp32's time{bounds} at {c.confidence:.0%} "
                f"(p50 {c.p50_ms:.3g} ms vs {c.base_p50_ms:.3g} ms)")

    def line(self) -> str:
        size = f", {self.size / 1e6:.3g} MB" if self.size is not None else ""
        verdict = f"accuracy PASS ({self.worst})" if self.passed else f"not shippable: {self.worst or self.note}"
        fixed = f", kept {lock_entry.toml_value(dict(self.repaired))} in float" if self.repaired else ""
        return f"{self.option.label}: {verdict}{fixed}{size}; {self.timing()}"


def options_of(job: Job) -> list[Option]:
    """The declared precision, each candidate, and fp32 as the reference where no candidate is fp32."""
    s = job.settings
    out = [Option(f"{s.precision} (declared)", {}, s.precision)]
    for c in s.candidates:
        if c == {"precision": s.precision}:  # the declared one
            continue
        tables = {k: dict(v) for k, v in c.items() if k != "precision"}
        label = c["precision"] + "".join(f" {t} {lock_entry.toml_value(v)}" for t, v in tables.items())
        out.append(Option(label, {"precision": c["precision"], **tables}, c["precision"]))
    if not any(o.precision == FP32 for o in out):
        out.append(Option("fp32 (the reference, not a candidate)", {"precision": FP32}, FP32, shippable=False))
    return out


def choose(tried: Sequence[Tried]) -> tuple[Tried | None, str]:
    """The candidate to ship and why (None and why not, where none may)."""
    passing = [t for t in tried if t.passed and t.option.shippable]
    slow = [t for t in passing if t.slower]
    eligible = [t for t in passing if not t.slower and t.ratio is not None]
    if passing and not any(t.ratio is not None for t in passing):  # nothing timed: what was asked for, if it passes
        first = passing[0]
        return first, f"{first.option.label}: {first.timing()}: none of the candidates could be timed against fp32"
    if not eligible:
        if slow:
            return None, ("measured slower than fp32 on this CPU: " + "; ".join(
                f"{t.option.label} takes {t.timing()}" for t in slow) + ", and fp32 is not a candidate")
        return None, "no candidate passes its accuracy gate: " + "; ".join(
            f"{t.option.label}: {t.worst or t.note}" for t in tried if t.option.shippable)
    fastest = min(eligible, key=lambda t: (t.ratio or 0.0))
    best = fastest.ratio or 0.0
    tied = [t for t in eligible if (t.ratio or 0.0) <= best * (1.0 + TIE)]
    pick = min(tied, key=lambda t: (t.size if t.size is not None else math.inf, t.ratio or 0.0))
    why = f"{pick.option.label}: {pick.timing()}" if pick.option.precision != FP32 else pick.option.label
    if pick is not fastest:
        why += (f", the smallest of those within {TIE:.0%} of the fastest ({fastest.option.label}: "
                f"{fastest.timing()})")
    elif len(eligible) > 1 or pick.option.precision == FP32:
        why += ", the fastest that passes"
    if slow:
        why += "; measured slower than fp32: " + "; ".join(f"{t.option.label} ({t.timing()})" for t in slow)
    untimed = [t for t in passing if t.ratio is None]
    if untimed:
        why += "; passes but " + "; ".join(f"{t.option.label}: {t.note or 'not timed'}" for t in untimed)
    return pick, why


class FastestSearch(JobSearch):
    """Build to the fastest artifact that passes, a base.Search over a job's build result (the declared settings,
    built into dist/): the candidates built and judged in a scratch dist, timed against fp32, the choice locked and
    rebuilt into dist/; a job none of whose candidates may ship fails with the table of what was measured."""

    def search(self, job: Job, given: JobResult) -> Found[JobResult]:
        clock = self.budget.start()
        declared = lockfile.declared(job)
        if not given.status.usable and not isinstance(given.error, OutputsBroken):  # not the precision's doing
            return clock.found(given, found=False, cut_short=False)
        if emulated.emulated(job.target):  # timings under qemu say nothing of the device's speed
            return clock.found(self._refused(job, given), found=False, cut_short=False)
        options = options_of(declared)
        self.progress(job.name, PhaseStarted(f"candidates: {len(options)} artifacts built, judged and timed against "
                                             f"fp32 on this CPU ({speedup.level()}), at most "
                                             f"{self.budget.seconds:g} s"))
        dist = self.locking.builder.dist  # what the converters and ONNX Runtime say goes to the job's log (not with -v)
        log = logs.log_path(dist, job.target.name, job.model.name, "candidates") if self.locking.builder.capture \
            else None
        with tempfile.TemporaryDirectory(prefix="ortbuild-candidates-") as scratch, logs.captured(log, dist):
            tried, notes = self._measure(declared, options, Path(scratch), clock, given.seconds)
        pick, why = choose(tried)
        complete = not any(t.note.startswith("not tried") for t in tried)
        record: dict[str, object] = {
            "chosen": pick.option.label if pick is not None else "none", "why": why,
            "cpu": speedup.level(), "cpu_model": machine.cpu_model(),
            "isa": " ".join(machine.fingerprint()["isa_flags"]),
            "measured": [t.line() for t in tried], "all_measured": complete, "seconds": round(clock.spent(), 1)}
        if notes:
            record["notes"] = notes
        if pick is None:
            return clock.found(self._failed(job, given, why, tried), found=False, cut_short=not complete)
        return clock.found(self._keep(job, given, pick, record), found=True, cut_short=not complete)

    def _measure(self, declared: Job, options: Sequence[Option], scratch: Path, clock: Clock,
                 build_seconds: float) -> tuple[list[Tried], list[str]]:
        """Each option built, judged (repaired) and timed, and how they were timed; `build_seconds`: what the
        declared build took, the estimate of each candidate's build kept from the repairs with the timing's share."""
        base = self.locking.builder
        builder = Builder(base.project, scratch, force=True, progress=Progress(quiet=True), secrets=base.secrets,
                          capture=False)
        tester = Tester(self.tester.project, scratch, self.tester.secret, self.tester.config_arg,
                        Progress(quiet=True), self.tester.sign_key, judged=self.tester.judged)
        tester.golden_cache = self.tester.golden_cache
        tried: list[Tried] = []
        opened: dict[str, Any] = {}
        feeds: list[dict[str, Any]] = []
        # the timing's share and the builds still to come, kept from the repairs; each repair gets an equal part of
        # the rest
        timing = min(TIMING_SHARE * self.budget.seconds, MEASURE_SECONDS * sum(o.precision != FP32 for o in options))
        for i, opt in enumerate(options):
            reserve = timing + build_seconds * (len(options) - i)
            t = Tried(opt)
            tried.append(t)
            if clock.out_of_time():
                t.note = "not tried (out of time)"
                continue
            self.progress(declared.name, f"candidates: {opt.label}: building and judging")
            repair = Budget(self.budget.rebuilds, max(0.0, clock.left() - reserve) / (len(options) - i))
            session, g = self._judged(builder, tester, declared, t, repair.start())
            if session is not None:
                opened[opt.label] = session
                feeds = feeds or [ds.inputs for ds in g]
        ref = next((opened.get(t.option.label) for t in tried if t.option.precision == FP32), None)
        sliced: list[str] = []
        if ref is not None and feeds:  # a golden set too long to time in MEASURE_SECONDS: its first samples
            feeds, sliced = fitted(ref, feeds, 2 * MEASURE_SECONDS)
        # the passing ones first; a failing one is timed too, where time is left (what a repair would be worth)
        timed = sorted((t for t in tried if t.option.label in opened and t.option.precision != FP32),
                       key=lambda t: not t.passed)
        for i, t in enumerate(timed):
            if ref is None:
                t.note = "not timed: the fp32 artifact could not be built or run"
                continue
            if clock.out_of_time():
                t.note = "not timed (out of time)"
                continue
            share = min(MEASURE_SECONDS, clock.left() / (len(timed) - i))
            self.progress(declared.name, f"candidates: {t.option.label} against fp32, paired, at most {share:.0f} s")
            gates = declared.settings.gates
            assert gates is not None
            try:
                t.comparison = measure_pair((ref, opened[t.option.label]), feeds, gates.latency.warmup_runs,
                                            plan_of(declared), time.monotonic() + share)
            except OrtbuildError as e:
                t.note = f"not timed: {first_line(e)}"
        return tried, sliced

    def _job(self, declared: Job, applies: Mapping[str, Any]) -> Job | None:
        if not applies:
            return declared
        try:
            (cjob,) = lockfile.apply(self.locking.builder.project, [
                (declared, lock_entry.Entry(declared.name, "", "", applies))])
        except OrtbuildError:
            return None
        return cjob

    def _judged(self, builder: Builder, tester: Tester, declared: Job, t: Tried, clock: Clock) \
            -> tuple[Any | None, list[Any]]:
        """Build and judge one candidate (`t.option` laid over the declared job; repaired where the target asks and
        it fails): its session, passing or not (None where it was not built or cannot run here), and the golden data
        sets."""
        cjob = self._job(declared, t.option.applies)
        if cjob is None:
            t.worst = "its settings do not apply to this model"
            return None, []
        built = builder.run_job(cjob)
        if built.status != JobStatus.BUILT:
            t.worst = f"build {built.status}: {first_line(built.error) if built.error else built.reason}"[:200]
            return None, []
        res = TestResult(cjob.target.name, cjob.model.name, cjob.settings.precision)
        try:
            module, g, _ = tester.accuracy_gate(cjob, res)
        except OrtbuildError as e:
            t.worst = first_line(e)[:200]
            return None, []
        knob = cjob.settings.rule.knob
        if res.accuracy != Verdict.PASS and t.repaired is None and knob is not None \
                and cjob.settings.precision_search == "auto" and not clock.out_of_time():
            self.progress(declared.name, f"candidates: {t.option.label}: accuracy FAIL ({res.worst}); searching")
            ex = explain.Explainer(self.locking.builder, self.tester, self.budget,
                                   progress=self.progress, final_gate=False)
            doc = ex.search(cjob, res, clock).answer  # `clock`: this candidate's share of the budget
            if doc.get("status") == "found":
                fixed = bisect.settings_with(cjob.settings, knob, list(doc.get("nodes", [])),
                                             list(doc.get("op_types", [])))
                lists = bisect.changed_lists(cjob.settings, knob, fixed)
                tables = dict(t.option.applies.get(knob.table, {}))
                t.option = replace(t.option, applies={**t.option.applies, knob.table: {**tables, **lists}})
                t.repaired = {knob.table: lists}
                return self._judged(builder, tester, declared, t, clock)
            t.worst = f"{res.worst}; the precision search found no set kept in float that passes: {doc.get('reason')}"
        else:
            t.worst = res.worst
            t.passed = res.accuracy == Verdict.PASS
        t.size = built.size
        if module is None:
            return None, list(g.sets)
        folder = paths.inside(tester.dist, cjob.target.name, cjob.model.name)
        return Sessions(module, folder, tester.secret, cjob.name).open({}), list(g.sets)

    def _keep(self, job: Job, given: JobResult, pick: Tried, record: dict[str, object]) -> JobResult:
        """The chosen candidate written to the lock, rebuilt into dist/ through it and judged again."""
        declared = lockfile.declared(job)
        entry = lock_entry.Entry(job.name, *self.locking.builder.fingerprint(declared), dict(pick.option.applies),
                                 choice=record)
        if "search" in lockfile.wanted(declared.settings):  # precision_search = "auto": its part, as it ended
            entry = entry.merged({}, search={"result": f"repaired as the candidate {pick.option.label}" if
                                             pick.repaired else f"passes as the candidate {pick.option.label}"})
        locked, result, res = self.locking.judged(job, entry, self.tester)
        if res.accuracy != Verdict.PASS:
            return self._failed(job, given, f"the chosen candidate {pick.option.label} did not pass when rebuilt "
                                            f"into dist/ ({res.worst})", [pick])
        self.locking.keep(locked, result, entry, f"candidates: shipped {record['why']}")
        return result

    def _refused(self, job: Job, given: JobResult) -> JobResult:
        return self.fail(job, given, UsageError(
            f"[targets.{job.target.name}] candidates: a {job.target.platform} target's candidates are timed on the "
            f"machine it runs on, and this one emulates it ({emulation.host()}): emulation says nothing of the "
            "device's speed",
            f"build this target on {emulated.where_timed(job.target)} (the lock keeps its choice for builds here), or "
            "set `candidates = []` on it"))

    def _failed(self, job: Job, given: JobResult, why: str, tried: Sequence[Tried]) -> JobResult:
        table = "\n".join(f"  {t.line()}" for t in tried)
        return self.fail(job, given, GateFailed(
            f"{job.name}: no candidate may ship ({why})\n{table}",
            "add \"fp32\" to the target's candidates to fall back to it, loosen the accuracy rule, or raise "
            "--explain-seconds"))
