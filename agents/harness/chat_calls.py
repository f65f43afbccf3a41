"""What a chat endpoint records: the calls it served, chained into trajectories.

A :class:`Call` is one chat completion: the request's messages (in the form the chat template
renders), the exact prompt ids, the sampled ids and their log-probs. Calls of one
:class:`Session` form chains: a call whose messages extend an earlier call's messages and the
assistant message that call returned continues it (its prompt starts with that call's prompt and
sampled ids). :func:`chain_trajectory` makes a chain the :class:`~agents.rollout.Trajectory` the
trainer learns from. Also here: reading OpenAI-format messages (:func:`template_messages`,
:class:`RequestError` for what cannot be read) and writing the model's text as an OpenAI
assistant message (:func:`assistant_message`).
"""

from __future__ import annotations

import hashlib
import json
import uuid
from dataclasses import dataclass, field
from typing import Any

from envfactory.parsing import parse_text

from agents.rollout import Trajectory

__all__ = ["Call", "Session", "RequestError", "chain_trajectory", "template_messages", "message_as_template",
           "assistant_message", "chain_key"]

_ROLES = ("system", "user", "assistant", "tool")


class RequestError(ValueError):
    """A request the endpoint refuses: ``status`` (4xx), the message and the offending ``param``."""

    def __init__(self, message: str, status: int = 400, param: str | None = None) -> None:
        super().__init__(message)
        self.status, self.param = status, param

    def body(self) -> dict[str, Any]:
        kind = "invalid_request_error" if self.status < 500 else "server_error"
        return {"error": {"message": str(self), "type": kind, "param": self.param, "code": None}}


@dataclass
class Call:
    """One served chat completion: what was asked, the exact ids sampled and their log-probs."""

    id: str
    parent: "Call | None"
    messages: list[dict[str, Any]]
    """The request's messages in template form (tool-call arguments as JSON strings)."""
    tools: list[dict[str, Any]]
    prompt_ids: list[int]
    completion_ids: list[int]
    logprobs: list[float]
    entropies: list[float]
    finish_reason: str
    text: str
    """The model's text (without a sampled turn-ending stop token): what the template renders."""
    closing: str
    """The template's turn-closing markup still owed after ``completion_ids``."""
    message: dict[str, Any]
    """The assistant message returned to the client."""
    temperature: float
    closing_ids: list[int] = field(default_factory=list)
    """``closing`` as ids (what a trajectory ending with this call ends with)."""
    children: int = 0


@dataclass
class Session:
    """The calls one client (one episode of an agent loop) made, grouped into chains."""

    name: str
    calls: list[Call] = field(default_factory=list)
    _index: dict[str, list[Call]] = field(default_factory=dict, repr=False)

    def chains(self) -> list[list[Call]]:
        """Each chain of calls (root to a call no later call extended), in the order they ended."""
        return [_lineage(c) for c in self.calls if c.children == 0]

    def trajectories(self, *, env_name: str = "", task_id: str = "", reward: float = 0.0,
                     success: bool = False) -> list[Trajectory]:
        """A :class:`~agents.rollout.Trajectory` per chain: the first call's prompt, then every
        call's sampled ids (loss mask 1, their log-probs) with what came between them inserted
        (loss mask 0), all with ``reward``."""
        return [chain_trajectory(ch, env_name=env_name, task_id=task_id, reward=reward, success=success)
                for ch in self.chains()]


def _lineage(call: Call) -> list[Call]:
    out = []
    c: Call | None = call
    while c is not None:
        out.append(c)
        c = c.parent
    return out[::-1]


def chain_trajectory(chain: list[Call], *, env_name: str = "", task_id: str = "", reward: float = 0.0,
                     success: bool = False) -> Trajectory:
    """The trajectory of one chain of calls (each extends the one before)."""
    first, last = chain[0], chain[-1]
    t = Trajectory(env_name=env_name, task_id=task_id, prompt_ids=list(first.prompt_ids), tools=last.tools,
                   reward=reward, success=success, terminated=True)
    seq = list(first.prompt_ids)
    for c in chain:
        if c.prompt_ids[:len(seq)] != seq:  # an invariant of how calls are chained
            raise RuntimeError(f"call {c.id} does not extend its parent's ids")
        t._insert(c.prompt_ids[len(seq):])
        begin = len(t.response_ids)
        t.response_ids += c.completion_ids
        t.loss_mask += [1] * len(c.completion_ids)
        t.logprobs += c.logprobs
        t.entropies += c.entropies
        t.turn_spans.append((begin, len(t.response_ids)))
        t.turns += 1
        t.tool_calls += len(c.message.get("tool_calls") or ())
        seq = c.prompt_ids + c.completion_ids
    t._insert(last.closing_ids)  # the last turn's closing markup, as a rollout's trajectory ends
    t.messages = [*last.messages, {"role": "assistant", "content": last.text}]
    return t


