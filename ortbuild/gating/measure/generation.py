"""Generation latency of a decoder LLM opened through onnxruntime-genai: time to first token (TTFT), time per
output token (TPOT) and decode tokens per second at stated prompt and generation lengths, judged with latency's
distribution-free percentile verdicts and early stopping; peak memory with the KV cache at the longest context:
ortbuild.gating.measure.generation_memory.

One generation (generate_once): a fresh Generator (greedy, batch 1, max_length = min_length = prompt_tokens +
new_tokens: genai masks EOS until min_length, so it never stops early), the prompt appended as ids, then the
tokens. TTFT runs from the GeneratorParams to the first token: the Generator's creation (where genai allocates
the KV cache for max_length), the prefill (append_tokens runs the model on the whole prompt) and the first
token's pick; tokenizing is not counted (ids are fed). TPOT is the rest of the generation over its new_tokens - 1
decode steps (each runs the model on the last token against the cache and picks the next): MLPerf LoadGen's and
vLLM's per-query TPOT. Decode tokens per second of a generation = 1000 / TPOT ms; `min_tokens_per_second` is
judged on the median generation: TPOT p50 <= 1000 / min_tokens_per_second, under the same bounds (the
throughput gate judges its rate so too).

The prompt: prompt_tokens ids drawn uniformly from the vocabulary less its special tokens (BOS, EOS, pad),
numpy default_rng(PROMPT_SEED), the same every generation. Ids, not repeated text: a dense decoder's work per
token does not depend on which token it is, so any ids of the right count time the same; ids give the exact
count with no tokenizer (loaders open the model without one), and a fixed seed makes runs comparable.

Independence: the bounds need independent samples. The steps of one generation are not (they share its moment's
load and cache state, and each attends to one token more than the last), so each generation gives ONE TPOT
sample (its mean step) and one TTFT sample; generations are taken as independent, as latency's runs are. The
decode steps pooled over all generations are reported (`step_ms`, inter-token latency) but not judged.

Sampling is latency.gate's, over two series ("ttft", "tpot") with one generation per round (_Rounds hands the
round's generation to both series under a clock that advances by each figure), so its plan, looks, early stop
and retry of a FAIL under load apply as they are, counted in generations: the first look at min_samples (0:
latency.FIRST_LOOK), then doubling, to the plan's end (planned_samples); sampling stops at the first look that
decides every budget or FAILs one. The plan's min_seconds is 0 (the clock counts measured time, not wall time).
`max_seconds`: where the plan's end would run past it at the pace of the warm-up, the plan becomes one look at
as many generations as fit (at least FIRST_LOOK): early stopping is lost there, the bounds are not.
"""

from __future__ import annotations

import importlib
import itertools
import json
import math
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, cast

from ortbuild.errors import ArtifactError, GateFailed
from ortbuild.gating.measure import generation_memory as memory
from ortbuild.gating.measure import generation_report as report
from ortbuild.gating.measure import sampling as latency
from ortbuild.gating.measure.engine import gate_verdict
from ortbuild.gating.measure.generation_budget import GenaiConfig, GenerationBudget, Timing
from ortbuild.gating.measure.load import runnable
from ortbuild.gating.measure.percentiles import planned_samples
from ortbuild.gating.protocol import Judged
from ortbuild.gating.timing_records import WaitDoc
from ortbuild.status import Verdict

PROMPT_SEED = 0
WARMUP_GENERATIONS = 2


class GenerationError(GateFailed):
    """A generation could not run at the stated lengths."""


