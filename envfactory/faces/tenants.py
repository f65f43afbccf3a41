"""OpenEnv WebSocket sessions as tenants: a per-client cap, and an expired session's slot given back.

openenv-core holds a session (and its slot of ``max_concurrent_envs``) for as long as its WebSocket
is open. Two things it cannot know are done here, as ASGI middleware around its app:

* **Per-client cap.** A client (the token it presented, :func:`envfactory.faces.guard.client_of`)
  may hold at most ``per_client`` WebSocket sessions at once; one more handshake is refused 429
  with a JSON error, so one client cannot take every slot. A server without tokens has no client
  beyond the connection, and then there is no per-client cap (each connection is one session).
* **Expired sessions close.** When the environment answers a request "session expired" (idle past
  the timeout, past ``--max-session-time``, or closed by the reaper), the connection is closed
  after that answer (code 1008, reason "session expired"), so openenv-core releases the session
  and its slot; was: a client that kept knocking kept the slot for ever.
"""

from __future__ import annotations

import json
from typing import Any

from .guard import ASGIApp, Receive, Scope, Send, _refuse, client_of

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

    def __init__(self, app: ASGIApp, per_client: int | None = None) -> None:
        if per_client is not None and per_client < 1:
            raise ValueError("the per-client session cap must be at least 1")
        self.app, self.per_client = app, per_client
        self._open: dict[str, int] = {}  # client -> WebSocket sessions open now

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "websocket":
            await self.app(scope, receive, send)
            return
        client = client_of(scope)
        if client is not None and self.per_client is not None:
            held = self._open.get(client, 0)
            if held >= self.per_client:
                await _refuse(scope, send, 429, {
                    "error": "too many sessions",
                    "detail": f"this client already holds {held} sessions, the server's limit per client "
                              f"(--max-episodes-per-client {self.per_client}); close one and connect again"})
                return
            self._open[client] = held + 1
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
            if client is not None and self.per_client is not None:
                self._open[client] -= 1
                if not self._open[client]:
                    del self._open[client]
