"""The generated loaders, run for real: Python in a clean interpreter, Node.js on onnxruntime-node.

Both must reproduce the unencrypted artifact's outputs, load external data from memory, refuse what they
cannot run, and reject every tampered input with its specific error (the tamper suite, >= 1,000 mutations
through each loader). Builds and loads must leave no plaintext model bytes on disk.
"""

from __future__ import annotations

import base64
import hashlib
import json
import os
import random
import shutil
import subprocess
import sys
import textwrap
from collections.abc import Callable, Iterator
from dataclasses import asdict
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import pytest

from ortbuild.artifact import container, ed25519, keygen, keys, loaders, manifest, pieces
from ortbuild.errors import ArtifactError
from ortbuild.pipeline.build import Builder
from ortbuild.project import config, plan
from ortbuild.status import JobStatus
from tests.conftest import MODELS, TEST_KEY, TEST_SIGNING_SEED, here_runtime, npm_install

BUILT = JobStatus.BUILT

NODE_VERSION = "onnxruntime-node@1.30.0"
TARGETS = """
    [targets.fp32]
    runtime = "RUNTIME"
    providers = ["CPUExecutionProvider"]

    [targets.int8]
    extends = "fp32"
    precision = "int8-dynamic"
    models = ["tiny_lstm"]

    [targets.ext]
    extends = "fp32"
    external_data = true
    optimization = "basic"
    models = ["tiny_transformer"]

    [targets.ext-copy]
    extends = "ext"
    session = { config = { "session.use_external_initializer_file_buffers_directly" = "0" } }
"""


# ------------------------------------------------------------------------------------------ fixtures

def build_examples(root: Path, targets: str) -> Path:
    """Build `targets` (TOML, RUNTIME standing for this venv's flavor) over tiny_cnn, tiny_lstm and tiny_transformer
    in `root`; every job must build. Returns the dist folder."""
    text = '[project]\nname = "t"\nversion = "1"\n\n'
    for m in ("tiny_cnn", "tiny_lstm", "tiny_transformer"):
        text += f'[models.{m}]\npath = "{MODELS / m}.onnx"\ninputs = "{MODELS / m}.inputs.npz"\n'
    (root / "targets.toml").write_text(text + textwrap.dedent(targets).replace("RUNTIME", here_runtime()))
    project = config.load(root / "targets.toml")
    results = Builder(project, root / "dist", secrets=keys.read_secrets(),
                      progress=lambda j, m: None).run(plan.jobs(project))
    assert all(r.status == BUILT for r in results), [(r.target, r.model, r.reason) for r in results]
    return root / "dist"


