"""The token gate's judgement: a generative artifact's greedy tokens, teacher-forced logits and held-out
perplexity against the fp32 reference (ortbuild.generative.reference), by a `TokenRule`. numpy only: the inputs
are plain data (`Reference`, `Candidate`), so the judgement is tested on synthetic arrays.

The measures, per golden prompt (step = 1-based position in the continuation):
- first divergence: the first step where the artifact's greedy token differs from the reference's (a
  continuation that ends earlier diverges at the step after its end); None when identical.
- agreement: the share of the reference continuation matched before the first divergence (1.0 when none).
  After a divergence the two continue from different texts, so later positions are not compared; the total is
  the mean over prompts (the "exact-match prefix" rate).
- cosine: of the next-token logits, reference vs artifact, both teacher-forced along the reference's
  continuation (the same input at every step); the rule bounds the minimum over all steps of all prompts.
- top-5 overlap: |top5(reference) & top5(artifact)| / 5 per step; the rule bounds the mean over all steps.
- perplexity: exp(-mean log p) of the held-out ids; the rule bounds the artifact's relative increase.

DEFAULTS, from the example model (models/generate_llm.py: 600 steps on models/tiny_llama.corpus.txt, outlier
channels as real LLMs have; 12 golden prompts x 32 tokens, 256 held-out tokens; onnxruntime-genai 0.18.0's builder,
CPU; "divergences" = each prompt's first divergent step, "-" where none):

    build                       exact  agreement  min cosine  top-5   perplexity  divergences
    fp32                        12/12  1.000      1.00000     1.0000  +0.00%      all -
    int8                        12/12  1.000      0.99865     0.9813  -0.43%      all -
    int4 block 32, level 4       7/12  0.591      0.86877     0.7318  -8.74%      1 1 - 1 - - - - 4 1 - -  (1)
    int4 block 32, level 0       7/12  0.591      0.86746     0.7302  -8.85%      same tokens as level 4
    int4 block 16                9/12  0.766      0.90804     0.8000  -10.73%     1 - - - - - - - 4 4 - -
    int4 block 32, asymmetric    6/12  0.586      0.92485     0.8161  -6.92%
    int4 block 32, lm_head float 8/12  0.674      0.88549     0.7797  -12.81%
    int4 block 64                5/12  0.461      0.75477     0.6615  -4.43%
    int4 block 128               2/12  0.305      0.56239     0.5797  -15.68%     1 1 14 1 16 3 13 - 5 1 8 -  (2)
    int4 block 256, level 4      2/12  0.307      0.57729     0.5776  -23.09%                                 (2)

(1) the builder's CPU default; (2) harmful.

fp32 is exact (the ONNX graph computes what torch does): its rule only leaves room for a near-tie flip late in a
long continuation. int8 keeps every greedy token here: it must match 2 tokens, 80% agreement, cosine 0.995
(measured 0.99865), perplexity +2%. int4 flips tokens from the first step even at the builder's defaults (as ORT
issue 29849 reports on real models), so exact tokens are not asked of it (match_tokens 0); agreement 0.7 and
cosine 0.9 pass block 16 and fail the builder's default block 32 (agreement 0.591: the token-flip trap, which
`precision_search = "auto"` repairs: gating/gensearch.py) and, by far, blocks of 64 and more. Perplexity on the
held-out text falls under int4 on this model (it is fitted closely to its training text, and quantization noise
flattens its confident mistakes elsewhere): its bound (+5%) guards real models, where perplexity rises. fp16 is not
measured: the builder's fp16 CPU graph fails in onnxruntime 1.31.1 ("Shape mismatch attempting to re-use buffer" in
a Cast node), so its rule sits between fp32's and int8's.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import asdict, dataclass
from typing import TypedDict

import numpy as np

from ortbuild.generative.reference import Reference
from ortbuild.generative.run import Candidate
from ortbuild.status import Verdict


@dataclass(frozen=True)
class TokenRule:
    match_tokens: int        # greedy must agree exactly on the first N tokens of every prompt
    min_agreement: float     # mean exact-match prefix share over the prompts
    min_cosine: float        # minimum teacher-forced logits cosine over all steps of all prompts
    min_top5: float          # mean top-5 overlap over all steps of all prompts
    max_ppl_increase: float  # held-out perplexity: artifact / reference - 1 at most (0.05 = 5%)
    max_kl: float = float("inf")  # mean KL(fp32 || artifact) of the next-token distributions, nats per position
    min_top1: float = 0.0    # top-1 agreement at the decided positions (fp32's top-1 leads by >= margin)
    margin: float = 1.0      # what "decided" means: fp32's top-1 logit minus its second's (nats of probability ratio)


DEFAULTS: dict[str, TokenRule] = {
    # fp32 computes what torch does: greedy tokens must match, its distribution all but equal
    "fp32": TokenRule(match_tokens=32, min_agreement=0.95, min_cosine=0.9999, min_top5=0.99, max_ppl_increase=0.001,
                      max_kl=0.001, min_top1=1.0),
    # the reduced precisions are judged by the next-token distributions (KL, top-1 where fp32 is decided): greedy
    # agreement flips at near-ties on noise (reported, with fp32's margin at each flip, not judged); cosine and
    # top-5 stay as backstops
    "fp16": TokenRule(match_tokens=0, min_agreement=0.0, min_cosine=0.998, min_top5=0.97, max_ppl_increase=0.01,
                      max_kl=0.005, min_top1=0.995),
    "int8": TokenRule(match_tokens=0, min_agreement=0.0, min_cosine=0.995, min_top5=0.95, max_ppl_increase=0.02,
                      max_kl=0.01, min_top1=0.99),
    "int4": TokenRule(match_tokens=0, min_agreement=0.0, min_cosine=0.8, min_top5=0.7, max_ppl_increase=0.05,
                      max_kl=0.05, min_top1=0.98),
}


class Flip(TypedDict):
    step: int          # 1-based position in the continuation
    expected: int      # fp32's top-1 token there
    got: int           # the artifact's
    margin: float      # fp32's top-1 logit minus its second's


class PromptDoc(TypedDict):
    prompt: str
    tokens: int                    # the reference continuation's length
    first_divergence: int | None   # 1-based step
    expected: int | None           # the two tokens at the first divergence (None: that side had ended)
    got: int | None
    agreement: float
    min_cosine: float
    min_cosine_step: int
    top5: float
    flip_margin: float | None      # fp32's top-1 margin at the first divergence (None: no divergence there)
    kl_mean: float                 # KL(fp32 || artifact) per position along the fp32 trajectory: mean, max
    kl_max: float
    kl_max_step: int
    decided: int                   # positions where fp32's top-1 leads by >= the rule's margin
    decided_flips: list[Flip]      # those of them where the artifact's top-1 differs


class TokensDoc(TypedDict):
    prompts: list[PromptDoc]
    agreement: float
    exact_prompts: int
    min_cosine: float
    top5: float
    perplexity: float | None           # the artifact's, on the held-out text
    reference_perplexity: float | None
    ppl_increase: float | None
    kl_mean: float                     # over every position of every prompt
    kl_p99: float
    kl_max: float
    decided: int                       # positions where fp32's top-1 leads by >= margin
    top1_decided: float                # the artifact's top-1 agreement there
    top1_all: float                    # and at every position
    rule: dict[str, float]


def first_divergence(expected: list[int], got: list[int]) -> int | None:
    """The 1-based step where the two continuations first differ; None when identical."""
    for i, (a, b) in enumerate(zip(expected, got, strict=False)):
        if a != b:
            return i + 1
    return None if len(expected) == len(got) else min(len(expected), len(got)) + 1


def cosines(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Row-wise cosine of two [steps, vocab] arrays, in float64 (two zero rows: 1.0; one: 0.0)."""
    x, y = np.asarray(a, dtype=np.float64), np.asarray(b, dtype=np.float64)
    nx, ny = np.linalg.norm(x, axis=1), np.linalg.norm(y, axis=1)
    norms = nx * ny
    dots = (x * y).sum(axis=1)
    return np.where(norms > 0, dots / np.where(norms > 0, norms, 1.0), np.where((nx == 0) & (ny == 0), 1.0, 0.0))


