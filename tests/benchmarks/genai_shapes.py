"""Real-shaped generative models with random weights, for benchmarks at real sizes: a Hugging Face-format
directory (config.json, sharded safetensors, tokenizer.json + tokenizer_config.json) that onnxruntime-genai's
model builder takes, written where you say (into /tmp: never into the repository).

    python tests/benchmarks/genai_shapes.py qwen2.5-0.5b /tmp/qwen05 [--seed 0]

Shapes: qwen2.5-0.5b (Qwen2.5-0.5B's config: 24 layers, hidden 896, 14 heads / 2 KV heads, vocabulary 151936,
tied embeddings; 494M parameters, 1.98 GB in fp32). The weights are random (normal, std 0.02, as transformers
initialises them): the figures of memory and speed are the real model's, its tokens are noise. The tokenizer is a
byte-level BPE with no merges (the 256 byte tokens and the special tokens), padded to the config's vocabulary with
unused placeholder tokens, so that tokenizer and config agree; needs torch, transformers and tokenizers (the
generative venv of nox).
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path
from typing import Any

SHAPES: dict[str, dict[str, Any]] = {
    "qwen2.5-0.5b": {"vocab_size": 151936, "hidden_size": 896, "num_hidden_layers": 24, "num_attention_heads": 14,
                     "num_key_value_heads": 2, "intermediate_size": 4864, "tie_word_embeddings": True,
                     "max_position_embeddings": 32768, "rope_theta": 1e6, "bos_token_id": 151643,
                     "eos_token_id": 151645},
}
SPECIALS = {151643: "<|endoftext|>", 151644: "<|im_start|>", 151645: "<|im_end|>"}


def tokenizer(vocab_size: int) -> Any:
    """A byte-level BPE of `vocab_size` tokens: 256 byte tokens, placeholders, and the specials at their ids."""
    from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    alphabet = pre_tokenizers.ByteLevel.alphabet()
    vocab = {ch: i for i, ch in enumerate(sorted(alphabet))}
    for i in range(len(vocab), vocab_size):
        vocab[SPECIALS.get(i, f"<|unused_{i}|>")] = i
    tok = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    tok.decoder = decoders.ByteLevel()
    tok.add_special_tokens([AddedToken(t, special=True) for t in SPECIALS.values()])
    return PreTrainedTokenizerFast(tokenizer_object=tok, bos_token=SPECIALS[151643], eos_token=SPECIALS[151645],
                                   pad_token=SPECIALS[151643], unk_token=None)


def generate(shape: str, out: Path, seed: int = 0) -> dict[str, Any]:
    """Write the shape's directory into `out`; returns its facts (parameters, fp32 bytes, seconds)."""
    import torch
    import transformers

    start = time.perf_counter()
    torch.manual_seed(seed)
    config = transformers.Qwen2Config(**SHAPES[shape], torch_dtype="float32")
    model = transformers.Qwen2ForCausalLM(config)
    model.generation_config.do_sample = False
    out.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(out, max_shard_size="500MB")
    params = sum(p.numel() for p in model.parameters())  # tied embeddings counted once
    del model
    tokenizer(config.vocab_size).save_pretrained(out)
    facts = {"shape": shape, "parameters": params, "fp32_bytes": 4 * params,
             "seconds": round(time.perf_counter() - start, 1), "dir": str(out)}
    (out / "ortbuild_shape.json").write_text(json.dumps(facts, indent=1) + "\n", encoding="utf-8")
    return facts


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("shape", choices=sorted(SHAPES))
    parser.add_argument("out", type=Path)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    print(json.dumps(generate(args.shape, args.out, args.seed), indent=1))


if __name__ == "__main__":
    main()
