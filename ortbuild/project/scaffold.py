"""`ortbuild init`: a project scaffolded from its ONNX models: targets.toml (the models found, their golden inputs
found beside them or generated from each model's input signature), a noxfile.py importing ortbuild's sessions, a
.gitignore for what ortbuild writes, and a CI workflow over `ortbuild matrix` (docs/project.md)."""

from __future__ import annotations

import io
import json
import os
import re
import tomllib
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from ortbuild import __version__, files, paths
from ortbuild.errors import ConfigError, UsageError, first_line
from ortbuild.project import config, data, expected, signature, speedup
from ortbuild.project.config import Project
from ortbuild.project.presets import PRESETS, SUITS, with_parents

if TYPE_CHECKING:
    import onnx

GITIGNORE = ("dist/", ".nox/", ".ortbuild/", "keys/*.key", ".venv/", "__pycache__/")
GENERATED = "generated-inputs.npz"  # golden inputs init made up: models/NAME.generated-inputs.npz
WORKFLOW = Path(".github") / "workflows" / "ortbuild.yml"
SKIP_DIRS = frozenset({"dist", "node_modules", "__pycache__", "site-packages"})

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


Outputs = Callable[[Path, list[data.Feed]], tuple[list[Mapping[str, object]], str]]
Measure = Callable[[Path, data.Feed, Mapping[str, object], int], "speedup.Measured | speedup.Unmeasured"]


@dataclass(frozen=True)
class Probe:
    """What init runs on the models where onnxruntime is importable (cli/init.py gives it: this layer does not import
    the runtime): the source's outputs on the golden inputs (golden.compute), recorded as `expected`, and int8
    against fp32 on this CPU (gating.int8speed.measure), which decides cpu-int8's models; `say` prints a line
    before the measurement starts."""

    outputs: Outputs
    measure: Measure | None          # None: not timed (`init --no-timing`)
    say: Callable[[str], None]


NOT_TIMED = ("int8 was not timed against fp32 on this CPU (init --no-timing): `ortbuild test` warns where an int8 "
             "artifact is slower than the fp32 one (docs/testing.md)")
UNPROBED = ("onnxruntime is not importable where init ran: int8 was not timed against fp32 on this CPU, and the "
            "source's outputs were not recorded as `expected`; to do both: pip install onnxruntime, then "
            "ortbuild init --force")


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


def shown(path: Path, root: Path) -> str:
    """`path` as targets.toml names it: relative to the project where it is inside it (symlinks kept as they are)."""
    full, top = os.path.abspath(path), os.path.abspath(root)
    return os.path.relpath(full, top) if os.path.commonpath([full, top]) == top else full


def _toml_path(path: Path, root: Path) -> str:
    """`path` for targets.toml, quoted (shown)."""
    return json.dumps(shown(path, root))


@dataclass
class Toml:
    """What targets.toml says beyond the models and targets: comment lines of its header and of each target's
    table, and lines of each model's table."""

    header: list[str] = field(default_factory=list)
    targets: dict[str, list[str]] = field(default_factory=dict)
    models: dict[str, list[str]] = field(default_factory=dict)


def targets_toml(project: str, models: list[tuple[Found, Path]], targets: Sequence[str], root: Path,
                 only: dict[str, list[str]], said: Toml | None = None) -> str:
    said = said or Toml()
    lines = [f"# Written by `ortbuild init`, on {speedup.host()}. Every key: ortbuild's docs/targets-reference.md;",
             "# `ortbuild schema` prints the JSON Schema. Build and test every target, each in its own virtualenv:",
             "# python -m nox -s test", *said.header, "",
             "[project]", f"name = {json.dumps(project)}", 'version = "0.1.0"', ""]
    for found, inputs in models:
        generated = found.inputs is None
        lines += [f"[models.{config.toml_key(found.name)}]", f"path = {_toml_path(found.path, root)}",
                  f"inputs = {_toml_path(inputs, root)}" + ("  # generated by init: replace with real samples"
                                                            if generated else ""),
                  *said.models.get(found.name, []), ""]
    for name in targets:
        lines += [f"[targets.{name}]", *said.targets.get(name, []),
                  *([f"models = {json.dumps(only[name])}"] if name in only else []), PRESETS[name][1]]
    return "\n".join(lines).rstrip() + "\n"


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


def _inputs(root: Path, models: list[Path], pointed: dict[Path, Path], graphs: dict[Path, onnx.GraphProto],
            dims: dict[str, int], scaffold: Scaffold) -> list[tuple[Found, Path]]:
    """Each model with its golden inputs: given (--inputs), found beside it, else generated into scaffold.data."""
    taken: set[str] = set()
    chosen: list[tuple[Found, Path]] = []
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
    return chosen


