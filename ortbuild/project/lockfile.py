"""targets.lock: what the build found for a job, applied by later builds without searching again.

Two things write it: the precision search of a target with `precision_search = "auto"` (the sets kept in float)
and session tuning (`ortbuild tune`, or `tune = true` on a target: the session options measured fastest). One
entry per (target, model), keyed by two digests: `source` (the model's files, its golden inputs and, for the
precisions that read them, its calibration data) and `settings` (the job's declared settings, as the build key
holds them, and its accuracy rule). An entry whose digests no longer match is out of date: the build says so and
searches again, or `--locked` fails (for CI). `applies` is what the entry lays over the declared settings, as an
`[[targets.X.overrides]]` table would (lists and tables given whole), so a locked job is exactly a job with that
override: targets.toml's own validation checks it.

The file is TOML, sorted, one table per job, written atomically; it is meant to be committed and reviewed.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import tomllib
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from ortbuild import files
from ortbuild.errors import ConfigError
from ortbuild.project import config
from ortbuild.project.declare import plain
from ortbuild.project.plan import Job

LOCK_FILE = "targets.lock"
VERSION = 1
HEADER = ("# targets.lock: what ortbuild found for these jobs (precision_search = \"auto\", ortbuild tune).\n"
          "# Written by ortbuild; commit it: builds apply it without searching again, and `--locked` fails where\n"
          "# an entry is out of date. An entry's `applies` is laid over targets.toml as an override would be;\n"
          "# delete an entry to drop it (the next build searches again where the target asks).\n")

Value = str | int | float | bool | list[str] | dict[str, object]


def path_of(project: config.Project) -> Path:
    """targets.lock beside the project's targets.toml."""
    return project.file.parent / LOCK_FILE


def _sha(value: object) -> str:
    return "sha256:" + hashlib.sha256(json.dumps(value, sort_keys=True, default=str).encode()).hexdigest()


def source_digest(model_digests: Mapping[str, str], inputs: str | None, calibration: str | None) -> str:
    """The `source` digest: the model's files (ModelFiles.digests()), golden inputs and calibration data."""
    return _sha({"model": dict(model_digests), "inputs": inputs, "calibration": calibration})


def settings_digest(job: Job) -> str:
    """The `settings` digest: the job's declared settings (the build key's part) and its accuracy rule."""
    gates = job.settings.gates
    accuracy = plain(gates.accuracy) if gates is not None else None
    return _sha({"settings": job.settings.as_json(), "accuracy": accuracy})


@dataclass(frozen=True)
class Entry:
    """One job's entry: its digests, what it lays over the settings, and how each part was found."""

    job: str                                        # "target/model"
    source: str
    settings: str
    applies: Mapping[str, Mapping[str, object]] = field(default_factory=dict)  # table -> key -> value
    search: Mapping[str, object] = field(default_factory=dict)  # the precision search: what it kept, rebuilds...
    tune: Mapping[str, object] = field(default_factory=dict)    # session tuning: the speed-up and its confidence

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

    def describe(self) -> str:
        """What the entry changes, in one line: `quantization.exclude_nodes = [...]; session.intra_op... = 1`."""
        parts = [f"{table}.{k} = {toml_value(v)}" for table, values in self.applies.items() for k, v in values.items()]
        return "; ".join(parts) or "nothing (the declared settings pass)"

    def as_record(self) -> dict[str, object]:
        """What the manifest records of it."""
        return {"file": LOCK_FILE, "source": self.source, "settings": self.settings,
                "applies": {t: dict(v) for t, v in self.applies.items()}, "search": dict(self.search),
                "tune": dict(self.tune)}


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


