"""The network faces (``envfactory serve``: OpenEnv, MCP over streamable HTTP) against hostile
clients (issue 28): a token when asked for (401 with a JSON error otherwise, on HTTP and on the
WebSocket handshake), no non-loopback address without one unless told, body and WebSocket message
caps (413 / close 1009, the server keeps serving), idle sessions closed with a clear "session
expired" after, a bounded number of sessions with a clear refusal beyond it, and no client able to
evict another's episode."""

from __future__ import annotations

import base64
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from conftest import require_module, serve_mcp_http, stop_process

require_module("openenv", "pip install 'envfactory[bench]' (scripts/setup.sh installs it)")
require_module("mcp", "pip install 'envfactory[mcp]'")

import httpx  # noqa: E402
from openenv.core.generic_client import GenericEnvClient  # noqa: E402
from websockets.exceptions import ConnectionClosed, InvalidStatus  # noqa: E402
from websockets.sync.client import connect  # noqa: E402

from envfactory.env import EpisodeError  # noqa: E402
from envfactory.faces.mcp_server import EpisodeService  # noqa: E402
from envfactory.faces.openenv_server import BackgroundServer  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
TOKEN = "s3cret-token-for-tests"


def _ws(url: str, **kw):
    return connect(url.replace("http://", "ws://") + "/ws", proxy=None, open_timeout=10, **kw)


def _ask(ws, kind: str, data: dict | None = None) -> dict:
    ws.send(json.dumps({"type": kind, "data": data or {}}))
    return json.loads(ws.recv(timeout=30))


# -- OpenEnv face ----------------------------------------------------------------------------
def test_openenv_body_over_the_cap_is_413_and_the_server_keeps_serving():
    """Was: no body cap (a 512 MiB body took the server to 1.75 GB, then HTTP 500); an 8 MiB body
    was read whole and answered 422/200. Now 413 with a JSON error, declared or streamed."""
    big = json.dumps({"seed": 1, "pad": "x" * (8 << 20)})
    with BackgroundServer("Counter-v0") as url:
        r = httpx.post(url + "/reset", content=big, headers={"content-type": "application/json"}, timeout=30)
        assert r.status_code == 413 and "limited to" in r.json()["detail"]

        def chunks():  # no Content-Length: chunked, streamed past the cap
            for _ in range(9):
                yield b"x" * (1 << 20)

        r = httpx.post(url + "/reset", content=chunks(), headers={"content-type": "application/json"}, timeout=30)
        assert r.status_code == 413 and r.json()["error"] == "request body too large"
        assert httpx.get(url + "/health", timeout=10).status_code == 200
        r = httpx.post(url + "/reset", json={"seed": 1}, timeout=30)
        assert r.status_code == 200 and r.json()["observation"]["task_id"]
    with BackgroundServer("Counter-v0", max_body=1000) as url:  # configurable
        r = httpx.post(url + "/reset", json={"seed": 1, "pad": "x" * 2000}, timeout=30)
        assert r.status_code == 413 and "1000 bytes" in r.json()["detail"]


def test_openenv_websocket_message_over_the_cap_closes_only_that_connection():
    """Was: uvicorn's 16 MiB default; a 5 MiB step message was read and parsed. Now the cap is the
    body cap (4 MiB by default): that connection closes with 1009, the others play on."""
    with BackgroundServer("Counter-v0") as url:
        with _ws(url) as other:
            assert _ask(other, "reset", {"seed": 1})["type"] == "observation"
            with _ws(url) as ws:
                assert _ask(ws, "reset", {"seed": 1})["type"] == "observation"
                ws.send(json.dumps({"type": "step", "data": {"text": "y" * (5 << 20)}}))
                with pytest.raises(ConnectionClosed) as info:
                    ws.recv(timeout=30)
                assert info.value.rcvd is not None and info.value.rcvd.code == 1009
            assert _ask(other, "step", {"text": "Done."})["type"] == "observation"


