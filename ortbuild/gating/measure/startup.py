"""Cold start and peak memory of an artifact, measured in fresh processes through its generated Python loader.

Each process (a fresh `sys.executable -B`, run in a private temporary directory) reads the key from its stdin
(never argv or the environment), imports the loader by path and onnxruntime with it, calls `load()` (verify,
decrypt, session creation), runs the first golden data set once (timed) and RUNS_AFTER times more, then prints
one JSON line: `cold_start_ms` (import + load + first run, timed inside the process: the interpreter's own start
is not counted), `import_ms`, `session_ms`, `first_run_ms` and `peak_rss_bytes`, the RSS high-water mark the
process reads itself (VmHWM of /proc/self/status: a spawned child's ru_maxrss can start at its parent's; where
/proc is absent, ru_maxrss of RUSAGE_SELF).

Verdicts: `latency.cold_start_ms` and `memory.peak_mb` each judge the median across processes, with the
distribution-free sequential test of the latency budgets (ortbuild.gating.measure.percentiles) at the target's
`latency.confidence`: looks at FIRST_LOOK processes, then at each doubling, up to MAX_PROCESSES; a further look
is not started when it would end past MAX_SECONDS (at the pace so far). PASS, FAIL, or INCONCLUSIVE when the
last look cannot decide (the median sits on the budget).
"""

from __future__ import annotations

import base64
import json
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np

from ortbuild.errors import GateFailed
from ortbuild.gating.measure.engine import Looks
from ortbuild.gating.measure.percentiles import Budget, PercentileVerdict, nearest_rank
from ortbuild.gating.timing_records import StartupDoc, StartupStats
from ortbuild.status import Verdict

FIRST_LOOK = 8            # processes before the first look (at 0.99, 8 is the fewest that can decide a median)
MAX_PROCESSES = 32        # the last look
MAX_SECONDS = 120.0       # no look is started that would end past this, at the pace so far
RUNS_AFTER = 2            # runs after the first, before the peak memory is read
PROCESS_TIMEOUT_S = 600   # one process
MIB = 1 << 20
# the budgets measured here: kind -> (the figure judged, its unit, how failure lines name it)
KINDS = {"cold_start": ("cold_start_ms", "ms", "cold start"), "memory": ("peak_rss_mb", "MB", "memory")}

CHILD = r"""
import sys, json, time
key = sys.stdin.read().strip() or None
loader, folder, inputs, runs = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
t0 = time.perf_counter()
import importlib.util
spec = importlib.util.spec_from_file_location("_ortbuild_loader_cold", loader)
mod = importlib.util.module_from_spec(spec)
sys.modules[spec.name] = mod
spec.loader.exec_module(mod)
import onnxruntime, numpy
t1 = time.perf_counter()
model = mod.load(key=key, folder=folder)
t2 = time.perf_counter()
with numpy.load(inputs, allow_pickle=True) as z:  # our own file, in a private directory
    feed = {k: z[k] for k in z.files}
t3 = time.perf_counter()
model.run(feed)
t4 = time.perf_counter()
for _ in range(runs):
    model.run(feed)
peak = None
try:
    with open("/proc/self/status") as f:
        peak = next(int(line.split()[1]) * 1024 for line in f if line.startswith("VmHWM:"))
except (OSError, StopIteration, ValueError, IndexError):
    try:
        import resource
        peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * (1 if sys.platform == "darwin" else 1024)
    except ImportError:
        pass
ms = lambda a, b: (b - a) * 1e3
print(json.dumps({"cold_start_ms": ms(t0, t2) + ms(t3, t4), "import_ms": ms(t0, t1), "session_ms": ms(t1, t2),
                  "first_run_ms": ms(t3, t4), "peak_rss_bytes": peak}))
"""


class StartupError(GateFailed):
    """A fresh process could not load or run the artifact (the loaded one in the test process could)."""


@dataclass(frozen=True)
class Sample:
    """One fresh process's figures."""

    cold_start_ms: float
    import_ms: float
    session_ms: float
    first_run_ms: float
    peak_rss_bytes: int | None

    @property
    def peak_rss_mb(self) -> float:
        return (self.peak_rss_bytes or 0) / MIB

    def value(self, kind: str) -> float:
        return float(getattr(self, KINDS[kind][0]))


