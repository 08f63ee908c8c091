"""The reload step looks at what it built (ortbuild/pipeline/steps/reload.py): an artifact whose outputs are
NaN/inf where the source model's are finite, or constant where the source's vary, fails its job at the reload
step (OutputsBroken), never BUILT; the source model runs only when an output looks suspicious."""

from __future__ import annotations

import json
import re
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, numpy_helper
from onnx import helper as h

from ortbuild.artifact import golden
from ortbuild.errors import OutputsBroken, StepError
from ortbuild.modelfiles import ValueInfo
from ortbuild.pipeline.steps import reload
from ortbuild.status import JobStatus
from tests.conftest import here_runtime, run_cli

VOCAB, WIDTH, TOKENS = 64, 64, 16


def nan_embedding_model(folder: Path, name: str = "nanemb") -> None:
    """A sentence-encoder head as real graph transformers have it: ids -> Gather over a float embedding table
    (`embed`) -> each token divided by its L2 norm (ReduceL2, Div: `x / x.norm()` with no epsilon, as CLIP's
    embeddings are) -> mean over the tokens -> a projection (MatMul `proj`) -> `emb` [1, 64]. The padding row (id
    0, fed at the end of the ids) is near zero (about 1e-3), the other rows about 1.

    What triggers NaN, checked with onnxruntime 1.31.1's quantize_dynamic: not an all-zero row (nor an all-zero
    table): ORT's compute_scale_zp replaces a zero scale by 1.0, so a zero row quantizes to exact zeros and stays
    finite. The int8 scale of this table (per tensor: Gather's table is, per_channel or not) is about 6/255, and
    the padding row, under half a step, rounds to exactly zero: its norm is then 0, 0/0 is NaN at every padded
    token, the mean over the tokens makes every pooled value NaN, and the projection keeps them so (all 64 values
    of `emb`). The source's padding row has a norm of about 8e-3: every value finite. Keeping `embed` in float
    repairs it (`proj` stays int8: the precision step still converts half of the weights)."""
    rng = np.random.default_rng(0)
    table = rng.standard_normal((VOCAB, WIDTH)).astype(np.float32)
    table[0] = rng.standard_normal(WIDTH).astype(np.float32) * 1e-3
    inits = [numpy_helper.from_array(table, "table"),
             numpy_helper.from_array(np.array([-1], np.int64), "last"),
             numpy_helper.from_array(np.array([1], np.int64), "tokens"),
             numpy_helper.from_array((rng.standard_normal((WIDTH, WIDTH)) / 8).astype(np.float32), "W")]
    nodes = [h.make_node("Gather", ["table", "ids"], ["tok"], name="embed"),
             h.make_node("ReduceL2", ["tok", "last"], ["norm"], name="norm", keepdims=1),
             h.make_node("Div", ["tok", "norm"], ["unit"], name="normalize"),
             h.make_node("ReduceMean", ["unit", "tokens"], ["pooled"], name="pool", keepdims=0),
             h.make_node("MatMul", ["pooled", "W"], ["emb"], name="proj")]
    graph = h.make_graph(nodes, name, [h.make_tensor_value_info("ids", TensorProto.INT64, [1, TOKENS])],
                         [h.make_tensor_value_info("emb", TensorProto.FLOAT, [1, WIDTH])], inits)
    model = h.make_model(graph, opset_imports=[h.make_opsetid("", 18)])
    model.ir_version = 9
    onnx.save(model, str(folder / f"{name}.onnx"))
    ids = np.concatenate([rng.integers(1, VOCAB, TOKENS - 4), np.zeros(4)]).astype(np.int64)[None]
    np.savez(folder / f"{name}.inputs.npz", ids=ids)


def constant_model(folder: Path, name: str = "flat") -> None:
    """ids -> Gather over a table whose every value is 0.5: the output is 0.5 everywhere, in the source as in the
    int8 artifact (0.5 is the top of the table's quantized range), a constant that is not an error."""
    table = np.full((VOCAB, WIDTH), 0.5, np.float32)
    graph = h.make_graph([h.make_node("Gather", ["table", "ids"], ["emb"], name="embed")], name,
                         [h.make_tensor_value_info("ids", TensorProto.INT64, [1, TOKENS])],
                         [h.make_tensor_value_info("emb", TensorProto.FLOAT, [1, TOKENS, WIDTH])],
                         [numpy_helper.from_array(table, "table")])
    model = h.make_model(graph, opset_imports=[h.make_opsetid("", 18)])
    model.ir_version = 9
    onnx.save(model, str(folder / f"{name}.onnx"))
    np.savez(folder / f"{name}.inputs.npz", ids=np.arange(TOKENS, dtype=np.int64)[None])


