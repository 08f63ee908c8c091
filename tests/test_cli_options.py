"""The command line's typed options: every flag of every command reaches its command's options dataclass (argv ->
argparse -> `from_args` -> the value), no command has a flag its options do not carry (a flag cannot exist without
acting), and the tuning budget has one name (`--tune-seconds`; `tune --seconds` is its hidden alias)."""

from __future__ import annotations

import argparse
import dataclasses
import re
from pathlib import Path
from typing import Any

import pytest

from ortbuild import cli
from ortbuild.cli.options import Budgets, Selection, Writer
from ortbuild.gating.search.base import Budget

CLI = Path(cli.__file__).parent

# what each command needs besides the flag under test (positionals, required flags)
BASE: dict[str, list[str]] = {"inspect": ["dist/cpu/m"], "rekey": ["dist", "--new-key-file", "new.key"],
                              "verify": ["release/cpu"], "pull": ["oci://host/repo:tag"], "summary": ["build"]}


def _subparsers(p: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    sub = next(a for a in p._actions if isinstance(a, argparse._SubParsersAction))
    return dict(sub.choices)


SUBPARSERS = _subparsers(cli.parser())


def _flags(command: str) -> list[argparse.Action]:
    """The command's own actions (options and positionals), --help aside."""
    return [a for a in SUBPARSERS[command]._actions if not isinstance(a, argparse._HelpAction)]


def _flat(options: Any) -> dict[str, Any]:
    """An options dataclass's fields by name, the fields of its groups (Selection, Writer, ...) laid in."""
    out: dict[str, Any] = {}
    for f in dataclasses.fields(options):
        value = getattr(options, f.name)
        if isinstance(value, Budgets):  # two search Budgets: the flags that give them, by dest
            out.update(explain_rebuilds=value.precision.rebuilds, explain_seconds=value.precision.seconds,
                       tune_seconds=value.tuning.seconds)
        elif dataclasses.is_dataclass(value):
            inner = _flat(value)
            assert not set(inner) & set(out), f"{type(options).__name__}: {f.name} repeats a field"
            out.update(inner)
        else:
            out[f.name] = value
    return out


def _options(argv: list[str]) -> tuple[argparse.Namespace, Any]:
    ns = cli.parser().parse_args(argv)
    return ns, cli.COMMANDS[ns.command].options(ns)


def _value(action: argparse.Action) -> tuple[list[str], Any]:
    """Words that give a flag a value other than its default, and that value as the options hold it."""
    flag = max(action.option_strings, key=len)
    if isinstance(action, argparse.BooleanOptionalAction):  # --explain (--no-explain: test_the_groups_...)
        return [action.option_strings[0]], True
    if action.nargs == 0:  # store_true
        return [flag], True
    if action.choices is not None:
        word = next(str(c) for c in action.choices if c != action.default)
        value: Any = word
    elif action.type is None:
        word = value = "cpu*"
    else:
        word = {"dim": "batch=2", "gate_names": "accuracy"}.get(getattr(action.type, "__name__", ""), "3")
        value = action.type(word)  # type: ignore[operator]
    return [flag, word], (value,) if isinstance(action, argparse._AppendAction) else value


FLAGS = [(command, a) for command in SUBPARSERS for a in _flags(command) if a.option_strings]


@pytest.mark.parametrize("command, action", FLAGS, ids=[f"{c} {'/'.join(a.option_strings)}" for c, a in FLAGS])
def test_every_flag_reaches_its_commands_options(command: str, action: argparse.Action) -> None:
    words, want = _value(action)
    _, options = _options([command, *BASE.get(command, []), *words])
    got = _flat(options)
    assert action.dest in got, f"{command} {words}: {type(options).__name__} has no field {action.dest}"
    assert got[action.dest] == want, f"{command} {words}: {action.dest} = {got[action.dest]!r}, not {want!r}"
    _, default = _options([command, *BASE.get(command, [])])
    if action.dest != "new_key_file":  # required: BASE gives it
        assert _flat(default)[action.dest] != want, f"{command} {words}: the flag changed nothing"


@pytest.mark.parametrize("argv, field, want", [
    (["inspect", "a/b"], "path", "a/b"), (["rekey", "d1", "d2", "--new-key-file", "k"], "paths", ("d1", "d2")),
    (["verify", "oci://h/r:t"], "bundle", "oci://h/r:t"), (["pull", "oci://h/r:t"], "ref", "oci://h/r:t"),
    (["summary", "test"], "what", "test"), (["init", "m1.onnx", "models"], "paths", ("m1.onnx", "models"))])
def test_every_positional_reaches_its_commands_options(argv: list[str], field: str, want: object) -> None:
    assert _flat(_options(argv)[1])[field] == want
    positionals = {(c, a.dest) for c in SUBPARSERS for a in _flags(c) if not a.option_strings}
    assert positionals == {("inspect", "path"), ("rekey", "paths"), ("verify", "bundle"), ("pull", "ref"),
                           ("summary", "what"), ("init", "paths")}


@pytest.mark.parametrize("command", list(SUBPARSERS))
def test_no_command_has_a_flag_its_options_do_not_carry(command: str) -> None:
    ns = cli.parser().parse_args([command, *BASE.get(command, [])])
    fields = set(_flat(cli.COMMANDS[command].options(ns)))
    dests = {a.dest for a in _flags(command)}
    assert dests <= fields, f"`ortbuild {command}` has flags no option carries: {sorted(dests - fields)}"
    assert set(vars(ns)) - {"command", "debug"} == dests  # nothing set on the Namespace beside the flags


def test_every_command_has_its_parser_options_and_implementation() -> None:
    assert list(SUBPARSERS) == list(cli.COMMANDS)
    for name, command in cli.COMMANDS.items():
        ns = cli.parser().parse_args([name, *BASE.get(name, [])])
        options = command.options(ns)
        assert dataclasses.is_dataclass(options) and type(options).__name__.endswith("Options")
        with pytest.raises(dataclasses.FrozenInstanceError):
            options.__setattr__(dataclasses.fields(options)[0].name, None)


@pytest.mark.parametrize("command", ["build", "test"])
def test_debug_reaches_the_commands_that_read_it(command: str) -> None:
    assert _options(["--debug", command])[1].debug is True
    assert _options([command])[1].debug is False


def test_tune_seconds_is_the_one_name_of_the_tuning_budget() -> None:
    _, new = _options(["tune", "--tune-seconds", "7"])
    _, old = _options(["tune", "--seconds", "7"])
    assert new == old and new.budgets == Budgets(Budget(16, 300.0), Budget(None, 7.0))
    assert _options(["tune"])[1].budgets.tuning.seconds == 120.0
    help_text = SUBPARSERS["tune"].format_help()
    assert "--tune-seconds" in help_text and not re.search(r"--seconds\b", help_text)  # the alias is hidden
    for command in ("build", "test", "profile"):
        assert _options([command, "--tune-seconds", "9"])[1].budgets.tuning.seconds == 9.0
        with pytest.raises(SystemExit):
            cli.parser().parse_args([command, "--seconds", "9"])


@pytest.mark.parametrize("argv", [["plan", "--no-summary"], ["plan", "-v"], ["profile", "--no-summary"],
                                  ["tune", "--no-summary"], ["tune", "--locked"], ["tune", "--cache", "d"]])
def test_a_flag_that_would_not_act_is_refused(argv: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as e:
        cli.parser().parse_args(argv)
    assert e.value.code == 2 and "unrecognized arguments" in capsys.readouterr().err


def test_the_groups_are_shared_and_typed() -> None:
    _, b = _options(["build", "-c", "x.toml", "-t", "a", "-t", "b*", "-m", "m", "--json", "-v", "-j", "2",
                     "--lock-timeout", "5", "--locked", "--no-cache"])
    assert b.selection == Selection(config="x.toml", target=("a", "b*"), model=("m",), json=True, verbose=True)
    assert b.writer == Writer(jobs=2, lock_timeout=5.0, locked=True, no_cache=True)
    _, t = _options(["tune", "-j", "3"])
    assert t.writer == Writer(jobs=3, lock_timeout=600.0)  # tune: the configured cache, no --locked
    assert _options(["test", "--no-explain"])[1].explain is False and _options(["test"])[1].explain is None
    _, p = _options(["plan", "--json"])
    assert p.selection.no_summary is False and p.selection.verbose is False


def test_the_commands_read_no_namespace() -> None:
    """argparse is read in cli/__init__.py (the parser, the table of commands) and cli/options/ alone: each
    `cmd_*` takes its typed options."""
    for path in sorted(CLI.glob("*.py")):
        if path.name != "__init__.py":
            text = path.read_text()
            assert "argparse" not in text and "getattr(args" not in text, path
