"""The kinds of model a project builds: an ONNX graph, or a generative (decoder language) model's Hugging
Face-format directory built by onnxruntime-genai's model builder.

Each kind is a rule object that carries everything ortbuild does differently for it (what its `path` is, what
its targets' virtualenvs hold, its nox sessions and tag, what its build key holds, which model keys it takes,
what `ortbuild tune` / `ortbuild profile` and the JavaScript loaders do with it, its golden data); code is handed
the rule (`kind_rule(model.kind)`), never a name or a flag to test. Where the differing thing lives in a higher
layer (a pipeline's steps, loader templates), that layer keeps a table keyed by `Kind`.
Stdlib-only: the noxfile imports it (through ortbuild.project.config) before any venv exists.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Literal, get_args

from ortbuild.project import generation

Kind = Literal["onnx", "generative"]


@dataclass(frozen=True, kw_only=True)
class KindRule:
    """What a kind of model is: its source, its environment and sessions, how it is built, judged and loaded."""

    name: Kind
    directory: bool                  # `path` is a Hugging Face-format directory (else an ONNX model file)
    made_on_first_use: bool          # its `path` may be missing at load: the project's generator makes it on first use
    wildcards: bool                  # a target's wildcard patterns select it (False: a target must name it)
    model_keys: tuple[str, ...]      # the [models.X] keys only this kind takes (another kind's model refuses them)
    requirements: tuple[str, ...]    # what its targets' virtualenvs hold besides the ONNX Runtime flavor
    venv: str                        # its targets of equal requirements share one nox venv, "<this>-<digest>"
    session_suffix: str              # its nox sessions: build<suffix>(T), test<suffix>(T), release<suffix>(T)
    tag: str | None                  # the nox tag of its targets and of its own sessions (None: no tag of its own)
    builder_in_key: bool             # the model builder's package versions enter the build key
    not_covered: str | None          # why `ortbuild tune` and `ortbuild profile` skip it (None: they cover it)
    js_refusal: str | None           # why the Node and browser loaders refuse it (None: they load it)
    golden_tokens: bool              # its golden data are greedy tokens (golden/tokens.json), not golden outputs
    token_gate: bool                 # judged by the token gate ([targets.X.tokens], part of a lock entry's digest)
    records_expected: bool           # `ortbuild init` records (and --refresh-expected recomputes) expected outputs
    flag: bool                       # how JSON documents spell it: "generative": <flag> (test records, gate digests)
    path_hint: str                   # what a `path` that is not one of its sources should name
    data_hint: str                   # what its golden inputs, expected outputs and held-out data should be

    def session(self, command: str, target: str) -> str:
        """The nox session running `command` (build, test, release) for `target`, a target of this kind."""
        return f"{command}{self.session_suffix}({target})"


# why the JavaScript loaders refuse a generative model (their refused-loader template says it too)
JS_REFUSAL = ("a generative model (onnxruntime-genai's decoder with its KV cache and generation loop): "
              "onnxruntime-genai has no Node.js or browser package, and onnxruntime-node/-web run single "
              "graphs; open it with the Python loader")

# The one place that knows the kinds of model.
RULES: dict[Kind, KindRule] = {r.name: r for r in (
    KindRule(name="onnx", directory=False, made_on_first_use=False, wildcards=True,
             model_keys=("calibration", "eval", "custom_ops"),
             requirements=(), venv="runtime", session_suffix="", tag=None, builder_in_key=False, not_covered=None,
             js_refusal=None, golden_tokens=False, token_gate=False, records_expected=True, flag=False,
             path_hint="name an ONNX model file",
             data_hint="name an .npz file or a directory of test_data_set_N/ (docs/targets-reference.md)"),
    KindRule(name="generative", directory=True, made_on_first_use=True, wildcards=False, model_keys=("heldout",),
             requirements=generation.BUILDER_REQUIREMENTS, venv="generative", session_suffix="-generative",
             tag="generative", builder_in_key=True, not_covered=generation.NOT_PROFILED, js_refusal=JS_REFUSAL,
             golden_tokens=True, token_gate=True, records_expected=False, flag=True,
             path_hint="name an ONNX model file, or a Hugging Face-format directory of a generative model "
                       "(docs/generative.md)",
             data_hint="a UTF-8 text file (docs/generative.md): one golden prompt per line for `inputs`, "
                       "one expected continuation per line for `expected`, any text for `heldout`"),
)}
KINDS: tuple[Kind, ...] = get_args(Kind)
assert tuple(RULES) == KINDS, "Kind and RULES name the same kinds, in one order"


def kind_rule(kind: Kind | KindRule) -> KindRule:
    """The rule of a kind of model (a validated name: a loaded model, a manifest), or the rule itself."""
    return kind if isinstance(kind, KindRule) else RULES[kind]


def spelled(kind: Kind) -> tuple[str, object]:
    """How JSON documents write a kind (a derived field's `spelled`: gate digests): `"generative": <flag>`."""
    return "generative", kind_rule(kind).flag


def kind_of(path: Path) -> Kind:
    """The kind of model a `path` names: generative when it is a directory (a Hugging Face-format one), or, not
    made yet, has no file suffix (`models/tiny_llama`, made on first use); else an ONNX model file."""
    if path.suffix in (".onnx", ".ort"):
        return "onnx"
    try:
        return "generative" if path.is_dir() or (not path.exists() and path.suffix == "") else "onnx"
    except OSError:  # a name no file can have: its own check says why
        return "onnx"
