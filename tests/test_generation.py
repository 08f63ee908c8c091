"""Generation latency and memory (ortbuild.gating.measure.generation, generation_memory, generation_report): the pure
parts (budgets, lengths, the prompt, the rounds adapter over latency.sample) unmarked; the rest on genai builds of
the example model (the builder CLI, fp32, into temporary folders), marked `generative` (torch, onnxruntime-genai:
`nox -s tests-generative`)."""

from __future__ import annotations

import json
import shutil
import time
from pathlib import Path
from typing import Any

import pytest

from ortbuild.errors import ArtifactError
from ortbuild.gating.measure import generation as gen
from ortbuild.gating.measure import generation_memory as memory
from ortbuild.gating.measure import sampling as latency
from ortbuild.gating.measure.generation_budget import GenaiConfig, GenerationBudget, Timing
from ortbuild.gating.measure.percentiles import planned_samples
from ortbuild.status import Verdict
from tests.genmodels import builder_runs

CONFIG = GenaiConfig(vocab_size=50, context_length=128, special=frozenset({0, 1, 2}), layers=2,
                         present_key="present.0.key", share_buffer=True)
generative = pytest.mark.generative


# ---------------------------------------------------------------------------------------------- pure logic

def test_prompt_ids_exact_count_without_special_tokens_from_a_fixed_seed() -> None:
    ids = gen.prompt_ids(CONFIG, 500)
    assert len(ids) == 500 and set(ids) <= set(range(3, 50)) and len(set(ids)) > 40
    assert gen.prompt_ids(CONFIG, 500) == ids and gen.prompt_ids(CONFIG, 500, seed=1) != ids


def test_budgets_are_named_by_their_key_and_judged_on_their_series() -> None:
    b = GenerationBudget(ttft_p90_ms=5.0, tpot_p50_ms=1.0, tpot_p99_ms=2.0, min_tokens_per_second=100.0)
    got = {x.kind: (x.percentile, x.limit, x.values({"ttft": [7.0], "tpot": [0.5]}, "ttft")[0])
           for x in b.budgets()}
    assert got == {"ttft_p90_ms": (0.9, 5.0, [7.0]), "tpot_p50_ms": (0.5, 1.0, [0.5]),
                   "tpot_p99_ms": (0.99, 2.0, [0.5]), "min_tokens_per_second": (0.5, 10.0, [0.5])}
    assert b.set() == {"ttft_p90_ms": 5.0, "tpot_p50_ms": 1.0, "tpot_p99_ms": 2.0, "min_tokens_per_second": 100.0}
    assert GenerationBudget().budgets() == []


def test_each_budget_is_judged_on_its_own_series_in_the_sampler() -> None:
    """A TPOT budget between the TPOT and the TTFT figures passes (judged on TPOT), a TTFT one there fails: the
    sampler calls each budget's own values() (it once called Budget.values unbound, judging TPOT and tokens/s
    budgets on the TTFT samples)."""
    def fake() -> Timing:  # TTFT 10 ms, TPOT 1 ms
        return Timing(10.0, (1.0, 1.0), 0.0)

    rounds = gen._Rounds(fake)
    budgets = GenerationBudget(tpot_p90_ms=5.0, min_tokens_per_second=500.0).budgets()
    out = latency.sample({"ttft": rounds.call("ttft"), "tpot": rounds.call("tpot")}, "ttft", budgets,
                         latency.Plan(0.95, 0, 0.0, 0.0), clock=rounds.clock, read=lambda: 0.0)
    tpot = out.verdicts["tpot_p90_ms"]
    assert tpot.verdict is Verdict.PASS and tpot.observed == pytest.approx(1.0)
    assert out.verdicts["min_tokens_per_second"].verdict is Verdict.PASS
    rounds = gen._Rounds(fake)
    out = latency.sample({"ttft": rounds.call("ttft"), "tpot": rounds.call("tpot")}, "ttft",
                         GenerationBudget(ttft_p90_ms=5.0).budgets(), latency.Plan(0.95, 0, 0.0, 0.0),
                         clock=rounds.clock, read=lambda: 0.0)
    ttft = out.verdicts["ttft_p90_ms"]
    assert ttft.verdict is Verdict.FAIL and ttft.observed == pytest.approx(10.0)


def test_lengths_that_do_not_fit_are_refused_with_the_numbers() -> None:
    assert gen.shape_problem(GenerationBudget(), CONFIG) is None
    assert "97 is above the context length 96" in str(
        gen.shape_problem(GenerationBudget(prompt_tokens=65, context_length=96), CONFIG))
    assert "new_tokens at least 2" in str(gen.shape_problem(GenerationBudget(new_tokens=1), CONFIG))
    assert "above the model's 128" in str(gen.shape_problem(GenerationBudget(context_length=256), CONFIG))


