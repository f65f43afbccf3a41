"""The network faces shared by clients who do not trust each other (issue 28, serving): an
episode belongs to the client that started it (another client can neither play, read, end nor
evict it), a per-client cap keeps one client from taking every slot, a client trickling its
request headers is cut off while others are served, and an expired OpenEnv session gives its
slot back.

The client is the token it presents when the server has tokens (``--token A,B``: each token is
one client), else its transport session (the MCP session, the WebSocket connection)."""

from __future__ import annotations

import json
import socket
import time

import pytest

from conftest import require_module, serve_mcp_http, stop_process

require_module("openenv", "pip install 'envfactory[bench]' (scripts/setup.sh installs it)")
require_module("mcp", "pip install 'envfactory[mcp]'")

import httpx  # noqa: E402
from websockets.exceptions import ConnectionClosed, InvalidStatus  # noqa: E402
from websockets.sync.client import connect  # noqa: E402

from envfactory.env import EpisodeError  # noqa: E402
from envfactory.faces.mcp_server import EPISODE_META, EpisodeService  # noqa: E402
from envfactory.faces.openenv_server import BackgroundServer  # noqa: E402


def _ws(url: str, **kw):
    return connect(url.replace("http://", "ws://") + "/ws", proxy=None, open_timeout=10, **kw)


def _ask(ws, kind: str, data: dict | None = None) -> dict:
    ws.send(json.dumps({"type": kind, "data": data or {}}))
    return json.loads(ws.recv(timeout=30))


# -- 1. ownership ------------------------------------------------------------------------------
def test_mcp_another_session_cannot_play_an_episode_by_its_id():
    """Was: any MCP session that named an episode id in _meta played, read and ended that episode,
    whoever started it. Now the episode belongs to the session that started it."""
    import anyio
    from mcp import ClientSession
    from mcp.client.streamable_http import streamable_http_client

    proc, url, seen = serve_mcp_http("Counter-v0")
    assert url, seen
    try:
        async def main():
            async with streamable_http_client(url) as a_streams, streamable_http_client(url) as b_streams:
                async with ClientSession(a_streams[0], a_streams[1]) as a, \
                        ClientSession(b_streams[0], b_streams[1]) as b:
                    await a.initialize()
                    await b.initialize()
                    eid = (await a.call_tool("start_episode", {"seed": 1})).structured_content["episode"]
                    meta = {EPISODE_META: eid}
                    for name, args in (("read_counter", {}), ("episode_status", {}), ("end_episode", {}),
                                       ("start_episode", {"seed": 2})):
                        r = await b.call_tool(name, args, meta=meta)
                        assert r.is_error and "another client" in r.content[0].text, (name, r.content)
                    st = await a.call_tool("episode_status", {})
                    assert st.structured_content["episode"] == eid and st.structured_content["done"] is False
                    assert st.structured_content["tool_calls"] == 0
                    # the owner may name its episode by id too
                    assert not (await a.call_tool("read_counter", {}, meta=meta)).is_error

        anyio.run(main)
    finally:
        stop_process(proc)


def test_mcp_episodes_belong_to_the_token_that_started_them():
    """With several tokens each is a client: B cannot reach A's episode even knowing its id, and
    A's many episodes never evict B's."""
    service = EpisodeService("Counter-v0", max_episodes=4)
    try:
        victim = service.start(None, seed=1, client="token:b")["episode"]
        for _ in range(3):
            service.start(None, seed=1, client="token:a")
        with pytest.raises(EpisodeError, match="server full"):
            service.start(None, seed=1, client="token:a")
        for call in (lambda: service.status(victim, client="token:a"),
                     lambda: service.play(victim, "read_counter", {}, client="token:a"),
                     lambda: service.end(victim, client="token:a"),
                     lambda: service.start(victim, seed=2, client="token:a")):
            with pytest.raises(EpisodeError, match="another client"):
                call()
        st = service.status(victim, client="token:b")
        assert st["done"] is False and st["tool_calls"] == 0
    finally:
        service.close()


def test_mcp_http_each_token_is_one_client():
    """Over the wire with ``--token A,B``: B's sessions cannot reach A's episode; A's other
    sessions can (the client is the token, not the session); the per-client cap counts per token."""
    import anyio
    import httpx as _httpx
    from mcp import ClientSession
    from mcp.client.streamable_http import streamable_http_client

    proc, url, seen = serve_mcp_http("Counter-v0", "--max-episodes-per-client", "1",
                                     env={"ENVFACTORY_TOKEN": "token-a,token-b"})
    assert url, seen
    try:
        async def session(token, body):
            async with _httpx.AsyncClient(headers={"authorization": "Bearer " + token}) as http:
                async with streamable_http_client(url, http_client=http) as streams:
                    async with ClientSession(streams[0], streams[1]) as s:
                        await s.initialize()
                        return await body(s)

        async def main():
            async def start(s):
                return (await s.call_tool("start_episode", {"seed": 1})).structured_content["episode"]

            eid = await session("token-a", start)
            meta = {EPISODE_META: eid}

            async def as_b(s):
                r = await s.call_tool("read_counter", {}, meta=meta)
                assert r.is_error and "another client" in r.content[0].text, r.content
                return await start(s)  # b's own episode: its own share

            assert (await session("token-b", as_b)).startswith("ep-")

            async def as_a_again(s):
                assert not (await s.call_tool("read_counter", {}, meta=meta)).is_error
                r = await s.call_tool("start_episode", {"seed": 1})  # a second episode: over a's cap of 1
                assert r.is_error and "per client" in r.content[0].text, r.content

            await session("token-a", as_a_again)

        anyio.run(main)
    finally:
        stop_process(proc)


