"""`ortbuild init`: a project scaffolded from its ONNX models: targets.toml (the models found, their golden inputs
found beside them or generated from each model's input signature), a noxfile.py importing ortbuild's sessions, a
.gitignore for what ortbuild writes, and a CI workflow over `ortbuild matrix` (docs/project.md)."""

from __future__ import annotations

import io
import json
import os
import re
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from ortbuild import __version__, files, paths
from ortbuild.errors import ConfigError, UsageError
from ortbuild.project import config, signature
from ortbuild.project.config import Project

RUNTIME = "onnxruntime==1.31.1"  # the CPU flavor this ortbuild is tested with
GITIGNORE = ("dist/", ".nox/", ".ortbuild/", "keys/*.key")
GENERATED = "generated-inputs.npz"  # golden inputs init made up: models/NAME.generated-inputs.npz
WORKFLOW = Path(".github") / "workflows" / "ortbuild.yml"
SKIP_DIRS = frozenset({"dist", "node_modules", "__pycache__", "site-packages"})

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
# the precision is a goal: where int8 fails its accuracy rule, the build keeps the layers that break it in float
# and records them in targets.lock (commit it); docs/build-to-the-gates.md
precision_search = "auto"
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

# The presets whose precision suits some models only: the ops whose weights it serves well, and what the others need.
SUITS: dict[str, tuple[frozenset[str], str]] = {
    "cpu-int8": (signature.DYNAMIC_OPS, "most of {whose} weights are in Conv (or other) nodes, which int8-dynamic "
                 "serves poorly; they want int8-static with `calibration` = real samples (docs/targets.md)"),
    "cpu-int4": (signature.INT4_OPS, "most of {whose} weights are not MatMul weights, the only ones int4-weight "
                 "converts"),
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
    """The .onnx files under `folder`, skipping hidden folders, virtualenvs, ortbuild's outputs and folders it may
    not read."""
    try:
        entries = sorted(folder.iterdir())
    except OSError:
        return
    for entry in entries:
        if entry.is_dir() and not entry.is_symlink():
            if entry.name.startswith(".") or entry.name in SKIP_DIRS or os.path.lexists(entry / "pyvenv.cfg"):
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
        return _named(found)
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
    return _named(list(dict.fromkeys(Path(os.path.abspath(p)) for p in out)))  # a symlink keeps its own name


def _named(models: list[Path]) -> list[Path]:
    """`models`, each file name checked to be text a targets.toml can hold."""
    for m in models:
        try:
            str(m).encode()
        except UnicodeEncodeError:
            raise UsageError(f"{os.fsencode(m)!r}: the file name is not valid UTF-8, which targets.toml cannot hold",
                             "rename the file") from None
    return models


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


def _toml_path(path: Path, root: Path) -> str:
    """`path` for targets.toml: relative to the project where it is inside it (symlinks kept as they are)."""
    full, top = os.path.abspath(path), os.path.abspath(root)
    inside = os.path.commonpath([full, top]) == top
    return json.dumps(os.path.relpath(full, top) if inside else full)


def targets_toml(project: str, models: list[tuple[Found, Path]], targets: Sequence[str], root: Path,
                 only: dict[str, list[str]]) -> str:
    lines = ["# Written by `ortbuild init`. Every key: ortbuild's docs/targets-reference.md; `ortbuild schema` prints",
             "# the JSON Schema. Build and test every target, each in its own virtualenv: python -m nox -s test", "",
             "[project]", f"name = {json.dumps(project)}", 'version = "0.1.0"', ""]
    for found, inputs in models:
        generated = found.inputs is None
        lines += [f"[models.{config.toml_key(found.name)}]", f"path = {_toml_path(found.path, root)}",
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
    """--inputs [MODEL=]PATH: golden inputs given for a model, named by its file's stem (or its path as given);
    MODEL= may be left out when there is one model. A path may hold '=' itself."""
    out: dict[Path, Path] = {}
    for text in inputs:
        head, sep, tail = text.partition("=")
        matching = [m for m in models if head in (m.stem, str(m))] if sep else []
        where = tail if matching else text
        if not matching and len(models) == 1:
            matching = models
        if len(matching) != 1:
            problem = (f"'{head}' names {len(matching)} models (give the model's path)" if matching else
                       f"which model? {len(models)} models here: {', '.join(m.stem for m in models)}")
            raise UsageError(f"--inputs {text}: {problem}", "write --inputs MODEL=PATH (MODEL: the file's stem)")
        path = Path(where)
        if not (path.is_file() or (path / "test_data_set_0").is_dir()):
            raise UsageError(f"--inputs {text}: {where} is neither a file nor a folder holding test_data_set_0/",
                             "give an .npz keyed by input name, or an ONNX test_data_set_N layout")
        out[matching[0]] = Path(os.path.abspath(path))
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
    graphs = {path: signature.graph(path) for path in models}
    for path in models:
        found = Found(model_name(path, taken), path, pointed.get(path) or golden_beside(path))
        if found.inputs is None:
            arrays, dims_set = signature.generated_inputs(path, graphs[path], dims)
            # not NAME.inputs.npz: a rerun regenerates it (and never takes it, or a user's file, for real samples)
            target = root / "models" / f"{found.name}.{GENERATED}"
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
        shares = {f.name: signature.weight_share(graphs[f.path], ops) for f, _ in chosen}
        fit = [name for name, share in shares.items() if share is not None and share >= 0.5]
        left = [name for name in shares if name not in fit]
        if not left:
            continue
        whose = "its" if len(left) == 1 else "their"
        if all(shares[name] is None for name in left):
            why = "{whose} graph has no weights to convert"
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
    try:
        text = files.read_document(path).decode() if os.path.lexists(path) else ""
    except (OSError, UnicodeDecodeError) as err:
        raise UsageError(f"{path}: cannot add ortbuild's lines to it ({err})",
                         "make it a readable text file, or remove it") from None
    missing = [line for line in GITIGNORE if line not in text.splitlines()]
    if not missing:
        return None
    head = text if not text or text.endswith("\n") else text + "\n"
    why = "# ortbuild: build output, nox's virtualenvs, development keys, private keys\n"
    return head + why + "\n".join(missing) + "\n"


def _checked(root: Path, scaffold: Scaffold, check: Callable[[Project], None]) -> None:
    """What init writes would load: its targets.toml through the configuration's checks (files aside: the generated
    inputs are not written yet), from a private temp file beside it, removed at once; then `check` (the caller's:
    the golden inputs given or found, against their models)."""
    partial = files.partial_file(root / "targets.toml", root)
    try:
        with files.open_partial(partial) as f:
            f.write(scaffold.files[root / "targets.toml"].encode())
        check(config.load(partial, check_files=False))
    except ConfigError as err:  # about the targets.toml init would write, not its temp file
        err.message = err.message.replace(str(partial), f"{root / 'targets.toml'} (as init would write it)")
        raise
    finally:
        partial.unlink(missing_ok=True)


def write(root: Path, scaffold: Scaffold, force: bool, check: Callable[[Project], None]) -> list[Path]:
    """Write the scaffold, all or nothing: every check first (files to replace, folders to make, the targets.toml
    loading), then each file into a temp file beside its place, then all renamed into place."""
    ignore = gitignore(root)
    texts: dict[Path, bytes] = {}  # the generated inputs first, then the files naming them
    for path, arrays in scaffold.data.items():
        buffer = io.BytesIO()
        np.savez(buffer, **arrays)  # type: ignore[arg-type]
        texts[path] = buffer.getvalue()
    texts.update({path: text.encode() for path, text in scaffold.files.items()})
    present = [p for p in texts if os.path.lexists(p)]
    if present and not force:
        shown = ", ".join(str(p.relative_to(root)) for p in present)
        raise UsageError(f"init would replace {shown}", "keep them and edit by hand (a new model: add its "
                         "[models.NAME] table; `ortbuild plan` checks it), or run `ortbuild init --force` to replace "
                         "them, losing your edits")
    for p in present:
        if p.is_dir() and not p.is_symlink():
            raise UsageError(f"{p} is a folder: init writes a file there", "move it away, then run init again")
    if ignore is not None:
        texts[root / ".gitignore"] = ignore.encode()
    _checked(root, scaffold, check)
    partials: dict[Path, Path] = {}
    try:
        for path in texts:
            files.safe_mkdir(path.parent, root)
        for path, data in texts.items():
            partials[path] = files.partial_file(path, root)
            with files.open_partial(partials[path]) as f:
                f.write(data)
            os.chmod(partials[path], 0o644)
        for path, partial in partials.items():
            files.publish(partial, path, root)
    except OSError as err:
        raise UsageError(f"init could not write into {root}: {err}", "fix what it names, then run init again") \
            from None
    finally:
        for partial in partials.values():
            partial.unlink(missing_ok=True)
    return list(texts)
