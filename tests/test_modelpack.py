"""Releases as CNCF ModelPack OCI artifacts (ortbuild.publish.modelpack), pushed to Debian's docker-registry on
loopback: the manifest and model config are read back with plain HTTP and checked against the ModelPack spec
(modelpack/model-spec d78bf32: docs/spec.md, docs/config.md, docs/annotations.md, schema/config-schema.json), the
artifact is pulled with clients that are not ortbuild's pull (the ORAS SDK's `pull`, which names files by their
title; skopeo, which copies it into an OCI image layout), and the pulled files pass `ortbuild verify`."""

from __future__ import annotations

import datetime as dt
import hashlib
import json
import os
import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

import jsonschema
import pytest
import requests

from ortbuild import oci_ref
from ortbuild.artifact import keygen
from ortbuild.errors import RegistryError
from ortbuild.project import precisions
from ortbuild.publish import modelpack, registry, release
from tests.test_openssf import model_signing  # noqa: F401  (a session fixture: the upstream CLI)
from tests.test_registry import oci  # noqa: F401  (a module fixture)
from tests.test_release import SIGNER, cli, public_key_file, released, tested  # noqa: F401  (module fixtures)

# The spec's strings and rules, written out here (never imported from the module under test)
MANIFEST_TYPE = "application/vnd.oci.image.manifest.v1+json"
ARTIFACT_TYPE = "application/vnd.cncf.model.manifest.v1+json"
CONFIG_TYPE = "application/vnd.cncf.model.config.v1+json"
LAYER_TYPE = re.compile(r"application/vnd\.cncf\.model\.(weight|weight\.config|doc|code|dataset)\.v1\."
                        r"(raw|tar|tar\+gzip|tar\+zstd)")
SPEC_PRECISIONS = {"float32", "float64", "float16", "bfloat16", "float8_e4m3", "float8_e5m2", "complex32",
                   "complex64", "complex128", "int8", "int16", "int32", "int64", "uint8", "uint16", "uint32",
                   "uint64", "bool"}
_STRINGS = {"type": "array", "items": {"type": "string"}}
CONFIG_SCHEMA: dict[str, Any] = {  # the rules of the spec's config schema
    "type": "object", "required": ["descriptor", "config", "modelfs"], "additionalProperties": False,
    "properties": {
        "descriptor": {"type": "object", "additionalProperties": False, "properties": {
            "createdAt": {"type": "string"}, "authors": _STRINGS, "family": {"type": "string"},
            "name": {"type": "string", "minLength": 1}, "docURL": {"type": "string"}, "sourceURL": {"type": "string"},
            "datasetsURL": _STRINGS, "version": {"type": "string"}, "revision": {"type": "string"},
            "vendor": {"type": "string"}, "licenses": _STRINGS, "title": {"type": "string"},
            "description": {"type": "string"}}},
        "config": {"type": "object", "additionalProperties": False, "properties": {
            "architecture": {"type": "string"}, "format": {"type": "string"}, "paramSize": {"type": "string"},
            "precision": {"type": "string"}, "quantization": {"type": "string"}, "capabilities": {"type": "object"}}},
        "modelfs": {"type": "object", "additionalProperties": False, "required": ["type", "diffIds"], "properties": {
            "type": {"enum": ["layers"]}, "diffIds": {"type": "array", "items": {"type": "string"}, "minItems": 1}}}}}
FILES = ["SHA256SUMS", "SHA256SUMS.minisig", "model.sig", "rel-1.0-cpu.intoto.jsonl", "rel-1.0-cpu.release.json",
         "rel-1.0-cpu.tar"]


def _manifest(host: str, repo: str, tag: str) -> tuple[dict[str, Any], str]:
    r = requests.get(f"http://{host}/v2/{repo}/manifests/{tag}", headers={"Accept": MANIFEST_TYPE}, timeout=30)
    r.raise_for_status()
    return r.json(), r.headers["Docker-Content-Digest"]


def _blob(host: str, repo: str, digest: str) -> bytes:
    r = requests.get(f"http://{host}/v2/{repo}/blobs/{digest}", timeout=30)
    r.raise_for_status()
    assert "sha256:" + hashlib.sha256(r.content).hexdigest() == digest
    return r.content


@pytest.fixture(scope="module")
def pushed(oci: str, tested: Path) -> str:  # noqa: F811
    """`ortbuild release -t cpu --to oci://...`, the default layout: the reference it pushed."""
    proc = cli("release", "-t", "cpu", "--to", f"oci://{oci}/models/mp", cwd=tested)
    assert proc.returncode == 0, proc.stderr
    return f"oci://{oci}/models/mp:1.0-cpu"


