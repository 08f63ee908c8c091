"""Run each job's pipeline of steps and publish dist/<target>/<model>/{artifact, manifest.json}.

A job runs in three phases (see PIPELINE, the one place a step joins):
  prepare  check the source and its data, compute the build key (always)
  build    make and publish the artifact, in a private temp dir (skipped when the published one is reused)
  verify   checks on the published artifact (always: on fresh and reused artifacts alike)
"""

from __future__ import annotations

import dataclasses
import hashlib
import importlib.metadata as md
import json
import os
import sys
import time
import traceback
import typing
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal, TextIO

from packaging.requirements import Requirement

from ortbuild import __version__, modelfiles, paths, runtime, workspace
from ortbuild.artifact import keys, loaders, manifest
from ortbuild.errors import (
    ArtifactError,
    ConfigError,
    KeyMissing,
    OrtbuildError,
    StepError,
    Tampered,
    WrongKey,
    first_line,
)
from ortbuild.project import options
from ortbuild.project.config import Project, Provider, Target
from ortbuild.project.plan import Job

if TYPE_CHECKING:  # the steps import onnx, numpy and the quantizers: a no-op build never needs them
    import onnx

    from ortbuild.pipeline.steps import check, compile, fusion, optimize, precision, reload
    from ortbuild.project import data

# statuses, and whether each counts as a usable artifact
BUILT, PORTABLE, UP_TO_DATE, SKIPPED, FAILED = "built", "portable", "up-to-date", "skipped", "failed"


@dataclass
class JobResult:
    target: str
    model: str
    status: str
    reason: str = ""
    precision: str = ""
    level: str = ""
    artifact: str | None = None
    size: int | None = None
    source_size: int | None = None
    seconds: float = 0.0
    step: str = ""                   # the step running last: the one that failed, for a failed job
    steps: dict[str, float] = field(default_factory=dict)
    converted: float | None = None   # the share of the float weights the precision step converted
    notes: list[str] = field(default_factory=list)
    error: OrtbuildError | None = None
    debug: str = ""                  # the traceback behind a StepError (shown with --debug)

    def as_json(self) -> dict[str, Any]:
        out = {k: v for k, v in self.__dict__.items() if k not in ("error", "debug")}
        if self.error is not None:
            out["error"] = {"class": type(self.error).__name__, "exit_code": self.error.exit_code,
                            "message": self.error.message, "hint": self.error.hint}
        return out


class Progress:
    """Progress on stderr. Plain lines (`[target/model] step`) in CI and pipes; on a terminal, a live table of
    the running jobs (rich) above which finished jobs scroll."""

    def __init__(self, stream: TextIO | None = None, quiet: bool = False, live: bool | None = None) -> None:
        self.stream = stream or sys.stderr
        self.quiet = quiet
        self.live = (not quiet and self.stream.isatty() and os.environ.get("TERM") != "dumb"
                     and "CI" not in os.environ) if live is None else live
        self._rows: dict[str, tuple[str, float]] = {}  # running job -> (its current step, since)
        self._display: Any = None

    def __enter__(self) -> Progress:
        if self.live:
            from rich.console import Console
            from rich.live import Live

            self._display = Live(self._table(), console=Console(file=self.stream), refresh_per_second=4,
                                 transient=True, get_renderable=self._table)
            self._display.__enter__()
        return self

    def __exit__(self, *exc: object) -> None:
        if self._display is not None:
            self._display.__exit__(None, None, None)
            self._display = None

    def _table(self) -> Any:
        from rich.table import Table

        table = Table(box=None, show_header=False, pad_edge=False)
        now = time.monotonic()
        for job, (step, since) in sorted(self._rows.items()):
            table.add_row(f"[bold]{job}[/]", step, f"{now - since:5.1f}s")
        return table

    def __call__(self, job: str, message: str) -> None:
        if self.quiet:
            return
        if self._display is None:
            print(f"[{job}] {message}", file=self.stream, flush=True)
            return
        final = message.split(":", 1)[0] in (BUILT, PORTABLE, "FAILED", "skipped") or message.startswith("up to date")
        if final:
            self._rows.pop(job, None)
            self._display.console.print(f"[{job}] {message}", highlight=False, markup=False)
        else:
            self._rows[job] = (message, self._rows.get(job, ("", time.monotonic()))[1])


def key_parts(job: Job, sources: dict[str, str], inputs_sha: str, calib_sha: str | None, flavor: runtime.Flavor,
              missing: dict[str, str], sealing: dict[str, Any], *, plugins: dict[str, dict[str, str]],
              libraries: Sequence[runtime.CustomOpLibrary]) -> dict[str, Any]:
    """Everything the artifact depends on, by name (plan says which one changed). `sources`: the model's
    files (ModelFiles.digests(): `source`, and `source:<location>` for each external-data file)."""
    parts: dict[str, Any] = {
        **sources, "inputs": inputs_sha,
        # only the precisions that read calibration data depend on it
        "calibration": calib_sha if job.settings.rule.needs_calibration else None,
        **{f"settings.{k}": v for k, v in job.settings.as_json().items()},
        "runtime": flavor.as_json(), "onnx": md.version("onnx"), "ortbuild": __version__,
        "loader_templates": loaders.templates_digest(),  # a changed loader rebuilds, even within one ortbuild version
        "plugins": plugins,
        "custom_ops": [lib.as_json() for lib in libraries],
        "missing_providers": sorted(missing),
        "simd_level": runtime.simd_level() if options.LEVEL_RULES[job.settings.optimization].nchwc else None,
        "sealing": sealing,  # key ids (never keys) and whether encryption is deterministic
    }
    return parts




