"""The token gate's judgement (ortbuild/gating/measure/tokens.py) on synthetic references and candidates: every rule
field passes and fails on the side of its bound it should, the section's numbers are the documented
definitions, and a failure line names the prompt, the step and both tokens."""

from __future__ import annotations

import itertools
import json
import math
from dataclasses import replace

import numpy as np
import pytest

from ortbuild.gating.measure import tokens
from ortbuild.gating.measure.tokens import DEFAULTS, TokenRule, judge
from ortbuild.generative.reference import PromptReference, Reference
from ortbuild.generative.run import Candidate, Trace
from ortbuild.status import Verdict

VOCAB = 26
LENIENT = TokenRule(match_tokens=0, min_agreement=0.0, min_cosine=-2.0, min_top5=0.0, max_ppl_increase=1e9)


def decode(ids: list[int]) -> str:
    return "".join(chr(ord("a") + i) for i in ids)


def _logits(tokens: list[int], seed: int) -> np.ndarray:
    """Random logits whose argmax at row i is tokens[i], with a clear margin."""
    rows = np.random.default_rng(seed).normal(size=(len(tokens), VOCAB)).astype(np.float32)
    rows[np.arange(len(tokens)), tokens] += 10.0
    return rows


def make_ref(continuations: dict[str, list[int]], heldout: int = 50) -> Reference:
    prompts = tuple(PromptReference(text=text, prompt_ids=[1, 2, 3], tokens=toks, logits=_logits(toks, i))
                    for i, (text, toks) in enumerate(continuations.items()))
    rng = np.random.default_rng(99)
    lp = np.log(rng.uniform(0.05, 0.5, size=heldout))
    return Reference(prompts=prompts, max_tokens=max(len(t) for t in continuations.values()),
                     heldout_ids=list(range(heldout + 1)), heldout_logprobs=lp)


def same(ref: Reference) -> Candidate:
    assert ref.heldout_logprobs is not None
    return Candidate(traces=tuple(Trace(list(p.tokens), 0.01, [0.001] * (len(p.tokens) - 1)) for p in ref.prompts),
                     logits=tuple(p.logits.copy() for p in ref.prompts), heldout_logprobs=ref.heldout_logprobs.copy())


def with_tokens(cand: Candidate, index: int, toks: list[int]) -> Candidate:
    traces = list(cand.traces)
    traces[index] = Trace(toks, 0.01, [])
    return replace(cand, traces=tuple(traces))


REF = make_ref({"The quick brown fox jumps over the lazy dog": list(range(10)),
                "Second prompt": [5, 4, 3, 2, 1, 0, 1, 2, 3, 4]})


def test_identical_passes_the_strictest_rule_with_exact_numbers() -> None:
    verdict, doc, lines = judge(REF, same(REF), DEFAULTS["fp32"], decode)
    assert verdict is Verdict.PASS, lines
    assert doc["agreement"] == 1.0 and doc["exact_prompts"] == 2 and doc["top5"] == 1.0
    assert doc["min_cosine"] == pytest.approx(1.0, abs=1e-12) and doc["ppl_increase"] == pytest.approx(0.0)
    assert [p["first_divergence"] for p in doc["prompts"]] == [None, None]
    assert doc["rule"] == {"match_tokens": 32, "min_agreement": 0.95, "min_cosine": 0.9999, "min_top5": 0.99,
                           "max_ppl_increase": 0.001, "max_kl": 0.001, "min_top1": 1.0, "margin": 1.0}
    assert doc["kl_mean"] == pytest.approx(0.0, abs=1e-12) and doc["top1_decided"] == 1.0 and doc["top1_all"] == 1.0
    assert doc["decided"] == 20  # every position of _logits leads by a margin of about 10
    assert len(lines) == 1 and lines[0].startswith("tokens: PASS: 2/2 prompts exact")
    json.dumps(doc)


