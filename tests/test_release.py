"""`ortbuild release` and `ortbuild verify`: refusal, signatures, tampering, malicious bundles, reproducibility."""

from __future__ import annotations

import base64
import gzip
import io
import json
import os
import shutil
import subprocess
import tarfile
import textwrap
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from cryptography.hazmat.primitives.asymmetric.ec import EllipticCurvePublicKey
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from ortbuild.artifact import keys, manifest_types, minisign
from ortbuild.artifact.keys import SigningKey
from ortbuild.errors import ArtifactError, GateFailed, OrtbuildError
from ortbuild.publish import provenance, release, tarball, verify
from tests.conftest import MODELS, TEST_SIGNING_SEED, here_runtime, run_cli, shared

EPOCH = "1767225600"  # 2026-01-01
PROJECT = """\
[project]
name = "rel"
version = "1.0"

[models.tiny_cnn]
path = "models/tiny_cnn.onnx"
inputs = "models/tiny_cnn.inputs.npz"

[models.breast_cancer_gb]
path = "models/breast_cancer_gb.onnx"
inputs = "models/breast_cancer_gb.inputs.npz"

[targets.cpu]
runtime = "RUNTIME"
providers = ["CPUExecutionProvider"]
session = { intra_op_num_threads = 1 }
latency = { p90_ms = 1000, min_seconds = 0.2 }

[targets.cpu-strict]
description = "fp16 judged bit-exact: its accuracy gate fails"
extends = "cpu"
precision = "fp16"
models = ["tiny_cnn"]
accuracy = { rtol = 0.0, atol = 0.0, cosine = 1.0 }
"""
SIGNER = SigningKey(Ed25519PrivateKey.from_private_bytes(TEST_SIGNING_SEED), "tests")


def make_project(root: Path) -> Path:
    (root / "models").mkdir(parents=True)
    for m in ("tiny_cnn", "breast_cancer_gb"):
        for suffix in (".onnx", ".inputs.npz"):
            shutil.copy(MODELS / f"{m}{suffix}", root / "models" / f"{m}{suffix}")
    (root / "targets.toml").write_text(PROJECT.replace("RUNTIME", here_runtime()))
    return root / "targets.toml"


