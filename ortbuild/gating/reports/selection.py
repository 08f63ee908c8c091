"""`ortbuild test --gates NAMES`: the gates one run judges (docs/testing.md, "Judging some gates").

While iterating on accuracy, `--gates accuracy` judges that gate alone: the others are not measured, their
verdicts stay "-" (not run), and the result records which gates were judged (`judged`). `ortbuild release` needs
every gate: it refuses an artifact whose last test left one out (left_out), as it refuses a `--quick` one. An
INCONCLUSIVE verdict names the command that judges only its undecided gates again (rejudge). Stdlib and packaging
only."""

from __future__ import annotations

import difflib
import shlex
from collections.abc import Sequence

from ortbuild.gating.gates import registry
from ortbuild.gating.record import TestResult
from ortbuild.project.kinds import Kind
from ortbuild.project.settings import Gates
from ortbuild.status import Verdict

GATES = registry.NAMES  # the registry's gates, in its order (as parsed: --gates)
ALIASES = {"startup": ("cold_start", "memory"),                  # cold start and memory: one measurement
           "load": ("throughput", "server", "multi_stream"),      # the load scenarios
           "all": GATES}
CHOICES = ", ".join([*GATES, *ALIASES])


def parse(text: str) -> tuple[str, ...]:
    """The gates a comma-separated list names (`cold-start` is cold_start), in GATES' order; a ValueError
    naming what is not a gate."""
    names: set[str] = set()
    for part in text.split(","):
        word = part.strip().lower().replace("-", "_")
        if word in GATES:
            names.add(word)
        elif word in ALIASES:
            names.update(ALIASES[word])
        elif not word:
            raise ValueError(f"'{text}': a gate name is empty; give a comma-separated list of: {CHOICES}")
        else:
            close = difflib.get_close_matches(word, [*GATES, *ALIASES], n=1)
            hint = f" (did you mean '{close[0]}'?)" if close else ""
            raise ValueError(f"'{part.strip()}' is not a gate{hint}; the gates are: {CHOICES}")
    return tuple(g for g in GATES if g in names)


def flag(judged: Sequence[str]) -> str:
    """The option that judges `judged`: `--gates accuracy,size`."""
    return f"--gates {','.join(judged)}"


def left_out(judged: object, kind: Kind) -> list[str]:
    """The gates of its kind of model a test did not judge (`judged`: the record's; a result without it, from an
    older ortbuild, judged all)."""
    if not isinstance(judged, list):
        return []
    return [g.name for g in registry.GATES if g.name not in judged and kind in g.kinds]


def not_judged(judged: object, kind: Kind) -> str:
    """`not judged (--gates accuracy): size, latency, cold_start, memory`, or "" when every gate was."""
    left = left_out(judged, kind)
    if not left or not isinstance(judged, list):
        return ""
    return f"not judged ({flag([str(g) for g in judged])}): {', '.join(left)}"


def rejudge(target: str, model: str, gates: Sequence[str], config_arg: str = "targets.toml",
            session: str = "") -> str:
    """The command that judges only `gates` of one artifact again (an INCONCLUSIVE gate's, on a quieter machine),
    and its nox form; `session`: the target's nox test session (default test(<target>))."""
    cfg = "" if config_arg == "targets.toml" else f" -c {shlex.quote(config_arg)}"
    flag = f"--gates {','.join(gates)}"
    return (f"ortbuild test{cfg} -t {target} -m {model} {flag}   (or: nox -s \"{session or f'test({target})'}\" -- "
            f"-m {model} {flag})")


def undecided_reason(res: TestResult, notes: list[str], config_arg: str, session: str) -> str:
    """An INCONCLUSIVE result's reason: its gates' notes, then the command that judges only those gates again."""
    gates = [g.name for g in registry.GATES if res.verdict(g.name) == Verdict.INCONCLUSIVE]
    return "; ".join(notes) + f"; judge {', '.join(gates)} alone again: " + rejudge(
        res.target, res.model, gates, config_arg, session)


def undecided_refusal(r: TestResult, target: str, session: str) -> str:
    """Why an INCONCLUSIVE test is refused, and the commands that settle it: the undecided gates judged alone (to
    see whether a quieter machine decides them), then the artifact's full test, which release takes."""
    gates = [g.name for g in registry.GATES if r.verdict(g.name) == Verdict.INCONCLUSIVE] or ["all"]
    why = r.reason.partition("; judge ")[0] or "undecided"
    full = f"`ortbuild test -t {target} -m {r.model}` (or `python3 -m nox -s \"{session}\" -- -m {r.model}`)"
    return (f"its tests did not pass (INCONCLUSIVE: {why[:300]}): its {', '.join(gates)} gate(s) could not decide "
            f"(often a loaded machine); on a quiet machine, {rejudge(target, r.model, gates, session=session)} "
            f"judges only {'that gate' if len(gates) == 1 else 'those gates'}, then {full} gives the verdict "
            "release takes (one test of every gate)")


def unjudged(r: TestResult, gates: Gates | None) -> list[str]:
    """The gates declared now (a budget is set) whose verdict the test record lacks: set after the test (budgets
    never change the build key). A section with verdict "-" was measured, with no budget to judge."""
    if gates is None:
        return []
    return [g.name for g in registry.GATES if r.kind in g.kinds and g.declared(gates)
            and r.verdict(g.name) == "-" and g.name not in r.sections]
