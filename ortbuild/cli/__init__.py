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
from ortbuild.artifact import keys
from ortbuild.cli.artifacts import cmd_clean, cmd_inspect, cmd_keygen, cmd_rekey
from ortbuild.cli.build import cmd_build, cmd_plan
from ortbuild.cli.building import say_removed
from ortbuild.cli.gate import cmd_profile, cmd_test
from ortbuild.cli.info import cmd_schema, cmd_summary, cmd_targets
from ortbuild.cli.init import cmd_init
from ortbuild.cli.options import artifacts as artifacts_options
from ortbuild.cli.options import build as build_options
from ortbuild.cli.options import gate as gate_options
from ortbuild.cli.options import info as info_options
from ortbuild.cli.options import init as init_options
from ortbuild.cli.options import release as release_options
from ortbuild.cli.options import tune as tune_options
from ortbuild.cli.release import cmd_matrix, cmd_pull, cmd_release, cmd_verify
from ortbuild.cli.tune import cmd_tune
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


# in the order `ortbuild --help` lists them
COMMANDS: dict[str, Command[Any]] = {
    "build": Command(build_options.add_build, build_options.BuildOptions.from_args, cmd_build),
    "test": Command(gate_options.add_test, gate_options.TestOptions.from_args, cmd_test),
    "profile": Command(gate_options.add_profile, gate_options.ProfileOptions.from_args, cmd_profile),
    "tune": Command(tune_options.add_tune, tune_options.TuneOptions.from_args, cmd_tune),
    "plan": Command(build_options.add_plan, build_options.PlanOptions.from_args, cmd_plan),
    "clean": Command(artifacts_options.add_clean, artifacts_options.CleanOptions.from_args, cmd_clean),
    "targets": Command(info_options.add_targets, info_options.TargetsOptions.from_args, cmd_targets),
    "inspect": Command(artifacts_options.add_inspect, artifacts_options.InspectOptions.from_args, cmd_inspect),
    "keygen": Command(artifacts_options.add_keygen, artifacts_options.KeygenOptions.from_args, cmd_keygen),
    "rekey": Command(artifacts_options.add_rekey, artifacts_options.RekeyOptions.from_args, cmd_rekey),
    "release": Command(release_options.add_release, release_options.ReleaseOptions.from_args, cmd_release),
    "verify": Command(release_options.add_verify, release_options.VerifyOptions.from_args, cmd_verify),
    "pull": Command(release_options.add_pull, release_options.PullOptions.from_args, cmd_pull),
    "matrix": Command(release_options.add_matrix, release_options.MatrixOptions.from_args, cmd_matrix),
    "summary": Command(info_options.add_summary, info_options.SummaryOptions.from_args, cmd_summary),
    "schema": Command(info_options.add_schema, info_options.SchemaOptions.from_args, cmd_schema),
    "init": Command(init_options.add_init, init_options.InitOptions.from_args, cmd_init),
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
    keys.no_core_dumps(hard=argv is None)
    # ONNX Runtime's telemetry event store stays untouched by every session of this process and its workers and
    # probes (unless the user set the variable); runtime.import_ort() also disables the events (API use)
    os.environ.setdefault("ORT_DISABLE_TELEMETRY", "1")
    args = parser().parse_args(argv)
    try:
        # the plaintext temp dirs of ortbuild processes that were killed go at once, whatever the command
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