def test_openenv_token_is_required_on_http_and_websocket():
    with BackgroundServer("Counter-v0", token=TOKEN) as url:
        for headers in ({}, {"authorization": "Bearer wrong"}, {"authorization": "Bearer " + TOKEN[:-1]},
                        {"authorization": "Basic !!notbase64"}):
            r = httpx.post(url + "/reset", json={"seed": 1}, headers=headers, timeout=10)
            assert r.status_code == 401 and "token" in r.json()["detail"], headers
            assert r.headers["www-authenticate"].startswith("Bearer")
        assert httpx.get(url + "/health", timeout=10).status_code == 401
        ok = httpx.post(url + "/reset", json={"seed": 1}, headers={"authorization": "Bearer " + TOKEN}, timeout=10)
        assert ok.status_code == 200
        with pytest.raises(InvalidStatus) as info:
            _ws(url)
        assert info.value.response.status_code == 401 and b"token" in info.value.response.body
        with _ws(url, additional_headers={"Authorization": "Bearer " + TOKEN}) as ws:
            assert _ask(ws, "reset", {"seed": 1})["type"] == "observation"
        # openenv-core's unchanged client: the token as the password of the URL (HTTP Basic)
        with GenericEnvClient(base_url=url.replace("http://", f"http://envfactory:{TOKEN}@")).sync() as env:
            assert env.reset(seed=1).observation["task_id"]
        # and envfactory's typed client takes it as an argument
        from envfactory.faces.openenv_server import EnvfactoryClient

        with EnvfactoryClient(base_url=url, token=TOKEN).sync() as env:
            assert env.reset(seed=1).observation.task_id
            assert env.list_tasks()


def test_openenv_idle_session_expires_with_a_clear_error():
    with BackgroundServer("Counter-v0", idle_timeout=1.5) as url:  # generous: a loaded machine answers slowly
        with _ws(url) as ws:
            assert _ask(ws, "reset", {"seed": 1})["type"] == "observation"
            assert _ask(ws, "step", {"text": "hi"})["type"] == "observation"
            time.sleep(2.0)
            r = _ask(ws, "step", {"text": "hi"})
            assert r["type"] == "error" and "session expired" in r["data"]["message"]
            # the session is over: the server closes the connection (its slot freed); reconnect
            with pytest.raises(ConnectionClosed) as info:
                _ask(ws, "reset", {"seed": 1})
            assert info.value.rcvd is not None and info.value.rcvd.code == 1008
        with _ws(url) as ws:
            assert _ask(ws, "reset", {"seed": 1})["type"] == "observation"


def test_openenv_reaper_releases_idle_sessions():
    """A session that never comes back is closed by openenv-core's reaper (its world released, its
    slot freed), so idle clients cannot hold the server's sessions forever."""
    with BackgroundServer("Counter-v0", idle_timeout=0.2, max_sessions=2) as url:
        idle = [_ws(url, legacy=True), _ws(url, legacy=True)]
        for ws in idle:
            assert _ask(ws, "reset", {"seed": 1})["type"] == "observation"
        deadline = time.monotonic() + 15  # the reaper looks every max(timeout / 4, 5 s)
        while True:
            with _ws(url) as ws:
                try:
                    r = _ask(ws, "reset", {"seed": 1})
                except ConnectionClosed:  # full: the server said so (CAPACITY_REACHED) and closed
                    r = {"type": "refused"}
            if r["type"] == "observation" or time.monotonic() > deadline:
                break
            time.sleep(0.5)
        assert r["type"] == "observation", r
        r = _ask(idle[0], "step", {"text": "hi"})
        assert r["type"] == "error" and "session expired" in r["data"]["message"]
        for ws in idle:
            ws.close()