@dataclass
class Outcome:
    """The processes measured and the verdict of each budget (by kind) at the last look."""

    samples: list[Sample]
    verdicts: dict[str, PercentileVerdict]
    looks: int = 0
    stopped: str = ""        # "decided", "cap" (MAX_PROCESSES reached) or "time" (MAX_SECONDS)
    seconds: float = 0.0
    error: str = ""          # a process failed: its verdicts are FAIL
    notes: list[str] = field(default_factory=list)


def judge(measure: Callable[[], Sample], budgets: Mapping[str, float], confidence: float, *,
          first: int = FIRST_LOOK, cap: int = MAX_PROCESSES, max_seconds: float = MAX_SECONDS,
          clock: Callable[[], float] = time.monotonic) -> Outcome:
    """Measure fresh processes one at a time, looking at the checkpoints (first, doubling, cap): stop at the first
    look that decides every budget, at the cap, or before a look that would end past max_seconds (the sampling
    engine's Looks, on the median of each kind)."""
    looks = Looks([Budget(kind, 0.5, budget) for kind, budget in budgets.items()], confidence, {}, first, cap)
    samples: list[Sample] = []
    start = clock()
    while True:
        samples.append(measure())
        if not looks.due(len(samples)):
            continue
        if looks.judge(lambda b: ([s.value(b.kind) for s in samples], b.limit)) or not budgets:
            stopped = "decided"
            break
        if len(samples) >= cap:
            stopped = "cap"
            break
        elapsed = clock() - start
        if elapsed + elapsed / len(samples) * (looks.next - len(samples)) > max_seconds:
            stopped = "time"
            break
    final = {kind: _in_processes(v) for kind, v in looks.final().items()}
    return Outcome(samples, final, looks.count, stopped, clock() - start)


def _in_processes(v: PercentileVerdict) -> PercentileVerdict:
    """with_estimate's note, in processes rather than samples."""
    return replace(v, note=v.note.replace("more samples", "more processes")) if v.note else v


def measure_once(loader: Path, folder: Path, inputs: Path, secret: bytes | None, workdir: Path,
                 runs_after: int = RUNS_AFTER) -> Sample:
    """One fresh process (the key on its stdin)."""
    key = base64.b64encode(secret).decode() if secret is not None else ""
    try:
        proc = subprocess.run([sys.executable, "-B", "-c", CHILD, str(loader), str(folder), str(inputs),
                               str(runs_after)], input=key, capture_output=True, text=True, cwd=workdir,
                              timeout=PROCESS_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        raise StartupError(f"a fresh process did not load and run the artifact within {PROCESS_TIMEOUT_S} s") from None
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("{")]
    if proc.returncode != 0 or not lines:
        tail = (proc.stderr.strip().splitlines() or ["(no output)"])[-1][:400]
        raise StartupError(f"a fresh process failed to load and run the artifact (exit {proc.returncode}): {tail}")
    doc = json.loads(lines[-1])
    return Sample(float(doc["cold_start_ms"]), float(doc["import_ms"]), float(doc["session_ms"]),
                  float(doc["first_run_ms"]), None if doc["peak_rss_bytes"] is None else int(doc["peak_rss_bytes"]))


def measure(loader: Path, folder: Path, feed: Mapping[str, object], secret: bytes | None, budgets: Mapping[str, float],
            confidence: float) -> Outcome:
    """The sequential plan over fresh processes, on `feed` (the first golden data set). A process that fails
    makes every budget FAIL (Outcome.error says why)."""
    with tempfile.TemporaryDirectory(prefix="ortbuild-startup-") as tmp:
        work = Path(tmp)
        inputs = work / "inputs.npz"
        # (numpy's stubs check savez's **kwds against its allow_pickle flag too: the arrays go untyped)
        arrays: dict[str, Any] = {k: np.asarray(v) for k, v in feed.items()}
        np.savez(inputs, **arrays)

        def one() -> Sample:
            s = measure_once(loader, folder, inputs, secret, work)
            if s.peak_rss_bytes is None and "memory" in budgets:
                raise StartupError("this platform does not say a process's peak memory (no /proc, no resource "
                                   "module): memory.peak_mb cannot be checked here")
            return s

        try:
            return judge(one, budgets, confidence)
        except StartupError as e:
            return Outcome([], {}, error=e.message)


