"""README examples are run: its targets.toml example builds, and every `$ ortbuild ...` line succeeds."""

from __future__ import annotations

import importlib.util
import re
import shlex
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

from ortbuild.project import config, plan
from tests.conftest import MODELS, REPO, here_runtime, run_cli

README_PATH = REPO / "README.md"
README = README_PATH.read_text()


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
    blocks = [b for b in _blocks("console") if "python3 -m nox" in b]  # the quick start, then generative models
    assert len(blocks) == 2 and "-t generative" in blocks[1]
    ci = (REPO / ".ci" / "run").read_text()
    for line in "\n".join(blocks).strip().splitlines():
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


def _samples() -> ModuleType:
    """docs/samples.py, the script that writes the pages' output samples from a real run."""
    spec = importlib.util.spec_from_file_location("docs_samples", REPO / "docs" / "samples.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclass looks its module up
    spec.loader.exec_module(module)
    return module


samples = _samples()
# the jobs of `nox -s test`: the generative targets have their own sessions (`nox -t generative`)
JOBS = [(j.target.name, j.model.name) for j in plan.jobs(config.load(REPO / "targets.toml")) if j.target.kind == "onnx"]


def _sample(name: str) -> tuple[str, list[str]]:
    sentence, block = samples.block_of(samples.SAMPLES[name].read_text(), name)
    return " ".join(sentence.split()), block.splitlines()


def _counted(sentence: str) -> tuple[int, int]:
    m = re.search(r"abridged: (\d+) of its (\d+) rows", sentence)
    assert m is not None, sentence
    return int(m[1]), int(m[2])


def _laid_out(t: Any, header: list[str]) -> None:
    """A table as summary.table lays it out: the header's cells, each column as wide as its dashes and no cell
    wider, two spaces between them (nothing spilling into them)."""
    assert set(t.rule.replace("  ", "")) == {"-"} and "   " not in t.rule, t.rule
    assert t.cells(t.head) == header
    for line in [t.head, *t.rows]:
        assert all(line[end:end + 2].strip() == "" for _, end in t.spans()), line
        cells = t.cells(line)
        assert "  ".join(c.ljust(b - a) for c, (a, b) in zip(cells, t.spans(), strict=True)).rstrip() == line


def test_samples_markers_are_the_scripts() -> None:
    """Every marked span in README.md and docs/ is one docs/samples.py writes, and each of its spans is there once."""
    pages = [README_PATH, *sorted((REPO / "docs").glob("*.md"))]
    found = {(kind, name, path) for path in pages
             for kind, name in re.findall(r"<!-- (sample|timing): ([\w-]+) -->", path.read_text())}
    want = {("sample", n, p) for n, p in samples.SAMPLES.items()}
    want |= {("timing", n, p) for n, ps in samples.TIMINGS.items() for p in ps}
    assert found == want
    for kind, name, path in want:
        samples.marked(path.read_text(), kind, name)  # exactly one span, closed


def test_readme_test_summary_is_what_the_committed_targets_print() -> None:
    """The sample of `nox -s test`'s last table: the report's columns laid out as summary.table does, rows of real
    (target, model) jobs kept by the script's rule, counts that add up to every job of the committed targets.toml,
    and a sentence whose numbers and skipped targets are the block's."""
    from ortbuild.gating.reports import cells, summary

    sentence, lines = _sample("test-summary")
    t = samples.parse_table(lines, samples.TEST_TITLE, lambda line: bool(re.match(r"\d+ PASS, ", line)))
    assert t.title == "test summary, every target (dist/report.json):"
    shown = t.cells(t.head)
    _laid_out(t, [h for h in cells.HEADER if h not in cells.OPTIONAL or h in shown])
    rows = [t.cells(r) for r in t.rows]
    assert {(r[0], r[1]) for r in rows} <= set(JOBS) and len(rows) == len({(r[0], r[1]) for r in rows})
    assert all(r[-1] in ("PASS", "SKIPPED") for r in rows), "a README sample is a passing run"
    assert samples.keep_test_rows(t) == t.rows, "the rows are not those docs/samples.py keeps"
    (counts,) = [line for line in t.after if line and not line.startswith(" ")]
    verdicts = [r[-1] for r in rows]
    m = re.fullmatch(r"(\d+) PASS, (\d+) FAIL, (\d+) INCONCLUSIVE, (\d+) SKIPPED  ->  (.*)", counts)
    assert m is not None and sum(int(n) for n in m.groups()[:4]) == len(JOBS), (counts, len(JOBS))
    assert counts.split("  ->  ")[1] == "dist/report.json, dist/report.html"
    assert counts == summary.verdict_counts(["PASS"] * int(m[1]) + ["SKIPPED"] * int(m[4]), Path("dist/report.json"),
                                            Path("dist/report.html"))
    assert all(int(m[i + 1]) >= 1 for i, v in enumerate(("PASS", "FAIL", "INCONCLUSIVE", "SKIPPED")) if v in verdicts)
    assert _counted(sentence) == (len(rows), len(JOBS)), sentence
    said = re.search(r"so (.*) (?:is|are) skipped\)", sentence)
    skipped = re.split(r", | and ", said[1]) if said else []
    assert set(skipped) <= {t for t, _ in JOBS}, skipped
    assert all(r[-1] == "SKIPPED" for r in rows if r[0] in skipped)
    assert {r[0] for r in rows if r[-1] == "SKIPPED"} <= set(skipped), "a SKIPPED row of a target the sentence omits"
    assert int(m[4]) == sum(t in skipped for t, _ in JOBS), "SKIPPED: the jobs of the targets the sentence names"


def test_readme_build_summary_is_what_the_committed_targets_build() -> None:
    """The sample of the build's last table: summary.table's layout of BUILD_HEADER, rows of real jobs whose
    precision and optimization level are what targets.toml asks for that job, kept by the script's rule, notes
    only about rows shown, and counts of every job."""
    from ortbuild.gating.reports import summary
    from ortbuild.status import JobStatus

    project = config.load(REPO / "targets.toml")
    sentence, lines = _sample("build-summary")
    t = samples.parse_table(lines, samples.BUILD_TITLE, lambda line: bool(re.match(r"\d+ [a-z-]+(, |$)", line)))
    assert t.title == "build summary, every target (dist):"
    _laid_out(t, summary.BUILD_HEADER)
    assert samples.keep_build_rows(t) == t.rows, "the rows are not those docs/samples.py keeps"
    for row in map(t.cells, t.rows):
        target, model, status, precision, _, level = row[:6]
        assert (target, model) in JOBS, row
        settings = project.targets[target].settings[model]
        assert status.lower() in {JobStatus.BUILT, JobStatus.PORTABLE, JobStatus.UP_TO_DATE}, row  # a passing run
        assert precision == settings.precision, (row, settings.precision)
        asked = re.fullmatch(r"(\w+)(?: \(asked (\w+)\))?", level)
        assert asked is not None and (asked[2] or asked[1]) == settings.optimization, (row, settings.optimization)
    notes = [line for line in t.after if line.startswith("  [")]
    for row in t.rows:  # a PORTABLE row comes with the reason
        if t.cells(row)[2] == "PORTABLE":
            assert any(" PORTABLE: " in line and samples._about(line, [row], t) for line in notes), row
    assert all(samples._about(line, t.rows, t) for line in notes)
    *_, counts = t.after
    counted = re.findall(r"(\d+) ([a-z-]+)", counts)
    assert {s for _, s in counted} <= set(JobStatus) and sum(int(n) for n, _ in counted) == len(JOBS), counts
    assert _counted(sentence) == (len(t.rows), len(JOBS)), sentence


def test_diagnose_profile_sample_is_a_profile_of_a_real_job() -> None:
    """docs/diagnose.md's profile sample: `ortbuild profile -t cpu-int8 -m tiny_cnn --top 5` on a job of the
    committed targets.toml, its operator table laid out by summary.table with profile.HEADER, --top rows."""
    from ortbuild.gating.measure import profile
    from ortbuild.gating.reports import summary

    _, lines = _sample("profile")
    assert samples.PROFILE_COMMAND[:5] == ("profile", "-t", "cpu-int8", "-m", "tiny_cnn")
    assert "$ ortbuild " + " ".join(samples.PROFILE_COMMAND) in (REPO / "docs" / "diagnose.md").read_text()
    assert ("cpu-int8", "tiny_cnn") in JOBS and lines[0] == "cpu-int8/tiny_cnn: PROFILED"
    assert re.fullmatch(r"  20 runs, [0-9.]+ ms per run \(\d+% in kernels\); CPU \d+ nodes [0-9.]+ ms/run", lines[1])
    table = [line.removeprefix("  ") for line in lines[2:-1]]
    t = samples.Table("", table[0], table[1], table[2:], [])
    _laid_out(t, profile.HEADER)
    assert len(t.rows) == int(samples.PROFILE_COMMAND[-1])
    printed = summary.table([t.cells(r) for r in t.rows], profile.HEADER).splitlines()
    assert [line.rstrip() for line in printed] == [t.head, t.rule, *t.rows]
    assert lines[-1] == f"  trace: dist/cpu-int8/tiny_cnn/{profile.TRACE}  (chrome://tracing or ui.perfetto.dev)"


def test_checks_timing_is_one_measurement() -> None:
    """The minutes the README and docs/testing.md quote for `nox -t check` are one measurement (the script writes
    both): the same total and machine, and docs/testing.md's parts add up to about that total."""
    readme, testing = (samples.marked(p.read_text(), "timing", "checks")["body"] for p in samples.TIMINGS["checks"])
    readme, testing = " ".join(readme.split()), " ".join(testing.split())
    total = re.match(r"([\d.]+) minutes \((\d+) s\) on a fresh clone, (\d+)-CPU (\w+) machine(?: \([^)]*\))?, "
                     r"with (\w+) CPU burners?", readme)  # the CPU's x86-64 level in parentheses where it has one
    assert total is not None, readme
    assert abs(float(total[1]) * 60 - int(total[2])) <= 3, total[0]  # the minutes say the seconds
    m = re.match(r"a fresh clone, (\d+)-CPU (\w+) machine \(.*?\), with (\w+) CPU burners? running beside it: "
                 r"([\d.]+) minutes \((\d+) s\) \((.*?);", testing)
    assert m is not None, testing
    assert (m[1], m[2], m[3], m[4], m[5]) == (total[3], total[4], total[5], total[1], total[2])
    parts = [(float(n), unit) for n, unit in re.findall(r"([\d.]+) (s|min)\b", m[6])]
    assert len(parts) == 3, m[6]  # lint, tests, tests-openvino
    seconds = sum(n * (60 if unit == "min" else 1) for n, unit in parts)
    assert abs(seconds - int(total[2])) <= 60, (parts, total[0])  # the sessions' times, rounded to 0.1 min
