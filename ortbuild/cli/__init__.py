"""The `ortbuild` command line: build, test, profile, tune, plan, release, verify, pull, matrix, inspect, keys,
schema.

One module per family of commands (build and plan: cli.build; test and profile: cli.gate; tune: cli.tune; inspect,
keygen, rekey, clean: cli.artifacts; release, verify, pull, matrix: cli.release; targets, schema, summary: cli.info;
init: cli.init), each with its flags and typed options in cli.options (one frozen dataclass per command, built
from the parsed arguments in its `from_args`); this one assembles their parser and runs one with its options.
Each command reads the keys it needs once (keys.read_secrets) and passes them down, and returns its exit code,
reduced from its results' own codes by status.final_exit."""

from __future__ import annotations

import argparse
import contextlib
import os
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Generic, TypeVar

from ortbuild import __version__, errors, workspace
from ortbuild.cli.options import artifacts as artifacts_options
from ortbuild.cli.options import build as build_options
from ortbuild.cli.options import gate as gate_options
from ortbuild.cli.options import info as info_options
from ortbuild.cli.options import init as init_options
from ortbuild.cli.options import release as release_options
from ortbuild.cli.options import tune as tune_options
from ortbuild.errors import OrtbuildError

if TYPE_CHECKING:
    from ortbuild.cli.options import Subparsers

__all__ = ["COMMANDS", "main", "parser"]

Opts = TypeVar("Opts")


@dataclass(frozen=True)
class Command(Generic[Opts]):
    """A command: its parser (cli.options.<family>.add_<command>), its options, built from the parsed arguments
    (the one place a Namespace is read), and what runs with them."""

    add: Callable[[Subparsers], None]
    options: Callable[[argparse.Namespace], Opts]
    run: Callable[[Opts], int]

    def __call__(self, ns: argparse.Namespace) -> int:
        return self.run(self.options(ns))


# Each command's module is imported when that command runs (`ortbuild --version` or `plan` never imports the
# build pipeline, ONNX Runtime, numpy or the gates): one small function per command.
def _build(o: build_options.BuildOptions) -> int:
    from ortbuild.cli.build import cmd_build

    return cmd_build(o)


def _plan(o: build_options.PlanOptions) -> int:
    from ortbuild.cli.build import cmd_plan

    return cmd_plan(o)


def _test(o: gate_options.TestOptions) -> int:
    from ortbuild.cli.gate import cmd_test

    return cmd_test(o)


def _profile(o: gate_options.ProfileOptions) -> int:
    from ortbuild.cli.gate import cmd_profile

    return cmd_profile(o)


def _tune(o: tune_options.TuneOptions) -> int:
    from ortbuild.cli.tune import cmd_tune

    return cmd_tune(o)


def _clean(o: artifacts_options.CleanOptions) -> int:
    from ortbuild.cli.artifacts import cmd_clean

    return cmd_clean(o)


def _inspect(o: artifacts_options.InspectOptions) -> int:
    from ortbuild.cli.artifacts import cmd_inspect

    return cmd_inspect(o)


def _keygen(o: artifacts_options.KeygenOptions) -> int:
    from ortbuild.cli.artifacts import cmd_keygen

    return cmd_keygen(o)


def _rekey(o: artifacts_options.RekeyOptions) -> int:
    from ortbuild.cli.artifacts import cmd_rekey

    return cmd_rekey(o)


def _targets(o: info_options.TargetsOptions) -> int:
    from ortbuild.cli.info import cmd_targets

    return cmd_targets(o)


def _summary(o: info_options.SummaryOptions) -> int:
    from ortbuild.cli.info import cmd_summary

    return cmd_summary(o)


def _schema(o: info_options.SchemaOptions) -> int:
    from ortbuild.cli.info import cmd_schema

    return cmd_schema(o)


def _init(o: init_options.InitOptions) -> int:
    from ortbuild.cli.init import cmd_init

    return cmd_init(o)


def _release(o: release_options.ReleaseOptions) -> int:
    from ortbuild.cli.release import cmd_release

    return cmd_release(o)


def _verify(o: release_options.VerifyOptions) -> int:
    from ortbuild.cli.release import cmd_verify

    return cmd_verify(o)


def _pull(o: release_options.PullOptions) -> int:
    from ortbuild.cli.release import cmd_pull

    return cmd_pull(o)


def _matrix(o: release_options.MatrixOptions) -> int:
    from ortbuild.cli.release import cmd_matrix

    return cmd_matrix(o)


# in the order `ortbuild --help` lists them
COMMANDS: dict[str, Command[Any]] = {
    "build": Command(build_options.add_build, build_options.BuildOptions.from_args, _build),
    "test": Command(gate_options.add_test, gate_options.TestOptions.from_args, _test),
    "profile": Command(gate_options.add_profile, gate_options.ProfileOptions.from_args, _profile),
    "tune": Command(tune_options.add_tune, tune_options.TuneOptions.from_args, _tune),
    "plan": Command(build_options.add_plan, build_options.PlanOptions.from_args, _plan),
    "clean": Command(artifacts_options.add_clean, artifacts_options.CleanOptions.from_args, _clean),
    "targets": Command(info_options.add_targets, info_options.TargetsOptions.from_args, _targets),
    "inspect": Command(artifacts_options.add_inspect, artifacts_options.InspectOptions.from_args, _inspect),
    "keygen": Command(artifacts_options.add_keygen, artifacts_options.KeygenOptions.from_args, _keygen),
    "rekey": Command(artifacts_options.add_rekey, artifacts_options.RekeyOptions.from_args, _rekey),
    "release": Command(release_options.add_release, release_options.ReleaseOptions.from_args, _release),
    "verify": Command(release_options.add_verify, release_options.VerifyOptions.from_args, _verify),
    "pull": Command(release_options.add_pull, release_options.PullOptions.from_args, _pull),
    "matrix": Command(release_options.add_matrix, release_options.MatrixOptions.from_args, _matrix),
    "summary": Command(info_options.add_summary, info_options.SummaryOptions.from_args, _summary),
    "schema": Command(info_options.add_schema, info_options.SchemaOptions.from_args, _schema),
    "init": Command(init_options.add_init, init_options.InitOptions.from_args, _init),
}


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="ortbuild", description="Declarative multi-target ONNX Runtime builds.")
    p.add_argument("--version", action="version", version=f"ortbuild {__version__}")
    p.add_argument("--debug", action="store_true", help="show tracebacks")
    sub = p.add_subparsers(dest="command", required=True)
    for command in COMMANDS.values():
        command.add(sub)
    return p


def main(argv: Sequence[str] | None = None) -> int:
    # no core dump of this process or the processes it starts (workers, loaders, probes): it will hold keys and
    # decrypted weights. The hard limit too when this process is the ortbuild command (argv None); a caller
    # that runs main() in its own process keeps its hard limit, and may raise the soft one again
    workspace.no_core_dumps(hard=argv is None)
    # ONNX Runtime's telemetry event store stays untouched by every session of this process and its workers and
    # probes (unless the user set the variable); runtime.import_ort() also disables the events (API use)
    os.environ.setdefault("ORT_DISABLE_TELEMETRY", "1")
    args = parser().parse_args(argv)
    try:
        # the plaintext temp dirs of ortbuild processes that were killed go at once, whatever the command
        from ortbuild.cli.building import say_removed

        say_removed(workspace.remove_dead_private_dirs())
        code = COMMANDS[args.command](args)
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
