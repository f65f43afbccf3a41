"""The factory's commands: ``envfactory generate`` and ``envfactory tasks synth``."""

from __future__ import annotations

import argparse
import collections
import os
import sys

from . import Command, CommandError, Result, examples_epilog



# -- generate --------------------------------------------------------------
def _generate_args(p: argparse.ArgumentParser) -> None:
    src = p.add_mutually_exclusive_group(required=True)
    src.add_argument("--from-prompt", metavar="TEXT", help="describe the environment in words")
    src.add_argument("--from-spec", metavar="FILE", help="a YAML/JSON spec file to build and verify")
    p.add_argument("--llm-url", help="OpenAI-compatible base URL, e.g. http://localhost:8000/v1")
    p.add_argument("--model", help="model name sent to the endpoint")
    p.add_argument("--api-key", default=None, help="bearer token (default: $OPENAI_API_KEY)")
    p.add_argument("--max-rounds", type=int, default=3, help="answers at most (first + repairs)")
    p.add_argument("--min-tasks", type=int, default=5, help="fewest tasks a module must ship")
    p.add_argument("--out", default="generated", help="folder for accepted modules")
    p.add_argument("--timeout", type=float, default=120.0, help="sandbox timeout per round (s)")
    p.add_argument("--docker-image", default=None, help="verify inside this image (no network)")


def _generate_run(args: argparse.Namespace) -> Result:
    if args.from_spec:
        from ..checks.verify import verify_spec
        from ..episode import Episode
        from ..factory.from_spec import from_spec

        try:
            spec = from_spec(args.from_spec)
        except Exception as exc:  # noqa: BLE001 - whatever the file got wrong, say it
            msg = str(exc)  # a SpecError names the file already; anything else gets its name
            raise CommandError(msg if msg.startswith(str(args.from_spec)) else f"{args.from_spec}: {msg}") from None
        rep = verify_spec(spec, make_env=lambda: Episode(spec)).to_json()
        text = f"{'PASS' if rep['verified'] else 'FAIL'}  {spec.name}: {rep['tasks']} tasks" + "".join(
            f"\n      {f['check']}: {f['detail']}" for f in rep["failures"][:10])
        return (0 if rep["verified"] else 1), rep, text
    if not args.llm_url or not args.model:
        raise CommandError("--from-prompt needs --llm-url and --model (any OpenAI-compatible endpoint)")
    from ..factory.from_prompt import LLMError, generate_from_prompt
    from ..factory.sandbox import SandboxLimits

    try:
        res = generate_from_prompt(
            args.from_prompt, llm_url=args.llm_url, model=args.model, out_dir=args.out,
            max_rounds=args.max_rounds, api_key=args.api_key or os.environ.get("OPENAI_API_KEY"),
            min_tasks=args.min_tasks, limits=SandboxLimits(timeout_s=args.timeout),
            docker_image=args.docker_image)
    except LLMError as exc:
        raise CommandError(str(exc)) from None
    lines = []
    for r in res.rounds:
        lines.append(f"round {r['round']}: {'PASS' if r['ok'] else 'FAIL'}"
                     + (f"  {r['error'].splitlines()[0]}" if r.get("error") else ""))
        for f in r["failures"][:5]:
            lines.append(f"      {f['check']}{' [' + f['task'] + ']' if f.get('task') else ''}: "
                         f"{f['detail']}")
    lines.append(f"accepted {res.name} -> {res.module_path}" if res.accepted else
                 f"rejected: no answer passed verification in {len(res.rounds)} rounds; nothing kept")
    return (0 if res.accepted else 1), res.to_json(), "\n".join(lines)


# -- tasks synth -------------------------------------------------------------
def _tasks_args(p: argparse.ArgumentParser) -> None:
    sub = p.add_subparsers(dest="tasks_command", required=True, metavar="ACTION")
    s = sub.add_parser("synth", help="synthesize tasks by walking an environment's tools",
                       epilog=examples_epilog(_SYNTH_EXAMPLE), formatter_class=argparse.RawDescriptionHelpFormatter)
    s.add_argument("--json", action="store_true", help="machine-readable output on stdout")
    s.add_argument("name", help="registered environment, e.g. Library-v0")
    s.add_argument("--n", type=int, default=20, help="number of tasks")
    s.add_argument("--seed", type=int, default=0, help="seed (same seed, same tasks)")
    s.add_argument("--out", default=None, help="also write the tasks to this JSON file")
    s.add_argument("--difficulty", type=int, default=None,
                   help="1-5: draw goal-level tasks from the family's task supply at this difficulty "
                        "(envfactory.task_supply) instead of step-by-step walks")
    s.add_argument("--kinds", default=None, help="with --difficulty: only these kinds, comma separated")


def _tasks_run(args: argparse.Namespace) -> Result:
    import json

    from .. import spec as get_spec
    from ..factory.tasks.success import ChangeCheck
    from ..factory.tasks.synthesis import synthesize_for

    try:
        spec = get_spec(args.name)
    except KeyError as exc:
        raise CommandError(str(exc.args[0])) from None
    if args.n < 1:
        raise CommandError(f"--n must be 1 or more (got {args.n})")
    if args.difficulty is not None:
        import itertools

        from ..registry import task_supply

        try:
            kinds = args.kinds.split(",") if args.kinds else None
            tasks = list(itertools.islice(task_supply(spec.name, args.difficulty, args.seed, kinds), args.n))
        except (ValueError, RuntimeError) as exc:
            raise CommandError(str(exc)) from None
    else:
        tasks = synthesize_for(spec, n=args.n, seed=args.seed)
    docs = []
    for t in tasks:
        d = t.describe()
        d["check"] = t.check.describe() if isinstance(t.check, ChangeCheck) else None
        d["initial_state_hash"] = t.initial_state.hash()
        d["kind"] = t.kind
        docs.append(d)
    if args.out:
        with open(args.out, "w") as fh:
            json.dump(docs, fh, indent=2)
    levels = collections.Counter(t.difficulty for t in tasks)
    lines = [f"{d['id']:<18} L{d['difficulty']}  {d['instruction'].splitlines()[0][:90]}" for d in docs]
    lines.append(f"{len(tasks)} tasks for {spec.name} (seed {args.seed}); by difficulty: "
                 + ", ".join(f"L{k}={v}" for k, v in sorted(levels.items())))
    if len(tasks) < args.n:  # the tasks found are the output; the shortfall is said on stderr, exit 1
        print(f"envfactory tasks: error: {len(tasks)} of the {args.n} tasks asked for could be synthesized "
              f"for {spec.name}", file=sys.stderr, flush=True)
        return 1, docs, "\n".join(lines)
    return 0, docs, "\n".join(lines)


GENERATE = Command("build and verify an environment from a prompt (LLM) or a spec file", _generate_args,
                   _generate_run,
                   "envfactory generate --from-spec environments/specs/calendar.yaml\n"
                   "envfactory generate --from-prompt 'a thermostat with a schedule' "
                   "--llm-url http://localhost:8000/v1 --model qwen")
_SYNTH_EXAMPLE = ("envfactory tasks synth Library-v0 --n 20 --seed 0\n"
                  "envfactory tasks synth Loans-v0 --difficulty 4 --kinds lookup,user --json")
TASKS = Command("task tools: 'tasks synth NAME --n N --seed S'", _tasks_args, _tasks_run, _SYNTH_EXAMPLE)
