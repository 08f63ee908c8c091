"""Precision accounting (ortbuild.pipeline.steps.accounting): what a precision step changed, counted in every graph,
If/Loop/Scan bodies included; a step that changed nothing fails the job; constant-folding inflation inside
subgraphs is seen and undone; an already-quantized source is reported by `plan`."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from ortbuild.artifact import manifest_types
from ortbuild.pipeline.steps import accounting, optimize, precision
from ortbuild.project import config
from tests.conftest import here_runtime, run_cli

N = 128  # weights of 128x128: 64 KB in fp32
QUANT = {"per_channel": False, "reduce_range": False, "weight_type": "int8", "op_types": [], "exclude_nodes": [],
         "preprocess": True, "format": "qoperator", "activation_type": "uint8", "calibration_method": "minmax"}


def _branch(name: str, weight: np.ndarray, cast: bool) -> onnx.GraphProto:
    """y = x @ W, W a Constant node inside the branch (as spox/torch exporters write them); `cast`: W is
    stored in fp16 and cast to float in the graph (constant folding doubles it)."""
    nodes = [helper.make_node("Constant", [], [f"{name}_w"], value=numpy_helper.from_array(weight, f"{name}_w"))]
    w = f"{name}_w"
    if cast:
        nodes.append(helper.make_node("Cast", [w], [f"{name}_wf"], to=TensorProto.FLOAT))
        w = f"{name}_wf"
    nodes.append(helper.make_node("MatMul", ["x", w], [f"{name}_y"]))
    return helper.make_graph(nodes, name, [], [helper.make_tensor_value_info(f"{name}_y", TensorProto.FLOAT,
                                                                             None)])


def if_model(path: Path, cast: bool = False) -> Path:
    """A model whose every weight sits inside the two branches of an If (like Silero's VAD)."""
    rng = np.random.default_rng(0)
    dtype = np.float16 if cast else np.float32
    then = _branch("then", rng.standard_normal((N, N)).astype(dtype) * 0.1, cast)
    other = _branch("else", rng.standard_normal((N, N)).astype(dtype) * 0.1, cast)
    nodes = [helper.make_node("Constant", [], ["k"], value=numpy_helper.from_array(np.array(16000, np.int64))),
             helper.make_node("Equal", ["sr", "k"], ["c"]),
             helper.make_node("If", ["c"], ["y"], then_branch=then, else_branch=other)]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["n", N]),
                                           helper.make_tensor_value_info("sr", TensorProto.INT64, [])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["n", N])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.checker.check_model(model)
    onnx.save(model, str(path))
    np.savez(path.with_suffix(".inputs.npz"), x=rng.standard_normal((4, N)).astype(np.float32),
             sr=np.array(16000, np.int64))
    return path


def _project(root: Path, model: Path, targets: str) -> Path:
    (root / "targets.toml").write_text(f"""
[project]
name = "acc"
version = "1"

[models.m]
path = "{model}"
inputs = "{model.with_suffix('.inputs.npz')}"

[targets.fp32]
runtime = "{here_runtime()}"
providers = ["CPUExecutionProvider"]
precision = "fp32"
optimization = "all"
{targets}""")
    return root / "targets.toml"


def test_weights_and_ops_are_counted_inside_subgraphs(tmp_path: Path) -> None:
    model = onnx.load(str(if_model(tmp_path / "m.onnx")))
    w = accounting.weights(model)
    assert sum(b for dt, b in w.values() if dt == TensorProto.FLOAT) == 2 * N * N * 4  # both branches
    assert accounting.op_counts(model)["MatMul"] == 2
    assert accounting.already_reduced(model) is None


def test_int8_dynamic_quantizes_weights_inside_if_branches(tmp_path: Path) -> None:
    src = if_model(tmp_path / "m.onnx")
    work = tmp_path / "work"
    work.mkdir()
    model = onnx.load(str(src))
    res = precision.run(src, model, "int8-dynamic", QUANT, work)
    assert res.changed is not None
    assert res.changed.subgraph_ops >= 2, res.changed  # the quantized MatMuls sit inside the branches
    assert res.changed.tensors == 2
    assert res.changed.converted > 0.9
    assert precision.too_little("int8-dynamic", res.changed, QUANT) is None
    assert "subgraphs" in res.changed.summary()
    out = onnx.load(str(res.path))
    assert accounting.already_reduced(out) is not None  # and a quantized model is recognised as such
    from ortbuild.gating.search import explain

    said = explain._in_subgraphs(out)  # where no node there has a name to keep: what the search says to do
    assert "MatMulInteger 2" in said and "quantization.op_types" in said
    assert explain._in_subgraphs(onnx.load(str(src))) == ""


