"""Each targets.toml key is declared once (ortbuild.project.declare): the key tables, the construction of the
settings and the build key come from that declaration. The build key is complete: changing any key that rebuilds
(its declaration says so) changes the real build key of a job, and changing any other key leaves it as it was."""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from ortbuild.artifact import keys
from ortbuild.pipeline.build import Builder
from ortbuild.project import config, declare, options, plan, providers, sections, settings, tables
from tests.conftest import MODELS, REPO, here_runtime

# the value a key takes in the changed project where the one its kind gives would not load (or not differ)
VARIANTS: dict[str, object] = {
    "target.precision": "fp16",
    "target.fusion.model_type": "bert",
    "target.int4.block_size": 64,
    "target.disabled_optimizers": ["ConstantFolding"],
    "target.custom_ops": ["libfake.so"],
    "model.custom_ops": ["libfake.so"],
    "target.providers": ["CoreMLExecutionProvider", "CPUExecutionProvider"],
    "target.models": ["tiny_*"],
    "target.extends": "ref",
    "target.overrides": [{"models": ["*"], "precision": "fp16"}],
    "target.latency.faster_than": {"target": "ref", "ratio": 0.5},
    "target.latency.confidence": 0.9,
    "target.fusion.hidden_size": 128,
    "target.latency.faster_than.target": "ref2",
    "target.session.config": {"session.intra_op.allow_spinning": "0"},
    "target.free_dimensions": {"batch": 1},
    "target.runner": ["self-hosted"],
    "target.runtime": "onnxruntime==1.30.0",
    "target.quantization.op_types": ["MatMul"],
    "target.quantization.exclude_nodes": ["conv1"],
    "target.int4.exclude_nodes": ["conv1"],
    "target.fp16.op_block_list": ["Relu"],
    "target.fp16.node_block_list": ["conv1"],
    "target.candidates": ["int8-dynamic"],
    "model.path": str(MODELS / "tiny_lstm.onnx"),
    "model.inputs": str(MODELS / "tiny_lstm.inputs.npz"),
    "model.calibration": str(MODELS / "tiny_lstm.calib.npz"),
    "model.expected": str(MODELS / "tiny_lstm.inputs.npz"),
    "model.heldout": str(REPO / "README.md"),
    "model.eval.inputs": str(MODELS / "tiny_cnn.calib.npz"),
    "model.eval.labels": str(MODELS / "tiny_lstm.calib.npz"),
    "model.eval.metric": "f1",
    "target.eval.confidence": 0.9,
}
# what both projects set for a key to be changed on its own (the rest of its table, a precision that reads it)
CONTEXT: dict[str, dict[str, Any]] = {
    "target.fusion.num_heads": {"target.fusion": {"model_type": "bert", "num_heads": 2, "hidden_size": 64}},
    "target.fusion.hidden_size": {"target.fusion": {"model_type": "bert", "num_heads": 2, "hidden_size": 64}},
    "target.latency.faster_than.target": {"target.latency.faster_than": {"target": "ref", "ratio": 0.5}},
    "target.latency.faster_than.ratio": {"target.latency.faster_than": {"target": "ref", "ratio": 0.5}},
    "target.platform": {"target.optimization": "extended"},
    "model.calibration": {"target.precision": "int8-static", "model.calibration": str(MODELS / "tiny_cnn.calib.npz")},
    # a scenario's table, the target's or a data set's own (complete where the target has none)
    **{f"{at}.server.{k}": {f"{at}.server": {"qps": 10}}
       for at in ("target.latency", "target.latency.data_sets.test_data_set_0")
       for k in ("p99_ms", "p90_ms", "min_seconds", "min_queries", "seed", "workers", "peak_precision")},
    **{f"{at}.multi_stream.{k}": {f"{at}.multi_stream": {"streams": 2}}
       for at in ("target.latency", "target.latency.data_sets.test_data_set_0")
       for k in ("p99_ms", "min_seconds", "min_queries")},
    # a labelled evaluation set (only the eval gate reads it: never in the build key), and the budget that needs one
    **{f"{table}.{k}": {"model.eval": {"inputs": str(MODELS / "tiny_cnn.inputs.npz"),
                                       "labels": str(MODELS / "tiny_cnn.calib.npz")}}
       for table, names in (("model.eval", ("inputs", "labels", "metric", "output", "batch", "max_samples")),
                            ("target.eval", ("max_drop", "confidence"))) for k in names},
    # a generative model's key: the project's model is a Hugging Face-format directory (a stub, only hashed here)
    "model.heldout": {"model.path": str(REPO / "tests" / "fixtures" / "hf_stub"),
                      "model.inputs": str(REPO / "tests" / "fixtures" / "hf_stub" / "prompts.txt")},
}
NAMED = {"output_accuracy": "logits", "latency_data_set": "test_data_set_0"}  # an entry of each named table


