"""What makes a network face safe to expose: a bearer token, bounded requests, bounded sessions.

Shared by ``envfactory serve --protocol mcp --transport streamable-http`` and ``--protocol openenv``
(ASGI apps run by uvicorn). The libraries' own limits are used where they exist: the MCP SDK's
``max_request_body_size`` / ``session_idle_timeout`` / ``max_sessions``, openenv-core's
``ConcurrencyConfig`` (``max_concurrent_envs``, ``session_timeout``), uvicorn's ``ws_max_size``
(WebSocket messages) and ``limit_concurrency`` (connections; 503 beyond it). What none of them
does is here: :class:`TokenGuard` (one shared secret, compared in constant time, on every HTTP
request and WebSocket handshake) and :class:`BodyLimit` (a JSON 413 for an HTTP body over the cap,
declared or streamed, before the application reads it).

Clients: with tokens (``--token A,B,...``: several, comma-separated), each token is one client,
and :class:`TokenGuard` names it in the request's scope (:data:`CLIENT_SCOPE`, ``token:`` and a
digest of the token, never the token itself); the faces then keep each client to its own episodes
and to its per-client cap. Without tokens the client is the transport session (the MCP session,
the WebSocket connection). :func:`uvicorn_config` also answers 408 and closes a connection whose
request head has not fully arrived ``DEFAULT_HEADER_TIMEOUT`` seconds after it started
(:mod:`envfactory.faces.head_timeout`: uvicorn has no such limit of its own).

Defaults: no token on loopback; :func:`check_exposure` refuses a non-loopback address without
one unless told ``allow_no_token``. Bodies and WebSocket messages: :data:`DEFAULT_MAX_BODY`
(4 MiB, the MCP SDK's own). Idle sessions close after :data:`DEFAULT_IDLE_TIMEOUT` seconds
(30 minutes, the MCP SDK's own); a later request to one is a "session expired" error.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import ipaddress
import json
import os
import socket
from typing import Any, Awaitable, Callable, Sequence

from ..env import EpisodeError
from .head_timeout import DEFAULT_HEADER_TIMEOUT, DEFAULT_UNAUTHENTICATED, ConnectionGate, authorize

__all__ = ["TOKEN_VARIABLE", "CLIENT_SCOPE", "DEFAULT_MAX_BODY", "DEFAULT_IDLE_TIMEOUT", "DEFAULT_HEADER_TIMEOUT",
           "CONNECTION_HEADROOM", "DEFAULT_UNAUTHENTICATED", "SessionExpired", "client_of", "tokens_of",
           "resolve_token", "is_loopback", "check_exposure", "TokenGuard", "BodyLimit", "LocalOnly", "Admit", "guard",
           "uvicorn_config", "scheme", "per_client_default"]

TOKEN_VARIABLE = "ENVFACTORY_TOKEN"
DEFAULT_MAX_BODY = 4 << 20
DEFAULT_IDLE_TIMEOUT = 1800.0
CLIENT_SCOPE = "envfactory.client"  # the ASGI scope key naming the client (see client_of)
CONNECTION_HEADROOM = 64  # authorized requests in flight beyond the sessions before a 503 (Admit)

Scope = dict[str, Any]
Receive = Callable[[], Awaitable[dict[str, Any]]]
Send = Callable[[dict[str, Any]], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]


class SessionExpired(EpisodeError):
    """A request to a session the server has closed (idle past the timeout, or released)."""


def resolve_token(token: str | None) -> str | None:
    """The token to require: ``token``, else ``$ENVFACTORY_TOKEN``; ``None`` (or empty): none."""
    token = token if token is not None else os.environ.get(TOKEN_VARIABLE)
    return token or None


def tokens_of(token: str) -> list[str]:
    """The tokens a ``--token`` value names: several, comma-separated, each one client's."""
    tokens = [t.strip() for t in token.split(",") if t.strip()]
    if not tokens:
        raise ValueError("--token names no token (an empty value or only commas)")
    return tokens


