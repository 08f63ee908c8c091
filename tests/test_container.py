"""Container format v1 and keys: round trips, determinism, rekey, key sources and keygen."""

from __future__ import annotations

import base64
import hashlib
import io
import os
from pathlib import Path

import pytest

from ortbuild.artifact import container, keygen, keys, pieces
from ortbuild.errors import KeyMissing
from tests.conftest import TEST_KEY, run_cli

KEK2 = bytes(range(100, 132))


@pytest.mark.parametrize("size", [0, 1, 4095, 4096, 4097, 3 * 4096, 20_000])
def test_round_trip_at_and_around_chunk_boundaries(size: int) -> None:
    data = os.urandom(size)
    ct = container.encrypt(data, TEST_KEY, chunk_log2=12)
    assert len(ct) == container.HEADER + size + 16 * max(1, -(-size // 4096))
    assert container.decrypt(ct, TEST_KEY) == data
    if size >= 64:
        assert data[:64] not in ct


def test_deterministic_only_when_asked() -> None:
    data = os.urandom(10_000)
    a, b = (container.encrypt(data, TEST_KEY, deterministic=True) for _ in range(2))
    assert a == b and container.parse_header(a).flags == container.FLAG_DETERMINISTIC
    other = container.encrypt(data[:-1] + bytes([data[-1] ^ 1]), TEST_KEY, deterministic=True)
    assert container.parse_header(other).nonce_prefix != container.parse_header(a).nonce_prefix  # new data key
    assert container.encrypt(data, TEST_KEY) != container.encrypt(data, TEST_KEY)


def test_rewrap_changes_the_key_slot_only(tmp_path: Path) -> None:
    data = os.urandom(9000)
    ct = container.encrypt(data, TEST_KEY, chunk_log2=12)
    (tmp_path / "ct").write_bytes(ct)
    out = io.BytesIO()
    sha, size, digests = container.rewrap_file(tmp_path / "ct", out, TEST_KEY, KEK2)
    new = out.getvalue()
    assert size == len(new) == len(ct) and sha == hashlib.sha256(new).hexdigest()
    # its piece digests: the header alone, then pieces of 4 chunks (4 KiB + 16-byte tag each), the last shorter
    assert (digests.head, digests.size) == (container.HEADER, 4 * (4096 + 16))
    assert digests.sha256 == [hashlib.sha256(new[at:at + n]).hexdigest()
                              for at, n in pieces.spans(len(new), digests.head, digests.size)]
    assert len(digests.sha256) == 1 + 1  # 9000 bytes: 3 chunks, one piece
    assert new[container.HEADER:] == ct[container.HEADER:]
    assert new[:container.PAYLOAD_HEADER] == ct[:container.PAYLOAD_HEADER]
    assert container.decrypt(new, KEK2) == data
    with pytest.raises(container.ContainerError) as err:
        container.decrypt(new, TEST_KEY)
    assert err.value.code == "wrong_key"


def test_keygen_sources_and_development_marker(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    made = keygen.keygen(tmp_path / "k", development=True)
    assert (tmp_path / "k" / "encryption.key").stat().st_mode & 0o777 == 0o600
    with pytest.raises(KeyMissing, match="never overwrites"):
        keygen.keygen(tmp_path / "k")
    from_file = keys.encryption_key(file=made["encryption_key"])
    assert from_file is not None and from_file.development and from_file.key_id == made["encryption_key_id"]
    assert str(from_file.secret) not in repr(from_file) and base64.b64encode(from_file.secret).decode() not in repr(
        from_file)
    # order: explicit, then the file option, then $ORTBUILD_KEY, then $ORTBUILD_KEY_FILE
    env = keys.encryption_key()
    assert env is not None and env.secret == TEST_KEY and env.source == "ORTBUILD_KEY"
    explicit = keys.encryption_key(KEK2, file=made["encryption_key"])
    assert explicit is not None and explicit.secret == KEK2
    monkeypatch.delenv("ORTBUILD_KEY")
    monkeypatch.setenv("ORTBUILD_KEY_FILE", made["encryption_key"])
    found = keys.encryption_key()
    assert found is not None and found.secret == from_file.secret
    signing = keys.signing_key(file=made["signing_key"])
    assert signing is not None and signing.key_id == made["public_key_id"] and signing.development
    assert keys.read_public_key(made["public_key"]) == signing.public_raw
    monkeypatch.setenv("ORTBUILD_KEY", "bm90IDMyIGJ5dGVz")
    with pytest.raises(KeyMissing, match=r"\$ORTBUILD_KEY: an encryption key is 32 bytes, this one is 12"):
        keys.encryption_key()


def test_build_without_keys_fails_with_its_exit_code_and_the_fix(tmp_path: Path) -> None:
    from tests.conftest import REPO

    env = {k: v for k, v in os.environ.items() if not k.startswith("ORTBUILD_")}
    proc = run_cli("build", "-t", "cpu-fp32", "--dist", str(tmp_path), cwd=REPO, env=env)
    assert proc.returncode == 8, proc.stderr
    assert "no signing key" in proc.stderr and "ortbuild keygen --out keys" in proc.stderr
    assert "Traceback" not in proc.stderr and not any(tmp_path.iterdir())


def test_a_missing_key_names_the_development_keys_nox_made_where_there_are_some(tmp_path: Path) -> None:
    assert keys.make_keys_hint(tmp_path) == f"make keys: `{keys.MAKE_KEYS}`"
    dev = tmp_path / keys.DEV_KEYS
    dev.mkdir(parents=True)
    (dev / keys.ENCRYPTION_FILE).write_text("made by nox\n")
    hint = keys.make_keys_hint(tmp_path)
    assert hint.startswith(f"make keys: `{keys.MAKE_KEYS}`; or, to try things out, the development keys nox made")
    assert f"ORTBUILD_KEY_FILE={dev / 'encryption.key'} ORTBUILD_SIGNING_KEY_FILE={dev / 'signing.key'}" in hint
    assert "never for a release" in hint