def test_a_precision_that_converts_nothing_fails_the_job_with_the_way_out(tmp_path: Path) -> None:
    src = if_model(tmp_path / "m.onnx")
    cfg = _project(tmp_path, src, """
[targets.int8]
extends = "fp32"
precision = "int8-dynamic"
quantization = { op_types = ["Conv"] }
""")
    r = run_cli("build", "-c", str(cfg), "-t", "int8")
    assert r.returncode == 6, r.stderr
    assert "int8/m: step 'precision': int8-dynamic converted 0.0% of the float weights" in r.stderr
    assert "read by: MatMul" in r.stderr
    assert "op_types = ['Conv'] leaves them out" in r.stderr
    assert not (tmp_path / "dist" / "int8" / "m" / manifest_types.MANIFEST).exists()
    # the failed job still reports what the step converted, and the source's size (the check step ran)
    job = json.loads(run_cli("build", "-c", str(cfg), "-t", "int8", "--json").stdout)["jobs"][0]
    assert job["status"] == "failed" and job["converted"] == 0.0 and job["source_size"] > 0


def test_accounting_is_recorded_in_the_manifest_and_the_build_table(tmp_path: Path) -> None:
    src = if_model(tmp_path / "m.onnx")
    cfg = _project(tmp_path, src, """
[targets.int8]
extends = "fp32"
precision = "int8-dynamic"
""")
    r = run_cli("build", "-c", str(cfg), "-t", "int8")
    assert r.returncode == 0, r.stderr
    row = next(line for line in r.stdout.splitlines() if line.startswith("int8 "))
    assert "int8-dynamic" in row.split() and ("100%" in row.split() or "99%" in row.split()), row
    m = manifest_types.Manifest.from_json((tmp_path / "dist" / "int8" / "m" / manifest_types.MANIFEST).read_bytes())
    assert m.precision.changed is not None and m.precision.changed["subgraph_ops"] >= 2
    assert m.precision.changed["converted"] > 0.9
    r = run_cli("build", "-c", str(cfg), "-t", "int8", "--json")  # up to date: the share is read back
    job = json.loads(r.stdout)["jobs"][0]
    assert job["status"] == "up-to-date" and job["converted"] > 0.9


def test_constant_folding_inflation_inside_subgraphs_is_undone(tmp_path: Path) -> None:
    src = if_model(tmp_path / "m.onnx", cast=True)
    settings = config.load(_project(tmp_path, src, "")).targets["fp32"].settings["m"]
    res = optimize.run(src, settings, list(settings.providers), {}, tmp_path)
    assert res.inflation is not None, "the fp16 -> float Cast folded inside the branches must be seen"
    assert res.inflation["growth"] >= 1.9
    assert any("then" in g["initializer"] or "else" in g["initializer"] for g in res.inflation["grown"])
    assert "ConstantFolding" in res.disabled_optimizers
    assert optimize._size(res.path) <= 1.05 * src.stat().st_size


def test_plan_reports_an_already_quantized_source(tmp_path: Path) -> None:
    from onnxruntime.quantization import quantize_dynamic

    src = if_model(tmp_path / "m.onnx")
    q = tmp_path / "q.onnx"
    weights = tmp_path / "weights.onnx"
    onnx.save(precision._constants_to_initializers(onnx.load(str(src))), str(weights))
    quantize_dynamic(str(weights), str(q), extra_options={"EnableSubgraph": True})
    (tmp_path / "q.inputs.npz").write_bytes(src.with_suffix(".inputs.npz").read_bytes())
    cfg = _project(tmp_path, q, """
[targets.int8]
extends = "fp32"
precision = "int8-dynamic"
""")
    r = run_cli("plan", "-c", str(cfg), "--json")
    assert r.returncode == 0, r.stderr
    jobs = {j["target"]: j for j in json.loads(r.stdout)}
    assert jobs["fp32"]["notes"] == []
    assert any("already reduced" in n and "MatMulInteger" in n for n in jobs["int8"]["notes"]), jobs["int8"]
    r = run_cli("plan", "-c", str(cfg))
    assert "[int8/m] note: the source is already reduced" in r.stdout


@pytest.mark.parametrize("share,fails", [(0.0, True), (0.04, True), (0.06, False)])
def test_the_threshold(share: float, fails: bool) -> None:
    a = accounting.Accounting(ops={}, tensors=0, float_bytes_before=1000, reduced_as_float=round(1000 * share),
                              float_bytes_after=round(1000 * (1 - share)), bytes_before=1000, bytes_after=1000,
                              subgraph_ops=0, users={"MatMul": 1000})
    assert (precision.too_little("int8-dynamic", a, QUANT) is not None) is fails
