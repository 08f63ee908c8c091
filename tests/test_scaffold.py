"""`ortbuild init` (ortbuild/project/scaffold.py): a project scaffolded from its models loads, plans, lists one
nox session of each kind per target, and never replaces a file unasked."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import yaml

from ortbuild.project import config, scaffold, speedup
from tests.conftest import MODELS, REPO, run_cli


def _project(tmp_path: Path, *models: str) -> Path:
    root = tmp_path / "app"
    (root / "models").mkdir(parents=True)
    for m in models:
        shutil.copy(MODELS / f"{m}.onnx", root / "models")
    return root


def test_init_scaffolds_a_project_that_loads_and_plans(tmp_path: Path) -> None:
    root = _project(tmp_path, "tiny_cnn", "tiny_transformer")
    proc = run_cli("init", "--no-timing", cwd=root)
    assert proc.returncode == 0, proc.stderr
    for name in ("targets.toml", "noxfile.py", ".gitignore", ".github/workflows/ortbuild.yml",
                 "models/tiny_cnn.generated-inputs.npz", "models/tiny_transformer.generated-inputs.npz",
                 "models/tiny_cnn.expected.npz", "models/tiny_cnn.expected.json"):
        assert (root / name).is_file(), name
    # the host named in what it prints and in the file's header
    assert f"scaffolded on {speedup.host()}" in proc.stdout
    assert (root / "targets.toml").read_text().startswith(f"# Written by `ortbuild init`, on {speedup.host()}.")
    assert "not timed against fp32 on this CPU (init --no-timing)" in (root / "targets.toml").read_text()
    project = config.load(root / "targets.toml")
    assert list(project.targets) == ["cpu-fp32", "cpu-int8"]
    # int8-dynamic only where it suits: the CNN's weights are Conv weights (it wants int8-static + calibration)
    assert list(project.targets["cpu-int8"].models) == ["tiny_transformer"]
    assert "cpu-int8 leaves out tiny_cnn" in proc.stdout
    # golden inputs of the model's signature: names, types, fixed dims; symbolic dims set and reported
    golden = np.load(root / "models" / "tiny_transformer.generated-inputs.npz")
    import onnx

    graph = onnx.load(str(MODELS / "tiny_transformer.onnx")).graph
    weights = {i.name for i in graph.initializer}
    wanted = [i for i in graph.input if i.name not in weights]
    assert sorted(golden.files) == sorted(i.name for i in wanted)
    for value in wanted:
        arr = golden[value.name]
        assert arr.dtype == onnx.helper.tensor_dtype_to_np_dtype(value.type.tensor_type.elem_type)
        dims = value.type.tensor_type.shape.dim
        assert [d.dim_value for d in dims if d.dim_value] == [s for s, d in zip(arr.shape, dims, strict=True)
                                                               if d.dim_value]
    assert "symbolic dims: batch=1, seq=16" in proc.stdout
    assert (root / ".gitignore").read_text().splitlines()[-6:] == list(scaffold.GITIGNORE)
    assert {".venv/", "__pycache__/"} <= set(scaffold.GITIGNORE)  # docs/project.md makes .venv in the project
    plan = run_cli("plan", "--json", cwd=root)  # the scaffold is a valid project, its golden inputs included
    assert plan.returncode == 0, plan.stderr


def test_golden_inputs_beside_a_model_are_used_not_generated(tmp_path: Path) -> None:
    root = tmp_path / "app"
    root.mkdir()
    shutil.copy(MODELS / "tiny_lstm.onnx", root / "lstm.v2.onnx")  # a dot in the name: a quoted TOML key
    shutil.copy(MODELS / "tiny_lstm.inputs.npz", root / "lstm.v2.inputs.npz")
    proc = run_cli("init", "--no-timing", cwd=root)
    assert proc.returncode == 0, proc.stderr
    model = config.load(root / "targets.toml").models["lstm.v2"]
    assert Path(model.inputs) == root / "lstm.v2.inputs.npz"
    assert not (root / "models").exists()  # nothing generated
    assert f"lstm.v2: golden inputs {root / 'lstm.v2.inputs.npz'}" in proc.stdout


def test_golden_inputs_pointed_at(tmp_path: Path) -> None:
    root = _project(tmp_path, "tiny_cnn", "tiny_transformer")
    samples = MODELS / "tiny_cnn.inputs.npz"
    proc = run_cli("init", "--no-timing", "--inputs", f"tiny_cnn={samples}", cwd=root)
    assert proc.returncode == 0, proc.stderr
    models = config.load(root / "targets.toml").models
    generated = root / "models" / "tiny_transformer.generated-inputs.npz"
    assert Path(models["tiny_cnn"].inputs) == samples and Path(models["tiny_transformer"].inputs) == generated
    for bad, error in ((str(samples), "which model? 2 models here"), (f"vgg={samples}", "which model? 2 models"),
                       ("tiny_cnn=nowhere.npz", "nowhere.npz is neither a file"),
                       (f"tiny_cnn={MODELS / 'tiny_lstm.inputs.npz'}", "exit 3")):
        proc = run_cli("init", "--no-timing", "--force", "--inputs", bad, cwd=root)
        if error == "exit 3":  # another model's samples: the check plan does, naming the file and the input
            assert proc.returncode == 3 and "[models.tiny_cnn.inputs]" in proc.stderr, proc.stderr
        else:
            assert proc.returncode == 2 and error in proc.stderr, proc.stderr


def test_init_never_replaces_a_file_unless_forced(tmp_path: Path) -> None:
    root = _project(tmp_path, "tiny_transformer")
    (root / "targets.toml").write_text("# mine\n")
    (root / ".gitignore").write_text("*.pyc")
    proc = run_cli("init", "--no-timing", cwd=root)
    assert proc.returncode == 2 and "init would replace targets.toml" in proc.stderr and "--force" in proc.stderr
    assert "Traceback" not in proc.stderr
    assert (root / "targets.toml").read_text() == "# mine\n" and not (root / "noxfile.py").exists()
    assert run_cli("init", "--no-timing", "--force", cwd=root).returncode == 0
    assert "[models.tiny_transformer]" in (root / "targets.toml").read_text()
    assert (root / ".gitignore").read_text().startswith("*.pyc\n# ortbuild")  # kept, ortbuild's lines added
    assert run_cli("init", "--no-timing", "--force", cwd=root).returncode == 0
    assert (root / ".gitignore").read_text().count("dist/") == 1  # added once


@pytest.mark.parametrize(("args", "error"), [
    ((), "no .onnx model found in"),
    (("nothing.onnx",), "nothing.onnx: not an .onnx file or a folder"),
    (("--dim", "seq"), "write NAME=N"),
    (("--target", "tpu-int2"), "invalid choice"),
])
def test_bad_init_arguments_are_usage_errors(tmp_path: Path, args: tuple[str, ...], error: str) -> None:
    proc = run_cli("init", *args, cwd=tmp_path)
    assert proc.returncode == 2 and error in proc.stderr, proc.stderr
    assert "Traceback" not in proc.stderr and not (tmp_path / "targets.toml").exists()


def test_dims_and_targets_are_chosen_on_the_command_line(tmp_path: Path) -> None:
    root = _project(tmp_path, "tiny_transformer")
    proc = run_cli("init", "models/tiny_transformer.onnx", "--dim", "seq=7", "--target", "arm64-int8",
                   "--target", "mobile-int8", "--target", "x86-v3-int8", cwd=root)
    assert proc.returncode == 0, proc.stderr
    golden = np.load(root / "models" / "tiny_transformer.generated-inputs.npz")
    assert all(golden[k].shape[1] == 7 for k in golden.files if golden[k].ndim > 1)
    targets = config.load(root / "targets.toml").targets
    # a preset comes with the ones it extends
    assert list(targets) == ["cpu-fp32", "cpu-int8", "arm64-int8", "mobile-int8", "x86-v3-int8"]
    assert targets["arm64-int8"].platform == "linux-aarch64"
    # 8-bit weights for phones are gated on ARM's kernels, not on x86's (which saturate without VNNI)
    mobile = targets["mobile-int8"]
    assert mobile.platform == "linux-aarch64" and mobile.settings["tiny_transformer"].quantization.reduce_range is False
    assert targets["x86-v3-int8"].platform == "x86-64-v3"
    # cpu-int8 is timed against fp32 where it is built; the platform targets, timed where they run, list none
    assert targets["cpu-int8"].settings["tiny_transformer"].candidates == ({"precision": "fp32"},)
    assert all(targets[t].settings["tiny_transformer"].candidates == () for t in ("arm64-int8", "mobile-int8",
                                                                               "x86-v3-int8"))


def test_the_scaffold_has_one_nox_session_of_each_kind_per_target_and_a_workflow_over_them(tmp_path: Path) -> None:
    root = _project(tmp_path, "tiny_transformer")
    assert run_cli("init", "--no-timing", cwd=root).returncode == 0
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    env.pop("ORTBUILD_CONFIG", None)
    kinds = ("build", "test", "profile", "release")
    proc = subprocess.run([sys.executable, "-m", "nox", "-l", "--json", "-s", *kinds], cwd=root, env=env,
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    sessions = {s["session"] for s in json.loads(proc.stdout)}
    assert sessions == {f"{k}({t})" for k in kinds for t in ("cpu-fp32", "cpu-int8")}
    workflow = yaml.safe_load((root / scaffold.WORKFLOW).read_text())
    steps = [s.get("run", "") for job in workflow["jobs"].values() for s in job["steps"]]
    assert "ortbuild matrix --compact" in " ".join(steps)
    assert any('nox -s "${{ matrix.session }}"' in s for s in steps)  # test(T), test-generative(T) for an LLM
    assert any('nox -s "${{ matrix.release_session }}"' in s for s in steps)
    assert workflow["env"]["ORTBUILD_REQUIREMENT"].startswith("ortbuild==")


def test_model_names_are_unique_down_to_their_loader_module(tmp_path: Path) -> None:
    root = tmp_path / "app"
    for where in ("a/tiny-cnn.onnx", "b/tiny_cnn.onnx", "c/tiny_cnn.onnx"):
        (root / where).parent.mkdir(parents=True)
        shutil.copy(MODELS / "tiny_cnn.onnx", root / where)
    proc = run_cli("init", cwd=root)
    assert proc.returncode == 0, proc.stderr
    assert list(config.load(root / "targets.toml").models) == ["tiny-cnn", "tiny_cnn_2", "tiny_cnn_3"]


def test_int8_and_int4_targets_take_the_models_they_suit(tmp_path: Path) -> None:
    cnn_only = _project(tmp_path / "a", "tiny_cnn")
    proc = run_cli("init", cwd=cnn_only)
    assert proc.returncode == 0, proc.stderr
    assert list(config.load(cnn_only / "targets.toml").targets) == ["cpu-fp32"]  # no int8 it would serve poorly
    assert "no cpu-int8 target: for tiny_cnn, most of its weights are in Conv" in proc.stdout
    proc = run_cli("init", "--force", "--target", "cpu-int8", cwd=cnn_only)  # asked for: kept, with a warning
    assert proc.returncode == 0 and "warning: cpu-int8 (asked for) suits none of the models" in proc.stdout
    assert list(config.load(cnn_only / "targets.toml").targets["cpu-int8"].models) == ["tiny_cnn"]
    both = _project(tmp_path / "b", "tiny_cnn", "tiny_transformer")
    proc = run_cli("init", "--target", "cpu-int4", cwd=both)
    assert proc.returncode == 0, proc.stderr
    targets = config.load(both / "targets.toml").targets
    assert list(targets["cpu-int4"].models) == ["tiny_transformer"] and len(targets["cpu-fp32"].models) == 2
    assert "cpu-int4 leaves out tiny_cnn: most of its weights are not MatMul weights" in proc.stdout


def test_a_rerun_regenerates_its_own_inputs_and_never_touches_the_users(tmp_path: Path) -> None:
    root = _project(tmp_path, "tiny_transformer")
    (root / "models" / "sub").mkdir()
    shutil.copy(MODELS / "tiny_transformer.onnx", root / "models" / "sub" / "tiny_transformer.onnx")
    mine = root / "models" / "tiny_transformer.inputs.npz"  # the user's samples of the second model
    shutil.copy(MODELS / "tiny_transformer.inputs.npz", mine)
    before = mine.read_bytes()
    assert run_cli("init", "--no-timing", cwd=root).returncode == 0
    assert run_cli("init", "--no-timing", "--force", "--dim", "seq=5", cwd=root).returncode == 0
    assert mine.read_bytes() == before  # never replaced by generated data, with or without --force
    models = config.load(root / "targets.toml").models
    generated = {n: Path(m.inputs) for n, m in models.items() if Path(m.inputs) != mine}
    assert len(generated) == 1 and len(models) == 2
    (path,) = generated.values()
    assert path.name.endswith(scaffold.GENERATED) and np.load(path)["input_ids"].shape[1] == 5  # the rerun's --dim


def _files(root: Path) -> set[str]:
    return {str(p.relative_to(root)) for p in root.rglob("*")}


@pytest.mark.parametrize("case", ["github-symlink", "gitignore-folder", "gitignore-symlink", "not-onnx", "huge-dim",
                                  "bfloat16", "inputs-mismatch"])
def test_a_failed_init_writes_nothing_and_says_why(tmp_path: Path, case: str) -> None:
    import onnx
    from onnx import TensorProto, helper

    root = _project(tmp_path, "tiny_transformer")
    args: tuple[str, ...] = ()
    if case == "github-symlink":
        (tmp_path / "elsewhere").mkdir()
        (root / ".github").symlink_to(tmp_path / "elsewhere")
    elif case == "gitignore-folder":
        (root / ".gitignore").mkdir()
    elif case == "gitignore-symlink":  # a secret outside the project: init must not copy it into a new .gitignore
        (tmp_path / "secret").write_text("API_TOKEN=hunter2\n")
        (tmp_path / "secret").chmod(0o600)
        (root / ".gitignore").symlink_to(tmp_path / "secret")
    elif case == "not-onnx":
        (root / "models" / "notes.onnx").write_text("hello")
    elif case == "huge-dim":
        args = ("--dim", "seq=99999999999")
    elif case == "inputs-mismatch":
        args = ("--inputs", str(MODELS / "tiny_lstm.inputs.npz"))
    else:
        x = helper.make_tensor_value_info("x", TensorProto.BFLOAT16, [1, 4])
        y = helper.make_tensor_value_info("y", TensorProto.BFLOAT16, [1, 4])
        onnx.save(helper.make_model(helper.make_graph([helper.make_node("Identity", ["x"], ["y"])], "g", [x], [y])),
                  root / "models" / "bf.onnx")
    before = _files(root)
    proc = run_cli("init", *args, cwd=root)
    assert proc.returncode in (2, 3, 7) and "Traceback" not in proc.stderr and "internal error" not in proc.stderr
    expected = {"github-symlink": ".github", "gitignore-folder": ".gitignore",
                "gitignore-symlink": ".gitignore: cannot add ortbuild's lines to it", "not-onnx": "notes.onnx",
                "huge-dim": "set smaller dims with --dim", "bfloat16": "is BFLOAT16",
                "inputs-mismatch": "targets.toml (as init would write it): [models.tiny_transformer.inputs]"}[case]
    assert expected in proc.stderr, proc.stderr
    assert _files(root) == before and not list((tmp_path / "elsewhere").glob("*")) if case == "github-symlink" \
        else _files(root) == before
    if case == "gitignore-symlink":
        assert "symbolic link" in proc.stderr and "remove it" in proc.stderr
        assert (root / ".gitignore").is_symlink() and (tmp_path / "secret").read_text() == "API_TOKEN=hunter2\n"


def test_a_symlinked_model_keeps_its_own_name_and_place(tmp_path: Path) -> None:
    blobs = tmp_path / "cache"
    blobs.mkdir()
    shutil.copy(MODELS / "tiny_lstm.onnx", blobs / "sha256-abc")
    root = tmp_path / "app"
    (root / "models").mkdir(parents=True)
    (root / "models" / "forecast.onnx").symlink_to(blobs / "sha256-abc")
    shutil.copy(MODELS / "tiny_lstm.inputs.npz", root / "models" / "forecast.inputs.npz")
    assert run_cli("init", cwd=root).returncode == 0
    model = config.load(root / "targets.toml").models["forecast"]
    assert 'path = "models/forecast.onnx"' in (root / "targets.toml").read_text()
    assert Path(model.inputs) == root / "models" / "forecast.inputs.npz"


def _test(root: Path) -> dict[str, Any]:
    """`ortbuild test -t cpu-fp32` in the project, its one result."""
    proc = run_cli("test", "-t", "cpu-fp32", "--no-explain", "--json", cwd=root)
    assert proc.returncode in (0, 9), proc.stderr[-3000:]
    result: dict[str, Any] = json.loads(proc.stdout)["results"][0]
    return result


def _damage_first_conv(model: Path) -> None:
    """Negate the first output channel of the first Conv's weights: still a valid model, other outputs."""
    import onnx
    from onnx import numpy_helper

    m = onnx.load(str(model))
    conv = next(n for n in m.graph.node if n.op_type == "Conv")
    weight = next(t for t in m.graph.initializer if t.name == conv.input[1])
    w = numpy_helper.to_array(weight).copy()
    w[0] = -w[0]
    weight.CopyFrom(numpy_helper.from_array(w, weight.name))
    onnx.save(m, str(model))


