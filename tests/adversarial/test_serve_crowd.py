"""An unauthenticated crowd cannot deny service to a token holder, and no client takes every
session slot by default (issue 63), on both network faces.

Before: uvicorn's connection limit (``--max-episodes`` + 64) counted every open connection, so 400
connections trickling request headers (no token) made a client with a valid token get HTTP 503
on 91 of 97 requests (MCP) and 92 of 100 (OpenEnv); one client's bare MCP ``initialize`` calls
filled the SDK's session table (every other client 503 until the 30-minute idle timeout); on
OpenEnv the per-client cap defaulted to the total. Now connections that have sent no authorized
request have a budget of their own (the oldest beyond it is closed), the server caps only
authorized requests, a transport session takes no episode slot (an episode-less one is closed
to make room), and with several tokens a client may hold an equal share of the sessions.

Runtime: about 20-30 s on 2 cores (two servers, 400 slow connections each).
"""

from __future__ import annotations

import socket
import threading
import time

import pytest

from conftest import require_module, serve_mcp_http, stop_process

require_module("openenv", "pip install 'envfactory[bench]' (scripts/setup.sh installs it)")
require_module("mcp", "pip install 'envfactory[mcp]'")

import httpx  # noqa: E402

from envfactory.faces.openenv_server import BackgroundServer  # noqa: E402

TOKEN = "crowd-test-token"
AUTH = {"authorization": "Bearer " + TOKEN}
_INIT = {"jsonrpc": "2.0", "id": 1, "method": "initialize",
         "params": {"protocolVersion": "2025-06-18", "capabilities": {}, "clientInfo": {"name": "t", "version": "0"}}}
_MCP = {"accept": "application/json, text/event-stream", "content-type": "application/json"}


class Crowd:
    """``n`` connections trickling a request head (one header every 0.2 s, no token), each opened
    again as soon as the server closes it, until stopped."""

    def __init__(self, url: str, n: int = 400) -> None:
        host, port = url.split("://")[1].split("/")[0].rsplit(":", 1)
        self.addr, self.n = (host, int(port)), n
        self.socks: list[socket.socket | None] = [None] * n
        self.opened = self.closed_by_server = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _open(self, i: int) -> None:
        try:
            s = socket.create_connection(self.addr, timeout=2)
            s.setblocking(False)
            s.send(b"GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\n")
            self.socks[i] = s
            self.opened += 1
        except OSError:
            self.socks[i] = None

    def _run(self) -> None:
        for i in range(self.n):
            self._open(i)
        k = 0
        while not self._stop.wait(0.2):
            k += 1
            for i, s in enumerate(self.socks):
                try:
                    if s is None:
                        raise OSError
                    try:
                        s.recv(1024)  # an answer (503, 408) or the end: the server cut it off
                        raise OSError
                    except BlockingIOError:
                        pass
                    s.send(b"X-Slow-%d: y\r\n" % k)
                except OSError:
                    if s is not None:
                        s.close()
                        self.closed_by_server += 1
                    self._open(i)

    def __enter__(self) -> "Crowd":
        self._thread.start()
        deadline = time.monotonic() + 20
        while self.opened < self.n and time.monotonic() < deadline:
            time.sleep(0.05)
        time.sleep(0.5)  # every connection has trickled a header or two
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(10)
        for s in self.socks:
            if s is not None:
                s.close()


def _answered(request, n: int = 100) -> list[int]:
    """``n`` requests, each on a fresh connection; their statuses (0: no answer)."""
    out = []
    for _ in range(n):
        try:
            out.append(request().status_code)
        except httpx.HTTPError:
            out.append(0)
    return out


def test_openenv_a_token_holder_is_served_through_a_crowd_of_slow_connections() -> None:
    with BackgroundServer("Counter-v0", token=TOKEN) as url:
        with Crowd(url) as crowd:
            got = _answered(lambda: httpx.get(url + "/tasks", headers={**AUTH, "connection": "close"}, timeout=10))
            assert crowd.opened >= 400
        assert got == [200] * 100, {s: got.count(s) for s in set(got)}
        assert crowd.closed_by_server > 0  # the crowd was cut down to its budget


def test_mcp_a_token_holder_is_served_through_a_crowd_of_slow_connections() -> None:
    proc, url, seen = serve_mcp_http("Counter-v0", env={"ENVFACTORY_TOKEN": TOKEN})
    assert url, seen
    try:
        with Crowd(url) as crowd:
            got = _answered(lambda: httpx.post(url, json=_INIT, headers={**_MCP, **AUTH, "connection": "close"},
                                               timeout=10))
            assert crowd.opened >= 400
        assert got == [200] * 100, {s: got.count(s) for s in set(got)}
    finally:
        stop_process(proc)


def test_mcp_bare_initialize_calls_take_no_episode_slot() -> None:
    """One client (one token of two) opens twice the server's sessions with bare ``initialize``
    calls: before, the SDK's table filled and the other client got 503; now the episode-less
    sessions are closed to make room, and the other client starts its episode."""
    proc, url, seen = serve_mcp_http("Counter-v0", "--max-episodes", "4", env={"ENVFACTORY_TOKEN": "a-tok,b-tok"})
    assert url, seen
    try:
        a = {**_MCP, "authorization": "Bearer a-tok"}
        codes = [httpx.post(url, json=_INIT, headers=a, timeout=10).status_code for _ in range(2 * (4 + 64))]
        assert set(codes) == {200}
        b = {**_MCP, "authorization": "Bearer b-tok"}
        r = httpx.post(url, json=_INIT, headers=b, timeout=10)
        assert r.status_code == 200, r.text
        sid = r.headers["mcp-session-id"]
        h = {**b, "mcp-session-id": sid, "mcp-protocol-version": "2025-06-18"}
        httpx.post(url, json={"jsonrpc": "2.0", "method": "notifications/initialized"}, headers=h, timeout=10)
        r = httpx.post(url, json={"jsonrpc": "2.0", "id": 2, "method": "tools/call",
                                  "params": {"name": "start_episode", "arguments": {"seed": 1}}}, headers=h, timeout=30)
        assert r.status_code == 200 and '"isError":false' in r.text.replace(" ", ""), r.text[:500]
    finally:
        stop_process(proc)


def test_openenv_a_client_holds_an_equal_share_by_default() -> None:
    """Two tokens, four sessions: each client may hold two (was: all four, by default)."""
    from websockets.exceptions import InvalidStatus
    from websockets.sync.client import connect

    with BackgroundServer("Counter-v0", token="a-tok,b-tok", max_sessions=4) as url:
        ws = url.replace("http://", "ws://") + "/ws"
        a = {"authorization": "Bearer a-tok"}
        with connect(ws, additional_headers=a, proxy=None), connect(ws, additional_headers=a, proxy=None):
            with pytest.raises(InvalidStatus) as refused:
                connect(ws, additional_headers=a, proxy=None, open_timeout=10)
            assert refused.value.response.status_code == 429
            with connect(ws, additional_headers={"authorization": "Bearer b-tok"}, proxy=None):
                pass
