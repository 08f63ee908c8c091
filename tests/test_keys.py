"""Keys: private key files (like ssh), typed key files, keygen's private directory and symlinks, and a release's
refusal of development keys and the verify command it prints."""

from __future__ import annotations

import base64
import os
import shlex
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from ortbuild.artifact import keys
from ortbuild.errors import KeyMissing
from tests.conftest import TEST_KEY, TEST_SIGNING_SEED, run_cli

KEY_VARS = ("ORTBUILD_KEY", "ORTBUILD_SIGNING_KEY", "ORTBUILD_KEY_FILE", "ORTBUILD_SIGNING_KEY_FILE",
            "ORTBUILD_PUBLIC_KEY_FILE")


@pytest.fixture
def no_key_env(monkeypatch: pytest.MonkeyPatch) -> None:
    """Only the key files a test names: the suite's fixed keys (conftest) are taken out of the environment."""
    for var in KEY_VARS:
        monkeypatch.delenv(var, raising=False)


@pytest.fixture
def made(tmp_path: Path) -> dict[str, str]:
    return keys.keygen(tmp_path / "my keys")  # a space: the printed chmod must quote the path


def _load(kind: str, how: str, path: str, monkeypatch: pytest.MonkeyPatch) -> object:
    if how == "file":
        return keys.encryption_key(file=path) if kind == "encryption" else keys.signing_key(file=path)
    monkeypatch.setenv("ORTBUILD_KEY_FILE" if kind == "encryption" else "ORTBUILD_SIGNING_KEY_FILE", path)
    return keys.encryption_key() if kind == "encryption" else keys.signing_key()


# ------------------------------------------------------------------------------------- private key files

@pytest.mark.parametrize("how", ["file", "env"])
@pytest.mark.parametrize("kind", ["encryption", "signing"])
@pytest.mark.parametrize("mode", [0o644, 0o640, 0o604, 0o660, 0o602, 0o666])
def test_a_key_file_group_or_others_may_read_or_write_is_refused_with_the_chmod(
        made: dict[str, str], no_key_env: None, monkeypatch: pytest.MonkeyPatch, kind: str, how: str,
        mode: int) -> None:
    path = made[f"{kind}_key"]
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o600  # keygen's files are private
    os.chmod(path, mode)
    with pytest.raises(KeyMissing) as err:
        _load(kind, how, path, monkeypatch)
    assert path in err.value.message and f"(mode {mode:04o})" in err.value.message
    assert err.value.hint == f"run `chmod 600 {shlex.quote(path)}`" and "'" in err.value.hint  # quoted: a space
    os.chmod(path, 0o600)  # the fix it names works
    assert _load(kind, how, path, monkeypatch) is not None


def test_the_public_key_is_no_secret_and_a_pipe_has_no_mode(made: dict[str, str], no_key_env: None) -> None:
    assert stat.S_IMODE(os.stat(made["public_key"]).st_mode) == 0o644
    assert keys.public_key_id(keys.read_public_key(made["public_key"])) == made["public_key_id"]
    # --key-file <(pass show key): a pipe, not a file with a mode
    text = Path(made["encryption_key"]).read_text()
    r, w = os.pipe()
    os.write(w, text.encode())
    os.close(w)
    try:
        key = keys.encryption_key(file=f"/dev/fd/{r}")
    finally:
        os.close(r)
    assert key is not None and key.key_id == made["encryption_key_id"]


