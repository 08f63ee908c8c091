"""The artifact side (ortbuild/generative/run.py) and the fp32 reference (ortbuild/generative/reference.py) on
the example generative model, built with onnxruntime-genai's model builder, and the token gate's judgement
(ortbuild/gating/measure/tokens.py) of real builds: fp32 agrees with the reference exactly, int4 with the builder's
CPU defaults passes the int4 rule, and a harmful int4 setting (block size 256, accuracy level 1) fails it.

The model is models/generate_llm.py with its default 600 training steps (made once, ~2 minutes on 2 cores,
into the tests' cache; keyed by the generator's digest). With 200 steps the model is too uncertain for int4
settings to differ: every block size and accuracy level gives the same cosine and perplexity there.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest

from ortbuild.gating.measure.tokens import DEFAULTS, judge
from ortbuild.generative import run
from ortbuild.generative.reference import Reference, log_probs_of, reference
from ortbuild.status import Verdict
from tests.genmodels import builder_runs

pytestmark = pytest.mark.generative
og = pytest.importorskip("onnxruntime_genai")

MAX_TOKENS = 32
HARMFUL = ["block_size=128", "accuracy_level=4"]
ACCURATE = ["block_size=16", "accuracy_level=0"]  # int4 that keeps most greedy tokens on the example model


@pytest.fixture(scope="session")
def builds(llm: Path, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """The four builds, made by the model builder's command line in one interpreter (tests/genmodels.py)."""
    root = tmp_path_factory.mktemp("genai")
    settings = {"fp32": ("fp32", []), "int4": ("int4", ACCURATE), "int4-default": ("int4", []),
                "int4-harmful": ("int4", HARMFUL)}
    builder_runs(*([
        "-i", str(llm), "-o", str(root / name), "-p", precision, "-e", "cpu",
        *(["--extra_options", *extra] if extra else [])] for name, (precision, extra) in settings.items()))
    return {name: root / name for name in settings}


@pytest.fixture(scope="session")
def vocab(llm: Path) -> int:
    return int(json.loads((llm / "config.json").read_text())["vocab_size"])


@pytest.fixture(scope="session")
def ref(llm: Path) -> Reference:
    prompts = (llm / "prompts.txt").read_text(encoding="utf-8").splitlines()
    return reference(llm, prompts, MAX_TOKENS, (llm / "heldout.txt").read_text(encoding="utf-8"))


def _decoder(model: object) -> Callable[[list[int]], str]:
    tokenizer = og.Tokenizer(model)
    return lambda ids: str(tokenizer.decode(np.asarray(ids, dtype=np.int32)))


@pytest.mark.parametrize("name", ["fp32", "int4"])
def test_greedy_is_the_argmax_of_its_own_teacher_forcing(builds: dict[str, Path], ref: Reference,
                                                         name: str, vocab: int) -> None:
    model = og.Model(str(builds[name]))
    for p in ref.prompts:
        trace = run.greedy(model, p.prompt_ids, MAX_TOKENS)
        assert len(trace.tokens) == MAX_TOKENS or trace.tokens[-1] == 2          # EOS (id 2) ends it early
        assert len(trace.step_s) == len(trace.tokens) - 1 and trace.ttft_s > 0
        logits = run.teacher_forced(model, p.prompt_ids, trace.tokens)
        assert logits.shape == (len(trace.tokens), vocab) and logits.dtype == np.float32
        assert logits.argmax(axis=1).tolist() == trace.tokens, p.text


def test_log_probs_are_the_teacher_forced_log_softmax(builds: dict[str, Path], ref: Reference, vocab: int) -> None:
    model = og.Model(str(builds["fp32"]))
    p = ref.prompts[0]
    ids = [*p.prompt_ids, *p.tokens]
    lp = run.log_probs(model, ids)
    assert lp.shape == (len(ids) - 1,) and lp.dtype == np.float64 and (lp < 0).all()
    tf = run.teacher_forced(model, p.prompt_ids, p.tokens)
    along = log_probs_of(np.concatenate([np.zeros((len(p.prompt_ids) - 1, tf.shape[1])), tf]), ids)
    np.testing.assert_allclose(lp[len(p.prompt_ids) - 1:], along[len(p.prompt_ids) - 1:], atol=1e-4)
    # the greedy token is the most likely one: its log-prob is at least log(1/vocab)
    assert (lp[len(p.prompt_ids) - 1:] > np.log(1 / vocab)).all()
    held = ref.heldout_ids
    assert len(held) == run.context_length(builds["fp32"]) == 256                # cut to the context
    assert run.log_probs(model, [*held, *held]).shape == (255,)                  # the artifact cuts too
    # the held-out perplexity through the artifact is the reference's (fp32: the same function)
    np.testing.assert_allclose(run.log_probs(model, held), ref.heldout_logprobs, atol=1e-3)