def test_init_records_the_sources_outputs_and_a_damaged_source_fails_the_test(tmp_path: Path) -> None:
    from ortbuild.artifact import golden

    root = _project(tmp_path, "tiny_cnn")
    assert run_cli("init", "--no-timing", cwd=root).returncode == 0
    model = config.load(root / "targets.toml").models["tiny_cnn"]
    assert model.expected == root / "models" / "tiny_cnn.expected.npz"
    want = golden.compute(MODELS / "tiny_cnn.onnx", [dict(np.load(model.inputs))])[0][0]
    np.testing.assert_array_equal(np.load(model.expected)["logits"], want["logits"])  # the source's, recorded
    before = _test(root)
    assert before["status"] == "PASS" and before["golden"]["made_by"].startswith("recorded by ortbuild init")
    _damage_first_conv(root / "models" / "tiny_cnn.onnx")
    after = _test(root)
    assert after["status"] == "FAIL" and after["accuracy"] == "FAIL", after["failures"]
    assert after["failures"][0].startswith("accuracy: cpu-fp32/tiny_cnn output 'logits'")
    assert not after["golden"].get("warnings")  # the inputs are those recorded: a failure, no excuse
    # and no tolerance offered that would accept the damaged model: the source changed, and that is said
    assert not any("paste into" in line for line in after["failures"]), after["failures"]
    said = next(line for line in after["failures"] if "the source model itself" in line)
    assert "'logits' max |diff| " in said and said.endswith("ortbuild init --refresh-expected")


