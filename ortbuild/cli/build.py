"""`ortbuild build` and `ortbuild plan`, and what `test` and `profile` share with build: the runtime check, the
worker count, and building what is missing or stale under dist/'s lock."""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import json
import sys
from collections import Counter
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, TypedDict, cast

from ortbuild import emulation, files, logs, machine, runtime, workspace
from ortbuild.artifact import keys
from ortbuild.cli.common import dist_dir, table
from ortbuild.errors import ConfigError, GateFailed, MissingProvider, OrtbuildError, RuntimeMismatch, first_line
from ortbuild.gating.gates import catalog
from ortbuild.gating.measure import emulated
from ortbuild.gating.records import BuildRecord
from ortbuild.gating.reports import summary
from ortbuild.gating.reports.builds import record_path
from ortbuild.gating.reports.summary import BUILD_HEADER, build_rows
from ortbuild.pipeline import cache as cache_
from ortbuild.pipeline.build import Builder
from ortbuild.pipeline.buildkey import published
from ortbuild.pipeline.job import JobResult
from ortbuild.pipeline.parallel import default_workers
from ortbuild.pipeline.progress import Progress
from ortbuild.project import config, lockfile, plan
from ortbuild.project.precisions import Quantizer
from ortbuild.publish import epochs
from ortbuild.status import JobFinished, JobStatus, final_exit

if TYPE_CHECKING:
    import onnx


class PlanRow(TypedDict):
    """One job of `ortbuild plan --json`."""

    target: str
    model: str
    runtime: str
    providers: list[str]
    precision: str
    optimization: str
    format: str
    buildable_here: bool
    why_not: str | None          # why it cannot be built here (another runtime)
    rebuild: bool | None         # None: unknown (another runtime, or no keys)
    why: str | None
    notes: list[str]
    accuracy: str
    platform: str


def fitting(jobs: Sequence[plan.Job], command: str | None = None) -> list[plan.Job]:
    """The jobs whose target's runtime is this environment's (each target checked once). With `command`, a run
    in which none fits would do nothing: it fails, naming the nox session or the install that fixes it."""
    problems: dict[str, str | None] = {}
    for j in jobs:
        if j.target.name not in problems:
            problems[j.target.name] = runtime.runtime_problem(j.target)
    fit = [j for j in jobs if problems[j.target.name] is None]
    if command is None or fit or not jobs:
        return fit
    targets = {j.target.name: j.target for j in jobs}
    flavor = runtime.installed_flavor()
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


def worker_count(args: argparse.Namespace, fit: Sequence[plan.Job]) -> int:
    """-j's worker count, else the default for these jobs (saying on stderr why it is lower than the cores)."""
    if args.jobs is not None:
        return max(1, int(args.jobs))
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
def built(args: argparse.Namespace, project: config.Project, jobs: Sequence[plan.Job], secrets: keys.Secrets, *,
          force: bool = False, command: str = "build") -> Iterator[Built]:
    """Hold dist/'s lock (recovering what killed runs left), build the jobs that are missing or stale (all of
    them with `force`) with their targets.lock entries, search where a target asks (precision_search = "auto":
    gating/autobuild.py), and give what was built to what runs on it (`test`, `profile`) under the lock."""
    fit = fitting(jobs)
    dist = dist_dir(args, project)
    verbose = getattr(args, "verbose", False)
    cache = cache_.configured(project.file, project.cache, getattr(args, "cache", None),
                              getattr(args, "no_cache", False))
    builder = Builder(project, dist, force=force, repair=getattr(args, "repair", False), secrets=secrets,
                      capture=not verbose, command=command, cache=cache)
    builder.check_keys(fit)  # before dist/ is touched
    development = any(k is not None and k.development for k in (secrets.encryption, secrets.signing))
    if said := cache_.development_warning(cache, development):  # once per command, before any build
        print(f"ortbuild: WARNING: {said}", file=sys.stderr)
    with workspace.Lock(dist, timeout=args.lock_timeout):
        jobs, notes = builder.lock_jobs(jobs, lockfile.read(project), locked=getattr(args, "locked", False))
        for n in notes:
            print(f"ortbuild: {n}", file=sys.stderr)
        _clean_leftovers(dist)
        # a lowered [project] epoch: a config error unless --allow-epoch-decrease (the artifacts in dist/ are the
        # record of the epoch they were built at)
        lowered = epochs.decrease(project, dist, allowed=getattr(args, "allow_epoch_decrease", False))
        if lowered:
            print(f"ortbuild: WARNING: {lowered}", file=sys.stderr)
        with Progress(quiet=args.json, verbose=verbose, what="building") as progress:
            builder.progress = progress
            done = {f"{r.target}/{r.model}": r for r in builder.run(jobs, workers=worker_count(args, fit))}
            searched = _to_the_gates(args, builder, jobs, done, progress)
        for r in done.values():
            if r.status != JobStatus.SKIPPED:  # another runtime's environment keeps its own record
                record(dist, r)
        yield Built(dist, builder, done, [searched.get(j.name, j) for j in jobs])


