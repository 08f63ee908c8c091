"""The ortbuild command line, run as a user runs it (a subprocess), exit codes included."""

from __future__ import annotations

import base64
import json
from collections.abc import Callable
from pathlib import Path

import pytest

from ortbuild import installed
from tests.conftest import MODELS, REPO, run_cli

CPU_TARGET = """
    [targets.cpu]
    runtime = "RUNTIME"
    providers = ["CPUExecutionProvider"]
    precision = "int8-static"
"""


@pytest.fixture
def built(make_project: Callable[..., Path]) -> Path:
    path = make_project(CPU_TARGET, calibration=True)
    proc = run_cli("build", "-c", str(path), "-v")
    assert proc.returncode == 0, proc.stderr
    assert "[cpu/tiny_cnn] precision int8-static" in proc.stderr  # progress per step, with -v
    assert "1 built, 0 up-to-date, 0 portable, 0 skipped, 0 failed" in proc.stdout  # the summary
    return path.parent / "dist" / "cpu" / "tiny_cnn"


def test_build_json(make_project: Callable[..., Path]) -> None:
    path = make_project(CPU_TARGET, calibration=True)
    proc = run_cli("build", "-c", str(path), "--json")
    doc = json.loads(proc.stdout)
    assert proc.returncode == 0 and doc["exit_code"] == 0
    assert doc["jobs"][0]["status"] == "built" and doc["jobs"][0]["precision"] == "int8-static"
    assert set(doc["jobs"][0]["steps"]) == {"check", "precision", "optimize", "compile", "reload", "encrypt", "loaders",
                                              "package", "integrity", "loader"}
    assert proc.stderr == ""  # --json is quiet on stderr


def test_inspect_ok_then_tampered(built: Path) -> None:
    proc = run_cli("inspect", str(built))
    assert proc.returncode == 0 and "OK         signature and every signed file verified" in proc.stdout
    assert "int8-static" in proc.stdout and "image: float32 ['batch', 3, 32, 32]" in proc.stdout
    art = built / "model.onnx.enc"
    art.write_bytes(art.read_bytes()[:-10] + bytes(10))
    proc = run_cli("inspect", str(art))
    assert proc.returncode == 7 and "TAMPERED   artifact file model.onnx.enc: piece 1 of 2 differs" in proc.stdout


def test_inspect_warns_when_the_artifact_does_not_fit(built: Path) -> None:
    doc = json.loads((built / "manifest.json").read_text())
    doc["optimization"]["tied_to"]["simd_level"] = "x86_64-sse"
    (built / "manifest.json").write_text(json.dumps(doc))
    proc = run_cli("inspect", str(built))  # an edited manifest no longer matches its signature
    assert proc.returncode == 7 and "TAMPERED" in proc.stderr and "the signature of" in proc.stderr
    from ortbuild.artifact import keys

    sign = keys.signing_key()
    assert sign is not None
    (built / "manifest.sig").write_bytes(base64.b64encode(sign.sign((built / "manifest.json").read_bytes())))
    proc = run_cli("inspect", str(built))
    assert proc.returncode == 0 and "WARNING    does not fit this environment: built with a x86_64-sse" in proc.stdout
    assert run_cli("inspect", "--strict", str(built)).returncode == 7


def test_inspect_a_plain_model_and_a_missing_path() -> None:
    proc = run_cli("inspect", str(MODELS / "tiny_lstm.onnx"))
    assert proc.returncode == 0 and "input  series: float32 ['batch', 'steps', 8]" in proc.stdout
    proc = run_cli("inspect", "nowhere/manifest.json")
    assert proc.returncode == 7 and "no such file" in proc.stderr


@pytest.mark.parametrize("what", ["a text file", "a directory", "a foreign manifest.json"])
def test_inspect_of_what_is_no_artifact_says_so_without_a_rebuild_hint(tmp_path: Path, what: str) -> None:
    path = {"a text file": tmp_path / "passwd", "a directory": tmp_path / "d",
            "a foreign manifest.json": tmp_path / "web" / "manifest.json"}[what]
    if what == "a directory":
        path.mkdir()
    else:
        path.parent.mkdir(exist_ok=True)
        path.write_text('{"name": "a web app", "icons": []}' if path.suffix == ".json" else "root:x:0:0:root\n")
    for key in ([], ["--public-key", str(tmp_path / "no.pub")]):  # with a key, nothing is checked against it
        proc = run_cli("inspect", str(path), *key)
        assert proc.returncode == 7 and f"{path}: not an artifact" in proc.stderr, proc.stderr
        assert "TAMPERED" not in proc.stderr + proc.stdout and "--repair" not in proc.stderr
        assert "rebuild" not in proc.stderr and "Traceback" not in proc.stderr


def test_inspect_of_a_broken_manifest_beside_its_signature_is_tampered_not_foreign(built: Path) -> None:
    (built / "manifest.json").write_text("garbage")
    proc = run_cli("inspect", str(built))
    assert proc.returncode == 7 and "TAMPERED" in proc.stderr and "not an artifact" not in proc.stderr


