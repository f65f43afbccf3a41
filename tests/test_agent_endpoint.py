"""Any agent loop trainable: an unchanged openai-SDK loop talks to agents.harness.endpoint.ChatEndpoint,
which serves the policy being trained and records exactly what it sampled; the Trainer trains on
those records (Trainer.train_agent_loop). Uses the embedded tiny model; ~30 s on 2 cores."""

from __future__ import annotations

import itertools
import json
import socket

import pytest

torch = pytest.importorskip("torch")
openai = pytest.importorskip("openai")
httpx = pytest.importorskip("httpx")

import envfactory  # noqa: E402
from agents.algorithms.objectives import GRPO  # noqa: E402
from agents.harness.endpoint import ChatEndpoint  # noqa: E402
from agents.policies.hf_policy import HFPolicy  # noqa: E402
from agents.policies.policy import sampling_stats  # noqa: E402
from agents.rollout import rollout  # noqa: E402
from agents.policies.scripted_model import ScriptedModel  # noqa: E402
from agents.models.tiny import build_tiny_model  # noqa: E402
from agents.train_config import OptimConfig, OutputConfig, SamplingConfig, TrainerConfig  # noqa: E402
from agents.trainer import Trainer  # noqa: E402

TASK = "counter-0-1"


@pytest.fixture(scope="module")
def hf() -> HFPolicy:
    torch.manual_seed(0)
    return HFPolicy(build_tiny_model(), device="cpu")


def agent_loop(base_url: str, env) -> None:
    """A plain agent loop over the openai SDK, as a user writes it: nothing envfactory-specific
    but the environment it runs the tool calls on."""
    client = openai.OpenAI(base_url=base_url, api_key="unused")
    messages = list(env.transcript())
    while not env.done:
        reply = client.chat.completions.create(model="any-model", messages=messages, tools=env.tool_schemas())
        messages.append(reply.choices[0].message.model_dump(exclude_none=True))
        messages += env.step(messages[-1]).messages


def _counter(max_turns: int = 3):
    env = envfactory.make("Counter-v0", max_turns=max_turns)
    env.reset(TASK)
    return env


def test_the_openai_sdk_gets_an_openai_shaped_answer_with_the_sampled_ids(hf: HFPolicy) -> None:
    env = _counter()
    with ChatEndpoint(hf, max_tokens=16) as ep:
        client = openai.OpenAI(base_url=ep.session_url("one"), api_key="unused")
        assert [m.id for m in client.models.list().data] == [ep.model]
        reply = client.chat.completions.create(model="gpt-4o", messages=list(env.transcript()),
                                               tools=env.tool_schemas(), max_tokens=16, temperature=0.7,
                                               logprobs=True)
    choice = reply.choices[0]
    assert choice.message.role == "assistant" and choice.finish_reason in ("stop", "length", "tool_calls")
    ext = reply.model_extra["envfactory"]
    assert reply.usage.completion_tokens == len(ext["completion_token_ids"]) <= 16
    assert [c.logprob for c in choice.logprobs.content] == ext["logprobs"]
    # the prompt is the chat template's rendering of messages + tools, as a rollout's opening
    [ro] = rollout(ScriptedModel(hf.tokenizer, lambda p, t: "done"), [(_counter(), TASK)], max_new_tokens=4)
    assert ext["prompt_token_ids"] == ro.trajectory.prompt_ids
    [call] = ep.session("one").calls
    assert call.completion_ids == ext["completion_token_ids"] and call.temperature == 0.7