def _to_the_gates(args: argparse.Namespace, builder: Builder, jobs: Sequence[plan.Job], done: dict[str, JobResult],
                  progress: Progress) -> dict[str, plan.Job]:
    """The precision search and the session tuning of the jobs that ask for them (gating/autobuild.py,
    gating/tune.py; numpy, onnx and ONNX Runtime load only when one does): the jobs rebuilt, by name. `ortbuild
    tune` tunes its jobs itself."""
    from ortbuild.gating.search import autobuild, tune

    searching = [j for j in jobs if autobuild.wants_search(j) and j.name in done]
    tuning = [j for j in jobs if tune.wants_tune(j) and j.name in done] if builder.command != "tune" else []
    if not searching and not tuning:
        return {}
    from ortbuild.gating.runner import Tester

    tester = Tester(builder.project, builder.dist, builder.secrets.secret, args.config, progress,
                    builder.secrets.signing, capture=builder.capture)
    auto = autobuild.AutoSearch(builder, tester, max_rebuilds=getattr(args, "explain_rebuilds", 16),
                                max_seconds=getattr(args, "explain_seconds", 300.0), progress=progress)
    auto.run(searching, done)
    rebuilt = dict(auto.locked)
    lock = lockfile.read(builder.project)
    for j in tuning:
        job = rebuilt.get(j.name, j)
        if not done[j.name].status.usable or tune.cannot_tune(job, done[j.name]):
            continue
        try:
            lock, rebuilt[j.name], done[j.name] = tune.tune_for_build(
                builder, tester, lock, job, progress, seconds=getattr(args, "tune_seconds", 120.0))
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


def job_exit_code(r: JobResult, *, strict: bool, named: bool) -> int:
    """One build job's own exit code: a failure's; a target that cannot build here fails when it was named
    (-t) or with --strict; a portable-only build fails with --strict."""
    if r.status == JobStatus.FAILED and r.error is not None:
        return r.error.exit_code
    if r.status == JobStatus.SKIPPED and (strict or named):
        return RuntimeMismatch.exit_code
    if r.status == JobStatus.PORTABLE and strict:
        return MissingProvider.exit_code
    return 0


def cmd_build(args: argparse.Namespace) -> int:
    project = config.load(args.config)
    jobs = plan.jobs(project, args.target, args.model)
    fitting(jobs, "build")
    secrets = keys.read_secrets(args.key_file, args.signing_key_file)
    with built(args, project, jobs, secrets, force=args.force) as b:
        dist, results = b.dist, list(b.done.values())

    rows = build_rows(project, [cast(BuildRecord, r.as_json()) for r in results])  # the records the build wrote
    code = final_exit(job_exit_code(r, strict=args.strict, named=bool(config.matches([r.target], args.target or [])))
                      for r in results)
    if args.json:
        print(json.dumps({"dist": str(dist), "exit_code": code, "jobs": [r.as_json() for r in results]},
                         indent=2))
        return code
    if args.no_summary:
        _failures(results, args.debug)
        return code
    print()
    print(table(rows, BUILD_HEADER))
    said: dict[str, list[tuple[str, str]]] = {}  # each reason or note once, with the jobs it concerns
    for r in results:
        lines = [f"{r.status.upper()}: {r.reason}"] if r.reason and r.status in (
            JobStatus.SKIPPED, JobStatus.PORTABLE, JobStatus.FAILED) else []
        for text in lines + [f"note: {n}" for n in r.notes if n not in r.reason]:
            said.setdefault(text, []).append((r.target, r.model))
    for line in summary.grouped(said, Counter(r.target for r in results)):
        print(line)
    order = (JobStatus.BUILT, JobStatus.PULLED, JobStatus.UP_TO_DATE, JobStatus.PORTABLE, JobStatus.SKIPPED,
             JobStatus.FAILED)
    counts = {s: n for s in order if (n := sum(r.status == s for r in results)) or s is not JobStatus.PULLED}
    print("\n" + ", ".join(f"{n} {s}" for s, n in counts.items()) + f"  ->  {dist}")
    for line in logs.footer([(f"{r.target}/{r.model}", r.log) for r in results if r.log is not None]):
        print(line, file=sys.stderr)
    _failures(results, args.debug)
    return code


