"""Generated loaders: a Python module, a Node.js ES module (+ .d.ts) and a browser ES module (onnxruntime-web),
rendered from a Manifest.

Templates live in ortbuild/artifact/templates/ (jinja2). The loaders pin the signing public key, the target's
providers, provider options and session options; they read everything else from the signed manifest.
"""

from __future__ import annotations

import functools
import hashlib
import json
import pprint
import types
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

from ortbuild import __version__, paths

if TYPE_CHECKING:
    import jinja2

from ortbuild.artifact.manifest_types import READABLE_FORMATS, LoaderFile, Manifest
from ortbuild.project.kinds import Kind, kind_rule

LOADER_DIR = "loader"
# The Python loader is a module named per model (python_file: `import ortbuild_<model>`), so one app imports several
# side by side; the JavaScript ones are imported by path, where one name per kind collides with nothing.
NODE, NODE_TYPES, WEB = "ortbuild_loader.mjs", "ortbuild_loader.d.ts", "ortbuild_loader.web.mjs"
LEGACY_PYTHON = "ortbuild_loader.py"  # ortbuild before per-model names: rebuilt (the key), removed by clean
# What onnxruntime-node ships, by ONNX Runtime provider name (the Node template has the same table).
NODE_PROVIDERS = {"CPUExecutionProvider": "cpu", "CUDAExecutionProvider": "cuda", "DmlExecutionProvider": "dml",
                  "CoreMLExecutionProvider": "coreml", "WebGpuExecutionProvider": "webgpu"}
# The provider options onnxruntime-node 1.30's binding hands to ONNX Runtime (js/node/src/session_options_helper.cc:
# deviceId for CUDA and DirectML, coreMlFlags for CoreML, its named options for WebGPU; none for the CPU); the Node
# template has the same table (NODE_PROVIDER_OPTIONS) and refuses a target that sets any other.
NODE_PROVIDER_OPTIONS: dict[str, set[str] | None] = {
    "CPUExecutionProvider": set(), "CUDAExecutionProvider": {"device_id"}, "DmlExecutionProvider": {"device_id"},
    "CoreMLExecutionProvider": {"coreml_flags", "coreMlFlags"}, "WebGpuExecutionProvider": None}  # None: all

# What onnxruntime-web 1.30 runs, by ONNX Runtime provider name (the web template has the same table): the CPU
# provider's kernels compiled to WebAssembly, and WebGPU. The options it hands to ONNX Runtime
# (js/web/lib/wasm/session-options.ts): none for WASM, preferredLayout for WebGPU (its JSEP build reads no other).
WEB_PROVIDERS = {"CPUExecutionProvider": "wasm", "WebGpuExecutionProvider": "webgpu"}
WEB_PROVIDER_OPTIONS: dict[str, set[str]] = {"CPUExecutionProvider": set(),
                                             "WebGpuExecutionProvider": {"preferredLayout"}}
# Operator domains the WASM build has no kernels for: NCHWc ops (level "layout"/"all" on the CPU provider) are
# written for the build machine's SIMD width (the web template has the same list)
WEB_MISSING_DOMAINS = ("com.microsoft.nchwc",)

# onnxruntime-genai's short names of the providers its Config.append_provider takes (the CPU provider is its default)
GENAI_PROVIDERS = {"CUDAExecutionProvider": "cuda", "DmlExecutionProvider": "dml", "WebGpuExecutionProvider": "webgpu",
                   "NvTensorRTRTXExecutionProvider": "NvTensorRtRtx"}

TEMPLATES = Path(__file__).parent / "templates"


def python_file(model: str) -> str:
    """The file name of a model's Python loader: its module name (paths.loader_module) + .py."""
    return f"{paths.loader_module(model)}.py"


def python_path(folder: Path, model: str) -> Path:
    """The Python loader of the artifact of `model` in `folder` (dist/<target>/<model>/)."""
    return folder / LOADER_DIR / python_file(model)


def python_loader_of(folder: Path, m: Manifest) -> Path:
    """The Python loader that the (verified) manifest `m` lists: a release made by an older ortbuild names it
    ortbuild_loader.py, one made now python_file(model)."""
    names = [lf.name for lf in m.loaders if lf.language == "python"]
    return folder / names[0] if names else python_path(folder, m.model)


