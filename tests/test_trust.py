"""Trust: the artifact that ships is the one that passed its gates.

The tamper matrix: five kinds of tampering (the artifact, the manifest, a loader, the golden data, and a manifest
re-signed with another key) through five entry points (`build`, `test`, `release`, `inspect`, both loaders).
Every cell must be loud (a non-zero exit naming TAMPERED, or the loader's `tampered`/`bad_signature`), and
`build`/`test` must replace nothing. Then: `--repair` rebuilds on purpose and says so; another artifact's signed
directory swapped in is TAMPERED too, naming what it holds; `rekey` rotates the encryption key without a rebuild
and the old key gets WrongKey; the one trust root of `inspect`.
"""

from __future__ import annotations

import base64
import json
import shutil
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from ortbuild import cli
from ortbuild.artifact import ed25519, keygen, keys, loaders, manifest, manifest_types
from ortbuild.errors import Tampered, WrongKey
from ortbuild.files import sha256_file
from tests.conftest import TEST_KEY
from tests.test_loaders import install_node_app, node

TARGET = """
[targets.cpu]
runtime = "RUNTIME"
providers = ["CPUExecutionProvider"]
precision = "fp32"
"""
ART = Path("cpu") / "tiny_cnn"


def ortbuild(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str]:
    code = cli.main(list(args))
    out = capsys.readouterr()
    return code, out.out + out.err


@pytest.fixture(scope="module")
def pristine(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """A project whose one artifact was built and tested (golden data signed): copied for each case."""
    from tests.conftest import here_runtime, model_table

    root = tmp_path_factory.mktemp("trust")
    (root / "targets.toml").write_text('[project]\nname = "t"\nversion = "1"\n\n' + model_table("tiny_cnn")
                                       + TARGET.replace("RUNTIME", here_runtime()))
    assert cli.main(["test", "-c", str(root / "targets.toml"), "--no-explain"]) == 0
    yield root


def copy(pristine: Path, tmp_path: Path) -> Path:
    root = tmp_path / "p"
    shutil.copytree(pristine, root, symlinks=True)
    return root


def _flip(path: Path, at: int = -20) -> None:
    data = bytearray(path.read_bytes())
    data[at] ^= 0x01
    path.write_bytes(bytes(data))


def _edit_manifest(folder: Path) -> None:
    doc = json.loads((folder / manifest_types.MANIFEST).read_text())
    doc["notes"] = [*doc["notes"], "an edit"]
    (folder / manifest_types.MANIFEST).write_text(json.dumps(doc, indent=2, sort_keys=True) + "\n")


def _resign(folder: Path) -> None:
    """Swap the artifact for a modified one, and make the manifest say so, signed by a fresh key that the manifest
    itself names: only a reader that trusts the manifest's own key would accept it."""
    enc = folder / "model.onnx.enc"
    _flip(enc)
    doc = json.loads((folder / manifest_types.MANIFEST).read_text())
    sha = sha256_file(enc)
    doc["artifact"]["sha256"] = sha
    for f in doc["artifact"]["files"]:
        if f["name"] == enc.name:
            f["sha256"] = sha
    other = Ed25519PrivateKey.generate()
    raw = other.public_key().public_bytes_raw()
    doc["signing"].update(public_key=base64.b64encode(raw).decode(), public_key_id=ed25519.public_key_id(raw))
    text = (json.dumps(doc, indent=2, sort_keys=True) + "\n").encode()
    (folder / manifest_types.MANIFEST).write_bytes(text)
    (folder / manifest.SIGNATURE).write_bytes(base64.b64encode(other.sign(text)) + b"\n")


# kind -> (what to tamper with, given the artifact folder; the file whose bytes must survive)
KINDS: dict[str, tuple[Callable[[Path], None], str]] = {
    "artifact": (lambda f: _flip(f / "model.onnx.enc"), "model.onnx.enc"),
    "manifest": (_edit_manifest, manifest_types.MANIFEST),
    "loader": (lambda f: _flip(f / loaders.LOADER_DIR / loaders.NODE, 10), f"{loaders.LOADER_DIR}/{loaders.NODE}"),
    "golden": (lambda f: _flip(f / "golden" / "test_data_set_0" / "output_0.pb"), "golden/test_data_set_0/output_0.pb"),
    "resigned": (_resign, manifest.SIGNATURE),
}
LOUD = ("TAMPERED",)


@pytest.mark.parametrize("kind", list(KINDS))
@pytest.mark.parametrize("entry", ["build", "test", "release", "inspect"])
def test_tampering_is_loud_through_every_command_and_replaces_nothing(
        pristine: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str], kind: str, entry: str) -> None:
    root = copy(pristine, tmp_path)
    folder = root / "dist" / ART
    tamper, survivor = KINDS[kind]
    tamper(folder)
    after = (folder / survivor).read_bytes()
    cfg = str(root / "targets.toml")
    args = {"build": ["build", "-c", cfg], "test": ["test", "-c", cfg, "--no-explain"],
            "release": ["release", "-c", cfg, "--to", str(root / "out")], "inspect": ["inspect", str(folder)]}[entry]
    code, text = ortbuild(capsys, *args)
    assert code == Tampered.exit_code, text
    assert "TAMPERED" in text, text
    assert (folder / survivor).read_bytes() == after, "the tampered file was replaced without --repair"
    if entry == "release":
        assert not list((root / "out").rglob("*.tar")), "a bundle was released"


