"""The generation gate's section and failure lines (ortbuild.gating.measure.generation measures and judges): the
settings measured at, TTFT / TPOT / pooled decode-step percentiles, tokens per second, each budget's verdict with
its confidence bounds, and the memory part (ortbuild.gating.measure.generation_memory.section)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from ortbuild.gating.measure.generation_budget import PERCENTILES
from ortbuild.gating.measure.percentiles import PercentileVerdict, nearest_rank

if TYPE_CHECKING:
    from ortbuild.gating.measure import sampling as latency
    from ortbuild.gating.measure.generation_budget import GenaiConfig, GenerationBudget, Timing


def stats(xs: list[float]) -> dict[str, float]:
    ys = sorted(xs)
    return {"min": round(ys[0], 4), **{k: round(nearest_rank(ys, p), 4) for k, p in PERCENTILES.items()},
            "max": round(ys[-1], 4), "mean": round(sum(ys) / len(ys), 4)}


def section(budget: GenerationBudget, config: GenaiConfig, plan: latency.Plan, out: latency.Outcome,
            final: list[Timing], first: Timing, seconds: float, quick: bool, seed: int,
            warmup: int) -> dict[str, object]:
    """The timed part of the section, over the generations of the final attempt (`final`; `first`: the first
    warm-up generation; `seed`: the prompt's; `warmup`: the untimed generations)."""
    total = budget.prompt_tokens + budget.new_tokens
    ttft = out.final.series["ttft"]
    doc: dict[str, object] = {
        "budget": budget.set(),
        "settings": {"prompt_tokens": budget.prompt_tokens, "new_tokens": budget.new_tokens,
                     "prompt": f"{budget.prompt_tokens} ids drawn from the vocabulary less its special tokens "
                               f"(seed {seed}), the same each generation",
                     "search": f"greedy, batch 1, min_length = max_length = {total}",
                     "confidence": plan.confidence, "min_samples": budget.min_samples,
                     "max_seconds": budget.max_seconds, "warmup_generations": warmup, "quick": quick,
                     "kv_cache_allocated_for_max_length": config.share_buffer},
        "generations": len(final), "looks": out.final.looks, "stopped_early": out.final.early,
        "seconds": round(seconds, 3), "load": None if ttft.load is None else round(ttft.load, 2),
        "unstable": ttft.instability(),
        "first_generation": {"ttft_ms": round(first.ttft_ms, 4), "tpot_ms": round(first.tpot_ms, 4)},
        "ttft_ms": stats([t.ttft_ms for t in final]), "tpot_ms": stats([t.tpot_ms for t in final]),
        "step_ms": stats([x for t in final for x in t.steps_ms]),
        "tokens_per_second": {
            "decode_p50": round(1e3 / nearest_rank(sorted(t.tpot_ms for t in final), 0.5), 1),
            "end_to_end_p50": round(nearest_rank(sorted(budget.new_tokens / t.seconds for t in final), 0.5), 1)},
        "verdicts": [verdict_doc(k, v) for k, v in out.verdicts.items()]}
    if out.retry:
        doc["retry"] = out.retry
    return doc


def _rate(ms: object) -> float | None:
    return round(1e3 / ms, 2) if isinstance(ms, (int, float)) and ms > 0 else None


def verdict_doc(kind: str, v: PercentileVerdict) -> dict[str, object]:
    """A budget's verdict; min_tokens_per_second is judged on TPOT ms (budget 1000 / rate): its fields are ms,
    and the rate fields say the same in tokens per second (rate_lower: the rate's lower confidence bound)."""
    out: dict[str, object] = {"kind": kind, "unit": "ms", **v.as_json()}
    if kind == "min_tokens_per_second":
        out.update({"observed_rate": _rate(v.observed), "rate_lower": _rate(v.upper), "rate_upper": _rate(v.lower),
                    "budget_rate": _rate(v.budget)})
    return out


def fail_lines(name: str, kind: str, v: PercentileVerdict, budget: GenerationBudget, where: str) -> list[str]:
    """A FAILed budget's lines: the percentile, the measured estimate and its bound, the budget, the lengths."""
    at = f"{budget.prompt_tokens} prompt + {budget.new_tokens} new tokens"
    there = f" in {where}" if where else ""
    if kind == "min_tokens_per_second":
        # the rates the report records (_rate), so the line and report.json never differ in the last digit
        bound = f" (at most {_rate(v.lower):.1f} with {v.confidence:.0%} confidence)" if v.lower else ""
        return [f"generation: {name} decode {_rate(v.observed):.1f} tokens/s on the median generation{bound} < "
                f"budget min_tokens_per_second = {budget.min_tokens_per_second:g} ({v.exceeding} of {v.samples} "
                f"generations slower; {at})",
                f"  hint: lower min_tokens_per_second{there} if this rate is expected on this machine; a lower "
                "precision (int8, int4) raises it"]
    what = "TTFT" if kind.startswith("ttft") else "TPOT"
    bound = f" (at least {v.lower:.3f} ms with {v.confidence:.0%} confidence)" if v.lower is not None else ""
    return [f"generation: {name} {what} p{round(v.percentile * 100)} {v.observed:.3f} ms{bound} > budget {kind} = "
            f"{v.budget:g} ms ({v.exceeding} of {v.samples} generations above it; {at})",
            f"  hint: raise {kind}{there} if this is expected on this machine; a lower precision (int8, int4)"
            + (" or a shorter prompt lowers it" if what == "TTFT" else " lowers it")]


def warmup_section(budget: GenerationBudget, first: Timing) -> dict[str, object]:
    """The section where no TTFT/TPOT/tokens-per-second budget is set: nothing timed beyond one warm-up
    generation (the pace the memory measurement is planned by), reported as such."""
    return {"budget": budget.set(), "generations": 0,
            "settings": {"prompt_tokens": budget.prompt_tokens, "new_tokens": budget.new_tokens,
                         "max_seconds": budget.max_seconds, "warmup_generations": 1},
            "first_generation": {"ttft_ms": round(first.ttft_ms, 4), "tpot_ms": round(first.tpot_ms, 4)},
            "timed": "not timed: no ttft_*/tpot_*/min_tokens_per_second budget (no budget, no measurement)"}


def summary(section: Mapping[str, Any]) -> str:
    """The text table's cell: TTFT and TPOT medians, decode tokens/s, peak memory."""
    said = f"TTFT {section['ttft_ms']['p50']:.2f} ms, TPOT {section['tpot_ms']['p50']:.2f} ms, " \
           f"{section['tokens_per_second']['decode_p50']:.0f} tok/s" if "ttft_ms" in section else "not timed"
    memory = section.get("memory", {})
    peak = memory.get("peak_rss_mb")
    if not isinstance(peak, dict) and memory:
        return said + ", memory not measured"
    return said + (f", peak {peak['p50']:.0f} MB" if isinstance(peak, dict) else "")