def test_match_tokens_names_prompt_step_and_both_tokens() -> None:
    cand = with_tokens(same(REF), 0, [0, 1, 23, 3, 4, 5, 6, 7, 8, 9])
    rule = replace(LENIENT, match_tokens=4)
    verdict, doc, lines = judge(REF, cand, rule, decode)
    assert verdict is Verdict.FAIL
    assert doc["prompts"][0]["first_divergence"] == 3
    assert (doc["prompts"][0]["expected"], doc["prompts"][0]["got"]) == (2, 23)
    failure = lines[1]
    assert "'The quick brown fox jumps over the la...'" in failure
    assert "step 3" in failure and "expected 'c' (id 2), got 'x' (id 23)" in failure
    assert judge(REF, cand, replace(LENIENT, match_tokens=2), decode)[0] is Verdict.PASS


def test_match_tokens_beyond_a_short_continuation_compares_what_there_is() -> None:
    ref = make_ref({"ends early": [4, 2]})
    assert judge(ref, same(ref), replace(LENIENT, match_tokens=32), decode)[0] is Verdict.PASS
    cand = with_tokens(same(ref), 0, [4])   # the artifact stopped one token early
    verdict, doc, lines = judge(ref, cand, replace(LENIENT, match_tokens=32), decode)
    assert verdict is Verdict.FAIL and doc["prompts"][0]["first_divergence"] == 2
    assert "expected 'c' (id 2), got the end" in lines[1]


def test_agreement_is_the_mean_matched_prefix_share() -> None:
    cand = with_tokens(same(REF), 1, [5, 4, 3, 2, 1, 9, 1, 2, 3, 4])   # diverges at step 6: 5 of 10 matched
    _, doc, _ = judge(REF, cand, LENIENT, decode)
    assert doc["prompts"][1]["agreement"] == 0.5 and doc["agreement"] == 0.75
    assert judge(REF, cand, replace(LENIENT, min_agreement=0.75), decode)[0] is Verdict.PASS
    verdict, _, lines = judge(REF, cand, replace(LENIENT, min_agreement=0.8), decode)
    assert verdict is Verdict.FAIL
    assert "token agreement 0.750 < 0.8" in lines[1] and "'Second prompt' at step 6" in lines[1]
    assert "expected 'a' (id 0), got 'j' (id 9)" in lines[1]


def test_cosine_is_the_minimum_over_steps_and_names_the_step() -> None:
    cand = same(REF)
    bad = cand.logits[1].copy()
    bad[7] = np.roll(bad[7], 1)                       # step 8 of the second prompt: another top token
    cand = replace(cand, logits=(cand.logits[0], bad))
    expected = float(np.dot(REF.prompts[1].logits[7].astype(np.float64), bad[7])
                     / np.linalg.norm(REF.prompts[1].logits[7].astype(np.float64)) / np.linalg.norm(bad[7]))
    _, doc, _ = judge(REF, cand, LENIENT, decode)
    assert doc["min_cosine"] == pytest.approx(expected) and doc["prompts"][1]["min_cosine_step"] == 8
    assert judge(REF, cand, replace(LENIENT, min_cosine=expected - 1e-6), decode)[0] is Verdict.PASS
    verdict, _, lines = judge(REF, cand, replace(LENIENT, min_cosine=expected + 1e-6), decode)
    assert verdict is Verdict.FAIL
    assert "'Second prompt', step 8: expected 'c' (id 2), the artifact's top token 'd' (id 3)" in lines[1]


def test_a_failure_without_an_early_divergence_names_the_earliest_one() -> None:
    cand = with_tokens(same(REF), 1, [5, 4, 3, 2, 1, 0, 1, 2, 8, 4])    # diverges at step 9
    scaled = cand.logits[0].copy()
    scaled[4, 4] *= 0.5                                # step 5: lower, still the top token
    cand = replace(cand, logits=(scaled, cand.logits[1]))
    verdict, doc, lines = judge(REF, cand, replace(LENIENT, min_cosine=0.9999), decode)
    assert verdict is Verdict.FAIL and doc["prompts"][0]["min_cosine_step"] == 5
    assert "step 5: expected 'e' (id 4), the artifact still ranks it first" in lines[1]
    margin = tokens.margins(REF.prompts[1].logits)[8]
    assert lines[2] == ("  earliest divergence: prompt 'Second prompt' at step 9: expected 'd' (id 3), got 'i' (id 8)"
                        f" (fp32's top-1 led by {margin:.3f} there)")
    assert doc["prompts"][1]["flip_margin"] == pytest.approx(margin, abs=1e-4)
    assert len(judge(REF, cand, LENIENT, decode)[2]) == 1           # passing: no divergence line