def read_config(path: Path) -> GenaiConfig:
    """genai_config.json (or the folder holding it)."""
    file = path / "genai_config.json" if path.is_dir() else path
    try:
        doc = json.loads(file.read_text(encoding="utf-8"))
        m = doc["model"]
        special = {i for k in ("bos_token_id", "eos_token_id", "pad_token_id")
                   for i in (m.get(k) if isinstance(m.get(k), list) else [m.get(k)]) if isinstance(i, int)}
        return GenaiConfig(int(m["vocab_size"]), int(m["context_length"]), frozenset(special),
                           int(m["decoder"]["num_hidden_layers"]),
                           str(m["decoder"]["outputs"]["present_key_names"]).replace("%d", "0"),
                           bool(doc.get("search", {}).get("past_present_share_buffer", False)))
    except (OSError, ValueError, KeyError, TypeError) as e:
        raise ArtifactError(f"{file}: not a readable onnxruntime-genai config ({type(e).__name__}: {e})",
                            "rebuild the artifact (its genai_config.json comes from the model builder)") from None


def shape_problem(budget: GenerationBudget, config: GenaiConfig) -> str | None:
    """Why these lengths cannot be measured on this model (None: they can)."""
    ctx = budget.context_length or config.context_length
    if budget.prompt_tokens < 1 or budget.new_tokens < 2:
        return f"prompt_tokens must be at least 1 and new_tokens at least 2 (TPOT needs a decode step), " \
               f"not {budget.prompt_tokens} and {budget.new_tokens}"
    if ctx > config.context_length:
        return f"context_length {ctx} is above the model's {config.context_length} (genai_config.json)"
    if budget.prompt_tokens + budget.new_tokens > ctx:
        return f"prompt_tokens + new_tokens = {budget.prompt_tokens + budget.new_tokens} is above the context " \
               f"length {ctx}"
    return None


def prompt_ids(config: GenaiConfig, count: int, seed: int = PROMPT_SEED) -> list[int]:
    """`count` ids drawn uniformly from the vocabulary less its special tokens, from a fixed seed."""
    import numpy as np

    pool = np.array([i for i in range(config.vocab_size) if i not in config.special], dtype=np.int32)
    return [int(x) for x in np.random.default_rng(seed).choice(pool, size=count)]


def og() -> Any:
    return importlib.import_module("onnxruntime_genai")


def open_folder(folder: str) -> Any:
    """An og.Model of a plaintext genai folder (an Opener's function for models not sealed)."""
    return og().Model(folder)


def generate_once(model: Any, prompt: list[int], new_tokens: int,
                  clock: Callable[[], float] = time.perf_counter) -> Timing:
    import numpy as np

    g = og()
    ids, total = np.asarray(prompt, dtype=np.int32), len(prompt) + new_tokens
    t0 = clock()
    params = g.GeneratorParams(model)
    params.set_search_options(max_length=total, min_length=total, do_sample=False)
    gen = g.Generator(model, params)
    gen.append_tokens(ids)
    gen.generate_next_token()
    marks = [clock()]
    for _ in range(new_tokens - 1):
        gen.generate_next_token()
        marks.append(clock())
    if gen.token_count() != total:
        raise GenerationError(f"the generation ended at {gen.token_count()} tokens, not the {total} asked for")
    return Timing((marks[0] - t0) * 1e3, tuple((b - a) * 1e3 for a, b in itertools.pairwise(marks)),
                  marks[-1] - t0)


class _Rounds:
    """latency.gate's calls and clock for generations: a round's first call (either series, as gate alternates
    them) runs one generation, each call hands its series that generation's figure, and the clock advances by
    exactly that figure, so gate times what the generation measured."""

    def __init__(self, generate: Callable[[], Timing]) -> None:
        self.generate, self.now = generate, 0.0
        self.pending: dict[str, float] = {}
        self.timings: list[Timing] = []

    def clock(self) -> float:
        return self.now

    def call(self, series: str) -> Callable[[], object]:
        def run() -> object:
            if series not in self.pending:
                t = self.generate()
                self.timings.append(t)
                self.pending = {"ttft": t.ttft_ms, "tpot": t.tpot_ms}
            self.now += self.pending.pop(series) / 1e3
            return None
        return run