@pytest.mark.parametrize("command, args, says", [
    ("build", ["-j", "0"], "argument -j/--jobs: 0: at least 1 job"),
    ("build", ["-j", "-3"], "argument -j/--jobs: -3: at least 1 job"),
    ("build", ["--jobs", "two"], "argument -j/--jobs: 'two' is not a whole number of jobs"),
    ("build", ["--lock-timeout", "nan"], "argument --lock-timeout: nan: a finite number of seconds, 0 or more"),
    ("build", ["--lock-timeout", "-5"], "argument --lock-timeout: -5: a finite number of seconds, 0 or more"),
    ("build", ["--lock-timeout", "inf"], "argument --lock-timeout: inf: a finite number of seconds"),
    ("build", ["--lock-timeout", "soon"], "argument --lock-timeout: 'soon' is not a number of seconds"),
    ("test", ["-j", "0"], "argument -j/--jobs: 0: at least 1 job"),
    ("profile", ["--lock-timeout", "nan"], "argument --lock-timeout: nan: a finite number of seconds"),
])
def test_jobs_and_lock_timeout_out_of_range_are_usage_errors(make_project: Callable[..., Path], command: str,
                                                             args: list[str], says: str) -> None:
    path = make_project(CPU_TARGET, calibration=True)
    proc = run_cli(command, "-c", str(path), *args)
    assert proc.returncode == 2 and says in proc.stderr, proc.stderr
    assert not (path.parent / "dist").exists()  # refused before anything ran


@pytest.mark.parametrize("command", [["clean"], ["rekey", "dist", "--new-key-file", "k"], ["release"]])
def test_lock_timeout_is_checked_on_every_command_that_takes_it(command: list[str]) -> None:
    proc = run_cli(*command, "--lock-timeout", "-1")
    assert proc.returncode == 2 and "a finite number of seconds, 0 or more" in proc.stderr, proc.stderr


def test_jobs_and_lock_timeout_in_range_are_taken() -> None:
    from ortbuild import cli

    args = cli.parser().parse_args(["build", "-j", "1", "--lock-timeout", "0"])
    assert args.jobs == 1 and args.lock_timeout == 0.0
    assert cli.parser().parse_args(["test", "--lock-timeout", "2.5"]).lock_timeout == 2.5


def _other_runtime() -> str:
    """A runtime requirement that this environment's ONNX Runtime flavor does not satisfy."""
    flavor = installed.installed_flavor()
    assert flavor is not None
    return "onnxruntime-openvino==1.24.1" if flavor.distribution != "onnxruntime-openvino" else "onnxruntime==1.31.1"


def test_explicit_target_in_the_wrong_runtime_exits_4(make_project: Callable[..., Path]) -> None:
    other = _other_runtime()
    path = make_project(f"""
        [targets.here]
        runtime = "RUNTIME"
        providers = ["CPUExecutionProvider"]
        optimization = "disable"

        [targets.elsewhere]
        runtime = "{other}"
        providers = ["CPUExecutionProvider"]
    """)
    proc = run_cli("build", "-c", str(path))
    assert proc.returncode == 0 and "SKIPPED" in proc.stdout  # all targets, one fits: report and go on
    proc = run_cli("build", "-c", str(path), "-t", "elsewhere")
    assert proc.returncode == 4 and 'nox -s "build(elsewhere)"' in proc.stderr
    assert run_cli("build", "-c", str(path), "-t", "else*").returncode == 4  # named through a glob
    proc = run_cli("plan", "-c", str(path), "--json")
    assert [j["buildable_here"] for j in json.loads(proc.stdout)] == [True, False]


def test_a_run_that_can_build_nothing_fails_with_the_fix(make_project: Callable[..., Path]) -> None:
    other = _other_runtime()
    path = make_project(f"""
        [targets.elsewhere]
        runtime = "{other}"
        providers = ["CPUExecutionProvider"]
    """)
    for command in ("build", "test"):
        proc = run_cli(command, "-c", str(path))
        assert proc.returncode == 4, proc.stderr
        assert f"nothing to {command} here" in proc.stderr and f"python3 -m nox -s {command}" in proc.stderr
        assert f"pip install {other}" in proc.stderr and "Traceback" not in proc.stderr


def test_strict_fails_on_portable_builds(absent_provider_project: Path) -> None:
    path = absent_provider_project
    assert run_cli("build", "-c", str(path)).returncode == 0
    shown = run_cli("inspect", str(path.parent / "dist" / "mac" / "tiny_cnn")).stdout
    assert "(portable)" in shown and "missing    CoreMLExecutionProvider at build time: " in shown
    proc = run_cli("build", "-c", str(path), "--strict", "--force")
    assert proc.returncode == 5 and "PORTABLE: CoreMLExecutionProvider is not in onnxruntime" in proc.stdout
    proc = run_cli("build", "-c", str(path), "--strict")  # reused, but still only portable
    assert proc.returncode == 5 and "0 built, 0 up-to-date, 1 portable" in proc.stdout