def _paths(table: str, prefix: str) -> Iterator[tuple[str, options.Key]]:
    """Every key under `table`: (dotted path, its declaration), sub-tables included."""
    for k in options.TABLES[table]:
        path = f"{prefix}.{k.name}"
        if k.kind == "table" and k.table:
            yield from _paths(k.table, path)
        elif k.kind == "named" and k.table:
            yield path, k
            yield from _paths(k.table, f"{path}.{NAMED[k.table]}")
        else:
            yield path, k


def _variant(path: str, k: options.Key) -> object:
    if path in VARIANTS:
        return VARIANTS[path]
    default = k.default
    if k.kind == "boolean":
        return not default
    if k.kind == "string" and k.choices:
        return next(c for c in k.choices if c != default)
    if k.kind == "string":
        return "changed"
    if k.kind == "integer":
        return int(default or 0) + 1
    if k.kind == "number":
        return 1.0 if default is None else (default / 2 if default else 0.5)
    if k.kind == "named" and k.table:
        return {NAMED[k.table]: {}}
    raise AssertionError(f"{path}: add a changed value of this {k.kind} key to VARIANTS")


def _put(doc: dict[str, Any], path: str, value: object) -> None:
    """Set a dotted path of the test project (target.* is [targets.t], model.* [models.tiny_cnn])."""
    head, *rest = path.split(".")
    node = {"target": doc["targets"]["t"], "model": doc["models"]["tiny_cnn"], "project": doc["project"]}[head]
    for part in rest[:-1]:
        node = node.setdefault(part, {})
    node[rest[-1]] = value


def _toml(value: object) -> str:
    if isinstance(value, dict):
        return "{ " + ", ".join(f"{json.dumps(k)} = {_toml(v)}" for k, v in value.items()) + " }"
    if isinstance(value, list):
        return "[" + ", ".join(_toml(v) for v in value) + "]"
    return json.dumps(value)


def _key(folder: Path, changes: dict[str, object]) -> str:
    """The real build key of job t/tiny_cnn in a project with `changes` made (Builder.prepare: every digest)."""
    # the model by name: a wildcard never selects a generative model (model.heldout's context)
    cpu = {"runtime": here_runtime(), "providers": ["CPUExecutionProvider"], "models": ["tiny_cnn"]}
    doc: dict[str, Any] = {"project": {"name": "t", "version": "1"},
                           "models": {"tiny_cnn": {"path": str(MODELS / "tiny_cnn.onnx"),
                                                   "inputs": str(MODELS / "tiny_cnn.inputs.npz")}},
                           "targets": {"ref": dict(cpu), "ref2": dict(cpu), "t": dict(cpu)}}
    for path, value in changes.items():
        _put(doc, path, value)
    text = "".join(f"[{name}]\n" + "".join(f"{k} = {_toml(v)}\n" for k, v in table.items())
                   for name, table in [("project", doc["project"]),
                                       *((f"models.{m}", t) for m, t in doc["models"].items()),
                                       *((f"targets.{t}", v) for t, v in doc["targets"].items())])
    folder.mkdir()
    (folder / "libfake.so").write_bytes(b"not a library, only hashed")
    (folder / "targets.toml").write_text(text)
    project = config.load(folder / "targets.toml")
    job = plan.jobs(project, ["t"], ["tiny_cnn"])[0]
    builder = Builder(project, folder / "dist", secrets=keys.read_secrets(), progress=lambda job, msg: None)
    return builder.prepare(job).key


KEYS = [*_paths("project", "project"), *_paths("model", "model"), *_paths("target", "target")]


