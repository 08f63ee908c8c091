"""`ortbuild test`: the release gates of every artifact, opened through its generated Python loader.

Per (target, model): golden-output accuracy (ortbuild.golden, ortbuild.compare), latency budgets
(ortbuild.latency) and size budgets. Verdicts: PASS, FAIL, INCONCLUSIVE (latency the samples cannot decide)
or SKIPPED (the target cannot run here; with `require` that is a failure).
"""

from __future__ import annotations

import base64
import json
import os
import platform
import shlex
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from . import __version__, compare, golden, latency, loaders, manifest, paths, runtime
from .build import FAILED, PORTABLE, SKIPPED, JobResult
from .config import Project, did_you_mean
from .errors import ConfigError, GateFailed, MissingProvider, OrtbuildError, RuntimeMismatch, from_loader
from .keys import SigningKey
from .plan import Job

PASS, FAIL, INCONCLUSIVE = latency.PASS, latency.FAIL, latency.INCONCLUSIVE
SKIP = "SKIPPED"
REPORT = "test-report.json"
REPORT_SIG = "test-report.sig"      # Ed25519 over the exact bytes of test-report.json, by the signing key
SIZE_SLACK = 4096  # bytes a ratio budget allows on top: the container header, tags and graph metadata


@dataclass
class TestResult:
    target: str
    model: str
    precision: str
    status: str = PASS
    reason: str = ""
    accuracy: str = "-"
    worst: str = "-"
    outputs: list[dict[str, Any]] = field(default_factory=list)
    golden: dict[str, Any] = field(default_factory=dict)
    latency: dict[str, Any] = field(default_factory=dict)
    latency_verdict: str = "-"
    size: dict[str, Any] = field(default_factory=dict)
    size_verdict: str = "-"
    failures: list[str] = field(default_factory=list)   # the failure report's lines
    reproduce: str = ""
    explain: dict[str, Any] = field(default_factory=dict)  # `--explain`: the precision search (ortbuild.explain)
    build_key: str = ""
    artifact_sha256: str = ""        # the artifact these verdicts are about (release refuses stale verdicts)
    exit_code: int = 0

    def fail(self, lines: list[str], code: int = GateFailed.exit_code) -> None:
        self.failures += lines
        self.exit_code = self.exit_code or code

    def as_json(self) -> dict[str, Any]:
        return asdict(self)


def environment() -> dict[str, Any]:
    """What the latency numbers depend on, recorded with them."""
    ort = runtime.import_ort()

    fp = runtime.fingerprint()
    flavor = runtime.installed_flavor()
    return {"cpu": fp["cpu"], "isa_flags": fp["isa_flags"], "simd_level": fp["simd_level"],
            "cpus": os.cpu_count(), "load_average": [round(x, 2) for x in os.getloadavg()],
            "onnxruntime": flavor.as_json() if flavor else {"version": ort.__version__},
            "ortbuild": __version__, "python": platform.python_version(), "machine": platform.machine()}


def _size_fix(job: Job, m: manifest.Manifest) -> str:
    """The targets.toml option that makes this artifact smaller, from what its build recorded."""
    where = f"[targets.{job.target.name}]"
    inf, changed, s = m.optimization.inflation, m.precision.changed, job.settings
    if inf and "disabled" not in inf.get("action", ""):
        if s.constant_folding == "on":
            return f'constant_folding = "auto" (the default) or "off" in {where}: the build optimizes without it'
        return (f'constant folding was not the cause (disabling it did not help): raise size.max_ratio in {where} '
                "if this size is expected")
    if changed is not None and changed.get("converted", 1.0) < 0.5:
        return (f"the precision step converted only {changed['converted']:.0%} of the float weights (the build's "
                f"note says which ops hold the rest): name them in quantization.op_types in {where}")
    if s.precision == "fp16" and not m.optimization.portable:
        return (f'optimization = "basic" in {where}: at higher levels ORT upcasts fp16 weights for the CPU '
                "provider")
    return f"raise size.max_ratio or size.max_mb in {where} if this size is expected"


