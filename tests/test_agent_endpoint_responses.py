"""The endpoint's Responses API and streaming (agents.harness.responses): the openai SDK's own
``client.responses.create`` (what the OpenAI Agents SDK calls by default) and streamed calls get
OpenAI-shaped answers, recorded and chained token-in/token-out exactly as chat completions are, so a
Responses loop trains unchanged. Uses the embedded tiny model."""

from __future__ import annotations

import json

import pytest

torch = pytest.importorskip("torch")
openai = pytest.importorskip("openai")
httpx = pytest.importorskip("httpx")

import envfactory  # noqa: E402
from agents.harness.chat_calls import RequestError  # noqa: E402
from agents.harness.endpoint import ChatEndpoint  # noqa: E402
from agents.harness.responses import responses_request_as_chat  # noqa: E402
from agents.models.tiny import build_tiny_model  # noqa: E402
from agents.policies.hf_policy import HFPolicy  # noqa: E402
from agents.policies.scripted_model import ScriptedModel  # noqa: E402
from agents.rollout import rollout  # noqa: E402

TASK = "counter-0-1"
CALL = '<tool_call>{"name": "increment", "arguments": {"by": 1}}</tool_call>'


@pytest.fixture(scope="module")
def hf() -> HFPolicy:
    torch.manual_seed(0)
    return HFPolicy(build_tiny_model(), device="cpu")


def _counter(max_turns: int = 3):
    env = envfactory.make("Counter-v0", max_turns=max_turns)
    env.reset(TASK)
    return env


def _responses_tools(env) -> list[dict]:
    """The environment's tools in the Responses API's flat shape."""
    return [{"type": "function", "name": s["function"]["name"], "description": s["function"]["description"],
             "parameters": s["function"]["parameters"]} for s in env.tool_schemas()]


def responses_loop(base_url: str, env, previous: bool = False) -> None:
    """An agent loop over ``client.responses.create`` as the Agents SDK runs one: the system prompt as
    ``instructions``, the conversation as input items (the model's ``function_call`` items and the
    tools' ``function_call_output`` items); with ``previous``, only the new items and the last id."""
    client = openai.OpenAI(base_url=base_url, api_key="unused")
    system, *rest = env.transcript()
    items: list = [{"role": m["role"], "content": m["content"]} for m in rest]
    last = None
    while not env.done:
        resp = client.responses.create(model="any", instructions=system["content"], tools=_responses_tools(env),
                                       input=items, **({"previous_response_id": last} if last else {}))
        out = [o.model_dump(exclude_none=True) for o in resp.output]
        calls = [o for o in out if o["type"] == "function_call"]
        text = "".join(c["text"] for o in out if o["type"] == "message" for c in o["content"])
        if calls:
            action = {"role": "assistant", "content": text or None, "tool_calls": [
                {"id": c["call_id"], "type": "function", "function": {"name": c["name"], "arguments": c["arguments"]}}
                for c in calls]}
        else:
            action = {"role": "assistant", "content": text}
        results = env.step(action).messages
        new = [{"type": "function_call_output", "call_id": c["call_id"], "output": m["content"]}
               for c, m in zip(calls, [m for m in results if m["role"] == "tool"])]
        if previous:
            items, last = new, resp.id
        else:
            items = items + out + new


@pytest.mark.parametrize("previous", [False, True], ids=["whole-input", "previous_response_id"])
def test_a_responses_loop_records_the_trajectory_a_rollout_records(hf: HFPolicy, previous: bool) -> None:
    scripted = ScriptedModel(hf.tokenizer, lambda p, turn: CALL if turn == 0 else "The counter shows 1.")
    [ro] = rollout(scripted, [(_counter(), TASK)], max_new_tokens=32)
    env = _counter()
    with ChatEndpoint(scripted, max_tokens=32) as ep:
        responses_loop(ep.session_url("ep"), env, previous=previous)
        [traj] = ep.session("ep").trajectories(env_name="Counter-v0", task_id=TASK, reward=1.0)
        calls = ep.session("ep").calls
    assert env.success and len(calls) == 2 and calls[1].parent is calls[0]
    want = ro.trajectory  # token for token: the second call extends the first's ids, never re-tokenized
    assert traj.prompt_ids == want.prompt_ids
    assert traj.response_ids == want.response_ids and traj.loss_mask == want.loss_mask


