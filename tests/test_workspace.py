"""dist/ under stress, for real: kill -9 at random moments, concurrent builds, locks, leftovers."""

from __future__ import annotations

import json
import os
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from ortbuild import cli, workspace
from ortbuild.artifact import keys, manifest
from ortbuild.errors import Busy

TARGETS = """
[targets.fp32]
runtime = "RUNTIME"
providers = ["CPUExecutionProvider"]

[targets.int8]
runtime = "RUNTIME"
providers = ["CPUExecutionProvider"]
precision = "int8-dynamic"
"""


def _cli(*args: str) -> list[str]:
    return [sys.executable, "-m", "ortbuild", *args]


def _isolated(root: Path) -> dict[str, str]:
    """The environment of a command whose temp dir and private dirs' root ($ORTBUILD_TMPDIR) are `root`: ortbuild
    makes its private dirs and looks for dead ones there only, so no other test's command (the suite runs in
    parallel) sweeps this test's dead dirs, and this test's command sees no other test's."""
    return {**os.environ, "TMPDIR": str(root), "ORTBUILD_TMPDIR": str(root)}


def _artifacts(dist: Path) -> list[Path]:
    return sorted(p.parent for p in dist.glob("*/*/manifest.json"))


def _assert_no_torn_state(dist: Path) -> int:
    """Every artifact a reader can find is complete: its manifest reads, its signature and digests hold.
    An artifact directory without a manifest is not an artifact (readers say 'no manifest here')."""
    pub = keys.signing_key()
    assert pub is not None
    for folder in _artifacts(dist):
        m, _ = manifest.read(folder)
        assert manifest.integrity_problems(m, folder, pub.public_raw) == [], folder
    return len(_artifacts(dist))


def _alive(pid: int) -> bool:
    """Running: not gone and not a zombie (an exited process its parent or init has not reaped yet)."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state not in ("Z", "X")


def _dead_private_dirs(root: Path) -> list[Path]:
    """ortbuild-<pid>-* temp dirs in `root` whose process is gone (builds and their workers): plaintext nobody
    owns."""
    return [d for d in root.glob(f"{workspace.PRIVATE_PREFIX}*")
            if d.name.split("-")[1].isdigit() and not _alive(int(d.name.split("-")[1]))]


def _until_building(proc: subprocess.Popen[bytes]) -> bytes:
    """What a `build -v` wrote to stderr up to its first job's start ("] building"), or until it ended."""
    assert proc.stderr is not None
    head = b""
    while b"] building" not in head and (line := proc.stderr.readline()):
        head += line
    return head


