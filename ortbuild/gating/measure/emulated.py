"""The golden gate of a target whose `platform` is not this machine's: its artifact opened by the generated Python
loader on that platform's ONNX Runtime wheel, under emulation (ortbuild.emulation). The timing gates are SKIPPED
there (`timing_note` says why)."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from importlib.metadata import version
from pathlib import Path

from ortbuild import emulation
from ortbuild.artifact import golden, loaders
from ortbuild.project.plan import Job
from ortbuild.project.settings import Target
from ortbuild.status import Event, PhaseStarted


def requirements(target: Target) -> list[str]:
    """What the emulated environment holds: the target's runtime, and the loader's dependencies at this
    environment's versions."""
    return [*target.requirements, *(f"{d}=={version(d)}" for d in ("numpy", "cryptography"))]


def emulated(target: Target) -> bool:
    return emulation.emulated(target.platform)


def cannot_run(target: Target) -> str:
    """Why the target's platform can be neither run nor emulated here ("" when it can)."""
    return emulation.unavailable(target.platform, requirements(target)) if emulated(target) else ""


def where_timed(target: Target) -> str:
    """Where the target's timing gates run: a runner of its platform (an x86-64 level: a CPU of that level)."""
    runner = ", ".join(target.runner)
    return f"an {target.platform} CPU (runner: {runner})" if target.platform_rule.x86_level else runner


def timing_note(target: Target, info: Mapping[str, object]) -> str:
    return (f"emulated {target.platform} ({info.get('emulator', 'qemu-user')}): emulation says nothing about the "
            f"device's speed; `ortbuild matrix` runs this target on {where_timed(target)}, where every gate runs")


def golden_outputs(job: Job, folder: Path, secret: bytes | None, g: golden.Golden,
                   progress: Callable[[str, Event | str], None]) -> tuple[list[dict[str, object]], dict[str, object]]:
    """Each golden data set's outputs from the artifact in `folder` (by output name), run under emulation, and what
    ran them."""
    plat, reqs = job.target.platform, requirements(job.target)
    if not emulation.ready(plat, reqs):  # said on every stream (PhaseStarted): it downloads, once
        progress(job.name, PhaseStarted(f"setting up the emulated {plat} environment (first time only; each step "
                                        f"says what it downloads; cached in {emulation.cache_root()})"))
    how = ("its x86-64 level's CPU model" if job.target.platform_rule.x86_level
           else f"its onnxruntime wheel ({job.target.runtime_text})")
    progress(job.name, f"golden outputs through the generated Python loader on {plat} ({how}), emulated")
    return emulation.run(plat, reqs, loaders.python_path(folder, job.model.name), folder, secret,
                         [ds.inputs for ds in g.sets], job.name,
                         say=lambda text: progress(job.name, PhaseStarted(text)))
