"""The ``envfactory`` command line. Every command takes ``--json`` for scripts.

One way to add a command: write a module-level :class:`Command` (its help, a function
adding its arguments, its runner, and an example) and name it by ``"module:ATTRIBUTE"``.
The core's own commands are named in :data:`BUILTIN_COMMANDS`; other packages name theirs
as entry points in the group ``envfactory.commands`` (:data:`COMMAND_GROUP`), the way the
``agents`` package adds ``eval``, ``train`` and ``quickstart`` (so the core never imports
it). Both tables are loaded the same way, by :func:`commands`: a name is imported only
when the CLI starts, and a command's heavy imports wait inside its ``run``.

``run`` returns ``(exit_code, json_document, human_text)``, or raises :class:`CommandError`.
The human text goes to stdout; an error (a :class:`CommandError`, any other exception a command
raises, or a non-zero result whose document is ``{"error": ...}``) goes to stderr as
``envfactory NAME: error: ...`` (an unexpected exception exits 1, its traceback shown only with
``ENVFACTORY_TRACEBACK=1``).
With ``--json``, everything the command (or any library or child process) writes to
stdout goes to stderr, and stdout carries only the JSON document (``{"error": ...}``
for an error, a usage error that argparse finds included).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import sys
import traceback
from importlib import metadata
from typing import Any, Callable, Iterator, NamedTuple, NoReturn

__all__ = ["main", "build_parser", "commands", "BUILTIN_COMMANDS", "COMMAND_GROUP", "Command", "CommandError",
           "Result"]

Result = tuple[int, Any, str]  # what a command's run returns: (exit code, JSON document, human text)
COMMAND_GROUP = "envfactory.commands"

# The core's commands, named exactly as an entry point names a plugin's. They live in code, not
# in pyproject's entry points, so that they exist without installed package metadata (a checkout
# on PYTHONPATH) and no plugin can replace them.
BUILTIN_COMMANDS: dict[str, str] = {
    "list": "envfactory.cli.environments:LIST",
    "verify": "envfactory.cli.environments:VERIFY",
    "play": "envfactory.cli.environments:PLAY",
    "bench": "envfactory.cli.measure:BENCH",
    "generate": "envfactory.cli.factory:GENERATE",
    "tasks": "envfactory.cli.factory:TASKS",
    "image": "envfactory.cli.runtime:IMAGE",
    "gc": "envfactory.cli.runtime:GC",
    "serve": "envfactory.cli.serve:SERVE",
    "eval-team": "envfactory.cli.evaluation:EVAL_TEAM",
    "export": "envfactory.cli.export:EXPORT",
}


class Command(NamedTuple):
    """A subcommand of ``envfactory``.

    ``help``: one line for ``envfactory --help`` (a %-format: write ``%%`` for a percent sign);
    ``add_arguments(parser)``: declares its arguments (``--json`` is already there);
    ``run(args)``: returns ``(exit_code, json_document, human_text)`` or raises :class:`CommandError`;
    ``example``: command lines shown under ``Examples:`` in its ``--help``, one per line.
    """

    help: str
    add_arguments: Callable[[argparse.ArgumentParser], None]
    run: Callable[[argparse.Namespace], Result]
    example: str = ""


class CommandError(Exception):
    """What a command raises when it cannot do what it was asked: the message says what was wrong
    and what to do; the CLI writes it to stderr and exits with ``code`` (2: a usage error)."""

    def __init__(self, message: str, code: int = 2) -> None:
        super().__init__(message)
        self.code = code


def check_runtime(runtime: str) -> None:
    """Raise :class:`CommandError` unless ``runtime`` is a registered runtime
    (:data:`envfactory.registry.RUNTIMES`): said before any world starts, not as a traceback
    from the first ``make``."""
    from ..registry import RUNTIMES

    if runtime not in RUNTIMES:
        raise CommandError(f"no runtime {runtime!r}; the runtimes: {', '.join(RUNTIMES)}")


def examples_epilog(example: str) -> str | None:
    """The ``--help`` epilog of a command whose examples are ``example`` (one command line a line)."""
    lines = [line for line in example.strip().splitlines() if line.strip()]
    return "Examples:\n" + "\n".join(f"  {line.strip()}" for line in lines) if lines else None


# -- finding commands -----------------------------------------------------------------
class _Broken(Command):
    """A stand-in for a command that cannot be loaded: listed in --help, a clear error when run."""


def _broken(name: str, source: str, why: str) -> Command:
    msg = f"the {name!r} command ({source}) is unavailable: {why}"

    def run(args: argparse.Namespace) -> Result:
        raise CommandError(msg)

    # whatever arguments come are accepted (main parses them as unknown); help is a %-format
    return _Broken(f"[unavailable: {why}]".replace("%", "%%"), lambda p: None, run)


def _as_command(obj: Any) -> Command:
    if isinstance(obj, Command):
        return obj
    raise TypeError(f"expected an envfactory.cli.Command(help, add_arguments, run, example), "
                    f"got {type(obj).__name__}")


def _load(entry_point: metadata.EntryPoint, source: str) -> Command:
    """The command an entry point (``name = "module:ATTRIBUTE"``) names, or a :func:`_broken` stand-in."""
    try:
        return _as_command(entry_point.load())
    except Exception as exc:  # noqa: BLE001 - a broken plugin must not break the CLI
        return _broken(entry_point.name, source, f"{type(exc).__name__}: {exc}")


def commands() -> dict[str, tuple[Command, str]]:
    """Every command: ``name -> (command, where it comes from)``, the built-ins first.

    Loading one imports the module its reference names (which imports its heavy dependencies
    inside ``run``). A command that fails to load or is malformed becomes a stand-in that
    explains why when run; a built-in wins over a plugin of the same name.
    """
    table = {name: (_load(metadata.EntryPoint(name, ref, COMMAND_GROUP), f"built-in {ref}"), f"built-in {ref}")
             for name, ref in BUILTIN_COMMANDS.items()}
    for ep in sorted(metadata.entry_points(group=COMMAND_GROUP), key=lambda e: e.name):
        if ep.name in table:
            continue  # a built-in command wins; the same distribution may be seen twice on sys.path
        source = f"entry point {ep.name} = {ep.value!r} in group {COMMAND_GROUP}"
        table[ep.name] = (_load(ep, source), source)
    return table


class _Parser(argparse.ArgumentParser):
    """argparse's parser, whose usage errors (a bad ``--port``, an unknown command) also give
    ``{"error": ...}`` on stdout when the command line asks for ``--json`` (:data:`_JSON_ERRORS`),
    as every other error does; the usage and message still go to stderr, the exit code stays 2.
    Sub-parsers are of the same class (argparse makes them of their parent's)."""

    def error(self, message: str) -> NoReturn:
        if _JSON_ERRORS:
            with contextlib.suppress(Exception):
                sys.stdout.write(json.dumps({"error": message}, indent=2) + "\n")
                sys.stdout.flush()
        super().error(message)


_JSON_ERRORS = False  # set by main() for a command line with --json


def build_parser(table: dict[str, tuple[Command, str]] | None = None, chosen: str | None = None
                 ) -> argparse.ArgumentParser:
    """The ``envfactory`` parser over ``table`` (default: :func:`commands`). Only the ``chosen``
    command's arguments are added (``""``: none, for the command list; ``None``: every command's),
    so parsing ``envfactory list`` never builds ``train``'s. A command whose arguments cannot be
    built becomes a stand-in in ``table``."""
    table = commands() if table is None else table
    parser = _Parser(prog="envfactory",
                     description="The envfactory command line. Every command takes --json for scripts.",
                     epilog=examples_epilog("envfactory list\nenvfactory verify --all --json\n"
                                            "envfactory COMMAND --help"),
                     formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for name, (cmd, source) in table.items():
        own = _Parser(prog=f"envfactory {name}", add_help=False)
        if chosen is None or name == chosen:
            try:  # on a parser of its own first: a command that fails leaves nothing half-added
                cmd.add_arguments(own)
            except Exception as exc:  # noqa: BLE001 - a command whose arguments cannot be built
                cmd = _broken(name, source, f"adding its arguments failed: {type(exc).__name__}: {exc}")
                table[name] = (cmd, source)
                own = _Parser(add_help=False)
        p = sub.add_parser(name, help=cmd.help, description=cmd.help.replace("%%", "%"), parents=[own],
                           epilog=examples_epilog(cmd.example), formatter_class=argparse.RawDescriptionHelpFormatter)
        p.add_argument("--json", action="store_true", help="machine-readable output on stdout (only JSON)")
    return parser


# -- running ----------------------------------------------------------------------------
def _fileno(stream: Any, default: int) -> int:
    try:
        return stream.fileno()
    except (AttributeError, OSError, ValueError):  # e.g. pytest's capsys streams
        return default


@contextlib.contextmanager
def stdout_to_stderr() -> Iterator[None]:
    """Send everything written to stdout to stderr until the block ends, at the
    file-descriptor level too (so C libraries, ``logging`` handlers holding the old
    ``sys.stdout`` and child processes are caught); ``sys.stdout`` is restored after."""
    old_stdout = sys.stdout
    for stream in (old_stdout, sys.__stdout__):
        with contextlib.suppress(Exception):
            if stream is not None:
                stream.flush()
    saved = os.dup(1)
    try:
        os.dup2(_fileno(sys.stderr, 2), 1)
        sys.stdout = sys.stderr
        yield
    finally:
        for stream in (sys.stdout, old_stdout, sys.__stdout__):  # buffered noise goes out to stderr
            with contextlib.suppress(Exception):
                if stream is not None:
                    stream.flush()
        sys.stdout = old_stdout
        os.dup2(saved, 1)
        os.close(saved)


def _run(name: str, cmd: Command, source: str, args: argparse.Namespace) -> Result:
    try:
        return cmd.run(args)
    except CommandError as exc:
        return exc.code, {"error": str(exc)}, ""
    except ImportError as exc:  # an optional dependency (torch, mcp, docker, ...) is missing
        msg = (f"the {name!r} command ({source}) needs a module that is not installed: {exc}. "
               "Install the extra that provides it (pyproject.toml's optional dependencies, "
               "e.g. pip install 'envfactory[train]').")
        return 2, {"error": msg}, ""
    except Exception as exc:  # noqa: BLE001 - any other failure: one line on stderr, never a bare traceback
        if os.environ.get("ENVFACTORY_TRACEBACK", "") not in ("", "0"):
            traceback.print_exc(file=sys.stderr)
        what = str(exc.args[0]) if isinstance(exc, KeyError) and exc.args else str(exc)
        return 1, {"error": f"{what or type(exc).__name__} ({type(exc).__name__}; "
                            "ENVFACTORY_TRACEBACK=1 shows where)"}, ""


def _error_of(code: int, doc: Any) -> str | None:
    """The message of an error result: non-zero, and its document is ``{"error": message}``."""
    if code != 0 and isinstance(doc, dict) and set(doc) == {"error"}:
        return str(doc["error"])
    return None


def _command_name(argv: list[str]) -> str | None:
    # the top-level parser has no options but -h, so the first word is the command
    return next((a for a in argv if not a.startswith("-")), None)


def _subparser(parser: argparse.ArgumentParser, name: str) -> argparse.ArgumentParser:
    """The parser of command ``name`` in :func:`build_parser`'s ``parser`` (the top level if none)."""
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction) and name in action.choices:
            return action.choices[name]
    return parser


def main(argv: list[str] | None = None) -> int:
    """``envfactory ARGS``; returns the exit code (0: done, 1: a check failed, 2: a usage error)."""
    global _JSON_ERRORS
    argv = sys.argv[1:] if argv is None else list(argv)
    _JSON_ERRORS = "--json" in argv
    table = commands()
    name = _command_name(argv) or ""
    parser = build_parser(table, chosen=name)
    if name and name not in table:  # argparse would list every command; name the likely one
        from ..definition import did_you_mean

        parser.error(f"no command {name!r}{did_you_mean(name, table)} ('envfactory --help' lists them)")
    args, unknown = parser.parse_known_args(argv)
    cmd, source = table[args.command]
    if unknown and not isinstance(cmd, _Broken):  # said by the command's parser: its usage, its name
        _subparser(parser, args.command).error(f"unrecognized arguments: {' '.join(unknown)} "
                                               f"('envfactory {args.command} --help' lists its arguments)")
    if args.json:
        with stdout_to_stderr():
            code, doc, text = _run(args.command, cmd, source, args)
    else:
        code, doc, text = _run(args.command, cmd, source, args)
    error = _error_of(code, doc)
    if error is not None:
        print(f"envfactory {args.command}: error: {error}", file=sys.stderr, flush=True)
    try:
        if args.json:
            sys.stdout.write(json.dumps(doc, indent=2, default=str) + "\n")
        elif error is None and text:
            sys.stdout.write(text + "\n")
        sys.stdout.flush()
    except BrokenPipeError:  # `envfactory list | head`
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
    return code
