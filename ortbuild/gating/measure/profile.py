"""`ortbuild profile`: where an artifact spends its time, and on which execution provider.

Each artifact is opened through its generated Python loader with ONNX Runtime's profiler on (`load(...,
profile=...)`, i.e. `enable_profiling`) and run on its golden inputs: one warm-up run, then `runs` profiled ones.
Beside the artifact it leaves
  profile.trace.json  ORT's trace (Chrome trace format: chrome://tracing or https://ui.perfetto.dev); it names
                      nodes, op types and shapes, never weights
  profile.json        the summary: the top operators by total time (op type, node, provider, calls, share of
                      the run time), time per provider and per op type, and the nodes that ran on the CPU
                      provider where the target's first provider is another one (unplanned CPU fallback)
Both are removed when the artifact is rebuilt; the HTML report (dist/report.html) links them.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import cast

from ortbuild import files, paths, workspace
from ortbuild.artifact import golden, loaders, manifest, manifest_types
from ortbuild.errors import ArtifactError, OrtbuildError, StepError, from_loader
from ortbuild.gating.measure import emulated
from ortbuild.gating.timing_records import FallbackDoc, NodesTime, OperatorDoc, ProfileDoc, TraceEvent
from ortbuild.pipeline.job import JobResult
from ortbuild.project.kinds import kind_rule
from ortbuild.project.plan import Job
from ortbuild.status import JobStatus, ProfileStatus

TRACE, SUMMARY = "profile.trace.json", "profile.json"
CPU = "CPUExecutionProvider"
# the statuses under the names other modules have used (ortbuild.status.ProfileStatus is the vocabulary)
PROFILED, SKIPPED, FAILED = ProfileStatus.PROFILED, ProfileStatus.SKIPPED, ProfileStatus.FAILED


@dataclass
class ProfileResult:
    target: str
    model: str
    status: ProfileStatus
    reason: str = ""
    summary: ProfileDoc = field(default_factory=ProfileDoc)
    exit_code: int = 0

    def __bool__(self) -> bool:
        """Whether profiling did not fail (a SKIPPED target is no failure)."""
        return bool(self.status)

    def as_json(self) -> ProfileDoc:
        return {"target": self.target, "model": self.model, "status": self.status, "reason": self.reason,
                **self.summary}


def summarize(events: list[TraceEvent], planned: list[str], warmup: int = 1) -> ProfileDoc:
    """The operators of a trace by total time, leaving out the first `warmup` runs.

    planned: the target's providers, in order. Where the first is not the CPU provider, every node that ran
    on the CPU provider is listed as a fallback (ORT assigns what the planned provider cannot take to the
    next one, silently).
    """
    runs = sorted((e for e in events if e.get("cat") == "Session" and e.get("name") == "model_run"),
                  key=lambda e: e["ts"])
    counted = runs[warmup:] if len(runs) > warmup else runs
    if not counted:
        raise ValueError("the trace holds no model_run event")
    start = counted[0]["ts"]
    run_us = sum(int(e["dur"]) for e in counted)
    nodes: dict[str, OperatorDoc] = {}
    for e in events:
        name = str(e.get("name", ""))
        if e.get("cat") != "Node" or not name.endswith("_kernel_time") or e["ts"] < start:
            continue
        args = e.get("args") or {}
        node = name.removesuffix("_kernel_time")
        row = nodes.setdefault(node, {"op_type": args.get("op_name", "?"), "node": node,
                                      "provider": args.get("provider", "?"), "calls": 0, "total_us": 0})
        row["calls"] += 1
        row["total_us"] += int(e["dur"])
    ops = sorted(nodes.values(), key=lambda r: (-r["total_us"], r["node"]))
    for r in ops:
        r["share"] = round(r["total_us"] / run_us, 4) if run_us else 0.0
    providers: dict[str, NodesTime] = {}
    op_types: dict[str, NodesTime] = {}
    for r in ops:
        p = providers.setdefault(r["provider"], {"nodes": 0, "total_us": 0})
        p["nodes"] += 1
        p["total_us"] += r["total_us"]
        o = op_types.setdefault(r["op_type"], {"nodes": 0, "total_us": 0})
        o["nodes"] += 1
        o["total_us"] += r["total_us"]
    fallback: list[FallbackDoc] = [] if not planned or planned[0] == CPU else [
        {"node": r["node"], "op_type": r["op_type"], "share": r["share"]} for r in ops if r["provider"] == CPU]
    return {"runs": len(counted), "warmup_runs": len(runs) - len(counted),
            "run_ms": round(run_us / len(counted) / 1e3, 4),
            "kernel_share": round(sum(r["total_us"] for r in ops) / run_us, 4) if run_us else 0.0,
            "planned_providers": planned, "providers": providers,
            "op_types": dict(sorted(op_types.items(), key=lambda kv: -kv[1]["total_us"])),
            "operators": ops, "cpu_fallback": fallback}


def profile_artifact(job: Job, dist: Path, folder: Path, secret: bytes | None, runs: int) -> ProfileDoc:
    """Profile the published artifact in `folder` through its Python loader; write TRACE and SUMMARY there."""
    m, _ = manifest.read(folder)
    module = loaders.import_python_loader(loaders.python_path(folder, job.model.name))
    feeds = [feed for _, feed, _ in golden.load(job.model, m.io)]
    with workspace.private_dir(64 << 20) as work:
        try:
            model = module.load(key=secret, folder=folder, profile=work / "trace")
        except module.LoaderError as e:
            raise from_loader(e, job.name) from None
        model.run(feeds[0])  # warm-up: left out of the summary (first-run allocations)
        for i in range(runs):
            model.run(feeds[i % len(feeds)])
        trace = Path(model.end_profiling())
        blob = trace.read_bytes()
    try:
        events = json.loads(blob)
    except ValueError as e:
        raise ArtifactError(f"{folder}: ONNX Runtime wrote an unreadable profile ({e})") from None
    summary: ProfileDoc = {"build_key": m.build_key, "artifact_sha256": m.artifact.sha256, "trace": TRACE,
               "created": manifest.iso_utc(), "data_sets": len(feeds),
               **summarize(events, [p["name"] for p in m.providers])}
    files.atomic_write(folder / TRACE, blob, root=dist)
    files.atomic_write(folder / SUMMARY, (json.dumps(summary, indent=2) + "\n").encode(), root=dist)
    return summary


def write_skipped(dist: Path, job: Job, reason: str) -> None:
    """A SKIPPED summary beside a portable artifact (its providers cannot run here), replacing an old one."""
    folder = paths.inside(dist, job.target.name, job.model.name)
    if (folder / manifest_types.MANIFEST).exists():
        m, _ = manifest.read(folder)
        (folder / TRACE).unlink(missing_ok=True)
        doc: ProfileDoc = {"build_key": m.build_key, "status": ProfileStatus.SKIPPED, "reason": reason,
                           "created": manifest.iso_utc()}
        files.atomic_write(folder / SUMMARY, (json.dumps(doc, indent=2) + "\n").encode(), root=dist)


def collect(dist: Path) -> list[ProfileDoc]:
    """Every dist/<target>/<model>/profile.json whose artifact is still the one profiled."""
    return [{"target": m.target, "model": m.model, **cast(ProfileDoc, doc)}  # as profile_artifact wrote it
            for doc, m in manifest.reports(dist, SUMMARY)
            if doc.get("build_key") == m.build_key and doc.get("operators") is not None]


def table(summary: ProfileDoc, top: int) -> list[list[str]]:
    """The top operators as table rows: op type, node, provider, calls, total and mean time, share."""
    return [[r["op_type"], r["node"], r["provider"].removesuffix("ExecutionProvider"), str(r["calls"]),
             f"{r['total_us'] / 1e3:.3f}", f"{r['total_us'] / r['calls']:.1f}", f"{r['share']:.1%}"]
            for r in summary["operators"][:top]]


HEADER = ["op type", "node", "provider", "calls", "total ms", "mean us", "share"]


def profile_jobs(jobs: list[Job], dist: Path, secret: bytes | None, runs: int, built: dict[str, JobResult],
                 progress: Callable[[str, str], None]) -> list[ProfileResult]:
    out = []
    for job in jobs:
        b = built[job.name]
        res = ProfileResult(job.target.name, job.model.name, ProfileStatus.PROFILED)
        if b.status == JobStatus.FAILED:
            res.status, res.reason = ProfileStatus.FAILED, f"build failed: {b.reason}"
            res.exit_code = b.error.exit_code if b.error else StepError.exit_code
        elif b.status in (JobStatus.SKIPPED, JobStatus.PORTABLE):
            res.status, res.reason = ProfileStatus.SKIPPED, b.reason
            if b.status == JobStatus.PORTABLE:
                write_skipped(dist, job, b.reason)
        elif (why := kind_rule(job.model.kind).not_covered) is not None:  # onnxruntime-genai's session: no ORT
            res.status, res.reason = ProfileStatus.SKIPPED, why                 # profile through the loader
        elif emulated.emulated(job.target):  # a profile of x86 kernels, or of qemu, says nothing about the device
            res.status, res.reason = ProfileStatus.SKIPPED, (
                f"a {job.target.platform} artifact is profiled on its platform: `ortbuild matrix` runs this target "
                f"on {', '.join(job.target.runner)}")
            write_skipped(dist, job, res.reason)
        else:
            progress(job.name, f"profile: 1 warm-up + {runs} runs through the generated Python loader")
            try:
                res.summary = profile_artifact(job, dist, paths.inside(dist, job.target.name, job.model.name),
                                               secret, runs)
            except OrtbuildError as e:
                res.status, res.reason, res.exit_code = ProfileStatus.FAILED, e.message, e.exit_code
            except Exception as e:  # the loader's own errors (LoaderError) and ORT's
                res.status, res.reason = ProfileStatus.FAILED, f"{type(e).__name__}: {e}"
                res.exit_code = ArtifactError.exit_code
        progress(job.name, res.status + (f": {res.reason}" if res.reason else ""))
        out.append(res)
    return out
