"""A Qwen2 laid out as real models are (models/generate_qwen2.py --size small, trained at test time and cached:
its own tokenizer with Qwen's chat tokens, a chat template, sharded safetensors, tied embeddings) through the whole
generative path: int8 passes the tokens gate though its greedy continuations flip (at near-ties, reported with
fp32's margin), a harmful int4 fails naming the position, both tokens and fp32's margin, `precision_search =
"auto"` repairs the builder's default int4 (harmful on a model this narrow: 128 hidden channels, two of them
outliers), and the artifact answers chat messages through the model's own template. The 10.5M-parameter size, on
which the builder's default int4 passes as it is, is measured by tests/benchmarks/bench_gen_gates.py
(docs/generative.md#the-tokens-gate)."""

from __future__ import annotations

import importlib.util
import json
import sys
import tomllib
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import here_runtime, run_cli
from tests.genmodels import qwen2_llm

pytestmark = pytest.mark.generative

HARMFUL = "int4 = { block_size = 128, accuracy_level = 4 }"


@pytest.fixture(scope="module")
def qwen() -> Path:
    pytest.importorskip("torch")
    pytest.importorskip("onnxruntime_genai")
    return qwen2_llm("small")


@pytest.fixture(scope="module")
def project(qwen: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("qwen2")
    (root / "targets.toml").write_text(f"""[project]
name = "q"
version = "1"
[models.qwen]
path = "{qwen}"
inputs = "{qwen / 'prompts.txt'}"
heldout = "{qwen / 'heldout.txt'}"
[targets.int8]
runtime = "{here_runtime()}"
providers = ["CPUExecutionProvider"]
models = ["qwen"]
precision = "int8-dynamic"
[targets.harmful]
extends = "int8"
precision = "int4-weight"
{HARMFUL}
[targets.repaired]
extends = "harmful"
int4 = {{ block_size = 32, accuracy_level = 4 }}
precision_search = "auto"
""")
    return root


def test_the_model_is_laid_out_as_real_models_are(qwen: Path) -> None:
    config = json.loads((qwen / "config.json").read_text())
    assert config["architectures"] == ["Qwen2ForCausalLM"] and config["tie_word_embeddings"] is True
    index = json.loads((qwen / "model.safetensors.index.json").read_text())
    shards = sorted(set(index["weight_map"].values()))
    assert len(shards) >= 2 and all((qwen / s).is_file() for s in shards)
    assert not (qwen / "model.safetensors").exists()
    vocab = json.loads((qwen / "tokenizer.json").read_text())["added_tokens"]
    assert {"<|im_start|>", "<|im_end|>", "<|endoftext|>"} <= {t["content"] for t in vocab}
    template = (qwen / "chat_template.jinja").read_text() if (qwen / "chat_template.jinja").is_file() else \
        json.loads((qwen / "tokenizer_config.json").read_text())["chat_template"]
    assert "<|im_start|>" in template and "add_generation_prompt" in template


def test_int8_passes_by_its_distribution_though_greedy_flips(project: Path) -> None:
    assert run_cli("build", "-t", "int8", cwd=project).returncode == 0
    proc = run_cli("test", "-t", "int8", "--no-explain", cwd=project)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    doc = json.loads((project / "dist" / "int8" / "qwen" / "test-report.json").read_text())
    tokens = doc["result"]["sections"]["tokens"]
    assert tokens["kl_mean"] < tokens["rule"]["max_kl"] and tokens["top1_decided"] >= tokens["rule"]["min_top1"]
    assert tokens["agreement"] < 1.0  # greedy flips...
    flips = [p["flip_margin"] for p in tokens["prompts"] if p["flip_margin"] is not None]
    assert flips and max(flips) < tokens["rule"]["margin"]  # ...at near-ties, reported with fp32's margin


def test_a_harmful_int4_fails_naming_position_tokens_and_margin(project: Path) -> None:
    assert run_cli("build", "-t", "harmful", cwd=project).returncode == 0
    proc = run_cli("test", "-t", "harmful", "--no-explain", cwd=project)
    said = proc.stdout + proc.stderr
    assert proc.returncode == 9, said
    kl = next(line for line in said.splitlines() if line.strip().startswith("KL divergence"))
    assert "> max_kl 0.05" in kl and ", step " in kl and "fp32's top-1 '" in kl and "(leading by " in kl
    assert "the artifact's '" in kl


def test_the_search_repairs_a_harmful_int4(project: Path) -> None:
    proc = run_cli("build", "-t", "repaired", cwd=project)
    said = proc.stdout + proc.stderr
    assert proc.returncode == 0, said
    assert "precision_search: tokens gate FAIL" in said and "tokens PASS" in said, said
    entry = tomllib.loads((project / "targets.lock").read_text())["jobs"]["repaired/qwen"]
    assert entry["search"]["tokens"].startswith("PASS") and entry["applies"]["int4"]["accuracy_level"] == 0
    proc = run_cli("test", "-t", "repaired", "--no-explain", cwd=project)
    assert proc.returncode == 0, proc.stdout + proc.stderr


def _loader(folder: Path) -> Any:
    path = folder / "loader" / "ortbuild_qwen.py"
    spec = importlib.util.spec_from_file_location(f"ortbuild_qwen_{folder.parent.name}", path)
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod
    spec.loader.exec_module(mod)
    return mod


def test_chat_goes_through_the_models_own_template(project: Path) -> None:
    folder = project / "dist" / "int8" / "qwen"
    if not folder.is_dir():
        assert run_cli("build", "-t", "int8", cwd=project).returncode == 0
    model = _loader(folder).load(folder=folder)  # the key: $ORTBUILD_KEY (tests/conftest.py)
    messages = [{"role": "user", "content": "What does the build make?"}]
    prompt = model.chat_prompt(messages)
    assert prompt == "<|im_start|>user\nWhat does the build make?<|im_end|>\n<|im_start|>assistant\n"
    reply = model.chat(messages, max_tokens=24)
    assert isinstance(reply, str) and "<|im_end|>" not in reply and "<|im_start|>" not in reply
    session = model.session(max_length=256)
    first = session.send(messages, max_tokens=8)
    assert first == model.chat(messages, max_tokens=8)  # greedy: a session's first turn is chat()'s reply
