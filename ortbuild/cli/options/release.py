"""The flags and options of `release`, `verify`, `pull` and `matrix` (cli.release runs them)."""

from __future__ import annotations

import argparse
from dataclasses import dataclass
from typing import TYPE_CHECKING

from ortbuild.cli import options

if TYPE_CHECKING:
    from ortbuild.cli.options import Subparsers


def min_epoch(text: str) -> int:
    """--min-epoch: a non-negative integer (argparse: exit 2 otherwise)."""
    try:
        n = int(text)
    except ValueError:
        n = -1
    if n < 0:
        raise argparse.ArgumentTypeError(f"{text!r} is not an epoch (a non-negative integer)")
    return n


@dataclass(frozen=True)
class ReleaseOptions:
    config: str
    target: tuple[str, ...]      # () is every target
    to: str | None               # a directory or oci://...; None: dist/release
    oci_format: str
    dist: str | None
    force: bool                  # release where tests failed, were skipped or are stale
    signing_key_file: str | None
    allow_development_key: bool
    lock_timeout: float
    json: bool

    @classmethod
    def from_args(cls, ns: argparse.Namespace) -> ReleaseOptions:
        return cls(config=ns.config, target=options.names(ns.target), to=ns.to, oci_format=ns.oci_format, dist=ns.dist,
                   force=ns.force, signing_key_file=ns.signing_key_file,
                   allow_development_key=ns.allow_development_key, lock_timeout=ns.lock_timeout, json=ns.json)


def add_release(sub: Subparsers) -> None:
    rl = sub.add_parser("release", help="bundle, sign and publish each target whose tests passed (docs/release.md)")
    options.add_config(rl)
    rl.add_argument("-t", "--target", action="append", help="target name or glob (repeatable; default: all)")
    rl.add_argument("--to", help="a directory (default: dist/release; one subdirectory per target) or "
                                 "oci://host[:port]/repo[:tag] ({target} and {version} are filled in; the default "
                                 "tag is {version}-{target})")
    rl.add_argument("--oci-format", choices=("modelpack", "ortbuild"), default="modelpack",
                    help="with --to oci://...: push a CNCF ModelPack model artifact (default), or ortbuild's earlier "
                         "layout (docs/release.md); `ortbuild pull` reads both")
    options.add_dist(rl, "build output directory")
    rl.add_argument("--force", action="store_true",
                    help="release even where tests failed, were skipped or are stale (recorded in the provenance)")
    rl.add_argument("--signing-key-file", help="signing key (else $ORTBUILD_SIGNING_KEY / _FILE)")
    rl.add_argument("--allow-development-key", action="store_true",
                    help="release even when the signing key, or a key an artifact was built with, is a development "
                         "key (`keygen --dev`), with a WARNING: never ship such a release")
    rl.add_argument("--lock-timeout", type=options.seconds, default=600.0, help="seconds to wait for a running build")
    rl.add_argument("--json", action="store_true")


@dataclass(frozen=True)
class Checks:
    """What `verify` and `pull` check a release with: --public-key, --key-file, --no-run, --min-epoch, --json."""

    public_key: str | None
    key_file: str | None         # decrypts for the golden test
    no_run: bool                 # no golden test
    min_epoch: int
    json: bool

    @classmethod
    def from_args(cls, ns: argparse.Namespace) -> Checks:
        return cls(public_key=ns.public_key, key_file=ns.key_file, no_run=ns.no_run, min_epoch=ns.min_epoch,
                   json=ns.json)


def add_checks(sp: argparse.ArgumentParser) -> None:
    sp.add_argument("--public-key", help="the publisher's signing.pub (else $ORTBUILD_PUBLIC_KEY_FILE, else "
                                         "the configured signing key's public half)")
    sp.add_argument("--key-file", help="decryption key for the golden test (else $ORTBUILD_KEY / _FILE)")
    sp.add_argument("--no-run", action="store_true",
                    help="check signatures, digests and provenance only; do not run the golden test")
    sp.add_argument("--min-epoch", type=min_epoch, default=0, metavar="N",
                    help="refuse a release whose epoch (its artifacts' signed [project] epoch) is below N "
                         "(default: %(default)s)")
    sp.add_argument("--json", action="store_true")


@dataclass(frozen=True)
class VerifyOptions:
    bundle: str                  # a release directory, bundle or oci:// reference
    checks: Checks

    @classmethod
    def from_args(cls, ns: argparse.Namespace) -> VerifyOptions:
        return cls(bundle=ns.bundle, checks=Checks.from_args(ns))


def add_verify(sub: Subparsers) -> None:
    v = sub.add_parser("verify", help="verify a release directory, bundle or oci:// reference")
    v.add_argument("bundle", metavar="BUNDLE_OR_REF")
    add_checks(v)


@dataclass(frozen=True)
class PullOptions:
    ref: str
    to: str | None               # None: ./<bundle name>
    allow_downgrade: bool
    checks: Checks

    @classmethod
    def from_args(cls, ns: argparse.Namespace) -> PullOptions:
        return cls(ref=ns.ref, to=ns.to, allow_downgrade=ns.allow_downgrade, checks=Checks.from_args(ns))


def add_pull(sub: Subparsers) -> None:
    pu = sub.add_parser("pull", help="fetch a release from an OCI registry, verify it, extract the bundle")
    pu.add_argument("ref", metavar="REF", help="oci://host[:port]/repo:tag")
    pu.add_argument("--to", help="directory for the verified bundle (default: ./<bundle name>); a release pull put "
                                 "there before is replaced, never by an older one (a lower epoch)")
    pu.add_argument("--allow-downgrade", action="store_true",
                    help="replace the release in --to even with an older one (a lower epoch)")
    add_checks(pu)


@dataclass(frozen=True)
class MatrixOptions:
    config: str
    target: tuple[str, ...]      # () is every target
    cache: str | None            # the build cache every runner uses
    compact: bool                # one line

    @classmethod
    def from_args(cls, ns: argparse.Namespace) -> MatrixOptions:
        return cls(config=ns.config, target=options.names(ns.target), cache=ns.cache, compact=ns.compact)


def add_matrix(sub: Subparsers) -> None:
    mx = sub.add_parser("matrix", help="print a GitHub Actions matrix: one entry per target with its runner labels")
    options.add_config(mx)
    mx.add_argument("-t", "--target", action="append", help="target name or glob (repeatable; default: all)")
    mx.add_argument("--cache", metavar="oci://HOST/REPO|DIR",
                    help="the build cache every runner uses (each entry's `cache`; default: $ORTBUILD_CACHE, else "
                         "[project] cache, else none)")
    mx.add_argument("--compact", action="store_true", help="one line (for $GITHUB_OUTPUT)")
