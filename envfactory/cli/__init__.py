"""The ``envfactory`` command line. Every command takes ``--json`` for scripts.

Built-in subcommands live in :data:`COMMANDS` as ``name -> (help, add_arguments, run)``.
Other packages add theirs through the entry-point group ``envfactory.commands``
(:data:`COMMAND_GROUP`): each entry point is named after its command and points
at a :class:`Command` (or any ``(help, add_arguments, run)`` triple); the
``agents`` package adds ``eval``, ``train`` and ``quickstart`` this way, so the
core never imports it. ``run`` returns ``(exit_code, json_document, human_text)``;
the CLI prints one of them. With ``--json``, everything the command (or any
library or child process) writes to stdout goes to stderr, and stdout carries
only the JSON document.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib
import json
import os
import sys
import time
from typing import AbstractSet, Any, Callable, Iterator, NamedTuple

__all__ = ["main", "build_parser", "COMMANDS", "COMMAND_GROUP", "Command", "plugin_commands"]

Result = tuple[int, Any, str]
COMMAND_GROUP = "envfactory.commands"


class Command(NamedTuple):
    """A subcommand: its one-line help, a function adding its arguments, and its runner."""

    help: str
    add_arguments: Callable[[argparse.ArgumentParser], None]
    run: Callable[[argparse.Namespace], Result]


def _table(header: list[str], rows: list[list[Any]], right: AbstractSet[int] = frozenset()) -> list[str]:
    """Left/right-aligned columns, each as wide as its widest cell; the last column is free text."""
    cells = [[str(c) for c in r] for r in [header, *rows]]
    widths = [max(len(r[i]) for r in cells) for i in range(len(header) - 1)]
    out = []
    for r in cells:
        parts = [r[i].rjust(w) if i in right else r[i].ljust(w) for i, w in enumerate(widths)]
        out.append("  ".join(parts + [r[-1]]).rstrip())
    return out


# -- list ------------------------------------------------------------------
def _list_args(p: argparse.ArgumentParser) -> None:
    pass


def _list_run(args: argparse.Namespace) -> Result:
    from .. import specs

    rows = [s.describe() for s in specs()]
    lines = _table(
        ["name", "domain", "agents", "tasks", "tools", "description"],
        [[r["name"], r["domain"], "multi" if r["multi_agent"] else "single", r["tasks"], r["tools"],
          r.get("description", "")] for r in rows],
        right={3, 4},
    )
    return 0, rows, "\n".join(lines)


# -- verify ----------------------------------------------------------------
def _verify_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("names", nargs="*", help="environments to verify (default: all)")
    p.add_argument("--all", action="store_true", help="verify every registered environment")
    p.add_argument("--runtime", default="local", help="runtime to verify in (local or docker)")
    p.add_argument("--audit", action="store_true",
                   help="the full reward-hacking audit (every task; default: a quick one on a few tasks)")
    p.add_argument("--no-audit", action="store_true", help="skip the reward-hacking audit")
    p.add_argument("--fail-on-hack", action="store_true", help="a hack the audit finds fails verification")
    p.add_argument("--workers", type=int, default=None,
                   help="processes verifying side by side (default: one per core; 1: in order, here)")


def _verify_run(args: argparse.Namespace) -> Result:
    from .. import spec, specs
    from ..checks.verify import verify_many

    try:
        chosen = specs() if (args.all or not args.names) else [spec(n) for n in args.names]
    except KeyError as exc:
        return 2, {"error": str(exc.args[0])}, f"error: {exc.args[0]}"
    audit = None if args.no_audit else "full" if args.audit else "quick"
    doc = verify_many(chosen, runtime=args.runtime, audit=audit, audit_fails=args.fail_on_hack,
                      workers=args.workers)
    lines = []
    for r in doc["environments"]:
        mark = "PASS" if r["verified"] else "FAIL"
        lines.append(f"{mark}  {r['name']:<24}{r['domain']:<14}{r['tasks']:>4} tasks  {r['seconds']:.2f}s"
                     + _audit_line(r.get("audit")))
        for f in r["failures"][:10]:
            where = f" [{f['task']}]" if "task" in f else ""
            lines.append(f"      {f['check']}{where}: {f['detail']}")
        if len(r["failures"]) > 10:
            lines.append(f"      ... {len(r['failures']) - 10} more failures")
    t = doc["totals"]
    lines.append(
        f"{t['verified']}/{t['environments']} verified, {t['domains']} domains, {t['tasks']} tasks, "
        f"mean reference solution {t['mean_solution_length']} calls, {t['seconds']:.1f}s"
    )
    if "audit" in doc:
        a = doc["audit"]
        tr = a["transcriber"]
        lines.append(f"audit ({audit}): {a['tasks_searched']} tasks searched, {a['sequences']} sequences, "
                     f"{a['rewards']} rewards reached, {a['hacks']} hacked tasks"
                     + (f" in {', '.join(a['hacked_environments'])}" if a["hacked_environments"] else "")
                     + f"; transcriber solved {tr['solved']}/{tr['tasks']} "
                     f"({tr['needs_lookup_solved']}/{tr['needs_lookup']} needing a look-up), {a['seconds']:.1f}s")
    code = 0 if t["verified"] == t["environments"] else 1
    return code, doc, "\n".join(lines)


def _audit_line(a: dict[str, Any] | None) -> str:
    if not a or "skipped" in a:
        return ""
    tr = a["transcriber"] or {"solved": "-", "tasks": "-"}
    hacks = f"  HACKED {a['hacks']}: {', '.join(a['hacked_tasks'][:3])}" if a["hacks"] else ""
    return (f"  audit {a['tasks_searched']}t/{a['sequences']}seq/{a['rewards']}rew/{a['hacks']}hacks"
            f"  transcriber {tr['solved']}/{tr['tasks']}{hacks}")


# -- bench -----------------------------------------------------------------
def _bench_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--only", action="append", metavar="SECTION",
                   help="run only this section (repeatable): " + ", ".join(installed_sections()))


BENCH_GROUP = "envfactory.bench"  # the sections: benchmarks/ (and any package) announce theirs here


def installed_sections() -> dict[str, Callable[[], dict[str, Any]]]:
    """The ``envfactory bench`` sections that installed packages announce in :data:`BENCH_GROUP`
    (the project's own live in ``benchmarks/``, never inside the library)."""
    from importlib import metadata

    def section(ep: metadata.EntryPoint) -> Callable[[], Any]:
        return lambda: ep.load()()

    return {ep.name: section(ep) for ep in metadata.entry_points(group=BENCH_GROUP)}


def run_bench(only: list[str] | None = None) -> dict[str, Any]:
    """Run the named sections (all by default) and merge their results. A section that fails
    reports ``<section>_error`` and the others still run: one failure never empties the report."""
    results: dict[str, Any] = {}
    for name, fn in installed_sections().items():
        if only and name not in only:
            continue
        t0 = time.perf_counter()
        try:
            results.update(fn())
        except Exception as exc:  # noqa: BLE001 - whatever broke, the other sections' figures stand
            results[f"{name}_error"] = f"{type(exc).__name__}: {exc}"
        results[f"section_{name}_s"] = round(time.perf_counter() - t0, 3)
    return results


def _bench_run(args: argparse.Namespace) -> Result:
    known = installed_sections()
    if not known:
        msg = ("no bench sections are installed: they live in the benchmarks package "
               "(pip install -e . from a checkout; scripts/setup.sh does)")
        return 2, {"error": msg}, "error: " + msg
    if args.only:
        unknown = [s for s in args.only if s not in known]
        if unknown:
            msg = f"unknown bench section(s) {unknown}; choose from {sorted(known)}"
            return 2, {"error": msg}, "error: " + msg
    doc = run_bench(args.only)
    width = max((len(k) for k in doc), default=0)
    return 0, doc, "\n".join(f"{k:<{width}}  {v}" for k, v in doc.items())


# -- quickstart (the main job) --------------------------------------------
def _quickstart_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--episodes", type=int, default=3, help="episodes per environment to play")


def _quickstart_run(args: argparse.Namespace) -> Result:
    """List, verify and play episodes of the built-in environments with scripted agents."""
    from .. import make, specs
    from ..checks.scripted import OraclePolicy, RandomPolicy, play
    from ..checks.verify import verify_many

    start = time.perf_counter()
    out: list[str] = []
    code, rows, text = _list_run(args)
    out += ["== environments", text]
    doc = verify_many(specs())
    t = doc["totals"]
    out += ["== verification", f"{t['verified']}/{t['environments']} environments verified "
            f"({t['tasks']} tasks) in {t['seconds']:.1f}s"]
    played = []
    out.append("== episodes (scripted agents: the reference 'oracle' and a seeded 'random')")
    for s in specs():
        if getattr(s, "multi_agent", False):
            continue
        env = make(s.name)
        for i, task in enumerate(s.get_tasks()[: args.episodes]):
            for agent, policy in (("oracle", OraclePolicy()), ("random", RandomPolicy())):
                res = play(env, policy, task.id, seed=i)
                played.append({"env": s.name, "task": task.id, "agent": agent, "reward": res.reward,
                               "turns": res.turns})
                out.append(f"{s.name:<16} {task.id:<12} {agent:<7} reward={res.reward:.0f} "
                           f"turns={res.turns}")
        if s.name == specs()[0].name:
            out.append("   transcript of the last episode:")
            for m in env.messages[1:]:
                out.append(f"   [{m['role']}] {str(m.get('content'))[:110]!r}")
    summary = {
        "environments": rows,
        "verification": t,
        "episodes": played,
        "oracle_success": _mean(p["reward"] for p in played if p["agent"] == "oracle"),
        "random_success": _mean(p["reward"] for p in played if p["agent"] == "random"),
        "seconds": round(time.perf_counter() - start, 2),
    }
    out.append(f"oracle success {summary['oracle_success']:.2f}, random success "
               f"{summary['random_success']:.2f}, {summary['seconds']}s")
    ok = t["verified"] == t["environments"] and summary["oracle_success"] == 1.0
    return (0 if ok else 1), summary, "\n".join(out)


def _mean(xs: Any) -> float:
    xs = list(xs)
    return sum(xs) / len(xs) if xs else 0.0


def _lazy(help_text: str, module: str, prefix: str) -> Command:
    """A command whose ``{prefix}_args`` and ``{prefix}_run`` live in ``module`` (absolute),
    imported only when the command is built or run (``import envfactory`` stays cheap)."""

    def add_arguments(p: argparse.ArgumentParser) -> None:
        getattr(importlib.import_module(module), f"{prefix}_args")(p)

    def run(args: argparse.Namespace) -> Result:
        return getattr(importlib.import_module(module), f"{prefix}_run")(args)

    return Command(help_text, add_arguments, run)


def _serve_args(p: argparse.ArgumentParser) -> None:
    """``serve``'s arguments are the MCP server's; ``--protocol`` also offers ``openenv``."""
    importlib.import_module("envfactory.faces.mcp_server").serve_args(p)
    for action in p._actions:
        if action.dest == "protocol":
            action.choices = ["mcp", "openenv"]
            action.help = ("mcp: Model Context Protocol (default); openenv: openenv-core's server (HTTP + "
                           "WebSocket at --host/--port; --transport is not used)")


def _serve_run(args: argparse.Namespace) -> Result:
    if args.protocol == "openenv":
        try:
            module = importlib.import_module("envfactory.faces.openenv_server")
        except ImportError as exc:
            msg = f"--protocol openenv needs openenv-core (pip install 'envfactory[bench]'): {exc}"
            return 2, {"error": msg}, f"error: {msg}"
        return module.serve_run(args)
    return importlib.import_module("envfactory.faces.mcp_server").serve_run(args)


COMMANDS: dict[str, Command] = {
    "list": Command("list registered environments", _list_args, _list_run),
    "verify": Command("run the verification suite", _verify_args, _verify_run),
    "bench": Command("measure speed against same-run baselines", _bench_args, _bench_run),
    "generate": _lazy("build and verify an environment from a prompt (LLM) or a spec file",
                      "envfactory.factory.commands", "generate"),
    "tasks": _lazy("task tools: 'tasks synth NAME --n N --seed S'", "envfactory.factory.commands", "tasks"),
    "image": _lazy("Docker images: 'image build [NAME...|--all]' (offline, content-hashed tags)",
                   "envfactory.runtime.commands", "image"),
    "gc": _lazy("remove Docker containers that exited envfactory processes left behind", "envfactory.runtime.commands", "gc"),
    "serve": Command("serve an environment to any client: '--protocol mcp' (stdio, or --transport "
                     "streamable-http) or '--protocol openenv' (openenv-core's server: WebSocket EnvClient)",
                     _serve_args, _serve_run),
    "eval-team": _lazy("evaluate teams of policies on the multi-agent environments (JSON + markdown report)",
                       "envfactory.evaluation.eval", "cli"),
    "play": Command("list, verify and play the built-in environments with scripted agents", _quickstart_args,
                    _quickstart_run),
}


# -- commands from other packages (entry points) ------------------------------
def _broken(name: str, source: str, why: str) -> Command:
    """A stand-in for a plugin command that cannot be loaded: listed in --help, a clear error when run."""
    msg = (f"the {name!r} command (entry point {source} in group {COMMAND_GROUP}) is unavailable: {why}")

    def add_arguments(p: argparse.ArgumentParser) -> None:
        pass  # whatever arguments come are accepted (main parses them as unknown)

    def run(args: argparse.Namespace) -> Result:
        return 2, {"error": msg}, "error: " + msg

    return _Broken(f"[unavailable: {why}]".replace("%", "%%"), add_arguments, run)  # help is a %-format


class _Broken(Command):
    """A plugin command that could not be loaded (see :func:`_broken`)."""


def _as_command(obj: Any) -> Command:
    if isinstance(obj, Command):
        return obj
    if isinstance(obj, tuple) and len(obj) == 3:
        return Command(*obj)
    if all(hasattr(obj, a) for a in ("help", "add_arguments", "run")):
        return Command(obj.help, obj.add_arguments, obj.run)
    raise TypeError(f"expected an envfactory.cli.Command or a (help, add_arguments, run) triple, "
                    f"got {type(obj).__name__}")


def plugin_commands() -> dict[str, tuple[Command, str]]:
    """Commands announced in :data:`COMMAND_GROUP`: ``name -> (command, where it comes from)``.

    Loading an entry point imports only the module it names (which should import its
    heavy dependencies inside ``run``). A plugin that fails to load or is malformed becomes a
    stand-in that explains why when run; a built-in command of the same name wins.
    """
    from importlib import metadata

    out: dict[str, tuple[Command, str]] = {}
    for ep in sorted(metadata.entry_points(group=COMMAND_GROUP), key=lambda e: e.name):
        source = f"{ep.name} = {ep.value!r}"
        if ep.name in COMMANDS or ep.name in out:
            continue  # a built-in command wins; the same distribution may be seen twice on sys.path
        try:
            cmd = _as_command(ep.load())
        except Exception as exc:  # a broken plugin must not break the CLI
            cmd = _broken(ep.name, source, f"{type(exc).__name__}: {exc}")
        out[ep.name] = (cmd, source)
    return out


def _all_commands() -> dict[str, tuple[Command, str | None]]:
    table: dict[str, tuple[Command, str | None]] = {n: (c, None) for n, c in COMMANDS.items()}
    table.update(plugin_commands())
    return table


def build_parser(commands: dict[str, tuple[Command, str | None]] | None = None) -> argparse.ArgumentParser:
    commands = _all_commands() if commands is None else commands
    parser = argparse.ArgumentParser(prog="envfactory", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for name, (cmd, source) in commands.items():
        p = sub.add_parser(name, help=cmd.help)
        p.add_argument("--json", action="store_true", help="machine-readable output on stdout (only JSON)")
        try:
            cmd.add_arguments(p)
        except Exception as exc:  # a plugin whose arguments cannot be built
            if source is None:
                raise
            broken = _broken(name, source, f"adding its arguments failed: {type(exc).__name__}: {exc}")
            commands[name] = (broken, source)
            for action in p._actions:  # whatever it added before failing must not block the error
                action.required = False
    return parser


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


def _run(name: str, cmd: Command, source: str | None, args: argparse.Namespace) -> Result:
    if source is None:
        return cmd.run(args)
    try:
        return cmd.run(args)
    except ImportError as exc:  # a plugin's optional dependency (torch, transformers, ...) is missing
        msg = (f"the {name!r} command (from {source}) needs a module that is not installed: {exc}. "
               "Install the package's extras (e.g. pip install 'envfactory[train]').")
        return 2, {"error": msg}, "error: " + msg


def main(argv: list[str] | None = None) -> int:
    commands = _all_commands()
    parser = build_parser(commands)
    args, unknown = parser.parse_known_args(argv)
    cmd, source = commands[args.command]
    if unknown and not isinstance(cmd, _Broken):
        parser.error(f"unrecognized arguments: {' '.join(unknown)}")
    if not args.json:
        code, doc, text = _run(args.command, cmd, source, args)
        try:
            print(text)
            sys.stdout.flush()
        except BrokenPipeError:  # `envfactory list | head`
            os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return code
    with stdout_to_stderr():
        code, doc, text = _run(args.command, cmd, source, args)
    sys.stdout.write(json.dumps(doc, indent=2, default=str) + "\n")
    sys.stdout.flush()
    return code
