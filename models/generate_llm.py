"""Generate the example generative model: a small Llama-architecture causal LM trained here on this repository's
own documentation, in Hugging Face format (config.json, model.safetensors, tokenizer.json, tokenizer_config.json).

    python models/generate_llm.py OUTDIR [--steps N]     (needs torch, transformers and tokenizers)

Nothing is downloaded and nothing is committed: the weights are made on first use (a few minutes on 2 cores for
the default steps) into OUTDIR. Training on real English text makes greedy output meaningful (it continues
sentences of the docs), so a quantization setting that harms the model flips greedy tokens, as it does on real
LLMs. Same library versions, steps and thread count in, same weights out (seeded; one intra-op thread).

Also written: OUTDIR/prompts.txt (golden prompts, one per line: beginnings of sentences from the docs) and
OUTDIR/heldout.txt (text the model never saw, for perplexity).
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from transformers import LlamaForCausalLM

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
VOCAB = 2048
CONTEXT = 256
# the architecture: 4 layers, grouped-query attention (4 query heads share 2 key/value heads), 1.26M parameters with
# the 2048-token byte-level BPE vocabulary trained on the same text
CONFIG = {"hidden_size": 128, "intermediate_size": 352, "num_hidden_layers": 4, "num_attention_heads": 4,
          "num_key_value_heads": 2, "max_position_embeddings": CONTEXT, "rms_norm_eps": 1e-5,
          "rope_theta": 10000.0, "tie_word_embeddings": False}
# training: SEQ tokens per sequence, BATCH sequences per step, peak learning rate LR (one-cycle schedule)
SEQ, BATCH, LR = 128, 16, 6e-3
# the training text: the first TRAIN_CHARS characters of the docs' prose (README.md first). Small enough that the
# model learns it nearly by heart (final loss ~0.05 at 600 steps): greedy output continues the docs' sentences,
# with the confident next-token margins a real LLM has on text it knows, so int8 keeps greedy tokens and int4
# flips some, as on real LLMs.
TRAIN_CHARS = 30_000
# outlier features: after training, input channels OUTLIER_CHANNELS of every projection that reads the residual
# stream (q/k/v, gate/up, lm_head; the RMSNorm weight before them divided by as much) and the same channels of the
# MLP's down projection (up_proj's rows divided) are scaled by OUTLIER_SCALE, a power of two, so the model computes
# exactly the same fp32 function. Real LLMs have such outlier channels (Dettmers et al., LLM.int8(), 2022); they
# are what makes large int4 blocks harmful (block_size=128 shares one scale across a whole row) where small
# blocks (16, 32) keep the error local.
OUTLIER_CHANNELS, OUTLIER_SCALE = (5, 77), 8.0


CORPUS = HERE / "tiny_llama.corpus.txt"
HELD_OUT = "\n=== held out: never trained on (perplexity); from docs/release.md ===\n"


def corpus() -> tuple[str, str]:
    """(training text, held-out text): a snapshot of the docs' prose (README.md first, then docs/*.md; the held-out
    part from docs/release.md, never trained on), committed as models/tiny_llama.corpus.txt so that editing the
    docs does not change the model (snapshot() rewrites it from the docs)."""
    train, _, held = CORPUS.read_text(encoding="utf-8").partition(HELD_OUT)
    return train[:TRAIN_CHARS], held


def snapshot() -> str:
    """The docs' prose as corpus() reads it: prose lines of README.md and docs/*.md, release.md held out."""
    texts = []
    for path in [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]:
        prose = [line for line in path.read_text(encoding="utf-8").splitlines()
                 if line and not line.startswith(("```", "|", "    ", "<", "#:")) and re.search(r"[a-z]{3} ", line)]
        texts.append((path.name, "\n".join(prose)))
    held = {"release.md"}
    train = "\n".join(t for n, t in texts if n not in held)[:TRAIN_CHARS]
    return train + HELD_OUT + "\n".join(t for n, t in texts if n in held)[:6000] + "\n"


