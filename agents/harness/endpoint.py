"""An OpenAI-compatible chat endpoint over a policy being trained, recording what it sampled
(chat completions and the Responses API, streamed or not).

Any agent loop that talks to a chat endpoint (the plain ``openai`` SDK:
``client.chat.completions.create(model=..., messages=..., tools=...)``) can be trained
unchanged: point its ``base_url`` at a :class:`ChatEndpoint`. The endpoint renders the
request's messages and tools with the policy's chat template (as rollouts do), samples
with the policy, answers in OpenAI's shape (``tool_calls`` parsed from the model's
``<tool_call>`` text, ``finish_reason``) plus an ``envfactory`` field with the token ids
and log-probs, and records every call.

**Sessions.** ``base_url`` is ``http://127.0.0.1:PORT/v1``; ``session_url(name)`` is
``.../s/NAME/v1``: a client given that URL records into session ``NAME`` and needs no
other change (one session per episode of an agent loop). Requests to the plain URL go to
the session named by the request's ``user`` field, else to ``""``.

**Token-in/token-out across calls.** When a request's messages extend an earlier call
of the same session (its messages, then the assistant message it returned, compared by
role, content and tool calls), the prompt is that call's prompt ids + its sampled ids +
the template's rendering of the new messages (closing markup, tool results, the next
assistant header), exactly as :mod:`agents.rollout` builds it; the sampled ids are never
re-tokenized. A request that extends no earlier call is rendered whole (a new chain).
:meth:`Session.trajectories` (:mod:`agents.harness.chat_calls`) turns each chain of calls into a
:class:`~agents.rollout.Trajectory` (sampled ids with loss mask 1, inserted ids 0) that
the trainer trains on.

The server is the standard library's threading HTTP server on loopback, bounded: at most
``max_workers`` connections are served at once (more wait in a listen backlog of
:data:`BACKLOG`, so a burst of clients is queued, not refused), a connection idle for
:data:`IDLE_TIMEOUT_S` is closed, and a request's head and body must each arrive within
:data:`READ_TIMEOUT_S`. Generation runs on one worker thread that batches the requests waiting at
that moment. A prompt too long for the context is refused before it is tokenized when its
characters alone say so (no token is longer than the tokenizer's longest). Malformed
requests get a 4xx JSON error in OpenAI's ``{"error": {...}}`` shape.
"""

from __future__ import annotations

import io
import json
import socket
from collections import OrderedDict
import threading
import time
import uuid
from concurrent.futures import Future
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from agents.harness.chat_calls import (Call, RequestError, Session, assistant_message, chain_key, message_as_template,
                         template_messages)
from agents.harness.responses import (STORED, chat_as_response, chat_stream_events, response_stream_events,
                                      responses_request_as_chat, sse)
from agents.policies.policy import Generation, Policy, default_stop_ids
from agents.rollout import _split, renderer_for

__all__ = ["ChatEndpoint", "Session", "Call", "RequestError", "MAX_BODY"]

MAX_BODY = 4 << 20  # bytes of a request body (the MCP face's limit too)
GATHER_S = 0.05  # the longest a request waits for others to join its batch
MAX_WORKERS = 128  # connections served at once (a thread each); more wait in the backlog
BACKLOG = 1024  # connections the kernel queues while every worker is busy (was 5: a burst of 64 lost some)
IDLE_TIMEOUT_S = 30.0  # a keep-alive connection with no request for this long is closed (its thread freed)
READ_TIMEOUT_S = 30.0  # a request's head, and its body, must each arrive within this


