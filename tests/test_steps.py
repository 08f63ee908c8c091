"""Each build step on the example models, with the real ONNX/ORT tools."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import onnx
import pytest
from onnx import helper

from ortbuild import runtime
from ortbuild.errors import RuntimeMismatch
from ortbuild.pipeline.steps import check, compile, optimize, precision, reload
from ortbuild.project import config, data, options
from ortbuild.project.config import Provider, Settings
from tests.conftest import MODELS, REPO

CPU = [Provider("CPUExecutionProvider")]
PROJECT = config.load(REPO / "targets.toml")



def _options(s: Settings) -> dict[str, Any]:
    """The options of a job's precision as a table (what targets.toml holds)."""
    opts = s.typed_precision_options()
    return {} if opts is None else config.as_plain(opts)


def _prec(path: Path, *args: Any, **kw: Any) -> precision.PrecisionResult:
    """The precision step on a model file, as the build runs it (after the check step)."""
    return precision.run(path, check.run(path).model, *args, **kw)

def settings(target: str, model: str, **changes: object) -> Settings:
    import dataclasses

    return dataclasses.replace(PROJECT.targets[target].settings[model], **changes)  # type: ignore[arg-type]


def ops(path: Path) -> set[str]:
    return {n.op_type for n in onnx.load(str(path)).graph.node}


def calib(model: str) -> list[data.Feed]:
    return data.load_samples(MODELS / f"{model}.calib.npz", [])


def feed(model: str) -> data.Feed:
    return data.load_feed(MODELS / f"{model}.inputs.npz", [])


# ------------------------------------------------------------------------------------------ check

def test_check_records_source_facts() -> None:
    res = check.run(MODELS / "tiny_cnn.onnx")
    assert res.opsets == {"ai.onnx": 17} and res.ir_version == 8
    assert len(res.sha256) == 64 and res.size == (MODELS / "tiny_cnn.onnx").stat().st_size


def test_check_rejects_an_invalid_graph(tmp_path: Path) -> None:
    graph = helper.make_graph([helper.make_node("Relu", ["nowhere"], ["y"])], "g",
                              [helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, [1])],
                              [helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT, [1])])
    bad = tmp_path / "bad.onnx"
    bad.write_bytes(helper.make_model(graph).SerializeToString())
    with pytest.raises(onnx.checker.ValidationError, match="nowhere"):
        check.run(bad)


# -------------------------------------------------------------------------------------- precision

def test_int8_dynamic_transformer_is_at_most_035x(tmp_path: Path) -> None:
    s = settings("cpu-int8", "tiny_transformer")
    res = _prec(MODELS / "tiny_transformer.onnx", s.precision, _options(s),
                        tmp_path)
    check.run(res.path)
    assert {"DynamicQuantizeLinear", "MatMulInteger"} <= ops(res.path)
    ratio = res.path.stat().st_size / (MODELS / "tiny_transformer.onnx").stat().st_size
    assert ratio <= 0.35, ratio


@pytest.mark.parametrize("fmt,expected", [("qdq", {"QuantizeLinear", "DequantizeLinear"}),
                                          ("qoperator", {"QLinearConv"})])
def test_int8_static_cnn_with_calibration(tmp_path: Path, fmt: str, expected: set[str]) -> None:
    s = settings("cpu-int8", "tiny_cnn")
    opts = {**_options(s), "format": fmt}
    res = _prec(MODELS / "tiny_cnn.onnx", "int8-static", opts, tmp_path, calib("tiny_cnn"))
    check.run(res.path)
    assert expected <= ops(res.path)
    assert res.options["calibration_samples"] == 32


def test_int4_weight_uses_matmulnbits(tmp_path: Path) -> None:
    s = settings("cpu-int4", "tiny_transformer")
    res = _prec(MODELS / "tiny_transformer.onnx", s.precision, _options(s),
                        tmp_path)
    check.run(res.path)
    assert "MatMulNBits" in ops(res.path)
    assert res.path.stat().st_size / (MODELS / "tiny_transformer.onnx").stat().st_size < 0.3


def test_fp16_halves_weights_and_is_topologically_sorted(tmp_path: Path) -> None:
    s = settings("cuda-fp16", "tiny_lstm")
    res = _prec(MODELS / "tiny_lstm.onnx", s.precision, _options(s), tmp_path)
    check.run(res.path)  # the full checker rejects unsorted graphs: ORT's converter emits one
    m = onnx.load(str(res.path))
    assert not [i.name for i in m.graph.initializer if i.data_type == onnx.TensorProto.FLOAT]
    assert [i for i in m.graph.initializer if i.data_type == onnx.TensorProto.FLOAT16]
    assert m.graph.input[0].type.tensor_type.elem_type == onnx.TensorProto.FLOAT  # keep_io_types
    assert res.path.stat().st_size < 0.6 * (MODELS / "tiny_lstm.onnx").stat().st_size


