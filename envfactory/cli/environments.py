"""The commands over registered environments: ``list``, ``verify`` and ``play``."""

from __future__ import annotations

import argparse
import sys
import time
from typing import AbstractSet, Any

from . import Command, CommandError, Result, check_runtime



def _advance(bar: Any, name: str) -> None:
    bar.set_postfix_str(name, refresh=False)
    bar.update()


def _table(header: list[str], rows: list[list[Any]], right: AbstractSet[int] = frozenset()) -> list[str]:
    """Left/right-aligned columns, each as wide as its widest cell; the last column is free text."""
    cells = [[str(c) for c in r] for r in [header, *rows]]
    widths = [max(len(r[i]) for r in cells) for i in range(len(header) - 1)]
    out = []
    for r in cells:
        parts = [r[i].rjust(w) if i in right else r[i].ljust(w) for i, w in enumerate(widths)]
        out.append("  ".join(parts + [r[-1]]).rstrip())
    return out


def _chosen(names: list[str]) -> list[Any]:
    """The registered specs of ``names`` (every one when empty); an unknown name is a usage error
    that suggests the closest registered names."""
    from .. import spec, specs

    try:
        return [spec(n) for n in names] if names else specs()
    except KeyError as exc:
        raise CommandError(str(exc.args[0])) from None


# -- list ------------------------------------------------------------------
def _list_run(args: argparse.Namespace) -> Result:
    from ..registry import listing

    bar: Any = None

    def progress(done: int, total: int, name: str | None) -> None:
        nonlocal bar  # a bar only when entries must be built (a warm cache answers at once)
        if bar is None:
            bar = progress_bar(total, "list: describing", "env")
            bar.refresh()
        if name is not None:
            _advance(bar, name)

    try:
        # cached per environment, keyed by the sources it really read: no synthesis on a warm cache
        rows = listing(progress=progress)
    finally:
        if bar is not None:
            bar.close()
    return 0, rows, "\n".join(_list_lines(rows))


def _list_lines(rows: list[dict[str, Any]]) -> list[str]:
    return _table(
        ["name", "domain", "agents", "tasks", "tools", "description"],
        [[r["name"], r["domain"], "multi" if r["multi_agent"] else "single", r["tasks"], r["tools"],
          r.get("description", "")] for r in rows],
        right={3, 4},
    )


LIST = Command("list registered environments", lambda p: None, _list_run,
               "envfactory list\nenvfactory list --json")


# -- verify ----------------------------------------------------------------
def _verify_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("names", nargs="*", help="environments to verify (default: all)")
    p.add_argument("--all", action="store_true", help="verify every registered environment")
    p.add_argument("--runtime", default="local", help="runtime to verify in (local or docker)")
    p.add_argument("--audit", action="store_true",
                   help="the full reward-hacking audit (every task; default: a quick one on a few tasks)")
    p.add_argument("--no-audit", action="store_true", help="skip the reward-hacking audit")
    p.add_argument("--fail-on-hack", action="store_true", help="a hack the audit finds fails verification")
    p.add_argument("--audit-depth", type=int, default=None, metavar="N",
                   help="after the audit's breadth-first search (depth 2), a guided search to depth N "
                        "(0: each task's reference length), its coverage reported; off by default")
    p.add_argument("--workers", type=int, default=None,
                   help="processes verifying side by side (default: one per core; 1: in order, here)")


def progress_bar(total: int, desc: str, unit: str) -> Any:
    """A tqdm bar on stderr, shown only when stderr is a terminal (stdout stays the command's).
    Redrawn at every step (``mininterval=0``: a step is one environment, at most a few hundred), so a
    step that ends within tqdm's default 0.1 s of the last one is still shown."""
    from tqdm import tqdm

    return tqdm(total=total, desc=desc, unit=unit, file=sys.stderr, disable=not _isatty(sys.stderr),
                leave=False, dynamic_ncols=True, mininterval=0.0)


def _isatty(stream: Any) -> bool:
    try:
        return bool(stream.isatty())
    except (AttributeError, ValueError):
        return False


