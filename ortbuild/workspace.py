"""Where builds write: one writer per output directory (a lock), private temp space, and no leftovers.

- `Lock(dist)`: an exclusive `fcntl.flock` on dist/.ortbuild.lock. The kernel drops it when its process dies,
  so the lock of a killed build is taken over at once; the file names the holder (pid, command, start) so a
  waiting process says whom it waits for, and gives up after a timeout.
- `private_dir()`: the build's temp space (it holds plaintext models): mode 0700, in $ORTBUILD_TMPDIR where set,
  else on /dev/shm when it has room for `temp_need()` of the model's real size (all its files), else beside the
  output directory this process has locked (dist/.ortbuild-*.partial: the build's own file system, never inside
  dist/<target>; the build log says so), else in the system temp dir, named ortbuild-<pid>-<process start time>-*,
  so a later run can tell a live build's directory from a dead one's.
- `no_core_dumps()`: no core file of a process that holds plaintext or keys (nor of the processes it starts).
- `leftovers()` / `clean()`: what killed builds leave: private dirs of dead processes (anywhere we put them),
  and partial files (`.NAME.*.partial`, `.golden.*`) in dist/, which only a lock holder may remove.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import shutil
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path

from ortbuild.errors import Busy, UsageError
from ortbuild.paths import UnsafePath

LOCK = ".ortbuild.lock"
# In every output directory ortbuild created (or found empty): `ortbuild clean` empties only a directory that holds
# it, so a mistyped --dist never costs a user's files
MARKER = ".ortbuild-dist"
PRIVATE_PREFIX = "ortbuild-"
PARTIAL_GLOBS = ("*.partial", ".golden.*")  # atomic_write's temp files, golden's temp dirs
# Where set, the only place private dirs are made and looked for (a tmpfs of the user's choosing where /dev/shm is
# small, as in a container; a test's own directory, so that no other process's sweep races it)
TMPDIR_ENV = "ORTBUILD_TMPDIR"


def _start_time(pid: int) -> str | None:
    """The process's start time in clock ticks since boot (/proc/PID/stat field 22), or None if it is gone or
    has exited and waits to be reaped (a zombie writes nothing more; some init processes reap orphans, such as
    the workers of a killed build, only seconds later)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    fields = stat.rsplit(")", 1)[1].split()
    return None if fields[0] in ("Z", "X") else fields[19]


def _alive(pid: int, start: str | None) -> bool:
    now = _start_time(pid)
    if now is None:
        if Path("/proc/self/stat").exists():
            return False
        try:  # no /proc (not Linux): fall back to a signal-0 probe
            os.kill(pid, 0)
        except ProcessLookupError:
            return False
        except PermissionError:
            return True
        return True
    return start is None or now == start  # same pid, other start time: the pid was reused


def _tag() -> str:
    return f"{os.getpid()}-{_start_time(os.getpid()) or 0}"


# --------------------------------------------------------------------------------------- private dirs

def configured_root() -> Path | None:
    """$ORTBUILD_TMPDIR: an existing directory of this user's, not a symlink; None where unset."""
    value = os.environ.get(TMPDIR_ENV, "")
    if not value:
        return None
    root = Path(value).absolute()
    if root.is_symlink() or not root.is_dir():
        raise UsageError(f"{TMPDIR_ENV}={value} is not a directory: the build's private temp dirs (which hold "
                         "plaintext models) go there", f"create it (a tmpfs keeps plaintext off the disk), or "
                         f"unset {TMPDIR_ENV} for /dev/shm or the system temp dir")
    if root.stat().st_uid != os.getuid():
        raise UsageError(f"{TMPDIR_ENV}={value} belongs to another user: the build's plaintext would sit in a "
                         "directory they control", f"point {TMPDIR_ENV} at a directory of your own")
    return root


def private_roots() -> list[Path]:
    """Where private dirs are made and where the sweep of dead ones looks."""
    own = configured_root()
    roots = [own] if own is not None else [Path("/dev/shm"), Path(tempfile.gettempdir())]
    return [r for r in dict.fromkeys(roots) if r.is_dir()]


SHM = Path("/dev/shm")
_LOCKED: list[Path] = []  # the output directories this process holds the lock of (Lock), innermost last


def shm_free() -> int | None:
    """Bytes free on /dev/shm for this process, or None where there is no /dev/shm it can write to."""
    try:
        st = os.statvfs(SHM)
    except OSError:
        return None
    return st.f_bavail * st.f_frsize if os.access(SHM, os.W_OK | os.X_OK) else None


