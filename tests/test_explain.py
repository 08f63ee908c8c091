"""Precision bisection (`ortbuild test --explain`): a deliberately fragile fp16 model fails its gate, the
printed override is pasted into targets.toml, and `ortbuild test` then passes; the search's logic and bounds."""

from __future__ import annotations

import dataclasses
import json
import math
import re
from collections.abc import Callable
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, numpy_helper
from onnx import helper as h

from ortbuild.gating.search import bisect, explain, explain_render, layerwise, predict
from ortbuild.gating.search.base import Budget
from ortbuild.project import config
from ortbuild.project.plan import Job
from tests.conftest import here_runtime, run_cli


def fragile_model(folder: Path) -> None:
    """y = (relu(x W1 + b1) W2 + 1000.37) - 1000: fp16 stores 1000.37 as 1000.5, and the Add's output has a
    resolution of 0.5 in fp16, so the result is off by ~0.13 on values of about 1 (cosine ~0.98). Keeping the
    node `shift` in fp32 fixes it; keeping `shift` and `unshift` does not (ORT's converter casts to fp16 between
    two blocked nodes), nor does keeping `unshift` alone (where the error shows)."""
    rng = np.random.default_rng(0)
    inits = [numpy_helper.from_array((rng.standard_normal((16, 32)) / 4).astype(np.float32), "W1"),
             numpy_helper.from_array((rng.standard_normal(32) / 10).astype(np.float32), "b1"),
             numpy_helper.from_array((rng.standard_normal((32, 8)) / 6).astype(np.float32), "W2"),
             numpy_helper.from_array(np.array([1000.37], np.float32), "offset"),
             numpy_helper.from_array(np.array([1000.0], np.float32), "base")]
    nodes = [h.make_node("MatMul", ["x", "W1"], ["h1"], name="fc1"),
             h.make_node("Add", ["h1", "b1"], ["h2"], name="bias1"),
             h.make_node("Relu", ["h2"], ["h3"], name="relu1"), h.make_node("MatMul", ["h3", "W2"], ["h4"], name="fc2"),
             h.make_node("Add", ["h4", "offset"], ["h5"], name="shift"),
             h.make_node("Sub", ["h5", "base"], ["y"], name="unshift")]
    graph = h.make_graph(nodes, "fragile", [h.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 16])],
                         [h.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", 8])], inits)
    model = h.make_model(graph, opset_imports=[h.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.save(model, str(folder / "fragile.onnx"))
    np.savez(folder / "fragile.inputs.npz", x=rng.standard_normal((4, 16)).astype(np.float32))


def _project(tmp_path: Path, target: str = "") -> Path:
    fragile_model(tmp_path)
    path = tmp_path / "targets.toml"
    path.write_text(f"""[project]
name = "fragile"
version = "1"

[models.fragile]
path = "fragile.onnx"
inputs = "fragile.inputs.npz"

[targets.cpu-fp16]
runtime = "{here_runtime()}"
providers = ["CPUExecutionProvider"]
precision = "fp16"
optimization = "basic"
{target}""")
    return path


@pytest.mark.runtime
def test_the_printed_override_pasted_into_targets_toml_makes_the_gate_pass(tmp_path: Path) -> None:
    path = _project(tmp_path)
    proc = run_cli("test", "-c", str(path), "-v")  # a failing accuracy gate is explained without being asked
    assert proc.returncode == 9, proc.stderr[-2000:]
    assert "accuracy: cpu-fp16/fragile output 'y'" in proc.stderr
    assert "explain: rebuild 1/16" in proc.stderr  # progress per rebuild (-v: a line per step)
    out = proc.stdout
    assert "explain cpu-fp16/fragile: found" in out and "layer-wise: unshift (Sub)" in out
    assert re.search(r"result \(\d+ rebuilds, [\d.]+ s\): accuracy PASS .* size [\d.]+ KB", out)
    block = re.search(r"paste into targets.toml:\n\n(\[\[targets\.cpu-fp16\.overrides\]\]\n.*?\n)\n", out, re.S)
    assert block is not None, out
    override = block.group(1)
    assert override == '[[targets.cpu-fp16.overrides]]\nmodels = ["fragile"]\nfp16 = { node_block_list = ["shift"] }\n'
    # recorded in the test report and the HTML report
    doc = json.loads((tmp_path / "dist" / "cpu-fp16" / "fragile" / "test-report.json").read_text())["result"]
    assert doc["status"] == "FAIL" and doc["explain"]["status"] == "found"
    assert doc["explain"]["override"] == override and doc["explain"]["rebuilds"] <= 16
    assert doc["explain"]["trials"][-1]["passed"] and not doc["explain"]["trials"][0]["passed"]
    assert "<pre class=override>" in (tmp_path / "dist" / "report.html").read_text()
    # paste it: the gate passes
    path.write_text(path.read_text() + "\n" + override)
    proc = run_cli("test", "-c", str(path))
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    assert "1 PASS, 0 FAIL" in proc.stdout and "explain cpu-fp16" not in proc.stdout


@pytest.mark.runtime
def test_no_explain_and_the_bounds(tmp_path: Path) -> None:
    path = _project(tmp_path)
    proc = run_cli("test", "-c", str(path), "--no-explain")
    assert proc.returncode == 9 and "explain cpu-fp16" not in proc.stdout
    proc = run_cli("test", "-c", str(path), "--explain-rebuilds", "2")
    assert proc.returncode == 9
    assert "explain cpu-fp16/fragile: not found: stopped after 2 rebuilds (--explain-rebuilds)" in proc.stdout
    assert "rebuild 3/" not in proc.stderr
    assert run_cli("test", "-c", str(path), "--explain-rebuilds", "0").returncode == 2


@pytest.mark.runtime
def test_explain_on_request_of_a_passing_target_shows_the_layers(tmp_path: Path) -> None:
    path = _project(tmp_path, 'fp16 = { node_block_list = ["shift"] }\n')
    proc = run_cli("test", "-c", str(path), "--explain")
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "explain cpu-fp16/fragile: passes: the accuracy gate passes: nothing to keep in float" in proc.stdout
    assert "rebuild" not in proc.stdout


@pytest.mark.runtime
def test_layerwise_error_points_at_where_the_error_shows(tmp_path: Path) -> None:
    from onnxruntime.transformers.float16 import convert_float_to_float16

    fragile_model(tmp_path)
    source = onnx.load(str(tmp_path / "fragile.onnx"))
    reduced = convert_float_to_float16(onnx.load(str(tmp_path / "fragile.onnx")), keep_io_types=True)
    opts = config.Fp16(keep_io_types=True, op_block_list=(), node_block_list=())
    nodes = layerwise.changed_nodes(source, reduced, "fp16", opts)
    assert [n.name for n in nodes] == ["fc1", "bias1", "relu1", "fc2", "shift", "unshift"]
    feed = dict(np.load(tmp_path / "fragile.inputs.npz"))
    layers = layerwise.layerwise(source, reduced, nodes, feed)
    assert layers[0].node == "unshift" and layers[0].error is not None and layers[0].error > 0.1
    assert all(x.error is not None and x.error < 1e-2 for x in layers[1:])  # fp16 rounding elsewhere


@pytest.mark.runtime
def test_layerwise_error_streamed_one_sample_at_a_time_equals_the_whole_feeds(tmp_path: Path) -> None:
    from onnxruntime.transformers.float16 import convert_float_to_float16

    fragile_model(tmp_path)
    source = onnx.load(str(tmp_path / "fragile.onnx"))
    reduced = convert_float_to_float16(onnx.load(str(tmp_path / "fragile.onnx")), keep_io_types=True)
    nodes = layerwise.changed_nodes(source, reduced, "fp16", config.Fp16(keep_io_types=True))
    feed = dict(np.load(tmp_path / "fragile.inputs.npz"))
    each = layerwise.samples(feed, source)
    assert len(each) == 4 and all(f["x"].shape == (1, 16) for f in each)  # a symbolic batch: one sample each
    whole = {x.node: x.error for x in layerwise.layerwise(source, reduced, nodes, feed)}
    streamed = {x.node: x.error for x in layerwise.layerwise(source, reduced, nodes, each)}
    assert streamed.keys() == whole.keys()
    assert all(streamed[n] == pytest.approx(whole[n], rel=1e-6) for n in whole)  # the same sums of squares
    seen = []
    first = layerwise.layerwise(source, reduced, nodes, each, more=lambda: bool(seen.append(1)) and False)
    assert len(seen) == 1 and first  # `more` asked once, after the first sample: it said stop
    assert layerwise.joined(each)["x"].tolist() == feed["x"].tolist()
    # a fixed batch dimension runs the feed whole
    emb_model(tmp_path)
    emb = onnx.load(str(tmp_path / "emb.onnx"))
    assert len(layerwise.samples(dict(np.load(tmp_path / "emb.inputs.npz")), emb)) == 1


def _search(passing: set[frozenset[str]], layers: list[layerwise.Layer], op_keys: bool,
            max_rebuilds: int = 50) -> tuple[bisect.Bisection, tuple[list[str], list[str]] | None]:
    members = {x.op_type: {y.node for y in layers if y.op_type == x.op_type} for x in layers}

    def trial(nodes: list[str], ops: list[str]) -> tuple[bool, str]:
        kept = set(nodes) | {n for o in ops for n in members[o]}
        return any(p <= kept for p in passing), "-"

    s = bisect.Bisection(trial, Budget(max_rebuilds, 60.0).start(), lambda m: None)
    return s, s.search(layers, op_keys)


LAYERS = [layerwise.Layer("b1", "Sub", 0.3, 0.3), layerwise.Layer("m1", "MatMul", 1e-3, 1e-3),
          layerwise.Layer("a1", "Add", 1e-3, 1e-4), layerwise.Layer("a2", "Add", 1e-3, 0.0)]


def test_search_tries_op_types_then_bisects_to_nodes() -> None:
    s, best = _search({frozenset({"a2"})}, LAYERS, op_keys=True)
    # Sub, MatMul, then Add passes; its nodes bisected: a1 fails, a2 passes
    assert best == (["a2"], [])
    assert [(t.nodes, t.op_types, t.passed) for t in s.trials] == [
        ([], ["Sub"], False), ([], ["MatMul"], False), ([], ["Add"], True), (["a1"], [], False), (["a2"], [], True)]
    # op types written as their nodes where the precision has no op-type key (int8/int4)
    s, best = _search({frozenset({"m1"})}, LAYERS, op_keys=False)
    assert best == (["m1"], []) and s.trials[1].nodes == ["m1"]
    # an op type that cannot be narrowed stays an op type
    s, best = _search({frozenset({"a1", "a2"})}, LAYERS, op_keys=True)
    assert best == ([], ["Add"]) and len(s.trials) == 5  # no candidate is built twice
    # the report's trials: every field, in order (Trial.as_json is written out, typed), as render reads them back
    assert [t.as_json() for t in s.trials] == [dataclasses.asdict(t) for t in s.trials]
    assert [list(t.as_json()) for t in s.trials] == [[f.name for f in dataclasses.fields(t)] for t in s.trials]


def test_search_combines_op_types_and_respects_its_bounds() -> None:
    s, best = _search({frozenset({"b1", "m1"})}, LAYERS, op_keys=False)  # no single op type passes
    assert best == (["b1", "m1"], [])
    s, best = _search({frozenset({"b1", "m1"})}, LAYERS, op_keys=False, max_rebuilds=3)
    assert best is None and len(s.trials) == 3 and "stopped after 3 rebuilds" in s.stopped
    s, best = _search(set(), LAYERS, op_keys=False)
    assert best is None and not s.stopped  # nothing passes: said, not guessed


def test_override_repeats_the_targets_own_list_entries() -> None:
    model = config.Model(name="m", path=Path("m.onnx"), inputs=Path("m.npz"), calibration=None)
    t = config.load(Path(__file__).parent.parent / "targets.toml", check_files=False).targets["cpu-int8"]
    job = Job(t, model, bisect.settings_with(t.settings["tiny_transformer"], explain.KNOBS["int8-dynamic"],
                                              ["MatMul_1"], []))  # the target's own exclude_nodes
    both = bisect.settings_with(job.settings, explain.KNOBS["int8-dynamic"], ["MatMul_2"], [])
    text = bisect.override_toml(job, explain.KNOBS["int8-dynamic"], both)
    assert text == ('[[targets.cpu-int8.overrides]]\nmodels = ["m"]\n'
                    'quantization = { exclude_nodes = ["MatMul_1", "MatMul_2"] }\n')


def test_the_override_checks_when_the_target_inherits_an_override_for_the_model(
        make_project: Callable[..., Path]) -> None:
    # pasted into a child target, the printed override merges with the parent's override for the model: the
    # settings it yields are the tested ones, the inherited latency budget included
    project = config.load(make_project("""
        [targets.cpu]
        runtime = "RUNTIME"
        providers = ["CPUExecutionProvider"]
        latency = { p50_ms = 1500 }

        [[targets.cpu.overrides]]
        models = ["tiny_cnn"]
        latency = { p50_ms = 150 }

        [targets.int8]
        extends = "cpu"
        precision = "int8-dynamic"
        quantization = { exclude_nodes = ["Conv_0"] }
    """))
    t = project.targets["int8"]
    job = Job(t, project.models["tiny_cnn"], t.settings["tiny_cnn"])
    assert job.settings.gates is not None and job.settings.gates.latency.p50_ms == 150
    tested = bisect.settings_with(job.settings, explain.KNOBS["int8-dynamic"], ["MatMul_2"], [])
    text = bisect.override_toml(job, explain.KNOBS["int8-dynamic"], tested)
    assert 'exclude_nodes = ["Conv_0", "MatMul_2"]' in text
    bisect.check_override(project, job, text, tested)  # AssertionError where the printed table loses a setting
    pasted_file = project.file.with_name("pasted.toml")  # targets.toml with the printed table pasted at its end
    pasted_file.write_text(project.file.read_text() + "\n" + text)
    pasted = config.load(pasted_file, check_files=False).targets["int8"].settings["tiny_cnn"].gates
    assert pasted is not None and pasted.latency.p50_ms == 150
    with pytest.raises(AssertionError, match="does not yield the tested settings"):  # a budget it would change
        bisect.check_override(project, job, text + "latency = { p50_ms = 1500 }\n", tested)


@pytest.mark.runtime
def test_layerwise_error_skips_tensors_the_quantizer_handed_to_another_node(tmp_path: Path) -> None:
    """QDQ folds each Relu into its Conv, which then writes the Relu's output name before the activation:
    comparing that tensor with the fp32 Relu output would blame the Relu for the activation itself."""
    from ortbuild.pipeline.steps import check, precision
    from ortbuild.project import data

    project = config.load(Path(__file__).parent.parent / "targets.toml")
    s, model = project.targets["cpu-int8"].settings["tiny_cnn"], project.models["tiny_cnn"]
    src = check.run(model.path)
    assert model.calibration is not None
    samples = data.load_samples(model.calibration, ["image"])
    reduced = onnx.load(str(precision.run(model.path, src.model, s.precision, s.typed_precision_options(), tmp_path,
                                          samples).path))
    nodes = layerwise.changed_nodes(src.model, reduced, s.precision, s.typed_precision_options())
    layers = layerwise.layerwise(src.model, reduced, nodes, data.load_feed(model.inputs, ["image"]))
    relus = [x for x in layers if x.op_type == "Relu"]
    assert relus and all(x.error is None for x in relus)
    assert all(x.error is not None and x.error < 0.1 for x in layers if x.op_type in ("Gemm", "MaxPool"))
    # nor can such a node be put back in float for a prediction: a Conv whose output the reduced graph no longer
    # computes, and the nodes reading a Relu's output name (the Conv's, before the activation), get none
    from onnxruntime import InferenceSession

    feed = data.load_feed(model.inputs, ["image"])
    expected = {"logits": InferenceSession(src.model.SerializeToString()).run(["logits"], feed)[0]}
    proxy = predict.Proxy(src.model, reduced, feed, expected, lambda o: {"cosine": 0.99})
    relu_outputs = {o for n in src.model.graph.node if n.op_type == "Relu" for o in n.output}
    readers = [n.name for n in src.model.graph.node if relu_outputs & set(n.input)]
    convs = [x.node for x in layers if x.op_type == "Conv"]
    assert readers and convs and all(proxy.predict([n]) is None for n in readers + convs)
    flatten = proxy.predict(["Flatten_44"])  # Flatten of dequantized values: the same outputs
    assert flatten is not None and flatten == proxy.predict([])


@pytest.mark.runtime
def test_a_model_past_protobufs_limit_is_not_searched_and_says_why(tmp_path: Path,
                                                                  monkeypatch: pytest.MonkeyPatch,
                                                                  capsys: pytest.CaptureFixture[str]) -> None:
    from ortbuild import cli, modelfiles

    path = _project(tmp_path)
    monkeypatch.setattr(modelfiles, "needs_external_data", lambda weights: True)  # as if it held 2.5 GB
    assert cli.main(["test", "-c", str(path)]) == 9  # the gate's verdict, not an internal error
    out = capsys.readouterr().out
    assert "explain cpu-fp16/fragile: not run: the model holds 0.00 GiB of weights" in out
    doc = json.loads((tmp_path / "dist" / "cpu-fp16" / "fragile" / "test-report.json").read_text())["result"]
    assert doc["status"] == "FAIL" and doc["explain"]["status"] == "not run"


@pytest.mark.runtime
def test_a_failing_diagnosis_changes_no_verdict(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                capsys: pytest.CaptureFixture[str]) -> None:
    from ortbuild import cli

    def boom(*args: object) -> dict[str, object]:
        raise RuntimeError("boom")

    monkeypatch.setattr(explain.Explainer, "explain", boom)
    assert cli.main(["test", "-c", str(_project(tmp_path))]) == 9
    assert "explain cpu-fp16/fragile: failed: RuntimeError: boom (the verdict stands" in capsys.readouterr().out


def emb_model(folder: Path, *, bias: bool = False) -> None:
    """ids -> Gather over an embedding table (`embed`) -> + positions -> MatMul (`fc`) -> Relu -> a Shape/Gather/
    Constant/Concat path computing the Reshape to [batch, -1]. int8-dynamic quantizes `embed` (its table) and
    `fc` (MatMulInteger); the pre-processing folds the shape path away (static shapes), which is no candidate.
    `W` has one outlier: per-tensor int8 leaves its other weights a handful of levels, so `fc` breaks cosine 0.999
    and keeping it in float fixes it. bias: an Add after the MatMul, which the pre-processing fuses with it."""
    rng = np.random.default_rng(0)
    w = (rng.standard_normal((16, 16)) / 4).astype(np.float32)
    w[0, 0] = 40.0
    inits = [numpy_helper.from_array(rng.standard_normal((50, 16)).astype(np.float32), "table"),
             numpy_helper.from_array(w, "W"), numpy_helper.from_array(np.array([0], np.int64), "zero"),
             numpy_helper.from_array(rng.standard_normal(16).astype(np.float32), "b"),
             numpy_helper.from_array(rng.standard_normal((6, 16)).astype(np.float32), "pos")]
    nodes = [h.make_node("Gather", ["table", "ids"], ["emb"], name="embed"),
             h.make_node("Add", ["emb", "pos"], ["x"], name="add_pos"),
             h.make_node("MatMul", ["x", "W"], ["mm"], name="fc")]
    if bias:
        nodes.append(h.make_node("Add", ["mm", "b"], ["mm_b"], name="bias"))
    nodes += [h.make_node("Relu", ["mm_b" if bias else "mm"], ["act"], name="act"),
              h.make_node("Shape", ["act"], ["shape"], name="shape"),
              h.make_node("Gather", ["shape", "zero"], ["batch"], name="batch_dim"),
              h.make_node("Constant", [], ["minus1"], name="minus1",
                          value=numpy_helper.from_array(np.array([-1], np.int64))),
              h.make_node("Concat", ["batch", "minus1"], ["newshape"], name="concat", axis=0),
              h.make_node("Reshape", ["act", "newshape"], ["y"], name="flatten")]
    graph = h.make_graph(nodes, "emb", [h.make_tensor_value_info("ids", TensorProto.INT64, [2, 6])],
                         [h.make_tensor_value_info("y", TensorProto.FLOAT, [2, 96])], inits)
    model = h.make_model(graph, opset_imports=[h.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.save(model, str(folder / "emb.onnx"))
    np.savez(folder / "emb.inputs.npz", ids=rng.integers(0, 50, (2, 6)).astype(np.int64))


def _emb_project(tmp_path: Path, quantization: str = "per_channel = false, reduce_range = true",
                 bias: bool = False) -> Path:
    emb_model(tmp_path, bias=bias)
    path = tmp_path / "targets.toml"
    path.write_text(f"""[project]
name = "emb"
version = "1"

[models.emb]
path = "emb.onnx"
inputs = "emb.inputs.npz"

[targets.int8]
runtime = "{here_runtime()}"
providers = ["CPUExecutionProvider"]
precision = "int8-dynamic"
quantization = {{ {quantization} }}
accuracy = {{ cosine = 0.999 }}
""")
    return path


def _job(path: Path) -> Job:
    from ortbuild.project import plan

    return plan.jobs(config.load(path))[0]


@pytest.mark.runtime
def test_candidates_are_the_nodes_the_quantizer_changed(tmp_path: Path) -> None:
    an = explain.analyse(_job(_emb_project(tmp_path)))
    # not the shape path the pre-processing folded (Shape, Gather, Constant, Concat), nor the float Add and Relu
    assert sorted(x.node for x in an.layers) == ["embed", "fc"] and not an.renamed
    assert {x.node: x.weights for x in an.layers} == {"embed": 50 * 16 * 4, "fc": 16 * 16 * 4}
    assert all(x.error is not None and x.error > 0 for x in an.layers)
    # only what the precision's options quantize
    an = explain.analyse(_job(_emb_project(tmp_path, 'per_channel = false, op_types = ["MatMul"]')))
    assert [x.node for x in an.layers] == ["fc"]


@pytest.mark.runtime
def test_a_node_the_pre_processing_renamed_is_reported_not_searched(tmp_path: Path) -> None:
    an = explain.analyse(_job(_emb_project(tmp_path, bias=True)))  # MatMul + Add fused: a new node name
    assert [x.node for x in an.layers] == ["embed"]
    assert len(an.renamed) == 1 and an.renamed[0].startswith("fc") and an.renamed[0] != "fc"
    text = "\n".join(explain_render.render("int8/emb", {"status": "not found", "renamed": an.renamed}))
    assert "not searched: 1 quantized node(s) the source model has no name for" in text
    assert "quantization = { preprocess = false } keeps the names" in text
    an = explain.analyse(_job(_emb_project(tmp_path, "per_channel = false, preprocess = false", bias=True)))
    assert sorted(x.node for x in an.layers) == ["embed", "fc"] and not an.renamed


@pytest.mark.runtime
def test_a_prediction_is_the_build_with_those_nodes_in_float(tmp_path: Path) -> None:
    from onnxruntime import InferenceSession

    from ortbuild.pipeline.steps import check

    job = _job(_emb_project(tmp_path))
    an = explain.analyse(job)
    gates = job.settings.gates
    assert gates is not None
    proxy = predict.Proxy(an.source, an.reduced, an.feed, an.expected,
                          lambda o: gates.accuracy_rule(job.settings.precision, o))
    base = proxy.predict([])
    assert base is not None and not base.passed and base.worst.startswith("y: cosine 0.9")
    src = check.run(job.model.path)
    knob = explain.KNOBS["int8-dynamic"]

    def built(nodes: list[str]) -> onnx.ModelProto:
        return explain.reduce_model(job, bisect.settings_with(job.settings, knob, nodes, []), src)

    for keep in (["fc"], ["embed"], ["embed", "fc"]):
        patched = proxy.model(keep)
        assert patched is not None
        want = InferenceSession(built(keep).SerializeToString(), providers=["CPUExecutionProvider"]).run(None, an.feed)
        got = InferenceSession(patched.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, an.feed)
        np.testing.assert_allclose(got[0], want[0], rtol=0, atol=1e-6)
    fc = proxy.predict(["fc"])
    assert fc is not None and fc.passed and fc.error < base.error
    # each set that keeps a changed node in float changes the graph; one that keeps another node does not
    assert layerwise.graph_digest(built(["add_pos"])) == an.digest == layerwise.graph_digest(built([]))
    assert len({an.digest, layerwise.graph_digest(built(["fc"])), layerwise.graph_digest(built(["embed"]))}) == 3


def test_a_set_that_gives_a_graph_already_tried_is_not_rebuilt() -> None:
    changed = {"m1", "a1"}  # the nodes the precision step changed: keeping others in float changes nothing
    rebuilt: list[list[str]] = []
    messages: list[str] = []

    def trial(nodes: list[str], ops: list[str]) -> tuple[bool, str]:
        rebuilt.append(nodes)
        return "m1" in nodes, "-"

    def graph(nodes: list[str], ops: list[str]) -> str:
        return ",".join(sorted(changed & set(nodes))) or "baseline"

    s = bisect.Bisection(trial, Budget(50, 60.0).start(), messages.append, graph=graph, graphs={"baseline": -1})
    assert not s.run(["b1"], [])           # the failing artifact's graph: its verdict, no rebuild
    assert s.run(["m1", "b1"], [])         # a new graph: rebuilt
    assert s.run(["m1", "a2"], [])         # the same graph as that rebuild: its verdict
    assert not s.run(["a1"], [])
    assert rebuilt == [["m1", "b1"], ["a1"]] and len(s.trials) == 2
    assert [(x["nodes"], x["same_as"], x["passed"]) for x in s.skipped] == [
        (["b1"], "the failing artifact", False), (["m1", "a2"], "rebuild 1", True)]
    assert "explain: not rebuilt: 1 node(s) b1: the precision step gives the same graph as the failing artifact" \
        in messages
    # the search's own candidates: whatever they are, every rebuild is a graph not tried before
    rebuilt.clear()
    s = bisect.Bisection(trial, Budget(50, 60.0).start(), messages.append, graph=graph, graphs={"baseline": -1})
    s.search(LAYERS, op_keys=False)
    assert len({graph(n, []) for n in rebuilt}) == len(rebuilt) and "baseline" not in {graph(n, []) for n in rebuilt}


def _predicted(layers: list[layerwise.Layer], passing: set[str]) -> tuple[list[layerwise.Layer],
                                                                        bisect.Bisection, list[list[str]]]:
    """Layers with predictions (the set passes when it holds `passing`), ranked; a search that rebuilds with the
    same verdicts, and the sets it rebuilt."""
    def predict(nodes: list[str]) -> layerwise.Prediction:
        ok = passing <= set(nodes)
        return layerwise.Prediction(ok, 0.0 if ok else 0.1 - 0.01 * len(set(nodes) & passing), "-")

    ranked = layerwise.ranked([dataclasses.replace(x, alone=predict([x.node])) for x in layers])
    rebuilt: list[list[str]] = []

    def trial(nodes: list[str], ops: list[str]) -> tuple[bool, str]:
        rebuilt.append(nodes)
        return passing <= set(nodes), "-"

    return ranked, bisect.Bisection(trial, Budget(50, 60.0).start(), lambda m: None, predict=predict), rebuilt


def test_the_first_rebuild_is_the_fewest_top_ranked_nodes_predicted_to_pass() -> None:
    layers, s, rebuilt = _predicted(LAYERS, {"m1", "a2"})
    # ranked by the error predicted with each kept in float alone: m1 and a2 first (both help), then b1, a1
    assert [x.node for x in layers] == ["a2", "m1", "a1", "b1"]
    assert s.search(layers, op_keys=True) == (["a2", "m1"], [])
    assert rebuilt == [["a2", "m1"]]  # one rebuild: the prefix search and the narrowing were predictions
    # a prediction the rebuild contradicts: the search goes on by rebuilds (op types first)
    layers, s, rebuilt = _predicted(LAYERS, {"b1"})
    s.trial = lambda nodes, ops: (rebuilt.append(nodes) or ("m1" in nodes or "MatMul" in ops), "-")
    assert s.search(layers, op_keys=False) == (["m1"], [])
    assert rebuilt[0] == ["b1"] and len(rebuilt) > 1


def test_tables_never_show_none() -> None:
    layers = [layerwise.Layer("relu", "Relu", None, 0.0, 0, "n/a (the reduced graph computes its output in conv)"),
              layerwise.Layer("shift", "Add", None, 0.0), layerwise.Layer("fc", "MatMul", math.inf, math.inf, 2 << 20,
                                                                      alone=layerwise.Prediction(True, 0.01, "y: cos"))]
    doc = {"status": "found", "layers": explain_render.layers_doc(layers), "rebuilds": 1, "seconds": 1.0,
           "trials": [{"nodes": ["fc"], "op_types": [], "passed": True, "worst": "y: cos", "seconds": 1.0}],
           "skipped": [{"nodes": ["b"], "op_types": [], "same_as": "the failing artifact", "passed": False}],
           "predictions": {"status": "on", "baseline": "y: cos", "predicted": 1, "candidates": 3, "seconds": 0.1},
           "override": "[[targets.t.overrides]]\n",
           "result": {"accuracy": None, "worst": None, "size": None, "size_verdict": None, "latency_verdict": None,
                      "p50_ms": None}}
    text = "\n".join(explain_render.render("t/m", doc))
    assert "None" not in text and "null" not in json.dumps(doc["layers"])
    assert "layer-wise: relu (Relu) error n/a (the reduced graph computes its output in conv) vs fp32" in text
    assert "layer-wise: shift (Add) error n/a vs fp32" in text
    assert "layer-wise: fc (MatMul) error inf vs fp32, adds inf, 2.0 MB of weights; kept in float alone: y: cos " \
           "(PASS, predicted)" in text
    assert "not rebuilt: 1 node(s) b: the same graph as the failing artifact" in text
    assert "accuracy - (-), size 0.0 KB (0.00x the source, -), latency p50 - (no budget)" in text


@pytest.mark.runtime
def test_int8_search_rebuilds_once_and_the_pasted_override_passes(tmp_path: Path) -> None:
    path = _emb_project(tmp_path)
    proc = run_cli("test", "-c", str(path))
    assert proc.returncode == 9, proc.stderr[-2000:]
    out = proc.stdout
    assert "explain int8/emb: found" in out and "None" not in out, out
    assert "predicted (no rebuild): 2 of 2 candidate(s) kept in float alone" in out
    assert re.search(r"layer-wise: fc \(MatMul\) error [\d.]+ vs fp32, adds [\d.]+, 1\.0 KB of weights; kept in "
                     r"float alone: y: cosine 0\.9999\d+ \(PASS, predicted\)", out), out
    assert re.search(r"rebuild: 1 node\(s\) fc: PASS \(y: cosine 0\.9999\d+\)", out), out
    block = re.search(r"paste into targets.toml:\n\n(\[\[targets\.int8\.overrides\]\]\n.*?\n)\n", out, re.S)
    assert block is not None
    assert block.group(1) == '[[targets.int8.overrides]]\nmodels = ["emb"]\nquantization = { exclude_nodes = ["fc"] }\n'
    doc = json.loads((tmp_path / "dist" / "int8" / "emb" / "test-report.json").read_text())["result"]["explain"]
    assert doc["rebuilds"] == 1 and doc["skipped"] == []
    path.write_text(path.read_text() + "\n" + block.group(1))
    proc = run_cli("test", "-c", str(path))
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]


@pytest.mark.runtime
def test_the_search_announces_each_rebuild_and_keeps_what_ort_says_in_its_log(tmp_path: Path) -> None:
    """The search quantizes and opens sessions outside the gates: ORT's C++ warnings there (its graph cleanup
    removing the model's unused initializer `b`) go to dist/logs/<target>/<model>.explain.log, counted in the
    footer; the terminal gets each rebuild's start. -v shows them as they come."""
    path = _emb_project(tmp_path)
    proc = run_cli("test", "-c", str(path))
    assert proc.returncode == 9, proc.stderr[-2000:]
    assert "[int8/emb] explain: rebuilding 1/16: 1 node(s) fc" in proc.stderr
    assert "[W:onnxruntime" not in proc.stderr + proc.stdout and "Removing initializer" not in proc.stderr
    log = tmp_path / "dist" / "logs" / "int8" / "emb.explain.log"
    text = log.read_text()
    said = text.count("Removing initializer 'b'")
    assert said and "[W:onnxruntime" in text, text
    assert re.search(rf"  \[int8/emb\] \d+ lines? \(\d+ warnings?\) in {re.escape(str(log))}", proc.stderr), \
        proc.stderr
    loud = run_cli("test", "-c", str(path), "-v")
    assert loud.returncode == 9 and "Removing initializer 'b'" in loud.stderr
    assert not log.exists() or log.read_text() == text  # -v writes no log


def if_model(folder: Path) -> None:
    """z = x @ Wp (`pre`, benign weights); y = If on sr == 16000, each branch a MatMul of x (`then_fc`,
    `else_fc`) whose weight, a Constant node inside the branch (as in Silero's VAD; 4 KB: a weight to the build),
    has one outlier: per-tensor int8 breaks cosine 0.999 there. The golden inputs run the then branch only."""
    rng = np.random.default_rng(0)

    def branch(name: str) -> onnx.GraphProto:
        w = (rng.standard_normal((32, 32)) / 4).astype(np.float32)
        w[0, 0] = 40.0
        nodes = [h.make_node("Constant", [], [f"{name}_w"], name=f"{name}_const",
                             value=numpy_helper.from_array(w, f"{name}_w")),
                 h.make_node("MatMul", ["x", f"{name}_w"], [f"{name}_y"], name=f"{name}_fc")]
        return h.make_graph(nodes, name, [], [h.make_tensor_value_info(f"{name}_y", TensorProto.FLOAT, None)])

    pre = numpy_helper.from_array((rng.standard_normal((32, 32)) / 4).astype(np.float32), "Wp")
    nodes = [h.make_node("MatMul", ["x", "Wp"], ["z"], name="pre"),
             h.make_node("Constant", [], ["k"], name="k", value=numpy_helper.from_array(np.array(16000, np.int64))),
             h.make_node("Equal", ["sr", "k"], ["c"], name="is_16k"),
             h.make_node("If", ["c"], ["y"], name="by_rate", then_branch=branch("then"), else_branch=branch("else"))]
    graph = h.make_graph(nodes, "if", [h.make_tensor_value_info("x", TensorProto.FLOAT, [4, 32]),
                                       h.make_tensor_value_info("sr", TensorProto.INT64, [])],
                         [h.make_tensor_value_info("y", TensorProto.FLOAT, [4, 32]),
                          h.make_tensor_value_info("z", TensorProto.FLOAT, [4, 32])], [pre])
    model = h.make_model(graph, opset_imports=[h.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.checker.check_model(model)
    onnx.save(model, str(folder / "branches.onnx"))
    np.savez(folder / "branches.inputs.npz", x=rng.standard_normal((4, 32)).astype(np.float32),
             sr=np.array(16000, np.int64))


def _if_project(tmp_path: Path) -> Path:
    if_model(tmp_path)
    path = tmp_path / "targets.toml"
    path.write_text(f"""[project]
name = "branches"
version = "1"

[models.branches]
path = "branches.onnx"
inputs = "branches.inputs.npz"

[targets.int8]
runtime = "{here_runtime()}"
providers = ["CPUExecutionProvider"]
precision = "int8-dynamic"
quantization = {{ per_channel = false, reduce_range = true }}
accuracy = {{ cosine = 0.999 }}
""")
    return path


@pytest.mark.runtime
def test_candidates_inside_if_branches_are_found_ranked_and_those_not_run_set_aside(tmp_path: Path) -> None:
    an = explain.analyse(_job(_if_project(tmp_path)))
    layers = {x.node: x for x in an.layers}
    assert sorted(layers) == ["else_fc", "pre", "then_fc"] and not an.renamed
    assert layers["pre"].error is not None and layers["pre"].ran  # the main graph: measured
    then, other = layers["then_fc"], layers["else_fc"]
    assert then.error is None and then.ran and then.note == "n/a (inside by_rate then_branch: not measured)"
    assert not other.ran and "not run on the golden inputs" in other.note
    assert then.weights == other.weights == 32 * 32 * 4  # the Constant's weight, made an initializer of its branch
    assert [x.node for x in an.layers] == ["pre", "then_fc", "else_fc"]  # measured, unmeasured, not run
    # the predictor puts back main-graph nodes only
    proxy = predict.Proxy(an.source, an.reduced, an.feed, an.expected, lambda o: {"cosine": 0.999})
    assert proxy.patchable("pre") and not proxy.patchable("then_fc")
    assert proxy.predict(["pre"]) is not None and proxy.predict(["then_fc"]) is None


@pytest.mark.runtime
def test_the_search_keeps_a_node_inside_an_if_branch_in_float_and_the_pasted_override_passes(tmp_path: Path) -> None:
    path = _if_project(tmp_path)
    proc = run_cli("test", "-c", str(path))
    assert proc.returncode == 9, proc.stderr[-2000:]
    out = proc.stdout
    assert "explain int8/branches: found" in out, out
    assert "layer-wise: then_fc (MatMul) error n/a (inside by_rate then_branch: not measured)" in out, out
    block = re.search(r"paste into targets.toml:\n\n(\[\[targets\.int8\.overrides\]\]\n.*?\n)\n", out, re.S)
    assert block is not None, out
    assert block.group(1).endswith('quantization = { exclude_nodes = ["then_fc"] }\n'), block.group(1)
    doc = json.loads((tmp_path / "dist" / "int8" / "branches" / "test-report.json").read_text())["result"]["explain"]
    assert all("else_fc" not in t["nodes"] for t in doc["trials"])  # the branch the inputs do not run: not searched
    path.write_text(path.read_text() + "\n" + block.group(1))  # the build accepts a node name inside a branch
    proc = run_cli("test", "-c", str(path))
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
