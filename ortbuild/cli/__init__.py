"""The `ortbuild` command line: build, test, profile, plan, release, verify, pull, matrix, inspect, keys, schema."""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import json
import os
import sys
from collections import Counter
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

from ortbuild import __version__, paths, runtime, workspace
from ortbuild.artifact import container, keys, manifest
from ortbuild.errors import (
    ArtifactError,
    GateFailed,
    KeyMissing,
    MissingProvider,
    OrtbuildError,
    RuntimeMismatch,
    Tampered,
    UsageError,
    WrongKey,
    first_line,
)
from ortbuild.project import config, options, plan

PACKAGE_DIR = Path(__file__).resolve().parent
SCHEMA_FILE = PACKAGE_DIR / "targets.schema.json"
REFERENCE_FILE = PACKAGE_DIR.parent / "docs" / "targets-reference.md"
TARGETS_DOC = PACKAGE_DIR.parent / "docs" / "targets.md"


def _size(n: int | None) -> str:
    if n is None:
        return "-"
    for unit in ("B", "KB", "MB", "GB"):
        if n < 1024 or unit == "GB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024  # type: ignore[assignment]
    return str(n)


def _table(rows: list[list[str]], header: list[str]) -> str:
    widths = [max(len(str(r[i])) for r in [header, *rows]) for i in range(len(header))]
    fmt = "  ".join(f"{{:<{w}}}" for w in widths)
    return "\n".join([fmt.format(*header), fmt.format(*("-" * w for w in widths)),
                      *(fmt.format(*r) for r in rows)])


# ------------------------------------------------------------------------------------------ build

def _fitting(jobs: Sequence[plan.Job], command: str | None = None) -> list[plan.Job]:
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
        f"`python3 -m nox -s \"{command}({one})\"` for one target; or `pip install {targets[one].runtime_text}` "
        "into this environment (one flavor per environment)")


def _workers(args: argparse.Namespace, fit: Sequence[plan.Job]) -> int:
    from ortbuild.pipeline.parallel import default_workers

    if args.jobs is not None:
        return max(1, int(args.jobs))
    n, why = default_workers(fit)
    if why:
        print(f"ortbuild: {why}", file=sys.stderr)
    return n


def _clean_leftovers(dist: Path) -> None:
    """Start-up recovery, holding dist's lock: what killed builds left (partial files, plaintext temp dirs)."""
    removed = workspace.clean(dist)
    if removed:
        shown = ", ".join(str(p) for p in removed[:3]) + (f" and {len(removed) - 3} more" if len(removed) > 3 else "")
        print(f"ortbuild: removed {len(removed)} leftover(s) of interrupted builds: {shown}", file=sys.stderr)


def cmd_build(args: argparse.Namespace) -> int:
    from ortbuild.pipeline.build import BUILT, FAILED, PORTABLE, SKIPPED, UP_TO_DATE, JobResult

    project = config.load(args.config)
    jobs = plan.jobs(project, args.target, args.model)
    _fitting(jobs, "build")
    with _built(args, project, jobs, force=args.force) as (dist, _, built):
        results = list(built.values())

    rows = []
    for r in results:
        ratio = f"{r.size / r.source_size:.2f}x" if r.size and r.source_size else "-"
        level = r.level or "-"
        requested = project.targets[r.target].settings[r.model].optimization
        if r.level and r.level != requested:
            level = f"{r.level} (asked {requested})"
        converted = f"{r.converted:.0%}" if r.converted is not None else "-"
        rows.append([r.target, r.model, r.status.upper(), r.precision, converted, level, _size(r.size), ratio,
                     f"{r.seconds:.1f}s"])
    code = 0
    for r in results:
        named = bool(config.matches([r.target], args.target or []))
        if r.status == FAILED and r.error is not None:
            code = code or r.error.exit_code
        elif r.status == SKIPPED and (args.strict or named):
            code = code or RuntimeMismatch.exit_code
        elif r.status == PORTABLE and args.strict:
            code = code or MissingProvider.exit_code
    if args.json:
        print(json.dumps({"dist": str(dist), "exit_code": code, "jobs": [r.as_json() for r in results]},
                         indent=2))
        return code
    print()
    print(_table(rows, ["target", "model", "status", "precision", "converted", "level", "size", "vs src",
                        "time"]))
    said: dict[str, list[JobResult]] = {}  # each reason or note once, with the jobs it concerns
    for r in results:
        lines = [f"{r.status.upper()}: {r.reason}"] if r.status in (SKIPPED, PORTABLE, FAILED) and r.reason \
            else []
        for text in lines + [f"note: {n}" for n in r.notes if n not in r.reason]:
            said.setdefault(text, []).append(r)
    jobs_of = Counter(r.target for r in results)
    for text, who in said.items():
        shown = []
        for t, n in Counter(r.target for r in who).items():  # all the models of a target read "target/*"
            shown += [f"{t}/*"] if n == jobs_of[t] > 1 else [f"{t}/{r.model}" for r in who if r.target == t]
        print(f"  [{', '.join(shown)}] {text}")
    counts = {s: sum(r.status == s for r in results) for s in (BUILT, UP_TO_DATE, PORTABLE, SKIPPED, FAILED)}
    print("\n" + ", ".join(f"{n} {s}" for s, n in counts.items()) + f"  ->  {dist}")
    for r in results:
        if r.status == FAILED and r.error is not None:
            if args.debug and r.debug:
                print(r.debug, file=sys.stderr)
            print(r.error.render(), file=sys.stderr)
    return code


# ------------------------------------------------------------------------------------------- test

@contextlib.contextmanager
def _built(args: argparse.Namespace, project: config.Project, jobs: Sequence[plan.Job], *, force: bool = False) \
        -> Iterator[tuple[Path, Any, dict[str, Any]]]:
    """Hold dist/'s lock (recovering what killed runs left), build the jobs that are missing or stale (all of
    them with `force`), and give (dist, the builder, its results by job name, in the jobs' order) to what runs
    on them (`test`, `profile`) under the lock."""
    from ortbuild.pipeline.build import Builder, Progress

    fit = _fitting(jobs)
    dist = Path(args.dist) if args.dist else project.root / "dist"
    builder = Builder(project, dist, force=force, repair=getattr(args, "repair", False),
                      enc_key=keys.encryption_key(file=args.key_file),
                      sign_key=keys.signing_key(file=args.signing_key_file))
    builder.check_keys(fit)  # before dist/ is touched
    with workspace.Lock(dist, timeout=args.lock_timeout):
        _clean_leftovers(dist)
        with Progress(quiet=args.json) as progress:
            builder.progress = progress
            built = {f"{r.target}/{r.model}": r for r in builder.run(jobs, workers=_workers(args, fit))}
        yield dist, builder, built