def test_unknown_target_selection(make_project: Callable[..., Path]) -> None:
    path = make_project(CPU_TARGET, calibration=True)
    proc = run_cli("build", "-c", str(path), "-t", "cpv")
    assert proc.returncode == 3 and "no target matches 'cpv' (did you mean 'cpu'?)" in proc.stderr


def test_targets_and_schema_and_version(make_project: Callable[..., Path]) -> None:
    path = make_project(CPU_TARGET, calibration=True)
    rows = json.loads(run_cli("targets", "-c", str(path), "--json").stdout)
    assert rows[0]["target"] == "cpu" and rows[0]["providers_here"] is True
    assert json.loads(run_cli("schema").stdout)["title"] == "ortbuild targets.toml"
    assert run_cli("--version").stdout.startswith("ortbuild ")
    usage = run_cli("build", "--nope")
    assert usage.returncode == 2 and "unrecognized arguments" in usage.stderr


def test_targets_providers_prints_the_capability_table_with_this_machines_answers() -> None:
    """docs/targets.md's example command, and its JSON: every EP of the table, the CPU running here, the
    unsupported ones refused with the message config gives."""
    from ortbuild.project import capabilities

    doc = (REPO / "docs" / "targets.md").read_text()
    (command,) = [line.removeprefix("$ ortbuild ") for line in doc.splitlines() if line.startswith("$ ortbuild")]
    shown = run_cli(*command.split())
    assert shown.returncode == 0, shown.stderr
    assert "runs here" in shown.stdout and "XnnpackExecutionProvider" in shown.stdout
    rows = {r["provider"]: r for r in json.loads(run_cli("targets", "--providers", "--json").stdout)}
    assert set(rows) == {p for c in capabilities.CAPABILITIES for p in c.providers}
    assert rows["CPUExecutionProvider"]["here"] and rows["CPUExecutionProvider"]["why_not"] is None
    cuda = rows["CUDAExecutionProvider"]
    assert not cuda["here"] and "CUDAExecutionProvider" in cuda["why_not"]
    assert rows["NnapiExecutionProvider"]["why_not"] == capabilities.unsupported("NnapiExecutionProvider")
    ov = rows["OpenVINOExecutionProvider"]
    assert ov["here"] or "Intel" in ov["why_not"] or "not in" in ov["why_not"]


def test_a_reader_that_closes_the_pipe_early_ends_ortbuild_quietly() -> None:
    """`ortbuild matrix | head -1`: no traceback, no internal error, the exit status of a process SIGPIPE ended
    (or 0 where everything fit in the pipe before the reader left)."""
    import os
    import subprocess
    import sys

    # the read end closed before ortbuild writes a byte: every write meets a closed pipe (EPIPE)
    r, w = os.pipe()
    proc = subprocess.Popen([sys.executable, "-m", "ortbuild", "matrix", "-c", str(REPO / "targets.toml")],
                            stdout=w, stderr=subprocess.PIPE, text=True)
    os.close(w)
    os.close(r)
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 141, err
    assert err == ""
    # as a user types it: head reads one line and exits
    shell = subprocess.run(["bash", "-o", "pipefail", "-c", f"{sys.executable} -m ortbuild matrix -c "
                            f"{REPO / 'targets.toml'} | head -1"], capture_output=True, text=True, timeout=120)
    assert shell.returncode in (0, 141) and shell.stdout == "{\n", shell.stdout
    assert "Traceback" not in shell.stderr and "internal error" not in shell.stderr and "Broken" not in shell.stderr


@pytest.mark.parametrize("content, says", [
    (b"hello, I am a text file\n", "is not an ONNX model (it looks like a text file): protobuf cannot parse it"),
    (b"location = a text file that mentions external data\n", "is not an ONNX model (it looks like a text file)"),
    (b"\x08\x07", "it parses as protobuf, but holds no ONNX graph"),
    (b"version https://git-lfs.github.com/spec/v1\noid sha256:0\nsize 1\n", "is a Git LFS pointer"),
])
def test_a_file_that_is_no_onnx_model_is_named_with_what_to_do(tmp_path: Path, content: bytes, says: str) -> None:
    from tests.conftest import here_runtime

    (tmp_path / "m.onnx").write_bytes(content)
    (tmp_path / "targets.toml").write_text(f"""[project]
name = "p"
version = "1"
[models.m]
path = "m.onnx"
inputs = "{MODELS / 'tiny_cnn.inputs.npz'}"
[targets.cpu]
runtime = "{here_runtime()}"
providers = ["CPUExecutionProvider"]
""")
    proc = run_cli("build", "-c", str(tmp_path / "targets.toml"), "-j", "1")
    assert proc.returncode == 3, proc.stdout + proc.stderr  # a configuration error, not a failed build step
    assert f"{tmp_path / 'm.onnx'}: " in proc.stderr and says in proc.stderr, proc.stderr
    assert "hint: " in proc.stderr and "Traceback" not in proc.stderr
