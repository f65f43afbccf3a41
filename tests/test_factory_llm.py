"""The LLM repair loop against a local OpenAI-compatible server that replays recorded answers.

Verification runs in a Docker container by default (the tests that use the default need an
engine); ``sandbox="process"`` is the unsafe opt-in, used here where the sandbox is not what
is tested. tests/adversarial/test_generated_contained.py proves that generated modules never
run on the host.
"""

from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from envfactory.cli import main
from envfactory.factory.from_prompt import generate_from_prompt, load_generated
from envfactory.factory.sandbox import SandboxUnavailable

from conftest import require_docker

FIXTURES = Path(__file__).parent / "fixtures" / "llm"


class ReplayServer:
    """``POST /v1/chat/completions`` answers with the next recorded answer; keeps the requests."""

    def __init__(self, answers: list[str]) -> None:
        self.answers = list(answers)
        self.requests: list[dict] = []
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # noqa: N802
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                outer.requests.append({"path": self.path, "body": body})
                if self.path != "/v1/chat/completions" or not outer.answers:
                    self.send_response(404 if outer.answers else 500)
                    self.end_headers()
                    return
                content = outer.answers.pop(0)
                doc = {"id": "replay", "object": "chat.completion", "model": body["model"],
                       "choices": [{"index": 0, "finish_reason": "stop",
                                    "message": {"role": "assistant", "content": content}}]}
                data = json.dumps(doc).encode()
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def log_message(self, *args) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/v1"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    def __enter__(self) -> "ReplayServer":
        self.thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self.server.shutdown()
        self.server.server_close()


def _answers(name: str) -> list[str]:
    return json.loads((FIXTURES / name).read_text())["answers"]


@pytest.mark.docker
def test_repair_loop_accepts_the_repaired_module(tmp_path):
    require_docker()
    with ReplayServer(_answers("repair_then_pass.json")) as srv:
        res = generate_from_prompt("a thermostat environment", llm_url=srv.url, model="recorded",
                                   out_dir=tmp_path, max_rounds=3)
    assert res.accepted and res.name == "Thermostat-v0"
    assert [r["ok"] for r in res.rounds] == [False, True]
    # round 1 failed on the no-op check, named with its task; the failure went back to the model
    assert {(f["check"], f.get("task")) for f in res.rounds[0]["failures"]} >= {("noop", "thermo-noop")}
    repair_turn = srv.requests[1]["body"]["messages"][-1]["content"]
    assert "noop" in repair_turn and "thermo-noop" in repair_turn
    prov = json.loads(res.provenance_path.read_text())
    assert prov["prompt"] == "a thermostat environment" and prov["model"] == "recorded"
    assert prov["rounds"] == 2 and prov["history"][0]["ok"] is False
    assert prov["sandbox"]["kind"] == "container"  # the default
    # the kept module registers and plays (in a container: it is never imported here)
    (spec,) = load_generated(tmp_path)
    import envfactory

    env = envfactory.make("Thermostat-v0")
    try:
        env.reset("thermo-0")
        r = env.step('<tool_call>{"name": "set_target", "arguments": {"room": "kitchen", "celsius": 22}}</tool_call>')
        assert env.step("done").reward == 1.0 and not r.done
        env.reset("thermo-0")
        assert env.step("done").reward == 0.0
    finally:
        env.close()
        spec.close()


def test_repair_loop_rejects_a_module_that_never_passes(tmp_path):
    with ReplayServer(_answers("never_passes.json")) as srv:
        res = generate_from_prompt("a thermostat environment", llm_url=srv.url, model="recorded",
                                   out_dir=tmp_path / "out", max_rounds=3, sandbox="process")
    assert not res.accepted and len(res.rounds) == 3 and len(srv.requests) == 3
    assert all(any(f["check"] == "noop" for f in r["failures"]) for r in res.rounds)
    assert not (tmp_path / "out").exists()  # nothing is kept


def test_generated_module_that_hangs_is_stopped_by_the_process_sandbox(tmp_path):
    hang = "```python\nwhile True:\n    pass\n```"
    from envfactory.factory.sandbox import SandboxLimits

    with ReplayServer([hang]) as srv:
        res = generate_from_prompt("x", llm_url=srv.url, model="m", out_dir=tmp_path, max_rounds=1,
                                   limits=SandboxLimits(timeout_s=3), sandbox="process")
    assert not res.accepted and "timed out" in res.rounds[0]["error"]


@pytest.mark.docker
def test_cli_generate_from_prompt(tmp_path, capsys):
    require_docker()
    with ReplayServer(_answers("repair_then_pass.json")) as srv:
        code = main(["generate", "--from-prompt", "a thermostat environment", "--llm-url", srv.url,
                     "--model", "recorded", "--out", str(tmp_path), "--json"])
    doc = json.loads(capsys.readouterr().out)
    assert code == 0 and doc["accepted"] and doc["rounds"] == 2
    assert (tmp_path / "thermostat_v0.py").exists()


def test_cli_generate_needs_an_endpoint(capsys):
    assert main(["generate", "--from-prompt", "x"]) == 2
    assert "--llm-url" in capsys.readouterr().err


def test_without_docker_the_default_sandbox_fails_naming_the_opt_in(tmp_path, monkeypatch):
    import envfactory.runtime.pool as pool

    monkeypatch.setattr(pool, "_client", None)  # forget the engine this process may have found
    monkeypatch.setenv("DOCKER_HOST", f"unix://{tmp_path}/no-engine.sock")
    with ReplayServer(_answers("repair_then_pass.json")) as srv:
        with pytest.raises(SandboxUnavailable, match="sandbox='process'.*UNSAFE"):
            generate_from_prompt("a thermostat environment", llm_url=srv.url, model="recorded",
                                 out_dir=tmp_path / "out")
    assert srv.requests == []  # it failed before asking the model anything
    # load_generated never falls back to importing on the host
    (tmp_path / "g").mkdir()
    import hashlib

    code = "raise SystemExit('imported on the host')\n"
    (tmp_path / "g" / "x_v0.py").write_text(code)
    (tmp_path / "g" / "x_v0.provenance.json").write_text(json.dumps(
        {"name": "X-v0", "sha256": hashlib.sha256(code.encode()).hexdigest()}))
    with pytest.raises(RuntimeError, match="run only in containers.*no Docker engine answers"):
        load_generated(tmp_path / "g")