def cmd_test(args: argparse.Namespace) -> int:
    """Build what is missing or stale, then gate every artifact: golden outputs, latency and size budgets."""
    from ortbuild.gating import explain, gates, report
    from ortbuild.pipeline.build import Progress

    if args.explain_rebuilds < 1 or args.explain_seconds <= 0:
        raise UsageError("--explain-rebuilds and --explain-seconds must be positive")
    project = config.load(args.config)
    jobs = plan.jobs(project, args.target, args.model)
    _fitting(jobs, "test")
    refs: list[plan.Job] = []  # the other side of relative latency budgets: built, not tested
    for j in jobs:
        ft = j.settings.gates.latency.faster_than if j.settings.gates else None
        if ft is not None and not any(x.name == f"{ft.target}/{j.model.name}" for x in [*jobs, *refs]):
            other = project.targets[ft.target]
            refs.append(plan.Job(other, j.model, other.settings[j.model.name]))
    with _built(args, project, [*jobs, *refs]) as (dist, builder, built):
        progress = Progress(quiet=args.json, live=False)  # the gates measure latency: no display thread
        secret = builder.enc_key.secret if builder.enc_key else None
        tester = gates.Tester(project, dist, secret, args.config, progress, builder.sign_key)
        results = tester.run(jobs, built, args.require)
        explained = _explain(args, builder, tester, jobs, results, progress)
        json_path, html_path = report.write(dist, report.collect(dist))

    code = next((r.exit_code for r in results if r.exit_code), 0)
    if not code and args.strict and any(r.status == gates.INCONCLUSIVE for r in results):
        code = GateFailed.exit_code
    if args.json:
        print(json.dumps({"exit_code": code, "report": str(json_path), "html": str(html_path),
                          "results": [r.as_json() for r in results]}, indent=2, default=str))
        return code
    docs = [r.as_json() for r in results]
    print()
    print(_table(report.rows(docs), report.HEADER))
    notes = dict.fromkeys(f"[{k}] note: {n}" for k, b in built.items() for n in b.notes
                          if any(r.target + "/" + r.model == k for r in results))
    for r in results:
        if r.status in (gates.SKIP, gates.INCONCLUSIVE) and r.reason:
            print(f"  [{r.target}/{r.model}] {r.status}: {r.reason}")
    for n in notes:
        print(f"  {n}")
    counts = {s: sum(r.status == s for r in results) for s in (gates.PASS, gates.FAIL, gates.INCONCLUSIVE, gates.SKIP)}
    print("\n" + ", ".join(f"{n} {s}" for s, n in counts.items()) + f"  ->  {json_path}, {html_path}")
    for r in results:
        if r.failures:
            print(f"\nFAIL {r.target}/{r.model}:", file=sys.stderr)
            for line in r.failures:
                print(f"  {line}", file=sys.stderr)
            print(f"  reproduce: {r.reproduce}", file=sys.stderr)
    if code == 0 and any(r.status == gates.INCONCLUSIVE for r in results):
        print("INCONCLUSIVE latency verdicts pass without --strict", file=sys.stderr)
    for r in explained:
        print()
        print("\n".join(explain.render(f"{r.target}/{r.model}", r.explain)))
    return code


def _explain(args: argparse.Namespace, builder: Any, tester: Any, jobs: Sequence[plan.Job], results: Sequence[Any],
             progress: Any) -> list[Any]:
    """The precision search of every fp16/int8/int4 job whose accuracy gate failed (with --explain: of every
    one; --no-explain: none), recorded in its test report."""
    from ortbuild.gating import explain, gates

    if args.explain is False:
        return []
    ex = explain.Explainer(builder, tester, max_rebuilds=args.explain_rebuilds, max_seconds=args.explain_seconds,
                           progress=progress)
    done = []
    for job, r in zip(jobs, results, strict=True):
        if r.precision not in explain.KNOBS or r.status == gates.SKIP or r.accuracy == "-":
            continue
        if args.explain is None and r.accuracy != gates.FAIL:
            continue
        try:
            r.explain = ex.explain(job, r)
        except OrtbuildError as e:  # the diagnosis failing changes no verdict: it is recorded and shown
            r.explain = {"status": "failed", "reason": e.message}
        except Exception as e:
            r.explain = {"status": "failed", "reason": f"{type(e).__name__}: {first_line(e)} (the verdict stands; "
                                                       "rerun with --debug for the traceback)"}
            if getattr(args, "debug", False):
                raise
        tester.write_report(job, r)
        done.append(r)
    return done


def cmd_profile(args: argparse.Namespace) -> int:
    """Build what is missing or stale, then profile every artifact through its loader (ortbuild.gating.profile)."""
    from ortbuild.gating import profile, report
    from ortbuild.pipeline.build import Progress

    if args.runs < 1 or args.top < 1:
        raise UsageError("--runs and --top must be at least 1")
    project = config.load(args.config)
    jobs = plan.jobs(project, args.target, args.model)
    _fitting(jobs, "profile")
    with _built(args, project, jobs) as (dist, builder, built):
        secret = builder.enc_key.secret if builder.enc_key else None
        results = profile.profile_jobs(jobs, dist, secret, args.runs, built, Progress(quiet=args.json, live=False))
        _, html_path = report.write(dist, report.collect(dist))
    code = next((r.exit_code for r in results if r.exit_code), 0)
    if args.json:
        print(json.dumps({"exit_code": code, "html": str(html_path), "results": [r.as_json() for r in results]},
                         indent=2))
        return code
    for r in results:
        print(f"\n{r.target}/{r.model}: {r.status}" + (f": {r.reason}" if r.reason else ""))
        if r.status != profile.PROFILED:
            continue
        s = r.summary
        shares = ", ".join(f"{p.removesuffix('ExecutionProvider')} {v['nodes']} nodes "
                           f"{v['total_us'] / 1e3 / s['runs']:.3f} ms/run" for p, v in s["providers"].items())
        print(f"  {s['runs']} runs, {s['run_ms']:.3f} ms per run ({s['kernel_share']:.0%} in kernels); {shares}")
        print("  " + _table(profile.table(s, args.top), profile.HEADER).replace("\n", "\n  "))
        if s["cpu_fallback"]:
            print(f"  CPU fallback: {len(s['cpu_fallback'])} node(s) ran on CPUExecutionProvider, not on "
                  f"{s['planned_providers'][0]}: " + ", ".join(f"{x['node']} ({x['op_type']}, {x['share']:.1%})"
                                                               for x in s["cpu_fallback"][:8]))
        print(f"  trace: {dist / r.target / r.model / profile.TRACE}  (chrome://tracing or ui.perfetto.dev)")
    counts = {st: sum(r.status == st for r in results) for st in (profile.PROFILED, profile.SKIPPED, profile.FAILED)}
    print("\n" + ", ".join(f"{n} {st}" for st, n in counts.items()) + f"  ->  {html_path}")
    return code