def test_other_inputs_warn_with_how_the_outputs_moved_and_refresh_records_theirs(tmp_path: Path) -> None:
    root = _project(tmp_path, "tiny_cnn")
    assert run_cli("init", "--no-timing", cwd=root).returncode == 0
    inputs = root / "models" / f"tiny_cnn.{scaffold.GENERATED}"
    np.savez(inputs, **{k: v * 0.5 for k, v in np.load(inputs).items()})  # the user's new samples
    _damage_first_conv(root / "models" / "tiny_cnn.onnx")  # changed too: the gate cannot tell, so it warns
    result = _test(root)
    assert result["status"] == "PASS" and result["golden"]["source"] == "computed"
    (warning,) = result["golden"]["warnings"]
    assert "[models.tiny_cnn] expected" in warning and "recorded by ortbuild init from other golden inputs" in warning
    assert "'logits' max |diff| " in warning and warning.endswith("ortbuild init --refresh-expected")
    proc = run_cli("init", "--refresh-expected", cwd=root)
    assert proc.returncode == 0 and "refreshed models/tiny_cnn.expected.npz" in proc.stdout, proc.stderr
    result = _test(root)
    assert result["status"] == "PASS" and result["golden"]["source"] == "user" and not result["golden"].get("warnings")
    _damage_first_conv(root / "models" / "tiny_cnn.onnx")  # damaged again, once the new outputs are recorded
    assert _test(root)["accuracy"] == "FAIL"


