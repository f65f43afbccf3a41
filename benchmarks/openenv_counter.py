"""The OpenEnv baseline for ``envfactory bench``: the same trivial counter served by
``openenv-core`` (FastAPI server, WebSocket ``EnvClient``), measured step by step.

    python benchmarks/openenv_counter.py serve PORT     # the server (a subprocess of the bench)
    python benchmarks/openenv_counter.py bench N         # start a server, time N steps, print JSON

Needs ``pip install openenv-core``. The server parses the same Hermes tool-call
text and applies ``increment``, as Counter-v0 does.
"""

from __future__ import annotations

import json
import re
import socket
import subprocess
import sys
import time
from typing import Any

from openenv.core.client_types import StepResult
from openenv.core.env_client import EnvClient
from openenv.core.env_server.interfaces import Environment
from openenv.core.env_server.types import Action, Observation, State

_CALL = re.compile(r"<tool_call>(.*?)</tool_call>", re.DOTALL)


class TextAction(Action):
    text: str


class TextObservation(Observation):
    text: str = ""


class CounterEnv(Environment):
    def __init__(self) -> None:
        super().__init__()
        self.value = 0
        self._state = State()

    def reset(self, seed: int | None = None, episode_id: str | None = None, **kw: Any) -> TextObservation:
        self.value = 0
        return TextObservation(text="Make the counter show 10.")

    def step(self, action: TextAction, timeout_s: float | None = None, **kw: Any) -> TextObservation:
        outs = []
        for body in _CALL.findall(action.text):
            call = json.loads(body)
            self.value += int(call["arguments"].get("by", 1))
            outs.append(str(self.value))
        return TextObservation(text="\n".join(outs), done=not outs, reward=0.0)

    @property
    def state(self) -> State:
        return self._state


class CounterClient(EnvClient[TextAction, TextObservation, State]):
    def _step_payload(self, action: TextAction) -> dict[str, Any]:
        return {"text": action.text}

    def _parse_result(self, payload: dict[str, Any]) -> StepResult[TextObservation]:
        obs = TextObservation(**payload.get("observation", {}))
        return StepResult(observation=obs, reward=payload.get("reward"), done=payload.get("done", False))

    def _parse_state(self, payload: dict[str, Any]) -> State:
        return State(**payload)


def serve(port: int) -> None:
    import uvicorn
    from openenv.core.env_server.http_server import create_app

    app = create_app(CounterEnv, TextAction, TextObservation, env_name="counter")
    uvicorn.run(app, host="127.0.0.1", port=port, log_level="error")


def bench(n: int) -> dict[str, float]:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    proc = subprocess.Popen([sys.executable, __file__, "serve", str(port)])
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                socket.create_connection(("127.0.0.1", port), timeout=1).close()
                break
            except OSError:
                if time.monotonic() > deadline or proc.poll() is not None:
                    raise RuntimeError("the OpenEnv server did not start")
                time.sleep(0.1)
        action = TextAction(text='<tool_call>{"name": "increment", "arguments": {"by": 1}}</tool_call>')
        with CounterClient(base_url=f"http://127.0.0.1:{port}").sync() as env:
            env.reset()
            for _ in range(200):
                env.step(action)
            samples = []
            for _ in range(n):
                t0 = time.perf_counter_ns()
                env.step(action)
                samples.append(time.perf_counter_ns() - t0)
        samples.sort()
        return {"p50_us": samples[len(samples) // 2] / 1000, "p99_us": samples[int(len(samples) * 0.99)] / 1000}
    finally:
        proc.kill()
        proc.wait()


if __name__ == "__main__":
    if sys.argv[1] == "serve":
        serve(int(sys.argv[2]))
    else:
        print(json.dumps(bench(int(sys.argv[2]))))