def cmd_plan(args: argparse.Namespace) -> int:
    """What would be built, with which runtime, and whether each job would rebuild and why."""
    from ortbuild.pipeline.build import Builder, Progress, published

    project = config.load(args.config)
    jobs = plan.jobs(project, args.target, args.model)
    dist = Path(args.dist) if args.dist else project.root / "dist"
    problems = {t: runtime.runtime_problem(project.targets[t]) for t in {j.target.name for j in jobs}}
    builder = Builder(project, dist, progress=Progress(quiet=True), enc_key=keys.encryption_key(file=args.key_file),
                      sign_key=keys.signing_key(file=args.signing_key_file))
    out: list[dict[str, Any]] = []
    reduced: dict[str, str | None] = {}  # model -> why its source is already quantized / fp16
    for j in jobs:
        why: str | None
        notes = []
        if j.settings.precision != options.FP32:
            if j.model.name not in reduced:
                reduced[j.model.name] = _already_reduced(j.model.path)
            if reduced[j.model.name]:
                notes.append(f"the source is already reduced ({reduced[j.model.name]}): {j.settings.precision} "
                             "converts it again and loses accuracy twice; precision = \"fp32\" ships it as it is")
        if problems[j.target.name]:
            rebuild, why = None, problems[j.target.name]
        elif builder.sign_key is None or (j.settings.encrypt and builder.enc_key is None):
            rebuild, why = None, "unknown: no keys configured (the key ids are part of the build key)"
        else:
            ctx = builder.prepare(j)
            try:
                why, _ = published(ctx.out_dir, ctx.key, builder.sign_key, ctx.key_parts, ctx.enc_key)
                rebuild = why is not None
            except OrtbuildError as e:  # TAMPERED or a wrong key: a build refuses it, `--repair` rebuilds it
                why, rebuild = f"{e.label}: {e.message}", True
        out.append({"target": j.target.name, "model": j.model.name, "runtime": j.target.runtime_text,
                    "providers": [p.name for p in j.settings.providers], "precision": j.settings.precision,
                    "optimization": j.settings.optimization, "format": j.settings.format,
                    "buildable_here": problems[j.target.name] is None, "why_not": problems[j.target.name],
                    "rebuild": rebuild, "why": why, "notes": notes, "accuracy": plan.accuracy_text(j)})
    if args.json:
        print(json.dumps(out, indent=2))
        return 0

    def state(o: dict[str, Any]) -> str:
        if not o["buildable_here"]:
            return "other runtime"
        return "?" if o["rebuild"] is None else "rebuild" if o["rebuild"] else "up to date"
    print(_table([[o["target"], o["model"], o["runtime"], ",".join(p.removesuffix("ExecutionProvider")
                                                                    for p in o["providers"]),
                   o["precision"], o["optimization"], state(o), o["why"] if o["rebuild"] else ""]
                  for o in out],
                 ["target", "model", "runtime", "providers", "precision", "level", "build", "why"]))
    for o in out:
        for n in o["notes"]:
            print(f"  [{o['target']}/{o['model']}] note: {n}")
    if jobs:
        print("\naccuracy (ortbuild test's golden-output rule, per output where set):")
        print("\n".join(plan.accuracy_lines(jobs)))
    return 0


def _already_reduced(path: Path) -> str | None:
    """Why the model at `path` is already quantized or fp16 (its graph only: the weights are not read)."""
    import onnx

    from ortbuild.pipeline.steps import accounting

    try:
        return accounting.already_reduced(onnx.load(str(path), load_external_data=False))
    except Exception:  # an unreadable model: the build's check step names the problem
        return None


def _providers_here() -> list[dict[str, Any]]:
    """docs/targets.md's capability table, with this environment's answer for each provider."""
    from ortbuild.project import capabilities

    flavor = runtime.installed_flavor()
    out = []
    for c in capabilities.CAPABILITIES:
        for name in c.providers:
            why = (capabilities.unsupported(name) if c.status == capabilities.UNSUPPORTED
                   else runtime.provider_here(name))
            out.append({"provider": name, "label": c.label, "status": c.status, "runtime": c.runtime,
                        "here": why is None, "why_not": why, "environment": flavor.as_json() if flavor else None,
                        "built_without_hardware": c.portable, "with_hardware": c.with_hardware,
                        "verified": c.verified})
    return out


def _print_providers(rows: list[dict[str, Any]]) -> None:
    flavor = runtime.installed_flavor()
    print(f"execution providers (docs/targets.md), in this environment "
          f"({f'{flavor.distribution} {flavor.version}' if flavor else 'no ONNX Runtime'}, {runtime.cpu_model()}):")
    print(_table([[r["label"], r["provider"], r["status"], "yes" if r["here"] else "no"] for r in rows],
                 ["EP", "provider", "ortbuild support", "runs here"]))
    for r in rows:
        if r["why_not"]:
            print(f"  {r['provider']}: {r['why_not']}")


def cmd_targets(args: argparse.Namespace) -> int:
    if args.providers:
        rows = _providers_here()
        if args.json:
            print(json.dumps(rows, indent=2))
        else:
            _print_providers(rows)
        return 0
    project = config.load(args.config)
    out: list[dict[str, Any]] = []
    for t in project.targets.values():
        why = runtime.runtime_problem(t)
        missing: list[str] = []
        if why is None:
            missing = [r for r in (runtime.probe_provider(p, t.plugin_for(p.name)) for p in t.providers) if r]
        out.append({"target": t.name, "runtime": t.runtime_text, "providers": [p.name for p in t.providers],
                    "precisions": sorted({s.precision for s in t.settings.values()}), "models": list(t.models),
                    "runtime_here": why is None, "providers_here": why is None and not missing,
                    "why_not": why or "; ".join(missing) or None, "description": t.description})
    if args.json:
        print(json.dumps(out, indent=2))
        return 0

    def state(o: dict[str, Any]) -> str:
        if o["providers_here"]:
            return "yes"
        return "other runtime" if not o["runtime_here"] else "no provider (portable build only)"
    print(_table([[o["target"], o["runtime"], ",".join(o["precisions"]), str(len(o["models"])), state(o)]
                  for o in out], ["target", "runtime", "precision", "models", "runs here"]))
    for o in out:
        if o["why_not"]:
            print(f"  {o['target']}: {o['why_not']}")
    print()
    _print_providers(_providers_here())
    return 0


# ---------------------------------------------------------------------------------------- inspect

def _inspect_onnx(path: Path) -> dict[str, Any]:
    import onnx

    from ortbuild.pipeline.steps import check

    try:
        model = onnx.load(str(path), load_external_data=False)
    except Exception as e:  # protobuf DecodeError and friends
        raise ArtifactError(f"{path}: not an ONNX model: {str(e)[:200]}") from None
    return {"file": str(path), "size": path.stat().st_size, "sha256": manifest.sha256_file(path),
            "ir_version": model.ir_version, "opsets": check.opsets(model), "io": check.signature(model),
            "producer": f"{model.producer_name} {model.producer_version}".strip(), "nodes": len(model.graph.node)}