def test_a_record_of_other_outputs_is_refused_naming_it(tmp_path: Path) -> None:
    root = _project(tmp_path, "tiny_cnn")
    assert run_cli("init", "--no-timing", cwd=root).returncode == 0
    outputs = root / "models" / "tiny_cnn.expected.npz"
    np.savez(outputs, logits=np.zeros((1, 10), np.float32))  # replaced by hand, the record left
    proc = run_cli("test", "-t", "cpu-fp32", "--no-explain", cwd=root)
    assert proc.returncode != 0 and "tiny_cnn.expected.json" in proc.stderr + proc.stdout
    assert "records other outputs than tiny_cnn.expected.npz holds" in proc.stderr + proc.stdout


def _plan(root: Path, ratios: dict[str, float], *targets: str) -> tuple[scaffold.Scaffold, list[str]]:
    """init's plan where int8 is measured at `ratios` (model file stem -> int8/fp32), what it said first."""
    from ortbuild.artifact import golden

    said: list[str] = []

    def measure(path: Path, feed: object, quantization: object, threads: int) -> speedup.Measured:
        r = ratios[path.stem]
        return speedup.Measured(r, r * 0.9, r * 1.1, 20, r * 10, 10.0)

    probe = scaffold.Probe(lambda path, feeds: golden.compute(path, feeds), measure, said.append)
    return scaffold.plan(root, [], targets, {}, (), probe), said