def plugin_versions(target: Target) -> dict[str, dict[str, str]]:
    """The target's plugin EPs as installed here, by provider: package, import name, version, devices."""
    out = {}
    for req in target.plugins:
        plugin = options.PLUGINS[Requirement(req).name.lower()]
        try:
            version = md.version(plugin.package)
        except md.PackageNotFoundError:
            version = "not installed"
        out[plugin.provider] = {"package": plugin.package, "module": plugin.module, "version": version,
                                "devices": plugin.devices}
    return out


def _sha(value: Any) -> str:
    return hashlib.sha256(json.dumps(value, sort_keys=True).encode()).hexdigest()


def build_key(parts: dict[str, Any]) -> tuple[str, dict[str, str]]:
    """The build key (equal keys: the published artifact can be reused) and a short digest of each part."""
    return _sha(parts), {k: _sha(v)[:16] for k, v in parts.items()}


def changed_parts(recorded: dict[str, str], now: dict[str, str]) -> list[str]:
    """The names of the build key's parts that differ between a manifest and now."""
    return sorted(k for k in {*recorded, *now} if recorded.get(k) != now.get(k))


def _digest(path: Path | None) -> str | None:
    if path is None:
        return None
    if path.is_dir():
        h = hashlib.sha256()
        for f in sorted(path.rglob("*.pb")):
            h.update(f.relative_to(path).as_posix().encode() + b"\0" + f.read_bytes())
        return h.hexdigest()
    return manifest.sha256_file(path)


@dataclass
class JobContext:
    """What the steps of one job share: each step reads what earlier ones left and adds its own result."""

    job: Job
    project: Project
    out_dir: Path
    res: JobResult
    work: Path | None = None                     # the private temp dir of the build phase
    files: modelfiles.ModelFiles | None = None   # the source model's files, hashed for the build key
    src: check.CheckResult | None = None
    feed: data.Feed = field(default_factory=dict)
    samples: list[data.Feed] | None = None
    usable: list[Provider] = field(default_factory=list)
    missing: dict[str, str] = field(default_factory=dict)
    flavor: runtime.Flavor | None = None
    plugins: dict[str, dict[str, str]] = field(default_factory=dict)  # plugin_versions(): as installed here
    libraries: list[runtime.CustomOpLibrary] = field(default_factory=list)  # the custom-op libraries found here
    key: str = ""
    key_parts: dict[str, str] = field(default_factory=dict)  # digest per part of the key
    inputs_sha: str = ""
    fused: fusion.FusionResult | None = None     # [targets.X.fusion] on: what the precision step reads
    prec: precision.PrecisionResult | None = None
    opt: optimize.OptimizeResult | None = None
    compiled: compile.CompileResult | None = None  # compiling providers: the EPContext model
    rel: reload.ReloadResult | None = None
    # each artifact file, sealed into a partial file in out_dir (renamed into place by the package step)
    sealed: list[tuple[manifest.ArtifactFile, Path]] = field(default_factory=list)
    external: str = ""                           # why the artifact's weights are external data ("": they are not)
    loader_files: dict[str, str] = field(default_factory=dict)
    manifest: manifest.Manifest | None = None    # the published one (fresh or reused)
    enc_key: keys.EncryptionKey | None = None
    sign_key: keys.SigningKey | None = None


Phase = Literal["prepare", "build", "verify"]


@dataclass(frozen=True)
class Step:
    name: str
    phase: Phase
    run: Callable[[JobContext], None]
    describe: Callable[[JobContext], str]
    on_reuse: bool = True            # verify steps: also on a reused artifact (False: only on a fresh one)
    applies: Callable[[JobContext], bool] | None = None  # None: always; else the step runs (and shows) when True


def _check(ctx: JobContext) -> None:
    from ortbuild.pipeline.steps import check
    from ortbuild.project import data

    job, s = ctx.job, ctx.job.settings
    src = ctx.src = check.run(job.model.path, ctx.files)
    ctx.res.source_size = src.size
    if s.format == "ort" and modelfiles.needs_external_data(src.files.weights_size):
        raise ConfigError(str(ctx.project.file), f"targets.{job.target.name}.format",
                          f"model '{job.model.name}' holds {src.files.weights_size / (1 << 30):.2f} GiB of weights: "
                          "format 'ort' is one flatbuffer, limited to 2 GiB, and cannot hold external data",
                          'use format = "onnx" for this target (external data is then written for it)')
    for key, message in check.settings_problems(src.model, src.signature, s):
        raise ConfigError(str(ctx.project.file), f"targets.{job.target.name}.{key}",
                          f"{message} (model '{job.model.name}')",
                          "ONNX Runtime's tools ignore such names silently, so ortbuild refuses them")
    names = [i["name"] for i in src.signature["inputs"]]
    ctx.feed = data.load_feed(job.model.inputs, names)
    data.check_feed(ctx.feed, src.signature, str(job.model.inputs))
    if s.rule.needs_calibration and job.model.calibration is not None:
        ctx.samples = data.load_samples(job.model.calibration, names)
        for sample in ctx.samples:
            data.check_feed(sample, src.signature, str(job.model.calibration))