def _verify_run(args: argparse.Namespace) -> Result:
    from ..checks.verify import verify_many

    chosen = _chosen([] if args.all else args.names)
    check_runtime(args.runtime)
    audit: Any = None if args.no_audit else "full" if args.audit else "quick"
    if args.audit_depth is not None and audit is not None:
        from dataclasses import replace

        from ..checks import audit as _audit

        if args.audit_depth < 0:
            raise CommandError("--audit-depth must be 0 (the reference length) or more")
        base = _audit.FULL if audit == "full" else _audit.QUICK
        audit = replace(base, guided_depth=args.audit_depth,
                        name=f"{base.name}+guided({args.audit_depth or 'reference'})")
    with progress_bar(len(chosen), "verify", "env") as bar:
        doc = verify_many(chosen, runtime=args.runtime, audit=audit, audit_fails=args.fail_on_hack,
                          workers=args.workers,
                          on_report=lambda r: _advance(bar, r["name"]))
    lines = []
    for r in doc["environments"]:
        mark = "PASS" if r["verified"] else "FAIL"
        lines.append(f"{mark}  {r['name']:<24}{r['domain']:<14}{r['tasks']:>4} tasks  {r['seconds']:.2f}s"
                     + _audit_line(r.get("audit")))
        parts = r.get("components") or {}
        if set(parts) - {"state", "answer"}:  # a conversation's or an imported suite's components
            lines.append("      reward: product of " + ", ".join(f"{k} ({n} tasks)" for k, n in parts.items()))
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
    d = t["depth"]
    lines.append(f"depth: goal-level references {d['goal_level_mean_len']} calls on average "
                 f"(goal {d['goals']['goal_level_mean_len']}), {d['hard_long']}/{d['hard_tasks']} tasks of "
                 f"difficulty >= {d['hard_difficulty']} need >= {d['long_calls']} calls "
                 f"({d['hard_long_share']:.1%}, goal {d['goals']['hard_long_share']:.0%}; "
                 f"{d['stated']['hard_long']}/{d['stated']['hard_tasks']} of those whose difficulty is stated)")
    if "audit" in doc:
        a = doc["audit"]
        tr = a["transcriber"]
        name = audit if isinstance(audit, str) else audit.name
        lines.append(f"audit ({name}): {a['tasks_searched']} tasks searched, {a['sequences']} sequences, "
                     f"{a['rewards']} rewards reached, {a['hacks']} hacked tasks"
                     + (f" in {', '.join(a['hacked_environments'])}" if a["hacked_environments"] else "")
                     + f"; transcriber solved {tr['solved']}/{tr['tasks']} "
                     f"({tr['needs_lookup_solved']}/{tr['needs_lookup']} needing a look-up), {a['seconds']:.1f}s")
        if "guided" in a:
            g = a["guided"]
            lines.append(f"guided search: {g['tasks']} tasks to depth {g['mean_depth']} on average (max "
                         f"{g['max_depth']}), {g['reached_depth']} reached it; {g['sequences']} sequences, "
                         f"{g['states']} states, a share {g['coverage']:.3g} of the {g['space']:.3g} "
                         "candidate sequences")
    code = 0 if t["verified"] == t["environments"] else 1
    return code, doc, "\n".join(lines)


def _audit_line(a: dict[str, Any] | None) -> str:
    if not a or "skipped" in a:
        return ""
    tr = a["transcriber"] or {"solved": "-", "tasks": "-"}
    hacks = f"  HACKED {a['hacks']}: {', '.join(a['hacked_tasks'][:3])}" if a["hacks"] else ""
    return (f"  audit {a['tasks_searched']}t/{a['sequences']}seq/{a['rewards']}rew/{a['hacks']}hacks"
            f"  transcriber {tr['solved']}/{tr['tasks']}{hacks}")


VERIFY = Command("run the verification suite", _verify_args, _verify_run,
                 "envfactory verify Bank-v0 Counter-v0\nenvfactory verify --all --json\n"
                 "envfactory verify FileSystem-v0 --runtime docker --audit")


