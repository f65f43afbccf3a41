"""Tools: typed Python functions over the state, exposed to agents as JSON schemas.

A tool is written as an ordinary function whose first parameter is the state::

    @tool
    def read_file(state: FileSystem, path: str) -> str:
        \"\"\"Return the content of a file.

        Args:
            path: Absolute path of the file.
        \"\"\"

Its OpenAI function-calling schema comes from the type hints and the docstring.
Arguments are validated (strictly: no missing, extra or mistyped arguments)
before the function runs. Whatever happens inside, :meth:`Tool.invoke` returns
an observation; it never raises.
"""

from __future__ import annotations

import inspect
import json
import re
import typing
from dataclasses import dataclass, field
from typing import Any, Callable

from pydantic import BaseModel, ConfigDict, ValidationError, create_model

__all__ = ["Tool", "ToolError", "ToolOutcome", "tool", "FINISH_TOOL_NAME", "finish_tool", "CallStopped",
           "stops_the_process", "failed_outcome"]

FINISH_TOOL_NAME = "finish"


_REQUIRED = object()
_FLOAT_TYPES = (float, int)
_SIMPLE_TYPES = {str: (str,), int: (int,), bool: (bool,), float: _FLOAT_TYPES}


class ToolError(Exception):
    """Raised by a tool for an expected failure (missing file, insufficient funds).

    Its message is shown to the agent as the tool's result; the episode goes on.
    """


class CallStopped(BaseException):
    """Raised into a tool's thread from outside to stop its call (the container server abandons
    a session's call past its step timeout with a subclass). :meth:`Tool.invoke` lets it through;
    any other exception a tool raises is the call's error observation."""


def _handler_codes() -> set[Any]:
    """The code objects of the Python-level signal handlers installed now."""
    import signal

    codes: set[Any] = set()
    for sig in signal.valid_signals():
        try:
            h = signal.getsignal(sig)
        except (ValueError, OSError):
            continue
        while h is not None and not isinstance(h, int):
            code = getattr(h, "__code__", None)
            if code is not None:
                codes.add(code)
                break
            h = getattr(h, "__func__", None) or getattr(h, "func", None)  # a bound method, a partial
    return codes


_RAISE_OPS = frozenset(op for name, op in __import__("dis").opmap.items() if name in ("RAISE_VARARGS", "RERAISE"))


def stops_the_process(exc: BaseException) -> bool:
    """Whether ``exc``, raised out of a tool's call, is the process's own stop rather than the
    tool's fault: a :class:`CallStopped`; an exception raised by a Python signal handler (a
    ``SIGTERM`` handler calling ``sys.exit``: its frame is in the traceback); a
    ``KeyboardInterrupt`` that Python's own ``SIGINT`` handler (or ``_thread.interrupt_main``)
    delivered in the main thread: no ``raise`` statement raised it. Anything else (a tool's
    ``sys.exit()``, ``raise KeyboardInterrupt``, ``GeneratorExit``, any ``BaseException``
    subclass) is the tool's, and :meth:`Tool.invoke` answers it as the call's error."""
    if isinstance(exc, CallStopped):
        return True
    if not isinstance(exc, (KeyboardInterrupt, SystemExit)):
        return False
    handlers = _handler_codes()
    tb, last = exc.__traceback__, None
    while tb is not None:
        if tb.tb_frame.f_code in handlers:
            return True
        last, tb = tb, tb.tb_next
    if isinstance(exc, KeyboardInterrupt):
        import threading

        if threading.current_thread() is not threading.main_thread():
            return False  # no signal is delivered to another thread
        if last is None:
            return True
        code = last.tb_frame.f_code.co_code
        at = last.tb_lasti
        return not (0 <= at < len(code) and code[at] in _RAISE_OPS)
    return False


def _describe(exc: BaseException) -> str:
    """``"Type: message"`` of an exception, whatever its ``__str__`` does."""
    name = type(exc).__name__
    try:
        text = str(exc)
    except BaseException as inner:  # noqa: BLE001 - a hostile __str__ (which may raise SystemExit itself)
        if stops_the_process(inner):
            raise
        text = f"<its message could not be read: {type(inner).__name__}>"
    if not isinstance(text, str):
        text = "<its message is not a string>"
    return f"{name}: {text}"


