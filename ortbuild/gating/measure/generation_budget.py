"""What the generation gate measures by (ortbuild.gating.measure.generation measures, generation_report reports):
its budget (lengths, percentiles of time to first token and per output token, tokens/s, memory), the model's
genai_config.json as measuring needs it, and one generation's timing."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from ortbuild.gating.measure.percentiles import Budget, budgets_of

PERCENTILES = {"p50": 0.5, "p90": 0.9, "p99": 0.99}


@dataclass(frozen=True)
class GenerationBudget:
    """What is measured (prompt and generation lengths; the context for memory: None, the model's) and the
    budgets (None: not judged; ms, tokens per second, MB)."""

    prompt_tokens: int = 64
    new_tokens: int = 32
    ttft_p50_ms: float | None = None
    ttft_p90_ms: float | None = None
    ttft_p99_ms: float | None = None
    tpot_p50_ms: float | None = None
    tpot_p90_ms: float | None = None
    tpot_p99_ms: float | None = None
    min_tokens_per_second: float | None = None
    max_memory_mb: float | None = None
    context_length: int | None = None
    confidence: float = 0.95
    min_samples: int = 0
    max_seconds: float = 60.0
    retry_wait_seconds: float = 30.0

    def budgets(self) -> list[Budget]:
        """The timed budgets, each on its series, named by its key."""
        out: list[Budget] = []
        for s in ("ttft", "tpot"):
            ms = {p: v for k, p in PERCENTILES.items() if (v := getattr(self, f"{s}_{k}_ms")) is not None}
            out += [SeriesBudget(f"{s}_{b.kind}_ms", b.percentile, b.limit, series=s) for b in budgets_of(ms)]
        if self.min_tokens_per_second:
            out.append(SeriesBudget("min_tokens_per_second", 0.5, 1e3 / self.min_tokens_per_second, series="tpot"))
        return out

    def set(self) -> dict[str, float]:
        keys = [f"{s}_{k}_ms" for s in ("ttft", "tpot") for k in PERCENTILES] + ["min_tokens_per_second",
                                                                                 "max_memory_mb"]
        return {k: v for k in keys if (v := getattr(self, k)) is not None}


@dataclass(frozen=True)
class SeriesBudget(Budget):
    """A latency Budget judged on the samples of `series` (its verdict's values), not on the gate's own."""

    series: str = "ttft"

    def values(self, series: Mapping[str, list[float]], mine: str) -> tuple[list[float], float]:
        return series[self.series], self.limit


@dataclass(frozen=True)
class GenaiConfig:
    """What measuring needs from genai_config.json."""

    vocab_size: int
    context_length: int
    special: frozenset[int]
    layers: int
    present_key: str          # layer 0's present key output ("present.0.key")
    share_buffer: bool        # search.past_present_share_buffer: the KV cache allocated for max_length


@dataclass(frozen=True)
class Timing:
    """One generation: its TTFT and each decode step after the first token (ms)."""

    ttft_ms: float
    steps_ms: tuple[float, ...]
    seconds: float

    @property
    def tpot_ms(self) -> float:
        return sum(self.steps_ms) / len(self.steps_ms)
