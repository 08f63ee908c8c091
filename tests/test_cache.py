"""The shared build cache (ortbuild.pipeline.cache): a directory and a real OCI registry (Debian's docker-registry
on loopback). Two fresh copies of a project: the second builds nothing and its artifacts are byte-identical; a
poisoned entry (a changed byte, another key's signature under this key's name) is refused with a warning naming
it, rebuilt and replaced; a plaintext artifact is never stored; bad cache settings are config errors."""

from __future__ import annotations

import base64
import json
import os
import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest

from ortbuild import cli
from ortbuild.errors import Tampered
from ortbuild.pipeline import cache
from tests.conftest import here_runtime, model_table, run_cli
from tests.test_registry import oci  # noqa: F401  (a module fixture: docker-registry on loopback)

TARGETS = """
[targets.cpu]
runtime = "RUNTIME"
providers = ["CPUExecutionProvider"]
precision = "fp32"

[targets.cpu-int8]
runtime = "RUNTIME"
providers = ["CPUExecutionProvider"]
precision = "int8-dynamic"
"""


def project(root: Path, cache_line: str = "", targets: str = TARGETS) -> Path:
    """A fresh project (what a fresh clone is to the cache: the same sources, nothing built)."""
    root.mkdir(parents=True)
    (root / "targets.toml").write_text(f'[project]\nname = "t"\nversion = "1"\n{cache_line}\n'
                                       + model_table("tiny_cnn") + targets.replace("RUNTIME", here_runtime()))
    return root / "targets.toml"


def build(config: Path, *args: str) -> list[dict[str, object]]:
    import contextlib
    import io

    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        code = cli.main(["build", "-c", str(config), "--json", *args])
    assert code == 0, out.getvalue()
    jobs: list[dict[str, object]] = json.loads(out.getvalue())["jobs"]
    return jobs


def files_of(dist: Path) -> dict[str, bytes]:
    return {str(p.relative_to(dist)): p.read_bytes() for p in sorted(dist.rglob("*"))
            if p.is_file() and p.parent != dist and "logs" not in p.parts}


def statuses(jobs: list[dict[str, object]]) -> dict[str, object]:
    return {f"{j['target']}/{j['model']}": j["status"] for j in jobs}


def test_a_second_fresh_project_pulls_every_job_and_ships_the_same_bytes(tmp_path: Path) -> None:
    store = tmp_path / "cache"
    first = build(project(tmp_path / "a"), "--cache", str(store))
    assert set(statuses(first).values()) == {"built"}
    assert len([p for p in store.iterdir() if not p.name.startswith(".")]) == 2  # one entry per job
    second = build(project(tmp_path / "b"), "--cache", str(store))
    assert set(statuses(second).values()) == {"pulled"}, second
    assert all(any("pulled from the cache" in n for n in j["notes"]) for j in second)  # type: ignore[attr-defined]
    a, b = files_of(tmp_path / "a" / "dist"), files_of(tmp_path / "b" / "dist")
    assert a and a == b
    assert not list((tmp_path / "b" / "dist").glob(".cache.*"))  # the staging directory is gone
    # pulled artifacts are then simply up to date, and test like built ones
    assert set(statuses(build(tmp_path / "b" / "targets.toml", "--cache", str(store))).values()) == {"up-to-date"}
    assert cli.main(["test", "-c", str(tmp_path / "b" / "targets.toml"), "--no-explain", "-t", "cpu",
                     "--no-summary"]) == 0


def _entry(store: Path, jobs: list[dict[str, object]], target: str) -> Path:
    job = next(j for j in jobs if j["target"] == target)
    m = json.loads((Path(str(job["artifact"])).parent / "manifest.json").read_text())
    return store / cache.entry_id(m["build_key"], target, str(job["model"]))


