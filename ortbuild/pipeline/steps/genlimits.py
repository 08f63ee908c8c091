"""What a generative model's build can be refused for before the model builder runs (its `check` step), read from
the directory's config.json, its weights' sizes and its tokenizer: an architecture the builder does not make (or
attention heads ONNX Runtime's GroupQueryAttention cannot run), a model that cannot be one ONNX file at the
target's precision (the 2 GB protobuf limit, docs/generative.md), a golden prompt that does not fit the context
with the tokens the gate generates after it, and generation lengths over the context. Each is a ConfigError
naming the key, the prompt or the limit, in seconds rather than after the builder's minutes."""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from ortbuild.errors import ConfigError
from ortbuild.project import generation
from ortbuild.project.config import Settings

PROTOBUF_LIMIT = (2 << 30) - (64 << 20)  # a single ONNX file is a protobuf: under 2 GiB, with room for the graph

# The decoder-only text models onnxruntime-genai 0.18.0's builder makes (its create_model(), by config.json's
# `architectures[0]`; its vision, audio and speech models are not decoder LLMs the loader can run)
ARCHITECTURES = frozenset({
    "ChatGLMForConditionalGeneration", "ChatGLMModel", "Ernie4_5ForCausalLM", "GemmaForCausalLM", "Gemma2ForCausalLM",
    "Gemma3ForCausalLM", "GptOssForCausalLM", "GraniteForCausalLM", "GraniteMoeHybridForCausalLM",
    "HunYuanDenseV1ForCausalLM", "InternLM2ForCausalLM", "Lfm2ForCausalLM", "Lfm2MoeForCausalLM", "LlamaForCausalLM",
    "MistralForCausalLM", "NemotronForCausalLM", "OlmoForCausalLM", "PhiForCausalLM", "Phi3ForCausalLM",
    "PhiMoEForCausalLM", "Phi3SmallForCausalLM", "Qwen2ForCausalLM", "Qwen3ForCausalLM", "SmolLM3ForCausalLM"})

# bytes per weight of the built graph, by the builder's precision: a lower bound (int8/int4 keep the embeddings in
# float and add scales, so they are bigger than this)
BYTES_PER_WEIGHT = {"fp32": 4.0, "fp16": 2.0, "int8-dynamic": 1.0, "int4-weight": 0.5}
DTYPE_BYTES = {"float32": 4, "float16": 2, "bfloat16": 2, "float64": 8}


def weights(folder: Path, hf: Mapping[str, Any]) -> tuple[int, int]:
    """(parameters, bytes of the weight files) of a Hugging Face directory: the safetensors index's total_size or
    the weight files' sizes, over the bytes per parameter of config.json's dtype (float32 where unstated)."""
    index = folder / "model.safetensors.index.json"
    total = 0
    if index.is_file():
        try:
            total = int(json.loads(index.read_text(encoding="utf-8"))["metadata"]["total_size"])
        except (OSError, ValueError, KeyError, TypeError):
            total = 0
    if not total:
        total = sum(f.stat().st_size for f in folder.iterdir()
                    if f.is_file() and f.suffix in (".safetensors", ".bin"))
    dtype = str(hf.get("torch_dtype") or hf.get("dtype") or "float32")
    return total // DTYPE_BYTES.get(dtype, 4), total


def context_of(hf: Mapping[str, Any]) -> int | None:
    """The model's context length as the builder reads it (max_position_embeddings; None where unstated)."""
    value = hf.get("max_position_embeddings", hf.get("seq_length"))
    return int(value) if isinstance(value, int) and value > 0 else None


