"""Third-party output, kept off the terminal: what ONNX Runtime (its C++ logger writes to the process's stderr),
the quantizers and optimizers (Python logging, print) and Python warnings say while a job runs goes into that
job's log file, dist/logs/<target>/<model>.<phase>.log; the terminal shows one line per job and, at the end,
how many lines and warnings each log holds. `ortbuild -v` captures nothing. Stdlib and files.py only.

The capture is at the file-descriptor level (dup2 of 1 and 2), so native code is captured too; ortbuild's own
progress writes to a duplicate of the terminal's descriptor taken before (`terminal`). A log is a new file that
replaces the old one, below the output directory, without following a symlink (files.py).
"""

from __future__ import annotations

import contextlib
import logging
import os
import re
import sys
import warnings
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TextIO

from ortbuild import files

LOG_DIR = "logs"  # in dist/
# lines that are warnings or errors: ORT's C++ logger ("[W:onnxruntime:...", "[E:...", after its colour code and
# timestamp where it writes them), Python's logging and warnings ("WARNING", "UserWarning: ..."), and ORT Python's
# "*** EP Error ***" blocks
_WARNING = re.compile(r"^\s*(\x1b\[[0-9;]*m)?\s*(\d{4}-\d\d-\d\d [\d:.]+ )?\[(W|E|F):|\bWARNING\b|\bERROR\b|Warning:"
                      r"|\*\*\* EP Error", re.I)


def log_path(dist: Path, target: str, model: str, phase: str) -> Path:
    return dist / LOG_DIR / target / f"{model}.{phase}.log"


@dataclass
class Captured:
    """What one capture wrote: its file, its lines and how many of them are warnings or errors."""

    path: Path | None
    lines: int = 0
    warnings: int = 0

    def summary(self) -> str:
        """`148 lines (3 warnings) in dist/logs/...`, or "" when nothing was written."""
        if self.path is None or not self.lines:
            return ""
        w = f" ({self.warnings} warning{'s' if self.warnings != 1 else ''})" if self.warnings else ""
        return f"{self.lines} line{'s' if self.lines != 1 else ''}{w} in {self.path}"


def terminal(stream: TextIO | None = None) -> TextIO:
    """A text stream to where `stream` (default: stderr) writes now, that keeps writing there while a capture
    redirects the process's descriptors: a duplicate of its descriptor (the stream itself where it has none)."""
    stream = stream or sys.stderr
    try:
        fd = stream.fileno()
    except (AttributeError, OSError, ValueError):  # a captured or in-memory stream: no descriptor to redirect
        return stream
    stream.flush()
    return os.fdopen(os.dup(fd), "w", buffering=1, encoding=getattr(stream, "encoding", None) or "utf-8",
                     errors="replace")


@contextlib.contextmanager
def captured(path: Path | None, root: Path) -> Iterator[Captured]:
    """Send this process's stdout, stderr, Python logging and warnings to `path` while the block runs: a new file
    that replaces the old one (below `root`, no symlink followed: files.py); None: capture nothing (verbose)."""
    cap = Captured(path)
    if path is None:
        yield cap
        return
    for s in (sys.stdout, sys.stderr):
        with contextlib.suppress(Exception):
            s.flush()
    fd = files.fresh_file(path, root)
    saved = {n: os.dup(n) for n in (1, 2)}
    for n in (1, 2):
        os.dup2(fd, n)
    stream = os.fdopen(os.dup(fd), "w", buffering=1, encoding="utf-8", errors="replace")
    handler = logging.StreamHandler(stream)
    handler.setFormatter(logging.Formatter("%(levelname)s %(name)s: %(message)s"))
    logger = logging.getLogger()
    level = logger.level
    logger.addHandler(handler)
    logger.setLevel(min(level, logging.INFO) if level else logging.INFO)
    logging.captureWarnings(True)
    streams = sys.stdout, sys.stderr
    sys.stdout = sys.stderr = stream  # Python-level writers too, where sys.stdout is not descriptor 1
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("default")
            yield cap
    finally:
        sys.stdout, sys.stderr = streams
        logging.captureWarnings(False)
        logger.removeHandler(handler)
        logger.setLevel(level)
        for s in (sys.stdout, sys.stderr, stream):
            with contextlib.suppress(Exception):
                s.flush()
        stream.close()
        for n, dup in saved.items():
            os.dup2(dup, n)
            os.close(dup)
        try:
            _count(cap, fd)
        finally:
            os.close(fd)


def _count(cap: Captured, fd: int) -> None:
    """Count the log's lines from its descriptor (the file the capture wrote, whatever its name holds now)."""
    assert cap.path is not None
    chunks = []
    try:
        os.lseek(fd, 0, os.SEEK_SET)
        while piece := os.read(fd, 1 << 20):
            chunks.append(piece)
    except OSError:
        return
    text = b"".join(chunks).decode("utf-8", errors="replace")
    lines = [line for line in text.splitlines() if line.strip()]
    cap.lines = len(lines)
    cap.warnings = sum(1 for line in lines if _WARNING.search(line))
    if not lines:
        cap.path.unlink(missing_ok=True)  # nothing said: no file to look at


def footer(caps: list[tuple[str, Captured]], verbose_flag: str = "-v") -> list[str]:
    """The end-of-command lines about what the tools said: a total, and the logs with warnings in them."""
    said = [(job, c) for job, c in caps if c.lines]
    if not said:
        return []
    total = sum(c.lines for _, c in said)
    warns = sum(c.warnings for _, c in said)
    where = {str(c.path.parent.parent) for _, c in said if c.path is not None}
    out = [f"third-party output: {total} line{'s' if total != 1 else ''}, {warns} warning"
           f"{'s' if warns != 1 else ''}, kept in {', '.join(sorted(where))}/ ({verbose_flag} shows it as it runs)"]
    out += [f"  [{job}] {c.summary()}" for job, c in said if c.warnings]
    return out