def test_reference_is_self_consistent_and_tokenizes_like_genai(builds: dict[str, Path], ref: Reference,
                                                               vocab: int) -> None:
    tokenizer = og.Tokenizer(og.Model(str(builds["fp32"])))
    assert len(ref.prompts) == 12 and ref.heldout_logprobs is not None
    for p in ref.prompts:
        assert list(tokenizer.encode(p.text)) == p.prompt_ids
        assert len(p.tokens) == MAX_TOKENS and p.logits.shape == (MAX_TOKENS, vocab)
        assert p.logits.argmax(axis=1).tolist() == p.tokens


def test_fp32_artifact_agrees_with_the_reference(builds: dict[str, Path], ref: Reference) -> None:
    model = og.Model(str(builds["fp32"]))
    verdict, doc, lines = judge(ref, run.observe(model, ref), DEFAULTS["fp32"], _decoder(model))
    assert verdict is Verdict.PASS, lines
    assert doc["agreement"] == 1.0 and doc["exact_prompts"] == 12
    assert doc["min_cosine"] > 0.99999 and doc["top5"] == 1.0
    assert doc["ppl_increase"] is not None and abs(doc["ppl_increase"]) < 1e-4


def test_int4_by_its_distribution_the_builder_default_passes_and_a_harmful_setting_fails(
        builds: dict[str, Path], ref: Reference) -> None:
    """The int4 rule judges the next-token distributions (KL, top-1 where fp32 is decided), not greedy agreement:
    the builder's CPU default flips near-ties (agreement 0.59) yet its distribution is close, so it passes; blocks
    of 128 move decided tokens and fail, naming the position, both tokens and fp32's margin there."""
    model = og.Model(str(builds["int4"]))
    verdict, accurate, lines = judge(ref, run.observe(model, ref), DEFAULTS["int4"], _decoder(model))
    assert verdict is Verdict.PASS, lines
    assert accurate["exact_prompts"] < 12                  # int4 flips greedy tokens even then
    model = og.Model(str(builds["int4-default"]))  # the builder's CPU default (ORT 29849's near-tie flips)
    _, default, lines = judge(ref, run.observe(model, ref), DEFAULTS["int4"], _decoder(model))
    # on this outlier-channel model it sits near the bound (KL 0.046 here): its verdict is not asserted
    assert default["agreement"] < 0.7 and accurate["kl_mean"] < default["kl_mean"] < 2 * DEFAULTS["int4"].max_kl
    flips = [d["flip_margin"] for d in default["prompts"] if d["flip_margin"] is not None]
    assert flips and min(flips) < 1.0  # greedy flips, reported with fp32's margin: some at near-ties
    model = og.Model(str(builds["int4-harmful"]))
    verdict, harmful, lines = judge(ref, run.observe(model, ref), DEFAULTS["int4"], _decoder(model))
    assert verdict is Verdict.FAIL
    assert harmful["kl_mean"] > DEFAULTS["int4"].max_kl > default["kl_mean"] > accurate["kl_mean"]
    assert harmful["top1_decided"] < DEFAULTS["int4"].min_top1 <= default["top1_decided"]
    failure = next(line for line in lines if "top-1 agreement" in line)
    worst = max((f for d in harmful["prompts"] for f in d["decided_flips"]), key=lambda f: f["margin"])
    assert f"step {worst['step']}: expected '" in failure and f"fp32's margin {worst['margin']:.3f}" in failure
    assert f"(id {worst['expected']}), got '" in failure and f"(id {worst['got']})" in failure
    kl = next(line for line in lines if line.startswith("  KL divergence"))
    assert f"KL divergence {harmful['kl_mean']:.5f} > max_kl 0.05" in kl and "(leading by " in kl
    first = min((d for d in harmful["prompts"] if d["first_divergence"]), key=lambda d: d["first_divergence"] or 0)
    assert lines[-1].startswith(f"  earliest divergence: prompt {repr(first['prompt'][:20]).rstrip(chr(39))}")
    assert f"(fp32's top-1 led by {first['flip_margin']:.3f} there)" in lines[-1]