def _failures(results: Sequence[JobResult], debug: bool) -> None:
    for r in results:
        if r.status == JobStatus.FAILED and r.error is not None:
            if debug and r.debug:
                print(r.debug, file=sys.stderr)
            print(r.error.render(), file=sys.stderr)


def cmd_plan(args: argparse.Namespace) -> int:
    """What would be built, with which runtime, and whether each job would rebuild and why."""
    project = config.load(args.config)
    jobs = plan.jobs(project, args.target, args.model)
    graphs = checked_graphs(project, jobs)  # golden inputs against each model's inputs, before anything else
    dist = dist_dir(args, project)
    problems = {t: runtime.runtime_problem(project.targets[t]) for t in {j.target.name for j in jobs}}
    secrets = keys.read_secrets(args.key_file, args.signing_key_file)
    builder = Builder(project, dist, progress=Progress(quiet=True), secrets=secrets)
    lock = lockfile.read(project)
    jobs, lock_notes = builder.lock_jobs(jobs, lock)  # as a build would build them
    orphans = [name for name, e in lock.entries.items()
               if e.target not in project.targets or e.model not in project.targets[e.target].models]
    out: list[PlanRow] = []
    reduced: dict[str, str | None] = {}  # model -> why its source is already quantized / fp16
    for j in jobs:
        why: str | None
        notes = [n for n in lock_notes if f" {j.name} " in n]
        if j.locked is not None:
            notes.append(f"{lockfile.LOCK_FILE} lays over its settings: {j.locked.describe()}")
        for part in lockfile.missing(j, j.locked):
            notes.append('precision_search = "auto" and no search in targets.lock: the build judges its accuracy and '
                         "searches where it fails" if part == "search" else
                         "tune = true and no tuning in targets.lock: the build tunes its session options")
        if j.settings.rule.quantizer is not Quantizer.NONE and j.model.name in graphs:
            if j.model.name not in reduced:
                reduced[j.model.name] = _already_reduced(graphs[j.model.name])
            if reduced[j.model.name]:
                notes.append(f"the source is already reduced ({reduced[j.model.name]}): {j.settings.precision} "
                             "converts it again and loses accuracy twice; precision = \"fp32\" ships it as it is")
        if problems[j.target.name]:
            rebuild, why = None, problems[j.target.name]
        elif secrets.signing is None or (j.settings.encrypt and secrets.encryption is None):
            rebuild, why = None, "unknown: no keys configured (the key ids are part of the build key)"
        else:
            prepared = builder.prepare(j)
            try:
                why, _ = published(prepared.out_dir, prepared.key, secrets.signing, prepared.key_parts,
                                   prepared.secrets.encryption)
                rebuild = why is not None
            except OrtbuildError as e:  # TAMPERED or a wrong key: a build refuses it, `--repair` rebuilds it
                why, rebuild = f"{e.label}: {e.message}", True
        out.append({"target": j.target.name, "model": j.model.name, "runtime": j.target.runtime_text,
                    "providers": [p.name for p in j.settings.providers], "precision": j.settings.precision,
                    "optimization": j.settings.optimization, "format": j.settings.format,
                    "buildable_here": problems[j.target.name] is None, "why_not": problems[j.target.name],
                    "rebuild": rebuild, "why": why, "notes": notes, "accuracy": plan.accuracy_text(j),
                    "platform": j.target.platform})
    if args.json:
        print(json.dumps(out, indent=2))
        return 0

    def state(o: PlanRow) -> str:
        if not o["buildable_here"]:
            return "other runtime"
        return "?" if o["rebuild"] is None else "rebuild" if o["rebuild"] else "up to date"
    print(table([[o["target"], o["model"], o["runtime"], ",".join(p.removesuffix("ExecutionProvider")
                                                                   for p in o["providers"]),
                  o["precision"], o["optimization"], state(o), (o["why"] or "") if o["rebuild"] is not False else ""]
                 for o in out],
                ["target", "model", "runtime", "providers", "precision", "level", "build", "why"]))
    for o in out:
        for n in o["notes"]:
            print(f"  [{o['target']}/{o['model']}] note: {n}")
    for name in orphans:
        print(f"  note: {lockfile.LOCK_FILE}: the entry of {name} matches no job of {project.file.name}: delete it")
    platforms = {j.target.name: j.target for j in jobs if not j.target.platform_rule.native}
    lv = machine.x86_level()  # ONNX Runtime's x86 kernels, and so a native target's verdicts, depend on it
    print("\nplatforms (docs/targets.md#platforms):")
    print(f"  this machine: {emulation.host()}" + (f", {lv.name} ({machine.cpu_model()}: {lv.says})" if lv else ""))
    if platforms:
        timed = ", ".join(g.name for g in catalog.GATES if g.timed)  # the gates that measure the device
        for t in platforms.values():
            if not emulated.emulated(t):
                print(f"  {t.name}: {t.platform}, this machine's: every gate runs here")
                continue
            why = emulated.cannot_run(t)
            how = ("under qemu's model of that CPU level" if t.platform_rule.x86_level
                   else "on its onnxruntime wheel under emulation")
            print(f"  {t.name}: {t.platform}: golden gate {how} here"
                  + (f" (SKIPPED: {why})" if why else f"; {timed} on {emulated.where_timed(t)}"))
    onnx_jobs = [j for j in jobs if not j.model.generative]
    if onnx_jobs:
        print("\naccuracy (ortbuild test's golden-output rule, per output where set):")
        print("\n".join(plan.accuracy_lines(onnx_jobs)))
    llms = [j for j in jobs if j.model.generative]
    if llms:
        from ortbuild.gating.gates import genai as genai_gates

        print("\ntokens (ortbuild test's rule for generative models, docs/generative.md):")
        for j in llms:
            assert j.settings.gates is not None
            rule = genai_gates.rule_of(j.settings.precision, j.settings.gates.tokens)
            print(f"  {j.name}: " + ", ".join(f"{k} {v}" for k, v in dataclasses.asdict(rule).items())
                  + f" ({j.settings.gates.tokens.max_tokens} tokens per prompt)")
    return 0


