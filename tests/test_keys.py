"""Keys: private key files (like ssh), typed key files, only regular files and pipes read, one key never taken as
both kinds, no core dumps of a process holding keys, keygen's private directory and symlinks, and a release's
refusal of development keys and the verify command it prints."""

from __future__ import annotations

import base64
import os
import re
import shlex
import socket
import stat
import subprocess
import sys
import textwrap
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from ortbuild.artifact import ed25519, keygen, keys
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
    return keygen.keygen(tmp_path / "my keys")  # a space: the printed chmod must quote the path


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
    assert ed25519.public_key_id(keys.read_public_key(made["public_key"])) == made["public_key_id"]
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


# ------------------------------------------------------------------------------- only regular files and pipes

def _fifo(path: Path) -> Path:
    os.mkfifo(path, 0o600)  # private: refused for being a FIFO, not for its mode
    return path


def test_a_fifo_key_file_is_refused_at_once_not_waited_on(made: dict[str, str], no_key_env: None,
                                                          monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """A named FIFO without a writer made `build` wait forever (its open blocks); one with a writer would hand over
    whatever key its planter writes. Both kinds, from the option and the environment: refused with what it is."""
    fifo = _fifo(tmp_path / "encryption.key")
    env = {k: v for k, v in os.environ.items() if k not in KEY_VARS}
    start = time.monotonic()
    proc = run_cli("rekey", str(tmp_path), "--old-key-file", str(fifo), "--new-key-file", made["encryption_key"],
                   "--signing-key-file", made["signing_key"], env=env)
    assert proc.returncode == 8, proc.stderr
    assert f"{fifo}: cannot read the encryption key: a FIFO (named pipe), not a regular file" in proc.stderr
    assert "hint: give the key file itself (a regular file, mode 0600)" in proc.stderr
    assert "Traceback" not in proc.stderr and time.monotonic() - start < 60
    for kind in ("encryption", "signing"):
        for how in ("file", "env"):
            with pytest.raises(KeyMissing, match="a FIFO \\(named pipe\\), not a regular file") as err:
                _load(kind, how, str(fifo), monkeypatch)
            assert err.value.message.startswith(f"{fifo}: cannot read the {kind} key")
            monkeypatch.delenv("ORTBUILD_KEY_FILE", raising=False)
            monkeypatch.delenv("ORTBUILD_SIGNING_KEY_FILE", raising=False)


def test_a_public_key_that_is_a_fifo_or_a_device_is_refused_not_read(tmp_path: Path) -> None:
    """`verify --public-key`, ORTBUILD_PUBLIC_KEY_FILE: a FIFO would block for ever, /dev/zero fill the memory."""
    fifo = _fifo(tmp_path / "signing.pub")
    for path, kind in ((fifo, "a FIFO (named pipe)"), (Path("/dev/zero"), "a character device")):
        with pytest.raises(KeyMissing, match=re.escape(f"{path}: cannot read the public key: {kind}")):
            keys.read_public_key(path)


def test_devices_sockets_and_directories_are_no_key_files(no_key_env: None, tmp_path: Path) -> None:
    sock_path = tmp_path / "agent.sock"
    sock = socket.socket(socket.AF_UNIX)
    sock.bind(str(sock_path))
    try:
        for path, what in (("/dev/zero", "a character device"), (str(sock_path), "a socket")):
            with pytest.raises(KeyMissing) as err:
                keys.encryption_key(file=path)
            assert err.value.message == f"{path}: cannot read the encryption key: {what}, not a regular file"
    finally:
        sock.close()
    with pytest.raises(KeyMissing, match="is a directory"):
        keys.signing_key(file=tmp_path)


def test_a_pipe_from_the_parent_is_still_read_even_when_its_writer_is_slow(made: dict[str, str],
                                                                          no_key_env: None) -> None:
    """`--key-file <(pass show key)`: the pipe is opened without blocking, then read as before (waiting for the
    writer), through /dev/fd and /dev/stdin alike."""
    text = Path(made["encryption_key"]).read_text()
    code = ("import sys; from ortbuild.artifact import keys; "
            "print(keys.encryption_key(file=sys.argv[1]).key_id)")
    for path in ("/dev/stdin", "/proc/self/fd/0"):
        writer = subprocess.Popen(["sh", "-c", 'sleep 1; printf "%s" "$1"', "sh", text], stdout=subprocess.PIPE)
        proc = subprocess.run([sys.executable, "-c", code, path], stdin=writer.stdout, capture_output=True,
                              text=True, timeout=120, env={k: v for k, v in os.environ.items() if k not in KEY_VARS})
        assert writer.stdout is not None
        writer.stdout.close()
        writer.wait()
        assert proc.returncode == 0, proc.stderr
        assert proc.stdout.strip() == made["encryption_key_id"]


# ------------------------------------------------------------------------------ one key is never both kinds

SIGNING_PUBLIC = keys.ed25519_public(TEST_SIGNING_SEED)
B64 = {name: base64.b64encode(raw).decode() for name, raw in
       (("key", TEST_KEY), ("seed", TEST_SIGNING_SEED), ("public", SIGNING_PUBLIC))}


def _untyped(path: Path, raw: bytes) -> Path:
    path.write_text(base64.b64encode(raw).decode() + "\n")
    path.chmod(0o600)
    return path


@pytest.mark.parametrize("enc_how", ["env", "file"])
@pytest.mark.parametrize("sign_how", ["env", "file"])
def test_the_signing_seed_given_as_the_encryption_key_is_refused(no_key_env: None, monkeypatch: pytest.MonkeyPatch,
                                                                  tmp_path: Path, enc_how: str, sign_how: str) -> None:
    """The environment's keys stay raw base64 (the variable's name is the kind); the same 32 bytes as both kinds
    are refused, wherever each came from, naming both sources."""
    enc_file, sign_file = _untyped(tmp_path / "enc", TEST_SIGNING_SEED), _untyped(tmp_path / "sign",
                                                                                 TEST_SIGNING_SEED)
    if enc_how == "env":
        monkeypatch.setenv("ORTBUILD_KEY", B64["seed"])
    if sign_how == "env":
        monkeypatch.setenv("ORTBUILD_SIGNING_KEY", B64["seed"])
    with pytest.raises(KeyMissing) as err:
        keys.read_secrets(enc_file if enc_how == "file" else None, sign_file if sign_how == "file" else None)
    enc_src = "$ORTBUILD_KEY" if enc_how == "env" else str(enc_file)
    sign_src = "$ORTBUILD_SIGNING_KEY" if sign_how == "env" else str(sign_file)
    assert err.value.message == (f"the encryption key ({enc_src}) is the signing key ({sign_src}): with one key for "
                                 "both, anyone who holds an app's decryption key could sign manifests")
    assert err.value.hint is not None and "ortbuild keygen" in err.value.hint


def test_an_encryption_key_that_signs_as_the_signing_key_or_is_its_public_half_is_refused(
        no_key_env: None, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ORTBUILD_SIGNING_KEY", B64["seed"])
    monkeypatch.setenv("ORTBUILD_KEY", B64["public"])
    with pytest.raises(KeyMissing, match=r"is the signing key's public half \(\$ORTBUILD_SIGNING_KEY\)"):
        keys.read_secrets()
    # the Ed25519 comparison itself: a signing key object built from the encryption key's bytes is that key
    enc = keys.EncryptionKey(TEST_KEY, "argument")
    sign = keys._signing_key_from_seed(TEST_KEY, "ORTBUILD_SIGNING_KEY", False, None)
    assert sign.public_raw == keys.ed25519_public(TEST_KEY)
    with pytest.raises(KeyMissing, match=r"the encryption key \(the key argument\) is the signing key"):
        keys.Secrets(enc, sign)
    # two different keys, as today: accepted, whichever the sources
    monkeypatch.setenv("ORTBUILD_KEY", B64["key"])
    secrets = keys.read_secrets()
    assert secrets.secret == TEST_KEY and secrets.signing is not None
    assert keys.Secrets(secrets.encryption, None).secret == TEST_KEY  # one key alone: nothing to compare


def test_the_cli_refuses_one_key_as_both_kinds_with_exit_8(made: dict[str, str], tmp_path: Path,
                                                          make_project: Callable[..., Path]) -> None:
    """The finding as written: `ORTBUILD_KEY=<the signing seed> ortbuild build` built with exit 0; and rekey
    refuses a new key that is the signing key."""
    config = make_project('[targets.cpu]\nruntime = "RUNTIME"\nproviders = ["CPUExecutionProvider"]\n')
    env = {**{k: v for k, v in os.environ.items() if k not in KEY_VARS}, "ORTBUILD_KEY": B64["seed"],
           "ORTBUILD_SIGNING_KEY": B64["seed"]}
    proc = run_cli("build", "-c", str(config), "-j", "1", env=env)
    assert proc.returncode == 8, proc.stdout + proc.stderr
    assert "the encryption key ($ORTBUILD_KEY) is the signing key ($ORTBUILD_SIGNING_KEY)" in proc.stderr
    assert not (tmp_path / "dist").exists()
    assert B64["seed"] not in proc.stdout + proc.stderr  # never the key itself
    seed = base64.b64decode(Path(made["signing_key"]).read_text().splitlines()[-1])
    same = _untyped(tmp_path / "new.key", seed)
    proc = run_cli("rekey", str(tmp_path), "--old-key-file", made["encryption_key"], "--new-key-file", str(same),
                   "--signing-key-file", made["signing_key"],
                   env={k: v for k, v in os.environ.items() if k not in KEY_VARS})
    assert proc.returncode == 8, proc.stderr
    assert f"the encryption key ({same}) is the signing key ({made['signing_key']})" in proc.stderr


# ------------------------------------------------------------------------------------------- no core dumps

CRASH = """
import ctypes, sys
def crash(where):
    with open(where, "w") as f:  # the crashing process's own limits, read at the crash
        f.write(open("/proc/self/limits").read())
    ctypes.string_at(0)  # a NULL read: SIGSEGV, a crash the kernel dumps like any other
"""


def core_pattern() -> str:
    return Path("/proc/sys/kernel/core_pattern").read_text().strip()


def cores_land_in_cwd() -> bool:
    """Whether the kernel writes a core as a file in the crashing process's directory (a plain name; not a
    path elsewhere, not a pipe to systemd-coredump or apport, where only the limit can be checked here)."""
    pattern = core_pattern()
    return bool(pattern) and not pattern.startswith("|") and "/" not in pattern


def crash_child(code: str, cwd: Path, *args: str, env: dict[str, str] | None = None,
                timeout: float = 300) -> tuple[int, tuple[str, str], list[Path]]:
    """Run `code` (which ends by calling crash(<limits file>)) in a child whose soft core limit is first raised to
    the hard one, as a user's `ulimit -c unlimited` would. Returns the wait status (os.WCOREDUMP: the kernel dumped
    it), the core limits (soft, hard) the child had when it crashed, and the core files left in `cwd`."""
    import resource

    hard = resource.getrlimit(resource.RLIMIT_CORE)[1]
    if hard == 0:
        pytest.skip("core dumps are off for this test process (hard RLIMIT_CORE 0): nothing to disable")
    limits = cwd / "limits.txt"

    def enable_cores() -> None:
        resource.setrlimit(resource.RLIMIT_CORE, (hard, hard))

    with open(cwd / "stderr.txt", "wb") as err:
        proc = subprocess.Popen([sys.executable, "-c", CRASH + textwrap.dedent(code), str(limits), *args],
                                cwd=cwd, env=env, stdout=subprocess.DEVNULL, stderr=err, preexec_fn=enable_cores)
        deadline = time.monotonic() + timeout
        while True:
            pid, status = os.waitpid(proc.pid, os.WNOHANG)
            if pid:
                break
            if time.monotonic() > deadline:
                proc.kill()
                proc.wait()
                pytest.fail(f"the child did not crash in {timeout} s: {(cwd / 'stderr.txt').read_text()[-2000:]}")
            time.sleep(0.05)
        proc.returncode = -1  # reaped here (os.waitpid): Popen must not wait for it again
    assert os.WIFSIGNALED(status) and os.WTERMSIG(status) == 11, (status, (cwd / "stderr.txt").read_text()[-3000:])
    line = next(ln for ln in limits.read_text().splitlines() if ln.startswith("Max core file size"))
    soft, hard_now = line.removeprefix("Max core file size").split()[:2]
    return status, (soft, hard_now), sorted(p for p in cwd.iterdir() if p.name.startswith("core"))


def test_a_crashed_ortbuild_command_leaves_no_core_with_its_keys(tmp_path: Path,
                                                                make_project: Callable[..., Path]) -> None:
    """`ortbuild test` crashes (SIGSEGV) right after reading both keys: its core limit is 0, soft and hard (set
    before any key is read), and no core appears. The same crash without ortbuild's main() (the control, in a
    process that read the same keys) keeps the limit the user set, and, where cores land in the working directory,
    leaves a core holding the encryption key: the test can fail."""
    config = make_project('[targets.cpu]\nruntime = "RUNTIME"\nproviders = ["CPUExecutionProvider"]\n')
    hook = """
        from ortbuild.artifact import keys
        from ortbuild.cli import main
        read, where = keys.read_secrets, sys.argv.pop(1)
        def read_then_crash(*a):
            read(*a)
            crash(where)
        keys.read_secrets = read_then_crash
        sys.exit(main())
    """
    env = {k: v for k, v in os.environ.items() if k != "PYTHONFAULTHANDLER"}
    work = tmp_path / "work"
    work.mkdir()
    status, limits, cores = crash_child(hook, work, "test", "-c", str(config), "-j", "1", "--no-explain", env=env)
    assert limits == ("0", "0")
    if cores_land_in_cwd():
        assert cores == [] and not os.WCOREDUMP(status)
    control = tmp_path / "control"
    control.mkdir()
    status, limits, cores = crash_child("""
        from ortbuild.artifact import keys
        secrets = keys.read_secrets()
        crash(sys.argv[1])
    """, control, env=env)
    assert limits[0] != "0"
    if cores_land_in_cwd():
        assert os.WCOREDUMP(status) and len(cores) == 1
        assert TEST_KEY in cores[0].read_bytes()  # what a core of a process holding the key gives away
        cores[0].unlink()


# ------------------------------------------------------------------------------------------------- keygen

def test_keygen_makes_its_directory_0700_and_refuses_an_open_one(tmp_path: Path) -> None:
    old = os.umask(0o022)
    try:
        made = keygen.keygen(tmp_path / "a" / "keys")
    finally:
        os.umask(old)
    assert stat.S_IMODE((tmp_path / "a" / "keys").stat().st_mode) == 0o700
    assert {stat.S_IMODE(os.stat(made[k]).st_mode) for k in ("encryption_key", "signing_key")} == {0o600}
    open_dir = tmp_path / "open dir"
    open_dir.mkdir()
    open_dir.chmod(0o755)
    with pytest.raises(KeyMissing) as err:
        keygen.keygen(open_dir)
    assert "accessible by group or others (mode 0755)" in err.value.message
    assert err.value.hint is not None and f"chmod 700 {shlex.quote(str(open_dir))}" in err.value.hint
    assert list(open_dir.iterdir()) == []  # nothing written
    open_dir.chmod(0o700)  # the fix it names works
    assert keygen.keygen(open_dir)["development"] == "false"


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
        keygen.keygen(out)
    assert target.read_text() == "mine\n"
    # --out itself a dangling symlink
    (tmp_path / "dangling").symlink_to(tmp_path / "nowhere")
    proc = run_cli("keygen", "--out", str(tmp_path / "dangling"))
    assert proc.returncode == 8 and "dangling symlink" in proc.stderr, proc.stderr
    assert not (tmp_path / "nowhere").exists()


def test_keygen_writes_model_signing_pub_the_derived_p256_key(made: dict[str, str]) -> None:
    from cryptography.hazmat.primitives.asymmetric import ec

    from ortbuild.artifact import p256

    pub = Path(made["model_signing_public_key"])
    assert pub.name == "model-signing.pub" and stat.S_IMODE(pub.stat().st_mode) == 0o644  # no secret
    key = p256.parse_public_pem(pub.read_bytes())
    assert isinstance(key.curve, ec.SECP256R1)
    signing = keys.signing_key(file=made["signing_key"])
    assert signing is not None
    assert p256.public_pem(key) == p256.public_pem(signing.model_signing_key.public_key())
    assert "PRIVATE" not in pub.read_text()


def test_keygen_model_signing_pub_writes_only_that_file_for_the_configured_key(
        made: dict[str, str], no_key_env: None, tmp_path: Path) -> None:
    out = tmp_path / "published"
    proc = run_cli("keygen", "--model-signing-pub", "--out", str(out),
                   env={**os.environ, "ORTBUILD_SIGNING_KEY_FILE": made["signing_key"]})
    assert proc.returncode == 0, proc.stderr
    assert sorted(p.name for p in out.iterdir()) == ["model-signing.pub"]
    assert (out / "model-signing.pub").read_bytes() == Path(made["model_signing_public_key"]).read_bytes()
    assert f"wrote {out / 'model-signing.pub'}" in proc.stdout
    again = run_cli("keygen", "--model-signing-pub", "--out", str(out), "--signing-key-file", made["signing_key"])
    assert again.returncode == 8 and "exists: keygen never overwrites" in again.stderr, again.stderr
    proc = run_cli("keygen", "--model-signing-pub", "--out", str(tmp_path / "none"),
                   env={k: v for k, v in os.environ.items() if k not in KEY_VARS})
    assert proc.returncode == 8 and "--model-signing-pub needs the signing key" in proc.stderr, proc.stderr
    assert not (tmp_path / "none").exists()
    wrong = run_cli("keygen", "--out", str(tmp_path / "k2"), "--signing-key-file", made["signing_key"])
    assert wrong.returncode == 2 and "goes with --model-signing-pub" in wrong.stderr, wrong.stderr


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