# -- 2. a per-client cap ---------------------------------------------------------------------
def test_mcp_one_client_cannot_take_every_slot():
    """Was: one client could hold all --max-episodes episodes, so nobody else could play. Now
    --max-episodes-per-client caps each client; the others still get episodes."""
    service = EpisodeService("Counter-v0", max_episodes=8, max_episodes_per_client=3)
    try:
        mine = [service.start(None, seed=1, client="token:a")["episode"] for _ in range(3)]
        with pytest.raises(EpisodeError, match="per client") as info:
            service.start(None, seed=1, client="token:a")
        assert "--max-episodes-per-client" in str(info.value)
        for _ in range(3):  # another client still gets its share
            service.start(None, seed=1, client="token:b")
        with pytest.raises(EpisodeError, match="per client"):
            service.start(None, seed=1, client="token:b")
        # a client's own finished episode makes room for its next one
        service.end(mine[0], client="token:a")
        service.start(None, seed=1, client="token:a")
        with pytest.raises(EpisodeError, match="released"):
            service.status(mine[0], client="token:a")
    finally:
        service.close()


def test_openenv_one_token_cannot_take_every_session():
    with BackgroundServer("Counter-v0", token="token-a,token-b", max_sessions=4, max_sessions_per_client=2) as url:
        a = {"Authorization": "Bearer token-a"}
        b = {"Authorization": "Bearer token-b"}
        with _ws(url, additional_headers=a) as a1, _ws(url, additional_headers=a) as a2:
            assert _ask(a1, "reset", {"seed": 1})["type"] == "observation"
            assert _ask(a2, "reset", {"seed": 1})["type"] == "observation"
            with pytest.raises(InvalidStatus) as info:
                _ws(url, additional_headers=a)
            assert info.value.response.status_code == 429 and b"per client" in info.value.response.body
            with _ws(url, additional_headers=b) as b1:
                assert _ask(b1, "reset", {"seed": 1})["type"] == "observation"
        with _ws(url, additional_headers=a) as a3:  # a's sessions closed: room again
            assert _ask(a3, "reset", {"seed": 1})["type"] == "observation"


def _mcp(url: str, headers: dict, method: str, params: dict | None = None) -> httpx.Response:
    return httpx.post(url + "/mcp", headers=headers, timeout=30,
                      json={"jsonrpc": "2.0", "id": 1, "method": method, "params": params or {}})


def test_openenv_sessions_opened_over_mcp_count_against_the_clients_cap():
    """Was: ``openenv/session/create`` over ``POST /mcp`` (what openenv 0.10's ``MCPToolClient``
    sends) opened a session that no per-client cap counted, so one token could take every slot
    of ``--max-episodes`` (the cap counted WebSockets only). Now a client's sessions are its
    WebSockets and the sessions it opened over ``/mcp`` that still live; one more is refused 429
    with a JSON-RPC error, and closing one (or its expiry) gives the room back."""
    with BackgroundServer("Counter-v0", token="token-a,token-b", max_sessions=4, max_sessions_per_client=2) as url:
        a = {"Authorization": "Bearer token-a"}
        b = {"Authorization": "Bearer token-b"}
        first = _mcp(url, a, "openenv/session/create")
        assert first.status_code == 200, first.text
        sid = first.json()["result"]["session_id"]
        with _ws(url, additional_headers=a) as a1:
            assert _ask(a1, "reset", {"seed": 1})["type"] == "observation"
            refused = _mcp(url, a, "openenv/session/create")
            assert refused.status_code == 429, refused.text
            assert "per client" in refused.json()["error"]["message"]
            with pytest.raises(InvalidStatus) as info:  # a WebSocket counts the /mcp session too
                _ws(url, additional_headers=a)
            assert info.value.response.status_code == 429
            other = _mcp(url, b, "openenv/session/create")  # another client is not held back
            assert other.status_code == 200 and "session_id" in other.json()["result"], other.text
        assert _mcp(url, a, "tools/list").status_code == 200  # no session asked: not refused
        closed = _mcp(url, a, "openenv/session/close", {"session_id": sid})
        assert closed.status_code == 200 and "error" not in closed.json(), closed.text
        again = [_mcp(url, a, "openenv/session/create") for _ in range(2)]  # room for two again
        assert [r.status_code for r in again] == [200, 200], [r.text for r in again]
        assert _mcp(url, a, "openenv/session/create").status_code == 429


