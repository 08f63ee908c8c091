"""ortbuild.publish.tarball: deterministic, streaming writing; reading that refuses every kind of malicious archive
by name."""

from __future__ import annotations

import gzip
import hashlib
import io
import tarfile
import tracemalloc
from pathlib import Path

import pytest

from ortbuild.errors import ArtifactError
from ortbuild.publish import tarball

INDEX = b'{"index": true}\n'


def _write(tmp_path: Path, order: list[str]) -> bytes:
    out = tmp_path / f"{len(list(tmp_path.glob('*.tar')))}.tar"
    src = tmp_path / "src"
    src.mkdir(exist_ok=True)
    files: dict[str, bytes | Path] = {"b/release.json": INDEX}
    for name in order:  # files made in different orders, at different times, with different modes
        p = src / name.replace("/", "_")
        p.write_bytes(name.encode() * 100)
        p.chmod(0o600 if len(name) % 2 else 0o755)
        files[f"b/{name}"] = p
    digest = tarball.write(out, files, 1700000000, first="b/release.json")
    assert digest == hashlib.sha256(out.read_bytes()).hexdigest()  # hashed while written
    return out.read_bytes()


def test_equal_files_give_equal_bytes_whatever_their_order_time_and_mode(tmp_path: Path) -> None:
    one = _write(tmp_path, ["m/z.bin", "a.txt", "m/a.bin"])
    two = _write(tmp_path, ["a.txt", "m/a.bin", "m/z.bin"])
    assert one == two
    assert one[:2] != tarball.GZIP_MAGIC  # stored, not compressed: the bulk of a bundle is encrypted bytes
    with tarfile.open(fileobj=io.BytesIO(one), mode="r:") as tar:
        members = tar.getmembers()
    assert [m.name for m in members] == ["b/release.json", "b/a.txt", "b/m/a.bin", "b/m/z.bin"]
    assert {(m.mode, m.uid, m.gid, m.uname, m.gname, m.mtime) for m in members} == {(0o644, 0, 0, "", "", 1700000000)}


def test_a_file_that_changed_since_it_was_listed_is_refused(tmp_path: Path) -> None:
    f = tmp_path / "artifact.enc"
    f.write_bytes(b"new bytes")
    with pytest.raises(ArtifactError, match=r"artifact\.enc: changed while the bundle was written"):
        tarball.write(tmp_path / "out.tar", {"b/release.json": INDEX, "b/artifact.enc": f}, 0, first="b/release.json",
                      digests={"b/artifact.enc": hashlib.sha256(b"old bytes").hexdigest()})


def _archive(tmp_path: Path, entries: list[tuple[tarfile.TarInfo, bytes]], *, first: bool = True,
             compress: bool = False) -> Path:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.PAX_FORMAT) as tar:
        if first:
            info = tarfile.TarInfo("b/release.json")
            info.size = len(INDEX)
            tar.addfile(info, io.BytesIO(INDEX))
        for info, data in entries:
            tar.addfile(info, io.BytesIO(data) if info.isreg() else None)
    path = tmp_path / ("evil.tar.gz" if compress else "evil.tar")
    path.write_bytes(gzip.compress(buf.getvalue()) if compress else buf.getvalue())
    return path


def _info(name: str, kind: bytes = tarfile.REGTYPE, size: int = 0, **kw: object) -> tarfile.TarInfo:
    info = tarfile.TarInfo(name)
    info.type, info.size = kind, size
    for k, v in kw.items():
        setattr(info, k, v)
    return info


def _listed(sizes: dict[str, int], data: dict[str, bytes] | None = None) -> dict[str, tuple[int, str]]:
    return {n: (size, hashlib.sha256((data or {}).get(n, b"")).hexdigest()) for n, size in sizes.items()}


def _read_all(path: Path, sizes: dict[str, int], data: dict[str, bytes] | None = None) -> list[tuple[str, bytes]]:
    return [(n, b"".join(chunks)) for n, chunks in tarball.Reader(path, "b/release.json", INDEX,
                                                                  _listed(sizes, data))]


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


@pytest.mark.parametrize("compress", [False, True], ids=["tar", "tar.gz"])
@pytest.mark.parametrize("case", list(EVIL))
def test_malicious_entries_are_refused_naming_the_entry(tmp_path: Path, case: str, compress: bool) -> None:
    entries, listed, words = EVIL[case]
    path = _archive(tmp_path, entries, compress=compress)
    with pytest.raises(ArtifactError) as err:
        _read_all(path, listed, {info.name: data for info, data in reversed(entries)})  # the first's data
    assert words in err.value.message
    assert str(path) in err.value.message
    if entries:
        assert f"entry '{entries[-1][0].name}'" in err.value.message or "missing" in err.value.message