NODE_LOAD = """
import { LoaderError, load } from '%(loader)s';
try { await load({ folder: '%(folder)s', key: Buffer.from('%(key)s', 'base64') }); console.log('"ok"'); }
catch (e) { console.log(JSON.stringify(e instanceof LoaderError ? e.code : `crash:${e}`)); }
"""


@pytest.mark.parametrize("kind", list(KINDS))
def test_tampering_is_loud_through_both_loaders(pristine: Path, tmp_path: Path, kind: str) -> None:
    root = copy(pristine, tmp_path)
    folder = root / "dist" / ART
    app = tmp_path / "app"  # apps embed a copy of the generated loaders
    shutil.copytree(folder / loaders.LOADER_DIR, app)
    tamper, _ = KINDS[kind]
    tamper(folder)  # "loader": the Node loader beside the artifact; each loader checks the files listed there
    py_code = _python_load(app, folder)
    expected = {"tampered", "bad_signature"}
    assert py_code in expected
    node_app = install_node_app()
    loader = node_app / f"loader_trust_{kind}.mjs"
    shutil.copy(app / loaders.NODE, loader)
    got = node(node_app, NODE_LOAD % {"loader": loader.as_posix(), "folder": folder.as_posix(),
                                      "key": base64.b64encode(TEST_KEY).decode()})
    assert got in expected


def _python_load(app: Path, folder: Path) -> str:
    mod: Any = loaders.import_python_loader(app / loaders.python_file(ART.name))
    try:
        mod.load(key=TEST_KEY, folder=folder)
    except mod.LoaderError as e:
        return str(e.code)
    return "ok"


def test_untampered_copies_load_and_repair_rebuilds_on_purpose(pristine: Path, tmp_path: Path,
                                                               capsys: pytest.CaptureFixture[str]) -> None:
    root = copy(pristine, tmp_path)
    folder = root / "dist" / ART
    assert _python_load(folder / loaders.LOADER_DIR, folder) == "ok"  # the control: the copy itself is sound
    cfg = str(root / "targets.toml")
    _flip(folder / "model.onnx.enc")
    code, text = ortbuild(capsys, "test", "-c", cfg, "--no-explain", "--repair")
    assert code == 0, text
    assert "TAMPERED, replaced on --repair" in text and "model.onnx.enc" in text, text
    code, text = ortbuild(capsys, "inspect", str(folder))
    assert code == 0 and "OK" in text, text