def test_the_cli_refuses_a_readable_key_file_with_exit_8_and_no_traceback(made: dict[str, str],
                                                                           tmp_path: Path) -> None:
    os.chmod(made["signing_key"], 0o644)
    proc = subprocess.run([sys.executable, "-m", "ortbuild", "rekey", str(tmp_path), "--old-key-file",
                           made["encryption_key"], "--new-key-file", made["encryption_key"], "--signing-key-file",
                           made["signing_key"]], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 8, proc.stderr
    assert f"chmod 600 {shlex.quote(made['signing_key'])}" in proc.stderr
    assert "Traceback" not in proc.stderr and "internal error" not in proc.stderr


# ------------------------------------------------------------------------------------------ typed key files

def test_one_kind_of_key_file_is_refused_as_the_other(made: dict[str, str], no_key_env: None,
                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    cases = [("encryption", "file", made["signing_key"], "is a signing key, not an encryption key",
              "use encryption.key"),
             ("encryption", "env", made["signing_key"], "is a signing key, not an encryption key",
              "use encryption.key"),
             ("signing", "file", made["encryption_key"], "is an encryption key, not a signing key", "use signing.key"),
             ("signing", "env", made["encryption_key"], "is an encryption key, not a signing key", "use signing.key"),
             ("encryption", "file", made["public_key"], "is a public key, not an encryption key", "use encryption.key")]
    for kind, how, path, message, hint in cases:
        with pytest.raises(KeyMissing) as err:
            _load(kind, how, path, monkeypatch)
        assert err.value.message == f"{path} {message}", (kind, how)
        assert err.value.hint is not None and err.value.hint.startswith(hint)
        monkeypatch.delenv("ORTBUILD_KEY_FILE", raising=False)
        monkeypatch.delenv("ORTBUILD_SIGNING_KEY_FILE", raising=False)
    # the other direction for the base64 variable too: a signing key file's text pasted into $ORTBUILD_KEY
    monkeypatch.setenv("ORTBUILD_KEY", Path(made["signing_key"]).read_text())
    with pytest.raises(KeyMissing, match="is a signing key, not an encryption key"):
        keys.encryption_key()
    # a secret key given where the public key is expected is never taken for it
    with pytest.raises(KeyMissing, match="is a signing key, not a public key") as err:
        keys.read_public_key(made["signing_key"])
    assert err.value.hint is not None and "signing.pub" in err.value.hint


def test_untyped_key_files_stay_accepted_as_either_kind(tmp_path: Path, no_key_env: None) -> None:
    enc, sign = tmp_path / "enc", tmp_path / "sign"
    enc.write_text(f"# my own comment\n{base64.b64encode(TEST_KEY).decode()}\n")
    sign.write_text(base64.b64encode(TEST_SIGNING_SEED).decode() + "\n")
    for f in (enc, sign):
        f.chmod(0o600)
    e, s = keys.encryption_key(file=enc), keys.signing_key(file=sign)
    assert e is not None and e.secret == TEST_KEY and not e.development
    assert s is not None and s.path == str(sign)
    assert keys.encryption_key(file=sign) is not None  # untyped: its kind is the caller's word


def test_keygen_files_declare_their_kind_in_their_first_line(made: dict[str, str]) -> None:
    for name, kind in (("encryption_key", "encryption key"), ("signing_key", "signing key")):
        first = Path(made[name]).read_text().splitlines()[0]
        assert first.startswith(keys.HEADERS[kind])
        assert keys.declared_kind([first]) == kind


# ------------------------------------------------------------------------------------------------- keygen

def test_keygen_makes_its_directory_0700_and_refuses_an_open_one(tmp_path: Path) -> None:
    old = os.umask(0o022)
    try:
        made = keys.keygen(tmp_path / "a" / "keys")
    finally:
        os.umask(old)
    assert stat.S_IMODE((tmp_path / "a" / "keys").stat().st_mode) == 0o700
    assert {stat.S_IMODE(os.stat(made[k]).st_mode) for k in ("encryption_key", "signing_key")} == {0o600}
    open_dir = tmp_path / "open dir"
    open_dir.mkdir()
    open_dir.chmod(0o755)
    with pytest.raises(KeyMissing) as err:
        keys.keygen(open_dir)
    assert "accessible by group or others (mode 0755)" in err.value.message
    assert err.value.hint is not None and f"chmod 700 {shlex.quote(str(open_dir))}" in err.value.hint
    assert list(open_dir.iterdir()) == []  # nothing written
    open_dir.chmod(0o700)  # the fix it names works
    assert keys.keygen(open_dir)["development"] == "false"


def test_keygen_never_writes_through_a_symlink(tmp_path: Path) -> None:
    out = tmp_path / "keys"
    out.mkdir(mode=0o700)
    target = tmp_path / "elsewhere" / "stolen.key"
    (out / "encryption.key").symlink_to(target)  # dangling: Path.exists() is False for it
    proc = run_cli("keygen", "--out", str(out))
    assert proc.returncode == 8, proc.stderr
    assert "is a symlink" in proc.stderr and "never writes through a symlink" in proc.stderr
    assert "internal error" not in proc.stderr and "Traceback" not in proc.stderr
    assert not target.exists() and not target.parent.exists()
    assert sorted(p.name for p in out.iterdir()) == ["encryption.key"]  # no half set of keys either
    # a symlink to an existing file: refused too, the file unchanged
    (out / "encryption.key").unlink()
    target.parent.mkdir()
    target.write_text("mine\n")
    (out / "signing.key").symlink_to(target)
    with pytest.raises(KeyMissing, match="is a symlink"):
        keys.keygen(out)
    assert target.read_text() == "mine\n"
    # --out itself a dangling symlink
    (tmp_path / "dangling").symlink_to(tmp_path / "nowhere")
    proc = run_cli("keygen", "--out", str(tmp_path / "dangling"))
    assert proc.returncode == 8 and "dangling symlink" in proc.stderr, proc.stderr
    assert not (tmp_path / "nowhere").exists()


# ---------------------------------------------------------------------------------------------- release

def _key_file(path: Path, header: str, secret: bytes, development: bool = False) -> Path:
    path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    mark = f"# {keys.DEV_MARKER}: made for local builds, never use it for a release\n" if development else ""
    path.write_text(f"{header}\n{mark}{base64.b64encode(secret).decode()}\n")
    path.chmod(0o600)
    return path


def _env(**files: Path) -> dict[str, str]:
    """Environment changes for a subprocess that sees no key but the files given (the suite's fixed keys are
    blanked: an empty variable is no key)."""
    return {**{k: "" for k in KEY_VARS}, **{k: str(v) for k, v in files.items()}}


@pytest.fixture(scope="module")
def dev_tested(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A project whose cpu target was built with a DEVELOPMENT encryption key (and the suite's signing key) and
    passed its tests."""
    from tests.test_release import cli, make_project

    root = tmp_path_factory.mktemp("devrel")
    make_project(root)
    enc = _key_file(root / "keys" / "encryption.key", "# ortbuild encryption key (AES-256 KEK)", TEST_KEY,
                    development=True)
    proc = cli("test", "-t", "cpu", "-j", "1", "--no-explain", cwd=root,
               env={"ORTBUILD_KEY": "", "ORTBUILD_KEY_FILE": str(enc)})
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return root


@pytest.mark.runtime
def test_release_refuses_development_keys_unless_allowed(dev_tested: Path, tmp_path: Path) -> None:
    from tests.test_release import cli

    enc = dev_tested / "keys" / "encryption.key"
    proc = cli("release", "-t", "cpu", "--to", str(tmp_path / "out"), cwd=dev_tested,
               env={"ORTBUILD_KEY": "", "ORTBUILD_KEY_FILE": str(enc)})
    assert proc.returncode == 8, proc.stderr
    assert "release refused: DEVELOPMENT keys" in proc.stderr
    assert "cpu/tiny_cnn was built with a development encryption key" in proc.stderr
    assert "--allow-development-key" in proc.stderr
    assert not (tmp_path / "out").exists()  # nothing written
    # a development signing key (the same key, marked), with artifacts it signed
    dev_sign = _key_file(tmp_path / "dev" / "signing.key", "# ortbuild Ed25519 signing key", TEST_SIGNING_SEED,
                         development=True)
    proc = cli("release", "-t", "cpu", "--to", str(tmp_path / "out"), "--signing-key-file", str(dev_sign),
               cwd=dev_tested, env={"ORTBUILD_SIGNING_KEY": ""})
    assert proc.returncode == 8 and f"the signing key ({dev_sign}) is a development key" in proc.stderr, proc.stderr
    # allowed: released, with a WARNING (and in --json)
    proc = cli("release", "-t", "cpu", "--to", str(tmp_path / "out"), "--allow-development-key", cwd=dev_tested)
    assert proc.returncode == 0, proc.stderr
    assert "WARNING: released with DEVELOPMENT keys" in proc.stderr
    assert (tmp_path / "out" / "cpu" / "SHA256SUMS.minisig").exists()
    proc = cli("release", "-t", "cpu", "--to", str(tmp_path / "out2"), "--allow-development-key", "--json",
               cwd=dev_tested)
    assert proc.returncode == 0, proc.stderr
    assert '"warnings": [\n    "released with DEVELOPMENT keys' in proc.stdout


@pytest.mark.runtime
def test_the_verify_command_release_prints_works_from_anywhere(dev_tested: Path, tmp_path: Path) -> None:
    """The signing key from a file with signing.pub beside it: the command names that signing.pub by its full
    path, and run as printed, from another directory, with no key in the environment but the decryption key,
    it verifies (golden test included)."""
    from tests.test_release import cli, public_key_file

    keydir = tmp_path / "release keys"
    sign = _key_file(keydir / "signing.key", "# ortbuild Ed25519 signing key", TEST_SIGNING_SEED)
    public_key_file(keydir)  # keydir/signing.pub, as keygen writes it
    out = tmp_path / "out"
    proc = cli("release", "-t", "cpu", "--to", str(out), "--allow-development-key", cwd=dev_tested,
               env=_env(ORTBUILD_SIGNING_KEY_FILE=sign))
    assert proc.returncode == 0, proc.stderr
    line = next(ln for ln in proc.stdout.splitlines() if ln.startswith("verify with: "))
    command = shlex.split(line.removeprefix("verify with: "))
    assert command[:2] == ["ortbuild", "verify"] and command[3:] == ["--public-key", str(keydir / "signing.pub")]
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    enc = dev_tested / "keys" / "encryption.key"
    proc = subprocess.run([sys.executable, "-m", *command], cwd=elsewhere, capture_output=True, text=True,
                          timeout=600, env={**os.environ, **_env(ORTBUILD_KEY_FILE=enc)})
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "verified" in proc.stdout and "golden" in proc.stdout
    # no signing.pub beside the key: $ORTBUILD_PUBLIC_KEY_FILE, by its full path
    (keydir / "signing.pub").rename(tmp_path / "pub key")
    proc = cli("release", "-t", "cpu", "--to", str(out), "--allow-development-key", cwd=dev_tested,
               env=_env(ORTBUILD_SIGNING_KEY_FILE=sign, ORTBUILD_PUBLIC_KEY_FILE=tmp_path / "pub key"))
    assert proc.returncode == 0, proc.stderr
    assert f"--public-key {shlex.quote(str(tmp_path / 'pub key'))}" in proc.stdout
    # neither (the key from $ORTBUILD_SIGNING_KEY): a placeholder, and what to put there
    proc = cli("release", "-t", "cpu", "--to", str(out), "--allow-development-key", cwd=dev_tested)
    assert proc.returncode == 0, proc.stderr
    assert "--public-key SIGNING.PUB\n" in proc.stdout and "SIGNING.PUB: the signing.pub" in proc.stdout
