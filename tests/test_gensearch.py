"""Build to the gates for a generative model (ortbuild/gating/search/gensearch.py): the order of the builder settings it
tries (no model needed), and on the example LLM a harmful int4 setting (block size 64, the builder's CPU
accuracy level 4) that fails the tokens gate, repaired by `precision_search = "auto"` and kept in targets.lock,
or, with too small a rebuild budget, a failed build that lists every setting it tried."""

from __future__ import annotations

import re
import shutil
import tomllib
from pathlib import Path

import pytest

from ortbuild.gating.search import gensearch
from ortbuild.project import config, plan
from tests.conftest import here_runtime, run_cli

MATMULS = ["/model/layers.0/attn/qkv_proj/MatMul", "/model/layers.0/mlp/down_proj/MatMul",
           "/model/layers.1/attn/qkv_proj/MatMul", "/model/layers.2/attn/qkv_proj/MatMul", "/lm_head/MatMul"]


def _job(tmp_path: Path, precision: str, options: str, hf: Path | None = None) -> plan.Job:
    hf = hf or Path(__file__).parent / "fixtures" / "hf_stub"
    (tmp_path / "targets.toml").write_text(f"""[project]
name = "t"
version = "1"
[models.llm]
path = "{hf}"
inputs = "{hf / 'prompts.txt'}"
[targets.t]
runtime = "{here_runtime()}"
providers = ["CPUExecutionProvider"]
models = ["llm"]
precision = "{precision}"
{options}
""")
    return plan.jobs(config.load(tmp_path / "targets.toml"))[0]


def test_int4_tries_accuracy_then_smaller_blocks_then_float_layers(tmp_path: Path) -> None:
    job = _job(tmp_path, "int4-weight", "int4 = { block_size = 128, accuracy_level = 4 }")
    tried = list(gensearch.candidates(job, MATMULS))
    assert [what for what, _, _ in tried] == ["accuracy_level 0", "block_size 32", "block_size 16", "asymmetric blocks",
                                              "lm_head kept in float", "layers 0, 2 kept in float",
                                              "layer 1 kept in float"]
    assert all(table == "int4" for _, table, _ in tried)
    last = tried[-1][2]
    assert last["accuracy_level"] == 0 and last["block_size"] == 16 and last["symmetric"] is False  # cumulative
    assert last["exclude_nodes"] == ["/lm_head/MatMul", "/model/layers.0/attn/qkv_proj/MatMul",
                                     "/model/layers.0/mlp/down_proj/MatMul", "/model/layers.2/attn/qkv_proj/MatMul",
                                     "/model/layers.1/attn/qkv_proj/MatMul"]


def test_every_kind_of_knob_comes_within_a_few_rebuilds_on_a_deep_model(tmp_path: Path) -> None:
    """24 layers (Qwen2.5-0.5B's depth): the layers in float grow 2, 4, 8, ... so every knob and every layer is
    reached in 10 rebuilds, where one layer at a time took 28."""
    job = _job(tmp_path, "int4-weight", "int4 = { block_size = 32, accuracy_level = 4 }")
    deep = [f"/model/layers.{i}/mlp/down_proj/MatMul" for i in range(24)] + ["/lm_head/MatMul"]
    tried = [what for what, _, _ in gensearch.candidates(job, deep)]
    assert tried[:4] == ["accuracy_level 0", "block_size 16", "asymmetric blocks", "lm_head kept in float"]
    assert tried[4:] == ["layers 0, 23 kept in float", "layers 1, 2, 21, 22 kept in float",
                         "layers 3, 4, 5, 6, 17, 18, 19, 20 kept in float",
                         "layers 7, 8, 9, 10, 11, 12, 13, 14, 15, 16 kept in float"]