def _project(tmp_path: Path, models: tuple[str, ...] = ("nanemb",), extra: str = "") -> Path:
    nan_embedding_model(tmp_path)
    constant_model(tmp_path)
    path = tmp_path / "targets.toml"
    tables = "".join(f'[models.{m}]\npath = "{m}.onnx"\ninputs = "{m}.inputs.npz"\n\n' for m in models)
    path.write_text(f"""[project]
name = "outputs"
version = "1"

{tables}[targets.cpu-fp32]
runtime = "{here_runtime()}"
providers = ["CPUExecutionProvider"]

[targets.cpu-int8]
runtime = "{here_runtime()}"
providers = ["CPUExecutionProvider"]
precision = "int8-dynamic"
{extra}""")
    return path


def _result(values: dict[str, object]) -> reload.ReloadResult:
    outputs: list[ValueInfo] = [{"name": k, "dtype": str(np.asarray(v).dtype), "shape": list(np.asarray(v).shape)}
                                for k, v in values.items()]
    return reload.ReloadResult(providers=["CPUExecutionProvider"], outputs=outputs, load_seconds=0.0,
                               run_seconds=0.0, values=list(values.values()))


# ----------------------------------------------------------------------------------------- the check itself

def test_non_finite_values_where_the_source_is_finite_are_broken() -> None:
    rng = np.random.default_rng(1)
    src = rng.standard_normal((4, 8)).astype(np.float32)
    got = src.copy()
    got[0, :3] = np.nan
    got[1, 0] = np.inf
    (b,) = reload.compare({"y": got}, {"y": src})
    assert str(b) == "output 'y' is NaN in 3 and inf in 1 of 32 values where the source model's are finite"
    # where the source is non-finite too, the artifact reproduces it: not broken (element by element)
    src[0, :3] = np.nan
    (b,) = reload.compare({"y": got}, {"y": src})
    assert str(b) == "output 'y' is inf in 1 of 32 values where the source model's are finite"
    src[1, 0] = -np.inf
    assert reload.compare({"y": got}, {"y": src}) == []


def test_a_constant_where_the_source_varies_is_broken_and_a_constant_source_is_not() -> None:
    rng = np.random.default_rng(2)
    src = rng.standard_normal((2, 50)).astype(np.float32)
    zeros = np.zeros_like(src)
    (b,) = reload.compare({"y": zeros}, {"y": src})
    assert re.fullmatch(r"output 'y' is constant 0 in all 100 values where the source model's vary "
                        r"\(std 0\.\d+\)", str(b)), str(b)
    assert f"(std {float(src.astype(np.float64).std()):.3g})" in str(b)
    assert reload.compare({"y": zeros}, {"y": np.full_like(src, 3.0)}) == []
    # a source that varies by less than fp32's default tolerance (the golden data's (near) constant rule):
    # an artifact that outputs its mean would pass the gate, so it is no broken output
    faint = (4.8e-5 + 3.3e-7 * rng.standard_normal(src.shape)).astype(np.float32)
    assert reload.compare({"y": np.zeros_like(src)}, {"y": faint}) == []
    # one value is never constant; integer outputs are not judged
    assert reload.compare({"y": np.zeros(1, np.float32)}, {"y": np.ones(1, np.float32)}) == []
    assert reload.compare({"y": np.zeros(8, np.int64)}, {"y": np.arange(8)}) == []


