"""Build to the gates (ortbuild/gating/search/autobuild.py): `precision_search = "auto"` on real builds of a small model
whose int8 fails its accuracy rule until one MatMul stays in float (tests/test_explain.py's `emb_model`)."""

from __future__ import annotations

import json
import tomllib
from pathlib import Path

import numpy as np

from ortbuild.errors import ConfigError, GateFailed
from tests.conftest import here_runtime, run_cli
from tests.test_explain import _emb_project

AUTO = 'accuracy = { cosine = 0.999 }\nprecision_search = "auto"\n\n[targets.int8-b]\nextends = "int8"\n'


def _project(tmp_path: Path, extra: str = AUTO) -> Path:
    path = _emb_project(tmp_path)
    path.write_text(path.read_text().replace("accuracy = { cosine = 0.999 }\n", extra))
    return path


def _build(path: Path, *args: str) -> tuple[int, dict[str, dict[str, object]], str]:
    proc = run_cli("build", "-c", str(path), "--json", *args)
    jobs = {f"{j['target']}/{j['model']}": j for j in json.loads(proc.stdout)["jobs"]} if proc.stdout else {}
    return proc.returncode, jobs, proc.stderr


def test_auto_ships_the_passing_set_locks_it_and_one_root_cause_searches_once(tmp_path: Path) -> None:
    path = _project(tmp_path)
    code, jobs, err = _build(path)
    assert code == 0, err[-3000:]
    assert {j: r["status"] for j, r in jobs.items()} == {"int8/emb": "built", "int8-b/emb": "built"}
    lock = tomllib.loads((tmp_path / "targets.lock").read_text())["jobs"]
    for job in ("int8/emb", "int8-b/emb"):
        assert lock[job]["applies"] == {"quantization": {"exclude_nodes": ["fc"]}}
        manifest = json.loads((tmp_path / "dist" / job / "manifest.json").read_text())
        assert manifest["locked"]["applies"] == lock[job]["applies"]
    assert lock["int8/emb"]["search"]["rebuilds"] == 1  # the search ran once, for the first job
    assert lock["int8/emb"]["search"]["failed_with"].startswith("accuracy gate FAIL (y: cosine 0.99")
    assert lock["int8-b/emb"]["search"]["reused_from"] == "int8/emb"  # the second tried that answer, no search
    assert "rebuilds" not in lock["int8-b/emb"]["search"]
    assert any("the answer of int8/emb's search" in n for n in jobs["int8-b/emb"]["notes"])  # type: ignore[attr-defined]
    # what was shipped passes the gates, with no override written by hand
    proc = run_cli("test", "-c", str(path), "--no-explain")
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    # the lock makes the next build a no-op that ships the same artifact; --locked agrees
    before = (tmp_path / "targets.lock").read_bytes()
    artifact = (tmp_path / "dist" / "int8" / "emb" / "model.onnx.enc").read_bytes()
    code, jobs, err = _build(path, "--locked")
    assert code == 0, err
    assert {r["status"] for r in jobs.values()} == {"up-to-date"}
    assert (tmp_path / "targets.lock").read_bytes() == before
    assert (tmp_path / "dist" / "int8" / "emb" / "model.onnx.enc").read_bytes() == artifact
    plan = run_cli("plan", "-c", str(path))
    assert 'targets.lock lays over its settings: quantization.exclude_nodes = ["fc"]' in plan.stdout


def test_a_changed_model_invalidates_its_entry_locked_fails_and_a_build_searches_again(tmp_path: Path) -> None:
    path = _project(tmp_path, 'accuracy = { cosine = 0.999 }\nprecision_search = "auto"\n')
    assert _build(path)[0] == 0
    ids = np.load(tmp_path / "emb.inputs.npz")["ids"]
    np.savez(tmp_path / "emb.inputs.npz", ids=(ids + 1) % 50)  # other golden inputs: the judgement changes
    code, _, err = _build(path, "--locked")
    assert code == ConfigError.exit_code
    assert 'targets.lock: --locked: int8/emb (precision_search = "auto"): its entry is out of date (the model or ' \
        "its data changed since it was written)" in err
    assert "run the build without --locked" in err
    code, _, err = _build(path)
    assert code == 0, err[-2000:]
    assert "the entry of int8/emb is out of date (the model or its data changed since it was written): the " \
           "build does its search again" in err
    lock = tomllib.loads((tmp_path / "targets.lock").read_text())["jobs"]["int8/emb"]
    assert lock["applies"] == {"quantization": {"exclude_nodes": ["fc"]}} and lock["search"]["rebuilds"] >= 1