def _fusion(ctx: JobContext) -> None:
    """ONNX Runtime's transformer optimizer on the source; the precision step then reads the fused graph."""
    from ortbuild.pipeline.steps import fusion

    assert ctx.src is not None and ctx.work is not None
    s, files, job = ctx.job.settings, ctx.src.files, ctx.job
    if ctx.missing:  # a portable build holds standard ONNX ops only: the fusion belongs where the providers run
        ctx.fused = fusion.skipped(ctx.src.model, s.fusion, job.model.path.resolve(),
                                   f"a portable build holds standard ONNX ops only ({', '.join(ctx.missing)} cannot "
                                   "run here); the build where the target's providers run fuses the model")
        return
    missing = fusion.unknown_here(s.fusion.model_type)
    if missing:
        raise ConfigError(str(ctx.project.file), f"targets.{job.target.name}.fusion.model_type", missing,
                          "pick a model type this runtime offers, or pin the runtime ortbuild's choices come from "
                          "(onnxruntime 1.31.1)")
    external = s.external_data or files.has_external_data or modelfiles.needs_external_data(files.weights_size)
    ctx.fused = fusion.run(job.model.path, ctx.src.model, s.fusion, ctx.work, external=external)
    for key, node in fusion.lost_nodes(s, ctx.fused.model):
        raise ConfigError(str(ctx.project.file), f"targets.{job.target.name}.{key}",
                          f"node '{node}' of model '{job.model.name}' was fused into another node by fusion "
                          f"'{s.fusion.model_type}': the precision step would ignore the name silently",
                          "name the fused node instead (`ortbuild inspect` and the manifest's fusion record say what "
                          "was fused), or set fusion = { model_type = \"off\" } for this model")
    ctx.fused.notes.extend(fusion.precision_notes(s, ctx.fused.fused_ops))


def _precision_source(ctx: JobContext) -> tuple[Path, onnx.ModelProto]:
    """The model the precision step reads: the fused one when the fusion step made one, else the source."""
    assert ctx.src is not None
    if ctx.fused is not None:
        return ctx.fused.path, ctx.fused.model
    return ctx.job.model.path, ctx.src.model


def _precision(ctx: JobContext) -> None:
    from ortbuild.pipeline.steps import check, precision

    assert ctx.src is not None and ctx.work is not None
    s, files = ctx.job.settings, ctx.src.files
    # intermediates keep the weights as external data when the source does, or could not be one file
    external = s.external_data or files.has_external_data or modelfiles.needs_external_data(files.weights_size)
    source, graph = _precision_source(ctx)  # the fused model when the fusion step made one
    ctx.prec = precision.run(source, graph, s.precision, s.typed_precision_options(), ctx.work,
                             ctx.samples, external=external)
    if source.is_relative_to(ctx.work.resolve()) and ctx.prec.path != source:
        precision.remove_model(source)  # the fused model, read: the temp space holds at most two models at once
    if ctx.prec.changed is not None:
        ctx.res.converted = ctx.prec.changed.converted
        little = precision.too_little(s.precision, ctx.prec.changed, s.typed_precision_options())
        if little:
            raise StepError(ctx.job.target.name, ctx.job.model.name, "precision", *little)
    if ctx.prec.path != ctx.job.model.path.resolve():
        check.run(ctx.prec.path)  # every precision output must pass the full checker


def _optimize(ctx: JobContext) -> None:
    from ortbuild.pipeline.steps import optimize
    from ortbuild.pipeline.steps.precision import remove_model

    assert ctx.prec is not None and ctx.work is not None
    s = ctx.job.settings
    prec = modelfiles.of(ctx.prec.path, hashed=False)
    if s.external_data:
        ctx.external = "external_data = true"
    elif s.format != "ort" and modelfiles.needs_external_data(prec.weights_size):
        ctx.external = (f"its weights ({prec.weights_size / (1 << 30):.2f} GiB) would pass protobuf's 2 GiB limit "
                        "for one file")
    elif s.format != "ort" and prec.has_external_data:  # ORT keeps it so (and never re-serializes the weights)
        ctx.external = "the source model keeps its weights as external data"
    ctx.opt = optimize.run(ctx.prec.path, s, ctx.usable, ctx.missing, ctx.work, external=bool(ctx.external))
    ctx.res.level = ctx.opt.applied
    if ctx.prec.path.is_relative_to(ctx.work):  # the temp space holds at most two models at once
        remove_model(ctx.prec.path)


def _plugins(ctx: JobContext) -> dict[str, options.PluginEP]:
    """The target's plugin EPs, by the provider each registers."""
    return {p.name: plugin for p in ctx.job.settings.providers if (plugin := ctx.job.target.plugin_for(p.name))}


def _compile_for(ctx: JobContext) -> Provider | None:
    from ortbuild.pipeline.steps import compile

    return None if ctx.missing else compile.provider_to_compile(ctx.usable, _plugins(ctx))


