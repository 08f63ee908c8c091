"""The nox sessions are generated from targets.toml: one build and one test session per target, tagged."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from ortbuild.project import config
from tests.conftest import REPO


def _sessions(*args: str) -> list[dict[str, object]]:
    proc = subprocess.run([sys.executable, "-m", "nox", "-l", "--json", *args], cwd=REPO, capture_output=True,
                          text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    out: list[dict[str, object]] = json.loads(proc.stdout)
    return out


def test_one_build_and_one_test_session_per_target_with_tags() -> None:
    every = config.load(REPO / "targets.toml").targets
    targets = [t for t in every if every[t].kind == "onnx"]  # the generative ones have their own sessions
    assert {s["name"] for s in _sessions()} == {"test"}  # the default: `nox` alone builds and tests
    sessions = _sessions("-s", "build", "test")  # --json lists the selected sessions only
    builds = [s for s in sessions if s["name"] == "build"]
    assert [s["session"] for s in builds] == [f"build({t})" for t in targets]
    assert [s["session"] for s in sessions if s["name"] == "test"] == [f"test({t})" for t in targets]
    profiles = [s["session"] for s in _sessions("-s", "profile")]
    assert profiles == [f"profile({t})" for t in targets]
    tags = {s["session"]: s["tags"] for s in builds}
    assert tags["build(openvino-cpu)"] == ["openvino", "fp32"]
    assert "int8" in tags["build(cpu-int8)"] and "tensorrt" in tags["build(tensorrt-fp16)"]
    # generative targets: out of `nox -s build/test/profile/release`, in their own sessions under the generative tag
    llms = [t for t in every if every[t].kind == "generative"]
    assert llms, "the committed targets.toml has generative targets"
    generative = [s["session"] for s in _sessions("-t", "generative")]
    assert generative == ["example-llm", *(f"{kind}-generative({t})" for kind in ("build", "test", "release")
                                           for t in llms), "tests-generative"]


def test_tag_and_keyword_selection() -> None:
    selected = [s["session"] for s in _sessions("-t", "openvino")]  # --json lists the selected only
    assert selected == ["build(openvino-cpu)", "test(openvino-cpu)", "profile(openvino-cpu)", "release(openvino-cpu)"]
    selected = [s["session"] for s in _sessions("-k", "int8 and not arm64 and not mobile and not llm and not x86")]
    assert selected == ["build(cpu-int8)", "test(cpu-int8)", "profile(cpu-int8)", "release(cpu-int8)"]
    selected = [s["session"] for s in _sessions("-t", "linux-aarch64")]  # a platform is a tag
    assert selected == [f"{kind}({t})" for kind in ("build", "test", "profile", "release")
                        for t in ("arm64-int8", "mobile-int8")]
    selected = [s["session"] for s in _sessions("-t", "x86-64-v3")]  # an x86-64 level too
    assert selected == ["build(x86-v3-int8)", "test(x86-v3-int8)", "profile(x86-v3-int8)", "release(x86-v3-int8)"]
    checks = {s["session"] for s in _sessions("-t", "check")}
    assert checks == {"lint", "tests", "tests-openvino"}
    # tuning is one session that no tag or keyword of a target selects: it never rebuilds what a run just tested
    assert [s["session"] for s in _sessions("-s", "tune")] == ["tune"]


def test_a_runtime_that_cannot_be_installed_is_skipped_with_the_reason(make_project: Callable[..., Path],
                                                                      tmp_path: Path) -> None:
    config_file = make_project("""
        [targets.ancient]
        runtime = "onnxruntime==0.1.0"
        providers = ["CPUExecutionProvider"]
    """)
    proc = subprocess.run([sys.executable, "-m", "nox", "--envdir", str(tmp_path / "envs"), "-s", "build(ancient)"],
                          cwd=REPO, capture_output=True, text=True, timeout=300,
                          env={**os.environ, "ORTBUILD_CONFIG": str(config_file)})
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "skipped: ancient: its runtime 'onnxruntime==0.1.0' cannot be installed on this machine" in proc.stderr
    assert not (tmp_path / "dist").exists()  # nothing built for the CPU in its place


class _Session:
    """Just what the release session uses of a nox session: each run is recorded, `ortbuild release --json`
    answers a clean release."""

    def __init__(self, envdir: Path) -> None:
        from types import SimpleNamespace

        self._runner = SimpleNamespace(global_config=SimpleNamespace(envdir=str(envdir)))
        self.posargs: list[str] = []
        self.runs: list[tuple[str, ...]] = []

    def run(self, *args: str, **_: object) -> str:
        self.runs.append(args)
        return '{\n "exit_code": 0, "released": [], "refused": [], "warnings": []}' if "release" in args else ""

    def log(self, *_: object) -> None:
        pass

    warn = log

    def error(self, message: str) -> None:
        raise AssertionError(message)

    skip = error


@pytest.fixture(scope="module")
def noxfile() -> Any:
    """ortbuild's nox sessions as the repository's noxfile.py imports them (importing registers them)."""
    import ortbuild.nox

    return ortbuild.nox


@pytest.mark.parametrize("configured", [False, True])
def test_the_release_session_allows_development_keys_only_with_its_own(
        noxfile: Any, configured: bool, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import nox.sessions

    target = "cpu-fp32"
    ortbuild = Path(nox.sessions._normalize_path(str(tmp_path / "envs"), f"target-{target}")) / "bin" / "ortbuild"
    ortbuild.parent.mkdir(parents=True)
    ortbuild.touch()  # "tested here"
    monkeypatch.setattr(noxfile, "DEV_KEYS", tmp_path / "dev-keys")
    monkeypatch.setattr(noxfile, "_skipped_here", lambda t, gates=False: None)
    for var in noxfile.KEY_VARS:
        monkeypatch.delenv(var, raising=False)
    if configured:  # the release's own keys: a development key among them is refused, never allowed
        monkeypatch.setenv("ORTBUILD_SIGNING_KEY_FILE", str(tmp_path / "keys" / "signing.key"))
    session = _Session(tmp_path / "envs")
    noxfile.release.func(session, target)
    release = next(r for r in session.runs if "release" in r)
    assert ("--allow-development-key" in release) is not configured, release
    assert any("keygen" in r and "--dev" in r for r in session.runs) is not configured  # its own DEV_KEYS made


def test_the_test_session_passes_its_arguments_to_ortbuild_test(noxfile: Any, tmp_path: Path,
                                                                monkeypatch: pytest.MonkeyPatch) -> None:
    """`nox -s test -- --gates accuracy`: what follows `--` reaches `ortbuild test` in the target's venv."""
    target = "cpu-fp32"
    venv = tmp_path / "envs" / "target-cpu-fp32"
    monkeypatch.setattr(noxfile, "_target_env", lambda session, t, required_fails=False: (
        noxfile.PROJECT.targets[t], venv))
    monkeypatch.setattr(noxfile, "keys_env", lambda session, v: {})
    monkeypatch.setattr(noxfile, "_skipped_here", lambda t, gates=False: None)
    monkeypatch.setattr(noxfile, "_SUMMARIES", ["test"])  # no summary registered at exit
    session = _Session(tmp_path / "envs")
    session.posargs = ["--gates", "accuracy"]
    noxfile.test.func(session, target)
    (run,) = session.runs
    assert run[0] == str(venv / "bin" / "ortbuild") and run[1] == "test"
    assert run[-2:] == ("--gates", "accuracy") and ("-t", target) == run[4:6], run


