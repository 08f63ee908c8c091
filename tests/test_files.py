"""The one way ortbuild writes a file (ortbuild.files): below a root, never through a symlink, never in place."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from ortbuild import files
from ortbuild.paths import UnsafePath


@pytest.fixture
def victim(tmp_path: Path) -> Path:
    v = tmp_path / "outside" / "victim.txt"
    v.parent.mkdir()
    v.write_text("precious\n")
    return v


def test_a_symlink_at_the_file_is_replaced_never_written_through(tmp_path: Path, victim: Path) -> None:
    root = tmp_path / "dist"
    (root / "t").mkdir(parents=True)
    link = root / "t" / "report.json"
    link.symlink_to(victim)
    files.atomic_write(link, b"new", root=root)
    assert victim.read_text() == "precious\n"
    assert not link.is_symlink() and link.read_bytes() == b"new"
    assert sorted(p.name for p in (root / "t").iterdir()) == ["report.json"]  # no partial file left


@pytest.mark.parametrize("depth", [1, 2])
def test_a_symlinked_folder_below_the_root_is_refused(tmp_path: Path, victim: Path, depth: int) -> None:
    root = tmp_path / "dist"
    parts = ["logs", "t"][:depth]
    (root.joinpath(*parts[:-1])).mkdir(parents=True)
    root.joinpath(*parts).symlink_to(victim.parent)
    target = root / "logs" / "t" / "m.build.json"
    for write in (lambda: files.atomic_write(target, b"x", root=root),
                  lambda: files.atomic_copy(victim, target, root=root),
                  lambda: files.partial_file(target, root),
                  lambda: os.close(files.fresh_file(target, root)),
                  lambda: files.safe_mkdir(target.parent, root)):
        with pytest.raises(UnsafePath, match="is a symlink") as err:
            write()
        assert str(root.joinpath(*parts)) in err.value.message and err.value.hint
    assert [p.name for p in victim.parent.iterdir()] == ["victim.txt"] and victim.read_text() == "precious\n"


def test_the_root_itself_may_be_a_symlink_and_folders_are_made(tmp_path: Path) -> None:
    real = tmp_path / "real"
    real.mkdir()
    root = tmp_path / "dist"
    root.symlink_to(real)  # the user's choice of output directory
    files.atomic_write(root / "a" / "b" / "c.txt", b"c", root=root, mode=0o644)
    assert (real / "a" / "b" / "c.txt").read_bytes() == b"c"
    assert (real / "a" / "b" / "c.txt").stat().st_mode & 0o777 == 0o644


def test_a_path_outside_the_root_is_refused(tmp_path: Path) -> None:
    with pytest.raises(UnsafePath, match="outside"):
        files.atomic_write(tmp_path / "dist" / ".." / "elsewhere.txt", b"x", root=tmp_path / "dist")
    assert not (tmp_path / "elsewhere.txt").exists()


def test_a_partial_file_is_published_over_its_name_and_a_swapped_partial_refused(tmp_path: Path,
                                                                                  victim: Path) -> None:
    root = tmp_path / "dist"
    partial = files.partial_file(root / "m" / "model.onnx.enc", root)
    assert partial.name.startswith(".model.onnx.enc.") and partial.name.endswith(".partial")
    with files.open_partial(partial) as f:
        f.write(b"sealed")
    files.publish(partial, root / "m" / "sub" / "model.onnx.enc", root)
    assert (root / "m" / "sub" / "model.onnx.enc").read_bytes() == b"sealed" and not partial.exists()
    swapped = files.partial_file(root / "m" / "x", root)
    swapped.unlink()
    swapped.symlink_to(victim)
    with pytest.raises(OSError):
        files.open_partial(swapped)
    assert victim.read_text() == "precious\n"
