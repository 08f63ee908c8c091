"""The commands' flags and their typed options: one frozen dataclass per command, built from argparse's Namespace
in one place (its `from_args`), and passed down to its `cmd_*` function, which reads no Namespace.

One light module per command family beside this one (build: build, plan; gate: test, profile; tune; artifacts:
clean, inspect, keygen, rekey; release: release, verify, pull, matrix; info: targets, schema, summary; init): each
adds its commands' subparsers (`add_<command>`) and holds their options. A flag exists only on the commands whose
code reads it (tests/test_cli_options.py checks that each one reaches its command's options). They import no
command's implementation (numpy, onnx, ONNX Runtime, the pipeline): parsing the command line costs little.

This module holds what several families share: the groups of flags (`Selection`, `Writer`, `Budgets`, `Keys`),
the argparse types that turn a bad value into a usage error (exit 2), and the protocol of the options of the
commands that build what is missing or stale (`Builds`: cli.build.built reads it)."""

from __future__ import annotations

import argparse
import math
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

from ortbuild.gating.reports import selection as gate_selection
from ortbuild.gating.search.base import TUNE_SECONDS, Budget
from ortbuild.project import config

if TYPE_CHECKING:  # what add_subparsers returns: each family's add_<command> adds to it
    Subparsers = argparse._SubParsersAction[argparse.ArgumentParser]


# ------------------------------------------------------------------------------------- argparse types

def jobs_count(text: str) -> int:
    """-j/--jobs: a whole number of jobs, at least 1 (argparse turns the error into a usage error, exit 2)."""
    try:
        n = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"'{text}' is not a whole number of jobs (e.g. -j 2)") from None
    if n < 1:
        raise argparse.ArgumentTypeError(f"{n}: at least 1 job (leave -j out for as many as the cores and "
                                         "memory allow)")
    return n


def seconds(text: str) -> float:
    """--lock-timeout: a finite number of seconds, 0 or more (0: give up at once if another ortbuild holds it)."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"'{text}' is not a number of seconds (e.g. 600)") from None
    if not math.isfinite(value) or value < 0:
        raise argparse.ArgumentTypeError(f"{text}: a finite number of seconds, 0 or more (0: do not wait)")
    return value


def gate_names(text: str) -> tuple[str, ...]:
    """--gates: a comma-separated list of gate names (argparse turns the error into a usage error, exit 2)."""
    try:
        return gate_selection.parse(text)
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e)) from None


def names(values: list[str] | None) -> tuple[str, ...]:
    """A repeatable flag's values (action="append"), in order; () when it was not given."""
    return tuple(values or ())


# ------------------------------------------------------------------------------------------ groups

@dataclass(frozen=True)
class Selection:
    """What a command runs on and how it reports: -c, -t, -m, --json, --no-summary, -v. A command without
    --no-summary or -v (plan: it prints no summary and runs no step) has them False."""

    config: str
    target: tuple[str, ...]     # -t: names or globs; () is every target
    model: tuple[str, ...]      # -m: names or globs; () is every model
    json: bool
    no_summary: bool = False
    verbose: bool = False

    @classmethod
    def from_args(cls, ns: argparse.Namespace, *, summary: bool = True, verbose: bool = True) -> Selection:
        """`summary`, `verbose`: whether the command has --no-summary and -v (as add_selection was told)."""
        return cls(config=ns.config, target=names(ns.target), model=names(ns.model), json=ns.json,
                   no_summary=ns.no_summary if summary else False, verbose=ns.verbose if verbose else False)


def add_selection(sp: argparse.ArgumentParser, *, summary: bool = True, verbose: bool = True) -> None:
    add_config(sp)
    sp.add_argument("-t", "--target", action="append", help="target name or glob (repeatable)")
    sp.add_argument("-m", "--model", action="append", help="model name or glob (repeatable)")
    sp.add_argument("--json", action="store_true", help="machine-readable output on stdout")
    if summary:
        sp.add_argument("--no-summary", action="store_true",
                        help="no table at the end (nox's sessions print one for every target: `ortbuild summary`)")
    if verbose:
        sp.add_argument("-v", "--verbose", action="store_true",
                        help="every step as it starts, and what ONNX Runtime and the quantizers say (by default "
                             "kept in dist/logs/, one line per job on the terminal)")


@dataclass(frozen=True)
class Writer:
    """How a command that writes dist/ builds: -j, --lock-timeout, --locked, --cache, --no-cache. `tune` has the
    first two only (it writes targets.lock itself, and uses the configured cache)."""

    jobs: int | None            # None: as many as the cores and memory allow
    lock_timeout: float
    locked: bool = False
    cache: str | None = None    # None: $ORTBUILD_CACHE, else [project] cache
    no_cache: bool = False

    @classmethod
    def from_args(cls, ns: argparse.Namespace) -> Writer:
        return cls(jobs=ns.jobs, lock_timeout=ns.lock_timeout, locked=ns.locked, cache=ns.cache,
                   no_cache=ns.no_cache)