def test_the_manifest_and_config_follow_the_modelpack_spec(oci: str, pushed: str, tested: Path) -> None:  # noqa: F811
    man, _ = _manifest(oci, "models/mp", "1.0-cpu")
    assert man["schemaVersion"] == 2 and man["mediaType"] == MANIFEST_TYPE and man["artifactType"] == ARTIFACT_TYPE
    assert man["config"]["mediaType"] == CONFIG_TYPE
    local = tested / "dist" / "release" / "cpu"
    titles = []
    for layer in man["layers"]:
        assert LAYER_TYPE.fullmatch(layer["mediaType"]), layer["mediaType"]
        assert layer["mediaType"].endswith(".raw")  # written to disk as it is: what SHA256SUMS signs
        notes = layer["annotations"]
        title = notes["org.opencontainers.image.title"]
        assert notes["org.cncf.model.filepath"] == title
        meta = json.loads(notes["org.cncf.model.file.metadata+json"])  # the spec's FileMetadata
        assert set(meta) == {"name", "mode", "uid", "gid", "size", "mtime", "typeflag"}
        assert meta["name"] == title and meta["size"] == layer["size"] and meta["typeflag"] == ord("0")
        assert all(isinstance(meta[k], int) and meta[k] >= 0 for k in ("mode", "uid", "gid"))
        dt.datetime.fromisoformat(meta["mtime"])
        assert _blob(oci, "models/mp", layer["digest"]) == (local / title).read_bytes()
        titles.append(title)
    assert sorted(titles) == FILES
    bundle = next(layer for layer in man["layers"] if layer["annotations"]["org.opencontainers.image.title"]
                  == "rel-1.0-cpu.tar")
    assert bundle["mediaType"] == "application/vnd.cncf.model.weight.v1.raw"
    assert bundle["annotations"]["dev.ortbuild.encrypted"] == "true"
    notes = man["annotations"]
    assert notes["dev.ortbuild.target"] == "cpu" and notes["dev.ortbuild.precision"] == "fp32"
    assert notes["dev.ortbuild.providers"] == "CPUExecutionProvider" and notes["dev.ortbuild.epoch"] == "0"
    assert notes["org.opencontainers.image.version"] == "1.0"

    body = _blob(oci, "models/mp", man["config"]["digest"])
    assert man["config"]["size"] == len(body)
    conf = json.loads(body)
    jsonschema.validate(conf, CONFIG_SCHEMA)
    index = json.loads((local / "rel-1.0-cpu.release.json").read_text())
    assert conf["descriptor"]["name"] == "rel-1.0-cpu" and conf["descriptor"]["version"] == "1.0"
    assert conf["descriptor"]["createdAt"] == index["created"]
    dt.datetime.fromisoformat(conf["descriptor"]["createdAt"])  # RFC 3339
    assert conf["config"]["format"] == "onnx" and conf["config"]["precision"] == "float32"
    assert "quantization" not in conf["config"]
    # raw layers: each one's DiffID (its uncompressed content's hash) is its digest
    assert conf["modelfs"]["diffIds"] == [layer["digest"] for layer in man["layers"]]


def test_each_precision_has_a_name_from_the_spec() -> None:
    for name in precisions.PRECISIONS:
        spec, quantization = modelpack.SPEC_PRECISION[name]
        assert all(p in SPEC_PRECISIONS for p in spec.split(",")), (name, spec)
        assert (quantization is not None) == (name not in ("fp32", "fp16")), name


