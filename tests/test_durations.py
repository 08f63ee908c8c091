"""tests/durations.py: the heaviest test files are handed to pytest-xdist's workers first."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

from tests import durations
from tests.conftest import REPO


def test_files_go_heaviest_first_by_what_runs_of_them_each_in_its_own_order() -> None:
    ids = ["tests/a.py::x", "tests/a.py::y", "tests/b.py::x", "tests/c.py::x", "tests/d.py::x", "tests/d.py::y"]
    recorded = {"tests/a.py::x": 8.0, "tests/a.py::y": 0.5, "tests/b.py::x": 5.0, "tests/d.py::y": 1.0,
                "tests/c.py::gone": 99.0}
    assert [ids[i] for i in durations.heaviest_first(ids, recorded)] == [
        "tests/a.py::x", "tests/a.py::y", "tests/b.py::x", "tests/d.py::x", "tests/d.py::y", "tests/c.py::x"]
    # a.py's heavy test deselected: a.py weighs what is left of it
    left = [i for i in ids if i != "tests/a.py::x"]
    assert [left[i] for i in durations.heaviest_first(left, recorded)] == [
        "tests/b.py::x", "tests/d.py::x", "tests/d.py::y", "tests/a.py::y", "tests/c.py::x"]


def test_a_run_updates_what_it_measured_and_keeps_the_rest(tmp_path: Path) -> None:
    path = tmp_path / "durations.json"
    durations.write({"t.py::a": 2.04, "t.py::b": 0.1}, path)
    assert durations.load(path) == {"t.py::a": 2.0}
    durations.write({"t.py::a": 0.2, "t.py::c": 7.0}, path)
    assert durations.load(path) == {"t.py::c": 7.0}   # a is now light: dropped; c added
    assert [p.name for p in tmp_path.iterdir()] == ["durations.json"]
    path.write_text("{not json")
    assert durations.load(path) == {}


def test_pytest_collects_the_heaviest_file_first_and_records_a_run(tmp_path: Path) -> None:
    """The conftest hooks in a real pytest run: collection order follows the recorded weights, and
    ORTBUILD_DURATIONS_WRITE=1 records the run (a copy of the repository's conftest, in a tree of its own)."""
    (tmp_path / "tests").mkdir()
    (tmp_path / "tests" / "__init__.py").write_text("")
    for name in ("conftest.py", "durations.py"):
        (tmp_path / "tests" / name).write_text((REPO / "tests" / name).read_text())
    body = "import time\n\ndef test_it():\n    time.sleep({})\n"
    (tmp_path / "tests" / "test_light.py").write_text(body.format(0))
    (tmp_path / "tests" / "test_heavy.py").write_text(body.format(0.6))
    (tmp_path / "tests" / "durations.json").write_text('{"tests/test_heavy.py::test_it": 5.0}')
    args = [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "--collect-only", "-q", "tests"]
    env = {k: v for k, v in os.environ.items() if k != durations.WRITE_VAR} | {"PYTHONPATH": f"{tmp_path}:{REPO}"}
    out = subprocess.run(args, cwd=tmp_path, env=env, capture_output=True, text=True, check=True).stdout
    assert out.splitlines()[:2] == ["tests/test_heavy.py::test_it", "tests/test_light.py::test_it"], out
    (tmp_path / "tests" / "durations.json").write_text("{}")
    run = subprocess.run([a for a in args if a != "--collect-only"], cwd=tmp_path, capture_output=True, text=True,
                         env={**env, durations.WRITE_VAR: "1"})
    assert run.returncode == 0, run.stdout[-2000:]
    got = durations.load(tmp_path / "tests" / "durations.json")
    assert list(got) == ["tests/test_heavy.py::test_it"] and got["tests/test_heavy.py::test_it"] >= 0.6, \
        textwrap.shorten(run.stdout, 500)


def test_the_recorded_files_exist() -> None:
    files = {k.split("::", 1)[0] for k in durations.load()}
    assert files, "tests/durations.json is committed (ORTBUILD_DURATIONS_WRITE=1 records it)"
    assert not [f for f in files if not (REPO / f).is_file()]
