"""Golden data: the input feeds of a model and the outputs every artifact must reproduce.

Inputs come from the model's `inputs` (an .npz: one feed; or ONNX-layout `test_data_set_N/` directories:
one feed each). Expected outputs are the user's (`expected`: an .npz keyed by output name, or the
`output_K.pb` files of the same ONNX layout; or those `ortbuild init` recorded, while the inputs are those it
recorded them from: ortbuild.project.expected), else computed from the *source* model in fp32 on the CPU
provider with optimizations disabled. Either way they are stored beside each artifact in the ONNX layout
(`golden/test_data_set_N/{input_K,output_K}.pb` and `golden/golden.json`: hashes and provenance), so other
tools (onnx's backend runner, Polygraphy) can read them.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import tempfile
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from ortbuild import files as files_
from ortbuild.artifact import manifest
from ortbuild.errors import ConfigError
from ortbuild.modelfiles import Signature, ValueInfo
from ortbuild.project import data, expected, precisions
from ortbuild.project.config import CustomOps, Model

if TYPE_CHECKING:
    import onnx

GOLDEN_DIR = manifest.GOLDEN_DIR
GOLDEN_JSON = "golden.json"


@dataclass(frozen=True)
class DataSet:
    name: str                          # test_data_set_N
    inputs: data.Feed
    expected: Mapping[str, object]     # output name -> ndarray, list (sequence) or dict (map)


@dataclass(frozen=True)
class Golden:
    sets: list[DataSet]
    made_by: str                       # how the expected outputs were made (provenance)
    source: str                        # "user" | "computed"
    warnings: tuple[str, ...] = ()     # what the test result says of them (recorded outputs of other inputs)


def _to_proto(value: object, name: str) -> onnx.TensorProto | onnx.SequenceProto | onnx.MapProto:
    from onnx import numpy_helper

    if isinstance(value, list):
        return numpy_helper.from_list(value, name)
    if isinstance(value, dict):
        return numpy_helper.from_dict(value, name)
    return numpy_helper.from_array(np.asarray(value), name)


def _expected_dir(folder: Path, outputs: list[ValueInfo]) -> dict[str, object]:
    files = data.numbered(folder, "output")
    if len(files) != len(outputs):
        raise ConfigError(str(folder), "", f"holds {len(files)} output_K.pb files, the model has {len(outputs)} "
                                           f"outputs {[o['name'] for o in outputs]}")
    out: dict[str, object] = {}
    for f, spec in zip(files, outputs, strict=True):
        name, value = data.read_pb(f, spec.get("kind", "tensor"))
        if name and name != spec["name"]:
            raise ConfigError(str(f), "", f"holds output '{name}', but output #{f.stem.split('_')[1]} of the model "
                                          f"is '{spec['name']}'")
        out[spec["name"]] = value
    return out


def load(model: Model, signature: Signature) -> list[tuple[str, data.Feed, Mapping[str, object] | None]]:
    """(data set name, feed, user-supplied expected outputs or None) for every data set of the model."""
    names = [i["name"] for i in signature["inputs"]]
    outputs = signature["outputs"]
    if model.inputs.is_dir():
        sets = [(d.name, data.dataset_feed(d, names)) for d in data.datasets(model.inputs)]
    else:
        sets = [("test_data_set_0", data.load_feed(model.inputs, names))]
    for _, feed in sets:
        data.check_feed(feed, signature, str(model.inputs))
    exp = model.expected
    if exp is None:
        return [(n, f, None) for n, f in sets]
    where = f"models.{model.name}.expected"
    if exp.is_dir():
        dirs = {d.name: d for d in data.datasets(exp)}
        missing = [n for n, _ in sets if n not in dirs]
        if missing:
            raise ConfigError(str(exp), where, f"has no {', '.join(missing)} for the inputs' data sets",
                              "give one test_data_set_N/output_K.pb per input data set")
        return [(n, f, _expected_dir(dirs[n], outputs)) for n, f in sets]
    if len(sets) != 1:
        raise ConfigError(str(exp), where, f"an .npz holds one feed's outputs, the inputs have {len(sets)} "
                                           "data sets", "use the ONNX layout test_data_set_N/output_K.pb")
    arrays = data.npz(exp)
    wanted = [o["name"] for o in outputs]
    if sorted(arrays) != sorted(wanted):
        raise ConfigError(str(exp), where, f"outputs do not match the model: it has {wanted}, the file "
                                           f"{sorted(arrays)}")
    return [(sets[0][0], sets[0][1], arrays)]


def compute(source: Path, feeds: list[data.Feed], custom_ops: Sequence[CustomOps] = ()) \
        -> tuple[list[Mapping[str, object]], str]:
    """The source model's outputs in fp32 on the CPU provider with optimizations disabled, and how."""
    from ortbuild import runtime

    ort = runtime.import_ort()

    so = ort.SessionOptions()
    runtime.register_custom_ops(so, custom_ops)
    so.log_severity_level = 3
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    sess = ort.InferenceSession(str(source), so, providers=["CPUExecutionProvider"])
    names = [o.name for o in sess.get_outputs()]
    results: list[Mapping[str, object]] = [dict(zip(names, sess.run(None, feed), strict=True)) for feed in feeds]
    return results, (f"computed from the source model ({source.name}) in fp32 with onnxruntime {ort.__version__}"
                     " CPUExecutionProvider, optimizations disabled")


