"""The `ortbuild` command line: build, test, profile, tune, plan, release, verify, pull, matrix, inspect, keys,
schema.

One module per family of commands (build and plan: cli.build; test and profile: cli.gate; tune: cli.tune; inspect,
keygen, rekey, clean: cli.artifacts; release, verify, pull, matrix: cli.release; targets, schema: cli.info); this one
assembles their parser and runs one. Each command reads the keys it needs once (keys.read_secrets) and passes
them down, and returns its exit code, reduced from its results' own codes by status.final_exit."""

from __future__ import annotations

import argparse
import contextlib
import math
import os
import sys
from collections.abc import Sequence

from ortbuild import __version__, errors, workspace
from ortbuild.artifact import keys
from ortbuild.cli import init
from ortbuild.cli.artifacts import cmd_clean, cmd_inspect, cmd_keygen, cmd_rekey
from ortbuild.cli.build import cmd_build, cmd_plan, say_removed
from ortbuild.cli.gate import cmd_profile, cmd_test
from ortbuild.cli.info import SCHEMA_FILE, cmd_schema, cmd_targets
from ortbuild.cli.release import cmd_matrix, cmd_pull, cmd_release, cmd_verify, min_epoch
from ortbuild.cli.tune import cmd_tune
from ortbuild.errors import OrtbuildError
from ortbuild.gating.reports import selection as gate_selection
from ortbuild.gating.reports import summary
from ortbuild.gating.search import tune_search
from ortbuild.project import config

