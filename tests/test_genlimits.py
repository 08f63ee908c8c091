"""What a generative build is refused for before the model builder runs (ortbuild/pipeline/steps/genlimits.py): an
architecture the builder does not make, a model too big for one ONNX file at its precision, lengths over the
context, a golden prompt that does not fit: each a ConfigError naming the key and the limit."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from ortbuild.errors import ConfigError
from ortbuild.pipeline.steps import genlimits
from ortbuild.project import config, plan
from tests.conftest import here_runtime

STUB = Path(__file__).parent / "fixtures" / "hf_stub"


def _setup(tmp_path: Path, hf: dict[str, object], target: str = "", weights: int = 0) -> tuple[Path, plan.Job]:
    folder = tmp_path / "llm"
    shutil.copytree(STUB, folder)
    (folder / "config.json").write_text(json.dumps(hf))
    try:  # a real tokenizer.json where the tokenizers library is (the stub's is a placeholder)
        from tokenizers import Tokenizer, models, pre_tokenizers

        tok = Tokenizer(models.WordLevel({"[UNK]": 0, "hello": 1}, unk_token="[UNK]"))
        tok.pre_tokenizer = pre_tokenizers.Whitespace()
        tok.save(str(folder / "tokenizer.json"))
    except ImportError:
        pass
    if weights:
        (folder / "model.safetensors.index.json").write_text(json.dumps({"metadata": {"total_size": weights},
                                                                         "weight_map": {}}))
    (tmp_path / "targets.toml").write_text(f"""[project]
name = "t"
version = "1"
[models.llm]
path = "{folder}"
inputs = "{folder / 'prompts.txt'}"
[targets.t]
runtime = "{here_runtime()}"
providers = ["CPUExecutionProvider"]
models = ["llm"]
{target}
""")
    return folder, plan.jobs(config.load(tmp_path / "targets.toml"))[0]


def _check(folder: Path, job: plan.Job, prompts: tuple[str, ...] = ("Hello",)) -> None:
    hf = json.loads((folder / "config.json").read_text())
    genlimits.check(folder, hf, job.settings, prompts, "targets.toml", "t", "llm", folder / "prompts.txt")


LLAMA = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "max_position_embeddings": 256}


def test_an_architecture_the_builder_does_not_make_is_refused_naming_it(tmp_path: Path) -> None:
    folder, job = _setup(tmp_path, {**LLAMA, "architectures": ["BertForMaskedLM"]})
    with pytest.raises(ConfigError) as err:
        _check(folder, job)
    assert err.value.where == "models.llm.path" and "names architecture BertForMaskedLM" in err.value.detail
    assert "Qwen2ForCausalLM" in err.value.hint and "LlamaForCausalLM" in err.value.hint
    _check(*_setup(tmp_path / "ok", LLAMA))


def test_a_head_size_groupqueryattention_cannot_run_is_refused(tmp_path: Path) -> None:
    """hidden 288 over 8 heads: heads of 36 channels, which ONNX Runtime's GroupQueryAttention refuses at the first
    token ("head_size must be a multiple of 8"), after a builder run that succeeds."""
    folder, job = _setup(tmp_path, {**LLAMA, "hidden_size": 288, "num_attention_heads": 8})
    with pytest.raises(ConfigError) as err:
        _check(folder, job)
    assert "attention heads of 36 channels (hidden_size 288 / num_attention_heads 8)" in err.value.detail
    assert "needs a multiple of 8" in err.value.detail
    _check(*_setup(tmp_path / "ok", {**LLAMA, "hidden_size": 256, "num_attention_heads": 8}))


def test_a_model_too_big_for_one_onnx_file_at_its_precision_is_refused_before_the_builder(tmp_path: Path) -> None:
    """630M float32 parameters (an untied Qwen2.5-0.5B): 2.35 GiB at fp32, over 2 GiB; int4 fits."""
    size = 630_000_000 * 4
    folder, job = _setup(tmp_path, {**LLAMA, "torch_dtype": "float32"}, 'precision = "fp32"', weights=size)
    with pytest.raises(ConfigError) as err:
        _check(folder, job)
    assert err.value.where == "targets.t.precision"
    assert "about 630M parameters (2.35 GiB of weights): at fp32 its graph would hold at least 2.35 GiB, over the " \
           "2 GiB one ONNX file can hold" in err.value.detail
    assert err.value.hint.startswith("int4-weight")
    _check(*_setup(tmp_path / "int4", {**LLAMA, "torch_dtype": "float32"}, 'precision = "int4-weight"', weights=size))
    # bfloat16 weights: 2 bytes a parameter on disk, 4 in the fp32 graph
    folder, job = _setup(tmp_path / "bf16", {**LLAMA, "torch_dtype": "bfloat16"}, 'precision = "fp32"',
                         weights=size // 2)
    with pytest.raises(ConfigError, match="about 630M parameters"):
        _check(folder, job)


def test_generation_lengths_over_the_models_context_are_refused(tmp_path: Path) -> None:
    folder, job = _setup(tmp_path, LLAMA, "generation = { context_length = 512, max_memory_mb = 100 }")
    with pytest.raises(ConfigError) as err:
        _check(folder, job)
    assert err.value.where == "targets.t.generation.context_length"
    assert "512 is above model 'llm''s context length 256 (max_position_embeddings" in err.value.detail
    folder, job = _setup(tmp_path / "b", LLAMA, "generation = { prompt_tokens = 250, new_tokens = 32, "
                                                "ttft_p90_ms = 100 }")
    with pytest.raises(ConfigError, match="prompt_tokens \\+ new_tokens = 282 is above the context length 256"):
        _check(folder, job)


def test_a_golden_prompt_that_does_not_fit_the_context_names_the_prompt_and_the_limit(tmp_path: Path) -> None:
    pytest.importorskip("tokenizers")
    folder, job = _setup(tmp_path, {**LLAMA, "max_position_embeddings": 40}, "tokens = { max_tokens = 32 }")
    long = "the loaders check the same digests " * 3
    with pytest.raises(ConfigError) as err:
        _check(folder, job, ("Hello", long))
    assert err.value.where == "models.llm.inputs"
    assert f"prompt 2 of {folder / 'prompts.txt'} ('the loaders check" in err.value.detail
    assert "with the 32 tokens the tokens gate generates after it" in err.value.detail
    assert "above model 'llm''s context length 40" in err.value.detail
    assert err.value.hint == "shorten the prompt, or lower [targets.t.tokens] max_tokens"
    _check(folder, job, ("Hello",))
