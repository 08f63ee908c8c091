"""README examples are run: its targets.toml example builds, and every `$ ortbuild ...` line succeeds."""

from __future__ import annotations

import re
import shlex
from pathlib import Path

import pytest

from ortbuild.project import config
from tests.conftest import MODELS, REPO, here_runtime, run_cli

README = (REPO / "README.md").read_text()


def _blocks(lang: str) -> list[str]:
    return re.findall(rf"```{lang}\n(.*?)```", README, flags=re.S)


@pytest.fixture(scope="module")
def example(tmp_path_factory: pytest.TempPathFactory) -> Path:
    (toml,) = _blocks("toml")
    root = tmp_path_factory.mktemp("readme")
    (root / "models").symlink_to(MODELS)
    (root / "targets.toml").write_text(toml.replace("onnxruntime==1.31.1", here_runtime()))
    return root


def test_readme_targets_example_is_valid(example: Path) -> None:
    project = config.load(example / "targets.toml")
    int8 = project.targets["cpu-int8"]
    assert int8.settings["tiny_cnn"].precision == "int8-static"
    assert int8.settings["tiny_transformer"].precision == "int8-dynamic"
    assert int8.settings["tiny_transformer"].quantization.format == "qdq"  # merged, not replaced


def test_readme_commands_run(example: Path) -> None:
    (console,) = [b for b in _blocks("console") if "$ ortbuild" in b]
    commands = [line.removeprefix("$ ") for line in console.splitlines() if line.startswith("$ ortbuild")]
    assert len(commands) >= 5
    for cmd in commands:
        proc = run_cli(*shlex.split(cmd)[1:], cwd=example)
        assert proc.returncode == 0, (cmd, proc.stdout[-2000:], proc.stderr[-2000:])


def test_readme_quick_start_is_what_ci_runs() -> None:
    (quick,) = [b for b in _blocks("console") if "python3 -m nox" in b]
    ci = (REPO / ".ci" / "run").read_text()
    for line in quick.strip().splitlines():
        nox_part = line.split("&&")[-1].strip()
        assert nox_part in ci, nox_part


def test_readme_big_model_generator_runs(tmp_path: Path) -> None:
    import subprocess
    import sys

    from ortbuild import modelfiles

    (block,) = [b for b in _blocks("sh") if "tests/bigmodels.py" in b]
    cmd = shlex.split(block.split("#")[0].strip().replace("/tmp/big", str(tmp_path)))
    assert cmd[:2] == ["python3", "tests/bigmodels.py"]
    subprocess.run([sys.executable, *cmd[1:]], cwd=REPO, check=True, capture_output=True, timeout=300)
    files = modelfiles.of(tmp_path / "mlp" / "model.onnx")
    assert [f.location for f in files.external] == ["model.onnx.data"] and files.weights_size > 90 << 20


def test_readme_test_summary_is_what_the_committed_targets_print() -> None:
    """The sample of `nox -s test`'s last table (abridged: widths from the rows left out): the report's columns,
    laid out as summary.table does (left-aligned, two spaces apart, a dashed rule), rows of real (target, model)
    jobs, and counts that add up to every job of the committed targets.toml."""
    from ortbuild.gating import report
    from ortbuild.project import plan

    (sample,) = [b for b in _blocks("text") if b.startswith("test summary, every target")]
    _, head, rule, *rows, counts = sample.strip("\n").splitlines()
    spans, at = [], 0
    for dashes in rule.split("  "):
        assert set(dashes) == {"-"}, rule
        spans.append((at, at + len(dashes)))
        at += len(dashes) + 2

    def cells(line: str) -> list[str]:
        assert all(line[end:end + 2].strip() == "" for _, end in spans), line  # nothing between the columns
        return [line[a:b].strip() for a, b in spans]

    columns = [h for h in report.HEADER if h != "startup"]  # no budget of the committed targets has a startup cell
    assert cells(head) == columns
    shown = [cells(r) for r in rows]
    assert all(len(c) <= b - a for r in shown for c, (a, b) in zip(r, spans, strict=True))
    jobs = [(j.target.name, j.model.name) for j in plan.jobs(config.load(REPO / "targets.toml"))]
    assert {(r[0], r[1]) for r in shown} <= set(jobs) and all(r[-1] in ("PASS", "SKIPPED") for r in shown)
    shown = re.fullmatch(r"(\d+) PASS, (\d+) FAIL, (\d+) INCONCLUSIVE, (\d+) SKIPPED  ->  (.*)", counts)
    assert shown is not None and sum(int(n) for n in shown.groups()[:4]) == len(jobs), (counts, len(jobs))
