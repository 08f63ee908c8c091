"""Transformer fusion ([targets.X.fusion], steps/fusion.py): ONNX Runtime's transformer optimizer before the precision
step, on the example transformer: what it fuses, the manifest record, the build key, the accuracy gate, the
precision step on a fused graph, and every refusal (a clear ConfigError naming the file and key).

The real encoder (paraphrase-MiniLM-L3, fused vs unfused per precision, latency and accuracy) is measured in
tests/benchmarks/bench_fusion.py: too heavy for CI."""

from __future__ import annotations

import copy
import dataclasses
import inspect
import json
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

import onnx
import pytest

from ortbuild.artifact import keys
from ortbuild.errors import ConfigError
from ortbuild.pipeline import buildkey, stages
from ortbuild.pipeline.build import Builder
from ortbuild.pipeline.job import Done, JobResult
from ortbuild.pipeline.steps import check, fusion, precision
from ortbuild.project import config, options, plan
from ortbuild.status import JobStatus
from tests.conftest import MODELS, REPO, TEST_KEY, here_runtime

BUILT, FAILED, UP_TO_DATE = JobStatus.BUILT, JobStatus.FAILED, JobStatus.UP_TO_DATE


TRANSFORMER = MODELS / "tiny_transformer.onnx"

TARGETS = """
    [targets.fp32]
    runtime = "RUNTIME"
    providers = ["CPUExecutionProvider"]

    [targets.fused]
    extends = "fp32"
    fusion = { model_type = "bert" }

    [targets.fused-int8]
    extends = "fused"
    precision = "int8-dynamic"
    quantization = { per_channel = true, reduce_range = true, op_types = ["MatMul", "Gather"] }
"""


def build(path: Path, dist: Path, **sel: list[str]) -> list[JobResult]:
    project = config.load(path)
    return Builder(project, dist, secrets=keys.read_secrets(),
                   progress=lambda job, msg: None).run(plan.jobs(project, **sel))


def manifest_of(dist: Path, target: str, model: str = "tiny_transformer") -> dict[str, Any]:
    doc: dict[str, Any] = json.loads((dist / target / model / "manifest.json").read_text())
    return doc


def config_error(make_project: Callable[..., Path], targets: str) -> ConfigError:
    with pytest.raises(ConfigError) as e:
        config.load(make_project(targets, models=("tiny_transformer",)))
    return e.value


# ------------------------------------------------------------------------------------------------ config

def test_the_model_types_are_the_pinned_optimizers() -> None:
    import onnxruntime
    from onnxruntime.transformers import optimizer

    why = fusion.unknown_here("no-such-type")  # the build's config error names the runtime's own types
    assert why is not None and onnxruntime.__version__ in why and "bert" in why
    if onnxruntime.__version__ != "1.31.1":  # the key's choices are 1.31.1's; others are checked at build time
        missing = [t for t in options.FUSION_MODEL_TYPES if t not in optimizer.MODEL_TYPES]
        assert all(fusion.unknown_here(t) for t in missing) and fusion.unknown_here("bert") is None
        pytest.skip(f"onnxruntime {onnxruntime.__version__}: not the version the key's choices come from")
    assert tuple(optimizer.MODEL_TYPES) == options.FUSION_MODEL_TYPES
    # the types whose sizes it infers, as optimize_by_fusion lists them
    listed = re.search(r"model_type not in \[([^\]]*)\]", inspect.getsource(optimizer.optimize_by_fusion))
    assert listed is not None
    assert set(re.findall(r'"(\w+)"', listed.group(1))) == options.FUSION_INFERS_SIZES


def test_fusion_is_off_by_default_and_stays_out_of_the_build_key_then(make_project: Callable[..., Path]) -> None:
    project = config.load(make_project(TARGETS, models=("tiny_transformer",)))
    plain = project.targets["fp32"].settings["tiny_transformer"]
    fused = project.targets["fused"].settings["tiny_transformer"]
    assert plain.fusion == config.Fusion() and not plain.fusion.enabled and "fusion" not in plain.as_json()
    assert fused.as_json()["fusion"] == {"model_type": "bert", "num_heads": 0, "hidden_size": 0}