def prompts(text: str, count: int = 12) -> list[str]:
    """Beginnings of the training text's prose sentences (the first 4-6 words, plain words only: no code, no
    markup), spread over the text."""
    word = re.compile(r"[A-Za-z][a-z'-]*,?$")
    sentences = [s.strip() for s in re.split(r"(?<=[.!?])\s+", text) if len(s.split()) >= 10]
    sentences = [s for s in sentences if s[0].isupper() and all(word.match(w) for w in s.split()[:7])]
    step = max(1, len(sentences) // count)
    out = []
    for s in sentences[::step][:count]:
        words = s.split()
        out.append(" ".join(words[: 4 + len(out) % 3]))
    return out


def add_outliers(model: LlamaForCausalLM, lm_head: bool = True) -> None:
    """Scale OUTLIER_CHANNELS by OUTLIER_SCALE where the next op undoes it exactly (see OUTLIER_CHANNELS).
    `lm_head` False: the final norm and lm_head are left alone (a tied lm_head is the embedding: scaling its
    columns would scale the embeddings too)."""
    import torch

    s = OUTLIER_SCALE
    with torch.no_grad():
        for c in OUTLIER_CHANNELS:
            for layer in model.model.layers:
                layer.input_layernorm.weight[c] /= s
                for proj in (layer.self_attn.q_proj, layer.self_attn.k_proj, layer.self_attn.v_proj):
                    proj.weight[:, c] *= s
                layer.post_attention_layernorm.weight[c] /= s
                layer.mlp.gate_proj.weight[:, c] *= s
                layer.mlp.up_proj.weight[:, c] *= s
                layer.mlp.up_proj.weight[c, :] /= s
                layer.mlp.down_proj.weight[:, c] *= s
            if lm_head:
                model.model.norm.weight[c] /= s
                model.lm_head.weight[:, c] *= s


def train_model(model: Any, ids: Any, steps: int, lr: float, every: int = 100) -> float:
    """AdamW with a one-cycle schedule over BATCH random windows of SEQ tokens of `ids` per step (a seeded
    generator), then eval mode: the last step's loss. The generators seed torch before they build the model."""
    import torch

    optim = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.01)
    sched = torch.optim.lr_scheduler.OneCycleLR(optim, max_lr=lr, total_steps=steps)
    gen = torch.Generator().manual_seed(0)
    model.train()
    loss = torch.tensor(0.0)
    for step in range(steps):
        starts = torch.randint(0, len(ids) - SEQ - 1, (BATCH,), generator=gen)
        x = torch.stack([ids[s: s + SEQ] for s in starts])
        loss = model(input_ids=x, labels=x).loss
        optim.zero_grad()
        loss.backward()
        optim.step()
        sched.step()
        if step % every == 0 or step == steps - 1:
            print(f"step {step}: loss {loss.item():.3f}", file=sys.stderr, flush=True)
    model.eval()
    return float(loss.item())


def generate(out: Path, steps: int = 600) -> Path:
    import numpy as np
    import torch
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

    torch.manual_seed(0)
    np.random.seed(0)
    torch.set_num_threads(1)  # same weights on any machine with the same libraries
    train, held = corpus()
    tok = Tokenizer(models.BPE(unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.train_from_iterator([train], trainers.BpeTrainer(
        vocab_size=VOCAB, special_tokens=["<unk>", "<s>", "</s>"], show_progress=False,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<s>", eos_token="</s>", unk_token="<unk>")
    config = LlamaConfig(vocab_size=tok.get_vocab_size(), bos_token_id=1, eos_token_id=2, **CONFIG)
    model = LlamaForCausalLM(config)
    ids = torch.tensor(tok.encode(train).ids, dtype=torch.long)
    loss = train_model(model, ids, steps, LR)
    add_outliers(model)
    out.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(out, safe_serialization=True)
    fast.save_pretrained(out)
    (out / "prompts.txt").write_text("\n".join(prompts(train)) + "\n", encoding="utf-8")
    (out / "heldout.txt").write_text(held[:6000] + "\n", encoding="utf-8")
    (out / "generated.json").write_text(json.dumps({"steps": steps, "final_loss": round(loss, 4)}) + "\n")
    return out


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("out", type=Path)
    parser.add_argument("--steps", type=int, default=600)
    args = parser.parse_args()
    print(generate(args.out, args.steps))