def test_a_broken_targets_toml_fails_the_target_sessions(tmp_path: Path) -> None:
    """Not 'skipped: no parameters' with exit 0: a script's `nox -s test && nox -s release` must stop here."""
    broken = tmp_path / "targets.toml"
    broken.write_text((REPO / "targets.toml").read_text().replace('optimization = "all"', 'optimisation = "all"', 1))
    for session in ("test", "release", "build"):
        proc = subprocess.run([sys.executable, "-m", "nox", "--envdir", str(tmp_path / "envs"), "-s", session],
                              cwd=REPO, capture_output=True, text=True, timeout=120,
                              env={**os.environ, "ORTBUILD_CONFIG": str(broken)})
        assert proc.returncode != 0, proc.stderr[-2000:]
        assert f"{session}(invalid-config) aborted" in proc.stderr and "did you mean 'optimization'" in proc.stderr
    assert not (tmp_path / "dist").exists()


@pytest.mark.parametrize(("origin", "wanted"), [
    ({"url": "file:///WHEEL", "archive_info": {}}, ["WHEEL"]),
    ({"url": "file:///DIR", "dir_info": {"editable": True}}, ["-e", "DIR"]),
    ({"url": "file:///DIR", "dir_info": {}}, ["DIR"]),
    ({"url": "https://example.org/ortbuild.git", "vcs_info": {"vcs": "git", "commit_id": "abc123"}},
     ["ortbuild @ https://example.org/ortbuild.git@abc123"]),
    ({"url": "file:///gone/ortbuild-0.1.0-py3-none-any.whl", "archive_info": {}}, None),  # gone: the index's
    ({}, None),
])
def test_target_venvs_get_the_ortbuild_nox_runs_with(noxfile: Any, monkeypatch: pytest.MonkeyPatch, tmp_path: Path,
                                                    origin: dict[str, Any], wanted: list[str] | None) -> None:
    from ortbuild import __version__, installed

    wheel, folder = tmp_path / "ortbuild-0.1.0-py3-none-any.whl", tmp_path / "src"
    wheel.write_bytes(b"zip")
    folder.mkdir()
    origin = json.loads(json.dumps(origin).replace("/WHEEL", str(wheel)).replace("/DIR", str(folder)))
    monkeypatch.delenv("ORTBUILD_REQUIREMENT", raising=False)
    monkeypatch.setattr(installed, "_checkout", lambda: None)
    monkeypatch.setattr(installed, "_origin", lambda: origin)
    expected = [a.replace("WHEEL", str(wheel)).replace("DIR", str(folder)) for a in wanted or []]
    assert installed.ortbuild_requirement()[0] == (expected or [f"ortbuild=={__version__}"])


