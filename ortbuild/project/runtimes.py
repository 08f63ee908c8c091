"""A target's `runtime` (one ONNX Runtime flavor and the plugin EPs it loads) and its providers: offered by that
runtime, their options checked, ortbuild's safe defaults added.
"""

from __future__ import annotations

import importlib.metadata as md
import json
from dataclasses import dataclass
from typing import Any

from packaging.requirements import InvalidRequirement, Requirement
from packaging.utils import canonicalize_name

from ortbuild.project import capabilities, options, precisions
from ortbuild.project.checker import PLUGIN_EXAMPLE, Checker, did_you_mean, providers_of
from ortbuild.project.precisions import PrecisionRule, Quantizer


@dataclass(frozen=True)
class Runtime:
    """A target's parsed `runtime`: the flavor's requirement, its plugin EPs' requirements, and which package
    provides each provider it can offer."""

    flavor: str
    plugins: tuple[str, ...]
    offered: dict[str, str]          # provider -> the flavor's name, or the plugin package providing it

    @property
    def text(self) -> str:
        return " + ".join([self.flavor, *self.plugins])

    def from_plugin(self, provider: str) -> bool:
        return self.offered.get(provider) in options.PLUGINS


def _pin_problem(req: Requirement) -> str | None:
    """Why a runtime requirement is not a plain pin (name[extras]==version), or None. Markers and direct URLs
    are refused: a marker can make pip install nothing (or another flavor), a URL installs whatever it names."""
    if req.url:
        return f"is a direct reference (@ {req.url})"
    if req.marker is not None:
        return f"has an environment marker (; {req.marker})"
    specs = list(req.specifier)
    if len(specs) != 1 or specs[0].operator != "==" or "*" in specs[0].version:
        return "does not pin one exact version with ==" if specs else "names no version"
    return None


# The extras each runtime distribution declares (Provides-Extra), read from PyPI's metadata of the release named
# (pip's metadata-only resolution, no wheel fetched). A runtime's extras are checked against these unless the
# distribution is installed here at the pinned version: then its own installed metadata decides (docs/targets.md).
# onnxruntime-rocm is not on PyPI (AMD's index serves it): none known, so only an installed one may name extras.
KNOWN_EXTRAS: dict[str, tuple[str, frozenset[str]]] = {
    "onnxruntime": ("1.31.1", frozenset({"symbolic", "quantization"})),
    "onnxruntime-gpu": ("1.31.1", frozenset({"symbolic", "quantization", "cuda", "cudnn"})),
    "onnxruntime-openvino": ("1.24.1", frozenset()),
    "onnxruntime-directml": ("1.24.4", frozenset()),
    "onnxruntime-qnn": ("2.7.0", frozenset()),
    "onnxruntime-ep-openvino": ("1.8.1", frozenset()),
}


def declared_extras(name: str, version: str) -> tuple[frozenset[str], str] | None:
    """The extras distribution `name` declares at `version` (names normalized, PEP 685) and where that comes from:
    the installed distribution's metadata when this environment has that very version, else KNOWN_EXTRAS; None
    when neither knows."""
    try:
        if md.version(name) == version:
            return (frozenset(canonicalize_name(e) for e in md.metadata(name).get_all("Provides-Extra") or []),
                    f"the metadata of {name} {version} installed here")
    except md.PackageNotFoundError:
        pass
    known = KNOWN_EXTRAS.get(name)
    if known is None:
        return None
    checked, extras = known
    return extras, f"{name} {checked}'s metadata on PyPI" + (f" (the pin is {version}; install that release here "
                                                              "and its own metadata decides)" if checked != version
                                                              else "")


def _extras_problem(req: Requirement) -> tuple[str, str] | None:
    """(why, hint) when the requirement names an extra its distribution does not declare, or None."""
    if not req.extras:
        return None
    name, version = canonicalize_name(req.name), _pinned_version(req)
    found = declared_extras(name, version)
    if found is None:
        return (f"names extras {sorted(req.extras)}, and ortbuild cannot tell which extras {name} {version} "
                "declares (it is neither installed here at that version nor in ortbuild's table)",
                f'install {name}=={version} into this environment, or write "{name}=={version}" without extras')
    declared, source = found
    unknown = sorted(e for e in req.extras if canonicalize_name(e) not in declared)
    if not unknown:
        return None
    return (f"names the extra{'s' if len(unknown) > 1 else ''} {', '.join(repr(e) for e in unknown)}, which {name} "
            f"does not declare (its extras: {', '.join(sorted(declared)) or 'none'}; from {source})",
            "pip ignores an extra its distribution does not declare (with only a warning), so it adds nothing: "
            "remove it, or name one of the declared extras")