def client_of(scope: Scope) -> str | None:
    """The client a request comes from, as :class:`TokenGuard` named it (``token:`` and a digest of
    the token it presented); ``None`` on a server without tokens (then the transport session is the
    client)."""
    value = scope.get(CLIENT_SCOPE)
    return value if isinstance(value, str) else None


def per_client_default(total: int, token: str | None) -> int:
    """The sessions one client may hold when ``--max-episodes-per-client`` is not given: an equal
    share of ``total`` among the clients the tokens name (one token, or none: ``total``, there
    being no other client to keep room for), so that no client can take every slot."""
    n = len(tokens_of(token)) if token else 1
    return max(1, -(-total // n))


def is_loopback(host: str) -> bool:
    """Whether every address ``host`` names is a loopback address (a name is resolved)."""
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        pass
    try:
        infos = socket.getaddrinfo(host, None)
    except OSError:
        return False
    return bool(infos) and all(ipaddress.ip_address(str(i[4][0]).split("%")[0]).is_loopback for i in infos)


def check_exposure(host: str, token: str | None, allow_no_token: bool = False) -> None:
    """Raise ``ValueError`` for a server about to listen beyond loopback with no token (anyone who
    can reach the port could play, fill the sessions, or run the environment's tools), unless
    ``allow_no_token`` says that is meant (a trusted network, a proxy that authenticates)."""
    if token is None and not allow_no_token and not is_loopback(host):
        raise ValueError(f"refusing to serve on {host} without a token: anyone who reaches it could play; "
                         f"pass --token (or set {TOKEN_VARIABLE}) and give clients the same token, or "
                         "--allow-no-token if the network is trusted")


def _json_response(status: int, body: dict[str, Any],
                   headers: Sequence[tuple[bytes, bytes]] = ()) -> list[dict[str, Any]]:
    data = json.dumps(body).encode()
    return [{"type": "http.response.start", "status": status,
             "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(data)).encode()),
                         *headers]},
            {"type": "http.response.body", "body": data}]


async def _refuse(scope: Scope, send: Send, status: int, body: dict[str, Any],
                  headers: Sequence[tuple[bytes, bytes]] = ()) -> None:
    """An HTTP error reply, or for a WebSocket handshake the same reply as its denial response
    (uvicorn's ``websocket.http.response`` extension; a bare close where the server lacks it)."""
    messages = _json_response(status, body, list(headers))
    if scope["type"] == "websocket":
        if "websocket.http.response" not in scope.get("extensions", {}):
            await send({"type": "websocket.close", "code": 1008, "reason": body.get("detail", "")[:120]})
            return
        messages = [{**m, "type": "websocket." + m["type"]} for m in messages]
    for m in messages:
        await send(m)


class TokenGuard:
    """ASGI middleware: every HTTP request and WebSocket handshake must carry ``token`` as
    ``Authorization: Bearer TOKEN`` (or HTTP Basic with the token as the password, which clients
    send for a URL such as ``http://user:TOKEN@host:port``); else 401 with a JSON error. The
    comparison takes the same time wherever the tokens differ. ``token`` may name several,
    comma-separated: each is one client, named in the scope (:func:`client_of`)."""

    def __init__(self, app: ASGIApp, token: str) -> None:
        self.app = app
        self._tokens = [(t.encode(), "token:" + hashlib.sha256(t.encode()).hexdigest()[:16])
                        for t in tokens_of(token)]

    def _presented(self, scope: Scope) -> bytes | None:
        for name, value in scope.get("headers", ()):
            if name.lower() != b"authorization":
                continue
            kind, _, cred = value.strip().partition(b" ")
            if kind.lower() == b"bearer":
                return cred.strip()
            if kind.lower() == b"basic":
                try:
                    return base64.b64decode(cred.strip(), validate=True).partition(b":")[2]
                except (binascii.Error, ValueError):
                    return None
        return None

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] not in ("http", "websocket"):
            await self.app(scope, receive, send)
            return
        got = self._presented(scope)
        client = None
        if got is not None:
            for token, name in self._tokens:  # every one compared: the time says nothing about which
                if hmac.compare_digest(got, token):
                    client = name
        if client is not None:
            authorize(scope)
            await self.app({**scope, CLIENT_SCOPE: client}, receive, send)
            return
        why = "no token" if got is None else "a wrong token"
        await _refuse(scope, send, 401, {
            "error": "unauthorized",
            "detail": f"this server requires a token and the request carried {why}: send "
                      "'Authorization: Bearer TOKEN' (or a URL http://user:TOKEN@host:port)"},
            [(b"www-authenticate", b'Bearer realm="envfactory"')])


