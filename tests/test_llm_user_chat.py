"""The LLM user over a chat-only endpoint (``/v1/chat/completions``, no tokenizer): a fake chat
server on loopback plays the user of a real episode; a failing endpoint is an observation."""

from __future__ import annotations

import json
import re
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Iterator

import pytest

import envfactory
from agents.policies.openai_policy import OpenAIChat, ServerError
from agents.policies.users import LLMUser
from envfactory.checks.scripted import OraclePolicy, play
from envfactory.users import user_facts

ENV = "RetailOrders-v1"


class _ChatServer(ThreadingHTTPServer):
    """Answers ``POST /v1/chat/completions`` like a model told the user's facts: each fact the last
    question names, from the facts listed in the system message. ``status`` forces an HTTP error."""

    requests: list[dict[str, Any]]
    status = 200


class _Handler(BaseHTTPRequestHandler):
    server: _ChatServer

    def do_POST(self) -> None:  # noqa: N802 (http.server's name)
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        self.server.requests.append({"path": self.path, "auth": self.headers.get("Authorization"), "body": body})
        if self.server.status != 200:
            self._send(self.server.status, {"error": {"message": "the model is overloaded"}})
            return
        if self.path != "/v1/chat/completions":  # another route answers 200, but no completion
            self._send(200, {"object": "list", "data": []})
            return
        system, question = body["messages"][0]["content"], body["messages"][-1]["content"].lower()
        facts = dict(re.findall(r"^- ([^:\n]+): (.+)$", system, re.M))
        told = [f"my {k} is {v}" for k, v in facts.items() if k.split()[-1] in question]
        reply = ("Sure, " + " and ".join(told) + ".") if told else "Hmm, I am not sure what you mean."
        self._send(200, {"id": "c1", "object": "chat.completion", "model": body["model"],
                         "choices": [{"index": 0, "finish_reason": "stop",
                                      "message": {"role": "assistant", "content": reply}}]})

    def _send(self, status: int, doc: dict[str, Any]) -> None:
        data = json.dumps(doc).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, *args: Any) -> None:
        pass


@pytest.fixture()
def chat_server() -> Iterator[_ChatServer]:
    server = _ChatServer(("127.0.0.1", 0), _Handler)
    server.requests = []
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield server
    finally:
        server.shutdown()
        server.server_close()


def _url(server: _ChatServer) -> str:
    return f"http://127.0.0.1:{server.server_address[1]}"


def _user_task() -> Any:
    return next(t for t in envfactory.spec(ENV).get_tasks() if t.metadata.get("kind") == "user")


def test_a_chat_endpoint_plays_the_user_of_an_episode(chat_server: _ChatServer) -> None:
    task = _user_task()
    user = LLMUser.from_chat(_url(chat_server), "user-model", api_key="k", temperature=0.0)
    ep = envfactory.make(ENV, user=user)
    out = play(ep, OraclePolicy(), task.id)
    assert out.success, out
    asked = [c for c in task.solution if c.name == "ask_user"]
    assert len(chat_server.requests) == len(asked) >= 2  # every ask_user went to the endpoint, nothing else
    first, second = (r["body"] for r in chat_server.requests[:2])
    assert {r["path"] for r in chat_server.requests} == {"/v1/chat/completions"}
    assert {r["auth"] for r in chat_server.requests} == {"Bearer k"} and first["model"] == "user-model"
    facts = user_facts(task.initial_state)  # the facts (the persona and goal are told too)
    assert all(f"- {k}: {v}" in first["messages"][0]["content"] for k, v in facts.items())
    assert first["messages"][-1] == {"role": "user", "content": asked[0].arguments["question"]}
    # the second request carries the first question and the endpoint's own reply as history
    assert [m["role"] for m in second["messages"]] == ["system", "user", "assistant", "user"]
    assert second["messages"][2]["content"] == f"Sure, my name is {facts['name']}."
    replies = [m["content"] for m in ep.transcript(ep.agents[0]) if m["role"] == "tool"]
    assert f"Sure, my name is {facts['name']}." in replies  # the agent saw the endpoint's text
    ep.close()


@pytest.mark.parametrize("how", ["http_error", "unreachable", "not_a_completion"])
def test_a_failing_chat_endpoint_is_an_error_observation(chat_server: _ChatServer, how: str) -> None:
    task = _user_task()
    if how == "http_error":
        chat_server.status = 503
        url = _url(chat_server)
    elif how == "unreachable":
        url = "http://127.0.0.1:9"  # discard port: nothing listens
    else:
        url = _url(chat_server) + "/v1/models/chat/completions"  # 200, but no completion
    ep = envfactory.make(ENV, user=LLMUser.from_chat(url, "user-model", timeout=5.0))
    ep.reset(task=task.id)
    r = ep.step('<tool_call>{"name": "ask_user", "arguments": {"question": "What is your name?"}}</tool_call>')
    text = r.messages[0]["content"]
    assert text.startswith("Error: the user did not answer (ServerError:") and not r.done, text
    assert {"http_error": "answered 503", "unreachable": "ConnectError",
            "not_a_completion": "chat/completions"}[how] in text
    ep.close()


def test_the_chat_client_names_what_went_wrong() -> None:
    import httpx

    def app(request: httpx.Request) -> httpx.Response:
        body = json.loads(request.content)
        if body["messages"][-1]["content"] == "null":
            return httpx.Response(200, json={"choices": [{"message": {"role": "assistant", "content": None}}]})
        return httpx.Response(200, json={"choices": [{"message": {"role": "assistant", "content": " hi "}}]})

    for base in ("http://x", "http://x/v1", "http://x/v1/chat/completions"):
        assert OpenAIChat(base, "m").url == "http://x/v1/chat/completions"
    chat = OpenAIChat("http://x", "m", transport=httpx.MockTransport(app))
    assert chat.complete([{"role": "user", "content": "hello"}]) == " hi "
    with pytest.raises(ServerError, match="without text"):
        chat.complete([{"role": "user", "content": "null"}])
    user = LLMUser(chat, temperature=0.0)
    assert user("hello", {"name": "Kim"}, []) == "hi"