def top5_overlap(a: np.ndarray, b: np.ndarray, k: int = 5) -> np.ndarray:
    """Per row: the share of the reference's top-k ids that are also the artifact's top-k."""
    k = min(k, a.shape[1])
    top_a = np.argsort(-np.asarray(a), axis=1, kind="stable")[:, :k]
    top_b = np.argsort(-np.asarray(b), axis=1, kind="stable")[:, :k]
    return np.array([len(set(x.tolist()) & set(y.tolist())) / k for x, y in zip(top_a, top_b, strict=True)])


def log_softmax(a: np.ndarray) -> np.ndarray:
    """Row-wise log-softmax in float64."""
    x = np.asarray(a, dtype=np.float64)
    x = x - x.max(axis=1, keepdims=True)
    return np.asarray(x - np.log(np.exp(x).sum(axis=1, keepdims=True)), dtype=np.float64)


def kl_divergence(ref: np.ndarray, got: np.ndarray) -> np.ndarray:
    """Per row: KL(p_ref || p_got) of the next-token distributions of two [steps, vocab] logit arrays, in nats (what
    llama.cpp's perplexity tool reports per quantization type)."""
    lp, lq = log_softmax(ref), log_softmax(got)
    return np.asarray(np.maximum((np.exp(lp) * (lp - lq)).sum(axis=1), 0.0), dtype=np.float64)


