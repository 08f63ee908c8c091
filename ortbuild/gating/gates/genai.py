"""The gates of a generative model (`kinds` generative in ortbuild.gating.gates.catalog): `tokens`, its greedy tokens,
next-token logits and perplexity against the fp32 source's (ortbuild.gating.measure.tokens), and `generation`, time to
first token, time per output token, tokens per second and peak memory with the KV cache
(ortbuild.gating.measure.generation). Each is given the job's Context, opened here instead of by the golden-output run
of an ONNX model (a generative model has no golden feeds: its golden data are prompts)."""

from __future__ import annotations

import dataclasses
import hashlib
from typing import TYPE_CHECKING

from ortbuild import paths
from ortbuild.artifact import golden, loaders, manifest
from ortbuild.errors import ConfigError
from ortbuild.gating.gates.catalog import Context, Judged
from ortbuild.project.generation import Tokens
from ortbuild.status import Verdict

if TYPE_CHECKING:
    from ortbuild.gating.measure.tokens import TokenRule
    from ortbuild.gating.record import TestResult
    from ortbuild.gating.runner import Tester
    from ortbuild.generative.reference import Reference
    from ortbuild.pipeline.job import JobResult
    from ortbuild.project.plan import Job


def open_context(tester: Tester, job: Job, res: TestResult, built: dict[str, JobResult]) -> Context:
    """The Context of a generative artifact: its manifest and generated loader (opened by each gate that asks)."""
    folder = paths.inside(tester.dist, job.target.name, job.model.name)
    m, _ = manifest.read(folder)
    if m.generative is None:
        raise ConfigError(str(tester.project.file), f"models.{job.model.name}.path",
                          f"{folder} holds an ONNX model's artifact, and the model is now a generative one",
                          "rebuild it: `ortbuild build`")
    res.build_key, res.artifact_sha256 = m.build_key, m.artifact.sha256
    module = loaders.import_python_loader(loaders.python_path(folder, job.model.name))
    none = golden.Golden([], "none: a generative model's golden data are its prompts (the tokens gate)", "computed")
    return Context(tester, job, res, module, none, m, [], built)


