"""The generated browser loader (ortbuild_loader.web.mjs), run for real: onnxruntime-web 1.30.0 from the npm
registry, served over loopback to headless Chromium (Debian's), against artifacts built here.

One page runs every case in one Chromium launch and POSTs the outputs (or each error's code) back: the outputs
must equal the Python loader's on the same golden inputs, and a tampered file (flipped byte, or re-encrypted under
the app's own key), a wrong key, a signed corrupt chunk, a broken signature must give the same error codes as the
Python loader; a provider onnxruntime-web lacks (CUDA), NCHWc operators, a rolled-back manifest, a missing key and
bad feeds give their own codes. Manifest format 3: a flipped byte in the header piece, the first, a middle or the last
piece of a file of several pieces is refused as that piece, and piece digests that do not fit the file too; a format-2
copy of an artifact (one sha256 per file) loads with the same outputs. The browser example of docs/loaders.md runs as
written.
"""

from __future__ import annotations

import base64
import dataclasses
import http.server
import json
import os
import re
import shutil
import signal
import subprocess
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from ortbuild.artifact import loaders, manifest, pieces
from tests.bigmodels import mlp
from tests.conftest import CHROMIUM, CHROMIUM_INSTALL, CHROMIUM_VAR, MODELS, REPO, TEST_KEY, npm_install, tool
from tests.test_loaders import _forge_weights, _resign, _set_file, build_examples

WEB_VERSION = "onnxruntime-web@1.30.0"
# "extended" keeps ONNX Runtime's contrib fusions (com.microsoft ops, which the WASM build has) and no NCHWc ops
# (level "layout"/"all" on the CPU provider: written for the build CPU's SIMD width, absent from WASM)
TARGETS = """
[targets.web]
runtime = "RUNTIME"
providers = ["CPUExecutionProvider"]
optimization = "extended"

[targets.web-int8]
extends = "web"
precision = "int8-dynamic"
models = ["tiny_transformer", "tiny_cnn"]

[targets.web-ext]
extends = "web"
external_data = true
models = ["tiny_transformer"]

[targets.web-plain]
extends = "web"
encrypt = false
models = ["tiny_cnn"]

[targets.cpu-all]
extends = "web"
optimization = "all"
models = ["tiny_cnn"]
"""
OK = [("web", "tiny_cnn"), ("web", "tiny_transformer"), ("web", "tiny_lstm"), ("web-int8", "tiny_transformer"),
      ("web-int8", "tiny_cnn"), ("web-ext", "tiny_transformer"), ("web-plain", "tiny_cnn"), ("web", "mlp")]
# The browser's outputs against the Python loader's (onnxruntime 1.31.1, native x86 kernels) on the golden inputs.
# Measured max |web - python| (Chromium 156, onnxruntime-web 1.30.0 WASM, AMD EPYC with AVX-512 VNNI): fp32 3.6e-7
# (tiny_cnn logits, |values| <= 3.4), 1.3e-6 (tiny_transformer embedding, <= 2.6; a few float32 ulps), 3.7e-8
# (tiny_lstm), 1.9e-6 (mlp y, sums of 1024 products); WASM's kernels sum in another order than the native AVX-512
# ones, so elements near zero differ by ~1e-6 absolute, not relatively: the bound is absolute, with room for other
# native CPUs (AVX2).
RTOL, ATOL = 1e-5, 5e-6
# int8-dynamic tiny_transformer: max 0.0144 on |values| <= 2.6, cosine 0.999989 (the integer kernels of WASM and
# of the native CPU differ; each is as far from the fp32 output as the other, cosine 0.99955)
INT8_ATOL, INT8_COSINE = 0.03, 0.9999


# ------------------------------------------------------------------------------------------ fixtures

# A generated MLP (tests/bigmodels.py) whose external data spans several pieces of manifest format 3 (3 layers of
# 1024 x 1024 float32: 12.6 MB, a container's header and 4 pieces of 4 whole 1 MiB chunks); built by `web` only
BIG = "mlp"
GENERATED: dict[str, Path] = {}  # a generated model -> its golden inputs