def test_rekey_rotates_the_key_without_a_rebuild_and_the_old_key_gets_wrong_key(
        pristine: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    root = copy(pristine, tmp_path)
    folder = root / "dist" / ART
    cfg = str(root / "targets.toml")
    new = keygen.keygen(tmp_path / "keys")["encryption_key"]
    old = tmp_path / "old.key"
    old.write_text(base64.b64encode(TEST_KEY).decode() + "\n")
    old.chmod(0o600)
    built = json.loads((folder / manifest_types.MANIFEST).read_text())
    code, text = ortbuild(capsys, "rekey", str(root / "dist"), "--old-key-file", str(old), "--new-key-file", new)
    assert code == 0, text
    m, _ = manifest.read(folder)
    assert m.build_key == built["build_key"] and m.encryption is not None
    assert m.encryption.key_id == keys.encryption_key(file=new).key_id  # type: ignore[union-attr]
    # the new key: reused as it is (no rebuild), and its gates pass through the re-wrapped artifact
    monkeypatch.delenv("ORTBUILD_KEY")
    code, text = ortbuild(capsys, "test", "-c", cfg, "--no-explain", "--key-file", new)
    assert code == 0, text
    assert "up to date" in text or manifest.read(folder)[0].created == built["created"], text
    assert manifest.read(folder)[0].created == built["created"]
    # the old key: a clear WrongKey, from test, build, plan and the loader; nothing rebuilt
    for args in (["test", "-c", cfg, "--no-explain"], ["build", "-c", cfg]):
        code, text = ortbuild(capsys, *args, "--key-file", str(old))
        assert code == WrongKey.exit_code, text
        assert "wrong key" in text and "internal error" not in text, text
    code, text = ortbuild(capsys, "plan", "-c", cfg, "--key-file", str(old))
    assert code == 0 and "wrong key" in text, text
    assert _python_load_code(folder, TEST_KEY) == "wrong_key"
    assert manifest.read(folder)[0].created == built["created"]


@pytest.fixture(scope="module")
def pair(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """A built project of two targets and two models, each artifact validly signed in its own place: copied for
    each case (swapping one artifact directory for another is the tampering)."""
    from tests.conftest import here_runtime, model_table

    root = tmp_path_factory.mktemp("swap")
    (root / "targets.toml").write_text('[project]\nname = "t"\nversion = "1"\n\n' + model_table("tiny_cnn")
                                       + model_table("tiny_lstm") + TARGET.replace("RUNTIME", here_runtime())
                                       + '[targets.other]\nextends = "cpu"\noptimization = "basic"\n')
    assert cli.main(["build", "-c", str(root / "targets.toml")]) == 0
    yield root


# what is copied over dist/cpu/tiny_cnn/ (as `cp -r dist/cpu/tiny_lstm/* dist/cpu/tiny_cnn/` does): what it holds
SWAPS = {"model": (Path("cpu") / "tiny_lstm", "tiny_lstm for cpu"),
         "target": (Path("other") / "tiny_cnn", "tiny_cnn for other")}


@pytest.mark.parametrize("swap", list(SWAPS))
@pytest.mark.parametrize("entry", ["build", "test", "inspect", "release"])
def test_another_artifacts_signed_directory_swapped_in_is_tampered_and_named(
        pair: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str], swap: str, entry: str) -> None:
    root = copy(pair, tmp_path)
    folder = root / "dist" / ART
    source, holds = SWAPS[swap]
    for f in (root / "dist" / source).iterdir():  # cp -r source/* folder/
        if f.is_dir():
            shutil.copytree(f, folder / f.name, dirs_exist_ok=True)
        else:
            shutil.copy2(f, folder / f.name)
    swapped = (folder / manifest_types.MANIFEST).read_bytes()
    cfg = str(root / "targets.toml")
    args = {"build": ["build", "-c", cfg], "test": ["test", "-c", cfg, "--no-explain"],
            "inspect": ["inspect", str(folder)], "release": ["release", "-c", cfg, "-t", "cpu", "--force"]}[entry]
    code, text = ortbuild(capsys, *args)
    assert code == Tampered.exit_code, text
    assert "TAMPERED" in text and f"holds {holds}" in text and "not tiny_cnn for cpu" in text, text
    assert (folder / manifest_types.MANIFEST).read_bytes() == swapped, "the swapped directory was rebuilt over"
    if entry in ("inspect", "release"):
        released = root / "dist" / "release" / "cpu"
        assert not released.exists() or not any(released.iterdir()), "a swapped directory was released"
        return
    code, text = ortbuild(capsys, "build", "-c", cfg, "-t", "cpu", "-m", "tiny_cnn", "--repair")
    assert code == 0 and "TAMPERED, replaced on --repair" in text, text
    m, _ = manifest.read(folder)
    assert (m.target, m.model) == ("cpu", "tiny_cnn")
    code, text = ortbuild(capsys, "inspect", str(folder))
    assert code == 0 and "OK" in text, text


def test_rekey_refuses_to_re_sign_a_swapped_directory(pair: Path, tmp_path: Path,
                                                      capsys: pytest.CaptureFixture[str]) -> None:
    root = copy(pair, tmp_path)
    folder = root / "dist" / ART
    shutil.rmtree(folder)
    shutil.copytree(root / "dist" / "cpu" / "tiny_lstm", folder)  # mv dist/cpu/tiny_lstm dist/cpu/tiny_cnn
    old = tmp_path / "old.key"
    old.write_text(base64.b64encode(TEST_KEY).decode() + "\n")
    old.chmod(0o600)
    new = keygen.keygen(tmp_path / "keys")["encryption_key"]
    before = (folder / manifest_types.MANIFEST).read_bytes()
    code, text = ortbuild(capsys, "rekey", str(folder), "--old-key-file", str(old), "--new-key-file", new)
    assert code == Tampered.exit_code and "holds tiny_lstm for cpu" in text, text
    assert (folder / manifest_types.MANIFEST).read_bytes() == before


def test_an_artifact_copied_out_of_dist_is_inspected_where_it_is(pair: Path, tmp_path: Path,
                                                                  capsys: pytest.CaptureFixture[str]) -> None:
    """Outside an ortbuild output directory (an app's copy, an extracted bundle) a directory has no place to
    match: inspect checks its files and signature, and names what it holds."""
    shipped = tmp_path / "app" / "models" / "classifier"
    shutil.copytree(pair / "dist" / ART, shipped)
    code, text = ortbuild(capsys, "inspect", str(shipped))
    assert code == 0 and "OK" in text and text.startswith("cpu/tiny_cnn"), text


def _python_load_code(folder: Path, key: bytes) -> str:
    mod: Any = loaders.import_python_loader(loaders.python_path(folder, folder.name))
    try:
        mod.load(key=key, folder=folder)
    except mod.LoaderError as e:
        return str(e.code)
    return "ok"


def test_inspect_trusts_only_the_configured_key(pristine: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                                monkeypatch: pytest.MonkeyPatch) -> None:
    root = copy(pristine, tmp_path)
    folder = root / "dist" / ART
    code, text = ortbuild(capsys, "inspect", str(folder))
    assert code == 0 and "OK" in text, text
    monkeypatch.delenv("ORTBUILD_SIGNING_KEY")
    code, text = ortbuild(capsys, "inspect", str(folder))
    assert code == 8 and "UNVERIFIED" in text and " OK " not in text, text  # no key: nothing called verified
    made = keygen.keygen(tmp_path / "k")
    code, text = ortbuild(capsys, "inspect", str(folder), "--public-key", made["public_key"])
    assert code == Tampered.exit_code and "does not verify with the trusted public key" in text, text


def test_release_takes_verdicts_only_from_a_report_the_trusted_key_signed(
        pristine: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from ortbuild.gating.runner import REPORT

    root = copy(pristine, tmp_path)
    report = root / "dist" / ART / REPORT
    doc = json.loads(report.read_text())
    doc["result"]["worst"] = "a forged verdict"
    report.write_text(json.dumps(doc, indent=2) + "\n")
    code, text = ortbuild(capsys, "release", "-c", str(root / "targets.toml"), "--to", str(root / "out"))
    assert code == Tampered.exit_code and "TAMPERED" in text and REPORT in text, text
    assert not list((root / "out").rglob("*.tar"))
    # the control: the untouched copy releases
    root2 = tmp_path / "q"
    shutil.copytree(pristine, root2, symlinks=True)
    code, text = ortbuild(capsys, "release", "-c", str(root2 / "targets.toml"), "--to", str(root2 / "out"))
    assert code == 0, text


def _event_store(home: Path) -> Path:
    return home / ".cache" / "Microsoft" / "DeveloperTools" / ".onnxruntime" / "onnxruntime.db"


def test_build_and_gates_leave_onnx_runtimes_telemetry_store_untouched(make_project: Callable[..., Path],
                                                                       tmp_path: Path) -> None:
    """ONNX Runtime 1.31 keeps an event store naming the graphs of the models its sessions open. ortbuild's
    commands run with it off: nothing is written there at all. The control, a plain session in the same setup,
    writes the store (always its ProcessInfo event; SessionCreation events, which name the graph, are sampled)."""
    import os
    import subprocess
    import sys

    path = make_project(TARGET)
    env = {k: v for k, v in os.environ.items() if k != "ORT_DISABLE_TELEMETRY"}
    for side in ("ortbuild", "control"):
        home = tmp_path / side
        home.mkdir()
        run_env = {**env, "HOME": str(home), "XDG_CACHE_HOME": str(home / ".cache")}
        if side == "ortbuild":
            cmd = [sys.executable, "-m", "ortbuild", "test", "-c", str(path), "--no-explain"]
        else:
            model = tmp_path / "plain.onnx"
            shutil.copy(Path(__file__).resolve().parent.parent / "models" / "tiny_cnn.onnx", model)
            cmd = [sys.executable, "-c", f"import onnxruntime as o; o.InferenceSession({str(model)!r})"]
        proc = subprocess.run(cmd, env=run_env, capture_output=True, text=True, timeout=600)
        assert proc.returncode == 0, proc.stderr[-2000:]
        if side == "ortbuild":
            assert not _event_store(home).exists(), "an ortbuild command wrote ONNX Runtime's event store"
        elif not _event_store(home).exists():
            pytest.skip("this onnxruntime writes no local event store (the control made none): nothing to check")


def test_release_never_writes_through_a_symlink_out_of_dist(pristine: Path, tmp_path: Path,
                                                            capsys: pytest.CaptureFixture[str]) -> None:
    root = copy(pristine, tmp_path)
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (root / "dist" / "release").symlink_to(elsewhere)
    code, text = ortbuild(capsys, "release", "-c", str(root / "targets.toml"), "--force")
    assert code == 7 and "resolves outside the output directory" in text, text
    assert list(elsewhere.iterdir()) == []


# where a FIFO was planted -> the commands that read that file (each blocked on it for ever)
FIFO_READERS = {"cpu/tiny_cnn/manifest.json": ("build", "test", "release", "inspect"),
                "cpu/tiny_cnn/manifest.sig": ("build", "test", "release", "inspect"),
                "cpu/tiny_cnn/test-report.json": ("release",), "report.json": ("test", "summary")}


@pytest.mark.parametrize("planted", list(FIFO_READERS))
def test_a_fifo_planted_where_ortbuild_reads_its_own_files_never_hangs_a_command(
        pristine: Path, tmp_path: Path, planted: str) -> None:
    """A FIFO at a manifest, its signature or a report made build, test, release, inspect and summary wait for a
    writer for ever: each command now ends on its own (a time-out fails the test), none in an internal error."""
    import os
    import signal
    import subprocess
    import sys

    root = copy(pristine, tmp_path)
    cfg = str(root / "targets.toml")
    (root / "dist" / planted).unlink()
    os.mkfifo(root / "dist" / planted)
    args = {"build": ["build", "-c", cfg], "test": ["test", "-c", cfg, "--no-explain"],
            "release": ["release", "-c", cfg, "--force"], "inspect": ["inspect", str(root / "dist" / ART)],
            "summary": ["summary", "test", "-c", cfg]}
    for command in FIFO_READERS[planted]:
        proc = subprocess.Popen([sys.executable, "-m", "ortbuild", *args[command]], stdout=subprocess.PIPE,
                                stderr=subprocess.STDOUT, text=True, start_new_session=True)
        try:
            out, _ = proc.communicate(timeout=180)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)  # its workers too
            proc.communicate()
            pytest.fail(f"`ortbuild {command}` blocked on the FIFO at dist/{planted}")
        assert proc.returncode != 1 and "internal error" not in out, (command, out)


def test_rekey_never_writes_through_a_symlink_below_dist(pristine: Path, tmp_path: Path,
                                                         capsys: pytest.CaptureFixture[str]) -> None:
    """`rekey dist/cpu/tiny_cnn` where dist/cpu is a symlink to an artifact elsewhere: refused, nothing rewritten."""
    root = copy(pristine, tmp_path)
    elsewhere = tmp_path / "elsewhere"
    shutil.move(root / "dist" / "cpu", elsewhere)
    (root / "dist" / "cpu").symlink_to(elsewhere)
    before = {p.name: p.read_bytes() for p in (elsewhere / "tiny_cnn").iterdir() if p.is_file()}
    old = tmp_path / "old.key"
    old.write_text(base64.b64encode(TEST_KEY).decode() + "\n")
    old.chmod(0o600)
    new = keygen.keygen(tmp_path / "keys")["encryption_key"]
    code, text = ortbuild(capsys, "rekey", str(root / "dist" / ART), "--old-key-file", str(old), "--new-key-file", new)
    assert code == 7 and "is a symlink" in text, text
    assert {p.name: p.read_bytes() for p in (elsewhere / "tiny_cnn").iterdir() if p.is_file()} == before


# ------------------------------------------------------------------ no session option writes a file (third pass)

FILE_KEY = "session.collect_node_memory_stats_to_file"


def _victim(tmp_path: Path) -> Path:
    victim = tmp_path / "victim.rc"
    victim.write_text("export SAFE=1\n")
    victim.chmod(0o600)
    return victim


def test_a_session_option_that_writes_a_file_is_refused_and_the_file_untouched(
        capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    """The attack as the review wrote it: a pull request sets session.collect_node_memory_stats_to_file to a file of
    the user's; ONNX Runtime would truncate it and write a CSV on every build, test and app. Refused at config time
    (exit 3, naming the key); the file is never touched. Likewise a provider option that names a file."""
    from tests.conftest import here_runtime, model_table

    victim = _victim(tmp_path)
    root = tmp_path / "p"
    root.mkdir()
    for config in (f'session = {{ config = {{ "{FILE_KEY}" = "{victim}" }} }}',
                   'session = { config = { "ep.context_enable" = "1" } }',
                   f'session = {{ config = {{ "session.node_partition_config_file" = "{victim}" }} }}'):
        (root / "targets.toml").write_text('[project]\nname = "t"\nversion = "1"\n\n' + model_table("tiny_cnn")
                                           + TARGET.replace("RUNTIME", here_runtime()) + config + "\n")
        code, out = ortbuild(capsys, "build", "-c", str(root / "targets.toml"))
        key = config.split('"')[1]
        assert code == 3 and f'config."{key}"' in out and "touches files" in out, out
        assert "Traceback" not in out
    assert victim.read_text() == "export SAFE=1\n" and not (root / "dist").exists()


def _locked_project(tmp_path: Path, applies: str, target_extra: str = "") -> tuple[Path, Path]:
    """A built project whose targets.lock holds an entry written by hand with the job's true digests (an "up to date"
    entry: the digests do not cover `applies`)."""
    from ortbuild.pipeline.build import Builder
    from ortbuild.pipeline.progress import Progress
    from ortbuild.project import config, lockfile, plan
    from tests.conftest import here_runtime, model_table

    root = tmp_path / "p"
    root.mkdir(parents=True)
    path = root / "targets.toml"
    path.write_text('[project]\nname = "t"\nversion = "1"\n\n' + model_table("tiny_cnn")
                    + TARGET.replace("RUNTIME", here_runtime()) + target_extra)
    project = config.load(path)
    (job,) = plan.jobs(project)
    source, settings = Builder(project, root / "dist", secrets=keys.read_secrets(),
                               progress=Progress(quiet=True)).fingerprint(job)
    lockfile.path_of(project).write_text(f'version = 1\n[jobs."cpu/tiny_cnn"]\nsource = "{source}"\n'
                                         f'settings = "{settings}"\napplies = {applies}\n'
                                         f'[jobs."cpu/tiny_cnn".tune]\nkept = "by hand"\n')
    return path, root / "dist" / ART


def test_a_lock_entry_cannot_name_a_file_nor_change_a_job_that_asks_for_nothing(
        capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    """An up-to-date lock entry with the file key in `applies`: `build --locked` refuses the lock, naming the entry,
    and the file is untouched. An entry with a setting tuning may set, for a target that asks for no search or
    tuning, is not applied (said so): the artifact has the declared options."""
    victim = _victim(tmp_path)
    path, _ = _locked_project(tmp_path / "a", f'{{ session = {{ config = {{ "{FILE_KEY}" = "{victim}" }} }} }}')
    code, out = ortbuild(capsys, "build", "-c", str(path), "--locked")
    assert code == 3 and f'[jobs."cpu/tiny_cnn".applies.session] config."{FILE_KEY}"' in out, out
    assert victim.read_text() == "export SAFE=1\n"
    path, folder = _locked_project(tmp_path / "b", '{ session = { intra_op_num_threads = 1, config = { '
                                                   '"session.intra_op.allow_spinning" = "0" } } }')
    code, out = ortbuild(capsys, "build", "-c", str(path), "--locked")
    assert code == 0 and "the entry of cpu/tiny_cnn is not applied: its target asks for no search or tuning" in out
    m, _ = manifest.read(folder)
    assert m.session["intra_op_num_threads"] == 0 and m.session["config"] == {} and m.locked is None
    # the same entry applies where the target asks for tuning (tune = true; no search: its quantization part would not)
    path, folder = _locked_project(tmp_path / "c", '{ session = { intra_op_num_threads = 1 } }', "tune = true\n")
    code, out = ortbuild(capsys, "build", "-c", str(path), "--locked")
    assert code == 0, out
    assert manifest.read(folder)[0].session["intra_op_num_threads"] == 1
