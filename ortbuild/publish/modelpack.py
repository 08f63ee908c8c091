"""A release as a CNCF ModelPack OCI artifact (the model-spec at modelpack/model-spec, commit d78bf32 of June 2026:
docs/spec.md, docs/config.md, docs/annotations.md); `ortbuild.publish.registry` pushes and pulls it.

The manifest's artifactType is ARTIFACT_TYPE, its config a ModelPack model config (CONFIG_TYPE) made from the
release index: descriptor (name, version, createdAt, description), config (format "onnx", precision and
quantization in the spec's words), modelfs (type "layers", diffIds: the layers' digests, which for raw layers
are their content hashes). Each release file is one raw layer, titled with its file name
(org.opencontainers.image.title and org.cncf.model.filepath, which clients such as `oras pull`, modctl and kit
name the file by) and described by org.cncf.model.file.metadata+json.

The spec has no media type for an encrypted model. The bundle (the encrypted artifacts, their signed manifests,
loaders and golden data, one deterministic tar) is a *weight* layer, *raw*: a ModelPack client writes a raw layer
to disk as it is, so the pulled file is byte for byte the one SHA256SUMS signs and `ortbuild verify` checks it
unchanged (a `.tar` weight layer would be unpacked by clients, and its signature could no longer be checked).
The layer says what it is with dev.ortbuild.* annotations (an ortbuild-release-v1 bundle, encrypted). The index
(release.json) describes the weights: weight.config. The provenance, SHA256SUMS, its minisign signature and the
OpenSSF model signature are documents about the model, read by verifiers, never by a runtime: doc.
"""

from __future__ import annotations

import json
import re
import tarfile
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ortbuild.artifact.manifest_types import MANIFEST, Manifest
from ortbuild.errors import OrtbuildError
from ortbuild.files import sha256_file
from ortbuild.publish import epochs, release, release_index

ARTIFACT_TYPE = "application/vnd.cncf.model.manifest.v1+json"
CONFIG_TYPE = "application/vnd.cncf.model.config.v1+json"
TITLE = "org.opencontainers.image.title"
FILEPATH = "org.cncf.model.filepath"
FILE_METADATA = "org.cncf.model.file.metadata+json"
WEIGHT = "application/vnd.cncf.model.weight.v1.raw"
WEIGHT_CONFIG = "application/vnd.cncf.model.weight.config.v1.raw"
DOC = "application/vnd.cncf.model.doc.v1.raw"
# a release file's kind (release.Published.files) -> its layer's media type
LAYER_TYPES = {"index": WEIGHT_CONFIG, "bundle": WEIGHT, "provenance": DOC, "sums": DOC, "signature": DOC,
               "model_signature": DOC}
MODEL_SIGNATURE = "model.sig"  # the OpenSSF model-signing bundle: optional (older releases lack it)
# ortbuild's precisions in the spec's words: (precision, quantization); int4-weight stores 4-bit blocks of weights
# and computes in float32 (MatMulNBits)
SPEC_PRECISION: dict[str, tuple[str, str | None]] = {
    "fp32": ("float32", None), "fp16": ("float16", None), "int8-dynamic": ("int8", "int8-dynamic"),
    "int8-static": ("int8", "int8-static"), "int4-weight": ("float32", "int4-weight")}


@dataclass(frozen=True)
class Facts:
    """What the bundle's manifests say about a release, for the annotations and the config (the index lacks it)."""
    precisions: list[str]            # ortbuild's names, sorted, each once
    epoch: int                       # the release's: its artifacts' lowest
    encrypted: bool                  # every artifact encrypted


def facts(published: release.Published) -> Facts | None:
    """Read each model's manifest from the bundle (an uncompressed tar: found by seeking past the data), or None
    when a manifest cannot be read: these are labels for registry tools, and `verify` judges the release itself."""
    index = published.index
    wanted = {f"{index['name']}/{model}/{MANIFEST}" for model in index["models"]}
    found: dict[str, Manifest] = {}
    try:
        with tarfile.open(published.files["bundle"], mode="r:") as tar:
            for member in tar:
                if member.name in wanted and member.isfile() and member.size < 64 << 20:
                    f = tar.extractfile(member)
                    if f is not None:
                        found[member.name] = Manifest.from_json(f.read().decode(), member.name)
    except (OSError, tarfile.TarError, ValueError, OrtbuildError):
        return None
    if set(found) != wanted:
        return None
    ms = list(found.values())
    return Facts(sorted({m.precision.name for m in ms}), epochs.release_epoch({m.model: m.epoch for m in ms}),
                 all(m.encryption is not None for m in ms))