class Tester:
    def __init__(self, project: Project, dist: Path, secret: bytes | None, config_arg: str,
                 progress: Callable[[str, str], None], sign_key: SigningKey | None = None) -> None:
        self.project = project
        self.sign_key = sign_key  # signs the golden data into each tested artifact's manifest
        self.dist = dist
        self.secret = secret
        self.config_arg = config_arg
        self.progress = progress
        self.golden_cache: dict[str, golden.Golden] = {}
        self._outputs: dict[str, list[str]] = {}

    def reproduce(self, job: Job) -> str:
        cfg = "" if self.config_arg == "targets.toml" else f" -c {shlex.quote(self.config_arg)}"
        return (f"ortbuild test{cfg} -t {job.target.name} -m {job.model.name}   "
                f"(or: nox -s \"test({job.target.name})\" -- -m {job.model.name})")

    def run(self, jobs: list[Job], built: dict[str, JobResult], require: bool) -> list[TestResult]:
        results = []
        for job in jobs:
            res = TestResult(job.target.name, job.model.name, job.settings.precision, reproduce=self.reproduce(job))
            b = built[job.name]
            if b.status == FAILED:
                res.reason = f"build failed: {b.reason}"
                res.fail([res.reason], b.error.exit_code if b.error else 6)
            elif b.status in (SKIPPED, PORTABLE):
                res.status, res.reason = SKIP, b.reason
                if b.status == SKIPPED:  # another runtime: say which session tests it
                    res.reason = (f"runs in {job.target.runtime_text}, not in this environment: "
                                  f"nox -s \"test({job.target.name})\" tests it in its own virtualenv")
                if require or job.target.require:
                    code = RuntimeMismatch.exit_code if b.status == SKIPPED else MissingProvider.exit_code
                    res.fail([f"required, but cannot run here: {res.reason}"], code)
            else:
                try:
                    self.gate(job, res, built)
                except OrtbuildError as e:
                    res.reason = e.message
                    res.fail([e.render().removeprefix("ortbuild: ")], e.exit_code)
            if res.failures:  # any failure line, from any gate or path, makes the verdict FAIL
                res.status = FAIL
            self.progress(job.name, f"{res.status}" + (f": {res.reason}" if res.reason else ""))
            if b.status != SKIPPED:  # never overwrite the verdict another runtime's environment wrote
                self.write_report(job, res)
            results.append(res)
        return results

    def write_report(self, job: Job, res: TestResult) -> None:
        folder = paths.inside(self.dist, job.target.name, job.model.name)
        if folder.is_dir():
            doc = {"result": res.as_json(), "environment": environment()}
            text = (json.dumps(doc, indent=2, default=str) + "\n").encode()
            if self.sign_key is not None:  # release takes verdicts only from a report the trusted key signed
                manifest.atomic_write(folder / REPORT_SIG, base64.b64encode(self.sign_key.sign(text)) + b"\n")
            else:
                (folder / REPORT_SIG).unlink(missing_ok=True)
            manifest.atomic_write(folder / REPORT, text)

    # ------------------------------------------------------------------------------------------ one job

    def gate(self, job: Job, res: TestResult, built: dict[str, JobResult]) -> None:
        """Every gate of one built job: accuracy, size, latency (`built`: the references of relative budgets)."""
        module, g, m = self.accuracy_gate(job, res)
        self._size(job, res, m)
        self._latency(job, res, module, g, built)
        if not res.failures and res.latency_verdict == INCONCLUSIVE:
            res.status = INCONCLUSIVE
            res.reason = res.latency.get("note", "latency inconclusive")

    def accuracy_gate(self, job: Job, res: TestResult) -> tuple[Any, golden.Golden, manifest.Manifest]:
        """The golden-output gate of the published artifact, through its generated Python loader: fills
        `res` and returns the loader module, the golden data and the manifest."""
        folder = paths.inside(self.dist, job.target.name, job.model.name)
        m, _ = manifest.read(folder)
        res.build_key, res.artifact_sha256 = m.build_key, m.artifact.sha256
        module: Any = loaders.import_python_loader(folder / loaders.LOADER_DIR / loaders.PYTHON)
        self.progress(job.name, "golden outputs through the generated Python loader")
        try:
            model = module.load(key=self.secret, folder=folder)
        except module.LoaderError as e:
            raise from_loader(e, f"{job.target.name}/{job.model.name}") from None
        g = self._golden_of(job, m.io)
        sk = self.sign_key
        golden.write(folder, g, m.io, sign=None if sk is None else
                     lambda files: manifest.sign_golden(folder, files, sk.sign, sk.public_raw))
        res.golden = {"made_by": g.made_by, "source": g.source, "digest": golden.digest(g),
                      "data_sets": [d.name for d in g.sets], "dir": str(folder / golden.GOLDEN_DIR)}
        self._accuracy(job, res, model, g, m.io)
        return module, g, m

    def _target_outputs(self, job: Job) -> list[str]:
        """The output names of every model of the job's target (read once per target)."""
        import onnx

        if job.target.name not in self._outputs:
            names: list[str] = []
            for m in job.target.models:
                graph = onnx.load(str(self.project.models[m].path), load_external_data=False).graph
                names += [o.name for o in graph.output if o.name not in names]
            self._outputs[job.target.name] = names
        return self._outputs[job.target.name]

    def _golden_of(self, job: Job, io: dict[str, Any]) -> golden.Golden:
        if job.model.name not in self.golden_cache:
            self.golden_cache[job.model.name] = golden.golden_for(job.model, io, job.settings.custom_ops)
        return self.golden_cache[job.model.name]

    def _accuracy(self, job: Job, res: TestResult, model: Any, g: golden.Golden, io: dict[str, Any]) -> None:
        gates = job.settings.gates
        assert gates is not None
        names = [o["name"] for o in io["outputs"]]
        known = self._target_outputs(job)
        for name in gates.accuracy.get("outputs", {}):  # a table may name another model's output, not a typo
            if name not in known:
                raise ConfigError(str(self.project.file), f"targets.{job.target.name}.accuracy.outputs.{name}",
                                  f"no model of this target has an output '{name}'{did_you_mean(name, known)}",
                                  f"the outputs are: {', '.join(known)}")
        results: list[compare.OutputResult] = []
        for ds in g.sets:
            got = model.run(ds.inputs)
            for name in names:
                rule = gates.accuracy_rule(job.settings.precision, name)
                results.append(compare.compare(name, ds.name, ds.expected[name], got[name], rule))
        res.outputs = [r.as_json() for r in results]
        res.worst = compare.worst_metric(results)
        failed = [r for r in results if not r.passed]
        res.accuracy = FAIL if failed else PASS
        for r in failed:
            res.fail([f"accuracy: {job.name} " + line if i == 0 else line
                      for i, line in enumerate(compare.describe_failure(r))])

    def _size(self, job: Job, res: TestResult, m: manifest.Manifest) -> None:
        gates = job.settings.gates
        assert gates is not None
        size, src = m.artifact.size, m.source.size
        ratio = size / src
        max_ratio, max_mb = gates.max_ratio(job.settings.precision), gates.size.max_mb
        res.size = {"bytes": size, "source_bytes": src, "ratio": ratio, "max_ratio": max_ratio, "max_mb": max_mb,
                    "inflation": m.optimization.inflation}
        problems = []
        if size > max_ratio * src + SIZE_SLACK:
            problems.append(f"artifact {size / 1024:.1f} KB is {ratio:.2f}x its source ({src / 1024:.1f} KB), "
                            f"above max_ratio {max_ratio} (+ {SIZE_SLACK // 1024} KB)")
        if max_mb is not None and size > max_mb * (1 << 20):
            problems.append(f"artifact {size / (1 << 20):.2f} MiB is above max_mb {max_mb}")
        res.size_verdict = FAIL if problems else PASS
        if problems:
            lines = [f"size: {job.name} {'; '.join(problems)}"]
            inf = m.optimization.inflation
            if inf:
                lines.append(f"  constant folding grew the weights {inf['growth']}x ({inf.get('action', '')}): "
                             + ", ".join(f"{x['initializer']} ({x['dtype']}, {x['bytes'] / 1024:.0f} KB, from "
                                         f"{x['pattern']})" for x in inf["grown"][:3]))
            lines.append(f"  hint: {_size_fix(job, m)}")
            res.fail(lines)

    def _latency(self, job: Job, res: TestResult, module: Any, g: golden.Golden, built: dict[str, JobResult]) -> None:
        gates = job.settings.gates
        assert gates is not None
        lat = gates.latency
        budgets = lat.budgets()
        feed = g.sets[0].inputs
        folder = paths.inside(self.dist, job.target.name, job.model.name)

        def opener(mod: Any, where: Path) -> Callable[[], Callable[[], object]]:
            def open_() -> Callable[[], object]:
                loaded = mod.load(key=self.secret, folder=where)
                return lambda: loaded.run(feed)
            return open_

        opens = {job.target.name: opener(module, folder)}
        ft = lat.faster_than
        ref_problem = None
        if ft is not None:
            ref_target = self.project.targets[ft.target]
            ref_build = built.get(f"{ft.target}/{job.model.name}")
            if ref_build is None or ref_build.status in (FAILED, SKIPPED, PORTABLE):
                ref_problem = (f"{ft.target} cannot run here ({ref_build.reason if ref_build else 'not built'}); "
                               f"relative budgets compare targets of one runtime ({ref_target.runtime_text})")
            else:
                rfolder = paths.inside(self.dist, ft.target, job.model.name)
                opens[ft.target] = opener(loaders.import_python_loader(rfolder / loaders.LOADER_DIR / loaders.PYTHON),
                                          rfolder)
        n = latency.planned_samples([*budgets, *([0.5] if ft else [])], lat.confidence, lat.min_samples)
        self.progress(job.name, f"latency: {n}+ samples, {lat.min_seconds:g}s+"
                                + (f", interleaved with {ft.target}" if ft and len(opens) > 1 else ""))
        series = latency.measure(opens, n, lat.min_seconds, lat.warmup_runs)
        mine = series[job.target.name]
        threads = job.settings.session.intra_op_num_threads
        out: dict[str, Any] = {**mine.summary(), "samples_ms": [round(x, 4) for x in mine.samples],
                               "threads": threads or f"ORT default ({os.cpu_count()} CPUs)",
                               "unstable": mine.instability(), "verdicts": [], "confidence": lat.confidence}
        verdicts: list[latency.PercentileVerdict] = []
        lines: list[str] = []
        for p, budget in budgets.items():
            v = latency.percentile_verdict(mine.samples, p, budget, lat.confidence)
            verdicts.append(v)
            out["verdicts"].append({"kind": f"p{round(p * 100)}", **latency.as_json(v)})
            if v.verdict == FAIL:
                lines.append(f"latency: {job.name} p{round(p * 100)} {v.observed:.3f} ms (at least "
                             f"{v.lower:.3f} ms with {lat.confidence:.0%} confidence) > budget {budget} ms "
                             f"({v.exceeding} of {v.samples} samples above it)")
        if ft is not None:
            if ref_problem:
                out["relative"] = {"target": ft.target, "ratio": ft.ratio, "verdict": SKIP, "note": ref_problem}
            else:
                other = series[ft.target]
                v = latency.relative_verdict(mine.samples, other.samples, ft.ratio, lat.confidence)
                verdicts.append(v)
                p50, other_p50 = mine.summary()["p50_ms"], other.summary()["p50_ms"]
                speedup = other_p50 / p50
                out["relative"] = {"target": ft.target, "ratio": ft.ratio, "observed_ratio": speedup,
                                   "reference": other.summary(), **latency.as_json(v)}
                if v.verdict == FAIL:
                    lines.append(f"latency: {job.name} is {speedup:.2f}x as fast as {ft.target} (median "
                                 f"{p50:.3f} ms vs {other_p50:.3f} ms, interleaved), below faster_than ratio "
                                 f"{ft.ratio}")
        inconclusive = [v for v in verdicts if v.verdict == INCONCLUSIVE]
        res.latency_verdict = FAIL if lines else (INCONCLUSIVE if inconclusive else (PASS if verdicts else "-"))
        if inconclusive:
            out["note"] = "; ".join(f"p{round(v.percentile * 100)}: {v.note}" for v in inconclusive)
        if out["unstable"]:
            out["note"] = "; ".join([*([out["note"]] if "note" in out else []), *out["unstable"]])
        res.latency = out
        if lines:
            res.fail(lines)