# -- sampling ------------------------------------------------------------------------
class _Batcher:
    """One worker thread that samples every request waiting, batched by sampling settings."""

    def __init__(self, policy: Policy) -> None:
        self.policy = policy
        self._cv = threading.Condition()
        self._queue: list[tuple[list[int], tuple[Any, ...], Future[Generation]]] = []
        self._stop = False
        self._thread = threading.Thread(target=self._run, name="chat-endpoint-sampler", daemon=True)
        self._thread.start()

    def submit(self, prompt: list[int], settings: tuple[Any, ...]) -> "Future[Generation]":
        fut: Future[Generation] = Future()
        with self._cv:
            if self._stop:
                raise RequestError("the endpoint is closed", status=503)
            self._queue.append((prompt, settings, fut))
            self._cv.notify()
        return fut

    def _run(self) -> None:
        while True:
            with self._cv:
                while not self._queue and not self._stop:
                    self._cv.wait()
                if self._stop:
                    for _, _, f in self._queue:
                        f.set_exception(RequestError("the endpoint is closed", status=503))
                    return
                # requests of concurrent episodes arrive a few ms apart: gather them while they keep
                # coming (up to GATHER_S), so they are sampled as one batch
                deadline = time.monotonic() + GATHER_S
                while not self._stop and time.monotonic() < deadline:
                    n = len(self._queue)
                    self._cv.wait(timeout=0.005)
                    if len(self._queue) == n:
                        break
                jobs, self._queue = self._queue, []
            groups: dict[tuple[Any, ...], list[tuple[list[int], Future[Generation]]]] = {}
            for prompt, settings, fut in jobs:
                # a seeded request samples alone: its stream must not depend on what else was waiting
                key = settings if settings[3] is None else (*settings, id(fut))
                groups.setdefault(key, []).append((prompt, fut))
            for (max_new, temperature, top_p, seed, stops, *_), rows in groups.items():
                try:
                    gens = self.policy.generate([p for p, _ in rows], max_new_tokens=max_new,
                                                temperature=temperature, top_p=top_p,
                                                stop_token_ids=list(stops), seed=seed)
                except Exception as exc:  # the backend failed these requests, not the server
                    for _, f in rows:
                        f.set_exception(exc)
                    continue
                for (_, f), g in zip(rows, gens):
                    f.set_result(g)

    def close(self) -> None:
        with self._cv:
            self._stop = True
            self._cv.notify()
        self._thread.join(timeout=30)


# -- the HTTP server ---------------------------------------------------------------------
class _Server(ThreadingHTTPServer):
    """A threading HTTP server with at most ``max_workers`` connections served at once (the
    accept loop waits for a free worker; clients wait in the listen backlog meanwhile)."""

    request_queue_size = BACKLOG
    daemon_threads = True

    def __init__(self, address: tuple[str, int], handler: type, max_workers: int) -> None:
        self._workers = threading.BoundedSemaphore(max_workers)
        super().__init__(address, handler)

    def process_request(self, request: Any, client_address: Any) -> None:
        while not self._workers.acquire(timeout=0.5):
            if getattr(self, "_BaseServer__shutdown_request", False):
                self.shutdown_request(request)
                return
        try:
            super().process_request(request, client_address)
        except BaseException:
            self._workers.release()
            raise

    def process_request_thread(self, request: Any, client_address: Any) -> None:
        try:
            super().process_request_thread(request, client_address)
        finally:
            self._workers.release()


class _Deadline(io.RawIOBase):
    """A connection's reads, each bounded by what is left of the current deadline (set per
    request head and per body), so a client dripping one byte at a time holds no worker for
    longer than the deadline; between requests the idle timeout applies."""

    def __init__(self, sock: socket.socket) -> None:
        self.sock, self.deadline = sock, None  # type: float | None

    def readable(self) -> bool:
        return True

    def readinto(self, b: Any) -> int:
        if self.deadline is None:
            self.sock.settimeout(IDLE_TIMEOUT_S)
        else:
            left = self.deadline - time.monotonic()
            if left <= 0:
                raise TimeoutError("the request did not arrive in time")
            self.sock.settimeout(left)
        return self.sock.recv_into(b)


