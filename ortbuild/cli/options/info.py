"""The flags and options of `targets`, `summary` and `schema` (cli.info runs them)."""

from __future__ import annotations

import argparse
from dataclasses import dataclass
from typing import TYPE_CHECKING

from ortbuild.cli import options
from ortbuild.project import config

if TYPE_CHECKING:
    from ortbuild.cli.options import Subparsers


@dataclass(frozen=True)
class TargetsOptions:
    config: str
    providers: bool              # only the execution providers
    json: bool

    @classmethod
    def from_args(cls, ns: argparse.Namespace) -> TargetsOptions:
        return cls(config=ns.config, providers=ns.providers, json=ns.json)


def add_targets(sub: Subparsers) -> None:
    t = sub.add_parser("targets", help="list targets, and the execution providers, and whether this environment "
                                       "can run them")
    t.add_argument("-c", "--config", default=config.DEFAULT_FILE)
    t.add_argument("--providers", action="store_true",
                   help="only the execution providers: ortbuild's support (docs/targets.md) and this environment's")
    t.add_argument("--json", action="store_true")


@dataclass(frozen=True)
class SummaryOptions:
    what: str                    # "build" or "test"
    config: str
    dist: str | None

    @classmethod
    def from_args(cls, ns: argparse.Namespace) -> SummaryOptions:
        return cls(what=ns.what, config=ns.config, dist=ns.dist)


def add_summary(sub: Subparsers) -> None:
    su = sub.add_parser("summary", help="one table of every target's last build or test results in dist/")
    su.add_argument("what", choices=("build", "test"))
    options.add_config(su)
    options.add_dist(su)


@dataclass(frozen=True)
class SchemaOptions:
    write: bool                  # regenerate the shipped schema and docs reference
    check: bool                  # fail if they are out of date

    @classmethod
    def from_args(cls, ns: argparse.Namespace) -> SchemaOptions:
        return cls(write=ns.write, check=ns.check)


def add_schema(sub: Subparsers) -> None:
    s = sub.add_parser("schema", help="print the JSON Schema of targets.toml")
    g = s.add_mutually_exclusive_group()
    g.add_argument("--write", action="store_true", help="regenerate the shipped schema and docs reference")
    g.add_argument("--check", action="store_true", help="fail if they are out of date")