def test_openenv_session_time_limit_ends_even_a_busy_session():
    with BackgroundServer("Counter-v0", max_session_time=1.0) as url:
        with _ws(url) as ws:
            assert _ask(ws, "reset", {"seed": 1})["type"] == "observation"
            deadline = time.monotonic() + 10
            while (r := _ask(ws, "step", {"text": "hi"}))["type"] == "observation" and time.monotonic() < deadline:
                if r["data"]["done"]:
                    assert _ask(ws, "reset", {"seed": 1})["type"] == "observation"
                time.sleep(0.1)
            assert r["type"] == "error" and "at most 1 s" in r["data"]["message"], r
        with _ws(url) as ws:
            assert _ask(ws, "reset", {"seed": 1})["type"] == "observation"


def test_openenv_close_waits_for_the_step_in_flight():
    """openenv-core's reaper closes a session on another thread than the one stepping it (a
    container world's step runs on the session's own thread): was, the world closed under the
    step. Now close() waits for it; the next request is "session expired"."""
    import threading

    from envfactory.faces.openenv_server import EnvfactoryAction, EnvfactoryEnvironment

    env = EnvfactoryEnvironment("Counter-v0")
    env.reset(seed=1)
    ep = env._episode
    real_step, order = ep.step, []

    def slow_step(action):
        order.append("step starts")
        time.sleep(0.5)
        out = real_step(action)
        order.append("step ends")
        return out

    ep.step = slow_step
    real_close = ep.close
    ep.close = lambda: (order.append("close"), real_close())
    stepping = threading.Thread(target=env.step, args=(EnvfactoryAction(text="hi"),))
    stepping.start()
    while not order:
        time.sleep(0.01)
    env.close()
    stepping.join()
    assert order == ["step starts", "step ends", "close"]
    with pytest.raises(EpisodeError, match="session expired"):
        env.step(EnvfactoryAction(text="hi"))


def test_openenv_sessions_beyond_the_limit_are_refused_clearly():
    with BackgroundServer("Counter-v0", max_sessions=2) as url:
        with _ws(url) as a, _ws(url) as b:
            assert _ask(a, "reset", {"seed": 1})["type"] == "observation"
            assert _ask(b, "reset", {"seed": 1})["type"] == "observation"
            with _ws(url) as c:
                r = json.loads(c.recv(timeout=10))
                assert r["type"] == "error" and r["data"]["code"] == "CAPACITY_REACHED" and \
                    "2" in r["data"]["message"]
            assert _ask(a, "step", {"text": "Done."})["type"] == "observation"


def test_openenv_on_loopback_refuses_web_pages():
    """Was: any web page the user opened could play on the loopback server (browsers let a page
    open a WebSocket to localhost; DNS rebinding sends a foreign Host). Now 403 for a foreign
    Origin or Host; clients that are not browsers (no Origin) and local pages play."""
    with BackgroundServer("Counter-v0") as url:
        with pytest.raises(InvalidStatus) as info:
            _ws(url, origin="http://evil.example")
        assert info.value.response.status_code == 403 and b"Origin" in info.value.response.body
        r = httpx.post(url + "/reset", json={"seed": 1}, headers={"host": "evil.example:8000"}, timeout=10)
        assert r.status_code == 403 and "Host" in r.json()["detail"]
        r = httpx.post(url + "/reset", json={"seed": 1}, headers={"origin": "https://evil.example"}, timeout=10)
        assert r.status_code == 403
        with _ws(url, origin="http://localhost:3000") as ws:
            assert _ask(ws, "reset", {"seed": 1})["type"] == "observation"
        assert httpx.post(url + "/reset", json={"seed": 1}, timeout=10).status_code == 200


def test_openenv_refuses_a_public_address_without_a_token():
    with pytest.raises(ValueError, match="without a token"):
        BackgroundServer("Counter-v0", host="0.0.0.0")
    with BackgroundServer("Counter-v0", host="0.0.0.0", token=TOKEN) as url:
        r = httpx.get(url.replace("0.0.0.0", "127.0.0.1") + "/health",
                      headers={"authorization": "Bearer " + TOKEN}, timeout=10)
        assert r.status_code == 200


