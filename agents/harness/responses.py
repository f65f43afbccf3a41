"""OpenAI's Responses API and streaming over :class:`~agents.harness.endpoint.ChatEndpoint`.

The endpoint samples chat completions; an agent built on the OpenAI Agents SDK (whose default model
calls ``client.responses.create``) or on a streaming client talks another shape of the same thing.
This module translates, and nothing else: a ``/v1/responses`` request becomes the chat request it
stands for (``instructions`` a system message, ``input`` items messages: a ``function_call`` item
an assistant tool call, a ``function_call_output`` a tool message; consecutive ones one assistant
message, as the chat template renders them), is served by :meth:`ChatEndpoint.complete` (so it is
recorded, chained token-in/token-out and trained on exactly as a chat call), and its answer is
written back as a Response (a ``message`` item with ``output_text``, a ``function_call`` item per
tool call, the ``envfactory`` ids beside). ``previous_response_id`` continues a stored response's
conversation (the endpoint keeps the last :data:`STORED` responses unless ``store`` is false).

Streaming (``stream: true``, on either route) answers as Server-Sent Events in the order and shape
OpenAI's clients parse (chat: ``chat.completion.chunk`` deltas, ``usage`` with
``stream_options.include_usage``, then ``[DONE]``; Responses: ``response.created`` ... the item and
part events ... ``response.completed``). The policy samples a whole turn in one batch, so the events
are written together once it is sampled: a client streams unchanged, but sees no token before the
turn is done.
"""

from __future__ import annotations

import json
import uuid
from typing import Any, Iterator

from agents.harness.chat_calls import RequestError

__all__ = ["responses_request_as_chat", "chat_as_response", "chat_stream_events", "response_stream_events",
           "sse", "STORED"]

STORED = 1024  # responses kept for ``previous_response_id`` (the oldest forgotten first)


def _text_parts(content: Any, where: str, kinds: tuple[str, ...]) -> str:
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        out = []
        for p in content:
            if not isinstance(p, dict) or p.get("type") not in kinds or not isinstance(p.get("text"), str):
                raise RequestError(f"{where}: only text content parts ({', '.join(kinds)}) are supported", param=where)
            out.append(p["text"])
        return "".join(out)
    raise RequestError(f"{where} must be a string or a list of text parts", param=where)


def _input_messages(items: Any) -> list[dict[str, Any]]:
    """The chat messages a Responses ``input`` stands for."""
    if isinstance(items, str):
        return [{"role": "user", "content": items}]
    if not isinstance(items, list):
        raise RequestError("input must be a string or a list of input items", param="input")
    out: list[dict[str, Any]] = []
    names: dict[str, str] = {}  # call_id -> the function's name (a tool message carries it)
    for i, item in enumerate(items):
        where = f"input[{i}]"
        if not isinstance(item, dict):
            raise RequestError(f"{where} must be an object", param=where)
        kind = item.get("type", "message" if "role" in item else None)
        if kind == "message":
            role = item.get("role")
            if role == "developer":
                role = "system"
            if role not in ("system", "user", "assistant"):
                raise RequestError(f"{where}.role must be user, system, developer or assistant, not {role!r}",
                                   param=f"{where}.role")
            kinds = ("output_text", "input_text", "text", "refusal") if role == "assistant" else ("input_text", "text")
            if role == "assistant" and isinstance(item.get("content"), list):
                content = "".join(p.get("text") or p.get("refusal") or "" for p in item["content"]
                                  if isinstance(p, dict) and p.get("type") in kinds)
            else:
                content = _text_parts(item.get("content"), f"{where}.content", kinds)
            out.append({"role": role, "content": content})
        elif kind == "function_call":
            name, args, call_id = item.get("name"), item.get("arguments", "{}"), item.get("call_id")
            if not isinstance(name, str) or not isinstance(args, str) or not isinstance(call_id, str):
                raise RequestError(f"{where}: a function_call item needs string name, arguments and call_id",
                                   param=where)
            names[call_id] = name
            call = {"id": call_id, "type": "function", "function": {"name": name, "arguments": args}}
            if out and out[-1]["role"] == "assistant":  # the calls of one assistant turn, its words first
                out[-1].setdefault("tool_calls", []).append(call)
            else:
                out.append({"role": "assistant", "content": "", "tool_calls": [call]})
        elif kind == "function_call_output":
            call_id, output = item.get("call_id"), item.get("output")
            if not isinstance(call_id, str):
                raise RequestError(f"{where}: a function_call_output item needs a string call_id", param=where)
            text = _text_parts(output, f"{where}.output", ("input_text", "output_text", "text"))
            msg = {"role": "tool", "tool_call_id": call_id, "content": text}
            if call_id in names:
                msg["name"] = names[call_id]
            out.append(msg)
        elif kind == "reasoning":
            continue  # a reasoning summary: nothing the chat template renders
        else:
            raise RequestError(f"{where}: input items of type {kind!r} are not supported (message, function_call, "
                               "function_call_output)", param=where)
    return out