def failed_outcome(name: str, exc: BaseException) -> "ToolOutcome":
    """The error observation of a tool call that raised ``exc`` (not a :class:`ToolError`)."""
    return ToolOutcome(f"Error: tool '{name}' failed: {_describe(exc)}", False, "exception")


@dataclass(slots=True)
class ToolOutcome:
    """What one tool call produced: the observation text and whether it failed."""

    content: str
    ok: bool
    kind: str = "ok"  # ok | invalid_arguments | tool_error | exception


_ARGS_RE = re.compile(r"^\s*(Args|Arguments|Parameters):\s*$", re.MULTILINE)
_SECTION_RE = re.compile(r"^\s*(Returns|Raises|Yields|Examples?|Notes?):\s*$", re.MULTILINE)
_PARAM_RE = re.compile(r"^\s*(\*{0,2}\w+)\s*(\([^)]*\))?\s*:\s*(.*)$")


def _parse_docstring(doc: str | None) -> tuple[str, dict[str, str]]:
    """Split a Google-style docstring into (description, {param: description})."""
    if not doc:
        return "", {}
    doc = inspect.cleandoc(doc)
    m = _ARGS_RE.search(doc)
    head = doc[: m.start()] if m else doc
    end = _SECTION_RE.search(head)
    head = head[: end.start()] if end else head
    description = " ".join(head.strip().split("\n\n")[0].split())
    params: dict[str, str] = {}
    if m:
        body = doc[m.end():]
        end = _SECTION_RE.search(body)
        body = body[: end.start()] if end else body
        current = None
        for line in body.splitlines():
            pm = _PARAM_RE.match(line)
            indent = len(line) - len(line.lstrip())
            if pm and (current is None or indent <= params_indent):
                current = pm.group(1).lstrip("*")
                params_indent = indent
                params[current] = pm.group(3).strip()
            elif current and line.strip():
                params[current] = (params[current] + " " + line.strip()).strip()
    return description, params


def _strip_titles(schema: Any) -> Any:
    """Drop pydantic's auto-generated ``title`` keywords (not property names)."""
    if isinstance(schema, dict):
        out = {}
        for k, v in schema.items():
            if k == "title" and isinstance(v, str):
                continue
            if k in ("properties", "$defs") and isinstance(v, dict):
                out[k] = {name: _strip_titles(sub) for name, sub in v.items()}
            else:
                out[k] = _strip_titles(v)
        return out
    if isinstance(schema, list):
        return [_strip_titles(v) for v in schema]
    return schema