def test_openenv_serves_tls_so_the_token_is_not_in_the_clear(tmp_path):
    import shutil
    import ssl

    if shutil.which("openssl") is None:
        pytest.skip("no openssl to make a test certificate")
    cert, key = tmp_path / "cert.pem", tmp_path / "key.pem"
    subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", str(key), "-out",
                    str(cert), "-days", "1", "-subj", "/CN=localhost", "-addext", "subjectAltName=IP:127.0.0.1"],
                   check=True, capture_output=True)
    ctx = ssl.create_default_context(cafile=str(cert))
    with BackgroundServer("Counter-v0", token=TOKEN, tls_cert=str(cert), tls_key=str(key)) as url:
        assert url.startswith("https://")
        r = httpx.post(url + "/reset", json={"seed": 1}, headers={"authorization": "Bearer " + TOKEN},
                       verify=ctx, timeout=10)
        assert r.status_code == 200
        with pytest.raises(httpx.HTTPError):  # plain HTTP is not served
            httpx.get(url.replace("https://", "http://") + "/health", timeout=10)
        with connect(url.replace("https://", "wss://") + "/ws", proxy=None, ssl=ctx,
                     additional_headers={"Authorization": "Bearer " + TOKEN}) as ws:
            assert _ask(ws, "reset", {"seed": 1})["type"] == "observation"
    with pytest.raises(ValueError, match="both"):
        BackgroundServer("Counter-v0", tls_cert=str(cert))


# -- MCP face: the episode service -----------------------------------------------------------
def test_mcp_sessions_of_one_client_cannot_evict_anothers_episode():
    """Was: 260 MCP sessions opened by another client evicted the victim's episode (least recently
    used, closed). Now a full server refuses new episodes with a clear error; live episodes stay."""
    service = EpisodeService("Counter-v0", max_episodes=256)
    try:
        victim = service.start("http:victim", seed=1)["episode"]
        for i in range(255):
            service.start(f"http:attacker-{i}", seed=1)
        with pytest.raises(EpisodeError, match="server full"):
            for i in range(255, 300):
                service.start(f"http:attacker-{i}", seed=1)
        assert service.status("http:victim")["episode"] == victim
        assert service.status(victim)["done"] is False
    finally:
        service.close()


def test_mcp_finished_episodes_make_room():
    service = EpisodeService("Counter-v0", max_episodes=2)
    try:
        a = service.start("http:a", seed=1)["episode"]
        service.start("http:b", seed=1)
        service.end("http:a")  # finished: its world may be released when room is needed
        service.start("http:c", seed=1)
        with pytest.raises(EpisodeError, match="released"):
            service.status(a)
        with pytest.raises(EpisodeError, match="server full"):
            service.start("http:d", seed=1)
    finally:
        service.close()


def test_mcp_idle_episode_expires_and_is_closed():
    service = EpisodeService("Counter-v0", idle_timeout=1.0)
    closed = []
    try:
        eid = service.start("http:idle", seed=1)["episode"]
        ep = service._episodes[eid]
        real_close = ep.close
        ep.close = lambda: (closed.append(eid), real_close())
        service.play("http:idle", "read_counter", {})
        time.sleep(1.5)
        with pytest.raises(EpisodeError, match="session expired"):
            service.status("http:idle")
        with pytest.raises(EpisodeError, match="session expired"):
            service.status(eid)
        assert closed == [eid] and eid not in service._episodes
        # starting again on the same session is a fresh episode
        assert service.start("http:idle", seed=1)["episode"] != eid
    finally:
        service.close()


def test_mcp_session_time_limit_ends_even_a_busy_episode():
    service = EpisodeService("Counter-v0", idle_timeout=None, max_session_time=0.5)
    try:
        eid = service.start("http:busy", seed=1)["episode"]
        t0 = time.monotonic()
        with pytest.raises(EpisodeError, match="time limit") as info:
            while time.monotonic() - t0 < 5:
                service.play("http:busy", "read_counter", {})
                time.sleep(0.05)
        assert time.monotonic() - t0 < 2 and eid not in service._episodes
        assert "session expired" in str(info.value)
    finally:
        service.close()