def test_recorded_ids_and_logprobs_are_the_sampled_ones(hf: HFPolicy) -> None:
    env = _counter()
    with ChatEndpoint(hf, max_tokens=12) as ep:
        client = openai.OpenAI(base_url=ep.base_url, api_key="unused")
        replies = [client.chat.completions.create(model="m", messages=list(env.transcript()), tools=env.tool_schemas(),
                                                  temperature=0.8, top_p=0.9, seed=s, user="u") for s in (1, 1, 2)]
    exts = [r.model_extra["envfactory"] for r in replies]
    assert exts[0]["completion_token_ids"] == exts[1]["completion_token_ids"]  # the seed is honoured
    direct = hf.generate([exts[0]["prompt_token_ids"]], max_new_tokens=12, temperature=0.8, top_p=0.9, seed=1)[0]
    assert direct.token_ids == exts[0]["completion_token_ids"]
    calls = ep.session("u").calls  # the `user` field names the session on the plain URL
    assert len(calls) == 3
    for ext, call in zip(exts, calls):
        prompt, ids = ext["prompt_token_ids"], ext["completion_token_ids"]
        assert (call.prompt_ids, call.completion_ids, call.logprobs) == (prompt, ids, ext["logprobs"])
        with torch.no_grad():  # re-scored under the model: the recorded log-probs
            logits = hf.model(torch.tensor([prompt + ids])).logits[0, len(prompt) - 1:-1]
        logp, _ = sampling_stats(logits, 0.8, 0.9)
        rescored = logp.gather(1, torch.tensor(ids)[:, None]).squeeze(1)
        assert torch.allclose(rescored, torch.tensor(call.logprobs), atol=1e-4)


def test_a_multi_call_episode_records_the_trajectory_a_rollout_records(hf: HFPolicy) -> None:
    call = '<tool_call>{"name": "increment", "arguments": {"by": 1}}</tool_call>'
    scripted = ScriptedModel(hf.tokenizer, lambda p, turn: call if turn == 0 else "The counter shows 1.")
    [ro] = rollout(scripted, [(_counter(), TASK)], max_new_tokens=32)
    assert ro.success
    env = _counter()
    with ChatEndpoint(scripted, max_tokens=32) as ep:
        agent_loop(ep.session_url("ep"), env)
        [traj] = ep.session("ep").trajectories(env_name="Counter-v0", task_id=TASK, reward=1.0)
        first = ep.session("ep").calls[0]
    assert env.success and first.message["tool_calls"][0]["function"]["name"] == "increment"
    assert first.message["content"] is None
    want = ro.trajectory
    # token for token: the second call's prompt extends the first call's ids, never re-tokenized
    assert traj.prompt_ids == want.prompt_ids
    assert traj.response_ids == want.response_ids and traj.loss_mask == want.loss_mask
    assert traj.turns == 2 and traj.reward == 1.0


def test_an_unchanged_openai_loop_trains_for_two_steps(hf: HFPolicy, tmp_path) -> None:
    from agents.trajectories import load_trajectories

    cfg = TrainerConfig(algorithm=GRPO(M=4), tasks=[TASK], seed=1,
                        sampling=SamplingConfig(max_new_tokens=16, max_turns=2, temperature=1.0),
                        optim=OptimConfig(lr=1e-3, tasks_per_step=1),
                        output=OutputConfig(show_progress=False, dir=str(tmp_path), save_trajectories=True))
    tr = Trainer(hf, ["Counter-v0"], cfg)
    runs_seen = itertools.count()
    tr.reward_fn = lambda t: float(next(runs_seen) % 4 == 0)  # one winner in each group of 4 runs
    before = [p.detach().clone() for p in tr.model.parameters()]
    rows = tr.train_agent_loop(agent_loop, steps=2)
    assert [r["step"] for r in rows] == [1, 2] and all(r["errors"] == 0 and r["episodes"] == 4 for r in rows)
    assert any(not torch.equal(a, b) for a, b in zip(before, tr.model.parameters()))
    runs = tr.last_runs
    assert all(r.reward == 0.0 for r in runs)  # the environment's reward: the tiny model fails the task
    trained = tr.last_samples["agent_0"]
    recorded = [t.prompt_ids + t.response_ids for r in runs for t in r.trajectories]
    # what was trained on is exactly what the endpoint recorded, the winner's tokens pushed up
    assert [s.ids for s in trained] == recorded and len(trained) == 4
    assert [s.advantages[0] > 0 for s in trained] == [True, False, False, False]
    assert all(len(s.advantages) == len(s.mask) == len(s.old_logprobs) for s in trained)
    saved = load_trajectories(tmp_path / "trajectories.jsonl")  # both steps' runs, as train() writes them
    assert len(saved) == 8 and [t.prompt_ids + t.response_ids for t in saved[4:]] == recorded


