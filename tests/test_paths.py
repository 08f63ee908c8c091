"""Names and paths: nothing escapes dist/, inputs are regular files of sane size, every refusal is clear."""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path

import pytest

from ortbuild import paths
from ortbuild.errors import ConfigError
from ortbuild.project import config
from tests.conftest import MODELS, here_runtime, run_cli

ESCAPING = ["/tmp/x", "..", ".", "../../y", "a/b", "a\\b", "", " cpu", "-rf", ".hidden", "x" * 65, "nul\0byte",
            "café", "release", "report.json"]


@pytest.mark.parametrize("name", ESCAPING)
@pytest.mark.parametrize("kind", ["models", "targets"])
def test_names_that_are_not_identifiers_are_refused_and_nothing_is_written(tmp_path: Path, kind: str,
                                                                           name: str) -> None:
    model, target = (name, "cpu") if kind == "models" else ("m", name)
    esc = name.replace("\\", "\\\\").replace("\0", "\\u0000")
    (tmp_path / "targets.toml").write_text(f"""
[project]
name = "p"
version = "1"
[models."{esc if kind == "models" else model}"]
path = "{MODELS / 'tiny_cnn.onnx'}"
inputs = "{MODELS / 'tiny_cnn.inputs.npz'}"
[targets."{esc if kind == "targets" else target}"]
runtime = "{here_runtime()}"
providers = ["CPUExecutionProvider"]
""")
    before = set(Path("/tmp").iterdir())
    proc = run_cli("build", "-c", str(tmp_path / "targets.toml"), cwd=tmp_path)
    assert proc.returncode == 3, proc.stderr
    assert "name" in proc.stderr and "Traceback" not in proc.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == ["targets.toml"]  # no dist/, no lock
    assert {p for p in set(Path("/tmp").iterdir()) - before if p.name == "x"} == set()


def test_written_paths_stay_inside_the_output_directory(tmp_path: Path) -> None:
    dist = tmp_path / "dist"
    assert paths.inside(dist, "cpu", "m") == dist / "cpu" / "m"
    for parts in (("..", "x"), ("/etc", "passwd"), ("a", "../../b")):
        with pytest.raises(paths.UnsafePath, match="outside the output directory"):
            paths.inside(dist, *parts)
    dist.mkdir()
    (dist / "cpu").symlink_to(tmp_path.parent)  # a symlink leading out is refused too
    with pytest.raises(paths.UnsafePath):
        paths.inside(dist, "cpu", "m")


def _project(tmp_path: Path, model_path: str, inputs: str | None = None) -> Path:
    f = tmp_path / "targets.toml"
    f.write_text(f"""
[project]
name = "p"
version = "1"
[models.m]
path = "{model_path}"
inputs = "{inputs or MODELS / 'tiny_cnn.inputs.npz'}"
[targets.cpu]
runtime = "{here_runtime()}"
providers = ["CPUExecutionProvider"]
""")
    return f


def test_input_paths_must_be_regular_files_of_sane_size(tmp_path: Path) -> None:
    fifo = tmp_path / "pipe.onnx"
    os.mkfifo(fifo)
    (tmp_path / "empty.onnx").write_bytes(b"")
    cases = {
        "/dev/zero": "is a character device, not a regular file",
        str(fifo): "is a FIFO (named pipe), not a regular file",
        # a directory is a generative model's (Hugging Face format): this one is no such directory
        str(tmp_path): "has no config.json (a Hugging Face-format model directory",
        str(tmp_path / "empty.onnx"): "is empty",
        "x" * 300 + ".onnx": "a path component is 305 bytes long",
        "/" + "d/" * 2100 + "m.onnx": "characters long (at most 4096)",
        str(tmp_path / "missing.onnx"): "does not exist",
    }
    for model_path, says in cases.items():
        with pytest.raises(ConfigError, match=r"models\.m\.path") as err:
            config.load(_project(tmp_path, model_path))  # returns at once: /dev/zero and the FIFO are never read
        assert says in err.value.message, (model_path[:40], err.value.message)
    with pytest.raises(ConfigError, match="is a character device") as err:
        config.load(_project(tmp_path, str(MODELS / "tiny_cnn.onnx"), inputs="/dev/zero"))
    assert "models.m.inputs" in err.value.message


def test_the_size_limits_are_checked_before_reading(tmp_path: Path) -> None:
    big = tmp_path / "big.npz"
    with big.open("wb") as f:  # sparse: no disk used
        f.truncate(paths.MAX_DATA_BYTES + 1)
    assert "GiB" in (paths.input_problem(big, limit=paths.MAX_DATA_BYTES) or "")


@pytest.mark.parametrize("name", ["cpu-fp32", "resnet50-v1.5", "m", "A_1", "x" * 64])
def test_ordinary_names_are_accepted(name: str) -> None:
    assert paths.name_problem(name) is None


def test_bad_golden_inputs_are_clear_config_errors(make_project: Callable[..., Path], tmp_path: Path) -> None:
    import numpy as np

    from ortbuild.project import data

    npy = tmp_path / "a.npz"
    np.save(tmp_path / "a.npy", np.zeros(3))
    (tmp_path / "a.npy").rename(npy)
    with pytest.raises(ConfigError, match=r"is not an \.npz file \(a single \.npy array\)"):
        data.npz(npy)
    text = tmp_path / "t.npz"
    text.write_text("hello")
    with pytest.raises(ConfigError, match=r"not a zip archive"):
        data.npz(text)
    nan = tmp_path / "nan.npz"
    np.savez(nan, image=np.full((1, 3, 32, 32), np.nan, np.float32))
    sig = {"inputs": [{"name": "image", "dtype": "float32", "shape": [1, 3, 32, 32]}]}
    data.check_feed(data.npz(nan), sig, str(nan))  # golden inputs may hold NaN/Inf; calibration data may not
    with pytest.raises(ConfigError, match="3072 NaN or infinite value"):
        data.load_samples(nan, ["image"])


@pytest.mark.parametrize("name,module", [
    ("tiny_cnn", "ortbuild_tiny_cnn"), ("resnet-50.v2", "ortbuild_resnet_50_v2"), ("3d", "ortbuild_3d"),
    ("class", "ortbuild_class"), ("A" * 64, "ortbuild_" + "A" * 64)])
def test_every_model_name_gives_a_python_loader_module_that_is_an_identifier(name: str, module: str) -> None:
    import keyword

    assert paths.NAME_RE.fullmatch(name) and paths.loader_module(name) == module
    assert module.isidentifier() and not keyword.iskeyword(module)
