"""Run each job's pipeline of steps and publish dist/<target>/<model>/{artifact, manifest.json}.

A job runs in three phases (see PIPELINE, the one place a step joins):
  prepare  check the source and its data, compute the build key (always)
  build    make and publish the artifact, in a private temp dir (skipped when the published one is reused)
  verify   checks on the published artifact (always: on fresh and reused artifacts alike)
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal, TextIO

from . import __version__, container, data, keys, loaders, manifest, options, paths, runtime
from .config import Project, Provider
from .errors import ArtifactError, ConfigError, KeyMissing, OrtbuildError, StepError, first_line
from .plan import Job
from .steps import check, optimize, precision, reload

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
    notes: list[str] = field(default_factory=list)
    error: OrtbuildError | None = None

    def as_json(self) -> dict[str, Any]:
        out = {k: v for k, v in self.__dict__.items() if k != "error"}
        if self.error is not None:
            out["error"] = {"class": type(self.error).__name__, "exit_code": self.error.exit_code,
                            "message": self.error.message, "hint": self.error.hint}
        return out


class Progress:
    """Progress lines on stderr: one per job step, so long builds show where they are."""

    def __init__(self, stream: TextIO | None = None, quiet: bool = False) -> None:
        self.stream = stream or sys.stderr
        self.quiet = quiet

    def __call__(self, job: str, message: str) -> None:
        if not self.quiet:
            print(f"[{job}] {message}", file=self.stream, flush=True)


def build_key(job: Job, src_sha: str, inputs_sha: str, calib_sha: str | None,
              flavor: runtime.Flavor, missing: dict[str, str], sealing: dict[str, Any] | None = None) -> str:
    """Everything the artifact depends on; equal keys mean the published artifact can be reused."""
    import onnx

    parts = {
        "source": src_sha, "inputs": inputs_sha, "calibration": calib_sha,
        "settings": job.settings.as_json(), "runtime": flavor.as_json(), "onnx": onnx.__version__,
        "ortbuild": __version__, "missing_providers": sorted(missing),
        "simd_level": runtime.simd_level() if options.LEVEL_RULES[job.settings.optimization].nchwc else None,
        "sealing": sealing,  # key ids (never keys) and whether encryption is deterministic
    }
    return hashlib.sha256(json.dumps(parts, sort_keys=True).encode()).hexdigest()


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
    src: check.CheckResult | None = None
    feed: data.Feed = field(default_factory=dict)
    samples: list[data.Feed] | None = None
    usable: list[Provider] = field(default_factory=list)
    missing: dict[str, str] = field(default_factory=dict)
    flavor: runtime.Flavor | None = None
    key: str = ""
    inputs_sha: str = ""
    prec: precision.PrecisionResult | None = None
    opt: optimize.OptimizeResult | None = None
    rel: reload.ReloadResult | None = None
    sealed: list[tuple[manifest.ArtifactFile, bytes]] = field(default_factory=list)  # ciphertext, in memory
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


def _check(ctx: JobContext) -> None:
    job, s = ctx.job, ctx.job.settings
    src = ctx.src = check.run(job.model.path)
    ctx.res.source_size = src.size
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


def _precision(ctx: JobContext) -> None:
    assert ctx.src is not None and ctx.work is not None
    s = ctx.job.settings
    ctx.prec = precision.run(ctx.src.model, s.precision, s.typed_precision_options(), ctx.work, ctx.samples)
    check.run(ctx.prec.path)  # every precision output must pass the full checker


def _optimize(ctx: JobContext) -> None:
    assert ctx.prec is not None and ctx.work is not None
    ctx.opt = optimize.run(ctx.prec.path, ctx.job.settings, ctx.usable, ctx.missing, ctx.work)
    ctx.res.level = ctx.opt.applied


def _run_on(ctx: JobContext) -> list[Provider]:
    # a portable build is proven on the CPU of this runtime; otherwise on the target's providers
    return [Provider("CPUExecutionProvider")] if ctx.missing else ctx.usable


def _reload(ctx: JobContext) -> None:
    assert ctx.opt is not None
    ctx.rel = reload.run(ctx.opt.path, ctx.job.settings, _run_on(ctx), ctx.feed)


def deterministic() -> bool:
    """Encryption is deterministic when the build asks for reproducible output (SOURCE_DATE_EPOCH set)."""
    return "SOURCE_DATE_EPOCH" in os.environ


def _seal(ctx: JobContext) -> None:
    """Split off external data if asked, then encrypt every file of the artifact (in memory)."""
    import onnx

    assert ctx.opt is not None and ctx.work is not None
    s = ctx.job.settings
    main = "model.ort" if s.format == "ort" else "model.onnx"
    plain: list[tuple[str, str, Path]] = [(main, "model", ctx.opt.path)]
    if s.external_data:
        folder = ctx.work / "external"
        folder.mkdir()
        model = onnx.load(str(ctx.opt.path))
        onnx.save_model(model, str(folder / main), save_as_external_data=True, all_tensors_to_one_file=True,
                        location=f"{main}.data", size_threshold=1024)
        del model
        plain = [(main, "model", folder / main), (f"{main}.data", "external_data", folder / f"{main}.data")]
    ctx.sealed = []
    for location, role, path in plain:
        data = path.read_bytes()
        if s.encrypt:
            assert ctx.enc_key is not None
            data = container.encrypt(data, ctx.enc_key.secret, deterministic=deterministic())
        name = f"{location}.enc" if s.encrypt else location
        entry = manifest.ArtifactFile(name=name, role=role, location=location,
                                      sha256=hashlib.sha256(data).hexdigest(), size=len(data), encrypted=s.encrypt)
        ctx.sealed.append((entry, data))


def _loaders(ctx: JobContext) -> None:
    ctx.manifest = _manifest(ctx)
    ctx.loader_files = loaders.render(ctx.manifest, ctx.job.target.runtime)
    ctx.manifest = dataclasses.replace(ctx.manifest, loaders=loaders.describe(ctx.loader_files, ctx.manifest))


def _package(ctx: JobContext) -> None:
    assert ctx.manifest is not None and ctx.sign_key is not None
    ctx.res.artifact = str(_publish(ctx.out_dir, ctx.sealed, ctx.loader_files, ctx.manifest, ctx.sign_key))


def _integrity(ctx: JobContext) -> None:
    """The published artifact still matches its signed manifest (fresh or reused)."""
    assert ctx.sign_key is not None
    m, folder = manifest.read(ctx.out_dir)
    problems = manifest.integrity_problems(m, folder, ctx.sign_key.public_raw)
    if problems:
        raise ArtifactError(f"{ctx.out_dir}: {'; '.join(problems)}", "rebuild it with --force")
    ctx.manifest = m


def _python_loader(ctx: JobContext) -> None:
    """Open the published artifact through its generated Python loader and run the golden inputs.

    Fresh builds must reproduce the unencrypted artifact's outputs (reload step); where the target's
    providers cannot run here, the loader must refuse to load it (no silent fallback) after verifying it.
    """
    import numpy as np

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
            same = np.array_equal(a, b) if a.dtype.kind not in "fc" else np.allclose(a, b, rtol=1e-5, atol=1e-6)
            if not same:
                raise ArtifactError(f"{ctx.job.name}: output '{name}' through the Python loader differs from the "
                                    "unencrypted artifact's")


# The pipeline: a new step joins here, in its phase, and nowhere else.
PIPELINE: tuple[Step, ...] = (
    Step("check", "prepare", _check, lambda c: f"check {c.job.model.path.name} and its data"),
    Step("precision", "build", _precision, lambda c: f"precision {c.job.settings.precision}"),
    Step("optimize", "build", _optimize,
         lambda c: f"optimize level={c.job.settings.optimization} providers={[p.name for p in c.usable] or '-'}"),
    Step("reload", "build", _reload,
         lambda c: f"reload (optimizations disabled) and run on {[p.name for p in _run_on(c)]}"),
    Step("encrypt", "build", _seal, lambda c: "encrypt (container v1, AES-256-GCM)" if c.job.settings.encrypt
         else "no encryption (encrypt = false)"),
    Step("loaders", "build", _loaders, lambda c: "generate the Python and Node.js loaders"),
    Step("package", "build", _package, lambda c: f"sign and publish into {c.out_dir}"),
    Step("integrity", "verify", _integrity, lambda c: "verify the signature and digests of the published artifact"),
    Step("loader", "verify", _python_loader, lambda c: "open it through the generated Python loader"),
)


def _manifest(ctx: JobContext) -> manifest.Manifest:
    import onnx

    job, src, prec, opt, rel, flavor = ctx.job, ctx.src, ctx.prec, ctx.opt, ctx.rel, ctx.flavor
    assert src is not None and prec is not None and opt is not None and rel is not None and flavor is not None
    assert ctx.sign_key is not None
    ctx.res.notes = prec.notes + opt.notes
    size = sum(f.size for f, _ in ctx.sealed)
    main = next(f for f, _ in ctx.sealed if f.role == "model")
    root = ctx.project.root
    rel_path = job.model.path.resolve().relative_to(root.resolve()) \
        if job.model.path.resolve().is_relative_to(root.resolve()) else job.model.path
    enc = ctx.enc_key
    return manifest.Manifest(
        project=manifest.ProjectInfo(ctx.project.name, ctx.project.version),
        target=job.target.name,
        model=job.model.name,
        status="portable" if ctx.missing else "complete",
        missing_providers=ctx.missing,
        source=manifest.Source(path=str(rel_path), sha256=src.sha256, size=src.size, ir_version=src.ir_version,
                               opsets=src.opsets),
        artifact=manifest.Artifact(file=main.name, format=job.settings.format, sha256=main.sha256, size=size,
                                   size_ratio=round(size / src.size, 4), files=[f for f, _ in ctx.sealed]),
        precision=manifest.PrecisionInfo(prec.precision, prec.options),
        providers=[p.as_json() for p in job.settings.providers],
        session=job.settings.session.as_json(),
        free_dimensions=dict(job.settings.free_dimensions),
        optimization=manifest.Optimization(requested=opt.requested, applied=opt.applied, portable=opt.portable,
                                           tied_to=opt.tied_to, optimized_with=opt.providers,
                                           op_domains=opt.op_domains, disabled_optimizers=opt.disabled_optimizers,
                                           inflation=opt.inflation),
        io=src.signature,
        golden_run=manifest.GoldenRun(providers=rel.providers, outputs=rel.outputs, inputs_sha256=ctx.inputs_sha),
        versions={"ortbuild": __version__, "onnx": onnx.__version__, "onnxruntime": flavor.as_json()},
        build_machine=runtime.fingerprint(),
        build_key=ctx.key,
        created=manifest.timestamp(),
        encryption=manifest.Encryption(
            container="ortbuild-container-v1", algorithm="AES-256-GCM", key_id=enc.key_id,
            chunk_size=1 << container.DEFAULT_CHUNK_LOG2, deterministic=deterministic(),
            development_key=enc.development) if job.settings.encrypt and enc is not None else None,
        signing=ctx.sign_key.info(),
        notes=ctx.res.notes,
    )


def _publish(out_dir: Path, sealed: list[tuple[manifest.ArtifactFile, bytes]], loader_files: dict[str, str],
             m: manifest.Manifest, sign_key: keys.SigningKey) -> Path:
    files = {f.name: blob for f, blob in sealed}
    files.update({f"{loaders.LOADER_DIR}/{name}": code.encode() for name, code in loader_files.items()})
    manifest.write_signed(out_dir, files, m, sign_key.sign, prune=True)
    return out_dir / m.artifact.file


def private_dir_root(need: int) -> str | None:
    """Where the build's private temp dirs go: /dev/shm (memory-backed) when it has room, else the temp dir."""
    shm = Path("/dev/shm")
    try:
        st = os.statvfs(shm)
    except OSError:
        return None
    if os.access(shm, os.W_OK | os.X_OK) and st.f_bavail * st.f_frsize > need:
        return str(shm)
    return None