@pytest.mark.parametrize(("path", "key"), KEYS, ids=[p for p, _ in KEYS])
def test_a_key_rebuilds_exactly_when_its_declaration_says_so(path: str, key: options.Key, tmp_path: Path) -> None:
    context: dict[str, object] = dict(CONTEXT.get(path, {}))
    base = _key(tmp_path / "base", context)
    changed = _key(tmp_path / "changed", {**context, path: _variant(path, key)})
    rebuilds = key.build != "never" or bool(key.rebuilds)
    assert (changed != base) == rebuilds, (
        f"{path} is declared build={key.build!r}{f', rebuilds: {key.rebuilds}' if key.rebuilds else ''}, but "
        f"changing it {'left the build key as it was' if rebuilds else 'changed the build key'}")


def test_the_tables_are_the_declared_fields() -> None:
    """Every declared field is a key of its table, and every key of a dataclass-backed table is a field."""
    backed = {"project": settings.Project, "model": settings.Model, **declare.sub_tables(settings.Model),
              **declare.sub_tables(settings.Settings), **declare.sub_tables(settings.Gates)}
    for table, cls in backed.items():
        declared = [f.name for f in dataclasses.fields(cls) if f.metadata.get("ortbuild.key")]
        assert [k.name for k in tables.TABLES[table]] == declared, table
    per_model = [k.name for k in (*declare.keys_of(settings.Settings), *declare.keys_of(settings.Gates))]
    assert tuple(per_model) == tables.OVERRIDABLE
    assert [k.name for k in tables.TABLES["override"]] == ["models", *per_model]
    target = [k.name for k in tables.TABLES["target"]]
    assert target == ["extends", *(k.name for k in declare.keys_of(settings.Target)), *per_model, "overrides"]


def test_kinds_choices_and_defaults_come_from_the_annotations() -> None:
    q = options.keys("quantization")
    assert (q["format"].kind, q["format"].choices, q["format"].default) == ("string", ("qdq", "qoperator"), "qdq")
    assert (q["op_types"].kind, q["op_types"].default) == ("strings", [])
    t = options.keys("target")
    assert t["precision"].choices == options.PRECISIONS and t["optimization"].choices == options.LEVELS
    assert (t["quantization"].kind, t["quantization"].table, t["quantization"].default) == ("table", "quantization",
                                                                                              {})
    assert options.keys("latency")["faster_than"].default is None  # an optional table stays absent
    assert tables.not_inherited() == {"extends": True, "latency": {"faster_than": True}}

    @dataclasses.dataclass(frozen=True)
    class Odd:
        value: complex = declare.setting(0j, doc="no kind for it")

    with pytest.raises(TypeError, match="give kind="):
        declare.keys_of(Odd)


def test_built_settings_equal_the_table_and_the_build_key_omits_what_it_should(tmp_path: Path) -> None:
    doc = {"format": "qoperator", "op_types": ["MatMul"]}
    q = declare.build(sections.Quantization, doc)
    assert q == sections.Quantization(format="qoperator", op_types=("MatMul",))
    s = settings.Settings(providers=(providers.Provider("CPUExecutionProvider"),))
    key = s.as_json()
    assert "fusion" not in key and "custom_ops" not in key  # when-set keys at their default
    everything = declare.plain(sections.Quantization())
    assert isinstance(everything, dict)  # quantization.recipe is when-set: a key added later, omitted at its default
    assert key["quantization"] == {k: v for k, v in everything.items() if k != "recipe"}
    fused = dataclasses.replace(s, fusion=sections.Fusion("bert"))
    assert fused.as_json()["fusion"] == {"model_type": "bert", "num_heads": 0, "hidden_size": 0}


def test_a_new_key_needs_only_its_declaration(tmp_path: Path) -> None:
    """The exercise of issue 37, kept: a key declared on Session is validated, in the schema, the reference and the
    build key, with nothing else written for it."""

    @dataclasses.dataclass(frozen=True)
    class Session(sections.Session):
        example: int = declare.setting(0, maximum=9, doc="A throw-away key.")

    keys_ = {k.name: k for k in declare.keys_of(Session)}
    assert keys_["example"].kind == "integer" and keys_["example"].build == "always"
    on = declare.build(Session, {"example": 3})
    assert declare.build_json(on)["example"] == 3 and declare.build_json(Session())["example"] == 0
