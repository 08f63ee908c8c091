"""OpenSSF model signing (ortbuild/publish/openssf.py, ortbuild/artifact/p256.py): the P-256 key derived from the
Ed25519 seed, model.sig written and checked over a directory (a changed byte, an extra or missing file, another
key: refused), the release's model.sig through `ortbuild verify --public-key model-signing.pub` and `pull`, and the
real upstream `model_signing` CLI (model-signing 1.1.1, in a venv cached under the tests' cache) verifying a
release and refusing it after a one-byte change."""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from ortbuild.artifact import keygen, keys, p256
from ortbuild.artifact.keys import SigningKey
from ortbuild.errors import ArtifactError, KeyMissing, Tampered
from ortbuild.publish import deploy, openssf, verify
from tests.genmodels import default_cache_root, locked
from tests.test_release import SIGNER, cli, public_key_file, released, tested  # noqa: F401  (module fixtures)

MODEL_SIGNING = "1.1.1"
PYOPENSSL = "26.4.0"  # model-signing 1.1.1 imports OpenSSL (through sigstore) without declaring it


def _key(seed: int) -> SigningKey:
    return SigningKey(Ed25519PrivateKey.from_private_bytes(bytes([seed]) * 32), "tests")


def _sha(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _model(root: Path, sign_key: SigningKey = SIGNER) -> tuple[Path, dict[str, str]]:
    """A directory of three files and its model.sig; the files' digests."""
    folder = root / "mymodel"
    folder.mkdir()
    (folder / "weights.bin").write_bytes(bytes(range(256)) * 64)
    (folder / "config.json").write_text('{"layers": 2}\n')
    (folder / "README").write_text("a model\n")
    digests = {p.name: _sha(p) for p in folder.iterdir()}
    (folder / openssf.SIGNATURE).write_bytes(openssf.sign(folder.name, digests, sign_key))
    return folder, digests


def _check(folder: Path, public: ec.EllipticCurvePublicKey) -> openssf.Signed:
    """What `verify` does with a directory: the signature, then every file against it (hashed here)."""
    sig = folder / openssf.SIGNATURE
    signed = openssf.verify(sig, sig.read_bytes(), public)
    openssf.check_files(folder, signed, {p.name: _sha(p) for p in folder.iterdir()
                                         if p.name != openssf.SIGNATURE and p.is_file() and not p.is_symlink()})
    return signed


def _public(sign_key: SigningKey = SIGNER) -> ec.EllipticCurvePublicKey:
    return sign_key.model_signing_key.public_key()


# ------------------------------------------------------------------------------------------- the P-256 key

def test_the_p256_key_is_hkdf_sha256_of_the_seed_reduced_into_the_curve_order() -> None:
    """An independent HKDF (RFC 5869, with hmac) and the reduction the docs state give the same scalar: the
    derivation cannot change without this test failing (every model-signing.pub published would go stale)."""
    seed = bytes(range(32, 64))
    prk = hmac.new(b"\0" * 32, seed, hashlib.sha256).digest()  # no salt: HashLen zero bytes
    okm, block = b"", b""
    for i in (1, 2):
        block = hmac.new(prk, block + p256.INFO + bytes([i]), hashlib.sha256).digest()
        okm += block
    n = 0xFFFFFFFF00000000FFFFFFFFFFFFFFFFBCE6FAADA7179E84F3B9CAC2FC632551  # P-256's order (FIPS 186-4 D.1.2.3)
    expected = int.from_bytes(okm[:48], "big") % (n - 1) + 1
    key = SigningKey(Ed25519PrivateKey.from_private_bytes(seed), "tests").model_signing_key
    assert key.curve.name == "secp256r1"
    assert key.private_numbers().private_value == expected
    assert p256.INFO == b"ortbuild model-signing ECDSA P-256 v1"


def test_the_derivation_is_deterministic_and_different_seeds_give_different_keys() -> None:
    values = [_key(s).model_signing_key.private_numbers().private_value for s in (1, 1, 2, 3)]
    assert values[0] == values[1]
    assert len({values[0], values[2], values[3]}) == 3
    assert p256.public_pem(_public(_key(1))) == p256.public_pem(_public(_key(1)))
    with pytest.raises(ValueError, match="32 bytes"):
        p256.derive(b"short")


def test_the_derived_key_never_shows_in_a_signing_keys_repr() -> None:
    sk = _key(7)
    secret = str(sk.model_signing_key.private_numbers().private_value)
    assert secret not in repr(sk) and "model_signing" not in repr(sk)


# ----------------------------------------------------------------------------------------------- model.sig

def test_model_sig_is_a_sigstore_bundle_of_the_model_signing_statement(tmp_path: Path) -> None:
    folder, digests = _model(tmp_path)
    bundle = json.loads((folder / openssf.SIGNATURE).read_bytes())
    assert list(bundle) == ["mediaType", "verificationMaterial", "dsseEnvelope"]
    assert bundle["mediaType"] == "application/vnd.dev.sigstore.bundle.v0.3+json"
    assert bundle["verificationMaterial"] == {
        "publicKey": {"hint": hashlib.sha256(p256.public_pem(_public())).hexdigest()}, "tlogEntries": []}
    env = bundle["dsseEnvelope"]
    assert env["payloadType"] == "application/vnd.in-toto+json" and env["signatures"][0]["keyid"] == ""
    st = json.loads(base64.b64decode(env["payload"]))
    assert st["_type"] == "https://in-toto.io/Statement/v1"
    assert st["predicateType"] == "https://model_signing/signature/v1.0"
    names = sorted(digests)
    assert [r["name"] for r in st["predicate"]["resources"]] == names
    assert all(r["algorithm"] == "sha256" and r["digest"] == digests[r["name"]] for r in st["predicate"]["resources"])
    root = hashlib.sha256(b"".join(bytes.fromhex(digests[n]) for n in names)).hexdigest()
    assert st["subject"] == [{"name": "mymodel", "digest": {"sha256": root}}]
    assert st["predicate"]["serialization"] == {"method": "files", "hash_type": "sha256", "allow_symlinks": False,
                                                "ignore_paths": ["model.sig"]}
    assert st["predicate"]["ortbuild"] == {"algorithm": "Ed25519", "public_key_id": SIGNER.key_id,
                                           "public_key": base64.b64encode(SIGNER.public_raw).decode()}
    # the signature: ECDSA P-256 with SHA-256 over DSSE's pre-authentication encoding of the payload
    body = base64.b64decode(env["payload"])
    _public().verify(base64.b64decode(env["signatures"][0]["sig"]),
                     b"DSSEv1 28 application/vnd.in-toto+json %d %s" % (len(body), body), ec.ECDSA(
                         p256.CURVES["secp256r1"]()))


def test_a_verified_model_sig_gives_its_files_and_the_ed25519_key_it_names(tmp_path: Path) -> None:
    folder, digests = _model(tmp_path)
    signed = _check(folder, _public())
    assert signed.resources == digests and signed.name == "mymodel" and signed.ed25519 == SIGNER.public_raw
    assert (folder / openssf.SIGNATURE).read_bytes() == openssf.sign("mymodel", digests, SIGNER)  # deterministic


def test_a_changed_byte_is_refused_naming_the_file(tmp_path: Path) -> None:
    folder, _ = _model(tmp_path)
    data = bytearray((folder / "weights.bin").read_bytes())
    data[5000] ^= 1
    (folder / "weights.bin").write_bytes(bytes(data))
    with pytest.raises(Tampered, match=r"weights.bin: sha256 differs from .*model.sig"):
        _check(folder, _public())


def test_an_extra_or_missing_file_or_a_symlink_is_refused(tmp_path: Path) -> None:
    folder, _ = _model(tmp_path)
    (folder / "extra.py").write_text("import os\n")
    with pytest.raises(Tampered, match=r"extra.py: not signed in .*model.sig \(an extra file\)"):
        _check(folder, _public())
    (folder / "extra.py").unlink()
    (folder / "README").unlink()
    with pytest.raises(Tampered, match=r"README: missing \(signed in"):
        _check(folder, _public())
    (folder / "README").symlink_to(folder / "config.json")
    with pytest.raises(Tampered, match="README: not a regular file"):
        _check(folder, _public())


def test_another_key_or_an_edited_statement_is_refused(tmp_path: Path) -> None:
    folder, _ = _model(tmp_path)
    with pytest.raises(Tampered, match="signed by another key"):
        _check(folder, _public(_key(9)))
    sig = folder / openssf.SIGNATURE
    bundle = json.loads(sig.read_bytes())
    del bundle["verificationMaterial"]["publicKey"]["hint"]  # no hint: the signature itself must fail
    sig.write_text(json.dumps(bundle))
    with pytest.raises(Tampered, match="does not verify with the public key given"):
        _check(folder, _public(_key(9)))
    st = json.loads(base64.b64decode(bundle["dsseEnvelope"]["payload"]))
    st["predicate"]["resources"][0]["digest"] = "0" * 64
    bundle["dsseEnvelope"]["payload"] = base64.b64encode(json.dumps(st).encode()).decode()
    sig.write_text(json.dumps(bundle))
    with pytest.raises(Tampered, match="does not verify"):
        _check(folder, _public())
    sig.write_text("not json")
    with pytest.raises(ArtifactError, match=r"model\.sig: not a model-signing bundle"):
        _check(folder, _public())


def test_a_statement_that_is_signed_but_inconsistent_is_refused(tmp_path: Path) -> None:
    """Signed by the right key, but its subject's digest is not its resources': what model_signing refuses too."""
    folder, digests = _model(tmp_path)
    st = openssf.statement("mymodel", digests, SIGNER)
    st["subject"] = [{"name": "mymodel", "digest": {"sha256": "0" * 64}}]
    body = json.dumps(st).encode()
    sig = p256.sign(SIGNER.model_signing_key, openssf.pae(openssf.PAYLOAD_TYPE, body))
    bundle = json.loads((folder / openssf.SIGNATURE).read_bytes())
    bundle["dsseEnvelope"]["payload"] = base64.b64encode(body).decode()
    bundle["dsseEnvelope"]["signatures"][0]["sig"] = base64.b64encode(sig).decode()
    (folder / openssf.SIGNATURE).write_text(json.dumps(bundle))
    with pytest.raises(ArtifactError, match="subject's digest is not that of its resources"):
        _check(folder, _public())


# ------------------------------------------------------------------------------------------- public key files

def test_verify_takes_a_pem_ec_key_and_refuses_other_pem_keys_by_name(tmp_path: Path) -> None:
    pub = tmp_path / "model-signing.pub"
    pub.write_text(keygen.model_signing_public(SIGNER))
    found = keys.release_public_key(pub)
    assert isinstance(found, ec.EllipticCurvePublicKey) and p256.public_pem(found) == p256.public_pem(_public())
    assert keys.release_public_key(public_key_file(tmp_path)) == SIGNER.public_raw
    for name, key in (("ed25519.pem", Ed25519PrivateKey.generate()), ("p224.pem", ec.generate_private_key(
            ec.SECP224R1()))):
        (tmp_path / name).write_bytes(key.public_key().public_bytes(
            serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo))
        with pytest.raises(KeyMissing) as err:
            keys.release_public_key(tmp_path / name)
        assert f"{tmp_path / name}: " in err.value.message and "P-256, P-384 or P-521" in err.value.message
        assert "model-signing.pub" in (err.value.hint or "")
    with pytest.raises(KeyMissing, match=r"a PEM public key .*not the Ed25519 signing\.pub"):
        keys.read_public_key(pub)  # inspect and the manifests take signing.pub only


# ---------------------------------------------------------------------------- a release: verify and pull

def _release_copy(released: Path, tmp: Path) -> tuple[Path, Path]:  # noqa: F811
    """A copy of the module's release (tests change it) and the model-signing.pub of its key."""
    folder = tmp / "cpu"
    shutil.copytree(released, folder)
    pub = tmp / "model-signing.pub"
    pub.write_text(keygen.model_signing_public(SIGNER))
    return folder, pub


def _flip_a_byte(path: Path) -> None:
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0x01
    path.write_bytes(bytes(data))


def test_release_writes_model_sig_and_verify_takes_either_public_key(released: Path, tmp_path: Path) -> None:  # noqa: F811
    folder, pub = _release_copy(released, tmp_path)
    assert oct((folder / "model.sig").stat().st_mode & 0o777) == "0o644"
    ok = cli("verify", str(folder), "--public-key", str(pub), "--no-run", cwd=tmp_path)
    assert ok.returncode == 0, ok.stderr
    assert "signature    model.sig verified (OpenSSF model signing, EC key" in ok.stdout
    assert f"it signs the Ed25519 key id {SIGNER.key_id}" in ok.stdout
    assert "signature    SHA256SUMS verified" in ok.stdout and "artifacts    " in ok.stdout
    ed = cli("verify", str(folder), "--public-key", str(public_key_file(tmp_path)), "--no-run", cwd=tmp_path)
    assert ed.returncode == 0 and "model.sig    present, not checked" in ed.stdout, ed.stdout + ed.stderr
    (folder / "notes.txt").write_text("unsigned\n")  # signing.pub checks SHA256SUMS's files only; model.sig: all
    extra = cli("verify", str(folder), "--public-key", str(pub), "--no-run", cwd=tmp_path)
    assert extra.returncode == 7 and "notes.txt: not signed in" in extra.stderr, extra.stderr
    assert cli("verify", str(folder), "--public-key", str(public_key_file(tmp_path)), "--no-run",
               cwd=tmp_path).returncode == 0
    (folder / "notes.txt").unlink()
    (folder / "model.sig").unlink()
    missing = cli("verify", str(folder), "--public-key", str(pub), "--no-run", cwd=tmp_path)
    assert missing.returncode == 7 and "model.sig: missing" in missing.stderr and "signing.pub" in missing.stderr


def test_a_changed_sums_file_is_named_against_model_sig(released: Path, tmp_path: Path) -> None:  # noqa: F811
    folder, pub = _release_copy(released, tmp_path)
    (folder / "SHA256SUMS").write_bytes((folder / "SHA256SUMS").read_bytes() + b"\n")
    proc = cli("verify", str(folder), "--public-key", str(pub), "--no-run", cwd=tmp_path)
    assert proc.returncode == 7 and "SHA256SUMS: sha256 differs from" in proc.stderr and "model.sig" in proc.stderr


def test_pull_places_a_release_verified_with_model_signing_pub(released: Path, tmp_path: Path) -> None:  # noqa: F811
    folder, pub = _release_copy(released, tmp_path)
    key = keys.release_public_key(pub)
    v = deploy.place(folder, tmp_path / "deployed", key, source="tests", run=False, key=None)
    assert v.lines[0].startswith("signature    model.sig verified") and (tmp_path / "deployed" / "tiny_cnn").is_dir()
    assert verify.publisher_key(folder, key) == SIGNER.public_raw


# ------------------------------------------------------------------------------------ the upstream CLI

@pytest.fixture(scope="session")
def model_signing() -> Path:
    """The upstream `model_signing` command (model-signing 1.1.1), in a venv made once per machine and Python
    under the tests' cache (pip install from the package index)."""
    root = default_cache_root()
    root.mkdir(parents=True, exist_ok=True)
    venv = root / f"model-signing-{MODEL_SIGNING}-py{sys.version_info.major}.{sys.version_info.minor}"
    done = venv / ".ortbuild-installed"
    if not done.is_file():
        with locked(root / f"{venv.name}.lock"):
            if not done.is_file():
                shutil.rmtree(venv, ignore_errors=True)
                made = subprocess.run([sys.executable, "-m", "venv", str(venv)], capture_output=True, text=True)
                pip = subprocess.run([str(venv / "bin" / "python"), "-m", "pip", "install", "--quiet",
                                      f"model-signing=={MODEL_SIGNING}", f"pyopenssl=={PYOPENSSL}"],
                                     capture_output=True, text=True, timeout=900) if made.returncode == 0 else made
                if pip.returncode != 0:
                    shutil.rmtree(venv, ignore_errors=True)
                    why = (f"cannot install model-signing=={MODEL_SIGNING} pyopenssl=={PYOPENSSL} into a venv "
                           f"(no package index?): {(pip.stderr or pip.stdout)[-800:]}")
                    if os.environ.get("ORTBUILD_REQUIRE_RELEASE_TOOLS"):
                        pytest.fail(why)
                    pytest.skip(why)
                done.write_text(f"model-signing=={MODEL_SIGNING} pyopenssl=={PYOPENSSL}\n")
    return venv / "bin" / "model_signing"


def _upstream_verify(exe: Path, folder: Path, pub: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([str(exe), "verify", "key", str(folder), "--signature", str(folder / "model.sig"),
                           "--public_key", str(pub)], capture_output=True, text=True, timeout=300)


def test_upstream_model_signing_verifies_a_release_and_refuses_a_one_byte_change(
        model_signing: Path, released: Path, tmp_path: Path) -> None:  # noqa: F811
    folder, pub = _release_copy(released, tmp_path)
    up = _upstream_verify(model_signing, folder, pub)
    assert up.returncode == 0 and "Verification succeeded" in up.stdout + up.stderr, up.stdout + up.stderr
    ours = cli("verify", str(folder), "--public-key", str(pub), "--no-run", cwd=tmp_path)
    assert ours.returncode == 0, ours.stderr
    _flip_a_byte(folder / "rel-1.0-cpu.tar")
    up = _upstream_verify(model_signing, folder, pub)
    said = up.stdout + up.stderr  # upstream prints a list's repr: its quoting depends on the digests' bytes
    assert up.returncode != 0 and re.search(r"Hash mismatch for \\?'rel-1\.0-cpu\.tar\\?'", said), said
    ours = cli("verify", str(folder), "--public-key", str(pub), "--no-run", cwd=tmp_path)
    assert ours.returncode == 7 and "rel-1.0-cpu.tar" in ours.stderr, ours.stderr
    other = tmp_path / "other.pub"  # and another key's public half: refused by upstream too
    other.write_text(keygen.model_signing_public(_key(3)))
    shutil.copy(released / "rel-1.0-cpu.tar", folder / "rel-1.0-cpu.tar")
    assert _upstream_verify(model_signing, folder, other).returncode != 0


def test_upstream_signing_lists_the_same_files_and_digests(
        model_signing: Path, released: Path, tmp_path: Path) -> None:  # noqa: F811
    """`model_signing sign key` over the release, with the derived key: the statement it writes has the resources
    and subject digest ortbuild's has, and ortbuild reads its bundle (no ortbuild key in it: said so)."""
    folder, pub = _release_copy(released, tmp_path)
    theirs = tmp_path / "theirs.sig"
    private = tmp_path / "p256.pem"
    private.write_bytes(SIGNER.model_signing_key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()))
    signed = subprocess.run([str(model_signing), "sign", "key", str(folder), "--signature", str(theirs),
                             "--private_key", str(private), "--ignore-paths", str(folder / "model.sig")],
                            capture_output=True, text=True, timeout=300)
    assert signed.returncode == 0, signed.stdout + signed.stderr
    key = keys.release_public_key(pub)
    assert isinstance(key, ec.EllipticCurvePublicKey)
    up = openssf.verify(theirs, theirs.read_bytes(), key)
    ours = openssf.verify(folder / "model.sig", (folder / "model.sig").read_bytes(), key)
    assert up.resources == ours.resources and len(ours.resources) == 5
    assert up.ed25519 is None and ours.ed25519 == SIGNER.public_raw
    st = json.loads(base64.b64decode(json.loads(theirs.read_bytes())["dsseEnvelope"]["payload"]))
    mine = json.loads(base64.b64decode(json.loads((folder / "model.sig").read_bytes())["dsseEnvelope"]["payload"]))
    assert st["subject"] == mine["subject"] and st["predicateType"] == mine["predicateType"]
    shutil.copy(theirs, folder / "model.sig")
    proc = cli("verify", str(folder), "--public-key", str(pub), "--no-run", cwd=tmp_path)
    assert proc.returncode == 7 and "names no ortbuild signing key" in proc.stderr, proc.stderr


def test_the_docs_pin_the_versions_tested_here() -> None:
    text = (Path(__file__).parent.parent / "docs" / "release.md").read_text()
    assert f"pip install model-signing=={MODEL_SIGNING} pyopenssl=={PYOPENSSL}\n" in text


def test_release_prints_the_model_signing_command_and_it_verifies(
        model_signing: Path, tested: Path, tmp_path: Path) -> None:  # noqa: F811
    """The signing key from a file with keygen's model-signing.pub beside it: release prints the upstream command,
    which verifies as printed (model_signing from the test venv)."""
    keydir = tmp_path / "keys"
    keydir.mkdir(mode=0o700)
    sign = keydir / "signing.key"
    sign.write_text(f"# ortbuild Ed25519 signing key\n{base64.b64encode(SIGNER.seed).decode()}\n")
    sign.chmod(0o600)
    keygen.write_model_signing_public(keydir, SIGNER)
    proc = cli("release", "-t", "cpu", "--to", str(tmp_path / "out"), "--signing-key-file", str(sign), cwd=tested,
               env={"ORTBUILD_SIGNING_KEY": ""})
    assert proc.returncode == 0, proc.stderr
    line = next(ln for ln in proc.stdout.splitlines() if "or with OpenSSF model_signing: " in ln)
    command = line.split("or with OpenSSF model_signing: ", 1)[1].split()
    assert command[:3] == ["model_signing", "verify", "key"] and command[-1] == str(keydir / "model-signing.pub")
    up = subprocess.run([str(model_signing), *command[1:]], capture_output=True, text=True, timeout=300,
                        cwd=tmp_path / "out")
    assert up.returncode == 0 and "Verification succeeded" in up.stdout + up.stderr, up.stdout + up.stderr