@pytest.mark.slow
def test_kill_9_at_random_moments_leaves_no_torn_state_and_no_plaintext(make_project: Callable[..., Path],
                                                                         tmp_path: Path,
                                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    path = make_project(TARGETS, models=("tiny_cnn", "tiny_transformer"))
    dist = path.parent / "dist"
    # every command here (and the in-process inspect) keeps its private dirs in, and sweeps, this test's own root
    root = tmp_path / "private"
    root.mkdir()
    for k, v in _isolated(root).items():
        monkeypatch.setenv(k, v)
    rng = random.Random(20261123)
    killed_in_build = leftovers_seen = 0
    # one complete build first, so kills also hit the replacement of published artifacts; timed, so that the kills'
    # moments scale with how fast builds run on this machine now (beside the other tests, several times slower)
    t0 = time.monotonic()
    first = subprocess.Popen(_cli("build", "-c", str(path), "--force", "-v"), stdout=subprocess.DEVNULL,
                             stderr=subprocess.PIPE)
    _until_building(first)
    started = time.monotonic()
    assert first.wait(timeout=600) == 0
    whole, jobs = time.monotonic() - t0, time.monotonic() - started
    # two in three aimed inside the jobs, the others anywhere; until enough landed in steps (under CI's load, where
    # builds run slower than the first one timed here, about one kill in six lands in a step: 8 of 48 once)
    for i in range(96):
        if i >= 18 and killed_in_build >= 12 and leftovers_seen >= 1:
            break
        proc = subprocess.Popen(_cli("build", "-c", str(path), "--force", "-j", str(1 + i % 2), "-v"),
                                stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, start_new_session=True)
        head = b""
        if i % 3:  # two kills in three at a random moment after the first job started, however slow the start
            head = _until_building(proc)
            time.sleep(rng.uniform(0.0, jobs))
        else:  # the others at a random moment from the process's start (start-up, lock, sweep, the first step)
            time.sleep(rng.uniform(0.1, whole))
        proc.send_signal(signal.SIGKILL)
        _, err = proc.communicate(timeout=60)
        err = head + err
        if proc.returncode == -signal.SIGKILL:
            killed_in_build += b"] precision" in err or b"] optimize" in err or b"] sign and publish" in err
        _assert_no_torn_state(dist)
        # what the kill left, counted before inspect runs here: like every command, it sweeps the dead's private dirs
        leftovers_seen += len(workspace.partial_files(dist)) + len(_dead_private_dirs(root))
        # readers never crash on what a kill left; inspect names leftovers
        for folder in dist.glob("*/*"):
            assert cli.main(["inspect", str(folder)]) in (0, 7)  # 1 would be an internal error
    assert killed_in_build >= 10, "the kills must land inside build steps"
    assert leftovers_seen >= 1, "some kills must leave something for the recovery to remove"
    # the next build removes every leftover (partial files, the plaintext temp dirs of the dead processes)
    left = workspace.partial_files(dist) + _dead_private_dirs(root)
    proc = subprocess.run(_cli("build", "-c", str(path)), capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr
    assert workspace.partial_files(dist) == [] and _dead_private_dirs(root) == []
    assert _assert_no_torn_state(dist) == 4
    assert ("leftover(s) of interrupted builds" in proc.stderr) == bool(left)


def _dead_private_dir(root: Path) -> Path:
    """A private dir as a kill -9'd build leaves it: named for a process that is gone, holding plaintext. In
    `root`, the test's own TMPDIR (`_isolated`): any ortbuild command on the machine removes the dead dirs it
    sees in /dev/shm, so another test run's command would race this test there."""
    dead = subprocess.Popen(["sleep", "0"])
    dead.wait()
    private = root / f"ortbuild-{dead.pid}-12345-test"
    private.mkdir()
    (private / "source.onnx").write_bytes(b"plaintext weights")
    return private


def test_clean_stale_removes_a_dead_builds_plaintext_dir_and_partial_files(make_project: Callable[..., Path],
                                                                           tmp_path: Path) -> None:
    path = make_project(TARGETS.split("[targets.int8]")[0])
    dist = path.parent / "dist"
    root = tmp_path / "tmpdir"
    root.mkdir()
    private = _dead_private_dir(root)
    (dist / "fp32" / "tiny_cnn").mkdir(parents=True)
    partial = dist / "fp32" / "tiny_cnn" / ".model.onnx.enc.x1.partial"
    partial.write_bytes(b"half")
    live = Path(private.parent) / f"ortbuild-{os.getpid()}-{workspace._start_time(os.getpid())}-live"
    live.mkdir()  # a live process's private dir is never touched
    try:
        # every command removes a dead process's private dir as it starts; partial files in dist/ wait for a
        # command that holds dist's lock, and inspect names them
        shown = subprocess.run(_cli("inspect", str(dist / "fp32" / "tiny_cnn")), capture_output=True, text=True,
                               env=_isolated(root))
        assert not private.exists() and live.exists()
        assert "removed 1 leftover(s) of interrupted builds" in shown.stderr and str(private) in shown.stderr
        assert "LEFTOVER" in shown.stderr and str(partial) in shown.stderr
        private = _dead_private_dir(root)
        proc = subprocess.run(_cli("clean", "--stale", "-c", str(path)), capture_output=True, text=True,
                              env=_isolated(root))
        assert proc.returncode == 0, proc.stderr
        assert not private.exists() and not partial.exists() and live.exists()
        assert f"removed {partial}" in proc.stdout and str(private) in proc.stderr
    finally:
        live.rmdir()
        shutil.rmtree(private, ignore_errors=True)


@pytest.mark.parametrize("command", [["targets"], ["matrix", "--compact"], ["plan"], ["schema", "--check"]])
def test_every_command_removes_dead_processes_private_dirs_as_it_starts(make_project: Callable[..., Path],
                                                                         command: list[str], tmp_path: Path) -> None:
    """kill -9 leaves a build's plaintext in /dev/shm: the next ortbuild command of any kind removes it, not
    only the next build (`schema` takes no -c: run in the project's directory)."""
    path = make_project(TARGETS.split("[targets.int8]")[0])
    root = tmp_path / "tmpdir"
    root.mkdir()
    private = _dead_private_dir(root)
    live = Path(private.parent) / f"ortbuild-{os.getpid()}-{workspace._start_time(os.getpid())}-live"
    live.mkdir()
    try:
        args = command if command[0] == "schema" else [*command, "-c", str(path)]
        proc = subprocess.run(_cli(*args), capture_output=True, text=True, cwd=path.parent, env=_isolated(root))
        assert not private.exists(), proc.stderr
        assert live.exists()
        assert f"removed 1 leftover(s) of interrupted builds: {private}" in proc.stderr
        proc = subprocess.run(_cli(*args), capture_output=True, text=True, cwd=path.parent, env=_isolated(root))
        assert "leftover" not in proc.stderr  # nothing left, nothing said
    finally:
        live.rmdir()
        shutil.rmtree(private, ignore_errors=True)


@pytest.mark.parametrize("n", [2, 3])
@pytest.mark.slow
def test_concurrent_builds_with_different_settings_never_mismatch(make_project: Callable[..., Path], n: int) -> None:
    base = make_project(TARGETS, models=("tiny_cnn", "tiny_lstm"))
    text = base.read_text()
    variants = []
    for i, level in enumerate(["all", "basic", "extended"][:n]):
        v = base.parent / f"targets-{i}.toml"
        v.write_text(text.replace('providers = ["CPUExecutionProvider"]',
                                  f'providers = ["CPUExecutionProvider"]\noptimization = "{level}"'))
        variants.append(v)
    dist = base.parent / "dist"
    procs = [subprocess.Popen(_cli("build", "-c", str(v), "--dist", str(dist)), stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True) for v in variants]
    outs = [p.communicate(timeout=600) for p in procs]
    assert [p.returncode for p in procs] == [0] * n, [e for _, e in outs]
    assert any("waiting for" in err and "locked by pid" in err for _, err in outs)
    assert _assert_no_torn_state(dist) == 4
    # the artifacts on disk are exactly one of the variants' builds, each matching its own manifest
    levels = {manifest.read(f)[0].optimization.requested for f in _artifacts(dist)}
    assert len(levels) == 1


def test_lock_times_out_naming_the_holder_and_dead_holders_are_taken_over(make_project: Callable[..., Path]) -> None:
    path = make_project(TARGETS.split("[targets.int8]")[0])
    dist = path.parent / "dist"
    with workspace.Lock(dist, command="ortbuild build (the test holds it)"):
        proc = subprocess.run(_cli("build", "-c", str(path), "--lock-timeout", "1"), capture_output=True, text=True)
        assert proc.returncode == Busy.exit_code
        assert f"locked by pid {os.getpid()} (ortbuild build (the test holds it)" in proc.stderr
        assert "gave up after 1 s" in proc.stderr and "Traceback" not in proc.stderr
    dead = subprocess.Popen(["sleep", "0"])
    dead.wait()
    (dist / workspace.LOCK).write_text(json.dumps({"pid": dead.pid, "start": "1", "command": "ortbuild build",
                                                   "since": "earlier"}))
    proc = subprocess.run(_cli("build", "-c", str(path)), capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0 and f"took over the lock of pid {dead.pid}" in proc.stderr


@pytest.mark.slow
def test_a_damaged_manifest_is_tampered_and_only_repair_rebuilds_it(make_project: Callable[..., Path]) -> None:
    path = make_project(TARGETS.split("[targets.int8]")[0])
    assert subprocess.run(_cli("build", "-c", str(path)), capture_output=True).returncode == 0
    folder = path.parent / "dist" / "fp32" / "tiny_cnn"
    doc = (folder / "manifest.json").read_text()
    (folder / "manifest.json").write_text(doc.replace('"artifact"', '"artifacT"', 1))
    shown = subprocess.run(_cli("inspect", str(folder)), capture_output=True, text=True)
    assert shown.returncode == 7 and "TAMPERED" in shown.stderr + shown.stdout, shown.stderr
    assert "Traceback" not in shown.stderr
    plan = subprocess.run(_cli("plan", "-c", str(path), "--json"), capture_output=True, text=True)
    assert json.loads(plan.stdout)[0]["why"].startswith("TAMPERED")
    proc = subprocess.run(_cli("build", "-c", str(path)), capture_output=True, text=True)
    assert proc.returncode == 7 and "TAMPERED" in proc.stderr and "--repair" in proc.stderr, proc.stderr
    assert "artifacT" in (folder / "manifest.json").read_text()  # replaced nothing
    proc = subprocess.run(_cli("build", "-c", str(path), "--repair"), capture_output=True, text=True)
    assert proc.returncode == 0 and "1 built" in proc.stdout
    assert "note: TAMPERED, replaced on --repair" in proc.stdout
    assert _assert_no_torn_state(path.parent / "dist") == 1


def test_clean_empties_only_an_output_directory_ortbuild_made(make_project: Callable[..., Path],
                                                              tmp_path: Path) -> None:
    path = make_project(TARGETS.split("[targets.int8]")[0])
    mine = tmp_path / "v"
    mine.mkdir()
    (mine / "important.txt").write_text("keep me")
    proc = subprocess.run(_cli("clean", "-c", str(path), "--dist", str(mine)), capture_output=True, text=True)
    assert proc.returncode == 2 and "not an ortbuild output directory" in proc.stderr, proc.stderr
    assert (mine / "important.txt").read_text() == "keep me" and not (mine / workspace.LOCK).exists()
    assert subprocess.run(_cli("build", "-c", str(path)), capture_output=True).returncode == 0
    dist = path.parent / "dist"
    assert workspace.owned(dist)
    proc = subprocess.run(_cli("clean", "-c", str(path)), capture_output=True, text=True)
    assert proc.returncode == 0 and not (dist / "fp32").exists(), proc.stderr
    assert sorted(p.name for p in dist.iterdir()) == [workspace.MARKER, workspace.LOCK]
    # a build into a directory that already held the user's files never marks it as ortbuild's
    assert subprocess.run(_cli("build", "-c", str(path), "--dist", str(mine)), capture_output=True).returncode == 0
    assert not workspace.owned(mine)
    proc = subprocess.run(_cli("clean", "-c", str(path), "--dist", str(mine)), capture_output=True, text=True)
    assert proc.returncode == 2 and (mine / "important.txt").exists()


def test_clean_removes_only_what_ortbuild_made_and_says_what_it_kept(make_project: Callable[..., Path]) -> None:
    path = make_project(TARGETS.split("[targets.int8]")[0])
    assert subprocess.run(_cli("test", "-c", str(path), "--no-explain"), capture_output=True).returncode == 0
    dist = path.parent / "dist"
    art = dist / "fp32" / "tiny_cnn"
    ours = [art / "manifest.json", art / "manifest.sig", art / "model.onnx.enc", art / "test-report.json",
            art / "golden" / "golden.json", art / "loader" / "ortbuild_tiny_cnn.py", dist / "report.json",
            dist / "report.html", dist / "logs" / "fp32" / "tiny_cnn.build.json"]
    assert all(p.is_file() for p in ours), [p for p in ours if not p.is_file()]
    legacy = art / "loader" / "ortbuild_loader.py"  # the Python loader's name before per-model names: still ortbuild's
    legacy.write_text("# generated by an older ortbuild\n")
    ours.append(legacy)
    user = {dist / "NOTES.txt": "mine", dist / "userdir" / "sub" / "model.onnx": "mine too",
            dist / "fp32" / "notes.md": "about fp32", art / "mine.txt": "beside the artifact",
            art / "loader" / "patch.diff": "my loader change", dist / "logs" / "what-i-saw.txt": "a note",
            dist / "release" / "README": "how we ship"}
    for p, text in user.items():
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text(text)
    (dist / "empty").mkdir()  # the user's, empty: clean leaves it too
    proc = subprocess.run(_cli("clean", "-c", str(path)), capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    assert not any(p.exists() for p in ours), [p for p in ours if p.exists()]
    assert {p: p.read_text() for p in user} == user and (dist / "empty").is_dir()
    for p in [*user, dist / "empty"]:
        kept = dist / p.relative_to(dist).parts[0] if p.parent == dist or "userdir" in p.parts or p.name == "empty" \
            else p
        assert f"kept    {kept}: not made by ortbuild" in proc.stdout, proc.stdout
    assert "remove them yourself if you mean to" in proc.stdout
    assert not (art / "golden").exists() and not (dist / "report.json").exists()
    assert workspace.owned(dist)  # still ortbuild's: the next build and clean work as before
    # what the user left beside the artifact directories stays through a build and a second clean; a clean with
    # nothing of the user's left keeps nothing
    assert subprocess.run(_cli("build", "-c", str(path)), capture_output=True).returncode == 0
    proc = subprocess.run(_cli("clean", "-c", str(path)), capture_output=True, text=True)
    assert proc.returncode == 0 and (dist / "NOTES.txt").read_text() == "mine"
    assert (dist / "userdir" / "sub" / "model.onnx").read_text() == "mine too"
    for p in dist.iterdir():
        if p.name not in (workspace.MARKER, workspace.LOCK):
            shutil.rmtree(p) if p.is_dir() else p.unlink()
    assert subprocess.run(_cli("build", "-c", str(path)), capture_output=True).returncode == 0
    proc = subprocess.run(_cli("clean", "-c", str(path)), capture_output=True, text=True)
    assert proc.returncode == 0 and "kept" not in proc.stdout and not (dist / "fp32").exists(), proc.stdout


def test_a_symlinked_lock_file_is_a_clear_error_never_written_through(make_project: Callable[..., Path],
                                                                      tmp_path: Path) -> None:
    path = make_project(TARGETS.split("[targets.int8]")[0])
    dist = path.parent / "dist"
    dist.mkdir()
    victim = tmp_path / "victim"
    victim.write_text("keep me")
    (dist / workspace.LOCK).symlink_to(victim)
    proc = subprocess.run(_cli("build", "-c", str(path)), capture_output=True, text=True)
    assert proc.returncode == 7 and "is a symlink" in proc.stderr and "internal error" not in proc.stderr
    assert victim.read_text() == "keep me"


def test_the_private_dir_is_in_memory_when_it_has_room_else_on_disk_and_always_0700(tmp_path: Path) -> None:
    import stat

    shm = Path("/dev/shm")
    if not (shm.is_dir() and os.access(shm, os.W_OK)):
        pytest.skip("no writable /dev/shm here")
    for need, root in ((1 << 20, shm), (1 << 60, Path(tempfile.gettempdir()))):  # 1 EiB: no /dev/shm has room
        with workspace.private_dir(need) as d:
            assert d.parent == root and d.name.startswith(workspace.PRIVATE_PREFIX)
            assert stat.S_IMODE(d.stat().st_mode) == 0o700
            (d / "model.onnx").write_bytes(b"plaintext")
        assert not d.exists()  # removed when the job ends


def test_a_small_dev_shm_puts_the_private_dir_beside_the_locked_dist_0700_and_says_so(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    import stat

    monkeypatch.delenv(workspace.TMPDIR_ENV, raising=False)
    monkeypatch.setattr(workspace, "shm_free", lambda: 64 << 20)  # a container's /dev/shm
    dist = tmp_path / "dist"
    with workspace.Lock(dist), workspace.private_dir(1 << 30) as d:
        # on the build's file system, in dist/ itself (not in dist/<target>/), a partial the next run's clean removes
        assert d.parent == dist.absolute() and d.name.startswith(f".{workspace.PRIVATE_PREFIX}{os.getpid()}-")
        assert d.name.endswith(".partial") and d in [p.absolute() for p in workspace.partial_files(dist)]
        assert stat.S_IMODE(d.stat().st_mode) == 0o700
        (d / "model.onnx").write_bytes(b"plaintext")
    assert not d.exists() and sorted(p.name for p in dist.iterdir()) == sorted([workspace.LOCK, workspace.MARKER])
    lines = [line for line in capsys.readouterr().err.splitlines() if "private temp dir" in line]
    assert lines == [f"ortbuild: private temp dir {d} (mode 0700, removed when the build ends): /dev/shm has 64 MB "
                     "free, less than the 1024 MB this build may need"]
    # no output directory locked (a command that builds nothing): the system temp dir, said the same way
    with workspace.private_dir(1 << 30) as d:
        assert d.parent == Path(tempfile.gettempdir()) and stat.S_IMODE(d.stat().st_mode) == 0o700
    assert f"private temp dir {d} " in capsys.readouterr().err
    # room on /dev/shm: there, without a word
    monkeypatch.setattr(workspace, "shm_free", lambda: 1 << 40)
    if Path("/dev/shm").is_dir() and os.access("/dev/shm", os.W_OK):
        with workspace.Lock(dist), workspace.private_dir(1 << 30) as d:
            assert d.parent == Path("/dev/shm")
        assert "private temp dir" not in capsys.readouterr().err


def test_ortbuild_tmpdir_is_the_only_place_private_dirs_are_made_and_swept(make_project: Callable[..., Path],
                                                                          tmp_path: Path,
                                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    own, shm = tmp_path / "own", Path("/dev/shm")
    own.mkdir()
    monkeypatch.setenv(workspace.TMPDIR_ENV, str(own))
    with workspace.private_dir(1 << 60) as d:  # more than any /dev/shm holds: the setting still decides
        assert d.parent == own and oct(d.stat().st_mode & 0o777) == "0o700"
    assert workspace.private_roots() == [own]
    dead = _dead_private_dir(own)
    proc = subprocess.run(_cli("plan", "-c", str(make_project(TARGETS))), capture_output=True, text=True,
                          env={**os.environ, "TMPDIR": str(tmp_path)})
    assert proc.returncode == 0 and not dead.exists(), proc.stderr
    assert f"removed 1 leftover(s) of interrupted builds: {dead}" in proc.stderr  # and nothing from /dev/shm
    # not a directory, or a symlink: every command refuses, naming the variable and what to do
    for bad in (tmp_path / "missing", tmp_path / "link"):
        if bad.name == "link":
            bad.symlink_to(own)
        proc = subprocess.run(_cli("plan", "-c", str(tmp_path / "targets.toml")), capture_output=True, text=True,
                              env={**os.environ, workspace.TMPDIR_ENV: str(bad)})
        assert proc.returncode == 2, proc.stderr
        assert f"{workspace.TMPDIR_ENV}={bad} is not a directory" in proc.stderr and "hint: create it" in proc.stderr
        assert "Traceback" not in proc.stderr
    monkeypatch.delenv(workspace.TMPDIR_ENV)
    assert own not in workspace.private_roots() and (shm in workspace.private_roots()) == shm.is_dir()


def test_the_private_dir_of_a_process_that_exited_but_is_not_reaped_yet_is_removable(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # a killed build's workers are orphans; some init processes reap them seconds later, and until then they
    # are zombies: their plaintext dirs are nobody's and the next build's recovery must remove them. In a root of
    # this test's own ($ORTBUILD_TMPDIR): another test's command, sweeping /dev/shm and /tmp, cannot remove it first
    monkeypatch.setenv(workspace.TMPDIR_ENV, str(tmp_path))
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    private = tmp_path / "never-made"
    try:
        start = workspace._start_time(child.pid)
        assert start is not None
        private = Path(tempfile.mkdtemp(prefix=f"{workspace.PRIVATE_PREFIX}{child.pid}-{start}-", dir=tmp_path))
        assert private not in workspace._dead_private_dirs()  # running: its dir is in use
        assert workspace.owner_alive(private) is True and workspace.owner_alive(tmp_path / "other-dir") is None
        child.kill()
        deadline = time.monotonic() + 10
        while _alive(child.pid):
            assert time.monotonic() < deadline
            time.sleep(0.01)
        assert private in workspace._dead_private_dirs()  # exited, not reaped (we have not waited for it)
        assert workspace.owner_alive(private) is False
    finally:
        child.kill()
        child.wait()
        shutil.rmtree(private, ignore_errors=True)


# ------------------------------------------------------------------------ no private dir after success

# The startup gate (fresh processes opening the artifact through its loader: about 2 s an artifact) runs where
# the loader differs, an .onnx (fp32) and an .ort (mobile) artifact; the other targets measure latency only.
LEAK_TARGETS = """
[targets.fp32]
runtime = "RUNTIME"
providers = ["CPUExecutionProvider"]
latency = { p90_ms = 1000, min_seconds = 0.1, cold_start_ms = 60000 }
memory = { peak_mb = 4096 }

[targets.int8]
runtime = "RUNTIME"
providers = ["CPUExecutionProvider"]
latency = { p90_ms = 1000, min_seconds = 0.1 }
precision = "int8-static"
models = ["tiny_cnn"]

[targets.fp16]
runtime = "RUNTIME"
providers = ["CPUExecutionProvider"]
latency = { p90_ms = 1000, min_seconds = 0.1 }
precision = "fp16"
optimization = "basic"

[targets.mobile]
extends = "fp32"
precision = "int8-dynamic"
format = "ort"
optimization = "basic"

[targets.fused]
runtime = "RUNTIME"
providers = ["CPUExecutionProvider"]
latency = { p90_ms = 1000, min_seconds = 0.1 }
fusion = { model_type = "bert" }
models = ["tiny_transformer"]
"""


class _Tree:
    """The pids of a process and of every descendant seen while it runs (/proc polled every few ms: a build's
    workers live as long as their jobs)."""

    def __init__(self, root: int) -> None:
        import threading

        self.pids = {root}
        self._done = threading.Event()
        self._thread = threading.Thread(target=self._poll, daemon=True)
        self._thread.start()

    def _poll(self) -> None:
        # each process's parent, read once (from its /proc/PID/stat when first listed): a scan reads only the new
        # processes' stat files, so polling every few ms costs little CPU beside the other tests
        parent: dict[int, int] = {}
        while not self._done.is_set():
            for name in os.listdir("/proc"):
                if name.isdigit() and int(name) not in parent:
                    try:
                        parent[int(name)] = int(Path(f"/proc/{name}/stat").read_text().rsplit(")", 1)[1].split()[1])
                    except (OSError, ValueError, IndexError):
                        continue
            while new := {pid for pid, ppid in parent.items() if ppid in self.pids and pid not in self.pids}:
                self.pids |= new  # children, then theirs, whichever order the scan listed them in
            time.sleep(0.005)

    def stop(self) -> set[int]:
        self._done.set()
        self._thread.join()
        return self.pids


def _private_dirs(roots: list[Path]) -> set[Path]:
    return {d for r in roots if r.is_dir() for d in r.glob(f"{workspace.PRIVATE_PREFIX}*-*-*")}


def test_a_successful_build_test_and_profile_leave_no_private_dir(make_project: Callable[..., Path],
                                                                   tmp_path: Path) -> None:
    """Each step that writes plaintext (precision fp16/int8 static and dynamic, fusion, .ort, the golden and startup
    gates, the profiler) runs through a successful build, test and profile in worker processes; afterwards no
    private dir (ortbuild-<pid>-<start>-*) of the CLI or any of its processes is left in /dev/shm, and nothing at
    all in the run's own TMPDIR nor in its private dirs' root ($ORTBUILD_TMPDIR: a directory of this test's own,
    so that it runs beside other tests' builds)."""
    path = make_project(LEAK_TARGETS, models=("tiny_cnn", "tiny_transformer"), calibration=True)
    tmp, private = tmp_path / "tmp", tmp_path / "private"
    tmp.mkdir()
    private.mkdir()
    roots = [Path("/dev/shm"), tmp, private]
    before = _private_dirs(roots)
    env = {**os.environ, "TMPDIR": str(tmp), "ORTBUILD_TMPDIR": str(private)}
    for args in (["build", "-j", "2"], ["test"], ["profile", "--runs", "3"]):
        proc = subprocess.Popen(_cli(*args, "-c", str(path)), cwd=path.parent, env=env, stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, text=True)
        tree = _Tree(proc.pid)
        out, err = proc.communicate(timeout=900)
        pids = tree.stop()
        assert proc.returncode == 0, (args, out[-2000:], err[-3000:])
        left = [d for d in _private_dirs(roots) - before if int(d.name.split("-")[1]) in pids]
        assert left == [], f"`ortbuild {' '.join(args)}` succeeded and left {left} (its pids: {sorted(pids)})"
        assert list(tmp.iterdir()) == [], f"`ortbuild {' '.join(args)}` left files in its TMPDIR"
        assert list(private.iterdir()) == [], f"`ortbuild {' '.join(args)}` left files in $ORTBUILD_TMPDIR"
    assert len(list((path.parent / "dist").glob("*/*/test-report.json"))) == 8