def test_kl_divergence_is_the_mean_over_positions_and_names_the_largest() -> None:
    cand = same(REF)
    worse = cand.logits[1].copy()
    worse[6] = REF.prompts[1].logits[6] * 0.5          # step 7: the same top token, a flatter distribution
    cand = replace(cand, logits=(cand.logits[0], worse))
    lp, lq = tokens.log_softmax(REF.prompts[1].logits[6:7]), tokens.log_softmax(worse[6:7])
    kl = float((np.exp(lp) * (lp - lq)).sum())
    _, doc, _ = judge(REF, cand, LENIENT, decode)
    assert kl > 0 and doc["kl_max"] == pytest.approx(kl) and doc["kl_mean"] == pytest.approx(kl / 20)
    assert doc["prompts"][1]["kl_max_step"] == 7 and doc["top1_decided"] == 1.0
    assert judge(REF, cand, replace(LENIENT, max_kl=kl / 20 + 1e-9), decode)[0] is Verdict.PASS
    verdict, _, lines = judge(REF, cand, replace(LENIENT, max_kl=kl / 20 - 1e-9), decode)
    assert verdict is Verdict.FAIL
    lead = tokens.margins(REF.prompts[1].logits[6:7])[0]
    assert (f"largest {kl:.4f}: prompt 'Second prompt', step 7: fp32's top-1 'b' (id 1) (leading by {lead:.3f}), the "
            "artifact's 'b'") in lines[1]


def test_top1_counts_flips_only_where_fp32_is_decided_and_names_the_margin() -> None:
    ref = make_ref({"p": [0, 1, 2, 3]})
    logits = ref.prompts[0].logits.copy()
    logits[1, 7] = logits[1, 1] - 0.5                 # step 2: a near-tie in fp32 (margin 0.5)
    ref = replace(ref, prompts=(replace(ref.prompts[0], logits=logits),))
    got = logits.copy()
    got[1, 7], got[1, 1] = logits[1, 1], logits[1, 7]  # the artifact flips the near-tie: not counted
    cand = replace(same(ref), logits=(got,))
    _, doc, _ = judge(ref, cand, LENIENT, decode)
    assert doc["decided"] == 3 and doc["top1_decided"] == 1.0 and doc["top1_all"] == 0.75
    assert doc["prompts"][0]["decided_flips"] == []
    got[3, 2] = got[3, 3] + 1.0                        # step 4: decided in fp32 (margin ~10), flipped
    margin = float(tokens.margins(logits)[3])
    _, doc, lines = judge(ref, replace(cand, logits=(got,)), replace(LENIENT, min_top1=0.9), decode)
    assert doc["top1_decided"] == pytest.approx(2 / 3)
    assert doc["prompts"][0]["decided_flips"] == [{"step": 4, "expected": 3, "got": 2, "margin": round(margin, 4)}]
    assert (f"top-1 agreement 0.6667 < min_top1 0.9 at the 3 decided positions (fp32's top-1 leads by >= margin "
            f"1.0): 1 flipped; the most decided: prompt 'p', step 4: expected 'd' (id 3), got 'c' (id 2), fp32's "
            f"margin {margin:.3f}") in lines[1]
    # a margin above every position's: nothing is decided, nothing judged
    assert judge(ref, replace(cand, logits=(got,)), replace(LENIENT, min_top1=0.9, margin=100.0), decode)[0] \
        is Verdict.PASS


def test_top5_is_the_mean_overlap_over_all_steps() -> None:
    cand = same(REF)
    flipped = -cand.logits[0]                          # every step's top 5 becomes its bottom 5: overlap 0
    cand = replace(cand, logits=(flipped, cand.logits[1]))
    _, doc, _ = judge(REF, cand, LENIENT, decode)
    assert doc["prompts"][0]["top5"] == 0.0 and doc["top5"] == 0.5
    assert judge(REF, cand, replace(LENIENT, min_top5=0.5), decode)[0] is Verdict.PASS
    verdict, _, lines = judge(REF, cand, replace(LENIENT, min_top5=0.6), decode)
    assert verdict is Verdict.FAIL and "top-5 overlap 0.5000 < 0.6" in lines[1]


