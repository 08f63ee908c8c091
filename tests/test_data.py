from __future__ import annotations

import io
import json
import math
import subprocess
import sys
import zipfile
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import numpy_helper

from ortbuild.errors import ConfigError
from ortbuild.pipeline.steps import check
from ortbuild.project import data
from tests.conftest import MODELS


def _write_dataset(root: Path, feeds: list[dict[str, np.ndarray]], named: bool = True) -> None:
    for i, feed in enumerate(feeds):
        d = root / f"test_data_set_{i}"
        d.mkdir(parents=True)
        for k, (name, arr) in enumerate(feed.items()):
            (d / f"input_{k}.pb").write_bytes(numpy_helper.from_array(arr, name if named else "").SerializeToString())


def test_npz_feed_matches_the_model_signature() -> None:
    sig = check.run(MODELS / "tiny_transformer.onnx").signature
    feed = data.load_feed(MODELS / "tiny_transformer.inputs.npz", ["input_ids", "attention_mask"])
    data.check_feed(feed, sig, "inputs.npz")
    assert feed["input_ids"].dtype == np.int64 and feed["input_ids"].shape == (4, 32)


def test_onnx_layout_directory_named_and_unnamed(tmp_path: Path) -> None:
    feed = {"image": np.ones((1, 3, 32, 32), np.float32)}
    _write_dataset(tmp_path / "named", [feed, feed])
    _write_dataset(tmp_path / "unnamed", [feed], named=False)
    assert data.load_feed(tmp_path / "named", ["image"])["image"].shape == (1, 3, 32, 32)
    assert list(data.load_feed(tmp_path / "unnamed", ["image"])) == ["image"]
    assert len(data.load_samples(tmp_path / "named", ["image"])) == 2


def test_npz_calibration_rows_become_batches_of_one() -> None:
    samples = data.load_samples(MODELS / "tiny_cnn.calib.npz", ["image"])
    assert len(samples) == 32 and samples[0]["image"].shape == (1, 3, 32, 32)


def test_mismatched_feeds_name_the_file_and_the_problem() -> None:
    sig = check.run(MODELS / "tiny_cnn.onnx").signature  # image: float32 [batch, 3, 32, 32]
    with pytest.raises(ConfigError, match=r"^f.npz: input 'image' \(float32 \[batch, 3, 32, 32\]\) is missing; 'x' "
                                          r"is not an input of the model") as err:
        data.check_feed({"x": np.zeros((1, 3, 32, 32), np.float32)}, sig, "f.npz")
    assert err.value.hint is not None and "the model's inputs are 'image' float32 [batch, 3, 32, 32]" in err.value.hint
    with pytest.raises(ConfigError, match="is float64, the model wants float32"):
        data.check_feed({"image": np.zeros((1, 3, 32, 32))}, sig, "f.npz")
    with pytest.raises(ConfigError, match="wants rank 4"):
        data.check_feed({"image": np.zeros((3, 32, 32), np.float32)}, sig, "f.npz")
    with pytest.raises(ConfigError, match=r"the model wants \[batch, 3, 32, 32\] \(dim 1 is 1, not 3\)"):
        data.check_feed({"image": np.zeros((2, 1, 32, 32), np.float32)}, sig, "f.npz")
    data.check_feed({"image": np.zeros((7, 3, 32, 32), np.float32)}, sig, "f.npz")  # a named dim: any size
    with pytest.raises(ConfigError) as err:  # with the declaration: targets.toml's key first, then the file
        data.check_feed({"image": np.zeros((1, 3, 32, 32))}, sig, "f.npz", config="targets.toml",
                        key="models.cnn.inputs")
    assert err.value.message == ("targets.toml: [models.cnn.inputs] f.npz: input 'image' is float64, the model "
                                 "wants float32")


def test_every_problem_of_a_feed_is_named_at_once() -> None:
    sig = check.run(MODELS / "tiny_transformer.onnx").signature  # input_ids, attention_mask: int64 [batch, seq]
    problems = data.inputs_problems({"input_id": ((4, 32), "int64"), "attention_mask": ((4,), "int32")}, sig)
    assert problems == ["input 'input_ids' (int64 [batch, seq]) is missing",
                        "'input_id' is not an input of the model (did you mean 'input_ids'?)",
                        "input 'attention_mask' is int32, the model wants int64",
                        "input 'attention_mask' has shape [4] (rank 1), the model wants rank 2 [batch, seq]"]


