"""`ortbuild init`: a project scaffolded from its ONNX models: targets.toml (the models found, their golden inputs
found beside them or generated from each model's input signature), a noxfile.py importing ortbuild's sessions, a
.gitignore for what ortbuild writes, and a CI workflow over `ortbuild matrix` (docs/project.md)."""

from __future__ import annotations

import io
import json
import re
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from ortbuild import __version__, files, paths
from ortbuild.errors import ConfigError, UsageError

RUNTIME = "onnxruntime==1.31.1"  # the CPU flavor this ortbuild is tested with
GITIGNORE = ("dist/", ".nox/", ".ortbuild/", "keys/*.key")
WORKFLOW = Path(".github") / "workflows" / "ortbuild.yml"
SKIP_DIRS = frozenset({"dist", "node_modules", "__pycache__", "site-packages"})
SEED = 0  # generated golden inputs are the same on every run

# Targets `init --target` offers, each a TOML table body; a preset's parents come along (`extends`).
PRESETS: dict[str, tuple[str | None, str]] = {
    "cpu-fp32": (None, f'''description = "x86/ARM servers, full precision"
runtime = "{RUNTIME}"
providers = ["CPUExecutionProvider"]
precision = "fp32"
optimization = "all"
# release gates (`ortbuild test`): fp32 must match the source within rtol 1e-4 / atol 1e-5 and stay under 1.1x
# its size; add latency budgets measured on your hardware, e.g.
# latency = {{ p90_ms = 50, p99_ms = 100 }}
'''),
    "cpu-int8": ("cpu-fp32", '''description = "CPU servers, int8 weights (dynamic: no calibration data needed)"
extends = "cpu-fp32"
precision = "int8-dynamic"
# reduce_range: 7-bit weights, ORT's advice for x86 CPUs without VNNI; accuracy default: cosine >= 0.99
quantization = { per_channel = true, reduce_range = true }
'''),
    "cpu-int4": ("cpu-fp32", '''description = "memory-bound CPU devices: block-wise int4 weights of MatMul nodes"
extends = "cpu-fp32"
precision = "int4-weight"
int4 = { block_size = 32, symmetric = true }
'''),
    "arm64-int8": ("cpu-int8", '''description = "ARM64 servers and boards, int8 (golden-tested here under emulation)"
extends = "cpu-int8"
platform = "linux-aarch64"
optimization = "extended"
quantization = { reduce_range = false }
'''),
    "mobile-int8": ("cpu-int8", '''description = "Android/iOS apps: an .ort artifact and its operator config"
extends = "cpu-int8"
format = "ort"
optimization = "basic"
quantization = { reduce_range = false }
'''),
    "openvino-cpu": (None, f'''description = "Intel CPUs through OpenVINO, compiled ahead of time"
runtime = ["{RUNTIME}", "onnxruntime-ep-openvino==1.8.1"]
providers = [{{ name = "OpenVINOExecutionProvider", options = {{ device_type = "CPU" }} }}, "CPUExecutionProvider"]
optimization = "all"
size = {{ max_ratio = 3.0 }}
'''),
    "cuda-fp16": (None, f'''description = "NVIDIA servers through CUDA, fp16"
runtime = "{RUNTIME.replace("onnxruntime", "onnxruntime-gpu")}"
providers = [
    {{ name = "CUDAExecutionProvider", options = {{ cudnn_conv_algo_search = "EXHAUSTIVE", use_tf32 = false }} }},
    "CPUExecutionProvider",
]
precision = "fp16"
optimization = "basic"
runner = ["self-hosted", "linux", "x64", "gpu"]
'''),
}


@dataclass(frozen=True)
class Found:
    """A model init found: its name, its file, its golden inputs (found beside it, or None: generate them)."""

    name: str
    path: Path
    inputs: Path | None


@dataclass
class Scaffold:
    """What init writes (path -> text) and what it says about it."""

    files: dict[Path, str] = field(default_factory=dict)
    data: dict[Path, dict[str, np.ndarray]] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)


def _walk(folder: Path) -> Iterator[Path]:
    """The .onnx files under `folder`, skipping hidden folders, virtualenvs and ortbuild's outputs."""
    for entry in sorted(folder.iterdir()):
        if entry.is_dir() and not entry.is_symlink():
            if entry.name.startswith(".") or entry.name in SKIP_DIRS or (entry / "pyvenv.cfg").exists():
                continue
            yield from _walk(entry)
        elif entry.suffix == ".onnx" and entry.is_file():
            yield entry


