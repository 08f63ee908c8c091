"""targets.lock laid over the jobs a build runs: each up-to-date entry applied where its job asks for a search or
tuning (precision_search = "auto", tune = true), what to say of the others, and `--locked` (CI) refusing a job
whose entry lacks what it asks for. The Builder hands in its digests (`Builder.fingerprint`).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from ortbuild.errors import ConfigError
from ortbuild.project import lockfile, speedup
from ortbuild.project.config import Project
from ortbuild.project.plan import Job


def lay_over(project: Project, jobs: Sequence[Job], lock: lockfile.Lock,
             fingerprint: Callable[[Job], tuple[str, str]], *, locked: bool = False) -> tuple[list[Job], list[str]]:
    """The jobs with their targets.lock entries laid over their settings, where an entry is up to date, and
    what to say of the others. `locked` (--locked, for CI): a job that asks for a search or tuning
    (precision_search = "auto", tune = true) that its up-to-date entry does not hold is a config error (an
    out-of-date entry of a job that asks for neither is only said: it is not applied). `fingerprint`: a job's
    digests (source, settings)."""
    pairs, notes, problems = [], [], []
    for job in jobs:
        entry = lock.get(job)
        if entry is not None and not job.model.path.exists():  # e.g. a generative model made on first use
            why = f"its source {job.model.path} does not exist (yet)"
        else:
            why = entry.stale(*fingerprint(job)) if entry is not None else ""
        if why:
            wants = lockfile.wanted(job.settings)
            notes.append(f"{lock.file.name}: the entry of {job.name} is out of date ({why}): "
                         + (f"the build does its {' and '.join(wants)} again" if wants
                            else "it is not applied; delete it"))
            entry = None
        if entry is not None:  # an entry changes only what the job asks for, and nothing where it asks for neither
            wants = lockfile.wanted(job.settings)
            if not wants and entry.applies:
                notes.append(f"{lock.file.name}: the entry of {job.name} is not applied: its target asks for no "
                             "search or tuning (precision_search = \"auto\", tune = true); delete it")
            entry = entry.only(wants) if wants else None
            if entry is not None and entry.choice and entry.choice.get("cpu") not in (None, speedup.level()):
                notes.append(f"{lock.file.name}: the choice of {job.name} ({entry.choice.get('chosen')}) was measured "
                             f"on an {entry.choice.get('cpu')} CPU ({entry.choice.get('cpu_model', '?')}), this one is "
                             f"{speedup.host()}: delete the entry to measure the candidates here")
        lacking = lockfile.missing(job, entry)
        if lacking:
            asks = {"search": 'precision_search = "auto"', "tune": "tune = true", "choice": "candidates"}
            problems.append(f"{job.name} ({' and '.join(asks[p] for p in lacking)}): "
                            + (f"its entry is out of date ({why})" if why else "no entry" if entry is None
                               else f"its entry holds no {' and '.join(lacking)}"))
        pairs.append((job, entry))
    if locked and problems:
        raise ConfigError(str(lock.file), "", "--locked: " + "; ".join(problems),
                          f"run the build without --locked (it updates {lock.file.name}), review and commit "
                          f"{lock.file.name}")
    applied = dict(zip((j.name for j, e in pairs if e is not None),
                       lockfile.apply(project, [(j, e) for j, e in pairs if e is not None]), strict=True))
    return [applied.get(j.name, j) for j, _ in pairs], notes
