"""The fp32 reference of the token gates: the Hugging Face source directory run with transformers and torch,
in float32, eval mode, without gradients (deterministic: greedy, no sampling).

Per golden prompt: its ids (the HF tokenizer of that directory; the artifact is fed these same ids, never its
own tokenization: on the example model genai's tokenizer gives identical ids for every golden prompt anyway),
the greedy continuation and the teacher-forced next-token logits along it; for a held-out text: its ids (cut
to max_position_embeddings) and their log-probabilities, for perplexity.

torch and transformers are imported when `reference` runs (they live in the build's venv only); the data
classes hold only numpy arrays, lists and strings, so the gate that judges them imports without either.
"""

from __future__ import annotations

import importlib
import inspect
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np


@dataclass(frozen=True)
class PromptReference:
    text: str
    prompt_ids: list[int]
    tokens: list[int]     # greedy continuation: max_tokens ids, fewer when EOS came (then EOS is the last one)
    logits: np.ndarray    # float32 [len(tokens), vocab]: row i = next-token logits after prompt + tokens[:i]


@dataclass(frozen=True)
class Reference:
    prompts: tuple[PromptReference, ...]
    max_tokens: int
    heldout_ids: list[int]                # empty without a held-out text
    heldout_logprobs: np.ndarray | None   # float64 [len(heldout_ids) - 1]: log p(ids[i] | ids[:i]), i >= 1


def _eos_ids(model: Any) -> set[int]:
    found: set[int] = set()
    for source in (model.config, getattr(model, "generation_config", None)):
        value = getattr(source, "eos_token_id", None)
        if value is not None:
            found |= set(value) if isinstance(value, (list, tuple)) else {int(value)}
    return found


def _greedy(torch: Any, model: Any, prompt_ids: list[int], max_tokens: int, eos: set[int]) -> list[int]:
    """Greedy with the KV cache; stops after max_tokens tokens or after EOS (kept)."""
    # transformers 5.2x names the KV cache `cache`; earlier versions `past_key_values`
    name = "cache" if "cache" in inspect.signature(model.forward).parameters else "past_key_values"
    out = model(input_ids=torch.tensor([prompt_ids]), use_cache=True)
    tokens: list[int] = []
    while len(tokens) < max_tokens:
        token = int(out.logits[0, -1].argmax())
        tokens.append(token)
        if token in eos or len(tokens) == max_tokens:
            break
        out = model(input_ids=torch.tensor([[token]]), use_cache=True, **{name: getattr(out, name)})
    return tokens


def _logits(torch: Any, model: Any, ids: list[int]) -> np.ndarray:
    """float32 [len(ids), vocab]: next-token logits after each prefix, one forward pass."""
    return np.asarray(model(input_ids=torch.tensor([ids])).logits[0].float().numpy(), dtype=np.float32)


def reference(hf_dir: Path, prompts: list[str], max_tokens: int, heldout: str | None,
              given: list[str] | None = None) -> Reference:
    """Run the fp32 source on the golden prompts (greedy, `max_tokens` each) and the held-out text.
    `given`: the expected continuation of each prompt (its text, tokenized without special tokens and cut to
    max_tokens) in place of the source's greedy one; the logits are still the source's along it.
    A prompt whose ids plus `max_tokens` exceed max_position_embeddings is a ValueError naming it."""
    torch = importlib.import_module("torch")
    transformers = importlib.import_module("transformers")
    transformers.logging.set_verbosity_error()  # no progress bars or notices on the gate's output
    transformers.logging.disable_progress_bar()
    tokenizer = transformers.AutoTokenizer.from_pretrained(str(hf_dir))
    model = transformers.AutoModelForCausalLM.from_pretrained(str(hf_dir), dtype=torch.float32)
    model.eval()
    context = int(model.config.max_position_embeddings)
    eos = _eos_ids(model)
    refs = []
    with torch.no_grad():
        for n, text in enumerate(prompts):
            ids = [int(i) for i in tokenizer(text)["input_ids"]]
            if not ids:
                raise ValueError(f"prompt {text!r} has no tokens")
            if len(ids) + max_tokens > context:
                raise ValueError(f"prompt {text[:40]!r}: {len(ids)} tokens + {max_tokens} to generate exceed "
                                 f"the model's context of {context} tokens")
            if given is not None:
                tokens = [int(i) for i in tokenizer(given[n], add_special_tokens=False)["input_ids"]][:max_tokens]
                if not tokens:
                    raise ValueError(f"the expected continuation of prompt {text[:40]!r} has no tokens")
            else:
                tokens = _greedy(torch, model, ids, max_tokens, eos)
            logits = _logits(torch, model, [*ids, *tokens[:-1]])[len(ids) - 1:]
            refs.append(PromptReference(text=text, prompt_ids=ids, tokens=tokens, logits=logits))
        heldout_ids: list[int] = []
        heldout_lp = None
        if heldout is not None:
            heldout_ids = [int(i) for i in tokenizer(heldout)["input_ids"]][:context]
            heldout_lp = (log_probs_of(_logits(torch, model, heldout_ids[:-1]), heldout_ids)
                          if len(heldout_ids) >= 2 else np.zeros(0, dtype=np.float64))
    return Reference(prompts=tuple(refs), max_tokens=max_tokens, heldout_ids=heldout_ids,
                     heldout_logprobs=heldout_lp)


def log_probs_of(logits: np.ndarray, ids: list[int]) -> np.ndarray:
    """float64 [len(ids) - 1]: log-softmax of `logits` (row i: after ids[:i+1]) at ids[i+1]."""
    if len(ids) < 2:
        return np.zeros(0, dtype=np.float64)
    wide = np.asarray(logits[: len(ids) - 1], dtype=np.float64)
    top = wide.max(axis=1, keepdims=True)
    logz = top[:, 0] + np.log(np.exp(wide - top).sum(axis=1))
    target = np.asarray(ids[1:])
    return np.asarray(wide[np.arange(len(target)), target] - logz, dtype=np.float64)