def cmd_inspect(args: argparse.Namespace) -> int:
    path = Path(args.path)
    if not path.exists():
        raise ArtifactError(f"{path}: no such file or directory")
    if path.is_file() and path.suffix == ".onnx" and not (path.parent / manifest.MANIFEST).exists():
        info = _inspect_onnx(path)
        if args.json:
            print(json.dumps(info, indent=2))
        else:
            print(f"{path}: plain ONNX model (no ortbuild manifest beside it)")
            print(f"  size {_size(info['size'])}  sha256 {info['sha256']}")
            print(f"  ir {info['ir_version']}  opsets {info['opsets']}  nodes {info['nodes']}")
            for kind in ("inputs", "outputs"):
                for v in info["io"][kind]:
                    print(f"  {kind[:-1]:<6} {v['name']}: {v['dtype']} {v['shape']}")
        return 0
    folder = manifest.locate(path).parent
    left = [str(p) for p in workspace.leftovers(None) + workspace.partial_files(folder)]
    for p in left:
        print(f"  LEFTOVER   {p}: left by an interrupted build; `ortbuild clean --stale` (or the next build) "
              "removes it", file=sys.stderr)
    # one trust root: --public-key, else $ORTBUILD_PUBLIC_KEY_FILE, else the configured signing key's public half;
    # the public key a manifest names is information, never trust
    pinned = keys.public_key(args.public_key)
    if pinned and (sig := manifest.signature_problem(folder, pinned)):  # before reading what may be forged
        raise Tampered(f"{folder}: {sig}", "someone or something changed it after the build: find out what, then "
                                           "`ortbuild build --repair` rebuilds it on purpose")
    m, folder = manifest.read(path)
    unverified = None if pinned else ("no public key configured: nothing here is verified (pass --public-key "
                                      "signing.pub, or set ORTBUILD_PUBLIC_KEY_FILE or ORTBUILD_SIGNING_KEY_FILE)")
    integrity = manifest.integrity_problems(m, folder, pinned) if pinned else []
    fit = manifest.fit_problems(m)
    if args.json:
        print(json.dumps({"manifest": json.loads(m.to_json()), "verified": pinned is not None and not integrity,
                          "trusted_public_key_id": keys.public_key_id(pinned) if pinned else None,
                          "integrity_problems": integrity if pinned else [unverified],
                          "fit_problems": fit, "leftovers": left}, indent=2))
    else:
        opt, ort_version = m.optimization, m.versions["onnxruntime"]
        print(f"{m.target}/{m.model}  ({m.status})  built {m.created} with "
              f"{ort_version['distribution']} {ort_version['version']}")
        print(f"  artifact   {folder / m.artifact.file}  {_size(m.artifact.size)}  "
              f"({m.artifact.size_ratio:.2f}x source)  sha256 {m.artifact.sha256[:16]}...")
        print(f"  source     {m.source.path}  {_size(m.source.size)}  opsets {m.source.opsets}")
        for f in m.source.files[1:]:  # the external-data files the graph names
            print(f"             + {f['file']}  {_size(int(f['size']))}  sha256 {str(f['sha256'])[:16]}...")
        if m.artifact.external_data:
            print(f"  weights    external data (model.onnx.data): {m.artifact.external_data}")
        if m.fusion is not None:
            fz = m.fusion
            print(f"  fusion     {fz.model_type}: " + (f"{fz.nodes_before} -> {fz.nodes_after} nodes, fused "
                                                    + ", ".join(f"{op} {n}" for op, n in fz.fused_ops.items())
                                                    if fz.applied else f"not applied ({fz.reason})"))
        print(f"  precision  {m.precision.name}  {m.precision.options or ''}")
        enc = m.encryption
        print("  encrypted  " + (f"{enc.algorithm}, {enc.container}, key id {enc.key_id}"
                                 + (" (DEVELOPMENT KEY)" if enc.development_key else "") if enc else
                                 "no (encrypt = false)"))
        print(f"  signed     {m.signing.algorithm}, public key id {m.signing.public_key_id}"
              + (" (DEVELOPMENT KEY)" if m.signing.development_key else "")
              + (f"; checked with the trusted key id {keys.public_key_id(pinned)}" if pinned else ""))
        print(f"  epoch      {m.epoch} (rollback counter: loaders generated at a higher epoch refuse this one)")
        if m.golden:
            print(f"  golden     {len(m.golden)} signed file(s) under golden/")
        for lf in m.loaders:
            print(f"  loader     {lf.name}" + (f"  ({lf.note})" if lf.note else ""))
        print(f"  providers  {', '.join(p['name'] for p in m.providers)}")
        for name, why in m.missing_providers.items():
            print(f"  missing    {name} at build time: {why}")
        print(f"  level      {opt.applied} (asked {opt.requested}); "
              + ("portable" if opt.portable else f"tied to {opt.tied_to}"))
        if m.compiled:
            print(f"  compiled   ahead of time for {m.compiled['provider']} ({m.compiled['device']}): "
                  f"{m.compiled['ep_context_nodes']} EPContext node(s), {m.compiled['other_nodes']} node(s) on "
                  "the CPU; loads with session.disable_model_compile = 1")
        for name, info in m.plugins.items():
            print(f"  plugin     {name} from {info['package']} {info['version']} (registered by the loaders)")
        for c in m.custom_ops:
            named = f"{c['name']} {c['version']}".strip()
            print(f"  custom ops {named} ({c.get('file') or c['library']}, sha256 {c['sha256'][:16]}; registered by "
                  "the Python loader after checking its sha256)")
        for kind in ("inputs", "outputs"):
            for v in m.io[kind]:
                print(f"  {kind[:-1]:<10} {v['name']}: {v['dtype']} {v['shape']}")
        print(f"  machine    {m.build_machine['cpu']} ({m.build_machine['simd_level']})")
        for n in m.notes:
            print(f"  note       {n}")
        for p in integrity:
            print(f"  TAMPERED   {p}")
        for p in fit:
            print(f"  WARNING    does not fit this environment: {p}")
        if unverified:
            print(f"  UNVERIFIED {unverified}")
        elif not integrity and not fit:
            print("  OK         signature and every signed file verified; fits this environment")
        if m.signing.development_key or (m.encryption is not None and m.encryption.development_key):
            print("  WARNING    built with a DEVELOPMENT key: never release it")
    if integrity:
        return Tampered.exit_code
    if unverified:
        return KeyMissing.exit_code
    return ArtifactError.exit_code if (fit and args.strict) else 0


# ------------------------------------------------------------------------------------- keys

def cmd_keygen(args: argparse.Namespace) -> int:
    made = keys.keygen(Path(args.out), development=args.dev)
    if args.json:
        print(json.dumps(made, indent=2))
        return 0
    kind = "DEVELOPMENT keys (never for a release)" if args.dev else "keys"
    print(f"wrote {kind}: {made['encryption_key']} (id {made['encryption_key_id']}), {made['signing_key']}, "
          f"{made['public_key']} (id {made['public_key_id']})")
    print(f"use them: export ORTBUILD_KEY_FILE={Path(made['encryption_key']).resolve()} "
          f"ORTBUILD_SIGNING_KEY_FILE={Path(made['signing_key']).resolve()}")
    print("keep encryption.key and signing.key secret; apps need encryption.key at run time, only the build "
          "needs signing.key")
    return 0