def test_a_job_that_passes_as_declared_is_recorded_and_not_judged_again(tmp_path: Path) -> None:
    path = _project(tmp_path, 'accuracy = { cosine = 0.9 }\nprecision_search = "auto"\n')
    code, jobs, err = _build(path)
    assert code == 0, err
    lock = tomllib.loads((tmp_path / "targets.lock").read_text())["jobs"]["int8/emb"]
    assert lock["applies"] == {} and lock["search"]["result"].startswith("passes as declared (y: cosine 0.99")
    code, jobs, err = _build(path, "--locked")
    assert code == 0 and jobs["int8/emb"]["status"] == "up-to-date"
    assert "accuracy gate" not in err


def test_a_search_the_budget_stopped_says_so_and_a_larger_budget_refines_it(tmp_path: Path) -> None:
    path = _project(tmp_path, 'accuracy = { cosine = 0.999 }\nprecision_search = "auto"\n')
    assert _build(path)[0] == 0
    lock = tmp_path / "targets.lock"
    entry = tomllib.loads(lock.read_text())["jobs"]["int8/emb"]
    assert entry["search"]["minimal"] is True and entry["search"]["budget_seconds"] == 300
    # as a search stopped by a 5 s budget would have left it (the model has two candidates, and both in float
    # convert nothing: the set stays, the entry says it is not minimal)
    lock.write_text(lock.read_text().replace("minimal = true", "minimal = false").replace("budget_seconds = 300",
                                                                                        "budget_seconds = 5"))
    code, jobs, err = _build(path, "--locked")  # CI: the lock decides, nothing is searched
    assert code == 0 and jobs["int8/emb"]["status"] == "up-to-date" and "searching again" not in err
    code, jobs, err = _build(path, "--explain-seconds", "4")  # no more budget than it had: nothing searched
    assert code == 0 and "searching again" not in err
    proc = run_cli("build", "-c", str(path))  # 300 s: searched again from the declared settings
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "the entry's search was stopped by its budget (5 s): searching again with 300 s" in proc.stderr
    entry = tomllib.loads(lock.read_text())["jobs"]["int8/emb"]
    assert entry["applies"] == {"quantization": {"exclude_nodes": ["fc"]}}
    assert entry["search"]["minimal"] is True and entry["search"]["budget_seconds"] == 300
    code, jobs, err = _build(path)  # settled again
    assert code == 0 and "searching again" not in err


def test_no_passing_set_within_the_budget_fails_the_job_with_the_search_table(tmp_path: Path) -> None:
    path = _project(tmp_path, AUTO.replace("0.999 }", "0.9999999 }"))
    code, jobs, err = _build(path, "--explain-rebuilds", "1")
    assert code == GateFailed.exit_code, err[-2000:]
    assert jobs["int8/emb"]["status"] == "failed"
    error = jobs["int8/emb"]["error"]
    assert isinstance(error, dict) and error["class"] == "GateFailed"
    assert 'precision_search = "auto" found no set kept in float that passes (accuracy gate FAIL (y: cosine' \
        in error["message"]
    assert "explain int8/emb" in error["message"]  # the search's table
    proc = run_cli("build", "-c", str(path), "--explain-rebuilds", "1")  # as the terminal shows it
    assert proc.returncode == GateFailed.exit_code and "Traceback" not in proc.stderr
    assert "release gate failed: int8/emb: precision_search" in proc.stderr, proc.stderr[-2000:]
    assert not (tmp_path / "targets.lock").exists()
    other = jobs["int8-b/emb"]["error"]  # the same root cause: not searched again
    assert isinstance(other, dict) and "the search of int8/emb (the same model and precision step) found none" \
        in other["message"] and "rebuild:" not in other["message"]
    code, _, err = _build(path, "--locked")
    assert code == ConfigError.exit_code and 'int8/emb (precision_search = "auto"): no entry' in err


def test_off_is_todays_behaviour(tmp_path: Path) -> None:
    path = _project(tmp_path, "accuracy = { cosine = 0.999 }\n")
    code, jobs, err = _build(path, "--locked")  # nothing asks for the lock: --locked has nothing to check
    assert code == 0, err
    assert not (tmp_path / "targets.lock").exists()
    assert not any("precision_search" in n for n in jobs["int8/emb"]["notes"])  # type: ignore[attr-defined]