def _compile(ctx: JobContext) -> None:
    from ortbuild.pipeline.steps import compile

    assert ctx.opt is not None and ctx.work is not None
    provider = _compile_for(ctx)
    if provider is None:
        return
    ctx.compiled = compile.run(ctx.opt.path, ctx.job.settings, provider, _plugins(ctx), ctx.work)


def _artifact_path(ctx: JobContext) -> Path:
    """The model the artifact holds: the compiled EPContext model where there is one, else the optimized one."""
    assert ctx.opt is not None
    return ctx.compiled.path if ctx.compiled is not None and ctx.compiled.path is not None else ctx.opt.path


def _precompiled(ctx: JobContext) -> bool:
    return ctx.compiled is not None and ctx.compiled.path is not None


def _run_on(ctx: JobContext) -> list[Provider]:
    # a portable build is proven on the CPU of this runtime; otherwise on the target's providers
    return [Provider("CPUExecutionProvider")] if ctx.missing else ctx.usable


def _reload(ctx: JobContext) -> None:
    from ortbuild.pipeline.steps import reload

    assert ctx.opt is not None
    ctx.rel = reload.run(_artifact_path(ctx), ctx.job.settings, _run_on(ctx), ctx.feed, _plugins(ctx),
                         precompiled=_precompiled(ctx))


def deterministic() -> bool:
    """Encryption is deterministic when the build asks for reproducible output (SOURCE_DATE_EPOCH set)."""
    return "SOURCE_DATE_EPOCH" in os.environ


def _seal(ctx: JobContext) -> None:
    """Encrypt every file of the artifact (the graph and its external data), streaming each from the private temp
    dir into a partial file beside the published artifact: one chunk in memory at a time, hashed as written."""
    import onnx

    from ortbuild.artifact import container

    assert ctx.opt is not None and ctx.work is not None
    s = ctx.job.settings
    main = "model.ort" if s.format == "ort" else "model.onnx"
    artifact = _artifact_path(ctx)
    files = modelfiles.of(artifact, hashed=False)
    if ctx.external and not files.has_external_data:  # a compiled (EPContext) model: split its data off here
        folder = ctx.work / "external"
        folder.mkdir()
        model = onnx.load(str(artifact))
        onnx.save_model(model, str(folder / main), save_as_external_data=True, all_tensors_to_one_file=True,
                        location=f"{main}.data", size_threshold=1024)
        del model
        files = modelfiles.of(folder / main, hashed=False)
    ctx.out_dir.mkdir(parents=True, exist_ok=True)
    ctx.sealed = []
    for f in files.files:
        location = f.location or main
        name = f"{location}.enc" if s.encrypt else location
        partial = manifest.partial_file(ctx.out_dir / name)
        with open(partial, "wb") as out:
            if s.encrypt:
                assert ctx.enc_key is not None
                sha, size = container.encrypt_file(f.path, out, ctx.enc_key.secret, deterministic=deterministic())
            else:  # encrypt = false: the plaintext, copied and hashed in one pass
                h, size = hashlib.sha256(), 0
                with open(f.path, "rb") as src:
                    while piece := src.read(1 << 20):
                        h.update(piece)
                        out.write(piece)
                        size += len(piece)
                sha = h.hexdigest()
            out.flush()
            os.fsync(out.fileno())
        entry = manifest.ArtifactFile(name=name, role="external_data" if f.location else "model",
                                      location=location, sha256=sha, size=size, encrypted=s.encrypt)
        ctx.sealed.append((entry, partial))


def _loaders(ctx: JobContext) -> None:
    from ortbuild.artifact import loaders

    ctx.manifest = _manifest(ctx)
    ctx.loader_files = loaders.render(ctx.manifest, ctx.job.target.runtime_text)
    ctx.manifest = dataclasses.replace(ctx.manifest, loaders=loaders.describe(ctx.loader_files, ctx.manifest))


def _package(ctx: JobContext) -> None:
    assert ctx.manifest is not None and ctx.sign_key is not None
    ctx.res.artifact = str(_publish(ctx.out_dir, ctx.sealed, ctx.loader_files, ctx.manifest, ctx.sign_key,
                                    ctx.libraries))


def _integrity(ctx: JobContext) -> None:
    """The published artifact still matches its signed manifest (fresh or reused)."""
    assert ctx.sign_key is not None
    ctx.manifest = manifest.trusted(ctx.out_dir, ctx.sign_key.public_raw)


