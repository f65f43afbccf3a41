"""verifiers' own classes play envfactory episodes: envfactory's verifiers environment, a scripted model.

The environment is ``vf.load_environment`` on envfactory's taskset: ``envfactory.faces.verifiers``
by default, or ``--taskset ID`` (an exported package: ``envfactory export NAME --verifiers DIR``,
``pip install DIR``, taskset id ``envfactory-counter-v0``). Its episodes run as verifiers runs them
(``env.serving()``, ``env.run_episode(task, ctx)``): the taskset's harness calls the model through
verifiers' interception server, which relays each request to the model's endpoint, here a scripted
OpenAI-compatible chat-completions server on loopback standing in for the policy.

A rollout names its ``task`` and, optionally, its ``turns``, each the model's reply: a text (Hermes
``<tool_call>`` blocks in it become the reply's native ``tool_calls``, any other text its content)
or ``{"tool_calls": [{"name": ..., "arguments": "<raw JSON text>"}]}`` (arguments sent exactly as
written, malformed ones included; optionally ``content`` and ``reasoning_content``). Without
``turns``: the task's reference solution, one call a turn, then "Done.". Printed: one JSON list, per
rollout its ``reward``, ``rewards``, ``metrics``, ``envfactory`` (the episode's result),
``tool_messages`` (what the model was shown), ``branches`` (verifiers' trace: 1 when every request
extended the one before, so the episode is one training sample) and ``errors``.
Run it with a Python that has verifiers 0.4 and envfactory's dependencies, the repository on its
path::

    PYTHONPATH=. /path/to/verifiers-venv/bin/python examples/verifiers/rollout.py Counter-v0 \\
        --rollouts '[{"task": "counter-0-1"}]'

``--vf-eval N`` runs verifiers' own command line instead, ``vf-eval TASKSET -n N`` (an installed
package's taskset id; no dashboard, nothing pushed) against the scripted model, which plays each
task's reference solution (it knows the task by its instruction); printed: per episode of the run's
``traces.jsonl``, its ``task``, ``reward``, ``ok`` and ``metrics``.
"""

import argparse
import asyncio
import glob
import json
import os
import subprocess
import sys
import tempfile
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import verifiers.v1 as vf

import envfactory
from envfactory.faces.verifiers import TASKSET_ID, load_environment

HOST = "127.0.0.1"


def reference_turns(name: str, task_id: str) -> list[Any]:
    """The task's reference solution as model replies: one native tool call a turn, then an answer."""
    calls = envfactory.spec(name).task(task_id).solution
    return [{"tool_calls": [{"name": c.name, "arguments": json.dumps(c.arguments)}]} for c in calls] + ["Done."]


def reply(turn: Any, k: int) -> dict[str, Any]:
    """A script entry as a chat-completions assistant message."""
    reasoning = None
    if isinstance(turn, dict):
        calls = turn.get("tool_calls") or []
        content = turn.get("content")
        reasoning = turn.get("reasoning_content")
    else:
        parsed = envfactory.parse_action(turn)
        calls = [{"name": c.name, "arguments": json.dumps(c.arguments)} for c in parsed.calls]
        content = parsed.content if not calls else None
    message: dict[str, Any] = {"role": "assistant", "content": content}
    if reasoning is not None:  # as vLLM's reasoning parsers add it
        message["reasoning_content"] = reasoning
    if calls:
        message["tool_calls"] = [{"id": f"call_{k}_{n}", "type": "function",
                                  "function": {"name": c["name"], "arguments": c["arguments"]}}
                                 for n, c in enumerate(calls)]
    return message


