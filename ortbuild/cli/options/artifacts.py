"""The flags and options of `clean`, `inspect`, `keygen` and `rekey` (cli.artifacts runs them)."""

from __future__ import annotations

import argparse
from dataclasses import dataclass
from typing import TYPE_CHECKING

from ortbuild.cli import options

if TYPE_CHECKING:
    from ortbuild.cli.options import Subparsers

WAIT = "seconds to wait for a running build"


@dataclass(frozen=True)
class CleanOptions:
    config: str
    dist: str | None
    stale: bool                  # only what interrupted builds left
    lock_timeout: float

    @classmethod
    def from_args(cls, ns: argparse.Namespace) -> CleanOptions:
        return cls(config=ns.config, dist=ns.dist, stale=ns.stale, lock_timeout=ns.lock_timeout)


def add_clean(sub: Subparsers) -> None:
    cl = sub.add_parser("clean", help="remove dist/'s artifacts, or with --stale only what interrupted builds left")
    options.add_config(cl)
    options.add_dist(cl)
    cl.add_argument("--stale", action="store_true",
                    help="only partial files and the private temp dirs of dead builds (they hold plaintext)")
    cl.add_argument("--lock-timeout", type=options.seconds, default=600.0, help=WAIT)


@dataclass(frozen=True)
class InspectOptions:
    path: str
    json: bool
    strict: bool                 # exit 7 when the artifact does not fit this machine
    public_key: str | None

    @classmethod
    def from_args(cls, ns: argparse.Namespace) -> InspectOptions:
        return cls(path=ns.path, json=ns.json, strict=ns.strict, public_key=ns.public_key)


def add_inspect(sub: Subparsers) -> None:
    i = sub.add_parser("inspect", help="show a manifest or artifact; check integrity and fit")
    i.add_argument("path")
    i.add_argument("--json", action="store_true")
    i.add_argument("--strict", action="store_true", help="exit 7 when the artifact does not fit this machine")
    i.add_argument("--public-key", help="check the signature with this public key (signing.pub)")


@dataclass(frozen=True)
class KeygenOptions:
    out: str
    dev: bool
    model_signing_pub: bool      # only model-signing.pub, for the existing signing key
    signing_key_file: str | None
    json: bool

    @classmethod
    def from_args(cls, ns: argparse.Namespace) -> KeygenOptions:
        return cls(out=ns.out, dev=ns.dev, model_signing_pub=ns.model_signing_pub,
                   signing_key_file=ns.signing_key_file, json=ns.json)


def add_keygen(sub: Subparsers) -> None:
    k = sub.add_parser("keygen", help="make an encryption key and a signing key pair")
    k.add_argument("--out", default="keys", help="directory for encryption.key, signing.key, signing.pub, "
                                                 "model-signing.pub")
    k.add_argument("--dev", action="store_true", help="mark them as development keys (never for a release)")
    k.add_argument("--model-signing-pub", action="store_true",
                   help="write only model-signing.pub (the public key `model_signing verify key` checks a release's "
                        "model.sig with) for the existing signing key")
    k.add_argument("--signing-key-file", help="with --model-signing-pub: the signing key (else "
                                              "$ORTBUILD_SIGNING_KEY / _FILE)")
    k.add_argument("--json", action="store_true")


@dataclass(frozen=True)
class RekeyOptions:
    paths: tuple[str, ...]
    old_key_file: str | None
    new_key_file: str
    signing_key_file: str | None
    lock_timeout: float

    @classmethod
    def from_args(cls, ns: argparse.Namespace) -> RekeyOptions:
        return cls(paths=tuple(ns.paths), old_key_file=ns.old_key_file, new_key_file=ns.new_key_file,
                   signing_key_file=ns.signing_key_file, lock_timeout=ns.lock_timeout)


def add_rekey(sub: Subparsers) -> None:
    r = sub.add_parser("rekey", help="re-wrap artifacts' data keys under a new encryption key (no re-encryption)")
    r.add_argument("paths", nargs="+", help="dist/ directories or artifact directories")
    r.add_argument("--old-key-file", help="the current key (else $ORTBUILD_KEY / $ORTBUILD_KEY_FILE)")
    r.add_argument("--new-key-file", required=True, help="the new key")
    r.add_argument("--signing-key-file", help="signing key (the manifest is re-signed)")
    r.add_argument("--lock-timeout", type=options.seconds, default=600.0, help=WAIT)
