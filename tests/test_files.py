"""The one way ortbuild writes a file (ortbuild.files): below a root, never through a symlink, never in place."""

from __future__ import annotations

import os
import shutil
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


def test_a_document_read_back_must_be_a_regular_file_of_a_sane_size(tmp_path: Path) -> None:
    """A FIFO planted where ortbuild reads a manifest or report would block for ever; /dev/zero or a huge file
    would fill the memory: Unreadable (an OSError) at once instead."""
    good = tmp_path / "manifest.json"
    good.write_bytes(b"{}")
    assert files.read_document(good) == b"{}"
    os.mkfifo(tmp_path / "fifo")
    (tmp_path / "zero").symlink_to("/dev/zero")
    big = tmp_path / "big"
    with open(big, "wb") as f:
        f.truncate(files.MAX_DOCUMENT + 1)  # sparse: no disk used
    for path, why in ((tmp_path / "fifo", "a FIFO"), (tmp_path / "zero", "a character device"),
                      (big, "more than")):
        with pytest.raises(files.Unreadable, match=why):
            files.read_document(path)
    with pytest.raises(FileNotFoundError):
        files.read_document(tmp_path / "absent")


# ------------------------------------------------------------------------------------------ the sweep

SWEEP_TARGET = """
[targets.cpu]
runtime = "RUNTIME"
providers = ["CPUExecutionProvider"]
precision = "fp32"
"""
# every command that writes into the project's tree, in the order a user runs them
# (`build --repair` rebuilds an artifact that a planted link made look tampered: the rebuild's writes are swept too)
COMMANDS = (("build",), ("build", "--repair"), ("test", "--no-explain"), ("profile", "--runs", "2"),
            ("release", "--force"), ("clean",))


def _run_all(config: Path) -> list[int]:
    from ortbuild import cli

    return [cli.main([cmd[0], "-c", str(config), *cmd[1:]]) for cmd in COMMANDS]


def _written(project: Path) -> list[str]:
    """Every path the commands write under dist/ (clean removes them: each command but clean runs twice, so
    that what only a second run writes, such as report.previous.json, is there too)."""
    from ortbuild import cli

    config = project / "targets.toml"
    for _ in range(2):
        for cmd in COMMANDS[:-1]:
            assert cli.main([cmd[0], "-c", str(config), *cmd[1:]]) == 0, cmd
    dist = project / "dist"
    logs = [f"logs/cpu/tiny_cnn.{phase}.log" for phase in ("build", "test")]  # removed when nothing was said
    return sorted({*(str(p.relative_to(dist)) for p in dist.rglob("*")), *logs})


def _state(folder: Path) -> dict[str, str]:
    out = {}
    for p in sorted(folder.rglob("*")):
        st = p.lstat()
        out[str(p.relative_to(folder))] = (f"link {os.readlink(p)}" if p.is_symlink() else "dir" if p.is_dir()
                                           else f"{st.st_size} {st.st_mtime_ns} {p.read_bytes().hex()[:64]}")
    return out


@pytest.mark.slow
def test_no_command_writes_outside_the_tree_through_a_symlink_planted_anywhere_it_writes(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A symlink is planted at every path that build, test, profile, release and clean write (each in its own
    round, a file or a folder), pointing at a copy outside the project; every command runs; nothing outside
    changes and no command ends in an internal error."""
    from tests.conftest import here_runtime, model_table

    pristine = tmp_path / "pristine"
    pristine.mkdir()
    (pristine / "targets.toml").write_text('[project]\nname = "t"\nversion = "1"\n\n' + model_table("tiny_cnn")
                                           + SWEEP_TARGET.replace("RUNTIME", here_runtime()))
    written = _written(pristine)
    assert {"logs", "cpu/tiny_cnn/manifest.json", "cpu/tiny_cnn/profile.json", "release", "report.json"} \
        <= {w.split("/test-report")[0] for w in written} | set(written), written
    outside = tmp_path / "outside"
    for i, rel in enumerate(written):
        project = tmp_path / f"p{i}"
        shutil.copytree(pristine, project, symlinks=True)
        planted = project / "dist" / rel
        bait = outside / str(i)
        if not planted.exists():
            bait.parent.mkdir(parents=True, exist_ok=True)
            bait.write_text("precious\n")
        elif planted.is_dir():
            shutil.copytree(planted, bait, symlinks=True)
            shutil.rmtree(planted)
        else:
            bait.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(planted, bait)
            planted.unlink()
        planted.symlink_to(bait)
        before = _state(outside)
        codes = _run_all(project / "targets.toml")
        text = capsys.readouterr()
        assert _state(outside) == before, f"a command wrote through a symlink at dist/{rel}"
        assert 1 not in codes, f"dist/{rel}: an internal error: {codes}\n{text.out}{text.err}"
        shutil.rmtree(project)
