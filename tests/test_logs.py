"""Third-party output goes to the job's log, not the terminal (ortbuild.logs); the terminal gets one line per
job; -v shows everything."""

from __future__ import annotations

import json
import logging
import os
import shutil
import warnings
from collections.abc import Callable
from pathlib import Path

import pytest

from ortbuild import logs
from ortbuild.paths import UnsafePath
from ortbuild.pipeline.progress import Progress
from ortbuild.status import JobFinished, JobStatus, Message, StepStarted
from tests.conftest import REPO, run_cli, run_process


def test_capture_takes_native_python_and_logging_output(tmp_path: Path, capfd: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "logs" / "t" / "m.build.log"
    with logs.captured(path, tmp_path) as cap:
        os.write(2, b"[W:onnxruntime:, graph.cc:1] native warning\n")
        os.write(1, b"native stdout\n")
        print("python print")
        logging.getLogger("some.tool").warning("a tool's warning")
        logging.getLogger("some.tool").info("a tool's info")
        warnings.warn("deprecated thing", DeprecationWarning, stacklevel=1)
    out, err = capfd.readouterr()
    assert out == "" and err == ""  # nothing reached the terminal
    text = path.read_text()
    for line in ("native warning", "native stdout", "python print", "a tool's warning", "a tool's info",
                 "deprecated thing"):
        assert line in text
    assert cap.lines == len([x for x in text.splitlines() if x.strip()]) and cap.warnings >= 3
    assert str(path) in cap.summary() and "warnings" in cap.summary()
    print("after")  # the descriptors are back
    assert capfd.readouterr().out == "after\n"


def test_nothing_said_leaves_no_file_and_none_captures_nothing(tmp_path: Path,
                                                                capfd: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "m.build.log"
    with logs.captured(path, tmp_path) as cap:
        pass
    assert not path.exists() and cap.lines == 0 and cap.summary() == ""
    with logs.captured(None, tmp_path) as cap:
        os.write(2, b"verbose\n")
    assert capfd.readouterr().err == "verbose\n" and cap.path is None


def test_footer_counts_and_names_the_logs_with_warnings(tmp_path: Path) -> None:
    a = logs.Captured(tmp_path / "logs" / "t" / "a.build.log", 148, 0)
    b = logs.Captured(tmp_path / "logs" / "t" / "b.build.log", 3, 2)
    lines = logs.footer([("t/a", a), ("t/b", b), ("t/c", logs.Captured(None))])
    assert lines[0].startswith("third-party output: 151 lines, 2 warnings, kept in ") and "-v" in lines[0]
    assert lines[1:] == [f"  [t/b] 3 lines (2 warnings) in {b.path}"]
    assert logs.footer([("t/c", logs.Captured(None))]) == []


def test_progress_prints_one_line_per_job_on_a_plain_stream(capsys: pytest.CaptureFixture[str]) -> None:
    p = Progress(live=False)
    p("t/m", StepStarted("precision"))
    p("t/m", Message("rebuilding: the model changed"))
    p("t/m", JobFinished(JobStatus.BUILT, "BUILT: dist/t/m/model.onnx.enc"))
    assert capsys.readouterr().err == "[t/m] BUILT: dist/t/m/model.onnx.enc\n"
    v = Progress(live=False, verbose=True)
    v("t/m", StepStarted("precision"))
    v("t/m", JobFinished(JobStatus.BUILT, "BUILT"))
    assert capsys.readouterr().err == "[t/m] precision\n[t/m] BUILT\n"


def test_live_rows_are_text_not_markup() -> None:
    """A step with brackets shows as it is (rich would read `[bold]` or `['CPU']` as markup)."""
    from rich.console import Console

    p = Progress(live=False)
    p._rows["cpu/m"] = ("reload on ['CPUExecutionProvider'] [bold]x[/]", 0.0)
    console = Console(record=True, width=200)
    console.print(p._table())
    text = console.export_text()
    assert "['CPUExecutionProvider'] [bold]x[/]" in text and "cpu/m" in text


def test_a_build_is_quiet_and_keeps_its_log_and_record(make_project: Callable[..., Path], tmp_path: Path) -> None:
    """The int4 quantizer logs a line per node; ORT warns; none of it reaches the terminal without -v."""
    path = make_project("""
        [targets.int4]
        runtime = "RUNTIME"
        providers = ["CPUExecutionProvider"]
        precision = "int4-weight"
    """, models=("tiny_transformer",))
    base = ["build", "-c", str(path), "--force", "-j", "1"]
    quiet = run_process(*base, cwd=REPO)  # the third-party loggers as a fresh interpreter sets them up
    assert quiet.returncode == 0, quiet.stderr
    assert "matmul_nbits" not in quiet.stderr + quiet.stdout
    # two lines for the job: its build starting (a long phase, said on every stream) and its result
    said = [line for line in quiet.stderr.splitlines() if "[int4/tiny_transformer]" in line
            and "] ... still " not in line]  # (a heartbeat where a phase runs long: a loaded machine)
    assert len(said) == 2, quiet.stderr
    assert "[int4/tiny_transformer] building (no artifact yet)" in quiet.stderr
    record = json.loads((tmp_path / "dist" / "logs" / "int4" / "tiny_transformer.build.json").read_text())
    assert record["status"] == "built" and record["steps"]["precision"] > 0
    slowest = max(record["steps"], key=record["steps"].get)  # the precision step, or on a loaded machine the check
    assert "time (slowest step)" in quiet.stdout and f"({slowest} " in quiet.stdout, quiet.stdout
    loud = run_process(*base, "-v", cwd=REPO)
    assert loud.returncode == 0, loud.stderr
    assert "matmul_nbits_quantizer" in loud.stderr  # -v: the quantizer's own lines, as it runs
    assert loud.stderr.count("[int4/tiny_transformer]") > 3  # and every step


def test_summary_gathers_every_target(make_project: Callable[..., Path], tmp_path: Path) -> None:
    path = make_project("""
        [targets.a]
        runtime = "RUNTIME"
        providers = ["CPUExecutionProvider"]
        latency = { p90_ms = 1000 }

        [targets.b]
        extends = "a"
        optimization = "basic"
    """)
    for t in ("a", "b"):  # one run per target, as nox's sessions do
        proc = run_cli("test", "-c", str(path), "-t", t, "--no-summary", cwd=REPO)
        assert proc.returncode == 0, proc.stderr
        assert "size (vs src/max)" not in proc.stdout  # no table: the summary prints it
    for what, header in (("build", "time (slowest step)"), ("test", "accuracy (worst)")):
        proc = run_cli("summary", what, "-c", str(path), cwd=REPO)
        assert proc.returncode == 0, proc.stderr
        rows = [line.split()[:2] for line in proc.stdout.splitlines() if line.startswith(("a ", "b "))]
        assert rows == [["a", "tiny_cnn"], ["b", "tiny_cnn"]], proc.stdout
        assert header in proc.stdout
    assert "2 PASS" in proc.stdout and str(tmp_path / "dist" / "report.html") in proc.stdout


def test_quick_mode_states_its_confidence_and_release_refuses_it(make_project: Callable[..., Path],
                                                                 tmp_path: Path) -> None:
    path = make_project("""
        [targets.a]
        runtime = "RUNTIME"
        providers = ["CPUExecutionProvider"]
        latency = { p90_ms = 1000, confidence = 0.99 }
    """)
    test = ["test", "-c", str(path), "--json"]
    proc = run_cli(*test, "--quick", cwd=REPO)
    assert proc.returncode == 0, proc.stderr
    r = json.loads(proc.stdout)["results"][0]
    assert r["quick"] is True and r["latency"]["confidence"] == 0.9 and r["latency"]["quick"] is True
    release = ["release", "-c", str(path), "--json"]
    proc = run_cli(*release, cwd=REPO)
    assert proc.returncode == 9 and "tested with --quick (latency at 90% confidence)" in proc.stdout, proc.stdout
    proc = run_cli(*test, cwd=REPO)  # the full sampling
    r = json.loads(proc.stdout)["results"][0]
    assert proc.returncode == 0 and r["quick"] is False and r["latency"]["confidence"] == 0.99
    proc = run_cli(*release, cwd=REPO)
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_a_symlink_at_the_log_is_replaced_and_a_symlinked_folder_refused(tmp_path: Path) -> None:
    """A link planted at the log file is replaced, never written through; one at a folder on the way is refused."""
    victim = tmp_path / "victim.txt"
    victim.write_text("precious\n")
    dist = tmp_path / "dist"
    path = logs.log_path(dist, "t", "m", "build")
    path.parent.mkdir(parents=True)
    path.symlink_to(victim)
    with logs.captured(path, dist):
        os.write(2, b"said\n")
    assert victim.read_text() == "precious\n" and not path.is_symlink() and path.read_text() == "said\n"
    outside = tmp_path / "outside"
    outside.mkdir()
    shutil.rmtree(dist / "logs")
    (dist / "logs").symlink_to(outside)
    with pytest.raises(UnsafePath, match="is a symlink"), logs.captured(path, dist):
        pass
    assert list(outside.iterdir()) == []
