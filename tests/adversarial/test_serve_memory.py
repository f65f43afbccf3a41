"""What sessions free goes back to the kernel, in the servers that hold many sessions on threads of
their own (issue 63).

glibc keeps what Python frees in the arena of the thread that allocated it, so eight sessions that
took turns at 25 MB states and reset left about 200 MB held with almost nothing live: a shared
container's server was OOM-killed at its 512 MiB limit by the 10**6-output fuzz
(``test_amplify_docker.py`` has that case), and ``envfactory serve``'s OpenEnv server, whose
sessions each run on an executor thread, held the same (92 -> 288 MiB here, 94 after a trim)."""

from __future__ import annotations

import json
import threading
import time

import pytest

from envfactory import processes

from conftest import require_module

require_module("openenv", "pip install 'envfactory[bench]' (scripts/setup.sh installs it)")

from websockets.sync.client import connect  # noqa: E402


def _rss_mib() -> int:
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) for line in f if line.startswith("VmRSS")) >> 10


@pytest.mark.skipif(processes.malloc_trim() is None, reason="not glibc: no malloc_trim to call")
def test_openenv_sessions_taking_turns_at_large_states_leave_no_memory_held(amplify) -> None:
    from envfactory.faces.openenv_server import BackgroundServer

    def ask(ws, kind: str, data: dict) -> dict:
        ws.send(json.dumps({"type": kind, "data": data}))
        return json.loads(ws.recv(timeout=120))

    with BackgroundServer("Amplify-v0", max_sessions=16) as url:
        wss = [connect(url.replace("http://", "ws://") + "/ws", proxy=None, open_timeout=10) for _ in range(8)]
        try:
            for ws in wss:
                assert ask(ws, "reset", {"task_id": "one-row"})["type"] == "observation"
            time.sleep(2)
            before = _rss_mib()
            errors: list[BaseException] = []

            def play(ws, k: int) -> None:
                try:
                    for r in range(4):
                        out = ask(ws, "step", {"tool_calls": [{"name": "fill", "arguments": {
                            "n": 5000 + 300 * k + 100 * r, "width": 4000}}]})
                        assert out["type"] == "observation", out
                        ask(ws, "reset", {"task_id": "one-row"})
                except BaseException as exc:  # noqa: BLE001 - reported below
                    errors.append(exc)

            threads = [threading.Thread(target=play, args=(ws, k)) for k, ws in enumerate(wss)]
            for t in threads:
                t.start()
            for t in threads:
                t.join()
            assert not errors, errors
            time.sleep(2.5)  # the trimmer looks each second
            grown = _rss_mib() - before
            assert grown < 64, f"the server's process kept {grown} MiB after every session was reset"
        finally:
            for ws in wss:
                ws.close()
