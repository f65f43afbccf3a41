"""OpenEnv WebSocket sessions as tenants: a per-client cap, and an expired session's slot given back.

openenv-core holds a session (and its slot of ``max_concurrent_envs``) for as long as its WebSocket
is open. Two things it cannot know are done here, as ASGI middleware around its app:

* **Per-client cap.** A client (the token it presented, :func:`envfactory.faces.guard.client_of`)
  may hold at most ``per_client`` sessions at once: its WebSocket sessions and the sessions it
  opened with ``openenv/session/create`` over ``POST /mcp`` (what ``openenv`` 0.10's
  ``MCPToolClient`` does) that still live. One more handshake is refused 429 with a JSON error, one
  more ``/mcp`` session 429 with a JSON-RPC error, so one client cannot take every slot (was: the
  ``/mcp`` sessions were counted nowhere). A WebSocket that joins one of the client's own ``/mcp``
  sessions (``/ws?session_id=``, where the server joins rather than opens) is that session, not
  another. A server without tokens has no client beyond the connection, and then there is no
  per-client cap (each connection is one session).
* **Expired sessions close.** When the environment answers a request "session expired" (idle past
  the timeout, past ``--max-session-time``, or closed by the reaper), the connection is closed
  after that answer (code 1008, reason "session expired"), so openenv-core releases the session
  and its slot; was: a client that kept knocking kept the slot for ever.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Container
from typing import Any
from urllib.parse import parse_qs

from .guard import ASGIApp, Receive, Scope, Send, _json_response, _refuse, client_of

__all__ = ["WebSocketSessions", "EXPIRED_CLOSE_CODE"]

EXPIRED_CLOSE_CODE = 1008  # policy violation: the session is over; the client must open a new one


def _says_expired(message: dict[str, Any]) -> bool:
    text = message.get("text")
    if message.get("type") != "websocket.send" or not isinstance(text, str) or '"error"' not in text[:40]:
        return False
    try:
        data = json.loads(text).get("data") or {}
    except (ValueError, AttributeError):
        return False
    return isinstance(data, dict) and str(data.get("message", "")).startswith("session expired")


class WebSocketSessions:
    """ASGI middleware over openenv-core's app: ``per_client`` WebSocket sessions per client at
    most (``None``: no per-client cap), and a session that has expired is closed after saying so."""

    def __init__(self, app: ASGIApp, per_client: int | None = None, *,
                 live_sessions: Callable[[], Container[str]] | None = None, joins: bool = False) -> None:
        """``live_sessions``: the server's session ids now (a ``/mcp`` session reaped or closed
        stops counting; without it, only a ``openenv/session/close`` through here releases one);
        ``joins``: the server's ``/ws?session_id=`` joins that session (``openenv`` 0.10) rather
        than opening a new one (``openenv-core`` 0.3)."""
        if per_client is not None and per_client < 1:
            raise ValueError("the per-client session cap must be at least 1")
        self.app, self.per_client = app, per_client
        self._open: dict[str, int] = {}  # client -> WebSocket sessions open now (joins left out)
        self._mcp: dict[str, set[str]] = {}  # client -> sessions it opened over POST /mcp
        self._creating: dict[str, int] = {}  # client -> /mcp session creations in flight
        self._live, self._joins = live_sessions, joins

    def _held(self, client: str) -> int:
        mine = self._mcp.get(client)
        if mine and self._live is not None:
            live = self._live()
            mine.intersection_update([sid for sid in mine if sid in live])
        return self._open.get(client, 0) + len(mine or ()) + self._creating.get(client, 0)

    def _too_many(self, held: int) -> str:
        return (f"this client already holds {held} sessions, the server's limit per client "
                f"(--max-episodes-per-client {self.per_client}); close one and connect again")

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        client = client_of(scope)
        if scope["type"] == "http":
            if (client is not None and self.per_client is not None and scope.get("method") == "POST"
                    and scope.get("path") == "/mcp"):
                await self._mcp_request(client, scope, receive, send)
            else:
                await self.app(scope, receive, send)
            return
        if scope["type"] != "websocket":
            await self.app(scope, receive, send)
            return
        if client is not None and self.per_client is not None and self._joins:
            asked = parse_qs(scope.get("query_string", b"").decode("latin-1")).get("session_id", [""])[0]
            if asked and asked in self._mcp.get(client, ()):
                await self.app(scope, receive, send)  # its own /mcp session, counted there
                return
        counted = client is not None and self.per_client is not None
        if counted:
            assert client is not None and self.per_client is not None
            held = self._held(client)
            if held >= self.per_client:
                await _refuse(scope, send, 429, {"error": "too many sessions", "detail": self._too_many(held)})
                return
            self._open[client] = self._open.get(client, 0) + 1
        expired = False

        async def watched_send(message: dict[str, Any]) -> None:
            nonlocal expired
            if message.get("type") == "websocket.close" and expired:
                message = {**message, "code": EXPIRED_CLOSE_CODE, "reason": "session expired"}
            await send(message)
            expired = expired or _says_expired(message)

        async def watched_receive() -> dict[str, Any]:
            if expired:  # the application hears the client leave: it releases the session and closes
                return {"type": "websocket.disconnect", "code": EXPIRED_CLOSE_CODE}
            return await receive()

        try:
            await self.app(scope, watched_receive, watched_send)
        finally:
            if counted and client is not None:
                self._open[client] -= 1
                if not self._open[client]:
                    del self._open[client]

    async def _mcp_request(self, client: str, scope: Scope, receive: Receive, send: Send) -> None:
        """A ``POST /mcp``: ``openenv/session/create`` counted against the client's cap (refused
        beyond it; the session id it gets is the client's), ``openenv/session/close`` releasing
        one; any other method passed through as it came."""
        chunks, more = [], True
        while more:  # (the body's size is capped by the guard outside)
            message = await receive()
            if message["type"] != "http.request":
                await self.app(scope, receive, send)  # the client left: openenv-core hears it
                return
            chunks.append(message.get("body", b""))
            more = bool(message.get("more_body"))
        body = b"".join(chunks)
        replayed = False

        async def replay() -> dict[str, Any]:
            nonlocal replayed
            if not replayed:
                replayed = True
                return {"type": "http.request", "body": body, "more_body": False}
            return await receive()

        try:
            request = json.loads(body)
        except ValueError:
            request = None
        method = request.get("method") if isinstance(request, dict) else None
        if method == "openenv/session/close":
            params = request.get("params") if isinstance(request, dict) else None
            sid = params.get("session_id") if isinstance(params, dict) else None
            await self.app(scope, replay, send)
            if isinstance(sid, str) and (self._live is None or sid not in self._live()):
                self._mcp.get(client, set()).discard(sid)
            return
        if method != "openenv/session/create":
            await self.app(scope, replay, send)
            return
        assert self.per_client is not None and isinstance(request, dict)
        held = self._held(client)
        if held >= self.per_client:
            messages = _json_response(429, {"jsonrpc": "2.0", "id": request.get("id"), "error": {
                "code": -32000, "message": "too many sessions: " + self._too_many(held)}}, [])
            for m in messages:
                await send(m)
            return
        self._creating[client] = self._creating.get(client, 0) + 1
        reply: list[bytes] = []

        async def watched_send(message: dict[str, Any]) -> None:
            if message.get("type") == "http.response.body":
                reply.append(message.get("body", b""))
            await send(message)

        try:
            await self.app(scope, replay, watched_send)
        finally:
            self._creating[client] -= 1
            if not self._creating[client]:
                del self._creating[client]
            try:
                result = json.loads(b"".join(reply)).get("result")
            except (ValueError, AttributeError):
                result = None
            sid = result.get("session_id") if isinstance(result, dict) else None
            if isinstance(sid, str):
                self._mcp.setdefault(client, set()).add(sid)
