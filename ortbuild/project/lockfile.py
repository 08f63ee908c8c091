"""targets.lock: what the build found for a job, applied by later builds without searching again.

Three things write it: the precision search of a target with `precision_search = "auto"` (the sets kept in float),
session tuning (`ortbuild tune`, or `tune = true` on a target: the session options measured fastest) and the
choice among a target's `candidates` (the fastest artifact that passes: its precision and options). One
entry per (target, model), keyed by two digests: `source` (the model's files, its golden inputs, its expected
outputs where given and, for the precisions that read them, its calibration data) and `settings` (the job's
declared settings, as the build key holds them, and its accuracy rule). An entry whose digests no longer match is
out of date: the build says so and searches again, or `--locked` fails (for CI). `applies` is what the entry lays
over the declared settings, as one more `[[targets.X.overrides]]` table would (lists and tables given whole), so a
locked job is exactly a job with that override: targets.toml's own validation checks it. It may only hold the
lists the search keeps in float, the generative search's int4 knobs and tuning's four session settings (ALLOWED),
checked on read, and a precision with its options only where it is one of the job's candidates (CHOSEN, checked on
apply): the lock never loosens a gate and never names a file. An entry applies only to a job that asks
for a search or tuning, and only the part it asks for (Entry.only: ortbuild.project.lock_entry).

The file is TOML, sorted, one table per job, written atomically under a lock on its folder (builds of one
project add their entries one at a time); it is meant to be committed and reviewed."""

from __future__ import annotations

import contextlib
import dataclasses
import fcntl
import hashlib
import json
import math
import os
import tomllib
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ortbuild import files
from ortbuild.errors import ConfigError
from ortbuild.project import config
from ortbuild.project.declare import keys_of, plain
from ortbuild.project.kinds import kind_rule
from ortbuild.project.lock_entry import LOCK_FILE, Entry, copied, toml_value
from ortbuild.project.plan import Job
from ortbuild.project.precisions import RULES
from ortbuild.project.sections import Fp16, Int4, Quantization, Session
from ortbuild.project.settings import Settings

VERSION = 1
HEADER = ("# targets.lock: what ortbuild found for these jobs (precision_search = \"auto\", ortbuild tune).\n"
          "# Written by ortbuild; commit it: builds apply it without searching again, and `--locked` fails where\n"
          "# an entry is out of date. An entry's `applies` is laid over targets.toml as an override would be;\n"
          "# delete an entry to drop it (the next build searches again where the target asks).\n")

# what an entry may lay over the declared settings: the lists the precision search keeps in float, and the
# session options tuning measures. Never a gate, a budget or the precision: the lock cannot loosen what is judged.
ALLOWED: dict[str, frozenset[str]] = {}
for _rule in RULES:
    if _rule.knob is not None:
        ALLOWED[_rule.knob.table] = ALLOWED.get(_rule.knob.table, frozenset()) | {
            k for k in (_rule.knob.nodes, _rule.knob.op_types) if k is not None}
# session tuning's four settings (gating/search/tune_search.py), by name: two options and two config entries
TUNED_CONFIG = frozenset({"session.intra_op.allow_spinning", "session.dynamic_block_base"})
ALLOWED["session"] = frozenset({"intra_op_num_threads", "execution_mode", "config"})
assert ALLOWED["session"] <= {k.name for k in keys_of(Session)}
# a generative model's search (gating/gensearch.py) also moves the model builder's int4 knobs
ALLOWED["int4"] = ALLOWED["int4"] | {"block_size", "accuracy_level", "symmetric"}
# what the choice among a target's `candidates` lays over: the precision (a string) and its options tables' keys,
# checked on apply against the candidates the target lists (`_check_choice`)
CHOSEN: dict[str, frozenset[str]] = {t: frozenset(k.name for k in keys_of(cls)) for t, cls in
                                     (("quantization", Quantization), ("int4", Int4), ("fp16", Fp16))}


def wanted(settings: Settings) -> list[str]:
    """The parts of an entry the job's settings ask for: "search" (precision_search = "auto" on a precision the
    search applies to), "tune" (tune = true) and "choice" (`candidates`: the fastest that passes)."""
    return [part for part, asks in (("search", settings.precision_search == "auto" and settings.rule.knob is not None),
                                    ("tune", settings.tune), ("choice", bool(settings.candidates))) if asks]


def declared(job: Job) -> Job:
    """The job as targets.toml declares it (no entry laid over): what an entry's digests are of."""
    return dataclasses.replace(job, settings=job.target.settings[job.model.name], locked=None)


def missing(job: Job, entry: Entry | None) -> list[str]:
    """The parts the job asks for that `entry` (an up-to-date one, or None) does not hold."""
    return [part for part in wanted(job.settings) if entry is None or not getattr(entry, part)]


def path_of(project: config.Project) -> Path:
    """targets.lock beside the project's targets.toml."""
    return project.file.parent / LOCK_FILE