def test_the_sdk_reads_an_openai_shaped_response_with_the_sampled_ids(hf: HFPolicy) -> None:
    env = _counter()
    with ChatEndpoint(hf, max_tokens=16) as ep:
        client = openai.OpenAI(base_url=ep.session_url("one"), api_key="unused")
        system, *rest = env.transcript()
        resp = client.responses.create(model="m", instructions=system["content"], input=rest[0]["content"],
                                       tools=_responses_tools(env), max_output_tokens=16, temperature=0.7,
                                       extra_body={"seed": 3})
        [call] = ep.session("one").calls
    ext = resp.model_extra["envfactory"]
    assert resp.object == "response" and resp.status in ("completed", "incomplete")
    assert ext["completion_token_ids"] == call.completion_ids and ext["prompt_token_ids"] == call.prompt_ids
    assert resp.usage.output_tokens == len(call.completion_ids) and resp.usage.input_tokens == len(call.prompt_ids)
    assert call.temperature == 0.7
    # the same prompt a chat completion of the same messages renders
    assert call.messages == [{"role": "system", "content": system["content"]}, {"role": "user", "content": rest[0]["content"]}]
    text = "".join(c.text for o in resp.output if o.type == "message" for c in o.content)
    assert text == call.message["content"] or any(o.type == "function_call" for o in resp.output)


def test_streamed_answers_are_the_whole_answers_in_events(hf: HFPolicy) -> None:
    env = _counter()
    msgs = list(env.transcript())
    with ChatEndpoint(hf, max_tokens=16) as ep:
        client = openai.OpenAI(base_url=ep.base_url, api_key="unused")
        whole = client.chat.completions.create(model="m", messages=msgs, tools=env.tool_schemas(), seed=5)
        chunks = list(client.chat.completions.create(model="m", messages=msgs, tools=env.tool_schemas(), seed=5,
                                                     stream=True, stream_options={"include_usage": True}))
        resp = client.responses.create(model="m", input=msgs[1]["content"], instructions=msgs[0]["content"], extra_body={"seed": 5})
        events = list(client.responses.create(model="m", input=msgs[1]["content"],
                                              instructions=msgs[0]["content"], extra_body={"seed": 5},
                                              stream=True))
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    args = "".join(t.function.arguments or "" for c in chunks if c.choices for t in c.choices[0].delta.tool_calls or ())
    message = whole.choices[0].message
    assert text == (message.content or "")
    assert args == "".join(t.function.arguments for t in message.tool_calls or ())
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == whole.choices[0].finish_reason
    assert chunks[-1].usage.completion_tokens == whole.usage.completion_tokens  # include_usage: the last chunk
    kinds = [e.type for e in events]
    assert kinds[0] == "response.created" and kinds[-1] in ("response.completed", "response.incomplete")
    final = events[-1].response
    assert [o.model_dump() for o in final.output][0]["type"] == resp.output[0].type
    assert final.model_extra["envfactory"]["completion_token_ids"] == resp.model_extra["envfactory"]["completion_token_ids"]
    deltas = "".join(e.delta for e in events if e.type == "response.output_text.delta")
    assert deltas == "".join(c.text for o in final.output if o.type == "message" for c in o.content)