@pytest.mark.parametrize("table,where,says", [
    ('fusion = { model_type = "bret" }', "targets.fused.fusion.model_type", "did you mean 'bert'?"),
    ('fusion = { model_type = "gpt2" }', "targets.fused.fusion.model_type", "needs num_heads and hidden_size"),
    ('fusion = { model_type = "bert", num_heads = 4 }', "targets.fused.fusion", "gives num_heads alone"),
    ('fusion = { model_type = "bert", num_heads = 3, hidden_size = 128 }', "targets.fused.fusion.hidden_size",
     "128 is not a multiple of num_heads = 3"),
    ('fusion = { model_type = "bert", heads = 4 }', "targets.fused.fusion", "unknown key 'heads'"),
])
def test_bad_fusion_settings_are_config_errors(make_project: Callable[..., Path], table: str, where: str,
                                               says: str) -> None:
    e = config_error(make_project, f"""
        [targets.fused]
        runtime = "RUNTIME"
        providers = ["CPUExecutionProvider"]
        {table}
    """)
    assert e.where == where and says in e.message and e.file.endswith("targets.toml")
    if "bret" in table:  # the model types are listed
        assert "bert, bert_tf, bert_keras" in e.message and "gpt2" in e.message


def test_a_compiling_provider_refuses_fusion_and_an_override_turns_it_off(make_project: Callable[..., Path]) -> None:
    # CoreML compiles subgraphs, like OpenVINO and TensorRT: they get the portable graph and fuse it themselves
    if not here_runtime().startswith("onnxruntime=="):
        pytest.skip("needs the onnxruntime flavor (the one whose providers include CoreML)")
    target = """
        [targets.mac]
        runtime = "RUNTIME"
        providers = ["CoreMLExecutionProvider", "CPUExecutionProvider"]
        fusion = { model_type = "bert" }
    """
    e = config_error(make_project, target)
    assert e.where == "targets.mac.fusion.model_type" and "cannot be used with CoreMLExecutionProvider" in e.message
    assert e.hint is not None and 'fusion = { model_type = "off" }' in e.hint
    fixed = config.load(make_project(target + """
        [[targets.mac.overrides]]
        models = ["tiny_transformer"]
        fusion = { model_type = "off" }
    """, models=("tiny_transformer",)))
    assert not fixed.targets["mac"].settings["tiny_transformer"].fusion.enabled


def test_fused_op_types_are_op_types_only_with_fusion_on() -> None:
    project = config.load(Path(__file__).resolve().parent.parent / "targets.toml", check_files=False)
    s = project.targets["cpu-int8"].settings["tiny_transformer"]
    s = dataclasses.replace(s, quantization=dataclasses.replace(s.quantization,
                                                                 op_types=("MatMul", "EmbedLayerNormalization")))
    src = check.run(TRANSFORMER)
    assert [k for k, _ in check.settings_problems(src.model, src.signature, s)] == ["quantization.op_types"]
    on = dataclasses.replace(s, fusion=config.Fusion("bert"))
    assert check.settings_problems(src.model, src.signature, on) == []


# ------------------------------------------------------------------------------------------------ builds

@pytest.mark.runtime
def test_a_fused_build_records_what_it_fused_passes_the_golden_test_and_rebuilds_on_change(
        make_project: Callable[..., Path], tmp_path: Path) -> None:
    from ortbuild.gating.record import TestResult
    from ortbuild.gating.runner import Tester
    from ortbuild.status import Verdict

    path = make_project(TARGETS, models=("tiny_transformer",))
    dist = tmp_path / "dist"
    results = build(path, dist)
    assert [r.status for r in results] == [BUILT] * 3, [r.reason for r in results]
    fused_doc = manifest_of(dist, "fused")
    # the example's encoder: skip layer norms and GELU fuse; its attention (mask applied as an additive bias built
    # before the Unsqueeze) is not a pattern ORT's bert optimizer recognizes, and the build says so
    assert fused_doc["fusion"] == {"model_type": "bert", "num_heads": 0, "hidden_size": 0, "applied": True,
                                   "fused_ops": {"BiasGelu": 3, "SkipLayerNormalization": 6},
                                   "nodes_before": 118, "nodes_after": 91, "reason": ""}
    notes = results[1].notes
    assert "fused BiasGelu 3, SkipLayerNormalization 6" in notes[0] and "fused no attention" in notes[1]
    assert manifest_of(dist, "fp32")["fusion"] is None
    opt = fused_doc["optimization"]
    assert opt["tied_to"] == {"providers": ["CPUExecutionProvider"]}
    assert opt["op_domains"]["com.microsoft"] > manifest_of(dist, "fp32")["optimization"]["op_domains"]["com.microsoft"]
    assert "settings.fusion" in fused_doc["build_inputs"]
    assert "settings.fusion" not in manifest_of(dist, "fp32")["build_inputs"]

    # the golden test's default rules (fp32: rtol 1e-4 / atol 1e-5; int8: cosine 0.99), through the loader
    project = config.load(path)
    tester = Tester(project, dist, TEST_KEY, str(path), lambda job, msg: None, sign_key=keys.signing_key())
    for job in plan.jobs(project, targets=["fused", "fused-int8"]):
        res = TestResult(job.target.name, job.model.name, job.settings.precision)
        tester.accuracy_gate(job, res)
        assert res.accuracy == Verdict.PASS, res.failures

    # changing the fusion changes the build key: only the fused jobs rebuild, and the plan names the part
    path.write_text(path.read_text().replace('fusion = { model_type = "bert" }',
                                             'fusion = { model_type = "bert", num_heads = 4, hidden_size = 128 }'))
    project = config.load(path)
    builder = Builder(project, dist, secrets=keys.read_secrets(), progress=lambda job, msg: None)
    prep = builder.prepare(plan.jobs(project, targets=["fused"])[0])
    why, _ = buildkey.published(prep.out_dir, prep.key, prep.secrets.signing, prep.key_parts)
    assert why == "changed: settings.fusion"
    assert [r.status for r in build(path, dist)] == [UP_TO_DATE, BUILT, BUILT]
    assert manifest_of(dist, "fused")["fusion"]["num_heads"] == 4