def _sha(value: object) -> str:
    return "sha256:" + hashlib.sha256(json.dumps(value, sort_keys=True, default=str).encode()).hexdigest()


def source_digest(model_digests: Mapping[str, str], inputs: str | None, calibration: str | None,
                  expected: str | None) -> str:
    """The `source` digest: the model's files (ModelFiles.digests()), golden inputs, calibration data and the
    expected outputs the accuracy gate compares with where the model gives them."""
    return _sha({"model": dict(model_digests), "inputs": inputs, "calibration": calibration,
                 **({"expected": expected} if expected is not None else {})})


def settings_digest(job: Job) -> str:
    """The `settings` digest: the job's declared settings (the build key's part) and its accuracy rule."""
    gates = job.settings.gates
    accuracy = plain(gates.accuracy) if gates is not None else None
    tokens = {"tokens": plain(gates.tokens)} if gates is not None and kind_rule(gates.kind).token_gate else {}
    return _sha({"settings": job.settings.as_json(), "accuracy": accuracy, **tokens})


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
            out.append(f"applies = {toml_value(copied(e.applies))}\n")
            for part, values in (("search", e.search), ("tune", e.tune), ("choice", e.choice)):
                if values:
                    out.append(f"\n[jobs.{json.dumps(name)}.{part}]\n")
                    out += [f"{config.toml_key(k)} = {toml_value(v)}\n" for k, v in values.items()]
        files.atomic_write(self.file, "".join(out).encode(), root=self.file.parent, mode=0o644)


@contextlib.contextmanager
def _exclusive(folder: Path) -> Iterator[None]:
    """Hold an exclusive flock on the lock's folder (read-only is enough to take it): builds of one project,
    whatever their dist/, update targets.lock one at a time."""
    fd = os.open(folder, os.O_RDONLY)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)


def record(project: config.Project, entry: Entry) -> Lock:
    """Write `entry` into targets.lock: the file read again under an exclusive lock, the entry put in, written
    atomically (another build's entries, written meanwhile, are kept). OSError where the folder is read-only."""
    path = path_of(project)
    with _exclusive(path.parent):
        lock = read(project).with_entry(entry)
        lock.write()
    return lock


def record_and_say(project: config.Project, entry: Entry) -> tuple[Lock | None, str]:
    """record(), and what the command says of it. A folder that cannot be written is no error: the artifact stands,
    and the next build searches or tunes again (None, and the line that says so)."""
    try:
        lock = record(project, entry)
    except OSError as e:
        return None, f"NOT recorded: {path_of(project)} could not be written ({e.strerror}); make its folder writable"
    return lock, f"recorded in {LOCK_FILE}"


def read(project: config.Project) -> Lock:
    """targets.lock beside the project's targets.toml (none: an empty lock). A malformed file is a config error
    naming it and what to do."""
    path = path_of(project)
    if not path.exists():
        return Lock(path)
    try:
        return _read(path)
    except RecursionError:  # arrays or tables nested thousands deep: no lock ortbuild writes
        raise ConfigError(str(path), "", "nested too deeply to read", _FIX) from None


def _read(path: Path) -> Lock:
    try:
        doc = tomllib.loads(path.read_text(encoding="utf-8"))
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as e:
        raise ConfigError(str(path), "", f"not valid TOML: {e}",
                          "fix the line it names (ortbuild writes this file: a merge conflict?), or delete the file: "
                          "the next build searches again where a target asks") from None
    if doc.get("version") != VERSION:
        raise ConfigError(str(path), "version", f"version {doc.get('version')!r}, this ortbuild reads {VERSION}",
                          "written by another ortbuild: build with that one, or delete the file (the next build "
                          "searches again)")
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
        applies, search, tune, choice = (t.get(k, {}) for k in ("applies", "search", "tune", "choice"))
        if not isinstance(applies, dict):
            raise ConfigError(str(path), f"{key}.applies", "must be a table of tables, e.g. "
                              "{ quantization = { exclude_nodes = [...] } }", _FIX)
        for table, values in applies.items():
            if table == "precision" and isinstance(values, str):  # a candidate's: checked against them by apply()
                continue
            if (table not in ALLOWED and table not in CHOSEN) or not isinstance(values, dict):
                raise ConfigError(str(path), f"{key}.applies.{table}", f"{_only()}, each a table", _FIX)
        if not all(isinstance(x, dict) for x in (search, tune, choice)):
            raise ConfigError(str(path), key, "`search`, `tune` and `choice` must be tables", _FIX)
        unknown = set(t) - {"source", "settings", "applies", "search", "tune", "choice"}
        if unknown:
            raise ConfigError(str(path), key, f"unknown key(s) {', '.join(sorted(unknown))}", _FIX)
        for table, values in applies.items():
            if table == "precision":
                continue
            allowed = ALLOWED.get(table, frozenset()) | CHOSEN.get(table, frozenset())
            wrong = sorted(k for k in values if k not in allowed)
            config_ = values.get("config") if table == "session" else None
            if config_ is not None and (not isinstance(config_, dict) or set(config_) - TUNED_CONFIG):
                wrong.append("config" if not isinstance(config_, dict) else
                             ", ".join(f"config.{json.dumps(k)}" for k in sorted(set(config_) - TUNED_CONFIG)))
            if wrong:
                raise ConfigError(str(path), f"{key}.applies.{table}", f"{', '.join(wrong)}: {_only()}", _FIX)
        for part, values in (("search", search), ("tune", tune), ("choice", choice)):
            for k, v in values.items():
                if not _plain_value(v):
                    raise ConfigError(str(path), f"{key}.{part}.{k}", f"holds {type(v).__name__} {v!r}: only "
                                      "strings, finite numbers, booleans and lists of them", _FIX)
        entries[name] = Entry(name, t["source"], t["settings"], applies, search, tune, choice)
    return Lock(path, entries)