@dataclass(eq=False)
class Tool:
    """A typed function over the state, callable by an agent.

    Attributes:
        name: The name agents call it by.
        description: What it does (first paragraph of the docstring).
        fn: The function; called as ``fn(state, **arguments)``.
        parameters: JSON schema of the arguments (OpenAI function-calling format).
        finish: Calling this tool ends the episode; its ``answer`` argument is
            the agent's final answer.
        read_only: Declares that the tool never changes the state (used by the
            factory's task synthesis; not enforced at run time).
    """

    name: str
    description: str
    fn: Callable[..., Any]
    parameters: dict[str, Any]
    args_model: type[BaseModel]
    finish: bool = False
    read_only: bool = False
    _arg_names: tuple[str, ...] = field(default=(), repr=False)
    # name -> (accepted classes, default or _REQUIRED) when every parameter is a
    # plain str/int/float/bool; None otherwise (pydantic validates everything).
    _simple: dict[str, tuple[tuple[type, ...], Any]] | None = field(default=None, repr=False)
    # name -> the one class a value passes through unchanged (a float parameter: float),
    # when ``_simple`` is set: arguments giving every parameter exactly so need no copy
    _exact: dict[str, type] | None = field(default=None, repr=False)

    def schema(self) -> dict[str, Any]:
        """The OpenAI function-calling schema: ``{"type": "function", "function": {...}}``."""
        return {
            "type": "function",
            "function": {
                "name": self.name,
                "description": self.description,
                "parameters": self.parameters,
            },
        }

    def __init_subclass__(cls, **kwargs: Any) -> None:
        """A subclass's own :meth:`invoke` never raises either: what it lets out (anything but
        the process's own stop, :func:`stops_the_process`) is the call's error observation."""
        super().__init_subclass__(**kwargs)
        own = cls.__dict__.get("invoke")
        if own is None or getattr(own, "__guarded__", False):
            return

        def invoke(self: Tool, state: Any, arguments: Any) -> ToolOutcome:
            try:
                return own(self, state, arguments)
            except BaseException as exc:  # noqa: BLE001 - one fault, one behaviour (see Tool.invoke)
                if stops_the_process(exc):
                    raise
                return failed_outcome(self.name, exc)

        invoke.__guarded__ = True  # type: ignore[attr-defined]
        invoke.__doc__, invoke.__wrapped__ = own.__doc__, own  # type: ignore[attr-defined]
        cls.invoke = invoke  # type: ignore[method-assign]

    def invoke(self, state: Any, arguments: Any) -> ToolOutcome:
        """Validate ``arguments`` and run the tool on ``state``. Never raises.

        Invalid arguments, :class:`ToolError` and any other exception become an
        error observation naming the problem: any ``BaseException`` the tool raises
        (``sys.exit()``, ``raise KeyboardInterrupt``, ``GeneratorExit``), so that one
        fault is one observation wherever the tool runs (in-process, in a container,
        in :func:`~envfactory.step_many`, in a reference replay). Only the process's
        own stop goes through (:func:`stops_the_process`: Ctrl-C, a signal handler's
        exit, :class:`CallStopped`).
        """
        kwargs = None
        exact = self._exact
        if exact is not None and arguments.__class__ is dict and len(arguments) == len(exact):
            # the step's hot path: every parameter given, each of exactly its type
            kwargs = arguments
            for k, v in arguments.items():
                if exact.get(k) is not v.__class__:
                    kwargs = None
                    break
        if kwargs is None:
            if not isinstance(arguments, dict):
                return ToolOutcome(
                    f"Error: arguments for tool '{self.name}' must be a JSON object, "
                    f"got {type(arguments).__name__}.",
                    False,
                    "invalid_arguments",
                )
            kwargs = self._fast_validate(simple, arguments) if (simple := self._simple) is not None else None
            if kwargs is None:
                try:
                    kwargs = self.args_model.model_validate(arguments).__dict__
                except ValidationError as exc:
                    return ToolOutcome(self._describe_invalid(exc), False, "invalid_arguments")
        try:
            result = self.fn(state, **kwargs)
            if result.__class__ is not str:
                result = _render_result(result)
        except ToolError as exc:
            return ToolOutcome(f"Error: {_describe(exc).partition(': ')[2]}", False, "tool_error")
        except BaseException as exc:  # noqa: BLE001 - a tool bug (or exit) must not crash the episode
            if stops_the_process(exc):
                raise
            return failed_outcome(self.name, exc)
        return ToolOutcome(result, True)

    def _fast_validate(self, simple: dict[str, tuple[tuple[type, ...], Any]],
                       arguments: dict[str, Any]) -> dict[str, Any] | None:
        """Validate scalar-only signatures without pydantic (the common case).

        Returns the keyword arguments, or ``None`` to defer to the full pydantic
        validation, which then produces the precise error message.
        """
        for name in arguments:
            if name not in simple:
                return None
        kwargs: dict[str, Any] = {}
        for name, (types, default) in simple.items():
            if name in arguments:
                v: Any = arguments[name]
                if v.__class__ not in types:
                    return None
                kwargs[name] = float(arguments[name]) if types is _FLOAT_TYPES else v
            elif default is _REQUIRED:
                return None
            else:
                kwargs[name] = default
        return kwargs

    def _describe_invalid(self, exc: ValidationError) -> str:
        problems = []
        for err in exc.errors(include_url=False):
            loc = ".".join(str(p) for p in err["loc"]) or "(arguments)"
            if err["type"] == "missing":
                problems.append(f"missing required argument '{loc}'")
            elif err["type"] == "extra_forbidden":
                problems.append(f"unexpected argument '{loc}'")
            else:
                problems.append(f"argument '{loc}': {err['msg']}")
        expected = ", ".join(
            f"{n}" + ("" if n in self.parameters.get("required", ()) else "?")
            for n in self._arg_names
        )
        return (
            f"Error: invalid arguments for tool '{self.name}': "
            + "; ".join(problems)
            + f". Expected arguments: ({expected})."
        )