def _python_loader(ctx: JobContext) -> None:
    """Open the published artifact through its generated Python loader and run the golden inputs.

    Fresh builds must reproduce the unencrypted artifact's outputs (reload step); where the target's
    providers cannot run here, the loader must refuse to load it (no silent fallback) after verifying it.
    """
    import numpy as np

    from ortbuild.artifact import loaders

    assert ctx.manifest is not None
    module: Any = loaders.import_python_loader(ctx.out_dir / loaders.LOADER_DIR / loaders.PYTHON)
    secret = ctx.enc_key.secret if ctx.enc_key is not None else None
    if ctx.missing:
        module.verify(ctx.out_dir)
        try:
            module.load(key=secret, folder=ctx.out_dir)
        except module.ProviderUnavailableError:
            return
        raise ArtifactError(f"{ctx.job.name}: the Python loader opened an artifact whose providers cannot run "
                            "here: it must refuse (no silent fallback)")
    model = module.load(key=secret, folder=ctx.out_dir)
    got = model.run(ctx.feed)
    expected = [(o["name"], o["dtype"], o["shape"]) for o in ctx.manifest.golden_run.outputs]
    seen = [(name, str(np.asarray(v).dtype), list(np.asarray(v).shape)) for name, v in got.items()]
    if seen != expected:
        raise ArtifactError(f"{ctx.job.name}: the Python loader's outputs {seen} differ from the build's {expected}")
    if ctx.rel is not None:
        for (name, value), ref in zip(got.items(), ctx.rel.values, strict=True):
            a, b = np.asarray(value), np.asarray(ref)
            same = np.array_equal(a, b) if a.dtype.kind not in "fc" else np.allclose(a, b, rtol=1e-5, atol=1e-6,
                                                                                  equal_nan=True)  # NaN golden inputs
            if not same:
                raise ArtifactError(f"{ctx.job.name}: output '{name}' through the Python loader differs from the "
                                    "unencrypted artifact's")


# The pipeline: a new step joins here, in its phase, and nowhere else.
PIPELINE: tuple[Step, ...] = (
    Step("check", "build", _check, lambda c: f"check {c.job.model.path.name} and its data"),
    Step("fusion", "build", _fusion, lambda c: f"fusion {c.job.settings.fusion.model_type} (ONNX Runtime's transformer "
         "optimizer)", applies=lambda c: c.job.settings.fusion.enabled),
    Step("precision", "build", _precision, lambda c: f"precision {c.job.settings.precision}"),
    Step("optimize", "build", _optimize,
         lambda c: f"optimize level={c.job.settings.optimization} providers={[p.name for p in c.usable] or '-'}"),
    Step("compile", "build", _compile, lambda c: f"compile for {p.name} ahead of time (EPContext)"
         if (p := _compile_for(c)) else "compile: no provider compiles ahead of time"),
    Step("reload", "build", _reload,
         lambda c: f"reload (optimizations disabled) and run on {[p.name for p in _run_on(c)]}"),
    Step("encrypt", "build", _seal, lambda c: "encrypt (container v1, AES-256-GCM)" if c.job.settings.encrypt
         else "no encryption (encrypt = false)"),
    Step("loaders", "build", _loaders, lambda c: "generate the Python and Node.js loaders"),
    Step("package", "build", _package, lambda c: f"sign and publish into {c.out_dir}"),
    Step("integrity", "verify", _integrity, lambda c: "verify the signature and digests of the published artifact"),
    Step("loader", "verify", _python_loader, lambda c: "open it through the generated Python loader",
         on_reuse=False),  # a reused artifact passed it when built; its integrity is checked every time
)


def _manifest(ctx: JobContext) -> manifest.Manifest:
    import onnx

    from ortbuild.artifact import container
    from ortbuild.pipeline.steps import optimize

    job, src, prec, opt, rel, flavor = ctx.job, ctx.src, ctx.prec, ctx.opt, ctx.rel, ctx.flavor
    assert src is not None and prec is not None and opt is not None and rel is not None and flavor is not None
    assert ctx.sign_key is not None
    opt_notes = [n for n in opt.notes if not (_precompiled(ctx) and optimize.COMPILED_AT_LOAD in n)]
    split = [f"weights written as external data (model.onnx.data): {ctx.external}"] \
        if ctx.external and not job.settings.external_data and not src.files.has_external_data else []
    changed = [f"precision {prec.precision}: {prec.changed.summary()}"] if prec.changed else []
    ctx.res.notes = changed + prec.notes + split + opt_notes + (ctx.compiled.notes if ctx.compiled else [])
    if ctx.fused is not None:  # the fusion step ran first: its notes come first
        ctx.res.notes = ctx.fused.notes + ctx.res.notes
    size = sum(f.size for f, _ in ctx.sealed)
    main = next(f for f, _ in ctx.sealed if f.role == "model")
    root = ctx.project.root
    rel_path = job.model.path.resolve().relative_to(root.resolve()) \
        if job.model.path.resolve().is_relative_to(root.resolve()) else job.model.path
    enc = ctx.enc_key
    return manifest.Manifest(
        project=manifest.ProjectInfo(ctx.project.name, ctx.project.version),
        epoch=ctx.project.epoch,
        target=job.target.name,
        model=job.model.name,
        status="portable" if ctx.missing else "complete",
        missing_providers=ctx.missing,
        source=manifest.Source(path=str(rel_path), sha256=src.sha256, size=src.size, ir_version=src.ir_version,
                               opsets=src.opsets, files=[f.as_json() for f in src.files.files]),
        artifact=manifest.Artifact(file=main.name, format=job.settings.format, sha256=main.sha256, size=size,
                                   size_ratio=round(size / src.size, 4), files=[f for f, _ in ctx.sealed],
                                   external_data=ctx.external),
        precision=manifest.PrecisionInfo(prec.precision, prec.options,
                                         prec.changed.as_json() if prec.changed else None),
        providers=[p.as_json() for p in job.settings.providers],
        session=_session_json(ctx),
        free_dimensions=dict(job.settings.free_dimensions),
        optimization=manifest.Optimization(requested=opt.requested, applied=opt.applied,
                                           portable=opt.portable and not _precompiled(ctx),
                                           tied_to=_tied_to(ctx), optimized_with=opt.providers,
                                           op_domains=opt.op_domains, disabled_optimizers=opt.disabled_optimizers,
                                           inflation=opt.inflation),
        io=src.signature,
        golden_run=manifest.GoldenRun(providers=rel.providers, outputs=rel.outputs, inputs_sha256=ctx.inputs_sha),
        versions={"ortbuild": __version__, "onnx": onnx.__version__, "onnxruntime": flavor.as_json()},
        build_machine=runtime.fingerprint(),
        build_key=ctx.key,
        build_inputs=ctx.key_parts,
        created=manifest.timestamp(),
        encryption=manifest.Encryption(
            container="ortbuild-container-v1", algorithm="AES-256-GCM", key_id=enc.key_id,
            chunk_size=1 << container.DEFAULT_CHUNK_LOG2, deterministic=deterministic(),
            development_key=enc.development) if job.settings.encrypt and enc is not None else None,
        signing=ctx.sign_key.info(),
        notes=ctx.res.notes,
        plugins=ctx.plugins,
        custom_ops=[lib.as_json() for lib in ctx.libraries],
        compiled=ctx.compiled.as_json() if ctx.compiled is not None and ctx.compiled.path is not None else None,
        fusion=manifest.Fusion(**ctx.fused.as_json()) if ctx.fused is not None else None,
    )