def test_quantizing_an_opset_11_graph_upgrades_it_first(tmp_path: Path) -> None:
    w = onnx.numpy_helper.from_array(np.random.default_rng(0).normal(size=(64, 32)).astype(np.float32), "w")
    graph = helper.make_graph([helper.make_node("MatMul", ["x", "w"], ["y"])], "mm",
                              [helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, ["n", 64])],
                              [helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT, ["n", 32])], [w])
    old = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 11)])
    old.ir_version = 6
    s = settings("cpu-int8", "tiny_lstm")
    onnx.save_model(old, str(tmp_path / "old.onnx"))
    (tmp_path / "work").mkdir()
    res = _prec(tmp_path / "old.onnx", "int8-dynamic", _options(s), tmp_path / "work")
    check.run(res.path)
    assert any("opset 11 to 13" in n for n in res.notes)


def test_toposort_orders_a_shuffled_graph_and_refuses_cycles() -> None:
    m = onnx.load(str(MODELS / "tiny_lstm.onnx"))
    nodes = list(m.graph.node)[::-1]
    del m.graph.node[:]
    m.graph.node.extend(nodes)
    with pytest.raises(onnx.checker.ValidationError, match="topologically sorted"):
        onnx.checker.check_model(m)
    onnx.checker.check_model(precision.toposort(m))
    cyc = helper.make_graph([helper.make_node("Relu", ["b"], ["a"]), helper.make_node("Relu", ["a"], ["b"])],
                            "c", [], [helper.make_tensor_value_info("a", onnx.TensorProto.FLOAT, [1])])
    with pytest.raises(ValueError, match="cycle"):
        precision.toposort(helper.make_model(cyc))


# --------------------------------------------------------------------------------------- optimize

def _fp32(tmp_path: Path, model: str) -> Path:
    return _prec(MODELS / f"{model}.onnx", "fp32", {}, tmp_path).path


@pytest.mark.parametrize("level", ["layout", "all"])
def test_layout_levels_on_cpu_bake_in_the_simd_layout(tmp_path: Path, level: str) -> None:
    s = settings("cpu-fp32", "tiny_cnn", optimization=level)
    res = optimize.run(_fp32(tmp_path, "tiny_cnn"), s, CPU, {}, tmp_path)
    assert res.applied == level and not res.portable
    assert "com.microsoft.nchwc" in res.op_domains
    assert res.tied_to["simd_level"].startswith(("x86_64", "aarch64", "arm"))


def test_level_basic_is_portable(tmp_path: Path) -> None:
    s = settings("cpu-fp32", "tiny_transformer", optimization="basic")
    res = optimize.run(_fp32(tmp_path, "tiny_transformer"), s, CPU, {}, tmp_path)
    assert res.portable and res.tied_to == {} and set(res.op_domains) == {"ai.onnx"}
    assert "LayerNormalization" in ops(res.path)  # basic fuses the decomposed LayerNorm


def test_level_all_without_contrib_ops_stays_portable(tmp_path: Path) -> None:
    res = optimize.run(_fp32(tmp_path, "tiny_lstm"), settings("cpu-fp32", "tiny_lstm"), CPU, {}, tmp_path)
    assert res.applied == "all" and set(res.op_domains) == {"ai.onnx"}
    assert res.portable and res.tied_to == {}


def test_extended_is_tied_to_the_providers(tmp_path: Path) -> None:
    s = settings("cpu-fp32", "tiny_transformer", optimization="extended")
    res = optimize.run(_fp32(tmp_path, "tiny_transformer"), s, CPU, {}, tmp_path)
    assert res.tied_to == {"providers": ["CPUExecutionProvider"]} and "com.microsoft" in res.op_domains


def test_missing_provider_gives_a_portable_build_and_says_so(tmp_path: Path) -> None:
    s = settings("cuda-fp16", "tiny_cnn", precision="fp32")
    res = optimize.run(_fp32(tmp_path, "tiny_cnn"), s, [], {"CUDAExecutionProvider": "no GPU"}, tmp_path)
    assert res.applied == "basic" and res.requested == "all" and res.portable
    assert any("portable build" in n for n in res.notes)


