"""`ortbuild matrix` and docs/ci.md: the matrix is what the workflow consumes; the workflow names only real
commands (ortbuild's, with arguments its parser accepts, and nox sessions that exist)."""

from __future__ import annotations

import json
import re
import shlex
from pathlib import Path
from typing import Any

import pytest
import yaml

from ortbuild import cli
from ortbuild.project import config
from tests.conftest import REPO, run_cli
from tests.test_noxfile import _sessions

DOC = REPO / "docs" / "ci.md"
# Tools of the runner image or of the actions the workflow sets up; everything else must be ortbuild's or nox's.
KNOWN_TOOLS = {"echo", "python3", "docker", "oras", "for", "do", "done", "git"}


def _workflow() -> dict[Any, Any]:
    blocks = re.findall(r"```yaml\n(.*?)```", DOC.read_text(), re.S)
    assert len(blocks) == 1, "docs/ci.md holds one workflow"
    doc: dict[Any, Any] = yaml.safe_load(blocks[0])
    return doc


def test_matrix_has_one_entry_per_target_with_its_runner_labels() -> None:
    proc = run_cli("matrix")
    assert proc.returncode == 0, proc.stderr
    include = json.loads(proc.stdout)["include"]
    targets = config.load(REPO / "targets.toml").targets
    assert [e["target"] for e in include] == list(targets)
    by = {e["target"]: e for e in include}
    assert by["cuda-fp16"]["runs-on"] == ["self-hosted", "linux", "x64", "gpu"]
    assert by["tensorrt-fp16"]["runs-on"] == by["cuda-fp16"]["runs-on"]  # inherited through extends
    assert by["cpu-fp32"]["runs-on"] == ["ubuntu-latest"] and by["cpu-fp32"]["session"] == "test(cpu-fp32)"
    # an aarch64 target goes to an ARM runner, where its latency gates run natively
    assert by["arm64-int8"]["runs-on"] == ["ubuntu-24.04-arm"] and by["arm64-int8"]["platform"] == "linux-aarch64"
    compact = run_cli("matrix", "--compact", "-t", "cpu-*")
    assert "\n" not in compact.stdout.strip()
    assert [e["target"] for e in json.loads(compact.stdout)["include"]] == [t for t in targets if t.startswith("cpu-")]


def test_the_documented_matrix_output_is_what_the_command_prints() -> None:
    shown = re.search(r"\$ ortbuild matrix -t cuda-fp16 --cache (\S+)\n(.*?)```", DOC.read_text(), re.S)
    assert shown is not None
    proc = run_cli("matrix", "-t", "cuda-fp16", "--cache", shown.group(1))
    assert json.loads(shown.group(2)) == json.loads(proc.stdout)