def test_mcp_episode_reaped_between_lookup_and_step_is_expired_not_stepped():
    """The reaper runs on its own thread: an episode it closes after a request looked it up and
    before the step starts is that request's "session expired" (was: the step ran on the closed
    world)."""
    service = EpisodeService("Counter-v0", idle_timeout=None)
    try:
        eid = service.start("http:x", seed=1)["episode"]
        real_episode = service.episode

        def looked_up_then_reaped(key, **kw):
            found = real_episode(key, **kw)
            with service._lock:
                service._drop(eid, "session expired: reaped just now")
            return found

        service.episode = looked_up_then_reaped
        stepped = []
        ep = service._episodes[eid]
        ep.step = lambda *a, **k: stepped.append(a)
        with pytest.raises(EpisodeError, match="reaped just now"):
            service.play("http:x", "read_counter", {})
        assert not stepped
    finally:
        service.close()


def test_mcp_reaper_closes_episodes_nobody_asks_about():
    service = EpisodeService("Counter-v0", idle_timeout=0.2)
    try:
        eid = service.start("http:gone", seed=1)["episode"]
        deadline = time.monotonic() + 5
        while eid in service._episodes and time.monotonic() < deadline:
            time.sleep(0.05)
        assert eid not in service._episodes
    finally:
        service.close()


def test_mcp_restarting_an_episode_by_id_reuses_it_instead_of_leaking_it():
    """Was: start_episode with _meta episode = an existing id made a second Episode under the same
    id and dropped the first without closing it (its world, a container session on Docker, leaked)."""
    service = EpisodeService("Counter-v0")
    try:
        eid = service.start(None, seed=1)["episode"]
        first = service._episodes[eid]
        closed = []
        first.close = lambda: closed.append(eid)
        again = service.start(eid, seed=2)
        assert again["episode"] == eid and service._episodes[eid] is first and not closed
        assert len(service._episodes) == 1
    finally:
        service.close()


def test_mcp_meta_names_only_episode_ids_not_other_sessions():
    """Was: _meta["envfactory/episode"] = "http:<another client's Mcp-Session-Id>" reached that
    client's episode (the value was used as the session key as it was). Only episode ids count."""
    from types import SimpleNamespace

    from envfactory.faces.mcp_server import EPISODE_META, _session_key

    def ctx(value, sid=None):
        return SimpleNamespace(meta={EPISODE_META: value},
                               request=SimpleNamespace(headers={"mcp-session-id": sid} if sid else {}))

    assert _session_key(ctx("http:victim", "mine"), False) == "http:mine"
    assert _session_key(ctx("stdio"), False) is None
    assert _session_key(ctx("ep-0123"), False) == "ep-0123"
    # was: any "ep-..." string became an episode id kept in memory (live, then among the expired):
    # 4 MiB ids x 4,096 remembered = 16 GiB. Now ids are at most 67 characters.
    assert _session_key(ctx("ep-" + "a" * (1 << 20), "mine"), False) == "http:mine"
    assert _session_key(ctx("ep-a/b"), False) is None


# -- MCP face over streamable HTTP (the CLI) --------------------------------------------------
def _serve(*extra: str, env: dict | None = None):
    return serve_mcp_http("Counter-v0", *extra, env=env)


_stop = stop_process


_INIT = {"jsonrpc": "2.0", "id": 1, "method": "initialize",
         "params": {"protocolVersion": "2025-06-18", "capabilities": {},
                    "clientInfo": {"name": "t", "version": "0"}}}
_MCP_HEADERS = {"accept": "application/json, text/event-stream", "content-type": "application/json"}


