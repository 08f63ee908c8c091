"""The order test files are handed to pytest-xdist's workers in: the heaviest first.

`--dist loadfile` keeps each file on one worker and hands files out in collection order (with
`--no-loadscope-reorder`; by default pytest-xdist orders them by their number of tests). A file whose tests take two
minutes, collected last, then runs alone at the end while the other workers wait: in CI's e2e pass the kill -9 file
(tests/test_workspace.py, collected among the last) ran by itself for the pass's last 110 s, one CPU of two idle.
Handing out the heaviest files first (longest processing time first) ends the workers together.

A file's weight is the sum of the recorded durations (setup, call and teardown) of its tests that the run selected,
from tests/durations.json (`ORTBUILD_DURATIONS_WRITE=1` records a run's own there, merged with what is there; only
tests of 0.5 s or more are kept). A test it does not name weighs nothing, so a new file goes after the recorded
ones, in collection order; stale entries only cost a little balance, never a test.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from pathlib import Path

from ortbuild.files import atomic_write

FILE = Path(__file__).with_name("durations.json")
WRITE_VAR = "ORTBUILD_DURATIONS_WRITE"
KEPT_FROM = 0.5  # seconds: lighter tests change no file's place much, and would make the file long


def load(path: Path = FILE) -> dict[str, float]:
    """The recorded durations (test node id: seconds); none where the file is missing or unreadable."""
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return {}
    return {str(k): float(v) for k, v in data.items()} if isinstance(data, dict) else {}


def heaviest_first(nodeids: Sequence[str], durations: Mapping[str, float]) -> list[int]:
    """The indexes of `nodeids` ordered file by file, the heaviest file first (ties and unrecorded files in
    collection order), each file's tests in their own order."""
    files = [nodeid.split("::", 1)[0] for nodeid in nodeids]
    weight: dict[str, float] = {}
    for f, nodeid in zip(files, nodeids, strict=True):
        weight[f] = weight.get(f, 0.0) + durations.get(nodeid, 0.0)
    first_seen = {f: i for i, f in enumerate(weight)}
    return sorted(range(len(nodeids)), key=lambda i: (-weight[files[i]], first_seen[files[i]], i))


def merged(recorded: Mapping[str, float], measured: Mapping[str, float]) -> dict[str, float]:
    """`recorded` updated with a run's `measured` durations: a test that ran takes its new figure (dropped when
    under KEPT_FROM); the others keep theirs."""
    out = {k: v for k, v in recorded.items() if k not in measured}
    out.update({k: round(v, 1) for k, v in measured.items() if v >= KEPT_FROM})
    return dict(sorted(out.items()))


def write(measured: Mapping[str, float], path: Path = FILE) -> None:
    """Merge a run's durations into `path` (ortbuild's own atomic write: never a half-written file)."""
    data = json.dumps(merged(load(path), measured), indent=0) + "\n"
    atomic_write(path, data.encode(), root=path.parent, mode=0o644)
