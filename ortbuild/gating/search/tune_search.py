"""Session tuning's search (`ortbuild tune`, `tune = true`; gating/search/tune.py runs it on a built job): the fastest
session options that pass every gate, measured on the built artifact through its generated Python loader
(load(session=...)) with the latency gate's statistics.

The search is greedy, one knob at a time in a fixed order (intra-op threads: 1, half the CPUs, all of them; intra-op
spinning; `session.dynamic_block_base`; the execution mode), each value of a knob measured against the best setting
so far: both sessions open side by side, their runs paired and interleaved on each golden data set (latency.sample:
A B, B A, ..., looked at the checkpoints fixed in advance, stopping early once decided), the verdict on the median of
candidate/current over the pairs at the target's latency confidence (a relative budget of ratio 1, as `faster_than`
judges). A value is faster only when the whole interval of that median ratio lies below 1 on every data set (its
speed-up's interval excludes 1.0); a faster value measured while the machine was loaded (more runnable threads than
CPUs) or drifting is measured again once the load has fallen (load.wait_for_quiet), both looks sharing one error
budget, as the gate retries a FAIL under load. The fastest faster value of a knob that passes the accuracy gate
(Tester.accuracy_gate through load(session=...): threads and parallel execution can change float reductions) is kept.
At the end the kept setting is measured once more against the declared one, in one run: the recorded speed-up and
its interval are that measurement's; when that interval includes 1.0 nothing is kept. Bounded in seconds per job.

Not searched here: the optimization level and fusion (they change the offline-optimized graph: a rebuild per
value), see docs/build-to-the-gates.md. A reduced precision is compared with an fp32 artifact of the same model
where one is built (same session options, interleaved): a note, e.g. "int8-dynamic is 0.84x fp32's speed".
"""

from __future__ import annotations

import dataclasses
import os
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from ortbuild.errors import OrtbuildError, first_line
from ortbuild.gating.measure import load, percentiles
from ortbuild.gating.measure import sampling as latency
from ortbuild.project import lock_entry
from ortbuild.project.plan import Job

SPINNING = "session.intra_op.allow_spinning"
BLOCK_BASE = "session.dynamic_block_base"
BLOCK_BASES = ("4",)         # ORT's suggested start for dynamic block sizing
# the config keys the search sets, at ONNX Runtime's defaults: the declared setting states them explicitly, so an
# artifact built with a tuned value is measured against the default again (load(session=...) merges `config`)
CONFIG_DEFAULTS = {SPINNING: "1", BLOCK_BASE: "0"}
RETRY_WAIT_SECONDS = 5.0     # a faster verdict under load waits at most this long for the load to fall
MIN_SECONDS = 0.5            # sampling of one comparison, at least (when undecided)
SEARCH_SHARE = 0.8           # of the seconds, the candidates' part; the rest is kept for the final confirmation

KEPT, NO_FASTER, FAILS_ACCURACY, NOT_BEST, NOT_TRIED, ERROR = (
    "kept", "no faster", "fails accuracy", "faster, another value more", "not tried (out of time)", "error")

Session = dict[str, Any]     # the loader's SESSION: the keys of [targets.X.session], `config` a table of strings


@dataclass(frozen=True)
class Candidate:
    """One value of one knob: what it lays over the session (`config` key by key)."""

    knob: str
    label: str                       # "intra_op_num_threads = 1"
    patch: Mapping[str, Any]

    def over(self, session: Session) -> Session:
        return patched(session, self.patch)


def patched(session: Session, patch: Mapping[str, Any]) -> Session:
    out = {**session, **{k: v for k, v in patch.items() if k != "config"}}
    out["config"] = {**session.get("config", {}), **patch.get("config", {})}
    return out


def declared_session(job: Job) -> Session:
    """The job's session options as targets.toml declares them, the keys the search sets stated at ORT's defaults."""
    s = job.settings.session.as_json()
    s["config"] = {**CONFIG_DEFAULTS, **dict(job.settings.session.config)}
    return s


def changes(declared: Session, tuned: Session) -> dict[str, Any]:
    """What `tuned` changes of `declared`: the lock's `applies.session` (`config`: only the changed entries)."""
    out: dict[str, Any] = {k: v for k, v in tuned.items() if k != "config" and declared.get(k) != v}
    config = {k: v for k, v in tuned.get("config", {}).items() if declared.get("config", {}).get(k) != v}
    if config:
        out["config"] = config
    return out