def test_the_environment_reward_scores_a_run(hf: HFPolicy) -> None:
    from agents.harness.agent_loop import run_agent_loop

    call = '<tool_call>{"name": "increment", "arguments": {"by": 1}}</tool_call>'
    scripted = ScriptedModel(hf.tokenizer, lambda p, turn: call if turn == 0 else "Done.")
    wrong = ScriptedModel(hf.tokenizer, lambda p, turn: "Done.")
    for policy, reward in ((scripted, 1.0), (wrong, 0.0)):
        with ChatEndpoint(policy, max_tokens=32) as ep:
            runs = run_agent_loop(agent_loop, ep, [(_counter(), TASK)], 2)
        assert [r.reward for r in runs] == [reward, reward] and all(r.error is None for r in runs)
        assert all(t.reward == reward for r in runs for t in r.trajectories)
        assert ep.sessions == {}  # each run's session was taken

    def scored_by_the_loop(base_url, env):  # e.g. a loop that plays through MCP and reads the reward there
        agent_loop(base_url, env)
        return 0.25

    with ChatEndpoint(wrong, max_tokens=32) as ep:
        runs = run_agent_loop(scored_by_the_loop, ep, [(_counter(), TASK)], 2)
    assert [r.reward for r in runs] == [0.25, 0.25] and [len(r.trajectories) for r in runs] == [1, 1]


@pytest.mark.parametrize("body, status", [
    (b"{not json", 400),
    (b"[1, 2]", 400),
    (json.dumps({"model": "m"}).encode(), 400),
    (json.dumps({"model": "m", "messages": []}).encode(), 400),
    (json.dumps({"model": "m", "messages": [{"role": "wizard", "content": "x"}]}).encode(), 400),
    (json.dumps({"model": "m", "messages": [{"role": "user", "content": 5}]}).encode(), 400),
    (json.dumps({"model": "m", "messages": ["hi"]}).encode(), 400),
    (json.dumps({"model": "m", "messages": [{"role": "user", "content": "x"}], "max_tokens": -3}).encode(), 400),
    (json.dumps({"model": "m", "messages": [{"role": "user", "content": "x"}], "temperature": "hot"}).encode(), 400),
    (json.dumps({"model": "m", "messages": [{"role": "user", "content": "x"}], "stream": True, "n": 2}).encode(),
     400),  # a streamed request that cannot be served: a JSON error, not an event stream
    (json.dumps({"model": "m", "messages": [{"role": "user", "content": "x"}], "tools": "all"}).encode(), 400),
    (json.dumps({"model": "m", "messages": [{"role": "user", "content": "x"}], "tools": [{"name": 1}]}).encode(), 400),
    (json.dumps({"model": "m", "messages": [{"role": "user", "content": "x"}], "n": 2}).encode(), 400),
    (json.dumps({"model": "m", "messages": [{"role": "assistant", "content": "",
                                              "tool_calls": [{"function": 3}]}]}).encode(), 400),
])
def test_malformed_requests_get_a_4xx_json_error(hf: HFPolicy, body: bytes, status: int) -> None:
    with ChatEndpoint(hf, max_tokens=4) as ep:
        r = httpx.post(ep.base_url + "/chat/completions", content=body,
                       headers={"content-type": "application/json"})
        assert r.status_code == status, r.text
        assert isinstance(r.json()["error"]["message"], str) and "Traceback" not in r.text
        # the server is still there for a good request
        ok = httpx.post(ep.base_url + "/chat/completions",
                        json={"model": "m", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2})
        assert ok.status_code == 200


