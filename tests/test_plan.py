"""`ortbuild plan` checks each model's golden inputs against the model's graph inputs (names, element types,
ranks, fixed dimensions) before anything is built: a mismatch is a config error (exit 3) naming targets.toml, the
`[models.X] inputs` key, the data file, the input, what the model wants and what the file holds."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest
from onnx import numpy_helper

from tests.conftest import MODELS, run_cli

CNN = "[targets.cpu]\nruntime = \"RUNTIME\"\nproviders = [\"CPUExecutionProvider\"]\n"
GOOD = dict(np.load(MODELS / "tiny_cnn.inputs.npz"))  # image: float32 (4, 3, 32, 32); the model: [batch, 3, 32, 32]


def _project(make_project: Callable[..., Path], inputs: Path | None = None) -> Path:
    path = make_project(CNN)
    if inputs is not None:
        text = path.read_text().replace(f'"{MODELS / "tiny_cnn.inputs.npz"}"', f'"{inputs}"')
        assert str(inputs) in text
        path.write_text(text)
    return path


def _plan(path: Path, *extra: str) -> tuple[int, str, str]:
    proc = run_cli("plan", "-c", str(path), *extra, cwd=path.parent)
    return proc.returncode, proc.stdout, proc.stderr


@pytest.mark.parametrize(("arrays", "problem"), [
    ({"imag": GOOD["image"]},
     "input 'image' (float32 [batch, 3, 32, 32]) is missing; 'imag' is not an input of the model "
     "(did you mean 'image'?)"),
    ({"image": GOOD["image"].astype(np.float64)}, "input 'image' is float64, the model wants float32"),
    ({"image": np.zeros((4, 3, 16, 32), np.float32)},
     "input 'image' has shape [4, 3, 16, 32], the model wants [batch, 3, 32, 32] (dim 2 is 16, not 32)"),
    ({"image": GOOD["image"][0]}, "input 'image' has shape [3, 32, 32] (rank 3), the model wants rank 4"),
    ({"image": GOOD["image"], "mask": np.ones((4, 1), np.float32)}, "'mask' is not an input of the model"),
])
def test_golden_inputs_that_do_not_fit_the_model_fail_plan_before_anything_is_built(
        make_project: Callable[..., Path], arrays: dict[str, np.ndarray], problem: str) -> None:
    golden = _project(make_project).parent / "golden.npz"
    np.savez(golden, **arrays)
    path = _project(make_project, golden)
    for extra in ((), ("--json",)):
        code, out, err = _plan(path, *extra)
        assert code == 3, err
        assert err.startswith(f"ortbuild: config error: {path}: [models.tiny_cnn.inputs] {golden}: {problem}"), err
        assert "hint: the model's inputs are 'image' float32 [batch, 3, 32, 32]" in err
        assert "numpy.savez(path, image=x.astype(numpy.float32)" in err  # what to do
        assert out == "" and "Traceback" not in err
    assert not (path.parent / "dist").exists()  # nothing built, not even dist/
    # the build says the same (the one check), naming the declaration too
    proc = run_cli("build", "-c", str(path), cwd=path.parent)
    assert proc.returncode == 3 and f"{path}: [models.tiny_cnn.inputs] {golden}: {problem}" in proc.stderr


def test_golden_inputs_that_fit_pass_plan(make_project: Callable[..., Path]) -> None:
    path = _project(make_project)  # the example's own golden file: batch 4 against the symbolic batch
    code, out, err = _plan(path, "--json")
    assert code == 0, err
    assert [(j["model"], j["rebuild"]) for j in json.loads(out)] == [("tiny_cnn", True)]
    other_batch = path.parent / "batch1.npz"
    np.savez(other_batch, image=GOOD["image"][:1])  # a named dim takes any size
    assert _plan(_project(make_project, other_batch))[0] == 0


def test_every_test_data_set_of_an_onnx_layout_directory_is_checked(make_project: Callable[..., Path]) -> None:
    folder = make_project(CNN).parent / "golden"
    for i, arr in enumerate([GOOD["image"], GOOD["image"].astype(np.float16)]):
        (folder / f"test_data_set_{i}").mkdir(parents=True)
        (folder / f"test_data_set_{i}" / "input_0.pb").write_bytes(
            numpy_helper.from_array(arr, "image").SerializeToString())
    path = _project(make_project, folder)
    code, _, err = _plan(path)
    assert code == 3, err
    assert (f"[models.tiny_cnn.inputs] {folder / 'test_data_set_1'}: input 'image' is float16, the model wants "
            "float32") in err


def test_several_models_problems_come_in_one_error(make_project: Callable[..., Path]) -> None:
    path = make_project(CNN, models=("tiny_cnn", "tiny_transformer"))
    bad_cnn, bad_tf = path.parent / "cnn.npz", path.parent / "tf.npz"
    np.savez(bad_cnn, image=GOOD["image"].astype(np.float64))
    np.savez(bad_tf, input_ids=np.zeros((4, 32), np.int64))
    text = path.read_text()
    for model, bad in (("tiny_cnn", bad_cnn), ("tiny_transformer", bad_tf)):
        text = text.replace(f'"{MODELS / model}.inputs.npz"', f'"{bad}"')
    path.write_text(text)
    code, _, err = _plan(path)
    assert code == 3 and err.count("config error") == 1, err
    assert f"{path}: [models] the inputs of 2 models do not fit" in err
    assert f"[models.tiny_cnn.inputs] {bad_cnn}: input 'image' is float64" in err
    assert f"[models.tiny_transformer.inputs] {bad_tf}: input 'attention_mask' (int64 [batch, seq]) is missing" in err



def test_an_evaluation_set_whose_labels_do_not_match_its_samples_fails_plan(make_project: Callable[..., Path]) -> None:
    """One label per sample, checked by `ortbuild plan` (headers and labels only) before anything is built, naming
    targets.toml, the key and the file; the same set with the right count plans."""
    path = _project(make_project)
    np.savez(path.parent / "eval.npz", image=np.zeros((6, 3, 32, 32), np.float32))
    np.save(path.parent / "labels.npy", np.zeros(5, np.int64))
    path.write_text(path.read_text() + '\n[models.tiny_cnn.eval]\ninputs = "eval.npz"\nlabels = "labels.npy"\n')
    code, _, err = _plan(path)
    assert code == 3, err
    assert (f"{path}: [models.tiny_cnn.eval.labels] labels.npy holds 5 labels, the inputs 6 samples" in err
            and "give one label per sample" in err), err
    assert not (path.parent / "dist").exists()  # nothing built
    np.save(path.parent / "labels.npy", np.zeros(6, np.int64))
    code, _, err = _plan(path)
    assert code == 0, err
