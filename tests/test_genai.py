"""Generative artifacts end to end (ortbuild.pipeline.genai, pipeline/steps/genbuild.py and the generated loader,
artifact/templates/loader_genai.py.j2): the real `ortbuild` CLI builds a small Llama (models/generate_llm.py) with
onnxruntime-genai's model builder for fp32, int4 and a CUDA target (portable here, built with the CPU stand-in);
the loader that ortbuild generates opens the sealed artifact with the real onnxruntime-genai, under real keys
(`ortbuild keygen`).

Checked: what an artifact holds (the graph sealed, its config and tokenizer signed, the manifest's `generative`
section, the loaders: Python runs, Node and the browser refuse); no plaintext weights on disk after a build and a
load; the loader's greedy tokens equal onnxruntime-genai's on an independent plaintext build of the same source;
tampering, a wrong key and no key are refused before onnxruntime-genai sees anything; incremental rebuilds name
the changed source file; a CUDA target is portable and refused; `ortbuild test`, `release` and `verify`.

The model: models/generate_llm.py with 600 training steps, made once per machine into the tests' cache (the `llm`
fixture's entry, which `nox -s example-llm` trains and the other generative tests use: ~2 minutes the first
time). A model trained for fewer steps answers every prompt with the same token (40 steps: token 223 at every
position of every prompt), and greedy agreement on such a model cannot tell a loader that ignores its prompt
from one that works.
Marked `generative`: run with a Python that has torch, transformers and onnxruntime-genai (nox -s tests-generative).
"""

from __future__ import annotations

import base64
import hashlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import onnx
import pytest

from ortbuild import workspace
from ortbuild.artifact import container, keys, loaders, manifest, manifest_types
from ortbuild.errors import Tampered
from ortbuild.project.kinds import kind_rule
from tests.bigmodels import plaintext_hits
from tests.conftest import NODE_INSTALL, NODE_VAR, TEST_KEY, tool

pytestmark = pytest.mark.generative
og = pytest.importorskip("onnxruntime_genai")

MODEL = "tiny_llama"
TARGETS = f"""
[project]
name = "gen"
version = "1"

[models.{MODEL}]
path = "models/{MODEL}"
inputs = "models/{MODEL}/prompts.txt"

[targets.fp32]
runtime = "onnxruntime==1.31.1"
providers = ["CPUExecutionProvider"]
models = ["{MODEL}"]

[targets.int4]
extends = "fp32"
precision = "int4-weight"
int4 = {{ block_size = 32, accuracy_level = 4 }}
optimization = "extended"
session = {{ intra_op_num_threads = 1, config = {{ "session.intra_op.allow_spinning" = "0" }} }}

[targets.cuda]
runtime = "onnxruntime-gpu==1.31.1"
providers = ["CUDAExecutionProvider"]
models = ["{MODEL}"]
precision = "int4-weight"
"""
SIDE = ("genai_config.json", "tokenizer.json", "tokenizer_config.json")  # signed, not encrypted
LOADERS = (f"ortbuild_{MODEL}.py", loaders.NODE, loaders.WEB)


@dataclass(frozen=True)
class Project:
    root: Path              # targets.toml, models/tiny_llama (a copy of the model), keys/, dist/
    env: dict[str, str]     # the keys made by `ortbuild keygen`, the CUDA target's stand-in, a private TMPDIR
    key: bytes              # the encryption key
    private: tuple[Path, ...]  # the build's cwd, TMPDIR and HOME: everything it could write outside dist/
    shm_before: frozenset[Path]
    build: subprocess.CompletedProcess[str]

    def dist(self, target: str) -> Path:
        return self.root / "dist" / target / MODEL

    def run(self, *args: str, root: Path | None = None) -> subprocess.CompletedProcess[str]:
        return subprocess.run([sys.executable, "-m", "ortbuild", *args], cwd=root or self.root, env=self.env,
                              capture_output=True, text=True, timeout=600)

    def prompts(self) -> list[str]:
        return [p.strip() for p in (self.root / "models" / MODEL / "prompts.txt").read_text().splitlines() if p.strip()]

    def copy(self, to: Path) -> Path:
        """The project (model, keys, dist) copied: a case that changes it works on its own."""
        shutil.copytree(self.root, to, symlinks=True)
        return to


