"""The flags and options of `ortbuild build` and `ortbuild plan` (cli.build runs them)."""

from __future__ import annotations

import argparse
from dataclasses import dataclass
from typing import TYPE_CHECKING

from ortbuild.cli import options

if TYPE_CHECKING:
    from ortbuild.cli.options import Subparsers


@dataclass(frozen=True)
class BuildOptions:
    selection: options.Selection
    dist: str | None
    force: bool                  # rebuild even when the build key is unchanged
    repair: bool                 # rebuild TAMPERED artifacts
    strict: bool                 # portable-only builds and skipped targets fail
    keys: options.Keys
    budgets: options.Budgets
    writer: options.Writer
    allow_epoch_decrease: bool
    debug: bool                  # the top-level --debug: a failed job's traceback

    @classmethod
    def from_args(cls, ns: argparse.Namespace) -> BuildOptions:
        return cls(selection=options.Selection.from_args(ns), dist=ns.dist, force=ns.force, repair=ns.repair,
                   strict=ns.strict, keys=options.Keys.from_args(ns), budgets=options.Budgets.from_args(ns),
                   writer=options.Writer.from_args(ns), allow_epoch_decrease=ns.allow_epoch_decrease, debug=ns.debug)


def add_build(sub: Subparsers) -> None:
    b = sub.add_parser("build", help="build artifacts into dist/<target>/<model>/")
    options.add_selection(b)
    options.add_dist(b)
    b.add_argument("--force", action="store_true", help="rebuild even when the build key is unchanged")
    b.add_argument("--repair", action="store_true",
                   help="rebuild artifacts whose files differ from their signed manifest (TAMPERED), saying what "
                        "was replaced; without it a build refuses them")
    b.add_argument("--strict", action="store_true",
                   help="fail (exit 5/4) on portable-only builds and skipped targets instead of reporting them")
    options.add_builds(b, "signing key file (else $ORTBUILD_SIGNING_KEY, else $ORTBUILD_SIGNING_KEY_FILE)")


@dataclass(frozen=True)
class PlanOptions:
    """plan builds nothing and runs no step: no --no-summary, -v, budgets or writer flags."""

    selection: options.Selection
    dist: str | None
    keys: options.Keys                   # their ids are part of the build key

    @classmethod
    def from_args(cls, ns: argparse.Namespace) -> PlanOptions:
        return cls(selection=options.Selection.from_args(ns, summary=False, verbose=False), dist=ns.dist,
                   keys=options.Keys.from_args(ns))


def add_plan(sub: Subparsers) -> None:
    pl = sub.add_parser("plan", help="show what would be built, with which runtime, and why each job rebuilds")
    options.add_selection(pl, summary=False, verbose=False)
    options.add_dist(pl)
    options.add_keys(pl, "signing key file (its id is part of the build key)",
             key_help="encryption key file (its id is part of the build key)")
