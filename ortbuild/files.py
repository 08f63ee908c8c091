"""File utilities: the sha256 of a file, and the one way ortbuild writes a file.

Every write names its *root*: the directory the user chose for it (the output directory dist/, a release
directory, a cache). The root itself may be anything the user points at, symlinks included; below it, ortbuild
never follows a symlink: each directory is created or opened one component at a time relative to its parent's
descriptor (`openat` with O_NOFOLLOW), so a symlink planted at `dist/logs` or `dist/<target>` is refused, and a
file is never written in place: a new temp file (O_EXCL, `.NAME.*.partial`: crash recovery removes what is left
of it) is written, fsynced, then renamed over the name, which replaces a symlink planted there instead of writing
through it. Only paths.py's error comes in; anything may import this module.
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import os
import secrets
import shutil
import stat
from collections.abc import Iterator
from pathlib import Path
from typing import BinaryIO

from ortbuild.paths import UnsafePath, file_kind

_CLOEXEC = getattr(os, "O_CLOEXEC", 0)
_NOFOLLOW = getattr(os, "O_NOFOLLOW", 0)
_DIRECTORY = getattr(os, "O_DIRECTORY", 0)


def sha256_file(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


MAX_DOCUMENT = 64 << 20  # a manifest, signature, report or record ortbuild wrote: far below this


class Unreadable(OSError):
    """A file ortbuild reads back (a manifest, a signature, a report) is not a regular file, or is larger than any
    it writes: a FIFO would block the read forever, /dev/zero or a huge file would fill the memory."""


def read_document(path: Path, limit: int = MAX_DOCUMENT, *, follow: bool = True) -> bytes:
    """The bytes of a file ortbuild wrote and reads back: a regular file (after symlinks; with follow=False a
    symlink is Unreadable too, and the last component is opened with O_NOFOLLOW) of at most `limit` bytes, opened
    without blocking and judged by the file opened (fstat), else Unreadable (an OSError: callers that handle an
    unreadable file handle it too); FileNotFoundError when it is not there."""
    before = (os.stat if follow else os.lstat)(path).st_mode  # a device or FIFO is not even opened
    if not stat.S_ISREG(before):
        raise Unreadable(errno.EINVAL, f"{file_kind(before)}, not a regular file", str(path))
    nofollow = 0 if follow else getattr(os, "O_NOFOLLOW", 0)
    fd = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | _CLOEXEC | nofollow)
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise Unreadable(errno.EINVAL, f"{file_kind(st.st_mode)}, not a regular file", str(path))
        if st.st_size > limit:
            raise Unreadable(errno.EFBIG, f"{st.st_size} bytes, more than the {limit} such a file may be", str(path))
        chunks, size = [], 0
        while piece := os.read(fd, min(1 << 20, limit + 1 - size)):
            chunks.append(piece)
            size += len(piece)
            if size > limit:
                raise Unreadable(errno.EFBIG, f"more than the {limit} bytes such a file may be", str(path))
        return b"".join(chunks)
    finally:
        os.close(fd)


def _parts(folder: Path, root: Path) -> tuple[Path, list[str]]:
    """The root (absolute) and the components of `folder` below it; a folder outside the root is refused."""
    base = Path(os.path.abspath(root))
    rel = os.path.relpath(os.path.abspath(folder), base)
    if rel == ".":
        return base, []
    if rel == ".." or rel.startswith(".." + os.sep) or os.path.isabs(rel):
        raise UnsafePath(f"refusing to write into {folder}: it lies outside {base}, where this write belongs",
                         "report this: ortbuild computed a path outside its output directory")
    return base, rel.split(os.sep)


def _refusal(path: Path, root: Path) -> UnsafePath:
    what = "is a symlink" if path.is_symlink() else "is not a directory"
    return UnsafePath(f"refusing to write into {path}: it {what}, and ortbuild never follows a symlink below {root}",
                      f"remove {path} (ortbuild makes it again as a plain directory), or choose another output "
                      "directory")


@contextlib.contextmanager
def opened_dir(folder: Path, root: Path) -> Iterator[int]:
    """A descriptor of `folder`, made as needed (0755), reached from `root` without following a symlink below it."""
    base, parts = _parts(folder, root)
    base.mkdir(parents=True, exist_ok=True)
    fd = os.open(base, os.O_RDONLY | _DIRECTORY | _CLOEXEC)
    try:
        here = base
        for part in parts:
            here = here / part
            with contextlib.suppress(FileExistsError):
                os.mkdir(part, 0o755, dir_fd=fd)
            try:
                sub = os.open(part, os.O_RDONLY | _DIRECTORY | _NOFOLLOW | _CLOEXEC, dir_fd=fd)
            except OSError as e:
                if e.errno in (errno.ELOOP, errno.ENOTDIR, errno.EMLINK):
                    raise _refusal(here, base) from None
                raise
            os.close(fd)
            fd = sub
        yield fd
    finally:
        os.close(fd)


def safe_mkdir(folder: Path, root: Path) -> Path:
    """Make `folder` (and its parents below `root`) as plain directories; a symlink on the way is refused."""
    with opened_dir(folder, root):
        return folder


def _temp_name(name: str) -> str:
    return f".{name}.{secrets.token_hex(4)}.partial"


def partial_file(path: Path, root: Path) -> Path:
    """A new, empty temp file beside `path` (`.NAME.*.partial`, mode 0600, created with O_EXCL in a directory
    reached without a symlink), to be written and then renamed over `path` (`publish`)."""
    with opened_dir(path.parent, root) as dfd:
        name = _temp_name(path.name)
        os.close(os.open(name, os.O_WRONLY | os.O_CREAT | os.O_EXCL | _NOFOLLOW | _CLOEXEC, 0o600, dir_fd=dfd))
    return path.parent / name


def open_partial(partial: Path) -> BinaryIO:
    """Open a `partial_file` for writing, refusing it if it was replaced by a symlink meanwhile."""
    fd = os.open(partial, os.O_WRONLY | os.O_TRUNC | _NOFOLLOW | _CLOEXEC)
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        raise UnsafePath(f"refusing to write {partial}: it is not the regular file ortbuild made",
                         "another process changed the output directory during the build: rerun it")
    return os.fdopen(fd, "wb")


def publish(partial: Path, path: Path, root: Path) -> None:
    """Rename a written partial file over `path` (both below `root`, their directories reached without a
    symlink; `path`'s made as needed)."""
    with opened_dir(partial.parent, root) as src, opened_dir(path.parent, root) as dst:
        os.replace(partial.name, path.name, src_dir_fd=src, dst_dir_fd=dst)


@contextlib.contextmanager
def _writing(path: Path, root: Path, mode: int = 0o600) -> Iterator[BinaryIO]:
    with opened_dir(path.parent, root) as dfd:
        tmp = _temp_name(path.name)
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | _NOFOLLOW | _CLOEXEC, 0o600, dir_fd=dfd)
        try:
            if mode != 0o600:
                os.fchmod(fd, mode)  # exactly `mode`, whatever the umask
            with os.fdopen(fd, "wb") as f:
                yield f
                f.flush()
                os.fsync(f.fileno())
            os.replace(tmp, path.name, src_dir_fd=dfd, dst_dir_fd=dfd)
        except BaseException:
            with contextlib.suppress(OSError):
                os.unlink(tmp, dir_fd=dfd)
            raise