def margins(logits: np.ndarray) -> np.ndarray:
    """Per row: the top-1 logit minus the second's (log of the two probabilities' ratio); inf with one column."""
    x = np.asarray(logits, dtype=np.float64)
    if x.shape[1] < 2:
        return np.full(len(x), np.inf)
    top2 = np.partition(x, -2, axis=1)[:, -2:]
    return top2[:, 1] - top2[:, 0]


def perplexity(logprobs: np.ndarray) -> float:
    return float(np.exp(-np.mean(logprobs))) if len(logprobs) else float("nan")


def _short(text: str, limit: int = 40) -> str:
    return repr(text if len(text) <= limit else text[: limit - 3] + "...")


def _token(decode: Callable[[list[int]], str], token: int | None) -> str:
    return "the end" if token is None else f"{decode([token])!r} (id {token})"


@dataclass(frozen=True)
class _Steps:
    """One prompt's measures at each step of the reference's continuation (empty: no continuation)."""

    cos: np.ndarray       # logits cosine
    top5: np.ndarray      # top-5 overlap
    kl: np.ndarray        # KL(fp32 || artifact)
    gap: np.ndarray       # fp32's top-1 margin
    same: np.ndarray      # the artifact's top-1 is fp32's
    ref_top: np.ndarray   # fp32's top-1, the artifact's
    top: np.ndarray


def _steps(text: str, ref_logits: np.ndarray, logits: np.ndarray) -> _Steps:
    """Every per-step measure of one prompt, each computed once (the prompt's figures and the totals use them)."""
    if logits.shape != ref_logits.shape:
        raise ValueError(f"prompt {_short(text)}: teacher-forced logits {logits.shape}, the reference's "
                         f"{ref_logits.shape}")
    ref_top, top = np.argmax(ref_logits, axis=1), np.argmax(logits, axis=1)
    return _Steps(cosines(ref_logits, logits), top5_overlap(ref_logits, logits), kl_divergence(ref_logits, logits),
                  margins(ref_logits), ref_top == top, ref_top, top)


def _prompt(text: str, expected: list[int], got: list[int], steps: _Steps, margin: float) -> PromptDoc:
    div = first_divergence(expected, got)
    n = len(expected)
    cos, top5, kl = (steps.cos, steps.top5, steps.kl) if n else (np.ones(1), np.ones(1), np.zeros(1))
    gap = steps.gap
    flips = [Flip(step=i + 1, expected=int(steps.ref_top[i]), got=int(steps.top[i]), margin=round(float(gap[i]), 4))
             for i in range(n) if gap[i] >= margin and not steps.same[i]]
    at = None if div is None else div - 1
    return PromptDoc(
        prompt=text, tokens=n, first_divergence=div,
        expected=None if at is None or at >= n else expected[at],
        got=None if at is None or at >= len(got) else got[at],
        agreement=1.0 if div is None else (div - 1) / max(1, n),
        min_cosine=float(cos.min()), min_cosine_step=int(cos.argmin()) + 1, top5=float(top5.mean()),
        flip_margin=None if at is None or at >= n else round(float(gap[at]), 4),
        kl_mean=float(kl.mean()), kl_max=float(kl.max()), kl_max_step=int(kl.argmax()) + 1,
        decided=int((gap >= margin).sum()), decided_flips=flips)


