"""The examples in docs/*.md are run, like the README's (tests/test_readme.py): every `$ ortbuild ...` line
succeeds in a project built from the committed targets.toml, the Python and Node.js examples run against a
built artifact, and every TOML fragment loads through the config (merged into a minimal project that has the
example models). Examples that need what a test machine lacks are listed in SKIPPED with the reason; an
example that is neither run nor listed fails `test_every_example_is_run_or_listed`, so a new one cannot go
untested by accident.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path
from typing import Any

import pytest

from ortbuild.project import config
from tests.conftest import MODELS, REPO, here_runtime, run_cli
from tests.test_loaders import install_node_app

DOCS = REPO / "docs"

NOX = "makes a virtualenv per target and installs its runtime from the package index (nox + uv)"
OCI = "needs an OCI registry at localhost:5000"
GENERATIVE = "needs torch, transformers and onnxruntime-genai (a generative target's venv) and the example LLM"
SKIPPED: dict[tuple[str, str], str] = {
    ("benchmarks.md", "nox -s benchmark"): "a benchmark: minutes of measurement in per-target virtualenvs",
    ("benchmarks.md", "python tests/benchmarks/bench_fusion.py"): "a benchmark: minutes of measurement",
    ("benchmarks.md", "python tests/benchmarks/bench_cache.py"): "a benchmark: two fresh clones with their venvs and "
                                                                  "a registry, minutes",
    ("benchmarks.md", "python tests/benchmarks/bench_tune.py"): "a benchmark: minutes of measurement, and a model "
                                                                 "fetched from PyPI",
    ("benchmarks.md", "ortbuild build --force -t llm-"): "a benchmark of generative targets: " + GENERATIVE,
    ("benchmarks.md", "ortbuild test -t llm-"): "a benchmark of generative targets: " + GENERATIVE,
    ("benchmarks.md", "python tests/benchmarks/bench_genai_load.py"): "a benchmark: " + GENERATIVE,
    ("benchmarks.md", "python -m onnxruntime_genai.models.builder"): "a benchmark: " + GENERATIVE,
    ("diagnose.md", "python3 -m nox"): NOX,
    ("generative.md", "python3 -m nox -t generative"): GENERATIVE + "; " + NOX,
    ("gpu-results.md", "python3 -m nox"): "needs an NVIDIA GPU with CUDA and TensorRT (and " + NOX + ")",
    ("gpu-results.md", "cat dist/report.json"): "the report of the GPU run above",
    ("release.md", "python3 -m nox"): NOX,
    ("release.md", "ortbuild release -t cpu-fp32 --to oci://"): OCI,
    ("release.md", "ortbuild verify oci://"): OCI,
    ("release.md", "ortbuild pull oci://"): OCI,
    ("release.md", "minisign "): "needs the minisign tool (not a dependency) and a release bundle",
    ("release.md", "oras pull "): "the ORAS CLI (not packaged here): " + OCI,
    ("release.md", "skopeo copy "): ("needs skopeo and an OCI registry at localhost:5000 "
                                       "(tests/test_modelpack.py runs it)"),
    ("release.md", "ortbuild verify pulled/"): "the files pulled above (tests/test_modelpack.py verifies them)",
    ("testing.md", "nox -s"): NOX,
    ("testing.md", "python3 -m nox -t check"): "the project's own checks, run by `nox -t check` itself (CI)",
    ("testing.md", "ORTBUILD_DURATIONS_WRITE=1 python3 -m nox"): "the project's own sessions (minutes each); the "
                                                               "recording is run by tests/test_durations.py",
}
# Commands checked by their own test below rather than in the example project.
OWN_TEST = {("ci.md", "ortbuild matrix -t cuda-fp16 --cache oci://ghcr.io/acme/models-cache"): "test_ci_matrix_example"}
# docs/project.md's walk from an empty directory to a release: run in order, as written, by tests/test_project.py
OWN_TEST.update({("project.md", cmd): "tests/test_project.py" for cmd in (
    "mkdir encoder '&&' cd encoder", "cp /path/to/paraphrase-MiniLM-L3-v2.onnx .",
    "python3 -m venv .venv '&&' . .venv/bin/activate",
    "pip install /path/to/ortbuild-0.1.0-py3-none-any.whl onnxruntime==1.31.1",
    "ortbuild init", "python -m nox -s test", "python -m nox -s release",
    "ortbuild verify dist/release/cpu-int8 --public-key .ortbuild/dev-keys/signing.pub --no-run")})
# release.md's OpenSSF verification: the real model_signing CLI (in a venv made with that pip command) and
# `ortbuild verify` with model-signing.pub, on a real release
OWN_TEST.update({("release.md", cmd): "tests/test_openssf.py" for cmd in (
    "pip install model-signing==1.1.1 pyopenssl==26.4.0",
    "model_signing verify key dist/release/cpu-fp32 --signature dist/release/cpu-fp32/model.sig --public_key "
    "keys/model-signing.pub",
    "ortbuild verify dist/release/cpu-fp32 --public-key keys/model-signing.pub")})
# Languages whose blocks are examples (text and yaml blocks are output, trees and workflow files).
RUNNABLE = ("console", "sh", "python", "js", "toml")


def _blocks(doc: str, lang: str) -> list[str]:
    return re.findall(rf"^```{lang}\n(.*?)^```", (DOCS / doc).read_text(), flags=re.S | re.M)


def _commands(block: str) -> list[str]:
    """The commands of a console/sh block: its `$ ` lines when it has any (the rest is output), else every
    line; trailing comments dropped."""
    lines = [line for line in block.splitlines() if line.strip()]
    if any(line.startswith("$ ") for line in lines):
        lines = [line.removeprefix("$ ") for line in lines if line.startswith("$ ")]
    return [shlex.join(shlex.split(line, comments=True)) for line in lines]


def _skip_reason(doc: str, command: str) -> str | None:
    return next((why for (d, prefix), why in SKIPPED.items() if d == doc and command.startswith(prefix)), None)


def _all_commands() -> list[tuple[str, str]]:
    return [(path.name, cmd) for path in sorted(DOCS.glob("*.md")) for lang in ("console", "sh")
            for block in _blocks(path.name, lang) for cmd in _commands(block)]


def _example_commands() -> list[tuple[str, str]]:
    """Each command to run, once (a page may show the same command in several places)."""
    return list(dict.fromkeys((doc, cmd) for doc, cmd in _all_commands()
                              if _skip_reason(doc, cmd) is None and (doc, cmd) not in OWN_TEST))


def test_every_example_is_run_or_listed() -> None:
    langs = {m for path in DOCS.glob("*.md") for m in re.findall(r"^```(\w+)\n", path.read_text(), flags=re.M)}
    assert langs - {"text", "yaml"} <= set(RUNNABLE), f"a block language this test does not handle: {langs}"
    for doc, cmd in _example_commands():
        assert cmd.startswith("ortbuild "), f"{doc}: `{cmd}` is neither run here nor listed in SKIPPED"
    for key in SKIPPED:
        assert any(_skip_reason(doc, cmd) == SKIPPED[key] and doc == key[0] for doc, cmd in _all_commands()), (
            f"SKIPPED lists {key}, which no example matches any more")
    for doc, cmd in OWN_TEST:
        assert (doc, cmd) in _all_commands(), f"{doc} no longer shows `{cmd}`"


# ---------------------------------------------------------------------------------------------------------
# the example project: the committed targets.toml, runnable here, with the artifacts the examples use built


@pytest.fixture(scope="module")
def project(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("docs")
    (root / "models").symlink_to(MODELS)
    (root / "targets.toml").write_text((REPO / "targets.toml").read_text().replace("onnxruntime==1.31.1",
                                                                                    here_runtime()))
    # what the examples open without building it first (`ortbuild test` builds what is missing itself)
    proc = run_cli("build", "-t", "cpu-fp32", "-t", "cpu-int8", "-m", "tiny_cnn", cwd=root)
    assert proc.returncode == 0, proc.stderr[-3000:]
    proc = run_cli("build", "-t", "cpu-fp32", "-m", "tiny_lstm", cwd=root)  # the second model of loaders.md
    assert proc.returncode == 0, proc.stderr[-3000:]
    for _ in range(2):  # a dist/report.json and the dist/report.previous.json it replaced (accuracy only: 1.6 s,
        # not 8: the pages' own `ortbuild test` commands measure the latency gates and load scenarios)
        proc = run_cli("test", "-t", "cpu-int8", "-m", "tiny_cnn", "--gates", "accuracy", cwd=root)
        assert proc.returncode == 0, proc.stderr[-3000:]
    return root


def _marked(doc: str, command: str) -> Any:
    """testing.md's `ortbuild test --json > verdicts.json` builds and tests every target of the example project:
    over 30 s, so it runs in `nox -s e2e` (marked slow)."""
    return pytest.param(doc, command, marks=pytest.mark.slow) if command.startswith("ortbuild test --json") \
        else (doc, command)


@pytest.mark.parametrize(("doc", "command"), [_marked(d, c) for d, c in _example_commands()],
                         ids=lambda v: str(v)[:60])
def test_docs_command_runs(project: Path, doc: str, command: str) -> None:
    args = shlex.split(command)[1:]
    out = None
    if ">" in args:                                   # `ortbuild test --json > verdicts.json`
        at = args.index(">")
        args, out = args[:at], project / args[at + 1]
    proc = run_cli(*args, cwd=project)
    assert proc.returncode == 0, (doc, command, proc.stdout[-2000:], proc.stderr[-2000:])
    if out is not None:
        out.write_text(proc.stdout)
        if "--json" in args:
            json.loads(out.read_text())


def test_ci_matrix_example() -> None:
    """docs/ci.md shows `ortbuild matrix -t cuda-fp16` on the committed targets.toml, with its output."""
    (block,) = [b for b in _blocks("ci.md", "console") if "$ ortbuild matrix" in b]
    command, _, shown = block.partition("\n")
    proc = run_cli(*shlex.split(command.removeprefix("$ "))[1:], cwd=REPO)    # reads targets.toml, writes nothing
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout) == json.loads(shown)


def test_loaders_python_example(project: Path) -> None:
    """Two models' loaders imported side by side, as written (their loader/ directories relative to the project)."""
    (block,) = _blocks("loaders.md", "python")
    script = block + ("\nassert set(out) == {'logits'} and out['logits'].shape[0] == 4, out\n"
                      "assert set(forecast) == {'forecast'} and forecast['forecast'].shape[0] == 2, forecast\n"
                      "assert (ortbuild_tiny_cnn.MODEL, ortbuild_tiny_lstm.MODEL) == ('tiny_cnn', 'tiny_lstm')\n")
    proc = subprocess.run([sys.executable, "-c", script], cwd=project, capture_output=True, text=True, timeout=300,
                          env={**os.environ, "PYTHONPATH": ""})
    assert proc.returncode == 0, proc.stderr[-3000:]


