"""Steps: the manifest and the loaders (assembled from every earlier step's result, each giving its own
section), then package: sign and publish the sealed files, the loaders and the manifest atomically."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from pathlib import Path

import onnx

from ortbuild import __version__, machine, paths
from ortbuild.artifact import loaders, manifest, manifest_types
from ortbuild.pipeline.job import Prepared
from ortbuild.pipeline.steps import optimize, reload
from ortbuild.pipeline.steps.check import CheckResult
from ortbuild.pipeline.steps.compile import CompileResult
from ortbuild.pipeline.steps.encrypt import EncryptResult
from ortbuild.pipeline.steps.fusion import FusionResult
from ortbuild.pipeline.steps.operators import OperatorConfig
from ortbuild.pipeline.steps.optimize import OptimizeResult
from ortbuild.pipeline.steps.precision import PrecisionResult
from ortbuild.pipeline.steps.reload import ReloadResult
from ortbuild.status import ArtifactState


@dataclass(frozen=True)
class Rendered:
    """The manifest to publish and the loaders generated from it."""

    manifest: manifest_types.Manifest
    loader_files: dict[str, str]


@dataclass(frozen=True)
class Published:
    artifact: Path


def notes(prep: Prepared, src: CheckResult, prec: PrecisionResult, opt: OptimizeResult, seal: EncryptResult,
          compiled: CompileResult | None, fused: FusionResult | None, ops: OperatorConfig | None = None) -> list[str]:
    """The build's notes, in pipeline order."""
    s = prep.job.settings
    precompiled = compiled is not None and compiled.compiled
    opt_notes = [n for n in opt.notes if not (precompiled and optimize.COMPILED_AT_LOAD in n)]
    split = [f"weights written as external data (model.onnx.data): {seal.external}"] \
        if seal.external and not s.external_data and not src.files.has_external_data else []
    changed = [f"precision {prec.precision}: {prec.changed.summary()}"] if prec.changed else []
    locked = [f"targets.lock laid over its settings: {prep.job.locked.describe()}"] \
        if prep.job.locked is not None and prep.job.locked.applies else []
    out = locked + changed + prec.notes + split + opt_notes + (compiled.notes if compiled else []) \
        + (ops.notes if ops else [])
    return (fused.notes + out) if fused is not None else out  # the fusion step ran first: its notes come first


def assemble(prep: Prepared, src: CheckResult, prec: PrecisionResult, opt: OptimizeResult, rel: ReloadResult,
             seal: EncryptResult, compiled: CompileResult | None, fused: FusionResult | None,
             ops: OperatorConfig | None = None) -> manifest_types.Manifest:
    """The manifest: the job's facts, and each step result's own section."""
    job, root = prep.job, prep.project.root
    precompiled = compiled is not None and compiled.compiled
    source = job.model.path.resolve().relative_to(root.resolve()) \
        if job.model.path.resolve().is_relative_to(root.resolve()) else job.model.path
    optimization = opt.manifest_section()
    return manifest_types.Manifest(
        project=manifest_types.ProjectInfo(prep.project.name, prep.project.version),
        epoch=prep.project.epoch,
        target=job.target.name,
        model=job.model.name,
        status=ArtifactState.PORTABLE if prep.missing else ArtifactState.COMPLETE,
        missing_providers=prep.missing,
        source=src.manifest_section(str(source)),
        artifact=seal.artifact_section(job.settings.format, src.size),
        precision=prec.manifest_section(),
        providers=[manifest_types.ProviderEntry(name=p.name, options=dict(p.options)) for p in job.settings.providers],
        session=_session_json(prep, precompiled),
        free_dimensions=dict(job.settings.free_dimensions),
        optimization=compiled.amend(optimization) if compiled is not None else optimization,
        io=src.signature,
        golden_run=rel.manifest_section(prep.inputs_sha),
        versions={"ortbuild": __version__, "onnx": onnx.__version__, "onnxruntime": prep.flavor.as_json()},
        build_machine=machine.fingerprint(),
        build_key=prep.key,
        build_inputs=prep.key_parts,
        created=manifest.timestamp(),
        encryption=seal.encryption_section(prep.secrets.encryption if job.settings.encrypt else None),
        signing=prep.signing.info(),
        notes=notes(prep, src, prec, opt, seal, compiled, fused, ops),
        plugins=prep.plugins,
        custom_ops=[lib.as_json() for lib in prep.libraries],
        compiled=compiled.manifest_section() if compiled is not None else None,
        fusion=fused.manifest_section() if fused is not None else None,
        operators=ops.manifest_section() if ops is not None else None,
        locked=job.locked.as_record() if job.locked is not None else None,
    )


def _session_json(prep: Prepared, precompiled: bool) -> dict[str, object]:
    """The session options loaders use: the target's, plus disable_model_compile for a compiled artifact."""
    out = prep.job.settings.session.as_json()
    if precompiled:
        out["config"] = {**prep.job.settings.session.config, reload.PRECOMPILED_CONFIG: "1"}
    return out


def render(m: manifest_types.Manifest, runtime_text: str) -> Rendered:
    """The loaders, generated from the manifest, and the manifest that describes them."""
    files = loaders.render(m, runtime_text)
    return Rendered(dataclasses.replace(m, loaders=loaders.describe(files, m)), files)


def publish(prep: Prepared, seal: EncryptResult, rendered: Rendered, ops: OperatorConfig | None = None) -> Published:
    files: dict[str, bytes | Path] = {f.name: partial for f, partial in seal.files}
    if ops is not None:  # format = "ort": ORT's operator config beside the artifact, signed in the manifest
        files[ops.manifest_section().config] = ops.data
    files.update({f"{loaders.LOADER_DIR}/{name}": code.encode() for name, code in rendered.loader_files.items()})
    for lib in prep.libraries:  # a path library ships beside the artifact
        if (name := lib.as_json().get("file")) is not None:
            files[name] = Path(lib.path).read_bytes()
    manifest.write_signed(prep.out_dir, files, rendered.manifest, prep.signing.sign, root=prep.dist,
                        prune=True)
    _remove_old_loaders(prep.out_dir, prep.job.model.name, set(rendered.loader_files))
    return Published(prep.out_dir / rendered.manifest.artifact.file)


def _remove_old_loaders(out_dir: Path, model: str, written: set[str]) -> None:
    """An earlier build's loaders that this one no longer writes (the Python loader of ortbuild before per-model
    names, ortbuild_loader.py) go: no stale loader stays beside the artifact it was not generated for."""
    for name in sorted(loaders.loader_files(model) - written):
        old = paths.inside(out_dir, loaders.LOADER_DIR, name)
        if old.is_file() or old.is_symlink():
            old.unlink()
