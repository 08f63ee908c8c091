"""Run the build steps for each job and publish dist/<target>/<model>/{artifact, manifest.json}."""

from __future__ import annotations

import contextlib
import hashlib
import json
import sys
import tempfile
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TextIO

from . import __version__, data, manifest, runtime
from .config import Project, Provider
from .errors import ConfigError, OrtbuildError, StepError, first_line
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
              flavor: runtime.Flavor, missing: dict[str, str]) -> str:
    """Everything the artifact depends on; equal keys mean the published artifact can be reused."""
    import onnx

    parts = {
        "source": src_sha, "inputs": inputs_sha, "calibration": calib_sha,
        "settings": job.settings.as_json(), "runtime": flavor.as_json(), "onnx": onnx.__version__,
        "ortbuild": __version__, "missing_providers": sorted(missing),
        "simd_level": runtime.simd_level() if job.settings.optimization in ("layout", "all") else None,
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


class Builder:
    def __init__(self, project: Project, dist: Path, *, force: bool = False,
                 progress: Callable[[str, str], None] | None = None) -> None:
        self.project = project
        self.dist = dist
        self.force = force
        self.progress = progress or Progress()
        self._probes: dict[tuple[str, str], str | None] = {}

    def _probe(self, p: Provider) -> str | None:
        key = (p.name, json.dumps(dict(p.options), sort_keys=True))
        if key not in self._probes:
            self._probes[key] = runtime.probe_provider(p)
        return self._probes[key]

    def run(self, jobs: Sequence[Job]) -> list[JobResult]:
        results = []
        problems: dict[str, str | None] = {}
        for job in jobs:
            t = job.target.name
            if t not in problems:
                problems[t] = runtime.runtime_problem(job.target)
            if problems[t]:
                res = JobResult(t, job.model.name, SKIPPED, reason=problems[t] or "",
                                precision=job.settings.precision)
                self.progress(job.name, f"skipped: {res.reason}")
            else:
                res = self.run_job(job)
            results.append(res)
        return results

    @contextlib.contextmanager
    def _step(self, res: JobResult, job: Job, name: str, message: str) -> Iterator[None]:
        """Announce a step, remember it (a failure is reported against it) and time it."""
        self.progress(job.name, message)
        res.step = name
        t = time.perf_counter()
        yield
        res.steps[name] = time.perf_counter() - t

    def run_job(self, job: Job) -> JobResult:
        res = JobResult(job.target.name, job.model.name, FAILED, precision=job.settings.precision)
        start = time.perf_counter()
        s = job.settings
        try:
            with self._step(res, job, "check", f"check {job.model.path.name} and its data"):
                src = check.run(job.model.path)
                res.source_size = src.size
                for key, message in check.settings_problems(src.model, src.signature, s):
                    raise ConfigError(str(self.project.file), f"targets.{job.target.name}.{key}",
                                      f"{message} (model '{job.model.name}')",
                                      "ONNX Runtime's tools ignore such names silently, so ortbuild refuses them")
                names = [i["name"] for i in src.signature["inputs"]]
                feed = data.load_feed(job.model.inputs, names)
                data.check_feed(feed, src.signature, str(job.model.inputs))
                samples = None
                if s.precision == "int8-static" and job.model.calibration is not None:
                    samples = data.load_samples(job.model.calibration, names)
                    for sample in samples:
                        data.check_feed(sample, src.signature, str(job.model.calibration))
                usable = [p for p in s.providers if self._probe(p) is None]
                missing = {p.name: reason for p in s.providers if (reason := self._probe(p))}
                flavor = runtime.installed_flavor()
                assert flavor is not None  # runtime_problem() said this environment has the right flavor
                inputs_sha = _digest(job.model.inputs) or ""
                key = build_key(job, src.sha256, inputs_sha, _digest(job.model.calibration), flavor, missing)

            out_dir = self.dist / job.target.name / job.model.name
            reused = None if self.force else self._reusable(out_dir, key)
            if reused is not None:
                # a reused portable-only artifact is still portable-only: the status says so (and --strict sees it)
                res.status, res.level = PORTABLE if missing else UP_TO_DATE, reused["optimization"]["applied"]
                res.artifact, res.size = str(out_dir / reused["artifact"]["file"]), reused["artifact"]["size"]
                res.notes = list(reused.get("notes", []))
                res.reason = "; ".join(missing.values())
                self.progress(job.name, "up to date (unchanged build key; --force rebuilds)")
                return res

            with tempfile.TemporaryDirectory(prefix="ortbuild-") as tmp:  # mode 0700, removed on exit
                work = Path(tmp)
                with self._step(res, job, "precision", f"precision {s.precision}"):
                    prec = precision.run(src.model, s.precision, s.precision_options(), work, samples)
                    check.run(prec.path)  # every precision output must pass the full checker
                with self._step(res, job, "optimize", f"optimize level={s.optimization} "
                                                      f"providers={[p.name for p in usable] or '-'}"):
                    opt = optimize.run(prec.path, s, usable, missing, work)
                    res.level = opt.applied
                # a portable build is proven on the CPU of this runtime; otherwise on the target's providers
                run_on = [Provider("CPUExecutionProvider")] if missing else usable
                with self._step(res, job, "reload", "reload (optimizations disabled) and run on "
                                                    f"{[p.name for p in run_on]}"):
                    rel = reload.run(opt.path, s, run_on, feed)
                with self._step(res, job, "package", f"publish into {out_dir}"):
                    res.notes = prec.notes + opt.notes
                    doc = self._manifest(job, src, prec, opt, rel, key, inputs_sha, flavor, missing, res.notes)
                    res.artifact = str(self._publish(out_dir, opt.path, doc))
                    res.size = doc["artifact"]["size"]
            res.status = PORTABLE if missing else BUILT
            res.reason = "; ".join(missing.values())
            self.progress(job.name, f"{res.status}: {res.artifact}")
        except OrtbuildError as e:  # ConfigError (bad inputs/calibration files) included
            res.error = e
            res.reason = e.message
        except Exception as e:  # a tool (onnx, ORT, a quantizer) rejected the model: name the step
            res.error = StepError(job.target.name, job.model.name, res.step, first_line(e),
                                  "rerun with --debug for the full traceback")
            res.error.__cause__ = e
            res.reason = res.error.message
        finally:
            res.seconds = time.perf_counter() - start
        if res.status == FAILED:
            self.progress(job.name, f"FAILED: {res.reason}")
        return res

    def _reusable(self, out_dir: Path, key: str) -> dict[str, Any] | None:
        try:
            doc, folder = manifest.read(out_dir)
        except OrtbuildError:
            return None
        if doc.get("build_key") != key or manifest.integrity_problems(doc, folder):
            return None
        return doc

    def _manifest(self, job: Job, src: check.CheckResult, prec: precision.PrecisionResult,
                  opt: optimize.OptimizeResult, rel: reload.ReloadResult, key: str, inputs_sha: str,
                  flavor: runtime.Flavor, missing: dict[str, str], notes: list[str]) -> dict[str, Any]:
        import onnx

        size = opt.path.stat().st_size
        root = self.project.root
        rel_path = job.model.path.resolve().relative_to(root.resolve()) \
            if job.model.path.resolve().is_relative_to(root.resolve()) else job.model.path
        return {
            "manifest_version": manifest.VERSION,
            "project": {"name": self.project.name, "version": self.project.version},
            "target": job.target.name,
            "model": job.model.name,
            "status": "portable" if missing else "complete",
            "missing_providers": missing,
            "source": {"path": str(rel_path), "sha256": src.sha256, "size": src.size,
                       "ir_version": src.ir_version, "opsets": src.opsets},
            "artifact": {"file": "model.ort" if job.settings.format == "ort" else "model.onnx",
                         "format": job.settings.format, "sha256": manifest.sha256_file(opt.path), "size": size,
                         "size_ratio": round(size / src.size, 4)},
            "precision": {"name": prec.precision, "options": prec.options},
            "providers": [p.as_json() for p in job.settings.providers],
            "session": dict(job.settings.session),
            "free_dimensions": dict(job.settings.free_dimensions),
            "optimization": {"requested": opt.requested, "applied": opt.applied, "portable": opt.portable,
                             "tied_to": opt.tied_to, "optimized_with": opt.providers,
                             "op_domains": opt.op_domains},
            "io": src.signature,
            "golden_run": {"providers": rel.providers, "outputs": rel.outputs,
                           "inputs_sha256": inputs_sha},
            "versions": {"ortbuild": __version__, "onnx": onnx.__version__, "onnxruntime": flavor.as_json()},
            "build_machine": runtime.fingerprint(),
            "build_key": key,
            "created": manifest.timestamp(),
            "notes": notes,
        }

    def _publish(self, out_dir: Path, artifact: Path, doc: dict[str, Any]) -> Path:
        out_dir.mkdir(parents=True, exist_ok=True)
        (out_dir / manifest.MANIFEST).unlink(missing_ok=True)  # no manifest may describe a half-done dir
        for stale in ("model.onnx", "model.ort"):
            if stale != doc["artifact"]["file"]:
                (out_dir / stale).unlink(missing_ok=True)
        dest: Path = out_dir / doc["artifact"]["file"]
        manifest.atomic_copy(artifact, dest)
        manifest.atomic_write(out_dir / manifest.MANIFEST, manifest.dumps(doc))
        return dest