def cli(*args: str, cwd: Path, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return run_cli(*args, cwd=cwd, env={**os.environ, "SOURCE_DATE_EPOCH": EPOCH, **(env or {})})


def _tested(root: Path) -> None:
    make_project(root)
    proc = cli("test", "-j", "1", cwd=root)
    assert proc.returncode == 9, proc.stdout + proc.stderr  # cpu-strict fails, by design


@pytest.fixture(scope="module")
def tested(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A project whose two targets were built and tested: cpu passes, cpu-strict fails its accuracy gate (built
    once per run, a copy per module: test_modelpack, test_openssf and test_registry use it too)."""
    return shared(tmp_path_factory, "release-tested", _tested)


@pytest.fixture(scope="module")
def released(tested: Path) -> Path:
    proc = cli("release", "-t", "cpu", cwd=tested)
    assert proc.returncode == 0, proc.stderr
    return tested / "dist" / "release" / "cpu"


def public_key_file(tmp: Path) -> Path:
    path = tmp / "signing.pub"
    path.write_text(minisign.public_key_text(SIGNER.public_raw, "test key"))
    return path


def test_release_writes_the_six_files_and_verify_runs_the_golden_test(released: Path, tmp_path: Path) -> None:
    assert sorted(p.name for p in released.iterdir()) == [
        "SHA256SUMS", "SHA256SUMS.minisig", "model.sig", "rel-1.0-cpu.intoto.jsonl", "rel-1.0-cpu.release.json",
        "rel-1.0-cpu.tar"]  # model.sig: tests/test_openssf.py
    proc = cli("verify", str(released), "--public-key", str(public_key_file(tmp_path)), "--json", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    doc = json.loads(proc.stdout)
    golden = [c for c in doc["checks"] if c.startswith("golden")]
    assert len(golden) == 2 and all(": PASS (" in c for c in golden), golden
    assert doc["tests"]["tiny_cnn"]["status"] == "PASS"


def test_the_bundle_holds_artifacts_manifests_loaders_golden_data_and_verdicts(released: Path) -> None:
    index = json.loads((released / "rel-1.0-cpu.release.json").read_text())
    names = set(index["files"])
    for model in ("tiny_cnn", "breast_cancer_gb"):
        for f in ("manifest.json", "manifest.sig", "model.onnx.enc", f"loader/ortbuild_{model}.py",
                  "loader/ortbuild_loader.mjs", "golden/golden.json", "golden/test_data_set_0/input_0.pb",
                  "golden/test_data_set_0/output_0.pb"):
            assert f"rel-1.0-cpu/{model}/{f}" in names
    assert not any(n.endswith((".onnx", "test-report.json")) for n in names)  # no plaintext model, no timings
    assert index["tests"]["tiny_cnn"]["accuracy"] == "PASS"
    assert index["tests"]["tiny_cnn"]["rules"]["logits"]["rtol"] == pytest.approx(1e-4)
    with tarfile.open(released / "rel-1.0-cpu.tar", "r:") as tar:  # stored, not compressed
        first = tar.next()
        assert first is not None and first.name == "rel-1.0-cpu/release.json"
        assert tar.extractfile(first).read() == (released / "rel-1.0-cpu.release.json").read_bytes()  # type: ignore[union-attr]


def test_the_provenance_is_slsa_v1_with_materials_builder_and_verdicts(released: Path) -> None:
    env = json.loads((released / "rel-1.0-cpu.intoto.jsonl").read_text())
    assert env["payloadType"] == "application/vnd.in-toto+json"
    st = json.loads(base64.b64decode(env["payload"]))
    assert st["_type"] == "https://in-toto.io/Statement/v1"
    assert st["predicateType"] == "https://slsa.dev/provenance/v1"
    sums = {n: d for d, n in (line.split("  ") for line in (released / "SHA256SUMS").read_text().splitlines())}
    assert {s["name"]: s["digest"]["sha256"] for s in st["subject"]} == \
        {n: sums[n] for n in ("rel-1.0-cpu.tar", "rel-1.0-cpu.release.json")}
    pred = st["predicate"]
    deps = {d["name"]: d for d in pred["buildDefinition"]["resolvedDependencies"]}
    assert {"targets.toml", "models/tiny_cnn.onnx", "models/tiny_cnn.inputs.npz"} <= set(deps)
    assert deps["models/tiny_cnn.onnx"]["annotations"]["role"] == "source model"
    assert pred["buildDefinition"]["externalParameters"]["force"] is False
    assert set(pred["runDetails"]["builder"]["version"]) >= {"ortbuild", "onnxruntime", "onnx"}
    reports = {b["name"]: b["annotations"] for b in pred["runDetails"]["byproducts"]}
    assert reports["test-report/tiny_cnn"]["status"] == "PASS" and "p90_ms" in reports["test-report/tiny_cnn"]


def test_debian_minisign_verifies_the_signature(released: Path, tmp_path: Path) -> None:
    if shutil.which("minisign") is None:
        if os.environ.get("ORTBUILD_REQUIRE_RELEASE_TOOLS"):
            pytest.fail("minisign is not installed (apt install minisign)")
        pytest.skip("Debian's minisign is not installed")
    pub = public_key_file(tmp_path)
    ok = subprocess.run(["minisign", "-Vm", str(released / "SHA256SUMS"), "-p", str(pub)], capture_output=True,
                        text=True)
    assert ok.returncode == 0 and "Signature and comment signature verified" in ok.stdout + ok.stderr
    bad = tmp_path / "SHA256SUMS"
    bad.write_bytes((released / "SHA256SUMS").read_bytes().replace(b"rel-1.0", b"rel-1.1"))
    shutil.copy(released / "SHA256SUMS.minisig", tmp_path / "SHA256SUMS.minisig")
    assert subprocess.run(["minisign", "-Vm", str(bad), "-p", str(pub)], capture_output=True).returncode != 0


def test_a_target_whose_tests_failed_is_refused_unless_forced(tested: Path, tmp_path: Path) -> None:
    proc = cli("release", "-t", "cpu-strict", "--to", str(tmp_path / "out"), cwd=tested)
    assert proc.returncode == 9
    assert "cpu-strict/tiny_cnn: its tests did not pass (FAIL" in proc.stderr and "--force" in proc.stderr
    assert not (tmp_path / "out" / "cpu-strict").exists()
    forced = cli("release", "-t", "cpu-strict", "--to", str(tmp_path / "out"), "--force", cwd=tested)
    assert forced.returncode == 0, forced.stderr
    out = tmp_path / "out" / "cpu-strict"
    index = json.loads((out / "rel-1.0-cpu-strict.release.json").read_text())
    assert index["forced"] and index["tests"]["tiny_cnn"]["status"] == "FAIL"
    v = cli("verify", str(out), "--public-key", str(public_key_file(tmp_path)), "--no-run", cwd=tmp_path)
    assert v.returncode == 0 and "WARNING: released with --force although cpu-strict/tiny_cnn" in v.stdout


def test_untested_and_stale_tests_are_refused(tested: Path, tmp_path: Path) -> None:
    report = tested / "dist" / "cpu" / "tiny_cnn" / "test-report.json"
    sig = report.with_name("test-report.sig")
    saved, saved_sig = report.read_bytes(), sig.read_bytes()
    try:
        report.unlink()
        proc = cli("release", "-t", "cpu", "--to", str(tmp_path), cwd=tested)
        assert proc.returncode == 9 and "never tested" in proc.stderr
        doc = json.loads(saved)
        doc["result"]["artifact_sha256"] = "0" * 64  # the verdict of another artifact
        report.write_text(json.dumps(doc))
        proc = cli("release", "-t", "cpu", "--to", str(tmp_path), cwd=tested)
        assert proc.returncode == 7 and "TAMPERED" in proc.stderr  # an edited report: its signature fails
        sk = keys.signing_key()  # a genuine (signed) report of an earlier build of the artifact
        assert sk is not None
        sig.write_bytes(base64.b64encode(sk.sign(report.read_bytes())) + b"\n")
        proc = cli("release", "-t", "cpu", "--to", str(tmp_path), cwd=tested)
        assert proc.returncode == 9 and "older than its artifact" in proc.stderr
    finally:
        report.write_bytes(saved)
        sig.write_bytes(saved_sig)


def _eval_project(tmp_path: Path, target_cpu: str, metric: str = "accuracy") -> Path:
    """targets.toml of tiny_cnn with a labelled evaluation set and a target `cpu`, `target_cpu` its further keys
    and tables."""
    np.save(tmp_path / "labels.npy", np.arange(4))
    path = tmp_path / "targets.toml"
    data = MODELS / "tiny_cnn.inputs.npz"
    path.write_text(textwrap.dedent(f"""
        [project]
        name = "rel"
        version = "1.0"
        [models.tiny_cnn]
        path = "{MODELS / 'tiny_cnn.onnx'}"
        inputs = "{data}"
        eval = {{ inputs = "{data}", labels = "labels.npy", metric = "{metric}" }}
        [targets.cpu]
        runtime = "{here_runtime()}"
        providers = ["CPUExecutionProvider"]
    """) + textwrap.dedent(target_cpu))
    return path


def test_a_budget_set_after_the_test_refuses_the_release_until_it_is_judged(tmp_path: Path) -> None:
    from ortbuild.gating.record import TestResult
    from ortbuild.gating.reports import selection
    from ortbuild.project import config
    from ortbuild.status import Verdict

    project = config.load(_eval_project(tmp_path, """
        latency = { p90_ms = 1000 }
        [targets.loaded]
        extends = "cpu"
        eval = { max_drop = 0.01 }
        [targets.loaded.latency.server]
        qps = 5
        p99_ms = 100
    """))
    # a PASS of every gate the target declared when it was tested; then eval and server budgets were set
    tested_before = TestResult("loaded", "tiny_cnn", "fp32", accuracy=Verdict.PASS, size_verdict=Verdict.PASS,
                               latency_verdict=Verdict.PASS)
    gates = project.targets["loaded"].settings["tiny_cnn"].gates
    assert selection.unjudged(tested_before, gates) == ["eval", "server"]
    assert selection.unjudged(tested_before, project.targets["cpu"].settings["tiny_cnn"].gates) == []
    tested_before.set_verdict("eval", Verdict.PASS)
    tested_before.set_verdict("server", Verdict.PASS)
    assert selection.unjudged(tested_before, gates) == []


def test_a_budget_changed_after_the_test_refuses_the_release(tmp_path: Path) -> None:
    """Budgets never rebuild: the record keeps what it judged by (gates_key), and a budget, rule or evaluation set
    changed since is refused, each kind of change seen."""
    from ortbuild.gating.record import TestResult
    from ortbuild.gating.runner import gates_key
    from ortbuild.project import config

    def key(extra: str, metric: str = "accuracy") -> str:
        project = config.load(_eval_project(tmp_path, f"""
            eval = {{ max_drop = 0.05 }}
            [targets.cpu.latency]
            p90_ms = 50
            {extra}
        """, metric))
        return gates_key(project.targets["cpu"].settings["tiny_cnn"].gates, project.models["tiny_cnn"].eval)

    tested = key("server = { qps = 50, p99_ms = 40 }")
    assert key("server = { qps = 50, p99_ms = 40 }") == tested  # the same configuration: the same key
    changed = [key("server = { qps = 5000, p99_ms = 40 }"), key("server = { qps = 50, p99_ms = 40, p90_ms = 1 }"),
               key("server = { qps = 50, p99_ms = 40 }", metric="f1"), key("p99_ms = 80\nserver = { qps = 50, "
                                                                           "p99_ms = 40 }")]
    assert tested not in changed and len(set(changed)) == len(changed)
    record = TestResult("cpu", "tiny_cnn", "fp32", gates_key=tested)  # a PASS of every gate, judged by `tested`
    said = release._test_problem(tmp_path, None, record, "cpu", None, changed[0])  # type: ignore[arg-type]
    assert said is not None and "changed since its last test" in said and "ortbuild test -t cpu" in said


def _check(folder: Path, public: bytes | EllipticCurvePublicKey = SIGNER.public_raw) -> None:
    verify.verify(folder, public, run=False)


@pytest.mark.parametrize("key", ["signing.pub", "model-signing.pub"])
@pytest.mark.slow
def test_flipping_any_byte_of_any_published_file_fails_naming_the_file(released: Path, tmp_path: Path,
                                                                       key: str) -> None:
    """With signing.pub, every file SHA256SUMS.minisig covers (model.sig is checked with model-signing.pub:
    tests/test_openssf.py); with model-signing.pub, all six."""
    copy = tmp_path / "r"
    shutil.copytree(released, copy)
    public = SIGNER.public_raw if key == "signing.pub" else SIGNER.model_signing_key.public_key()
    _check(copy, public)
    for f in sorted(copy.iterdir()):
        if f.name == "model.sig" and key == "signing.pub":
            continue
        original = f.read_bytes()
        positions = range(len(original)) if f.stat().st_size < 40000 else \
            sorted({0, 3, 4, 9, 10, *range(11, len(original), len(original) // 40), len(original) - 1})
        for pos in positions:
            data = bytearray(original)
            data[pos] ^= 0x01
            f.write_bytes(bytes(data))
            with pytest.raises(OrtbuildError) as err:
                _check(copy, public)
                pytest.fail(f"{f.name}: flipping byte {pos} went unnoticed")
            assert f.name in err.value.message, (f.name, pos, err.value.message)
        f.write_bytes(original)
    _check(copy, public)


def _resign(folder: Path, bundle: bytes, name: str = "rel-1.0-cpu.tar") -> None:
    """What a publisher with the key (or a bug) could ship: a validly signed release around `bundle`."""
    for old in folder.glob("rel-1.0-cpu.tar*"):
        old.unlink()
    b = folder / name
    b.write_bytes(bundle)
    prov = folder / "rel-1.0-cpu.intoto.jsonl"
    st = json.loads(base64.b64decode(json.loads(prov.read_text())["payload"]))
    for s in st["subject"]:
        if s["name"].startswith("rel-1.0-cpu.tar"):
            s["name"], s["digest"]["sha256"] = name, tarball.sha256(bundle)
    prov.write_bytes(provenance.envelope(st, SIGNER))
    sums = release.sums_text({p.name: tarball.sha256(p.read_bytes()) for p in
                              (b, prov, folder / "rel-1.0-cpu.release.json")})
    (folder / "SHA256SUMS").write_bytes(sums)
    (folder / "SHA256SUMS.minisig").write_text(minisign.sign(
        sums, SIGNER.sign, SIGNER.public_raw, trusted_comment="t",
        untrusted_comment=release.untrusted_comment(SIGNER.public_raw)))


def _repack(released: Path, extra: list[tuple[tarfile.TarInfo, bytes | None]], *, edit: str | None = None,
            compress: bool = False) -> bytes:
    buf = io.BytesIO()
    with tarfile.open(released / "rel-1.0-cpu.tar") as src, tarfile.open(fileobj=buf, mode="w") as dst:
        for m in src.getmembers():
            data = src.extractfile(m).read()  # type: ignore[union-attr]
            if m.name == edit:
                data = data[:-1] + bytes([data[-1] ^ 1])
            dst.addfile(m, io.BytesIO(data))
        for info, content in extra:
            dst.addfile(info, io.BytesIO(content) if content is not None else None)
    return gzip.compress(buf.getvalue()) if compress else buf.getvalue()


def _entry(name: str, kind: bytes, **kw: Any) -> tarfile.TarInfo:
    info = tarfile.TarInfo(name)
    info.type = kind
    for k, v in kw.items():
        setattr(info, k, v)
    return info


MALICIOUS = {
    "traversal": ([(_entry("rel-1.0-cpu/../../evil.py", tarfile.REGTYPE, size=1), b"x")], "'..'"),
    "symlink": ([(_entry("rel-1.0-cpu/tiny_cnn/link", tarfile.SYMTYPE, linkname="/etc/passwd"), None)],
                "symbolic link"),
    "device": ([(_entry("rel-1.0-cpu/tiny_cnn/dev", tarfile.CHRTYPE, devmajor=1, devminor=5), None)],
               "character device"),
    "bomb": ([(_entry("rel-1.0-cpu/zzz", tarfile.REGTYPE, size=1, pax_headers={"c": "0" * (48 << 20)}), b"x")],
             "decompression bomb"),
}


@pytest.mark.parametrize("bundle", ["rel-1.0-cpu.tar", "rel-1.0-cpu.tar.gz"])
@pytest.mark.parametrize("case", list(MALICIOUS))
def test_a_validly_signed_malicious_bundle_is_refused(released: Path, tmp_path: Path, case: str, bundle: str) -> None:
    extra, words = MALICIOUS[case]
    folder = tmp_path / "r"
    shutil.copytree(released, folder)
    _resign(folder, _repack(released, extra, compress=bundle.endswith(".gz")), bundle)  # type: ignore[arg-type]
    proc = cli("verify", str(folder), "--public-key", str(public_key_file(tmp_path)), cwd=tmp_path)
    assert proc.returncode == 7, proc.stdout + proc.stderr
    assert words in proc.stderr and f"{bundle}:" in proc.stderr
    assert "Traceback" not in proc.stderr
    assert not (tmp_path / "evil.py").exists()


def test_a_gzip_bundle_of_the_earlier_format_still_verifies(released: Path, tmp_path: Path) -> None:
    folder = tmp_path / "r"
    shutil.copytree(released, folder)
    _resign(folder, _repack(released, [], compress=True), "rel-1.0-cpu.tar.gz")
    v = verify.verify(folder, SIGNER.public_raw, run=False)
    assert any("rel-1.0-cpu.tar.gz" in line for line in v.lines)


def test_a_modified_member_is_named(released: Path, tmp_path: Path) -> None:
    folder = tmp_path / "r"
    shutil.copytree(released, folder)
    _resign(folder, _repack(released, [], edit="rel-1.0-cpu/tiny_cnn/model.onnx.enc"))
    with pytest.raises(ArtifactError, match=r"entry 'rel-1\.0-cpu/tiny_cnn/model\.onnx\.enc' differs"):
        _check(folder)


def test_wrong_public_key_and_missing_key_are_clear(released: Path, tmp_path: Path) -> None:
    other = tmp_path / "other.pub"
    other.write_text(minisign.public_key_text(Ed25519PrivateKey.generate().public_key().public_bytes_raw(), "x"))
    proc = cli("verify", str(released), "--public-key", str(other), cwd=tmp_path)
    assert proc.returncode == 7 and "signed by key id" in proc.stderr
    env = {k: "" for k in ("ORTBUILD_SIGNING_KEY", "ORTBUILD_SIGNING_KEY_FILE", "ORTBUILD_PUBLIC_KEY_FILE")}
    proc = cli("verify", str(released), cwd=tmp_path, env=env)
    assert proc.returncode == 8 and "--public-key" in proc.stderr
    proc = cli("verify", str(released), "--public-key", str(public_key_file(tmp_path)), cwd=tmp_path,
               env={"ORTBUILD_KEY": ""})
    assert proc.returncode == 8 and "--no-run" in proc.stderr
    proc = cli("verify", str(released), "--public-key", str(public_key_file(tmp_path)), cwd=tmp_path,
               env={"ORTBUILD_KEY": base64.b64encode(bytes(32)).decode()})  # the wrong decryption key
    assert proc.returncode == 8 and "wrong key" in proc.stderr and "internal error" not in proc.stderr, proc.stderr
    with pytest.raises(GateFailed):  # a forced verdict in the provenance without force: refused
        folder = tmp_path / "r"
        shutil.copytree(released, folder)
        prov = folder / "rel-1.0-cpu.intoto.jsonl"
        st = json.loads(base64.b64decode(json.loads(prov.read_text())["payload"]))
        st["predicate"]["runDetails"]["byproducts"][0]["annotations"]["status"] = "FAIL"
        prov.write_bytes(provenance.envelope(st, SIGNER))
        _resign(folder, (folder / "rel-1.0-cpu.tar").read_bytes())
        _check(folder)


def test_two_clean_builds_in_separate_directories_give_byte_identical_bundles(tmp_path: Path) -> None:
    """Reproducibility: the same inputs, keys and SOURCE_DATE_EPOCH; separate checkouts, separate runs."""
    out = []
    for side in ("a", "b"):
        root = tmp_path / side / "checkout"
        make_project(root)
        proc = cli("test", "-t", "cpu", "-j", "1", cwd=root)
        assert proc.returncode == 0, proc.stderr
        proc = cli("release", "-t", "cpu", cwd=root)
        assert proc.returncode == 0, proc.stderr
        out.append(root / "dist" / "release" / "cpu")
    a, b = out
    assert (a / "rel-1.0-cpu.tar").read_bytes() == (b / "rel-1.0-cpu.tar").read_bytes()
    assert (a / "rel-1.0-cpu.release.json").read_bytes() == (b / "rel-1.0-cpu.release.json").read_bytes()
    # model.sig signs the provenance too, which records when the release ran (not reproducible): both sign the
    # same bundle and index
    for d in (a, b):
        st = json.loads(base64.b64decode(json.loads((d / "model.sig").read_bytes())["dsseEnvelope"]["payload"]))
        signed = {r["name"]: r["digest"] for r in st["predicate"]["resources"]}
        assert {n: signed[n] for n in ("rel-1.0-cpu.tar", "rel-1.0-cpu.release.json")} == \
            {n: tarball.sha256((a / n).read_bytes()) for n in ("rel-1.0-cpu.tar", "rel-1.0-cpu.release.json")}
    index = json.loads((a / "rel-1.0-cpu.release.json").read_text())
    assert index["created"] == "2026-01-01T00:00:00Z"


def test_the_provenance_names_every_file_of_an_external_data_model(tmp_path: Path) -> None:
    """A model saved with its weights beside it: the graph file and its .data file are both materials, each with
    its sha256; the bundle (whose artifact has external data too) verifies with its golden run."""
    import hashlib

    import onnx

    root = tmp_path / "ext"
    (root / "models" / "ext").mkdir(parents=True)
    model = onnx.load(str(MODELS / "tiny_cnn.onnx"))
    onnx.save_model(model, str(root / "models" / "ext" / "model.onnx"), save_as_external_data=True,
                    all_tensors_to_one_file=True, location="model.onnx.data", size_threshold=0)
    shutil.copy(MODELS / "tiny_cnn.inputs.npz", root / "models" / "ext" / "inputs.npz")
    (root / "targets.toml").write_text(PROJECT.split("[models.tiny_cnn]")[0] + """[models.ext]
path = "models/ext/model.onnx"
inputs = "models/ext/inputs.npz"
""" + "[targets.cpu]" + PROJECT.split("[targets.cpu]")[1].split("[targets.cpu-strict]")[0].replace(
        "RUNTIME", here_runtime()))
    proc = cli("test", "-t", "cpu", "-j", "1", cwd=root)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    proc = cli("release", "-t", "cpu", cwd=root)
    assert proc.returncode == 0, proc.stderr
    out = root / "dist" / "release" / "cpu"
    st = json.loads(base64.b64decode(json.loads((out / "rel-1.0-cpu.intoto.jsonl").read_text())["payload"]))
    deps = {d["name"]: d for d in st["predicate"]["buildDefinition"]["resolvedDependencies"]}
    for name, role in (("models/ext/model.onnx", "source model"),
                       ("models/ext/model.onnx.data", "source model external data")):
        assert deps[name]["annotations"]["role"] == role
        assert deps[name]["digest"]["sha256"] == hashlib.sha256((root / name).read_bytes()).hexdigest()
    assert deps["models/ext/model.onnx.data"]["annotations"]["location"] == "model.onnx.data"
    index = json.loads((out / "rel-1.0-cpu.release.json").read_text())
    assert "rel-1.0-cpu/ext/model.onnx.data.enc" in index["files"]
    proc = cli("verify", str(out), "--public-key", str(public_key_file(tmp_path)), "--json", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert any(c.startswith("golden       ext: PASS") for c in json.loads(proc.stdout)["checks"])
    # one weight byte changed after the tests: the provenance would name files the artifact was not built from
    data = root / "models" / "ext" / "model.onnx.data"
    blob = bytearray(data.read_bytes())
    blob[len(blob) // 2] ^= 1
    data.write_bytes(bytes(blob))
    proc = cli("release", "-t", "cpu", cwd=root)
    assert proc.returncode == 9, proc.stdout + proc.stderr
    assert "its source changed since it was built (model.onnx.data)" in proc.stdout + proc.stderr


def test_an_inconclusive_test_is_refused_naming_the_command_that_judges_that_gate_alone(tmp_path: Path) -> None:
    """An INCONCLUSIVE latency (and server) verdict: the test's reason names the command that judges only those
    gates again, ortbuild's and nox's; release refuses it, naming that command and the full test it takes."""
    from types import SimpleNamespace
    from typing import cast

    from ortbuild.gating.record import TestResult
    from ortbuild.gating.reports.selection import undecided_reason
    from ortbuild.status import Verdict

    r = TestResult("cpu-fp32", "tiny_cnn", "fp32", status=Verdict.INCONCLUSIVE)
    r.set_verdict("latency", Verdict.INCONCLUSIVE)
    r.set_verdict("server", Verdict.INCONCLUSIVE)
    r.reason = undecided_reason(r, ["p99: FAIL measured under load 4.3 on 2 CPUs, twice"], "targets.toml",
                                "test(cpu-fp32)")
    assert r.reason == ("p99: FAIL measured under load 4.3 on 2 CPUs, twice; judge latency, server alone again: "
                        "ortbuild test -t cpu-fp32 -m tiny_cnn --gates latency,server   (or: nox -s \"test(cpu-fp32)\" "
                        "-- -m tiny_cnn --gates latency,server)")
    m = cast(manifest_types.Manifest, SimpleNamespace(generative=None, kind="onnx"))
    said = release._test_problem(tmp_path, m, r, "cpu-fp32")
    assert said == (
        "its tests did not pass (INCONCLUSIVE: p99: FAIL measured under load 4.3 on 2 CPUs, twice): its latency, "
        "server gate(s) could not decide (often a loaded machine); on a quiet machine, ortbuild test -t cpu-fp32 -m "
        "tiny_cnn --gates latency,server   (or: nox -s \"test(cpu-fp32)\" -- -m tiny_cnn --gates latency,server) "
        "judges only those gates, then `ortbuild test -t cpu-fp32 -m tiny_cnn` (or `python3 -m nox -s "
        "\"test(cpu-fp32)\" -- -m tiny_cnn`) gives the verdict release takes (one test of every gate)")
    r.set_verdict("server", "-")  # one gate, under a config elsewhere
    assert "-c cfg/targets.toml -t cpu-fp32 -m tiny_cnn --gates latency   (or" in undecided_reason(
        r, ["p99: undecided"], "cfg/targets.toml", "test(cpu-fp32)")
    assert "judges only that gate" in str(release._test_problem(tmp_path, m, r, "cpu-fp32"))