def _at_flip(d: PromptDoc) -> str:
    """Where a greedy run diverged, with fp32's margin there: a near-tie or a decided token."""
    m = d["flip_margin"]
    return "" if m is None else f" (fp32's top-1 led by {m:.3f} there)"


def judge(ref: Reference, cand: Candidate, rule: TokenRule,
          decode: Callable[[list[int]], str]) -> tuple[Verdict, TokensDoc, list[str]]:
    """The verdict, the report's section and its lines (a summary line, then one line per failed rule)."""
    if len(cand.traces) != len(ref.prompts) or len(cand.logits) != len(ref.prompts):
        raise ValueError(f"{len(ref.prompts)} prompts in the reference, {len(cand.traces)} greedy runs and "
                         f"{len(cand.logits)} teacher-forced runs in the candidate")
    measured = [_steps(p.text, p.logits, lg) for p, lg in zip(ref.prompts, cand.logits, strict=True)]
    docs = [_prompt(p.text, p.tokens, t.tokens, m, rule.margin)
            for p, t, m in zip(ref.prompts, cand.traces, measured, strict=True)]
    steps = [m for p, m in zip(ref.prompts, measured, strict=True) if len(p.tokens)]  # the totals' steps
    agreement = float(np.mean([d["agreement"] for d in docs])) if docs else 1.0
    min_cos = min((d["min_cosine"] for d in docs), default=1.0)
    top5 = float(np.concatenate([m.top5 for m in steps]).mean()) if steps else 1.0
    ref_ppl = ppl = increase = None
    if ref.heldout_logprobs is not None:
        if cand.heldout_logprobs is None or len(cand.heldout_logprobs) != len(ref.heldout_logprobs):
            raise ValueError("the candidate's held-out log-probabilities do not match the reference's "
                             f"{len(ref.heldout_logprobs)} tokens")
        ref_ppl, ppl = perplexity(ref.heldout_logprobs), perplexity(cand.heldout_logprobs)
        increase = ppl / ref_ppl - 1
    kls = np.concatenate([m.kl for m in steps]) if steps else np.zeros(1)
    same = np.concatenate([m.same for m in steps]) if steps else np.ones(1, dtype=bool)
    decided = sum(d["decided"] for d in docs)
    flips = sum(len(d["decided_flips"]) for d in docs)
    top1_decided = 1.0 - flips / decided if decided else 1.0
    doc = TokensDoc(prompts=docs, agreement=agreement, exact_prompts=sum(d["first_divergence"] is None for d in docs),
                    min_cosine=min_cos, top5=top5, perplexity=ppl, reference_perplexity=ref_ppl,
                    ppl_increase=increase, kl_mean=float(kls.mean()), kl_p99=float(np.quantile(kls, 0.99)),
                    kl_max=float(kls.max()), decided=decided, top1_decided=top1_decided,
                    top1_all=float(same.mean()), rule=asdict(rule))

    problems: list[str] = []
    early = [d for d in docs if d["first_divergence"] is not None
             and d["first_divergence"] <= min(rule.match_tokens, d["tokens"])]
    for d in early:
        problems.append(f"prompt {_short(d['prompt'])}: greedy diverges at step {d['first_divergence']} (the "
                        f"first {rule.match_tokens} tokens must match): expected {_token(decode, d['expected'])}, "
                        f"got {_token(decode, d['got'])}{_at_flip(d)}")
    if agreement < rule.min_agreement:
        worst = min(docs, key=lambda d: d["agreement"])
        problems.append(f"token agreement {agreement:.3f} < {rule.min_agreement} (the share of each continuation "
                        f"matched before its first divergence, mean of {len(docs)} prompts); worst: prompt "
                        f"{_short(worst['prompt'])} at step {worst['first_divergence']}: expected "
                        f"{_token(decode, worst['expected'])}, got {_token(decode, worst['got'])}{_at_flip(worst)}")
    if doc["kl_mean"] > rule.max_kl:
        at = max(range(len(docs)), key=lambda j: docs[j]["kl_max"])
        step = docs[at]["kl_max_step"]
        top, expected = int(measured[at].top[step - 1]), int(measured[at].ref_top[step - 1])
        lead = float(measured[at].gap[step - 1])
        problems.append(f"KL divergence {doc['kl_mean']:.5f} > max_kl {rule.max_kl} (nats per position, mean of "
                        f"{len(kls)} positions along fp32's continuations; p99 {doc['kl_p99']:.4f}); largest "
                        f"{docs[at]['kl_max']:.4f}: prompt {_short(docs[at]['prompt'])}, step {step}: fp32's top-1 "
                        f"{_token(decode, expected)} (leading by {lead:.3f}), the artifact's {_token(decode, top)}")
    if top1_decided < rule.min_top1:
        d = max((d for d in docs if d["decided_flips"]), key=lambda d: max(f["margin"] for f in d["decided_flips"]))
        f = max(d["decided_flips"], key=lambda f: f["margin"])
        problems.append(f"top-1 agreement {top1_decided:.4f} < min_top1 {rule.min_top1} at the {decided} decided "
                        f"positions (fp32's top-1 leads by >= margin {rule.margin}): {flips} flipped; the most "
                        f"decided: prompt {_short(d['prompt'])}, step {f['step']}: expected "
                        f"{_token(decode, f['expected'])}, got {_token(decode, f['got'])}, fp32's margin "
                        f"{f['margin']:.3f}")
    if min_cos < rule.min_cosine:
        at = min(range(len(docs)), key=lambda j: docs[j]["min_cosine"])
        step = docs[at]["min_cosine_step"]
        expected, top = ref.prompts[at].tokens[step - 1], int(measured[at].top[step - 1])
        problems.append(f"next-token logits cosine {min_cos:.6f} < {rule.min_cosine}: prompt "
                        f"{_short(docs[at]['prompt'])}, step {step}: expected {_token(decode, expected)}, "
                        + ("the artifact still ranks it first" if top == expected
                           else f"the artifact's top token {_token(decode, top)}"))
    if top5 < rule.min_top5:
        worst = min(docs, key=lambda d: d["top5"])
        problems.append(f"top-5 overlap {top5:.4f} < {rule.min_top5} (mean over all steps); lowest: prompt "
                        f"{_short(worst['prompt'])} ({worst['top5']:.4f})")
    if increase is not None and increase > rule.max_ppl_increase:
        problems.append(f"held-out perplexity {ppl:.4f} is {increase:+.2%} vs the reference's {ref_ppl:.4f} "
                        f"(max_ppl_increase {rule.max_ppl_increase:.2%})")
    diverged = [d for d in docs if d["first_divergence"] is not None]
    if problems and not early and diverged:
        first = min(diverged, key=lambda d: d["first_divergence"] or 0)
        problems.append(f"earliest divergence: prompt {_short(first['prompt'])} at step {first['first_divergence']}: "
                        f"expected {_token(decode, first['expected'])}, got {_token(decode, first['got'])}"
                        f"{_at_flip(first)}")
    verdict = Verdict.FAIL if problems else Verdict.PASS
    summary = (f"tokens: {verdict}: {doc['exact_prompts']}/{len(docs)} prompts exact, agreement {agreement:.3f}, "
               f"min cosine {min_cos:.6f}, top-5 {top5:.4f}, KL {doc['kl_mean']:.5f}, top-1 {top1_decided:.4f} of "
               f"{decided} decided"
               + ("" if increase is None else f", perplexity {ppl:.4f} ({increase:+.2%})"))
    return verdict, doc, [summary, *(f"  {p}" for p in problems)]