def test_loaders_node_example(project: Path, tmp_path: Path) -> None:
    (block,) = _blocks("loaders.md", "js")
    app = install_node_app()  # skipped, saying how to install them, without Node.js and npm
    (tmp_path / "node_modules").symlink_to(app / "node_modules")
    (tmp_path / "package.json").write_text('{"name": "app", "private": true, "type": "module"}\n')
    shutil.copy(project / "dist" / "cpu-fp32" / "tiny_cnn" / "loader" / "ortbuild_loader.mjs", tmp_path)
    (tmp_path / "example.mjs").write_text(block + "console.log(JSON.stringify(Object.keys(out)));\n")
    proc = subprocess.run(["node", str(tmp_path / "example.mjs")], cwd=project, capture_output=True, text=True,
                          timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert json.loads(proc.stdout.strip().splitlines()[-1]) == ["logits"]


# ---------------------------------------------------------------------------------------------------------
# TOML fragments


def _toml_value(v: Any) -> str:
    if isinstance(v, dict):
        return "{ " + ", ".join(f"{json.dumps(k)} = {_toml_value(x)}" for k, x in v.items()) + " }"
    if isinstance(v, list):
        return "[" + ", ".join(_toml_value(x) for x in v) + "]"
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, str):
        return json.dumps(v)
    return repr(v)


