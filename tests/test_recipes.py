"""int8-static's known-good starting points (ortbuild/pipeline/steps/recipes.py, `quantization.recipe`): which
graphs get the transformer recipe, and what a real build of one leaves in float."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import onnx
import pytest

from ortbuild.artifact import container
from ortbuild.pipeline.steps import recipes
from tests.conftest import REPO, TEST_KEY, run_cli


def _act_by_act(graph: onnx.GraphProto) -> list[str]:
    consts = {i.name for i in graph.initializer}
    return [n.name for n in graph.node if n.op_type == "MatMul" and not {*n.input} & consts]


def test_graphs_with_attention_get_the_transformer_recipe_and_others_none() -> None:
    graph = onnx.load(str(REPO / "models" / "tiny_transformer.onnx")).graph
    found = recipes.transformer(graph, ())
    assert found is not None and found.name == "transformer"
    assert found.op_types == ("MatMul", "Gemm")
    assert list(found.exclude_nodes) == _act_by_act(graph) and len(found.exclude_nodes) == 6  # q x k, p x v; 3 layers
    assert found.extra_options == {"OpTypesToExcludeOutputQuantization": ["MatMul", "Gemm"]}
    # the target's op_types are kept where set
    assert recipes.transformer(graph, ("MatMul",)).op_types == ("MatMul",)  # type: ignore[union-attr]
    for cnn_or_rnn in ("tiny_cnn", "tiny_lstm"):
        assert recipes.transformer(onnx.load(str(REPO / "models" / f"{cnn_or_rnn}.onnx")).graph, ()) is None


def _graph(dist: Path) -> onnx.ModelProto:
    return onnx.load_model_from_string(bytes(container.decrypt((dist / "model.onnx.enc").read_bytes(), TEST_KEY)))


def _feeds_a_matmul(node: onnx.NodeProto, users: dict[str, list[onnx.NodeProto]]) -> bool:
    """Whether `node`'s output reaches a MatMul's input through Q/DQ pairs and shape ops only (ONNX Runtime's QDQ
    propagation moves the next MatMul's input quantization up through Transpose and Reshape)."""
    return any(u.op_type in ("MatMul", "Gemm") or (u.op_type in ("QuantizeLinear", "DequantizeLinear", "Transpose",
                                                                "Reshape") and _feeds_a_matmul(u, users))
               for u in users.get(node.output[0], []))


@pytest.mark.runtime
def test_a_static_transformer_build_leaves_matmul_outputs_and_attention_in_float(
        make_project: Callable[..., Path], tmp_path: Path) -> None:
    path = make_project("""
        [targets.auto]
        runtime = "RUNTIME"
        providers = ["CPUExecutionProvider"]
        precision = "int8-static"
        optimization = "basic"
        accuracy = { cosine = 0.9 }

        [targets.none]
        extends = "auto"
        quantization = { recipe = "none" }
    """, models=("tiny_transformer",), calibration=True)
    proc = run_cli("build", "-c", str(path))
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = {t: tmp_path / "dist" / t / "tiny_transformer" for t in ("auto", "none")}
    manifest = {t: json.loads((d / "manifest.json").read_text()) for t, d in out.items()}
    options = {t: m["precision"]["options"] for t, m in manifest.items()}
    assert options["auto"]["recipe"] == "transformer" and options["none"]["recipe"] == "none"
    assert any("transformer recipe" in n for n in manifest["auto"]["notes"])
    attention = set(_act_by_act(onnx.load(str(REPO / "models" / "tiny_transformer.onnx")).graph))
    for target, d in out.items():
        graph = _graph(d).graph
        producer = {o: n for n in graph.node for o in n.output}
        users: dict[str, list[onnx.NodeProto]] = {}
        for n in graph.node:
            for i in n.input:
                users.setdefault(i, []).append(n)

        # a MatMul's output quantized as its output: a Q on it that does not lead to another MatMul's input
        quantized_outputs = [n.name for n in graph.node if n.op_type == "QuantizeLinear"
                             and producer.get(n.input[0]) is not None
                             and producer[n.input[0]].op_type in ("MatMul", "Gemm") and not _feeds_a_matmul(n, users)]
        float_attention = [n.name for n in graph.node if n.name in attention and all(
            producer.get(i) is None or producer[i].op_type != "DequantizeLinear" for i in n.input)]
        if target == "auto":  # the recipe: no MatMul output quantized, the attention's MatMuls read float inputs
            assert quantized_outputs == [] and sorted(float_attention) == sorted(attention)
        else:  # ORT's defaults quantize both
            assert quantized_outputs and not float_attention
