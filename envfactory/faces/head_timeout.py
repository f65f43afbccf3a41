"""A timeout on a request's head (request line and headers) for uvicorn, which has none, and a
budget of its own for the connections that have not yet sent an authorized request.

uvicorn's ``timeout_keep_alive`` covers only the idle time between requests and h11's
``max_incomplete_event_size`` only the head's size: a client that trickles a header every few
seconds (slowloris) holds its connection for as long as it likes. :func:`head_timeout_protocol` is
uvicorn's own HTTP protocol class (httptools, as uvicorn's ``auto`` picks it, else h11) with a
timer from the connection's opening or a request's first byte to its last header; when it fires
the client gets 408 and the connection closes.

uvicorn's ``limit_concurrency`` counts every open connection, so a crowd trickling headers (400
connections, no token) filled it and a client with a valid token got 503 on 91 of 97 requests
(issue 63). It is not used: a :class:`ConnectionGate` keeps the connections that have not yet
sent an authorized request (its head still arriving, or a request the token check refused) to a
budget of their own, :data:`DEFAULT_UNAUTHENTICATED` (the oldest beyond it is answered 503 and
closed, once it has had :data:`EVICTABLE_AFTER` seconds to send its head), and closes such a
connection after its refused request's answer. A request that passes the token check marks its
connection authorized (:func:`authorize`): it leaves the budget for good, and what the server
serves at once is capped by the app (:class:`envfactory.faces.guard.Admit`), counting authorized
requests only.
"""

from __future__ import annotations

from typing import Any, cast

import time
from collections import OrderedDict

__all__ = ["DEFAULT_HEADER_TIMEOUT", "DEFAULT_UNAUTHENTICATED", "EVICTABLE_AFTER", "CONNECTION_SCOPE",
           "ConnectionGate", "authorize", "head_timeout_protocol"]

DEFAULT_HEADER_TIMEOUT = 10.0  # seconds for a request's head to arrive whole (nginx's client_header_timeout: 60)
DEFAULT_UNAUTHENTICATED = 128  # connections without an authorized request yet, beyond which the oldest is closed
EVICTABLE_AFTER = 0.5  # seconds a connection has to send its first head before the budget may close it
HARD_FACTOR = 8  # budget x this: connections younger than EVICTABLE_AFTER past it are refused at once
CONNECTION_SCOPE = "envfactory.connection"  # the ASGI scope key of the request's connection (see authorize)


class ConnectionGate:
    """The connections of one server that have not (yet) sent an authorized request, oldest first,
    at most ``budget`` of them: when one more opens, the oldest that has been open
    :data:`EVICTABLE_AFTER` seconds is answered 503 and closed (a client that sends its head at
    once is never the oldest for long); past ``budget`` x :data:`HARD_FACTOR` (every one younger),
    the new one is. A client trickling its head is cut off by the header timeout, or sooner by
    the budget when others need room."""

    def __init__(self, budget: int = DEFAULT_UNAUTHENTICATED, evictable_after: float = EVICTABLE_AFTER) -> None:
        if budget < 1:
            raise ValueError("the budget of unauthenticated connections must be at least 1")
        self.budget, self.evictable_after = budget, evictable_after
        self.pending: OrderedDict[Any, float] = OrderedDict()  # protocol -> when it opened
        self.evicted = 0  # connections closed to make room (for tests and benchmarks)

    def opened(self, proto: Any) -> None:
        now = time.monotonic()
        pending = self.pending
        pending[proto] = now
        while len(pending) > self.budget:
            oldest, since = next(iter(pending.items()))
            if now - since < self.evictable_after:
                break
            del pending[oldest]
            self.evicted += 1
            oldest._gate_close(503)
        if len(pending) > self.budget * HARD_FACTOR:
            del pending[proto]
            self.evicted += 1
            proto._gate_close(503)

    def left(self, proto: Any) -> None:
        """``proto``'s request head is complete (it is served, or refused and then closed), or it closed."""
        self.pending.pop(proto, None)


class _Connection:
    """What a request's scope carries of its connection (:data:`CONNECTION_SCOPE`)."""

    __slots__ = ("authorized",)

    def __init__(self) -> None:
        self.authorized = False


def authorize(scope: dict[str, Any]) -> None:
    """Mark the connection of the request ``scope`` authorized (it passed the token check): it
    leaves the unauthenticated budget for good and stays open after its answers."""
    conn = scope.get(CONNECTION_SCOPE)
    if conn is not None:
        conn.authorized = True


