"""The chat endpoint (agents.harness.endpoint.ChatEndpoint) under load and slow clients (issue 63.6).

Before: 64 concurrent clients lost 20 of 256 requests (a listen backlog of 5), every idle
keep-alive connection held a thread for ever (no timeout, no bound on threads), and a 3 MiB
prompt took 28 s of tokenizing before it was refused as longer than the context. Now the
backlog queues a burst, at most ``max_workers`` connections are served at once, an idle
connection is closed after ``IDLE_TIMEOUT_S`` and a request's head or body after
``READ_TIMEOUT_S``, and a prompt whose characters alone overflow the context is refused before
it is tokenized. A scripted policy (no model runs); about 15 s.
"""

from __future__ import annotations

import socket
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import pytest

httpx = pytest.importorskip("httpx")
pytest.importorskip("transformers")

from agents.harness import endpoint as endpoint_mod  # noqa: E402
from agents.harness.endpoint import ChatEndpoint  # noqa: E402
from agents.policies.scripted_model import ScriptedModel  # noqa: E402

HI = {"model": "m", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4}


@pytest.fixture(scope="module")
def policy():
    from transformers import AutoTokenizer

    from agents.models.tiny import build_tiny_model

    return ScriptedModel(AutoTokenizer.from_pretrained(build_tiny_model()), lambda prompt, turn: "ok")


def test_a_burst_of_64_clients_loses_no_request(policy) -> None:
    with ChatEndpoint(policy, max_tokens=4) as ep:
        url = ep.base_url + "/chat/completions"

        def client(_: int) -> list[int]:
            return [httpx.post(url, json=HI, headers={"connection": "close"}, timeout=60).status_code
                    for _ in range(4)]

        with ThreadPoolExecutor(64) as pool:
            codes = [c for cs in pool.map(client, range(64)) for c in cs]
    assert codes == [200] * 256, {c: codes.count(c) for c in set(codes)}


def test_idle_connections_are_closed_and_hold_at_most_max_workers_threads(policy, monkeypatch) -> None:
    monkeypatch.setattr(endpoint_mod, "IDLE_TIMEOUT_S", 1.0)
    before = threading.active_count()
    with ChatEndpoint(policy, max_tokens=4, max_workers=4) as ep:
        idle = [socket.create_connection((ep.host, ep.port), timeout=10) for _ in range(20)]
        time.sleep(0.5)
        assert threading.active_count() <= before + 2 + 4  # the server's threads, and 4 workers
        t0 = time.monotonic()
        r = httpx.post(ep.base_url + "/chat/completions", json=HI, timeout=60)  # served once idle ones go
        assert r.status_code == 200 and time.monotonic() - t0 < 30
        for s in idle:  # each was closed by the server (EOF), none is still held
            s.settimeout(30)
            assert s.recv(1) == b""
            s.close()


def test_a_request_dripped_byte_by_byte_is_cut_off(policy, monkeypatch) -> None:
    monkeypatch.setattr(endpoint_mod, "READ_TIMEOUT_S", 1.0)
    with ChatEndpoint(policy, max_tokens=4) as ep:
        with socket.create_connection((ep.host, ep.port), timeout=10) as s:
            s.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 100\r\n\r\n{")
            t0 = time.monotonic()
            closed = None
            for _ in range(40):
                time.sleep(0.2)
                try:
                    s.sendall(b" ")
                except OSError:
                    closed = time.monotonic() - t0
                    break
                s.settimeout(0.01)
                try:
                    if s.recv(65536) == b"":
                        closed = time.monotonic() - t0
                        break
                except socket.timeout:
                    pass
        assert closed is not None and closed < 5, closed
        assert httpx.post(ep.base_url + "/chat/completions", json=HI, timeout=60).status_code == 200


def test_a_prompt_longer_than_the_context_is_refused_before_it_is_tokenized(policy) -> None:
    with ChatEndpoint(policy, max_tokens=4) as ep:
        calls = []
        real = ep.renderer.opening

        def counted(*a, **kw):
            calls.append(1)
            return real(*a, **kw)

        ep.renderer.opening = counted
        huge = {**HI, "messages": [{"role": "user", "content": "word " * (600 << 10)}]}  # 3 MiB
        t0 = time.monotonic()
        r = httpx.post(ep.base_url + "/chat/completions", json=huge, timeout=60)
        took = time.monotonic() - t0
        assert r.status_code == 400 and "characters" in r.json()["error"]["message"], r.text[:300]
        assert calls == [] and took < 10, took
        assert httpx.post(ep.base_url + "/chat/completions", json=HI, timeout=60).status_code == 200
