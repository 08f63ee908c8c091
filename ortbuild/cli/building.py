"""What `build`, `test`, `profile` and `tune` share: the runtime check, the worker count, and building what is
missing or stale under dist/'s lock, with the searches and the session tuning their targets ask for."""

from __future__ import annotations

import contextlib
import json
import sys
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

from ortbuild import files, installed, workspace
from ortbuild.artifact import keys
from ortbuild.cli.common import dist_dir
from ortbuild.cli.options import Budgets, Builds
from ortbuild.errors import GateFailed, RuntimeMismatch, first_line
from ortbuild.gating.reports.builds import record_path
from ortbuild.pipeline import cache as cache_
from ortbuild.pipeline.build import Builder
from ortbuild.pipeline.job import JobResult
from ortbuild.pipeline.parallel import default_workers
from ortbuild.pipeline.progress import Progress
from ortbuild.project import config, lockfile, plan
from ortbuild.publish import epochs
from ortbuild.status import JobFinished, JobStatus


def fitting(jobs: Sequence[plan.Job], command: str | None = None) -> list[plan.Job]:
    """The jobs whose target's runtime is this environment's (each target checked once). With `command`, a run
    in which none fits would do nothing: it fails, naming the nox session or the install that fixes it."""
    problems: dict[str, str | None] = {}
    for j in jobs:
        if j.target.name not in problems:
            problems[j.target.name] = installed.runtime_problem(j.target)
    fit = [j for j in jobs if problems[j.target.name] is None]
    if command is None or fit or not jobs:
        return fit
    targets = {j.target.name: j.target for j in jobs}
    flavor = installed.installed_flavor()
    have = f"{flavor.distribution} {flavor.version}" if flavor else "no ONNX Runtime"
    wants = sorted({t.runtime_text for t in targets.values()})
    one = next(iter(targets))
    raise RuntimeMismatch(
        f"nothing to {command} here: this environment has {have}, and the selected targets need "
        f"{', '.join(wants)}",
        f"run `python3 -m nox -s {command}` (one virtualenv per target, each with its runtime), or "
        f"`python3 -m nox -s \"{targets[one].session(command)}\"` for one target; or `pip install "
        f"{targets[one].runtime_text}` "
        "into this environment (one flavor per environment)")


def worker_count(jobs: int | None, fit: Sequence[plan.Job]) -> int:
    """-j's worker count, else the default for these jobs (saying on stderr why it is lower than the cores)."""
    if jobs is not None:
        return max(1, int(jobs))
    n, why = default_workers(fit)
    if why:
        print(f"ortbuild: {why}", file=sys.stderr)
    return n


def _clean_leftovers(dist: Path) -> None:
    """Start-up recovery, holding dist's lock: what killed builds left (partial files, plaintext temp dirs)."""
    say_removed(workspace.clean(dist))


def say_removed(removed: Sequence[Path]) -> None:
    """One line on stderr naming what the recovery removed (nothing when it removed nothing)."""
    if removed:
        shown = ", ".join(str(p) for p in removed[:3]) + (f" and {len(removed) - 3} more" if len(removed) > 3 else "")
        print(f"ortbuild: removed {len(removed)} leftover(s) of interrupted builds: {shown}", file=sys.stderr)


@dataclass(frozen=True)
class Built:
    """What `built()` gives the command running under dist/'s lock."""

    dist: Path
    builder: Builder
    done: dict[str, JobResult]     # each job's build result, by job name, in the jobs' order
    jobs: list[plan.Job]           # the jobs as built: their targets.lock entries laid over their settings


