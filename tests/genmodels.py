"""The example generative model for tests and benchmarks, made once per machine and cached.

`example_llm()` runs models/generate_llm.py (a small Llama trained on this repository's docs, Hugging Face
format) the first time and returns the cached directory afterwards. Nothing is committed and nothing is
downloaded. The cache is keyed by a digest of everything the weights depend on: models/generate_llm.py, the
training text (models/tiny_llama.corpus.txt) and the versions of the libraries that train it; the directory is
written under a temporary name and renamed into place, and a lock file makes concurrent pytest workers wait for
the one that trains instead of training too (the others never see half a model).

Use it from a session-scoped fixture (tests marked `generative`, run with the venv that holds torch):

    import pytest
    from tests.genmodels import example_llm

    pytestmark = pytest.mark.generative

    @pytest.fixture(scope="session")
    def llm_dir() -> Path:
        pytest.importorskip("torch")
        return example_llm()

    def test_prompts(llm_dir: Path) -> None:
        assert (llm_dir / "prompts.txt").read_text().strip()
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from importlib import metadata
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
GENERATOR = ROOT / "models" / "generate_llm.py"
QWEN2 = ROOT / "models" / "generate_qwen2.py"  # a Qwen2 as real models are laid out (sharded, chat template)
CORPUS = ROOT / "models" / "tiny_llama.corpus.txt"  # the training text: a committed snapshot of the docs' prose
# the libraries whose versions change the weights or the files written
LIBRARIES = ("torch", "transformers", "tokenizers", "safetensors", "numpy")
# written last by generate_llm.py: a directory without it is not a finished model
DONE = "generated.json"


def default_cache_root() -> Path:
    """$XDG_CACHE_HOME/ortbuild-tests, else ~/.cache/ortbuild-tests."""
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "ortbuild-tests"


def _version(name: str) -> str:
    try:
        return metadata.version(name)
    except metadata.PackageNotFoundError:
        return "absent"


def llm_digest(*generators: Path) -> str:
    """sha256 (first 16 hex digits) of what the example model's weights depend on (and `generators`')."""
    h = hashlib.sha256()
    for path in [GENERATOR, CORPUS, *generators]:
        h.update(path.relative_to(ROOT).as_posix().encode() + b"\0" + path.read_bytes() + b"\0")
    for name in LIBRARIES:
        h.update(f"{name}=={_version(name)}\0".encode())
    h.update(f"python {sys.version_info.major}.{sys.version_info.minor}\0".encode())
    return h.hexdigest()[:16]


@contextlib.contextmanager
def locked(lock: Path) -> Iterator[None]:
    """An exclusive lock on `lock` (POSIX flock; elsewhere no lock: the atomic rename still keeps the cache whole,
    concurrent workers then merely train twice)."""
    try:
        import fcntl
    except ImportError:  # pragma: no cover - Windows
        yield
        return
    with lock.open("a") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def example_llm(cache_root: Path | None = None, steps: int | None = None) -> Path:
    """The example model's directory (config.json, model.safetensors, tokenizer files, prompts.txt, heldout.txt,
    generated.json), made on first use into `cache_root` (default: `default_cache_root()`) under
    llm-<digest>[-<steps>]/. `steps` overrides the generator's default training steps (a quicker, worse model).
    Needs torch, transformers and tokenizers in this interpreter; raises RuntimeError with the generator's output
    when it fails."""
    name = f"llm-{llm_digest()}" + (f"-{steps}" if steps is not None else "")
    return _made(cache_root, name, [str(GENERATOR)] + (["--steps", str(steps)] if steps is not None else []))


def qwen2_llm(size: str = "small", cache_root: Path | None = None) -> Path:
    """models/generate_qwen2.py's model of `size` (small: 1.1M parameters, about 1.5 minutes to train; bench:
    10.5M, about 10), cached as example_llm's is: a Qwen2 with its own tokenizer, sharded weights and a chat
    template."""
    return _made(cache_root, f"qwen2-{size}-{llm_digest(QWEN2)}", [str(QWEN2), "--size", size])


def _made(cache_root: Path | None, name: str, generator: list[str]) -> Path:
    """The cached model `name`, made by running `generator` (a script and its arguments, the output directory
    appended) under a lock, into a temporary directory renamed into place."""
    root = cache_root if cache_root is not None else default_cache_root()
    root.mkdir(parents=True, exist_ok=True)
    final = root / name
    if (final / DONE).is_file():
        return final
    with locked(root / f"{name}.lock"):
        if (final / DONE).is_file():  # made by another worker while this one waited
            return final
        tmp = Path(tempfile.mkdtemp(prefix=f"{name}.tmp-", dir=root))
        try:
            done = subprocess.run([sys.executable, generator[0], str(tmp / "model"), *generator[1:]],
                                  capture_output=True, text=True, check=False)
            if done.returncode != 0:
                raise RuntimeError(
                    f"{Path(generator[0]).name} failed (exit {done.returncode}) with {sys.executable}:\n"
                    f"{done.stderr[-4000:]}")
            if final.exists():  # a finished model cannot be here (checked under the lock): a leftover
                shutil.rmtree(final)
            os.replace(tmp / "model", final)
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
    return final


# Several runs of onnxruntime-genai's model builder in one interpreter: importing it (torch, transformers) is about
# 5.5 s of a 6.5 s run on the example model, so each run after the first costs a second, not six
_BUILDER_RUNS = """import json, runpy, sys
for argv in json.loads(sys.argv[1]):
    sys.argv = ["onnxruntime_genai.models.builder", *argv]
    runpy.run_module("onnxruntime_genai.models.builder", run_name="__main__")
"""


def builder_runs(*runs: list[str], cwd: Path | None = None) -> None:
    """Run the model builder once per argument list (its command line: -i, -o, -p, -e, ...), in order, in one
    fresh interpreter of this Python (each run's module code executes anew, as under `python -m`). Raises
    RuntimeError with the builder's output when a run fails."""
    done = subprocess.run([sys.executable, "-c", _BUILDER_RUNS, json.dumps(runs)], capture_output=True, text=True,
                          cwd=cwd, check=False)
    if done.returncode != 0:
        raise RuntimeError(f"the model builder failed (exit {done.returncode}) on {runs}:\n{done.stderr[-4000:]}")