def test_perplexity_increase() -> None:
    assert REF.heldout_logprobs is not None
    cand = replace(same(REF), heldout_logprobs=REF.heldout_logprobs - math.log(1.1))   # every p / 1.1
    _, doc, _ = judge(REF, cand, LENIENT, decode)
    assert doc["ppl_increase"] == pytest.approx(0.1)
    assert doc["reference_perplexity"] == pytest.approx(math.exp(-REF.heldout_logprobs.mean()))
    assert judge(REF, cand, replace(LENIENT, max_ppl_increase=0.11), decode)[0] is Verdict.PASS
    verdict, _, lines = judge(REF, cand, replace(LENIENT, max_ppl_increase=0.05), decode)
    assert verdict is Verdict.FAIL and "+10.00%" in lines[1] and "max_ppl_increase 5.00%" in lines[1]


def test_no_heldout_text_skips_perplexity() -> None:
    ref = replace(REF, heldout_ids=[], heldout_logprobs=None)
    verdict, doc, _ = judge(ref, replace(same(REF), heldout_logprobs=None), DEFAULTS["fp32"], decode)
    assert verdict is Verdict.PASS and doc["perplexity"] is None and doc["ppl_increase"] is None


def test_mismatched_inputs_are_errors() -> None:
    with pytest.raises(ValueError, match="2 prompts in the reference, 1 greedy runs"):
        judge(REF, replace(same(REF), traces=same(REF).traces[:1]), LENIENT, decode)
    with pytest.raises(ValueError, match="held-out"):
        judge(REF, replace(same(REF), heldout_logprobs=None), LENIENT, decode)
    with pytest.raises(ValueError, match="teacher-forced logits"):
        judge(REF, replace(same(REF), logits=(REF.prompts[0].logits[:3], REF.prompts[1].logits)), LENIENT, decode)


def test_helpers() -> None:
    assert tokens.first_divergence([1, 2, 3], [1, 2, 3]) is None
    assert tokens.first_divergence([1, 2, 3], [1, 5, 3]) == 2
    assert tokens.first_divergence([1, 2, 3], [1, 2]) == 3
    assert tokens.first_divergence([1, 2], [1, 2, 3]) == 3
    zero = np.zeros((1, 4))
    assert tokens.cosines(zero, zero).tolist() == [1.0]
    assert tokens.cosines(zero, np.ones((1, 4))).tolist() == [0.0]
    a = np.array([[5.0, 4, 3, 2, 1, 0, -1]])
    assert tokens.top5_overlap(a, a).tolist() == [1.0]
    assert tokens.top5_overlap(a, np.array([[5.0, 4, 3, 2, -9, 0, 9]])).tolist() == [0.8]
    assert tokens.margins(np.array([[1.0, 3.5, 2.0], [0.0, 0.0, 0.0]])).tolist() == [1.5, 0.0]
    assert tokens.kl_divergence(a, a).tolist() == [0.0]
    assert tokens.kl_divergence(np.array([[0.0, 0.0]]), np.array([[0.0, math.log(3)]]))[0] == \
        pytest.approx(0.5 * math.log(0.5 / 0.25) + 0.5 * math.log(0.5 / 0.75))


def test_defaults_cover_every_precision_and_loosen_with_it() -> None:
    assert list(DEFAULTS) == ["fp32", "fp16", "int8", "int4"]
    order = list(DEFAULTS.values())
    for stricter, looser in itertools.pairwise(order):
        assert stricter.match_tokens >= looser.match_tokens
        assert stricter.min_agreement >= looser.min_agreement
        assert stricter.min_cosine >= looser.min_cosine
        assert stricter.min_top5 >= looser.min_top5
        assert stricter.max_ppl_increase <= looser.max_ppl_increase
        assert stricter.max_kl <= looser.max_kl and stricter.min_top1 >= looser.min_top1