def _local_name(host: str | None) -> bool:
    if not host:
        return False
    if host.lower() == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


class LocalOnly:
    """ASGI middleware for a server on a loopback address: a request whose ``Host`` is not a
    loopback name (DNS rebinding: a web page's name re-pointed at 127.0.0.1) or whose ``Origin``
    is a web page elsewhere (browsers let any page open a WebSocket to localhost) is refused 403,
    so no web page the user visits can play episodes here. Clients that are not browsers send no
    ``Origin`` and pass. (The MCP SDK guards its own app the same way.)"""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] not in ("http", "websocket"):
            await self.app(scope, receive, send)
            return
        from urllib.parse import urlsplit

        headers = {k.lower(): v.decode("latin-1") for k, v in scope.get("headers", ())}
        why = None
        try:
            host = urlsplit("//" + headers.get(b"host", "")).hostname
        except ValueError:
            host = None
        if not _local_name(host):
            why = f"Host {headers.get(b'host', '')!r} is not this machine's loopback name"
        elif b"origin" in headers:
            try:
                origin = urlsplit(headers[b"origin"]).hostname
            except ValueError:
                origin = None
            if not _local_name(origin):
                why = f"Origin {headers[b'origin']!r} is a web page elsewhere"
        if why is None:
            await self.app(scope, receive, send)
            return
        await _refuse(scope, send, 403, {"error": "forbidden",
                                         "detail": f"{why}: this server listens on loopback for local clients only"})


class BodyLimit:
    """ASGI middleware: an HTTP request body over ``max_body`` bytes is answered 413 with a JSON
    error, whether its ``Content-Length`` says so (nothing is read) or it streams past the cap
    (reading stops there); the connection's server keeps serving."""

    def __init__(self, app: ASGIApp, max_body: int) -> None:
        if max_body <= 0:
            raise ValueError("max_body must be a positive number of bytes")
        self.app, self.max_body = app, max_body

    def _reply(self) -> list[dict[str, Any]]:
        return _json_response(413, {"error": "request body too large",
                                    "detail": f"request bodies are limited to {self.max_body} bytes "
                                              "(the server's --max-body)"}, [(b"connection", b"close")])

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        for name, value in scope.get("headers", ()):
            if name.lower() == b"content-length":
                try:
                    declared = int(value)
                except ValueError:
                    declared = -1
                if declared > self.max_body:
                    for m in self._reply():
                        await send(m)
                    return
        seen = 0
        started = replied = False

        async def counted() -> dict[str, Any]:
            # past the cap: the 413 goes out now and the application sees the client gone (an
            # exception raised here could be caught by it, as FastAPI's body parsing does)
            nonlocal seen, replied
            if replied:
                return {"type": "http.disconnect"}
            message = await receive()
            if message["type"] == "http.request":
                seen += len(message.get("body", b""))
                if seen > self.max_body and not started:
                    replied = True
                    for m in self._reply():
                        await send(m)
                    return {"type": "http.disconnect"}
            return message

        async def tracked(message: dict[str, Any]) -> None:
            nonlocal started
            if replied:  # whatever the application says after the 413 is dropped
                return
            started = started or message["type"] == "http.response.start"
            await send(message)

        try:
            await self.app(scope, counted, tracked)
        except Exception:
            if not replied:
                raise


