from __future__ import annotations

import os
from pathlib import Path

import pytest

from ortbuild import manifest
from ortbuild.errors import ArtifactError


def test_timestamp_honours_source_date_epoch(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SOURCE_DATE_EPOCH", "1700000000")
    assert manifest.timestamp() == "2023-11-14T22:13:20Z"
    monkeypatch.setenv("SOURCE_DATE_EPOCH", "yesterday")
    with pytest.raises(ArtifactError, match="SOURCE_DATE_EPOCH"):
        manifest.timestamp()


def test_atomic_write_never_leaves_a_partial_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    target = tmp_path / "model.onnx"
    manifest.atomic_write(target, b"good")

    def boom(src: str, dst: str) -> None:
        raise OSError("disk full")

    monkeypatch.setattr(os, "replace", boom)
    with pytest.raises(OSError, match="disk full"):
        manifest.atomic_write(target, b"half-written")
    assert target.read_bytes() == b"good"
    assert [p.name for p in tmp_path.iterdir()] == ["model.onnx"]


def test_read_finds_the_manifest_from_dir_file_or_artifact(tmp_path: Path) -> None:
    with pytest.raises(ArtifactError, match="no manifest here"):
        manifest.read(tmp_path)
    (tmp_path / "manifest.json").write_text("{not json")
    with pytest.raises(ArtifactError, match="unreadable manifest"):
        manifest.read(tmp_path / "model.onnx")
    (tmp_path / "manifest.json").write_text('{"manifest_version": 99}')
    with pytest.raises(ArtifactError, match="not an ortbuild manifest"):
        manifest.read(tmp_path / "manifest.json")


def test_integrity_and_fit_problems(tmp_path: Path) -> None:
    art = tmp_path / "model.onnx"
    art.write_bytes(b"abc")
    doc = {"artifact": {"file": "model.onnx", "size": 3, "sha256": manifest.sha256_file(art)},
           "optimization": {"applied": "all", "tied_to": {"simd_level": "riscv64-rvv"}},
           "providers": [{"name": "QNNExecutionProvider", "options": {}}],
           "versions": {"onnxruntime": {"distribution": "onnxruntime-qnn", "version": "1.0"}}}
    assert manifest.integrity_problems(doc, tmp_path) == []
    art.write_bytes(b"abd")
    assert "sha256 differs" in manifest.integrity_problems(doc, tmp_path)[0]
    art.unlink()
    assert "missing" in manifest.integrity_problems(doc, tmp_path)[0]
    fit = manifest.fit_problems(doc)
    assert any("riscv64-rvv NCHWc layout" in p for p in fit)
    assert any("built with onnxruntime-qnn" in p for p in fit)
    assert any("ORT would fall back silently: QNNExecutionProvider is not in" in p for p in fit)