def _only() -> str:
    return ("a lock entry lays only what the searches and tuning find over the settings (the lists kept in float, "
            f"the generative search's int4 knobs and tuning's four session settings: {_allowed_text()}) and the "
            "candidate the build chose (`precision` and its options, one of the target's `candidates`), never a gate, "
            "a budget, another precision or another session option: write those in targets.toml")


def _allowed_text() -> str:
    return ", ".join(f"{t}.{k}" for t, keys in ALLOWED.items() for k in sorted(keys) if k != "config") \
        + ", " + ", ".join(f"session.config.\"{k}\"" for k in sorted(TUNED_CONFIG))


def _plain_value(v: object) -> bool:
    if isinstance(v, list):
        return all(_plain_value(x) for x in v)
    return isinstance(v, str | bool | int) or (isinstance(v, float) and math.isfinite(v))


_FIX = "delete the entry (or the file): the next build searches again where a target asks (precision_search, tune)"


def variant(applies: Mapping[str, Any]) -> dict[str, Any]:
    """What of `applies` (a lock entry's, or a candidate's table) chooses a candidate: `precision` and the keys of
    its options tables that the searches do not set (the lists they keep in float, the generative int4 knobs)."""
    out: dict[str, Any] = {"precision": applies["precision"]} if "precision" in applies else {}
    for table, keys in CHOSEN.items():
        values = applies.get(table)
        if isinstance(values, Mapping):
            picked = {k: v for k, v in values.items() if k in keys and k not in ALLOWED.get(table, frozenset())}
            if picked:
                out[table] = picked
    return out


def _check_choice(project: config.Project, job: Job, entry: Entry) -> None:
    """An entry that chooses a precision (or its options) chooses one of the job's `candidates`, or none."""
    chosen = variant(entry.applies)
    if not chosen:
        return
    listed = [variant(c) for c in job.settings.candidates]
    if chosen not in listed:
        what = ", ".join(f"{t} = {toml_value(v)}" for t, v in chosen.items())
        raise ConfigError(str(path_of(project)), f"jobs.{json.dumps(entry.job)}.applies",
                          f"chooses {what}, which is not one of the target's candidates "
                          f"({', '.join(toml_value(c) for c in listed) or 'it lists none'}): {_only()}", _FIX)


def apply(project: config.Project, pairs: Sequence[tuple[Job, Entry]]) -> list[Job]:
    """The jobs with their entries' settings laid over their own: targets.toml read again with each entry as one
    more `[[targets.X.overrides]]` table of the target (merged as data, nothing written), validated as
    targets.toml is. A config error names the lock's entry."""
    tables: dict[str, list[dict[str, object]]] = {}
    for job, entry in pairs:
        _check_choice(project, job, entry)
        if entry.applies:
            tables.setdefault(job.target.name, []).append({"models": [job.model.name], **copied(entry.applies)})
    if not tables:
        return [dataclasses.replace(job, locked=entry) for job, entry in pairs]
    try:
        locked = config.load_with_overrides(project.file, tables)
    except ConfigError as e:
        for job, entry in pairs:  # which entry: each alone
            if entry.applies:
                try:
                    config.load_with_overrides(project.file, {job.target.name: [
                        {"models": [job.model.name], **copied(entry.applies)}]})
                except ConfigError as one:
                    key = one.where.split("].", 1)[-1] if ".overrides[" in one.where else one.where
                    raise ConfigError(str(path_of(project)), f"jobs.{json.dumps(entry.job)}.applies",
                                      f"does not apply to {project.file.name}: [{key}] {one.detail}", _FIX) from None
        raise ConfigError(str(path_of(project)), "jobs", f"does not apply to {project.file.name}: {e.detail}",
                          _FIX) from None
    return [dataclasses.replace(job, settings=locked.targets[job.target.name].settings[job.model.name],
                                locked=entry) for job, entry in pairs]