def candidates(session: Session, cpus: int) -> list[tuple[str, list[Candidate]]]:
    """Each knob's values other than the session's own, in the search's order."""
    threads = [n for n in dict.fromkeys((1, max(1, cpus // 2), cpus)) if n != session["intra_op_num_threads"]]
    spin = "0" if session["config"].get(SPINNING, "1") == "1" else "1"
    mode = "parallel" if session["execution_mode"] == "sequential" else "sequential"
    return [
        ("intra_op_num_threads", [Candidate("intra_op_num_threads", f"intra_op_num_threads = {n}",
                                            {"intra_op_num_threads": n}) for n in threads]),
        ("spinning", [Candidate("spinning", f"{SPINNING} = \"{spin}\"", {"config": {SPINNING: spin}})]),
        ("dynamic_block_base", [Candidate("dynamic_block_base", f"{BLOCK_BASE} = \"{b}\"",
                                          {"config": {BLOCK_BASE: b}})
                                for b in BLOCK_BASES if session["config"].get(BLOCK_BASE, "0") != b]),
        ("execution_mode", [Candidate("execution_mode", f"execution_mode = \"{mode}\"", {"execution_mode": mode})]),
    ]


# ------------------------------------------------------------------------------------------ one comparison

@dataclass(frozen=True)
class Comparison:
    """Candidate against current, paired: the median of candidate/current and its interval (worst data set)."""

    ratio: float                     # median of candidate_i / current_i: below 1 is faster
    low: float | None                # the interval of that median at `confidence` (None: too few samples)
    high: float | None
    confidence: float
    p50_ms: float                    # the candidate's
    base_p50_ms: float               # the current setting's, in the same run
    samples: int
    load: float | None = None
    notes: tuple[str, ...] = ()      # instability, the retry under load

    @property
    def faster(self) -> bool:
        """The whole interval below 1: its speed-up's interval excludes 1.0 on the fast side."""
        return self.high is not None and self.high < 1.0

    @property
    def speedup(self) -> float:
        return 1.0 / self.ratio

    def interval(self) -> str:
        """The speed-up (current/candidate) and its interval: "1.23x [1.10, 1.35]"."""
        if self.low is None or self.high is None:
            return f"{self.speedup:.2f}x [too few samples]"
        return f"{self.speedup:.2f}x [{1 / self.high:.2f}, {1 / self.low:.2f}]"

    def as_json(self) -> dict[str, object]:
        return dataclasses.asdict(self) | {"speedup": self.speedup, "faster": self.faster}


def comparison_of(attempt: latency.Attempt, notes: Sequence[str] = ()) -> Comparison:
    """The comparison one latency.sample() of {"current", "candidate"} under RELATIVE found."""
    v = attempt.verdicts["relative"]
    cand, base = attempt.series["candidate"], attempt.series["current"]
    return Comparison(v.observed, v.lower, v.upper, v.confidence, cand.summary()["p50_ms"],
                      base.summary()["p50_ms"], v.samples, cand.load, tuple([*cand.instability(), *notes]))


RELATIVE = percentiles.Budget("relative", 0.5, 1.0, "current")  # median of candidate/current at most 1


def compare(calls: Mapping[str, Callable[[], object]], plan: latency.Plan, *, cpus: int | None = None,
            clock: Callable[[], float] = time.perf_counter, read: Callable[[], float | None] = load.runnable,
            wait: Callable[[float, int], object] | None = None) -> Comparison:
    """Sample calls {"current", "candidate"} paired and interleaved until the relative verdict is decided or the
    plan ends; a faster verdict taken under load or drift is measured again after waiting for the load to fall
    (at most plan.retry_wait_seconds), the two looks sharing one error budget."""
    cpus = cpus or os.cpu_count() or 1
    spending: dict[str, percentiles.Spending] = {}
    ends = clock() + plan.max_seconds  # both looks end by the plan's deadline
    first = latency.sample(calls, "candidate", [RELATIVE], plan, spending, clock, read, cpus)
    found = comparison_of(first)
    if not found.faster or not first.series["candidate"].instability() or clock() >= ends:
        return found
    waited = (wait or (lambda s, c: load.wait_for_quiet(s, c, read)))(min(plan.retry_wait_seconds,
                                                                          max(0.0, ends - clock())), cpus)
    again = latency.sample(calls, "candidate", [RELATIVE], dataclasses.replace(plan, max_seconds=max(
        0.0, ends - clock())), spending, clock, read, cpus)
    return comparison_of(again, [f"measured again: faster under {'; '.join(first.series['candidate'].instability())}"
                                 f" ({waited})"])


def worst(found: Sequence[Comparison]) -> Comparison:
    """The data set least in favour of the candidate (the highest upper bound, then ratio)."""
    return max(found, key=lambda c: (c.high if c.high is not None else float("inf"), c.ratio))


# ------------------------------------------------------------------------------------------ the search

@dataclass
class Tried:
    """One candidate of the search, what it was measured against, and the verdict."""

    label: str
    against: str
    comparison: Comparison | None
    verdict: str
    note: str = ""

    def line(self) -> str:
        c = self.comparison
        return f"{self.label}: {self.verdict}" + (f" ({c.interval()} vs {self.against})" if c else "") + \
            (f": {self.note}" if self.note else "")

    def as_json(self) -> dict[str, object]:
        return {"candidate": self.label, "against": self.against, "verdict": self.verdict, "note": self.note,
                "comparison": self.comparison.as_json() if self.comparison else None}


@dataclass
class Tuning:
    """The search's answer for one job."""

    declared: Session
    tuned: Session
    tried: list[Tried] = field(default_factory=list)
    final: Comparison | None = None  # the kept setting against the declared one, one run (else declared against itself)
    rejected: bool = False           # `final` measured the kept setting no faster: nothing kept
    seconds: float = 0.0
    notes: list[str] = field(default_factory=list)

    @property
    def applies(self) -> dict[str, Any]:
        return changes(self.declared, self.tuned)

    def kept(self) -> str:
        a = self.applies
        parts = [f"{k} = {lock_entry.toml_value(v)}" for k, v in a.items() if k != "config"]
        parts += [f"config.\"{k}\" = \"{v}\"" for k, v in a.get("config", {}).items()]
        return "; ".join(parts) or "nothing (the declared session options are the fastest measured)"

    def record(self) -> dict[str, object]:
        """The lock entry's `tune` table."""
        out: dict[str, object] = {"kept": self.kept()}
        f = self.final
        if f is not None and self.rejected:  # what ships is the declared setting
            out |= {"default_p50_ms": round(f.base_p50_ms, 4), "tuned_p50_ms": round(f.base_p50_ms, 4),
                    "speedup": 1.0, "confidence": f.confidence}
        elif f is not None and not self.applies:  # the declared options against themselves: 1.0 and the spread
            out |= {"default_p50_ms": round(f.base_p50_ms, 4), "tuned_p50_ms": round(f.base_p50_ms, 4),
                    "speedup": 1.0}
            if f.low is not None and f.high is not None:
                out |= {"low": round(1 / f.high, 3), "high": round(1 / f.low, 3)}
            out["confidence"] = f.confidence
        elif f is not None:
            out |= {"default_p50_ms": round(f.base_p50_ms, 4), "tuned_p50_ms": round(f.p50_ms, 4),
                    "speedup": round(f.speedup, 3)}
            if f.low is not None and f.high is not None:
                out |= {"low": round(1 / f.high, 3), "high": round(1 / f.low, 3)}
            out["confidence"] = f.confidence
        out |= {"tried": [t.line() for t in self.tried], "seconds": round(self.seconds, 1)}
        if self.notes:
            out["notes"] = list(self.notes)
        return out


Measure = Callable[[Session, Session], Comparison]   # (current, candidate) -> comparison
Accurate = Callable[[Session], tuple[bool, str]]     # candidate -> (accuracy passes, worst metric)


def search(declared: Session, cpus: int, measure: Measure, accurate: Accurate, seconds: float,
           clock: Callable[[], float] = time.monotonic,
           progress: Callable[[str], None] = lambda _: None) -> Tuning:
    """Greedy coordinate search from the declared session: each knob's values against the best so far; the fastest
    faster value that passes the accuracy gate is kept; then the kept setting against the declared one, once."""
    start = clock()
    out = Tuning(declared, declared)
    current, against = declared, "declared"
    for _knob, values in candidates(declared, cpus):
        values = [c for c in values if c.over(current) != current]
        found: list[tuple[Candidate, Tried]] = []
        for cand in values:
            if clock() - start >= seconds * SEARCH_SHARE:  # the rest: the final confirmation
                out.tried.append(Tried(cand.label, against, None, NOT_TRIED))
                continue
            progress(f"tune: {cand.label} against {against}")
            try:
                c = measure(current, cand.over(current))
            except OrtbuildError as e:
                out.tried.append(Tried(cand.label, against, None, ERROR, first_line(e)))
                continue
            t = Tried(cand.label, against, c, NO_FASTER if not c.faster else NOT_BEST)
            out.tried.append(t)
            if c.faster:
                found.append((cand, t))
        for cand, t in sorted(found, key=lambda x: x[1].comparison.ratio if x[1].comparison else 1.0):
            ok, worst_metric = accurate(cand.over(current))
            if not ok:
                t.verdict, t.note = FAILS_ACCURACY, worst_metric
                continue
            t.verdict, t.note = KEPT, f"accuracy {worst_metric}"
            current, against = cand.over(current), cand.label if against == "declared" else f"{against}, {cand.label}"
            break
    if current != declared and clock() - start < seconds:
        progress("tune: the kept setting against the declared one")
        out.final = measure(declared, current)
        if out.final.faster:
            out.tuned = current
        else:
            out.rejected = True
            out.notes.append(f"kept together ({against}) measured {out.final.interval()} against the declared "
                             "setting: no faster, nothing kept")
    elif current != declared:
        out.notes.append("out of time before the kept setting was measured against the declared one: nothing kept")
    elif clock() - start < seconds:
        progress("tune: the declared setting against itself, two sessions (the measurement's own spread)")
        out.final = measure(declared, declared)
    out.seconds = clock() - start
    return out