@pytest.fixture(scope="module")
def dist(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("web")
    src = mlp(root / "src" / BIG, layers=3, width=1024)
    GENERATED[BIG] = src.parent / "inputs.npz"
    return build_examples(root, f'[models.{BIG}]\npath = "{src}"\ninputs = "{GENERATED[BIG]}"\n' + TARGETS)


@pytest.fixture(scope="session")
def chromium() -> str:
    """Debian's Chromium: without it these tests are skipped with the command that installs it (CI sets
    ORTBUILD_REQUIRE_CHROMIUM=1: there they fail)."""
    return tool(*CHROMIUM, var=CHROMIUM_VAR, install=CHROMIUM_INSTALL)


@pytest.fixture(scope="session")
def web_app() -> Path:
    """A folder with onnxruntime-web installed from the npm registry (cached between runs); without Node.js and
    npm these tests are skipped with how to install them (fail with ORTBUILD_REQUIRE_NODE=1)."""
    app = Path(os.environ.get("ORTBUILD_WEB_APP", Path.home() / ".cache" / "ortbuild-tests" / "web-app"))
    package = app / "node_modules" / "onnxruntime-web"
    npm_install(app, WEB_VERSION, package / "dist" / "ort.bundle.min.mjs")
    assert json.loads((package / "package.json").read_text())["version"] == WEB_VERSION.split("@")[1]
    return app


# the MIME types a browser insists on: module scripts as JavaScript, WebAssembly for its streaming compilation
MIME = {**http.server.SimpleHTTPRequestHandler.extensions_map, ".mjs": "text/javascript", ".js": "text/javascript",
        ".wasm": "application/wasm", ".json": "application/json", ".html": "text/html", ".map": "application/json",
        "": "application/octet-stream"}


class _Handler(http.server.SimpleHTTPRequestHandler):
    extensions_map = MIME
    server: _Server

    def do_GET(self) -> None:
        if self.path == "/session-key":  # what an app's authenticated key endpoint would answer
            body = base64.b64encode(TEST_KEY)
            self.send_response(200)
            self.send_header("Content-Type", "text/plain")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)
            return
        super().do_GET()

    def do_POST(self) -> None:
        body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
        self.send_response(204)
        self.end_headers()
        self.server.posted.append(json.loads(body))
        self.server.arrived.set()

    def end_headers(self) -> None:
        self.send_header("Cache-Control", "no-store")
        super().end_headers()

    def log_message(self, format: str, *args: Any) -> None:
        pass


class _Server(http.server.ThreadingHTTPServer):
    posted: list[Any]
    arrived: threading.Event


@pytest.fixture
def serve(tmp_path: Path) -> Iterator[tuple[Path, str, _Server]]:
    """A loopback static server over a fresh folder (www), which also takes the page's POSTed results."""
    www = tmp_path / "www"
    www.mkdir()

    def handler(*args: Any) -> _Handler:
        return _Handler(*args, directory=str(www))

    server = _Server(("127.0.0.1", 0), handler)
    server.posted, server.arrived = [], threading.Event()
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield www, f"http://127.0.0.1:{server.server_address[1]}", server
    finally:
        server.shutdown()
        server.server_close()


def browse(chromium: str, url: str, server: _Server, profile: Path, timeout: float = 180) -> Any:
    """Open url in a fresh headless Chromium, wait for the page's POST, kill Chromium: the POSTed JSON."""
    args = [chromium, "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
            "--disable-background-networking", "--disable-component-update", "--disable-sync",
            "--enable-logging=stderr", f"--user-data-dir={profile}", url]
    log = profile.with_suffix(".log")
    with open(log, "wb") as err:
        proc = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=err, start_new_session=True)
        try:
            arrived = server.arrived.wait(timeout)
        finally:
            os.killpg(proc.pid, signal.SIGKILL)  # the browser and its helpers: the group it started
            proc.wait(30)
    if not arrived:
        pytest.fail(f"no result from the page within {timeout} s; Chromium's log ends:\n"
                    + log.read_text(errors="replace")[-4000:])
    doc = server.posted[0]
    assert "fatal" not in doc, doc["fatal"]
    return doc


