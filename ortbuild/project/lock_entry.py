"""One job's entry of targets.lock (`Entry`): its two digests, what it lays over the job's declared settings (as
TOML: `toml_value`), and how each part was found; and the file's name. A job holds the entry laid over its settings
(project.plan.Job.locked); reading, checking, applying and writing the file, which works on jobs: lockfile.py."""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from ortbuild.project import config

LOCK_FILE = "targets.lock"


@dataclass(frozen=True)
class Entry:
    """One job's entry: its digests, what it lays over the settings, and how each part was found."""

    job: str                                        # "target/model"
    source: str
    settings: str
    # table -> key -> value; and `precision` -> the name of the candidate chosen (a string, the one key not a table)
    applies: Mapping[str, Any] = field(default_factory=dict)
    search: Mapping[str, object] = field(default_factory=dict)  # the precision search: what it kept, rebuilds...
    tune: Mapping[str, object] = field(default_factory=dict)    # session tuning: the speed-up and its confidence
    choice: Mapping[str, object] = field(default_factory=dict)  # the candidates: which was chosen, ratios, CPU

    file_name = LOCK_FILE

    @property
    def target(self) -> str:
        return self.job.split("/", 1)[0]

    @property
    def model(self) -> str:
        return self.job.split("/", 1)[1]

    def stale(self, source: str, settings: str) -> str:
        """Why the entry no longer applies ("" when it does)."""
        changed = [what for what, mine, now in (("the model or its data", self.source, source),
                                                ("the settings", self.settings, settings)) if mine != now]
        return " and ".join(changed) + (" changed since it was written" if changed else "")

    def override_toml(self) -> str:
        """`applies` as the [[targets.X.overrides]] table that gives the job those settings."""
        lines = [f"[[targets.{config.toml_key(self.target)}.overrides]]", f"models = {json.dumps([self.model])}"]
        lines += [f"{config.toml_key(table)} = {toml_value(values)}" for table, values in self.applies.items()]
        return "\n".join(lines) + "\n"

    def merged(self, applies: Mapping[str, Any], *, search: Mapping[str, object] | None = None,
               tune: Mapping[str, object] | None = None, choice: Mapping[str, object] | None = None) -> Entry:
        """This entry with `applies`' tables laid over its own (key by key) and the given parts replaced."""
        tables = copied(self.applies)
        for t, values in applies.items():
            tables[t] = {**tables.get(t, {}), **values} if isinstance(values, Mapping) else values
        return dataclasses.replace(self, applies=tables, search=self.search if search is None else search,
                                   tune=self.tune if tune is None else tune,
                                   choice=self.choice if choice is None else choice)

    def only(self, parts: Sequence[str]) -> Entry:
        """This entry laying only what the parts the job asks for found ("search": the precision search's tables;
        "tune": the session options; "choice": the candidate chosen, its precision and options tables): an entry
        never changes a job that asks for none of them."""
        keep = {t: v for t, v in self.applies.items() if any(p in parts for p in part_of(t))}
        return dataclasses.replace(self, applies=keep, search=self.search if "search" in parts else {},
                                   tune=self.tune if "tune" in parts else {},
                                   choice=self.choice if "choice" in parts else {})

    def describe(self) -> str:
        """What the entry changes, in one line: `quantization.exclude_nodes = [...]; session.intra_op... = 1`."""
        parts: list[str] = []
        for table, values in self.applies.items():  # tables key by key; `precision`, a string, as it is
            if isinstance(values, Mapping):
                parts += [f"{table}.{k} = {toml_value(v)}" for k, v in values.items()]
            else:
                parts.append(f"{table} = {toml_value(values)}")
        return "; ".join(parts) or "nothing (the declared settings pass)"

    def as_record(self) -> dict[str, object]:
        """What the manifest records of it: its digests and what it lays over the settings (how each part was
        found stays in the lock, where later runs add to it)."""
        return {"file": LOCK_FILE, "source": self.source, "settings": self.settings, "applies": copied(self.applies)}


def part_of(table: str) -> tuple[str, ...]:
    """The parts of an entry that may lay `table` (an `applies` key) over a job's settings."""
    return ("tune",) if table == "session" else ("choice",) if table == "precision" else ("search", "choice")


def copied(applies: Mapping[str, Any]) -> dict[str, Any]:
    """A copy of an entry's `applies`: its tables as dicts, `precision` as it is."""
    return {t: dict(v) if isinstance(v, Mapping) else v for t, v in applies.items()}


def toml_value(v: object) -> str:
    """A TOML value (inline tables and arrays) for what the lock holds: strings, numbers, booleans, lists, tables."""
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, int | float):
        if v != v or v in (float("inf"), float("-inf")):
            raise ValueError(f"targets.lock cannot hold {v}")
        return repr(v)
    if isinstance(v, str):
        return json.dumps(v)
    if isinstance(v, list | tuple):
        return "[" + ", ".join(toml_value(x) for x in v) + "]"
    if isinstance(v, Mapping):
        return "{ " + ", ".join(f"{config.toml_key(str(k))} = {toml_value(x)}" for k, x in v.items()) + " }" \
            if v else "{}"
    raise TypeError(f"targets.lock cannot hold a {type(v).__name__}")