def generation(ctx: Context) -> Judged:
    """[targets.X.generation]: TTFT, TPOT, tokens/s (timed in this process through the loader) and peak memory
    with the KV cache (fresh processes, each opening the artifact through its loader)."""
    from ortbuild.gating.measure import generation as gen
    from ortbuild.gating.measure import generation_memory as memory

    gates = ctx.job.settings.gates
    assert gates is not None
    g, where = gates.generation, f"targets.{ctx.job.target.name}.generation"
    budget = gen.GenerationBudget(
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


# the fp32 reference of a model, per (source, prompts, tokens, held-out text): once per `ortbuild test` run
_REFERENCES: dict[tuple[str, tuple[str, ...], int, str | None, tuple[str, ...]], Reference] = {}


def rule_of(precision: str, given: Tokens) -> TokenRule:
    """The tokens gate's rule: the precision's defaults (ortbuild.gating.measure.tokens.DEFAULTS), the target's keys over
    them."""
    from ortbuild.gating.measure.tokens import DEFAULTS

    base = DEFAULTS[precision.split("-")[0]]
    overrides = {k: v for k, v in dataclasses.asdict(given).items() if k != "max_tokens" and v is not None}
    return dataclasses.replace(base, **overrides)


def tokens(ctx: Context) -> Judged:
    """The fp32 source (Hugging Face weights, run with transformers) and the artifact (through its generated
    loader, onnxruntime-genai) on the same prompt ids: greedy tokens, next-token logits along the source's
    continuation, held-out perplexity (ortbuild.gating.measure.tokens)."""
    from ortbuild.gating.measure import tokens as judgement
    from ortbuild.generative import reference, run
    from ortbuild.pipeline.steps import genbuild

    job, gates = ctx.job, ctx.job.settings.gates
    assert gates is not None
    config = str(ctx.project.file)
    if gates.tokens.max_tokens < 1:
        raise ConfigError(config, f"targets.{job.target.name}.tokens.max_tokens", "must be at least 1",
                          "the number of tokens generated per golden prompt (default 32)")
    prompts = genbuild.read_prompts(job.model.inputs, config, f"models.{job.model.name}.inputs")
    heldout = None
    if job.model.heldout is not None:
        try:
            heldout = job.model.heldout.read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as e:
            raise ConfigError(config, f"models.{job.model.name}.heldout", f"cannot read {job.model.heldout}: {e}",
                              "a UTF-8 text file the model never saw") from None
    given = None
    if job.model.expected is not None:  # the expected continuations, one per prompt
        given = list(genbuild.read_prompts(job.model.expected, config, f"models.{job.model.name}.expected",
                                              strip=False))
        if len(given) != len(prompts):
            raise ConfigError(config, f"models.{job.model.name}.expected",
                              f"{job.model.expected} holds {len(given)} continuations for {len(prompts)} prompts",
                              "one expected continuation per line, in the order of the prompts in `inputs`")
    key = (str(job.model.path), prompts, gates.tokens.max_tokens, heldout, tuple(given or ()))
    if key not in _REFERENCES:
        ctx.progress(job.name, f"tokens: the fp32 source on {len(prompts)} prompts x {gates.tokens.max_tokens} "
                               "tokens (transformers)")
        try:
            _REFERENCES[key] = reference.reference(job.model.path, list(prompts), gates.tokens.max_tokens, heldout,
                                                   given)
        except ImportError as e:
            why = f"the fp32 reference needs torch and transformers ({e}): nox installs them into a generative " \
                  "target's venv"
            return Verdict.SKIPPED, {"summary": str(Verdict.SKIPPED), "note": why}, []
        except ValueError as e:
            raise ConfigError(config, f"targets.{job.target.name}.tokens.max_tokens", str(e),
                              f"lower it, or shorten the prompt in {job.model.inputs}") from None
    ref = _REFERENCES[key]
    rule = rule_of(job.settings.precision, gates.tokens)
    opened = ctx.open()
    ctx.progress(job.name, "tokens: the artifact through its loader (greedy, teacher-forced, held-out)")
    observed = run.observe(opened.model, ref)
    verdict, doc, lines = judgement.judge(ref, observed, rule, opened.decode)
    _write_golden(ctx, ref, [t.tokens for t in observed.traces])
    section: dict[str, object] = {**doc, "summary": lines[0].removeprefix("tokens: "),
                                  "budget": dataclasses.asdict(rule)}
    failures = [f"tokens: {job.name}: {lines[0].removeprefix('tokens: ')}", *lines[1:]] \
        if verdict is Verdict.FAIL else []
    return verdict, section, failures


def _write_golden(ctx: Context, ref: Reference, artifact: list[list[int]]) -> None:
    """golden/tokens.json, signed into the manifest: each prompt's ids, the fp32 source's greedy tokens and the
    artifact's, which `ortbuild verify` has the released artifact reproduce through its loader."""
    import json

    prompts = [{"prompt": p.text, "prompt_ids": p.prompt_ids, "source_tokens": p.tokens, "tokens": got}
               for p, got in zip(ref.prompts, artifact, strict=True)]
    blob = (json.dumps({"max_tokens": ref.max_tokens, "prompts": prompts}, indent=1) + "\n").encode()
    meta = {"made_by": "greedy tokens of the fp32 source (transformers) and of the artifact (onnxruntime-genai) on "
                       "the model's prompts", "source": "computed"}
    sk, folder, dist = ctx.tester.sign_key, ctx.folder, ctx.dist
    golden.write_files(folder, {golden.TOKENS_JSON: blob}, meta, root=dist, sign=None if sk is None else
                       lambda files: manifest.sign_golden(folder, files, sk.sign, sk.public_raw, root=dist))
    ctx.result.golden = {"made_by": meta["made_by"], "source": "computed",
                         "digest": hashlib.sha256(blob).hexdigest(), "data_sets": [golden.TOKENS_JSON],
                         "dir": str(folder / golden.GOLDEN_DIR)}


def judge_tokens(tester: Tester, job: Job, res: TestResult) -> tuple[Verdict, str]:
    """The tokens gate alone (the search judges by it): its verdict and summary."""
    verdict, section, _ = tokens(open_context(tester, job, res, {}))
    return Verdict(verdict), str(section.get("summary", ""))