# -- 3. slow headers ---------------------------------------------------------------------------
def _trickle(url: str, seconds: float) -> float | None:
    """Send a request head one header every 0.2 s for up to ``seconds``; the time the server took
    to answer (408) or close the connection, or ``None`` if it was still open."""
    host, port = url.split("://")[1].split("/")[0].rsplit(":", 1)
    s = socket.create_connection((host, int(port)), timeout=5)
    t0 = time.monotonic()
    try:
        s.sendall(b"GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\n")
        i = 0
        while time.monotonic() - t0 < seconds:
            time.sleep(0.2)
            try:
                s.sendall(b"X-Slow-%d: y\r\n" % i)
                s.settimeout(0.01)
                s.recv(1)  # an answer (408) or the end of the connection
                return time.monotonic() - t0
            except socket.timeout:
                pass
            except OSError:
                return time.monotonic() - t0
            i += 1
        return None
    finally:
        s.close()


def test_openenv_slow_headers_are_cut_off_while_others_are_served():
    """Was: a client trickling headers held its connection (and a slot of uvicorn's connection
    limit) for as long as it liked: 8 s of trickling, still open. Now --header-timeout closes it."""
    with BackgroundServer("Counter-v0", header_timeout=1.0) as url:
        import threading

        served: list[int] = []

        def others():
            for _ in range(5):
                served.append(httpx.get(url + "/health", timeout=5).status_code)
                time.sleep(0.2)

        t = threading.Thread(target=others)
        t.start()
        took = _trickle(url, 8.0)
        t.join()
        assert took is not None and took < 4.0, took
        assert served == [200] * 5


def test_mcp_http_slow_headers_are_cut_off():
    proc, url, seen = serve_mcp_http("Counter-v0", "--header-timeout", "1")
    assert url, seen
    try:
        took = _trickle(url, 8.0)
        assert took is not None and took < 4.0, took
        _INIT = {"jsonrpc": "2.0", "id": 1, "method": "initialize",
                 "params": {"protocolVersion": "2025-06-18", "capabilities": {},
                            "clientInfo": {"name": "t", "version": "0"}}}
        r = httpx.post(url, json=_INIT, headers={"accept": "application/json, text/event-stream"}, timeout=10)
        assert r.status_code == 200
    finally:
        stop_process(proc)


# -- 4. an expired OpenEnv session releases its slot -------------------------------------------
def test_openenv_expired_session_releases_its_slot():
    """Was: a session past --max-session-time that kept sending requests (each answered "session
    expired") kept its slot for ever: with one slot, nobody else could connect. Now the expired
    answer is followed by closing the connection, and the slot is free."""
    with BackgroundServer("Counter-v0", max_sessions=1, max_session_time=1.0) as url:
        with _ws(url) as old:
            assert _ask(old, "reset", {"seed": 1})["type"] == "observation"
            time.sleep(1.3)
            r = _ask(old, "step", {"text": "hi"})
            assert r["type"] == "error" and "session expired" in r["data"]["message"]
            try:  # the client keeps knocking, as a careless (or hostile) one does
                for _ in range(3):
                    _ask(old, "step", {"text": "hi"})
                    time.sleep(0.1)
            except ConnectionClosed as exc:
                assert exc.rcvd is not None and exc.rcvd.code == 1008 and "expired" in exc.rcvd.reason
            with _ws(url) as new:
                r = _ask(new, "reset", {"seed": 1})
                assert r["type"] == "observation", r


def test_header_timeout_holds_on_h11_too(monkeypatch):
    """Where httptools is missing uvicorn speaks h11: the same timeout, through h11's own state."""
    import threading

    import uvicorn

    from envfactory.faces.head_timeout import head_timeout_protocol

    monkeypatch.setitem(__import__("sys").modules, "httptools", None)  # import httptools: ImportError
    protocol = head_timeout_protocol(1.0)
    assert "H11" in protocol.__name__

    async def app(scope, receive, send):
        if scope["type"] != "http":
            return
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b"ok"})

    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    sock.listen(16)
    server = uvicorn.Server(uvicorn.Config(app, http=protocol, log_level="warning", lifespan="off"))
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    try:
        while not server.started:
            time.sleep(0.01)
        url = f"http://127.0.0.1:{sock.getsockname()[1]}"
        with httpx.Client() as http:  # keep-alive: the timer is off once a whole head arrived
            assert http.get(url, timeout=5).text == "ok"
            time.sleep(1.3)
            assert http.get(url, timeout=5).text == "ok"
        took = _trickle(url, 6.0)
        assert took is not None and took < 4.0, took
    finally:
        server.should_exit = True
        thread.join(timeout=10)
        sock.close()