@pytest.mark.runtime
def test_the_documented_example_builds_and_says_what_the_docs_say(tmp_path: Path) -> None:
    doc = (REPO / "docs" / "targets.md").read_text().split("## Transformer fusion", 1)[1].split("\n## ", 1)[0]
    (toml,) = [b for b in re.findall(r"```toml\n(.*?)```", doc, flags=re.S) if "[project]" in b]
    (said,) = re.findall(r"```text\n(.*?)```", doc, flags=re.S)
    (tmp_path / "models").symlink_to(MODELS)
    (tmp_path / "fusion.toml").write_text(toml.replace("onnxruntime==1.31.1", here_runtime()))
    results = build(tmp_path / "fusion.toml", tmp_path / "dist")
    assert [r.status for r in results] == [BUILT, BUILT], [r.reason for r in results]
    for line in said.strip().splitlines():
        assert all(line.removeprefix("note: ") in r.notes for r in results), (line, [r.notes for r in results])
    assert manifest_of(tmp_path / "dist", "cpu-fused-int8")["precision"]["name"] == "int8-dynamic"


@pytest.mark.runtime
def test_a_model_type_that_fuses_nothing_is_noted_and_the_source_kept(make_project: Callable[..., Path],
                                                                       tmp_path: Path) -> None:
    path = make_project('''
        [targets.fused]
        runtime = "RUNTIME"
        providers = ["CPUExecutionProvider"]
        fusion = { model_type = "bert" }
    ''')  # tiny_cnn: nothing for a transformer optimizer
    res = build(path, tmp_path / "dist")[0]
    assert res.status == BUILT
    record = manifest_of(tmp_path / "dist", "fused", "tiny_cnn")["fusion"]
    assert not record["applied"] and record["fused_ops"] == {}
    assert "fused nothing in this model" in record["reason"]
    assert any(n.startswith("fusion 'bert' not applied: ") and "the source is used as it is" in n for n in res.notes)


def test_a_node_name_the_fusion_removed_is_a_config_error(make_project: Callable[..., Path], tmp_path: Path) -> None:
    targets = TARGETS.replace('"Gather"] }', '"Gather"], exclude_nodes = ["Erf_101"] }')  # Erf: in BiasGelu now
    path = make_project(targets, models=("tiny_transformer",))
    res = build(path, tmp_path / "dist", targets=["fused-int8"])[0]
    assert res.status == FAILED and isinstance(res.error, ConfigError) and res.error.exit_code == 3
    assert res.error.where == "targets.fused-int8.quantization.exclude_nodes"
    assert "node 'Erf_101' of model 'tiny_transformer' was fused into another node by fusion 'bert'" in res.reason


@pytest.mark.runtime
def test_an_external_data_model_is_fused_with_external_data(make_project: Callable[..., Path], tmp_path: Path) -> None:
    src = tmp_path / "models" / "tiny_transformer.onnx"
    src.parent.mkdir()
    onnx.save_model(onnx.load(str(TRANSFORMER)), str(src), save_as_external_data=True, all_tensors_to_one_file=True,
                    location="tiny_transformer.onnx.data", size_threshold=1024)
    work = tmp_path / "work"
    work.mkdir()
    r = fusion.run(src, onnx.load(str(src), load_external_data=False), config.Fusion("bert"), work, external=True)
    assert r.applied and sorted(p.name for p in work.iterdir()) == ["fused.onnx", "fused.onnx.data"]
    assert (work / "fused.onnx").stat().st_size < 100_000  # the graph alone: the weights stay in the data file
    assert r.model.graph.value_info  # the fused ops' output types, inferred without loading the weights
    path = make_project(TARGETS, models=("tiny_transformer",))
    path.write_text(path.read_text().replace(str(TRANSFORMER), str(src)))
    res = build(path, tmp_path / "dist", targets=["fused"])[0]  # the loader step checks the outputs
    assert res.status == BUILT and manifest_of(tmp_path / "dist", "fused")["fusion"]["applied"]