class Admit:
    """ASGI middleware, inside the token check: what reaches it is authorized (its connection is
    marked so: :func:`envfactory.faces.head_timeout.authorize`, it leaves the unauthenticated
    budget), and at most ``limit`` such requests and WebSocket sessions are served at once; one
    more is answered 503 with a JSON error. (uvicorn's ``limit_concurrency`` counted every open
    connection, a crowd's slow heads included: issue 63.)"""

    def __init__(self, app: ASGIApp, limit: int | None) -> None:
        self.app, self.limit = app, limit
        self.in_flight = 0

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] not in ("http", "websocket"):
            await self.app(scope, receive, send)
            return
        authorize(scope)
        if self.limit is not None and self.in_flight >= self.limit:
            await _refuse(scope, send, 503, {"error": "server busy",
                                             "detail": f"{self.in_flight} requests and sessions are being served, "
                                                       "the server's limit; try again shortly"})
            return
        self.in_flight += 1
        try:
            await self.app(scope, receive, send)
        finally:
            self.in_flight -= 1


def guard(app: ASGIApp, *, token: str | None, max_body: int | None, local_only: bool = False,
          max_in_flight: int | None = None) -> ASGIApp:
    """``app`` behind the body cap (when ``max_body``), the cap on authorized requests served at
    once (``max_in_flight``, :class:`Admit`), the token check (when ``token``) and the loopback
    Host/Origin check (when ``local_only``): a request without the token is refused before its
    body is read, and counts in no cap but the unauthenticated connections' own."""
    if max_body is not None:
        app = BodyLimit(app, max_body)
    app = Admit(app, max_in_flight)
    if token is not None:
        app = TokenGuard(app, token)
    if local_only:
        app = LocalOnly(app)
    return app


def uvicorn_config(app: Any, *, max_body: int, max_sessions: int, tls_cert: str | None = None,
                   tls_key: str | None = None, header_timeout: float = DEFAULT_HEADER_TIMEOUT,
                   unauthenticated: int = DEFAULT_UNAUTHENTICATED, **kw: Any) -> Any:
    """uvicorn's config with its own limits set: WebSocket messages over ``max_body`` close that
    connection (1009, message too big); a request whose head has not arrived whole
    ``header_timeout`` seconds after it began is answered 408 and its connection closed; the
    connections that have sent no authorized request yet are kept to ``unauthenticated`` (a
    :class:`~envfactory.faces.head_timeout.ConnectionGate`: beyond it the oldest is closed), so a
    crowd without the token cannot keep a client with it out. uvicorn's own ``limit_concurrency``
    (which counted every connection) is off: the app caps the authorized requests served at once
    (:class:`Admit`, ``max_sessions`` plus :data:`CONNECTION_HEADROOM` where the faces build it).
    With ``tls_cert`` (and ``tls_key``, PEM files) uvicorn serves HTTPS / WSS, so the token does not
    travel in the clear. The process hands what its sessions free back to the kernel
    (:func:`envfactory.processes.start_memory_trimmer`: each session runs on a thread of its own)."""
    import uvicorn

    from ..processes import start_memory_trimmer

    from .head_timeout import head_timeout_protocol

    if (tls_cert is None) != (tls_key is None):
        raise ValueError("TLS needs both a certificate and its key (--tls-cert and --tls-key)")
    gate = ConnectionGate(unauthenticated)
    config = uvicorn.Config(app, log_level="warning", ws_max_size=max_body,
                            http=head_timeout_protocol(header_timeout, gate), limit_concurrency=None,
                            ssl_certfile=tls_cert, ssl_keyfile=tls_key, **kw)
    config.envfactory_gate = gate  # type: ignore[attr-defined]
    start_memory_trimmer()
    return config


def scheme(tls_cert: str | None) -> str:
    """``https`` when serving TLS, else ``http``."""
    return "http" if tls_cert is None else "https"
