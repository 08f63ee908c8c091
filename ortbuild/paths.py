"""Safe names and paths: what may become a path component, where ortbuild may write, what it may read.

Target and model names become directories under dist/, so they are identifiers (NAME_PATTERN), never
path syntax. Every path ortbuild writes is checked to stay inside its output directory (`inside`).
Input paths (models, data) may live anywhere the user points, but must be regular files of a sane size,
or a directory in the documented layout; devices, FIFOs and over-long names get a clear error instead of
a hang, a read until memory runs out, or a traceback.
"""

from __future__ import annotations

import errno
import os
import re
import stat
from pathlib import Path

from ortbuild.errors import ArtifactError

# A target or model name: a letter or digit, then letters, digits, '_', '-' or '.', at most 64 in all.
NAME_PATTERN = r"[A-Za-z0-9][A-Za-z0-9_.-]{0,63}"
NAME_RE = re.compile(NAME_PATTERN)
NAME_RULE = "a letter or digit, then letters, digits, '_', '-' or '.' (at most 64 characters)"
# Names that would collide with what ortbuild keeps at the top of dist/ (beside the target directories).
RESERVED_NAMES = frozenset({"release", "report.json", "report.html"})

MAX_PATH = 4096        # Linux PATH_MAX
MAX_COMPONENT = 255    # Linux NAME_MAX
MAX_MODEL_BYTES = 2 << 30   # protobuf's limit for one .onnx file (larger models keep weights as external data)
MAX_DATA_BYTES = 16 << 30   # an .npz / .pb data file beyond this is a mistake, not golden data


def loader_module(model: str) -> str:
    """The import name of a model's generated Python loader: `ortbuild_` + the model name with '-' and '.' as '_'
    (a valid identifier for every NAME_PATTERN name, never a keyword), so one app imports several models' loaders
    side by side. Two model names that differ only there would share it: config.load refuses that pair."""
    return "ortbuild_" + model.replace("-", "_").replace(".", "_")


def name_problem(name: str) -> str | None:
    """Why `name` cannot be a target or model name, or None."""
    if not NAME_RE.fullmatch(name):
        shown = name if len(name) <= 80 else name[:77] + "..."
        return f"'{shown}' is not a valid name: use {NAME_RULE}"
    if name.lower() in RESERVED_NAMES:
        return f"'{name}' is reserved (ortbuild keeps {', '.join(sorted(RESERVED_NAMES))} in dist/)"
    return None


class UnsafePath(ArtifactError):
    """A path ortbuild was about to write lies outside its output directory (a name, or a symlink, leads out)."""


def inside(root: Path, *parts: str) -> Path:
    """root/parts..., refusing any result outside root (absolute parts, '..', symlinks pointing out)."""
    base = Path(os.path.abspath(root))
    path = base.joinpath(*parts)
    for b, p in ((str(base), os.path.abspath(path)), (os.path.realpath(base), os.path.realpath(path))):
        if os.path.commonpath([b, p]) != b:
            raise UnsafePath(f"refusing to write {path}: it resolves outside the output directory {base}",
                             "remove the symlink (or the name) that leads out of it")
    return path


def length_problem(path: Path) -> str | None:
    text = str(path)
    if len(text) > MAX_PATH:
        return f"the path is {len(text)} characters long (at most {MAX_PATH})"
    long = next((p for p in path.parts if len(p.encode()) > MAX_COMPONENT), None)
    if long is not None:
        return f"a path component is {len(long.encode())} bytes long (at most {MAX_COMPONENT}): '{long[:40]}...'"
    return None


def file_kind(mode: int) -> str:
    """What a file that is not a regular file is, in words (from its st_mode)."""
    for test, name in ((stat.S_ISCHR, "a character device"), (stat.S_ISBLK, "a block device"),
                       (stat.S_ISFIFO, "a FIFO (named pipe)"), (stat.S_ISSOCK, "a socket"),
                       (stat.S_ISDIR, "a directory"), (stat.S_ISLNK, "a symbolic link")):
        if test(mode):
            return name
    return "not a regular file"


def input_problem(path: Path, *, limit: int, directory_ok: bool = False) -> str | None:
    """Why `path` cannot be read as an input (a regular file of 1..limit bytes, or a directory if allowed)."""
    too_long = length_problem(path)
    if too_long:
        return too_long
    try:
        st = path.stat()  # follows symlinks: a link to a regular file is fine
    except FileNotFoundError:
        return "does not exist"
    except OSError as e:
        if e.errno == errno.ENAMETOOLONG:
            return "the name is too long for this file system"
        return f"cannot be read: {e.strerror or e}"
    if stat.S_ISDIR(st.st_mode) and directory_ok:
        return None
    if not stat.S_ISREG(st.st_mode):
        what = file_kind(st.st_mode)
        want = "a regular file or a directory in the documented layout" if directory_ok else "a regular file"
        return f"is {what}, not {want}"
    if st.st_size == 0:
        return "is empty"
    if st.st_size > limit:
        return f"is {st.st_size / (1 << 30):.1f} GiB, more than the {limit >> 30} GiB an input of this kind may be"
    if not os.access(path, os.R_OK):
        return "is not readable (permission denied)"
    return None