def feed(model: str) -> dict[str, np.ndarray]:
    with np.load(GENERATED.get(model, MODELS / f"{model}.inputs.npz")) as z:
        return {k: z[k] for k in z.files}


def feeds_json(model: str) -> dict[str, Any]:
    return {k: {"dtype": str(v.dtype), "shape": list(v.shape), "data": base64.b64encode(v.tobytes()).decode()}
            for k, v in feed(model).items()}


def python_outcome(folder: Path, key: bytes, model: str, **kw: Any) -> Any:
    """The Python loader on the same folder: its outputs (by name), or its error's code."""
    mod: Any = loaders.import_python_loader(loaders.python_path(folder, model))
    try:
        m = mod.load(key=key, folder=folder, **kw)
    except mod.LoaderError as e:
        return e.code
    return dict(m.run(feed(model)))


def _flip(path: Path, at: int) -> None:
    data = bytearray(path.read_bytes())
    data[at] ^= 0x20
    path.write_bytes(bytes(data))


# ------------------------------------------------------------------------------------------- the page

PAGE = """<!doctype html>
<meta charset="utf-8">
<title>ortbuild web loader test</title>
<script type="importmap">{"imports": {"onnxruntime-web": "/ort/ort.bundle.min.mjs"}}</script>
<script type="module">
import * as ort from 'onnxruntime-web';
ort.env.wasm.numThreads = 1;            // no cross-origin isolation here: one WASM thread
const post = (doc) => fetch('/result', { method: 'POST', body: JSON.stringify(doc) });
const unb64 = (s) => Uint8Array.from(atob(s), (c) => c.charCodeAt(0));
const b64 = (u8) => {
  let s = '';
  for (let i = 0; i < u8.length; i += 0x8000) s += String.fromCharCode(...u8.subarray(i, i + 0x8000));
  return btoa(s);
};
const ARRAYS = { float32: Float32Array, float64: Float64Array, int64: BigInt64Array, int32: Int32Array,
                 int8: Int8Array, uint8: Uint8Array, bool: Uint8Array };
const bytes = (t) => new Uint8Array(t.data.buffer, t.data.byteOffset, t.data.byteLength);
const tensor = (f, dtype = f.dtype) => {
  const raw = unb64(f.data);
  let data = new ARRAYS[f.dtype](raw.buffer);
  if (dtype !== f.dtype) data = ARRAYS[dtype].from(data);
  return new ort.Tensor(dtype, data, f.shape);
};
try {
  const cases = await (await fetch('/cases.json')).json();
  const results = {};
  for (const c of cases) {
    const t0 = performance.now();
    try {
      const { load } = await import(c.loader);
      const key = c.key === null ? undefined : c.keyAsBytes ? unb64(c.key) : c.key;
      const m = await load({ ort, key, baseUrl: c.baseUrl ?? undefined, minEpoch: c.minEpoch ?? null });
      const loaded = performance.now() - t0;
      const feeds = {};
      for (const [name, f] of Object.entries(c.feeds)) feeds[name] = tensor(f, c.feedAs ?? f.dtype);
      const out = await m.run(feeds);
      const outputs = {};
      for (const [name, t] of Object.entries(out)) {
        outputs[name] = { dims: t.dims, type: t.type, data: b64(bytes(t)) };
      }
      results[c.name] = { ok: true, outputs, providers: m.providers, load_ms: loaded };
      await m.release();
    } catch (e) {
      results[c.name] = { ok: false, name: e?.name ?? null, code: e?.code ?? null,
                          message: String(e?.message ?? e) };
    }
  }
  await post({ results, userAgent: navigator.userAgent, secure: isSecureContext });
} catch (e) {
  await post({ fatal: String(e?.stack ?? e) });
}
</script>
"""