def test_compiling_provider_keeps_the_basic_graph(tmp_path: Path) -> None:
    s = settings("openvino-cpu", "tiny_cnn")
    usable = [Provider("OpenVINOExecutionProvider", {"device_type": "CPU"}), *CPU]
    res = optimize.run(_fp32(tmp_path, "tiny_cnn"), s, usable, {}, tmp_path)
    assert res.applied == "basic" and res.providers == ["CPUExecutionProvider"]
    assert any("cannot serialize compiled nodes" in n for n in res.notes)


def test_fp16_on_cpu_at_level_all_warns_about_upcast_weights(tmp_path: Path) -> None:
    s = settings("cuda-fp16", "tiny_transformer")
    src = _prec(MODELS / "tiny_transformer.onnx", "fp16", _options(s),
                        tmp_path).path
    res = optimize.run(src, s, CPU, {}, tmp_path)
    assert any(n.startswith('optimization = "basic" keeps fp16 storage: the CPU provider has no fp16 kernels, and at '
                            "level 'all' ORT upcast the fp16 weights") for n in res.notes), res.notes


def test_ort_format(tmp_path: Path) -> None:
    s = settings("cpu-fp32", "tiny_lstm", format="ort", optimization="extended")
    res = optimize.run(_fp32(tmp_path, "tiny_lstm"), s, CPU, {}, tmp_path)
    assert res.path.suffix == ".ort" and res.path.read_bytes()[4:8] == b"ORTM"
    assert res.tied_to == {"providers": ["CPUExecutionProvider"]}  # unreadable graph: assumed from the level
    out = reload.run(res.path, s, CPU, feed("tiny_lstm"))
    assert out.outputs == [{"name": "forecast", "dtype": "float32", "shape": [4, 3]}]


# ----------------------------------------------------------------------------------------- reload

def test_reload_runs_with_optimizations_disabled_and_session_options(tmp_path: Path) -> None:
    s = settings("cpu-fp32", "tiny_cnn", free_dimensions={"batch": 4})
    res = optimize.run(_fp32(tmp_path, "tiny_cnn"), s, CPU, {}, tmp_path)
    out = reload.run(res.path, s, CPU, feed("tiny_cnn"))
    assert out.providers == ["CPUExecutionProvider"]
    assert out.outputs == [{"name": "logits", "dtype": "float32", "shape": [4, 10]}]
    with pytest.raises(Exception, match="Expected: 4"):  # the pinned batch is enforced
        reload.run(res.path, s, CPU, {"image": np.zeros((2, 3, 32, 32), np.float32)})