def test_rounds_give_each_series_one_figure_per_generation() -> None:
    """latency.sample over _Rounds: one generation per round whatever the order of the calls (A B, B A), each
    series gets exactly that generation's figure, and the plan counts generations (stopping at its first look
    that decides)."""
    made = iter(range(1, 10_000))

    def fake() -> Timing:  # a generation whose figures say which it was
        k = next(made)
        return Timing(float(k), (k / 1000, k / 1000 * 3), 0.0)

    rounds = gen._Rounds(fake)
    budgets = GenerationBudget(ttft_p50_ms=1e9).budgets()
    out = latency.sample({"ttft": rounds.call("ttft"), "tpot": rounds.call("tpot")}, "ttft", budgets,
                         latency.Plan(0.95, 0, 0.0, 0.0), clock=rounds.clock, read=lambda: 0.0)
    n = len(rounds.timings)
    assert n == latency.FIRST_LOOK and out.verdicts["ttft_p50_ms"].verdict is Verdict.PASS and out.early
    assert out.series["ttft"].samples == pytest.approx([float(k) for k in range(1, n + 1)])
    assert out.series["tpot"].samples == pytest.approx([k / 500 for k in range(1, n + 1)])


def test_an_unreadable_genai_config_names_the_file(tmp_path: Path) -> None:
    (tmp_path / "genai_config.json").write_text('{"model": {}}')
    with pytest.raises(ArtifactError, match=r"genai_config.json: not a readable onnxruntime-genai config"):
        gen.read_config(tmp_path)


# ---------------------------------------------------------------------------------------- on genai builds