# -- the endpoint ----------------------------------------------------------------------
class ChatEndpoint:
    """``POST /v1/chat/completions``, ``POST /v1/responses`` (OpenAI's Responses API, the OpenAI
    Agents SDK's default: :mod:`agents.harness.responses`) and ``GET /v1/models`` over ``policy``,
    on loopback; either POST streams (Server-Sent Events) with ``stream: true``.

    Args:
        policy: A :class:`~agents.policies.policy.Policy` that returns the ids it sampled (HF, vLLM,
            or a token-mode OpenAI-compatible server).
        model: The name ``/v1/models`` lists and responses carry (any requested name is served).
        max_tokens: Sampled tokens per call when a request does not say (and the most it may ask).
        temperature, top_p: When set, every call samples with these whatever the request says
            (a trainer sets them: its loss scores tokens at the temperature they were drawn at);
            ``None``: the request's (OpenAI's defaults, 1.0, when it has none).
        max_context: Prompt + completion tokens a call may use (default: the tokenizer's
            ``model_max_length`` when it is a real bound); a longer prompt is a 400 (before it
            is tokenized when its characters are more than the context's tokens could hold).
        port: ``0`` picks a free one.
        max_workers: Connections served at once (:data:`MAX_WORKERS`).

    Use as a context manager, or :meth:`start` / :meth:`close`.
    """

    def __init__(self, policy: Policy, *, model: str = "envfactory-policy", max_tokens: int = 256,
                 temperature: float | None = None, top_p: float | None = None, max_context: int | None = None,
                 host: str = "127.0.0.1", port: int = 0, max_workers: int = MAX_WORKERS) -> None:
        if max_workers < 1:
            raise ValueError("max_workers must be at least 1")
        self.max_workers = max_workers
        self._token_chars: int | None = None  # the longest token's characters (found when first needed)
        self.policy, self.model = policy, model
        self.max_tokens, self.temperature, self.top_p = int(max_tokens), temperature, top_p
        limit = max_context or getattr(policy.tokenizer, "model_max_length", 0) or 0
        self.max_context = limit if 0 < limit < 10**8 else None
        self.renderer = renderer_for(policy.tokenizer)
        self.stops = default_stop_ids(policy.tokenizer)
        self.host, self.port = host, port
        self.sessions: dict[str, Session] = {}
        self._lock = threading.Lock()  # sessions and their call indexes
        self._server: ThreadingHTTPServer | None = None
        self._batcher: _Batcher | None = None
        self.latencies_s: list[float] = []  # wall time of each served completion, for measurements
        self._stored: OrderedDict[str, list[dict[str, Any]]] = OrderedDict()  # response id -> its conversation

    # -- lifecycle -------------------------------------------------------------------
    def start(self) -> "ChatEndpoint":
        if self._server is None:
            self._batcher = _Batcher(self.policy)
            self._server = _Server((self.host, self.port), _handler(self), self.max_workers)
            self.port = self._server.server_address[1]
            threading.Thread(target=self._server.serve_forever, name="chat-endpoint", daemon=True).start()
        return self

    def close(self) -> None:
        """Stop serving (idempotent); the recorded sessions stay readable."""
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None
        if self._batcher is not None:
            self._batcher.close()
            self._batcher = None

    def __enter__(self) -> "ChatEndpoint":
        return self.start()

    def __exit__(self, *exc: Any) -> None:
        self.close()

    @property
    def base_url(self) -> str:
        """``http://127.0.0.1:PORT/v1``: the ``base_url`` of an ``openai.OpenAI`` client."""
        return f"http://{self.host}:{self.port}/v1"

    def session_url(self, name: str) -> str:
        """The ``base_url`` whose calls record into session ``name`` (letters, digits, ``-_.``)."""
        if not name or not all(ch.isalnum() or ch in "-_." for ch in name):
            raise ValueError(f"a session name is letters, digits and -_. only, not {name!r}")
        return f"http://{self.host}:{self.port}/s/{name}/v1"

    def session(self, name: str) -> Session:
        """The session ``name`` (empty when nothing was recorded in it)."""
        with self._lock:
            return self.sessions.setdefault(name, Session(name))

    def pop(self, name: str) -> Session:
        """The session ``name``, forgotten by the endpoint (a trainer takes each episode's once)."""
        with self._lock:
            return self.sessions.pop(name, None) or Session(name)

    # -- one completion ----------------------------------------------------------------
    def complete(self, body: Any, session: str | None = None) -> dict[str, Any]:
        """Serve one ``/v1/chat/completions`` request body; the response body.

        Raises:
            RequestError: the request is malformed or asks for what is not supported.
        """
        started = time.perf_counter()
        if not isinstance(body, dict):
            raise RequestError("the request body must be a JSON object")
        if body.get("stream"):
            raise RequestError("complete() returns a whole completion; stream=true is served over HTTP",
                               param="stream")
        if body.get("n", 1) != 1:
            raise RequestError("n must be 1 (call once per sample)", param="n")
        if body.get("stop"):
            raise RequestError("stop sequences are not supported: turns end at the chat template's end token",
                               param="stop")
        if not isinstance(body.get("model", ""), str):
            raise RequestError("model must be a string", param="model")
        user = body.get("user")
        name = session if session is not None else (user if isinstance(user, str) else "")
        msgs = template_messages(body.get("messages"))
        tools = body.get("tools") or []
        if not isinstance(tools, list) or not all(
                isinstance(t, dict) and isinstance(t.get("function"), dict)
                and isinstance(t["function"].get("name"), str) for t in tools):
            raise RequestError('tools must be a list of {"type": "function", "function": {"name": ..., '
                               '"parameters": {...}}} objects', param="tools")
        max_new = body.get("max_completion_tokens", body.get("max_tokens"))
        max_new = self.max_tokens if max_new is None else max_new
        if not isinstance(max_new, int) or isinstance(max_new, bool) or not 1 <= max_new <= self.max_tokens:
            raise RequestError(f"max_tokens must be an integer from 1 to {self.max_tokens}", param="max_tokens")
        temperature = self.temperature if self.temperature is not None else _number(body, "temperature", 1.0, 0, 2)
        top_p = self.top_p if self.top_p is not None else _number(body, "top_p", 1.0, 0, 1)
        if top_p <= 0:
            raise RequestError("top_p must be greater than 0", param="top_p")
        seed = body.get("seed")
        if seed is not None and (not isinstance(seed, int) or isinstance(seed, bool)):
            raise RequestError("seed must be an integer", param="seed")
        want_logprobs = bool(body.get("logprobs"))

        self._check_size(msgs, tools, max_new)
        parent, prompt = self._prompt(name, msgs, tools)
        if self.max_context and len(prompt) + max_new > self.max_context:
            raise RequestError(f"the prompt is {len(prompt)} tokens; with max_tokens={max_new} it exceeds the "
                               f"context of {self.max_context}", param="messages")
        assert self._batcher is not None, "start() the endpoint first"
        gen = self._batcher.submit(prompt, (max_new, float(temperature), float(top_p), seed,
                                            tuple(self.stops))).result()
        if not gen.token_ids:
            raise RequestError("the policy returned text only (no token ids): it cannot be recorded for "
                               "training; serve an HF or vLLM policy", status=501)
        ids, text, closing = _split(gen, self.renderer, set(self.stops))
        sess = self.session(name)
        message, calls = assistant_message(text, len(sess.calls))
        call = Call(f"chatcmpl-{uuid.uuid4().hex}", parent, msgs, tools, prompt, ids, list(gen.logprobs),
                    list(gen.entropies), gen.finish_reason, text, closing, message, float(temperature),
                    self.renderer.encode(closing) if closing else [])
        with self._lock:
            sess.calls.append(call)
            if parent is not None:
                parent.children += 1
            sess._index.setdefault(chain_key(tools, [*msgs, message_as_template(message)]), []).append(call)
        finish = "tool_calls" if calls else ("stop" if gen.finish_reason == "stop" else "length")
        choice: dict[str, Any] = {"index": 0, "message": message, "finish_reason": finish, "logprobs": None}
        if want_logprobs:
            choice["logprobs"] = {"content": [
                {"token": self.renderer.decode([t]), "logprob": lp, "bytes": list(self.renderer.decode([t]).encode()),
                 "top_logprobs": []} for t, lp in zip(ids, gen.logprobs)]}
        self.latencies_s.append(time.perf_counter() - started)
        return {"id": call.id, "object": "chat.completion", "created": int(time.time()), "model": self.model,
                "choices": [choice],
                "usage": {"prompt_tokens": len(prompt), "completion_tokens": len(ids),
                          "total_tokens": len(prompt) + len(ids)},
                "envfactory": {"session": name, "parent": parent.id if parent else None,
                               "prompt_token_ids": prompt, "completion_token_ids": ids,
                               "logprobs": list(gen.logprobs), "temperature": float(temperature)}}

    def respond(self, body: Any, session: str | None = None) -> dict[str, Any]:
        """Serve one ``/v1/responses`` request body (as the chat completion it stands for, recorded
        alike); the Response body. ``previous_response_id`` continues a stored response.

        Raises:
            RequestError: the request is malformed or asks for what is not supported.
        """
        history = None
        if isinstance(body, dict) and body.get("previous_response_id") is not None:
            with self._lock:
                history = self._stored.get(body["previous_response_id"])
            if history is None:
                raise RequestError(f"no stored response {body['previous_response_id']!r} (the endpoint keeps the "
                                   f"last {STORED}, and none made with store=false)", status=404,
                                   param="previous_response_id")
        chat = responses_request_as_chat(body, history)
        completion = self.complete(chat, session)
        response = chat_as_response(completion, body)
        if body.get("store", True) is not False:
            answer = dict(completion["choices"][0]["message"])
            answer["content"] = answer.get("content") or ""
            # (instructions are not carried over to a continuation, as OpenAI's are not)
            kept = chat["messages"][1 if body.get("instructions") is not None else 0:] + [answer]
            with self._lock:
                self._stored[response["id"]] = kept
                while len(self._stored) > STORED:
                    self._stored.popitem(last=False)
        return response

    def _longest_token(self) -> int:
        """The most characters one token stands for (its vocabulary's longest entry; byte-level
        entries count bytes, never fewer than the characters they decode to)."""
        if self._token_chars is None:
            longest = 0
            try:
                vocab = self.policy.tokenizer.get_vocab()
                longest = max((len(k) for k in vocab), default=0)
            except Exception:  # noqa: BLE001 - a tokenizer without a vocabulary to read: no early refusal
                longest = 0
            self._token_chars = longest
        return self._token_chars

    def _check_size(self, msgs: list[dict[str, Any]], tools: list[dict[str, Any]], max_new: int) -> None:
        """Refuse, before tokenizing, a request whose text alone is longer than the context could
        hold (a 3 MiB prompt took 28 s to tokenize before it was refused as too long)."""
        if not self.max_context:
            return
        longest = self._longest_token()
        if longest <= 0:
            return
        chars = sum(len(m["content"]) if isinstance(m.get("content"), str) else 0 for m in msgs)
        room = (self.max_context - max_new) * longest
        if chars > room:
            raise RequestError(f"the messages hold {chars} characters: more than {self.max_context - max_new} tokens "
                               f"(the context of {self.max_context} less max_tokens={max_new}) whatever the "
                               "tokenizer makes of them", param="messages")

    def _prompt(self, name: str, msgs: list[dict[str, Any]], tools: list[dict[str, Any]]
                ) -> tuple[Call | None, list[int]]:
        """The call this request extends (the latest whose messages + answer are its longest
        prefix) and the prompt ids: token-in/token-out after it, else the whole rendering."""
        r = self.renderer
        with self._lock:
            index = self.sessions.get(name, Session(name))._index
            parent = None
            for k in range(len(msgs), 0, -1):
                if msgs[k - 1]["role"] == "assistant":
                    hits = index.get(chain_key(tools, msgs[:k]))
                    if hits:
                        parent = hits[-1]
                        break
        try:
            if parent is None:
                return None, r.opening(msgs, tools)
            tail = parent.closing + r.continuation(msgs[k:], add_generation_prompt=True)
        except Exception as exc:  # the template refused what the request holds (jinja raises many kinds)
            raise RequestError(f"the chat template cannot render these messages: {type(exc).__name__}: {exc}",
                               param="messages") from None
        return parent, parent.prompt_ids + parent.completion_ids + r.encode(tail)