def _private_root(need: int) -> tuple[Path | None, str]:
    """Where a private dir goes, and why there when it is not /dev/shm or $ORTBUILD_TMPDIR ("" then): the setting
    where set; else /dev/shm (memory-backed: plaintext never reaches a disk) when it has room; else the output
    directory this process has locked (the build's own file system: a container's /dev/shm is often 64 MB, the
    system temp dir another small tmpfs); else the system temp dir (None)."""
    own = configured_root()
    if own is not None:
        return own, ""
    free = shm_free()
    if free is not None and free > need:
        return SHM, ""
    why = (f"{SHM} has {free / (1 << 20):.0f} MB free, less than the {need / (1 << 20):.0f} MB this build may need"
           if free is not None else f"there is no writable {SHM}")
    return (_LOCKED[-1] if _LOCKED else None), why


def temp_need(model_bytes: int) -> int:
    """Temp space one job's build may need for a model of `model_bytes` (all its files): at most two plaintext
    models at once (a step's input and output; each intermediate is removed when the next step has run)."""
    return 2 * model_bytes + (64 << 20)


@contextlib.contextmanager
def private_dir(need: int) -> Iterator[Path]:
    """A private (0700) temp dir for one job's build phase, removed when the job ends however it ends,
    short of kill -9; then the next run's clean() removes it."""
    root, why = _private_root(need)
    if root is not None and root in _LOCKED:  # a partial of dist/: the next run's clean() removes it if this one dies
        path = Path(tempfile.mkdtemp(prefix=f".{PRIVATE_PREFIX}{_tag()}-", suffix=".partial", dir=root))
    else:
        path = Path(tempfile.mkdtemp(prefix=f"{PRIVATE_PREFIX}{_tag()}-", dir=root))
    if why:
        print(f"ortbuild: private temp dir {path} (mode 0700, removed when the build ends): {why}", file=sys.stderr,
              flush=True)
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


def _dead_private_dirs() -> list[Path]:
    found = []
    for root in private_roots():
        try:
            entries = list(root.glob(f"{PRIVATE_PREFIX}*-*-*"))
        except OSError:
            continue
        for d in entries:
            try:
                owned = d.is_dir() and not d.is_symlink() and d.stat().st_uid == os.getuid()
            except OSError:
                continue
            if owned and owner_alive(d) is False:
                found.append(d)
    return found


def owner_alive(d: Path) -> bool | None:
    """Whether the ortbuild process that made private dir `d` still runs; None where `d` is not one of ours."""
    parts = d.name[len(PRIVATE_PREFIX):].split("-") if d.name.startswith(PRIVATE_PREFIX) else []
    if len(parts) < 3 or not (parts[0].isdigit() and parts[1].isdigit()):
        return None
    return _alive(int(parts[0]), parts[1])


def remove_dead_private_dirs() -> list[Path]:
    """Remove the private temp dirs of dead ortbuild processes (a kill -9'd build's: they may hold plaintext) and
    return them. Every command calls it as it starts (cli.main): two directory listings, nothing when none is
    left. A live process's dir is never touched; a dir another command removes at the same time is skipped."""
    removed = []
    for d in _dead_private_dirs():
        shutil.rmtree(d, ignore_errors=True)
        if not d.exists():
            removed.append(d)
    return removed


# -------------------------------------------------------------------------------------------- leftovers

def partial_files(folder: Path) -> list[Path]:
    """Temp files and dirs of interrupted writes under `folder` (a dist/ or one artifact directory)."""
    if not folder.is_dir():
        return []
    return sorted({p for pattern in PARTIAL_GLOBS for p in folder.rglob(pattern)})


def leftovers(dist: Path | None) -> list[Path]:
    """Everything dead builds left: their private temp dirs (plaintext!) and, in dist/, partial files."""
    return [*_dead_private_dirs(), *(partial_files(dist) if dist is not None else [])]


def mark(folder: Path) -> None:
    """Say that ortbuild made `folder` (its output directory), so that `clean` may empty it."""
    fd = os.open(folder / MARKER, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | getattr(os, "O_NOFOLLOW", 0), 0o644)
    with os.fdopen(fd, "w") as f:
        f.write("# ortbuild's output directory: `ortbuild clean` empties it.\n")


def owned(folder: Path) -> bool:
    """Whether ortbuild made this output directory (it holds the marker, a plain file)."""
    return (folder / MARKER).is_file() and not (folder / MARKER).is_symlink()


