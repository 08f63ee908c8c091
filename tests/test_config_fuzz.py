"""Property-based fuzzing of targets.toml: no traceback ever, and nothing the JSON Schema rejects is accepted.

Each example starts from a valid project and mutates it: a value anywhere replaced by a random TOML value
(huge and negative numbers, nan and inf, long and odd strings, deep arrays, wrong types), a key deleted,
renamed or added. The file goes through `ortbuild plan` (config loading, job planning and build keys) in
process. The shipped JSON Schema is the oracle for invalid files: whatever it rejects must fail with a
config error (exit 3); and no input, valid or not, may end in an internal error (exit 1) or a traceback.
"""

from __future__ import annotations

import contextlib
import copy
import functools
import io
import json
import math
from pathlib import Path
from typing import Any

import jsonschema
import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from ortbuild import cli
from ortbuild.cli.info import SCHEMA_FILE
from tests.conftest import MODELS, here_runtime

EXAMPLES = 320


def _base() -> dict[str, Any]:
    return {
        "project": {"name": "fuzz", "version": "1"},
        "models": {
            "cnn": {"path": str(MODELS / "tiny_cnn.onnx"), "inputs": str(MODELS / "tiny_cnn.inputs.npz"),
                    "calibration": str(MODELS / "tiny_cnn.calib.npz")},
        },
        "targets": {
            "cpu": {"runtime": here_runtime(), "providers": ["CPUExecutionProvider"], "precision": "fp32",
                    "optimization": "extended",
                    "session": {"intra_op_num_threads": 1, "config": {"session.intra_op.allow_spinning": "0"}},
                    "latency": {"p90_ms": 50, "warmup_runs": 2},
                    "accuracy": {"outputs": {"logits": {"top1": 0.99}}},
                    "overrides": [{"models": ["cnn"], "quantization": {"per_channel": False}}]},
            "int8": {"extends": "cpu", "precision": "int8-static", "size": {"max_ratio": 0.5}},
            "gpu": {"runtime": "onnxruntime-gpu==1.31.1", "precision": "fp16",
                    "providers": [{"name": "CUDAExecutionProvider",
                                   "options": {"device_id": 0, "cudnn_conv_algo_search": "EXHAUSTIVE"}},
                                  "CPUExecutionProvider"]},
        },
    }


# ------------------------------------------------------------------------------------- a TOML writer

def _key(k: str) -> str:
    return json.dumps(k, ensure_ascii=False)


def _value(v: Any) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, int):
        return str(v)
    if isinstance(v, float):
        return "nan" if math.isnan(v) else ("inf" if v > 0 else "-inf") if math.isinf(v) else repr(v)
    if isinstance(v, str):
        return json.dumps(v, ensure_ascii=False)
    if isinstance(v, list):
        return "[" + ", ".join(_value(x) for x in v) + "]"
    if isinstance(v, dict):
        return "{" + ", ".join(f"{_key(k)} = {_value(x)}" for k, x in v.items()) + "}"
    if isinstance(v, Deep):
        return "[" * v.n + "]" * v.n
    raise TypeError(type(v))


def to_toml(doc: dict[str, Any]) -> str:
    lines = []
    for top, value in doc.items():
        if isinstance(value, dict):
            lines.append(f"[{_key(top)}]")
            lines += [f"{_key(k)} = {_value(v)}" for k, v in value.items()]
        else:
            lines.append(f"{_key(top)} = {_value(value)}")
    return "\n".join(lines) + "\n"


# ------------------------------------------------------------------------------------------ mutations

_text = st.text(alphabet=st.characters(blacklist_categories=("Cs",)), max_size=40)
scalars = st.one_of(
    st.booleans(), st.integers(min_value=-(2**63), max_value=2**63 - 1),
    st.sampled_from([0, 1, -1, 2**31, 10**12, 2**63 - 1]),
    st.floats(allow_nan=True, allow_infinity=True), _text,
    st.sampled_from(["", "..", "/etc/passwd", "/dev/zero", "x" * 5000, "banana", "CPUExecutionProvider",
                     "int8-static", "all", "onnxruntime==1.31.1", "*", "cpu", "0", "1"]),
)
values = st.recursive(scalars, lambda inner: st.one_of(st.lists(inner, max_size=3),
                                                       st.dictionaries(_text, inner, max_size=3)), max_leaves=6)


