"""The reload step: reload the artifact with optimizations disabled, as a deployment would, and run it."""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from ortbuild import modelfiles, runtime
from ortbuild.artifact import manifest
from ortbuild.project import options
from ortbuild.project.config import Provider, Settings
from ortbuild.project.data import Feed

PRECOMPILED_CONFIG = "session.disable_model_compile"


@dataclass(frozen=True)
class ReloadResult:
    providers: list[str]             # what the session really runs on (InferenceSession.get_providers)
    outputs: list[modelfiles.ValueInfo]  # name, dtype and shape of each output on the golden inputs
    load_seconds: float
    run_seconds: float
    values: list[object] = field(default_factory=list, compare=False, repr=False)  # the outputs themselves

    def manifest_section(self, inputs_sha256: str) -> manifest.GoldenRun:
        return manifest.GoldenRun(providers=self.providers, outputs=self.outputs, inputs_sha256=inputs_sha256)


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
