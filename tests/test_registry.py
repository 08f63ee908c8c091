"""Releases through a real OCI registry: Debian's docker-registry (distribution) on loopback, started here."""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

from ortbuild import oci_ref
from ortbuild.errors import OrtbuildError
from ortbuild.publish import registry
from tests.test_epochs import Releases, releases  # noqa: F401  (a module fixture)
from tests.test_release import cli, public_key_file, released, tested  # noqa: F401  (module fixtures)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture(scope="module")
def oci(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """A docker-registry serving on a free loopback port, with its storage in a temp dir; its host:port."""
    binary = shutil.which("docker-registry")
    if binary is None:
        if os.environ.get("ORTBUILD_REQUIRE_RELEASE_TOOLS"):
            pytest.fail("docker-registry is not installed (apt install docker-registry)")
        pytest.skip("Debian's docker-registry is not installed")
    root = tmp_path_factory.mktemp("registry")
    port = _free_port()
    (root / "config.yml").write_text(f"""version: 0.1
log: {{level: error, accesslog: {{disabled: true}}}}
storage: {{filesystem: {{rootdirectory: {root / 'data'}}}, delete: {{enabled: true}}}}
http: {{addr: "127.0.0.1:{port}"}}
""")
    proc = subprocess.Popen([binary, "serve", str(root / "config.yml")], stdout=subprocess.DEVNULL,
                            stderr=subprocess.PIPE)
    try:
        for _ in range(100):
            try:
                urllib.request.urlopen(f"http://127.0.0.1:{port}/v2/", timeout=1).close()
                break
            except OSError:
                if proc.poll() is not None:
                    pytest.fail(f"docker-registry exited: {proc.stderr.read().decode()[:500]}")  # type: ignore[union-attr]
                time.sleep(0.1)
        yield f"127.0.0.1:{port}"
    finally:
        proc.terminate()
        proc.wait(10)


def test_push_pull_verify_through_a_real_registry(oci: str, tested: Path, tmp_path: Path) -> None:  # noqa: F811
    pub = str(public_key_file(tmp_path))
    proc = cli("release", "-t", "cpu", "--to", f"oci://{oci}/models/rel", cwd=tested)
    assert proc.returncode == 0, proc.stderr
    ref = f"oci://{oci}/models/rel:1.0-cpu"
    assert f"pushed {ref} (sha256:" in proc.stdout
    with urllib.request.urlopen(urllib.request.Request(
            f"http://{oci}/v2/models/rel/manifests/1.0-cpu",
            headers={"Accept": "application/vnd.oci.image.manifest.v1+json"})) as r:
        man = json.loads(r.read())
    assert man["config"]["mediaType"] == "application/vnd.cncf.model.config.v1+json"  # ModelPack: the default
    assert man["annotations"]["dev.ortbuild.target"] == "cpu"
    assert sorted(layer["annotations"]["org.opencontainers.image.title"] for layer in man["layers"]) == [
        "SHA256SUMS", "SHA256SUMS.minisig", "model.sig", "rel-1.0-cpu.intoto.jsonl", "rel-1.0-cpu.release.json",
        "rel-1.0-cpu.tar"]

    v = cli("verify", ref, "--public-key", pub, cwd=tmp_path)
    assert v.returncode == 0, v.stderr
    assert "golden       tiny_cnn: PASS" in v.stdout
    dest = tmp_path / "deploy"
    p = cli("pull", ref, "--public-key", pub, "--to", str(dest), cwd=tmp_path)
    assert p.returncode == 0, p.stderr
    assert (dest / "release.json").is_file() and (dest / "tiny_cnn" / "model.onnx.enc").is_file()
    # each model's Python loader, as its manifest names it: the module to import and the directory to put on sys.path
    assert f"tiny_cnn: `import ortbuild_tiny_cnn` with {dest / 'tiny_cnn' / 'loader'} on sys.path" in p.stdout, p.stdout
    assert (dest / "tiny_cnn" / "loader" / "ortbuild_tiny_cnn.py").is_file()
    assert not list(dest.rglob("*.onnx"))  # encrypted at rest after a pull too
    again = cli("pull", ref, "--public-key", pub, "--to", str(dest), "--no-run", cwd=tmp_path)
    assert again.returncode == 0, again.stderr  # a deploy step pulls into the same place again
    # a directory pull did not make is never replaced, even one that holds a release.json
    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "release.json").write_text("{}")
    (mine / "important.txt").write_text("keep me")
    refused = cli("pull", ref, "--public-key", pub, "--to", str(mine), "--no-run", cwd=tmp_path)
    assert refused.returncode == 2 and "not a release `ortbuild pull` made" in refused.stderr, refused.stderr
    assert (mine / "important.txt").read_text() == "keep me"
    link = tmp_path / "link"
    link.symlink_to(dest)
    refused = cli("pull", ref, "--public-key", pub, "--to", str(link), "--no-run", cwd=tmp_path)
    assert refused.returncode == 2 and "symlink" in refused.stderr, refused.stderr