def test_int8_measured_no_faster_here_is_left_out_or_said_to_be_slower(tmp_path: Path) -> None:
    root = _project(tmp_path, "tiny_transformer", "tiny_lstm")
    level = speedup.level()
    made, said = _plan(root, {"tiny_transformer": 1.66, "tiny_lstm": 0.6})
    assert said == [f"measuring int8 vs fp32 on this CPU ({level}): about 6 s"]
    text = made.files[root / "targets.toml"]
    assert 'models = ["tiny_lstm"]' in text
    assert "#   tiny_transformer: int8 takes 1.66x fp32's time" in text and "slower than fp32 here, left out" in text
    assert any(n.startswith(f"cpu-int8 leaves out tiny_transformer: int8 is no faster than fp32 on this CPU ({level}):"
                            " tiny_transformer: int8 takes 1.66x") for n in made.notes)
    assert "cpu-int8 keeps tiny_lstm: int8 takes 0.60x fp32's time" in " ".join(made.notes)
    made, _ = _plan(root, {"tiny_transformer": 0.97, "tiny_lstm": 1.2})  # none faster: no cpu-int8
    text = made.files[root / "targets.toml"]
    assert "[targets.cpu-int8]" not in text and "not 5% faster than fp32 here, left out" in text.split("[project]")[0]
    assert any(n.startswith(f"no cpu-int8 target: int8 is no faster than fp32 on this CPU ({level})")
               for n in made.notes)
    made, _ = _plan(root, {"tiny_transformer": 1.66, "tiny_lstm": 0.6}, "cpu-int8")  # asked for: kept, said
    text = made.files[root / "targets.toml"]
    assert "slower than fp32 here, kept: asked for" in text and "models = " not in text
    assert any(n.startswith("warning: cpu-int8 (asked for) is no faster") for n in made.notes)
    made, _ = _plan(root, {"tiny_transformer": 0.9496, "tiny_lstm": 0.9449})  # judged as printed (two decimals)
    text = made.files[root / "targets.toml"]
    assert "tiny_transformer: int8 takes 0.95x" in text and "not 5% faster than fp32 here, left out" in text
    assert 'models = ["tiny_lstm"]' in text and "tiny_lstm: int8 takes 0.94x" in text