def _suited(names: list[str], chosen: list[tuple[Found, Path]], graphs: dict[Path, onnx.GraphProto],
            asked: bool, scaffold: Scaffold) -> dict[str, list[str]]:
    """The models each preset of SUITS takes among `names` (a default one that suits none is removed from `names`),
    saying what it leaves out."""
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
        elif not asked:  # the default int8 target, for no model it suits
            names.remove(preset)
            scaffold.notes.append(f"no {preset} target: for {', '.join(left)}, {why.format(whose=whose)}")
        else:
            scaffold.notes.append(f"warning: {preset} (asked for) suits none of the models: {why.format(whose=whose)}")
    return only


def data_sets(inputs: Path, graph: onnx.GraphProto) -> list[tuple[str, data.Feed]]:
    """Golden inputs' data sets (name, feed) as `ortbuild test` reads them (golden.load): an .npz or ONNX layout."""
    names = [i.name for i in graph.input if i.name not in {w.name for w in graph.initializer}]
    if inputs.is_dir():
        return [(d.name, data.dataset_feed(d, names)) for d in data.datasets(inputs)]
    return [("test_data_set_0", data.npz(inputs))]


def _int8_speed(names: list[str], only: dict[str, list[str]], chosen: list[tuple[Found, Path]],
                feeds: Mapping[str, list[tuple[str, data.Feed]]], probe: Probe, asked: bool, said: Toml,
                scaffold: Scaffold) -> None:
    """cpu-int8's models narrowed to those int8 is faster for on this CPU (speedup.choose), measured."""
    if probe.measure is None:
        said.targets["cpu-int8"] = [f"# {NOT_TIMED}"]
        return
    models = [(f, feeds[f.name][0][1]) for f, _ in chosen if f.name in only.get("cpu-int8", [f.name])
              and feeds.get(f.name)]
    settings = {**tomllib.loads(PRESETS["cpu-fp32"][1]), **tomllib.loads(PRESETS["cpu-int8"][1])}
    threads = int(settings.get("session", {}).get("intra_op_num_threads", 0))
    probe.say(f"measuring int8 vs fp32 on this CPU ({speedup.level()}): about "
              f"{round(len(models) * (speedup.SECONDS + speedup.QUANTIZING))} s")
    found = {f.name: probe.measure(f.path, feed, settings.get("quantization", {}), threads) for f, feed in models}
    choice = speedup.choose(found, asked)
    scaffold.notes.extend(choice.notes)
    if choice.kept:
        if list(choice.kept) != [f.name for f, _ in chosen]:  # not every model
            only["cpu-int8"] = list(choice.kept)
        said.targets["cpu-int8"] = list(choice.comments)
    else:
        names.remove("cpu-int8")
        said.header.extend(choice.comments)


def _computed(path: Path, feeds: list[tuple[str, data.Feed]], outputs: Outputs) \
        -> tuple[dict[str, np.ndarray], str] | str:
    """The source's outputs on its one data set and how they were computed, or why there are none."""
    if len(feeds) != 1:
        return f"its inputs hold {len(feeds)} data sets (an .npz holds one feed's outputs)"
    try:
        values, how = outputs(path, [feeds[0][1]])
    except Exception as err:  # ONNX Runtime's errors share no base class
        return f"the source does not run here on its golden inputs: {first_line(err)}"
    arrays = {k: v for k, v in values[0].items() if isinstance(v, np.ndarray)}
    if len(arrays) < len(values[0]):
        return "an output is a sequence or map, which an .npz cannot hold"
    return arrays, how


def _record(root: Path, found: Found, inputs: Path, feeds: list[tuple[str, data.Feed]], outputs: Outputs,
            said: Toml, scaffold: Scaffold) -> None:
    """The source's outputs on its golden inputs written as its `expected` (NAME.expected.npz beside the inputs, in
    the project, with their record: expected.record_path), or a note saying why not."""
    computed = _computed(found.path, feeds, outputs)
    if isinstance(computed, str):
        scaffold.notes.append(f"{found.name}: expected outputs not recorded: {computed}")
        return
    arrays, how = computed
    folder = inputs if inputs.is_dir() else inputs.parent
    inside = os.path.commonpath([os.path.abspath(folder), os.path.abspath(root)]) == os.path.abspath(root)
    path = (folder if inside else root / "models") / f"{found.name}{expected.SUFFIX}"
    scaffold.data[path] = arrays
    scaffold.files[expected.record_path(path)] = expected.record_json(feeds, arrays, how, shown(inputs, root),
                                                                      shown(found.path, root))
    said.models[found.name] = [
        "# the source's outputs on these inputs (fp32, CPU, no optimizations), recorded by init (from what: the .json",
        "# beside them): a later source whose outputs differ fails `ortbuild test`; other inputs: a warning, and",
        f"# {expected.REFRESH} records theirs", f"expected = {_toml_path(path, root)}"]


