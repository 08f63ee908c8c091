"""The tokens gate of a generative model: its greedy tokens, next-token logits and held-out perplexity through
its generated loader (onnxruntime-genai) against the fp32 source's (transformers), by the precision's `TokenRule`
(ortbuild.gating.measure.tokens); the prompts' tokens are written and signed as its golden data
(golden/tokens.json)."""

from __future__ import annotations

import dataclasses
import hashlib
from typing import TYPE_CHECKING

from ortbuild.errors import ConfigError
from ortbuild.gating.protocol import GENERATIVE, Context, Gate, Judged
from ortbuild.status import Verdict

if TYPE_CHECKING:
    from ortbuild.gating.measure.tokens import TokenRule
    from ortbuild.generative.reference import Reference
    from ortbuild.project.generation import Tokens


# the fp32 reference of a model, per (source, prompts, tokens, held-out text): once per `ortbuild test` run
_REFERENCES: dict[tuple[str, tuple[str, ...], int, str | None, tuple[str, ...]], Reference] = {}


def rule_of(precision: str, given: Tokens) -> TokenRule:
    """The tokens gate's rule: the precision's defaults (ortbuild.gating.measure.tokens.DEFAULTS), the target's
    keys over them."""
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
            return Judged(Verdict.SKIPPED, {"summary": str(Verdict.SKIPPED), "note": why}, [])
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
    return Judged(verdict, section, failures)


def _write_golden(ctx: Context, ref: Reference, artifact: list[list[int]]) -> None:
    """golden/tokens.json, signed into the manifest: each prompt's ids, the fp32 source's greedy tokens and the
    artifact's, which `ortbuild verify` has the released artifact reproduce through its loader."""
    import json

    from ortbuild.artifact import golden, manifest

    prompts = [{"prompt": p.text, "prompt_ids": p.prompt_ids, "source_tokens": p.tokens, "tokens": got}
               for p, got in zip(ref.prompts, artifact, strict=True)]
    blob = (json.dumps({"max_tokens": ref.max_tokens, "prompts": prompts}, indent=1) + "\n").encode()
    meta = {"made_by": "greedy tokens of the fp32 source (transformers) and of the artifact (onnxruntime-genai) on "
                       "the model's prompts", "source": "computed"}
    sk, folder, dist = ctx.tester.sign_key, ctx.folder, ctx.dist
    golden.write_files(folder, {golden.TOKENS_JSON: blob}, meta, root=dist, sign=None if sk is None else
                       lambda files: manifest.sign_golden(folder, files, sk.sign, sk.public_raw, root=dist))
    ctx.golden_doc = {"made_by": meta["made_by"], "source": "computed",
                      "digest": hashlib.sha256(blob).hexdigest(), "data_sets": [golden.TOKENS_JSON],
                      "dir": str(folder / golden.GOLDEN_DIR)}


def summarized(judged: Judged) -> tuple[Verdict, str]:
    """The tokens gate's verdict and summary (the generative search judges by them)."""
    return Verdict(judged.verdict), str(judged.section.get("summary", ""))


GATE = Gate("tokens", "a generative model's greedy tokens, next-token logits and perplexity against the fp32 source's",
            tokens, lambda g: True, kinds=GENERATIVE)