def test_init_times_int8_against_fp32_and_decides_by_what_it_measured(tmp_path: Path) -> None:
    root = _project(tmp_path, "tiny_transformer")
    proc = run_cli("init", cwd=root)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.startswith(f"measuring int8 vs fp32 on this CPU ({speedup.level()}): about ")
    text = (root / "targets.toml").read_text()
    found = re.search(r"#   tiny_transformer: int8 takes ([0-9.]+)x fp32's time \(median of (\d+) paired runs", text)
    assert found is not None, text
    ratio, pairs = float(found.group(1)), int(found.group(2))
    assert ratio > 0 and speedup.MIN_PAIRS <= pairs <= speedup.MAX_PAIRS
    targets = config.load(root / "targets.toml").targets
    assert ("cpu-int8" in targets) == (ratio < speedup.MAX_RATIO)  # what it wrote follows what it printed


def test_init_times_int8_of_a_model_whose_weights_are_external_data(tmp_path: Path) -> None:
    """Weights beside the graph (model.onnx + model.onnx.data, as big models ship) are quantized and timed too."""
    import onnx

    root = _project(tmp_path)
    onnx.save_model(onnx.load(str(MODELS / "tiny_transformer.onnx")), str(root / "models" / "ext.onnx"),
                    save_as_external_data=True, all_tensors_to_one_file=True, location="ext.onnx.data",
                    size_threshold=1024)
    proc = run_cli("init", cwd=root)
    assert proc.returncode == 0, proc.stderr
    text = (root / "targets.toml").read_text()
    assert re.search(r"#   ext: int8 takes [0-9.]+x fp32's time \(median of \d+ paired runs", text), text
    assert "could not be made or run here" not in text