def judge(open_model: Callable[[], Any], config: GenaiConfig, budget: GenerationBudget, *,
          child: memory.Opener | None = None, name: str = "model", where: str = "", quick: bool = False,
          progress: Callable[[str], None] | None = None, read: Callable[[], float | None] = runnable,
          wait: Callable[[float, int], WaitDoc] | None = None) -> Judged:
    """Measure and judge: (verdict, section, failure lines). The verdict is FAIL if any budget FAILs, else
    INCONCLUSIVE if any is undecided, else PASS; "-" when nothing is budgeted (the figures are reported);
    SKIPPED where onnxruntime-genai is not installed. `open_model` returns the og.Model timed in this process;
    `child` opens it in the fresh processes memory is measured in (None: memory not measured)."""
    try:
        og()
    except ImportError as e:
        why = f"onnxruntime-genai is not installed here ({e})"
        return Judged(Verdict.SKIPPED, {"summary": "onnxruntime-genai not installed", "note": why}, [])
    problem = shape_problem(budget, config)
    if problem:
        raise GenerationError(f"{name}: {problem}")
    if budget.max_memory_mb is not None and child is None:
        raise ValueError("max_memory_mb needs the child Opener")
    say = progress or (lambda _: None)
    deadline = time.perf_counter() + budget.max_seconds  # everything the gate measures, warm-up and memory too
    model = open_model()
    prompt = prompt_ids(config, budget.prompt_tokens)
    budgets = budget.budgets()
    # no budget, no measurement: the timed generations run only for a TTFT/TPOT/tokens-per-second budget, the
    # fresh processes only for max_memory_mb; one warm-up generation (the pace) either way
    warm = [generate_once(model, prompt, budget.new_tokens) for _ in range(WARMUP_GENERATIONS if budgets else 1)]
    found: list[Verdict] = []
    lines: list[str] = []
    notes: list[str] = []
    if budgets:
        section, found, lines, note = _timed(model, config, prompt, warm, budget, budgets, deadline, name,
                                             where, quick, read, wait, say)
        notes += [note] if note else []
    else:
        section = report.warmup_section(budget, warm[0])
    mem_verdict = None
    if child is not None and budget.max_memory_mb is not None:
        ctx = budget.context_length or config.context_length
        per_token_s = warm[-1].ttft_ms / 1e3 / budget.prompt_tokens   # the prefill's pace (attention grows faster)
        need = memory_seconds(ctx, per_token_s, warm[-1].tpot_ms / 1e3 * budget.new_tokens)
        left = deadline - time.perf_counter()
        if need > left:
            mem_verdict = Verdict.INCONCLUSIVE
            why = (f"max_memory_mb not measured: {memory.FIRST_PROCESSES} fresh processes at context {ctx} (the "
                   f"prefill of {ctx - budget.new_tokens} tokens at the {1 / per_token_s:.0f} tokens/s measured) "
                   f"take about {need:.0f} s, past the {max(left, 0):.0f} s left of max_seconds = "
                   f"{budget.max_seconds:g}: state a shorter {where.strip('[]')}.context_length (the context the "
                   "app opens), or raise max_seconds")
            section["memory"] = {"context_length": ctx, "verdict": {"kind": "max_memory_mb", "budget":
                                 budget.max_memory_mb, "verdict": Verdict.INCONCLUSIVE, "note": why}}
            notes.append(why)
        else:
            say(f"generation memory: fresh processes at context {ctx}")
            mo = memory.measure(child, prompt_ids(config, ctx - budget.new_tokens), budget.new_tokens,
                                config.present_key, config.layers, budget.max_memory_mb, budget.confidence,
                                max(left, 0.0))
            doc = memory.section(mo, ctx, budget.new_tokens, budget.max_memory_mb)
            section["memory"] = doc
            mem_verdict = memory.verdict_of(mo, budget.max_memory_mb)
            lines += memory.failure_lines(name, mo, doc, budget.max_memory_mb, where)
            if mem_verdict is Verdict.INCONCLUSIVE:
                notes.append(f"max_memory_mb: {cast(dict[str, Any], section['memory'])['verdict']['note']}")
    verdict = gate_verdict([*found, mem_verdict])
    if notes:
        section["note"] = "; ".join(notes)
    section["summary"] = report.summary(section)
    return Judged(verdict if verdict is not None else "-", section, lines)


