"""`ortbuild test --gates NAMES`: the gates one run judges (docs/testing.md, "Judging some gates").

While iterating on accuracy, `--gates accuracy` judges that gate alone: the others are not measured, their
verdicts stay "-" (not run), and the result records which gates were judged (`judged`). `ortbuild release` needs
every gate: it refuses an artifact whose last test left one out (left_out), as it refuses a `--quick` one.
Stdlib only."""

from __future__ import annotations

import difflib
from collections.abc import Mapping, Sequence

from ortbuild.gating import catalog

GATES = catalog.NAMES  # the registry's gates, in its order
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


def left_out(result: Mapping[str, object]) -> list[str]:
    """The gates a test result did not judge (a result without `judged`, from an older ortbuild, judged all)."""
    judged = result.get("judged")
    if not isinstance(judged, list):
        return []
    generative = bool(result.get("generative"))  # only the gates of its kind of model
    return [g for g in GATES if g not in judged and catalog.BY_NAME[g].judges(generative)]


def not_judged(result: Mapping[str, object]) -> str:
    """`not judged (--gates accuracy): size, latency, cold_start, memory`, or "" when every gate was."""
    left = left_out(result)
    judged = result.get("judged")
    if not left or not isinstance(judged, list):
        return ""
    return f"not judged ({flag([str(g) for g in judged])}): {', '.join(left)}"
