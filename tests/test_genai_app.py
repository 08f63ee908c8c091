"""The generated genai loader's API for apps (artifact/templates/loader_genai.py.j2, docs/generative.md "The Python
loader"), on real artifacts of the example model opened with the real onnxruntime-genai: sampling (seeded, and
greedy by default), bad arguments refused naming them, EOS never in the text, stop strings, chat messages through
the model's chat template, a session that keeps its KV cache between turns (the same tokens as a fresh generation
over the whole history, its new tokens fed only), batches (the same tokens as each prompt alone), and the docs'
example chat app run as written.

The example model (tests/genmodels.py) continues text and has no chat template: the project here gives its copy one
(CHAT_TEMPLATE, in tokenizer_config.json, as the docs say). Its fp32 build is what the API is checked on (its
batched greedy tokens equal the single ones); the int4 build is the one the docs' app opens.
Marked `generative`: run with a Python that has torch, transformers and onnxruntime-genai (nox -s tests-generative).
"""

from __future__ import annotations

import ast
import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from ortbuild.artifact import loaders
from tests.conftest import REPO, run_cli

pytestmark = pytest.mark.generative
og = pytest.importorskip("onnxruntime_genai")

MODEL = "tiny_llama"
# the messages' contents line by line: a reply continues the last message's line (docs/generative.md)
CHAT_TEMPLATE = ("{% for message in messages %}{{ message['content'] }}{% if not loop.last %}\n{% endif %}"
                 "{% endfor %}")
TARGETS = f"""
[project]
name = "chat"
version = "1"

[models.{MODEL}]
path = "models/{MODEL}"
inputs = "models/{MODEL}/prompts.txt"

[targets.fp32]
runtime = "onnxruntime==1.31.1"
providers = ["CPUExecutionProvider"]
models = ["{MODEL}"]

[targets.llm-cpu-int4]
extends = "fp32"
precision = "int4-weight"
int4 = {{ block_size = 16, accuracy_level = 0 }}
"""
PROMPT = "One command builds every"