@dataclass(frozen=True)
class Lock:
    """targets.lock as read (no file: no entries)."""

    file: Path
    entries: Mapping[str, Entry] = field(default_factory=dict)

    def get(self, job: Job) -> Entry | None:
        return self.entries.get(job.name)

    def with_entry(self, entry: Entry) -> Lock:
        return dataclasses.replace(self, entries={**self.entries, entry.job: entry})

    def write(self) -> None:
        """The whole file, sorted by job, atomically (a reader never sees half of it)."""
        out = [HEADER, f"version = {VERSION}\n"]
        for name in sorted(self.entries):
            e = self.entries[name]
            out.append(f"\n[jobs.{json.dumps(name)}]\n")
            out.append(f"source = {json.dumps(e.source)}\n")
            out.append(f"settings = {json.dumps(e.settings)}\n")
            out.append(f"applies = {toml_value({t: dict(v) for t, v in e.applies.items()})}\n")
            for part, values in (("search", e.search), ("tune", e.tune)):
                if values:
                    out.append(f"\n[jobs.{json.dumps(name)}.{part}]\n")
                    out += [f"{config.toml_key(k)} = {toml_value(v)}\n" for k, v in values.items()]
        files.atomic_write(self.file, "".join(out).encode(), root=self.file.parent, mode=0o644)


def read(project: config.Project) -> Lock:
    """targets.lock beside the project's targets.toml (none: an empty lock). A malformed file is a config error
    naming it and what to do."""
    path = path_of(project)
    if not path.exists():
        return Lock(path)
    try:
        doc = tomllib.loads(path.read_text(encoding="utf-8"))
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as e:
        raise ConfigError(str(path), "", f"not valid TOML: {e}", _FIX) from None
    if doc.get("version") != VERSION:
        raise ConfigError(str(path), "version", f"version {doc.get('version')!r}, this ortbuild reads {VERSION}",
                          _FIX)
    jobs = doc.get("jobs", {})
    if not isinstance(jobs, dict):
        raise ConfigError(str(path), "jobs", "must be a table of jobs, \"target/model\" = { ... }", _FIX)
    entries = {}
    for name, t in jobs.items():
        key = f"jobs.{json.dumps(name)}"
        if "/" not in name or not isinstance(t, dict):
            raise ConfigError(str(path), key, "an entry is a table named \"target/model\"", _FIX)
        if not all(isinstance(t.get(k), str) for k in ("source", "settings")):
            raise ConfigError(str(path), key, "needs `source` and `settings` digests (strings)", _FIX)
        applies, search, tune = t.get("applies", {}), t.get("search", {}), t.get("tune", {})
        if not isinstance(applies, dict) or not all(isinstance(v, dict) for v in applies.values()):
            raise ConfigError(str(path), f"{key}.applies", "must be a table of tables, e.g. "
                              "{ quantization = { exclude_nodes = [...] } }", _FIX)
        if not isinstance(search, dict) or not isinstance(tune, dict):
            raise ConfigError(str(path), key, "`search` and `tune` must be tables", _FIX)
        unknown = set(t) - {"source", "settings", "applies", "search", "tune"}
        if unknown:
            raise ConfigError(str(path), key, f"unknown key(s) {', '.join(sorted(unknown))}", _FIX)
        entries[name] = Entry(name, t["source"], t["settings"], applies, search, tune)
    return Lock(path, entries)


_FIX = "delete the entry (or the file): the next build searches again where a target asks (precision_search, tune)"


def apply(project: config.Project, job: Job, entry: Entry) -> Job:
    """The job with the entry's settings laid over its own: targets.toml with the entry as an override appended,
    validated as targets.toml is. A config error names the lock's entry."""
    if not entry.applies:
        return dataclasses.replace(job, locked=entry)
    try:
        settings = config.load_appended(project.file, entry.override_toml(), check_files=False) \
            .targets[job.target.name].settings[job.model.name]
    except ConfigError as e:
        raise ConfigError(str(path_of(project)), f"jobs.{json.dumps(entry.job)}.applies",
                          f"does not apply to {project.file.name}: [{e.where}] {e.detail}", _FIX) from None
    return dataclasses.replace(job, settings=settings, locked=entry)