def loader_files(model: str) -> frozenset[str]:
    """The names ortbuild gives (and gave) the loaders of `model`'s artifact, in loader/."""
    return frozenset({python_file(model), LEGACY_PYTHON, NODE, NODE_TYPES, WEB})


@functools.cache
def templates_digest() -> str:
    """A digest of the templates the loaders are rendered from and of their file names (in the build key: a changed
    loader, or one renamed, rebuilds)."""
    h = hashlib.sha256()
    h.update(f"{python_file('MODEL')}\0{NODE}\0{NODE_TYPES}\0{WEB}\0".encode())
    for f in sorted(TEMPLATES.glob("*.j2")):
        h.update(f.name.encode() + b"\0" + f.read_bytes())
    return h.hexdigest()


@functools.cache
def _env() -> jinja2.Environment:
    """jinja2 is imported here, not at module level: its 70 ms would weigh on every no-op build's key."""
    import jinja2

    return jinja2.Environment(loader=jinja2.FileSystemLoader(TEMPLATES), undefined=jinja2.StrictUndefined,
                              keep_trailing_newline=True, autoescape=False)


def _provider_options(m: Manifest) -> list[tuple[str, dict[str, str]]]:
    return [(p["name"], {k: str(v).lower() if isinstance(v, bool) else str(v) for k, v in p["options"].items()})
            for p in m.providers]


def node_refusal(m: Manifest) -> str:
    """Why the Node loader cannot run this target ("" when it can)."""
    if (refusal := kind_rule(m.kind).js_refusal) is not None:
        return refusal
    absent = [p["name"] for p in m.providers if p["name"] not in NODE_PROVIDERS]
    if absent:
        return (f"onnxruntime-node ships no {', '.join(absent)}: the Node loader refuses this target, use the "
                "Python loader")
    dropped = [f"{p['name']} {k}" for p in m.providers
               for k in p["options"] if (known := NODE_PROVIDER_OPTIONS[p["name"]]) is not None and k not in known]
    if dropped:
        return (f"onnxruntime-node cannot hand these provider options to ONNX Runtime ({', '.join(dropped)}): the Node "
                "loader refuses this target, use the Python loader")
    if m.custom_ops:
        return (f"onnxruntime-node cannot register custom-op libraries ({', '.join(c['name'] for c in m.custom_ops)}):"
                " the Node loader refuses this artifact, use the Python loader")
    return ""


def web_refusal(m: Manifest) -> str:
    """Why the browser loader (onnxruntime-web) cannot run this artifact ("" when it can)."""
    if (refusal := kind_rule(m.kind).js_refusal) is not None:
        return refusal
    absent = [p["name"] for p in m.providers if p["name"] not in WEB_PROVIDERS]
    if absent:
        return (f"onnxruntime-web has no {', '.join(absent)} (it runs the CPU provider's kernels as WebAssembly, and "
                "WebGPU): the browser loader refuses this target, use the Python loader")
    if m.custom_ops:
        return (f"onnxruntime-web cannot register custom-op libraries ({', '.join(c['name'] for c in m.custom_ops)}): "
                "the browser loader refuses this artifact, use the Python loader")
    dropped = [f"{p['name']} {k}" for p in m.providers for k in p["options"]
               if k not in WEB_PROVIDER_OPTIONS[p["name"]]]
    if dropped:
        return (f"onnxruntime-web cannot hand these provider options to ONNX Runtime ({', '.join(dropped)}): the "
                "browser loader refuses this target, use the Python loader")
    missing = [d for d in WEB_MISSING_DOMAINS if d in m.optimization.op_domains]
    if missing:
        return (f"the artifact holds {', '.join(missing)} operators (optimization '{m.optimization.applied}' for the "
                "build machine's CPU), which onnxruntime-web's WASM build has no kernels for: the browser loader "
                'refuses it; build the browser\'s target with optimization = "extended" or lower')
    return ""


