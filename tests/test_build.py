"""The build orchestration: publish, reuse, failures, reproducibility, runtime isolation."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import pytest

from ortbuild.artifact import fit as artifact_fit
from ortbuild.artifact import keys
from ortbuild.errors import ConfigError, StepError
from ortbuild.pipeline.build import Builder
from ortbuild.pipeline.job import JobResult
from ortbuild.project import config, plan
from ortbuild.status import JobFinished, JobStatus

BUILT, FAILED, PORTABLE = JobStatus.BUILT, JobStatus.FAILED, JobStatus.PORTABLE
SKIPPED, UP_TO_DATE = JobStatus.SKIPPED, JobStatus.UP_TO_DATE


TWO_TARGETS = """
    [targets.fp32]
    runtime = "RUNTIME"
    providers = ["CPUExecutionProvider"]

    [targets.int8]
    extends = "fp32"
    precision = "int8-dynamic"
"""


def build(path: Path, dist: Path, force: bool = False, **sel: list[str]) -> list[JobResult]:
    project = config.load(path)
    return Builder(project, dist, force=force, secrets=keys.read_secrets(),
                   progress=lambda job, msg: None).run(plan.jobs(project, **sel))


@pytest.mark.runtime
def test_build_publishes_artifact_and_manifest(make_project: Callable[..., Path], tmp_path: Path) -> None:
    results = build(make_project(TWO_TARGETS, models=("tiny_cnn", "tiny_lstm")), tmp_path / "dist")
    assert [(r.target, r.model, r.status) for r in results] == [
        ("fp32", "tiny_cnn", BUILT), ("fp32", "tiny_lstm", BUILT),
        ("int8", "tiny_cnn", BUILT), ("int8", "tiny_lstm", BUILT)]
    folder = tmp_path / "dist" / "int8" / "tiny_lstm"
    assert sorted(p.name for p in folder.iterdir()) == ["loader", "manifest.json", "manifest.sig", "model.onnx.enc"]
    doc = json.loads((folder / "manifest.json").read_text())
    assert doc["status"] == "complete" and doc["precision"]["name"] == "int8-dynamic"
    assert doc["artifact"]["size"] == (folder / "model.onnx.enc").stat().st_size
    assert doc["encryption"]["algorithm"] == "AES-256-GCM" and doc["signing"]["algorithm"] == "Ed25519"
    assert doc["io"]["inputs"][0] == {"name": "series", "dtype": "float32", "shape": ["batch", "steps", 8]}
    assert doc["golden_run"]["outputs"] == [{"name": "forecast", "dtype": "float32", "shape": [4, 3]}]
    assert set(doc["versions"]) == {"ortbuild", "onnx", "onnxruntime"}
    assert {"cpu", "simd_level", "isa_flags"} <= set(doc["build_machine"])
    assert doc["optimization"]["requested"] == "all"


@pytest.mark.runtime
def test_unchanged_jobs_are_reused_and_changes_rebuild(make_project: Callable[..., Path], tmp_path: Path) -> None:
    path = make_project(TWO_TARGETS)
    dist = tmp_path / "dist"
    build(path, dist)
    assert {r.status for r in build(path, dist)} == {UP_TO_DATE}
    assert {r.status for r in build(path, dist, force=True)} == {BUILT}
    path.write_text(path.read_text().replace('precision = "int8-dynamic"', 'precision = "fp16"'))
    assert [r.status for r in build(path, dist)] == [UP_TO_DATE, BUILT]
    (dist / "fp32" / "tiny_cnn" / "model.onnx.enc").write_bytes(b"tampered")
    refused = build(path, dist)  # tampering is never repaired on its own (tests/test_trust.py: the full matrix)
    assert [r.status for r in refused] == [FAILED, UP_TO_DATE] and "TAMPERED" in refused[0].reason
    assert (dist / "fp32" / "tiny_cnn" / "model.onnx.enc").read_bytes() == b"tampered"


@pytest.mark.runtime
def test_reproducible_under_source_date_epoch(make_project: Callable[..., Path], tmp_path: Path,
                                              monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SOURCE_DATE_EPOCH", "1700000000")
    path = make_project(TWO_TARGETS, models=("tiny_transformer",))
    build(path, tmp_path / "a")
    build(path, tmp_path / "b")
    for t in ("fp32", "int8"):
        for name in ("model.onnx.enc", "manifest.json", "manifest.sig", "loader/ortbuild_tiny_transformer.py",
                     "loader/ortbuild_loader.mjs"):
            a = (tmp_path / "a" / t / "tiny_transformer" / name).read_bytes()
            assert a == (tmp_path / "b" / t / "tiny_transformer" / name).read_bytes(), (t, name)


@pytest.mark.runtime
def test_a_failing_job_names_its_step_and_publishes_nothing(make_project: Callable[..., Path],
                                                            tmp_path: Path) -> None:
    path = make_project(TWO_TARGETS, models=("tiny_cnn", "tiny_lstm"))
    # golden inputs of the wrong model: the CNN's inputs do not fit the LSTM
    path.write_text(path.read_text().replace("tiny_lstm.inputs.npz", "tiny_cnn.inputs.npz"))
    results = build(path, tmp_path / "dist", targets=["fp32"])
    assert [r.status for r in results] == [BUILT, FAILED]
    assert isinstance(results[1].error, ConfigError)
    assert "[models.tiny_lstm.inputs]" in results[1].reason  # the declaration, then the file and the input
    assert "input 'series' (float32 [batch, steps, 8]) is missing" in results[1].reason
    assert not (tmp_path / "dist" / "fp32" / "tiny_lstm").exists()


def test_a_tool_failure_becomes_a_step_error(make_project: Callable[..., Path], tmp_path: Path) -> None:
    import onnx
    from onnx import TensorProto, helper

    # an ONNX model the checker refuses (a file that is no ONNX model at all is a ConfigError naming it: test_cli)
    bad = tmp_path / "broken.onnx"
    x = helper.make_tensor_value_info("image", TensorProto.FLOAT, None)
    graph = helper.make_graph([helper.make_node("NoSuchOp", ["image"], ["y"])], "g", [x], [x])
    bad.write_bytes(helper.make_model(graph).SerializeToString())
    assert isinstance(onnx.load(bad), onnx.ModelProto)
    path = make_project(TWO_TARGETS)
    path.write_text(path.read_text().replace(str(Path(__file__).parent.parent / "models" / "tiny_cnn.onnx"),
                                             str(bad)))
    res = build(path, tmp_path / "dist", targets=["fp32"])[0]
    assert res.status == FAILED and isinstance(res.error, StepError)
    assert res.error.step == "check" and res.error.exit_code == 6
    assert "fp32/tiny_cnn: step 'check'" in res.error.message


def test_other_runtime_is_skipped_with_the_nox_command(make_project: Callable[..., Path], tmp_path: Path) -> None:
    path = make_project("""
        [targets.gpu]
        runtime = "onnxruntime-gpu==1.31.1"
        providers = ["CUDAExecutionProvider"]
    """)
    from ortbuild.installed import installed_flavor

    flavor = installed_flavor()
    assert flavor is not None
    if flavor.distribution == "onnxruntime-gpu":
        pytest.skip("this venv holds onnxruntime-gpu")
    res = build(path, tmp_path / "dist")[0]
    assert res.status == SKIPPED
    assert "nox -s 'build(gpu)'" in res.reason and not (tmp_path / "dist").exists()


@pytest.mark.runtime
def test_absent_provider_builds_portable(absent_provider_project: Path, tmp_path: Path) -> None:
    path = absent_provider_project
    res = build(path, tmp_path / "dist")[0]
    assert res.status == PORTABLE and "CoreMLExecutionProvider is not in onnxruntime" in res.reason
    doc = json.loads((tmp_path / "dist" / "mac" / "tiny_cnn" / "manifest.json").read_text())
    assert doc["status"] == "portable" and doc["optimization"]["applied"] == "basic"
    assert doc["optimization"]["portable"] and "CoreMLExecutionProvider" in doc["missing_providers"]


@pytest.mark.runtime
def test_nothing_is_written_outside_dist_and_the_private_temp_dir(make_project: Callable[..., Path],
                                                                  tmp_path: Path) -> None:
    """ORT's symbolic shape inference dumps models into the CWD when it fails (it does on the transformer)."""
    import os
    import subprocess
    import sys

    path = make_project(TWO_TARGETS, models=("tiny_transformer",))
    cwd, tmpdir = tmp_path / "cwd", tmp_path / "tmpdir"
    cwd.mkdir()
    tmpdir.mkdir()
    proc = subprocess.run([sys.executable, "-m", "ortbuild", "build", "-c", str(path), "--force"], cwd=cwd,
                          env={**os.environ, "TMPDIR": str(tmpdir)}, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr
    assert "symbolic shapes failed" in proc.stdout  # the failure that used to leak really happened
    assert list(cwd.iterdir()) == []
    # `import onnxruntime` writes a telemetry session id, $TMPDIR/.ses (microsoft/onnxruntime#32476): no model data
    left = {p.name: p.stat().st_size for p in tmpdir.iterdir()}
    assert set(left) <= {".ses"} and all(size < 200 for size in left.values()), left
    written = {p.relative_to(path.parent / "dist").as_posix() for p in (path.parent / "dist").rglob("*") if p.is_file()}
    assert written == {f"{t}/tiny_transformer/{f}" for t in ("fp32", "int8")
                       for f in ("model.onnx.enc", "manifest.json", "manifest.sig",
                                 "loader/ortbuild_tiny_transformer.py", "loader/ortbuild_loader.mjs",
                                 "loader/ortbuild_loader.d.ts",
                                 "loader/ortbuild_loader.web.mjs")} \
        | {".ortbuild.lock", ".ortbuild-dist"} | {f"logs/{t}/tiny_transformer.build.json" for t in ("fp32", "int8")} \
        | {f for f in written if f.startswith("logs/") and f.endswith(".build.log")}  # what ORT logged there


@pytest.mark.parametrize("setting,expect", [
    ('quantization = { op_types = ["Matmul"] }',
     "[targets.int8.quantization.op_types] 'Matmul' is not an ONNX op type (did you mean 'MatMul'?)"),
    ('quantization = { exclude_nodes = ["fc1"] }',
     "[targets.int8.quantization.exclude_nodes] the model has no node named 'fc1' (did you mean 'fc'?)"),
    ("free_dimensions = { btach = 1 }",
     "[targets.int8.free_dimensions.btach] no input of the model has a dimension named 'btach'"),
])
def test_names_the_tools_would_ignore_are_config_errors(make_project: Callable[..., Path], tmp_path: Path,
                                                       setting: str, expect: str) -> None:
    path = make_project(TWO_TARGETS + "    " + setting + "\n")
    res = build(path, tmp_path / "dist", targets=["int8"])[0]
    assert res.status == FAILED and isinstance(res.error, ConfigError)
    assert expect in res.error.message and res.error.exit_code == 3


@pytest.mark.runtime
def test_touching_calibration_data_rebuilds_only_that_models_int8_static_artifacts(
        make_project: Callable[..., Path], tmp_path: Path) -> None:
    import contextlib
    import io
    import shutil

    import numpy as np

    from ortbuild import cli
    from tests.conftest import MODELS

    calib = tmp_path / "cnn.calib.npz"
    shutil.copy(MODELS / "tiny_cnn.calib.npz", calib)
    path = make_project("""
        [targets.fp32]
        runtime = "RUNTIME"
        providers = ["CPUExecutionProvider"]

        [targets.static]
        extends = "fp32"
        precision = "int8-static"
        [[targets.static.overrides]]
        models = ["tiny_lstm"]
        precision = "int8-dynamic"
    """, models=("tiny_cnn", "tiny_lstm"), calibration=True)
    path.write_text(path.read_text().replace(str(MODELS / "tiny_cnn.calib.npz"), str(calib)))
    dist = tmp_path / "dist"
    assert {r.status for r in build(path, dist)} == {BUILT}
    with np.load(calib) as z:
        arrays = {k: z[k] * 0.9 for k in z.files}
    np.savez(calib, **arrays)
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        assert cli.main(["plan", "-c", str(path), "--dist", str(dist), "--json"]) == 0
    why = {f"{j['target']}/{j['model']}": j["why"] for j in json.loads(out.getvalue())}
    assert why == {"fp32/tiny_cnn": None, "fp32/tiny_lstm": None, "static/tiny_cnn": "changed: calibration",
                   "static/tiny_lstm": None}
    assert [(r.target, r.model, r.status) for r in build(path, dist)] == [
        ("fp32", "tiny_cnn", UP_TO_DATE), ("fp32", "tiny_lstm", UP_TO_DATE), ("static", "tiny_cnn", BUILT),
        ("static", "tiny_lstm", UP_TO_DATE)]


def test_the_build_key_names_each_input_so_a_runtime_change_rebuilds_only_its_target() -> None:
    from ortbuild.installed import Flavor
    from ortbuild.pipeline import buildkey as b

    project = config.load(Path(__file__).resolve().parent.parent / "targets.toml", check_files=False)
    job = plan.jobs(project, ["cpu-fp32"], ["tiny_cnn"])[0]
    sealing = {"encryption_key_id": "e", "signing_key_id": "s", "deterministic": False}
    here = {"plugins": {}, "libraries": []}
    src = {"source": "src"}
    a = b.build_key(b.key_parts(job, src, "in", None, Flavor("onnxruntime", "1.31.1"), {}, sealing, **here))
    c = b.build_key(b.key_parts(job, src, "in", None, Flavor("onnxruntime", "1.32.0"), {}, sealing, **here))
    assert a[0] != c[0] and b.changed_parts(a[1], c[1]) == ["runtime"]
    d = b.build_key(b.key_parts(job, src, "in", "calib", Flavor("onnxruntime", "1.31.1"), {}, sealing,
                                **here))
    assert d == a  # an fp32 job does not depend on calibration data


@pytest.mark.runtime
def test_parallel_builds_equal_serial_ones_and_a_failing_job_hides_nothing(make_project: Callable[..., Path],
                                                                           tmp_path: Path) -> None:
    path = make_project(TWO_TARGETS + """
    [[targets.int8.overrides]]
    models = ["tiny_lstm"]
    quantization = { exclude_nodes = ["no_such_node"] }
    """, models=("tiny_cnn", "tiny_lstm", "tiny_transformer"))
    results = {}
    for workers in (1, 2):
        p = config.load(path)
        res = Builder(p, tmp_path / f"dist{workers}", secrets=keys.read_secrets(),
                      progress=lambda job, msg: None).run(plan.jobs(p), workers)
        results[workers] = [(r.target, r.model, r.status, r.error.exit_code if r.error else 0) for r in res]
    assert results[1] == results[2]
    assert ("int8", "tiny_lstm", FAILED, 3) in results[2]
    assert sum(s == BUILT for _, _, s, _ in results[2]) == 5
    for workers in (1, 2):  # same artifacts: the same graphs and manifests up to timestamps and ciphertext
        docs = [json.loads(f.read_text()) for f in sorted((tmp_path / f"dist{workers}").glob("*/*/manifest.json"))]
        results[workers] = [(d["target"], d["model"], d["build_key"], d["golden_run"]) for d in docs]
    assert results[1] == results[2]


@pytest.mark.runtime
def test_openvino_plugin_target_ships_a_compiled_artifact_or_a_portable_one_that_its_loader_refuses(
        make_project: Callable[..., Path], tmp_path: Path) -> None:
    """The plugin EP end to end. Where it offers a CPU device (Intel): an EPContext artifact whose manifest says
    so, loaded by the generated loader with compilation disabled. Elsewhere: a portable artifact, the reason
    (Intel only, this CPU's vendor) in the result, and a loader that refuses it instead of running on the CPU."""
    pytest.importorskip("onnxruntime_ep_openvino", reason="the tests session installs the OpenVINO plugin EP")
    from ortbuild.artifact import loaders, manifest
    from ortbuild.installed import installed_flavor

    flavor = installed_flavor()
    if flavor is None or flavor.distribution != "onnxruntime":
        pytest.skip("the OpenVINO plugin EP plugs into the onnxruntime flavor")
    path = make_project("""
        [targets.ov]
        runtime = ["RUNTIME", "onnxruntime-ep-openvino==1.8.1"]
        providers = [{ name = "OpenVINOExecutionProvider", options = { device_type = "CPU" } }, "CPUExecutionProvider"]
        optimization = "all"
    """, models=("tiny_cnn", "breast_cancer_gb"))
    results = build(path, tmp_path / "dist")
    folder = tmp_path / "dist" / "ov" / "tiny_cnn"
    doc = json.loads((folder / "manifest.json").read_text())
    assert doc["plugins"]["OpenVINOExecutionProvider"]["package"] == "onnxruntime-ep-openvino"
    assert doc["plugins"]["OpenVINOExecutionProvider"]["version"] == "1.8.1"
    loader = loaders.import_python_loader(folder / "loader" / "ortbuild_tiny_cnn.py")
    fit = artifact_fit.problems(manifest.read(folder)[0])  # `ortbuild inspect` probes the plugin EP too
    if results[0].status == PORTABLE:
        assert "Intel" in results[0].reason and "vendor" in results[0].reason
        assert len(fit) == 1 and "ORT would fall back silently" in fit[0] and "Intel" in fit[0]
        assert doc["compiled"] is None and doc["status"] == "portable"
        with pytest.raises(loader.ProviderUnavailableError, match="offers no CPU device"):  # type: ignore[attr-defined]
            loader.load()  # type: ignore[attr-defined]
        return
    assert [r.status for r in results] == [BUILT, BUILT], [r.reason for r in results]
    assert doc["compiled"]["provider"] == "OpenVINOExecutionProvider" and doc["compiled"]["ep_context_nodes"] >= 1
    assert doc["session"]["config"]["session.disable_model_compile"] == "1"
    assert doc["optimization"]["tied_to"]["compiled_for"]["device"] == "CPU" and not doc["optimization"]["portable"]
    assert fit == []
    model = loader.load()  # type: ignore[attr-defined]
    assert "OpenVINOExecutionProvider" in model.providers
    tree = json.loads((tmp_path / "dist" / "ov" / "breast_cancer_gb" / "manifest.json").read_text())
    assert tree["compiled"] is None and any("compiled no node" in n for n in tree["notes"])


@pytest.mark.runtime
def test_an_external_data_model_is_hashed_signed_gated_and_rebuilt_by_every_file(
        make_project: Callable[..., Path], tmp_path: Path) -> None:
    import contextlib
    import hashlib
    import io

    from ortbuild import cli
    from tests.bigmodels import mlp

    src = mlp(tmp_path / "mlp", layers=3, width=128)
    data = src.parent / "model.onnx.data"
    path = make_project(TWO_TARGETS, models=("tiny_cnn",))
    path.write_text(path.read_text() + f'\n[models.mlp]\npath = "{src}"\ninputs = "{src.parent / "inputs.npz"}"\n'
                    '[[targets.int8.overrides]]\nmodels = ["mlp"]\nquantization = { preprocess = false }\n')
    dist = tmp_path / "dist"
    assert {r.status for r in build(path, dist)} == {BUILT}
    folder = dist / "int8" / "mlp"
    assert sorted(p.name for p in folder.glob("model.*")) == ["model.onnx.data.enc", "model.onnx.enc"]
    doc = json.loads((folder / "manifest.json").read_text())
    assert doc["source"]["files"] == [
        {"file": "model.onnx", "sha256": hashlib.sha256(src.read_bytes()).hexdigest(), "size": src.stat().st_size},
        {"file": "model.onnx.data", "sha256": hashlib.sha256(data.read_bytes()).hexdigest(),
         "size": data.stat().st_size}]
    assert doc["source"]["size"] == src.stat().st_size + data.stat().st_size
    assert doc["artifact"]["external_data"] == "the source model keeps its weights as external data"
    assert [f["role"] for f in doc["artifact"]["files"]] == ["model", "external_data"]
    # the tools read the source in place (fp32) or through links in the private dir: nothing lands beside it
    assert sorted(p.name for p in src.parent.iterdir()) == ["inputs.npz", "model.onnx", "model.onnx.data"]
    shown = io.StringIO()
    with contextlib.redirect_stdout(shown):
        assert cli.main(["inspect", str(folder)]) == 0
    assert "+ model.onnx.data" in shown.getvalue()
    assert f"sha256 {doc['source']['files'][1]['sha256'][:16]}..." in shown.getvalue()
    assert "weights    external data (model.onnx.data): the source model keeps" in shown.getvalue()
    # the size gate compares every file with every file (it compared the artifact with the 1 KB graph)
    assert cli.main(["test", "-c", str(path), "--dist", str(dist), "-t", "fp32", "-m", "mlp"]) == 0
    report = json.loads((dist / "fp32" / "mlp" / "test-report.json").read_text())
    assert report["result"]["status"] == "PASS", report["result"]

    with open(data, "r+b") as f:  # one byte of one weight
        f.seek(4096 + 7)
        byte = f.read(1)
        f.seek(4096 + 7)
        f.write(bytes([byte[0] ^ 1]))
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        assert cli.main(["plan", "-c", str(path), "--dist", str(dist), "--json"]) == 0
    why = {f"{j['target']}/{j['model']}": j["why"] for j in json.loads(out.getvalue())}
    assert why == {"fp32/tiny_cnn": None, "int8/tiny_cnn": None,
                   "fp32/mlp": "changed: source:model.onnx.data", "int8/mlp": "changed: source:model.onnx.data"}
    assert [(r.target, r.model, r.status) for r in build(path, dist)] == [
        ("fp32", "tiny_cnn", UP_TO_DATE), ("fp32", "mlp", BUILT), ("int8", "tiny_cnn", UP_TO_DATE),
        ("int8", "mlp", BUILT)]


@pytest.mark.runtime
def test_no_plaintext_weight_bytes_outside_the_private_dir_during_or_after_an_external_data_build(
        tmp_path: Path) -> None:
    import os
    import subprocess
    import sys
    import threading

    from tests.bigmodels import mlp, needles, plaintext_hits
    from tests.conftest import here_runtime

    src = mlp(tmp_path / "src" / "mlp", layers=4, width=256)
    root, cwd, tmpdir = tmp_path / "p", tmp_path / "cwd", tmp_path / "tmp"
    for d in (root, cwd, tmpdir):
        d.mkdir()
    (root / "targets.toml").write_text(
        f'[project]\nname = "t"\nversion = "1"\n[models.mlp]\npath = "{src}"\n'
        f'inputs = "{src.parent / "inputs.npz"}"\n[targets.fp32]\nruntime = "{here_runtime()}"\n'
        'providers = ["CPUExecutionProvider"]\noptimization = "basic"\n'
        '[targets.ext]\nextends = "fp32"\nexternal_data = true\nencrypt = true\n')
    pieces = needles(src.parent / "model.onnx.data")
    env = {**os.environ, "TMPDIR": str(tmpdir)}
    seen: list[str] = []
    done = threading.Event()

    def watch() -> None:  # at any point of the build: dist/, the cwd and $TMPDIR hold no plaintext
        while not done.wait(0.05):
            seen.extend(plaintext_hits([root / "dist", cwd, tmpdir], pieces)[0] if (root / "dist").exists() else [])

    watcher = threading.Thread(target=watch)
    watcher.start()
    try:
        proc = subprocess.run([sys.executable, "-m", "ortbuild", "build", "-c", str(root / "targets.toml")], cwd=cwd,
                              env=env, capture_output=True, text=True, timeout=600)
    finally:
        done.set()
        watcher.join()
    assert proc.returncode == 0, proc.stderr[-3000:]
    folder = root / "dist" / "fp32" / "mlp"
    script = (f"import sys; sys.path.insert(0, {str(folder / 'loader')!r}); import ortbuild_mlp; "
              "ortbuild_mlp.load()")
    subprocess.run([sys.executable, "-I", "-c", script], cwd=cwd, env=env, check=True, timeout=300)
    hits, scanned = plaintext_hits([root, cwd, tmpdir], pieces)
    assert not hits and not seen, hits + seen
    assert scanned > 2 * (src.parent / "model.onnx.data").stat().st_size  # both artifacts' weights were scanned
    assert set(os.listdir(tmpdir)) <= {".ses"}
    left = [d for d in Path("/dev/shm").glob("ortbuild-*") if plaintext_hits([d], pieces)[0]]
    assert not left, left  # no private dir of this build survives it


@pytest.mark.runtime
def test_an_unencrypted_target_publishes_the_plain_model_signed(make_project: Callable[..., Path],
                                                                tmp_path: Path) -> None:
    import hashlib

    import onnx

    path = make_project(TWO_TARGETS.split("[targets.int8]")[0] + "    encrypt = false\n")
    dist = tmp_path / "dist"
    assert [r.status for r in build(path, dist)] == [BUILT]
    folder = dist / "fp32" / "tiny_cnn"
    doc = json.loads((folder / "manifest.json").read_text())
    assert doc["encryption"] is None and doc["artifact"]["files"][0]["name"] == "model.onnx"
    assert doc["artifact"]["sha256"] == hashlib.sha256((folder / "model.onnx").read_bytes()).hexdigest()
    onnx.checker.check_model(onnx.load(str(folder / "model.onnx")))
    assert [r.status for r in build(path, dist)] == [UP_TO_DATE]


@pytest.mark.runtime
def test_inputs_the_model_cannot_run_fail_the_reload_naming_the_inputs_file_and_shapes(tmp_path: Path) -> None:
    """PaddleOCR's text detector on a 300x300 image: its feature maps are added back up at every 1/2 scale, so the
    sides must be multiples of 32; `plan` accepts the free dimensions, ONNX Runtime fails at the first run."""
    import numpy as np

    from tests.conftest import here_runtime, run_cli
    from tests.realmodels import installed
    from tests.test_e2e import PACKAGE, PINNED

    det = installed(PACKAGE, "ch_PP-OCRv4_det_infer.onnx", PINNED["ch_PP-OCRv4_det_infer.onnx"])
    np.savez(tmp_path / "page.npz", x=np.random.default_rng(0).random((1, 3, 300, 300), dtype=np.float32))
    path = tmp_path / "targets.toml"
    path.write_text(f"""
[project]
name = "ocr"
version = "1"

[models.det]
path = "{det}"
inputs = "page.npz"

[targets.cpu-fp32]
runtime = "{here_runtime()}"
providers = ["CPUExecutionProvider"]
""")
    res = build(path, tmp_path / "dist")[0]
    assert res.status == FAILED and isinstance(res.error, StepError) and res.error.step == "reload"
    assert res.error.message.startswith(
        "cpu-fp32/det: step 'reload': ONNX Runtime could not run the model on the golden inputs of [models.det] "
        f"inputs ({tmp_path / 'page.npz'}), fed x float32 [1, 3, 300, 300]: [ONNXRuntimeError]")
    assert "Attempting to broadcast an axis by a dimension other than 1. 19 by 20" in res.error.message  # ORT's
    assert res.error.hint is not None and "multiples of 32" in res.error.hint
    assert not (tmp_path / "dist" / "cpu-fp32" / "det").exists()
    proc = run_cli("test", "-c", str(path), "--json", cwd=tmp_path)  # the test's FAIL row says it, hint included
    failures = json.loads(proc.stdout)["results"][0]["failures"]
    assert proc.returncode == StepError.exit_code and "golden inputs of [models.det] inputs" in failures[0]
    assert failures[1].startswith("hint: check that the inputs fit the model")


@pytest.mark.parametrize("command, says", [
    ("build", "up to date (unchanged build key; --force rebuilds)"),
    ("test", 'up to date (unchanged build key; to rebuild it: ortbuild build --force -t fp32 -m tiny_cnn, or '
             'nox -s "build(fp32)" -- --force -m tiny_cnn)'),
])
@pytest.mark.runtime
def test_an_up_to_date_job_says_how_to_rebuild_it_from_the_command_that_built(
        make_project: Callable[..., Path], tmp_path: Path, command: str, says: str) -> None:
    """`ortbuild test` and `profile` have no --force: they name the build that rebuilds."""
    path = make_project(TWO_TARGETS)
    build(path, tmp_path / "dist", targets=["fp32"])
    project = config.load(path)
    said: list[str] = []
    Builder(project, tmp_path / "dist", secrets=keys.read_secrets(), command=command,
            progress=lambda job, event: said.append(event.text()) if isinstance(event, JobFinished) else None).run(
        plan.jobs(project, ["fp32"]))
    assert said == [says]