def _pinned_version(req: Requirement) -> str:
    """The version a requirement names, for the hint (else a placeholder)."""
    versions = [s.version for s in req.specifier if s.operator in ("==", "===", ">=", "~=") and "*" not in s.version]
    return versions[0] if versions else "<version>"


def parse_runtime(chk: Checker, where: str, runtime: str | list[str]) -> Runtime:
    """The target's flavor and plugin EP requirements (one flavor; plugins that plug into it)."""
    flavor_req: str | None = None
    plugins: list[str] = []
    for text in [runtime] if isinstance(runtime, str) else runtime:
        try:
            req = Requirement(text)
        except InvalidRequirement as e:
            raise chk.fail(where, f"'{text}' is not a pip requirement: {e}",
                           "write it like onnxruntime==1.31.1") from None
        name = req.name.lower()
        if name not in options.PLUGINS and name not in options.RUNTIMES:
            raise chk.fail(where, f"unknown ONNX Runtime flavor or plugin EP '{req.name}'"
                                  f"{did_you_mean(name, [*options.RUNTIMES, *options.PLUGINS])}",
                           f"flavors: {', '.join(options.RUNTIMES)}; plugin EPs: {', '.join(options.PLUGINS)}")
        problem = _pin_problem(req)
        if problem:  # what nox would install and what the build checks against must be one exact release
            raise chk.fail(where, f"'{text}' {problem}: a runtime is a plain pin of one release",
                           f'write it like "{req.name}=={_pinned_version(req)}" (name, optional [extras], == and '
                           "one exact version)")
        extras = _extras_problem(req)
        if extras:
            raise chk.fail(where, f"'{text}' {extras[0]}", extras[1])
        if name in options.PLUGINS:
            if text in plugins or any(Requirement(p).name.lower() == name for p in plugins):
                raise chk.fail(where, f"{req.name} is listed twice")
            plugins.append(text)
        else:  # a flavor (options.RUNTIMES)
            if flavor_req is not None:
                raise chk.fail(where, f"lists two ONNX Runtime flavors ({flavor_req}, {text})",
                               "one flavor per target: they overwrite each other's `onnxruntime` module")
            flavor_req = text
    if flavor_req is None:
        raise chk.fail(where, "names no ONNX Runtime flavor", f"e.g. {PLUGIN_EXAMPLE}")
    flavor = Requirement(flavor_req).name.lower()
    offered = {p: flavor for p in options.RUNTIMES[flavor]}
    for text in plugins:
        plugin = options.PLUGINS[Requirement(text).name.lower()]
        if flavor not in plugin.flavors:
            raise chk.fail(where, f"{plugin.package} plugs into {', '.join(plugin.flavors)}, not {flavor}",
                           f'e.g. runtime = ["onnxruntime==1.31.1", "{text}"]')
        if plugin.provider in offered:
            raise chk.fail(where, f"{plugin.provider} comes from both {flavor} and {plugin.package}",
                           "keep one of them")
        offered[plugin.provider] = plugin.package
    return Runtime(flavor_req, tuple(plugins), offered)


def check_providers(chk: Checker, where: str, at: str, rt: Runtime, providers: list[Any]) -> None:
    """Every listed provider is supported and offered by the runtime (errors about the runtime at `where`, about
    the list at `at`); plugin EP targets list only the plugin's provider and the CPU."""
    listed = providers_of(providers)
    for p in listed:
        gap = capabilities.unsupported(p.name)
        if gap:
            raise chk.fail(at, gap, f"supported providers: {', '.join(capabilities.supported())} "
                                    "(docs/targets.md)")
        if p.name not in rt.offered:
            owner = [r for r, eps in options.RUNTIMES.items() if p.name in eps]
            owner += [pl.package for pl in options.PLUGINS.values() if p.name == pl.provider]
            hint = f"{p.name} ships in {' or '.join(owner)}" if owner else None
            raise chk.fail(where, f"{rt.text} does not provide {p.name}", hint)
    from_plugin = [p.name for p in listed if rt.from_plugin(p.name)]
    others = [p.name for p in listed if not rt.from_plugin(p.name) and p.name != "CPUExecutionProvider"]
    if from_plugin and others:
        raise chk.fail(at, f"{from_plugin[0]} (a plugin EP) cannot be combined with {others[0]} here",
                       "list the plugin EP and CPUExecutionProvider (its fallback) only")


