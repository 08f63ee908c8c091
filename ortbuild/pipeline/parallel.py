"""Run build jobs in worker processes, N at a time, with progress flowing back to the parent.

Processes, not threads: the quantizers change the process's working directory and temp dir, and ORT's
sessions would compete for one GIL-free pool anyway. Workers are spawned (not forked: the parent has ORT
threads from its provider probes) and get the builder's state once (WorkerState: project, keys, probe
answers) and the callable that makes their builder: this module does not know the Builder.
"""

from __future__ import annotations

import dataclasses
import multiprocessing as mp
import os
import queue
import threading
from collections.abc import Callable, Sequence
from concurrent.futures import Future, ProcessPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from ortbuild import machine, modelfiles, runtime
from ortbuild.artifact import keys
from ortbuild.errors import ORPHANED, StepError
from ortbuild.pipeline.job import JobResult
from ortbuild.project.config import Project
from ortbuild.project.plan import Job
from ortbuild.status import Event, JobStatus

if TYPE_CHECKING:
    from multiprocessing.queues import Queue

    from ortbuild.pipeline.cache import Cache

PER_JOB_BASE = 600 << 20  # a worker's resident set before its model: Python, numpy, onnx, ORT
PER_JOB_FACTOR = 3        # a job's peak resident set, in model sizes (all files): build.py keeps it under 2.5x
# Below this many model bytes (all jobs, all files) the jobs build one after the other in this process: a spawned
# worker spends about a second of CPU importing numpy, onnx and ORT before its first job, more than small jobs
# take (cpu-fp32 and cpu-int8 of tiny_cnn and tiny_transformer, 4 jobs, 2 cores, medians of 6 side by side: 2.9 s
# and 3.0 CPU-seconds in this process, 4.3 s and 6.4 CPU-seconds with -j 2).
SMALL_WORK = 16 << 20


def default_workers(jobs: Sequence[Job]) -> tuple[int, str]:
    """As many workers as cores, as memory allows (a job needs its base plus ~3x its model, every file of it
    counted), and jobs; with the reason when memory is what limits it. Jobs whose models come to less than
    SMALL_WORK bytes in all: one (this process, no worker to start)."""
    if not jobs:
        return 1, ""
    sizes = {}
    for j in jobs:
        if j.model.name not in sizes:
            try:
                sizes[j.model.name] = modelfiles.of_source(j.model.path, hashed=False).size
            except Exception:  # the build reports a broken model; here it only sizes workers
                sizes[j.model.name] = j.model.path.stat().st_size if j.model.path.exists() else 0
    if sum(sizes[j.model.name] for j in jobs) < SMALL_WORK:
        return 1, ""
    name, biggest = max(sizes.items(), key=lambda kv: kv[1])
    need = PER_JOB_BASE + PER_JOB_FACTOR * biggest
    avail = machine.available_memory()
    by_memory = max(1, avail // need)
    n = max(1, min(os.cpu_count() or 1, by_memory, len(jobs)))
    why = ""
    if by_memory < min(os.cpu_count() or 1, len(jobs)):
        why = (f"{n} worker(s): the largest model, {name}, is {biggest / (1 << 30):.2f} GiB (all its files), a job "
               f"may need ~{need / (1 << 30):.1f} GiB and {avail / (1 << 30):.1f} GiB are available (-j overrides)")
    return n, why


@dataclass(frozen=True)
class WorkerState:
    """What a worker needs to build like the parent's builder, sent once (pickled) at its start."""

    project: Project
    dist: Path
    force: bool
    repair: bool
    secrets: keys.Secrets
    probes: dict[tuple[str, str, str], str | None]  # the parent's provider probes (a probe opens ORT sessions)
    parent: int = 0
    capture: bool = True             # third-party output into dist/logs/ (ortbuild.logs)
    command: str = "build"           # the ortbuild command building (Builder.command)
    cache: Cache | None = None       # the shared build cache (ortbuild.pipeline.cache)


WorkerFactory = Callable[[WorkerState, Callable[[str, Event], None]], Callable[[Job], JobResult]]
_WORKER: Callable[[Job], JobResult] | None = None


def _die_with_parent(parent: int) -> None:
    """Linux: the kernel kills this worker when the parent dies (kill -9 included), so no orphan goes on
    writing into dist/ after the lock its parent held is gone."""
    import ctypes
    import signal

    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        return
    if os.getppid() != parent:  # the parent died before prctl took effect
        os._exit(ORPHANED)


def _init(state: WorkerState, make: WorkerFactory, events: Queue[tuple[str, Event]]) -> None:
    _die_with_parent(state.parent)
    global _WORKER
    runtime.import_ort()  # telemetry off in this process before any session
    _WORKER = make(state, lambda job, event: events.put((job, event)))


def _run(job: Job) -> JobResult:
    assert _WORKER is not None, "a worker runs jobs only after _init"
    return _WORKER(job)


def _result(future: Future[JobResult], job: Job) -> JobResult:
    """The job's result; a worker that died (a crash inside a native library) fails its jobs, not the run."""
    try:
        return future.result()
    except Exception as e:
        err = StepError(job.target.name, job.model.name, "worker",
                        f"the worker process building it died ({type(e).__name__}: {e})",
                        "rerun with -j 1 to see which job crashes it")
        return JobResult(job.target.name, job.model.name, JobStatus.FAILED, reason=err.message,
                         precision=job.settings.precision, error=err)


def run_jobs(state: WorkerState, make: WorkerFactory, todo: Sequence[tuple[int, Job]], workers: int,
             progress: Callable[[str, Event], None]) -> dict[int, JobResult]:
    """Run `todo` in `workers` spawned processes; each builds its jobs with the callable `make(state, sink)`
    returns (picklable: a module-level function or classmethod), its progress relayed to `progress`."""
    ctx = mp.get_context("spawn")
    events: Queue[tuple[str, Event]] = ctx.Queue()
    done = threading.Event()

    def relay() -> None:  # worker progress -> the parent's display, one line or live row per event
        while not done.is_set() or not events.empty():
            try:
                job, event = events.get(timeout=0.05)
            except queue.Empty:
                continue
            progress(job, event)

    relay_thread = threading.Thread(target=relay, daemon=True)
    relay_thread.start()
    try:
        with ProcessPoolExecutor(max_workers=workers, mp_context=ctx, initializer=_init,
                                 initargs=(dataclasses.replace(state, parent=os.getpid()), make, events)) as pool:
            futures = {i: pool.submit(_run, job) for i, job in todo}
            return {i: _result(f, job) for (i, job), f in zip(todo, futures.values(), strict=True)}
    finally:
        done.set()
        relay_thread.join()
