"""A timeout on a request's head (request line and headers) for uvicorn, which has none.

uvicorn's ``timeout_keep_alive`` covers only the idle time between requests and h11's
``max_incomplete_event_size`` only the head's size: a client that trickles a header every few
seconds (slowloris) holds its connection, and a slot of ``limit_concurrency``, for as long as it
likes. :func:`head_timeout_protocol` is uvicorn's own HTTP protocol class (httptools, as uvicorn's
``auto`` picks it, else h11) with a timer from the connection's opening or a request's first byte
to its last header; when it fires the client gets 408 and the connection closes.
"""

from __future__ import annotations

from typing import Any

__all__ = ["DEFAULT_HEADER_TIMEOUT", "head_timeout_protocol"]

DEFAULT_HEADER_TIMEOUT = 10.0  # seconds for a request's head to arrive whole (nginx's client_header_timeout: 60)


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
        if not self.transport.is_closing():
            self.transport.write(b"HTTP/1.1 408 Request Timeout\r\ncontent-length: 0\r\nconnection: close\r\n\r\n")
            self.transport.close()


def head_timeout_protocol(seconds: float) -> type:
    """uvicorn's HTTP protocol class (httptools when installed, as uvicorn's ``auto`` picks, else
    h11) with a request-head timeout of ``seconds``."""
    if seconds <= 0:
        raise ValueError("the header timeout must be a number of seconds above 0")
    try:
        import httptools  # noqa: F401
        from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol
    except ImportError:
        import h11
        from uvicorn.protocols.http.h11_impl import H11Protocol

        class H11HeadTimeout(_HeadTimer, H11Protocol):
            header_timeout = seconds

            def connection_made(self, transport: Any) -> None:
                super().connection_made(transport)
                self._arm_head()

            def data_received(self, data: bytes) -> None:
                super().data_received(data)
                if self.conn.their_state is h11.IDLE:  # still waiting for a whole request head
                    self._arm_head()
                else:
                    self._disarm_head()

            def connection_lost(self, exc: Exception | None) -> None:
                self._disarm_head()
                super().connection_lost(exc)

        return H11HeadTimeout

    class HttpToolsHeadTimeout(_HeadTimer, HttpToolsProtocol):
        header_timeout = seconds

        def connection_made(self, transport: Any) -> None:
            super().connection_made(transport)
            self._arm_head()

        def on_message_begin(self) -> None:
            super().on_message_begin()
            self._arm_head()

        def on_headers_complete(self) -> None:
            self._disarm_head()
            super().on_headers_complete()

        def connection_lost(self, exc: Exception | None) -> None:
            self._disarm_head()
            super().connection_lost(exc)

    return HttpToolsHeadTimeout
