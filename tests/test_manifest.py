from __future__ import annotations

import base64
import json
import os
from pathlib import Path

import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from ortbuild.artifact import fit as artifact_fit
from ortbuild.artifact import keys, manifest, manifest_types, pieces
from ortbuild.errors import ArtifactError
from ortbuild.files import atomic_write


def test_timestamp_honours_source_date_epoch(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SOURCE_DATE_EPOCH", "1700000000")
    assert manifest.timestamp() == "2023-11-14T22:13:20Z"
    monkeypatch.setenv("SOURCE_DATE_EPOCH", "yesterday")
    with pytest.raises(ArtifactError, match="SOURCE_DATE_EPOCH"):
        manifest.timestamp()


def test_atomic_write_never_leaves_a_partial_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    target = tmp_path / "model.onnx"
    atomic_write(target, b"good", root=tmp_path)

    def boom(*args: object, **kwargs: object) -> None:
        raise OSError("disk full")

    monkeypatch.setattr(os, "replace", boom)
    with pytest.raises(OSError, match="disk full"):
        atomic_write(target, b"half-written", root=tmp_path)
    assert target.read_bytes() == b"good"
    assert [p.name for p in tmp_path.iterdir()] == ["model.onnx"]


def test_read_finds_the_manifest_from_dir_file_or_artifact(tmp_path: Path) -> None:
    with pytest.raises(ArtifactError, match="no manifest here"):
        manifest.read(tmp_path)
    (tmp_path / "manifest.json").write_text("{not json")
    with pytest.raises(ArtifactError, match="unreadable manifest"):
        manifest.read(tmp_path / "model.onnx")
    (tmp_path / "manifest.json").write_text('{"format_version": 99}')
    with pytest.raises(ArtifactError, match="not an ortbuild manifest"):
        manifest.read(tmp_path / "manifest.json")


def _manifest(**changes: object) -> manifest_types.Manifest:
    import dataclasses

    base = manifest_types.Manifest(
        project=manifest_types.ProjectInfo("p", "1"), target="t", model="m", status="complete", missing_providers={},
        source=manifest_types.Source("m.onnx", "0" * 64, 3, 8, {"ai.onnx": 13}),
        artifact=manifest_types.Artifact("model.onnx", "onnx", "0" * 64, 3, 1.0,
                                   [manifest_types.ArtifactFile("model.onnx", "model", "model.onnx", "0" * 64, 3, False,
                                                          pieces.Pieces(0, 4 << 20, ["1" * 64]))]),
        precision=manifest_types.PrecisionInfo("fp32", {}), providers=[{"name": "CPUExecutionProvider", "options": {}}],
        session={}, free_dimensions={},
        optimization=manifest_types.Optimization("all", "all", True, {}, ["CPUExecutionProvider"], {}),
        io={"inputs": [], "outputs": []}, golden_run=manifest_types.GoldenRun([], [], ""),
        versions={"onnxruntime": {"distribution": "onnxruntime", "version": "1.31.1"}},
        build_machine={"cpu": "x", "simd_level": "avx2"},
        build_key="k", created="2026-01-01T00:00:00Z", encryption=None,
        signing=manifest_types.Signing("Ed25519", "", "", False))
    return dataclasses.replace(base, **changes)  # type: ignore[arg-type]


def test_round_trip_and_strict_reading(tmp_path: Path) -> None:
    m = _manifest()
    assert manifest_types.Manifest.from_json(m.to_json()) == m
    doc = json.loads(m.to_json())
    doc["artifacT"] = doc.pop("artifact")
    with pytest.raises(ArtifactError, match="unknown manifest key 'artifacT'"):
        manifest_types.Manifest.from_json(json.dumps(doc))
    doc = json.loads(m.to_json())
    doc["artifact"]["size"] = "3"
    with pytest.raises(ArtifactError, match=r"'artifact\.size' has the wrong type"):
        manifest_types.Manifest.from_json(json.dumps(doc))


@pytest.mark.parametrize(("edit", "says"), [
    (lambda d: d["artifact"]["files"][0].update(name="../../etc/passwd"), "not a plain name"),
    (lambda d: d["artifact"]["files"][0].update(name="/etc/passwd"), "not a plain name"),
    (lambda d: d["artifact"].update(file="other.onnx"), "not among artifact.files"),
    (lambda d: d["versions"].pop("onnxruntime"), "versions.onnxruntime"),
    (lambda d: d["build_machine"].pop("cpu"), "build_machine"),
    (lambda d: d["io"].pop("inputs"), "io.inputs"),
    (lambda d: d["io"].update(outputs=[{"name": 1}]), "io.outputs"),
    (lambda d: d["providers"].append("CPU"), "providers"),
    (lambda d: d.update(status="done"), "status"),
])
def test_damaged_manifests_are_reported_never_indexed_blindly(edit: object, says: str) -> None:
    doc = json.loads(_manifest().to_json())
    edit(doc)  # type: ignore[operator]
    with pytest.raises(ArtifactError, match="damaged manifest") as err:
        manifest_types.Manifest.from_json(json.dumps(doc))
    assert says in err.value.message and err.value.exit_code == 7


def test_integrity_and_fit_problems(tmp_path: Path) -> None:
    import dataclasses

    art = tmp_path / "model.onnx"
    art.write_bytes(b"abc")
    m = _manifest()
    sha, digests = pieces.of_bytes(art.read_bytes())
    m = _manifest(artifact=dataclasses.replace(m.artifact, sha256=sha, files=[
                      dataclasses.replace(m.artifact.files[0], sha256=sha, pieces=digests)]),
                  optimization=dataclasses.replace(m.optimization, tied_to={"simd_level": "riscv64-rvv"}),
                  providers=[{"name": "QNNExecutionProvider", "options": {}}],
                  versions={"onnxruntime": {"distribution": "onnxruntime-qnn", "version": "1.0"}})
    (tmp_path / "manifest.json").write_bytes(m.to_json())
    sign = keys.signing_key()
    assert sign is not None
    assert manifest.integrity_problems(m, tmp_path, sign.public_raw) == [f"{tmp_path / 'manifest.sig'} is missing"]
    (tmp_path / "manifest.sig").write_bytes(base64.b64encode(sign.sign(m.to_json())))
    assert manifest.integrity_problems(m, tmp_path, sign.public_raw) == []
    other = Ed25519PrivateKey.generate().public_key().public_bytes_raw()
    assert "does not verify" in manifest.integrity_problems(m, tmp_path, other)[0]
    art.write_bytes(b"abd")
    problem = manifest.integrity_problems(m, tmp_path, sign.public_raw)[0]
    assert "piece 0 of 1 differs from the manifest (modified or corrupted)" in problem
    # format 3 checks the whole sha256 too: pieces that match with a whole digest that does not is refused
    whole = dataclasses.replace(m, artifact=dataclasses.replace(m.artifact, files=[
        dataclasses.replace(m.artifact.files[0], sha256="0" * 64, pieces=pieces.of_bytes(b"abd")[1])]))
    assert manifest.integrity_problems(whole, tmp_path, sign.public_raw) == \
        ["artifact file model.onnx sha256 differs from the manifest (modified or corrupted)"]
    art.unlink()
    assert "missing" in manifest.integrity_problems(m, tmp_path, sign.public_raw)[0]
    fit = artifact_fit.problems(m)
    assert any("riscv64-rvv NCHWc layout" in p for p in fit)
    assert any("built with onnxruntime-qnn" in p for p in fit)
    assert any("ORT would fall back silently: QNNExecutionProvider is not in" in p for p in fit)


def test_a_validly_signed_manifest_in_another_artifacts_place_is_tampered(tmp_path: Path) -> None:
    import dataclasses

    from ortbuild.errors import Tampered

    folder = tmp_path / "dist" / "t" / "m"
    folder.mkdir(parents=True)
    (folder / "model.onnx").write_bytes(b"abc")
    m = _manifest()
    sha, digests = pieces.of_bytes(b"abc")
    m = _manifest(artifact=dataclasses.replace(m.artifact, sha256=sha, files=[
                      dataclasses.replace(m.artifact.files[0], sha256=sha, pieces=digests)]))
    sign = keys.signing_key()
    assert sign is not None
    manifest.write_signed(folder, {}, m, sign.sign, root=tmp_path / "dist")
    assert manifest.trusted(folder, sign.public_raw, place=("t", "m")) == m
    assert manifest.trusted(folder, sign.public_raw) == m  # no place given: only files and signature
    assert manifest.place_problem(m, ("t", "m")) is None
    for place, holds in ((("t", "other"), "not other for t"), (("u", "m"), "not m for u")):
        with pytest.raises(Tampered) as err:
            manifest.trusted(folder, sign.public_raw, place=place)
        assert err.value.message.startswith(f"{folder}: the directory holds m for t (its manifest says so), "
                                            f"{holds}, whose place it is"), err.value.message
        assert err.value.hint and "--repair" in err.value.hint
