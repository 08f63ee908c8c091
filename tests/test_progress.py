"""A plain stream is never silent for long (ortbuild.pipeline.progress): long phases are announced, a heartbeat
fills the silences, and the quiet default still keeps third-party output off the terminal."""

from __future__ import annotations

import io
import itertools
import re
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from ortbuild.pipeline.progress import Progress
from ortbuild.status import JobFinished, JobStatus, Message, PhaseStarted, StepStarted
from tests.conftest import REPO, here_runtime

MAX_GAP_S = 10.0  # issue 36: a plain-pipe run never goes 10 s without a line


def _lines(stream: io.StringIO) -> list[str]:
    return stream.getvalue().splitlines()


def test_the_heartbeat_fills_a_silent_phase_and_stops() -> None:
    out = io.StringIO()
    with Progress(out, live=False, heartbeat=0.2) as p:
        p("t/m", PhaseStarted("testing"))
        p("t/m", Message("latency on test_data_set_0: sampling"))  # not printed by default, but named
        time.sleep(0.75)
        beats = [x for x in _lines(out) if "still" in x]
        assert _lines(out)[0] == "[t/m] testing"
        assert len(beats) >= 2, out.getvalue()
        assert all(re.fullmatch(r"\[t/m\] \.\.\. still latency on test_data_set_0: sampling, \d+s", x) for x in beats)
        p("t/m", JobFinished(JobStatus.BUILT, "PASS"))
        time.sleep(0.5)  # no job runs: the command's own heartbeat
        assert re.fullmatch(r"\.\.\. still working, \d+s", _lines(out)[-1]), out.getvalue()
    said = len(_lines(out))
    time.sleep(0.5)
    assert len(_lines(out)) == said  # stopped with the block
    assert not any(t.name == "ortbuild-heartbeat" for t in threading.enumerate())


def test_lines_reset_the_heartbeat_and_quiet_or_live_displays_have_none() -> None:
    out = io.StringIO()
    with Progress(out, live=False, heartbeat=0.4) as p:
        for _ in range(6):  # a phase announced every 0.1 s: never 0.4 s silent
            p("t/m", PhaseStarted("building"))
            time.sleep(0.1)
    assert not any("still" in x for x in _lines(out)), out.getvalue()
    for quiet, live in ((True, False), (False, True)):
        assert Progress(io.StringIO(), quiet=quiet, live=live, heartbeat=0.1).heartbeat is None
    out = io.StringIO()
    with Progress(out, quiet=True, heartbeat=0.1) as p:  # --json: nothing on the terminal
        p("t/m", PhaseStarted("testing"))
        time.sleep(0.3)
    assert out.getvalue() == ""


def test_the_quiet_default_prints_phase_starts_and_finished_jobs_only() -> None:
    out = io.StringIO()
    p = Progress(out, live=False)
    p("t/m", PhaseStarted("building (no artifact yet)"))
    p("t/m", StepStarted("precision"))
    p("t/m", Message("a note"))
    p("t/m", JobFinished(JobStatus.BUILT, "built"))
    assert _lines(out) == ["[t/m] building (no artifact yet)", "[t/m] built"]


def _example_copy(tmp_path: Path) -> Path:
    """The example project (this repository's targets.toml and models) on this environment's runtime, with one
    target whose latency sampling is a long phase that prints nothing of its own (no budget: it takes the
    `min_samples` runs it asks for, about 10-20 s of the example CNN)."""
    text = re.sub(r'runtime = "onnxruntime==[^"]*"', f'runtime = "{here_runtime()}"',
                  (REPO / "targets.toml").read_text())
    text += f"""
[targets.slow-sampling]
runtime = "{here_runtime()}"
providers = ["CPUExecutionProvider"]
models = ["tiny_cnn"]
latency = {{ min_samples = 100000 }}
"""
    (tmp_path / "models").symlink_to(REPO / "models")
    path = tmp_path / "targets.toml"
    path.write_text(text)
    return path


def timed_lines(cmd: list[str], timeout: float, env: dict[str, str] | None = None) \
        -> tuple[int, list[tuple[float, str]], float]:
    """Run `cmd` with stdout and stderr on one plain pipe; each line with the seconds since start when it
    arrived, read as it comes; the exit code and the seconds at exit."""
    start = time.monotonic()
    proc = subprocess.Popen(cmd, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env)
    killer = threading.Timer(timeout, proc.kill)
    killer.start()
    lines = []
    try:
        assert proc.stdout is not None
        for line in iter(proc.stdout.readline, ""):
            lines.append((time.monotonic() - start, line.rstrip("\n")))
        code = proc.wait()
    finally:
        killer.cancel()
    return code, lines, time.monotonic() - start


@pytest.mark.runtime
@pytest.mark.slow
def test_a_plain_pipe_run_of_test_never_goes_10_s_without_a_line(tmp_path: Path) -> None:
    path = _example_copy(tmp_path)
    cmd = [sys.executable, "-m", "ortbuild", "test", "-c", str(path), "-t", "cpu-fp32", "-t", "cpu-int8", "-t",
           "slow-sampling", "--no-explain"]
    code, lines, end = timed_lines(cmd, 900)
    text = "\n".join(f"{t:6.1f} {x}" for t, x in lines)
    assert code == 0, text
    stamps = [0.0, *(t for t, _ in lines), end]
    gaps = [b - a for a, b in itertools.pairwise(stamps)]
    assert max(gaps) <= MAX_GAP_S, f"a {max(gaps):.1f} s silence:\n{text}"
    said = [x for _, x in lines]
    # the long sampling said nothing of its own: the heartbeat named it
    assert any(re.match(r"\[slow-sampling/tiny_cnn\] \.\.\. still latency on test_data_set_0", x) for x in said), text
    # each job said it started and its verdict: PASS, or INCONCLUSIVE where other work competed with a latency gate
    # (e2e runs beside other tests; the command exits 0 either way without --strict)
    for job in ("cpu-fp32/tiny_cnn", "cpu-int8/tiny_transformer", "slow-sampling/tiny_cnn"):
        assert f"[{job}] testing" in said, text
        assert f"[{job}] PASS" in said or any(x.startswith(f"[{job}] INCONCLUSIVE: ") for x in said), text
    # the quiet default: what ONNX Runtime, the quantizers and Python warnings say stays in dist/logs/
    for third_party in ("Warning", "WARNING", "[W:onnxruntime", "onnxruntime.quantization", "Traceback"):
        assert not [x for x in said if third_party in x], text