def cmd_rekey(args: argparse.Namespace) -> int:
    """Re-wrap every artifact's data keys under a new key and re-sign its manifest, in place: the model bytes are
    not re-encrypted and the build key does not change, so the next `ortbuild test` with the new key reuses the
    artifact, and the old key gets WrongKey. Each artifact is checked against the signing key first."""
    old = keys.encryption_key(file=args.old_key_file)
    new = keys.encryption_key(file=args.new_key_file) if args.new_key_file else None
    sign = keys.signing_key(file=args.signing_key_file)
    if old is None or new is None or sign is None:
        raise KeyMissing("rekey needs --old-key-file, --new-key-file and a signing key "
                         "(--signing-key-file, ORTBUILD_SIGNING_KEY or ORTBUILD_SIGNING_KEY_FILE)",
                         f"make a new key: `{keys.MAKE_KEYS}`")
    folders = []
    for path in args.paths:
        p = Path(path)
        found = sorted(p.rglob(manifest.MANIFEST)) if p.is_dir() and not (p / manifest.MANIFEST).exists() \
            else [manifest.locate(p)]
        if not found or not found[0].exists():
            raise ArtifactError(f"{p}: no artifact (manifest.json) here", "give dist/ or a dist/<target>/<model>/")
        folders += [f.parent for f in found]
    done = 0
    for folder in folders:
        dist = folder.parent.parent  # a dist/<target>/<model>/ is re-keyed under dist's lock
        locked = (dist / workspace.LOCK).exists()
        with workspace.Lock(dist, timeout=args.lock_timeout) if locked else contextlib.nullcontext():
            done += _rekey_one(folder, old, new, sign)
    print(f"{done} artifact(s) re-keyed to key id {new.key_id}; build keys unchanged (no rebuild), the old key "
          "no longer opens them")
    return 0


def _rekey_one(folder: Path, old: keys.EncryptionKey, new: keys.EncryptionKey, sign: keys.SigningKey) -> int:
    m = manifest.trusted(folder, sign.public_raw)  # Tampered: rekey never signs what it did not check
    assert m is not None
    if m.encryption is None:
        return 0
    if m.encryption.key_id == new.key_id:
        print(f"{folder}: already under key id {new.key_id}")
        return 0
    if m.encryption.key_id != old.key_id:
        raise WrongKey(f"{folder}: encrypted under key id {m.encryption.key_id}, --old-key-file ({old.source}) is "
                       f"id {old.key_id}", "give the key it is encrypted under as --old-key-file")
    files, partials = [], []
    try:
        for f in m.artifact.files:
            partial = manifest.partial_file(folder / f.name)
            partials.append(partial)
            with open(partial, "wb") as out:
                sha, size = container.rewrap_file(folder / f.name, out, old.secret, new.secret)
                out.flush()
                os.fsync(out.fileno())
            files.append((dataclasses.replace(f, sha256=sha, size=size), partial))
        main = next(f for f, _ in files if f.role == "model")
        m = dataclasses.replace(
            m, artifact=dataclasses.replace(m.artifact, files=[f for f, _ in files], sha256=main.sha256),
            encryption=dataclasses.replace(m.encryption, key_id=new.key_id, development_key=new.development))
        manifest.write_signed(folder, {f.name: partial for f, partial in files}, m, sign.sign)
    finally:
        for partial in partials:
            partial.unlink(missing_ok=True)
    print(f"{folder}: re-wrapped {len(files)} file(s) from key id {old.key_id} to {new.key_id}")
    return 1


# ------------------------------------------------------------------------------------------ clean

def cmd_clean(args: argparse.Namespace) -> int:
    """--stale: remove what interrupted builds left; else every artifact and report in dist/ as well."""
    import shutil

    dist = Path(args.dist) if args.dist else config.load(args.config, check_files=False).root / "dist"
    if not dist.exists():
        print(f"nothing to clean: {dist} does not exist")
        return 0
    if not args.stale and not workspace.owned(dist):
        raise UsageError(f"{dist}: not an ortbuild output directory (no {workspace.MARKER} marker in it): clean "
                         "empties only directories ortbuild made", f"check --dist; if {dist} holds only build output "
                                                                   "of an older ortbuild, remove it yourself")
    with workspace.Lock(dist, timeout=args.lock_timeout):
        removed = workspace.clean(dist)
        if not args.stale:
            for entry in sorted(dist.iterdir()):
                if entry.name in (workspace.LOCK, workspace.MARKER):
                    continue
                if entry.is_dir() and not entry.is_symlink():
                    shutil.rmtree(entry)
                else:
                    entry.unlink()
                removed.append(entry)
    for p in removed:
        print(f"removed {p}")
    print(f"{len(removed)} removed" + (" (leftovers of interrupted builds)" if args.stale else f" from {dist}"))
    return 0


# ----------------------------------------------------------------------------------------- schema

def cmd_schema(args: argparse.Namespace) -> int:
    from ortbuild.project import capabilities

    files = {SCHEMA_FILE: options.schema_text(), REFERENCE_FILE: options.reference_markdown()}
    if TARGETS_DOC.exists():  # a source checkout: its capability table is generated too
        files[TARGETS_DOC] = capabilities.spliced(TARGETS_DOC.read_text())
    if args.write:
        for f, text in files.items():
            manifest.atomic_write(f, text.encode())
            print(f"wrote {f}")
        return 0
    if args.check:
        stale = [str(f) for f, text in files.items() if not f.exists() or f.read_text() != text]
        if stale:
            raise OrtbuildError(f"out of date: {', '.join(stale)}", "run `ortbuild schema --write`")
        print("schema and reference docs are up to date")
        return 0
    sys.stdout.write(options.schema_text())
    return 0


# ---------------------------------------------------------------------------------------- release

def _public_key(args: argparse.Namespace) -> bytes:
    found = keys.public_key(args.public_key)
    if found is None:
        raise KeyMissing("verifying a release needs the publisher's public key",
                         "pass --public-key signing.pub (what `ortbuild keygen` wrote), or set "
                         "ORTBUILD_PUBLIC_KEY_FILE")
    return found


def _development_keys(project: config.Project, names: Sequence[str], dist: Path,
                      sign_key: keys.SigningKey) -> list[str]:
    """What in a release would be DEVELOPMENT-keyed: the signing key, and each artifact whose manifest says its
    encryption or signing key was one (the release checks each manifest's signature afterwards)."""
    found = [f"the signing key ({sign_key.source}) is a development key"] if sign_key.development else []
    for name in names:
        for model in project.targets[name].models:
            try:
                m, _ = manifest.read(dist / name / model)
            except OrtbuildError:
                continue  # never built, or unreadable: the release says so itself
            which = [k for k, dev in (("encryption", m.encryption is not None and m.encryption.development_key),
                                      ("signing", m.signing.development_key)) if dev]
            if which:
                found.append(f"{name}/{model} was built with a development {' and '.join(which)} key")
    return found