def _number(body: dict[str, Any], key: str, default: float, lo: float, hi: float) -> float:
    v = body.get(key)
    if v is None:
        return default
    if not isinstance(v, (int, float)) or isinstance(v, bool) or not lo <= v <= hi:
        raise RequestError(f"{key} must be a number from {lo} to {hi}", param=key)
    return float(v)


def _handler(endpoint: ChatEndpoint) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"  # keep-alive, as the openai SDK's httpx client expects

        def setup(self) -> None:
            super().setup()
            self._raw = _Deadline(self.connection)
            self.rfile = io.BufferedReader(self._raw, 65536)  # type: ignore[assignment]

        def handle_one_request(self) -> None:
            self._raw.deadline = None  # idle until a request's first byte
            if not self.rfile.peek(1):  # the client closed (or the idle timeout: TimeoutError below)
                self.close_connection = True
                return
            self._raw.deadline = time.monotonic() + READ_TIMEOUT_S
            super().handle_one_request()

        def handle(self) -> None:
            try:
                super().handle()
            except (TimeoutError, OSError):  # idle too long, a request too slow, or a client gone
                self.close_connection = True

        def log_message(self, format: str, *args: Any) -> None:  # quiet: no line per request on stderr
            pass

        def _send(self, status: int, body: dict[str, Any]) -> None:
            self._write(status, json.dumps(body).encode(), "application/json")

        def _send_events(self, data: bytes) -> None:
            self._write(200, data, "text/event-stream", {"Cache-Control": "no-cache"})

        def _write(self, status: int, data: bytes, kind: str, headers: dict[str, str] | None = None) -> None:
            self.connection.settimeout(READ_TIMEOUT_S)  # (not what a read's deadline left)
            self.send_response(status)
            self.send_header("Content-Type", kind)
            for k, v in (headers or {}).items():
                self.send_header(k, v)
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def _route(self) -> tuple[str | None, str]:
            """(session from the path or None, the path under /v1)."""
            path = self.path.split("?", 1)[0].rstrip("/")
            session = None
            if path.startswith("/s/"):
                session, _, path = path[3:].partition("/")
                path = "/" + path
            if not path.startswith("/v1/"):
                raise RequestError(f"no route {self.path}: the API is under /v1", status=404)
            return session, path[3:]

        def do_GET(self) -> None:
            try:
                _, path = self._route()
                if path != "/models":
                    raise RequestError(f"no route GET {self.path}", status=404)
                self._send(200, {"object": "list", "data": [{"id": endpoint.model, "object": "model",
                                                              "created": 0, "owned_by": "envfactory"}]})
            except RequestError as exc:
                self._send(exc.status, exc.body())

        def do_POST(self) -> None:
            try:
                session, path = self._route()
                try:
                    length = int(self.headers.get("Content-Length") or 0)
                except ValueError:
                    length = -1
                if length < 0:
                    self.close_connection = True
                    raise RequestError("Content-Length must be a non-negative integer")
                if length > MAX_BODY:
                    self.close_connection = True  # the unread body must not be taken for the next request
                    raise RequestError(f"the request body is {length} bytes; at most {MAX_BODY} are read",
                                       status=413)
                self._raw.deadline = time.monotonic() + READ_TIMEOUT_S
                raw = self.rfile.read(length) if length > 0 else b""
                if len(raw) < length:
                    self.close_connection = True
                    raise RequestError(f"the request body ended after {len(raw)} of {length} bytes")
                if path not in ("/chat/completions", "/responses"):
                    raise RequestError(f"no route POST {self.path}: this endpoint serves /v1/chat/completions "
                                       "and /v1/responses", status=404)
                try:
                    body = json.loads(raw)
                except (ValueError, RecursionError) as exc:
                    raise RequestError(f"the request body is not valid JSON ({exc})") from None
                stream, opts = isinstance(body, dict) and bool(body.get("stream")), None
                if stream:
                    opts = body.get("stream_options")
                    body = {k: v for k, v in body.items() if k not in ("stream", "stream_options")}
                if path == "/responses":
                    answer = endpoint.respond(body, session)
                    if stream:
                        self._send_events(sse(response_stream_events(answer), named=True))
                    else:
                        self._send(200, answer)
                    return
                answer = endpoint.complete(body, session)
                if stream:
                    usage = isinstance(opts, dict) and bool(opts.get("include_usage"))
                    self._send_events(sse(chat_stream_events(answer, usage), named=False))
                else:
                    self._send(200, answer)
            except RequestError as exc:
                self._send(exc.status, exc.body())
            except Exception as exc:  # a backend failure: the client gets a JSON 500, the server goes on
                self._send(500, RequestError(f"{type(exc).__name__}: {exc}", status=500).body())

    return Handler
