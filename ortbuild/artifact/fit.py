"""Whether an artifact fits this machine and environment: its SIMD layout, the runtime flavor it was built
with, and its providers probed with a real session (`ortbuild inspect`, the test gates)."""

from __future__ import annotations

from ortbuild import installed, machine, runtime
from ortbuild.artifact.manifest_types import Manifest
from ortbuild.project import options
from ortbuild.project.config import Provider


def problems(m: Manifest) -> list[str]:
    """Why this machine/environment should not use the artifact (empty: it fits)."""
    problems = []
    tied = m.optimization.tied_to
    want_simd = tied.get("simd_level")
    if want_simd and want_simd != machine.simd_level():
        problems.append(f"built with a {want_simd} NCHWc layout (optimization "
                        f"'{m.optimization.applied}'); this machine is {machine.simd_level()}: "
                        "rebuild it here or use optimization = \"extended\"")
    flavor = installed.installed_flavor()
    built = m.versions["onnxruntime"]
    if flavor is None:
        problems.append(f"no ONNX Runtime installed; the artifact was built with {built['distribution']} "
                        f"{built['version']}")
        return problems
    if flavor.distribution != built["distribution"]:
        problems.append(f"built with {built['distribution']}, this environment has {flavor.distribution}")

    def plugin(name: str) -> options.PluginEP | None:  # the provider's plugin EP, as the build used it
        return options.PLUGINS.get(m.plugins[name]["package"]) if name in m.plugins else None

    configured = {p["name"]: Provider(p["name"], p.get("options", {})) for p in m.providers}
    compiled = tied.get("compiled_for", {}).get("provider")
    for name in tied.get("providers", []):
        reason = runtime.probe_provider(configured.get(name, Provider(name)), plugin(name))
        if reason:
            what = "the artifact is compiled for" if name == compiled else "the graph holds ops fused for"
            problems.append(f"{what} {name}: {reason}")
    for p in m.providers:
        if p["name"] not in tied.get("providers", []):
            reason = runtime.probe_provider(configured[p["name"]], plugin(p["name"]))
            if reason:
                problems.append(f"the target's provider cannot run here, ORT would fall back silently: {reason}")
    return problems
