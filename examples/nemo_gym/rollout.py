"""NeMo Gym's own agent plays envfactory episodes through envfactory's NeMo Gym resources server.

Three NeMo Gym servers on loopback, in one event loop, as NeMo Gym's launcher wires them:

* the resources server: ``envfactory.faces.nemo_gym.resources_server_class()`` (a
  ``SimpleResourcesServer``), config ``env_name: NAME``;
* a model server: a ``SimpleResponsesAPIModel`` that answers ``/v1/responses`` from a script of
  turns (each a model text: Hermes ``<tool_call>`` blocks become ``function_call`` output items, any
  other text the final assistant message), standing in for the policy;
* NeMo Gym's ``SimpleAgent`` (``responses_api_agents.simple_agent``): ``/run`` seeds the resources
  server's session with the dataset row, loops model and tools, then calls ``/verify``.

Each rollout's row comes from ``nemo_gym_rows``; ``POST /run`` goes through NeMo Gym's
``ServerClient``. Printed: one JSON list, per rollout its verify response (``reward``, ``success``,
...) and the tool outputs the model was shown. Run it with a Python that has nemo-gym (0.4, Python
3.12 or newer) and envfactory's dependencies, the repository on its path::

    PYTHONPATH=. /path/to/nemo-gym-venv/bin/python examples/nemo_gym/rollout.py Counter-v0 \\
        --rollouts '[{"task": "counter-0-2"}]'      # no "turns": the task's reference solution
"""

import argparse
import asyncio
import json
import socket
import time
from typing import Any

import uvicorn
from omegaconf import OmegaConf

import envfactory
from envfactory.checks.scripted import OraclePolicy
from envfactory.faces.nemo_gym import nemo_gym_rows, resources_server_class
from nemo_gym.base_responses_api_model import BaseResponsesAPIModelConfig, SimpleResponsesAPIModel
from nemo_gym.config_types import BaseServerConfig, ModelServerRef, ResourcesServerRef
from nemo_gym.openai_utils import NeMoGymResponse, NeMoGymResponseCreateParamsNonStreaming
from nemo_gym.server_utils import (GlobalAIOHTTPAsyncClientConfig, ServerClient, get_response_json,
                                   is_global_aiohttp_client_setup, set_global_aiohttp_client)
from responses_api_agents.simple_agent.app import SimpleAgent, SimpleAgentConfig

HOST = "127.0.0.1"


class ScriptedModel(SimpleResponsesAPIModel):
    """A NeMo Gym model server answering from a script (the rollouts run one at a time): turn
    ``k`` of the conversation (``k``: the number of its earlier turns in the input, each a run of
    ``function_call`` items) is ``script[k]``; past the script, "Done."."""

    script: list[str] = []

    async def chat_completions(self, body: Any = None) -> Any:
        raise NotImplementedError("the scripted model speaks the Responses API only")

    async def responses(self, body: NeMoGymResponseCreateParamsNonStreaming) -> NeMoGymResponse:
        items = [i if isinstance(i, dict) else i.model_dump() for i in body.input]
        kinds = [i.get("type") for i in items]
        turn = sum(1 for k, before in zip(kinds, [None, *kinds]) if k == "function_call" and before != k)
        parsed = envfactory.parse_action(self.script[turn] if turn < len(self.script) else "Done.")
        output: list[dict[str, Any]] = []
        for n, call in enumerate(parsed.calls):
            output.append({"type": "function_call", "id": f"fc_{turn}_{n}", "call_id": f"call_{turn}_{n}",
                           "name": call.name, "arguments": json.dumps(call.arguments), "status": "completed"})
        if not output:
            output.append({"type": "message", "id": f"msg_{turn}", "role": "assistant", "status": "completed",
                           "content": [{"type": "output_text", "text": parsed.content, "annotations": []}]})
        return NeMoGymResponse.model_validate({
            "id": f"resp_{turn}", "created_at": time.time(), "model": "scripted", "object": "response",
            "output": output, "parallel_tool_calls": False, "tool_choice": "auto", "tools": []})


def _socket() -> socket.socket:
    s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    s.bind((HOST, 0))
    return s


async def play(name: str, rollouts: list[dict[str, Any]]) -> list[dict[str, Any]]:
    if not is_global_aiohttp_client_setup():
        set_global_aiohttp_client(GlobalAIOHTTPAsyncClientConfig())  # NeMo Gym's client, in this loop
    socks = {k: _socket() for k in ("envfactory", "policy", "agent")}
    port = {k: s.getsockname()[1] for k, s in socks.items()}
    where = {"envfactory": ("resources_servers", "envfactory"), "policy": ("responses_api_models", "scripted"),
             "agent": ("responses_api_agents", "simple_agent")}
    client = ServerClient(head_server_config=BaseServerConfig(host=HOST, port=0), global_config_dict=OmegaConf.create(
        {k: {kind: {entry: {"host": HOST, "port": port[k]}}} for k, (kind, entry) in where.items()}))

    spec = envfactory.spec(name)
    rows = {r["task_id"]: r for r in nemo_gym_rows(name, split="all", tasks=[r["task"] for r in rollouts])}

    Server: Any = resources_server_class()
    resources = Server(config=Server.model_fields["config"].annotation(
        host=HOST, port=port["envfactory"], entrypoint="", name="envfactory", env_name=name, split="all"),
        server_client=client)
    model = ScriptedModel(config=BaseResponsesAPIModelConfig(host=HOST, port=port["policy"], entrypoint="",
                                                             name="policy"), server_client=client)
    agent = SimpleAgent(config=SimpleAgentConfig(
        host=HOST, port=port["agent"], entrypoint="", name="agent", max_steps=20,
        resources_server=ResourcesServerRef(type="resources_servers", name="envfactory"),
        model_server=ModelServerRef(type="responses_api_models", name="policy")), server_client=client)
    servers = {k: uvicorn.Server(uvicorn.Config(s.setup_webserver(), log_level="warning", lifespan="off"))
               for k, s in (("envfactory", resources), ("policy", model), ("agent", agent))}
    tasks = [asyncio.create_task(servers[k].serve(sockets=[socks[k]])) for k in servers]
    try:
        while not all(s.started for s in servers.values()):
            await asyncio.sleep(0.02)
        out = []
        for r in rollouts:
            model.script = r.get("turns") or OraclePolicy.actions(spec.task(r["task"]))
            response = await client.post(server_name="agent", url_path="/run", json=rows[r["task"]])
            body = await get_response_json(response)
            if response.status != 200:
                out.append({"task": r["task"], "status": response.status, "body": body})
                continue
            shown = [i["output"] for i in body["response"]["output"] if i.get("type") == "function_call_output"]
            out.append({"task": r["task"], "status": 200, "reward": body["reward"], "success": body["success"],
                        "ended_by": body["ended_by"], "turns": body["turns"], "tool_errors": body["tool_errors"],
                        "tool_outputs": shown})
        return out
    finally:
        for s in servers.values():
            s.should_exit = True
        await asyncio.gather(*tasks, return_exceptions=True)
        resources.service.close()


def main(argv: list[str] | None = None) -> list[dict[str, Any]]:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("env", help="a registered single-agent environment, e.g. Counter-v0")
    p.add_argument("--rollouts", required=True,
                   help='JSON list of {"task": id, "turns": [model text, ...]} (no turns: the reference solution)')
    a = p.parse_args(argv)
    out = asyncio.run(play(a.env, json.loads(a.rollouts)))
    print(json.dumps(out))
    return out


if __name__ == "__main__":
    main()