@contextlib.contextmanager
def built(o: Builds, project: config.Project, jobs: Sequence[plan.Job], secrets: keys.Secrets, *,
          force: bool = False, repair: bool = False, command: str = "build") -> Iterator[Built]:
    """Hold dist/'s lock (recovering what killed runs left), build the jobs that are missing or stale (all of
    them with `force`; TAMPERED ones too with `repair`) with their targets.lock entries, search where a target
    asks (precision_search = "auto": gating/search/autobuild.py), and give what was built to what runs on it (`test`,
    `profile`) under the lock."""
    fit = fitting(jobs)
    dist = dist_dir(o.dist, project)
    verbose, writer = o.selection.verbose, o.writer
    cache = cache_.configured(project.file, project.cache, writer.cache, writer.no_cache)
    builder = Builder(project, dist, force=force, repair=repair, secrets=secrets,
                      capture=not verbose, command=command, cache=cache)
    builder.check_keys(fit)  # before dist/ is touched
    development = any(k is not None and k.development for k in (secrets.encryption, secrets.signing))
    if said := cache_.development_warning(cache, development):  # once per command, before any build
        print(f"ortbuild: WARNING: {said}", file=sys.stderr)
    with workspace.Lock(dist, timeout=writer.lock_timeout):
        jobs, notes = builder.lock_jobs(jobs, lockfile.read(project), locked=writer.locked)
        for n in notes:
            print(f"ortbuild: {n}", file=sys.stderr)
        _clean_leftovers(dist)
        # a lowered [project] epoch: a config error unless --allow-epoch-decrease (the artifacts in dist/ are the
        # record of the epoch they were built at)
        lowered = epochs.decrease(project, dist, allowed=o.allow_epoch_decrease)
        if lowered:
            print(f"ortbuild: WARNING: {lowered}", file=sys.stderr)
        with Progress(quiet=o.selection.json, verbose=verbose, what="building") as progress:
            builder.progress = progress
            done = {f"{r.target}/{r.model}": r for r in builder.run(jobs, workers=worker_count(writer.jobs, fit))}
            searched = _to_the_gates(o.budgets, o.selection.config, builder, jobs, done, progress,
                                     refine=not writer.locked)
        for r in done.values():
            if r.status != JobStatus.SKIPPED:  # another runtime's environment keeps its own record
                record(dist, r)
        yield Built(dist, builder, done, [searched.get(j.name, j) for j in jobs])


def _to_the_gates(budgets: Budgets, config_file: str, builder: Builder, jobs: Sequence[plan.Job],
                  done: dict[str, JobResult], progress: Progress, *, refine: bool = True) -> dict[str, plan.Job]:
    """The precision search and the session tuning of the jobs that ask for them (gating/search/autobuild.py,
    gating/search/tune.py; numpy, onnx and ONNX Runtime load only when one does): the jobs rebuilt, by name. `ortbuild
    tune` tunes its jobs itself. `refine` (not with --locked): a search its budget stopped is searched again where
    this build's budget is larger."""
    from ortbuild.gating.search import autobuild, tune

    searching = [j for j in jobs if j.name in done and (autobuild.wants_search(j) or
                                                         (refine and autobuild.refinable(j, budgets.precision)))]
    tuning = [j for j in jobs if tune.wants_tune(j) and j.name in done] if builder.command != "tune" else []
    if not searching and not tuning:
        return {}
    from ortbuild.gating.runner import Tester

    tester = Tester(builder.project, builder.dist, builder.secrets.secret, config_file, progress,
                    builder.secrets.signing, capture=builder.capture)
    auto = autobuild.AutoSearch(builder, tester, budgets.precision,
                                progress=progress)
    auto.run(searching, done)
    rebuilt = dict(auto.locked)
    lock = lockfile.read(builder.project)
    for j in tuning:
        job = rebuilt.get(j.name, j)
        if not done[j.name].status.usable or tune.cannot_tune(job, done[j.name]):
            continue
        try:
            lock, rebuilt[j.name], done[j.name] = tune.tune_for_build(
                builder, tester, lock, job, progress, budgets.tuning)
        except GateFailed as e:  # its accuracy gate fails as declared: nothing to tune (`test` reports it)
            done[j.name].notes.append(f"tune = true: not tuned: {first_line(e)}")
        said = [n for n in done[j.name].notes if n.startswith(("tune:", "tune = true:"))]
        if said:
            progress(j.name, JobFinished(done[j.name].status, said[-1]))
    if builder.command != "build":  # `build` prints every failure itself; `test`, `profile`: the search's table here
        for j in searching:
            error = done[j.name].error
            if done[j.name].status == JobStatus.FAILED and isinstance(error, GateFailed):
                print(error.render(), file=sys.stderr)
    return rebuilt


def record(dist: Path, r: JobResult) -> None:
    """Keep the job's build result beside its log (`ortbuild summary build` and the report read it)."""
    path = record_path(dist, r.target, r.model)
    files.atomic_write(path, (json.dumps(r.as_json(), indent=1, default=str) + "\n").encode(), root=dist)
