"""File utilities: the sha256 of a file, and writes that a crash never leaves half done (a partial file beside
the target, fsynced, then renamed over it). Stdlib only: anything may import it."""

from __future__ import annotations

import hashlib
import os
import shutil
import tempfile
from pathlib import Path


def sha256_file(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def partial_file(path: Path) -> Path:
    """A new, empty temp file beside `path` (`.NAME.*.partial`: crash recovery removes what is left of it), to be
    renamed over `path` once written."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".partial", dir=path.parent)
    os.close(fd)
    return Path(tmp)


def atomic_write(path: Path, data: bytes) -> None:
    """Write to a partial file in the same directory, fsync, then rename over `path`."""
    tmp = partial_file(path)
    try:
        with open(tmp, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def atomic_copy(src: Path, dst: Path) -> None:
    """Copy `src` to `dst` through a partial file (streamed: never whole in memory)."""
    tmp = partial_file(dst)
    try:
        with open(src, "rb") as a, open(tmp, "wb") as b:
            shutil.copyfileobj(a, b, 1 << 20)
            b.flush()
            os.fsync(b.fileno())
        os.replace(tmp, dst)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
