"""The reload step: reload the artifact with optimizations disabled, as a deployment would, run it on the golden
inputs, and look at what it output.

An artifact whose float output holds NaN/inf where the source model's is finite, or is constant where the source's
varies, is broken (a quantized embedding table whose near-zero padding row rounds to zero, normalized without an
epsilon: NaN everywhere downstream). The source model is run only when an output looks suspicious on its own (a
non-finite value, or every one of its values equal), so a normal build pays nothing for the check.
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from ortbuild import modelfiles, runtime
from ortbuild.artifact import golden, manifest_types
from ortbuild.project import options
from ortbuild.project.config import CustomOps, Provider, Settings
from ortbuild.project.data import Feed

PRECOMPILED_CONFIG = "session.disable_model_compile"


@dataclass(frozen=True)
class ReloadResult:
    providers: list[str]             # what the session really runs on (InferenceSession.get_providers)
    outputs: list[modelfiles.ValueInfo]  # name, dtype and shape of each output on the golden inputs
    load_seconds: float
    run_seconds: float
    values: list[object] = field(default_factory=list, compare=False, repr=False)  # the outputs themselves

    def manifest_section(self, inputs_sha256: str) -> manifest_types.GoldenRun:
        return manifest_types.GoldenRun(providers=self.providers, outputs=self.outputs, inputs_sha256=inputs_sha256)


class RunFailed(Exception):
    """ONNX Runtime opened the artifact but could not run it on the golden inputs (ORT's message, what was fed)."""

    def __init__(self, error: str, fed: str) -> None:
        super().__init__(f"{error} (fed {fed})")
        self.error = error
        self.fed = fed

    def explained(self, model: str, inputs: str) -> tuple[str, str]:
        """The message and hint of the build's error, naming the model's inputs file and its key in targets.toml."""
        return (f"ONNX Runtime could not run the model on the golden inputs of [models.{model}] inputs ({inputs}), "
                f"fed {self.fed}: {self.error}",
                "check that the inputs fit the model: the sizes its dimensions need, e.g. the multiples of 32 a "
                "detector or U-Net that downsamples and adds its feature maps back requires (ONNX Runtime's message "
                "names the node); `ortbuild plan` checks the inputs' names, types and fixed dimensions only")


def fed(feed: Feed) -> str:
    """The inputs fed, as `name dtype [dims]` each."""
    return ", ".join(f"{name} {np.asarray(v).dtype} {list(np.asarray(v).shape)}" for name, v in feed.items())


def run(path: Path, settings: Settings, providers: list[Provider], feed: Feed,
        plugins: dict[str, options.PluginEP] | None = None, *, precompiled: bool = False) -> ReloadResult:
    so = runtime.session_options(settings, "disable")
    if precompiled:  # an EPContext model must load without compiling anything (it fails instead)
        so.add_session_config_entry(PRECOMPILED_CONFIG, "1")
    t0 = time.perf_counter()
    sess = runtime.open_session(str(path), so, providers, plugins)
    t1 = time.perf_counter()
    try:
        results = sess.run(None, feed)
    except Exception as e:  # ORT opened the model but cannot run it on these inputs: say which, and what they were
        raise RunFailed(" ".join(str(e).split())[:2000] or type(e).__name__, fed(feed)) from e  # every line of it
    t2 = time.perf_counter()
    outputs: list[modelfiles.ValueInfo] = [
        {"name": o.name, "dtype": str(np.asarray(r).dtype), "shape": list(np.asarray(r).shape)}
        for o, r in zip(sess.get_outputs(), results, strict=True)]
    return ReloadResult(providers=sess.get_providers(), outputs=outputs, load_seconds=t1 - t0,
                        run_seconds=t2 - t1, values=list(results))


@dataclass(frozen=True)
class Broken:
    """An output of the artifact that is broken where the source model's is not."""

    output: str
    problem: str                     # what is wrong with its numbers, against the source's

    def __str__(self) -> str:
        return f"output '{self.output}' is {self.problem}"


def _floats(value: object) -> np.ndarray | None:
    return value if isinstance(value, np.ndarray) and value.dtype.kind == "f" else None


def _constant(a: np.ndarray) -> bool:
    """Every one of its values (two or more, all finite) equal."""
    return a.size > 1 and bool(np.isfinite(a).all()) and bool((a == a.flat[0]).all())


def suspicious(result: ReloadResult) -> list[str]:
    """The float outputs that look broken on their own: a non-finite value, or every one of 2+ values equal. Only
    these are compared with the source model's (which costs a run of it)."""
    out = []
    for info, value in zip(result.outputs, result.values, strict=True):
        a = _floats(value)
        if a is not None and a.size and (not np.isfinite(a).all() or _constant(a)):
            out.append(info["name"])
    return out


def compare(values: Mapping[str, object], source: Mapping[str, object]) -> list[Broken]:
    """The outputs in `values` (the artifact's) broken where the source's (`source`, same feed) are not: non-finite
    values where the source's are finite (element by element where the shapes match), or a constant where the
    source's varies."""
    broken = []
    for name, value in values.items():
        a, b = _floats(value), _floats(source.get(name))
        if a is None or b is None or not a.size:
            continue
        bad = ~np.isfinite(a)
        if bad.any():
            if a.shape == b.shape:
                bad &= np.isfinite(b)
            elif not np.isfinite(b).all():
                continue
            nan, inf = int((bad & np.isnan(a)).sum()), int((bad & np.isinf(a)).sum())
            if nan or inf:
                kinds = " and ".join(f"{k} in {n}" for k, n in (("NaN", nan), ("inf", inf)) if n)
                broken.append(Broken(name, f"{kinds} of {a.size} values where the source model's are finite"))
        elif _constant(a) and (std := golden.varies(b)) is not None:
            broken.append(Broken(name, f"constant {float(a.flat[0]):.6g} in all {a.size} values where the source "
                                       f"model's vary (std {std:.3g})"))
    return broken


def broken_outputs(result: ReloadResult, source: Path, feed: Feed, custom_ops: Sequence[CustomOps]) -> list[Broken]:
    """The artifact's outputs broken where the source model's are not, the source run (CPU provider, no
    optimization, from its path: external data included) only when some output looks suspicious. A source that
    cannot run here is not compared: the accuracy gate, which needs it too, says why."""

    names = suspicious(result)
    if not names:
        return []
    try:
        (expected,), _ = golden.compute(source, [feed], custom_ops)
    except Exception:  # no comparison without the source's outputs: the accuracy gate reports the cause
        return []
    values = {i["name"]: v for i, v in zip(result.outputs, result.values, strict=True) if i["name"] in names}
    return compare(values, expected)


def explained_broken(broken: Sequence[Broken], target: str, model: str, settings: Settings) -> tuple[str, str]:
    """The message and hint of the build's error for broken outputs: what is wrong, and how to keep layers in
    float (a reduced precision) or what else changed the numbers (fp32)."""
    message = "; ".join(map(str, broken)) + " (the artifact run on the golden inputs)"
    knob = settings.rule.knob
    if knob is None:
        hint = (f"precision {settings.precision} converted nothing: the optimization, the fusion or the provider "
                f"changed the numbers; try optimization = \"basic\" or fusion = {{ model_type = \"off\" }} on "
                f"[targets.{target}] and compare with `ortbuild inspect`")
        return message, hint
    keys = f"{knob.table}.{knob.nodes}" + (f" or {knob.table}.{knob.op_types}" if knob.op_types else "")
    hint = (f"precision {settings.precision} broke it: set precision_search = \"auto\" on [targets.{target}] and the "
            f"build searches for the layers to keep in float; or `ortbuild test --explain -t {target} -m {model}` "
            f"finds them and prints the override; or keep them in float by hand ({keys})")
    return message, hint
