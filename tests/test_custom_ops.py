"""Custom-operator libraries end to end: a model using onnxruntime-extensions' `ai.onnx.contrib` Inverse builds,
passes its gates and loads through the generated Python loader (in a clean interpreter); the library is pinned by
sha256 in the manifest and the loader; the path form ships the library beside the artifact; the Node loader
refuses; bad `custom_ops` entries are config errors."""

from __future__ import annotations

import hashlib
import json
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, numpy_helper
from onnx import helper as h

from ortbuild.artifact import loaders
from tests.conftest import here_runtime, run_cli

EXTENSIONS = "onnxruntime-extensions==0.15.2"
ext = pytest.importorskip("onnxruntime_extensions", reason=f"nox installs {EXTENSIONS} in the test sessions")


def contrib_model(folder: Path) -> np.ndarray:
    """relu(inverse(x) @ W), Inverse from onnxruntime-extensions' ai.onnx.contrib domain; returns the input."""
    rng = np.random.default_rng(0)
    w = (rng.standard_normal((4, 4)) / 2).astype(np.float32)
    graph = h.make_graph([h.make_node("Inverse", ["x"], ["inv"], domain="ai.onnx.contrib", name="inverse"),
                          h.make_node("MatMul", ["inv", "W"], ["y"], name="project"),
                          h.make_node("Relu", ["y"], ["out"], name="relu")], "contrib_inverse",
                         [h.make_tensor_value_info("x", TensorProto.FLOAT, [4, 4])],
                         [h.make_tensor_value_info("out", TensorProto.FLOAT, [4, 4])],
                         [numpy_helper.from_array(w, "W")])
    model = h.make_model(graph, opset_imports=[h.make_opsetid("", 17), h.make_opsetid("ai.onnx.contrib", 1)])
    model.ir_version = 8
    onnx.save(model, str(folder / "inverse.onnx"))
    x = (np.eye(4) * 2 + rng.standard_normal((4, 4)) * 0.3).astype(np.float32)
    np.savez(folder / "inverse.inputs.npz", x=x)
    return np.maximum(np.linalg.inv(x.astype(np.float64)) @ w, 0)


def _project(tmp_path: Path, model_ops: str = f'["{EXTENSIONS}"]', target: str = "") -> Path:
    path = tmp_path / "targets.toml"
    path.write_text(f"""[project]
name = "co"
version = "1"

[models.inverse]
path = "inverse.onnx"
inputs = "inverse.inputs.npz"
custom_ops = {model_ops}

[targets.cpu]
runtime = "{here_runtime()}"
providers = ["CPUExecutionProvider"]
{target}""")
    return path


def _load_in_clean_python(folder: Path, prelude: str = "") -> subprocess.CompletedProcess[str]:
    """Import the generated loader in a fresh interpreter (ortbuild not imported) and run the golden input."""
    code = f"""{prelude}
import importlib.util, json, sys, numpy as np
spec = importlib.util.spec_from_file_location("loader", {str(loaders.python_path(folder, folder.name))!r})
mod = importlib.util.module_from_spec(spec); spec.loader.exec_module(mod)
try:
    model = mod.load()
except mod.LoaderError as e:
    print(json.dumps({{"error": type(e).__name__, "code": e.code, "message": str(e)}})); sys.exit(0)
x = np.load({str(folder.parent.parent.parent / "inverse.inputs.npz")!r})["x"]
mods = sorted(m for m in sys.modules if m.startswith("ortbuild"))
print(json.dumps({{"out": model.run({{"x": x}})["out"].tolist(), "modules": mods}}))
"""
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)


@pytest.mark.runtime
def test_a_model_with_an_extensions_operator_builds_tests_and_loads(tmp_path: Path) -> None:
    expected = contrib_model(tmp_path)
    path = _project(tmp_path)
    proc = run_cli("test", "-c", str(path), "--json")
    assert proc.returncode == 0, proc.stderr[-3000:]
    (result,) = json.loads(proc.stdout)["results"]
    assert result["status"] == "PASS" and result["accuracy"] == "PASS"
    folder = tmp_path / "dist" / "cpu" / "inverse"
    doc = json.loads((folder / "manifest.json").read_text())
    library = Path(ext.get_library_path())
    assert doc["custom_ops"] == [{"name": "onnxruntime-extensions", "version": "0.15.2",
                                  "module": "onnxruntime_extensions", "library": library.name,
                                  "sha256": hashlib.sha256(library.read_bytes()).hexdigest()}]
    assert "custom_ops" in doc["build_inputs"]
    # the Python loader registers the library itself, in a process without ortbuild
    out = _load_in_clean_python(folder)
    assert out.returncode == 0, out.stderr[-2000:]
    got = json.loads(out.stdout)
    assert got["modules"] == [] and np.allclose(got["out"], expected, rtol=1e-4, atol=1e-5)
    # ... and refuses, clearly, where the package is missing
    out = _load_in_clean_python(folder, "import sys; sys.modules['onnxruntime_extensions'] = None")
    err = json.loads(out.stdout)
    assert err["code"] == "custom_ops" and "pip install onnxruntime-extensions==0.15.2" in err["message"]
    # the Node loader cannot register custom-op libraries: the manifest says so, and its load() refuses
    node = next(lf for lf in doc["loaders"] if lf["language"] == "node")
    assert not node["runs_target"] and "cannot register custom-op libraries" in node["note"]
    assert "throw new CustomOpsError" in (folder / loaders.LOADER_DIR / loaders.NODE).read_text()
    # the profile runs it through the loader too
    prof = run_cli("profile", "-c", str(path), "--json")
    assert prof.returncode == 0, prof.stderr[-2000:]
    assert "Inverse" in {r["op_type"] for r in json.loads(prof.stdout)["results"][0]["operators"]}