class _HeadTimer:
    """What the HTTP protocol classes below share: a timer from the first byte of a request (or
    the connection's opening) to its last header; when it fires the client gets 408 and the
    connection closes, so a client trickling headers holds no connection slot for long."""

    header_timeout = DEFAULT_HEADER_TIMEOUT
    _head_timer: Any = None
    loop: Any
    transport: Any

    def _arm_head(self) -> None:
        if self._head_timer is None:
            self._head_timer = self.loop.call_later(self.header_timeout, self._head_too_slow)

    def _disarm_head(self) -> None:
        if self._head_timer is not None:
            self._head_timer.cancel()
            self._head_timer = None

    def _head_too_slow(self) -> None:
        self._head_timer = None
        self._gate_close(408)

    # -- the gate (see ConnectionGate) ------------------------------------------------------
    gate: ConnectionGate | None = None
    _conn: _Connection | None = None

    def _gate_open(self) -> None:
        self._conn = _Connection()
        if self.gate is not None:
            self.gate.opened(self)

    def _gate_head_done(self) -> None:
        if self.gate is not None:
            self.gate.left(self)

    def _gate_left(self) -> None:
        if self.gate is not None:
            self.gate.left(self)

    def _gate_response_done(self) -> None:
        """After an answer: a connection no request of which was authorized closes (it was refused)."""
        if self.gate is not None and self._conn is not None and not self._conn.authorized:
            if not self.transport.is_closing():
                self.transport.close()

    def _gate_close(self, status: int) -> None:
        self._disarm_head()
        if not self.transport.is_closing():
            line = b"408 Request Timeout" if status == 408 else b"503 Service Unavailable"
            self.transport.write(b"HTTP/1.1 " + line + b"\r\ncontent-length: 0\r\nconnection: close\r\n\r\n")
            self.transport.close()


def head_timeout_protocol(seconds: float, gate: ConnectionGate | None = None) -> type:
    """uvicorn's HTTP protocol class (httptools when installed, as uvicorn's ``auto`` picks, else
    h11) with a request-head timeout of ``seconds``, and, with ``gate``, the connections that have
    not sent an authorized request yet kept to its budget (see :class:`ConnectionGate`)."""
    if seconds <= 0:
        raise ValueError("the header timeout must be a number of seconds above 0")
    the_gate = gate
    try:
        import httptools  # noqa: F401
        from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol
    except ImportError:
        import h11
        from uvicorn.protocols.http.h11_impl import H11Protocol

        class H11HeadTimeout(_HeadTimer, H11Protocol):
            header_timeout = seconds
            gate = the_gate

            def connection_made(self, transport: Any) -> None:
                super().connection_made(transport)
                self._arm_head()
                self._gate_open()

            def data_received(self, data: bytes) -> None:
                super().data_received(data)
                if self.conn.their_state is h11.IDLE:  # still waiting for a whole request head
                    self._arm_head()
                else:
                    self._disarm_head()
                    self._gate_head_done()
                    scope = getattr(self, "scope", None)
                    if scope is not None and self._conn is not None:
                        scope[CONNECTION_SCOPE] = self._conn

            def handle_websocket_upgrade(self, event: Any) -> None:
                self._disarm_head()
                self._gate_left()
                super().handle_websocket_upgrade(event)

            def on_response_complete(self) -> None:
                super().on_response_complete()
                self._gate_response_done()

            def connection_lost(self, exc: Exception | None) -> None:
                self._disarm_head()
                self._gate_left()
                super().connection_lost(exc)

        return H11HeadTimeout

    class HttpToolsHeadTimeout(_HeadTimer, HttpToolsProtocol):
        header_timeout = seconds
        gate = the_gate

        def connection_made(self, transport: Any) -> None:
            super().connection_made(transport)
            self._arm_head()
            self._gate_open()

        def on_message_begin(self) -> None:
            super().on_message_begin()
            self._arm_head()
            if self._conn is not None:
                cast(dict, self.scope)[CONNECTION_SCOPE] = self._conn  # (an extra key of the ASGI scope)

        def on_headers_complete(self) -> None:
            self._disarm_head()
            self._gate_head_done()
            super().on_headers_complete()

        def handle_websocket_upgrade(self) -> None:
            self._gate_left()
            super().handle_websocket_upgrade()

        def on_response_complete(self) -> None:
            super().on_response_complete()
            self._gate_response_done()

        def connection_lost(self, exc: Exception | None) -> None:
            self._disarm_head()
            self._gate_left()
            super().connection_lost(exc)

    return HttpToolsHeadTimeout