def _session_json(ctx: JobContext) -> dict[str, Any]:
    """The session options loaders use: the target's, plus disable_model_compile for a compiled artifact."""
    from ortbuild.pipeline.steps import reload

    out = ctx.job.settings.session.as_json()
    if _precompiled(ctx):
        out["config"] = {**out["config"], reload.PRECOMPILED_CONFIG: "1"}
    return out


def _tied_to(ctx: JobContext) -> dict[str, Any]:
    """What the artifact needs besides ONNX Runtime: the optimize step's ties, and for a compiled artifact its
    provider and the device (and CPU) it was compiled for: a compiled blob is native code for them."""
    assert ctx.opt is not None
    tied = dict(ctx.opt.tied_to)
    if _precompiled(ctx):
        assert ctx.compiled is not None
        tied["providers"] = sorted({*tied.get("providers", []), ctx.compiled.provider})
        tied["compiled_for"] = {"provider": ctx.compiled.provider, "device": ctx.compiled.device,
                                "cpu": runtime.cpu_model(), "simd_level": runtime.simd_level()}
    return tied


def _publish(out_dir: Path, sealed: list[tuple[manifest.ArtifactFile, Path]], loader_files: dict[str, str],
             m: manifest.Manifest, sign_key: keys.SigningKey, libraries: Sequence[runtime.CustomOpLibrary]) -> Path:
    from ortbuild.artifact import loaders

    files: dict[str, bytes | Path] = {f.name: partial for f, partial in sealed}
    files.update({f"{loaders.LOADER_DIR}/{name}": code.encode() for name, code in loader_files.items()})
    for lib in libraries:  # a path library ships beside the artifact
        if (name := lib.as_json().get("file")) is not None:
            files[name] = Path(lib.path).read_bytes()
    manifest.write_signed(out_dir, files, m, sign_key.sign, prune=True)
    return out_dir / m.artifact.file