@pytest.mark.runtime
def test_without_the_library_the_model_does_not_load(tmp_path: Path) -> None:
    contrib_model(tmp_path)
    proc = run_cli("build", "-c", str(_project(tmp_path, "[]")))
    assert proc.returncode == 6  # ORT: ai.onnx.contrib:Inverse is not a registered op
    assert "Inverse" in proc.stderr and "not a registered function/op" in proc.stderr


@pytest.mark.runtime
def test_a_library_path_ships_beside_the_artifact_pinned_by_sha256(tmp_path: Path) -> None:
    expected = contrib_model(tmp_path)
    (tmp_path / "libs").mkdir()
    shutil.copy(ext.get_library_path(), tmp_path / "libs" / "libortextensions.so")
    path = _project(tmp_path, "[]", 'custom_ops = ["libs/libortextensions.so"]\n')  # the target's key
    proc = run_cli("test", "-c", str(path))
    assert proc.returncode == 0, proc.stderr[-3000:]
    folder = tmp_path / "dist" / "cpu" / "inverse"
    (entry,) = json.loads((folder / "manifest.json").read_text())["custom_ops"]
    assert entry["file"] == "custom_ops/libortextensions.so" and entry["version"] == "" and "module" not in entry
    shipped = folder / entry["file"]
    assert hashlib.sha256(shipped.read_bytes()).hexdigest() == entry["sha256"]
    out = _load_in_clean_python(folder)
    assert out.returncode == 0 and np.allclose(json.loads(out.stdout)["out"], expected, rtol=1e-4, atol=1e-5)
    # a release bundles the library with the artifact; verify runs the golden test through the bundle's loader
    proc = run_cli("release", "-c", str(path), "--to", str(tmp_path / "rel"))
    assert proc.returncode == 0, proc.stderr[-2000:]
    proc = run_cli("verify", str(tmp_path / "rel" / "cpu"))
    assert proc.returncode == 0 and "golden       inverse: PASS" in proc.stdout, proc.stdout + proc.stderr
    # a swapped library is refused before ONNX Runtime loads it, and the build says the artifact was modified
    blob = shipped.read_bytes()
    shipped.write_bytes(blob[:-1] + bytes([blob[-1] ^ 1]))
    err = json.loads(_load_in_clean_python(folder).stdout)
    assert err["code"] == "custom_ops" and "is not the custom-op library" in err["message"]
    proc = run_cli("build", "-c", str(path))  # TAMPERED: refused, replaced only on --repair
    assert proc.returncode == 7 and "custom-op library custom_ops/libortextensions.so" in proc.stderr
    assert hashlib.sha256(shipped.read_bytes()).hexdigest() != entry["sha256"]
    proc = run_cli("build", "-c", str(path), "--repair")
    assert proc.returncode == 0 and "custom-op library custom_ops/libortextensions.so" in proc.stdout
    assert hashlib.sha256(shipped.read_bytes()).hexdigest() == entry["sha256"]  # rebuilt


@pytest.mark.parametrize(("ops", "message"), [
    ('["onnxruntime-extensions"]', "must pin one exact version with =="),
    ('["onnxruntime-extensions>=0.15"]', "must pin one exact version with =="),
    ('["libs/nowhere.so"]', "custom-op library 'libs/nowhere.so' does not exist"),
    ('["not a requirement!"]', "is neither a pip requirement nor a library path"),
])
def test_bad_custom_ops_are_config_errors(tmp_path: Path, ops: str, message: str) -> None:
    contrib_model(tmp_path)
    proc = run_cli("plan", "-c", str(_project(tmp_path, ops)))
    assert proc.returncode == 3, proc.stderr
    assert "models.inverse.custom_ops" in proc.stderr and message in proc.stderr


def test_precisions_whose_tools_open_their_own_sessions_are_refused(tmp_path: Path) -> None:
    contrib_model(tmp_path)
    proc = run_cli("plan", "-c", str(_project(tmp_path, target='precision = "int8-dynamic"\n')))
    assert proc.returncode == 3 and "targets.cpu.quantization.preprocess" in proc.stderr
    ok = _project(tmp_path, target='precision = "int8-dynamic"\nquantization = { preprocess = false }\n')
    assert run_cli("plan", "-c", str(ok)).returncode == 0
    static = _project(tmp_path, target='precision = "int8-static"\n')
    static.write_text(static.read_text().replace('inputs = "inverse.inputs.npz"\n',
                                                 'inputs = "inverse.inputs.npz"\ncalibration = "inverse.inputs.npz"\n'))
    proc = run_cli("plan", "-c", str(static))
    assert proc.returncode == 3 and "int8-static cannot calibrate" in proc.stderr


def test_the_target_environment_needs_the_package(tmp_path: Path) -> None:
    contrib_model(tmp_path)
    path = _project(tmp_path, '["onnxruntime-extensions==0.14.0"]')
    proc = run_cli("targets", "-c", str(path), "--json")
    (row,) = json.loads(proc.stdout)
    assert not row["runtime_here"] and "onnxruntime-extensions==0.14.0" in row["why_not"]
    assert row["runtime"].endswith("onnxruntime-extensions==0.14.0")  # nox installs it with the runtime