class ScriptedModel:
    """An OpenAI-compatible ``POST /v1/chat/completions``: turn ``k`` of a conversation (``k``: its
    assistant messages so far) is ``script[k]``; past the script, "Done."."""

    def __init__(self, scripts: dict[str, list[Any]] | None = None) -> None:
        self.script: list[Any] = []
        self.scripts = scripts or {}  # a conversation's script by its first user message, where one is named
        self.requests: list[dict[str, Any]] = []
        model = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # noqa: N802 (http.server's name)
                body = json.loads(self.rfile.read(int(self.headers.get("content-length") or 0)))
                model.requests.append(body)
                messages = body.get("messages", [])
                k = sum(1 for m in messages if m.get("role") == "assistant")
                first = next((m.get("content") for m in messages if m.get("role") == "user"), None)
                script = model.scripts.get(first, model.script) if isinstance(first, str) else model.script
                message = reply(script[k] if k < len(script) else "Done.", k)
                out = json.dumps({
                    "id": f"chatcmpl-{len(model.requests)}", "object": "chat.completion", "created": int(time.time()),
                    "model": body.get("model", "scripted"),
                    "choices": [{"index": 0, "message": message, "logprobs": None,
                                 "finish_reason": "tool_calls" if message.get("tool_calls") else "stop"}],
                    "usage": {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2}}).encode()
                self.send_response(200)
                self.send_header("content-type", "application/json")
                self.send_header("content-length", str(len(out)))
                self.end_headers()
                self.wfile.write(out)

            def log_message(self, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer((HOST, 0), Handler)
        threading.Thread(target=self.server.serve_forever, daemon=True).start()
        self.base_url = f"http://{HOST}:{self.server.server_address[1]}/v1"

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


async def play(name: str, rollouts: list[dict[str, Any]], taskset: str = TASKSET_ID) -> list[dict[str, Any]]:
    wanted = sorted({r["task"] for r in rollouts})
    if taskset == TASKSET_ID:
        env = load_environment(name, split="all", tasks=wanted)
    else:  # an exported package: its own environment, the tasks named
        env = vf.load_environment(vf.resolve_env_config({"taskset": {"id": taskset, "split": "all",
                                                                      "tasks": wanted}}))
    tasks = {t.data.task_id: t for t in env.taskset}
    model = ScriptedModel()
    ctx = vf.ModelContext(model="scripted", client=vf.EvalClientConfig(base_url=model.base_url,
                                                                        api_key_var="SCRIPTED_MODEL_KEY"))
    out = []
    try:
        async with env.serving():
            for r in rollouts:
                model.script = r.get("turns") or reference_turns(name, r["task"])
                episode = await env.run_episode(tasks[r["task"]], ctx)
                trace = episode.traces[0]
                out.append({"task": r["task"], "env": type(env).__name__, "harness": trace.agent.config.harness.id
                            if trace.agent and trace.agent.config.harness else None,
                            "reward": trace.reward, "ok": episode.ok,
                            "rewards": {k: v.value if v is not None else None for k, v in trace.rewards.items()},
                            "metrics": dict(trace.metrics), "envfactory": trace.info.get("envfactory"),
                            "tool_messages": [m.content for m in trace.tool_messages],
                            "assistant_turns": len(trace.assistant_messages),
                            "branches": trace.num_branches,  # 1: every request extended the one before
                            "errors": [e.message for e in (*episode.errors, *trace.errors)]})
    finally:
        model.close()
    return out


def vf_eval(name: str, taskset: str, n: int) -> list[dict[str, Any]]:
    """``vf-eval TASKSET -n N`` against the scripted model playing reference solutions; the episodes it wrote."""
    s = envfactory.spec(name)
    model = ScriptedModel({t.instruction: reference_turns(name, t.id) for t in s.get_tasks()})
    try:
        with tempfile.TemporaryDirectory() as out:
            r = subprocess.run([os.path.join(os.path.dirname(sys.executable), "vf-eval"), taskset, "-n", str(n),
                                "--model", "scripted", "--client.base-url", model.base_url,
                                "--client.api-key-var", "SCRIPTED_MODEL_KEY", "--no-push", "--no-rich",
                                "--output-dir", out], capture_output=True, text=True, timeout=600)
            if r.returncode != 0:
                raise RuntimeError(f"vf-eval exited {r.returncode}: {r.stderr[-3000:]}")
            rows = []
            for path in sorted(glob.glob(os.path.join(out, "*", "traces.jsonl"))):
                with open(path) as f:
                    for line in f:
                        episode = json.loads(line)
                        trace = episode["traces"][0]
                        rows.append({"task": episode["task"]["data"]["id"], "ok": episode["ok"],
                                     "reward": sum(r["score"] * r["weight"] for r in trace["rewards"].values() if r),
                                     "metrics": trace["metrics"], "errors": episode["errors"]})
    finally:
        model.close()
    return rows


def main(argv: list[str] | None = None) -> list[dict[str, Any]]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("name", help="an envfactory environment, e.g. Counter-v0")
    parser.add_argument("--rollouts", help='JSON list of {"task": ID, "turns": [...]}')
    parser.add_argument("--taskset", default=TASKSET_ID, help="the verifiers taskset id (an exported package's)")
    parser.add_argument("--vf-eval", type=int, metavar="N", help="run vf-eval TASKSET -n N instead of --rollouts")
    args = parser.parse_args(argv)
    if args.vf_eval:
        rows = vf_eval(args.name, args.taskset, args.vf_eval)
    elif args.rollouts:
        rows = asyncio.run(play(args.name, json.loads(args.rollouts), args.taskset))
    else:
        parser.error("give --rollouts or --vf-eval N")
    print(json.dumps(rows, default=str))
    return rows


if __name__ == "__main__":
    main()