@pytest.fixture(scope="module")
def dist(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_examples(tmp_path_factory.mktemp("loaders"), TARGETS)


ARTIFACTS = [("fp32", "tiny_cnn"), ("fp32", "tiny_lstm"), ("fp32", "tiny_transformer"), ("int8", "tiny_lstm"),
             ("ext", "tiny_transformer"), ("ext-copy", "tiny_transformer")]


@pytest.fixture(scope="session")
def node_app() -> Path:
    """A Node.js app with onnxruntime-node installed from the npm registry (cached between runs)."""
    return install_node_app()


def install_node_app() -> Path:
    """The app folder ($ORTBUILD_NODE_APP, else a cache folder) with onnxruntime-node installed in it; without
    Node.js and npm the calling test is skipped with how to install them (fails with ORTBUILD_REQUIRE_NODE=1)."""
    app = Path(os.environ.get("ORTBUILD_NODE_APP", Path.home() / ".cache" / "ortbuild-tests" / "node-app"))
    # the package's install script fetches CUDA binaries from outside the registry: skip it, the CPU
    # binaries ship in the package itself
    env = {**os.environ, "ONNXRUNTIME_NODE_INSTALL": "skip"}
    return npm_install(app, NODE_VERSION, app / "node_modules" / "onnxruntime-node" / "package.json", env)


def node(app: Path, script: str, *args: str, cwd: Path | None = None, env: dict[str, str] | None = None) -> Any:
    """Run an ES module in the app (where onnxruntime-node resolves); it prints one JSON document."""
    path = app / f"run_{os.getpid()}.mjs"
    path.write_text(script)
    proc = subprocess.run(["node", str(path), *args], cwd=cwd or app, capture_output=True, text=True, timeout=600,
                          env=env)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


def feed(model: str) -> dict[str, np.ndarray]:
    with np.load(MODELS / f"{model}.inputs.npz") as z:
        return {k: z[k] for k in z.files}


def plain_outputs(folder: Path, model: str) -> list[np.ndarray]:
    """The unencrypted artifact's outputs: decrypted here, run with plain onnxruntime from memory."""
    import onnxruntime as ort

    m, _ = manifest.read(folder)
    files = {f.location: container.decrypt((folder / f.name).read_bytes(), TEST_KEY) for f in m.artifact.files}
    so = ort.SessionOptions()
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    main = bytes(files.pop(m.artifact.files[0].location))
    if files:
        so.add_external_initializers_from_files_in_memory(list(files), list(files.values()),
                                                          [len(v) for v in files.values()])
    sess = ort.InferenceSession(main, so, providers=["CPUExecutionProvider"])
    return list(sess.run(None, feed(model)))


# ----------------------------------------------------------------------------------------- Python

BLOCK_ORTBUILD = """
import sys, importlib.abc
class _Block(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name == "ortbuild" or name.startswith("ortbuild."):
            raise ModuleNotFoundError(f"No module named {name!r} (blocked: the loader must not need it)")
sys.meta_path.insert(0, _Block())
"""


@pytest.mark.parametrize("target,model", ARTIFACTS)
def test_python_loader_in_a_clean_interpreter(dist: Path, tmp_path: Path, target: str, model: str) -> None:
    folder = dist / target / model
    np.savez(tmp_path / "in.npz", **feed(model))
    script = BLOCK_ORTBUILD + f"""
import numpy as np
try:
    import ortbuild
    raise SystemExit("ortbuild is importable")
except ModuleNotFoundError:
    pass
sys.path.insert(0, {str(folder / "loader")!r})
import ortbuild_{model} as loader
m = loader.load()
with np.load({str(tmp_path / "in.npz")!r}) as z:
    out = m.run({{k: z[k] for k in z.files}})
np.savez({str(tmp_path / "out.npz")!r}, **out)
print(m.providers)
"""
    proc = subprocess.run([sys.executable, "-I", "-c", script], capture_output=True, text=True, timeout=300,
                          env={**os.environ, "PYTHONPATH": ""})
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "CPUExecutionProvider" in proc.stdout
    with np.load(tmp_path / "out.npz") as z:
        got = [z[k] for k in z.files]
    for a, b in zip(got, plain_outputs(folder, model), strict=True):
        np.testing.assert_array_equal(a, b)


TWO_MODELS = """
import sys
import numpy as np
sys.path[:0] = [{cnn!r}, {transformer!r}]
import ortbuild_tiny_cnn, ortbuild_tiny_transformer
assert "ortbuild_loader" not in sys.modules
out = {{}}
for mod, inputs in ((ortbuild_tiny_cnn, {cnn_in!r}), (ortbuild_tiny_transformer, {transformer_in!r})):
    m = mod.load()  # its own artifact: the directory above its loader/
    with np.load(inputs) as z:
        run = m.run({{k: z[k] for k in z.files}})
    out.update({{f"{{mod.MODEL}}/{{k}}": v for k, v in run.items()}})
    print(mod.__name__, mod.MODEL, mod.__file__)
np.savez({out!r}, **out)
"""


def test_two_models_python_loaders_import_side_by_side(dist: Path, tmp_path: Path) -> None:
    """An app with two models: both loader/ directories on sys.path, a plain `import` of each model's module, both
    loaded and run in one process; each gives its own model's outputs (plain onnxruntime on the source model)."""
    import onnxruntime as ort

    folders = {m: dist / "fp32" / m for m in ("tiny_cnn", "tiny_transformer")}
    for m in folders:
        np.savez(tmp_path / f"{m}.npz", **feed(m))
    script = BLOCK_ORTBUILD + TWO_MODELS.format(
        cnn=str(folders["tiny_cnn"] / "loader"), transformer=str(folders["tiny_transformer"] / "loader"),
        cnn_in=str(tmp_path / "tiny_cnn.npz"), transformer_in=str(tmp_path / "tiny_transformer.npz"),
        out=str(tmp_path / "out.npz"))
    proc = subprocess.run([sys.executable, "-I", "-c", script], capture_output=True, text=True, timeout=300,
                          env={**os.environ, "PYTHONPATH": ""})
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.splitlines() == [
        f"ortbuild_{m} {m} {folders[m] / 'loader' / f'ortbuild_{m}.py'}" for m in folders], proc.stdout
    with np.load(tmp_path / "out.npz") as z:
        got = {k: z[k] for k in z.files}
    for m, folder in folders.items():
        source = ort.InferenceSession(str(MODELS / f"{m}.onnx"), providers=["CPUExecutionProvider"])
        want = dict(zip([o.name for o in source.get_outputs()], source.run(None, feed(m)), strict=True))
        assert {k.split("/", 1)[1] for k in got if k.startswith(f"{m}/")} == set(want)
        for name, value in want.items():
            np.testing.assert_allclose(got[f"{m}/{name}"], value, rtol=1e-4, atol=1e-5)
        for a, b in zip([got[f"{m}/{n}"] for n in want], plain_outputs(folder, m), strict=True):
            np.testing.assert_array_equal(a, b)  # and exactly the artifact's own outputs


def test_python_loader_module_names_are_identifiers_for_every_model_name(dist: Path, tmp_path: Path) -> None:
    """Model names may hold '-' and '.' (and start with a digit): the loader's module is still a plain `import`."""
    import dataclasses
    import keyword

    m, _ = manifest.read(dist / "fp32" / "tiny_cnn")
    for name, module in (("resnet-50.v2", "ortbuild_resnet_50_v2"), ("3d.unet", "ortbuild_3d_unet"),
                         ("import", "ortbuild_import"), ("Mixed_Case", "ortbuild_Mixed_Case")):
        files = loaders.render(dataclasses.replace(m, model=name), here_runtime())
        assert loaders.python_file(name) == f"{module}.py" and f"{module}.py" in files
        assert module.isidentifier() and not keyword.iskeyword(module)
        where = tmp_path / name / "loader"
        where.mkdir(parents=True)
        (where / f"{module}.py").write_text(files[f"{module}.py"])
        proc = subprocess.run([sys.executable, "-I", "-c", f"import sys; sys.path.insert(0, {str(where)!r}); "
                               f"import {module}; print({module}.MODEL)"], capture_output=True, text=True, timeout=120)
        assert proc.returncode == 0 and proc.stdout.strip() == name, proc.stderr[-2000:]


def test_python_loader_errors(dist: Path) -> None:
    mod: Any = loaders.import_python_loader(loaders.python_path(dist / "fp32" / "tiny_cnn", "tiny_cnn"))
    m = mod.load()
    bad = {"image": np.zeros((2, 3, 32, 32), np.float64)}
    with pytest.raises(mod.FeedError, match="must be float32, got float64"):
        m.run(bad)
    with pytest.raises(mod.FeedError, match=r"takes inputs \['image'\], got \['x'\]"):
        m.run({"x": 1})
    with pytest.raises(mod.FeedError, match="must have shape"):
        m.run({"image": np.zeros((2, 3, 16, 32), np.float32)})
    with pytest.raises(mod.KeyMissingError):
        mod.load(key=b"short")
    saved = os.environ.pop("ORTBUILD_KEY")
    try:
        with pytest.raises(mod.KeyMissingError, match="no key was given"):
            mod.load()
    finally:
        os.environ["ORTBUILD_KEY"] = saved
    assert m.inputs[0]["name"] == "image" and m.manifest["target"] == "fp32"


def test_external_data_artifact_has_both_files_encrypted(dist: Path) -> None:
    m, folder = manifest.read(dist / "ext" / "tiny_transformer")
    assert [(f.name, f.role, f.encrypted) for f in m.artifact.files] == [
        ("model.onnx.enc", "model", True), ("model.onnx.data.enc", "external_data", True)]
    graph = onnx.load_model_from_string(bytes(container.decrypt((folder / "model.onnx.enc").read_bytes(), TEST_KEY)))
    assert any(i.data_location == onnx.TensorProto.EXTERNAL for i in graph.graph.initializer)
    assert (folder / "model.onnx.data.enc").stat().st_size > 10 * (folder / "model.onnx.enc").stat().st_size


# ------------------------------------------------------------- one pass: read, hash, decrypt (Python)

@pytest.mark.parametrize("size,chunk_log2", [(0, 20), (1, 20), (1 << 20, 20), ((1 << 20) + 1, 20),
                                             ((9 << 20) + 12345, 20), ((3 << 20) - 7, 12), (5000, 24)])
@pytest.mark.parametrize("graph", ["buffer", "bytes", "memfile"])
def test_one_pass_reads_what_ortbuild_writes(dist: Path, tmp_path: Path, size: int, chunk_log2: int,
                                             graph: str) -> None:
    """Empty, one-byte, exact-chunk and multi-piece files, 4 KiB to 16 MiB chunks: the loader's one pass (pieces
    of one or several chunks hashed on a second thread, decrypted straight into the result) gives back the
    plaintext; the graph comes back as `bytes` (what InferenceSession takes) or, on Linux, as an anonymous memory
    file (memfd) that ONNX Runtime opens by its /proc/self/fd path."""
    import hashlib

    mod: Any = loaders.import_python_loader(loaders.python_path(dist / "ext" / "tiny_transformer",
                                                                     "tiny_transformer"))
    plain = random.Random(size).randbytes(size)
    path = tmp_path / "c.enc"
    with open(path, "wb") as out:
        (tmp_path / "p").write_bytes(plain)
        digest, n, digests = container.encrypt_file(tmp_path / "p", out, TEST_KEY, chunk_log2=chunk_log2)
    plain_digest, plain_pieces = pieces.of_bytes(plain)
    # the container, and an unencrypted artifact file, hashed the same way; each as format 2 (one sha256, read
    # sequentially) and format 3 (piece digests, read on 1 and on 3 threads)
    for encrypted, where, signed in ((True, path, {"size": n, "sha256": digest, "pieces": asdict(digests)}),
                                     (False, tmp_path / "p", {"size": size, "sha256": plain_digest,
                                                              "pieces": asdict(plain_pieces)})):
        for entry, threads in (({**signed, "pieces": None}, 0), (signed, 1), (signed, 3)):
            got, err = mod._open_file(where, entry, encrypted, TEST_KEY if encrypted else None, None,
                                      graph=graph != "buffer", memfile=graph == "memfile", threads=threads)
            assert err is None
            if graph == "memfile" and sys.platform.startswith("linux"):
                assert isinstance(got, mod._Memfile)
                with open(got.path, "rb") as f:  # what ONNX Runtime reads
                    assert f.read() == plain
                got.close()
            else:
                assert bytes(got) == plain and len(got) == size
                assert isinstance(got, bytes) if graph != "buffer" else not isinstance(got, bytes)
    assert hashlib.sha256(path.read_bytes()).hexdigest() == digest


def _open_fds() -> set[str]:
    return {os.readlink(f"/proc/self/fd/{fd}") for fd in os.listdir("/proc/self/fd")
            if os.path.exists(f"/proc/self/fd/{fd}")}


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="memfd_create and /proc/self/fd are Linux's")
def test_a_graph_memory_file_is_dropped_on_every_error(dist: Path, tmp_path: Path) -> None:
    """The memory file a graph is decrypted into is closed when its digest is not the signed one, when a chunk
    does not authenticate and when the key is wrong: no plaintext is left behind, not even in memory."""
    import hashlib

    mod: Any = loaders.import_python_loader(loaders.python_path(dist / "ext" / "tiny_transformer",
                                                                     "tiny_transformer"))
    ct = bytearray(container.encrypt(os.urandom((3 << 20) + 5), TEST_KEY))
    ct[container.HEADER + (2 << 20) + 40] ^= 1  # in chunk 2 of 4
    path = tmp_path / "c.enc"
    path.write_bytes(ct)
    signed = {"size": len(ct), "sha256": hashlib.sha256(ct).hexdigest()}
    before = _open_fds()
    got, err = mod._open_file(path, signed, True, TEST_KEY, None, graph=True, memfile=True)
    assert got is None and isinstance(err, mod.CorruptContainerError) and "chunk 2 of 4" in str(err)
    got, err = mod._open_file(path, signed, True, bytes(32), None, graph=True, memfile=True)
    assert got is None and isinstance(err, mod.WrongKeyError)
    with pytest.raises(mod.TamperedError):
        mod._open_file(path, {**signed, "sha256": "0" * 64}, True, TEST_KEY, None, graph=True, memfile=True)
    assert not [f for f in _open_fds() - before if "memfd:" in f]


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="memfd_create and /proc/self/fd are Linux's")
def test_load_hands_the_graph_over_as_a_sealed_memory_file_and_keeps_no_plaintext(dist: Path,
                                                                                  tmp_path: Path) -> None:
    """An artifact in one file reaches ONNX Runtime as a sealed memory file, opened by path: the outputs are the
    unencrypted artifact's, the file is closed once the session exists (no descriptor, no mapping, and the
    session keeps neither the plaintext bytes nor the path of a descriptor that a later open may reuse), and
    the loader module imported cryptography already: load() imports none of it."""
    folder = dist / "fp32" / "tiny_transformer"
    script = f"""
import json, os, sys
sys.path.insert(0, {str(folder / "loader")!r})
import numpy as np
import ortbuild_tiny_transformer as loader
seen = []
made = loader._Memfile.create
def create():
    m = made()
    seen.append(m)
    return m
loader._Memfile.create = create
sealed = []
seal = loader._Memfile.seal
def check_seal(self):
    seal(self)
    import fcntl
    sealed.append(fcntl.fcntl(self.fd, fcntl.F_GET_SEALS))
loader._Memfile.seal = check_seal
modules = set(sys.modules)
m = loader.load()
with np.load({str(MODELS / "tiny_transformer.inputs.npz")!r}) as z:
    out = m.run({{k: z[k] for k in z.files}})
np.savez(sys.argv[1], **out)
fds = [os.readlink("/proc/self/fd/" + f) for f in os.listdir("/proc/self/fd") if os.path.exists("/proc/self/fd/" + f)]
print(json.dumps({{"memfiles": len(seen), "closed": all(x.fd == -1 for x in seen), "sealed": sealed,
                  "fds": [f for f in fds if "memfd" in f],
                  "maps": [line for line in open("/proc/self/maps") if "memfd" in line],
                  "model_path": m.session._model_path, "model_bytes": m.session._model_bytes is None,
                  "crypto_imported_by_load": sorted(x for x in set(sys.modules) - modules
                                                    if x.startswith("cryptography"))}}))
"""
    out = tmp_path / "out.npz"
    proc = subprocess.run([sys.executable, "-I", "-c", script, str(out)], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    doc = json.loads(proc.stdout.strip().splitlines()[-1])
    import fcntl

    want = fcntl.F_SEAL_SEAL | fcntl.F_SEAL_SHRINK | fcntl.F_SEAL_GROW | fcntl.F_SEAL_WRITE
    assert doc == {"memfiles": 1, "closed": True, "sealed": [want], "fds": [], "maps": [], "model_path": None,
                   "model_bytes": True, "crypto_imported_by_load": []}
    with np.load(out) as z:
        got = [z[k] for k in z.files]
    for a, b in zip(got, plain_outputs(folder, "tiny_transformer"), strict=True):
        np.testing.assert_array_equal(a, b)


def test_one_pass_checks_the_digest_before_decryption_errors(dist: Path, tmp_path: Path) -> None:
    """A chunk that does not authenticate is reported only when the file's digest is the signed one
    (CorruptContainerError); with another digest the file is TamperedError, whatever fails inside it."""
    import hashlib

    mod: Any = loaders.import_python_loader(loaders.python_path(dist / "ext" / "tiny_transformer",
                                                                     "tiny_transformer"))
    plain = os.urandom((6 << 20) + 99)
    ct = bytearray(container.encrypt(plain, TEST_KEY))
    ct[container.HEADER + (5 << 20) + 7] ^= 4  # in chunk 4 (of 7), inside the second piece
    path = tmp_path / "c.enc"
    path.write_bytes(ct)
    signed = {"size": len(ct), "sha256": hashlib.sha256(ct).hexdigest()}
    got, err = mod._open_file(path, signed, True, TEST_KEY, None, graph=False)
    assert got is None and isinstance(err, mod.CorruptContainerError) and "chunk 4 of 7" in str(err)
    with pytest.raises(mod.TamperedError):
        mod._open_file(path, {**signed, "sha256": "0" * 64}, True, TEST_KEY, None, graph=False)
    with pytest.raises(mod.TamperedError):  # wrong key and wrong digest: the digest wins
        mod._open_file(path, {**signed, "sha256": "0" * 64}, True, bytes(32), None, graph=False)
    got, err = mod._open_file(path, signed, True, bytes(32), None, graph=False)
    assert got is None and isinstance(err, mod.WrongKeyError)
    with pytest.raises(mod.TamperedError):  # a size that is not the signed one is refused before reading
        mod._open_file(path, {**signed, "size": len(ct) + 1}, True, TEST_KEY, None, graph=False)


def test_pieces_are_checked_on_every_thread_and_the_first_bad_one_is_refused(dist: Path, tmp_path: Path) -> None:
    """Format 3: a changed byte in the header piece, the first, a middle or the last piece is TamperedError naming
    that piece, on one thread and on several, with the right key or a wrong one; a chunk that does not authenticate
    in a file whose pieces all hold is CorruptContainerError; piece digests that do not fit the file are refused."""
    mod: Any = loaders.import_python_loader(loaders.python_path(dist / "ext" / "tiny_transformer",
                                                                     "tiny_transformer"))
    plain = os.urandom((13 << 20) + 5)  # 14 chunks of 1 MiB: the header piece, then 4 pieces of 4 chunks
    good = container.encrypt(plain, TEST_KEY)
    path = tmp_path / "c.enc"
    whole, digests = pieces.of_bytes(good, *pieces.container_layout(1 << 20, container.HEADER))
    signed = {"size": len(good), "sha256": whole, "pieces": asdict(digests)}
    spans = pieces.spans(len(good), digests.head, digests.size)
    assert len(spans) == len(digests.sha256) == 5
    for i, at in ((0, 50), (1, spans[1][0] + 3), (2, spans[2][0] + spans[2][1] // 2), (4, len(good) - 1)):
        bad = bytearray(good)
        bad[at] ^= 1
        path.write_bytes(bad)
        for threads, key in ((1, TEST_KEY), (3, TEST_KEY), (2, bytes(32))):
            with pytest.raises(mod.TamperedError, match=f"piece {i} of 5 \\(bytes {spans[i][0]}-"):
                mod._open_file(path, signed, True, key, None, graph=False, threads=threads)
    path.write_bytes(good)
    got, err = mod._open_file(path, signed, True, bytes(32), None, graph=False, threads=2)
    assert got is None and isinstance(err, mod.WrongKeyError)
    bad = bytearray(good)
    bad[spans[3][0] + (1 << 20) + 16 + 9] ^= 1  # chunk 9 (the second of piece 3), signed as it is
    path.write_bytes(bad)
    resigned = {**signed, "sha256": hashlib.sha256(bad).hexdigest(), "pieces": asdict(pieces.of_bytes(
        bytes(bad), digests.head, digests.size)[1])}
    for threads in (1, 3):
        got, err = mod._open_file(path, resigned, True, TEST_KEY, None, graph=False, threads=threads)
        assert got is None and isinstance(err, mod.CorruptContainerError) and "chunk 9 of 14" in str(err)
    path.write_bytes(good)
    with pytest.raises(mod.TamperedError):  # one digest too few for the file
        mod._open_file(path, {**signed, "pieces": {**signed["pieces"], "sha256": digests.sha256[:-1]}}, True,
                       TEST_KEY, None, graph=False)
    with pytest.raises(mod.UnsupportedFormatError, match="header"):  # an encrypted file's pieces start at 103
        mod._open_file(path, {**signed, "pieces": asdict(pieces.of_bytes(good, 0, digests.size)[1])}, True,
                       TEST_KEY, None, graph=False)
    odd = asdict(pieces.of_bytes(good, container.HEADER, 1 << 20)[1])  # pieces that split container chunks
    got, err = mod._open_file(path, {**signed, "pieces": odd}, True, TEST_KEY, None, graph=False)
    assert got is None and isinstance(err, mod.UnsupportedFormatError) and "whole container chunks" in str(err)


INTERRUPTED_PASS = """
import os, signal, sys, threading, time, _thread
sys.path.insert(0, sys.argv[1])
import importlib
mod = importlib.import_module(sys.argv[2])
main = threading.main_thread().ident
late, calls, interrupted, returned = [], [], threading.Event(), threading.Event()
preadv = os.preadv

def spy(fd, bufs, at):
    if _thread.get_ident() != main and not calls:  # the helper's first read: held until the main thread waits
        calls.append(at)
        interrupted.wait(10)
        time.sleep(0.3)
    if returned.is_set():
        late.append(at)  # a helper still reading after the call returned (its descriptor closed, maybe reused)
    return preadv(fd, bufs, at)

os.preadv = spy

def interrupt():
    time.sleep(1.5)  # the main thread has done every other piece and waits for the helper
    signal.pthread_kill(main, signal.SIGINT)
    interrupted.set()

threading.Thread(target=interrupt).start()
try:
    mod._open_file(sys.argv[3], {"size": int(sys.argv[4]), "sha256": "", "pieces": eval(sys.argv[5])}, True,
                   bytes(range(32)), None, graph=False, threads=2)
    print("no interrupt")
except KeyboardInterrupt:
    returned.set()
time.sleep(1.5)
print("helpers still running:", threading.active_count() - 1, "late reads:", late)
"""


def test_an_interrupted_pass_stops_its_helper_threads_before_it_returns(dist: Path, tmp_path: Path) -> None:
    """Ctrl-C while the Python loader's main thread waits for a helper thread of the format-3 pass: the
    KeyboardInterrupt reaches the caller only once every helper has stopped, so no helper goes on reading through a
    descriptor the pass has closed (which a later open() may reuse) or writing plaintext into a closed buffer."""
    folder = dist / "ext" / "tiny_transformer"
    ct = container.encrypt(os.urandom((13 << 20) + 5), TEST_KEY)  # the header, then 4 pieces of 4 chunks
    path = tmp_path / "c.enc"
    path.write_bytes(ct)
    layout = asdict(pieces.of_bytes(ct, *pieces.container_layout(1 << 20, container.HEADER))[1])
    proc = subprocess.run([sys.executable, "-I", "-c", INTERRUPTED_PASS, str(folder / "loader"),
                           "ortbuild_tiny_transformer", str(path), str(len(ct)), repr(layout)],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.strip().splitlines()[-1] == "helpers still running: 0 late reads: []"


def test_the_pass_runs_on_the_cores_the_target_gives_it(dist: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The one pass uses every core this process may run on, at most intra_op_num_threads when the target (or
    load(session=...)) sets it: a process given a share of the machine keeps to it."""
    folder = dist / "ext-copy" / "tiny_transformer"
    mod: Any = loaders.import_python_loader(loaders.python_path(folder, "tiny_transformer"))
    seen: list[int] = []
    real = mod._open_file
    monkeypatch.setattr(mod, "_open_file", lambda *a, **k: seen.append(k["threads"]) or real(*a, **k))
    cores = len(os.sched_getaffinity(0))
    mod.load()
    mod.load(session={"intra_op_num_threads": 1})
    mod.load(session={"intra_op_num_threads": cores + 7})
    files = len(mod.verify(folder)["artifact"]["files"])
    expected = [min(cores, mod.SESSION["intra_op_num_threads"] or cores)] * files + [1] * files + [cores] * files
    assert seen == expected


def _as_format_2(folder: Path) -> None:
    """The artifact as the previous ortbuild wrote it: manifest format 2, one sha256 per file, no piece digests."""
    def edit(doc: dict[str, Any]) -> None:
        doc["format_version"] = 2
        for f in doc["artifact"]["files"]:
            f.pop("pieces", None)

    _resign(folder, edit)


def test_an_artifact_of_the_previous_format_still_loads_and_rekey_rewrites_it(dist: Path, tmp_path: Path) -> None:
    """A format-2 artifact (one sha256 per file) loads through the same loader with the same outputs, a changed
    byte is still refused, ortbuild checks it as before; `ortbuild rekey` rewrites it in format 3."""
    from ortbuild.artifact import keys as keys_
    from tests.conftest import run_cli

    folder = tmp_path / "dist" / "ext" / "tiny_transformer"
    shutil.copytree(dist / "ext" / "tiny_transformer", folder)
    _as_format_2(folder)
    mod: Any = loaders.import_python_loader(loaders.python_path(folder, "tiny_transformer"))
    assert mod.verify(folder)["format_version"] == 2
    out = list(mod.load(key=TEST_KEY, folder=folder).run(feed("tiny_transformer")).values())
    for a, b in zip(out, plain_outputs(dist / "ext" / "tiny_transformer", "tiny_transformer"), strict=True):
        np.testing.assert_array_equal(a, b)
    sign = keys_.signing_key()
    assert sign is not None
    m = manifest.trusted(folder, sign.public_raw)
    assert m is not None and m.format_version == 2 and all(f.pieces is None for f in m.artifact.files)
    shown = run_cli("inspect", str(folder))
    assert shown.returncode == 0 and "manifest   format 2: one sha256 per file (rebuild or `ortbuild rekey`" in \
        shown.stdout, shown.stdout + shown.stderr
    made = keygen.keygen(tmp_path / "new")
    old_file = tmp_path / "old.key"
    old_file.write_text(base64.b64encode(TEST_KEY).decode() + "\n")
    old_file.chmod(0o600)
    proc = run_cli("rekey", str(folder), "--old-key-file", str(old_file), "--new-key-file", made["encryption_key"])
    assert proc.returncode == 0, proc.stderr
    m = manifest.trusted(folder, sign.public_raw)
    assert m is not None and m.format_version == 3 and all(f.pieces is not None for f in m.artifact.files)
    assert "manifest   format 3: " in run_cli("inspect", str(folder)).stdout
    new_key = keys_.encryption_key(file=made["encryption_key"])
    assert new_key is not None
    again = list(mod.load(key=new_key.secret, folder=folder).run(feed("tiny_transformer")).values())
    for a, b in zip(again, out, strict=True):
        np.testing.assert_array_equal(a, b)
    copy = tmp_path / "flipped"
    shutil.copytree(dist / "ext" / "tiny_transformer", copy)
    _as_format_2(copy)
    data = bytearray((copy / "model.onnx.data.enc").read_bytes())
    data[-1] ^= 1
    (copy / "model.onnx.data.enc").write_bytes(data)
    with pytest.raises(mod.TamperedError, match="size or sha256"):
        mod.load(key=TEST_KEY, folder=copy)


def _resign(folder: Path, edit: Callable[[dict[str, Any]], None], seed: bytes = TEST_SIGNING_SEED) -> None:
    """Rewrite manifest.json with `edit` and sign it with the signing key of `seed` (default: the test key), what
    a legitimate build does."""
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

    doc = json.loads((folder / "manifest.json").read_bytes())
    edit(doc)
    text = json.dumps(doc, indent=2).encode()
    (folder / "manifest.json").write_bytes(text)
    sig = Ed25519PrivateKey.from_private_bytes(seed).sign(text)
    (folder / "manifest.sig").write_bytes(base64.b64encode(sig))


def _forge_weights(folder: Path) -> None:
    """Re-encrypt the external data with one weight changed, under the artifact's own key: every GCM tag is valid
    (anyone holding the key, i.e. every app, can do this); only the signed sha256 tells."""
    path = folder / "model.onnx.data.enc"
    plain = bytearray(container.decrypt(path.read_bytes(), TEST_KEY))
    for i in range(0, len(plain) - 4, 4096):
        plain[i:i + 4] = np.float32(3.0).tobytes()
    path.write_bytes(container.encrypt(bytes(plain), TEST_KEY))


def _set_file(doc: dict[str, Any], folder: Path, name: str) -> None:
    import hashlib

    data = (folder / name).read_bytes()
    for f in doc["artifact"]["files"]:
        if f["name"] == name:
            f["sha256"], f["size"] = hashlib.sha256(data).hexdigest(), len(data)
            if f.get("pieces"):  # format 3: its piece digests too
                f["pieces"] = asdict(pieces.of_bytes(data, f["pieces"]["head"], f["pieces"]["size"])[1])


@pytest.mark.parametrize("case", ["bitflip", "bitflip-header", "bitflip-last-byte", "forged-under-the-app-key",
                                  "bitflip-and-wrong-key", "bitflip-and-no-key", "signed-corrupt-chunk"])
def test_external_data_is_checked_before_onnx_runtime_sees_anything(dist: Path, tmp_path: Path,
                                                                   monkeypatch: pytest.MonkeyPatch,
                                                                   case: str) -> None:
    folder = tmp_path / "a"
    shutil.copytree(dist / "ext" / "tiny_transformer", folder)
    mod: Any = loaders.import_python_loader(loaders.python_path(folder, "tiny_transformer"))
    handed: list[str] = []
    real = mod._session_options
    monkeypatch.setattr(mod, "_session_options", lambda *a, **k: handed.append("so") or real(*a, **k))
    data = folder / "model.onnx.data.enc"
    ct = bytearray(data.read_bytes())
    key: Any = TEST_KEY
    expected = mod.TamperedError
    if case == "forged-under-the-app-key":
        _forge_weights(folder)
    else:  # a byte in the middle, in the header piece or in the last piece (format 3: pieces of the file)
        ct[{"bitflip-header": 60, "bitflip-last-byte": len(ct) - 1}.get(case, len(ct) // 2)] ^= 0x10
        data.write_bytes(ct)
    if case == "bitflip-and-wrong-key":
        key = bytes(32)
    if case == "bitflip-and-no-key":
        monkeypatch.delenv("ORTBUILD_KEY")
        key = None
    if case == "signed-corrupt-chunk":  # the signer signed a broken container: the chunk's tag says so
        _resign(folder, lambda doc: _set_file(doc, folder, "model.onnx.data.enc"))
        expected = mod.CorruptContainerError
    with pytest.raises(expected):
        mod.load(key=key, folder=folder)
    assert handed == []  # no SessionOptions was even made: nothing reached ONNX Runtime
    mod.load(key=TEST_KEY, folder=dist / "ext" / "tiny_transformer")
    assert handed == ["so"]  # (the spy sees a load that gets there)


def test_signed_digest_is_what_catches_a_forged_container(dist: Path, tmp_path: Path) -> None:
    """Control for the case above: the same forged weights, once the manifest signs their digest, load and change
    the outputs; so the refusal above came from the signed sha256, not from GCM."""
    folder = tmp_path / "a"
    shutil.copytree(dist / "ext" / "tiny_transformer", folder)
    _forge_weights(folder)
    _resign(folder, lambda doc: _set_file(doc, folder, "model.onnx.data.enc"))
    mod: Any = loaders.import_python_loader(loaders.python_path(folder, "tiny_transformer"))
    forged = list(mod.load(folder=folder).run(feed("tiny_transformer")).values())
    original = plain_outputs(dist / "ext" / "tiny_transformer", "tiny_transformer")
    assert any(not np.array_equal(a, b) for a, b in zip(forged, original, strict=True))


def test_load_session_overrides_apply_to_that_session_only(dist: Path) -> None:
    """load(session=...) lays options over the artifact's for one session (`config` key by key: the target's own
    entries stay); the next plain load() has the artifact's own; an unknown option is a LoaderError naming it."""
    folder = dist / "ext-copy" / "tiny_transformer"
    mod: Any = loaders.import_python_loader(loaders.python_path(folder, "tiny_transformer"))
    tuned = mod.load(session={"intra_op_num_threads": 1, "execution_mode": "parallel",
                              "config": {"session.intra_op.allow_spinning": "0"}})
    options = tuned.session.get_session_options()
    assert options.intra_op_num_threads == 1
    assert str(options.execution_mode).endswith("ORT_PARALLEL")
    assert options.get_session_config_entry("session.intra_op.allow_spinning") == "0"
    assert options.get_session_config_entry("session.use_external_initializer_file_buffers_directly") == "0"
    feed = dict(np.load(MODELS / "tiny_transformer.inputs.npz"))
    plain = mod.load()
    for name, value in plain.run(feed).items():
        np.testing.assert_allclose(tuned.run(feed)[name], value, rtol=1e-5, atol=1e-6)
    options = plain.session.get_session_options()
    assert options.intra_op_num_threads == mod.SESSION["intra_op_num_threads"]
    assert str(options.execution_mode).endswith("ORT_SEQUENTIAL")
    with pytest.raises(RuntimeError, match="does not have configuration"):
        options.get_session_config_entry("session.intra_op.allow_spinning")
    with pytest.raises(mod.LoaderError, match=r"unknown session option.*intra_op_threads"):
        mod.load(session={"intra_op_threads": 1})


@pytest.mark.parametrize("target,borrowed", [("ext", True), ("ext-copy", False)])
def test_external_data_buffers_outlive_the_session_when_borrowed(dist: Path, target: str, borrowed: bool) -> None:
    """By default ONNX Runtime reads the decrypted external data in place
    (session.use_external_initializer_file_buffers_directly): the Model (and the session object) keep the
    buffers, and outputs stay equal to plain ONNX Runtime's after everything else is collected and the freed
    memory is reused. A target that sets the key to "0" gets ONNX Runtime's copy and keeps no buffer."""
    import gc

    folder = dist / target / "tiny_transformer"
    mod: Any = loaders.import_python_loader(loaders.python_path(folder, "tiny_transformer"))
    m = mod.load()
    options = m.session.get_session_options()
    assert options.get_session_config_entry("session.use_external_initializer_file_buffers_directly") == (
        "1" if borrowed else "0")
    if borrowed:  # parallel prepacking only where it does not raise the peak (ORT copying keeps more alive)
        assert options.get_session_config_entry("session.prepack.enable_parallel") == "1"
    else:
        with pytest.raises(RuntimeError, match="does not have configuration"):
            options.get_session_config_entry("session.prepack.enable_parallel")
    data = next(f for f in m.manifest["artifact"]["files"] if f["role"] == "external_data")
    if borrowed:
        assert [len(w) for w in m._weights] == [container.parse_header(
            (folder / data["name"]).read_bytes()[:container.HEADER]).size]
        assert m.session._ortbuild_weights is m._weights
    else:
        assert m._weights == ()
    session = m.session
    del m
    gc.collect()
    junk = [bytearray(os.urandom(1 << 16)) for _ in range(256)]  # reuse whatever was freed
    got = session.run(None, feed("tiny_transformer"))
    del junk
    for a, b in zip(got, plain_outputs(folder, "tiny_transformer"), strict=True):
        np.testing.assert_array_equal(a, b)


def _huge_advised(buf: Any) -> bool:
    """Whether the mapping that holds `buf` was advised MADV_HUGEPAGE (its VmFlags in /proc/self/smaps say `hg`)."""
    import ctypes

    at = ctypes.addressof((ctypes.c_char * len(buf)).from_buffer(buf))
    inside = False
    for line in Path("/proc/self/smaps").read_text().splitlines():
        head = line.split()[0]
        if "-" in head and ":" not in head:
            lo, hi = (int(x, 16) for x in head.split("-"))
            inside = lo <= at < hi
        elif inside and head == "VmFlags:":
            return "hg" in line.split()[1:]
    raise AssertionError("the buffer's mapping is not in /proc/self/smaps")


@pytest.mark.skipif(not Path("/sys/kernel/mm/transparent_hugepage/enabled").exists(),
                    reason="needs Linux with transparent huge pages")
def test_external_data_goes_into_huge_pages_when_asked_or_large(dist: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """load(huge_pages=True) asks for transparent huge pages (MADV_HUGEPAGE) for the decrypted external data,
    False never; by default only from _HUGE_FROM bytes (measured faster at 2.3 GB, slower at 0.27-1 GB on
    this machine class: docs/loaders.md). Outputs are the same either way."""
    folder = dist / "ext" / "tiny_transformer"
    mod: Any = loaders.import_python_loader(loaders.python_path(folder, "tiny_transformer"))
    expected = plain_outputs(folder, "tiny_transformer")
    for huge, advised in ((True, True), (False, False), (None, False)):
        m = mod.load(huge_pages=huge)
        assert [_huge_advised(w) for w in m._weights] == [advised], huge
        for a, b in zip(m.session.run(None, feed("tiny_transformer")), expected, strict=True):
            np.testing.assert_array_equal(a, b)
    size = len(m._weights[0])
    monkeypatch.setattr(mod, "_HUGE_FROM", size)  # the default's threshold, at this file's size
    assert [_huge_advised(w) for w in mod.load()._weights] == [True]
    monkeypatch.setattr(mod, "_HUGE_FROM", size + 1)
    assert [_huge_advised(w) for w in mod.load()._weights] == [False]
    with pytest.raises(mod.LoaderError, match=r"huge_pages must be True, False or None.*'yes'"):
        mod.load(huge_pages="yes")


# ------------------------------------------------------------------------------------------- Node

NODE_RUN = """
import { load } from '%(loader)s';
import ort from 'onnxruntime-node';
import { readFileSync } from 'node:fs';
const feeds = JSON.parse(readFileSync(process.argv[2], 'utf8'));
const m = await load({ folder: '%(folder)s' });
const input = {};
for (const [name, f] of Object.entries(feeds)) {
  const raw = Buffer.from(f.data, 'base64');
  const Ctor = { float32: Float32Array, int64: BigInt64Array, int32: Int32Array }[f.dtype];
  const arr = new Ctor(raw.buffer.slice(raw.byteOffset, raw.byteOffset + raw.byteLength));
  input[name] = new ort.Tensor(f.dtype, arr, f.shape);
}
const out = await m.run(input);
const res = {};
for (const [name, t] of Object.entries(out)) {
  const bytes = Buffer.from(t.data.buffer, t.data.byteOffset, t.data.byteLength);
  res[name] = { dims: t.dims, type: t.type, data: bytes.toString('base64') };
}
console.log(JSON.stringify(res));
"""


@pytest.mark.parametrize("target,model", ARTIFACTS)
def test_node_loader_reproduces_the_unencrypted_outputs(dist: Path, node_app: Path, tmp_path: Path, target: str,
                                                         model: str) -> None:
    folder = dist / target / model
    loader = node_app / f"loader_{target}_{model}.mjs"
    shutil.copy(folder / "loader" / loaders.NODE, loader)  # apps embed the generated loader
    feeds = {k: {"dtype": str(v.dtype), "shape": list(v.shape), "data": base64.b64encode(v.tobytes()).decode()}
             for k, v in feed(model).items()}
    (tmp_path / "feeds.json").write_text(json.dumps(feeds))
    out = node(node_app, NODE_RUN % {"loader": loader.as_posix(), "folder": folder.as_posix()},
               str(tmp_path / "feeds.json"))
    expected = plain_outputs(folder, model)
    assert list(out) == [o["name"] for o in manifest.read(folder)[0].io["outputs"]]
    for (name, got), ref in zip(out.items(), expected, strict=True):
        arr = np.frombuffer(base64.b64decode(got["data"]), dtype=ref.dtype).reshape(got["dims"])
        np.testing.assert_array_equal(arr, ref, err_msg=name)


def test_node_loader_refuses_providers_onnxruntime_node_lacks(dist: Path, node_app: Path, tmp_path: Path) -> None:
    import dataclasses

    m, _ = manifest.read(dist / "fp32" / "tiny_cnn")
    ov = dataclasses.replace(m, target="openvino", providers=[
        {"name": "OpenVINOExecutionProvider", "options": {"device_type": "CPU"}},
        {"name": "CPUExecutionProvider", "options": {}}])
    files = loaders.render(ov, "onnxruntime-openvino==1.24.1")
    assert not next(lf for lf in loaders.describe(files, ov) if lf.language == "node").runs_target
    loader = node_app / "loader_openvino.mjs"
    loader.write_text(files[loaders.NODE])
    out = node(node_app, f"""
import {{ load }} from '{loader.as_posix()}';
const folder = '{(dist / "fp32" / "tiny_cnn").as_posix()}';
try {{ await load({{ folder }}); console.log(JSON.stringify('loaded')); }}
catch (e) {{ console.log(JSON.stringify([e.name, e.code, e.message])); }}
""")
    assert out[:2] == ["ProviderUnavailableError", "provider_unavailable"]
    assert "onnxruntime-node does not ship" in out[2] and "Python loader" in out[2]


NODE_CASES = """
import { LoaderError, load } from '%(loader)s';
const out = {};
for (const [name, folder, key] of JSON.parse(process.argv[2])) {
  try { await load({ folder, key: Buffer.from(key, 'base64') }); out[name] = 'ok'; }
  catch (e) { out[name] = e instanceof LoaderError ? e.code : `crash:${e}`; }
}
console.log(JSON.stringify(out));
"""


def test_node_loader_checks_external_data_in_one_pass(dist: Path, node_app: Path, tmp_path: Path) -> None:
    """The Node loader's one pass (read, hash, decrypt each piece) gives the same verdicts as the Python one."""
    src = dist / "ext" / "tiny_transformer"
    cases, expected = [], {}
    for name in ("intact", "bitflip", "forged-under-the-app-key", "bitflip-and-wrong-key", "signed-corrupt-chunk",
                 "signed-forgery"):
        folder = tmp_path / name
        shutil.copytree(src, folder)
        data = folder / "model.onnx.data.enc"
        if "forge" in name:
            _forge_weights(folder)
        elif name != "intact":
            ct = bytearray(data.read_bytes())
            ct[len(ct) // 2] ^= 0x10
            data.write_bytes(ct)
        if name.startswith("signed"):
            _resign(folder, lambda doc, f=folder: _set_file(doc, f, "model.onnx.data.enc"))
        key = bytes(32) if "wrong-key" in name else TEST_KEY
        cases.append([name, folder.as_posix(), base64.b64encode(key).decode()])
        expected[name] = {"intact": "ok", "signed-corrupt-chunk": "corrupt", "signed-forgery": "ok"}.get(name,
                                                                                                       "tampered")
    loader = node_app / "loader_ext_cases.mjs"
    shutil.copy(src / "loader" / loaders.NODE, loader)
    assert node(node_app, NODE_CASES % {"loader": loader.as_posix()}, json.dumps(cases)) == expected


# ------------------------------------------------------- Node: format 3, pieces checked on worker threads

@pytest.fixture(scope="module")
def pieced(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """Two artifacts with enough pieces for the Node loader's worker pool: `mlp`, 24 MiB of external data (1 MiB
    chunks: the container header, then 7 pieces of 4 chunks, the last shorter) beside a graph of 2 pieces (done on
    the main thread), and `mlpe`, the same kind of model with its 20 MiB of weights in the graph (6 pieces)."""
    from tests.bigmodels import mlp

    root = tmp_path_factory.mktemp("pieced")
    text = '[project]\nname = "t"\nversion = "1"\n\n'
    for name, layers, embedded in (("mlp", 6, False), ("mlpe", 5, True)):
        src = mlp(root / name, layers=layers, width=1024, embedded=embedded)
        text += f'[models.{name}]\npath = "{src}"\ninputs = "{src.parent / "inputs.npz"}"\n'
    built = _build_fp32(root, text)
    return {name: built / name for name in ("mlp", "mlpe")}


NODE_PIECES = """
import ort from 'onnxruntime-node';
let created = 0;
const create = ort.InferenceSession.create;
ort.InferenceSession.create = (...a) => { created++; return create.call(ort.InferenceSession, ...a); };
const out = {};
for (const [name, folder, key, loader] of JSON.parse(process.argv[2])) {
  const before = created;
  const { LoaderError, load } = await import(loader);
  try {
    const m = await load({ folder, key: Buffer.from(key, 'base64') });
    const x = new ort.Tensor('float32', new Float32Array(2 * 1024).map((_, i) => Math.sin(i)), [2, 1024]);
    const y = (await m.run({ x })).y;
    const bytes = Buffer.from(y.data.buffer, y.data.byteOffset, y.data.byteLength);
    out[name] = { code: 'ok', workers: m.timings.workers, y: bytes.toString('base64') };
  } catch (e) {
    out[name] = { code: e instanceof LoaderError ? e.code : `crash:${e}`, message: String(e.message) };
  }
  out[name].sessions = created - before;
}
console.log(JSON.stringify(out));
"""


def _flip(path: Path, at: int) -> None:
    with open(path, "r+b") as f:
        f.seek(at)
        byte = f.read(1)[0]
        f.seek(at)
        f.write(bytes([byte ^ 0x40]))


def test_node_loader_checks_pieces_on_worker_threads(pieced: dict[str, Path], node_app: Path,
                                                     tmp_path: Path) -> None:
    """A format-3 artifact with many pieces: the Node loader checks and decrypts them on a pool of worker threads
    (the external data into one shared buffer, the graph posted back to the main thread) and gives the Python
    loader's outputs; a tampered byte in the first, a middle or the last piece, or in the header piece, is refused
    (`tampered`, naming the piece) before any session is created; a chunk that fails after its piece checked out
    (re-signed) is `corrupt`, a forgery under the app's key `tampered`, and the wrong key `wrong_key` only when
    every piece checked out; the same artifact as format 2 (no pieces) still loads, with the same outputs."""
    data_name = "model.onnx.data.enc"
    doc = json.loads((pieced["mlp"] / "manifest.json").read_text())
    entry = next(f for f in doc["artifact"]["files"] if f["name"] == data_name)
    spans = pieces.spans(entry["size"], entry["pieces"]["head"], entry["pieces"]["size"])
    assert entry["pieces"]["head"] == container.HEADER and len(spans) >= 6  # the header, then >= 5 pieces
    graph_pieces = json.loads((pieced["mlpe"] / "manifest.json").read_text())["artifact"]["files"][0]["pieces"]
    assert len(graph_pieces["sha256"]) >= 5
    middle = len(spans) // 2
    edits: dict[str, tuple[str, Callable[[Path], None], str]] = {
        "intact": ("mlp", lambda d: None, "ok"),
        "first-piece": ("mlp", lambda d: _flip(d / data_name, spans[1][0] + 5), "tampered:piece 1 of"),
        "middle-piece": ("mlp", lambda d: _flip(d / data_name, spans[middle][0] + spans[middle][1] // 2),
                         f"tampered:piece {middle} of"),
        "last-piece": ("mlp", lambda d: _flip(d / data_name, entry["size"] - 1), f"tampered:piece {len(spans) - 1} of"),
        "header-piece": ("mlp", lambda d: _flip(d / data_name, 60), "tampered:piece 0 of"),
        "signed-corrupt-chunk": ("mlp", lambda d: (_flip(d / data_name, spans[middle][0] + 100), _resign(
            d, lambda doc: _set_file(doc, d, data_name))), "corrupt"),
        "forged-under-the-app-key": ("mlp", _forge_weights, "tampered"),
        "graph-intact": ("mlpe", lambda d: None, "ok"),
        "graph-middle-piece": ("mlpe", lambda d: _flip(d / "model.onnx.enc", (5 << 20) + 77), "tampered:piece"),
        "format-2": ("mlp", lambda d: _resign(d, _format_2), "ok"),
        "graph-format-2": ("mlpe", lambda d: _resign(d, _format_2), "ok"),
    }
    app = {}
    for model, folder in pieced.items():  # apps embed the generated loader
        app[model] = (node_app / f"loader_pieces_{model}_{os.getpid()}.mjs").as_posix()
        shutil.copy(folder / "loader" / loaders.NODE, app[model])
    cases = []
    for name, (model, edit, _) in edits.items():
        folder = tmp_path / name
        shutil.copytree(pieced[model], folder)
        edit(folder)
        cases.append([name, folder.as_posix(), base64.b64encode(TEST_KEY).decode(), app[model]])
    for name, folder in (("wrong-key", tmp_path / "intact"), ("wrong-key-and-last-piece", tmp_path / "last-piece")):
        cases.append([name, folder.as_posix(), base64.b64encode(bytes(32)).decode(), app["mlp"]])
    try:
        got = node(node_app, NODE_PIECES, json.dumps(cases))
    finally:
        for path in app.values():
            Path(path).unlink()
    expected = {name: want for name, (_, _, want) in edits.items()}
    expected |= {"wrong-key": "wrong_key", "wrong-key-and-last-piece": f"tampered:piece {len(spans) - 1} of"}
    for name, want in expected.items():
        code, _, text = want.partition(":")
        assert got[name]["code"] == code, (name, got[name])
        assert text in got[name].get("message", ""), (name, got[name])
        assert got[name]["sessions"] == (code == "ok"), (name, got[name])  # refused before any session
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    assert got["intact"]["workers"] == min(cores, len(spans) - 1)
    assert got["graph-intact"]["workers"] == min(cores, len(graph_pieces["sha256"]) - 1)
    assert got["format-2"]["workers"] == got["graph-format-2"]["workers"] == 0  # the one-pass path
    x = {"x": np.sin(np.arange(2 * 1024, dtype=np.float32)).reshape(2, 1024)}
    for model, names in (("mlp", ("intact", "format-2")), ("mlpe", ("graph-intact", "graph-format-2"))):
        mod: Any = loaders.import_python_loader(loaders.python_path(pieced[model], model))
        want = mod.load(key=TEST_KEY, folder=pieced[model]).run(x)["y"]
        assert want.any()
        assert got[names[0]]["y"] == got[names[1]]["y"]  # the worker pass and the one pass: the same bytes
        # onnxruntime-node 1.30 against the Python loader's onnxruntime: the same model, sums in another order
        y = np.frombuffer(base64.b64decode(got[names[0]]["y"]), dtype=np.float32).reshape(want.shape)
        np.testing.assert_allclose(y, want, rtol=1e-4, atol=1e-5, err_msg=model)


# A signed manifest whose piece digests do not fit the file (only a signer can write one: a bug, or a tool other
# than ortbuild): each loader must refuse it as `tampered`, never crash, raise a raw exception or hang
ODD_LAYOUTS: dict[str, Callable[[dict[str, Any]], None]] = {
    "size-zero": lambda f: f["pieces"].update(size=0),
    "size-negative": lambda f: f["pieces"].update(size=-4096),
    "size-text": lambda f: f["pieces"].update(size=str(f["pieces"]["size"])),
    "size-fraction": lambda f: f["pieces"].update(size=f["pieces"]["size"] + 0.5),
    "head-negative": lambda f: f["pieces"].update(head=-5),
    "head-past-the-end": lambda f: f["pieces"].update(head=f["size"] + 1),
    "head-text": lambda f: f["pieces"].update(head="103"),
    "digests-not-a-list": lambda f: f["pieces"].update(sha256=f["pieces"]["sha256"][0]),
    "pieces-empty-object": lambda f: f.update(pieces={}),
    "pieces-a-list": lambda f: f.update(pieces=[]),
    "pieces-zero": lambda f: f.update(pieces=0),
}

NODE_LAYOUTS = """
const { LoaderError, load } = await import(process.argv[2]);
const out = {};
for (const folder of JSON.parse(process.argv[3])) {
  try { await load({ folder, key: Buffer.from(process.argv[4], 'base64') }); out[folder] = 'ok'; }
  catch (e) { out[folder] = e instanceof LoaderError ? `${e.code}:${e.message}` : `crash:${e}`; }
}
console.log(JSON.stringify(out));
"""


def test_signed_pieces_that_do_not_fit_the_file_are_refused_by_both_loaders(dist: Path, node_app: Path,
                                                                            tmp_path: Path) -> None:
    """Piece digests signed with the real key but malformed (a piece size of 0, below zero or not an integer, a head
    below zero, past the file's end or not an integer, digests that are not a list, pieces that are not an object)
    are refused by the Python and the Node loader as `tampered` ("do not fit", what the browser loader says), as
    ortbuild refuses the manifest: never a raw exception (ValueError, TypeError, RangeError), a hang or a crash."""
    src = dist / "fp32" / "tiny_cnn"
    mod: Any = loaders.import_python_loader(loaders.python_path(src, "tiny_cnn"))
    folders = []
    for name, edit in ODD_LAYOUTS.items():
        folder = tmp_path / name
        shutil.copytree(src, folder)
        _resign(folder, lambda doc, e=edit: e(doc["artifact"]["files"][0]))
        folders.append(folder.as_posix())
        with pytest.raises(ArtifactError):
            manifest.read(folder)
        with pytest.raises(mod.TamperedError, match="do not fit"):
            mod.load(key=TEST_KEY, folder=folder)
    loader = node_app / f"loader_layouts_{os.getpid()}.mjs"
    shutil.copy(src / "loader" / loaders.NODE, loader)
    try:
        got = node(node_app, NODE_LAYOUTS, loader.as_posix(), json.dumps(folders), base64.b64encode(TEST_KEY).decode())
    finally:
        loader.unlink()
    assert {Path(k).name: v.partition(" (")[0] for k, v in got.items()} == {
        name: f"tampered:{tmp_path / name / 'model.onnx.enc'}: its signed pieces do not fit its "
              f"{(src / 'model.onnx.enc').stat().st_size} bytes" for name in ODD_LAYOUTS}


def _format_2(doc: dict[str, Any]) -> None:
    """A format-3 manifest as the previous format wrote it: format_version 2, no piece digests."""
    doc["format_version"] = 2
    for f in doc["artifact"]["files"]:
        f.pop("pieces", None)


# --------------------------------------------------------------------------------------- tamper suite

CHUNK_LOG2 = 12


def container_mutations(ct: bytes) -> Iterator[tuple[str, bytes, bytes, str]]:
    """(case, container, key, expected error code): >= 1,000 mutations of a 5-chunk container."""
    rng = random.Random(1234)
    csize, h = 1 << CHUNK_LOG2, container.HEADER
    header = container.parse_header(ct)
    spans = [(h + i * (csize + 16), min(csize, header.size - i * csize) + 16) for i in range(header.chunks)]

    def region(pos: int) -> str:
        if pos < 10:
            return "unsupported_format"  # magic, version, algorithm
        if 27 <= pos < 43:
            return "wrong_key"            # the key id names another key
        return "corrupt"

    for pos in sorted(rng.sample(range(len(ct)), 800)) + list(range(0, h)):
        flipped = bytearray(ct)
        flipped[pos] ^= 1 << rng.randrange(8)
        yield f"bitflip@{pos}", bytes(flipped), TEST_KEY, region(pos)
    for start, length in spans:
        for cut in (start, start + 1, start + length // 2, start + length - 16, start + length - 1):
            yield f"truncate@{cut}", ct[:cut], TEST_KEY, "corrupt"
    for cut in (0, 1, 8, 27, 60, 102):
        yield f"truncate@{cut}", ct[:cut], TEST_KEY, "corrupt"  # shorter than the header
    for extra in (b"\0", bytes(16), os.urandom(100), ct[h:h + csize + 16]):
        yield f"append{len(extra)}", ct + extra, TEST_KEY, "corrupt"
    chunks = [ct[s:s + n] for s, n in spans]
    for i in range(len(chunks)):
        for j in range(len(chunks)):
            if i != j and len(chunks[i]) == len(chunks[j]):
                swapped = list(chunks)
                swapped[i], swapped[j] = swapped[j], swapped[i]
                yield f"swap{i}-{j}", ct[:h] + b"".join(swapped), TEST_KEY, "corrupt"
        yield f"drop{i}", ct[:h] + b"".join(c for k, c in enumerate(chunks) if k != i), TEST_KEY, "corrupt"
        dup = list(chunks)
        dup.insert(i, chunks[i])
        yield f"dup{i}", ct[:h] + b"".join(dup), TEST_KEY, "corrupt"
    for field, at, value in (("chunk_log2", 10, bytes([13])), ("flags", 11, bytes([1])), ("flags", 11, bytes([2])),
                             ("size", 12, (header.size - 1).to_bytes(8, "big")), ("version", 8, bytes([2])),
                             ("size", 12, (header.size + 4096).to_bytes(8, "big"))):
        edited = bytearray(ct)
        edited[at:at + len(value)] = value
        yield f"header-{field}", bytes(edited), TEST_KEY, "unsupported_format" if field == "version" else "corrupt"
    other = bytes(range(200, 232))
    yield "wrong-key", ct, other, "wrong_key"
    relabeled = bytearray(ct)
    relabeled[27:43] = container.key_id(other)
    yield "wrong-key-id", bytes(relabeled), TEST_KEY, "wrong_key"
    yield "wrong-key-id-and-key", bytes(relabeled), other, "corrupt"  # the id fits, the slot does not open
    yield "other-container", container.encrypt(os.urandom(len(ct)), other, chunk_log2=CHUNK_LOG2), TEST_KEY, \
        "wrong_key"


def artifact_mutations(folder: Path, other_folder: Path) -> Iterator[tuple[str, Callable[[Path], None], str]]:
    """(case, how to mutate a copy of the artifact directory, expected error code)."""
    rng = random.Random(99)
    enc = (folder / "model.onnx.enc").read_bytes()
    text = (folder / "manifest.json").read_bytes()

    def write(name: str, data: bytes) -> Callable[[Path], None]:
        return lambda d: (d / name).write_bytes(data)

    for pos in rng.sample(range(len(enc)), 60):
        flipped = bytearray(enc)
        flipped[pos] ^= 1 << rng.randrange(8)
        yield f"artifact-bitflip@{pos}", write("model.onnx.enc", bytes(flipped)), "tampered"
    for cut in (0, 103, 4096, len(enc) // 2, len(enc) - 1):
        yield f"artifact-truncate@{cut}", write("model.onnx.enc", enc[:cut]), "tampered"
    yield "artifact-append", write("model.onnx.enc", enc + b"x"), "tampered"
    yield "artifact-missing", lambda d: (d / "model.onnx.enc").unlink(), "tampered"
    yield "artifact-from-other-build", write("model.onnx.enc", container.encrypt(os.urandom(9000), TEST_KEY)), \
        "tampered"
    for pos in rng.sample(range(len(text)), 40):
        flipped = bytearray(text)
        flipped[pos] ^= 1 << rng.randrange(7)
        yield f"manifest-bitflip@{pos}", write("manifest.json", bytes(flipped)), "bad_signature"
    sig = base64.b64decode((folder / "manifest.sig").read_bytes())
    for pos in range(0, 64, 4):
        flipped = bytearray(sig)
        flipped[pos] ^= 1
        yield f"signature-bitflip@{pos}", write("manifest.sig", base64.b64encode(bytes(flipped))), "bad_signature"
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

    attacker = Ed25519PrivateKey.generate()
    doc = json.loads(text)
    doc["notes"] = ["edited by someone else"]
    forged = json.dumps(doc).encode()
    yield "manifest-resigned-with-another-key", lambda d: (
        (d / "manifest.json").write_bytes(forged),
        (d / "manifest.sig").write_bytes(base64.b64encode(attacker.sign(forged)))), "bad_signature"
    yield "signature-missing", lambda d: (d / "manifest.sig").unlink(), "tampered"
    yield "signature-not-base64", write("manifest.sig", b"%%%"), "bad_signature"
    other_text, other_sig = (other_folder / "manifest.json").read_bytes(), (other_folder / "manifest.sig").read_bytes()
    yield "manifest-of-another-model", lambda d: (
        (d / "manifest.json").write_bytes(other_text), (d / "manifest.sig").write_bytes(other_sig)), "tampered"


def _python_code(fn: Callable[[], Any], mod: Any) -> str:
    try:
        fn()
    except mod.LoaderError as e:
        return str(e.code)
    except Exception as e:  # a crash: never acceptable
        return f"crash:{type(e).__name__}:{e}"
    return "ok"


NODE_TAMPER = """
import { LoaderError, decryptContainer, load } from '%(loader)s';
import { readFileSync } from 'node:fs';
const cases = JSON.parse(readFileSync(process.argv[2], 'utf8'));
const out = {};
for (const c of cases) {
  try {
    if (c.kind === 'container') decryptContainer(readFileSync(c.file), Buffer.from(c.key, 'base64'));
    else await load({ folder: c.folder, key: Buffer.from(c.key, 'base64') });
    out[c.name] = 'ok';
  } catch (e) {
    // a LoaderError carries one of the loader's codes; anything else (a TypeError, node's ERR_*) is a crash
    out[c.name] = e instanceof LoaderError ? e.code : `crash:${e}`;
  }
}
console.log(JSON.stringify(out));
"""


def test_tamper_suite_through_both_loaders(dist: Path, node_app: Path, tmp_path: Path) -> None:
    folder, other = dist / "fp32" / "tiny_cnn", dist / "fp32" / "tiny_lstm"
    mod: Any = loaders.import_python_loader(loaders.python_path(folder, "tiny_cnn"))
    plain = os.urandom(5 * 4096 - 300)
    ct = container.encrypt(plain, TEST_KEY, chunk_log2=CHUNK_LOG2)
    assert mod.decrypt_container(ct, TEST_KEY) == plain  # the loader reads what ortbuild writes
    cases: list[dict[str, str]] = []
    expected: dict[str, str] = {}
    python: dict[str, str] = {}
    blobs = tmp_path / "blobs"
    blobs.mkdir()
    for i, (name, data, key, code) in enumerate(container_mutations(ct)):
        name = f"{name}#{i}"
        (blobs / f"{i}.bin").write_bytes(data)
        cases.append({"kind": "container", "name": name, "file": str(blobs / f"{i}.bin"),
                      "key": base64.b64encode(key).decode()})
        expected[name] = code
        python[name] = _python_code(lambda d=data, k=key: mod.decrypt_container(d, k), mod)
    for i, (name, mutate, code) in enumerate(artifact_mutations(folder, other)):
        name = f"{name}#{i}"
        copy = tmp_path / "artifacts" / str(i)
        shutil.copytree(folder, copy)
        mutate(copy)
        cases.append({"kind": "artifact", "name": name, "folder": str(copy),
                      "key": base64.b64encode(TEST_KEY).decode()})
        expected[name] = code
        python[name] = _python_code(lambda c=copy: mod.load(key=TEST_KEY, folder=c), mod)
    wrong = tmp_path / "artifacts" / "wrong-key"
    shutil.copytree(folder, wrong)
    cases.append({"kind": "artifact", "name": "load-with-wrong-key", "folder": str(wrong),
                  "key": base64.b64encode(bytes(32)).decode()})
    expected["load-with-wrong-key"] = python["load-with-wrong-key"] = "wrong_key"
    python["load-with-wrong-key"] = _python_code(lambda: mod.load(key=bytes(32), folder=wrong), mod)
    assert len(expected) >= 1000, len(expected)

    loader = node_app / "loader_tamper.mjs"
    shutil.copy(folder / "loader" / loaders.NODE, loader)
    (tmp_path / "cases.json").write_text(json.dumps(cases))
    nodejs = node(node_app, NODE_TAMPER % {"loader": loader.as_posix()}, str(tmp_path / "cases.json"))
    for got, lang in ((python, "python"), (nodejs, "node")):
        wrong_codes = {n: (got[n], e) for n, e in expected.items() if got[n] != e}
        assert not wrong_codes, (lang, len(wrong_codes), dict(list(wrong_codes.items())[:10]))
    # and the untouched artifact still loads through both (the suite did not just break everything)
    assert _python_code(lambda: mod.load(key=TEST_KEY, folder=folder), mod) == "ok"


# --------------------------------------------------------------------------------- no plaintext on disk

def _needles(model: Path, folder: Path) -> list[bytes]:
    """64-byte pieces of the largest weights, from the source and from the artifact's decrypted graph."""
    pieces = []
    for m in (onnx.load(str(model)), onnx.load_model_from_string(bytes(container.decrypt(
            (folder / "model.onnx.enc").read_bytes(), TEST_KEY)))):
        inits = sorted((i for i in m.graph.initializer if len(i.raw_data) >= 256),
                       key=lambda i: -len(i.raw_data))[:3]
        pieces += [i.raw_data[len(i.raw_data) // 2:len(i.raw_data) // 2 + 64] for i in inits]
    assert len(pieces) >= 4
    return pieces


def test_no_plaintext_model_bytes_on_disk_after_build_and_load(tmp_path: Path, node_app: Path) -> None:
    """Everything the build and both loaders wrote (the project, the cwd, TMPDIR, the build's private dirs' root and
    new files in /dev/shm) is scanned for the weights' bytes. The private dirs go in a root of this test's own
    ($ORTBUILD_TMPDIR), so other tests' builds, running beside it, neither add to nor sweep what it scans."""
    root, cwd, tmpdir, private = tmp_path / "p", tmp_path / "cwd", tmp_path / "tmp", tmp_path / "private"
    for d in (root, cwd, tmpdir, private):
        d.mkdir()
    m = "tiny_transformer"
    (root / "targets.toml").write_text(f'[project]\nname = "t"\nversion = "1"\n[models.{m}]\n'
                                       f'path = "{MODELS / m}.onnx"\ninputs = "{MODELS / m}.inputs.npz"\n'
                                       + TARGETS.replace("    ", "").replace("RUNTIME", here_runtime())
                                       .replace('models = ["tiny_lstm"]', f'models = ["{m}"]'))
    shm = Path("/dev/shm")
    before = set(shm.iterdir()) if shm.exists() else set()
    env = {**os.environ, "TMPDIR": str(tmpdir), "ORTBUILD_TMPDIR": str(private)}
    build = subprocess.Popen([sys.executable, "-m", "ortbuild", "build", "-c", str(root / "targets.toml")], cwd=cwd,
                             env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    _, err = build.communicate(timeout=600)
    assert build.returncode == 0, err[-3000:]
    folder = root / "dist" / "fp32" / m
    script = (f"import sys; sys.path.insert(0, {str(folder / 'loader')!r}); import ortbuild_{m}; "
              f"ortbuild_{m}.load()")
    subprocess.run([sys.executable, "-I", "-c", script], cwd=cwd, env=env, check=True, timeout=300)
    loader = node_app / "loader_scan.mjs"
    shutil.copy(folder / "loader" / loaders.NODE, loader)
    node(node_app, f"import {{ load }} from '{loader.as_posix()}'; await load({{ folder: '{folder.as_posix()}' }}); "
                   "console.log('1');")
    needles = _needles(MODELS / f"{m}.onnx", folder)
    written = [p for d in (root, cwd, tmpdir, private) for p in d.rglob("*") if p.is_file()]
    written += [p for p in (set(shm.iterdir()) - before if shm.exists() else set()) if p.is_file()]
    assert list(private.iterdir()) == []  # the build's private dirs are gone
    assert not [p for p in (set(shm.iterdir()) - before if shm.exists() else set())
                if p.name.startswith(f"ortbuild-{build.pid}-")]
    scanned = 0
    for p in written:
        if p.suffix in (".onnx", ".npz") and p.is_relative_to(MODELS):
            continue
        try:
            data = p.read_bytes()
        except FileNotFoundError:  # a new file in /dev/shm that its (other test's) process has removed since
            assert p.is_relative_to(shm), p
            continue
        scanned += len(data)
        hits = [n for n in needles if n in data]
        assert not hits, f"{p} holds plaintext weight bytes"
        if p.is_relative_to(root / "dist") and p.suffix == ".enc":
            with pytest.raises(Exception):  # noqa: B017 - any protobuf/parse error: it is not an ONNX model
                onnx.load_model_from_string(data)
    assert scanned > 1_000_000  # the artifacts themselves were scanned
    assert set(os.listdir(tmpdir)) <= {".ses"}


def test_rekey_rewraps_without_reencrypting(dist: Path, tmp_path: Path) -> None:
    from tests.conftest import run_cli

    copy = tmp_path / "fp32"
    shutil.copytree(dist / "fp32", copy)
    made = keygen.keygen(tmp_path / "new")
    old_file = tmp_path / "old.key"
    old_file.write_text(base64.b64encode(TEST_KEY).decode() + "\n")
    old_file.chmod(0o600)  # key files readable by others are refused
    before = (copy / "tiny_cnn" / "model.onnx.enc").read_bytes()
    proc = run_cli("rekey", str(copy), "--old-key-file", str(old_file), "--new-key-file", made["encryption_key"])
    assert proc.returncode == 0, proc.stderr
    after = (copy / "tiny_cnn" / "model.onnx.enc").read_bytes()
    assert after[container.HEADER:] == before[container.HEADER:] and after[27:43] != before[27:43]
    mod: Any = loaders.import_python_loader(loaders.python_path(copy / "tiny_cnn", "tiny_cnn"))
    new_key = keys.encryption_key(file=made["encryption_key"])
    assert new_key is not None
    mod.load(key=new_key.secret, folder=copy / "tiny_cnn").run(feed("tiny_cnn"))
    with pytest.raises(mod.WrongKeyError):
        mod.load(key=TEST_KEY, folder=copy / "tiny_cnn")
    assert base64.b64encode(new_key.secret).decode() not in proc.stdout + proc.stderr


# ------------------------------------------------------------------------------------ rollback protection

def _build_one(root: Path, model: str = "tiny_cnn", epoch: int | None = None, model_path: Path | None = None,
               inputs: Path | None = None) -> Path:
    """Build one model for the fp32 target in `root` (the suite's keys); the artifact directory."""
    root.mkdir(parents=True, exist_ok=True)
    text = '[project]\nname = "t"\nversion = "1"\n' + (f"epoch = {epoch}\n" if epoch is not None else "")
    text += (f'[models.{model}]\npath = "{model_path or MODELS / f"{model}.onnx"}"\n'
             f'inputs = "{inputs or MODELS / f"{model}.inputs.npz"}"\n')
    return _build_fp32(root, text) / model


def _build_fp32(root: Path, text: str) -> Path:
    """Build the project whose targets.toml starts with `text` (project and models) for one fp32 target, with
    the suite's keys; dist/fp32."""
    text += f'[targets.fp32]\nruntime = "{here_runtime()}"\nproviders = ["CPUExecutionProvider"]\n'
    (root / "targets.toml").write_text(text)
    project = config.load(root / "targets.toml")
    results = Builder(project, root / "dist", secrets=keys.read_secrets(),
                      progress=lambda j, m: None).run(plan.jobs(project))
    assert all(r.status == BUILT for r in results), [(r.target, r.model, r.reason) for r in results]
    return root / "dist" / "fp32"


def test_an_artifact_with_the_old_python_loader_name_is_rebuilt_whole(tmp_path: Path) -> None:
    """An artifact an older ortbuild built (its Python loader ortbuild_loader.py, another loader_templates part in
    its build key) still opens through its own loader, and a release check finds that loader by its manifest; the
    next build rebuilds it, saying why, and leaves the per-model loader only: no stale ortbuild_loader.py."""
    folder = _build_one(tmp_path / "p")
    new, old = loaders.python_path(folder, "tiny_cnn"), folder / "loader" / loaders.LEGACY_PYTHON
    new.rename(old)

    def as_built_before(doc: dict[str, Any]) -> None:
        for lf in doc["loaders"]:
            if lf["language"] == "python":
                lf["name"] = f"loader/{loaders.LEGACY_PYTHON}"
        doc["build_inputs"]["loader_templates"] = "0" * 16
        doc["build_key"] = "0" * 64

    _resign(folder, as_built_before)
    m, _ = manifest.read(folder)
    assert loaders.python_loader_of(folder, m) == old
    before: Any = loaders.import_python_loader(old)
    np.testing.assert_array_equal(before.load(folder=folder).run(feed("tiny_cnn"))["logits"],
                                  plain_outputs(folder, "tiny_cnn")[0])
    said: list[str] = []
    project = config.load(tmp_path / "p" / "targets.toml")
    results = Builder(project, tmp_path / "p" / "dist", secrets=keys.read_secrets(),
                      progress=lambda j, e: said.append(e.text())).run(plan.jobs(project))
    assert [r.status for r in results] == [BUILT], [(r.status, r.reason) for r in results]
    assert any("rebuilding" in line and "loader_templates" in line for line in said), said
    assert sorted(p.name for p in (folder / "loader").iterdir()) == sorted(
        [loaders.NODE, loaders.NODE_TYPES, loaders.WEB, "ortbuild_tiny_cnn.py"])
    m, _ = manifest.read(folder)
    assert loaders.python_loader_of(folder, m) == new
    assert [lf.name for lf in m.loaders if lf.language == "python"] == ["loader/ortbuild_tiny_cnn.py"]
    after: Any = loaders.import_python_loader(new)
    np.testing.assert_array_equal(after.load(folder=folder).run(feed("tiny_cnn"))["logits"],
                                  plain_outputs(folder, "tiny_cnn")[0])


NODE_LOAD_CASES = """
import { LoaderError, load } from '%(loader)s';
const out = {};
for (const [name, folder, opts] of JSON.parse(process.argv[2])) {
  try { await load({ folder, ...opts }); out[name] = 'ok'; }
  catch (e) { out[name] = e instanceof LoaderError ? e.code : `crash:${e}`; }
}
console.log(JSON.stringify(out));
"""


def test_rollback_an_older_signed_artifact_is_refused_by_both_loaders(tmp_path: Path, node_app: Path) -> None:
    """An app ships the loader generated at epoch 2. Putting the epoch-1 artifact (validly signed, same keys) in its
    folder gives `rolled_back` in both loaders; epoch 2 and later load; a manifest without `epoch` counts as 0; the
    caller's own minimum (min_epoch / minEpoch) raises the floor."""
    old = _build_one(tmp_path / "v1", epoch=1)
    new = _build_one(tmp_path / "v2", epoch=2)
    assert json.loads((old / "manifest.json").read_bytes())["epoch"] == 1
    assert json.loads((new / "manifest.json").read_bytes())["epoch"] == 2
    app = node_app / f"app_rollback_{os.getpid()}"  # the app: onnxruntime-node resolves from here, no artifact
    shutil.rmtree(app, ignore_errors=True)
    app.mkdir()
    py_file = loaders.python_file("tiny_cnn")
    for name in (py_file, loaders.NODE):
        shutil.copy(new / "loader" / name, app / name)
    assert "MIN_EPOCH = 2" in (app / py_file).read_text()
    model = tmp_path / "app-model"  # the folder the app loads from: first the old artifact is dropped in
    shutil.copytree(old, model)
    newer = tmp_path / "epoch3"
    shutil.copytree(new, newer)
    _resign(newer, lambda doc: doc.update(epoch=3))
    no_epoch = tmp_path / "no-epoch"
    shutil.copytree(new, no_epoch)
    _resign(no_epoch, lambda doc: doc.pop("epoch"))
    cases: list[tuple[str, Path, dict[str, Any]]] = [
        ("epoch1", model, {}), ("epoch2", new, {}), ("epoch3", newer, {}), ("no-epoch", no_epoch, {}),
        ("epoch2-min3", new, {"min_epoch": 3}), ("epoch3-min3", newer, {"min_epoch": 3})]
    expected = {"epoch1": "rolled_back", "epoch2": "ok", "epoch3": "ok", "no-epoch": "rolled_back",
                "epoch2-min3": "rolled_back", "epoch3-min3": "ok"}
    mod: Any = loaders.import_python_loader(app / py_file)
    python = {name: _python_code(lambda f=folder, o=opts: mod.load(folder=f, **o), mod) for name, folder, opts in cases}
    assert python == expected
    with pytest.raises(mod.RolledBackError, match="epoch 1, older than the minimum 2"):
        mod.verify(model)
    assert mod.RolledBackError.code == "rolled_back"
    node_cases = [[n, f.as_posix(), {"minEpoch": o["min_epoch"]} if o else {}] for n, f, o in cases]
    out = node(node_app, NODE_LOAD_CASES % {"loader": (app / loaders.NODE).as_posix()}, json.dumps(node_cases))
    assert out == expected
    # the same older artifact is fine for the loader generated with it (the refusal comes from MIN_EPOCH)
    old_mod: Any = loaders.import_python_loader(loaders.python_path(old, "tiny_cnn"))
    assert _python_code(lambda: old_mod.load(folder=model), old_mod) == "ok"
    shutil.rmtree(app)


# ----------------------------------------------------------------------- files beside the artifact

def test_loaders_and_golden_files_beside_the_artifact_are_checked(dist: Path, node_app: Path,
                                                                   tmp_path: Path) -> None:
    """Every loader and golden file the signed manifest lists and that is present must be the signed one
    (`tampered` otherwise, through both loaders); absent ones are fine (an app may ship the artifact and one
    loader)."""
    import hashlib

    from onnx import numpy_helper

    src = dist / "fp32" / "tiny_cnn"
    base = tmp_path / "base"
    shutil.copytree(src, base)
    golden = base / "golden" / "test_data_set_0"
    golden.mkdir(parents=True)
    for i, (name, value) in enumerate(feed("tiny_cnn").items()):
        (golden / f"input_{i}.pb").write_bytes(numpy_helper.from_array(value, name).SerializeToString())
    (golden / "output_0.pb").write_bytes(numpy_helper.from_array(np.arange(10, dtype=np.float32), "logits")
                                         .SerializeToString())

    def sign_golden(doc: dict[str, Any]) -> None:
        doc["golden"] = [{"name": p.relative_to(base).as_posix(), "sha256": hashlib.sha256(p.read_bytes()).hexdigest(),
                          "size": p.stat().st_size} for p in sorted(golden.iterdir())]

    _resign(base, sign_golden)
    signed = json.loads((base / "manifest.json").read_bytes())
    assert len(signed["golden"]) == 2 and len(signed["loaders"]) == 4

    def flip(rel: str) -> Callable[[Path], None]:
        def go(d: Path) -> None:
            data = bytearray((d / rel).read_bytes())
            data[len(data) // 2] ^= 0x01
            (d / rel).write_bytes(data)
        return go

    mutations: dict[str, tuple[Callable[[Path], None], str]] = {
        "intact": (lambda d: None, "ok"),
        "golden-input-edited": (flip("golden/test_data_set_0/input_0.pb"), "tampered"),
        "golden-output-edited": (flip("golden/test_data_set_0/output_0.pb"), "tampered"),
        "golden-appended": (lambda d: (d / "golden/test_data_set_0/output_0.pb").write_bytes(
            (d / "golden/test_data_set_0/output_0.pb").read_bytes() + b"\0"), "tampered"),
        "golden-replaced-by-a-folder": (lambda d: ((d / "golden/test_data_set_0/output_0.pb").unlink(),
                                                   (d / "golden/test_data_set_0/output_0.pb").mkdir()), "tampered"),
        "python-loader-edited": (flip("loader/ortbuild_tiny_cnn.py"), "tampered"),
        "node-loader-edited": (flip("loader/ortbuild_loader.mjs"), "tampered"),
        "types-edited": (flip("loader/ortbuild_loader.d.ts"), "tampered"),
        "golden-absent": (lambda d: shutil.rmtree(d / "golden"), "ok"),
        "loaders-absent": (lambda d: shutil.rmtree(d / "loader"), "ok"),
        "all-absent": (lambda d: (shutil.rmtree(d / "golden"), shutil.rmtree(d / "loader")), "ok"),
    }
    app = tmp_path / "app"  # the loaders in use are the app's copies, not the files being edited
    app.mkdir()
    shutil.copy(loaders.python_path(src, "tiny_cnn"), app)
    mod: Any = loaders.import_python_loader(app / loaders.python_file("tiny_cnn"))
    cases, python = [], {}
    for name, (mutate, _) in mutations.items():
        folder = tmp_path / name
        shutil.copytree(base, folder)
        mutate(folder)
        python[name] = _python_code(lambda f=folder: mod.load(folder=f), mod)
        cases.append([name, folder.as_posix(), {}])
    expected = {name: code for name, (_, code) in mutations.items()}
    assert python == expected
    loader = node_app / "loader_side_files.mjs"
    shutil.copy(src / "loader" / loaders.NODE, loader)
    assert node(node_app, NODE_LOAD_CASES % {"loader": loader.as_posix()}, json.dumps(cases)) == expected


# ------------------------------------------------------------------------------- Node loader parity

NODE_OPTIONS_PROBE = """
import { readdirSync } from 'node:fs';
const threads = () => readdirSync('/proc/self/task').length;
const out = {};
for (const [name, loader, folder] of JSON.parse(process.argv[2])) {
  const { load } = await import(loader);
  const before = threads();
  try {
    const m = await load({ folder });
    out[name] = { ok: true, threads: threads() - before };
  } catch (e) { out[name] = { ok: false, name: e.name, code: e.code, message: String(e.message) }; }
}
console.log(JSON.stringify(out));
"""


def _render_variant(src: Path, dest: Path, **changes: Any) -> Path:
    """The Node loader of `src`'s artifact rendered from its manifest with `changes` (providers, session)."""
    import dataclasses

    m, _ = manifest.read(src)
    variant = dataclasses.replace(m, **changes)
    dest.write_text(loaders.render(variant, here_runtime())[loaders.NODE])
    return dest


def test_node_loader_hands_provider_options_to_onnx_runtime(dist: Path, node_app: Path) -> None:
    """Provider options reach ONNX Runtime: a WebGPU option (onnxruntime-node's binding forwards them) comes back
    in ORT's own error about that value; the same entry with a valid value fails differently (no GPU adapter here)
    or loads. Options onnxruntime-node 1.30 cannot hand over (all CUDA options but device_id) are refused, never
    dropped, and the manifest says the Node loader does not run such a target."""
    import dataclasses

    src = dist / "fp32" / "tiny_cnn"
    cpu = {"name": "CPUExecutionProvider", "options": {}}
    variants = {
        "webgpu-bogus": [{"name": "WebGpuExecutionProvider", "options": {"validationMode": "bogus"}}, cpu],
        "webgpu-valid": [{"name": "WebGpuExecutionProvider", "options": {"validationMode": "disabled"}}, cpu],
        "cuda-algo": [{"name": "CUDAExecutionProvider", "options": {"cudnn_conv_algo_search": "EXHAUSTIVE",
                                                                   "device_id": 0}}, cpu],
    }
    cases = []
    for name, providers in variants.items():
        loader = _render_variant(src, node_app / f"loader_opts_{name}.mjs", providers=providers)
        cases.append([name, loader.as_posix(), src.as_posix()])
    out = node(node_app, NODE_OPTIONS_PROBE, json.dumps(cases))
    assert out["webgpu-bogus"]["code"] == "loader_error"
    assert "Invalid validation mode: bogus" in out["webgpu-bogus"]["message"], out["webgpu-bogus"]
    assert out["webgpu-valid"]["ok"] or "Invalid validation mode" not in out["webgpu-valid"]["message"]
    assert out["webgpu-valid"]["ok"] or "adapter" in out["webgpu-valid"]["message"].lower(), out["webgpu-valid"]
    assert out["cuda-algo"]["code"] == "provider_unavailable"
    assert "CUDAExecutionProvider cudnn_conv_algo_search" in out["cuda-algo"]["message"]
    assert "device_id" not in out["cuda-algo"]["message"]  # device_id is handed over (deviceId)
    m, _ = manifest.read(src)
    cuda = dataclasses.replace(m, providers=variants["cuda-algo"])
    assert "cudnn_conv_algo_search" in loaders.node_refusal(cuda)
    assert loaders.node_refusal(dataclasses.replace(m, providers=variants["webgpu-bogus"])) == ""
    assert loaders.node_refusal(dataclasses.replace(m, providers=[
        {"name": "CUDAExecutionProvider", "options": {"device_id": 1}}, cpu])) == ""


def test_node_loader_hands_session_options_to_onnx_runtime(dist: Path, node_app: Path, tmp_path: Path) -> None:
    """The target's session options reach ONNX Runtime: intra_op_num_threads = 5 makes ORT start 4 more intra-op
    threads than intra_op_num_threads = 1 (counted in /proc/self/task around load()); load({ profile }) makes ORT
    write its trace at that prefix, naming the model's nodes; and with enable_cpu_mem_arena = false that trace
    reports no memory held by the CPU arena (it does with the arena on)."""
    src = dist / "fp32" / "tiny_cnn"
    m, _ = manifest.read(src)
    cases = []
    for name, n in (("warm-up", 1), ("one", 1), ("five", 5)):
        loader = _render_variant(src, node_app / f"loader_threads_{name}.mjs",
                                 session={**m.session, "intra_op_num_threads": n, "inter_op_num_threads": 1})
        cases.append([name, loader.as_posix(), src.as_posix()])
    out = node(node_app, NODE_OPTIONS_PROBE, json.dumps(cases))
    assert all(v["ok"] for v in out.values()), out
    assert out["five"]["threads"] - out["one"]["threads"] == 4, out
    graph = onnx.load_model_from_string(bytes(container.decrypt((src / "model.onnx.enc").read_bytes(), TEST_KEY)))
    feeds = {k: {"dtype": str(v.dtype), "shape": list(v.shape), "data": base64.b64encode(v.tobytes()).decode()}
             for k, v in feed("tiny_cnn").items()}
    (tmp_path / "feeds.json").write_text(json.dumps(feeds))
    held = {}
    for arena in (True, False):
        loader = _render_variant(src, node_app / f"loader_profile_{arena}.mjs",
                                 session={**m.session, "enable_cpu_mem_arena": arena})
        prefix = tmp_path / f"trace_{arena}" / "tiny"
        prefix.parent.mkdir()
        script = NODE_RUN.replace("await load({ folder: '%(folder)s' })",
                                  f"await load({{ folder: '%(folder)s', profile: '{prefix.as_posix()}' }})")
        script = script.replace("console.log(JSON.stringify(res));",
                                "m.endProfiling();\nconsole.log(JSON.stringify(res));")
        node(node_app, script % {"loader": loader.as_posix(), "folder": src.as_posix()}, str(tmp_path / "feeds.json"))
        traces = list(prefix.parent.glob("tiny_*.json"))  # ORT wrote its trace where the profile option said
        assert len(traces) == 1, list(prefix.parent.iterdir())
        ops = [e for e in json.loads(traces[0].read_text()) if e.get("cat") == "Node"]
        assert {e["name"].removesuffix("_kernel_time") for e in ops} <= {n.name for n in graph.graph.node}
        assert ops
        held[arena] = max(int(e["args"].get("mem_arena_held", 0)) for e in ops)
    # enable_cpu_mem_arena reaches ORT: its profiler reports memory held by the CPU arena only when it is on
    assert held[True] > 0 and held[False] == 0, held


def test_node_loader_imports_from_dist_and_from_a_copy(dist: Path, node_app: Path, tmp_path: Path) -> None:
    """The generated Node loader resolves onnxruntime-node from its own folder, else from the working directory:
    imported straight from dist/ and from a copy outside any node_modules tree it loads when run from the app;
    where neither has onnxruntime-node it says so, naming both places."""
    src = dist / "fp32" / "tiny_cnn"
    elsewhere = tmp_path / "elsewhere" / "vendor"
    elsewhere.mkdir(parents=True)
    shutil.copy(src / "loader" / loaders.NODE, elsewhere / "loader.mjs")
    script = """
import { load } from '%s';
const m = await load({ folder: '%s' });
console.log(JSON.stringify({ inputs: m.inputs.map((i) => i.name), ort: typeof m.ort.Tensor }));
"""
    for loader in (src / "loader" / loaders.NODE, elsewhere / "loader.mjs"):
        out = node(node_app, script % (loader.as_posix(), src.as_posix()))
        assert out == {"inputs": ["image"], "ort": "function"}
    # neither the loader's folder nor the working directory has onnxruntime-node
    bare = tmp_path / "bare"
    bare.mkdir()
    probe = bare / "probe.mjs"
    probe.write_text(f"""
import {{ load }} from '{(elsewhere / "loader.mjs").as_posix()}';
try {{ await load({{ folder: '{src.as_posix()}' }}); console.log(JSON.stringify('loaded')); }}
catch (e) {{ console.log(JSON.stringify([e.name, e.code, e.message])); }}
""")
    proc = subprocess.run(["node", str(probe)], cwd=bare, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    name, code, message = json.loads(proc.stdout.strip().splitlines()[-1])
    assert (name, code) == ("ProviderUnavailableError", "provider_unavailable")
    assert str(elsewhere) in message and str(bare) in message and "npm install onnxruntime-node" in message


# ----------------------------------------------------------------------------------------- telemetry

STORE = "Microsoft/DeveloperTools/.onnxruntime/onnxruntime.db"


def _store_hits(home: Path, needle: str) -> tuple[int, int]:
    """(events in ORT's local event store under `home`, events naming `needle`); (0, 0) without a store."""
    import sqlite3

    db = home / ".cache" / STORE
    if not db.exists():
        return 0, 0
    con = sqlite3.connect(db)
    try:
        rows = [bytes(r[0]) for r in con.execute("SELECT payload FROM events")]
    finally:
        con.close()
    return len(rows), sum(needle.encode() in r for r in rows)


@pytest.fixture(scope="module")
def probe_artifact(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, str]:
    """An artifact of a tiny model whose graph has a distinctive name: (artifact directory, graph name)."""
    import uuid

    from onnx import TensorProto, helper

    root = tmp_path_factory.mktemp("telemetry")
    graph_name = f"ortbuild_probe_{uuid.uuid4().hex[:12]}"
    g = helper.make_graph([helper.make_node("Relu", ["x"], ["y"], name="relu")], graph_name,
                          [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4])])
    model = helper.make_model(g, producer_name="ortbuild-probe", opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 9
    onnx.save(model, str(root / "probe.onnx"))
    np.savez(root / "probe.inputs.npz", x=np.ones((1, 4), np.float32))
    folder = _build_one(root / "p", model="probe", model_path=root / "probe.onnx", inputs=root / "probe.inputs.npz")
    plain = onnx.load_model_from_string(bytes(container.decrypt((folder / "model.onnx.enc").read_bytes(), TEST_KEY)))
    assert plain.graph.name == graph_name  # the name ORT would report
    return folder, graph_name


def _telemetry_env(home: Path) -> dict[str, str]:
    home.mkdir()
    env = {k: v for k, v in os.environ.items() if k != "ORT_DISABLE_TELEMETRY"}
    return {**env, "HOME": str(home), "XDG_CACHE_HOME": str(home / ".cache")}


# onnxruntime 1.31 samples SessionCreation events at 1% of sessions (per process and session id): the control
# creates enough sessions that it records some (P(none) = 0.99**1500, about 3e-7)
PY_SESSIONS = 1500


def test_python_loader_leaves_no_telemetry_naming_the_model(probe_artifact: tuple[Path, str], tmp_path: Path) -> None:
    """Through the loader, no event in ORT's local store names the model; the control, plain onnxruntime on the same
    decrypted bytes in the same setup without disable_telemetry_events(), records SessionCreation events naming
    its graph, so the check can fail."""
    folder, graph_name = probe_artifact
    loader = f"""
import sys
import textwrap
sys.path.insert(0, {str(folder / "loader")!r})
import ortbuild_probe
for _ in range({PY_SESSIONS}):
    ortbuild_probe.load()
"""
    control = f"""
import onnxruntime as ort
from ortbuild.artifact import container
data = bytes(container.decrypt(open({str(folder / "model.onnx.enc")!r}, "rb").read(), {TEST_KEY!r}))
so = ort.SessionOptions()
so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
for _ in range({PY_SESSIONS}):
    ort.InferenceSession(data, so, providers=["CPUExecutionProvider"])
"""
    results = {}
    for name, script in (("control", control), ("loader", loader)):
        env = _telemetry_env(tmp_path / name)
        proc = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=600)
        assert proc.returncode == 0, proc.stderr[-3000:]
        results[name] = _store_hits(tmp_path / name, graph_name)
    if results["control"][0] == 0:
        pytest.skip("this onnxruntime keeps no local telemetry event store here: nothing to check against")
    assert results["control"][1] > 0, results  # plain ORT does record the model's graph name
    assert results["loader"][1] == 0, results


def test_node_loader_leaves_no_telemetry_naming_the_model(probe_artifact: tuple[Path, str], node_app: Path,
                                                          tmp_path: Path) -> None:
    """onnxruntime-node 1.30 records a SessionCreation event naming the graph for every session (control, plain
    onnxruntime-node on the decrypted bytes); through the loader (which sets ORT_DISABLE_TELEMETRY before the first
    session) no event names it."""
    folder, graph_name = probe_artifact
    plain = tmp_path / "plain.onnx"
    plain.write_bytes(bytes(container.decrypt((folder / "model.onnx.enc").read_bytes(), TEST_KEY)))
    loader = node_app / "loader_telemetry.mjs"
    shutil.copy(folder / "loader" / loaders.NODE, loader)
    scripts = {
        "control": f"""
import ort from 'onnxruntime-node';
import {{ readFileSync }} from 'node:fs';
const data = new Uint8Array(readFileSync('{plain.as_posix()}'));
for (let i = 0; i < 20; i++) await ort.InferenceSession.create(data, {{ graphOptimizationLevel: 'disabled' }});
console.log(JSON.stringify(process.env.ORT_DISABLE_TELEMETRY ?? null));
""",
        "loader": f"""
import {{ load }} from '{loader.as_posix()}';
for (let i = 0; i < 20; i++) await load({{ folder: '{folder.as_posix()}' }});
console.log(JSON.stringify(process.env.ORT_DISABLE_TELEMETRY ?? null));
""",
    }
    results = {}
    for name, script in scripts.items():
        out = node(node_app, script, env=_telemetry_env(tmp_path / name))
        assert out == (None if name == "control" else "1")
        results[name] = _store_hits(tmp_path / name, graph_name)
    if results["control"][0] == 0:
        pytest.skip("this onnxruntime-node keeps no local telemetry event store here: nothing to check against")
    assert results["control"][1] >= 20, results  # every session of plain onnxruntime-node 1.30 names the graph
    assert results["loader"] == (0, 0), results  # and through the loader ORT keeps no store at all


# --------------------------------------------------------------------------- key files and kinds, core dumps

@pytest.fixture(scope="module")
def one(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One encrypted artifact (the suite's keys: TEST_KEY, signed with TEST_SIGNING_SEED)."""
    return _build_one(tmp_path_factory.mktemp("keyfiles"))


PY_KEY_CASES = """
import json, os, sys
sys.path.insert(0, sys.argv[1])
import ortbuild_tiny_cnn as L
out = {}
for name, env, key in json.loads(sys.argv[2]):
    for k, v in env.items():
        os.environ.pop(k, None) if v is None else os.environ.__setitem__(k, v)
    try:
        L.load(key=key, folder=sys.argv[3])
        out[name] = ["ok", ""]
    except L.LoaderError as e:
        out[name] = [e.code, str(e)]
print(json.dumps(out))
"""

NODE_KEY_CASES = """
import { LoaderError, load } from '%(loader)s';
const out = {};
for (const [name, env, key] of JSON.parse(process.argv[2])) {
  for (const [k, v] of Object.entries(env)) { if (v === null) delete process.env[k]; else process.env[k] = v; }
  try { await load({ folder: process.argv[3], key: key ?? undefined }); out[name] = ['ok', '']; }
  catch (e) { out[name] = e instanceof LoaderError ? [e.code, e.message] : ['crash', String(e)]; }
}
console.log(JSON.stringify(out));
"""


def test_both_loaders_read_key_files_as_the_cli_does(one: Path, node_app: Path, tmp_path: Path) -> None:
    """A key file group or others may read, a named FIFO (no writer: it hung both loaders), a device, a signing
    key's or public key's file: refused with the reason, at once. The signing seed or its public key given as the
    encryption key (from the environment, a file or the argument) is refused: the loader's pinned public key tells
    it. A private file and a pipe from the parent (stdin) load."""
    made = keygen.keygen(tmp_path / "keys")
    text = f"# ortbuild encryption key (AES-256 KEK)\n{base64.b64encode(TEST_KEY).decode()}\n"
    good = tmp_path / "keys" / "mine.key"
    good.write_text(text)
    good.chmod(0o600)
    shared = tmp_path / "shared.key"
    shared.write_text(text)
    shared.chmod(0o644)
    fifo = tmp_path / "fifo.key"
    os.mkfifo(fifo, 0o600)
    seed_file = tmp_path / "keys" / "seed.key"  # untyped: only the key itself says what it is
    seed_file.write_text(base64.b64encode(TEST_SIGNING_SEED).decode() + "\n")
    seed_file.chmod(0o600)
    public = base64.b64encode(keys.ed25519_public(TEST_SIGNING_SEED)).decode()

    def file(path: Path | str) -> dict[str, str | None]:
        return {"ORTBUILD_KEY": None, "ORTBUILD_KEY_FILE": str(path)}

    cases: list[tuple[str, dict[str, str | None], str | None]] = [
        ("shared", file(shared), None), ("fifo", file(fifo), None), ("device", file("/dev/zero"), None),
        ("signing-file", file(made["signing_key"]), None), ("public-file", file(made["public_key"]), None),
        ("seed-file", file(seed_file), None),
        ("seed-env", {"ORTBUILD_KEY_FILE": None, "ORTBUILD_KEY": base64.b64encode(TEST_SIGNING_SEED).decode()}, None),
        ("public-arg", {}, public), ("good", file(good), None), ("stdin", file("/dev/stdin"), None)]
    expected = {
        "shared": f"{shared}: the encryption key file is accessible by group or others (mode 0644): a key file must "
                  f"be private, like an ssh key; run `chmod 600 {shared}`",
        "fifo": f"{fifo}: cannot read the encryption key: a FIFO (named pipe), not a regular file: give the key "
                "file itself (a regular file, mode 0600)",
        "device": "/dev/zero: cannot read the encryption key: a character device, not a regular file: give the key "
                  "file itself (a regular file, mode 0600)",
        "signing-file": f"{made['signing_key']} is a signing key, not an encryption key: use encryption.key, the "
                        "encryption key `ortbuild keygen` wrote beside it",
        "public-file": f"{made['public_key']} is a public key, not an encryption key: use encryption.key, the "
                       "encryption key `ortbuild keygen` wrote beside it",
        "seed-file": f"{seed_file} is the artifact's signing key (key id "
                     f"{ed25519.public_key_id(base64.b64decode(public))}), not the encryption key: give "
                     "encryption.key, the key the artifact was built with",
        "seed-env": "$ORTBUILD_KEY is the artifact's signing key (key id "
                    f"{ed25519.public_key_id(base64.b64decode(public))}), not the encryption key: give encryption.key, "
                    "the key the artifact was built with",
        "public-arg": "the key argument is the public key of the artifact's signing key (key id "
                      f"{ed25519.public_key_id(base64.b64decode(public))}), not the encryption key: give "
                      "encryption.key, the key the artifact was built with",
    }
    loader = node_app / f"loader_keys_{os.getpid()}.mjs"
    shutil.copy(one / "loader" / loaders.NODE, loader)
    script = node_app / f"run_keys_{os.getpid()}.mjs"
    script.write_text(NODE_KEY_CASES % {"loader": loader.as_posix()})
    runs = {"python": [sys.executable, "-I", "-c", PY_KEY_CASES, str(one / "loader"), json.dumps(cases), str(one)],
            "node": ["node", str(script), json.dumps(cases), str(one)]}
    for language, command in runs.items():
        r, w = os.pipe()  # stdin: a pipe from the parent, as `ORTBUILD_KEY_FILE=/dev/stdin app < <(pass show key)`
        os.write(w, text.encode())
        os.close(w)
        try:
            proc = subprocess.run(command, stdin=r, cwd=node_app, capture_output=True, text=True, timeout=120)
        finally:
            os.close(r)
        assert proc.returncode == 0, (language, proc.stderr[-3000:])
        out = json.loads(proc.stdout.strip().splitlines()[-1])
        assert out["good"] == ["ok", ""] and out["stdin"] == ["ok", ""], (language, out)
        for name, message in expected.items():
            assert out[name] == ["key_missing", message], (language, name, out[name])
    loader.unlink()
    script.unlink()


def test_the_python_loader_turns_core_dumps_off_unless_allowed(one: Path, tmp_path: Path) -> None:
    """An app that loaded an encrypted artifact crashes (SIGSEGV): its soft core limit was set to 0 by load() (the
    hard one, the app's, is untouched) and no core appears. With load(allow_core_dumps=True) the limit the app had
    stays, and (where cores land in the working directory) the crash leaves a core: the test can fail."""
    from tests.test_keys import cores_land_in_cwd, crash_child

    app = """
        where, allow = sys.argv[1], sys.argv[2] == "allow"
        sys.path.insert(0, sys.argv[3])
        import ortbuild_tiny_cnn
        model = ortbuild_tiny_cnn.load(allow_core_dumps=allow)
        crash(where)
    """
    env = {**{k: v for k, v in os.environ.items() if k != "PYTHONFAULTHANDLER"}, "PYTHONPATH": ""}
    for mode in ("default", "allow"):
        work = tmp_path / mode
        work.mkdir()
        status, (soft, hard), cores = crash_child(app, work, mode, str(one / "loader"), env=env)
        assert hard != "0"  # the app's own hard limit: the loader never lowers it
        if mode == "default":
            assert soft == "0"
            if cores_land_in_cwd():
                assert cores == [] and not os.WCOREDUMP(status)
        else:
            assert soft == hard
            if cores_land_in_cwd():
                assert os.WCOREDUMP(status) and len(cores) == 1
                for core in cores:
                    core.unlink()


def test_the_node_loader_warns_when_core_dumps_are_on(one: Path, node_app: Path) -> None:
    """Node.js has no setrlimit: the loader cannot turn core dumps off, so it warns (ORTBUILD_CORE_DUMPS) when the
    process may write one while it loads an encrypted artifact; not when `ulimit -c 0` is in force, nor with
    allowCoreDumps."""
    import resource

    hard = resource.getrlimit(resource.RLIMIT_CORE)[1]
    if hard == 0:
        pytest.skip("core dumps are off for this test process (hard RLIMIT_CORE 0): no warning to see")
    loader = node_app / f"loader_core_{os.getpid()}.mjs"
    shutil.copy(one / "loader" / loaders.NODE, loader)
    script = node_app / f"run_core_{os.getpid()}.mjs"
    script.write_text(f"""
import {{ coreDumpsEnabled, load }} from '{loader.as_posix()}';
await load({{ folder: '{one.as_posix()}', allowCoreDumps: process.argv[2] === 'allow' }});
await load({{ folder: '{one.as_posix()}' }});  // warned once per process
console.log(JSON.stringify(coreDumpsEnabled()));
""")
    results = {}
    for name, limit, arg in (("on", hard, ""), ("off", 0, ""), ("allowed", hard, "allow")):
        proc = subprocess.run(["node", str(script), arg], cwd=node_app, capture_output=True, text=True, timeout=120,
                              preexec_fn=lambda lim=limit: resource.setrlimit(resource.RLIMIT_CORE, (lim, hard)))
        assert proc.returncode == 0, proc.stderr[-3000:]
        results[name] = (json.loads(proc.stdout.strip().splitlines()[-1]), proc.stderr.count("[ORTBUILD_CORE_DUMPS]"))
    assert results["on"] == (True, 1)  # once, though it loaded twice
    assert results["off"] == (False, 0)
    assert results["allowed"] == (True, 1)  # the second load() did not allow them: warned there
    proc_text = subprocess.run(["node", str(script), ""], cwd=node_app, capture_output=True, text=True, timeout=120,
                               preexec_fn=lambda: resource.setrlimit(resource.RLIMIT_CORE, (hard, hard))).stderr
    assert "ulimit -c 0" in proc_text and "cannot turn them off itself" in proc_text
    loader.unlink()
    script.unlink()