def _broadcasting(path: Path) -> None:
    """y = x + c, x [1, n], c [1, 4]: any n loads, only n = 1 or 4 runs (as a detector needs multiples of 32)."""
    graph = helper.make_graph([helper.make_node("Add", ["x", "c"], ["y"])], "g",
                              [helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, [1, "n"])],
                              [helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT, [1, 4])],
                              [onnx.numpy_helper.from_array(np.ones((1, 4), np.float32), "c")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.save(model, str(path))


def test_reload_says_what_it_fed_when_ort_cannot_run_the_inputs(tmp_path: Path) -> None:
    _broadcasting(tmp_path / "add.onnx")
    s = settings("cpu-fp32", "tiny_cnn")
    assert reload.run(tmp_path / "add.onnx", s, CPU, {"x": np.zeros((1, 4), np.float32)}).outputs[0]["shape"] == [1, 4]
    with pytest.raises(reload.RunFailed) as caught:
        reload.run(tmp_path / "add.onnx", s, CPU, {"x": np.zeros((1, 5), np.float32)})
    e = caught.value
    assert e.fed == "x float32 [1, 5]"
    assert "Attempting to broadcast an axis by a dimension other than 1" in e.error  # ONNX Runtime's own words
    message, hint = e.explained("add", "/p/add.npz")
    assert message.startswith("ONNX Runtime could not run the model on the golden inputs of [models.add] inputs "
                              "(/p/add.npz), fed x float32 [1, 5]: [ONNXRuntimeError]")
    assert "multiples of 32" in hint and "`ortbuild plan` checks the inputs' names, types and fixed dimensions" in hint


def test_quantizer_temp_files_stay_in_the_private_work_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import tempfile

    made: list[str] = []
    real = tempfile.mkdtemp

    def spy(*args: object, **kwargs: object) -> str:
        path = real(*args, **kwargs)  # type: ignore[arg-type]
        made.append(path)
        return path

    monkeypatch.setattr(tempfile, "mkdtemp", spy)
    work = tmp_path / "work"
    work.mkdir()
    s = settings("cpu-int8", "tiny_cnn")
    _prec(MODELS / "tiny_cnn.onnx", "int8-static", _options(s), work,
                  calib("tiny_cnn"))
    assert made, "the quantizer made no temp dir: this test no longer tests anything"
    assert all(Path(p).is_relative_to(work) for p in made), made
    assert tempfile.gettempdir() != str(work)  # restored afterwards


def test_compile_step_with_no_compiling_provider_keeps_the_graph(tmp_path: Path) -> None:
    """ONNX Runtime's compile API on a provider that compiles nothing (the CPU): no EPContext node comes back,
    and the step says the artifact stays the basic-level graph instead of shipping a useless copy."""
    s = settings("cpu-fp32", "tiny_cnn")
    res = compile.run(_fp32(tmp_path, "tiny_cnn"), s, Provider("CPUExecutionProvider"), {}, tmp_path)
    assert res.path is None and res.ep_context_nodes == 0 and res.other_nodes > 0
    assert "compiled no node" in res.notes[0] and not (tmp_path / "compiled.onnx").exists()


def test_only_the_openvino_plugin_and_tensorrt_compile_ahead_of_time() -> None:
    ov = Provider("OpenVINOExecutionProvider", {"device_type": "CPU"})
    plugin = options.PLUGINS["onnxruntime-ep-openvino"]
    assert compile.provider_to_compile([ov, *CPU], {ov.name: plugin}) == ov
    assert compile.provider_to_compile([ov, *CPU], {}) is None  # onnxruntime-openvino's EPContext does not reload
    trt = Provider("TensorrtExecutionProvider")
    assert compile.provider_to_compile([trt, Provider("CUDAExecutionProvider"), *CPU], {}) == trt
    assert compile.provider_to_compile(CPU, {}) is None


def test_openvino_plugin_compiles_and_reloads_without_compiling_or_says_why(tmp_path: Path) -> None:
    """Where the plugin offers a CPU device (Intel): an EPContext model, reloaded with compilation disabled,
    matching the CPU provider within fp32 tolerances (the f32 hint pinned). Elsewhere: the reason names
    Intel and this CPU's vendor, and compiling refuses with it."""
    pytest.importorskip("onnxruntime_ep_openvino", reason="the tests session installs the OpenVINO plugin EP")
    target = config.load(REPO / "targets.toml").targets["openvino-cpu"]
    s = target.settings["tiny_cnn"]
    ov = s.providers[0]
    plugins = {ov.name: options.PLUGINS["onnxruntime-ep-openvino"]}
    assert target.plugin_for(ov.name) == plugins[ov.name]
    assert '"INFERENCE_PRECISION_HINT":"f32"' in ov.options["load_config"]
    src = _fp32(tmp_path, "tiny_cnn")
    why = runtime.probe_provider(ov, plugins[ov.name])
    if why is not None:
        assert "Intel" in why and "offers no CPU device here" in why and "vendor" in why
        with pytest.raises(RuntimeMismatch, match="offers no CPU device"):
            compile.run(src, s, ov, plugins, tmp_path)
        return
    res = compile.run(src, s, ov, plugins, tmp_path)
    assert res.path is not None and res.ep_context_nodes >= 1
    assert any(n.op_type == "EPContext" for n in onnx.load(str(res.path)).graph.node)
    got = reload.run(res.path, s, [ov, *CPU], feed("tiny_cnn"), plugins, precompiled=True)
    assert ov.name in got.providers
    ref = reload.run(src, s, CPU, feed("tiny_cnn"))
    np.testing.assert_allclose(got.values[0], ref.values[0], rtol=1e-4, atol=1e-5)


def test_the_model_builder_is_told_never_to_trust_remote_code(monkeypatch: pytest.MonkeyPatch,
                                                               tmp_path: Path) -> None:
    """onnxruntime-genai's builder defaults hf_remote (transformers' trust_remote_code) to False today; ortbuild says
    so on every run, so a later pin cannot run a model directory's `auto_map` code. The builder is run for real (it
    fails on an empty directory, or is absent here): the command it was given is in the error."""
    from ortbuild.errors import StepError
    from ortbuild.pipeline.steps import genbuild

    monkeypatch.setattr(genbuild, "missing_builder", lambda: [])  # run it even where it is not installed
    (tmp_path / "src").mkdir()
    with pytest.raises(StepError) as e:
        genbuild.build(tmp_path / "src", tmp_path, settings("cpu-fp32", "tiny_cnn"), "CPUExecutionProvider",
                       "cpu-fp32", "m")
    assert e.value.hint is not None and e.value.hint.endswith("hf_remote=false"), e.value.hint