def _shm() -> set[Path]:
    shm = Path("/dev/shm")
    return set(shm.iterdir()) if shm.is_dir() else set()


@pytest.fixture(scope="module")
def project(llm: Path, tmp_path_factory: pytest.TempPathFactory) -> Project:
    """The three targets built once by `ortbuild build` in a fresh process whose cwd, TMPDIR and HOME are
    private directories (so that the plaintext scan knows every place the build could write)."""
    base = tmp_path_factory.mktemp("genai")
    root = base / "p"
    shutil.copytree(llm, root / "models" / MODEL)
    (root / "targets.toml").write_text(TARGETS)
    private = tuple(base / d for d in ("cwd", "tmp", "home"))
    for d in private:
        d.mkdir()
    env = {k: v for k, v in os.environ.items() if k not in ("ORTBUILD_KEY", "ORTBUILD_SIGNING_KEY")}
    made = subprocess.run([sys.executable, "-m", "ortbuild", "keygen", "--out", str(root / "keys"), "--json"],
                          env=env, cwd=root, capture_output=True, text=True, timeout=120)
    assert made.returncode == 0, made.stderr
    env.update(ORTBUILD_KEY_FILE=str(root / "keys" / keys.ENCRYPTION_FILE),
               ORTBUILD_SIGNING_KEY_FILE=str(root / "keys" / keys.SIGNING_FILE), ORTBUILD_STAND_IN="1",
               TMPDIR=str(private[1]), PYTHONDONTWRITEBYTECODE="1")
    found = keys.encryption_key(file=root / "keys" / keys.ENCRYPTION_FILE)
    assert found is not None
    shm_before = frozenset(_shm())
    build = subprocess.run([sys.executable, "-m", "ortbuild", "build", "-c", str(root / "targets.toml")],
                           cwd=private[0], env={**env, "HOME": str(private[2])}, capture_output=True, text=True,
                           timeout=900)
    return Project(root, env, found.secret, private, shm_before, build)


