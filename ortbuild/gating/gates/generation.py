"""The generation gate of a generative model: time to first token, time per output token and tokens per second
through its generated loader (onnxruntime-genai), and peak memory with the KV cache in fresh processes
(ortbuild.gating.measure.generation, ortbuild.gating.measure.generation_memory)."""

from __future__ import annotations

from ortbuild.artifact import loaders
from ortbuild.errors import ConfigError
from ortbuild.gating.protocol import GENERATIVE, Context, Gate, Judged


def generation(ctx: Context) -> Judged:
    """[targets.X.generation]: TTFT, TPOT, tokens/s (timed in this process through the loader) and peak memory
    with the KV cache (fresh processes, each opening the artifact through its loader)."""
    from ortbuild.gating.measure import generation as gen
    from ortbuild.gating.measure import generation_memory as memory
    from ortbuild.gating.measure.generation_budget import GenerationBudget

    gates = ctx.job.settings.gates
    assert gates is not None
    g, where = gates.generation, f"targets.{ctx.job.target.name}.generation"
    if not g.declared:  # no budget, no measurement: nothing is opened or timed
        return Judged("-", {"summary": "not measured", "note": f"no budget in [{where}] (ttft_*, tpot_*, "
                            "min_tokens_per_second, max_memory_mb): nothing measured"}, [])
    budget = GenerationBudget(
        prompt_tokens=g.prompt_tokens, new_tokens=g.new_tokens, ttft_p50_ms=g.ttft_p50_ms, ttft_p90_ms=g.ttft_p90_ms,
        ttft_p99_ms=g.ttft_p99_ms, tpot_p50_ms=g.tpot_p50_ms, tpot_p90_ms=g.tpot_p90_ms, tpot_p99_ms=g.tpot_p99_ms,
        min_tokens_per_second=g.min_tokens_per_second, max_memory_mb=g.max_memory_mb,
        context_length=g.context_length, confidence=g.confidence, min_samples=g.min_samples,
        max_seconds=g.max_seconds)
    config = gen.read_config(ctx.folder / "genai_config.json")
    problem = gen.shape_problem(budget, config)
    if problem:
        raise ConfigError(str(ctx.project.file), where, f"{problem} (model '{ctx.job.model.name}')",
                          "state lengths the model's context holds")
    opened = ctx.open()
    child = memory.Opener(str(loaders.python_path(ctx.folder, ctx.job.model.name)), "load",
                          {"folder": str(ctx.folder)}, ctx.secret, "model")
    return gen.judge(lambda: opened.model, config, budget, child=child, name=ctx.job.name, where=f"[{where}]",
                     quick=ctx.quick, progress=lambda text: ctx.progress(ctx.job.name, text))


GATE = Gate("generation", "time to first token, time per output token, tokens/s and peak memory with the KV cache",
            generation, lambda g: g.generation.declared, timed=True, kinds=GENERATIVE)