def test_without_onnxruntime_init_says_what_it_did_not_measure_or_record(tmp_path: Path) -> None:
    root = _project(tmp_path, "tiny_transformer")
    made = scaffold.plan(root, [], [], {}, (), None)
    text = made.files[root / "targets.toml"]
    assert f"# {scaffold.UNPROBED}" in text and "expected =" not in text and scaffold.UNPROBED in made.notes
    (root / "targets.toml").write_text(text)
    assert list(config.load(root / "targets.toml", check_files=False).targets) == ["cpu-fp32", "cpu-int8"]


def _hf_dir(folder: Path, prompts: bool = False) -> Path:
    """What makes a Hugging Face-format directory for init and the configuration (generation.directory_problem): its
    config, weights and tokenizer files (their content is the builder's business, at build time)."""
    folder.mkdir(parents=True)
    (folder / "config.json").write_text(json.dumps({"architectures": ["LlamaForCausalLM"], "model_type": "llama"}))
    (folder / "model.safetensors").write_bytes(b"\0" * 64)
    (folder / "tokenizer.json").write_text("{}")
    if prompts:
        (folder / "prompts.txt").write_text("Its own prompt\n")
    return folder


def test_init_scaffolds_a_hugging_face_directory_as_a_generative_model_of_an_int4_target(tmp_path: Path) -> None:
    root = _project(tmp_path, "tiny_cnn")
    _hf_dir(root / "models" / "my-llm.v2")  # a dot in the name: the whole directory name is the model's
    proc = run_cli("init", "--no-timing", cwd=root)
    assert proc.returncode == 0, proc.stderr
    assert f"my-llm.v2: a Hugging Face-format directory, prompts {scaffold.PROMPTS}" in proc.stdout
    assert "python -m nox -t generative" in proc.stdout
    prompts = (root / scaffold.PROMPTS).read_text().splitlines()
    assert len(prompts) >= 4 and all(p.strip() for p in prompts)
    text = (root / "targets.toml").read_text()
    assert f'inputs = "{scaffold.PROMPTS}"  # generated by init' in text
    project = config.load(root / "targets.toml")
    llm = project.models["my-llm.v2"]
    assert llm.kind == "generative" and llm.path == root / "models" / "my-llm.v2"
    assert list(project.targets) == ["cpu-fp32", "llm-cpu-int4"]  # cpu-int8 does not suit the CNN
    assert list(project.targets["cpu-fp32"].models) == ["tiny_cnn"]  # a wildcard never selects a generative model
    int4 = project.targets["llm-cpu-int4"]
    assert list(int4.models) == ["my-llm.v2"] and int4.settings["my-llm.v2"].precision == "int4-weight"
    assert int4.settings["my-llm.v2"].precision_search == "auto"
    # edited prompts survive a forced rerun: init writes them only where there are none
    (root / scaffold.PROMPTS).write_text("Mine\n")
    assert run_cli("init", "--no-timing", "--force", cwd=root).returncode == 0
    assert (root / scaffold.PROMPTS).read_text() == "Mine\n"


def test_init_of_a_hugging_face_directory_alone_writes_its_generative_target_only(tmp_path: Path) -> None:
    root = tmp_path / "app"
    llm = _hf_dir(root / "models" / "llm", prompts=True)
    proc = run_cli("init", "models/llm", cwd=root)
    assert proc.returncode == 0, proc.stderr
    assert not (root / scaffold.PROMPTS).exists()  # its own prompts.txt are its golden prompts
    project = config.load(root / "targets.toml")
    assert list(project.targets) == ["llm-cpu-int4"] and project.models["llm"].inputs == llm / "prompts.txt"
    proc = run_cli("init", "--force", cwd=root)  # found in models/ too, where no .onnx model is
    assert proc.returncode == 0, proc.stderr
    assert list(config.load(root / "targets.toml").targets) == ["llm-cpu-int4"]