def golden_for(model: Model, signature: Signature, custom_ops: Sequence[CustomOps]) -> Golden:
    """The golden data of a model; custom_ops: the libraries its sessions need (the target's and the model's).
    Expected outputs `ortbuild init` recorded from other golden inputs than these (ortbuild.project.expected) are
    not compared with: the source's outputs are, with a warning saying how they moved. Golden data that tests
    nothing is refused (vacuous())."""
    loaded = load(model, signature)
    record = expected.read_record(model)
    given = [(n, e) for n, _, e in loaded if e is not None]
    moved = record is not None and expected.moved(model, record, [(n, f) for n, f, _ in loaded], given)
    if len(given) == len(loaded) and not moved:
        made_by = f"user-supplied: {model.expected}" if record is None else \
            f"recorded by {expected.RECORDED_BY}: {model.expected} ({record.made_by})"
        g = Golden([DataSet(n, f, e) for n, f, e in loaded if e is not None], made_by, "user")
    else:
        values, how = compute(model.path, [f for _, f, _ in loaded], custom_ops)
        said = (stale_warning(model, record.inputs_sha256, [e for _, e in given], values),) \
            if moved and record is not None else ()
        g = Golden([DataSet(n, f, v) for (n, f, _), v in zip(loaded, values, strict=True)], how, "computed", said)
    vacuous(model, g)
    return g


def moved_by(old: object, new: object) -> str:
    """How one output moved from `old` to `new`: 'unchanged', its shape, or its largest difference."""
    if not isinstance(old, np.ndarray) or not isinstance(new, np.ndarray):
        return "unchanged" if repr(old) == repr(new) else "changed"
    if old.shape != new.shape:
        return f"shape {list(old.shape)} -> {list(new.shape)}"
    if old.dtype.kind not in "fc" or new.dtype.kind not in "fc":
        differ = int(np.count_nonzero(old != new))
        return "unchanged" if not differ else f"{differ} of {old.size} values differ"
    diff = np.abs(old.astype(np.float64) - new.astype(np.float64))
    worst = float(np.nanmax(diff)) if diff.size and not np.isnan(diff).all() else 0.0
    scale = float(np.nanmax(np.abs(old))) if old.size and not np.isnan(old).all() else 0.0
    return "unchanged" if worst == 0 else f"max |diff| {worst:.3g} (largest |recorded| {scale:.3g})"


def stale_warning(model: Model, recorded_from: str, recorded: Sequence[Mapping[str, object]],
                  now: Sequence[Mapping[str, object]]) -> str:
    """What a test says where the golden inputs are not those the recorded expected outputs were computed on
    (`recorded_from`: their digest), with how each output moved from the recorded ones."""
    moved = [f"'{name}' {moved_by(old.get(name), new[name])}" for old, new in zip(recorded, now, strict=True)
             for name in new]
    return (f"[models.{model.name}] expected ({model.expected}) was recorded by {expected.RECORDED_BY} from other "
            f"golden inputs (values sha256 {recorded_from[:12]}; {model.inputs.name} now holds others): tested "
            f"against the source's outputs on these inputs instead; against the recorded ones they moved: "
            f"{', '.join(moved)}; where the new inputs are meant, record their outputs: {expected.REFRESH}")


def warnings(model: Model, g: Golden) -> list[str]:
    """What a test result says of its golden data: the golden's own warnings, then its (near) constant outputs."""
    return [*g.warnings, *constant_warnings(model, g)]


def warned(found: Sequence[str]) -> str:
    """The test's progress line's word on its golden data's warnings (the summary says each in full)."""
    constant = sum(w.startswith("golden output '") for w in found)
    parts = [f"{constant} golden output(s) (near) constant"] if constant else []
    parts += ["expected outputs recorded from other inputs"] if len(found) > constant else []
    return "; ".join(parts)