def test_a_nan_int8_is_never_built_and_auto_repairs_it_once_for_the_targets_sharing_the_cause(
        tmp_path: Path) -> None:
    """An embedding whose padding row int8 rounds to zero gives NaN (tests/test_reload.py): under "auto" the
    failed reload starts the search; the second target of the same model and precision step reuses its answer."""
    from tests.test_reload import _project as nan_project

    path = nan_project(tmp_path, extra='precision_search = "auto"\n\n[targets.arm-int8]\nextends = "cpu-int8"\n')
    code, jobs, err = _build(path)
    assert code == 0, err[-3000:]
    assert {j: r["status"] for j, r in jobs.items()} == {
        "cpu-fp32/nanemb": "built", "cpu-int8/nanemb": "built", "arm-int8/nanemb": "built"}
    lock = tomllib.loads((tmp_path / "targets.lock").read_text())["jobs"]
    assert lock["cpu-int8/nanemb"]["search"]["failed_with"].startswith("broken outputs (cpu-int8/nanemb: step "
                                                                        "'reload': output 'emb' is NaN")
    assert lock["cpu-int8/nanemb"]["applies"] == {"quantization": {"exclude_nodes": ["embed"]}}
    assert lock["arm-int8/nanemb"]["search"]["reused_from"] == "cpu-int8/nanemb"
    proc = run_cli("test", "-c", str(path), "--no-explain", "--locked")
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]


def test_an_entry_without_a_search_is_kept_and_locked_does_not_search(tmp_path: Path) -> None:
    """An up-to-date entry that holds no search (a tuning, or written by hand): --locked refuses to search in its
    place; a build judges the job with what the entry lays over it, keeps that, and the entry is then settled."""
    path = _project(tmp_path, 'accuracy = { cosine = 0.999 }\nprecision_search = "auto"\n')
    assert _build(path)[0] == 0
    lock = tmp_path / "targets.lock"
    lock.write_text(lock.read_text().split('\n[jobs."int8/emb".search]')[0])  # the search part dropped
    code, _, err = _build(path, "--locked")
    assert code == ConfigError.exit_code and "int8/emb (precision_search = \"auto\"): its entry holds no search" in err
    code, jobs, err = _build(path)
    assert code == 0 and jobs["int8/emb"]["status"] == "up-to-date", err  # the artifact it lays over stands
    entry = tomllib.loads(lock.read_text())["jobs"]["int8/emb"]
    assert entry["applies"] == {"quantization": {"exclude_nodes": ["fc"]}}
    assert entry["search"]["result"].startswith("passes with what targets.lock lays over it (y: cosine 0.9999")
    assert _build(path, "--locked")[0] == 0


def test_inline_overrides_and_an_entry_the_model_cannot_take(tmp_path: Path) -> None:
    """targets.toml writing its overrides as an inline array takes the lock's entry as one more (merged as data);
    an entry naming a node the model lacks is blamed on targets.lock, not targets.toml."""
    path = _project(tmp_path, 'accuracy = { cosine = 0.999 }\nprecision_search = "auto"\n'
                              'overrides = [ { models = ["emb"], latency = { p50_ms = 150 } } ]\n')
    code, jobs, err = _build(path)
    assert code == 0, err[-2000:]
    lock = tmp_path / "targets.lock"
    assert 'applies = { quantization = { exclude_nodes = ["fc"] } }' in lock.read_text()
    assert _build(path, "--locked")[1]["int8/emb"]["status"] == "up-to-date"
    lock.write_text(lock.read_text().replace('exclude_nodes = ["fc"]', 'exclude_nodes = ["nosuch"]'))
    code, jobs, err = _build(path, "--force")
    error = jobs["int8/emb"]["error"]
    assert code == ConfigError.exit_code and isinstance(error, dict), err
    assert error["message"].startswith(f'{lock}: [jobs."int8/emb".applies.quantization.exclude_nodes] the model '
                                       "has no node named 'nosuch'"), error
    assert "delete the entry" in error["hint"]