def test_input_items_become_the_chat_messages_they_stand_for() -> None:
    body = {"instructions": "Be brief.", "input": [
        {"role": "user", "content": [{"type": "input_text", "text": "Add one."}]},
        {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "Sure."}]},
        {"type": "function_call", "call_id": "c1", "name": "increment", "arguments": '{"by": 1}'},
        {"type": "function_call", "call_id": "c2", "name": "increment", "arguments": '{"by": 2}'},
        {"type": "reasoning", "summary": []},
        {"type": "function_call_output", "call_id": "c1", "output": "1"},
        {"type": "function_call_output", "call_id": "c2", "output": [{"type": "input_text", "text": "3"}]},
        {"role": "developer", "content": "Now stop."}],
        "tools": [{"type": "function", "name": "increment", "parameters": {"type": "object"}}],
        "max_output_tokens": 8, "user": "u1"}
    chat = responses_request_as_chat(body)
    assert chat["messages"] == [
        {"role": "system", "content": "Be brief."}, {"role": "user", "content": "Add one."},
        {"role": "assistant", "content": "Sure.", "tool_calls": [
            {"id": "c1", "type": "function", "function": {"name": "increment", "arguments": '{"by": 1}'}},
            {"id": "c2", "type": "function", "function": {"name": "increment", "arguments": '{"by": 2}'}}]},
        {"role": "tool", "tool_call_id": "c1", "content": "1", "name": "increment"},
        {"role": "tool", "tool_call_id": "c2", "content": "3", "name": "increment"},
        {"role": "system", "content": "Now stop."}]
    assert chat["tools"] == [{"type": "function", "function": {"name": "increment", "parameters": {"type": "object"}}}]
    assert (chat["max_tokens"], chat["user"]) == (8, "u1")


@pytest.mark.parametrize("body, status, param", [
    ({"input": "hi", "tools": [{"type": "web_search"}]}, 400, "tools[0]"),
    ({"input": [{"type": "input_image", "image_url": "x"}]}, 400, "input[0]"),
    ({"input": [{"role": "user", "content": [{"type": "input_file", "file_id": "f"}]}]}, 400, "input[0].content"),
    ({"input": "hi", "tool_choice": "required"}, 400, "tool_choice"),
    ({"input": "hi", "text": {"format": {"type": "json_schema", "schema": {}}}}, 400, "text.format"),
    ({"input": "hi", "previous_response_id": "resp_nope"}, 404, "previous_response_id"),
    ({"input": 7}, 400, "input"),
    ({"input": [{"type": "function_call", "name": "f"}]}, 400, "input[0]"),
])
def test_what_cannot_be_served_is_a_named_openai_error(hf: HFPolicy, body: dict, status: int, param: str) -> None:
    with ChatEndpoint(hf, max_tokens=4) as ep:
        r = httpx.post(ep.base_url + "/responses", content=json.dumps(body), timeout=30)
        assert r.status_code == status and r.json()["error"]["param"] == param, r.text
        with pytest.raises(RequestError):
            ep.respond(body)


def test_store_false_is_not_kept_and_the_store_is_bounded(hf: HFPolicy, monkeypatch) -> None:
    import agents.harness.endpoint as endpoint

    monkeypatch.setattr(endpoint, "STORED", 2)
    with ChatEndpoint(hf, max_tokens=2) as ep:
        kept = [ep.respond({"input": f"hi {i}"})["id"] for i in range(3)]
        gone = ep.respond({"input": "x", "store": False})["id"]
        assert list(ep._stored) == kept[1:]
        for rid, code in ((kept[0], 404), (gone, 404), (kept[2], 200)):
            r = httpx.post(ep.base_url + "/responses", json={"input": "more", "previous_response_id": rid}, timeout=30)
            assert r.status_code == code, r.text


def test_a_continuation_keeps_the_stored_conversation_and_takes_only_its_own_instructions() -> None:
    stored = [{"role": "system", "content": "A developer note."}, {"role": "user", "content": "Add one."},
              {"role": "assistant", "content": "Done."}]
    chat = responses_request_as_chat({"instructions": "New rules.", "input": "And again."}, stored)
    assert chat["messages"] == [{"role": "system", "content": "New rules."}, *stored,
                                {"role": "user", "content": "And again."}]