def test_unknown_routes_and_huge_bodies_are_refused(hf: HFPolicy) -> None:
    with ChatEndpoint(hf, max_tokens=4) as ep:
        assert httpx.get(ep.base_url + "/nothing").status_code == 404
        assert httpx.post(ep.base_url.replace("/v1", "") + "/other", json={}).status_code == 404
        r = httpx.post(ep.base_url + "/chat/completions", content=b"x" * (5 << 20))
        assert r.status_code == 413 and "error" in r.json()
        with socket.create_connection((ep.host, ep.port), timeout=30) as sock:  # httpx will not send this
            sock.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Length: -5\r\n\r\n{}")
            head = b"".join(iter(lambda: sock.recv(65536), b"")).decode()  # the server closes after it
        assert head.startswith("HTTP/1.1 400") and "Content-Length must be" in head
        with pytest.raises(openai.BadRequestError):
            openai.OpenAI(base_url=ep.base_url, api_key="x").chat.completions.create(
                model="m", messages=[{"role": "user", "content": "hi"}], stop=["\n"])


def test_a_loop_that_plays_through_mcp_is_recorded_and_scored(hf: HFPolicy) -> None:
    """The loop holds no environment: it plays `envfactory serve --protocol mcp` with the mcp SDK,
    and returns the reward the server reports."""
    import sys

    import anyio
    from conftest import require_module

    require_module("mcp", "pip install 'envfactory[mcp]' (scripts/setup.sh installs it)")
    from mcp import ClientSession, StdioServerParameters
    from mcp.client.stdio import stdio_client

    from agents.harness.agent_loop import run_agent_loop

    async def play(base_url: str, task_id: str) -> float:
        server = StdioServerParameters(command=sys.executable,
                                       args=["-m", "envfactory.cli", "serve", "Counter-v0", "--protocol", "mcp"])
        client = openai.AsyncOpenAI(base_url=base_url, api_key="unused")
        async with stdio_client(server) as (read, write), ClientSession(read, write) as mcp:
            await mcp.initialize()
            start = (await mcp.call_tool("start_episode", {"task_id": task_id})).structured_content
            tools = [{"type": "function", "function": {"name": t.name, "description": t.description or "",
                                                       "parameters": t.input_schema}}
                     for t in (await mcp.list_tools()).tools if t.name in {"increment", "finish"}]
            messages = [{"role": "system", "content": start["system_prompt"]},
                        {"role": "user", "content": start["instruction"]}]
            for _ in range(3):
                reply = (await client.chat.completions.create(model="m", messages=messages, tools=tools)).choices[0]
                messages.append(reply.message.model_dump(exclude_none=True))
                if not reply.message.tool_calls:
                    meta = (await mcp.call_tool("end_episode", {"answer": reply.message.content or ""})).meta
                    return float(meta["envfactory/reward"])
                for c in reply.message.tool_calls:
                    out = await mcp.call_tool(c.function.name, json.loads(c.function.arguments))
                    messages.append({"role": "tool", "tool_call_id": c.id, "content": out.content[0].text})
        return 0.0

    call = '<tool_call>{"name": "increment", "arguments": {"by": 1}}</tool_call>'
    scripted = ScriptedModel(hf.tokenizer, lambda p, turn: call if turn == 0 else "The counter shows 1.")
    with ChatEndpoint(scripted, max_tokens=32) as ep:
        [run] = run_agent_loop(lambda url, env: anyio.run(play, url, env.task.id), ep, [(_counter(), TASK)], 1)
    assert run.error is None and run.reward == 1.0
    [traj] = run.trajectories  # both calls in one chain: the second continued the first's ids
    assert traj.turns == 2 and traj.tool_calls == 1 and traj.reward == 1.0
    assert sum(traj.loss_mask) == sum(b - a for a, b in traj.turn_spans)
