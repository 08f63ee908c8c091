"""The pipeline of a generative model (a Hugging Face-format directory), in place of stages.PIPELINE:
  build:   check -> genai-build (onnxruntime-genai's model builder, weights folded into the graph) -> reload
           (greedy tokens through onnxruntime-genai, never NaN) -> encrypt (the graph; genai_config.json and the
           tokenizer files are signed, not encrypted: they hold no weights) -> loaders -> package
  verify:  integrity -> loader (the generated loader reproduces the reload's tokens from memory)
The published artifact is like any other: its manifest signs every file, `ortbuild verify`, release and rekey
treat it as they treat the others; its `generative` section says what the loaders need to know.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from ortbuild import __version__, files, machine
from ortbuild.artifact import manifest, manifest_types, pieces
from ortbuild.errors import ArtifactError
from ortbuild.pipeline import buildkey
from ortbuild.pipeline.job import Done, Prepared
from ortbuild.pipeline.stages import PIPELINE, Step
from ortbuild.pipeline.steps import encrypt, genbuild, genlimits, package
from ortbuild.project import generation
from ortbuild.status import ArtifactState

ROLES = {"tokenizer_config.json": "tokenizer", "tokenizer.json": "tokenizer", genbuild.CONFIG_FILE: "genai_config"}


@dataclass(frozen=True)
class Sealed:
    """The sealed graph and the signed side files, each a partial file beside the published artifact."""

    result: encrypt.EncryptResult


def _check(prep: Prepared, done: Done) -> genbuild.GenSource:
    job = prep.job
    source = genbuild.check(job.model.path, job.model.inputs, str(prep.project.file), job.model.name,
                            prep.files.size)
    genlimits.check(job.model.path, source.config, job.settings, source.prompts, str(prep.project.file),
                    job.target.name, job.model.name, job.model.inputs)
    return source


def _build(prep: Prepared, done: Done) -> genbuild.GenBuilt:
    provider = prep.job.settings.providers[0].name
    return genbuild.build(prep.job.model.path, prep.tmp, prep.job.settings, provider, prep.job.target.name,
                          prep.job.model.name, str(prep.project.file))


def _reload(prep: Prepared, done: Done) -> genbuild.GenReloaded:
    return genbuild.reload(done[genbuild.GenBuilt], done[genbuild.GenSource].prompts, prep.job.target.name,
                           prep.job.model.name, cpu=bool(prep.missing))


def _encrypt(prep: Prepared, done: Done) -> Sealed:
    built, s = done[genbuild.GenBuilt], prep.job.settings
    enc = prep.secrets.encryption if s.encrypt else None
    sealed = encrypt.run(built.graph, s, prep.dist, prep.out_dir, prep.tmp, "", enc, buildkey.deterministic())
    side = []
    for name in built.side_files:  # no weights: signed through the manifest, kept readable
        partial = files.partial_file(prep.out_dir / name, prep.dist)
        data = (built.folder / name).read_bytes()
        with files.open_partial(partial) as out:
            out.write(data)
        sha, digests = pieces.of_bytes(data)
        side.append((manifest_types.ArtifactFile(name=name, role=ROLES.get(name, "tokenizer"), location=name,
                                           sha256=sha, size=len(data), encrypted=False, pieces=digests), partial))
    return Sealed(dataclasses.replace(sealed, files=(*sealed.files, *side)))


def assemble(prep: Prepared, done: Done) -> manifest_types.Manifest:
    """The manifest of a generative artifact: the same sections as any artifact's, and its `generative` one."""
    import onnx

    from ortbuild.pipeline.steps import check

    job, s, built = prep.job, prep.job.settings, done[genbuild.GenBuilt]
    seal = done[Sealed].result
    graph = onnx.load(str(built.graph), load_external_data=False)
    root = prep.project.root.resolve()
    path = job.model.path.resolve()
    source = manifest_types.Source(path=str(path.relative_to(root) if path.is_relative_to(root) else path),
                             sha256=prep.files.graph.sha256, size=prep.files.size, ir_version=graph.ir_version,
                             opsets=check.opsets(graph), files=[f.as_json() for f in prep.files.files])
    sig = check.signature(graph)
    del graph
    fact = genbuild.facts(built)
    gen = manifest_types.Generative(
        architecture=done[genbuild.GenSource].architecture, model_type=fact["model_type"],
        builder=buildkey.builder_versions(), runtime=generation.genai_for(job.target.runtime),
        precision=built.precision,
        execution_provider=built.execution_provider, extra_options=dict(built.extra_options),
        context_length=fact["context_length"], vocab_size=fact["vocab_size"], num_layers=fact["num_layers"],
        eos_token_ids=fact["eos_token_ids"], config=genbuild.CONFIG_FILE,
        tokenizer=[n for n in built.side_files if n != genbuild.CONFIG_FILE],
        golden_tokens=done[genbuild.GenReloaded].tokens, matmuls=list(built.matmuls))
    extra = " ".join(f"{k}={v}" for k, v in built.extra_options.items())
    locked = [f"targets.lock laid over its settings: {job.locked.describe()}"] \
        if job.locked is not None and job.locked.applies else []
    notes = [*locked, f"built by onnxruntime-genai's model builder (-p {built.precision} -e "
             f"{built.execution_provider}" + (f" --extra_options {extra}" if extra else "")
             # a reproducible build (SOURCE_DATE_EPOCH) records no time: the same inputs give the same bytes
             + (")" if buildkey.deterministic() else f") in {built.seconds:.1f} s"), *built.notes,
             f"graph optimizations: ONNX Runtime applies level '{s.optimization}' when onnxruntime-genai opens the "
             "model (genai_config.json's session_options, with the target's session options)"]
    return manifest_types.Manifest(
        project=manifest_types.ProjectInfo(prep.project.name, prep.project.version), epoch=prep.project.epoch,
        target=job.target.name, model=job.model.name,
        status=ArtifactState.PORTABLE if prep.missing else ArtifactState.COMPLETE, missing_providers=prep.missing,
        source=source, artifact=seal.artifact_section("onnx", prep.files.size),
        precision=manifest_types.PrecisionInfo(name=s.precision, options=dict(built.extra_options)),
        providers=[manifest_types.ProviderEntry(name=p.name, options=dict(p.options)) for p in s.providers],
        session=s.session.as_json(), free_dimensions={},
        optimization=manifest_types.Optimization(requested=s.optimization, applied="builder", portable=not prep.missing,
                                           tied_to={}, optimized_with=[p.name for p in prep.run_on],
                                           op_domains=dict(source.opsets)),
        io=sig, golden_run=manifest_types.GoldenRun(providers=[p.name for p in prep.run_on],
                                              outputs=[o for o in sig["outputs"] if o["name"] == "logits"],
                                              inputs_sha256=prep.inputs_sha),
        versions={"ortbuild": __version__, "onnx": _onnx_version(), "onnxruntime": prep.flavor.as_json()},
        build_machine=machine.fingerprint(), build_key=prep.key, build_inputs=prep.key_parts,
        created=manifest.timestamp(),
        encryption=seal.encryption_section(prep.secrets.encryption if s.encrypt else None),
        signing=prep.signing.info(), notes=notes, plugins=prep.plugins, generative=gen,
        locked=job.locked.as_record() if job.locked is not None else None)