def _all_nan(value: object) -> bool:
    return isinstance(value, np.ndarray) and value.dtype.kind in "fc" and value.size > 0 and bool(np.isnan(value).all())


def vacuous(model: Model, g: Golden) -> None:
    """Refuse (ConfigError naming the model's inputs file) a data set whose inputs hold NaN/Inf and that tests no
    weight: a float input with no finite value at all, or a reference output that is NaN everywhere. NaN flows
    through almost any graph, so every artifact, whatever its weights, would reproduce it and the accuracy gate
    would say PASS (exact) having compared nothing. NaN/Inf beside finite values (IsNaN, IsInf, masking models)
    stay allowed: the comparison expects them exactly where the reference has them."""
    where = f"models.{model.name}.inputs"
    hint = ("golden inputs are realistic samples with finite values (numpy.savez(path, name=array, ...)); NaN/Inf "
            "belong beside finite values, where the model is meant to handle them (IsNaN, IsInf, masks)")
    for ds in g.sets:
        bad = {name: n for name, arr in ds.inputs.items() if (n := data.nonfinite(arr))}
        if not bad:
            continue
        said = ", ".join(f"'{name}' ({n} of {ds.inputs[name].size})" for name, n in bad.items())
        floats = [arr for arr in ds.inputs.values() if arr.dtype.kind in "fc" and arr.size]
        if all(data.nonfinite(arr) == arr.size for arr in floats):
            raise ConfigError(str(model.inputs), where, f"data set {ds.name}: the float inputs hold no finite value "
                                                        f"(NaN/Inf in {said}): the accuracy gate would test nothing",
                              hint)
        nan = [name for name, value in ds.expected.items() if _all_nan(value)]
        if nan:
            raise ConfigError(str(model.inputs), where,
                              f"data set {ds.name}: NaN/Inf in input(s) {said} make the reference output(s) "
                              f"{', '.join(repr(n) for n in nan)} NaN everywhere: every artifact, "
                              "whatever its weights, reproduces that, so the accuracy gate would pass having "
                              "compared nothing", hint)


def _tolerance() -> tuple[float, float]:
    """fp32's default (atol, rtol): the tightest default rule, by which values are (near) constant."""
    default = precisions.rule(precisions.FP32).accuracy
    return float(default["atol"]), float(default["rtol"])


def spread(x: np.ndarray) -> tuple[float, float] | None:
    """(mean, std) of an array's finite values; None for fewer than two."""
    x = x.astype(np.float64).ravel()
    x = x[np.isfinite(x)]
    return (float(x.mean()), float(x.std())) if x.size >= 2 else None


def varies(x: np.ndarray) -> float | None:
    """The standard deviation of the finite values where they are not (near) constant (near_constant's rule:
    std > atol + rtol * |mean| at fp32's defaults); None where they are, or are fewer than two."""
    found = spread(x)
    atol, rtol = _tolerance()
    return found[1] if found is not None and found[1] > atol + rtol * abs(found[0]) else None


def near_constant(g: Golden) -> dict[str, str]:
    """The float outputs whose golden values, every element of every data set together, are (near) constant, with
    what was measured.

    The rule: an output is near constant when its values' standard deviation is within fp32's default tolerance
    (the tightest default rule, atol 1e-5 + rtol 1e-4) of their mean: std <= atol + rtol * |mean|. An artifact
    that output the mean everywhere would then be off by less than that tolerance in root mean square: the
    output holds less signal than the accuracy gate ignores, so the gate tests almost nothing (random noise fed
    to a text detector gives an all-zero map: max 4.8e-5, std 3.3e-7; real text, std 0.26). It does not depend
    on a target's own rule: a task rule (a loose atol beside a cosine) would call real outputs constant. An output
    of one element is never judged; integer, boolean, string, sequence and map outputs are not (they match
    exactly)."""
    atol, rtol = _tolerance()
    values: dict[str, list[np.ndarray]] = {}
    for ds in g.sets:
        for name, value in ds.expected.items():
            if isinstance(value, np.ndarray) and value.dtype.kind == "f":
                values.setdefault(name, []).append(value.astype(np.float64).ravel())
    out = {}
    for name, parts in values.items():
        x = np.concatenate(parts)
        x = x[np.isfinite(x)]
        found = spread(x)
        if found is None:
            continue
        mean, std = found
        if std <= atol + rtol * abs(mean):
            lo, hi = float(x.min()), float(x.max())
            out[name] = (f"{x.size} values in [{lo:.3g}, {hi:.3g}], mean {mean:.3g}, std {std:.3g} <= the tolerance "
                         f"{atol:g} + {rtol:g} * |mean|" if hi > lo else
                         f"every one of its {x.size} values is {lo:.6g}")
    return out