UNKNOWN_PUBLIC_KEY = "SIGNING.PUB"  # in a printed verify command where the public key file is not known here


def _verify_command(where: str, sign_key: keys.SigningKey) -> str:
    """A verify command that works from anywhere: the signing.pub beside the signing key file (when it holds
    this key's public half), else $ORTBUILD_PUBLIC_KEY_FILE, else a placeholder and what to put there."""
    import shlex

    command = f"ortbuild verify {shlex.quote(where)} --public-key "
    if sign_key.path:
        beside = Path(sign_key.path).parent / keys.PUBLIC_FILE
        try:
            if beside.is_file() and keys.read_public_key(beside) == sign_key.public_raw:
                return command + shlex.quote(str(beside.resolve()))
        except (OSError, OrtbuildError):
            pass
    env = os.environ.get("ORTBUILD_PUBLIC_KEY_FILE")
    if env:
        return command + shlex.quote(str(Path(env).resolve()))
    return command + UNKNOWN_PUBLIC_KEY


def cmd_release(args: argparse.Namespace) -> int:
    """One signed, reproducible bundle per target, refused unless its tests passed (docs/release.md)."""
    from ortbuild.publish import registry, release

    project = config.load(args.config)
    names = plan._select(list(project.targets), args.target, "targets", str(project.file))
    dist = Path(args.dist) if args.dist else project.root / "dist"
    sign_key = keys.signing_key(file=args.signing_key_file)
    if sign_key is None:
        raise KeyMissing("no signing key: a release is signed (ORTBUILD_SIGNING_KEY or ORTBUILD_SIGNING_KEY_FILE, "
                         "or --signing-key-file)", f"make one with `{keys.MAKE_KEYS}`")
    warnings: list[str] = []
    development = _development_keys(project, names, dist, sign_key)
    if development and not args.allow_development_key:
        raise KeyMissing("release refused: DEVELOPMENT keys (`keygen --dev`, for local builds only): "
                         + "; ".join(development),
                         f"build and release with your own keys: `{keys.MAKE_KEYS}`, then `ortbuild test` and "
                         "`ortbuild release` again; or pass --allow-development-key to release anyway (never "
                         "ship it)")
    if development:
        warnings.append("released with DEVELOPMENT keys (--allow-development-key): never ship it: "
                        + "; ".join(development))
        for w in warnings:
            print(f"ortbuild: WARNING: {w}", file=sys.stderr)
    ref = registry.parse(args.to) if args.to and registry.is_ref(args.to) else None
    if ref is not None and ref.tag and "{target}" not in ref.tag and len(names) > 1:
        raise UsageError(f"{args.to}: one tag names one bundle, and {len(names)} targets are selected",
                            "put {target} in the tag (e.g. :{version}-{target}), leave the tag out (it defaults "
                            "to {version}-{target}), or select one target with -t")
    # the default dist/release must stay inside dist/ (a symlink there leading out is refused, never written through)
    out_root = Path(args.to) if args.to and ref is None else paths.inside(dist, "release")
    done, refused, lines = [], [], []
    with workspace.Lock(dist, timeout=args.lock_timeout):
        for name in names:
            target = project.targets[name]
            try:
                pub = release.release_target(project, target, dist, paths.inside(out_root, name), sign_key,
                                             force=args.force)
            except (GateFailed, ArtifactError) as e:
                refused.append(e)
                continue
            index = pub.index
            entry: dict[str, Any] = {"target": name, "dir": str(pub.folder),
                                     **{k: str(v) for k, v in pub.files.items()}, "forced": pub.forced}
            if ref is not None:
                tag = (ref.tag or "{version}-{target}").replace("{target}", name).replace("{version}",
                                                                                          project.version)
                where = ref.with_tag(tag)
                entry["pushed"], entry["digest"] = str(where), registry.push(where, pub)
            done.append(entry)
            lines.append(f"{name}: {pub.files['bundle'].name} ({_size(pub.files['bundle'].stat().st_size)}, "
                         f"{len(index['models'])} models) -> {pub.folder}"
                         + (f"\n  pushed {entry['pushed']} ({entry['digest']})" if "pushed" in entry else "")
                         + ("\n  FORCED: " + "; ".join(pub.forced) if pub.forced else ""))
    code = refused[0].exit_code if refused else 0
    for entry in done:
        entry["verify"] = _verify_command(entry.get("pushed") or str(Path(entry["dir"]).absolute()), sign_key)
    if args.json:
        print(json.dumps({"exit_code": code, "released": done, "refused": [err.message for err in refused],
                          "warnings": warnings}, indent=2))
        return code
    for line in lines:
        print(line)
    for err in refused:
        print(err.render(), file=sys.stderr)
    if done:
        print("\nverify with: " + "\n             ".join(entry["verify"] for entry in done))
        if done[0]["verify"].endswith(UNKNOWN_PUBLIC_KEY):
            print(f"  {UNKNOWN_PUBLIC_KEY}: the signing.pub `ortbuild keygen` wrote beside the signing key (public key "
                  f"id {sign_key.key_id}); set ORTBUILD_PUBLIC_KEY_FILE to it and this says its path")
    return code


def _verify_lines(v: Any, as_json: bool, extra: dict[str, Any] | None = None) -> None:
    if as_json:
        print(json.dumps({"name": v.name, "target": v.target, "checks": v.lines, "warnings": v.warnings,
                          "tests": v.index["tests"], **(extra or {})}, indent=2))
        return
    print(f"{v.name}: verified")
    for line in v.lines:
        print(f"  {line}")
    for w in v.warnings:
        print(f"  WARNING: {w}")


def cmd_verify(args: argparse.Namespace) -> int:
    """Signature, digests, provenance, safe extraction, then the golden test through the bundle's loader."""
    import tempfile

    from ortbuild.publish import registry, verify

    public = _public_key(args)
    enc = keys.encryption_key(file=args.key_file)
    secret = enc.secret if enc else None
    with tempfile.TemporaryDirectory(prefix="ortbuild-verify-") as tmp:
        where = Path(args.bundle)
        if registry.is_ref(args.bundle):
            registry.pull(registry.parse(args.bundle), Path(tmp))
            where = Path(tmp)
        v = verify.verify(where, public, run=not args.no_run, key=secret)
    _verify_lines(v, args.json)
    return 0


PULLED = ".ortbuild-pulled"  # in every directory `ortbuild pull` made: only such a directory is replaced