@pytest.fixture(scope="session")
def builds(llm: Path, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """fp32 builds of the example model: as it is ("fp32"), and the same weights with a 2048-token context
    ("fp32_long"; RoPE: the weights do not depend on the context length), made by the model builder's command
    line in one interpreter (tests/genmodels.py)."""
    pytest.importorskip("onnxruntime_genai")
    base = tmp_path_factory.mktemp("gen")
    hf = shutil.copytree(llm, base / "long-hf")
    cfg = json.loads((hf / "config.json").read_text())
    (hf / "config.json").write_text(json.dumps({**cfg, "max_position_embeddings": 2048}))
    out = {"fp32": base / "fp32", "fp32_long": base / "long" / "fp32"}
    out["fp32_long"].parent.mkdir()
    builder_runs(*(["-i", str(src), "-o", str(out[name]), "-p", "fp32", "-e", "cpu",
                    "-c", str(out[name].parent / f"{out[name].name}-cache")]
                   for name, src in (("fp32", llm), ("fp32_long", hf))), cwd=base)
    return out


@pytest.fixture(scope="session")
def fp32(builds: dict[str, Path]) -> Path:
    return builds["fp32"]


@pytest.fixture(scope="session")
def fp32_long(builds: dict[str, Path]) -> Path:
    return builds["fp32_long"]


def _judge(folder: Path, budget: GenerationBudget, child: memory.Opener | None = None) -> Any:
    return gen.judge(lambda: gen.open_folder(str(folder)), gen.read_config(folder), budget, child=child,
                     name="cpu/llm", where="[targets.cpu.generation]")


def _opener(folder: Path) -> memory.Opener:
    return memory.Opener("ortbuild.gating.measure.generation", "open_folder", {"folder": str(folder)})


@generative
def test_a_generous_budget_passes_early_with_the_figures(fp32: Path) -> None:
    budget = GenerationBudget(ttft_p90_ms=60_000.0, tpot_p90_ms=60_000.0, min_tokens_per_second=0.1,
                                  max_memory_mb=100_000.0)
    verdict, section, lines = _judge(fp32, budget, _opener(fp32))
    assert verdict is Verdict.PASS and lines == []
    assert section["stopped_early"] and section["generations"] < planned_samples([0.9], 0.95, 0)
    assert {v["kind"]: v["verdict"] for v in section["verdicts"]} == {
        "ttft_p90_ms": "PASS", "tpot_p90_ms": "PASS", "min_tokens_per_second": "PASS"}
    ttft, tpot = section["ttft_ms"], section["tpot_ms"]
    assert 0 < ttft["min"] <= ttft["p50"] <= ttft["p90"] <= ttft["max"] and 0 < tpot["p50"] <= tpot["max"]
    assert section["tokens_per_second"]["decode_p50"] == pytest.approx(1e3 / tpot["p50"], rel=1e-3)
    assert section["step_ms"]["mean"] == pytest.approx(tpot["mean"], rel=1e-3)  # the same steps, pooled
    assert section["settings"]["prompt_tokens"] == 64 and section["settings"]["new_tokens"] == 32
    mem = section["memory"]
    assert mem["verdict"]["verdict"] == "PASS" and mem["context_length"] == 256 and mem["processes"] >= 8
    assert mem["opened_rss_mb"]["p50"] < mem["peak_rss_mb"]["p50"]
    assert mem["kv_cache_mb"]["p50"] == pytest.approx(2 * 4 * 2 * 256 * 32 * 4 / 2 ** 20)  # k+v, layers, heads...
    assert section["summary"].startswith("TTFT ") and "tok/s" in section["summary"] and "MB" in section["summary"]


@generative
def test_an_impossible_ttft_fails_at_the_first_look_naming_percentile_estimate_and_budget(fp32: Path) -> None:
    budget = GenerationBudget(ttft_p90_ms=0.001, tpot_p99_ms=60_000.0)
    verdict, section, lines = _judge(fp32, budget)
    assert verdict is Verdict.FAIL and section["generations"] == latency.FIRST_LOOK and section["stopped_early"]
    by = {v["kind"]: v for v in section["verdicts"]}
    v = by["ttft_p90_ms"]
    assert v["verdict"] == "FAIL" and v["exceeding"] == latency.FIRST_LOOK
    assert lines[0].startswith(f"generation: cpu/llm TTFT p90 {v['observed']:.3f} ms (at least {v['lower']:.3f} ms "
                               "with 95% confidence) > budget ttft_p90_ms = 0.001 ms (20 of 20 generations")
    assert "raise ttft_p90_ms in [targets.cpu.generation]" in lines[1]
    assert by["tpot_p99_ms"]["verdict"] == "INCONCLUSIVE"
    assert by["tpot_p99_ms"]["note"].startswith("not decided: the gate had already failed on ttft_p90_ms")


@generative
def test_an_impossible_rate_fails_in_tokens_per_second(fp32: Path) -> None:
    verdict, section, lines = _judge(fp32, GenerationBudget(min_tokens_per_second=1e9))
    assert verdict is Verdict.FAIL
    v = section["verdicts"][0]
    assert v["kind"] == "min_tokens_per_second" and v["budget_rate"] == 1e9 and v["observed_rate"] < 1e9
    assert f"decode {v['observed_rate']:.1f} tokens/s on the median generation" in lines[0]
    assert "< budget min_tokens_per_second = 1e+09 (20 of 20 generations slower" in lines[0]
    assert "lower min_tokens_per_second in [targets.cpu.generation]" in lines[1]


@generative
def test_too_few_generations_to_bound_a_p99_is_inconclusive_with_how_many_more(fp32: Path) -> None:
    verdict, section, lines = _judge(fp32, GenerationBudget(tpot_p99_ms=60_000.0, min_samples=20))
    assert verdict is Verdict.INCONCLUSIVE and lines == [] and section["generations"] == 20
    v = section["verdicts"][0]
    assert v["upper"] is None and v["more_samples"] > 0  # 20 samples cannot bound a p99 from above
    assert "more samples would decide" in section["note"]


@generative
def test_no_budget_no_measurement(fp32: Path) -> None:
    """Nothing budgeted: one warm-up generation, reported as such, no timed generations and no fresh processes."""
    verdict, section, lines = _judge(fp32, GenerationBudget(prompt_tokens=8, new_tokens=4), _opener(fp32))
    assert verdict == "-" and lines == [] and section["generations"] == 0 and "memory" not in section
    assert section["timed"].startswith("not timed: no ttft_*/tpot_*/min_tokens_per_second budget")
    assert section["summary"] == "not timed"
    # a memory budget alone: the processes, not the timed generations
    verdict, section, _ = _judge(fp32, GenerationBudget(max_memory_mb=1e6), _opener(fp32))
    assert verdict is Verdict.PASS and section["generations"] == 0 and section["memory"]["processes"] >= 8
    assert section["summary"].startswith("not timed, peak ")


@generative
def test_max_seconds_bounds_the_whole_gate_and_says_what_would_decide(fp32: Path) -> None:
    """max_seconds caps the timed generations (half kept for a retry under load) and the memory processes; what
    cannot be decided in it is INCONCLUSIVE, saying how long would do."""
    one = gen.generate_once(gen.open_folder(str(fp32)), gen.prompt_ids(gen.read_config(fp32), 64), 32).seconds
    limit = 12 * one
    start = time.perf_counter()
    verdict, section, _ = _judge(fp32, GenerationBudget(tpot_p90_ms=60_000.0, max_seconds=limit))
    assert time.perf_counter() - start < limit + 20 * one + 2.0   # the open and warm-up beside it
    assert verdict is Verdict.INCONCLUSIVE and section["generations"] <= 6
    assert f"max_seconds = {limit:g} fits" in section["note"] and "needs at least 29" in section["note"]
    assert "raise max_seconds to about" in section["note"]
    verdict, section, lines = _judge(fp32, GenerationBudget(max_memory_mb=1e6, max_seconds=0.001), _opener(fp32))
    assert verdict is Verdict.INCONCLUSIVE and lines == []
    note = section["memory"]["verdict"]["note"]
    assert note.startswith("max_memory_mb not measured: 8 fresh processes at context 256")
    assert "max_seconds = 0.001" in note
    assert "state a shorter targets.cpu.generation.context_length" in note


@generative
def test_the_generation_does_not_stop_at_eos(fp32: Path, tmp_path: Path) -> None:
    """A copy whose EOS is the token the model generates first: plain genai stops there; generate_once does not."""
    og = gen.og()
    prompt = gen.prompt_ids(gen.read_config(fp32), 16)
    model = og.Model(str(fp32))
    params = og.GeneratorParams(model)
    params.set_search_options(max_length=48)
    g = og.Generator(model, params)
    g.append_tokens(prompt)
    g.generate_next_token()
    first = int(g.get_next_tokens()[0])
    copy = shutil.copytree(fp32, tmp_path / "eos")
    cfg = json.loads((copy / "genai_config.json").read_text())
    cfg["model"]["eos_token_id"] = first
    (copy / "genai_config.json").write_text(json.dumps(cfg))
    model = og.Model(str(copy))
    params = og.GeneratorParams(model)
    params.set_search_options(max_length=48)
    g = og.Generator(model, params)
    g.append_tokens(prompt)
    g.generate_next_token()
    assert g.is_done()  # genai ends at EOS without min_length
    t = gen.generate_once(model, prompt, 32)
    assert len(t.steps_ms) == 31 and t.ttft_ms > 0


@generative
def test_peak_memory_grows_with_the_context_by_at_least_the_kv_cache(fp32_long: Path) -> None:
    config = gen.read_config(fp32_long)
    assert config.context_length == 2048 and config.share_buffer
    got = {}
    for ctx in (2048, 64):
        out = memory.measure(_opener(fp32_long), gen.prompt_ids(config, ctx - 16), 16, config.present_key,
                             config.layers, None, 0.95)
        assert out.error == "" and len(out.samples) == 1 and out.samples[0].tokens == ctx
        got[ctx] = out.samples[0]
    long, short = got[2048], got[64]
    assert long.kv_cache_bytes == 2 * 4 * 2 * 2048 * 32 * 4 and short.kv_cache_bytes == 2 * 4 * 2 * 64 * 32 * 4
    assert long.peak_rss_bytes and short.peak_rss_bytes and long.opened_rss_bytes
    assert long.peak_rss_bytes - short.peak_rss_bytes >= long.kv_cache_bytes - short.kv_cache_bytes
    assert long.opened_rss_bytes < long.peak_rss_bytes


LOADER = '''
import base64, os, sys
import onnxruntime_genai as og

class Model:
    def __init__(self, model):
        self.model = model

def load(key, folder):
    assert base64.b64decode(key) == b"the-secret", "wrong key"
    assert not any("the-secret" in a or key in a for a in sys.argv), "the key is in argv"
    assert not any(key in v for v in os.environ.values()), "the key is in the environment"
    return Model(og.Model(folder))

def broken(folder):
    raise RuntimeError("cannot open " + folder)
'''


@generative
def test_memory_over_budget_fails_opened_through_a_loader_file_with_the_key_on_stdin(fp32: Path,
                                                                                     tmp_path: Path) -> None:
    loader = tmp_path / "loader_like.py"
    loader.write_text(LOADER)
    opener = memory.Opener(str(loader), "load", {"folder": str(fp32)}, b"the-secret", "model")
    verdict, section, lines = _judge(fp32, GenerationBudget(max_memory_mb=1.0), opener)
    mem = section["memory"]
    assert verdict is Verdict.FAIL and mem["verdict"]["verdict"] == "FAIL" and mem["processes"] >= 8
    assert lines[0].startswith(f"generation memory: cpu/llm peak RSS median {mem['verdict']['observed']:.1f} MB")
    assert "at context 256 (224 prompt + 32 new tokens) > budget max_memory_mb = 1 MB" in lines[0]
    assert "KV cache 0.5 MB" in lines[0]


@generative
def test_a_child_that_cannot_open_the_model_fails_saying_why(fp32: Path, tmp_path: Path) -> None:
    loader = tmp_path / "loader_like.py"
    loader.write_text(LOADER)
    opener = memory.Opener(str(loader), "broken", {"folder": "/nowhere"})
    verdict, section, lines = _judge(fp32, GenerationBudget(max_memory_mb=1e6), opener)
    assert verdict is Verdict.FAIL and "RuntimeError: cannot open /nowhere" in section["memory"]["error"]
    assert lines[0].startswith("generation memory: cpu/llm a fresh process failed to open the model")
