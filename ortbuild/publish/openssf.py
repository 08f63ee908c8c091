"""OpenSSF model signing: `model.sig`, the model-signing bundle over a release directory's files, in the format
of the `model-signing` package (1.x; its CLI: `model_signing verify key DIR --signature DIR/model.sig
--public_key model-signing.pub`), and its verification by ortbuild (docs/release.md, "Verifying with OpenSSF
model_signing").

The file is a Sigstore bundle (v0.3, JSON) with no transparency-log entry: the key's hint (sha256 of its PEM) and a
DSSE envelope whose one signature is an ECDSA signature (DER) over DSSE's pre-authentication encoding of an in-toto
v1 statement. The statement's predicate (`https://model_signing/signature/v1.0`) lists every file of the directory
but model.sig with its sha256 (`resources`, sorted by name) and how the directory was serialized (`files`, sha256,
no symlinks, model.sig ignored); its one subject is the directory's name, with the sha256 of the resources'
digests concatenated in that order. v1.0 verifiers ignore other predicate fields: ortbuild adds `ortbuild`, the
Ed25519 public key that signed the release's manifests and SHA256SUMS, so that a verifier given only the P-256
public key trusts that key too (the P-256 signature covers it).

The key is the ECDSA P-256 key derived from the Ed25519 signing seed (ortbuild.artifact.p256): model-signing 1.1.1
verifies EC keys only. The digests come from the caller (the release knows them all: its bundle's was computed
while it was written); nothing here reads a large file.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import json
import os
import stat
from dataclasses import dataclass
from pathlib import Path, PurePosixPath

from cryptography.hazmat.primitives.asymmetric.ec import EllipticCurvePublicKey

from ortbuild.artifact import ed25519, p256
from ortbuild.artifact.keys import SigningKey
from ortbuild.errors import ArtifactError, Tampered

SIGNATURE = "model.sig"
BUNDLE_MEDIA_TYPE = "application/vnd.dev.sigstore.bundle.v0.3+json"
PAYLOAD_TYPE = "application/vnd.in-toto+json"
STATEMENT_TYPE = "https://in-toto.io/Statement/v1"
PREDICATE_TYPE = "https://model_signing/signature/v1.0"
SERIALIZATION: dict[str, object] = {"method": "files", "hash_type": "sha256", "allow_symlinks": False,
                                    "ignore_paths": [SIGNATURE]}
ALGORITHM = "Ed25519"
FETCH = "fetch the whole release again from its publisher; never use a release that fails verify"


def pae(payload_type: str, body: bytes) -> bytes:
    """DSSE's pre-authentication encoding: what an envelope's signatures sign."""
    t = payload_type.encode()
    return b"DSSEv1 %d %s %d %s" % (len(t), t, len(body), body)


def key_hint(public: EllipticCurvePublicKey) -> str:
    """The key's name in a bundle (model-signing's): the sha256 of its PEM SubjectPublicKeyInfo."""
    return hashlib.sha256(p256.public_pem(public)).hexdigest()


def _order(name: str) -> tuple[str, ...]:
    return PurePosixPath(name).parts  # model-signing sorts its resources as paths


def root_digest(resources: dict[str, str]) -> str:
    """The subject's sha256: over the resources' raw digests, concatenated in name order."""
    return hashlib.sha256(b"".join(bytes.fromhex(resources[n]) for n in sorted(resources, key=_order))).hexdigest()


def statement(name: str, digests: dict[str, str], sign_key: SigningKey) -> dict[str, object]:
    """The in-toto statement model.sig signs: `digests` (file name -> sha256) of the directory `name`."""
    resources = [{"name": n, "algorithm": "sha256", "digest": digests[n]} for n in sorted(digests, key=_order)]
    return {"_type": STATEMENT_TYPE, "subject": [{"name": name, "digest": {"sha256": root_digest(digests)}}],
            "predicateType": PREDICATE_TYPE,
            "predicate": {"serialization": SERIALIZATION, "resources": resources,
                          "ortbuild": {"algorithm": ALGORITHM, "public_key_id": sign_key.key_id,
                                       "public_key": base64.b64encode(sign_key.public_raw).decode()}}}


def sign(name: str, digests: dict[str, str], sign_key: SigningKey) -> bytes:
    """model.sig's bytes for the directory `name` whose files have `digests`, signed with the P-256 key derived
    from `sign_key`."""
    if SIGNATURE in digests:
        raise ValueError(f"{SIGNATURE} cannot sign itself")
    body = (json.dumps(statement(name, digests, sign_key), indent=2, sort_keys=True) + "\n").encode()
    private = sign_key.model_signing_key
    return _bundle(body, p256.sign(private, pae(PAYLOAD_TYPE, body)), key_hint(private.public_key()))


def _bundle(body: bytes, sig: bytes, hint: str) -> bytes:
    """The bundle's bytes (compact JSON, in model-signing's key order) for a signed payload."""
    bundle = {"mediaType": BUNDLE_MEDIA_TYPE, "verificationMaterial": {"publicKey": {"hint": hint}, "tlogEntries": []},
              "dsseEnvelope": {"payload": base64.b64encode(body).decode(), "payloadType": PAYLOAD_TYPE,
                               "signatures": [{"sig": base64.b64encode(sig).decode(), "keyid": ""}]}}
    return json.dumps(bundle, separators=(",", ":")).encode()


@dataclass(frozen=True)
class Signed:
    """What a verified model.sig says: the directory's name, its files' sha256 by name, and the ortbuild Ed25519
    public key (raw) its predicate names (None: a bundle ortbuild did not write)."""
    name: str
    resources: dict[str, str]
    ed25519: bytes | None
    hint: str


def _payload(path: Path, data: bytes, public: EllipticCurvePublicKey) -> tuple[bytes, bytes]:
    """The signed payload of the bundle in `data` and its signature, once the signature verifies with `public`."""
    try:
        bundle = json.loads(data)
        hint = bundle["verificationMaterial"]["publicKey"].get("hint")
        env = bundle["dsseEnvelope"]
        body = base64.b64decode(env["payload"], validate=True)
        sigs = [base64.b64decode(s["sig"], validate=True) for s in env["signatures"]]
        media, payload_type = bundle["mediaType"], env["payloadType"]
    except (ValueError, KeyError, TypeError, AttributeError, binascii.Error):
        raise ArtifactError(f"{path}: not a model-signing bundle (Sigstore bundle JSON holding a DSSE envelope)",
                            FETCH) from None
    if media != BUNDLE_MEDIA_TYPE or payload_type != PAYLOAD_TYPE:
        raise ArtifactError(f"{path}: a bundle of media type {media!r} with payload {payload_type!r}, not a "
                            f"model-signing bundle ({BUNDLE_MEDIA_TYPE}, {PAYLOAD_TYPE})", FETCH)
    if hint and hint != key_hint(public):
        raise Tampered(f"{path}: signed by another key (its key hint {str(hint)[:16]}… is not the sha256 of the "
                       f"public key given, {key_hint(public)[:16]}…)",
                       "give the publisher's model-signing.pub, or fetch the release again from its publisher")
    good = [s for s in sigs if p256.verify(public, s, pae(PAYLOAD_TYPE, body))]
    if not good:
        raise Tampered(f"{path}: its signature does not verify with the public key given (modified, or signed by "
                       "another key)", FETCH)
    return body, good[0]


def verify(path: Path, data: bytes, public: EllipticCurvePublicKey) -> Signed:
    """Check model.sig (its bytes `data`, read from `path`) with the EC public key `public`: the signature, then the
    statement (type, predicate type, one subject whose digest the resources give, the file serialization). Raises
    Tampered (a signature that fails) or ArtifactError (a malformed bundle), naming the file."""
    body, sig = _payload(path, data, public)
    try:
        st = json.loads(body)
        subject, pred = st["subject"], st["predicate"]
        if st["_type"] != STATEMENT_TYPE or st["predicateType"] != PREDICATE_TYPE or len(subject) != 1:
            raise ValueError(f"not an in-toto v1 statement of {PREDICATE_TYPE} with one subject")
        ser = pred["serialization"]
        if ser["method"] != "files" or ser["hash_type"] != "sha256" or ser.get("allow_symlinks"):
            raise ValueError(f"serialized as {ser}: ortbuild checks only sha256 over whole files, no symlinks")
        resources: dict[str, str] = {}
        for r in pred["resources"]:
            name, digest = str(r["name"]), str(r["digest"])
            if r["algorithm"] != "sha256" or len(bytes.fromhex(digest)) != 32 or name in resources:
                raise ValueError(f"resource {name!r}: not one sha256 digest")
            resources[name] = digest
        if root_digest(resources) != subject[0]["digest"]["sha256"]:
            raise ValueError("its subject's digest is not that of its resources")
        ours = pred.get("ortbuild")
        key = None
        if ours is not None:
            key = base64.b64decode(ours["public_key"], validate=True)
            if ours["algorithm"] != ALGORITHM or len(key) != 32 or ed25519.public_key_id(key) != ours["public_key_id"]:
                raise ValueError("its ortbuild signing key is not an Ed25519 public key with its id")
    except (ValueError, KeyError, TypeError, AttributeError, IndexError, binascii.Error) as e:
        raise ArtifactError(f"{path}: signed, but not a model-signing statement ortbuild reads: {e}", FETCH) from None
    if key is not None and data != _bundle(body, sig, key_hint(public)):
        # ortbuild's own bundle: no byte may change, the unsigned ones (JSON spacing, keyid, base64's spare bits)
        # included, as with every other published file
        raise Tampered(f"{path}: signed, but not byte for byte the bundle `ortbuild release` writes around its "
                       "signature (an unsigned part was changed)", FETCH)
    return Signed(str(subject[0]["name"]), resources, key, key_hint(public))


def check_files(folder: Path, signed: Signed, digests: dict[str, str]) -> None:
    """The directory holds exactly the files model.sig lists (and model.sig), each a regular file (never a
    symlink), and each of `digests` (name -> the sha256 the caller has checked, or will check the file against)
    is the one model.sig signs: like `model_signing verify` without --ignore_unsigned_files, where the caller
    checks the other files' bytes. Tampered naming the first file that differs."""
    hint = f"the directory differs from what its publisher signed in {SIGNATURE}: {FETCH}"
    there = {}
    for entry in sorted(os.scandir(folder), key=lambda e: e.name):
        if entry.name == SIGNATURE:
            continue
        there[entry.name] = entry.stat(follow_symlinks=False).st_mode
    for name, mode in there.items():
        if name not in signed.resources:
            raise Tampered(f"{folder / name}: not signed in {folder / SIGNATURE} (an extra file)",
                           f"remove it if you put it there; else {hint}")
        if not stat.S_ISREG(mode):
            raise Tampered(f"{folder / name}: not a regular file (model.sig signs regular files only)", hint)
    for name, digest in sorted(signed.resources.items()):
        if name not in there:
            raise Tampered(f"{folder / name}: missing (signed in {folder / SIGNATURE})", hint)
        if name in digests and digests[name] != digest:
            raise Tampered(f"{folder / name}: sha256 differs from {folder / SIGNATURE} (modified or damaged)", hint)