def plan(root: Path, given: Sequence[str], targets: Sequence[str], dims: dict[str, int],
         inputs: Sequence[str] = (), probe: Probe | None = None) -> Scaffold:
    """Everything init would write into `root`, nothing written yet. Without `targets`: cpu-fp32 for every model,
    and cpu-int8 (dynamic) for the models whose weights are mostly MatMul/Gemm/Gather/recurrent (ONNX Runtime's
    advice: dynamic quantization for RNNs and transformers, static with calibration data for CNNs) and, with a
    `probe`, for which int8 is measured faster than fp32 here; cpu-int4, asked for, takes the models whose weights
    are mostly MatMul's (SUITS). With a `probe`, each model's source outputs are recorded as its `expected`."""
    from jinja2 import Environment, PackageLoader

    scaffold = Scaffold(notes=[f"scaffolded on {speedup.host()}"])
    models = find_models(root, given)
    graphs = {path: signature.graph(path) for path in models}
    chosen = _inputs(root, models, _pointed(models, inputs), graphs, dims, scaffold)
    project = re.sub(r"[^A-Za-z0-9_.-]", "-", root.resolve().name).strip("-.") or "models"
    names = with_parents(targets or ["cpu-fp32", "cpu-int8"])
    only = _suited(names, chosen, graphs, bool(targets), scaffold)
    said = Toml()
    if probe is None:
        said.header.append(f"# {UNPROBED}")
        scaffold.notes.append(UNPROBED)
    else:
        feeds = {}
        for found, path in chosen:
            try:
                feeds[found.name] = [("test_data_set_0", scaffold.data[path])] if path in scaffold.data else \
                    data_sets(path, graphs[found.path])
            except ConfigError:  # inputs that do not load: the check before writing says so, naming them
                continue
            _record(root, found, path, feeds[found.name], probe.outputs, said, scaffold)
        if "cpu-int8" in names:
            _int8_speed(names, only, chosen, feeds, probe, bool(targets), said, scaffold)
    scaffold.files[root / "targets.toml"] = targets_toml(project, chosen, names, root, only, said)
    env = Environment(loader=PackageLoader("ortbuild.project", "templates"), keep_trailing_newline=True,
                      autoescape=False)
    scaffold.files[root / "noxfile.py"] = env.get_template("noxfile.py.j2").render()
    scaffold.files[root / WORKFLOW] = env.get_template("ci.yml.j2").render(version=__version__)
    return scaffold


def gitignore(root: Path) -> str | None:
    """The .gitignore with ortbuild's lines added, or None when it has them all. Only a regular file is read: init
    replaces files, never follows a link (a symlinked .gitignore would copy what it points at into the project)."""
    path = root / ".gitignore"
    try:
        text = files.read_document(path, follow=False).decode() if os.path.lexists(path) else ""
    except (OSError, UnicodeDecodeError) as err:
        raise UsageError(f"{path}: cannot add ortbuild's lines to it ({err})",
                         "make it a readable text file, or remove it") from None
    missing = [line for line in GITIGNORE if line not in text.splitlines()]
    if not missing:
        return None
    head = text if not text or text.endswith("\n") else text + "\n"
    why = "# ortbuild: build output, nox's virtualenvs, development keys, private keys, a venv, Python's caches\n"
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


def npz_bytes(arrays: Mapping[str, np.ndarray]) -> bytes:
    buffer = io.BytesIO()
    np.savez(buffer, **arrays)  # type: ignore[arg-type]
    return buffer.getvalue()


def publish(root: Path, texts: Mapping[Path, bytes]) -> None:
    """Each file into a temp file beside its place, then all renamed into place (a failure leaves none written)."""
    partials: dict[Path, Path] = {}
    try:
        for path in texts:
            files.safe_mkdir(path.parent, root)
        for path, blob in texts.items():
            partials[path] = files.partial_file(path, root)
            with files.open_partial(partials[path]) as f:
                f.write(blob)
            os.chmod(partials[path], 0o644)
        for path, partial in partials.items():
            files.publish(partial, path, root)
    except OSError as err:
        raise UsageError(f"init could not write into {root}: {err}", "fix what it names, then run init again") \
            from None
    finally:
        for partial in partials.values():
            partial.unlink(missing_ok=True)


def write(root: Path, scaffold: Scaffold, force: bool, check: Callable[[Project], None]) -> list[Path]:
    """Write the scaffold, all or nothing: every check first (files to replace, folders to make, the targets.toml
    loading), then each file into a temp file beside its place, then all renamed into place."""
    ignore = gitignore(root)
    # the generated inputs and recorded outputs first, then the files naming them
    texts = {path: npz_bytes(arrays) for path, arrays in scaffold.data.items()}
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
    publish(root, texts)
    return list(texts)
