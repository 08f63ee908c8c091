"""The artifact side of the token gates: greedy generation, teacher-forced next-token logits and
log-probabilities through onnxruntime-genai, on a model the caller has already opened (`og.Model`, from memory
or from a directory).

Every function takes token ids, never text: the ids come from the reference's tokenizer (reference.py), so the
artifact and the fp32 source are compared on the same input. Each call makes its own `og.Generator` (a fresh
KV cache), so the calls do not depend on each other's state.

`onnxruntime_genai` is imported when a function runs, not when this module is imported (the package ships no
type information, and `Candidate` crosses into the gating layer, which must import without it).

How the logits are read. After `Generator.append_tokens(ids)` of many tokens, `get_output("logits")` holds the
logits of every appended position ([1, len(ids), vocab] on the builder's CPU graphs), but they are not always
the logits generation sees: int4 MatMulNBits (accuracy_level 4) runs another kernel for one row than for many,
and on the example model the prefill's rows differ from one-token appends by up to 0.013 (fp32: 5e-6, int8:
4e-5; logits of magnitude ~8). So `teacher_forced` does what greedy generation does: one append of the prompt,
then one token at a time (the cost of generating as many tokens): row i is exactly what greedy search would
have computed had it chosen continuation[:i]. `log_probs` (perplexity, a whole-text score) uses the one
prefill, as perplexity is usually computed; a graph that returns the last position only is fed one token at a
time there too.
"""

from __future__ import annotations

import importlib
import json
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from ortbuild.generative.reference import Reference, log_probs_of

Model = Any  # an opened onnxruntime_genai.Model (untyped)


@dataclass(frozen=True)
class Trace:
    """One greedy generation: the new tokens and how long they took."""

    tokens: list[int]     # the continuation only (not the prompt); ends with EOS when the model produced it
    ttft_s: float         # time to first token: the prompt's append (prefill) + choosing the first token
    step_s: list[float]   # each later token (decode): len(tokens) - 1 entries


@dataclass(frozen=True)
class Candidate:
    """What the artifact made of a `Reference`'s prompts and held-out text (judged by gating/tokens.py)."""

    traces: tuple[Trace, ...]            # per prompt: greedy from the prompt ids
    logits: tuple[np.ndarray, ...]       # per prompt: teacher_forced along the reference's continuation
    heldout_logprobs: np.ndarray | None  # log_probs of the reference's held-out ids (None: no held-out text)


def _og() -> Any:
    return importlib.import_module("onnxruntime_genai")


def context_length(genai_dir: Path) -> int:
    """`model.context_length` of a genai model directory's genai_config.json."""
    config = json.loads((genai_dir / "genai_config.json").read_text(encoding="utf-8"))
    return int(config["model"]["context_length"])


def _generator(model: Model, max_length: int) -> Any:
    """A fresh greedy generator for at most `max_length` tokens (prompt + new ones)."""
    og = _og()
    params = og.GeneratorParams(model)
    params.set_search_options(do_sample=False, num_beams=1, min_length=0, max_length=max_length)
    return og.Generator(model, params)


def _default_max_length(model: Model) -> int:
    return int(_og().GeneratorParams(model).get_search_options()["max_length"])


def greedy(model: Model, prompt_ids: Sequence[int], max_tokens: int) -> Trace:
    """Greedy search from `prompt_ids`: `max_tokens` new tokens, fewer when the model produces EOS (the EOS
    token is included, as the last one). The prompt plus `max_tokens` must fit the model's context length
    (otherwise onnxruntime-genai raises RuntimeError "max_length (N) cannot be greater than model
    context_length (M)")."""
    if not prompt_ids:
        raise ValueError("greedy: the prompt has no tokens")
    generator = _generator(model, len(prompt_ids) + max_tokens)
    tokens: list[int] = []
    steps: list[float] = []
    start = time.perf_counter()
    generator.append_tokens(np.asarray(prompt_ids, dtype=np.int32))
    ttft = 0.0
    while len(tokens) < max_tokens and not generator.is_done():
        begin = time.perf_counter()
        generator.generate_next_token()   # runs the model on the last token (lazily), then picks the argmax
        tokens.append(int(generator.get_next_tokens()[0]))
        end = time.perf_counter()
        if len(tokens) == 1:
            ttft = end - start
        else:
            steps.append(end - begin)
    return Trace(tokens=tokens, ttft_s=ttft, step_s=steps)


def _all_logits(model: Model, ids: Sequence[int]) -> np.ndarray:
    """float32 [len(ids), vocab]: row i = the next-token logits after ids[:i+1], from one prefill."""
    generator = _generator(model, len(ids))
    generator.append_tokens(np.asarray(ids, dtype=np.int32))
    out = np.asarray(generator.get_output("logits"), dtype=np.float32)
    if out.ndim == 3 and out.shape[1] == len(ids):
        return np.asarray(out[0], dtype=np.float32)
    return _stepped(model, ids[:1], ids[1:])   # the graph gives the last position only


def _stepped(model: Model, prompt_ids: Sequence[int], then: Sequence[int]) -> np.ndarray:
    """float32 [1 + len(then), vocab]: the logits after the prompt (one append), then after each of `then`
    appended one at a time, as greedy generation computes them."""
    generator = _generator(model, len(prompt_ids) + len(then))
    generator.append_tokens(np.asarray(prompt_ids, dtype=np.int32))
    rows = [np.asarray(generator.get_logits(), dtype=np.float32).reshape(-1)]
    for token in then:
        generator.append_tokens(np.asarray([token], dtype=np.int32))
        rows.append(np.asarray(generator.get_logits(), dtype=np.float32).reshape(-1))
    return np.stack(rows)


def teacher_forced(model: Model, prompt_ids: Sequence[int], continuation: Sequence[int]) -> np.ndarray:
    """float32 [len(continuation), vocab]: row i holds the next-token logits after prompt + continuation[:i]
    (the model is fed the given continuation, whatever it would have chosen itself): the prompt in one
    append, then the continuation one token at a time, as in generation."""
    if not prompt_ids:
        raise ValueError("teacher_forced: the prompt has no tokens")
    return _stepped(model, prompt_ids, continuation[:-1])[: len(continuation)]


def log_probs(model: Model, ids: Sequence[int], context: int | None = None) -> np.ndarray:
    """float64 [n - 1]: log p(ids[i] | ids[:i]) for i = 1 .. n-1, where n = len(ids) limited to `context`
    tokens (None: the model's default max_length, genai_config.json's search.max_length, which the builder
    sets to model.context_length; see `context_length`). For perplexity: exp(-mean)."""
    limit = _default_max_length(model) if context is None else context
    ids = list(ids[:limit])
    if len(ids) < 2:
        return np.zeros(0, dtype=np.float64)
    return log_probs_of(_all_logits(model, ids[:-1]), ids)


def observe(model: Model, ref: Reference) -> Candidate:
    """Run the artifact on everything `ref` holds: greedy from each prompt (as many tokens as the reference
    was asked for), teacher forcing along each reference continuation, log-probs of the held-out ids."""
    traces = tuple(greedy(model, p.prompt_ids, ref.max_tokens) for p in ref.prompts)
    logits = tuple(teacher_forced(model, p.prompt_ids, p.tokens) for p in ref.prompts)
    heldout = log_probs(model, ref.heldout_ids) if ref.heldout_logprobs is not None else None
    return Candidate(traces=traces, logits=logits, heldout_logprobs=heldout)