def constant_warnings(model: Model, g: Golden) -> list[str]:
    """What a test result says of the golden outputs that are (near) constant (near_constant): the gate compared
    them, but any artifact that output about that constant would pass."""
    return [f"golden output '{name}' is (near) constant ({what}): the accuracy gate tests almost nothing; give "
            f"real inputs ([models.{model.name}] inputs = \"{model.inputs}\")"
            for name, what in near_constant(g).items()]


def write(folder: Path, golden: Golden, signature: Signature, *, root: Path,
          sign: Callable[[dict[str, tuple[str, int]]], object] | None = None) -> Path:
    """Store the golden data in the ONNX layout under folder/golden/, replacing it as a whole. `sign` gets every
    file's name (relative to `folder`), sha256 and size once they are written, before they replace the old ones
    (the signed manifest lists them: equal golden data, the common case, leaves no window where they differ)."""
    blobs: dict[str, bytes] = {}
    for ds in golden.sets:
        pairs: list[tuple[str, str, object]] = [(f"input_{k}.pb", name, ds.inputs[name]) for k, name in
                 enumerate(i["name"] for i in signature["inputs"])]
        pairs += [(f"output_{k}.pb", o["name"], ds.expected[o["name"]]) for k, o in enumerate(signature["outputs"])]
        for file, name, value in pairs:
            blobs[f"{ds.name}/{file}"] = _to_proto(value, name).SerializeToString()
    meta = {"made_by": golden.made_by, "source": golden.source,
            "inputs": [i["name"] for i in signature["inputs"]], "outputs": [o["name"] for o in signature["outputs"]]}
    return write_files(folder, blobs, meta, root=root, sign=sign)


TOKENS_JSON = "tokens.json"  # a generative model's golden data: prompts, the source's and the artifact's tokens


def write_files(folder: Path, blobs: Mapping[str, bytes], meta: Mapping[str, object], *, root: Path,
                sign: Callable[[dict[str, tuple[str, int]]], object] | None = None) -> Path:
    """folder/golden/ replaced as a whole by `blobs` (names relative to it) and golden.json (`meta` with every
    file's sha256), each signed through `sign` before it replaces the old ones (see write)."""
    target = folder / GOLDEN_DIR
    files_.safe_mkdir(folder, root)  # below the output directory, no symlink followed (files.py)
    tmp = Path(tempfile.mkdtemp(prefix=".golden.", dir=folder))
    files: dict[str, str] = {}
    sizes: dict[str, tuple[str, int]] = {}
    try:
        for name, blob in blobs.items():
            (tmp / name).parent.mkdir(parents=True, exist_ok=True)
            (tmp / name).write_bytes(blob)
            files[name] = hashlib.sha256(blob).hexdigest()
            sizes[f"{GOLDEN_DIR}/{name}"] = (files[name], len(blob))
        doc = {"made_by": meta["made_by"], "source": meta["source"], "files": files,
               **{k: v for k, v in meta.items() if k not in ("made_by", "source")}}
        text = (json.dumps(doc, indent=2) + "\n").encode()
        (tmp / GOLDEN_JSON).write_bytes(text)
        sizes[f"{GOLDEN_DIR}/{GOLDEN_JSON}"] = (hashlib.sha256(text).hexdigest(), len(text))
        if sign is not None:
            sign(sizes)
        old = folder / f".golden.old.{os.getpid()}"
        if target.exists():
            target.rename(old)
        tmp.rename(target)
        shutil.rmtree(old, ignore_errors=True)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return target


def read(folder: Path, signature: Signature) -> list[DataSet]:
    """The golden data stored beside an artifact (folder/golden/test_data_set_N/), as written by write()."""
    names = [i["name"] for i in signature["inputs"]]
    return [DataSet(d.name, data.dataset_feed(d, names), _expected_dir(d, signature["outputs"]))
            for d in data.datasets(folder / GOLDEN_DIR)]


def digest(golden: Golden) -> str:
    """A digest of the golden data (inputs and expected outputs), recorded in the test report."""
    h = hashlib.sha256()
    for ds in golden.sets:
        h.update(ds.name.encode())
        for name in sorted(ds.inputs):
            h.update(name.encode() + np.ascontiguousarray(ds.inputs[name]).tobytes())
        for name in sorted(ds.expected):
            value = ds.expected[name]
            blob = np.ascontiguousarray(value).tobytes() if isinstance(value, np.ndarray) else repr(value).encode()
            h.update(name.encode() + blob)
    return h.hexdigest()