def find_models(root: Path, given: Sequence[str]) -> list[Path]:
    """The models of PATHs (files, or folders searched), else of root/models/, else of root and below."""
    if not given:
        found = list(_walk(root / "models")) if (root / "models").is_dir() else []
        found = found or list(_walk(root))
        if not found:
            raise UsageError(f"no .onnx model found in {root} (hidden folders, virtualenvs and dist/ left out)",
                             "give the models: `ortbuild init path/to/model.onnx ...`")
        return found
    out: list[Path] = []
    for text in given:
        path = Path(text)
        if path.is_dir():
            inside = list(_walk(path))
            if not inside:
                raise UsageError(f"{text}: no .onnx model in this folder", "give a model file or another folder")
            out += inside
        elif path.is_file() and path.suffix == ".onnx":
            out.append(path)
        else:
            raise UsageError(f"{text}: not an .onnx file or a folder", "give ONNX model files or folders holding them")
    return list(dict.fromkeys(p.resolve() for p in out))


def model_name(path: Path, taken: set[str]) -> str:
    """A model name (paths.NAME_RULE) from the file's name, unique among `taken`."""
    base = re.sub(r"[^A-Za-z0-9_.-]", "_", path.stem).lstrip("_.-")[:60] or "model"
    if paths.name_problem(base):
        base = f"m{base}"[:60]
    name, n = base, 2
    while paths.loader_module(name).lower() in taken:  # unique as a name and as its loader's module name
        name, n = f"{base}_{n}", n + 1
    taken.add(paths.loader_module(name).lower())
    return name


def golden_beside(model: Path) -> Path | None:
    """Golden inputs kept beside a model: <stem>.inputs.npz, or an ONNX-layout folder (test_data_set_0/)."""
    npz = model.with_name(f"{model.stem}.inputs.npz")
    if npz.is_file():
        return npz
    if (model.parent / "test_data_set_0").is_dir():
        return model.parent
    return None


def _dim(name: str, dim: Any, position: int, rank: int, is_float: bool, dims: dict[str, int]) -> int:
    if dim.HasField("dim_value") and dim.dim_value > 0:
        return int(dim.dim_value)
    symbol = dim.dim_param
    if symbol in dims:
        return dims[symbol]
    if position == 0:
        return 1  # a batch
    if is_float and rank == 4 and position >= 2:
        return 224  # an image's height and width
    return 16  # a sequence


def generated_inputs(model: Path, dims: dict[str, int]) -> tuple[dict[str, np.ndarray], list[str]]:
    """Golden inputs from the model's input signature: floats uniform in [0, 1), integers 0 (masks 1), booleans
    true; symbolic dims from `dims`, else batch 1, image 224, sequence 16. Returns them and how dims were set."""
    import onnx
    from onnx import helper

    graph = onnx.load(str(model), load_external_data=False).graph
    weights = {i.name for i in graph.initializer}
    rng = np.random.default_rng(SEED)
    out: dict[str, np.ndarray] = {}
    chosen: list[str] = []
    for value in graph.input:
        if value.name in weights:
            continue
        tensor = value.type.tensor_type
        if not value.type.HasField("tensor_type") or tensor.elem_type == onnx.TensorProto.STRING:
            raise ConfigError(str(model), f"input '{value.name}'", "is not a numeric tensor: init cannot make "
                              "golden data for it", "give golden inputs: put <model>.inputs.npz beside the model")
        dtype = np.dtype(helper.tensor_dtype_to_np_dtype(tensor.elem_type))
        is_float = dtype.kind == "f"
        rank = len(tensor.shape.dim)
        shape = [_dim(value.name, d, i, rank, is_float, dims) for i, d in enumerate(tensor.shape.dim)]
        chosen += [f"{d.dim_param or '?'}={s}" for d, s in zip(tensor.shape.dim, shape, strict=True)
                   if not (d.HasField("dim_value") and d.dim_value > 0)]
        if is_float:
            out[value.name] = rng.random(shape, dtype=np.float64).astype(dtype)
        elif dtype.kind == "b":
            out[value.name] = np.ones(shape, dtype=dtype)
        else:
            out[value.name] = np.full(shape, 1 if "mask" in value.name.lower() else 0, dtype=dtype)
    return out, sorted(set(chosen))


# Ops whose weights int8-dynamic quantizes well: ORT quantizes activations at run time, which suits MatMul-heavy
# graphs (transformers, MLPs, recurrent nets); Conv-heavy graphs lose accuracy and speed that way and want
# int8-static with calibration data (real samples), which init cannot make up.
DYNAMIC_OPS = frozenset({"MatMul", "Gemm", "Gather", "LSTM", "GRU", "Attention", "EmbedLayerNormalization"})
# The weights int4-weight converts (MatMulNBits): MatMul's only.
INT4_OPS = frozenset({"MatMul"})
# The presets whose precision suits some models only: the ops whose weights it serves well, and what the others need.
SUITS: dict[str, tuple[frozenset[str], str]] = {
    "cpu-int8": (DYNAMIC_OPS, "most of {whose} weights are in Conv (or other) nodes, which int8-dynamic serves "
                 "poorly; they want int8-static with `calibration` = real samples (docs/targets.md)"),
    "cpu-int4": (INT4_OPS, "most of {whose} weights are not MatMul weights, the only ones int4-weight converts"),
}