def clean(dist: Path | None) -> list[Path]:
    """Remove leftovers. Call it holding dist's lock: partial files in dist/ are then never a live write's."""
    removed = remove_dead_private_dirs()
    for p in partial_files(dist) if dist is not None else []:
        try:
            if p.is_dir() and not p.is_symlink():
                shutil.rmtree(p)
            else:
                p.unlink()
        except FileNotFoundError:
            pass
        removed.append(p)
    return removed


# ------------------------------------------------------------------------------------------------- lock

def holder(dist: Path) -> dict[str, object] | None:
    """Who holds (or last held) dist's lock, as written in the lock file."""
    try:
        info = json.loads((dist / LOCK).read_text() or "null")
    except (OSError, ValueError):
        return None
    return info if isinstance(info, dict) else None


class Lock:
    """An exclusive lock on one output directory, for the whole of a command that writes into it."""

    def __init__(self, dist: Path, *, timeout: float = 600.0, say: Callable[[str], None] | None = None,
                 command: str = "") -> None:
        self.dist = dist
        self.timeout = timeout
        self.say = say or (lambda text: print(f"ortbuild: {text}", file=sys.stderr, flush=True))
        self.command = command or " ".join(["ortbuild", *sys.argv[1:]])[:200]
        self.fd: int | None = None

    def __enter__(self) -> Lock:
        ours = not self.dist.exists() or (self.dist.is_dir() and not any(self.dist.iterdir()))
        try:
            self.dist.mkdir(parents=True, exist_ok=True)
            fd = os.open(self.dist / LOCK, os.O_RDWR | os.O_CREAT | getattr(os, "O_NOFOLLOW", 0), 0o600)
        except OSError as e:  # ELOOP: the lock file is a symlink (never written through); not a directory; ...
            what = "is a symlink" if (self.dist / LOCK).is_symlink() else f"cannot be opened ({e.strerror})"
            raise UnsafePath(f"{self.dist / LOCK} {what}: ortbuild locks its output directory with this file and "
                             "never writes through a symlink",
                             f"remove {self.dist / LOCK} (no ortbuild process holds it then) or choose another "
                             "--dist") from None
        start, told = time.monotonic(), False
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                who = holder(self.dist) or {}
                if time.monotonic() - start >= self.timeout:
                    os.close(fd)
                    raise Busy(f"{self.dist} is locked by pid {who.get('pid', '?')} ({who.get('command', '?')}, "
                               f"since {who.get('since', '?')}); gave up after {self.timeout:.0f} s",
                               "wait for that build to finish, or raise --lock-timeout") from None
                if not told:
                    self.say(f"waiting for {self.dist}: locked by pid {who.get('pid', '?')} "
                             f"({who.get('command', '?')}, since {who.get('since', '?')}); "
                             f"timeout {self.timeout:.0f} s")
                    told = True
                time.sleep(0.1)
        before = holder(self.dist)
        pid = before.get("pid") if before else None
        if before and isinstance(pid, int) and pid != os.getpid() \
                and not _alive(int(pid), str(before.get("start")) if before.get("start") else None):
            self.say(f"took over the lock of pid {pid} ({before.get('command', '?')}), which is gone")
        info = {"pid": os.getpid(), "start": _start_time(os.getpid()), "command": self.command,
                "since": time.strftime("%Y-%m-%dT%H:%M:%S")}
        os.ftruncate(fd, 0)
        os.pwrite(fd, json.dumps(info).encode(), 0)
        self.fd = fd
        if ours:
            mark(self.dist)
        _LOCKED.append(self.dist.absolute())
        return self

    def __exit__(self, *exc: object) -> None:
        if self.fd is not None:
            if self.dist.absolute() in _LOCKED:
                _LOCKED.remove(self.dist.absolute())
            os.ftruncate(self.fd, 0)  # released cleanly: nobody to take over from
            fcntl.flock(self.fd, fcntl.LOCK_UN)
            os.close(self.fd)
            self.fd = None


def no_core_dumps(*, hard: bool = True) -> None:
    """Set RLIMIT_CORE to 0 for this process and every process it starts (they inherit it): a core dump of a
    process that holds a key or decrypted weights would hold them too. `hard` lowers the hard limit as well, so
    that no child raises it again (for good: only the ortbuild command's own process asks for that)."""
    try:
        import resource
    except ImportError:  # Windows: no such limit (Windows Error Reporting is configured system-wide)
        return
    soft_max = resource.getrlimit(resource.RLIMIT_CORE)[1]
    for limits in ((0, 0), (0, soft_max)) if hard else ((0, soft_max),):
        try:
            resource.setrlimit(resource.RLIMIT_CORE, limits)
            return
        except (OSError, ValueError):
            continue