def test_a_tampered_entry_is_refused_rebuilt_and_replaced(tmp_path: Path) -> None:
    store = tmp_path / "cache"
    first = build(project(tmp_path / "a", targets=TARGETS.split("\n[targets.cpu-int8]")[0]), "--cache", str(store))
    entry = _entry(store, first, "cpu")
    blob = entry / "model.onnx.enc"
    data = bytearray(blob.read_bytes())
    data[len(data) // 2] ^= 1
    blob.write_bytes(bytes(data))
    again = build(project(tmp_path / "b", targets=TARGETS.split("\n[targets.cpu-int8]")[0]), "--cache", str(store))
    assert statuses(again) == {"cpu/tiny_cnn": "built"}
    warning = next(n for n in again[0]["notes"] if "WARNING" in n)  # type: ignore[attr-defined]
    assert str(entry) in warning and "refused" in warning and "model.onnx.enc" in warning, warning
    # the build replaced the entry: the next fresh project pulls it
    assert (entry / "model.onnx.enc").read_bytes() == (tmp_path / "b" / "dist" / "cpu" / "tiny_cnn"
                                                        / "model.onnx.enc").read_bytes()
    third = build(project(tmp_path / "c", targets=TARGETS.split("\n[targets.cpu-int8]")[0]), "--cache", str(store))
    assert statuses(third) == {"cpu/tiny_cnn": "pulled"}


def test_an_entry_signed_by_another_key_under_this_key_is_refused(tmp_path: Path,
                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    store, foreign_store = tmp_path / "cache", tmp_path / "foreign"
    one = TARGETS.split("\n[targets.cpu-int8]")[0]
    ours = build(project(tmp_path / "a", targets=one), "--cache", str(store))
    with monkeypatch.context() as mp:  # an attacker's build of the same model, signed with their key
        mp.setenv("ORTBUILD_SIGNING_KEY", base64.b64encode(os.urandom(32)).decode())
        theirs = build(project(tmp_path / "evil", targets=one), "--cache", str(foreign_store))
    entry = _entry(store, ours, "cpu")
    shutil.rmtree(entry)
    shutil.copytree(_entry(foreign_store, theirs, "cpu"), entry)  # ... planted under our build key
    doc = json.loads((entry / cache.ENTRY).read_text())
    doc["entry"] = entry.name
    (entry / cache.ENTRY).write_text(json.dumps(doc))
    again = build(project(tmp_path / "b", targets=one), "--cache", str(store))
    assert statuses(again) == {"cpu/tiny_cnn": "built"}
    warning = next(n for n in again[0]["notes"] if "WARNING" in n)  # type: ignore[attr-defined]
    assert str(entry) in warning and "TAMPERED" in warning and "does not verify" in warning, warning


def test_a_plaintext_artifact_is_never_cached(tmp_path: Path) -> None:
    store = tmp_path / "cache"
    jobs = build(project(tmp_path / "a", targets=TARGETS.split("\n[targets.cpu-int8]")[0].replace(
        'precision = "fp32"', 'precision = "fp32"\nencrypt = false')), "--cache", str(store))
    assert statuses(jobs) == {"cpu/tiny_cnn": "built"}
    assert any("not cached" in n and "plaintext" in n for n in jobs[0]["notes"])  # type: ignore[attr-defined]
    assert not store.exists() or not [p for p in store.iterdir()]


def test_the_cache_comes_from_the_flag_the_environment_or_targets_toml(tmp_path: Path,
                                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    one = TARGETS.split("\n[targets.cpu-int8]")[0]
    cfg = project(tmp_path / "a", 'cache = "../shared-cache"', targets=one)  # relative to targets.toml
    build(cfg)
    assert [p.name for p in (tmp_path / "shared-cache").iterdir()]
    assert statuses(build(project(tmp_path / "b", 'cache = "../shared-cache"', targets=one))) == {
        "cpu/tiny_cnn": "pulled"}
    # --no-cache: built here, nothing read
    assert statuses(build(project(tmp_path / "c", 'cache = "../shared-cache"', targets=one), "--no-cache")) == {
        "cpu/tiny_cnn": "built"}
    monkeypatch.setenv("ORTBUILD_CACHE", str(tmp_path / "env-cache"))  # the environment before targets.toml
    build(project(tmp_path / "d", 'cache = "../shared-cache"', targets=one))
    assert (tmp_path / "env-cache").is_dir()


@pytest.mark.parametrize(("value", "error"), [
    ('"s3://bucket/x"', "unknown cache scheme"),
    ('"oci://localhost:5000/cache:v1"', "a cache is a repository, not a tag"),
    ('"oci://Bad Host/x"', "is not an OCI reference"),
    ("3", "must be a string"),
])
def test_a_bad_cache_setting_is_a_config_error_naming_it(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                                         value: str, error: str) -> None:
    cfg = project(tmp_path / "a", f"cache = {value}", targets=TARGETS.split("\n[targets.cpu-int8]")[0])
    assert cli.main(["build", "-c", str(cfg)]) == 3
    err = capsys.readouterr().err
    assert error in err and "project.cache" in err and "Traceback" not in err, err
    assert not (tmp_path / "a" / "dist" / "cpu").exists()


def test_a_file_where_the_cache_directory_should_be_is_a_config_error(tmp_path: Path,
                                                                      capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "afile").write_text("x")
    cfg = project(tmp_path / "a", targets=TARGETS.split("\n[targets.cpu-int8]")[0])
    assert cli.main(["build", "-c", str(cfg), "--cache", str(tmp_path / "afile")]) == 3
    err = capsys.readouterr().err
    assert "--cache" in err and "is not a directory" in err, err


@pytest.fixture
def registry_cache(oci: str) -> Iterator[str]:  # noqa: F811
    yield f"oci://{oci}/cache-{os.urandom(4).hex()}"


def test_an_oci_cache_second_fresh_project_pulls_all_and_a_poisoned_entry_is_refused(
        tmp_path: Path, registry_cache: str, monkeypatch: pytest.MonkeyPatch) -> None:
    first = build(project(tmp_path / "a"), "--cache", registry_cache)
    assert set(statuses(first).values()) == {"built"}
    second = build(project(tmp_path / "b"), "--cache", registry_cache)
    assert set(statuses(second).values()) == {"pulled"}, second
    assert files_of(tmp_path / "a" / "dist") == files_of(tmp_path / "b" / "dist")
    # poison: another key's artifact of the same job stored under our build key
    with monkeypatch.context() as mp:
        mp.setenv("ORTBUILD_SIGNING_KEY", base64.b64encode(os.urandom(32)).decode())
        theirs = build(project(tmp_path / "evil", targets=TARGETS.split("\n[targets.cpu-int8]")[0]), "--no-cache")
    key = json.loads((tmp_path / "a" / "dist" / "cpu" / "tiny_cnn" / "manifest.json").read_text())["build_key"]
    folder = Path(str(theirs[0]["artifact"])).parent
    from ortbuild.artifact import manifest

    m, _ = manifest.read(folder)
    c = cache.configured(tmp_path / "targets.toml", "", registry_cache, False)
    assert c is not None
    c.store(cache.entry_id(key, "cpu", "tiny_cnn"), folder, cache.entry_names(m),
            {"target": "cpu", "model": "tiny_cnn"}, {n: sha for n, sha, _, _ in m.signed_files()})
    third = build(project(tmp_path / "c"), "--cache", registry_cache)
    assert statuses(third) == {"cpu/tiny_cnn": "built", "cpu-int8/tiny_cnn": "pulled"}
    cpu = next(j for j in third if j["target"] == "cpu")
    warning = next(n for n in cpu["notes"] if "WARNING" in n)  # type: ignore[attr-defined]
    assert f"{registry_cache}:{cache.entry_id(key, 'cpu', 'tiny_cnn')}" in warning and "does not verify" in warning, \
        warning
    # the rebuild replaced the poisoned entry
    assert statuses(build(project(tmp_path / "d"), "--cache", registry_cache)) == {
        "cpu/tiny_cnn": "pulled", "cpu-int8/tiny_cnn": "pulled"}


def test_an_oci_entry_with_a_layer_its_manifest_does_not_sign_is_refused_before_that_layer_is_fetched(
        tmp_path: Path, registry_cache: str) -> None:
    """The manifest's layer is fetched first: a layer that is not a file it signs (here 8 MiB of junk pushed with
    the entry) is refused on its name and declared size, never downloaded, and the job builds."""
    from ortbuild.artifact import manifest

    one = TARGETS.split("\n[targets.cpu-int8]")[0]
    first = build(project(tmp_path / "a", targets=one), "--no-cache")
    folder = Path(str(first[0]["artifact"])).parent
    m, _ = manifest.read(folder)
    (folder / "big.bin").write_bytes(os.urandom(8 << 20))
    c = cache.configured(tmp_path / "targets.toml", "", registry_cache, False)
    assert c is not None
    entry = cache.entry_id(m.build_key, "cpu", "tiny_cnn")
    c.store(entry, folder, [*cache.entry_names(m), "big.bin"], {"target": "cpu", "model": "tiny_cnn"},
            {n: sha for n, sha, _, _ in m.signed_files()})
    dest = tmp_path / "fetched"
    dest.mkdir()
    with pytest.raises(Tampered, match=r"big\.bin is not a file its manifest signs"):
        c.fetch(entry, dest)
    assert not (dest / "big.bin").exists()
    again = build(project(tmp_path / "b", targets=one), "--cache", registry_cache)
    assert statuses(again) == {"cpu/tiny_cnn": "built"}


def test_an_unreachable_registry_is_a_warning_and_the_build_goes_on(tmp_path: Path) -> None:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    jobs = build(project(tmp_path / "a", targets=TARGETS.split("\n[targets.cpu-int8]")[0]), "--cache",
                 f"oci://127.0.0.1:{port}/cache")
    assert statuses(jobs) == {"cpu/tiny_cnn": "built"}
    notes = " ".join(jobs[0]["notes"])  # type: ignore[arg-type]
    assert "WARNING: cache" in notes and "cannot reach" in notes, notes


def test_jobs_with_the_same_inputs_under_other_names_have_their_own_entries(tmp_path: Path) -> None:
    """The build key names no target or model: two targets with equal settings (and one model under two names)
    have equal keys, but their entries are apart, so neither evicts the other."""
    twins = TARGETS.split("\n[targets.cpu-int8]")[0]
    twins += twins.replace("[targets.cpu]", "[targets.server]")
    store = tmp_path / "cache"

    def make(root: Path) -> Path:
        cfg = project(root, targets=twins)
        text = cfg.read_text()
        cfg.write_text(text.replace("[targets.cpu]", model_table("tiny_cnn").replace("[models.tiny_cnn]",
                                                                                     "[models.cnn_copy]")
                                    + "\n[targets.cpu]"))
        return cfg

    first = build(make(tmp_path / "a"), "--cache", str(store))
    assert len(first) == 4 and set(statuses(first).values()) == {"built"}
    assert len([p for p in store.iterdir() if not p.name.startswith(".")]) == 4
    second = build(make(tmp_path / "b"), "--cache", str(store))
    assert set(statuses(second).values()) == {"pulled"}, [j["notes"] for j in second]


@pytest.mark.parametrize(("files", "why"), [
    (["manifest.json", "manifest.sig", "model.onnx.enc", "model.onnx.enc/inner"], "as a file and as a directory"),
    (["manifest.json", 5], "not a list of names"),
    (["manifest.json", "../../escape"], "is not a file name of an artifact"),
    (["manifest.json", "manifest.json"], "listed twice"),
])
def test_an_entry_whose_file_list_cannot_be_an_artifacts_is_refused_and_rebuilt(tmp_path: Path, files: list[object],
                                                                                 why: str) -> None:
    one = TARGETS.split("\n[targets.cpu-int8]")[0]
    store = tmp_path / "cache"
    entry = _entry(store, build(project(tmp_path / "a", targets=one), "--cache", str(store)), "cpu")
    doc = json.loads((entry / cache.ENTRY).read_text())
    doc["files"] = files
    (entry / cache.ENTRY).write_text(json.dumps(doc))
    again = build(project(tmp_path / "b", targets=one), "--cache", str(store))
    assert statuses(again) == {"cpu/tiny_cnn": "built"}
    warning = next(n for n in again[0]["notes"] if "WARNING" in n)  # type: ignore[attr-defined]
    assert str(entry) in warning and why in warning, warning


def test_a_symlink_inside_a_directory_entry_is_refused(tmp_path: Path) -> None:
    one = TARGETS.split("\n[targets.cpu-int8]")[0]
    store = tmp_path / "cache"
    entry = _entry(store, build(project(tmp_path / "a", targets=one), "--cache", str(store)), "cpu")
    shutil.move(entry / "loader", tmp_path / "elsewhere")
    (entry / "loader").symlink_to(tmp_path / "elsewhere")
    again = build(project(tmp_path / "b", targets=one), "--cache", str(store))
    assert statuses(again) == {"cpu/tiny_cnn": "built"}
    assert any("is not a plain file of the entry" in n for n in again[0]["notes"])  # type: ignore[attr-defined]


def test_a_sparse_file_in_a_directory_entry_is_refused_before_it_is_copied(tmp_path: Path,
                                                                          capsys: pytest.CaptureFixture[str]) -> None:
    """A file of 3 GiB that takes a few KiB on disk (no build writes one) is refused on its stat, before any of it
    is copied into dist/, and the job builds. The second build runs under a 256 MiB file size limit
    (RLIMIT_FSIZE): copying the sparse file would fail with EFBIG, so its 3 GiB never land in dist/."""
    import resource
    import signal

    one = TARGETS.split("\n[targets.cpu-int8]")[0]
    store = tmp_path / "cache"
    entry = _entry(store, build(project(tmp_path / "a", targets=one), "--cache", str(store)), "cpu")
    blob = entry / "model.onnx.enc"
    real = blob.stat().st_size
    blob.unlink()
    with open(blob, "wb") as f:
        f.write(b"ORTBUILD")
        f.truncate(3 << 30)
    if blob.stat().st_blocks * 512 > 1 << 20:
        pytest.skip(f"{tmp_path} keeps no sparse files")
    soft, hard = resource.getrlimit(resource.RLIMIT_FSIZE)
    xfsz = signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # a write past the limit: EFBIG, not a killed process
    resource.setrlimit(resource.RLIMIT_FSIZE, (256 << 20, hard))
    try:
        again = build(project(tmp_path / "b", targets=one), "--cache", str(store))
    finally:
        resource.setrlimit(resource.RLIMIT_FSIZE, (soft, hard))
        signal.signal(signal.SIGXFSZ, xfsz)
    assert statuses(again) == {"cpu/tiny_cnn": "built"}
    warning = next(n for n in again[0]["notes"] if "WARNING" in n)  # type: ignore[attr-defined]
    assert str(entry) in warning and "refused" in warning and "model.onnx.enc is a sparse file" in warning and \
        "which no build writes" in warning and "the build replaces it" in warning, warning
    dist = tmp_path / "b" / "dist"
    assert (dist / "cpu" / "tiny_cnn" / "model.onnx.enc").stat().st_size == real
    assert max(p.stat().st_size for p in dist.rglob("*") if p.is_file()) < 64 << 20
    assert not list(dist.glob(".cache.*"))
    capsys.readouterr()
    assert cli.main(["inspect", str(dist / "cpu" / "tiny_cnn")]) == 0, capsys.readouterr()
    assert (entry / "model.onnx.enc").stat().st_size == real  # the build replaced the entry


def test_a_manifest_nested_too_deep_for_json_in_a_directory_entry_is_refused_not_a_crash(tmp_path: Path) -> None:
    """A poisoned entry whose manifest.json is arrays nested 100,000 deep (json's RecursionError, not a ValueError):
    refused with a warning like any other poisoned entry, and the job builds."""
    one = TARGETS.split("\n[targets.cpu-int8]")[0]
    store = tmp_path / "cache"
    entry = _entry(store, build(project(tmp_path / "a", targets=one), "--cache", str(store)), "cpu")
    (entry / "manifest.json").write_text("[" * 100_000 + "]" * 100_000)
    again = build(project(tmp_path / "b", targets=one), "--cache", str(store))
    assert statuses(again) == {"cpu/tiny_cnn": "built"}
    warning = next(n for n in again[0]["notes"] if "WARNING" in n)  # type: ignore[attr-defined]
    assert str(entry) in warning and "the build replaces it" in warning, warning


@pytest.mark.parametrize("poison", ["fifo-entry-json", "sparse-entry-json", "unsigned-extra-file", "no-manifest"])
def test_a_poisoned_entry_in_a_shared_directory_never_hangs_nor_fills_the_build(tmp_path: Path, poison: str) -> None:
    """A planted entry.json that is a FIFO (opening it would block forever) or sparse (3 GiB read into memory), a
    file the manifest does not sign (copied before anything was verified), an entry.json listing no manifest: each
    refused before a byte of the entry is copied, and the job builds. In a subprocess with a time limit: a hang fails
    the test instead of hanging it."""
    one = TARGETS.split("\n[targets.cpu-int8]")[0]
    store = tmp_path / "cache"
    entry = _entry(store, build(project(tmp_path / "a", targets=one), "--cache", str(store)), "cpu")
    info = json.loads((entry / cache.ENTRY).read_text())
    if poison == "fifo-entry-json":
        (entry / cache.ENTRY).unlink()
        os.mkfifo(entry / cache.ENTRY)
    elif poison == "sparse-entry-json":
        with open(entry / cache.ENTRY, "r+b") as f:
            f.truncate(3 << 30)
    elif poison == "unsigned-extra-file":
        (entry / "big.bin").write_bytes(os.urandom(2 << 20))
        (entry / cache.ENTRY).write_text(json.dumps({**info, "files": [*info["files"], "big.bin"]}))
    else:
        (entry / cache.ENTRY).write_text(json.dumps({**info, "files": [n for n in info["files"]
                                                                      if n != "manifest.json"]}))
    config = project(tmp_path / "b", targets=one)
    proc = run_cli("build", "-c", str(config), "--cache", str(store), "--json")
    assert proc.returncode == 0, proc.stderr
    jobs = json.loads(proc.stdout)["jobs"]
    assert statuses(jobs) == {"cpu/tiny_cnn": "built"}
    warning = next(n for n in jobs[0]["notes"] if "WARNING" in n)
    assert str(entry) in warning and "refused" in warning, warning
    assert not (tmp_path / "b" / "dist" / "cpu" / "tiny_cnn" / "big.bin").exists()


def test_a_registry_answering_errors_is_asked_once_and_the_build_goes_on(tmp_path: Path) -> None:
    """A registry that answers 500 (ORAS would retry each request for minutes): one warning, the cache is off for
    the rest of the build, every job built, fast."""
    import http.server
    import threading
    import time

    asked: list[str] = []

    class Broken(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            asked.append(self.path)
            self.send_response(200 if self.path == "/v2/" else 500)
            self.send_header("Content-Length", "0")
            self.end_headers()

        do_HEAD = do_POST = do_PUT = do_GET

        def log_message(self, *args: object) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Broken)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        t = time.perf_counter()
        jobs = build(project(tmp_path / "a"), "--cache", f"oci://127.0.0.1:{server.server_port}/cache", "-j", "1")
        took = time.perf_counter() - t
    finally:
        server.shutdown()
    assert set(statuses(jobs).values()) == {"built"}
    warnings = [n for j in jobs for n in j["notes"] if "WARNING" in n]  # type: ignore[attr-defined]
    assert len(warnings) == 1 and "answered 500" in warnings[0] and "not used for the rest" in warnings[0], warnings
    assert len([p for p in asked if p != "/v2/"]) == 1 and took < 60, (asked, took)


def test_development_keys_with_a_shared_cache_are_a_warning_said_once(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                                      capsys: pytest.CaptureFixture[str]) -> None:
    """Development keys are made per checkout, and the signing key's id is part of every build key: a shared cache
    never hits across checkouts with them. The build says so once, naming the cache and what to do; with real keys,
    or without a cache, it says nothing of it."""
    from ortbuild.artifact import keygen, keys

    store = tmp_path / "cache"
    config = project(tmp_path / "a", targets=TARGETS.split("[targets.cpu-int8]")[0])
    dev = tmp_path / "dev-keys"
    keygen.keygen(dev, development=True)
    build(config, "--cache", str(store))  # the test keys (real ones)
    assert "development keys" not in capsys.readouterr().err
    for name in ("ORTBUILD_KEY", "ORTBUILD_SIGNING_KEY"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("ORTBUILD_KEY_FILE", str(dev / keys.ENCRYPTION_FILE))
    monkeypatch.setenv("ORTBUILD_SIGNING_KEY_FILE", str(dev / keys.SIGNING_FILE))
    config = project(tmp_path / "b", targets=TARGETS.split("[targets.cpu-int8]")[0])  # another checkout
    assert set(statuses(build(config, "--cache", str(store))).values()) == {"built"}  # no hit: another key
    err = capsys.readouterr().err
    assert err.count("development keys") == 1, err
    assert (f"WARNING: the shared cache {store} (--cache) is used with this checkout's development keys" in err
            and "never hit in another checkout" in err and "`ortbuild keygen --out keys`" in err
            and "ORTBUILD_KEY_FILE" in err), err
    build(config)  # no cache: nothing to say
    assert "development keys" not in capsys.readouterr().err