def check(folder: Path, hf: Mapping[str, Any], settings: Settings, prompts: Sequence[str], config: str,
          target: str, model: str, prompts_file: Path) -> None:
    """Refuse, before the builder runs, what it would refuse or make unusable (the module's docstring)."""
    arch = str(hf["architectures"][0])
    if arch not in ARCHITECTURES:
        raise ConfigError(config, f"models.{model}.path", f"{folder / generation.HF_CONFIG} names architecture {arch}, "
                          "which onnxruntime-genai 0.18.0's model builder does not make as a decoder LLM",
                          f"one of {', '.join(sorted(ARCHITECTURES))}")
    heads, hidden = hf.get("num_attention_heads"), hf.get("hidden_size")
    head = hf.get("head_dim") or (hidden // heads if isinstance(hidden, int) and isinstance(heads, int) and heads
                                  else None)
    if isinstance(head, int) and head % 8:
        raise ConfigError(config, f"models.{model}.path", f"{folder / generation.HF_CONFIG}: attention heads of {head} "
                          f"channels (hidden_size {hidden} / num_attention_heads {heads}): ONNX Runtime 1.31's "
                          "GroupQueryAttention, which the builder's graph uses, needs a multiple of 8 (\"head_size "
                          "must be a multiple of 8\" at the first token)", "a model whose head size is a multiple of 8")
    params, stored = weights(folder, hf)
    least = params * BYTES_PER_WEIGHT.get(settings.precision, 0.5)
    if least > PROTOBUF_LIMIT:
        raise ConfigError(config, f"targets.{target}.precision", f"model '{model}' has about {params / 1e6:.0f}M "
                          f"parameters ({stored / (1 << 30):.2f} GiB of weights): at {settings.precision} its graph "
                          f"would hold at least {least / (1 << 30):.2f} GiB, over the 2 GiB one ONNX file can hold "
                          "(onnxruntime-genai 0.18 opens a model from memory as one file: docs/generative.md)",
                          "int4-weight (or int8-dynamic below about 1.9B parameters), or a smaller model")
    context = context_of(hf)
    if context is None:
        return
    gates = settings.gates
    if gates is not None:
        g = gates.generation
        if g.context_length is not None and g.context_length > context:
            raise ConfigError(config, f"targets.{target}.generation.context_length", f"{g.context_length} is above "
                              f"model '{model}''s context length {context} (max_position_embeddings in "
                              f"{folder / generation.HF_CONFIG})", f"at most {context}")
        limit = g.context_length or context
        if g.declared and g.prompt_tokens + g.new_tokens > limit:
            raise ConfigError(config, f"targets.{target}.generation", f"prompt_tokens + new_tokens = "
                              f"{g.prompt_tokens + g.new_tokens} is above the context length {limit} of model "
                              f"'{model}'", "state lengths the context holds")
        _prompts_fit(folder, prompts, gates.tokens.max_tokens, context, config, target, model, prompts_file)


def _prompts_fit(folder: Path, prompts: Sequence[str], new: int, context: int, config: str, target: str,
                 model: str, prompts_file: Path) -> None:
    """Every golden prompt, tokenized by the directory's tokenizer.json, leaves room for the `new` tokens the
    tokens gate generates after it (tokenizers, where installed: the builder's venv has it)."""
    try:
        from tokenizers import Tokenizer
    except ImportError:
        return
    try:
        tok = Tokenizer.from_file(str(folder / generation.TOKENIZER))
    except Exception as e:  # the tokenizers library's own exception type
        raise ConfigError(config, f"models.{model}.path", f"{folder / generation.TOKENIZER} cannot be read by the "
                          f"tokenizers library: {str(e)[:200]}", "write it with transformers' save_pretrained()") \
            from None
    for line, prompt in enumerate(prompts, 1):
        count = len(tok.encode(prompt).ids)
        if count + new > context:
            raise ConfigError(config, f"models.{model}.inputs", f"prompt {line} of {prompts_file} "
                              f"({prompt[:60]!r}{'...' if len(prompt) > 60 else ''}) is {count} tokens: with the "
                              f"{new} tokens the tokens gate generates after it, {count + new} is above model "
                              f"'{model}''s context length {context}",
                              f"shorten the prompt, or lower [targets.{target}.tokens] max_tokens")