def test_the_matrix_sets_the_cache_for_every_runner(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Each entry's `cache`: --cache, else $ORTBUILD_CACHE, else [project] cache, else "" (the workflow sets
    ORTBUILD_CACHE from it on each runner); a bad one is a config error naming where it came from."""
    from tests.conftest import model_table

    toml = tmp_path / "targets.toml"
    toml.write_text('[project]\nname = "p"\nversion = "1"\ncache = "oci://localhost:5000/team-cache"\n'
                    + model_table("tiny_cnn") + '[targets.a]\nruntime = "onnxruntime==1.31.1"\n'
                    'providers = ["CPUExecutionProvider"]\nprecision = "fp32"\n')
    monkeypatch.delenv("ORTBUILD_CACHE", raising=False)

    def caches(*args: str) -> set[str]:
        proc = run_cli("matrix", "-c", str(toml), *args)
        assert proc.returncode == 0, proc.stderr
        return {e["cache"] for e in json.loads(proc.stdout)["include"]}

    assert caches() == {"oci://localhost:5000/team-cache"}
    assert caches("--cache", "oci://127.0.0.1:5001/other") == {"oci://127.0.0.1:5001/other"}
    monkeypatch.setenv("ORTBUILD_CACHE", "oci://127.0.0.1:5002/env")
    assert caches() == {"oci://127.0.0.1:5002/env"}
    bad = run_cli("matrix", "-c", str(toml), "--cache", "oci://host/repo:tag")
    assert bad.returncode == 3 and "--cache" in bad.stderr and "not a tag" in bad.stderr, bad.stderr


def test_bad_runner_labels_are_config_errors(tmp_path: Path) -> None:
    from tests.conftest import model_table

    toml = tmp_path / "targets.toml"
    toml.write_text('[project]\nname = "p"\nversion = "1"\n' + model_table("tiny_cnn") +
                    '[targets.t]\nruntime = "onnxruntime==1.31.1"\nproviders = ["CPUExecutionProvider"]\nrunner = []\n')
    proc = run_cli("matrix", "-c", str(toml))
    assert proc.returncode == 3 and "[targets.t.runner]" in proc.stderr


def _substitutions(script: str) -> tuple[str, list[str]]:
    """`script` with each $( ... ) replaced by X, and the scripts inside them (quotes and nesting respected)."""
    out, subs, i = [], [], 0
    while i < len(script):
        if script.startswith("$(", i):
            depth, j, quote = 1, i + 2, ""
            while depth:
                c = script[j]
                if quote:
                    quote = "" if c == quote else quote
                elif c in "'\"":
                    quote = c
                else:
                    depth += {"(": 1, ")": -1}.get(c, 0)
                j += 1
            subs.append(script[i + 2:j - 1])
            out.append("X")
            i = j
        else:
            out.append(script[i])
            i += 1
    return "".join(out), subs


def _commands(script: str) -> list[list[str]]:
    """The simple commands of a `run:` script (those inside $( ) too), with GitHub expressions and shell
    variables as placeholders X."""
    script = re.sub(r"\$\{\{.*?\}\}", "X", script)
    script, subs = _substitutions(script)
    script = re.sub(r"\$\{?\w+\}?", "X", script)
    out: list[list[str]] = []
    for line in script.splitlines():
        lex = shlex.shlex(line, posix=True, punctuation_chars=True)
        lex.whitespace_split = True
        words: list[str] = []
        skip = False
        for tok in [*lex, ";"]:
            if set(tok) <= set(";|&()<>"):
                if words:
                    out.append(words)
                words, skip = [], tok in (">", ">>")
            elif skip:
                skip = False  # a redirection's target
            else:
                words.append(tok)
    for sub in subs:
        out += _commands(sub)
    return out


def test_the_workflow_parses_and_names_only_commands_that_exist() -> None:
    wf = _workflow()
    jobs = wf["jobs"]
    assert set(jobs) == {"matrix", "target", "release"}
    target = jobs["target"]
    assert target["strategy"]["matrix"] == "${{ fromJSON(needs.matrix.outputs.matrix) }}"
    assert target["runs-on"] == "${{ matrix.runs-on }}"
    assert set(jobs["release"]["needs"]) == {"matrix", "target"}
    sessions = {s["session"] for s in _sessions("-s", "build", "test", "release", "test-generative",
                                                "release-generative")}
    targets = list(config.load(REPO / "targets.toml").targets)
    matrix = {e["target"]: e for e in json.loads(run_cli("matrix").stdout)["include"]}
    parser = cli.parser()
    seen = {"ortbuild": 0, "nox": 0}
    for name, job in jobs.items():
        for step in job["steps"]:
            for words in _commands(step.get("run", "")):
                tool = words[0]
                if tool == "ortbuild":
                    seen["ortbuild"] += 1
                    try:
                        parser.parse_args(words[1:])
                    except SystemExit:
                        pytest.fail(f"{name}: `{' '.join(words)}` is not a valid ortbuild command")
                elif words[:3] == ["python3", "-m", "nox"]:
                    seen["nox"] += 1
                    chosen = words[words.index("-s") + 1]
                    for t in targets:  # the matrix fills in each target's session (test-generative(...) for an LLM)
                        key = "session" if "--require" in words else "release_session"  # the test step requires
                        session = matrix[t][key] if chosen == "X" else chosen.replace("X", t)
                        assert session in sessions, f"{name}: no nox session {session} for {t}"
                else:
                    assert tool in KNOWN_TOOLS, f"{name}: unexpected command {tool!r}"
    assert seen["ortbuild"] >= 3 and seen["nox"] >= 2


def test_every_module_with_e2e_or_slow_tests_says_what_they_cover() -> None:
    """docs/testing.md lists, one line each, the modules whose tests `nox -s e2e` runs (and only those)."""
    text = (REPO / "docs" / "testing.md").read_text()
    section = text[text.index("### What `nox -s e2e` runs"):]
    listed = set(re.findall(r"^- `(test_\w+\.py)`", section, flags=re.M))
    marked = {p.name for p in (REPO / "tests").glob("test_*.py")
              if re.search(r"pytest\.mark\.(e2e|slow)\b", p.read_text())}
    assert listed == marked, f"listed, unmarked: {sorted(listed - marked)}; marked, unlisted: {sorted(marked - listed)}"