@pytest.mark.runtime
def test_only_a_suspicious_output_runs_the_source(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    nan_embedding_model(tmp_path)
    feed = dict(np.load(tmp_path / "nanemb.inputs.npz"))
    ran: list[Path] = []
    compute = golden.compute

    def counted(source: Path, *args: object, **kwargs: object) -> object:
        ran.append(source)
        return compute(source, *args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(golden, "compute", counted)
    path = tmp_path / "nanemb.onnx"
    fine = np.linspace(-1, 1, WIDTH, dtype=np.float32)[None]
    assert reload.suspicious(_result({"emb": fine})) == []
    assert reload.broken_outputs(_result({"emb": fine}), path, feed, ()) == []
    assert ran == []  # a normal build pays nothing
    nan = np.full((1, WIDTH), np.nan, np.float32)
    (b,) = reload.broken_outputs(_result({"emb": nan}), path, feed, ())
    assert ran == [path]
    assert str(b) == f"output 'emb' is NaN in {WIDTH} of {WIDTH} values where the source model's are finite"
    # a source that cannot run here is not compared (the accuracy gate, which runs it too, says why)
    assert reload.broken_outputs(_result({"emb": nan}), tmp_path / "missing.onnx", feed, ()) == []


def test_outputs_broken_is_a_step_error() -> None:
    e = OutputsBroken("cpu-int8", "nanemb", "reload", "output 'emb' is NaN", "hint")
    assert isinstance(e, StepError) and e.exit_code == StepError.exit_code
    assert e.message == "cpu-int8/nanemb: step 'reload': output 'emb' is NaN" and e.step == "reload"


# ----------------------------------------------------------------------------------------- real builds

@pytest.mark.runtime
def test_an_int8_artifact_whose_output_is_nan_fails_at_reload_and_publishes_nothing(tmp_path: Path) -> None:
    path = _project(tmp_path)
    proc = run_cli("build", "-c", str(path), "--json")
    assert proc.returncode == StepError.exit_code, proc.stdout[-2000:] + proc.stderr[-2000:]
    jobs = {j["target"]: j for j in json.loads(proc.stdout)["jobs"]}
    assert jobs["cpu-fp32"]["status"] == JobStatus.BUILT.value
    bad = jobs["cpu-int8"]
    assert bad["status"] == JobStatus.FAILED.value and bad["step"] == "reload", bad
    assert bad["error"]["class"] == "OutputsBroken" and bad["error"]["exit_code"] == StepError.exit_code
    assert bad["reason"] == ("cpu-int8/nanemb: step 'reload': output 'emb' is NaN in 64 of 64 values where the "
                             "source model's are finite (the artifact run on the golden inputs)"), bad["reason"]
    hint = bad["error"]["hint"]
    assert 'precision_search = "auto" on [targets.cpu-int8]' in hint
    assert "`ortbuild test --explain -t cpu-int8 -m nanemb`" in hint and "quantization.exclude_nodes" in hint
    assert not (tmp_path / "dist" / "cpu-int8" / "nanemb" / "manifest.json").exists()
    assert (tmp_path / "dist" / "cpu-fp32" / "nanemb" / "manifest.json").exists()
    text = run_cli("build", "-c", str(path))  # the text output: the reason and the hint, no traceback
    assert text.returncode == StepError.exit_code
    assert "output 'emb' is NaN in 64 of 64 values" in text.stdout + text.stderr
    assert "Traceback" not in text.stdout + text.stderr


@pytest.mark.runtime
def test_the_job_result_carries_outputs_broken_and_a_repaired_candidate_builds(tmp_path: Path) -> None:
    """What the precision search's trial builds (gating/explain.py) and `precision_search = "auto"` see: the job's
    result FAILED with an OutputsBroken error (a broken candidate is a failed trial); `embed` kept in float
    builds."""
    from ortbuild.artifact import keys
    from ortbuild.gating.search.bisect import settings_with
    from ortbuild.pipeline.build import Builder
    from ortbuild.project import config, plan

    project = config.load(_project(tmp_path))
    (job,) = plan.jobs(project, ["cpu-int8"])
    builder = Builder(project, tmp_path / "dist", secrets=keys.read_secrets(), progress=lambda job, msg: None)
    res = builder.run_job(job)
    assert res.status == JobStatus.FAILED and isinstance(res.error, OutputsBroken) and res.step == "reload"
    knob = job.settings.rule.knob
    assert knob is not None
    fixed = plan.Job(job.target, job.model, settings_with(job.settings, knob, ["embed"], []))
    assert builder.run_job(fixed).status == JobStatus.BUILT


def test_a_constant_output_of_a_constant_source_still_builds(tmp_path: Path) -> None:
    path = _project(tmp_path, models=("flat",))
    proc = run_cli("build", "-c", str(path), "--json")
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    assert {j["status"] for j in json.loads(proc.stdout)["jobs"]} == {JobStatus.BUILT.value}


@pytest.mark.runtime
def test_test_reports_the_broken_build_and_searches_it(tmp_path: Path) -> None:
    """`ortbuild test`: the failed build is the job's FAIL, with its reason (no traceback), and the precision
    search runs for it as for a failing accuracy gate; its override, pasted, builds and passes."""
    path = _project(tmp_path)
    proc = run_cli("test", "-c", str(path), "-t", "cpu-int8")
    out = proc.stdout + proc.stderr
    assert proc.returncode == StepError.exit_code, out[-3000:]
    assert "Traceback" not in out
    assert "output 'emb' is NaN in 64 of 64 values where the source model's are finite" in proc.stderr
    assert "explain cpu-int8/nanemb: found" in proc.stdout, proc.stdout[-3000:]
    block = re.search(r"paste into targets.toml:\n\n(\[\[targets\.cpu-int8\.overrides\]\]\n.*?\n)\n", proc.stdout,
                      re.S)
    assert block is not None, proc.stdout[-3000:]
    assert block.group(1) == ('[[targets.cpu-int8.overrides]]\nmodels = ["nanemb"]\n'
                              'quantization = { exclude_nodes = ["embed"] }\n')
    path.write_text(path.read_text() + "\n" + block.group(1))
    proc = run_cli("test", "-c", str(path), "-t", "cpu-int8")
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