def cmd_pull(args: argparse.Namespace) -> int:
    """Fetch a release from an OCI registry, verify it, and place the verified bundle in --to."""
    import shutil
    import tempfile

    from ortbuild.publish import registry, release, verify

    ref = registry.parse(args.ref)
    public = _public_key(args)
    enc = keys.encryption_key(file=args.key_file)
    with tempfile.TemporaryDirectory(prefix="ortbuild-pull-") as tmp:
        pulled = registry.pull(ref, Path(tmp))
        dest = Path(args.to) if args.to else Path.cwd() / pulled["index"].name.removesuffix(f".{release.INDEX}")
        if dest.is_symlink() or (dest.exists() and not dest.is_dir()):
            raise UsageError(f"{dest}: is a symlink or not a directory: pull replaces only a directory it made",
                             "choose another --to directory")
        if dest.exists() and any(dest.iterdir()) and not (dest / PULLED).is_file():
            raise UsageError(f"{dest}: not empty, and not a release `ortbuild pull` made (no {PULLED} in it): pull "
                             "replaces only its own", "choose another --to directory, or an empty one")
        staged = dest.parent / f".{dest.name}.pulling"
        shutil.rmtree(staged, ignore_errors=True)
        dest.parent.mkdir(parents=True, exist_ok=True)
        v = verify.verify(Path(tmp), public, run=not args.no_run, key=enc.secret if enc else None, extract_to=staged)
        (staged / PULLED).write_text(f"# pulled by ortbuild from {ref}: `ortbuild pull --to` may replace it\n")
        old = dest.parent / f".{dest.name}.old"
        if dest.exists():
            dest.rename(old)
        staged.rename(dest)
        shutil.rmtree(old, ignore_errors=True)
    _verify_lines(v, args.json, {"dir": str(dest)})
    if not args.json:
        print(f"  -> {dest}  (load with {dest}/<model>/loader/ortbuild_loader.py)")
    return 0


def cmd_matrix(args: argparse.Namespace) -> int:
    """A GitHub Actions matrix: one entry per target, on a runner with its hardware (docs/ci.md)."""
    project = config.load(args.config, check_files=False)
    names = plan._select(list(project.targets), args.target, "targets", str(project.file))
    include = [{"target": n, "runs-on": list(project.targets[n].runner), "runtime": project.targets[n].runtime_text,
                "required": project.targets[n].require, "session": f"test({n})",
                "models": list(project.targets[n].models)} for n in names]
    print(json.dumps({"include": include}, indent=None if args.compact else 2))
    return 0


# ------------------------------------------------------------------------------------------- main

