"""Parsing an agent's action into tool calls.

Accepted actions:

* raw model text with Hermes/Qwen blocks ``<tool_call>{"name": ..., "arguments": {...}}</tool_call>``
  (any number per message), or a bare JSON function call ``{"name": ..., "arguments": {...}}``
  (or a JSON list of them);
* an OpenAI-style assistant message ``{"role": "assistant", "content": ..., "tool_calls": [...]}``;
* a :class:`~envfactory.task.ToolCall`, or a list of them (or of ``{"name", "arguments"}`` dicts).

Nothing here raises on model output: every problem becomes a message in
:attr:`ParsedAction.errors`, which the episode turns into an error observation.
That holds for call objects too: a :class:`~envfactory.task.ToolCall` (or dict)
whose name is not a non-empty string, or whose arguments are not a JSON-encodable
dict (a set, an object, a cycle, an int past the 4,300-digit limit), is an error
for that call, before anything in the episode changes.

Limits (module attributes, read on every parse; set them to configure, e.g.
``envfactory.parsing.MAX_CALLS_PER_TURN = 1000``, or through the environment
variables ``ENVFACTORY_MAX_ACTION_CHARS`` / ``ENVFACTORY_MAX_CALLS_PER_TURN`` at import):

* :data:`MAX_ACTION_CHARS` (default 1 MiB of text): a longer action is rejected
  whole, unscanned, as one error (it runs no call and does not end the episode);
* :data:`MAX_CALLS_PER_TURN` (default 256): an action with more calls runs none
  of them and is one error;
* :data:`MAX_ARGUMENT_DEPTH` (default 100, ``ENVFACTORY_MAX_ARGUMENT_DEPTH``): a call whose
  arguments nest deeper (the arguments object is level 1) is that call's error: it runs nothing,
  where the copies and checks behind a call (each recursive) would otherwise exceed Python's
  recursion limit.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from typing import Any

from .task import ToolCall

__all__ = ["ParsedAction", "parse_action", "parse_text", "ActionTypeError", "MAX_ACTION_CHARS",
           "MAX_CALLS_PER_TURN", "MAX_ARGUMENT_DEPTH"]

MAX_ACTION_CHARS = int(os.environ.get("ENVFACTORY_MAX_ACTION_CHARS", 1 << 20))
"""The longest action (characters of text) that is parsed; a longer one is one error."""
MAX_CALLS_PER_TURN = int(os.environ.get("ENVFACTORY_MAX_CALLS_PER_TURN", 256))
"""The most tool calls one action may make; an action with more runs none of them."""
MAX_ARGUMENT_DEPTH = int(os.environ.get("ENVFACTORY_MAX_ARGUMENT_DEPTH", 100))
"""The deepest nesting of a call's arguments (the object itself is level 1); deeper is that call's error."""

_OPEN = "<tool_call>"
_CLOSE = "</tool_call>"
_N_OPEN = len(_OPEN)
_FORMAT_HINT = 'Write each call as <tool_call>{"name": "<tool>", "arguments": {...}}</tool_call>.'
_CALL_KEYS = frozenset({"name", "arguments", "parameters", "id", "type"})
# the C scanner behind json.loads, without its wrappers (typeshed leaves scan_once out)
_scan = json.JSONDecoder().scan_once  # type: ignore[attr-defined]
_JSON_WS = " \t\n\r"


def _loads(body: str) -> Any:
    """``json.loads(body)`` at a third of its cost: call the scanner directly, and defer
    to ``json.loads`` (for its exact error) on anything the scanner does not take whole."""
    s = body.strip(_JSON_WS)
    try:
        obj, end = _scan(s, 0)
    except (StopIteration, ValueError):
        return json.loads(body)
    if end != len(s):
        return json.loads(body)
    return obj


class ActionTypeError(TypeError):
    """The action is not text, an assistant message or tool calls (a caller bug, not model output)."""


@dataclass(slots=True)
class ParsedAction:
    """An action split into what the agent said and the calls it made.

    ``attempted`` is true when the action tried to call a tool, even if every
    attempt was malformed: such a turn does not end the episode.
    """

    content: str
    calls: list[ToolCall] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)
    attempted: bool = False
    answer: str = ""


def _too_long(text: str) -> ParsedAction:
    return ParsedAction(text, errors=[
        f"the action is too long ({len(text)} characters; at most {MAX_ACTION_CHARS} are read). "
        "Nothing in it was run; write a shorter message."], attempted=True)


def _capped(parsed: ParsedAction) -> ParsedAction:
    """``parsed``, or, when it makes more than :data:`MAX_CALLS_PER_TURN` calls, none of them and an error."""
    n = len(parsed.calls)
    if n > MAX_CALLS_PER_TURN:
        parsed.errors.insert(0, f"{n} tool calls in one message; at most {MAX_CALLS_PER_TURN} are allowed per "
                                "turn. None of them was run; make fewer calls per message.")
        parsed.calls = []
    return parsed


_check_json = json.JSONEncoder(separators=(",", ":")).encode  # what snapshot() and the wire must encode


def _too_deep(args: dict[str, Any]) -> bool:
    """Whether ``args`` nests deeper than :data:`MAX_ARGUMENT_DEPTH` (each container counted
    once, so shared or cyclic ones end). The usual flat arguments cost one pass over the values."""
    for v in args.values():
        if isinstance(v, (dict, list, tuple)):
            break
    else:
        return False
    limit, seen = MAX_ARGUMENT_DEPTH, set()
    stack: list[tuple[Any, int]] = [(args, 1)]
    while stack:
        value, depth = stack.pop()
        if depth > limit:
            return True
        if id(value) in seen:
            continue
        seen.add(id(value))
        for child in (value.values() if isinstance(value, dict) else value):
            if isinstance(child, (dict, list, tuple)):
                stack.append((child, depth + 1))
    return False


def _deep_error(name: str, where: str) -> str:
    return (f"{where}: 'arguments' of '{name}' nest deeper than {MAX_ARGUMENT_DEPTH} levels; "
            "no tool takes arguments that deep.")


def _bad_call(call: Any, where: str) -> str | None:
    """Why a call given as an object (not parsed from text) cannot run, or ``None``."""
    name = call.name
    if not isinstance(name, str) or not name:
        return f"{where}: the tool 'name' must be a non-empty string, got {_short(name)}. {_FORMAT_HINT}"
    args = call.arguments
    if not isinstance(args, dict):
        return f"{where}: 'arguments' of '{name}' must be a JSON object, got {type(args).__name__}."
    try:
        _check_json(args)
    except (TypeError, ValueError, RecursionError) as exc:
        return f"{where}: 'arguments' of '{name}' cannot be encoded as JSON ({type(exc).__name__}: {str(exc)[:200]})."
    if _too_deep(args):
        return _deep_error(name, where)
    if call.id is not None and not isinstance(call.id, str):
        return f"{where}: the call 'id' must be a string, got {type(call.id).__name__}."
    return None


def _short(obj: Any) -> str:
    try:
        text = repr(obj)
    except Exception:  # a hostile __repr__
        text = "?"
    return f"{type(obj).__name__} {text[:80]}"


def _call_from_obj(obj: Any, where: str) -> tuple[ToolCall | None, str | None]:
    if not isinstance(obj, dict):
        return None, f"{where}: expected a JSON object, got {type(obj).__name__}. {_FORMAT_HINT}"
    name = obj.get("name")
    if not isinstance(name, str) or not name:
        return None, f"{where}: missing the tool 'name' (a string). {_FORMAT_HINT}"
    args = obj.get("arguments", obj.get("parameters", {}))
    if isinstance(args, str):
        try:
            args = _loads(args) if args.strip() else {}
        except (ValueError, RecursionError) as exc:
            return None, f"{where}: 'arguments' of '{name}' is not valid JSON ({exc})."
    if args is None:
        args = {}
    if not isinstance(args, dict):
        return None, (
            f"{where}: 'arguments' of '{name}' must be a JSON object, got {type(args).__name__}."
        )
    if _too_deep(args):
        return None, _deep_error(name, where)
    call_id = obj.get("id")
    return ToolCall(name, args, call_id if isinstance(call_id, str) else None), None


def _blocks(text: str, start: int) -> tuple[list[str], bool]:
    """The bodies of the closed ``<tool_call>`` blocks from ``start`` on, and whether an
    open tag has no block of its own (left unclosed, or inside another block's body).
    Linear in the text: a regex with a lazy body rescans the tail for every unclosed
    tag (quadratic, and it holds the GIL)."""
    find = text.find
    n_open, n_close = len(_OPEN), len(_CLOSE)
    j = find(_CLOSE, start + n_open)
    if j >= 0 and find(_OPEN, start + n_open) < 0:  # the usual case: one block, one tag
        return [text[start + n_open:j]], False
    bodies = []
    i = start
    while i >= 0:
        j = find(_CLOSE, i + n_open)
        if j < 0:
            break
        bodies.append(text[i + n_open:j])
        i = find(_OPEN, j + n_close)
    return bodies, text.count(_OPEN) > len(bodies)


def one_call(text: str) -> tuple[str, dict[str, Any]] | None:
    """``(name, arguments)`` when ``text`` is what :func:`parse_text` reads as exactly one
    well-formed call and nothing else to report (one ``<tool_call>`` block holding
    ``{"name": str, "arguments": object}``); ``None`` for anything else, which
    :func:`parse_text` then reads in full. The step's hot path: no objects built."""
    if len(text) > MAX_ACTION_CHARS:
        return None
    start = text.find(_OPEN)
    if start < 0:
        return None
    b = start + _N_OPEN
    j = text.find(_CLOSE, b)
    if j < 0 or text.find(_OPEN, b) >= 0:
        return None
    body = text[b:j].strip(_JSON_WS)
    try:
        obj, end = _scan(body, 0)
    except (StopIteration, ValueError, RecursionError):
        return None
    if end == len(body) and obj.__class__ is dict and len(obj) == 2:
        name = obj.get("name")
        args = obj.get("arguments")
        if name.__class__ is str and name and args.__class__ is dict and not _too_deep(args):
            return name, args
    return None


def parse_text(text: str) -> ParsedAction:
    """Parse raw model text (see module docstring)."""
    one = one_call(text)
    if one is not None:
        return ParsedAction(text, [ToolCall(one[0], one[1])], [], True)
    if len(text) > MAX_ACTION_CHARS:
        return _too_long(text)
    start = text.find(_OPEN)
    if start >= 0:
        calls: list[ToolCall] = []
        errors: list[str] = []
        bodies, unclosed = _blocks(text, start)
        for i, body in enumerate(bodies, 1):
            try:
                obj = _loads(body)
            except (ValueError, RecursionError) as exc:
                errors.append(f"tool call #{i} is not valid JSON ({exc}). {_FORMAT_HINT}")
                continue
            if obj.__class__ is dict and len(obj) == 2:  # fast path: {"name": str, "arguments": dict}
                name = obj.get("name")
                args = obj.get("arguments")
                if name.__class__ is str and name and args.__class__ is dict and not _too_deep(args):
                    calls.append(ToolCall(name, args))
                    continue
            call, err = _call_from_obj(obj, f"tool call #{i}")
            if err:
                errors.append(err)
            elif call is not None:  # no error: a call
                calls.append(call)
        if unclosed:
            errors.append(f"a <tool_call> block is not closed with </tool_call>. {_FORMAT_HINT}")
        return _capped(ParsedAction(text, calls, errors, True))
    stripped = text.strip()
    if stripped[:1] in ("{", "[") and '"name"' in stripped:
        try:
            obj = _loads(stripped)
        except (ValueError, RecursionError):
            return ParsedAction(text, answer=stripped)
        objs = obj if isinstance(obj, list) else [obj]
        if objs and all(isinstance(o, dict) and "name" in o and set(o) <= _CALL_KEYS for o in objs):
            parsed = ParsedAction(text, attempted=True)
            for i, o in enumerate(objs, 1):
                call, err = _call_from_obj(o, f"tool call #{i}")
                if err:
                    parsed.errors.append(err)
                elif call is not None:  # no error: a call
                    parsed.calls.append(call)
            return _capped(parsed)
    return ParsedAction(text, answer=stripped)


def _parse_openai_calls(raw_calls: Any, content: str) -> ParsedAction:
    parsed = ParsedAction(content, attempted=True, answer=content.strip())
    if not isinstance(raw_calls, list):
        parsed.errors.append("'tool_calls' must be a list of function calls.")
        return parsed
    for i, rc in enumerate(raw_calls, 1):
        call: ToolCall | None
        err: str | None
        if isinstance(rc, ToolCall):
            call, err = rc, None
        else:
            if isinstance(rc, dict) and isinstance(rc.get("function"), dict):
                obj = dict(rc["function"])
                if isinstance(rc.get("id"), str):
                    obj["id"] = rc["id"]
            else:
                obj = rc
            call, err = _call_from_obj(obj, f"tool call #{i}")
        if err is None:  # objects (not parsed from text) may hold anything: check them whole
            err = _bad_call(call, f"tool call #{i}")
        if err:
            parsed.errors.append(err)
        elif call is not None:  # no error: a call
            parsed.calls.append(call)
    return _capped(parsed)


def parse_action(action: Any) -> ParsedAction:
    """Parse any accepted action form into a :class:`ParsedAction`.

    Raises:
        ActionTypeError: ``action`` is none of the accepted forms (a programming
            error in the caller; model output is always text and never raises).
    """
    if isinstance(action, str):
        return parse_text(action)
    if isinstance(action, ToolCall):
        err = _bad_call(action, "tool call #1")
        if err:
            return ParsedAction("", errors=[err], attempted=True)
        return ParsedAction("", [action], attempted=True)
    if isinstance(action, dict):
        if "tool_calls" in action or action.get("role") == "assistant":
            content = action.get("content") or ""
            if not isinstance(content, str):
                try:
                    content = json.dumps(content)
                except (TypeError, ValueError, RecursionError):
                    content = _short(content)
            raw_calls = action.get("tool_calls")
            if raw_calls:
                return _parse_openai_calls(raw_calls, content)
            return parse_text(content)
        if "name" in action:
            return _parse_openai_calls([action], "")
    if isinstance(action, (list, tuple)):
        return _parse_openai_calls(list(action), "")
    raise ActionTypeError(
        "an action must be model text (str), an assistant message dict, a ToolCall, "
        f"or a list of tool calls; got {type(action).__name__}"
    )