__all__ = ["SCHEMA_FILE", "main", "parser"]


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


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="ortbuild", description="Declarative multi-target ONNX Runtime builds.")
    p.add_argument("--version", action="version", version=f"ortbuild {__version__}")
    p.add_argument("--debug", action="store_true", help="show tracebacks")
    sub = p.add_subparsers(dest="command", required=True)

    def writer(sp: argparse.ArgumentParser) -> None:
        sp.add_argument("-j", "--jobs", type=jobs_count, default=None,
                        help="jobs built at once, in worker processes (default: cores, as memory allows)")
        sp.add_argument("--lock-timeout", type=seconds, default=600.0,
                        help="seconds to wait for another ortbuild writing the same dist/ (default: %(default)s)")
        sp.add_argument("--locked", action="store_true",
                        help="targets.lock must be up to date: a job whose entry is missing or out of date while its "
                             "target asks for a search or tuning (precision_search = \"auto\", tune = true) fails "
                             "instead of searching (for CI; docs/build-to-the-gates.md)")
        sp.add_argument("--cache", metavar="oci://HOST/REPO|DIR",
                        help="shared build cache: pull a job's verified artifact by its build key instead of building "
                             "it, push what is built (else $ORTBUILD_CACHE, else [project] cache; docs/cache.md)")
        sp.add_argument("--no-cache", action="store_true", help="use no build cache, whatever is configured")

    def selection(sp: argparse.ArgumentParser) -> None:
        sp.add_argument("-c", "--config", default=config.DEFAULT_FILE, help="targets.toml (default: %(default)s)")
        sp.add_argument("-t", "--target", action="append", help="target name or glob (repeatable)")
        sp.add_argument("-m", "--model", action="append", help="model name or glob (repeatable)")
        sp.add_argument("--json", action="store_true", help="machine-readable output on stdout")
        sp.add_argument("--no-summary", action="store_true",
                        help="no table at the end (nox's sessions print one for every target: `ortbuild summary`)")
        sp.add_argument("-v", "--verbose", action="store_true",
                        help="every step as it starts, and what ONNX Runtime and the quantizers say (by default "
                             "kept in dist/logs/, one line per job on the terminal)")

    def search_budget(sp: argparse.ArgumentParser) -> None:
        sp.add_argument("--explain-rebuilds", type=int, default=16,
                        help="rebuilds per precision search (--explain, precision_search = \"auto\") "
                             "(default: %(default)s)")
        sp.add_argument("--explain-seconds", type=float, default=300.0,
                        help="seconds per precision search (default: %(default)s)")
        sp.add_argument("--tune-seconds", type=float, default=tune_search.DEFAULT_SECONDS,
                        help="seconds of session tuning per job whose target says tune = true (default: "
                             "%(default)s)")

    def epoch_decrease(sp: argparse.ArgumentParser) -> None:
        sp.add_argument("--allow-epoch-decrease", action="store_true",
                        help="build although [project] epoch is lower than the epoch of the artifacts already in "
                             "dist/ (a config error without it: older artifacts would load again)")

    b = sub.add_parser("build", help="build artifacts into dist/<target>/<model>/")
    selection(b)
    b.add_argument("--dist", help="output directory (default: dist/ beside targets.toml)")
    b.add_argument("--force", action="store_true", help="rebuild even when the build key is unchanged")
    b.add_argument("--repair", action="store_true",
                   help="rebuild artifacts whose files differ from their signed manifest (TAMPERED), saying what "
                        "was replaced; without it a build refuses them")
    b.add_argument("--strict", action="store_true",
                   help="fail (exit 5/4) on portable-only builds and skipped targets instead of reporting them")
    b.add_argument("--key-file", help="encryption key file (else $ORTBUILD_KEY, else $ORTBUILD_KEY_FILE)")
    b.add_argument("--signing-key-file",
                   help="signing key file (else $ORTBUILD_SIGNING_KEY, else $ORTBUILD_SIGNING_KEY_FILE)")
    search_budget(b)
    writer(b)
    epoch_decrease(b)
    b.set_defaults(func=cmd_build)

    te = sub.add_parser("test", help="build what is missing or stale, then check golden outputs, latency and size")
    selection(te)
    te.add_argument("--dist", help="output directory (default: dist/ beside targets.toml)")
    te.add_argument("--strict", action="store_true", help="INCONCLUSIVE latency verdicts fail too (exit 9)")
    te.add_argument("--quick", action="store_true",
                    help="quick latency and cold-start verdicts while iterating: 90%% confidence, shorter sampling, "
                         "no wait for the load to fall; `ortbuild release` refuses them (test again without it)")
    te.add_argument("--gates", type=gate_names, default=gate_selection.GATES, metavar="NAMES",
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
    search_budget(te)
    te.add_argument("--key-file", help="encryption key file (else $ORTBUILD_KEY, else $ORTBUILD_KEY_FILE)")
    te.add_argument("--signing-key-file", help="signing key file, to build what is missing or stale")
    writer(te)
    epoch_decrease(te)
    te.set_defaults(func=cmd_test)

    pr = sub.add_parser("profile", help="build what is missing or stale, then profile each artifact through its "
                                        "loader: a trace and the top operators (per provider, CPU fallback)")
    selection(pr)
    pr.add_argument("--dist", help="output directory (default: dist/ beside targets.toml)")
    pr.add_argument("--runs", type=int, default=20, help="profiled runs after one warm-up (default: %(default)s)")
    pr.add_argument("--top", type=int, default=10, help="operators shown per artifact (default: %(default)s)")
    pr.add_argument("--key-file", help="encryption key file (else $ORTBUILD_KEY, else $ORTBUILD_KEY_FILE)")
    pr.add_argument("--signing-key-file", help="signing key file, to build what is missing or stale")
    search_budget(pr)
    writer(pr)
    epoch_decrease(pr)
    pr.set_defaults(func=cmd_profile)

    tu = sub.add_parser("tune", help="build what is missing or stale, then measure session options (threads, "
                                     "spinning, dynamic block base, execution mode) through the loader, keep the "
                                     "fastest that passes every gate in targets.lock and rebuild with it")
    selection(tu)
    tu.add_argument("--dist", help="output directory (default: dist/ beside targets.toml)")
    tu.add_argument("--seconds", type=float, default=tune_search.DEFAULT_SECONDS,
                    help="time for each job's search, in seconds (default: %(default)s)")
    tu.add_argument("--key-file", help="encryption key file (else $ORTBUILD_KEY, else $ORTBUILD_KEY_FILE)")
    tu.add_argument("--signing-key-file", help="signing key file, to build what is missing or stale and rebuild "
                                               "what is tuned")
    search_budget(tu)
    tu.add_argument("-j", "--jobs", type=jobs_count, default=None,
                    help="jobs built at once, in worker processes (default: cores, as memory allows)")
    tu.add_argument("--lock-timeout", type=seconds, default=600.0,
                    help="seconds to wait for another ortbuild writing the same dist/ (default: %(default)s)")
    epoch_decrease(tu)
    tu.set_defaults(func=cmd_tune)

    pl = sub.add_parser("plan", help="show what would be built, with which runtime, and why each job rebuilds")
    selection(pl)
    pl.add_argument("--dist", help="output directory (default: dist/ beside targets.toml)")
    pl.add_argument("--key-file", help="encryption key file (its id is part of the build key)")
    pl.add_argument("--signing-key-file", help="signing key file (its id is part of the build key)")
    pl.set_defaults(func=cmd_plan)

    cl = sub.add_parser("clean", help="remove dist/'s artifacts, or with --stale only what interrupted builds left")
    cl.add_argument("-c", "--config", default=config.DEFAULT_FILE, help="targets.toml (default: %(default)s)")
    cl.add_argument("--dist", help="output directory (default: dist/ beside targets.toml)")
    cl.add_argument("--stale", action="store_true",
                    help="only partial files and the private temp dirs of dead builds (they hold plaintext)")
    cl.add_argument("--lock-timeout", type=seconds, default=600.0, help="seconds to wait for a running build")
    cl.set_defaults(func=cmd_clean)

    t = sub.add_parser("targets", help="list targets, and the execution providers, and whether this environment "
                                       "can run them")
    t.add_argument("-c", "--config", default=config.DEFAULT_FILE)
    t.add_argument("--providers", action="store_true",
                   help="only the execution providers: ortbuild's support (docs/targets.md) and this environment's")
    t.add_argument("--json", action="store_true")
    t.set_defaults(func=cmd_targets)

    i = sub.add_parser("inspect", help="show a manifest or artifact; check integrity and fit")
    i.add_argument("path")
    i.add_argument("--json", action="store_true")
    i.add_argument("--strict", action="store_true", help="exit 7 when the artifact does not fit this machine")
    i.add_argument("--public-key", help="check the signature with this public key (signing.pub)")
    i.set_defaults(func=cmd_inspect)

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
    k.set_defaults(func=cmd_keygen)

    r = sub.add_parser("rekey", help="re-wrap artifacts' data keys under a new encryption key (no re-encryption)")
    r.add_argument("paths", nargs="+", help="dist/ directories or artifact directories")
    r.add_argument("--old-key-file", help="the current key (else $ORTBUILD_KEY / $ORTBUILD_KEY_FILE)")
    r.add_argument("--new-key-file", required=True, help="the new key")
    r.add_argument("--signing-key-file", help="signing key (the manifest is re-signed)")
    r.add_argument("--lock-timeout", type=seconds, default=600.0, help="seconds to wait for a running build")
    r.set_defaults(func=cmd_rekey)

    rl = sub.add_parser("release", help="bundle, sign and publish each target whose tests passed (docs/release.md)")
    rl.add_argument("-c", "--config", default=config.DEFAULT_FILE, help="targets.toml (default: %(default)s)")
    rl.add_argument("-t", "--target", action="append", help="target name or glob (repeatable; default: all)")
    rl.add_argument("--to", help="a directory (default: dist/release; one subdirectory per target) or "
                                 "oci://host[:port]/repo[:tag] ({target} and {version} are filled in; the default "
                                 "tag is {version}-{target})")
    rl.add_argument("--oci-format", choices=("modelpack", "ortbuild"), default="modelpack",
                    help="with --to oci://...: push a CNCF ModelPack model artifact (default), or ortbuild's earlier "
                         "layout (docs/release.md); `ortbuild pull` reads both")
    rl.add_argument("--dist", help="build output directory (default: dist/ beside targets.toml)")
    rl.add_argument("--force", action="store_true",
                    help="release even where tests failed, were skipped or are stale (recorded in the provenance)")
    rl.add_argument("--signing-key-file", help="signing key (else $ORTBUILD_SIGNING_KEY / _FILE)")
    rl.add_argument("--allow-development-key", action="store_true",
                    help="release even when the signing key, or a key an artifact was built with, is a development "
                         "key (`keygen --dev`), with a WARNING: never ship such a release")
    rl.add_argument("--lock-timeout", type=seconds, default=600.0, help="seconds to wait for a running build")
    rl.add_argument("--json", action="store_true")
    rl.set_defaults(func=cmd_release)

    def checks(sp: argparse.ArgumentParser) -> None:
        sp.add_argument("--public-key", help="the publisher's signing.pub (else $ORTBUILD_PUBLIC_KEY_FILE, else "
                                             "the configured signing key's public half)")
        sp.add_argument("--key-file", help="decryption key for the golden test (else $ORTBUILD_KEY / _FILE)")
        sp.add_argument("--no-run", action="store_true",
                        help="check signatures, digests and provenance only; do not run the golden test")
        sp.add_argument("--min-epoch", type=min_epoch, default=0, metavar="N",
                        help="refuse a release whose epoch (its artifacts' signed [project] epoch) is below N "
                             "(default: %(default)s)")
        sp.add_argument("--json", action="store_true")

    v = sub.add_parser("verify", help="verify a release directory, bundle or oci:// reference")
    v.add_argument("bundle", metavar="BUNDLE_OR_REF")
    checks(v)
    v.set_defaults(func=cmd_verify)

    pu = sub.add_parser("pull", help="fetch a release from an OCI registry, verify it, extract the bundle")
    pu.add_argument("ref", metavar="REF", help="oci://host[:port]/repo:tag")
    pu.add_argument("--to", help="directory for the verified bundle (default: ./<bundle name>); a release pull put "
                                 "there before is replaced, never by an older one (a lower epoch)")
    pu.add_argument("--allow-downgrade", action="store_true",
                    help="replace the release in --to even with an older one (a lower epoch)")
    checks(pu)
    pu.set_defaults(func=cmd_pull)

    mx = sub.add_parser("matrix", help="print a GitHub Actions matrix: one entry per target with its runner labels")
    mx.add_argument("-c", "--config", default=config.DEFAULT_FILE, help="targets.toml (default: %(default)s)")
    mx.add_argument("-t", "--target", action="append", help="target name or glob (repeatable; default: all)")
    mx.add_argument("--cache", metavar="oci://HOST/REPO|DIR",
                    help="the build cache every runner uses (each entry's `cache`; default: $ORTBUILD_CACHE, else "
                         "[project] cache, else none)")
    mx.add_argument("--compact", action="store_true", help="one line (for $GITHUB_OUTPUT)")
    mx.set_defaults(func=cmd_matrix)

    su = sub.add_parser("summary", help="one table of every target's last build or test results in dist/")
    su.add_argument("what", choices=("build", "test"))
    su.add_argument("-c", "--config", default=config.DEFAULT_FILE, help="targets.toml (default: %(default)s)")
    su.add_argument("--dist", help="output directory (default: dist/ beside targets.toml)")
    su.set_defaults(func=lambda a: summary.print_summary(a.what, a.config, a.dist))

    s = sub.add_parser("schema", help="print the JSON Schema of targets.toml")
    g = s.add_mutually_exclusive_group()
    g.add_argument("--write", action="store_true", help="regenerate the shipped schema and docs reference")
    g.add_argument("--check", action="store_true", help="fail if they are out of date")
    s.set_defaults(func=cmd_schema)
    init.add_parser(sub)
    return p


def main(argv: Sequence[str] | None = None) -> int:
    # no core dump of this process or the processes it starts (workers, loaders, probes): it will hold keys and
    # decrypted weights. The hard limit too when this process is the ortbuild command (argv None); a caller
    # that runs main() in its own process keeps its hard limit, and may raise the soft one again
    keys.no_core_dumps(hard=argv is None)
    # ONNX Runtime's telemetry event store stays untouched by every session of this process and its workers and
    # probes (unless the user set the variable); runtime.import_ort() also disables the events (API use)
    os.environ.setdefault("ORT_DISABLE_TELEMETRY", "1")
    args = parser().parse_args(argv)
    try:
        # the plaintext temp dirs of ortbuild processes that were killed go at once, whatever the command
        say_removed(workspace.remove_dead_private_dirs())
        code: int = args.func(args)
        sys.stdout.flush()  # here, so that a reader that went away (`ortbuild matrix | head -1`) is seen below
        return code
    except BrokenPipeError:
        # the reader of stdout closed the pipe: what it did not read is nobody's, and nothing is wrong with ortbuild.
        # Point stdout at /dev/null so the interpreter's own flush at exit does not fail again; exit as a process
        # killed by SIGPIPE would (128 + 13), quietly, like other command-line tools in a pipeline
        with contextlib.suppress(OSError, ValueError):
            devnull = os.open(os.devnull, os.O_WRONLY)
            os.dup2(devnull, sys.stdout.fileno())
            os.close(devnull)
        return errors.BROKEN_PIPE
    except OrtbuildError as e:
        if args.debug:
            raise
        print(e.render(), file=sys.stderr)
        return e.exit_code
    except KeyboardInterrupt:
        print("ortbuild: interrupted", file=sys.stderr)
        return errors.INTERRUPTED
    except Exception as e:
        if args.debug:
            raise
        print(f"ortbuild: internal error: {type(e).__name__}: {e}\n  hint: rerun with --debug and report "
              "the traceback", file=sys.stderr)
        return OrtbuildError.exit_code  # an internal error