def test_golden_shapes_come_from_npz_headers_and_every_data_set(tmp_path: Path) -> None:
    golden = tmp_path / "g.npz"
    np.savez_compressed(golden, image=np.ones((4, 3, 32, 32), np.float32), ids=np.ones((2, 5), np.int64))
    assert data.golden_shapes(golden, ["image"]) == [
        (str(golden), {"image": ((4, 3, 32, 32), "float32"), "ids": ((2, 5), "int64")})]
    _write_dataset(tmp_path / "sets", [{"image": np.ones((1, 3), np.float32)}, {"image": np.ones((2, 3), np.float16)}],
                   named=False)
    assert data.golden_shapes(tmp_path / "sets", ["image"]) == [
        (str(tmp_path / "sets" / "test_data_set_0"), {"image": ((1, 3), "float32")}),
        (str(tmp_path / "sets" / "test_data_set_1"), {"image": ((2, 3), "float16")})]
    (tmp_path / "x.npy").write_bytes(b"\x93NUMPY" + bytes(100))
    with pytest.raises(ConfigError, match=r"is not an \.npz file \(a single \.npy array\)"):
        data.golden_shapes(tmp_path / "x.npy", ["image"])


def test_unreadable_files_are_config_errors(tmp_path: Path) -> None:
    bad = tmp_path / "bad.npz"
    bad.write_text("not a zip")
    with pytest.raises(ConfigError, match=r"is not an \.npz file \(not a zip archive\)"):
        data.load_feed(bad, ["image"])
    (tmp_path / "empty").mkdir()
    with pytest.raises(ConfigError, match="without test_data_set_N"):
        data.load_feed(tmp_path / "empty", ["image"])
    uneven = tmp_path / "uneven.npz"
    np.savez(uneven, a=np.zeros((3, 2)), b=np.zeros((4, 2)))
    with pytest.raises(ConfigError, match="different sample counts"):
        data.load_samples(uneven, ["a", "b"])


def test_signature_keeps_symbolic_dims() -> None:
    sig = check.signature(onnx.load(str(MODELS / "tiny_lstm.onnx")))
    assert sig["inputs"] == [{"name": "series", "dtype": "float32", "shape": ["batch", "steps", 8]}]


def _npz_of_zeros(path: Path, shape: tuple[int, ...], name: str = "x") -> Path:
    """An .npz whose one float32 array of `shape` is all zeros, written streaming (never whole in memory)."""
    header = io.BytesIO()
    np.lib.format.write_array_header_1_0(header, {"descr": "<f4", "fortran_order": False, "shape": shape})
    size, block = math.prod(shape) * 4, bytes(1 << 20)
    with zipfile.ZipFile(path, "w", compression=zipfile.ZIP_DEFLATED) as z, \
            z.open(f"{name}.npy", "w", force_zip64=True) as f:
        f.write(header.getvalue())
        for start in range(0, size, len(block)):
            f.write(block[:min(len(block), size - start)])
    return path


def test_an_npz_bomb_is_refused_from_its_headers_with_flat_memory(tmp_path: Path) -> None:
    """1 GiB of zeros in a 1 MB .npz: refused, naming the file and the member, before decompressing it (measured
    in a fresh process: numpy's import is most of its memory)."""
    bomb = _npz_of_zeros(tmp_path / "bomb.npz", (256, 1024, 1024), "input_ids")
    assert bomb.stat().st_size < 2 << 20
    # VmHWM, not ru_maxrss: Linux carries a forked child's ru_maxrss over from its parent (here, pytest)
    code = ("import sys\nfrom pathlib import Path\nfrom ortbuild.project import data\nfrom ortbuild.errors import "
            "ConfigError\ntry:\n    data.npz(Path(sys.argv[1]))\nexcept ConfigError as e:\n    print(e.message)\n"
            "print(next(int(x.split()[1]) for x in open('/proc/self/status') if x.startswith('VmHWM')) >> 10)\n")
    proc = subprocess.run([sys.executable, "-c", code, str(bomb)], capture_output=True, text=True, timeout=120)
    message, peak_mib = proc.stdout.strip().rsplit("\n", 1)
    assert "bomb.npz" in message and "member 'input_ids.npy'" in message and "zip bomb" in message, message
    assert int(peak_mib) < 160, f"peak RSS {peak_mib} MiB"


