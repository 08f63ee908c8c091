"""The ECDSA key that signs a release's OpenSSF model-signing bundle (model.sig; docs/release.md, "Verifying with
OpenSSF model_signing"). model-signing 1.1.1 verifies EC keys only (P-256, P-384, P-521), and ortbuild signs with
Ed25519, so the P-256 key is derived from the Ed25519 signing seed: HKDF-SHA256 over the 32-byte seed, then a
scalar in [1, n-1] from 48 bytes (reduced mod n-1, plus 1: a bias below 2^-128). No second secret to keep, and
the derivation is one-way (the P-256 key does not give the seed back). Its public half is a PEM
SubjectPublicKeyInfo file, model-signing.pub, the format `model_signing verify key --public_key` reads."""

from __future__ import annotations

from cryptography.exceptions import InvalidSignature, UnsupportedAlgorithm
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.hazmat.primitives.kdf.hkdf import HKDF

PUBLIC_FILE = "model-signing.pub"
INFO = b"ortbuild model-signing ECDSA P-256 v1"
# the order of P-256's base point (FIPS 186-4, D.1.2.3)
ORDER = 0xFFFFFFFF00000000FFFFFFFFFFFFFFFFBCE6FAADA7179E84F3B9CAC2FC632551
CURVES: dict[str, type[hashes.SHA256 | hashes.SHA384 | hashes.SHA512]] = {  # model-signing's, with their hashes
    "secp256r1": hashes.SHA256, "secp384r1": hashes.SHA384, "secp521r1": hashes.SHA512}
PEM_HEADER = b"-----BEGIN PUBLIC KEY-----"


def derive(seed: bytes) -> ec.EllipticCurvePrivateKey:
    """The P-256 private key of an Ed25519 signing seed (32 bytes)."""
    if len(seed) != 32:
        raise ValueError("an Ed25519 signing seed is 32 bytes")
    okm = HKDF(algorithm=hashes.SHA256(), length=48, salt=None, info=INFO).derive(seed)
    return ec.derive_private_key(int.from_bytes(okm, "big") % (ORDER - 1) + 1, ec.SECP256R1())


def public_pem(public: ec.EllipticCurvePublicKey) -> bytes:
    """The key as model-signing.pub holds it (and as model-signing hashes it for a bundle's key hint)."""
    pem: bytes = public.public_bytes(serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo)
    return pem


def _hash(public: ec.EllipticCurvePublicKey) -> hashes.HashAlgorithm:
    return CURVES[public.curve.name]()


def sign(private: ec.EllipticCurvePrivateKey, message: bytes) -> bytes:
    """A DER ECDSA signature of `message`, deterministic (RFC 6979) where the OpenSSL underneath has it, so that
    equal releases get equal model.sig files; randomized otherwise (equally valid)."""
    algorithm = _hash(private.public_key())
    try:
        sig: bytes = private.sign(message, ec.ECDSA(algorithm, deterministic_signing=True))
    except UnsupportedAlgorithm:
        sig = private.sign(message, ec.ECDSA(algorithm))
    return sig


def verify(public: ec.EllipticCurvePublicKey, signature: bytes, message: bytes) -> bool:
    try:
        public.verify(signature, message, ec.ECDSA(_hash(public)))
        return True
    except (InvalidSignature, ValueError):
        return False


def is_pem(data: bytes) -> bool:
    return PEM_HEADER in data


def parse_public_pem(data: bytes) -> ec.EllipticCurvePublicKey:
    """A PEM public key that model-signing's key verifier takes; ValueError saying what it is otherwise."""
    try:
        key = serialization.load_pem_public_key(data)
    except (ValueError, UnsupportedAlgorithm) as e:
        raise ValueError(f"not a PEM public key ({e})") from None
    if not isinstance(key, ec.EllipticCurvePublicKey):
        kind = type(key).__name__.removeprefix("_").replace("PublicKey", "")
        raise ValueError(f"{'an' if kind[:1] in 'AEIOU' else 'a'} {kind} public key, not an EC one (P-256, P-384 "
                         "or P-521)")
    if key.curve.name not in CURVES:
        raise ValueError(f"an EC key on {key.curve.name}, not on P-256, P-384 or P-521")
    return key