def test_a_missing_ortbuild_requirement_fails_the_session_naming_it(tmp_path: Path, make_project: Any) -> None:
    config_file = make_project("""
        [targets.t]
        runtime = "RUNTIME"
        providers = ["CPUExecutionProvider"]
    """)
    for given, said in (("/nope/ortbuild-9.whl", "ORTBUILD_REQUIREMENT=/nope/ortbuild-9.whl: no such file"),
                        ("ortbuild==99.0", "ortbuild could not be installed into")):
        proc = subprocess.run([sys.executable, "-m", "nox", "--envdir", str(tmp_path / "envs"), "-s", "test(t)"],
                              cwd=REPO, capture_output=True, text=True, timeout=600,
                              env={**os.environ, "ORTBUILD_CONFIG": str(config_file), "ORTBUILD_REQUIREMENT": given})
        assert proc.returncode != 0 and said in proc.stderr, proc.stderr[-3000:]
        assert "skipped" not in proc.stderr.lower()  # a failure, never a green skip


def test_ortbuild_nox_sets_the_defaults_it_documents(noxfile: Any) -> None:
    """nox's own defaults are virtualenv and reuse "no": importing ortbuild.nox makes them uv and "yes"."""
    import nox

    assert nox.options.default_venv_backend == "uv|virtualenv" and nox.options.reuse_venv == "yes"
    assert nox.options.sessions == ["test"]


@pytest.fixture(scope="module")
def repo_noxfile() -> dict[str, Any]:
    """The repository's noxfile.py, run once (running it registers its sessions)."""
    import runpy

    return runpy.run_path(str(REPO / "noxfile.py"))


WORKERS = str(len(os.sched_getaffinity(0)) + 1)
PARALLEL = ["-n", WORKERS, "--dist", "loadfile", "--no-loadscope-reorder", "-m", "(x) and not serial"]


@pytest.mark.parametrize(("posargs", "expected"), [
    ([], [PARALLEL, ["-m", "(x) and serial"]]),
    (["--parallel", "-n", "1"], [[*PARALLEL, "-n", "1"]]),
    (["--serial"], [["-m", "(x) and serial"]]),
    (["-k", "gate"], [["-k", "gate"]]),
])
def test_the_check_sessions_run_one_pass_on_request(repo_noxfile: dict[str, Any], posargs: list[str],
                                                    expected: list[list[str]], tmp_path: Path) -> None:
    """`nox -s tests -- --parallel` (or `--serial`): that pass alone, the rest of the arguments added to it (CI
    runs the sessions' parallel passes side by side, then the serial ones alone); other arguments replace both."""
    pytest_ = repo_noxfile["_pytest"]
    session = _Session(tmp_path)
    session.posargs = posargs
    pytest_(session, "x")
    assert all(r[:4] == ("python", "-m", "pytest", "-q") for r in session.runs), session.runs
    assert [[a for a in r[4:] if a != "-rs"] for r in session.runs] == expected, session.runs
    session.runs.clear()  # without a serial pass (tests-openvino): the parallel one, or nothing on --serial
    pytest_(session, "x", serial=False)
    assert [[a for a in r[4:] if a != "-rs"] for r in session.runs] == [
        e for e in expected if "(x) and serial" not in e], session.runs