class Builder:
    def __init__(self, project: Project, dist: Path, *, force: bool = False, repair: bool = False,
                 progress: Callable[[str, str], None] | None = None,
                 enc_key: keys.EncryptionKey | None = None, sign_key: keys.SigningKey | None = None) -> None:
        self.project = project
        self.dist = dist
        self.force = force
        self.repair = repair  # rebuild a TAMPERED artifact (and say what was replaced) instead of refusing
        self.progress = progress or Progress()
        self._probes: dict[tuple[str, str, str], str | None] = {}
        self._digests: dict[tuple[str, int, int], str | None] = {}
        self._models: dict[tuple[str, int, int], tuple[modelfiles.ModelFiles, list[tuple[str, int, int]]]] = {}
        self.enc_key = enc_key or keys.encryption_key()
        self.sign_key = sign_key or keys.signing_key()

    def check_keys(self, buildable: Sequence[Job]) -> None:
        """A build without the keys it needs fails before it starts, with the command that makes them."""
        if buildable and self.sign_key is None:
            raise KeyMissing("no signing key: every artifact is signed (ORTBUILD_SIGNING_KEY, "
                             "ORTBUILD_SIGNING_KEY_FILE or --signing-key-file)", f"make keys: `{keys.MAKE_KEYS}`")
        needs = sorted({j.target.name for j in buildable if j.settings.encrypt})
        if needs and self.enc_key is None:
            raise KeyMissing(f"no encryption key, and {', '.join(needs)} encrypt their artifacts (ORTBUILD_KEY, "
                             "ORTBUILD_KEY_FILE or --key-file)",
                             f"make keys: `{keys.MAKE_KEYS}`, or set encrypt = false on a target to opt out")

    def _digest(self, path: Path | None) -> str | None:
        """_digest(), once per file and run: models and data are shared by many jobs (and a stale job's key
        is computed twice: to find it stale, then to build it)."""
        if path is None:
            return None
        st = path.stat()
        key = (str(path), st.st_size, st.st_mtime_ns)
        if key not in self._digests:
            self._digests[key] = _digest(path)
        return self._digests[key]

    def model_files(self, path: Path) -> modelfiles.ModelFiles:
        """modelfiles.of(), once per run while neither the graph file nor any of its data files changed."""
        key = modelfiles.stat_key(path)
        known = self._models.get(key)
        if known is not None and all(modelfiles.stat_key(Path(f[0])) == f for f in known[1]):
            return known[0]
        files = modelfiles.of(path, where="models")
        self._models[key] = (files, [modelfiles.stat_key(f.path) for f in files.external])
        return files

    def _probe(self, p: Provider, target: Target) -> str | None:
        plugin = target.plugin_for(p.name)
        key = (p.name, json.dumps(dict(p.options), sort_keys=True), plugin.package if plugin else "")
        if key not in self._probes:
            self._probes[key] = runtime.cached_probe(p, plugin, refresh=self.force)
        return self._probes[key]

    def run(self, jobs: Sequence[Job], workers: int = 1) -> list[JobResult]:
        """Build the jobs, `workers` at a time (in worker processes: the quantizers change the process's
        directory and temp dir, so jobs cannot share one). Results come back in the jobs' order; a failing
        job is reported in its result and stops nothing else."""
        targets = {j.target.name: j.target for j in jobs}
        problems = {name: runtime.runtime_problem(t) for name, t in targets.items()}
        buildable = [j for j in jobs if problems[j.target.name] is None]
        self.check_keys(buildable)
        for j in buildable:  # probe once, here: workers get the answers (a probe opens ORT sessions)
            for p in j.settings.providers:
                self._probe(p, j.target)
        results: dict[int, JobResult] = {}
        for i, job in enumerate(jobs):
            if problems[job.target.name]:
                results[i] = JobResult(job.target.name, job.model.name, SKIPPED,
                                       reason=problems[job.target.name] or "", precision=job.settings.precision)
                self.progress(job.name, f"skipped: {results[i].reason}")
        for i, job in enumerate(jobs):  # up-to-date jobs are settled here, cheaply (no model is parsed)
            if i not in results and not self.force and (reused := self.run_job(job, reuse_only=True)) is not None:
                results[i] = reused
        todo = [(i, job) for i, job in enumerate(jobs) if i not in results]
        if workers <= 1 or len(todo) <= 1:
            for i, job in todo:
                results[i] = self.run_job(job)
        else:
            from ortbuild.pipeline.parallel import run_jobs

            results.update(run_jobs(self, todo, workers))
        return [results[i] for i in range(len(jobs))]

    def _run_phase(self, ctx: JobContext, phase: Phase, reused: bool = False) -> None:
        """Run the phase's steps in order: announce each, remember it (a failure names it), time it."""
        for step in PIPELINE:
            if step.phase != phase or (reused and not step.on_reuse) or (step.applies and not step.applies(ctx)):
                continue
            self.progress(ctx.job.name, step.describe(ctx))
            ctx.res.step = step.name
            t = time.perf_counter()
            step.run(ctx)
            ctx.res.steps[step.name] = time.perf_counter() - t

    def _prepare(self, ctx: JobContext) -> None:
        """The build key, from digests alone (no model is parsed): usable providers, runtime, data, keys."""
        job = ctx.job
        ctx.usable = [p for p in job.settings.providers if self._probe(p, job.target) is None]
        ctx.missing = {p.name: reason for p in job.settings.providers if (reason := self._probe(p, job.target))}
        ctx.flavor = runtime.installed_flavor()
        assert ctx.flavor is not None  # runtime_problem() said this environment has the right flavor
        ctx.inputs_sha = self._digest(job.model.inputs) or ""
        ctx.enc_key = self.enc_key if job.settings.encrypt else None
        ctx.sign_key = self.sign_key
        assert ctx.sign_key is not None  # check_keys()
        # the encryption key's id is not part of the key: `ortbuild rekey` re-wraps an artifact under a new key
        # without a rebuild, and the reuse check refuses an artifact sealed for another key (WrongKey)
        sealing = {"encrypted": ctx.enc_key is not None, "signing_key_id": ctx.sign_key.key_id,
                   "deterministic": deterministic(), "epoch": self.project.epoch}
        ctx.plugins = plugin_versions(job.target)
        ctx.libraries = runtime.custom_op_libraries(job.settings.custom_ops)
        ctx.files = self.model_files(job.model.path)
        parts = key_parts(job, ctx.files.digests(), ctx.inputs_sha,
                          self._digest(job.model.calibration), ctx.flavor, ctx.missing, sealing,
                          plugins=ctx.plugins, libraries=ctx.libraries)
        ctx.key, ctx.key_parts = build_key(parts)

    def prepare(self, job: Job, res: JobResult | None = None) -> JobContext:
        """A job's context with its build key computed (plan uses it to say why a job would rebuild)."""
        res = res or JobResult(job.target.name, job.model.name, FAILED, precision=job.settings.precision)
        ctx = JobContext(job=job, project=self.project, res=res,
                         out_dir=paths.inside(self.dist, job.target.name, job.model.name))
        self._prepare(ctx)
        return ctx

    @typing.overload
    def run_job(self, job: Job) -> JobResult: ...
    @typing.overload
    def run_job(self, job: Job, reuse_only: bool) -> JobResult | None: ...

    def run_job(self, job: Job, reuse_only: bool = False) -> JobResult | None:
        """Build one job (or reuse its published artifact). reuse_only: None unless it can be reused."""
        res = JobResult(job.target.name, job.model.name, FAILED, precision=job.settings.precision)
        start = time.perf_counter()
        try:
            res.step = "prepare"
            ctx = self.prepare(job, res)
            try:
                why, reused = published(ctx.out_dir, ctx.key, ctx.sign_key, ctx.key_parts,
                                        None if self.force else ctx.enc_key)
            except Tampered as e:
                if not self.repair:
                    raise
                why, reused = f"TAMPERED, replaced on --repair: {e.message}", None
            if self.force and reused is not None:
                why, reused = "--force", None
            if reuse_only and reused is None:
                return None
            if why and why != "no artifact yet" and why != "--force":
                self.progress(job.name, f"rebuilding: {why}")
            if reused is not None:
                self.progress(job.name, "up to date (unchanged build key; --force rebuilds)")
                res.notes = list(reused.notes)
                res.source_size = reused.source.size
                if reused.precision.changed is not None:
                    res.converted = reused.precision.changed.get("converted")
            else:
                assert ctx.files is not None
                with workspace.private_dir(workspace.temp_need(ctx.files.size)) as work:
                    ctx.work = work
                    self._run_phase(ctx, "build")
                ctx.work = None
                if why and why.startswith("TAMPERED"):  # the summary says what was replaced
                    res.notes.append(why)
            self._run_phase(ctx, "verify", reused=reused is not None)
            assert ctx.manifest is not None
            # a reused portable-only artifact is still portable-only: the status says so (and --strict sees it)
            res.status = PORTABLE if ctx.missing else (BUILT if reused is None else UP_TO_DATE)
            res.level = ctx.manifest.optimization.applied
            res.artifact = str(ctx.out_dir / ctx.manifest.artifact.file)
            res.size = ctx.manifest.artifact.size
            res.reason = "; ".join(ctx.missing.values())
            if reused is None:
                self.progress(job.name, f"{res.status}: {res.artifact}")
        except OrtbuildError as e:  # ConfigError (bad inputs/calibration files) included
            if reuse_only:
                return None  # the full run reports it
            res.status = FAILED
            res.error = e
            res.reason = f"{e.label}: {e.message}" if isinstance(e, Tampered | WrongKey) else e.message
        except Exception as e:  # a tool (onnx, ORT, a quantizer) rejected the model: name the step
            if reuse_only:
                return None
            res.status = FAILED
            res.error = StepError(job.target.name, job.model.name, res.step, first_line(e),
                                  "rerun with --debug for the full traceback")
            res.error.__cause__ = e
            res.debug = traceback.format_exc()
            res.reason = res.error.message
        finally:
            res.seconds = time.perf_counter() - start
        if res.status == FAILED:
            self.progress(job.name, f"FAILED: {res.reason}")
        return res


