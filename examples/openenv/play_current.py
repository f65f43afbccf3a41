"""openenv 0.10's own clients play an envfactory OpenEnv server: ``GenericEnvClient`` (plain dicts
over the WebSocket) and ``MCPToolClient`` (tools over ``POST /mcp``, the episode over the WebSocket
that joins the same session), each a reference solution to reward 1.

    pip install 'openenv>=0.10,<0.11'        # in a venv of its own: it replaces openenv-core 0.3
    envfactory serve Counter-v0 --protocol openenv --port 8000 &
    python examples/openenv/play_current.py --url http://127.0.0.1:8000 Counter-v0

Without ``--url`` it starts the server in this process. Prints (and ``main`` returns) one JSON
document: each client's rewards, and what its tool errors looked like.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import sys
from typing import Any, Iterator

import envfactory


def _hermes(name: str, arguments: dict[str, Any]) -> str:
    return f'<tool_call>{json.dumps({"name": name, "arguments": arguments})}</tool_call>'


def play_generic(url: str, task: Any) -> dict[str, Any]:
    """The reference solution as Hermes text, one call a turn, then its ``finish`` call, or an
    answer without a call."""
    from openenv.core.generic_client import GenericEnvClient

    finish = next((c for c in task.solution if c.name == "finish"), None)
    with GenericEnvClient(base_url=url).sync() as env:
        first = env.reset(task_id=task.id)
        steps = [env.step({"text": _hermes(c.name, c.arguments)}) for c in task.solution if c is not finish]
        last = env.step({"text": _hermes(finish.name, finish.arguments) if finish else "Done."})
    return {"task": first.observation["task_id"], "reward": last.reward, "done": last.done,
            "outputs": [s.observation["text"] for s in steps]}


def play_mcp(url: str, task: Any) -> dict[str, Any]:
    """The reference solution one tool call a turn (``call_tool`` over ``/mcp``), then ``finish``
    as a ``CallToolAction`` step, whose observation carries the reward; a bad argument and an
    unknown tool in a second episode: both raised by ``call_tool``."""
    from openenv.core.env_server.mcp_types import CallToolAction
    from openenv.core.mcp_client import MCPToolClient

    finish = next((c for c in task.solution if c.name == "finish"), None)
    calls = [c for c in task.solution if c is not finish]
    with MCPToolClient(base_url=url).sync() as env:
        env.reset(task_id=task.id)
        tools = [t.name for t in env.list_tools()]
        outputs = [env.call_tool(c.name, **c.arguments) for c in calls]
        end = env.step(CallToolAction(tool_name="finish", arguments=finish.arguments if finish else {"answer": "Done."}))
        errors = []
        env.reset(task_id=task.id)
        for name, args in (calls[0].name, {k: {"not": "valid"} for k in calls[0].arguments} or {"bogus": 1}), \
                ("no_such_tool", {}):
            try:
                env.call_tool(name, **args)
                errors.append(None)
            except RuntimeError as exc:
                errors.append(str(exc))
    return {"task": task.id, "tools": tools, "outputs": outputs, "reward": end.reward, "done": end.done,
            "errors": errors}


@contextlib.contextmanager
def _server(name: str, url: str | None) -> Iterator[str]:
    if url:
        yield url
        return
    from envfactory.faces.openenv_server import BackgroundServer

    with BackgroundServer(name) as started:
        yield started


def main(argv: list[str] | None = None) -> dict[str, Any]:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("name", nargs="?", default="Counter-v0")
    p.add_argument("--url", help="a running `envfactory serve NAME --protocol openenv` (default: start one here)")
    args = p.parse_args(argv)
    spec = envfactory.spec(args.name)
    task = next(t for t in spec.tasks_in("train") if len(t.solution) >= 2 and not t.answer_facts)
    with _server(args.name, args.url) as url:
        out = {"env": spec.name, "generic": play_generic(url, task), "mcp": play_mcp(url, task)}
    print(json.dumps(out))
    return out


if __name__ == "__main__":
    main(sys.argv[1:])
