"""Generate a Qwen2-architecture causal LM trained here, as a real model's directory is laid out: its own byte-level
BPE tokenizer with Qwen's chat tokens and a chat template, weights sharded (`model-0000N-of-0000M.safetensors` and
`model.safetensors.index.json`), tied embeddings, grouped-query attention with biases on q/k/v.

    python models/generate_qwen2.py OUTDIR [--size small|bench] [--steps N]   (needs torch, transformers, tokenizers)

`small` (1.1M parameters, 300 steps: about 1.5 minutes on one core) is what the tests use; `bench` (10.3M
parameters, 10 layers, 300 steps: about 10 minutes on one core) is what tests/benchmarks/bench_gen_gates.py judges
the token gates on. Both are trained on the same text as the example model (models/tiny_llama.corpus.txt, seeded,
one thread: the same weights on every run with the same libraries) and get its outlier channels
(models/generate_llm.py: exact in fp32, what makes large int4 blocks harmful). Nothing is downloaded or
committed. Also written: prompts.txt, heldout.txt.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from generate_llm import add_outliers, corpus, prompts, train_model

SIZES = {  # hidden, intermediate, layers, heads, kv heads, vocabulary, default steps, shard size
    "small": (128, 384, 4, 4, 2, 2048, 300, "2MB"),
    "bench": (256, 1024, 10, 8, 2, 4096, 300, "8MB"),
}
CONTEXT = 512
LR = 5e-3  # SEQ 128 tokens x BATCH 16 per step, as the example model's (generate_llm.train_model)
SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
# Qwen2's chat template, as its tokenizer_config.json carries it (system message optional)
CHAT_TEMPLATE = (
    "{% for message in messages %}{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>\n' }}"
    "{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}")


def generate(out: Path, size: str = "small", steps: int | None = None) -> Path:
    import numpy as np
    import torch
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast, Qwen2Config, Qwen2ForCausalLM

    hidden, inter, layers, heads, kv, vocab, default_steps, shard = SIZES[size]
    steps = default_steps if steps is None else steps
    torch.manual_seed(0)
    np.random.seed(0)
    torch.set_num_threads(1)
    train, held = corpus()
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.train_from_iterator([train], trainers.BpeTrainer(
        vocab_size=vocab, special_tokens=SPECIALS, show_progress=False,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<|im_end|>", pad_token="<|endoftext|>",
                                   bos_token=None, chat_template=CHAT_TEMPLATE)
    eos = tok.token_to_id("<|im_end|>")
    config = Qwen2Config(vocab_size=tok.get_vocab_size(), hidden_size=hidden, intermediate_size=inter,
                         num_hidden_layers=layers, num_attention_heads=heads, num_key_value_heads=kv,
                         max_position_embeddings=CONTEXT, tie_word_embeddings=True, rope_theta=1e6,
                         bos_token_id=tok.token_to_id("<|endoftext|>"), eos_token_id=eos, rms_norm_eps=1e-6)
    model = Qwen2ForCausalLM(config)
    # the text, and a few chat turns made of it (so the chat tokens are tokens the model has seen)
    sentences = [s.strip() for s in train.split(". ") if len(s.split()) > 6]
    chats = "".join(f"<|im_start|>user\n{a}.<|im_end|>\n<|im_start|>assistant\n{b}.<|im_end|>\n"
                    for a, b in zip(sentences[::2], sentences[1::2], strict=False))
    ids = torch.tensor(tok.encode(train + "\n" + chats).ids, dtype=torch.long)
    loss = train_model(model, ids, steps, LR, every=50)
    add_outliers(model, lm_head=False)  # tied: the embedding is lm_head
    out.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(out, safe_serialization=True, max_shard_size=shard)
    fast.save_pretrained(out)
    (out / "prompts.txt").write_text("\n".join(prompts(train)) + "\n", encoding="utf-8")
    (out / "heldout.txt").write_text(held[:6000] + "\n", encoding="utf-8")
    params = sum(p.numel() for p in model.parameters())
    (out / "generated.json").write_text(json.dumps({"size": size, "steps": steps, "parameters": params,
                                                   "final_loss": round(loss, 4)}) + "\n")
    return out


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("out", type=Path)
    parser.add_argument("--size", choices=sorted(SIZES), default="small")
    parser.add_argument("--steps", type=int)
    args = parser.parse_args()
    print(generate(args.out, args.size, args.steps))