def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="ortbuild", description="Declarative multi-target ONNX Runtime builds.")
    p.add_argument("--version", action="version", version=f"ortbuild {__version__}")
    p.add_argument("--debug", action="store_true", help="show tracebacks")
    sub = p.add_subparsers(dest="command", required=True)

    def writer(sp: argparse.ArgumentParser) -> None:
        sp.add_argument("-j", "--jobs", type=int, default=None,
                        help="jobs built at once, in worker processes (default: cores, as memory allows)")
        sp.add_argument("--lock-timeout", type=float, default=600.0,
                        help="seconds to wait for another ortbuild writing the same dist/ (default: %(default)s)")

    def selection(sp: argparse.ArgumentParser) -> None:
        sp.add_argument("-c", "--config", default=config.DEFAULT_FILE, help="targets.toml (default: %(default)s)")
        sp.add_argument("-t", "--target", action="append", help="target name or glob (repeatable)")
        sp.add_argument("-m", "--model", action="append", help="model name or glob (repeatable)")
        sp.add_argument("--json", action="store_true", help="machine-readable output on stdout")

    b = sub.add_parser("build", help="build artifacts into dist/<target>/<model>/")
    selection(b)
    b.add_argument("--dist", help="output directory (default: dist/ beside targets.toml)")
    b.add_argument("--force", action="store_true", help="rebuild even when the build key is unchanged")
    b.add_argument("--repair", action="store_true",
                   help="rebuild artifacts whose files differ from their signed manifest (TAMPERED), saying what "
                        "was replaced; without it a build refuses them")
    b.add_argument("--strict", action="store_true",
                   help="fail (exit 5/4) on portable-only builds and skipped targets instead of reporting them")
    b.add_argument("--key-file", help="encryption key file (else $ORTBUILD_KEY, else $ORTBUILD_KEY_FILE)")
    b.add_argument("--signing-key-file",
                   help="signing key file (else $ORTBUILD_SIGNING_KEY, else $ORTBUILD_SIGNING_KEY_FILE)")
    writer(b)
    b.set_defaults(func=cmd_build)

    te = sub.add_parser("test", help="build what is missing or stale, then check golden outputs, latency and size")
    selection(te)
    te.add_argument("--dist", help="output directory (default: dist/ beside targets.toml)")
    te.add_argument("--strict", action="store_true", help="INCONCLUSIVE latency verdicts fail too (exit 9)")
    te.add_argument("--repair", action="store_true",
                    help="rebuild TAMPERED artifacts (saying what was replaced) instead of failing")
    te.add_argument("--require", action="store_true",
                    help="a target that cannot run here fails (exit 4/5) instead of being skipped")
    te.add_argument("--explain", action=argparse.BooleanOptionalAction, default=None,
                    help="precision bisection of fp16/int8/int4 artifacts: layer-wise error against fp32, then a "
                         "search (rebuilding and re-testing) for the nodes to keep in float that make a failing "
                         "accuracy gate pass, and the [[targets.X.overrides]] table to paste (docs/diagnose.md). "
                         "Default: for the artifacts whose accuracy gate failed; --explain: for every one; "
                         "--no-explain: never")
    te.add_argument("--explain-rebuilds", type=int, default=16, help="rebuilds per explained artifact (default: "
                                                                      "%(default)s)")
    te.add_argument("--explain-seconds", type=float, default=300.0,
                    help="seconds per explained artifact (default: %(default)s)")
    te.add_argument("--key-file", help="encryption key file (else $ORTBUILD_KEY, else $ORTBUILD_KEY_FILE)")
    te.add_argument("--signing-key-file", help="signing key file, to build what is missing or stale")
    writer(te)
    te.set_defaults(func=cmd_test)

    pr = sub.add_parser("profile", help="build what is missing or stale, then profile each artifact through its "
                                        "loader: a trace and the top operators (per provider, CPU fallback)")
    selection(pr)
    pr.add_argument("--dist", help="output directory (default: dist/ beside targets.toml)")
    pr.add_argument("--runs", type=int, default=20, help="profiled runs after one warm-up (default: %(default)s)")
    pr.add_argument("--top", type=int, default=10, help="operators shown per artifact (default: %(default)s)")
    pr.add_argument("--key-file", help="encryption key file (else $ORTBUILD_KEY, else $ORTBUILD_KEY_FILE)")
    pr.add_argument("--signing-key-file", help="signing key file, to build what is missing or stale")
    writer(pr)
    pr.set_defaults(func=cmd_profile)

    pl = sub.add_parser("plan", help="show what would be built, with which runtime, and why each job rebuilds")
    selection(pl)
    pl.add_argument("--dist", help="output directory (default: dist/ beside targets.toml)")
    pl.add_argument("--key-file", help="encryption key file (its id is part of the build key)")
    pl.add_argument("--signing-key-file", help="signing key file (its id is part of the build key)")
    pl.set_defaults(func=cmd_plan)

    cl = sub.add_parser("clean", help="remove dist/'s artifacts, or with --stale only what interrupted builds left")
    cl.add_argument("-c", "--config", default=config.DEFAULT_FILE, help="targets.toml (default: %(default)s)")
    cl.add_argument("--dist", help="output directory (default: dist/ beside targets.toml)")
    cl.add_argument("--stale", action="store_true",
                    help="only partial files and the private temp dirs of dead builds (they hold plaintext)")
    cl.add_argument("--lock-timeout", type=float, default=600.0, help="seconds to wait for a running build")
    cl.set_defaults(func=cmd_clean)

    t = sub.add_parser("targets", help="list targets, and the execution providers, and whether this environment "
                                       "can run them")
    t.add_argument("-c", "--config", default=config.DEFAULT_FILE)
    t.add_argument("--providers", action="store_true",
                   help="only the execution providers: ortbuild's support (docs/targets.md) and this environment's")
    t.add_argument("--json", action="store_true")
    t.set_defaults(func=cmd_targets)

    i = sub.add_parser("inspect", help="show a manifest or artifact; check integrity and fit")
    i.add_argument("path")
    i.add_argument("--json", action="store_true")
    i.add_argument("--strict", action="store_true", help="exit 7 when the artifact does not fit this machine")
    i.add_argument("--public-key", help="check the signature with this public key (signing.pub)")
    i.set_defaults(func=cmd_inspect)

    k = sub.add_parser("keygen", help="make an encryption key and a signing key pair")
    k.add_argument("--out", default="keys", help="directory for encryption.key, signing.key, signing.pub")
    k.add_argument("--dev", action="store_true", help="mark them as development keys (never for a release)")
    k.add_argument("--json", action="store_true")
    k.set_defaults(func=cmd_keygen)

    r = sub.add_parser("rekey", help="re-wrap artifacts' data keys under a new encryption key (no re-encryption)")
    r.add_argument("paths", nargs="+", help="dist/ directories or artifact directories")
    r.add_argument("--old-key-file", help="the current key (else $ORTBUILD_KEY / $ORTBUILD_KEY_FILE)")
    r.add_argument("--new-key-file", required=True, help="the new key")
    r.add_argument("--signing-key-file", help="signing key (the manifest is re-signed)")
    r.add_argument("--lock-timeout", type=float, default=600.0, help="seconds to wait for a running build")
    r.set_defaults(func=cmd_rekey)

    rl = sub.add_parser("release", help="bundle, sign and publish each target whose tests passed (docs/release.md)")
    rl.add_argument("-c", "--config", default=config.DEFAULT_FILE, help="targets.toml (default: %(default)s)")
    rl.add_argument("-t", "--target", action="append", help="target name or glob (repeatable; default: all)")
    rl.add_argument("--to", help="a directory (default: dist/release; one subdirectory per target) or "
                                 "oci://host[:port]/repo[:tag] ({target} and {version} are filled in; the default "
                                 "tag is {version}-{target})")
    rl.add_argument("--dist", help="build output directory (default: dist/ beside targets.toml)")
    rl.add_argument("--force", action="store_true",
                    help="release even where tests failed, were skipped or are stale (recorded in the provenance)")
    rl.add_argument("--signing-key-file", help="signing key (else $ORTBUILD_SIGNING_KEY / _FILE)")
    rl.add_argument("--allow-development-key", action="store_true",
                    help="release even when the signing key, or a key an artifact was built with, is a development "
                         "key (`keygen --dev`), with a WARNING: never ship such a release")
    rl.add_argument("--lock-timeout", type=float, default=600.0, help="seconds to wait for a running build")
    rl.add_argument("--json", action="store_true")
    rl.set_defaults(func=cmd_release)

    def checks(sp: argparse.ArgumentParser) -> None:
        sp.add_argument("--public-key", help="the publisher's signing.pub (else $ORTBUILD_PUBLIC_KEY_FILE, else "
                                             "the configured signing key's public half)")
        sp.add_argument("--key-file", help="decryption key for the golden test (else $ORTBUILD_KEY / _FILE)")
        sp.add_argument("--no-run", action="store_true",
                        help="check signatures, digests and provenance only; do not run the golden test")
        sp.add_argument("--json", action="store_true")

    v = sub.add_parser("verify", help="verify a release directory, bundle or oci:// reference")
    v.add_argument("bundle", metavar="BUNDLE_OR_REF")
    checks(v)
    v.set_defaults(func=cmd_verify)

    pu = sub.add_parser("pull", help="fetch a release from an OCI registry, verify it, extract the bundle")
    pu.add_argument("ref", metavar="REF", help="oci://host[:port]/repo:tag")
    pu.add_argument("--to", help="directory for the verified bundle (default: ./<bundle name>)")
    checks(pu)
    pu.set_defaults(func=cmd_pull)

    mx = sub.add_parser("matrix", help="print a GitHub Actions matrix: one entry per target with its runner labels")
    mx.add_argument("-c", "--config", default=config.DEFAULT_FILE, help="targets.toml (default: %(default)s)")
    mx.add_argument("-t", "--target", action="append", help="target name or glob (repeatable; default: all)")
    mx.add_argument("--compact", action="store_true", help="one line (for $GITHUB_OUTPUT)")
    mx.set_defaults(func=cmd_matrix)

    s = sub.add_parser("schema", help="print the JSON Schema of targets.toml")
    g = s.add_mutually_exclusive_group()
    g.add_argument("--write", action="store_true", help="regenerate the shipped schema and docs reference")
    g.add_argument("--check", action="store_true", help="fail if they are out of date")
    s.set_defaults(func=cmd_schema)
    return p


def main(argv: Sequence[str] | None = None) -> int:
    # ONNX Runtime's telemetry event store stays untouched by every session of this process and its workers and
    # probes (unless the user set the variable); runtime.import_ort() also disables the events (API use)
    os.environ.setdefault("ORT_DISABLE_TELEMETRY", "1")
    args = parser().parse_args(argv)
    try:
        code: int = args.func(args)
        sys.stdout.flush()  # here, so that a reader that went away (`ortbuild matrix | head -1`) is seen below
        return code
    except BrokenPipeError:
        # the reader of stdout closed the pipe: what it did not read is nobody's, and nothing is wrong with ortbuild.
        # Point stdout at /dev/null so the interpreter's own flush at exit does not fail again; exit as a process
        # killed by SIGPIPE would (128 + 13), quietly, like other command-line tools in a pipeline
        with contextlib.suppress(OSError, ValueError):
            devnull = os.open(os.devnull, os.O_WRONLY)
            os.dup2(devnull, sys.stdout.fileno())
            os.close(devnull)
        return 141
    except OrtbuildError as e:
        if args.debug:
            raise
        print(e.render(), file=sys.stderr)
        return e.exit_code
    except KeyboardInterrupt:
        print("ortbuild: interrupted", file=sys.stderr)
        return 130
    except Exception as e:
        if args.debug:
            raise
        print(f"ortbuild: internal error: {type(e).__name__}: {e}\n  hint: rerun with --debug and report "
              "the traceback", file=sys.stderr)
        return 1
