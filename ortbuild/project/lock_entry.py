"""One job's entry of targets.lock (`Entry`): its two digests, what it lays over the job's declared settings (as
TOML: `toml_value`), and how each part was found; and the file's name. A job holds the entry laid over its settings
(project.plan.Job.locked); reading, checking, applying and writing the file, which works on jobs: lockfile.py."""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from ortbuild.project import config

LOCK_FILE = "targets.lock"


@dataclass(frozen=True)
class Entry:
    """One job's entry: its digests, what it lays over the settings, and how each part was found."""

    job: str                                        # "target/model"
    source: str
    settings: str
    applies: Mapping[str, Mapping[str, object]] = field(default_factory=dict)  # table -> key -> value
    search: Mapping[str, object] = field(default_factory=dict)  # the precision search: what it kept, rebuilds...
    tune: Mapping[str, object] = field(default_factory=dict)    # session tuning: the speed-up and its confidence

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
        lines += [f"{config.toml_key(table)} = {toml_value(dict(values))}" for table, values in self.applies.items()]
        return "\n".join(lines) + "\n"

    def merged(self, applies: Mapping[str, Mapping[str, object]], *, search: Mapping[str, object] | None = None,
               tune: Mapping[str, object] | None = None) -> Entry:
        """This entry with `applies`' tables laid over its own (key by key) and the given parts replaced."""
        tables = {t: dict(v) for t, v in self.applies.items()}
        for t, values in applies.items():
            tables[t] = {**tables.get(t, {}), **values}
        return dataclasses.replace(self, applies=tables, search=self.search if search is None else search,
                                   tune=self.tune if tune is None else tune)

    def only(self, parts: Sequence[str]) -> Entry:
        """This entry laying only what the parts the job asks for found ("search": the precision search's tables;
        "tune": the session options): an entry never changes a job that asks for neither."""
        keep = {t: v for t, v in self.applies.items() if ("tune" if t == "session" else "search") in parts}
        return dataclasses.replace(self, applies=keep, search=self.search if "search" in parts else {},
                                   tune=self.tune if "tune" in parts else {})

    def describe(self) -> str:
        """What the entry changes, in one line: `quantization.exclude_nodes = [...]; session.intra_op... = 1`."""
        parts = [f"{table}.{k} = {toml_value(v)}" for table, values in self.applies.items() for k, v in values.items()]
        return "; ".join(parts) or "nothing (the declared settings pass)"

    def as_record(self) -> dict[str, object]:
        """What the manifest records of it: its digests and what it lays over the settings (how each part was
        found stays in the lock, where later runs add to it)."""
        return {"file": LOCK_FILE, "source": self.source, "settings": self.settings,
                "applies": {t: dict(v) for t, v in self.applies.items()}}


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