def test_the_oras_sdk_pull_writes_the_files_and_they_verify(oci: str, pushed: str, tmp_path: Path) -> None:  # noqa: F811
    import oras.client

    out = tmp_path / "pulled"
    oras.client.OrasClient(hostname=oci, insecure=True).pull(target=f"{oci}/models/mp:1.0-cpu", outdir=str(out))
    assert sorted(p.name for p in out.iterdir()) == FILES
    proc = cli("verify", str(out), "--public-key", str(public_key_file(tmp_path)), cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert "golden       tiny_cnn: PASS" in proc.stdout, proc.stdout


def test_what_oras_pulls_verifies_with_upstream_model_signing_too(oci: str, pushed: str, tmp_path: Path,  # noqa: F811
                                                                  model_signing: Path) -> None:  # noqa: F811
    """The ecosystem's two formats together: a ModelPack artifact pulled by another client, its files checked by
    OpenSSF's own verifier with model-signing.pub, and by `ortbuild verify` with the same key."""
    import oras.client

    out = tmp_path / "pulled"
    oras.client.OrasClient(hostname=oci, insecure=True).pull(target=f"{oci}/models/mp:1.0-cpu", outdir=str(out))
    pub = tmp_path / "model-signing.pub"
    pub.write_text(keygen.model_signing_public(SIGNER))
    up = subprocess.run([str(model_signing), "verify", "key", str(out), "--signature", str(out / "model.sig"),
                         "--public_key", str(pub)], capture_output=True, text=True, timeout=300)
    assert up.returncode == 0 and "Verification succeeded" in up.stdout + up.stderr, up.stdout + up.stderr
    proc = cli("verify", str(out), "--public-key", str(pub), "--no-run", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr


def test_skopeo_copies_it_and_the_files_it_names_verify(oci: str, pushed: str, tmp_path: Path) -> None:  # noqa: F811
    """A standalone OCI client (skopeo, Debian's) copies the artifact into an OCI image layout, digests intact;
    each layer written as its org.cncf.model.filepath (what ModelPack clients do) gives a release that verifies."""
    binary = shutil.which("skopeo")
    if binary is None:
        if os.environ.get("ORTBUILD_REQUIRE_RELEASE_TOOLS"):
            pytest.fail("skopeo is not installed (apt install skopeo)")
        pytest.skip("Debian's skopeo is not installed")
    layout = tmp_path / "layout"
    proc = subprocess.run([binary, "copy", "--src-tls-verify=false", f"docker://{oci}/models/mp:1.0-cpu",
                           f"oci:{layout}:1.0-cpu"], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    _, digest = _manifest(oci, "models/mp", "1.0-cpu")
    (entry,) = json.loads((layout / "index.json").read_text())["manifests"]
    assert entry["digest"] == digest  # the same manifest, byte for byte
    man = json.loads((layout / "blobs" / "sha256" / digest.removeprefix("sha256:")).read_bytes())
    assert man["artifactType"] == ARTIFACT_TYPE
    out = tmp_path / "files"
    out.mkdir()
    for layer in man["layers"]:
        shutil.copyfile(layout / "blobs" / "sha256" / layer["digest"].removeprefix("sha256:"),
                        out / layer["annotations"]["org.cncf.model.filepath"])
    v = cli("verify", str(out), "--public-key", str(public_key_file(tmp_path)), "--no-run", cwd=tmp_path)
    assert v.returncode == 0, v.stderr


def test_pull_reads_both_layouts(oci: str, tested: Path, pushed: str, tmp_path: Path) -> None:  # noqa: F811
    pub = str(public_key_file(tmp_path))
    proc = cli("release", "-t", "cpu", "--to", f"oci://{oci}/models/old", "--oci-format", "ortbuild", cwd=tested)
    assert proc.returncode == 0, proc.stderr
    man, _ = _manifest(oci, "models/old", "1.0-cpu")
    assert man["config"]["mediaType"] == registry.CONFIG_TYPE and "artifactType" not in man
    assert man["annotations"]["dev.ortbuild.precision"] == "fp32"
    for repo in ("old", "mp"):
        dest = tmp_path / repo
        p = cli("pull", f"oci://{oci}/models/{repo}:1.0-cpu", "--public-key", pub, "--to", str(dest), "--no-run",
                cwd=tmp_path)
        assert p.returncode == 0, p.stderr
        assert (dest / "tiny_cnn" / "model.onnx.enc").is_file()
    bad = cli("release", "-t", "cpu", "--to", f"oci://{oci}/models/x", "--oci-format", "oras", cwd=tested)
    assert bad.returncode == 2 and "--oci-format" in bad.stderr


def _published(released: Path, tmp_path: Path, signature: bool) -> release.Published:  # noqa: F811
    folder = tmp_path / "rel"
    shutil.copytree(released, folder)
    files = {"bundle": folder / "rel-1.0-cpu.tar", "index": folder / "rel-1.0-cpu.release.json",
             "provenance": folder / "rel-1.0-cpu.intoto.jsonl", "sums": folder / release.SUMS,
             "signature": folder / release.SUMS_SIG}
    if signature:
        files["model_signature"] = folder / "model.sig"
        files["model_signature"].write_text('{"mediaType": "application/vnd.dev.sigstore.bundle.v0.3+json"}\n')
    return release.Published("cpu", folder, files, [], json.loads(files["index"].read_text()))


@pytest.mark.parametrize("layout", registry.LAYOUTS)
def test_the_model_signature_is_pushed_and_pulled_where_present(oci: str, released: Path, tmp_path: Path,  # noqa: F811
                                                                layout: str) -> None:
    pub = _published(released, tmp_path, signature=True)
    ref = oci_ref.parse(f"oci://{oci}/models/sig:{layout}")
    registry.push(ref, pub, layout)
    man, _ = _manifest(oci, "models/sig", layout)
    (sig,) = [x for x in man["layers"] if x["annotations"]["org.opencontainers.image.title"] == "model.sig"]
    assert sig["mediaType"] == ("application/vnd.cncf.model.doc.v1.raw" if layout == "modelpack"
                                else "application/vnd.dev.sigstore.bundle.v0.3+json")
    (tmp_path / "out").mkdir()
    got = registry.pull(ref, tmp_path / "out")
    assert sorted(got) == sorted(pub.files)
    assert got["model_signature"].read_bytes() == pub.files["model_signature"].read_bytes()
    # without it (an older release): pulled all the same
    ref = oci_ref.parse(f"oci://{oci}/models/sig:{layout}-without")
    registry.push(ref, _published(released, tmp_path / "b", signature=False), layout)
    (tmp_path / "out2").mkdir()
    assert "model_signature" not in registry.pull(ref, tmp_path / "out2")


def _upload(host: str, repo: str, data: bytes) -> dict[str, Any]:
    digest = "sha256:" + hashlib.sha256(data).hexdigest()
    start = requests.post(f"http://{host}/v2/{repo}/blobs/uploads/", timeout=30)
    location = start.headers["Location"]
    location = location if location.startswith("http") else f"http://{host}{location}"
    put = requests.put(location, params={"digest": digest}, data=data,
                       headers={"Content-Type": "application/octet-stream"}, timeout=30)
    assert put.status_code == 201, put.text
    return {"digest": digest, "size": len(data)}


def _put(host: str, repo: str, tag: str, man: dict[str, Any]) -> str:
    r = requests.put(f"http://{host}/v2/{repo}/manifests/{tag}", data=json.dumps(man),
                     headers={"Content-Type": MANIFEST_TYPE}, timeout=30)
    assert r.status_code == 201, r.text
    return f"oci://{host}/{repo}:{tag}"


def test_a_modelpack_artifact_ortbuild_did_not_make_is_refused(oci: str, pushed: str, tmp_path: Path) -> None:  # noqa: F811
    repo = "models/mp"
    real, _ = _manifest(oci, repo, "1.0-cpu")
    config = {"mediaType": CONFIG_TYPE, **_upload(oci, repo, b'{"descriptor":{},"config":{},"modelfs":{}}')}
    weights = {"mediaType": "application/vnd.cncf.model.weight.v1.tar", **_upload(oci, repo, b"weights"),
               "annotations": {"org.opencontainers.image.title": "model.tar",
                               "org.cncf.model.filepath": "model.tar"}}

    def refused(tag: str, layers: list[dict[str, Any]], match: str, config: dict[str, Any] = config) -> None:
        ref = _put(oci, repo, tag, {"schemaVersion": 2, "mediaType": MANIFEST_TYPE, "artifactType": ARTIFACT_TYPE,
                                    "config": config, "layers": layers})
        (tmp_path / tag).mkdir()
        with pytest.raises(RegistryError, match=match) as e:
            registry.pull(oci_ref.parse(ref), tmp_path / tag)
        assert ref in e.value.message

    # a layer of a kind no release has (another tool's packed weights)
    refused("foreign", [*real["layers"], weights], r"layer 'model\.tar' \(application/vnd\.cncf\.model\.weight\.v1"
                                                   r"\.tar\) is not one of a release's files")
    # the release's files without the bundle
    without = [x for x in real["layers"] if not x["annotations"]["org.opencontainers.image.title"].endswith(".tar")]
    refused("nobundle", without, "the artifact lacks the release's bundle .*did not make")
    # a layer whose filepath names another file than its title: which name would a client write?
    twisted = [{**x, "annotations": {**x["annotations"], "org.cncf.model.filepath": "SHA256SUMS"}}
               if x["annotations"]["org.opencontainers.image.title"].endswith(".tar") else x for x in real["layers"]]
    refused("twisted", twisted, "is not one of a release's files")
    # an image, not a model
    refused("image", real["layers"], "not an ortbuild release", {**config, "mediaType":
                                                                 "application/vnd.oci.image.config.v1+json"})