def published(out_dir: Path, key: str, sign_key: keys.SigningKey | None, parts: dict[str, str] | None = None,
              enc_key: keys.EncryptionKey | None = None) -> tuple[str | None, manifest.Manifest | None]:
    """(why the published artifact must be rebuilt, None) or (None, its manifest).

    Trust first, with the configured signing key (never the manifest's own): a manifest whose signature does
    not verify, or a signed file (artifact, loaders, golden data, custom ops) that differs, raises Tampered
    whatever else changed: a build never replaces what someone modified (`--repair` does, on purpose). An
    intact artifact is rebuilt when its build key changed; one sealed for another encryption key raises WrongKey
    (`ortbuild rekey` rotated it: the old key no longer opens it)."""
    if not (out_dir / manifest.MANIFEST).exists():  # never built, or a publish cut short (the manifest goes
        return "no artifact yet", None             # first and comes last): files without one are no artifact
    if sign_key is None:
        raise KeyMissing("no signing key: the published artifacts are checked with its public half",
                         f"make keys: `{keys.MAKE_KEYS}`")
    m = manifest.trusted(out_dir, sign_key.public_raw, development=sign_key.development, rebuildable=True)
    if m is None:  # signed by this key, in another ortbuild's manifest format
        return "built by another ortbuild (manifest format)", None
    if m.build_key != key:
        if parts is not None and m.build_inputs:
            return "changed: " + ", ".join(changed_parts(m.build_inputs, parts)), None
        return "changed: the build key (built by an older ortbuild)", None
    if m.encryption is not None and enc_key is not None and m.encryption.key_id != enc_key.key_id:
        raise WrongKey(f"{out_dir}: encrypted for key id {m.encryption.key_id}, the configured key "
                       f"({enc_key.source}) is id {enc_key.key_id}",
                       "use the key it was built or re-keyed with (after `ortbuild rekey`, the new one); "
                       "`ortbuild build --repair` rebuilds it under this key")
    return None, m