def test_a_portable_build_skips_fusion_with_a_note(make_project: Callable[..., Path], tmp_path: Path) -> None:
    project = config.load(make_project(TARGETS, models=("tiny_transformer",)))
    job = plan.jobs(project, targets=["fused"])[0]
    builder = Builder(project, tmp_path / "dist", secrets=keys.read_secrets(), progress=lambda job, msg: None)
    prep = builder.prepare(job)
    # what a CUDA target gets on a machine without one
    prep = dataclasses.replace(prep, missing={"CUDAExecutionProvider": "no GPU here"}, work=tmp_path)
    done = Done()
    for result in stages._check(prep, done):
        done.add(result)
    fused = stages._fusion(prep, done)
    assert fused is not None and not fused.applied and fused.path == TRANSFORMER.resolve()
    assert "a portable build holds standard ONNX ops only (CUDAExecutionProvider cannot run here)" in fused.reason
    assert fused.notes == [f"fusion 'bert' not applied: {fused.reason}"]


def test_types_it_cannot_infer_are_noted_and_shape_inferences_dump_removed(tmp_path: Path,
                                                                           monkeypatch: pytest.MonkeyPatch) -> None:
    from onnxruntime.tools.symbolic_shape_infer import SymbolicShapeInference

    def fails(model: onnx.ModelProto, **kw: object) -> None:  # what it does on failure: dump into the current dir
        Path("sym_shape_infer_temp.onnx").write_bytes(b"weights")
        raise Exception("Incomplete symbolic shape inference")

    monkeypatch.setattr(SymbolicShapeInference, "infer_shapes", staticmethod(fails))
    r = fusion.run(TRANSFORMER, onnx.load(str(TRANSFORMER)), config.Fusion("bert"), tmp_path)
    assert r.applied and sorted(p.name for p in tmp_path.iterdir()) == ["fused.onnx"]
    assert any("types could not all be inferred (Incomplete symbolic shape inference)" in n for n in r.notes)


# ------------------------------------------------------------------------------------------- precision

def test_fp16_of_a_fused_graph_is_the_transformer_aware_conversion(tmp_path: Path) -> None:
    """The fusion step writes the fused ops' element types into the graph, so the precision step's converter
    gives what the optimizer's own convert_float_to_float16 gives (symbolic shape inference, then the converter)."""
    from onnxruntime.transformers.float16 import DEFAULT_OP_BLOCK_LIST
    from onnxruntime.transformers.onnx_model import OnnxModel

    r = fusion.run(TRANSFORMER, onnx.load(str(TRANSFORMER)), config.Fusion("bert"), tmp_path)
    reference = OnnxModel(copy.deepcopy(onnx.load(str(r.path))))
    reference.convert_float_to_float16(keep_io_types=True, op_block_list=list(DEFAULT_OP_BLOCK_LIST))
    ours = onnx.load(str(precision.run(r.path, r.model, "fp16", config.Fp16(True, (), ()), tmp_path).path))

    def graph(m: onnx.ModelProto) -> tuple[list[tuple[str, ...]], list[tuple[str, int]]]:
        return (sorted((n.op_type, *n.input, "->", *n.output) for n in m.graph.node),
                sorted((t.name, t.data_type) for t in m.graph.initializer))

    assert graph(ours) == graph(reference.model)


def test_quantization_notes_name_the_weights_fused_ops_hold() -> None:
    project = config.load(Path(__file__).resolve().parent.parent / "targets.toml", check_files=False)
    s = project.targets["cpu-int8"].settings["tiny_transformer"]  # op_types MatMul, Gemm, Conv, LSTM, Gather
    notes = fusion.precision_notes(s, {"Attention": 3, "EmbedLayerNormalization": 1})
    assert len(notes) == 2 and "the fused Attention nodes hold the Q/K/V MatMul weights" in notes[0]
    assert '(add "EmbedLayerNormalization" to quantize them)' in notes[1]
    assert fusion.precision_notes(s, {"SkipLayerNormalization": 6}) == []