def test_asymmetric_blocks_are_not_tried_on_tied_int4_embeddings(tmp_path: Path) -> None:
    """onnxruntime-genai 0.18's tied int4 embeddings (GatherBlockQuantized over lm_head) take symmetric blocks only:
    the asymmetric graph does not load; the search says so instead of building it."""
    hf = tmp_path / "tied"
    shutil.copytree(Path(__file__).parent / "fixtures" / "hf_stub", hf)
    (hf / "config.json").write_text('{"architectures": ["Qwen2ForCausalLM"], "model_type": "qwen2", '
                                    '"tie_word_embeddings": true}')
    job = _job(tmp_path, "int4-weight", "int4 = { block_size = 32, accuracy_level = 0 }", hf)
    tried = list(gensearch.candidates(job, MATMULS))
    assert tried[1][0].startswith("asymmetric blocks: not tried: the builder's tied int4 embeddings")
    assert not tried[1][2]
    assert all(keys.get("symmetric", True) for _, _, keys in tried)
    job = _job(tmp_path, "int4-weight", 'int4 = { block_size = 32, accuracy_level = 0, exclude_nodes = '
                                        '["/lm_head/MatMul"] }', hf)  # lm_head in float: nothing tied is quantized
    assert [w for w, _, _ in gensearch.candidates(job, MATMULS)][1] == "asymmetric blocks"


def test_an_accurate_int4_and_int8_only_keep_layers_in_float(tmp_path: Path) -> None:
    job = _job(tmp_path, "int4-weight", "int4 = { block_size = 16, accuracy_level = 0, symmetric = false }")
    assert next(w for w, _, _ in gensearch.candidates(job, MATMULS)) == "lm_head kept in float"
    job = _job(tmp_path, "int8-dynamic", "")
    tried = list(gensearch.candidates(job, MATMULS))
    assert tried[0][:2] == ("lm_head kept in float", "quantization")
    assert len(tried) == 3  # lm_head, then layers 0 and 2, then layer 1
    assert gensearch.outside_in(5) == [0, 4, 1, 3, 2] and gensearch.outside_in(0) == []


@pytest.fixture
def harmful(llm: Path, tmp_path: Path) -> Path:
    pytest.importorskip("onnxruntime_genai")
    pytest.importorskip("transformers")
    (tmp_path / "targets.toml").write_text(f"""[project]
name = "t"
version = "1"
[models.llm]
path = "{llm}"
inputs = "{llm / 'prompts.txt'}"
heldout = "{llm / 'heldout.txt'}"
[targets.int4]
runtime = "{here_runtime()}"
providers = ["CPUExecutionProvider"]
models = ["llm"]
precision = "int4-weight"
int4 = {{ block_size = 64, accuracy_level = 4 }}
precision_search = "auto"
""")
    return tmp_path


@pytest.mark.generative
def test_a_harmful_int4_is_repaired_and_kept_in_the_lock(harmful: Path) -> None:
    proc = run_cli("build", "-t", "int4", cwd=harmful)
    assert proc.returncode == 0, proc.stderr + proc.stdout
    said = proc.stdout + proc.stderr
    assert re.search(r"precision_search: tokens gate FAIL \(FAIL: .*agreement 0\.[0-6]", said), said
    entry = tomllib.loads((harmful / "targets.lock").read_text())["jobs"]["int4/llm"]
    applied = entry["applies"]["int4"]
    assert applied["accuracy_level"] == 0 and applied["block_size"] < 64, applied
    assert entry["search"]["tokens"].startswith("PASS")
    proc = run_cli("test", "-t", "int4", cwd=harmful)  # what ships passes its gate
    assert proc.returncode == 0, proc.stderr + proc.stdout
    assert "tokens PASS" in proc.stdout
    assert run_cli("build", "-t", "int4", "--locked", cwd=harmful).returncode == 0  # the lock is up to date


@pytest.mark.generative
def test_without_budget_the_build_fails_naming_what_it_tried(harmful: Path) -> None:
    proc = run_cli("build", "-t", "int4", "--explain-rebuilds", "1", cwd=harmful)
    assert proc.returncode != 0
    said = proc.stderr + proc.stdout
    assert "found no builder setting whose tokens pass" in said, said
    assert "accuracy_level 0: tokens FAIL" in said and "(stopped: 1 rebuilds" in said, said
    assert "Traceback" not in said
    assert not (harmful / "targets.lock").exists() or "int4/llm" not in (harmful / "targets.lock").read_text()