def atomic_write(path: Path, data: bytes, *, root: Path, mode: int = 0o600) -> None:
    """Write `data` to a new temp file beside `path`, fsync, then rename over `path` (below `root`, no symlink
    followed). The file is private (0600) unless `mode` says otherwise."""
    with _writing(path, root, mode) as f:
        f.write(data)


def atomic_copy(src: Path, dst: Path, *, root: Path) -> None:
    """Copy `src` to `dst` as `atomic_write` does (streamed: never whole in memory)."""
    with open(src, "rb") as a, _writing(dst, root) as b:
        shutil.copyfileobj(a, b, 1 << 20)


def fresh_file(path: Path, root: Path, mode: int = 0o644) -> int:
    """A descriptor of a new, empty file at `path` that replaces whatever was there (a symlink included: it is
    replaced, never written through): for a file written while a command runs (a log)."""
    with opened_dir(path.parent, root) as dfd:
        tmp = _temp_name(path.name)
        fd = os.open(tmp, os.O_RDWR | os.O_CREAT | os.O_EXCL | _NOFOLLOW | _CLOEXEC, mode, dir_fd=dfd)
        try:
            os.replace(tmp, path.name, src_dir_fd=dfd, dst_dir_fd=dfd)
        except BaseException:
            os.close(fd)
            with contextlib.suppress(OSError):
                os.unlink(tmp, dir_fd=dfd)
            raise
    return fd