def test_browser_loader_in_headless_chromium(dist: Path, chromium: str, web_app: Path,
                                            serve: tuple[Path, str, _Server], tmp_path: Path) -> None:
    www, origin, server = serve
    (www / "ort").symlink_to(web_app / "node_modules" / "onnxruntime-web" / "dist")
    shutil.copytree(dist, www / "dist")
    wrong = bytes(range(100, 132))
    cases: list[dict[str, Any]] = []
    expected: dict[str, Any] = {}  # case -> the Python loader's outcome (outputs, or its error code)

    def case(name: str, folder: Path, model: str, key: bytes | None = TEST_KEY, **extra: Any) -> None:
        rel = folder.relative_to(www).as_posix()
        cases.append({"name": name, "loader": f"/{rel}/loader/{loaders.WEB}", "key": None if key is None else
                      base64.b64encode(key).decode(), "feeds": feeds_json(model), **extra})

    text = (dist / "web" / "tiny_cnn" / "loader" / loaders.WEB).read_text()
    assert not re.search(r"^\s*(import|export .* from)\b", text, flags=re.M)  # self-contained: no imports
    for target, model in OK:
        folder = www / "dist" / target / model
        case(f"{target}/{model}", folder, model)
        expected[f"{target}/{model}"] = python_outcome(folder, TEST_KEY, model)
    case("key-as-bytes", www / "dist" / "web" / "tiny_cnn", "tiny_cnn", keyAsBytes=True)

    def variant(name: str, src: tuple[str, str]) -> Path:
        folder = www / "cases" / name
        shutil.copytree(www / "dist" / src[0] / src[1], folder)
        return folder

    tampered = variant("tampered", ("web", "tiny_cnn"))
    _flip(tampered / "model.onnx.enc", 5000)
    tampered_ext = variant("tampered-ext", ("web-ext", "tiny_transformer"))
    _flip(tampered_ext / "model.onnx.data.enc", (tampered_ext / "model.onnx.data.enc").stat().st_size // 2)
    side = variant("side-file", ("web", "tiny_cnn"))
    _flip(loaders.python_path(side, "tiny_cnn"), 100)  # a sibling loader, modified
    absent = variant("side-file-absent", ("web", "tiny_cnn"))
    (absent / "loader" / loaders.NODE).unlink()   # an app may ship only the artifact and one loader
    corrupt = variant("signed-corrupt-chunk", ("web-ext", "tiny_transformer"))  # the signer signed a broken chunk
    _flip(corrupt / "model.onnx.data.enc", (corrupt / "model.onnx.data.enc").stat().st_size // 2)
    _resign(corrupt, lambda doc: _set_file(doc, corrupt, "model.onnx.data.enc"))
    forged = variant("forged-under-the-app-key", ("web-ext", "tiny_transformer"))  # every GCM tag valid
    _forge_weights(forged)
    badsig = variant("bad-signature", ("web", "tiny_cnn"))
    sig = bytearray(base64.b64decode((badsig / "manifest.sig").read_bytes()))
    sig[10] ^= 1
    (badsig / "manifest.sig").write_bytes(base64.b64encode(bytes(sig)))
    for name, folder, model, key in (("tampered", tampered, "tiny_cnn", TEST_KEY),
                                     ("tampered-ext", tampered_ext, "tiny_transformer", TEST_KEY),
                                     ("tampered-and-wrong-key", tampered, "tiny_cnn", wrong),
                                     ("side-file", side, "tiny_cnn", TEST_KEY),
                                     ("side-file-absent", absent, "tiny_cnn", TEST_KEY),
                                     ("wrong-key", www / "dist" / "web" / "tiny_cnn", "tiny_cnn", wrong),
                                     ("wrong-key-ext", www / "dist" / "web-ext" / "tiny_transformer",
                                      "tiny_transformer", wrong),
                                     ("signed-corrupt-chunk", corrupt, "tiny_transformer", TEST_KEY),
                                     ("forged-under-the-app-key", forged, "tiny_transformer", TEST_KEY),
                                     ("bad-signature", badsig, "tiny_cnn", TEST_KEY)):
        case(name, folder, model, key)
        expected[name] = python_outcome(folder, key, model)
    assert {k: v for k, v in expected.items() if isinstance(v, str)} == {
        "tampered": "tampered", "tampered-ext": "tampered", "tampered-and-wrong-key": "tampered",
        "side-file": "tampered", "wrong-key": "wrong_key", "wrong-key-ext": "wrong_key",
        "signed-corrupt-chunk": "corrupt", "forged-under-the-app-key": "tampered", "bad-signature": "bad_signature"}
    pieced = _piece_cases(www, variant, case, expected)

    # a CUDA target: its loader refuses before fetching anything (rendered from the web/tiny_cnn manifest)
    m, _ = manifest.read(dist / "web" / "tiny_cnn")
    cuda_providers = [{"name": "CUDAExecutionProvider", "options": {"device_id": 0}},
                      {"name": "CPUExecutionProvider", "options": {}}]
    cuda = dataclasses.replace(m, target="cuda", providers=cuda_providers)
    files = loaders.render(cuda, "onnxruntime-gpu==1.31.1")
    entry = next(lf for lf in loaders.describe(files, cuda) if lf.language == "web")
    assert entry.name == f"loader/{loaders.WEB}" and not entry.runs_target
    assert "CUDAExecutionProvider" in entry.note and "Python loader" in entry.note
    (www / "cases" / "cuda" / "loader").mkdir(parents=True)
    (www / "cases" / "cuda" / "loader" / loaders.WEB).write_text(files[loaders.WEB])
    case("cuda", www / "cases" / "cuda", "tiny_cnn", baseUrl="/dist/web/tiny_cnn")
    # NCHWc operators (level "all" for this CPU): refused, and the manifest's note says so
    nchwc = www / "dist" / "cpu-all" / "tiny_cnn"
    note = next(lf for lf in manifest.read(nchwc)[0].loaders if lf.language == "web")
    assert not note.runs_target and "com.microsoft.nchwc" in note.note
    case("nchwc", nchwc, "tiny_cnn")
    case("no-key", www / "dist" / "web" / "tiny_cnn", "tiny_cnn", key=None)
    case("rolled-back", www / "dist" / "web" / "tiny_cnn", "tiny_cnn", minEpoch=5)
    expected["rolled-back"] = python_outcome(www / "dist" / "web" / "tiny_cnn", TEST_KEY, "tiny_cnn", min_epoch=5)
    case("bad-feed", www / "dist" / "web" / "tiny_cnn", "tiny_cnn", feedAs="float64")
    (www / "cases.json").write_text(json.dumps(cases))
    (www / "index.html").write_text(PAGE)

    started = time.monotonic()
    doc = browse(chromium, f"{origin}/index.html", server, tmp_path / "profile")
    took = time.monotonic() - started
    results = doc["results"]
    assert doc["secure"] is True
    version = re.search(r"(?:Headless)?Chrome/(\d+)", doc["userAgent"])
    assert version is not None and int(version.group(1)) >= 137, doc["userAgent"]  # WebCrypto Ed25519

    codes = {name: None if r["ok"] else r["code"] for name, r in results.items()}
    assert codes == {**{f"{t}/{mo}": None for t, mo in OK}, **PIECE_CODES, "key-as-bytes": None,
                     "tampered": "tampered", "tampered-ext": "tampered", "tampered-and-wrong-key": "tampered",
                     "side-file": "tampered",
                     "side-file-absent": None, "wrong-key": "wrong_key", "wrong-key-ext": "wrong_key",
                     "signed-corrupt-chunk": "corrupt", "forged-under-the-app-key": "tampered",
                     "bad-signature": "bad_signature", "cuda": "provider_unavailable",
                     "nchwc": "provider_unavailable", "no-key": "key_missing", "rolled-back": "rolled_back",
                     "bad-feed": "bad_feed"}, results
    for name, want in expected.items():   # the same code as the Python loader, case by case
        if isinstance(want, str):
            assert results[name]["code"] == want, (name, results[name])
    assert "CUDAExecutionProvider" in results["cuda"]["message"] and "onnxruntime-web" in results["cuda"]["message"]
    assert "com.microsoft.nchwc" in results["nchwc"]["message"]
    assert "must be float32, got float64" in results["bad-feed"]["message"]
    assert "does not authenticate" in results["signed-corrupt-chunk"]["message"]
    assert "model.onnx.enc" in results["tampered"]["message"]

    worst: dict[str, float] = {}
    for target, model in OK:
        got, want = results[f"{target}/{model}"], expected[f"{target}/{model}"]
        assert got["providers"] == ["wasm"]
        assert list(got["outputs"]) == [o["name"] for o in manifest.read(dist / target / model)[0].io["outputs"]]
        for name, ref in want.items():
            out = got["outputs"][name]
            arr = np.frombuffer(base64.b64decode(out["data"]), dtype=ref.dtype).reshape(out["dims"])
            assert arr.shape == ref.shape and out["type"] == str(ref.dtype), (target, model, name)
            what = f"{target}/{model}/{name}"
            worst[what] = float(np.max(np.abs(arr.astype(np.float64) - ref))) if ref.size else 0.0
            if "int8" in target:  # integer kernels of another CPU: compared as a whole, and element by element
                a, b = arr.ravel().astype(np.float64), ref.ravel().astype(np.float64)
                assert a @ b / (np.linalg.norm(a) * np.linalg.norm(b)) >= INT8_COSINE, what
                np.testing.assert_allclose(arr, ref, rtol=0, atol=INT8_ATOL, err_msg=what)
            else:
                np.testing.assert_allclose(arr, ref, rtol=RTOL, atol=ATOL, err_msg=what)
    for name in ("key-as-bytes", "side-file-absent"):
        assert results[name]["outputs"] == results["web/tiny_cnn"]["outputs"]
    for name, words in pieced.items():  # each bad piece named, by its index and bytes
        assert words in results[name]["message"], (name, results[name])
    for target, model in FORMAT2:  # format 2 loads as before: the very outputs of the format-3 artifact
        assert results[f"format-2/{target}/{model}"]["outputs"] == results[f"{target}/{model}"]["outputs"]
    assert "does not match its signed manifest" in results["format-2-tampered"]["message"]
    print(f"\nChromium run: {took:.1f} s; {doc['userAgent']}")
    print("max |web - python| per output:", json.dumps(worst, indent=1))
    print("load ms:", {k: round(r["load_ms"]) for k, r in results.items() if r["ok"]})


# The cases of manifest format 3 (piece digests) and of format 2 (one sha256 per file), on copies of web/mlp (an
# encrypted file of several pieces) and of an unencrypted artifact; the Python loader gives each the same code
FORMAT2 = [("web", BIG), ("web-plain", "tiny_cnn"), ("web-ext", "tiny_transformer")]
PIECE_CODES = {
    "piece-head": "tampered", "piece-first": "tampered", "piece-middle": "tampered",
    "piece-last": "tampered", "piece-plain": "tampered", "piece-middle-and-wrong-key": "tampered",
    "wrong-key-pieces": "wrong_key", "pieces-miscounted": "tampered", "pieces-past-the-end": "tampered",
    "pieces-not-at-the-header": "unsupported_format", "pieces-not-whole-chunks": "unsupported_format",
    **{f"format-2/{t}/{m}": None for t, m in FORMAT2}, "format-2-tampered": "tampered",
    "format-2-wrong-key": "wrong_key"}


def _format2(doc: dict[str, Any]) -> None:
    """A manifest as a format-2 build wrote it: no piece digests, the whole file's sha256 alone."""
    doc["format_version"] = 2
    for f in doc["artifact"]["files"]:
        del f["pieces"]


def _piece_cases(www: Path, variant: Any, case: Any, expected: dict[str, Any]) -> dict[str, str]:
    """Add the cases of PIECE_CODES (their Python outcomes in `expected`); returns, for each bad piece's case, the
    words its message must hold (\"piece I of N (bytes A-B)\")."""
    wrong = bytes(range(100, 132))
    data = "model.onnx.data.enc"
    big = www / "dist" / "web" / BIG
    doc = json.loads((big / "manifest.json").read_bytes())
    assert doc["format_version"] == 3
    entry = next(f for f in doc["artifact"]["files"] if f["name"] == data)
    p = entry["pieces"]
    places = pieces.spans(entry["size"], p["head"], p["size"])
    assert p["head"] == 103 and len(places) == len(p["sha256"]) >= 5, p  # a head and at least 4 pieces
    words: dict[str, str] = {}
    runs: list[tuple[str, Path, str, bytes]] = [("wrong-key-pieces", big, BIG, wrong)]
    for name, i in (("piece-head", 0), ("piece-first", 1), ("piece-middle", len(places) // 2),
                    ("piece-last", len(places) - 1)):
        folder = variant(name, ("web", BIG))
        at, n = places[i]
        _flip(folder / data, at + n // 2)
        words[name] = f"piece {i} of {len(places)} (bytes {at}-{at + n})"
        runs.append((name, folder, BIG, TEST_KEY))
    runs.append(("piece-middle-and-wrong-key", www / "cases" / "piece-middle", BIG, wrong))
    words["piece-middle-and-wrong-key"] = words["piece-middle"]
    plain = variant("piece-plain", ("web-plain", "tiny_cnn"))  # an unencrypted file: no head, pieces from 0
    _flip(plain / "model.onnx", 700)
    words["piece-plain"] = "piece 0 of 1 (bytes 0-"
    runs.append(("piece-plain", plain, "tiny_cnn", TEST_KEY))

    def layout(name: str, edit: Any) -> None:  # a signed manifest whose pieces do not fit the file
        folder = variant(name, ("web", BIG))

        def apply(doc: dict[str, Any]) -> None:
            f = next(f for f in doc["artifact"]["files"] if f["name"] == data)
            edit(f["pieces"])
            if f["pieces"].pop("recompute", False):
                _set_file(doc, folder, data)

        _resign(folder, apply)
        runs.append((name, folder, BIG, TEST_KEY))

    layout("pieces-miscounted", lambda q: q["sha256"].pop())
    layout("pieces-past-the-end", lambda q: q["sha256"].append(q["sha256"][-1]))
    layout("pieces-not-at-the-header", lambda q: q.update(head=0, recompute=True))
    layout("pieces-not-whole-chunks", lambda q: q.update(size=1 << 20, recompute=True))
    for target, model in FORMAT2:
        folder = variant(f"format-2/{target}/{model}", (target, model))
        _resign(folder, _format2)
        runs.append((f"format-2/{target}/{model}", folder, model, TEST_KEY))
    old = variant("format-2-tampered", ("web", BIG))
    _resign(old, _format2)
    _flip(old / data, places[2][0] + 10)
    runs += [("format-2-tampered", old, BIG, TEST_KEY), ("format-2-wrong-key", www / "cases" / "format-2" / "web" /
                                                         BIG, BIG, wrong)]
    for name, folder, model, key in runs:
        case(name, folder, model, key)
        expected[name] = python_outcome(folder, key, model)
    assert {k: v if isinstance(v, str) else None for k, v in expected.items() if k in PIECE_CODES} == PIECE_CODES
    return words


def _docs_example() -> str:
    """The browser example of docs/loaders.md (a ```text block: tests/test_docs.py runs its js block in Node)."""
    text = (REPO / "docs" / "loaders.md").read_text()
    (block,) = [b for b in re.findall(r"^```\w*\n(.*?)^```", text, flags=re.S | re.M) if '"importmap"' in b]
    return str(block)


HARNESS = """<script>
const post = (doc) => fetch('/result', { method: 'POST', body: JSON.stringify(doc) });
console.log = (...args) => post({ log: args });
addEventListener('error', (e) => post({ fatal: String(e.error?.stack ?? e.message) }));
addEventListener('unhandledrejection', (e) => post({ fatal: String(e.reason?.stack ?? e.reason) }));
</script>
"""


def test_docs_browser_example_runs(dist: Path, chromium: str, web_app: Path, serve: tuple[Path, str, _Server],
                                   tmp_path: Path) -> None:
    """The example page of docs/loaders.md, as written, served as the docs describe (onnxruntime-web under
    /node_modules, the artifact under /models, the key from the app's own endpoint)."""
    www, origin, server = serve
    (www / "node_modules").symlink_to(web_app / "node_modules")
    (www / "models").mkdir()
    (www / "models" / "tiny_cnn").symlink_to(dist / "web" / "tiny_cnn")
    (www / "index.html").write_text(HARNESS + _docs_example())
    doc = browse(chromium, f"{origin}/index.html", server, tmp_path / "profile")
    assert doc == {"log": [[4, 10]]}