class Deep:
    """An array nested n deep, written straight into the TOML text (too deep for Python's own recursion)."""

    def __init__(self, n: int) -> None:
        self.n = n


deep = st.integers(min_value=50, max_value=5000).map(Deep)


def _paths(doc: Any, prefix: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    out = [prefix] if prefix else []
    if isinstance(doc, dict):
        for k, v in doc.items():
            out += _paths(v, (*prefix, k))
    elif isinstance(doc, list):
        for i, v in enumerate(doc):
            out += _paths(v, (*prefix, i))
    return out


def _mutate(doc: dict[str, Any], data: st.DataObject) -> dict[str, Any]:
    doc = copy.deepcopy(doc)
    for _ in range(data.draw(st.integers(min_value=1, max_value=3), label="mutations")):
        paths = _paths(doc)
        path = data.draw(st.sampled_from(paths), label="where")
        parent = doc
        for p in path[:-1]:
            parent = parent[p]
        last = path[-1]
        op = data.draw(st.sampled_from(["replace", "replace", "delete", "rename", "add", "deep"]), label="op")
        if op == "replace":
            parent[last] = data.draw(values, label="value")
        elif op == "deep":
            parent[last] = data.draw(deep, label="deep")
        elif op == "delete" and isinstance(parent, dict):
            del parent[last]
        elif op == "rename" and isinstance(parent, dict):
            parent[data.draw(_text, label="new name")] = parent.pop(last)
        elif op == "add" and isinstance(parent[last], dict):
            parent[last][data.draw(_text, label="key")] = data.draw(values, label="value")
    return doc


SCHEMA = json.loads(SCHEMA_FILE.read_text())


@functools.cache
def _validator() -> Any:
    """The schema's validator, the schema checked against its metaschema once (jsonschema.validate does that on
    every call: about 1.5 s for this schema)."""
    cls = jsonschema.validators.validator_for(SCHEMA)
    cls.check_schema(SCHEMA)
    return cls(SCHEMA)


def _has_deep(doc: Any) -> bool:
    if isinstance(doc, Deep):
        return True
    items = doc.values() if isinstance(doc, dict) else doc if isinstance(doc, list) else []
    return any(_has_deep(x) for x in items)


def _schema_accepts(doc: dict[str, Any]) -> bool:
    if _has_deep(doc):
        return False  # no key of targets.toml takes nested arrays
    try:
        _validator().validate(doc)
    except (jsonschema.ValidationError, RecursionError):
        return False
    return True


@pytest.fixture(scope="module")
def workdir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("fuzz")


def test_the_base_project_is_valid(workdir: Path) -> None:
    (workdir / "targets.toml").write_text(to_toml(_base()))
    assert _schema_accepts(_base())
    assert cli.main(["plan", "-c", str(workdir / "targets.toml")]) == 0


@settings(max_examples=EXAMPLES, deadline=None, derandomize=True, database=None,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large,
                                 HealthCheck.function_scoped_fixture])
@given(data=st.data())
def test_mutated_targets_toml_never_crashes_and_invalid_never_passes(workdir: Path, data: st.DataObject) -> None:
    doc = _mutate(_base(), data)
    try:
        text = to_toml(doc)
    except (TypeError, RecursionError) as e:
        event(f"not TOML: {type(e).__name__} {e}"[:60])
        return  # not expressible as TOML
    f = workdir / "targets.toml"
    f.write_text(text, encoding="utf-8")
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = cli.main(["plan", "-c", str(f)])
    event(f"exit {code}, schema {'accepts' if _schema_accepts(doc) else 'rejects'}")
    assert code in (0, 3), f"exit {code}: {err.getvalue()[-2000:]}\n{text[:3000]}"
    assert "Traceback" not in err.getvalue() and "internal error" not in err.getvalue()
    if code == 3:
        assert err.getvalue().startswith(f"ortbuild: config error: {f}")  # names the file (and the key)
    if not _schema_accepts(doc):
        assert code == 3, f"the schema rejects this file, ortbuild accepted it:\n{text[:3000]}"