def _weight_bytes(tensor: Any) -> int:
    for entry in tensor.external_data:
        if entry.key == "length":
            return int(entry.value)
    if tensor.raw_data:
        return len(tensor.raw_data)
    return max(len(tensor.float_data), len(tensor.int64_data), len(tensor.int32_data), len(tensor.double_data)) * 4


def weight_share(model: Path, ops: frozenset[str] = DYNAMIC_OPS) -> float:
    """The share of the model's weight bytes that feed `ops` nodes (subgraphs included)."""
    import onnx

    by_op: dict[bool, int] = {True: 0, False: 0}

    def walk(graph: Any, weights: dict[str, int]) -> None:
        weights = {**weights, **{t.name: _weight_bytes(t) for t in graph.initializer}}
        for node in graph.node:
            if node.op_type == "Constant":  # exporters keep some weights there (int8-dynamic lifts them)
                for a in node.attribute:
                    if a.name == "value":
                        weights[node.output[0]] = _weight_bytes(a.t)
            for name in node.input:
                if name in weights:
                    by_op[node.op_type in ops] += weights.pop(name)
            for attr in node.attribute:
                for sub in [attr.g, *attr.graphs] if attr.type in (onnx.AttributeProto.GRAPH,
                                                                  onnx.AttributeProto.GRAPHS) else []:
                    walk(sub, weights)

    walk(onnx.load(str(model), load_external_data=False).graph, {})
    total = by_op[True] + by_op[False]
    return by_op[True] / total if total else 0.0


def _toml_path(path: Path, root: Path) -> str:
    try:
        text = str(path.resolve().relative_to(root.resolve()))
    except ValueError:
        text = str(path.resolve())
    return json.dumps(text)


def _key(name: str) -> str:
    """A TOML key: bare where it may be, else quoted (a dot would split it)."""
    return name if re.fullmatch(r"[A-Za-z0-9_-]+", name) else json.dumps(name)


def targets_toml(project: str, models: list[tuple[Found, Path]], targets: Sequence[str], root: Path,
                 only: dict[str, list[str]]) -> str:
    lines = ["# Written by `ortbuild init`. Every key: ortbuild's docs/targets-reference.md; `ortbuild schema` prints",
             "# the JSON Schema. Build and test every target, each in its own virtualenv: python -m nox -s test", "",
             "[project]", f"name = {json.dumps(project)}", 'version = "0.1.0"', ""]
    for found, inputs in models:
        generated = found.inputs is None
        lines += [f"[models.{_key(found.name)}]", f"path = {_toml_path(found.path, root)}",
                  f"inputs = {_toml_path(inputs, root)}" + ("  # generated by init: replace with real samples"
                                                            if generated else ""), ""]
    for name in targets:
        lines += [f"[targets.{name}]", PRESETS[name][1]]
        if name in only:
            lines.insert(-1, f"models = {json.dumps(only[name])}")
    return "\n".join(lines).rstrip() + "\n"


def with_parents(names: Sequence[str]) -> list[str]:
    """The presets named, with the presets they extend, parents first, each once."""
    out: list[str] = []

    def add(name: str) -> None:
        if name not in PRESETS:
            raise UsageError(f"--target {name}: not a target init knows",
                             f"choose among {', '.join(PRESETS)} (edit targets.toml for others)")
        parent = PRESETS[name][0]
        if parent:
            add(parent)
        if name not in out:
            out.append(name)

    for n in names:
        add(n)
    return out


def _pointed(models: list[Path], inputs: Sequence[str]) -> dict[Path, Path]:
    """--inputs [MODEL=]PATH: golden inputs given for a model (by its file's stem; the stem may be left out when
    there is one model)."""
    out: dict[Path, Path] = {}
    for text in inputs:
        stem, _, where = text.rpartition("=")
        matching = [m for m in models if m.stem == stem] if stem else models
        if len(matching) != 1:
            raise UsageError(f"--inputs {text}: " + (f"no model '{stem}' among {', '.join(m.stem for m in models)}"
                             if stem else f"{len(models)} models: say which one"), "write --inputs MODEL=PATH")
        path = Path(where)
        if not (path.is_file() or (path / "test_data_set_0").is_dir()):
            raise UsageError(f"--inputs {text}: {where} is neither a file nor a folder holding test_data_set_0/",
                             "give an .npz keyed by input name, or an ONNX test_data_set_N layout")
        out[matching[0]] = path.resolve()
    return out