def _dump(doc: dict[str, Any]) -> str:
    """TOML text for a parsed document: one table per project/model/target, values inline."""
    out = []
    for section in ("project", "models", "targets"):
        tables = {"": doc[section]} if section == "project" else doc.get(section, {})
        for name, table in tables.items():
            out.append(f"[{section}]" if not name else f"[{section}.{json.dumps(name)}]")
            out += [f"{json.dumps(k)} = {_toml_value(v)}" for k, v in table.items()]
    return "\n".join(out) + "\n"


def _merge(base: dict[str, Any], top: dict[str, Any]) -> dict[str, Any]:
    out = dict(base)
    for k, v in top.items():
        out[k] = _merge(out[k], v) if isinstance(v, dict) and isinstance(out.get(k), dict) else v
    return out


MINIMAL_TARGET = {"runtime": "onnxruntime==1.31.1", "providers": ["CPUExecutionProvider"]}


def _fragment_project(fragment: str, root: Path) -> Path:
    """A fragment without [project]: merged into a project with the example models, each target it names or
    extends standing on a minimal CPU target (the fragment's keys win)."""
    top = tomllib.loads(fragment)
    models = {m: {"path": f"models/{m}.onnx", "inputs": f"models/{m}.inputs.npz",
                  "calibration": f"models/{m}.calib.npz"}
              for m in ("tiny_cnn", "tiny_transformer", "tiny_lstm")}
    names = set(top.get("targets", {})) | {t.get("extends") for t in top.get("targets", {}).values()} - {None}
    base = {"project": {"name": "docs", "version": "1"}, "models": models,
            "targets": {name: dict(MINIMAL_TARGET) for name in sorted(names)}}
    (root / "models").symlink_to(MODELS)
    path = root / "targets.toml"
    path.write_text(_dump(_merge(base, top)))
    return path