def _render_result(result: Any) -> str:
    if isinstance(result, str):
        return str.__str__(result)
    if result is None:
        return "OK"
    if isinstance(result, BaseModel):
        return result.model_dump_json()
    return json.dumps(result, ensure_ascii=False, default=str)


class _StrictArgs(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True, arbitrary_types_allowed=False)


def tool(
    fn: Callable[..., Any] | None = None,
    *,
    name: str | None = None,
    description: str | None = None,
    finish: bool = False,
    read_only: bool = False,
) -> Any:
    """Turn a function ``fn(state, **arguments)`` into a :class:`Tool`.

    Usable bare (``@tool``) or with options (``@tool(name="ls", read_only=True)``).
    Every parameter after the state needs a type hint; defaults make arguments
    optional. Parameter descriptions come from the docstring's ``Args:`` section.
    """

    def build(f: Callable[..., Any]) -> Tool:
        return make_tool(f, name=name, description=description, finish=finish, read_only=read_only)

    return build(fn) if fn is not None else build


def make_tool(
    fn: Callable[..., Any],
    *,
    name: str | None = None,
    description: str | None = None,
    finish: bool = False,
    read_only: bool = False,
) -> Tool:
    """Build a :class:`Tool` from a function (see :func:`tool`); its first parameter is the state."""
    sig = inspect.signature(fn)
    try:
        hints = typing.get_type_hints(fn, include_extras=True)
    except Exception as exc:
        raise TypeError(f"tool {fn.__name__!r}: cannot resolve type hints: {exc}") from exc
    params = list(sig.parameters.values())
    if not params:
        raise TypeError(f"tool {fn.__name__!r} must take the state as its first parameter")
    params = params[1:]
    doc_description, doc_params = _parse_docstring(fn.__doc__)
    fields: dict[str, Any] = {}
    for p in params:
        if p.kind in (p.VAR_POSITIONAL, p.VAR_KEYWORD):
            raise TypeError(f"tool {fn.__name__!r}: *args/**kwargs are not supported ({p.name})")
        if p.name not in hints:
            raise TypeError(
                f"tool {fn.__name__!r}: parameter {p.name!r} needs a type hint "
                "(its JSON schema is derived from it)"
            )
        from pydantic import Field

        default = ... if p.default is inspect.Parameter.empty else p.default
        fields[p.name] = (hints[p.name], Field(default, description=doc_params.get(p.name)))
    simple: dict[str, tuple[tuple[type, ...], Any]] | None = {}
    for p in params:
        hint = hints[p.name]
        if hint in _SIMPLE_TYPES and simple is not None:
            default = _REQUIRED if p.default is inspect.Parameter.empty else p.default
            simple[p.name] = (_SIMPLE_TYPES[hint], default)
        else:
            simple = None
    tool_name = name or fn.__name__
    args_model = create_model(f"{tool_name}_args", __base__=_StrictArgs, **fields)
    schema = _strip_titles(args_model.model_json_schema())
    schema.setdefault("properties", {})
    schema["additionalProperties"] = False
    schema.setdefault("required", [])
    desc = description or doc_description
    if not desc:
        raise TypeError(f"tool {tool_name!r} needs a description (write a docstring)")
    return Tool(
        name=tool_name,
        description=desc,
        fn=fn,
        parameters=schema,
        args_model=args_model,
        finish=finish,
        read_only=read_only,
        _arg_names=tuple(fields),
        _simple=simple,
        _exact=None if simple is None else {n: types[0] for n, (types, _) in simple.items()},
    )


def _finish(state: Any, answer: str) -> str:
    """Finish the task and give your final answer to the user.

    Args:
        answer: Your final answer, including any facts the user asked for.
    """
    return "Episode finished."


finish_tool: Tool = make_tool(_finish, name=FINISH_TOOL_NAME, finish=True, read_only=True)