def manifest_annotations(index: release_index.ReleaseIndex, known: Facts | None) -> dict[str, str]:
    """The manifest's annotations (either layout): OCI's, then ortbuild's (target, runtime, providers, precision,
    epoch, models, signing key)."""
    out = {TITLE: index["name"], "org.opencontainers.image.version": index["project"]["version"],
           "org.opencontainers.image.created": index["created"],
           "org.opencontainers.image.description": index.get("description", ""),
           "dev.ortbuild.format": index["format"],
           "dev.ortbuild.target": index["target"], "dev.ortbuild.runtime": index["runtime"],
           "dev.ortbuild.providers": ",".join(p["name"] for p in index["providers"]),
           "dev.ortbuild.models": ",".join(index["models"]),
           "dev.ortbuild.public-key-id": index["signing"]["public_key_id"],
           "dev.ortbuild.forced": str(bool(index["forced"])).lower()}
    if known is not None:
        out |= {"dev.ortbuild.precision": ",".join(known.precisions), "dev.ortbuild.epoch": str(known.epoch),
                "dev.ortbuild.encrypted": str(known.encrypted).lower()}
    return out


def layer(kind: str, path: Path, created: str, sha256: str | None = None) -> dict[str, Any]:
    """The layer descriptor of a release file (its bytes as they are: digest = diffId); `sha256`: the file's, where
    the caller knows it (else the file is hashed)."""
    if kind not in LAYER_TYPES:
        raise ValueError(f"no ModelPack media type for a release's {kind}")
    size = path.stat().st_size
    meta = {"name": path.name, "mode": 0o644, "uid": 0, "gid": 0, "size": size, "mtime": created,
            "typeflag": ord(tarfile.REGTYPE)}
    notes = {TITLE: path.name, FILEPATH: path.name, FILE_METADATA: json.dumps(meta, separators=(",", ":")),
             "dev.ortbuild.file": kind}
    if kind == "bundle":
        notes |= {"dev.ortbuild.bundle": release.FORMAT, "dev.ortbuild.encrypted": "true"}
    return {"mediaType": LAYER_TYPES[kind], "digest": "sha256:" + (sha256 or sha256_file(path)), "size": size,
            "annotations": notes}


def config(index: release_index.ReleaseIndex, layers: list[dict[str, Any]], known: Facts | None) -> bytes:
    """The ModelPack model config (application/vnd.cncf.model.config.v1+json) of a release."""
    descriptor = {"name": index["name"], "version": index["project"]["version"], "createdAt": index["created"],
                  "title": f"{index['project']['name']} {index['project']['version']} for {index['target']}"}
    if index.get("description"):
        descriptor["description"] = index["description"]
    conf = {"format": "onnx"}
    if known is not None:
        spec = [SPEC_PRECISION.get(p, ("", p)) for p in known.precisions]
        if precision := ",".join(sorted({p for p, _ in spec if p})):
            conf["precision"] = precision
        if quantization := ",".join(sorted({q for _, q in spec if q})):
            conf["quantization"] = quantization
    doc = {"descriptor": descriptor, "config": conf,
           "modelfs": {"type": "layers", "diffIds": [d["digest"] for d in layers]}}
    return json.dumps(doc, indent=2, sort_keys=True).encode() + b"\n"


def kind_of(layer: Mapping[str, Any]) -> str | None:
    """Which release file a ModelPack layer is, by its title, when its media type is the one ortbuild gives that
    file and its filepath (where set) agrees with its title; None otherwise."""
    notes = layer.get("annotations") or {}
    title = notes.get(TITLE, "") if isinstance(notes, dict) else ""
    if not isinstance(title, str) or notes.get(FILEPATH, title) != title:
        return None
    kind = None
    if title == release.SUMS:
        kind = "sums"
    elif title == release.SUMS_SIG:
        kind = "signature"
    elif title == MODEL_SIGNATURE:
        kind = "model_signature"
    elif m := re.fullmatch(r".+(\.tar|\.release\.json|\.intoto\.jsonl)", title):
        kind = {".tar": "bundle", ".release.json": "index", ".intoto.jsonl": "provenance"}[m[1]]
    return kind if kind is not None and layer.get("mediaType") == LAYER_TYPES[kind] else None
