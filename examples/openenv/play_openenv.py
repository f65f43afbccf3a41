"""Play an envfactory environment through the OpenEnv protocol with openenv-core's own client.

    python examples/openenv/play_openenv.py Counter-v0 --episodes 4             # serves it here, on a thread
    envfactory serve Bank-v0 --protocol openenv --port 8000 &                   # or: a server elsewhere
    python examples/openenv/play_openenv.py Bank-v0 --url http://127.0.0.1:8000

Each episode plays a task's reference solution as Hermes tool-call text (one call a turn, then a
final answer) with ``openenv.core.generic_client.GenericEnvClient`` -- no envfactory code on the
client's side -- and compares the reward with ``envfactory.make(NAME)`` given the same actions.
"""

from __future__ import annotations

import argparse
import contextlib
import json
from typing import Any

from openenv.core.generic_client import GenericEnvClient

import envfactory


def _actions(task: Any) -> list[dict[str, str]]:
    calls = [{"text": "<tool_call>" + json.dumps({"name": c.name, "arguments": c.arguments}) + "</tool_call>"}
             for c in task.solution]
    answer = "Done. " + " ".join(task.answer_facts) if task.answer_facts else "Done."
    return calls + [{"text": answer}]


def main(argv: list[str] | None = None) -> dict[str, Any]:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("name", nargs="?", default="Counter-v0")
    ap.add_argument("--url", default=None, help="a running server (default: serve NAME here, on a free port)")
    ap.add_argument("--episodes", type=int, default=4)
    args = ap.parse_args(argv)

    tasks = envfactory.spec(args.name).tasks_in("train")[: args.episodes]  # a server serves the train split
    rewards, local_rewards = [], []
    with contextlib.ExitStack() as stack:
        url = args.url
        if url is None:
            from envfactory.faces.openenv_server import BackgroundServer

            url = stack.enter_context(BackgroundServer(args.name))
        env = stack.enter_context(GenericEnvClient(base_url=url).sync())
        for task in tasks:
            obs = env.reset(task_id=task.id).observation
            print(f"[{task.id}] {obs['instruction']}")
            for action in _actions(task):
                result = env.step(action)
                print(f"  > {action['text'][:80]}\n  < {result.observation['text'][:80]!r} "
                      f"reward={result.reward} done={result.done}")
                if result.done:
                    break
            rewards.append(result.reward)
            ep = envfactory.make(args.name)  # the same actions in process
            ep.reset(task.id)
            for action in _actions(task):
                r = ep.step(action["text"])
                if r.terminated or r.truncated:
                    break
            local_rewards.append(r.reward)
    out = {"env": args.name, "episodes": len(tasks), "rewards": rewards, "local_rewards": local_rewards}
    print(json.dumps(out))
    return out


if __name__ == "__main__":
    main()