def test_a_tampered_artifact_in_the_registry_is_refused(oci: str, released: Path, tmp_path: Path) -> None:  # noqa: F811
    """Someone with push rights replaces the bundle layer: pull and verify fail, naming the bundle."""
    from ortbuild.publish import release

    evil = tmp_path / "evil"
    shutil.copytree(released, evil)
    bundle = evil / "rel-1.0-cpu.tar"
    data = bytearray(bundle.read_bytes())
    data[len(data) // 2] ^= 0xFF
    bundle.write_bytes(bytes(data))
    files = {"bundle": bundle, "index": evil / "rel-1.0-cpu.release.json",
             "provenance": evil / "rel-1.0-cpu.intoto.jsonl", "sums": evil / "SHA256SUMS",
             "signature": evil / "SHA256SUMS.minisig"}

    index = json.loads(files["index"].read_text())
    ref = oci_ref.parse(f"oci://{oci}/models/rel:evil")
    registry.push(ref, release.Published("cpu", evil, files, [], index))
    proc = cli("pull", str(ref), "--public-key", str(public_key_file(tmp_path)), "--to", str(tmp_path / "d"),
               cwd=tmp_path)
    assert proc.returncode == 7 and "rel-1.0-cpu.tar" in proc.stderr, proc.stderr
    assert not (tmp_path / "d").exists()


def test_registry_errors_are_clear(oci: str, tmp_path: Path) -> None:
    proc = cli("verify", f"oci://{oci}/models/none:1", "--public-key", str(public_key_file(tmp_path)), cwd=tmp_path)
    assert proc.returncode == 11 and f"oci://{oci}/models/none:1" in proc.stderr and "Traceback" not in proc.stderr
    with pytest.raises(OrtbuildError, match="not an OCI reference"):
        oci_ref.parse("oci://UPPER/Case:tag")
    closed = _free_port()
    proc = cli("pull", f"oci://127.0.0.1:{closed}/x:y", "--public-key", str(public_key_file(tmp_path)), cwd=tmp_path)
    assert proc.returncode == 11 and "registry running" in proc.stderr


def _push(oci: str, folder: Path, tag: str) -> str:
    """Push the local release in `folder` (release -t cpu --to ...) under `tag`; its reference."""
    from ortbuild.publish import release

    index_file = next(folder.glob(f"*.{release.INDEX}"))
    name = index_file.name.removesuffix(f".{release.INDEX}")
    files = {"bundle": folder / f"{name}.tar", "index": index_file, "provenance": folder / f"{name}.intoto.jsonl",
             "sums": folder / release.SUMS, "signature": folder / release.SUMS_SIG}
    ref = oci_ref.parse(f"oci://{oci}/models/epochs:{tag}")
    registry.push(ref, release.Published("cpu", folder, files, [], json.loads(index_file.read_text())))
    return str(ref)


def test_pull_refuses_an_older_release_over_a_newer_one_and_below_min_epoch(oci: str, releases: Releases,  # noqa: F811
                                                                           tmp_path: Path) -> None:
    """The red team's case: `pull --to` replaced a deployed epoch-1 release with a validly signed epoch-0 one."""
    pub = str(public_key_file(tmp_path))
    old, new = _push(oci, releases.old, "old"), _push(oci, releases.new, "new")
    dest = tmp_path / "deploy"
    proc = cli("pull", new, "--public-key", pub, "--to", str(dest), "--no-run", cwd=tmp_path)
    assert proc.returncode == 0 and "epoch        1 (" in proc.stdout, proc.stderr
    before = (dest / "tiny_cnn" / "manifest.json").read_bytes()
    proc = cli("pull", old, "--public-key", pub, "--to", str(dest), "--no-run", cwd=tmp_path)
    assert proc.returncode == 7, proc.stdout + proc.stderr
    assert "below epoch 1 of the release already deployed in" in proc.stderr and "--allow-downgrade" in proc.stderr
    assert (dest / "tiny_cnn" / "manifest.json").read_bytes() == before
    proc = cli("pull", old, "--public-key", pub, "--to", str(dest), "--no-run", "--allow-downgrade", cwd=tmp_path)
    assert proc.returncode == 0 and "WARNING: replaced rel-1.0-cpu (epoch 1)" in proc.stdout, proc.stderr
    assert json.loads((dest / "tiny_cnn" / "manifest.json").read_text())["epoch"] == 0
    proc = cli("pull", old, "--public-key", pub, "--to", str(tmp_path / "other"), "--no-run", "--min-epoch", "1",
               cwd=tmp_path)
    assert proc.returncode == 7 and "below --min-epoch 1" in proc.stderr, proc.stderr
    assert not (tmp_path / "other").exists()
    proc = cli("verify", old, "--public-key", pub, "--no-run", "--min-epoch", "1", cwd=tmp_path)
    assert proc.returncode == 7 and "below --min-epoch 1" in proc.stderr, proc.stderr