def test_mcp_http_token_body_cap_and_the_sdk_client():
    import anyio
    from mcp import ClientSession
    from mcp.client.streamable_http import streamable_http_client

    proc, url, seen = _serve(env={"ENVFACTORY_TOKEN": TOKEN})
    assert url, seen
    try:
        r = httpx.post(url, json=_INIT, headers=_MCP_HEADERS, timeout=10)
        assert r.status_code == 401 and "token" in r.json()["detail"]
        auth = {**_MCP_HEADERS, "authorization": "Bearer " + TOKEN}
        r = httpx.post(url, content=b"{" + b" " * (5 << 20) + b"}", headers=auth, timeout=30)
        assert r.status_code == 413
        r = httpx.post(url, json=_INIT, headers=auth, timeout=10)
        assert r.status_code == 200
        r = httpx.post(url, json=_INIT, headers={**auth, "origin": "http://evil.example"}, timeout=10)
        assert r.status_code == 403  # the MCP SDK's own DNS-rebinding protection, on loopback

        async def main():
            async with httpx.AsyncClient(headers={"authorization": "Bearer " + TOKEN}) as http:
                async with streamable_http_client(url, http_client=http) as streams:
                    async with ClientSession(streams[0], streams[1]) as s:
                        await s.initialize()
                        res = await s.call_tool("start_episode", {"seed": 1})
                        assert not res.is_error and res.structured_content["task_id"]

        anyio.run(main)
    finally:
        _stop(proc)


def test_mcp_http_idle_episode_is_session_expired_over_the_wire():
    """``--idle-timeout`` reaches the served episodes: a session-less client (the SDK's Client, the
    episode id in _meta) comes back after the timeout and is told its session expired."""
    import anyio
    from mcp import Client

    from envfactory.faces.mcp_server import EPISODE_META

    proc, url, seen = _serve("--idle-timeout", "1.5")
    assert url, seen
    try:
        async def main():
            async with Client(url) as c:
                start = await c.call_tool("start_episode", {"seed": 1})
                meta = {EPISODE_META: start.structured_content["episode"]}
                assert not (await c.call_tool("read_counter", {}, meta=meta)).is_error
                await anyio.sleep(2.0)
                late = await c.call_tool("read_counter", {}, meta=meta)
                assert late.is_error and "session expired" in late.content[0].text, late.content

        anyio.run(main)
    finally:
        _stop(proc)


def test_cli_refuses_a_public_address_without_a_token():
    for protocol in ("mcp", "openenv"):
        argv = [sys.executable, "-m", "envfactory.cli", "serve", "Counter-v0", "--protocol", protocol,
                "--host", "0.0.0.0", "--port", "0"]
        if protocol == "mcp":
            argv += ["--transport", "streamable-http"]
        env = {k: v for k, v in os.environ.items() if k != "ENVFACTORY_TOKEN"}
        r = subprocess.run(argv, cwd=ROOT, capture_output=True, text=True, timeout=60,
                           env={**env, "PYTHONPATH": str(ROOT)})
        assert r.returncode == 2 and "without a token" in r.stderr and "--token" in r.stderr, r.stderr
    r = subprocess.run([sys.executable, "-m", "envfactory.cli", "serve", "Counter-v0", "--protocol", "openenv",
                        "--port", "0", "--tls-cert", "cert.pem"], cwd=ROOT, capture_output=True, text=True,
                       timeout=60, env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert r.returncode == 2 and "--tls-key" in r.stderr, r.stderr


def test_basic_credentials_are_checked_like_bearer_ones():
    from envfactory.faces.guard import TokenGuard

    g = TokenGuard(None, TOKEN)  # type: ignore[arg-type]
    basic = base64.b64encode(f"anyone:{TOKEN}".encode())
    assert g._presented({"headers": [(b"authorization", b"Basic " + basic)]}) == TOKEN.encode()
    assert g._presented({"headers": [(b"authorization", b"Bearer " + TOKEN.encode())]}) == TOKEN.encode()
    assert g._presented({"headers": []}) is None
