"""`ortbuild tune`: build what is missing or stale, then tune each job's session options (gating/search/tune.py),
write what was kept to targets.lock and rebuild the job with it; a table per job of every candidate tried."""

from __future__ import annotations

import json
import sys
from typing import TYPE_CHECKING

from ortbuild.artifact import keys
from ortbuild.cli.building import built, fitting, record
from ortbuild.cli.options.tune import TuneOptions
from ortbuild.errors import OrtbuildError, UsageError
from ortbuild.gating.reports.summary import table
from ortbuild.pipeline.progress import Progress
from ortbuild.project import config, lock_entry, lockfile, plan
from ortbuild.status import JobFinished, JobStatus, TuneStatus, final_exit

if TYPE_CHECKING:
    from ortbuild.gating.search.tune_search import Tuning

TUNED, SKIPPED, FAILED = TuneStatus.TUNED, TuneStatus.SKIPPED, TuneStatus.FAILED
HEADER = ["candidate", "against", "p50 ms", "against p50 ms", "speed-up [interval]", "verdict"]


def cmd_tune(o: TuneOptions) -> int:
    from ortbuild.gating import runner
    from ortbuild.gating.search import tune

    sel, seconds = o.selection, o.budgets.tuning.seconds
    if not seconds > 0:
        raise UsageError(f"--tune-seconds {seconds:g}: give a positive number of seconds for each job's search")
    project = config.load(sel.config)
    jobs = plan.jobs(project, sel.target, sel.model)
    fitting(jobs, "tune")
    refs: dict[str, plan.Job] = {}  # a reduced precision's fp32 artifact of the same model: built, not tuned
    for j in jobs:
        ref = tune.fp32_reference(project, j)
        if ref is not None:
            refs[j.name] = ref
    extra = list({r.name: r for r in refs.values() if all(r.name != j.name for j in jobs)}.values())
    secrets = keys.read_secrets(o.keys.key_file, o.keys.signing_key_file)
    out: list[dict[str, object]] = []
    codes: list[int] = []
    with built(o, project, [*jobs, *extra], secrets, command="tune") as b, \
            Progress(quiet=sel.json, live=False, verbose=sel.verbose, what="tuning") as progress:
        b.builder.progress = progress
        tester = runner.Tester(project, b.dist, secrets.secret, sel.config, progress, secrets.signing,
                              capture=not sel.verbose)
        lock = lockfile.read(project)
        for job in b.jobs[:len(jobs)]:
            done = b.done.get(job.name)
            why = tune.cannot_tune(job, done)
            if why:
                failed = done is not None and done.status == JobStatus.FAILED and done.error is not None
                out.append({"target": job.target.name, "model": job.model.name,
                            "status": FAILED if failed else SKIPPED, "reason": why})
                codes.append(done.error.exit_code if failed and done is not None and done.error is not None else 0)
                continue
            plain = lockfile.declared(job)
            ref = refs.get(job.name)
            ref_done = b.done.get(ref.name) if ref is not None else None
            if ref_done is None or ref_done.status not in (JobStatus.BUILT, JobStatus.UP_TO_DATE, JobStatus.PULLED):
                ref = None
            try:
                tuning = tune.Tuner(tester, o.budgets.tuning, progress).search(job, ref).answer
                lock, _, result = tune.record(b.builder, tester, lock, plain, tuning)
            except OrtbuildError as e:
                out.append({"target": job.target.name, "model": job.model.name, "status": FAILED,
                            "reason": e.message, "hint": e.hint})
                codes.append(e.exit_code)
                continue
            record(b.dist, result)
            if result.status == JobStatus.FAILED:
                codes.append(result.error.exit_code if result.error else 1)
            out.append(_job_doc(job, tuning, result.status, result.reason))
            if tuning.applies and not job.settings.tune:
                out[-1]["notes"] = [*tuning.notes, (
                    f"{lock_entry.LOCK_FILE} entries change only jobs that ask for tuning: add `tune = true` to "
                    f"[targets.{job.target.name}] to ship this (a later build without it builds the declared options)")]
            progress(job.name, JobFinished(result.status, f"tuned: kept {tuning.kept()}" if result.status !=
                                           JobStatus.FAILED else f"FAILED: {result.reason}"))
    code = final_exit(codes)
    if sel.json:
        print(json.dumps({"exit_code": code, "lock": str(lockfile.path_of(project)), "dist": str(b.dist),
                          "jobs": out}, indent=2, default=str))
        return code
    _print(out, lockfile.path_of(project).name)
    return code


def _job_doc(job: plan.Job, tuning: Tuning, status: JobStatus, reason: str) -> dict[str, object]:
    ok = status in (JobStatus.BUILT, JobStatus.UP_TO_DATE, JobStatus.PULLED)
    return {"target": job.target.name, "model": job.model.name, "status": TUNED if ok else FAILED,
            "reason": "" if ok else reason, "kept": tuning.kept(), "applies": {"session": tuning.applies}
            if tuning.applies else {}, "tune": tuning.record(), "tried": [t.as_json() for t in tuning.tried],
            "final": tuning.final.as_json() if tuning.final else None, "rejected": tuning.rejected,
            "notes": tuning.notes, "rebuilt": str(status)}


def _print(out: list[dict[str, object]], lock_name: str) -> None:
    for doc in out:
        name = f"{doc['target']}/{doc['model']}"
        if doc["status"] != TUNED:
            print(f"\n{name}: {doc['status']}: {doc['reason']}", file=sys.stderr if doc["status"] == FAILED
                  else sys.stdout)
            continue
        t = doc["tune"]
        assert isinstance(t, dict)
        final = doc["final"]
        head = f"\n{name}: kept {doc['kept']}"
        if isinstance(final, dict) and doc["applies"]:
            head += (f": p50 {t['default_p50_ms']:.3f} ms -> {t['tuned_p50_ms']:.3f} ms, {t['speedup']:.2f}x"
                     + (f" [{t['low']:.2f}, {t['high']:.2f}]" if "low" in t else "") + f" at {t['confidence']:.0%}")
        print(head)
        rows = []
        for x in doc["tried"]:  # type: ignore[attr-defined]
            c = x["comparison"]
            rows.append([x["candidate"], x["against"], f"{c['p50_ms']:.3f}" if c else "-",
                         f"{c['base_p50_ms']:.3f}" if c else "-", _interval(c) if c else "-",
                         x["verdict"] + (f" ({x['note']})" if x["note"] else "")])
        if rows:
            print("  " + table(rows, HEADER).replace("\n", "\n  "))
        for n in doc["notes"]:  # type: ignore[attr-defined]
            print(f"  note: {n}")
    counts = {s: sum(d["status"] == s for d in out) for s in (TUNED, SKIPPED, FAILED)}
    print("\n" + ", ".join(f"{n} {s}" for s, n in counts.items()) + f"  ->  {lock_name}")


def _interval(c: dict[str, object]) -> str:
    speedup, low, high = c["speedup"], c["low"], c["high"]
    assert isinstance(speedup, float)
    if not isinstance(low, float) or not isinstance(high, float):
        return f"{speedup:.2f}x [too few samples]"
    return f"{speedup:.2f}x [{1 / high:.2f}, {1 / low:.2f}]"