def add_jobs(sp: argparse.ArgumentParser) -> None:
    sp.add_argument("-j", "--jobs", type=jobs_count, default=None,
                    help="jobs built at once, in worker processes (default: cores, as memory allows; models of "
                         "less than 16 MiB in all build one after the other, in this process)")
    sp.add_argument("--lock-timeout", type=seconds, default=600.0,
                    help="seconds to wait for another ortbuild writing the same dist/ (default: %(default)s)")


def add_writer(sp: argparse.ArgumentParser) -> None:
    add_jobs(sp)
    sp.add_argument("--locked", action="store_true",
                    help="targets.lock must be up to date: a job whose entry is missing or out of date while its "
                         "target asks for a search or tuning (precision_search = \"auto\", tune = true) fails "
                         "instead of searching (for CI; docs/build-to-the-gates.md)")
    sp.add_argument("--cache", metavar="oci://HOST/REPO|DIR",
                    help="shared build cache: pull a job's verified artifact by its build key instead of building "
                         "it, push what is built (else $ORTBUILD_CACHE, else [project] cache; docs/cache.md)")
    sp.add_argument("--no-cache", action="store_true", help="use no build cache, whatever is configured")


@dataclass(frozen=True)
class Budgets:
    """The searches' budgets, one search.base.Budget each: the precision search's (--explain-rebuilds,
    --explain-seconds: `test --explain` and precision_search = "auto", the generative search included) and
    session tuning's (--tune-seconds: `tune`, and tune = true)."""

    precision: Budget
    tuning: Budget

    @classmethod
    def from_args(cls, ns: argparse.Namespace) -> Budgets:
        return cls(precision=Budget(ns.explain_rebuilds, ns.explain_seconds), tuning=Budget(None, ns.tune_seconds))


TUNE_HELP = "seconds of session tuning per job whose target says tune = true (default: %(default)s)"


def add_budget(sp: argparse.ArgumentParser, tune_help: str = TUNE_HELP) -> None:
    sp.add_argument("--explain-rebuilds", type=int, default=16,
                    help="rebuilds per precision search (--explain, precision_search = \"auto\") "
                         "(default: %(default)s)")
    sp.add_argument("--explain-seconds", type=float, default=300.0,
                    help="seconds per precision search (default: %(default)s)")
    sp.add_argument("--tune-seconds", type=float, default=TUNE_SECONDS, help=tune_help)


@dataclass(frozen=True)
class Keys:
    """--key-file and --signing-key-file (None: the environment's, keys.read_secrets)."""

    key_file: str | None
    signing_key_file: str | None

    @classmethod
    def from_args(cls, ns: argparse.Namespace) -> Keys:
        return cls(key_file=ns.key_file, signing_key_file=ns.signing_key_file)


KEY_HELP = "encryption key file (else $ORTBUILD_KEY, else $ORTBUILD_KEY_FILE)"


def add_keys(sp: argparse.ArgumentParser, signing_help: str, key_help: str = KEY_HELP) -> None:
    sp.add_argument("--key-file", help=key_help)
    sp.add_argument("--signing-key-file", help=signing_help)


def add_dist(sp: argparse.ArgumentParser, what: str = "output directory") -> None:
    sp.add_argument("--dist", help=f"{what} (default: dist/ beside targets.toml)")


def add_config(sp: argparse.ArgumentParser) -> None:
    sp.add_argument("-c", "--config", default=config.DEFAULT_FILE, help="targets.toml (default: %(default)s)")


def add_builds(sp: argparse.ArgumentParser, signing_help: str) -> None:
    """The flags of a command that builds what is missing or stale first (build, test, profile): what `Builds`
    carries, keys, the searches' budgets, the writer's flags and the epoch override."""
    add_keys(sp, signing_help)
    add_budget(sp)
    add_writer(sp)
    add_epoch_decrease(sp)


def add_epoch_decrease(sp: argparse.ArgumentParser) -> None:
    sp.add_argument("--allow-epoch-decrease", action="store_true",
                    help="build although [project] epoch is lower than the epoch of the artifacts already in "
                         "dist/ (a config error without it: older artifacts would load again)")


class Builds(Protocol):
    """The options of a command that builds what is missing or stale first (build, test, profile, tune):
    what cli.build.built reads."""

    @property
    def selection(self) -> Selection: ...
    @property
    def dist(self) -> str | None: ...
    @property
    def budgets(self) -> Budgets: ...
    @property
    def writer(self) -> Writer: ...
    @property
    def allow_epoch_decrease(self) -> bool: ...
