"""The pipeline: every step of a job in order, in its phase. A new step joins PIPELINE here, and nowhere else.

Each stage takes the prepared job and the results earlier steps returned (`Done`), calls its step module in
steps/ with what that needs, and returns the step's frozen result (or a tuple of them), which the next steps
receive; the manifest is assembled from those results, each giving its own section (steps/package.py).
  build:   check -> [fusion] -> precision -> optimize -> compile -> reload -> [operators] -> encrypt -> loaders
           -> package   ([operators]: format = "ort", ORT's reduced-build operator config of the .ort)
  verify:  integrity -> loader (on a reused artifact: integrity only)
The step modules import onnx, numpy and ONNX Runtime: each stage imports its own when it runs, so a no-op
build (every job reused: the integrity check only) never pays for them.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Literal

from ortbuild import modelfiles
from ortbuild.artifact import manifest_types
from ortbuild.errors import ConfigError, OutputsBroken, StepError
from ortbuild.pipeline import buildkey
from ortbuild.pipeline.job import Done, JobResult, Prepared
from ortbuild.pipeline.steps import compile, integrity

if TYPE_CHECKING:
    from ortbuild.pipeline.steps import check, encrypt, fusion, operators, optimize, package, precision, reload
    from ortbuild.project import data

Phase = Literal["build", "verify"]


@dataclass(frozen=True)
class Inputs:
    """The golden inputs (checked against the model's signature) and the calibration samples, if any."""

    feed: data.Feed
    samples: list[data.Feed] | None


@dataclass(frozen=True)
class Layout:
    """Why the artifact's weights are external data ("": they are not); decided before optimize writes them."""

    external: str


@dataclass(frozen=True)
class Step:
    name: str
    phase: Phase
    run: Callable[[Prepared, Done], object]   # a frozen result, a tuple of them, or None
    describe: Callable[[Prepared], str]
    on_reuse: bool = True            # verify steps: also on a reused artifact (False: only on a fresh one)
    applies: Callable[[Prepared], bool] | None = None  # None: always; else the step runs (and shows) when True


def _external(prep: Prepared, files: modelfiles.ModelFiles) -> bool:
    """Intermediates keep the weights as external data when the source does, or could not be one file."""
    return prep.job.settings.external_data or files.keeps_external_data


def _check(prep: Prepared, done: Done) -> tuple[check.CheckResult, Inputs]:
    from ortbuild.pipeline.steps import check
    from ortbuild.project import data

    job, s = prep.job, prep.job.settings
    src = check.run(job.model.path, prep.files)
    done.add(src)  # reported (the source's size) even when its data fail below
    if not s.format_rule.external_data and modelfiles.needs_external_data(src.files.weights_size):
        raise ConfigError(str(prep.project.file), f"targets.{job.target.name}.format",
                          f"model '{job.model.name}' holds {src.files.weights_size / (1 << 30):.2f} GiB of weights: "
                          "format 'ort' is one flatbuffer, limited to 2 GiB, and cannot hold external data",
                          'use format = "onnx" for this target (external data is then written for it)')
    for k, message in check.settings_problems(src.model, src.signature, s):
        table, _, key = k.partition(".")
        if job.locked is not None and key in job.locked.applies.get(table, {}):  # the lock set it, not targets.toml
            raise ConfigError(str(prep.project.file.parent / job.locked.file_name), f"jobs.\"{job.name}\".applies.{k}",
                              f"{message} (model '{job.model.name}')",
                              "delete the entry: the next build searches again where the target asks")
        raise ConfigError(str(prep.project.file), f"targets.{job.target.name}.{k}",
                          f"{message} (model '{job.model.name}')",
                          "ONNX Runtime's tools ignore such names silently, so ortbuild refuses them")
    names = [i["name"] for i in src.signature["inputs"]]
    feed = data.load_feed(job.model.inputs, names)
    config, model = str(prep.project.file), f"models.{job.model.name}"
    data.check_feed(feed, src.signature, str(job.model.inputs), config=config, key=f"{model}.inputs")
    samples = None
    if s.rule.needs_calibration and job.model.calibration is not None:
        samples = data.load_samples(job.model.calibration, names)
        for sample in samples:
            data.check_feed(sample, src.signature, str(job.model.calibration), config=config,
                            key=f"{model}.calibration")
    return src, Inputs(feed, samples)


def _fusion(prep: Prepared, done: Done) -> fusion.FusionResult:
    """ONNX Runtime's transformer optimizer on the source; the precision step then reads the fused graph."""
    from ortbuild.pipeline.steps import check, fusion

    src, s, job = done[check.CheckResult], prep.job.settings, prep.job
    if prep.missing:  # a portable build holds standard ONNX ops only: the fusion belongs where the providers run
        return fusion.skipped(src.model, s.fusion, job.model.path.resolve(),
                              f"a portable build holds standard ONNX ops only ({', '.join(prep.missing)} cannot "
                              "run here); the build where the target's providers run fuses the model")
    missing = fusion.unknown_here(s.fusion.model_type)
    if missing:
        raise ConfigError(str(prep.project.file), f"targets.{job.target.name}.fusion.model_type", missing,
                          "pick a model type this runtime offers, or pin the runtime ortbuild's choices come from "
                          "(onnxruntime 1.31.1)")
    fused = fusion.run(job.model.path, src.model, s.fusion, prep.tmp, external=_external(prep, src.files))
    for k, node in fusion.lost_nodes(s, fused.model):
        raise ConfigError(str(prep.project.file), f"targets.{job.target.name}.{k}",
                          f"node '{node}' of model '{job.model.name}' was fused into another node by fusion "
                          f"'{s.fusion.model_type}': the precision step would ignore the name silently",
                          "name the fused node instead (`ortbuild inspect` and the manifest's fusion record say what "
                          "was fused), or set fusion = { model_type = \"off\" } for this model")
    fused.notes.extend(fusion.precision_notes(s, fused.fused_ops))
    return fused


def _precision(prep: Prepared, done: Done) -> precision.PrecisionResult:
    from ortbuild.pipeline.steps import check, fusion, precision

    src, s = done[check.CheckResult], prep.job.settings
    fused = done.get(fusion.FusionResult)  # the fused model when the fusion step made one, else the source
    path, graph = (fused.path, fused.model) if fused is not None else (prep.job.model.path, src.model)
    prec = precision.run(path, graph, s.precision, s.typed_precision_options(), prep.tmp,
                         done[Inputs].samples, external=_external(prep, src.files))
    if path.is_relative_to(prep.tmp.resolve()) and prec.path != path:
        modelfiles.remove(path)  # the fused model, read: the temp space holds at most two models at once
    done.add(prec)  # reported (the share converted) even when it converted too little below
    if prec.changed is not None:
        little = precision.too_little(s.precision, prec.changed, s.typed_precision_options())
        if little and prec.already:  # the source's own quantization holds the rest: little is left to convert
            prec.notes.append(f"{little[0]}: the source is already reduced, the rest is its own quantization")
        elif little:
            raise StepError(prep.job.target.name, prep.job.model.name, "precision", *little)
    if prec.path != prep.job.model.path.resolve():
        check.run(prec.path)  # every precision output must pass the full checker
    return prec


def _optimize(prep: Prepared, done: Done) -> tuple[optimize.OptimizeResult, Layout]:
    from ortbuild.pipeline.steps import optimize, precision

    prec, s = done[precision.PrecisionResult], prep.job.settings
    files = modelfiles.of(prec.path, hashed=False)
    external, fmt = "", s.format_rule
    if s.external_data:
        external = "external_data = true"
    elif fmt.external_data and modelfiles.needs_external_data(files.weights_size):
        external = (f"its weights ({files.weights_size / (1 << 30):.2f} GiB) would pass protobuf's 2 GiB limit "
                    "for one file")
    elif fmt.external_data and files.has_external_data:  # ORT keeps it so (and never re-serializes the weights)
        external = "the source model keeps its weights as external data"
    opt = optimize.run(prec.path, s, prep.usable, prep.missing, prep.tmp, external=bool(external))
    if prec.path.is_relative_to(prep.tmp):  # the temp space holds at most two models at once
        modelfiles.remove(prec.path)
    return opt, Layout(external)


def _compile(prep: Prepared, done: Done) -> compile.CompileResult | None:
    from ortbuild.pipeline.steps import optimize

    if prep.compile_for is None:
        return None
    return compile.run(done[optimize.OptimizeResult].path, prep.job.settings, prep.compile_for, prep.plugin_eps,
                       prep.tmp)


def _compiled_model(done: Done) -> Path | None:
    """The EPContext model, where the compile step compiled some node."""
    found = done.get(compile.CompileResult)
    return found.path if found is not None else None


def _artifact_model(done: Done) -> Path:
    """The model the artifact holds: the compiled EPContext model where there is one, else the optimized one."""
    from ortbuild.pipeline.steps import optimize

    return _compiled_model(done) or done[optimize.OptimizeResult].path


def _reload(prep: Prepared, done: Done) -> reload.ReloadResult:
    from ortbuild.pipeline.steps import reload

    job, feed = prep.job, done[Inputs].feed
    try:
        result = reload.run(_artifact_model(done), job.settings, prep.run_on, feed, prep.plugin_eps,
                            precompiled=_compiled_model(done) is not None)
    except reload.RunFailed as e:
        message, hint = e.explained(job.model.name, str(job.model.inputs))
        raise StepError(job.target.name, job.model.name, "reload", message, hint) from e
    # NaN/inf where the source's outputs are finite, a constant where they vary: never BUILT
    broken = reload.broken_outputs(result, job.model.path, feed, job.settings.custom_ops)
    if broken:
        raise OutputsBroken(job.target.name, job.model.name, "reload",
                            *reload.explained_broken(broken, job.target.name, job.model.name, job.settings))
    return result


def _operators(prep: Prepared, done: Done) -> operators.OperatorConfig:
    """ORT's reduced-build operator config of the .ort artifact, made while it is plaintext in the temp dir."""
    from ortbuild.pipeline.steps import operators

    return operators.run(_artifact_model(done), prep.tmp, f"{prep.job.target.name}/{prep.job.model.name}/model.ort")


def _encrypt(prep: Prepared, done: Done) -> encrypt.EncryptResult:
    from ortbuild.pipeline.steps import encrypt

    path = _artifact_model(done)
    enc = prep.secrets.encryption if prep.job.settings.encrypt else None
    return encrypt.run(path, prep.job.settings, prep.dist, prep.out_dir, prep.tmp, done[Layout].external, enc,
                    buildkey.deterministic())


def _loaders(prep: Prepared, done: Done) -> package.Rendered:
    from ortbuild.pipeline.steps import check, encrypt, fusion, operators, optimize, package, precision, reload

    m = package.assemble(prep, done[check.CheckResult], done[precision.PrecisionResult],
                         done[optimize.OptimizeResult], done[reload.ReloadResult], done[encrypt.EncryptResult],
                         done.get(compile.CompileResult), done.get(fusion.FusionResult),
                         done.get(operators.OperatorConfig))
    done.add(m)  # its notes are reported even when rendering the loaders fails
    return package.render(m, prep.job.target.runtime_text)


def _package(prep: Prepared, done: Done) -> package.Published:
    from ortbuild.pipeline.steps import encrypt, operators, package

    return package.publish(prep, done[encrypt.EncryptResult], done[package.Rendered],
                           done.get(operators.OperatorConfig))


def _integrity(prep: Prepared, done: Done) -> manifest_types.Manifest:
    return integrity.run(prep.out_dir, prep.signing)


def _loader(prep: Prepared, done: Done) -> None:
    from ortbuild.pipeline.steps import loader, reload

    secret = prep.secrets.secret if prep.job.settings.encrypt else None
    loader.through_loader(prep.job.name, prep.out_dir, done[manifest_types.Manifest], done[Inputs].feed, secret,
                          bool(prep.missing), done.get(reload.ReloadResult))


def record(res: JobResult, result: object) -> None:
    """What the command reports from a step's result, as soon as the step returns (a job that fails later
    still reports it)."""
    from ortbuild.pipeline.steps import check, genbuild, optimize, package, precision

    if isinstance(result, check.CheckResult | genbuild.GenSource):
        res.source_size = result.size
    elif isinstance(result, precision.PrecisionResult) and result.changed is not None:
        res.converted = result.changed.converted
    elif isinstance(result, optimize.OptimizeResult):
        res.level = result.applied
    elif isinstance(result, package.Rendered | manifest_types.Manifest):
        res.notes = list((result.manifest if isinstance(result, package.Rendered) else result).notes)
    elif isinstance(result, package.Published):
        res.artifact = str(result.artifact)


PIPELINE: tuple[Step, ...] = (
    Step("check", "build", _check, lambda p: f"check {p.job.model.path.name} and its data"),
    Step("fusion", "build", _fusion, lambda p: f"fusion {p.job.settings.fusion.model_type} (ONNX Runtime's "
         "transformer optimizer)", applies=lambda p: p.job.settings.fusion.enabled),
    Step("precision", "build", _precision, lambda p: f"precision {p.job.settings.precision}"),
    Step("optimize", "build", _optimize,
         lambda p: f"optimize level={p.job.settings.optimization} providers={[u.name for u in p.usable] or '-'}"),
    Step("compile", "build", _compile, lambda p: f"compile for {p.compile_for.name} ahead of time (EPContext)"
         if p.compile_for else "compile: no provider compiles ahead of time"),
    Step("reload", "build", _reload,
         lambda p: f"reload (optimizations disabled) and run on {[u.name for u in p.run_on]}"),
    Step("operators", "build", _operators, lambda p: "operator config for a reduced ONNX Runtime build "
         "(required_operators.config, by ORT's create_config_from_models)",
         applies=lambda p: p.job.settings.format_rule.operators),
    Step("encrypt", "build", _encrypt, lambda p: "encrypt (container v1, AES-256-GCM)" if p.job.settings.encrypt
         else "no encryption (encrypt = false)"),
    Step("loaders", "build", _loaders, lambda p: "generate the Python, Node.js and browser loaders"),
    Step("package", "build", _package, lambda p: f"sign and publish into {p.out_dir}"),
    Step("integrity", "verify", _integrity, lambda p: "verify the signature and digests of the published artifact"),
    Step("loader", "verify", _loader, lambda p: "open it through the generated Python loader",
         on_reuse=False),  # a reused artifact passed it when built; its integrity is checked every time
)