def _onnx_version() -> str:
    import onnx

    return str(onnx.__version__)


def _loaders(prep: Prepared, done: Done) -> package.Rendered:
    m = assemble(prep, done)
    done.add(m)
    return package.render(m, prep.job.target.runtime_text)


def _package(prep: Prepared, done: Done) -> package.Published:
    return package.publish(prep, done[Sealed].result, done[package.Rendered])


def _loader(prep: Prepared, done: Done) -> None:
    """The generated loader opens the sealed artifact from memory and generates the reload step's tokens; where
    the target's providers cannot run here, it verifies the artifact and refuses to open it."""
    from ortbuild.artifact import loaders

    m = done[manifest_types.Manifest]
    module = loaders.import_python_loader(loaders.python_path(prep.out_dir, m.model))
    secret = prep.secrets.secret if prep.job.settings.encrypt else None
    if prep.missing:
        module.verify(prep.out_dir)
        try:
            module.load(key=secret, folder=prep.out_dir)
        except module.ProviderUnavailableError:
            return
        raise ArtifactError(f"{prep.job.name}: the Python loader opened an artifact whose providers cannot run here: "
                            "it must refuse (no silent fallback)")
    model = module.load(key=secret, folder=prep.out_dir)
    expected = done[genbuild.GenReloaded].tokens
    for prompt, tokens in expected.items():
        got = model.generate_ids(model.encode(prompt), len(tokens))
        if got != tokens:
            raise ArtifactError(f"{prep.job.name}: through the Python loader, prompt {prompt[:60]!r} gave tokens "
                                f"{got}, the plaintext build {tokens}")


def _provider(p: Prepared) -> str:
    return generation.BUILDER_PROVIDER.get(p.job.settings.providers[0].name, "?")


GENERATIVE: tuple[Step, ...] = (
    Step("check", "build", _check, lambda p: f"check {p.job.model.path.name} (a Hugging Face-format directory) and "
         "its golden prompts"),
    Step("genai-build", "build", _build, lambda p: "onnxruntime-genai's model builder: -p "
         f"{generation.BUILDER_PRECISION.get(p.job.settings.precision, '?')} -e {_provider(p)}"),
    Step("reload", "build", _reload, lambda p: f"open it with onnxruntime-genai on {[u.name for u in p.run_on]}: "
         "greedy tokens on the golden prompts"),
    Step("encrypt", "build", _encrypt, lambda p: "encrypt the graph (container v1, AES-256-GCM); sign the config "
         "and tokenizer" if p.job.settings.encrypt else "no encryption (encrypt = false)"),
    Step("loaders", "build", _loaders, lambda p: "generate the Python loader (onnxruntime-genai)"),
    Step("package", "build", _package, lambda p: f"sign and publish into {p.out_dir}"),
    *(s for s in PIPELINE if s.name == "integrity"),
    Step("loader", "verify", _loader, lambda p: "open it through the generated Python loader: the same tokens",
         on_reuse=False),
)