def _toml_examples() -> list[tuple[str, int]]:
    return [(path.name, i) for path in sorted(DOCS.glob("*.md")) for i, _ in enumerate(_blocks(path.name, "toml"))]


# Fragments that name files a test project does not have (a model of the reader's, a custom-op library): they
# are loaded without the file checks; everything else about them is checked.
NAMES_MISSING_FILES = {("diagnose.md", 0): "models/inverse.onnx, libs/libmyops.so",
                       ("testing.md", 0): "models/encoder.onnx, models/encoder.shapes/",
                       ("testing.md", 4): "the orientation classifier, its rendered data: tests/test_task.py runs it"}


@pytest.mark.parametrize(("doc", "index"), _toml_examples(), ids=lambda v: str(v))
def test_docs_toml_example_loads(tmp_path: Path, doc: str, index: int) -> None:
    fragment = _blocks(doc, "toml")[index]
    if "[project]" in fragment:                                  # a whole targets.toml: loaded as it is
        (tmp_path / "models").symlink_to(MODELS)
        path = tmp_path / "targets.toml"
        path.write_text(fragment)
    else:
        path = _fragment_project(fragment, tmp_path)
    project = config.load(path, check_files=(doc, index) not in NAMES_MISSING_FILES)
    for name in tomllib.loads(fragment).get("targets", {}):
        assert name in project.targets, (doc, name)


def test_targets_layers_example_means_what_it_says(tmp_path: Path) -> None:
    """docs/targets.md: a target's overrides merge with the ones it inherits; an override beats a target-level key."""
    (fragment,) = [b for b in _blocks("targets.md", "toml") if "cpu-fp32-strict.overrides" in b]
    strict = config.load(_fragment_project(fragment, tmp_path)).targets["cpu-fp32-strict"].settings
    cnn, lstm = strict["tiny_cnn"].gates, strict["tiny_lstm"].gates
    assert cnn is not None and lstm is not None
    assert (cnn.latency.p50_ms, cnn.accuracy.get("atol"), lstm.latency.p50_ms) == (150, 1e-3, 1000)


def test_testing_per_data_set_scenarios_example_means_what_it_says(tmp_path: Path) -> None:
    """docs/testing.md: a data set's own server table over the target's, and a scenario on that data set alone."""
    (fragment,) = [b for b in _blocks("testing.md", "toml") if "data_sets.test_data_set_1.server" in b]
    gates = config.load(_fragment_project(fragment, tmp_path)).targets["cpu-fp32"].settings["tiny_cnn"].gates
    assert gates is not None
    lat = gates.latency
    assert [(s.qps, s.p99_ms) for s in (lat.scenario("server", "test_data_set_0"),
                                        lat.scenario("server", "test_data_set_1")) if s] == [(50, 40), (10, 40)]
    assert lat.scenario("multi_stream", "test_data_set_0") is None
    assert lat.scenario("multi_stream", "test_data_set_1") is not None


def test_targets_accuracy_example_means_what_it_says(tmp_path: Path) -> None:
    """docs/targets.md: an accuracy rule is inherited within a precision only."""
    (fragment,) = [b for b in _blocks("targets.md", "toml") if "cosine = 0.9995" in b]
    targets = config.load(_fragment_project(fragment, tmp_path)).targets
    rules = {}
    for name in ("cpu-fp32", "cpu-int8", "cpu-fp16"):
        gates = targets[name].settings["tiny_cnn"].gates
        assert gates is not None
        rules[name] = dict(gates.accuracy)
    assert rules["cpu-fp32"].get("atol") == 1e-4 and rules["cpu-fp16"].get("cosine") == 0.9995, rules
    assert "atol" not in rules["cpu-int8"] and "atol" not in rules["cpu-fp16"], rules   # not inherited