class Builder:
    def __init__(self, project: Project, dist: Path, *, force: bool = False,
                 progress: Callable[[str, str], None] | None = None,
                 enc_key: keys.EncryptionKey | None = None, sign_key: keys.SigningKey | None = None) -> None:
        self.project = project
        self.dist = dist
        self.force = force
        self.progress = progress or Progress()
        self._probes: dict[tuple[str, str], str | None] = {}
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

    def _probe(self, p: Provider) -> str | None:
        key = (p.name, json.dumps(dict(p.options), sort_keys=True))
        if key not in self._probes:
            self._probes[key] = runtime.probe_provider(p)
        return self._probes[key]

    def run(self, jobs: Sequence[Job]) -> list[JobResult]:
        targets = {j.target.name: j.target for j in jobs}
        problems = {name: runtime.runtime_problem(t) for name, t in targets.items()}
        self.check_keys([j for j in jobs if problems[j.target.name] is None])
        results = []
        for job in jobs:
            t = job.target.name
            if problems[t]:
                res = JobResult(t, job.model.name, SKIPPED, reason=problems[t] or "",
                                precision=job.settings.precision)
                self.progress(job.name, f"skipped: {res.reason}")
            else:
                res = self.run_job(job)
            results.append(res)
        return results

    def _run_phase(self, ctx: JobContext, phase: Phase) -> None:
        """Run the phase's steps in order: announce each, remember it (a failure names it), time it."""
        for step in PIPELINE:
            if step.phase != phase:
                continue
            self.progress(ctx.job.name, step.describe(ctx))
            ctx.res.step = step.name
            t = time.perf_counter()
            step.run(ctx)
            ctx.res.steps[step.name] = time.perf_counter() - t

    def _prepare(self, ctx: JobContext) -> None:
        """What the build key needs beyond the check step: usable providers, the runtime, data digests."""
        job, src = ctx.job, ctx.src
        assert src is not None
        ctx.usable = [p for p in job.settings.providers if self._probe(p) is None]
        ctx.missing = {p.name: reason for p in job.settings.providers if (reason := self._probe(p))}
        ctx.flavor = runtime.installed_flavor()
        assert ctx.flavor is not None  # runtime_problem() said this environment has the right flavor
        ctx.inputs_sha = _digest(job.model.inputs) or ""
        ctx.enc_key = self.enc_key if job.settings.encrypt else None
        ctx.sign_key = self.sign_key
        assert ctx.sign_key is not None  # check_keys()
        sealing = {"encryption_key_id": ctx.enc_key.key_id if ctx.enc_key else None,
                   "signing_key_id": ctx.sign_key.key_id, "deterministic": deterministic()}
        ctx.key = build_key(job, src.sha256, ctx.inputs_sha, _digest(job.model.calibration), ctx.flavor,
                            ctx.missing, sealing)

    def run_job(self, job: Job) -> JobResult:
        res = JobResult(job.target.name, job.model.name, FAILED, precision=job.settings.precision)
        out_dir = paths.inside(self.dist, job.target.name, job.model.name)
        ctx = JobContext(job=job, project=self.project, out_dir=out_dir, res=res)
        start = time.perf_counter()
        try:
            self._run_phase(ctx, "prepare")
            self._prepare(ctx)
            reused = None if self.force else self._reusable(ctx.out_dir, ctx.key, ctx.sign_key)
            if reused is not None:
                self.progress(job.name, "up to date (unchanged build key; --force rebuilds)")
                res.notes = list(reused.notes)
            else:
                need = 8 * (ctx.src.size if ctx.src else 0) + (64 << 20)
                with tempfile.TemporaryDirectory(prefix="ortbuild-", dir=private_dir_root(need)) as tmp:  # 0700
                    ctx.work = Path(tmp)
                    self._run_phase(ctx, "build")
                ctx.work = None
            self._run_phase(ctx, "verify")
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
            res.status = FAILED
            res.error = e
            res.reason = e.message
        except Exception as e:  # a tool (onnx, ORT, a quantizer) rejected the model: name the step
            res.status = FAILED
            res.error = StepError(job.target.name, job.model.name, res.step, first_line(e),
                                  "rerun with --debug for the full traceback")
            res.error.__cause__ = e
            res.reason = res.error.message
        finally:
            res.seconds = time.perf_counter() - start
        if res.status == FAILED:
            self.progress(job.name, f"FAILED: {res.reason}")
        return res

    def _reusable(self, out_dir: Path, key: str, sign_key: keys.SigningKey | None) -> manifest.Manifest | None:
        try:
            m, folder = manifest.read(out_dir)
        except OrtbuildError:
            return None
        if m.build_key != key or manifest.integrity_problems(m, folder, sign_key.public_raw if sign_key else None):
            return None
        return m