@pytest.fixture(scope="module")
def root(llm: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The example model with a chat template, built for fp32 and int4 (the docs' target name)."""
    root = tmp_path_factory.mktemp("genapp")
    shutil.copytree(llm, root / "models" / MODEL)
    config = root / "models" / MODEL / "tokenizer_config.json"
    config.write_text(json.dumps({**json.loads(config.read_text()), "chat_template": CHAT_TEMPLATE}, indent=2))
    (root / "targets.toml").write_text(TARGETS)
    proc = run_cli("build", cwd=root)
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-4000:]
    return root


@pytest.fixture(scope="module")
def mod(root: Path) -> Any:
    return loaders.import_python_loader(loaders.python_path(root / "dist" / "fp32" / MODEL, MODEL))


@pytest.fixture(scope="module")
def model(mod: Any, root: Path) -> Any:
    return mod.load(folder=root / "dist" / "fp32" / MODEL)


def _prompts(root: Path) -> list[str]:
    return [p.strip() for p in (root / "models" / MODEL / "prompts.txt").read_text().splitlines() if p.strip()]


# ------------------------------------------------------------------------------------------------- sampling

def test_greedy_by_default_and_a_seeded_sample_is_reproducible(model: Any) -> None:
    ids = model.encode(PROMPT)
    greedy = model.generate_ids(ids, 24)
    assert model.generate_ids(ids, 24, seed=5) == greedy  # a seed alone: greedy still
    assert model.generate(PROMPT, 24) == model.decode(greedy)
    sampling = {"temperature": 0.9, "top_k": 40, "top_p": 0.95}
    first = model.generate_ids(ids, 24, **sampling, seed=11)
    assert model.generate_ids(ids, 24, **sampling, seed=11) == first  # the same seed, the same tokens
    others = [model.generate_ids(ids, 24, **sampling, seed=s) for s in (1, 2, 3, 4)]
    assert any(o != first for o in others) and any(o != greedy for o in [first, *others])
    assert model.generate(PROMPT, 24, **sampling, seed=11) == model.decode([t for t in first if t not in model.eos])
    assert "".join(model.stream(PROMPT, 24, **sampling, seed=11)) == model.generate(PROMPT, 24, **sampling, seed=11)


@pytest.mark.parametrize(("kwargs", "says"), [
    ({"temperature": 0}, "temperature=0: temperature must be a number above 0"),
    ({"temperature": float("nan")}, "temperature=nan: temperature must be a number above 0"),
    ({"temperature": "hot"}, "temperature='hot': temperature must be a number above 0"),
    ({"top_k": 0}, "top_k=0: top_k must be an integer of at least 1"),
    ({"top_k": 2.5}, "top_k=2.5: top_k must be an integer of at least 1"),
    ({"top_p": 0.0}, "top_p=0.0: top_p must be a number in (0, 1]"),
    ({"top_p": 1.5}, "top_p=1.5: top_p must be a number in (0, 1]"),
    ({"seed": -1}, "seed=-1: seed must be an integer from 0 to 2147483647"),
    ({"seed": 2**31}, "seed=2147483648: seed must be an integer from 0 to 2147483647"),
    ({"max_tokens": 0}, "max_tokens=0: max_tokens must be an integer of at least 1"),
    ({"max_tokens": True}, "max_tokens=True: max_tokens must be an integer of at least 1"),
    ({"stop": [""]}, "stop=['']: stop must be a non-empty string or a list of them"),
    ({"stop": 3}, "stop=3: stop must be a non-empty string or a list of them"),
])
def test_bad_arguments_are_feed_errors_naming_the_argument_and_its_range(mod: Any, model: Any,
                                                                         kwargs: dict[str, Any], says: str) -> None:
    calls = [lambda: model.generate(PROMPT, **kwargs), lambda: model.stream(PROMPT, **kwargs),
             lambda: model.generate_ids(model.encode(PROMPT), **kwargs),
             lambda: model.chat([{"role": "user", "content": PROMPT}], **kwargs),
             lambda: model.generate_batch([PROMPT, "It is"], **kwargs)]
    if "max_tokens" in kwargs:
        calls.append(lambda: model.session().send(PROMPT, **kwargs))
    else:
        calls.append(lambda: model.session(**kwargs))
    for call in calls:  # refused when called, before a token is generated (stream included)
        with pytest.raises(mod.FeedError) as err:
            call()
        assert err.value.code == "bad_feed" and str(err.value).startswith(f"fp32/{MODEL}: {says}"), err.value


def test_eos_ends_the_continuation_and_no_text_holds_it(model: Any) -> None:
    """The example model was trained without EOS: sampled hot over the whole vocabulary, some seed produces it."""
    ids = model.encode(PROMPT)
    hot = {"temperature": 2.0, "top_k": 2048}
    seed = next((s for s in range(3000) if model.generate_ids(ids, 40, **hot, seed=s)[-1] in model.eos), None)
    assert seed is not None, "no seed of 3000 made the example model end with EOS"
    tokens = model.generate_ids(ids, 40, **hot, seed=seed)
    assert list(model.stream_ids(ids, 40, **hot, seed=seed)) == tokens  # the ids keep it, and nothing follows it
    assert [t for t in tokens if t in model.eos] == tokens[-1:]
    text = model.generate(PROMPT, 40, **hot, seed=seed)
    assert text == model.decode(tokens[:-1]) and "</s>" not in text and "\ufffd" not in text
    assert "".join(model.stream(PROMPT, 40, **hot, seed=seed)) == text
    assert model.decode(tokens[-1:]) == "\ufffd"  # what onnxruntime-genai makes of EOS alone, left out of the text


def test_stop_strings_end_the_text_before_them(model: Any) -> None:
    full = model.generate(PROMPT, 48)
    ids = model.encode(PROMPT)
    assert "\n" in full, full
    line = full[:full.index("\n")]
    assert model.generate(PROMPT, 48, stop="\n") == line
    assert model.generate(PROMPT, 48, stop=["never in it", "\n"]) == line
    assert model.generate(PROMPT, 48, stop="never in it") == full
    word = line.split()[-1]  # a stop string inside the line: the text ends before its first occurrence
    assert model.generate(PROMPT, 48, stop=[word, "\n"]) == full[:full.index(word)]
    pieces = list(model.stream(PROMPT, 48, stop=[word]))
    assert "".join(pieces) == full[:full.index(word)] and all(word not in p for p in pieces)
    cut = model.generate_ids(ids, 48, stop="\n")  # ids end at the token that completes the stop string
    assert cut == model.generate_ids(ids, 48)[:len(cut)]
    assert "\n" in model.decode(cut) and "\n" not in model.decode(cut[:-1])


# --------------------------------------------------------------------------------------------------- chat

def test_chat_goes_through_the_models_chat_template(mod: Any, model: Any) -> None:
    assert model.chat_template == CHAT_TEMPLATE
    messages = [{"role": "user", "content": "The loaders check the same"},
                {"role": "assistant", "content": "files"}, {"role": "user", "content": PROMPT}]
    assert model.chat_prompt(messages) == "The loaders check the same\nfiles\n" + PROMPT
    assert model.chat(messages, 16) == model.generate(model.chat_prompt(messages), 16)
    assert model.chat(messages, 16, stop="\n", temperature=0.8, seed=2) == \
        model.generate(model.chat_prompt(messages), 16, stop="\n", temperature=0.8, seed=2)
    for bad, says in (("hello", "messages must be a non-empty list of dicts"), ([], "messages must be a non-empty"),
                      ([{"role": "user"}], "messages[0] must be a dict with a str 'role' and a str 'content'"),
                      ([{"role": "user", "content": "a"}, {"role": 1, "content": "b"}], "messages[1] must be")):
        with pytest.raises(mod.FeedError, match=re.escape(says)):
            model.chat(bad)


# ------------------------------------------------------------------------------------------------ sessions

def test_a_session_keeps_its_kv_cache_and_gives_a_fresh_generations_tokens(mod: Any, model: Any) -> None:
    talk = model.session()
    assert (talk.tokens_used, talk.remaining, talk.max_length, talk.ids) == (0, 256, 256, [])
    first = model.encode(PROMPT)
    reply = talk.send(PROMPT, 12)
    assert reply == model.generate(PROMPT, 12)
    assert talk.ids == first + model.generate_ids(first, 12) and talk.tokens_fed == len(first)
    for text in (" The loaders check the same", " It is never silent"):
        history, new = talk.ids, model.encode(text)
        fed = talk.tokens_fed
        reply = talk.send(text, 12)
        fresh = model.generate_ids(history + new, 12)  # greedy over the whole history, from nothing
        assert talk.ids == history + new + fresh and reply == model.decode(fresh)
        assert talk.tokens_fed - fed == len(new) + 1  # the new tokens and the last reply's last one, no history
        assert talk.tokens_used == len(talk.ids) and talk.remaining == 256 - len(talk.ids)
    history = talk.ids
    reply = talk.send([{"role": "user", "content": " What the result is"}], 24, stop="\n")  # messages: templated
    assert "\n" not in reply and talk.ids[:len(history)] == history
    long = " x" * 150
    with pytest.raises(mod.FeedError, match=r"no room in the session for this message: \d+ of its max_length 256 "
                                            rf"tokens used, and the message has {len(model.encode(long))} \(and its "
                                            r"reply needs at least 1\): start a new session\(\)"):
        talk.send(long)
    short = model.session(max_length=16)
    short.send(PROMPT, 100)  # the reply stops where the session is full
    assert short.tokens_used == 16 and short.remaining == 0
    with pytest.raises(mod.FeedError, match="no room in the session for this message: 16 of its max_length 16"):
        short.send(PROMPT)
    with pytest.raises(mod.FeedError, match=r"max_length=257: max_length must be an integer from 2 to 256"):
        model.session(max_length=257)


def test_a_sampled_session_with_a_seed_is_reproducible(model: Any) -> None:
    replies = []
    for _ in range(2):
        talk = model.session(temperature=0.8, top_p=0.9, seed=4, stop="\n")
        replies.append([talk.send(q, 24) for q in (PROMPT, " The loaders check the same")])
    assert replies[0] == replies[1] and all(replies[0]) and not any("\n" in r for r in replies[0])


# ------------------------------------------------------------------------------------------------- batches

def test_a_batch_gives_each_prompts_own_greedy_continuation(mod: Any, model: Any, root: Path) -> None:
    prompts = _prompts(root)
    assert len({len(model.encode(p)) for p in prompts}) > 1  # padded: prompts of different lengths
    assert model.generate_batch(prompts, 24) == [model.generate(p, 24) for p in prompts]
    assert model.generate_batch(prompts, 32, stop="\n") == [model.generate(p, 32, stop="\n") for p in prompts]
    assert model.generate_batch(prompts[:1], 8) == [model.generate(prompts[0], 8)]
    long = " x" * 150
    with pytest.raises(mod.FeedError, match=rf"prompts\[1\] has {len(model.encode(long))} tokens, and the model's "
                                            "context holds 256"):
        model.generate_batch([PROMPT, long], 8)
    with pytest.raises(mod.FeedError, match="prompts must be a non-empty list of strings"):
        model.generate_batch(PROMPT)


# ----------------------------------------------------------------------------------------- the docs' app

def test_the_docs_example_chat_app_runs_as_written(root: Path) -> None:
    blocks = re.findall(r"^```python\n(.*?)^```", (REPO / "docs" / "generative.md").read_text(), flags=re.S | re.M)
    (app,) = [b for b in blocks if b.startswith("# example chat app\n")]
    proc = subprocess.run([sys.executable, "-c", app], cwd=root, capture_output=True, text=True, timeout=300,
                          env={**os.environ, "PYTHONPATH": "", "PYTHONDONTWRITEBYTECODE": "1"})
    assert proc.returncode == 0, proc.stderr[-3000:]
    lines = proc.stdout.splitlines()
    assert len(lines) == 7, proc.stdout  # a reply, two questions with theirs, the count, the batch
    replies = [lines[0], lines[2], lines[4]]
    assert all(r.strip() for r in replies), proc.stdout
    assert lines[1] == "> One command builds every" and lines[3] == "> When a gate fails, ortbuild says"
    assert re.fullmatch(r"(\d+) tokens used, (\d+) left of 256", lines[5]), lines[5]
    used, left = map(int, re.findall(r"\d+", lines[5])[:2])
    assert used + left == 256 and 0 < used < 256
    batch = ast.literal_eval(lines[6])  # the printed list of strings
    assert isinstance(batch, list) and len(batch) == 2 and all(isinstance(t, str) and t for t in batch)
    assert "</s>" not in proc.stdout and "\ufffd" not in proc.stdout
    assert not any("\n" in t for t in batch)