def memory_seconds(context: int, prefill_s_per_token: float, decode_s: float) -> float:
    """What the memory gate's first look takes at least: FIRST_PROCESSES fresh processes, each prefilling the
    context at the measured pace (a lower bound: attention's cost grows faster than the tokens) and decoding."""
    return memory.FIRST_PROCESSES * (context * prefill_s_per_token + decode_s)


def needed_samples(percentile: float, confidence: float) -> int:
    """The fewest generations that can PASS a percentile budget at `confidence` (all of them under it):
    percentile ** n <= 1 - confidence."""
    return max(1, math.ceil(math.log(1 - confidence) / math.log(percentile)))


def _timed(model: Any, config: GenaiConfig, prompt: list[int], warm: list[Timing], budget: GenerationBudget,
           budgets: list[Any], deadline: float, name: str, where: str, quick: bool, read: Callable[[], float | None],
           wait: Callable[[float, int], WaitDoc] | None,
           say: Callable[[str], None]) -> tuple[dict[str, Any], list[Verdict], list[str], str]:
    """The timed generations within what is left of max_seconds: (section, verdicts, failure lines, a note)."""
    plan = latency.plan_of(budget.confidence, budget.min_samples, 0.0, budget.retry_wait_seconds, quick)
    end = planned_samples([b.percentile for b in budgets], plan.confidence, plan.min_samples)
    left = deadline - time.perf_counter()
    fit = int(left / max(warm[-1].seconds, 1e-6))
    capped = end > fit
    note = ""
    if capped:  # one look at what fits; a FAIL's retry (under load) measures again: each attempt gets half
        fit = max(1, fit // 2)
        plan = latency.Plan(plan.confidence, fit, 0.0, 0.0)
        need = max(needed_samples(b.percentile, plan.confidence) for b in budgets)
        if fit < need:
            note = (f"max_seconds = {budget.max_seconds:g} fits {fit} generations of {warm[-1].seconds:.2f} s "
                    f"(another {fit} kept for a retry under load); a verdict on the tightest percentile at "
                    f"{plan.confidence:g} confidence needs at least {need}: raise max_seconds to about "
                    f"{2 * need * warm[-1].seconds + budget.max_seconds - left:.3g}, or budget a lower percentile")
    say(f"generation: {budget.prompt_tokens} prompt + {budget.new_tokens} new tokens, up to "
        f"{plan.min_samples or end} generations")
    rounds = _Rounds(lambda: generate_once(model, prompt, budget.new_tokens))
    t0 = time.perf_counter()
    out = latency.gate({"ttft": rounds.call("ttft"), "tpot": rounds.call("tpot")}, "ttft", budgets, plan,
                       clock=rounds.clock, read=read, wait=wait)
    seconds = time.perf_counter() - t0
    final = rounds.timings[-len(out.final.series["ttft"].samples):]
    section = report.section(budget, config, plan, out, final, warm[0], seconds, quick, PROMPT_SEED,
                             len(warm))
    if capped:
        section["capped"] = f"{end} planned generations would take past max_seconds = {budget.max_seconds:g}: " \
                            f"one look at {plan.min_samples}"
    found = [v.verdict for v in out.verdicts.values()]
    lines = [line for k, v in out.verdicts.items() if v.verdict is Verdict.FAIL
             for line in report.fail_lines(name, k, v, budget, where)]
    notes = [f"{k}: {v.note}" for k, v in out.verdicts.items() if v.verdict is Verdict.INCONCLUSIVE and v.note]
    if note and any(v is Verdict.INCONCLUSIVE for v in found):
        notes.append(note)
    return section, found, lines, "; ".join(notes)