def checked_graphs(project: config.Project, jobs: Sequence[plan.Job]) -> dict[str, onnx.ModelProto]:
    """Each selected model's graph (read without the weights of external data), its golden inputs checked against
    the graph's inputs: names, element types, ranks and fixed dimensions, as the build's check step does
    (data.check_feed), from the .npz headers alone. Every problem is a ConfigError naming targets.toml, the
    `[models.X] inputs` key, the data file and the input; several models' problems come together in one. Each
    model's labelled evaluation set is checked too (its headers and labels: one label per sample), so a wrong
    label file fails here rather than at the eval gate, after the build. onnx (and the check step, which imports
    it) load here, when plan runs."""
    from ortbuild import modelfiles, paths
    from ortbuild.pipeline.steps import check
    from ortbuild.project import data

    graphs: dict[str, onnx.ModelProto] = {}
    errors: list[tuple[str, str, str | None]] = []  # (targets.toml's key, the problem, what to do)
    for model in dict.fromkeys(j.model.name for j in jobs):
        m, key = project.models[model], f"models.{model}.path"
        if m.generative:  # a Hugging Face-format directory: its build's check step reads it (no ONNX graph yet)
            continue
        try:
            problem = paths.input_problem(m.path, limit=paths.MAX_MODEL_BYTES)
            if problem:
                raise ConfigError(str(m.path), "", f"the model {problem}", "name an ONNX model file")
            graphs[model] = modelfiles.load_graph(m.path)
            signature = check.signature(graphs[model])
            names, key = [i["name"] for i in signature["inputs"]], f"models.{model}.inputs"
            for where, found in data.golden_shapes(m.inputs, names):
                data.check_shapes(found, signature, where)
        except ConfigError as e:  # named by the file that declares it: targets.toml's key, then the file read
            errors.append((key, e.message, e.hint))
        if eval_problem := _eval_problem(project, model):
            errors.append(eval_problem)
    file = str(project.file)
    if len(errors) == 1:
        raise ConfigError(file, *errors[0])
    if errors:
        raise ConfigError(file, "models", f"the inputs of {len(errors)} models do not fit:\n" + "\n".join(
            f"  [{key}] {message}" + (f"\n    hint: {hint}" if hint else "") for key, message, hint in errors),
            "fix each file or key named above, then run `ortbuild plan` again")
    return graphs


def _eval_problem(project: config.Project, model: str) -> tuple[str, str, str | None] | None:
    """What is wrong with a model's labelled evaluation set (its files' headers and labels, as the eval gate reads
    them: a label count that is not the sample count, files of different inputs, no samples), as
    (targets.toml's key, the problem, what to do); None where it has none or it is sound."""
    from ortbuild.gating.measure.labelled import EvalData

    ev = project.models[model].eval
    if ev is None:
        return None
    try:
        EvalData(ev, str(project.file), f"models.{model}.eval")
    except ConfigError as e:
        return e.where, e.detail, e.hint
    return None


def _already_reduced(graph: onnx.ModelProto) -> str | None:
    """Why the model whose graph this is is already quantized or fp16 (the graph only: the weights are not read).
    The accounting step (which imports onnx) loads here: only plan's reduced-precision jobs need it."""
    from ortbuild.pipeline.steps import accounting

    return accounting.already_reduced(graph)
