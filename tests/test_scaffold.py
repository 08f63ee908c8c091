"""`ortbuild init` (ortbuild/project/scaffold.py): a project scaffolded from its models loads, plans, lists one
nox session of each kind per target, and never replaces a file unasked."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import yaml

from ortbuild.project import config, scaffold
from tests.conftest import MODELS, REPO, run_cli


def _project(tmp_path: Path, *models: str) -> Path:
    root = tmp_path / "app"
    (root / "models").mkdir(parents=True)
    for m in models:
        shutil.copy(MODELS / f"{m}.onnx", root / "models")
    return root


def test_init_scaffolds_a_project_that_loads_and_plans(tmp_path: Path) -> None:
    root = _project(tmp_path, "tiny_cnn", "tiny_transformer")
    proc = run_cli("init", cwd=root)
    assert proc.returncode == 0, proc.stderr
    for name in ("targets.toml", "noxfile.py", ".gitignore", ".github/workflows/ortbuild.yml",
                 "models/tiny_cnn.generated-inputs.npz", "models/tiny_transformer.generated-inputs.npz"):
        assert (root / name).is_file(), name
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
    assert (root / ".gitignore").read_text().splitlines()[-4:] == list(scaffold.GITIGNORE)
    plan = run_cli("plan", "--json", cwd=root)  # the scaffold is a valid project, its golden inputs included
    assert plan.returncode == 0, plan.stderr


def test_golden_inputs_beside_a_model_are_used_not_generated(tmp_path: Path) -> None:
    root = tmp_path / "app"
    root.mkdir()
    shutil.copy(MODELS / "tiny_lstm.onnx", root / "lstm.v2.onnx")  # a dot in the name: a quoted TOML key
    shutil.copy(MODELS / "tiny_lstm.inputs.npz", root / "lstm.v2.inputs.npz")
    proc = run_cli("init", cwd=root)
    assert proc.returncode == 0, proc.stderr
    model = config.load(root / "targets.toml").models["lstm.v2"]
    assert Path(model.inputs) == root / "lstm.v2.inputs.npz"
    assert not (root / "models").exists()  # nothing generated
    assert f"lstm.v2: golden inputs {root / 'lstm.v2.inputs.npz'}" in proc.stdout


def test_golden_inputs_pointed_at(tmp_path: Path) -> None:
    root = _project(tmp_path, "tiny_cnn", "tiny_transformer")
    samples = MODELS / "tiny_cnn.inputs.npz"
    proc = run_cli("init", "--inputs", f"tiny_cnn={samples}", cwd=root)
    assert proc.returncode == 0, proc.stderr
    models = config.load(root / "targets.toml").models
    generated = root / "models" / "tiny_transformer.generated-inputs.npz"
    assert Path(models["tiny_cnn"].inputs) == samples and Path(models["tiny_transformer"].inputs) == generated
    for bad, error in ((str(samples), "which model? 2 models here"), (f"vgg={samples}", "which model? 2 models"),
                       ("tiny_cnn=nowhere.npz", "nowhere.npz is neither a file"),
                       (f"tiny_cnn={MODELS / 'tiny_lstm.inputs.npz'}", "exit 3")):
        proc = run_cli("init", "--force", "--inputs", bad, cwd=root)
        if error == "exit 3":  # another model's samples: the check plan does, naming the file and the input
            assert proc.returncode == 3 and "[models.tiny_cnn.inputs]" in proc.stderr, proc.stderr
        else:
            assert proc.returncode == 2 and error in proc.stderr, proc.stderr


def test_init_never_replaces_a_file_unless_forced(tmp_path: Path) -> None:
    root = _project(tmp_path, "tiny_transformer")
    (root / "targets.toml").write_text("# mine\n")
    (root / ".gitignore").write_text("*.pyc")
    proc = run_cli("init", cwd=root)
    assert proc.returncode == 2 and "init would replace targets.toml" in proc.stderr and "--force" in proc.stderr
    assert "Traceback" not in proc.stderr
    assert (root / "targets.toml").read_text() == "# mine\n" and not (root / "noxfile.py").exists()
    assert run_cli("init", "--force", cwd=root).returncode == 0
    assert "[models.tiny_transformer]" in (root / "targets.toml").read_text()
    assert (root / ".gitignore").read_text().startswith("*.pyc\n# ortbuild")  # kept, ortbuild's lines added
    assert run_cli("init", "--force", cwd=root).returncode == 0
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
    proc = run_cli("init", "models/tiny_transformer.onnx", "--dim", "seq=7", "--target", "arm64-int8", cwd=root)
    assert proc.returncode == 0, proc.stderr
    golden = np.load(root / "models" / "tiny_transformer.generated-inputs.npz")
    assert all(golden[k].shape[1] == 7 for k in golden.files if golden[k].ndim > 1)
    targets = config.load(root / "targets.toml").targets
    assert list(targets) == ["cpu-fp32", "cpu-int8", "arm64-int8"]  # a preset comes with the ones it extends
    assert targets["arm64-int8"].platform == "linux-aarch64"


def test_the_scaffold_has_one_nox_session_of_each_kind_per_target_and_a_workflow_over_them(tmp_path: Path) -> None:
    root = _project(tmp_path, "tiny_transformer")
    assert run_cli("init", cwd=root).returncode == 0
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
    assert run_cli("init", cwd=root).returncode == 0
    assert run_cli("init", "--force", "--dim", "seq=5", cwd=root).returncode == 0
    assert mine.read_bytes() == before  # never replaced by generated data, with or without --force
    models = config.load(root / "targets.toml").models
    generated = {n: Path(m.inputs) for n, m in models.items() if Path(m.inputs) != mine}
    assert len(generated) == 1 and len(models) == 2
    (path,) = generated.values()
    assert path.name.endswith(scaffold.GENERATED) and np.load(path)["input_ids"].shape[1] == 5  # the rerun's --dim


def _files(root: Path) -> set[str]:
    return {str(p.relative_to(root)) for p in root.rglob("*")}


@pytest.mark.parametrize("case", ["github-symlink", "gitignore-folder", "not-onnx", "huge-dim", "bfloat16",
                                  "inputs-mismatch"])
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
    expected = {"github-symlink": ".github", "gitignore-folder": ".gitignore", "not-onnx": "notes.onnx",
                "huge-dim": "set smaller dims with --dim", "bfloat16": "is BFLOAT16",
                "inputs-mismatch": "targets.toml (as init would write it): [models.tiny_transformer.inputs]"}[case]
    assert expected in proc.stderr, proc.stderr
    assert _files(root) == before and not list((tmp_path / "elsewhere").glob("*")) if case == "github-symlink" \
        else _files(root) == before


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