def effective_providers(chk: Checker, where: str, eff: dict[str, Any], rt: Runtime) -> list[Any]:
    """The providers as built, tested and loaded: options checked against the runtime that provides them, and
    ortbuild's safe defaults added where the target did not state them (docs/targets.md)."""
    out: list[Any] = []
    for i, p in enumerate(providers_of(eff["providers"])):
        opts = dict(p.options)
        at = f"{where}[{i}].options"
        for opt, why in options.PLAINTEXT_OPTIONS.get(p.name, {}).items():
            if opt in opts:
                raise chk.fail(f"{at}.{opt}", f"is refused: {why}", f"remove {opt}")
        if rt.from_plugin(p.name):
            for opt in opts:
                if opt in options.PLUGIN_IGNORED.get(p.name, {}):
                    raise chk.fail(f"{at}.{opt}", f"the {p.name} plugin ignores it (with only a warning)",
                                   f"use {options.PLUGIN_IGNORED[p.name][opt]}")
                if opt not in options.PLUGIN_OPTIONS.get(p.name, frozenset(opts)):
                    known = sorted(options.PLUGIN_OPTIONS[p.name])
                    raise chk.fail(f"{at}.{opt}", f"unknown option of the {p.name} plugin{did_you_mean(opt, known)}",
                                   f"its options: {', '.join(known)}")
            device = str(opts.get("device_type", "CPU"))
            if device not in options.PLUGIN_DEVICE_TYPES:
                raise chk.fail(f"{at}.device_type",
                               f"'{device}' is not one of {', '.join(options.PLUGIN_DEVICE_TYPES)}",
                               "the plugin EP offers one device per kind; HETERO/MULTI/AUTO are not supported")
            opts["device_type"] = device
        if p.name == "OpenVINOExecutionProvider":
            opts = pin_precision_hint(chk, at, opts, precisions.rule(eff["precision"]))
        for opt, value in options.PROVIDER_DEFAULTS.get(p.name, {}).items():
            opts.setdefault(opt, value)
        out.append({"name": p.name, "options": opts})
    return out


def pin_precision_hint(chk: Checker, at: str, opts: dict[str, Any], rule: PrecisionRule) -> dict[str, Any]:
    """OpenVINO's CPU plugin runs "fp32" models in bf16 on CPUs with AMX unless told otherwise: an fp32 target
    gets INFERENCE_PRECISION_HINT = f32 in load_config; a target that wants bf16/f16 states it there."""
    device = str(opts.get("device_type", "CPU"))
    if device not in options.PLUGIN_DEVICE_TYPES:
        return opts  # HETERO:/MULTI:/GPU.1 (the flavor's device strings): the target states load_config itself
    try:
        config = json.loads(str(opts.get("load_config", "{}")))
    except ValueError:
        config = None
    if not isinstance(config, dict) or not all(isinstance(v, dict) for v in config.values()):
        raise chk.fail(f"{at}.load_config", "must be a JSON object of device -> {property: value}",
                       'e.g. \'{"CPU": {"INFERENCE_PRECISION_HINT": "f32"}}\'')
    props = config.setdefault(device, {})
    hint = props.get("INFERENCE_PRECISION_HINT")
    if hint is None:
        if rule.quantizer is not Quantizer.NONE:
            return opts  # fp16/int8 graphs: the device's default execution precision is what they ask for
        props["INFERENCE_PRECISION_HINT"] = "f32"
    elif str(hint).lower() not in options.PRECISION_HINTS:
        raise chk.fail(f"{at}.load_config", f"INFERENCE_PRECISION_HINT '{hint}' is not one of "
                                            f"{', '.join(options.PRECISION_HINTS)}")
    return {**opts, "load_config": json.dumps(config, sort_keys=True, separators=(",", ":"))}