def test_npz_headers_are_checked_before_loading(tmp_path: Path) -> None:
    ok = tmp_path / "ok.npz"
    np.savez_compressed(ok, a=np.zeros((3, 4), np.float32), b=np.arange(5))
    assert data.npz_arrays(ok) == {"a": ((3, 4), np.dtype("float32")), "b": ((5,), np.dtype("int64"))}
    small_zeros = _npz_of_zeros(tmp_path / "zeros.npz", (64, 1024))  # compresses 1000x, but is small: fine
    assert data.npz(small_zeros)["x"].shape == (64, 1024)
    pickled = tmp_path / "objects.npz"
    np.savez(pickled, o=np.array([{"a": 1}], dtype=object))
    with pytest.raises(ConfigError, match=r"objects\.npz.*member 'o\.npy' holds Python objects"):
        data.npz(pickled)
    forged = tmp_path / "forged.npz"
    with zipfile.ZipFile(forged, "w") as z:
        header = io.BytesIO()
        np.lib.format.write_array_header_1_0(header, {"descr": "<f8", "fortran_order": False, "shape": (1 << 40,)})
        z.writestr("x.npy", header.getvalue() + bytes(64))
    with pytest.raises(ConfigError, match=r"member 'x\.npy' declares a \[1099511627776\] float64 array"):
        data.npz(forged)
    other = tmp_path / "other.npz"
    with zipfile.ZipFile(other, "w") as z:
        z.writestr("notes.txt", "hello")
    with pytest.raises(ConfigError, match=r"member 'notes\.txt' is not an \.npy array"):
        data.npz(other)


def test_golden_inputs_may_hold_nan_and_inf_calibration_data_may_not(tmp_path: Path) -> None:
    sig = {"inputs": [{"name": "x", "dtype": "float32", "shape": [2, 4]}]}
    x = np.array([[np.nan, 1.0, np.inf, -np.inf], [0.0, np.nan, 2.0, 3.0]], np.float32)
    data.check_feed({"x": x}, sig, "golden.npz")  # golden: accepted as they are
    calib = tmp_path / "calib.npz"
    np.savez(calib, x=x)
    with pytest.raises(ConfigError, match=r"calib\.npz: calibration input 'x' holds 4 NaN or infinite value\(s\) "
                                          r"of 8") as err:
        data.load_samples(calib, ["x"])
    assert err.value.hint and "golden inputs may hold them" in err.value.hint
    _write_dataset(tmp_path / "sets", [{"x": np.ones((2, 4), np.float32)}, {"x": x}])
    with pytest.raises(ConfigError, match=r"test_data_set_1: calibration input 'x' holds 4 NaN"):
        data.load_samples(tmp_path / "sets", ["x"])
    assert data.nonfinite(np.array([1, 2])) == 0 and data.nonfinite(np.array([np.nan, 1j * np.inf])) == 2


@pytest.mark.runtime
def test_a_model_tested_on_nan_and_inf_golden_inputs_builds_and_passes(tmp_path: Path) -> None:
    """ONNX's own IsNaN/IsInf cases: golden inputs full of NaN and Inf build and pass `ortbuild test`, with NaN
    and Inf flowing through to an output too (the comparison expects them exactly where the reference has them)."""
    from onnx import TensorProto, helper

    from tests.conftest import here_runtime, run_cli

    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 4])
    outputs = [helper.make_tensor_value_info("nan", TensorProto.BOOL, [2, 4]),
               helper.make_tensor_value_info("inf", TensorProto.BOOL, [2, 4]),
               helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 4])]
    two = numpy_helper.from_array(np.array(2.0, np.float32), "two")
    graph = helper.make_graph([helper.make_node("IsNaN", ["x"], ["nan"]), helper.make_node("IsInf", ["x"], ["inf"]),
                               helper.make_node("Mul", ["x", "two"], ["y"])], "nonfinite", [x], outputs, [two])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)
    onnx.checker.check_model(model, full_check=True)
    onnx.save_model(model, tmp_path / "m.onnx")
    np.savez(tmp_path / "m.inputs.npz",
             x=np.array([[np.nan, 1.0, np.inf, -np.inf], [0.0, np.nan, -2.5, np.inf]], np.float32))
    (tmp_path / "targets.toml").write_text(f"""[project]
name = "p"
version = "1"
[models.m]
path = "m.onnx"
inputs = "m.inputs.npz"
[targets.cpu]
runtime = "{here_runtime()}"
providers = ["CPUExecutionProvider"]
session = {{ intra_op_num_threads = 1 }}
""")
    proc = run_cli("test", "-c", str(tmp_path / "targets.toml"), "-j", "1", "--no-explain")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    report = json.loads((tmp_path / "dist" / "cpu" / "m" / "test-report.json").read_text())["result"]
    assert report["status"] == "PASS", report


def test_dimensions_of_minus_one_take_any_size() -> None:
    """Exporters (PaddlePaddle's among them) write -1 for a dimension of any size: no fixed size to check."""
    signature = {"inputs": [{"name": "x", "dtype": "float32", "shape": [-1, 3, -1, 48]}]}
    assert data.inputs_problems({"x": ((2, 3, 100, 48), np.dtype("float32"))}, signature) == []
    assert data.inputs_problems({"x": ((2, 3, 100, 40), np.dtype("float32"))}, signature) != []  # 48 is fixed
