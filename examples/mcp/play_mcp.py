"""Play an envfactory environment from any MCP client: the official ``mcp`` SDK's stdio client
starts ``envfactory serve NAME --protocol mcp`` and plays each task's reference solution.

    python examples/mcp/play_mcp.py [Bank-v0] [--episodes 2]

Prints one JSON line per episode: the task, the reward and whether the episode ended.
"""

from __future__ import annotations

import argparse
import json
import sys

import anyio
from mcp import ClientSession, StdioServerParameters
from mcp.client.stdio import stdio_client

import envfactory


async def play(name: str, episodes: int) -> list[dict]:
    server = StdioServerParameters(command=sys.executable,
                                   args=["-m", "envfactory.cli", "serve", name, "--protocol", "mcp"])
    tasks = envfactory.spec(name).tasks_in("train")[:episodes]  # the server serves the train split
    out = []
    async with stdio_client(server) as (read, write):
        async with ClientSession(read, write) as session:
            await session.initialize()
            tools = {t.name for t in (await session.list_tools()).tools}
            for task in tasks:
                start = await session.call_tool("start_episode", {"task_id": task.id})
                meta = {}
                for call in task.solution:  # what an agent would decide from the instruction
                    assert call.name in tools
                    meta = (await session.call_tool(call.name, dict(call.arguments))).meta or {}
                if not meta.get("envfactory/done"):
                    answer = "Done. " + " ".join(task.answer_facts)
                    meta = (await session.call_tool("finish", {"answer": answer})).meta or {}
                out.append({"task": task.id, "instruction": start.content[0].text[:60],
                            "reward": meta.get("envfactory/reward"), "done": meta.get("envfactory/done")})
    return out


def main(argv: list[str] | None = None) -> list[dict]:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("env", nargs="?", default="Bank-v0")
    p.add_argument("--episodes", type=int, default=2)
    args = p.parse_args(argv)
    rows = anyio.run(play, args.env, args.episodes)
    for r in rows:
        print(json.dumps(r))
    return rows


if __name__ == "__main__":
    main()
