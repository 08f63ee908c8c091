"""`ortbuild build` and `ortbuild plan`. What `test`, `profile` and `tune` share with build (building what is
missing or stale under dist/'s lock) is cli.building."""

from __future__ import annotations

import dataclasses
import json
import sys
from collections import Counter
from collections.abc import Sequence
from typing import TYPE_CHECKING, TypedDict, cast

from ortbuild import emulation, installed, logs, machine
from ortbuild.artifact import keys
from ortbuild.cli.building import built, fitting
from ortbuild.cli.common import dist_dir
from ortbuild.cli.options.build import BuildOptions, PlanOptions
from ortbuild.errors import ConfigError, MissingProvider, OrtbuildError, RuntimeMismatch
from ortbuild.gating.gates import registry
from ortbuild.gating.measure import emulated
from ortbuild.gating.records import BuildRecord
from ortbuild.gating.reports import summary
from ortbuild.gating.reports.summary import BUILD_HEADER, build_rows, table
from ortbuild.pipeline.build import Builder
from ortbuild.pipeline.buildkey import published
from ortbuild.pipeline.job import JobResult
from ortbuild.pipeline.progress import Progress
from ortbuild.project import config, lock_entry, lockfile, plan
from ortbuild.project.kinds import kind_rule
from ortbuild.project.precisions import Quantizer
from ortbuild.status import JobStatus, final_exit

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


def cmd_build(o: BuildOptions) -> int:
    sel = o.selection
    project = config.load(sel.config)
    jobs = plan.jobs(project, sel.target, sel.model)
    fitting(jobs, "build")
    secrets = keys.read_secrets(o.keys.key_file, o.keys.signing_key_file)
    with built(o, project, jobs, secrets, force=o.force, repair=o.repair) as b:
        dist, results = b.dist, list(b.done.values())

    rows = build_rows(project, [cast(BuildRecord, r.as_json()) for r in results])  # the records the build wrote
    code = final_exit(job_exit_code(r, strict=o.strict, named=bool(config.matches([r.target], list(sel.target))))
                      for r in results)
    if sel.json:
        print(json.dumps({"dist": str(dist), "exit_code": code, "jobs": [r.as_json() for r in results]},
                         indent=2))
        return code
    if sel.no_summary:
        _failures(results, o.debug)
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
    _failures(results, o.debug)
    return code


def _failures(results: Sequence[JobResult], debug: bool) -> None:
    for r in results:
        if r.status == JobStatus.FAILED and r.error is not None:
            if debug and r.debug:
                print(r.debug, file=sys.stderr)
            print(r.error.render(), file=sys.stderr)


def cmd_plan(opts: PlanOptions) -> int:
    """What would be built, with which runtime, and whether each job would rebuild and why."""
    project = config.load(opts.selection.config)
    jobs = plan.jobs(project, opts.selection.target, opts.selection.model)
    graphs = checked_graphs(project, jobs)  # golden inputs against each model's inputs, before anything else
    dist = dist_dir(opts.dist, project)
    problems = {t: installed.runtime_problem(project.targets[t]) for t in {j.target.name for j in jobs}}
    secrets = keys.read_secrets(opts.keys.key_file, opts.keys.signing_key_file)
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
            notes.append(f"{lock_entry.LOCK_FILE} lays over its settings: {j.locked.describe()}")
        for part in lockfile.missing(j, j.locked):
            notes.append({"search": 'precision_search = "auto" and no search in targets.lock: the build judges its '
                                    "accuracy and searches where it fails",
                          "tune": "tune = true and no tuning in targets.lock: the build tunes its session options",
                          "choice": f"candidates and no choice in targets.lock: the build makes {j.settings.precision} "
                                    f"and {len(j.settings.candidates)} candidate(s), judges each and ships the "
                                    "fastest that passes on this CPU"}[part])
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
    if opts.selection.json:
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
        print(f"  note: {lock_entry.LOCK_FILE}: the entry of {name} matches no job of {project.file.name}: delete it")
    platforms = {j.target.name: j.target for j in jobs if not j.target.platform_rule.native}
    lv = machine.x86_level()  # ONNX Runtime's x86 kernels, and so a native target's verdicts, depend on it
    print("\nplatforms (docs/targets.md#platforms):")
    print(f"  this machine: {emulation.host()}" + (f", {lv.name} ({machine.cpu_model()}: {lv.says})" if lv else ""))
    if platforms:
        timed = ", ".join(g.name for g in registry.GATES if g.timed)  # the gates that measure the device
        for t in platforms.values():
            if not emulated.emulated(t):
                print(f"  {t.name}: {t.platform}, this machine's: every gate runs here")
                continue
            why = emulated.cannot_run(t)
            how = ("under qemu's model of that CPU level" if t.platform_rule.x86_level
                   else "on its onnxruntime wheel under emulation")
            print(f"  {t.name}: {t.platform}: golden gate {how} here"
                  + (f" (SKIPPED: {why})" if why else f"; {timed} on {emulated.where_timed(t)}"))
    onnx_jobs = [j for j in jobs if not kind_rule(j.model.kind).token_gate]
    if onnx_jobs:
        print("\naccuracy (ortbuild test's golden-output rule, per output where set):")
        print("\n".join(plan.accuracy_lines(onnx_jobs)))
    llms = [j for j in jobs if kind_rule(j.model.kind).token_gate]
    if llms:
        from ortbuild.gating.gates import tokens as token_gate

        print("\ntokens (ortbuild test's rule for generative models, docs/generative.md):")
        for j in llms:
            assert j.settings.gates is not None
            rule = token_gate.rule_of(j.settings.precision, j.settings.gates.tokens)
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
        if kind_rule(m.kind).directory:  # a Hugging Face-format directory: its check step reads it (no graph yet)
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
