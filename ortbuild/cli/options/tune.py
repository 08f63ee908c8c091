"""The flags and options of `ortbuild tune` (cli.tune runs it). Its search budget is --tune-seconds, the name
build, test and profile give the same budget; `--seconds`, its earlier name, stays as a hidden alias."""

from __future__ import annotations

import argparse
from dataclasses import dataclass
from typing import TYPE_CHECKING

from ortbuild.cli import options

if TYPE_CHECKING:
    from ortbuild.cli.options import Subparsers


@dataclass(frozen=True)
class TuneOptions:
    """tune prints a table per job and no summary: no --no-summary. It writes targets.lock itself (no --locked)
    and builds with the configured cache (no --cache, --no-cache)."""

    selection: options.Selection
    dist: str | None
    budgets: options.Budgets             # tuning: each job's search
    keys: options.Keys
    writer: options.Writer               # -j and --lock-timeout
    allow_epoch_decrease: bool

    @classmethod
    def from_args(cls, ns: argparse.Namespace) -> TuneOptions:
        return cls(selection=options.Selection.from_args(ns, summary=False), dist=ns.dist,
                   budgets=options.Budgets.from_args(ns), keys=options.Keys.from_args(ns),
                   writer=options.Writer(jobs=ns.jobs, lock_timeout=ns.lock_timeout),
                   allow_epoch_decrease=ns.allow_epoch_decrease)


def add_tune(sub: Subparsers) -> None:
    tu = sub.add_parser("tune", help="build what is missing or stale, then measure session options (threads, "
                                     "spinning, dynamic block base, execution mode) through the loader, keep the "
                                     "fastest that passes every gate in targets.lock and rebuild with it")
    options.add_selection(tu, summary=False)
    options.add_dist(tu)
    options.add_keys(tu, "signing key file, to build what is missing or stale and rebuild what is tuned")
    options.add_budget(tu, tune_help="time for each job's search, in seconds (default: %(default)s)")
    # the budget's earlier name on this command: scripts that say `ortbuild tune --seconds 30` keep working
    tu.add_argument("--seconds", dest="tune_seconds", type=float, default=argparse.SUPPRESS, help=argparse.SUPPRESS)
    options.add_jobs(tu)
    options.add_epoch_decrease(tu)
