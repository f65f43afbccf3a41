"""An agent of the OpenAI Agents SDK (``pip install openai-agents``) playing one envfactory task.

The model is whatever serves the Responses API at ``--base-url`` (in training, the endpoint over the
policy: ``Trainer.train_agent_loop``); the environment is ``envfactory serve NAME --protocol mcp``,
started by the SDK as an MCP server with ``--envfactory-python``. The agent's tools are the
environment's (the episode's control tools stay out of its sight); the episode is started and ended
here, and the reward the server reports is printed as JSON.

The SDK's import name is ``agents``, as is envfactory's training package: run this script with a
Python that has the SDK and not envfactory's repository on its path (its own virtual environment,
the script's folder as the working directory), e.g.
``/path/to/sdk-venv/bin/python play.py --base-url URL --envfactory-python "$(which python)" --env Counter-v0 --task counter-0-1``.
"""

from __future__ import annotations

import argparse
import asyncio
import json

from agents import Agent, OpenAIResponsesModel, Runner, set_tracing_disabled
from agents.exceptions import MaxTurnsExceeded, ModelBehaviorError
from agents.mcp import MCPServerStdio, create_static_tool_filter
from openai import AsyncOpenAI

CONTROL = {"start_episode", "end_episode", "list_tasks", "episode_status"}


async def play(base_url: str, python: str, env: str, task: str, max_turns: int) -> float:
    set_tracing_disabled(True)
    params = {"command": python, "args": ["-m", "envfactory.cli", "serve", env, "--protocol", "mcp"]}
    async with MCPServerStdio(params=params, client_session_timeout_seconds=120) as server:  # type: ignore[arg-type]
        start = await server.call_tool("start_episode", {"task_id": task})
        info = getattr(start, "structured_content", None) or json.loads(start.content[0].text)
        names = [t.name for t in await server.list_tools() if t.name not in CONTROL]
        server.tool_filter = create_static_tool_filter(allowed_tool_names=names)
        model = OpenAIResponsesModel("envfactory-policy", AsyncOpenAI(base_url=base_url, api_key="unused"))
        agent = Agent(name="player", instructions=info["system_prompt"], model=model, mcp_servers=[server])
        try:
            answer = (await Runner.run(agent, info["instruction"], max_turns=max_turns)).final_output
        except (MaxTurnsExceeded, ModelBehaviorError):  # out of turns, or an answer cut at max_output_tokens
            answer = ""  # (the SDK raises on an incomplete response): the episode ends unanswered
        end = await server.call_tool("end_episode", {"answer": str(answer or "")})
        return float(end.meta["envfactory/reward"])


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--base-url", required=True)
    p.add_argument("--envfactory-python", required=True, help="the Python that has envfactory installed")
    p.add_argument("--env", required=True)
    p.add_argument("--task", required=True)
    p.add_argument("--max-turns", type=int, default=4)
    a = p.parse_args()
    print(json.dumps({"reward": asyncio.run(play(a.base_url, a.envfactory_python, a.env, a.task, a.max_turns))}))


if __name__ == "__main__":
    main()