def render(m: Manifest, runtime: str) -> dict[str, str]:
    """The loader files of an artifact, by file name."""
    providers = _provider_options(m)
    facts = {
        "target": m.target, "model": m.model, "version": __version__, "runtime": runtime,
        "module": paths.loader_module(m.model),
        "public_key": m.signing.public_key, "public_key_id": m.signing.public_key_id,
        "manifest_formats": list(READABLE_FORMATS), "min_epoch": int(m.epoch),
        "first_input": m.io["inputs"][0]["name"] if m.io["inputs"] else "input",
        "providers_py": pprint.pformat(providers, width=100),
        "session_py": pprint.pformat(m.session, width=100, sort_dicts=True),
        "free_dims_py": pprint.pformat(m.free_dimensions, width=100, sort_dicts=True),
        "plugins_py": pprint.pformat(m.plugins, width=100, sort_dicts=True),
        "custom_ops_py": pprint.pformat(m.custom_ops, width=100, sort_dicts=True),
        "custom_ops_json": json.dumps(m.custom_ops, sort_keys=True),
        "providers_json": json.dumps(providers), "session_json": json.dumps(m.session, sort_keys=True),
        "free_dims_json": json.dumps(m.free_dimensions, sort_keys=True),
        "inputs": m.io["inputs"], "outputs": m.io["outputs"],
        **KIND_FACTS[m.kind](m, runtime),
    }
    return {python_file(m.model) if name == PYTHON else name: _env().get_template(template).render(**facts)
            for name, template in KIND_TEMPLATES[m.kind].items()}


def _genai_facts(m: Manifest, runtime: str) -> dict[str, object]:
    """What a generative model's loaders add: onnxruntime-genai's Python loader (its manifest's `generative`
    section), and the JavaScript ones' refusal, saying why."""
    assert m.generative is not None, "a generative model's manifest has its `generative` section"
    return {"genai": m.generative.runtime, "runtime_only": runtime.split()[0] if runtime else "onnxruntime",
            "genai_providers_py": pprint.pformat(GENAI_PROVIDERS, width=100, sort_dicts=True),
            "refusal": kind_rule(m.kind).js_refusal}


PYTHON = "python"  # in KIND_TEMPLATES: the model's Python loader (python_file)
# Each kind of model's loaders (ortbuild.project.kinds): the template of each file, and the facts it adds
KIND_TEMPLATES: dict[Kind, dict[str, str]] = {
    "onnx": {PYTHON: "loader.py.j2", NODE: "loader.mjs.j2", NODE_TYPES: "loader.d.ts.j2", WEB: "loader.web.mjs.j2"},
    "generative": {PYTHON: "loader_genai.py.j2", NODE: "loader_refused.mjs.j2", WEB: "loader_refused.mjs.j2"}}
KIND_FACTS: dict[Kind, Callable[[Manifest, str], dict[str, object]]] = {"onnx": lambda m, runtime: {},
                                                                          "generative": _genai_facts}


def describe(files: dict[str, str], m: Manifest) -> list[LoaderFile]:
    """The manifest entries of rendered loader files."""
    python = python_file(m.model)
    language = {python: "python", NODE: "node", NODE_TYPES: "node-types", WEB: "web"}
    node = node_refusal(m)
    refusals = {python: "", NODE: node, NODE_TYPES: node, WEB: web_refusal(m)}
    return [LoaderFile(language=language[name], name=f"{LOADER_DIR}/{name}",
                       sha256=hashlib.sha256(text.encode()).hexdigest(),
                       runs_target=not refusals[name], note=refusals[name])
            for name, text in sorted(files.items())]


def import_python_loader(path: Path) -> types.ModuleType:
    """Import a generated Python loader by path, under a private module name (no sys.path change)."""
    import importlib.util
    import sys

    name = f"_ortbuild_loader_{hashlib.sha256(str(path).encode()).hexdigest()[:12]}"
    spec = importlib.util.spec_from_file_location(name, path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    saved, sys.dont_write_bytecode = sys.dont_write_bytecode, True  # no __pycache__ beside a signed artifact
    try:
        spec.loader.exec_module(module)
    finally:
        sys.dont_write_bytecode = saved
    return module