def test_a_search_with_every_changed_node_renamed_says_how_to_keep_the_names(tmp_path: Path) -> None:
    """MatMul + Add: the quantizer's pre-processing fuses them under new names, which exclude_nodes cannot name."""
    from tests.bigmodels import mlp

    mlp(tmp_path / "m", layers=2, width=64, embedded=True)
    path = tmp_path / "targets.toml"
    path.write_text(f"""[project]
name = "renamed"
version = "1"

[models.mlp]
path = "m/model.onnx"
inputs = "m/inputs.npz"

[targets.int8]
runtime = "{here_runtime()}"
providers = ["CPUExecutionProvider"]
precision = "int8-dynamic"
accuracy = {{ cosine = 0.9999999 }}
precision_search = "auto"
""")
    code, jobs, _ = _build(path)
    error = jobs["int8/mlp"]["error"]
    assert code == GateFailed.exit_code and isinstance(error, dict), error
    assert "by a name the source model has" in error["message"]
    assert error["hint"].startswith("the nodes it changed were renamed by the quantizer's pre-processing"), error
    assert "quantization = { preprocess = false }" in error["hint"]


def _already_int8(folder: Path) -> Path:
    """A model that ships its own int8 weights (as weight-only int8 encoders do: int8 tensors, Cast, a per-row scale,
    then a float MatMul), 64% of its weight bytes int8, and one float MatMul (`head`) with an outlier weight, which
    int8-dynamic quantizes again and breaks cosine 0.9999."""
    import onnx
    from onnx import TensorProto, numpy_helper
    from onnx import helper as h

    rng = np.random.default_rng(0)
    head = (rng.standard_normal((64, 8)) / 8).astype(np.float32)
    head[0, 0] = 30.0
    inits = [numpy_helper.from_array(rng.integers(-127, 128, (64, 64)).astype(np.int8), "w_q"),
             numpy_helper.from_array((rng.random((64, 1)) / 100).astype(np.float32), "w_scale"),
             numpy_helper.from_array(head, "head_w")]
    nodes = [h.make_node("Cast", ["w_q"], ["w_f"], name="dequant_cast", to=TensorProto.FLOAT),
             h.make_node("Mul", ["w_f", "w_scale"], ["w"], name="dequant_scale"),
             h.make_node("MatMul", ["x", "w"], ["hidden"], name="body"),
             h.make_node("Relu", ["hidden"], ["act"], name="act"),
             h.make_node("MatMul", ["act", "head_w"], ["y"], name="head")]
    graph = h.make_graph(nodes, "own", [h.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 64])],
                         [h.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", 8])], inits)
    model = h.make_model(graph, opset_imports=[h.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.save(model, str(folder / "own.onnx"))
    np.savez(folder / "own.inputs.npz", x=rng.standard_normal((8, 64)).astype(np.float32))
    path = folder / "targets.toml"
    path.write_text(f"""[project]
name = "own"
version = "1"

[models.own]
path = "own.onnx"
inputs = "own.inputs.npz"

[targets.int8]
runtime = "{here_runtime()}"
providers = ["CPUExecutionProvider"]
precision = "int8-dynamic"
quantization = {{ per_channel = false, reduce_range = true }}
accuracy = {{ cosine = 0.9999 }}
precision_search = "auto"
""")
    return path


def test_an_already_int8_source_ships_its_own_quantization_with_no_override(tmp_path: Path) -> None:
    path = _already_int8(tmp_path)
    proc = run_cli("plan", "-c", str(path))
    assert "the source is already reduced (64% of its weight bytes are int8/int4/fp16)" in proc.stdout
    proc = run_cli("build", "-c", str(path))
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "the source is already reduced (64% of its weight bytes are int8/int4/fp16): trying its own " \
           "quantization" in proc.stderr
    assert "shipped the source's own quantization (2 node(s) as it stores them): accuracy PASS" in proc.stderr
    entry = tomllib.loads((tmp_path / "targets.lock").read_text())["jobs"]["int8/own"]
    assert entry["applies"] == {"quantization": {"exclude_nodes": ["body", "head"]}}
    assert entry["search"]["source_quantization"] == "64% of its weight bytes are int8/int4/fp16"
    assert entry["search"]["failed_with"].startswith("accuracy gate FAIL (y: cosine 0.99")
    # the guard against converting nothing gives way to the source's own quantization, and says so
    record = json.loads((tmp_path / "dist" / "logs" / "int8" / "own.build.json").read_text())
    assert any("the source is already reduced, the rest is its own quantization" in n for n in record["notes"])
    assert run_cli("test", "-c", str(path), "--no-explain", "--gates", "accuracy").returncode == 0