def _stats(xs: list[float], full: bool) -> StartupStats:
    ys = sorted(xs)
    out: StartupStats = {"p50": round(nearest_rank(ys, 0.5), 3)}
    return {**out, "min": round(ys[0], 3), "max": round(ys[-1], 3)} if full else out


def verdict_of(outcome: Outcome, kind: str) -> Verdict:
    return Verdict.FAIL if outcome.error else outcome.verdicts[kind].verdict


def summary(outcome: Outcome, budgets: Mapping[str, float]) -> StartupDoc:
    """TestResult.startup: the figures over the processes, each budget's verdict, and a note when undecided."""
    xs = outcome.samples
    out: StartupDoc = {"processes": len(xs), "looks": outcome.looks, "stopped": outcome.stopped,
                       "seconds": round(outcome.seconds, 3),
                       "plan": {"first_look": FIRST_LOOK, "max_processes": MAX_PROCESSES,
                                "max_seconds": MAX_SECONDS, "runs_after_first": RUNS_AFTER}}
    if xs:
        out.update({"cold_start_ms": _stats([s.cold_start_ms for s in xs], True),
                    "import_ms": _stats([s.import_ms for s in xs], False),
                    "session_ms": _stats([s.session_ms for s in xs], False),
                    "first_run_ms": _stats([s.first_run_ms for s in xs], False)})
        if all(s.peak_rss_bytes is not None for s in xs):
            out["peak_rss_mb"] = _stats([s.peak_rss_mb for s in xs], True)
    out["verdicts"] = [
        {"kind": kind, "unit": KINDS[kind][1], "budget": budget, "verdict": Verdict.FAIL, "note": outcome.error}
        if outcome.error else {"kind": kind, "unit": KINDS[kind][1], **outcome.verdicts[kind].as_json()}
        for kind, budget in budgets.items()]
    if outcome.error:
        out["error"] = outcome.error
    notes = [f"{KINDS[v['kind']][2]}: {v['note']}" for v in out["verdicts"]
             if v["verdict"] == Verdict.INCONCLUSIVE and v.get("note")]
    if notes:
        why = {"cap": f"undecided after {len(xs)} processes, the most measured",
               "time": f"undecided after {len(xs)} processes: {MAX_SECONDS:g} s reached"}.get(outcome.stopped, "")
        out["note"] = "; ".join(notes) + (f" ({why})" if why else "")
    return out


def failure_lines(job: str, target: str, outcome: Outcome, budgets: Mapping[str, float]) -> list[str]:
    """The failure report's lines of the budgets that failed (`job`: target/model; `target`: its name)."""
    where = f"[targets.{target}]"
    if outcome.error:
        return [f"cold start / memory: {job} {outcome.error}",
                f"  hint: run the loader in a fresh Python process (docs/loaders.md) to see the whole error; "
                f"or remove latency.cold_start_ms and memory.peak_mb from {where}"]
    xs = outcome.samples
    lines: list[str] = []
    for kind, budget in budgets.items():
        v = outcome.verdicts[kind]
        if v.verdict != Verdict.FAIL:
            continue
        unit = KINDS[kind][1]
        bound = f" (at least {v.lower:.1f} {unit} with {v.confidence:.0%} confidence)" if v.lower is not None else ""
        over = f" over {len(xs)} fresh processes > budget {budget:g} {unit}"
        if kind == "cold_start":
            parts = {k: nearest_rank(sorted(getattr(s, k) for s in xs), 0.5)
                     for k in ("import_ms", "session_ms", "first_run_ms")}
            lines += [f"cold start: {job} median {v.observed:.1f} ms{bound}{over}",
                      f"  medians: import of the loader and onnxruntime {parts['import_ms']:.1f} ms, load() (verify, "
                      f"decrypt, session) {parts['session_ms']:.1f} ms, first run {parts['first_run_ms']:.1f} ms",
                      f"  hint: raise latency.cold_start_ms in {where} (or for this model, in a "
                      f"[[targets.{target}.overrides]] entry) if this start-up is expected"]
        else:
            lines += [f"memory: {job} peak RSS median {v.observed:.1f} MB{bound}{over}",
                      f"  hint: raise memory.peak_mb in {where} (or for this model, in a [[targets.{target}.overrides]]"
                      " entry) if this peak is expected; a reduced precision (fp16, int8) or session = "
                      "{ enable_cpu_mem_arena = false } lowers it"]
    return lines
