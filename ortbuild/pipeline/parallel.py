"""Run build jobs in worker processes, N at a time, with progress flowing back to the parent.

Processes, not threads: the quantizers change the process's working directory and temp dir, and ORT's
sessions would compete for one GIL-free pool anyway. Workers are spawned (not forked: the parent has ORT
threads from its provider probes) and get the builder's state once: project, keys, probe answers.
"""

from __future__ import annotations

import multiprocessing as mp
import os
import queue
import threading
from collections.abc import Sequence
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path
from typing import TYPE_CHECKING, Any

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from ortbuild import runtime
from ortbuild.artifact import keys

if TYPE_CHECKING:
    from ortbuild.pipeline.build import Builder, JobResult
    from ortbuild.project.plan import Job

PER_JOB_BASE = 600 << 20  # a worker's resident set before its model: Python, numpy, onnx, ORT
PER_JOB_FACTOR = 3        # a job's peak resident set, in model sizes (all files): build.py keeps it under 2.5x


def default_workers(jobs: Sequence[Job]) -> tuple[int, str]:
    """As many workers as cores, as memory allows (a job needs its base plus ~3x its model, every file of it
    counted), and jobs; with the reason when memory is what limits it."""
    from ortbuild import modelfiles

    if not jobs:
        return 1, ""
    try:
        with open("/proc/meminfo") as f:
            avail = next(int(line.split()[1]) << 10 for line in f if line.startswith("MemAvailable:"))
    except (OSError, StopIteration, ValueError):
        avail = 4 << 30
    sizes = {}
    for j in jobs:
        if j.model.name not in sizes:
            try:
                sizes[j.model.name] = modelfiles.of(j.model.path, hashed=False).size
            except Exception:  # the build reports a broken model; here it only sizes workers
                sizes[j.model.name] = j.model.path.stat().st_size if j.model.path.exists() else 0
    name, biggest = max(sizes.items(), key=lambda kv: kv[1])
    need = PER_JOB_BASE + PER_JOB_FACTOR * biggest
    by_memory = max(1, avail // need)
    n = max(1, min(os.cpu_count() or 1, by_memory, len(jobs)))
    why = ""
    if by_memory < min(os.cpu_count() or 1, len(jobs)):
        why = (f"{n} worker(s): the largest model, {name}, is {biggest / (1 << 30):.2f} GiB (all its files), a job "
               f"may need ~{need / (1 << 30):.1f} GiB and {avail / (1 << 30):.1f} GiB are available (-j overrides)")
    return n, why


_BUILDER: Builder | None = None


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
        os._exit(1)


def _init(state: dict[str, Any], events: Any) -> None:
    from ortbuild.pipeline.build import Builder

    _die_with_parent(state["parent"])
    global _BUILDER
    sign = state["sign"]
    sign_key = keys.SigningKey(Ed25519PrivateKey.from_private_bytes(sign[0]), sign[1], sign[2]) \
        if sign else None
    runtime.import_ort()  # telemetry off in this process before any session
    _BUILDER = Builder(state["project"], Path(state["dist"]), force=state["force"], repair=state["repair"],
                       progress=lambda job, message: events.put((job, message)),
                       enc_key=state["enc"], sign_key=sign_key)
    _BUILDER._probes = state["probes"]


def _run(job: Job) -> JobResult:
    assert _BUILDER is not None
    return _BUILDER.run_job(job)


def _result(future: Any, job: Job) -> JobResult:
    """The job's result; a worker that died (a crash inside a native library) fails its jobs, not the run."""
    from ortbuild.errors import StepError
    from ortbuild.pipeline.build import FAILED, JobResult

    try:
        result: JobResult = future.result()
        return result
    except Exception as e:
        err = StepError(job.target.name, job.model.name, "worker",
                        f"the worker process building it died ({type(e).__name__}: {e})",
                        "rerun with -j 1 to see which job crashes it")
        return JobResult(job.target.name, job.model.name, FAILED, reason=err.message,
                         precision=job.settings.precision, error=err)


def run_jobs(builder: Builder, todo: Sequence[tuple[int, Job]], workers: int) -> dict[int, JobResult]:
    from cryptography.hazmat.primitives import serialization

    sk = builder.sign_key
    sign = (sk.private.private_bytes(serialization.Encoding.Raw, serialization.PrivateFormat.Raw,
                                     serialization.NoEncryption()), sk.source, sk.development) if sk else None
    state = {"project": builder.project, "dist": str(builder.dist), "force": builder.force, "repair": builder.repair,
             "enc": builder.enc_key, "sign": sign, "probes": builder._probes, "parent": os.getpid()}
    ctx = mp.get_context("spawn")
    events = ctx.Queue()
    done = threading.Event()

    def relay() -> None:  # worker progress -> the parent's display, one line or live row per event
        while not done.is_set() or not events.empty():
            try:
                job, message = events.get(timeout=0.05)
            except queue.Empty:
                continue
            builder.progress(job, message)

    relay_thread = threading.Thread(target=relay, daemon=True)
    relay_thread.start()
    try:
        with ProcessPoolExecutor(max_workers=workers, mp_context=ctx, initializer=_init,
                                 initargs=(state, events)) as pool:
            futures = {i: pool.submit(_run, job) for i, job in todo}
            return {i: _result(f, job) for (i, job), f in zip(todo, futures.values(), strict=True)}
    finally:
        done.set()
        relay_thread.join()