def test_an_index_first_is_required_and_must_be_the_signed_one(tmp_path: Path) -> None:
    path = _archive(tmp_path, [(_info("b/x", size=1), b"1")], first=False)
    with pytest.raises(ArtifactError, match="comes first"):
        _read_all(path, {"b/x": 1}, {"b/x": b"1"})
    good = _archive(tmp_path, [])
    with pytest.raises(ArtifactError, match="differs from the signed index"):
        list(tarball.Reader(good, "b/release.json", INDEX.replace(b"true", b"fals"), {}))


def test_a_member_whose_content_differs_from_its_digest_is_named(tmp_path: Path) -> None:
    path = _archive(tmp_path, [(_info("b/m/x", size=3), b"abc")])
    with pytest.raises(ArtifactError, match=r"entry 'b/m/x' differs from the signed index \(its sha256"):
        _read_all(path, {"b/m/x": 3}, {"b/m/x": b"abd"})


@pytest.mark.parametrize("compress", [False, True], ids=["tar", "tar.gz"])
def test_a_tar_or_decompression_bomb_stops_at_the_header_cap(tmp_path: Path, compress: bool) -> None:
    """tarfile reads a PAX header whole: 64 MiB of it (65 KB compressed) must not be, nor anything near."""
    info = _info("b/x", size=1, pax_headers={"comment": "0" * (64 << 20)})
    path = _archive(tmp_path, [(info, b"1")], compress=compress)
    if compress:
        assert path.stat().st_size < 1 << 20
    tracemalloc.start()
    try:
        with pytest.raises(ArtifactError, match=r"evil\.tar.*after entry 'b/release\.json'.*decompression bomb"):
            _read_all(path, {"b/x": 1}, {"b/x": b"1"})
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < tarball.HEADER_MAX + 4 * tarball.CHUNK, peak


def test_truncated_and_damaged_archives_are_clear_errors(tmp_path: Path) -> None:
    for compress in (False, True):
        path = _archive(tmp_path, [(_info("b/x", size=4096), b"1" * 4096)], compress=compress)
        data = path.read_bytes()
        path.write_bytes(data[: len(data) // 2])
        with pytest.raises(ArtifactError, match=r"evil\.tar"):
            _read_all(path, {"b/x": 4096}, {"b/x": b"1" * 4096})
    path.write_bytes(b"not a tar at all")
    with pytest.raises(ArtifactError, match=r"evil\.tar\.gz: damaged, or not a tar archive"):
        _read_all(path, {"b/x": 4096})
    path.write_bytes(b"\x1f\x8b not gzip after all")
    with pytest.raises(ArtifactError, match=r"evil\.tar\.gz: not a readable bundle"):
        _read_all(path, {"b/x": 4096})


@pytest.mark.parametrize("compress", [False, True], ids=["tar", "tar.gz (read for old bundles)"])
def test_a_good_archive_reads_back_and_the_whole_file_is_hashed(tmp_path: Path, compress: bool) -> None:
    path = _archive(tmp_path, [(_info("b/m/x", size=3), b"abc")], compress=compress)
    if not compress:
        with path.open("ab") as f:
            f.write(b"trailing")  # outside the members: only the file's digest sees it
    reader = tarball.Reader(path, "b/release.json", INDEX, _listed({"b/m/x": 3}, {"b/m/x": b"abc"}))
    assert [(n, b"".join(c)) for n, c in reader] == [("b/release.json", INDEX), ("b/m/x", b"abc")]
    assert reader.sha256 == hashlib.sha256(path.read_bytes()).hexdigest()


def test_members_stream_through_bounded_memory(tmp_path: Path) -> None:
    """Writing and reading a 96 MiB member: chunk by chunk, never whole (Python allocations, tracemalloc)."""
    big = tmp_path / "big.bin"
    with big.open("wb") as f:
        for i in range(96):
            f.write(bytes([i]) * (1 << 20))
    digest = hashlib.sha256(big.read_bytes()).hexdigest()
    out = tmp_path / "b.tar"
    tracemalloc.start()
    try:
        tarball.write(out, {"b/release.json": INDEX, "b/big.bin": big}, 0, first="b/release.json",
                      digests={"b/big.bin": digest})
        written = tracemalloc.get_traced_memory()[1]
        tracemalloc.reset_peak()
        reader = tarball.Reader(out, "b/release.json", INDEX, {"b/big.bin": (big.stat().st_size, digest)})
        sizes = {n: sum(len(c) for c in chunks) for n, chunks in reader}
        read = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert sizes == {"b/release.json": len(INDEX), "b/big.bin": 96 << 20}
    assert written < 4 * tarball.CHUNK and read < 8 * tarball.CHUNK, (written, read)