# -- play: play, list and verify with scripted agents ----------------------------
def _play_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--only", nargs="+", default=[], metavar="NAME",
                   help="play only these environments (default: every registered one)")
    p.add_argument("--episodes", type=int, default=3, help="episodes per environment to play")
    p.add_argument("--no-verify", action="store_true", help="only play (no listing, no verification)")


def _play_run(args: argparse.Namespace) -> Result:
    """Play episodes of the built-in environments with scripted agents, printing each as it ends;
    then list and verify them. One environment at a time: its module is imported and its tasks built
    only when its turn comes, so the first episode is printed within seconds, not after the whole
    catalogue is built (``--json``: the document at the end, nothing else on stdout)."""
    from .. import make, spec
    from ..registry import names as all_names
    from ..checks.scripted import OraclePolicy, RandomPolicy, play

    start = time.perf_counter()
    streaming = not getattr(args, "json", False)
    out: list[str] = []

    def say(line: str) -> None:  # printed at once (the human form), or kept for nobody (--json)
        if streaming:
            try:
                sys.stdout.write(line + "\n")
                sys.stdout.flush()
            except BrokenPipeError:  # `envfactory play | head`
                pass
        else:
            out.append(line)

    chosen = list(args.only) or all_names()
    if args.only:
        _chosen(args.only)  # an unknown name: a usage error with the closest names, before any play
    played: list[dict[str, Any]] = []
    say("== episodes (scripted agents: the reference 'oracle' and a seeded 'random')")
    every = []
    for n, name in enumerate(chosen):
        try:
            s = spec(name)
        except Exception as exc:  # noqa: BLE001 - one broken module must not stop the tour
            say(f"{name:<16} not loaded: {exc}")
            continue
        every.append(s)
        if getattr(s, "multi_agent", False):
            continue
        env = make(s.name)
        try:
            for i, task in enumerate(s.get_tasks()[: args.episodes]):
                for agent, policy in (("oracle", OraclePolicy()), ("random", RandomPolicy())):
                    res = play(env, policy, task.id, seed=i)
                    played.append({"env": s.name, "task": task.id, "agent": agent, "reward": res.reward,
                                   "turns": res.turns})
                    say(f"{s.name:<16} {task.id:<12} {agent:<7} reward={res.reward:.0f} turns={res.turns}")
            if n == 0:
                say("   transcript of the last episode:")
                for m in env.transcript()[1:]:
                    say(f"   [{m['role']}] {str(m.get('content'))[:110]!r}")
        finally:
            env.close()
    summary: dict[str, Any] = {
        "episodes": played,
        "oracle_success": _mean(p["reward"] for p in played if p["agent"] == "oracle"),
        "random_success": _mean(p["reward"] for p in played if p["agent"] == "random"),
    }
    say(f"oracle success {summary['oracle_success']:.2f}, random success {summary['random_success']:.2f}, "
        f"{time.perf_counter() - start:.1f}s")
    ok = summary["oracle_success"] == 1.0
    if not args.no_verify:
        from ..checks.verify import verify_many
        from ..registry import listing

        rows = listing([s.name for s in every])  # the played ones are built here: no synthesis again
        summary["environments"] = rows
        say("== environments")
        for line in _list_lines(rows):
            say(line)
        with progress_bar(len(every), "verify", "env") as bar:
            doc = verify_many(every, on_report=lambda r: bar.update())
        t = doc["totals"]
        summary["verification"] = t
        say("== verification")
        say(f"{t['verified']}/{t['environments']} environments verified ({t['tasks']} tasks) in {t['seconds']:.1f}s")
        ok = ok and t["verified"] == t["environments"]
    summary["seconds"] = round(time.perf_counter() - start, 2)
    return (0 if ok else 1), summary, "\n".join(out) if not streaming else ""


def _mean(xs: Any) -> float:
    xs = list(xs)
    return sum(xs) / len(xs) if xs else 0.0


PLAY = Command("play the built-in environments with scripted agents (each episode printed as it ends), then "
               "list and verify them", _play_args, _play_run,
               "envfactory play\nenvfactory play --only FindLight-v0 Bank-v0 --episodes 1\n"
               "envfactory play --no-verify\nenvfactory play --episodes 1 --json")