def plan(root: Path, given: Sequence[str], targets: Sequence[str], dims: dict[str, int],
         inputs: Sequence[str] = ()) -> Scaffold:
    """Everything init would write into `root`, nothing written yet. Without `targets`: cpu-fp32 for every model,
    and cpu-int8 (dynamic) for the models whose weights are mostly MatMul/Gemm/Gather/recurrent (ONNX Runtime's
    advice: dynamic quantization for RNNs and transformers, static with calibration data for CNNs); cpu-int4,
    asked for, takes the models whose weights are mostly MatMul's (SUITS)."""
    from jinja2 import Environment, PackageLoader

    scaffold = Scaffold()
    taken: set[str] = set()
    chosen: list[tuple[Found, Path]] = []
    models = find_models(root, given)
    pointed = _pointed(models, inputs)
    for path in models:
        found = Found(model_name(path, taken), path, pointed.get(path) or golden_beside(path))
        if found.inputs is None:
            arrays, dims_set = generated_inputs(path, dims)
            target = root / "models" / f"{found.name}.inputs.npz"
            scaffold.data[target] = arrays
            how = f" (symbolic dims: {', '.join(dims_set)}; --dim NAME=N sets one)" if dims_set else ""
            scaffold.notes.append(f"{found.name}: golden inputs generated into {target.relative_to(root)}{how}: "
                                  "values of the right type and shape, not real samples; replace them for gates "
                                  "that mean something")
            chosen.append((found, target))
        else:
            scaffold.notes.append(f"{found.name}: golden inputs {found.inputs}")
            chosen.append((found, found.inputs))
    project = re.sub(r"[^A-Za-z0-9_.-]", "-", root.resolve().name).strip("-.") or "models"
    names = with_parents(targets or ["cpu-fp32", "cpu-int8"])
    only: dict[str, list[str]] = {}
    for preset, (ops, why) in SUITS.items():
        if preset not in names:
            continue
        fit = [f.name for f, _ in chosen if weight_share(f.path, ops) >= 0.5]
        left = [f.name for f, _ in chosen if f.name not in fit]
        if not left:
            continue
        whose = "its" if len(left) == 1 else "their"
        if fit:
            only[preset] = fit
            scaffold.notes.append(f"{preset} leaves out {', '.join(left)}: {why.format(whose=whose)}")
        elif not targets:  # the default int8 target, for no model it suits
            names.remove(preset)
            scaffold.notes.append(f"no {preset} target: for {', '.join(left)}, {why.format(whose=whose)}")
        else:
            scaffold.notes.append(f"warning: {preset} (asked for) suits none of the models: {why.format(whose=whose)}")
    scaffold.files[root / "targets.toml"] = targets_toml(project, chosen, names, root, only)
    env = Environment(loader=PackageLoader("ortbuild.project", "templates"), keep_trailing_newline=True,
                      autoescape=False)
    scaffold.files[root / "noxfile.py"] = env.get_template("noxfile.py.j2").render()
    scaffold.files[root / WORKFLOW] = env.get_template("ci.yml.j2").render(version=__version__)
    return scaffold


def gitignore(root: Path) -> str | None:
    """The .gitignore with ortbuild's lines added, or None when it has them all."""
    path = root / ".gitignore"
    text = path.read_text() if path.is_file() else ""
    missing = [line for line in GITIGNORE if line not in text.splitlines()]
    if not missing:
        return None
    head = text if not text or text.endswith("\n") else text + "\n"
    why = "# ortbuild: build output, nox's virtualenvs, development keys, private keys\n"
    return head + why + "\n".join(missing) + "\n"


def write(root: Path, scaffold: Scaffold, force: bool) -> list[Path]:
    """Write the scaffold (each file to a temp name, then renamed); refuse to replace a file unless `force`."""
    present = [p for p in [*scaffold.files, *scaffold.data] if p.exists()]
    if present and not force:
        shown = ", ".join(str(p.relative_to(root)) for p in present)
        raise UsageError(f"init would replace {shown}", "keep them and edit by hand (a new model: add its "
                         "[models.NAME] table; `ortbuild plan` checks it), or run `ortbuild init --force` to replace "
                         "them, losing your edits")
    written = []
    for path, arrays in scaffold.data.items():
        buffer = io.BytesIO()
        np.savez(buffer, **arrays)  # type: ignore[arg-type]
        files.safe_mkdir(path.parent, root)
        files.atomic_write(path, buffer.getvalue(), root=root, mode=0o644)
        written.append(path)
    for path, text in scaffold.files.items():
        files.safe_mkdir(path.parent, root)
        files.atomic_write(path, text.encode(), root=root, mode=0o644)
        written.append(path)
    ignore = gitignore(root)
    if ignore is not None:
        files.atomic_write(root / ".gitignore", ignore.encode(), root=root, mode=0o644)
        written.append(root / ".gitignore")
    return written