def _chat_tools(tools: Any) -> list[dict[str, Any]]:
    if tools is None:
        return []
    if not isinstance(tools, list):
        raise RequestError("tools must be a list", param="tools")
    out = []
    for i, t in enumerate(tools):
        if not isinstance(t, dict) or t.get("type") != "function" or not isinstance(t.get("name"), str):
            raise RequestError(f"tools[{i}]: only function tools ({{\"type\": \"function\", \"name\": ..., "
                               "\"parameters\": {...}}) are supported", param=f"tools[{i}]")
        fn: dict[str, Any] = {"name": t["name"]}  # (in the chat shape's key order: the template renders it)
        if isinstance(t.get("description"), str):
            fn["description"] = t["description"]
        fn["parameters"] = t.get("parameters") or {"type": "object", "properties": {}}
        out.append({"type": "function", "function": fn})
    return out


def responses_request_as_chat(body: Any, history: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    """The ``/v1/chat/completions`` body a ``/v1/responses`` body stands for. ``history``: the
    chat messages of the response named by ``previous_response_id`` (its request and answer).

    Raises:
        RequestError: what the endpoint cannot serve (other tool or item types, several choices,
            structured output formats, a tool choice other than ``auto``).
    """
    if not isinstance(body, dict):
        raise RequestError("the request body must be a JSON object")
    if body.get("tool_choice") not in (None, "auto"):
        raise RequestError("tool_choice other than 'auto' is not supported", param="tool_choice")
    fmt = (body.get("text") or {}).get("format") if isinstance(body.get("text"), dict) else None
    if isinstance(fmt, dict) and fmt.get("type") not in (None, "text"):
        raise RequestError("only text output is supported (text.format.type 'text')", param="text.format")
    messages: list[dict[str, Any]] = []
    instructions = body.get("instructions")
    if instructions is not None:
        if not isinstance(instructions, str):
            raise RequestError("instructions must be a string", param="instructions")
        messages.append({"role": "system", "content": instructions})
    if history:  # (a stored conversation holds no instructions: they are not carried over, as OpenAI's are not)
        messages += history
    messages += _input_messages(body.get("input"))
    chat: dict[str, Any] = {"model": body.get("model", ""), "messages": messages,
                            "tools": _chat_tools(body.get("tools"))}
    for src, dst in (("max_output_tokens", "max_tokens"), ("temperature", "temperature"), ("top_p", "top_p"),
                     ("user", "user"), ("seed", "seed")):
        if body.get(src) is not None:
            chat[dst] = body[src]
    if body.get("top_logprobs"):
        chat["logprobs"] = True
    return chat


def _hex() -> str:
    return uuid.uuid4().hex


def chat_as_response(completion: dict[str, Any], body: dict[str, Any], response_id: str | None = None
                     ) -> dict[str, Any]:
    """The Response object of a served chat completion (for the request ``body``)."""
    choice = completion["choices"][0]
    message = choice["message"]
    output: list[dict[str, Any]] = []
    if message.get("content"):
        text = {"type": "output_text", "text": message["content"], "annotations": [], "logprobs": []}
        output.append({"type": "message", "id": f"msg_{_hex()}", "status": "completed", "role": "assistant",
                       "content": [text]})
    for c in message.get("tool_calls") or ():
        output.append({"type": "function_call", "id": f"fc_{_hex()}", "call_id": c["id"],
                       "name": c["function"]["name"], "arguments": c["function"]["arguments"], "status": "completed"})
    usage = completion["usage"]
    cut = choice["finish_reason"] == "length"
    return {"id": response_id or f"resp_{_hex()}", "object": "response", "created_at": completion["created"],
            "status": "incomplete" if cut else "completed", "error": None,
            "incomplete_details": {"reason": "max_output_tokens"} if cut else None,
            "instructions": body.get("instructions"), "max_output_tokens": body.get("max_output_tokens"),
            "model": completion["model"], "output": output, "parallel_tool_calls": True,
            "previous_response_id": body.get("previous_response_id"), "reasoning": None,
            "store": body.get("store", True) is not False,
            "temperature": completion["envfactory"]["temperature"], "text": {"format": {"type": "text"}},
            "tool_choice": "auto", "tools": body.get("tools") or [], "top_p": body.get("top_p"),
            "truncation": "disabled", "metadata": body.get("metadata") or {}, "user": body.get("user"),
            "usage": {"input_tokens": usage["prompt_tokens"], "input_tokens_details": {"cached_tokens": 0},
                      "output_tokens": usage["completion_tokens"],
                      "output_tokens_details": {"reasoning_tokens": 0}, "total_tokens": usage["total_tokens"]},
            "envfactory": completion["envfactory"] | {"chat_completion_id": completion["id"]}}


def chat_stream_events(completion: dict[str, Any], include_usage: bool) -> Iterator[dict[str, Any] | str]:
    """A served chat completion as the chunks a streamed one sends (then ``"[DONE]"``)."""
    choice, base = completion["choices"][0], {k: completion[k] for k in ("id", "created", "model")}
    base["object"] = "chat.completion.chunk"
    message = choice["message"]

    def chunk(delta: dict[str, Any], finish: str | None = None, **extra: Any) -> dict[str, Any]:
        return base | {"choices": [{"index": 0, "delta": delta, "finish_reason": finish, "logprobs": None}]} | extra

    yield chunk({"role": "assistant", "content": ""})
    if message.get("content"):
        yield chunk({"content": message["content"]})
    for i, c in enumerate(message.get("tool_calls") or ()):
        yield chunk({"tool_calls": [{"index": i, "id": c["id"], "type": "function",
                                     "function": {"name": c["function"]["name"], "arguments": ""}}]})
        yield chunk({"tool_calls": [{"index": i, "function": {"arguments": c["function"]["arguments"]}}]})
    yield chunk({}, choice["finish_reason"], envfactory=completion["envfactory"])
    if include_usage:
        yield base | {"choices": [], "usage": completion["usage"]}
    yield "[DONE]"


def response_stream_events(response: dict[str, Any]) -> Iterator[dict[str, Any]]:
    """A Response as the events a streamed one sends, ``response.created`` to ``response.completed``."""
    seq = iter(range(1 << 30))
    opening = response | {"status": "in_progress", "output": [], "usage": None}

    def event(kind: str, **fields: Any) -> dict[str, Any]:
        return {"type": kind, "sequence_number": next(seq), **fields}

    yield event("response.created", response=opening)
    yield event("response.in_progress", response=opening)
    for n, item in enumerate(response["output"]):
        if item["type"] == "message":
            yield event("response.output_item.added", output_index=n, item=item | {"status": "in_progress", "content": []})
            part = item["content"][0]
            where = {"item_id": item["id"], "output_index": n, "content_index": 0}
            yield event("response.content_part.added", **where, part=part | {"text": ""})
            yield event("response.output_text.delta", **where, delta=part["text"], logprobs=[])
            yield event("response.output_text.done", **where, text=part["text"], logprobs=[])
            yield event("response.content_part.done", **where, part=part)
        else:
            yield event("response.output_item.added", output_index=n, item=item | {"status": "in_progress",
                                                                                   "arguments": ""})
            yield event("response.function_call_arguments.delta", item_id=item["id"], output_index=n,
                        delta=item["arguments"])
            yield event("response.function_call_arguments.done", item_id=item["id"], output_index=n,
                        name=item["name"], arguments=item["arguments"])
        yield event("response.output_item.done", output_index=n, item=item)
    done = "response.incomplete" if response["status"] == "incomplete" else "response.completed"
    yield event(done, response=response)


def sse(events: Iterator[dict[str, Any] | str], named: bool) -> bytes:
    """Server-Sent Events: ``data: <json>`` per event (``event: <type>`` first when ``named``, as the
    Responses API writes them)."""
    out = []
    for e in events:
        if isinstance(e, str):
            out.append(f"data: {e}\n\n")
        else:
            head = f"event: {e['type']}\n" if named else ""
            out.append(f"{head}data: {json.dumps(e)}\n\n")
    return "".join(out).encode()
