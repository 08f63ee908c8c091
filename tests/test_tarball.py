"""ortbuild.tarball: deterministic writing; reading that refuses every kind of malicious archive by name."""

from __future__ import annotations

import gzip
import io
import tarfile
from pathlib import Path

import pytest

from ortbuild import tarball
from ortbuild.errors import ArtifactError

INDEX = b'{"index": true}\n'


def _write(tmp_path: Path, order: list[str]) -> bytes:
    out = tmp_path / f"{len(list(tmp_path.glob('*.tar.gz')))}.tar.gz"
    src = tmp_path / "src"
    src.mkdir(exist_ok=True)
    files: dict[str, bytes | Path] = {"b/release.json": INDEX}
    for name in order:  # files made in different orders, at different times, with different modes
        p = src / name.replace("/", "_")
        p.write_bytes(name.encode() * 100)
        p.chmod(0o600 if len(name) % 2 else 0o755)
        files[f"b/{name}"] = p
    tarball.write(out, files, 1700000000, first="b/release.json")
    return out.read_bytes()


def test_equal_files_give_equal_bytes_whatever_their_order_time_and_mode(tmp_path: Path) -> None:
    one = _write(tmp_path, ["m/z.bin", "a.txt", "m/a.bin"])
    two = _write(tmp_path, ["a.txt", "m/a.bin", "m/z.bin"])
    assert one == two
    assert one[4:8] == b"\0\0\0\0"  # gzip header: no mtime
    with tarfile.open(fileobj=io.BytesIO(one), mode="r:gz") as tar:
        members = tar.getmembers()
    assert [m.name for m in members] == ["b/release.json", "b/a.txt", "b/m/a.bin", "b/m/z.bin"]
    assert {(m.mode, m.uid, m.gid, m.uname, m.gname, m.mtime) for m in members} == {(0o644, 0, 0, "", "", 1700000000)}


def _archive(tmp_path: Path, entries: list[tuple[tarfile.TarInfo, bytes]], *, first: bool = True) -> Path:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.PAX_FORMAT) as tar:
        if first:
            info = tarfile.TarInfo("b/release.json")
            info.size = len(INDEX)
            tar.addfile(info, io.BytesIO(INDEX))
        for info, data in entries:
            tar.addfile(info, io.BytesIO(data) if info.isreg() else None)
    path = tmp_path / "evil.tar.gz"
    path.write_bytes(gzip.compress(buf.getvalue()))
    return path


def _info(name: str, kind: bytes = tarfile.REGTYPE, size: int = 0, **kw: object) -> tarfile.TarInfo:
    info = tarfile.TarInfo(name)
    info.type, info.size = kind, size
    for k, v in kw.items():
        setattr(info, k, v)
    return info


def _read_all(path: Path, listed: dict[str, int]) -> list[str]:
    return [n for n, _ in tarball.members(path, "b/release.json", INDEX, listed)]


EVIL = {
    "traversal": ([(_info("b/../../etc/evil", size=3), b"bad")], {"b/../../etc/evil": 3}, "'..'"),
    "absolute": ([(_info("/etc/evil", size=3), b"bad")], {"/etc/evil": 3}, "absolute"),
    "symlink": ([(_info("b/link", tarfile.SYMTYPE, linkname="/etc/passwd"), b"")], {"b/link": 0},
                "symbolic link"),
    "hardlink": ([(_info("b/hard", tarfile.LNKTYPE, linkname="b/release.json"), b"")], {"b/hard": 0}, "hard link"),
    "char device": ([(_info("b/dev", tarfile.CHRTYPE, devmajor=1, devminor=3), b"")], {"b/dev": 0},
                    "character device"),
    "block device": ([(_info("b/blk", tarfile.BLKTYPE, devmajor=8, devminor=0), b"")], {"b/blk": 0},
                     "block device"),
    "fifo": ([(_info("b/fifo", tarfile.FIFOTYPE), b"")], {"b/fifo": 0}, "FIFO"),
    "directory": ([(_info("b/dir", tarfile.DIRTYPE), b"")], {"b/dir": 0}, "directory"),
    "duplicate": ([(_info("b/x", size=1), b"1"), (_info("b/x", size=1), b"2")], {"b/x": 1}, "appears twice"),
    "unlisted": ([(_info("b/extra", size=1), b"1")], {}, "not listed"),
    "size differs": ([(_info("b/x", size=5), b"12345")], {"b/x": 1}, "declares 5 bytes"),
    "missing": ([], {"b/x": 1}, "missing from the archive"),
}


@pytest.mark.parametrize("case", list(EVIL))
def test_malicious_entries_are_refused_naming_the_entry(tmp_path: Path, case: str) -> None:
    entries, listed, words = EVIL[case]
    path = _archive(tmp_path, entries)
    with pytest.raises(ArtifactError) as err:
        _read_all(path, listed)
    assert words in err.value.message
    assert str(path) in err.value.message
    if entries:
        assert f"entry '{entries[-1][0].name}'" in err.value.message or "missing" in err.value.message


def test_an_index_first_is_required_and_must_be_the_signed_one(tmp_path: Path) -> None:
    path = _archive(tmp_path, [(_info("b/x", size=1), b"1")], first=False)
    with pytest.raises(ArtifactError, match="comes first"):
        _read_all(path, {"b/x": 1})
    good = _archive(tmp_path, [])
    with pytest.raises(ArtifactError, match="differs from the signed index"):
        list(tarball.members(good, "b/release.json", INDEX.replace(b"true", b"fals"), {}))


def test_a_decompression_bomb_stops_at_the_listed_size(tmp_path: Path) -> None:
    """A PAX header is read whole by tarfile: 64 MiB of it (65 KB compressed) must not be."""
    info = _info("b/x", size=1, pax_headers={"comment": "0" * (64 << 20)})
    path = _archive(tmp_path, [(info, b"1")])
    assert path.stat().st_size < 1 << 20
    with pytest.raises(ArtifactError, match="decompression bomb"):
        _read_all(path, {"b/x": 1})


def test_truncated_and_damaged_archives_are_clear_errors(tmp_path: Path) -> None:
    path = _archive(tmp_path, [(_info("b/x", size=4096), b"1" * 4096)])
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2])
    with pytest.raises(ArtifactError, match=r"evil\.tar\.gz"):
        _read_all(path, {"b/x": 4096})
    path.write_bytes(b"not gzip at all")
    with pytest.raises(ArtifactError, match=r"not a readable \.tar\.gz"):
        _read_all(path, {"b/x": 4096})


def test_a_good_archive_reads_back(tmp_path: Path) -> None:
    path = _archive(tmp_path, [(_info("b/m/x", size=3), b"abc")])
    assert list(tarball.members(path, "b/release.json", INDEX, {"b/m/x": 3})) == \
        [("b/release.json", INDEX), ("b/m/x", b"abc")]
