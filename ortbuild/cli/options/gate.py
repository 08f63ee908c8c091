"""The flags and options of `ortbuild test` and `ortbuild profile` (cli.gate runs them). Both build what is
missing or stale first, with the build's searches and tuning: the budgets and writer flags act there too."""

from __future__ import annotations

import argparse
from dataclasses import dataclass
from typing import TYPE_CHECKING

from ortbuild.cli import options
from ortbuild.gating.reports import selection as gate_selection

if TYPE_CHECKING:
    from ortbuild.cli.options import Subparsers

REST = "signing key file, to build what is missing or stale"


@dataclass(frozen=True)
class TestOptions:
    __test__ = False             # not a pytest test class

    selection: options.Selection
    dist: str | None
    strict: bool                 # INCONCLUSIVE latency verdicts fail
    quick: bool
    gates: tuple[str, ...]       # the gates judged
    find_peak: bool
    repair: bool
    require: bool                # a target that cannot run here fails
    baseline: str | None         # a report.json to compare with
    explain: bool | None         # None: explain the failing; True: every one; False: none
    budgets: options.Budgets
    keys: options.Keys
    writer: options.Writer
    allow_epoch_decrease: bool
    debug: bool                  # the top-level --debug: a failed diagnosis raises

    @classmethod
    def from_args(cls, ns: argparse.Namespace) -> TestOptions:
        return cls(selection=options.Selection.from_args(ns), dist=ns.dist, strict=ns.strict, quick=ns.quick,
                   gates=tuple(ns.gates), find_peak=ns.find_peak, repair=ns.repair, require=ns.require,
                   baseline=ns.baseline, explain=ns.explain, budgets=options.Budgets.from_args(ns),
                   keys=options.Keys.from_args(ns), writer=options.Writer.from_args(ns),
                   allow_epoch_decrease=ns.allow_epoch_decrease, debug=ns.debug)


def add_test(sub: Subparsers) -> None:
    te = sub.add_parser("test", help="build what is missing or stale, then check golden outputs, latency and size")
    options.add_selection(te)
    options.add_dist(te)
    te.add_argument("--strict", action="store_true", help="INCONCLUSIVE latency verdicts fail too (exit 9)")
    te.add_argument("--quick", action="store_true",
                    help="quick latency and cold-start verdicts while iterating: 90%% confidence, shorter sampling, "
                         "no wait for the load to fall; `ortbuild release` refuses them (test again without it)")
    te.add_argument("--gates", type=options.gate_names, default=gate_selection.GATES, metavar="NAMES",
                    help=f"judge only these gates, a comma-separated list of: {gate_selection.CHOICES} (default: all); "
                         "the others are not measured (e.g. --gates accuracy while iterating on accuracy); "
                         "`ortbuild release` refuses a test that left a gate out")
    te.add_argument("--find-peak", action="store_true",
                    help="for targets with a [latency.server] budget: the highest QPS that meets it, by bisection "
                         "of server runs (docs/testing.md, Server)")
    te.add_argument("--repair", action="store_true",
                    help="rebuild TAMPERED artifacts (saying what was replaced) instead of failing")
    te.add_argument("--require", action="store_true",
                    help="a target that cannot run here fails (exit 4/5) instead of being skipped")
    te.add_argument("--baseline", metavar="REPORT_JSON",
                    help="compare each row with this report.json (e.g. the last release's) instead of the previous "
                         "run's (kept as dist/report.previous.json)")
    te.add_argument("--explain", action=argparse.BooleanOptionalAction, default=None,
                    help="precision bisection of fp16/int8/int4 artifacts: layer-wise error against fp32, then a "
                         "search (rebuilding and re-testing) for the nodes to keep in float that make a failing "
                         "accuracy gate pass, and the [[targets.X.overrides]] table to paste (docs/diagnose.md). "
                         "Default: for the artifacts whose accuracy gate failed; --explain: for every one; "
                         "--no-explain: never")
    options.add_builds(te, REST)


@dataclass(frozen=True)
class ProfileOptions:
    """profile prints a section per artifact and no summary table: no --no-summary."""

    selection: options.Selection
    dist: str | None
    runs: int                    # profiled runs after one warm-up
    top: int                     # operators shown per artifact
    keys: options.Keys
    budgets: options.Budgets
    writer: options.Writer
    allow_epoch_decrease: bool

    @classmethod
    def from_args(cls, ns: argparse.Namespace) -> ProfileOptions:
        return cls(selection=options.Selection.from_args(ns, summary=False), dist=ns.dist, runs=ns.runs,
                   top=ns.top, keys=options.Keys.from_args(ns), budgets=options.Budgets.from_args(ns),
                   writer=options.Writer.from_args(ns), allow_epoch_decrease=ns.allow_epoch_decrease)


def add_profile(sub: Subparsers) -> None:
    pr = sub.add_parser("profile", help="build what is missing or stale, then profile each artifact through its "
                                        "loader: a trace and the top operators (per provider, CPU fallback)")
    options.add_selection(pr, summary=False)
    options.add_dist(pr)
    pr.add_argument("--runs", type=int, default=20, help="profiled runs after one warm-up (default: %(default)s)")
    pr.add_argument("--top", type=int, default=10, help="operators shown per artifact (default: %(default)s)")
    options.add_builds(pr, REST)