@pytest.fixture(scope="module")
def plain(project: Project, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The same source built by onnxruntime-genai's model builder CLI itself, fp32 for the CPU: plaintext, for
    onnxruntime-genai to open from disk (the reference the loader is compared with)."""
    out = tmp_path_factory.mktemp("plain") / "fp32"
    proc = subprocess.run([sys.executable, "-m", "onnxruntime_genai.models.builder", "-i",
                           str(project.root / "models" / MODEL), "-o", str(out), "-p", "fp32", "-e", "cpu",
                           "-c", str(out.parent / "cache")], capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return out


def _loader(folder: Path) -> Any:
    return loaders.import_python_loader(loaders.python_path(folder, MODEL))


def _flip(path: Path, at: int = -20) -> None:
    data = bytearray(path.read_bytes())
    data[at] ^= 0x01
    path.write_bytes(bytes(data))


def _greedy(model: Any, tokenizer: Any, ids: list[int], n: int) -> list[int]:
    """onnxruntime-genai's own greedy loop on the plaintext model (no ortbuild code)."""
    params = og.GeneratorParams(model)
    params.set_search_options(max_length=len(ids) + n, do_sample=False)
    gen = og.Generator(model, params)
    gen.append_tokens(ids)
    out: list[int] = []
    while not gen.is_done() and len(out) < n:
        gen.generate_next_token()
        out.append(int(gen.get_next_tokens()[0]))
    return out


@pytest.fixture
def opened(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """Every og.Config / og.Model the code under test makes (the real ones, counted): a refusal must come before."""
    made: list[str] = []
    for name in ("Config", "Model"):
        real = getattr(og, name)

        def spy(*args: Any, _real: Callable[..., Any] = real, _name: str = name) -> Any:
            made.append(_name)
            return _real(*args)

        monkeypatch.setattr(og, name, spy)
    return made


# ------------------------------------------------------------------------------------------------ the artifact

def test_build_seals_the_graph_signs_config_and_tokenizer_and_writes_the_loaders(project: Project) -> None:
    out = project.build.stdout + project.build.stderr
    assert project.build.returncode == 0, out[-4000:]
    assert "2 built, 0 up-to-date, 1 portable, 0 skipped, 0 failed" in out, out[-3000:]
    source = project.root / "models" / MODEL
    hf = json.loads((source / "config.json").read_text())
    for target, precision in (("fp32", "fp32"), ("int4", "int4")):
        folder = project.dist(target)
        assert {p.name for p in folder.iterdir()} == {"model.onnx.enc", *SIDE, manifest_types.MANIFEST,
                                                     manifest.SIGNATURE, loaders.LOADER_DIR}
        assert {p.name for p in (folder / loaders.LOADER_DIR).iterdir()} == set(LOADERS)
        sealed = (folder / "model.onnx.enc").read_bytes()
        assert sealed.startswith(container.MAGIC)
        with pytest.raises(Exception):  # noqa: B017 - any protobuf error: the stored bytes are no ONNX model
            onnx.load_model_from_string(sealed)
        graph = onnx.load_model_from_string(bytes(container.decrypt(sealed, project.key)))
        ops = {n.op_type for n in graph.graph.node}
        assert "GroupQueryAttention" in ops  # the builder's decoder with its KV cache
        assert ("MatMulNBits" in ops) == (precision == "int4")
        assert not [t.name for t in graph.graph.initializer if t.data_location == onnx.TensorProto.EXTERNAL]
        doc = json.loads((folder / manifest_types.MANIFEST).read_text())
        files = {f["name"]: f for f in doc["artifact"]["files"]}
        assert set(files) == {"model.onnx.enc", *SIDE}
        # the target's level and session options, where onnxruntime-genai creates its session from
        so = json.loads((folder / "genai_config.json").read_text())["model"]["decoder"]["session_options"]
        level, threads = ("ORT_ENABLE_EXTENDED", 1) if target == "int4" else ("ORT_ENABLE_ALL", None)
        assert so["graph_optimization_level"] == level and so.get("intra_op_num_threads") == threads, so
        assert any("not applied: session.intra_op.allow_spinning" in n for n in doc["notes"]) == (target == "int4")
        assert files["model.onnx.enc"]["encrypted"] and files["model.onnx.enc"]["location"] == "model.onnx"
        for name in SIDE:  # plain, and signed: their digests are in the signed manifest
            assert not files[name]["encrypted"]
            assert files[name]["sha256"] == hashlib.sha256((folder / name).read_bytes()).hexdigest()
        assert json.loads((folder / "tokenizer.json").read_bytes()) == \
            json.loads((source / "tokenizer.json").read_bytes())
        genai_config = json.loads((folder / "genai_config.json").read_text())
        assert genai_config["model"]["decoder"]["filename"] == "model.onnx"
        assert doc["encryption"]["key_id"] == container.key_id(project.key).hex()
        assert doc["status"] == "complete" and doc["missing_providers"] == {}
        gen = doc["generative"]
        assert gen["builder"]["onnxruntime-genai"] == og.__version__
        assert {"torch", "transformers"} <= set(gen["builder"])
        assert gen["precision"] == precision and gen["execution_provider"] == "cpu"
        assert gen["extra_options"] == ({} if precision == "fp32" else
                                        {"block_size": "32", "is_symmetric": "true", "accuracy_level": "4"})
        assert gen["context_length"] == hf["max_position_embeddings"] == genai_config["model"]["context_length"]
        assert gen["architecture"] == hf["architectures"][0] and gen["num_layers"] == hf["num_hidden_layers"]
        assert gen["config"] == "genai_config.json" and set(gen["tokenizer"]) == {"tokenizer.json",
                                                                                   "tokenizer_config.json"}
        golden = gen["golden_tokens"]
        assert sorted(golden) == sorted(project.prompts())  # the manifest's keys are sorted
        assert all(len(t) == 8 and all(0 <= i < hf["vocab_size"] for i in t) for t in golden.values())
        assert len({tuple(t) for t in golden.values()}) > 1  # the prompts are continued differently
        assert {entry["language"]: entry["runs_target"] for entry in doc["loaders"]} == \
            {"python": True, "node": False, "web": False}


def test_the_python_loader_generates_and_the_javascript_loaders_refuse(project: Project, tmp_path: Path) -> None:
    mod = _loader(project.dist("fp32"))
    model = mod.load(key=project.key, folder=project.dist("fp32"))
    text = model.generate(project.prompts()[0], max_tokens=8)
    assert isinstance(text, str) and text.strip()
    node = tool("node", var=NODE_VAR, install=NODE_INSTALL)
    for name in (loaders.NODE, loaders.WEB):  # the browser module imports nothing: Node runs it as well
        script = tmp_path / f"{name}.check.mjs"
        script.write_text(f"import * as m from {json.dumps((project.dist('fp32') / 'loader' / name).as_uri())};\n"
                          "for (const f of [m.load, m.verify]) {\n"
                          "  try { await f({}); console.log('opened'); }\n"
                          "  catch (e) { console.log(JSON.stringify([e.name, e.code, e.message, "
                          "e instanceof m.LoaderError])); }\n}\n")
        proc = subprocess.run([node, str(script)], capture_output=True, text=True, timeout=120)
        assert proc.returncode == 0, proc.stderr
        for line in proc.stdout.splitlines():
            name_, code, message, is_loader_error = json.loads(line)
            assert (name_, code, is_loader_error) == ("UnsupportedFormatError", "unsupported_format", True)
            assert message == f"fp32/{MODEL}: {kind_rule('generative').js_refusal}"
        assert len(proc.stdout.splitlines()) == 2


# ----------------------------------------------------------------------------------- no plaintext on disk

def _needles(project: Project) -> list[bytes]:
    """64-byte pieces from the middle of the largest weights of each sealed graph (decrypted here, in memory)."""
    pieces = []
    for target in ("fp32", "int4"):
        graph = onnx.load_model_from_string(bytes(container.decrypt(
            (project.dist(target) / "model.onnx.enc").read_bytes(), project.key)))
        inits = sorted((t for t in graph.graph.initializer if len(t.raw_data) >= 1024),
                       key=lambda t: -len(t.raw_data))[:4]
        pieces += [t.raw_data[len(t.raw_data) // 2:len(t.raw_data) // 2 + 64] for t in inits]
    assert len(pieces) == 8 and all(p.strip(b"\0") for p in pieces)
    return pieces


def test_no_plaintext_weights_on_disk_after_build_and_load(project: Project, plain: Path) -> None:
    assert project.build.returncode == 0
    cwd, tmp, home = project.private
    script = (f"import sys; sys.path.insert(0, {str(project.dist('fp32') / 'loader')!r}); "
              f"import ortbuild_{MODEL} as m; model = m.load(folder={str(project.dist('fp32'))!r}); "
              "print(model.generate('The', max_tokens=4))")
    proc = subprocess.run([sys.executable, "-I", "-c", script], cwd=cwd, env={**project.env, "HOME": str(home)},
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    needles = _needles(project)
    # the scan finds plaintext where there is some: the builder's own output holds the fp32 weights
    found, _ = plaintext_hits([plain], needles)
    assert any(f.endswith("model.onnx.data") for f in found), found
    hits, scanned = plaintext_hits([project.root / "dist", project.root / "targets.toml", *project.private], needles)
    # /dev/shm, where the build's private directories are (memory-backed): what appeared there since the build
    # started, by content. This module's build and load have ended, so an entry that goes away while it is read, or
    # the private dir of an ortbuild process still running, is another process's: CI builds the same example LLM in
    # another lane at the same time. A private dir whose process has ended, still there with plaintext, is a leak.
    for entry in _shm() - project.shm_before:
        try:
            found, n = plaintext_hits([entry], needles)
        except FileNotFoundError:
            continue
        if found and entry.exists() and workspace.owner_alive(entry):
            continue
        hits += found
        scanned += n
    assert hits == []
    assert scanned > sum((project.dist(t) / "model.onnx.enc").stat().st_size for t in ("fp32", "int4", "cuda"))
    # the build's and the loader's private temporary directories are gone; what else is there is ONNX Runtime's
    # session file (as in tests/test_loaders.py) and the empty cache directory torch makes when the builder imports it
    leftovers = [p.name for p in tmp.iterdir() if p.name != ".ses"
                 and not (p.name.startswith("torchinductor_") and p.is_dir() and not any(p.iterdir()))]
    assert leftovers == [], leftovers


# --------------------------------------------------------------------- the same tokens as onnxruntime-genai

def test_the_loader_gives_onnxruntime_genais_tokens_on_the_plaintext_build(project: Project, plain: Path) -> None:
    model = _loader(project.dist("fp32")).load(key=project.key, folder=project.dist("fp32"))
    reference = og.Model(og.Config(str(plain)))  # from disk, no ortbuild code
    tokenizer = og.Tokenizer(reference)
    golden = json.loads((project.dist("fp32") / manifest_types.MANIFEST).read_text())["generative"]["golden_tokens"]
    continuations = set()
    for prompt in project.prompts():
        ids = [int(t) for t in tokenizer.encode(prompt)]
        assert model.encode(prompt) == ids
        expected = _greedy(reference, tokenizer, ids, 16)
        assert model.generate_ids(ids, 16) == expected, prompt
        assert expected[:8] == golden[prompt]  # the build's reload step opened what the builder makes
        text = model.generate(prompt, max_tokens=16)
        assert text == tokenizer.decode(expected)
        assert "".join(model.stream(prompt, max_tokens=16)) == text
        continuations.add(tuple(expected))
    assert len(continuations) > len(project.prompts()) // 2  # a model whose greedy output depends on the prompt


@pytest.mark.parametrize("route", ["pipe", "bytes"])
def test_both_routes_to_onnxruntime_genai_give_the_same_tokens(project: Project, plain: Path, route: str,
                                                                monkeypatch: pytest.MonkeyPatch) -> None:
    """A graph of FEED_MIN_BYTES or more goes through the pipe a child process feeds (forced here on the example's
    small graph), a smaller one as bytes; a child that cannot start falls back to bytes. Each gives onnxruntime-genai's
    own tokens on the plaintext build, and no plaintext graph file is left in the temp dir."""
    folder = project.dist("fp32")
    mod = _loader(folder)
    started: list[list[str]] = []
    popen = subprocess.Popen

    def spy(args: list[str], **kw: Any) -> Any:
        started.append(list(args))
        return popen(args, **kw)

    monkeypatch.setattr(subprocess, "Popen", spy)
    monkeypatch.setattr(mod, "FEED_MIN_BYTES", 0 if route == "pipe" else 1 << 40)
    before = set(Path(tempfile.gettempdir()).glob("ortbuild-genai-*"))
    model = mod.load(key=project.key, folder=folder)
    assert set(Path(tempfile.gettempdir()).glob("ortbuild-genai-*")) == before  # its private dir is gone
    assert len(started) == (1 if route == "pipe" else 0)
    if route == "pipe":
        assert started[0][1:4] == ["-I", "-S", "-c"]  # the loader's own Python, isolated
    reference = og.Model(og.Config(str(plain)))
    tokenizer = og.Tokenizer(reference)
    for prompt in project.prompts()[:3]:
        ids = [int(t) for t in tokenizer.encode(prompt)]
        assert model.generate_ids(ids, 12) == _greedy(reference, tokenizer, ids, 12), prompt
    if route == "pipe":  # a Python that cannot run the feeder: the bytes route, the same tokens
        monkeypatch.setattr(sys, "executable", "/bin/false")
        again = mod.load(key=project.key, folder=folder)
        ids = [int(t) for t in tokenizer.encode(project.prompts()[0])]
        assert again.generate_ids(ids, 12) == model.generate_ids(ids, 12)


def test_chat_on_a_model_without_a_chat_template_is_a_feed_error(project: Project) -> None:
    """The example model has none (tests/test_genai_app.py gives a copy one): chat() and a session's messages say so;
    plain text still works."""
    folder = project.dist("fp32")
    mod = _loader(folder)
    model = mod.load(key=project.key, folder=folder)
    assert model.chat_template is None and not (folder / "chat_template.jinja").exists()
    messages = [{"role": "user", "content": "The"}]
    for call in (lambda: model.chat(messages), lambda: model.session().send(messages)):
        with pytest.raises(mod.FeedError, match=f"^fp32/{MODEL} has no chat template") as err:
            call()
        assert err.value.code == "bad_feed"
    assert model.session().send("The", 4) == model.generate("The", 4)


# --------------------------------------------------------------------------------------- refusals

@pytest.mark.parametrize(("name", "code"), [("model.onnx.enc", "tampered"), ("genai_config.json", "tampered"),
                                            ("tokenizer.json", "tampered"), ("tokenizer_config.json", "tampered"),
                                            (manifest_types.MANIFEST, "bad_signature")])
def test_a_flipped_byte_is_refused_before_onnxruntime_genai_opens_anything(
        project: Project, tmp_path: Path, opened: list[str], name: str, code: str) -> None:
    folder = tmp_path / MODEL
    shutil.copytree(project.dist("fp32"), folder)
    mod = _loader(folder)
    _flip(folder / name)
    with pytest.raises(mod.LoaderError) as err:
        mod.load(key=project.key, folder=folder)
    assert err.value.code == code, err.value
    assert opened == []
    _flip(folder / name)  # flipped back: the same copy opens (the spy sees it)
    mod.load(key=project.key, folder=folder)
    assert opened == ["Config", "Model"]


def test_a_wrong_key_and_no_key_are_refused_before_onnxruntime_genai_opens_anything(
        project: Project, opened: list[str], monkeypatch: pytest.MonkeyPatch) -> None:
    folder = project.dist("fp32")
    mod = _loader(folder)
    with pytest.raises(mod.WrongKeyError):
        mod.load(key=TEST_KEY, folder=folder)
    with pytest.raises(mod.WrongKeyError):  # the key text as $ORTBUILD_KEY holds it
        mod.load(key=base64.b64encode(os.urandom(32)).decode(), folder=folder)
    for var in ("ORTBUILD_KEY", "ORTBUILD_KEY_FILE"):
        monkeypatch.delenv(var, raising=False)
    with pytest.raises(mod.KeyMissingError):
        mod.load(folder=folder)
    assert opened == []
    monkeypatch.setenv("ORTBUILD_KEY_FILE", project.env["ORTBUILD_KEY_FILE"])
    assert mod.load(folder=folder).generate_ids([5, 6, 7], 2)
    assert opened == ["Config", "Model"]


@pytest.mark.parametrize("name", ["model.onnx.enc", "tokenizer.json"])
def test_build_refuses_a_tampered_generative_artifact_and_replaces_nothing(project: Project, tmp_path: Path,
                                                                           name: str) -> None:
    root = project.copy(tmp_path / "p")
    path = root / "dist" / "fp32" / MODEL / name
    _flip(path)
    after = path.read_bytes()
    proc = project.run("build", "-t", "fp32", root=root)
    assert proc.returncode == Tampered.exit_code, proc.stdout + proc.stderr
    assert "TAMPERED" in proc.stdout + proc.stderr and name in proc.stdout + proc.stderr
    assert "Traceback" not in proc.stderr
    assert path.read_bytes() == after, "the tampered file was replaced without --repair"


# ---------------------------------------------------------------------------------------- incremental

def test_a_noop_build_reuses_and_a_changed_source_file_rebuilds_and_is_named(project: Project, tmp_path: Path) -> None:
    root = project.copy(tmp_path / "p")
    proc = project.run("build", "-t", "fp32", root=root)
    assert proc.returncode == 0 and "0 built, 1 up-to-date" in proc.stdout, proc.stdout + proc.stderr
    before = json.loads((root / "dist" / "fp32" / MODEL / manifest_types.MANIFEST).read_text())["build_key"]
    with open(root / "models" / MODEL / "tokenizer_config.json", "a") as f:
        f.write(" ")
    proc = project.run("plan", "-t", "fp32", "--json", root=root)
    assert proc.returncode == 0, proc.stderr
    (row,) = json.loads(proc.stdout)
    assert row["rebuild"] is True and row["why"] == "changed: source:tokenizer_config.json", row
    proc = project.run("build", "-t", "fp32", root=root)
    assert proc.returncode == 0 and "1 built, 0 up-to-date" in proc.stdout, proc.stdout + proc.stderr
    assert json.loads((root / "dist" / "fp32" / MODEL / manifest_types.MANIFEST).read_text())["build_key"] != before
    (row,) = json.loads(project.run("plan", "-t", "fp32", "--json", root=root).stdout)
    assert row["rebuild"] is False, row


def test_a_reproducible_build_gives_the_same_bytes_twice(project: Project, tmp_path: Path) -> None:
    """SOURCE_DATE_EPOCH: the builder's output, the sealed graph and the manifest are the same bytes on a rebuild."""
    root = project.copy(tmp_path / "p")
    env = {**project.env, "SOURCE_DATE_EPOCH": "1700000000"}
    digests = []
    for _ in range(2):
        proc = subprocess.run([sys.executable, "-m", "ortbuild", "build", "--force", "-t", "int4"], cwd=root,
                              env=env, capture_output=True, text=True, timeout=600)
        assert proc.returncode == 0, proc.stderr
        folder = root / "dist" / "int4" / MODEL
        digests.append({f.name: hashlib.sha256(f.read_bytes()).hexdigest() for f in sorted(folder.iterdir())
                        if f.is_file()})
    assert digests[0] == digests[1] and {"model.onnx.enc", manifest_types.MANIFEST} <= set(digests[0])


def test_an_exclude_nodes_name_the_graph_lacks_is_a_config_error(project: Project, tmp_path: Path) -> None:
    """The builder ignores a name it does not know: the build refuses it, naming the key and the graph's MatMuls."""
    root = project.copy(tmp_path / "p")
    toml = root / "targets.toml"
    old = "int4 = { block_size = 32, accuracy_level = 4 }"
    toml.write_text(toml.read_text().replace(old, old[:-2] + ', exclude_nodes = ["/nope/MatMul"] }'))
    proc = project.run("build", "-t", "int4", root=root)
    assert proc.returncode == 3 and "Traceback" not in proc.stderr, proc.stderr
    assert "[targets.int4.int4.exclude_nodes] names /nope/MatMul" in proc.stderr, proc.stderr
    assert "/lm_head/MatMul" in proc.stderr or "/model/layers.0/attn/qkv_proj/MatMul" in proc.stderr


# ------------------------------------------------------------------------------------------- CUDA, portable

def test_a_cuda_target_is_portable_and_its_loader_refuses_it(project: Project, opened: list[str]) -> None:
    if og.is_cuda_available():
        pytest.skip("this onnxruntime-genai runs CUDA here: the target is not portable")
    folder = project.dist("cuda")
    doc = json.loads((folder / manifest_types.MANIFEST).read_text())
    assert doc["status"] == "portable" and list(doc["missing_providers"]) == ["CUDAExecutionProvider"]
    assert doc["generative"]["execution_provider"] == "cuda"
    assert json.loads((folder / "genai_config.json").read_text())["model"]["decoder"]["session_options"][
        "provider_options"][0].keys() == {"cuda"}  # built for CUDA, not for the CPU it was built on
    mod = _loader(folder)
    assert mod.verify(folder)["target"] == "cuda"  # genuine and signed
    with pytest.raises(mod.ProviderUnavailableError) as err:
        mod.load(key=project.key, folder=folder)
    assert "CUDAExecutionProvider" in str(err.value)
    # the CPU package here: the message names the package CUDA needs, and how to install it
    assert doc["generative"]["runtime"] == "onnxruntime-genai-cuda==0.18.0"
    assert "pip install onnxruntime-genai-cuda==0.18.0 onnxruntime-gpu==1.31.1" in str(err.value), str(err.value)
    assert opened == []  # no silent fallback to the CPU
    proc = project.run("test", "-t", "cuda", "--no-explain")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert f"[cuda/{MODEL}] SKIPPED: no NVIDIA GPU here" in proc.stdout + proc.stderr, proc.stdout + proc.stderr


# ------------------------------------------------------------------------------------ test, release, verify

def test_test_release_and_verify(project: Project, tmp_path: Path) -> None:
    proc = project.run("test", "-t", "fp32", "--no-explain")
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-4000:]
    assert f"[fp32/{MODEL}] PASS" in proc.stdout + proc.stderr
    folder = project.dist("fp32")
    result = json.loads((folder / "test-report.json").read_text())["result"]
    assert result["status"] == "PASS" and result["gates"]["tokens"] == "PASS" and result["gates"]["size"] == "PASS"
    prompts = result["sections"]["tokens"]["prompts"]
    assert [p["prompt"] for p in prompts] == project.prompts()
    assert all(p["first_divergence"] is None and p["agreement"] == 1.0 for p in prompts)  # fp32: exact
    # no [targets.fp32.generation] budget: the generation gate measures nothing (no generation, no process)
    assert result["gates"]["generation"] == "-" and result["sections"]["generation"]["summary"] == "not measured"
    tokens = folder / "golden" / "tokens.json"
    signed = {g["name"]: g["sha256"] for g in json.loads((folder / manifest_types.MANIFEST).read_text())["golden"]}
    assert signed["golden/tokens.json"] == hashlib.sha256(tokens.read_bytes()).hexdigest()
    recorded = json.loads(tokens.read_text())["prompts"]
    assert [p["prompt"] for p in recorded] == project.prompts()
    assert all(p["tokens"] == p["source_tokens"] for p in recorded)

    proc = project.run("release", "-t", "fp32", "--to", str(tmp_path / "rel"))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    public = project.root / "keys" / keys.PUBLIC_FILE
    proc = project.run("verify", str(tmp_path / "rel" / "fp32"), "--public-key", str(public))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert f"golden       {MODEL}: PASS ({len(recorded)} prompts' greedy tokens" in proc.stdout, proc.stdout

    # the recorded tokens edited and signed again with the publisher's key: the bundle verifies as signed, and the
    # bundle's loader does not reproduce them
    root = project.copy(tmp_path / "edited")
    folder = root / "dist" / "fp32" / MODEL
    doc = json.loads((folder / "golden" / "tokens.json").read_text())
    victim = doc["prompts"][3]
    victim["tokens"][2] = victim["tokens"][2] + 1 if victim["tokens"][2] > 10 else 11  # another valid token id
    (folder / "golden" / "tokens.json").write_text(json.dumps(doc))
    signing = keys.signing_key(file=root / "keys" / keys.SIGNING_FILE)
    assert signing is not None
    files = {}
    for g in json.loads((folder / manifest_types.MANIFEST).read_text())["golden"]:
        data = (folder / g["name"]).read_bytes()
        files[g["name"]] = (hashlib.sha256(data).hexdigest(), len(data))
    manifest.sign_golden(folder, files, signing.sign, keys.read_public_key(public), root=root / "dist")
    proc = project.run("release", "-t", "fp32", "--to", str(tmp_path / "rel2"), "--force", root=root)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    proc = project.run("verify", str(tmp_path / "rel2" / "fp32"), "--public-key", str(public))
    assert proc.returncode != 0, proc.stdout + proc.stderr
    assert f"prompt {victim['prompt'][:60]!r}: greedy token 3" in proc.stderr, proc.stderr
    assert "Traceback" not in proc.stderr


def test_building_a_generative_model_not_made_yet_says_how_to_make_it(tmp_path: Path) -> None:
    """Where the builder is installed (so the target's environment fits), the missing directory is the error."""
    (tmp_path / "targets.toml").write_text(TARGETS.replace(f'"models/{MODEL}', '"models/not_made'))
    proc = subprocess.run([sys.executable, "-m", "ortbuild", "build", "-t", "fp32"], cwd=tmp_path,
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 3, proc.stdout + proc.stderr
    assert "Traceback" not in proc.stderr
    assert f"[models.{MODEL}.path] {tmp_path / 'models' / 'not_made'} does not exist: generative model " \
           f"'{MODEL}' is not made yet" in proc.stderr, proc.stderr
    assert "nox -s example-llm" in proc.stderr