# -- messages ---------------------------------------------------------------------
def _content(m: dict[str, Any], i: int) -> str:
    c = m.get("content")
    if c is None:
        return ""
    if isinstance(c, str):
        return c
    if isinstance(c, list):  # content parts: only text can be rendered
        parts = []
        for p in c:
            if not isinstance(p, dict) or p.get("type") != "text" or not isinstance(p.get("text"), str):
                raise RequestError(f"messages[{i}].content: only text parts are supported", param=f"messages[{i}]")
            parts.append(p["text"])
        return "".join(parts)
    raise RequestError(f"messages[{i}].content must be a string or a list of text parts",
                       param=f"messages[{i}].content")


def _tool_calls(m: dict[str, Any], i: int) -> list[dict[str, Any]]:
    raw = m.get("tool_calls") or []
    if not isinstance(raw, list):
        raise RequestError(f"messages[{i}].tool_calls must be a list", param=f"messages[{i}].tool_calls")
    out = []
    for j, c in enumerate(raw):
        f = c.get("function") if isinstance(c, dict) else None
        if not isinstance(f, dict) or not isinstance(f.get("name"), str):
            raise RequestError(f"messages[{i}].tool_calls[{j}] needs function.name",
                               param=f"messages[{i}].tool_calls")
        args = f.get("arguments", "{}")
        if not isinstance(args, str):
            try:
                args = json.dumps(args)
            except (TypeError, ValueError) as exc:
                raise RequestError(f"messages[{i}].tool_calls[{j}].function.arguments: {exc}",
                                   param=f"messages[{i}].tool_calls") from None
        out.append({"id": str(c.get("id") or f"call_{j}"), "type": "function",
                    "function": {"name": f["name"], "arguments": args}})
    return out


def template_messages(messages: Any) -> list[dict[str, Any]]:
    """The request's messages in the form the chat template renders (and calls are matched by)."""
    if not isinstance(messages, list) or not messages:
        raise RequestError("messages must be a non-empty list of message objects", param="messages")
    out = []
    for i, m in enumerate(messages):
        if not isinstance(m, dict):
            raise RequestError(f"messages[{i}] must be an object", param=f"messages[{i}]")
        role = m.get("role")
        if role == "developer":
            role = "system"
        if role not in _ROLES:
            raise RequestError(f"messages[{i}].role must be one of {', '.join(_ROLES)}, not {role!r}",
                               param=f"messages[{i}].role")
        msg: dict[str, Any] = {"role": role, "content": _content(m, i)}
        if role == "assistant" and m.get("tool_calls"):
            msg["tool_calls"] = _tool_calls(m, i)
        if role == "tool":
            for k in ("tool_call_id", "name"):
                if isinstance(m.get(k), str):
                    msg[k] = m[k]
        out.append(msg)
    return out


def _canonical(m: dict[str, Any]) -> Any:
    """What makes two messages the same for chaining (tool-call ids and argument spacing aside)."""
    calls = []
    for c in m.get("tool_calls") or ():
        try:
            args = json.loads(c["function"]["arguments"])
        except ValueError:
            args = c["function"]["arguments"]
        calls.append([c["function"]["name"], args])
    return [m["role"], m["content"].strip() if m["role"] == "assistant" else m["content"], calls,
            m.get("tool_call_id", "")]


def chain_key(tools: list[dict[str, Any]], messages: list[dict[str, Any]]) -> str:
    doc = json.dumps([tools, [_canonical(m) for m in messages]], sort_keys=True, default=str)
    return hashlib.sha256(doc.encode()).hexdigest()


def assistant_message(text: str, calls_seen: int) -> tuple[dict[str, Any], bool]:
    """The OpenAI assistant message of the model's text, and whether it calls tools."""
    parsed = parse_text(text)
    if not parsed.calls or parsed.errors:  # no calls, or malformed ones: the text as it is
        return {"role": "assistant", "content": text}, False
    rest, i = [], 0
    while True:  # the text outside the <tool_call> blocks
        j = text.find("<tool_call>", i)
        if j < 0:
            rest.append(text[i:])
            break
        rest.append(text[i:j])
        k = text.find("</tool_call>", j)
        i = len(text) if k < 0 else k + len("</tool_call>")
    content = "".join(rest).strip() or None
    calls = [{"id": f"call_{calls_seen + n}_{uuid.uuid4().hex[:8]}", "type": "function",
              "function": {"name": c.name, "arguments": json.dumps(c.arguments)}}
             for n, c in enumerate(parsed.calls)]
    return {"role": "assistant", "content": content, "tool_calls": calls}, True


def message_as_template(message: dict[str, Any]) -> dict[str, Any]:
    """A returned assistant message as :func:`template_messages` gives it back when a client resends it."""
    return template_messages([message])[0]
