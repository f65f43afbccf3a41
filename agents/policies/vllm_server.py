"""Starting a local vLLM OpenAI-compatible server for :class:`~agents.policies.openai_policy.OpenAIPolicy`.

``with vllm_server(path) as url: ...`` runs ``python -m vllm.entrypoints.openai.api_server``
on 127.0.0.1 with the options that make its token ids and logprobs match the
in-process backends, waits until it answers, and stops it afterwards.
"""

from __future__ import annotations

import contextlib
import os
import socket
import subprocess
import sys
import tempfile
import time
from typing import Iterator

import httpx

__all__ = ["vllm_server", "server_args"]


def server_args(model: str, port: int) -> list[str]:
    """The server command line (CPU-friendly: eager, in-process engine, float32 when the checkpoint is)."""
    return [sys.executable, "-m", "vllm.entrypoints.openai.api_server", "--model", model,
            "--host", "127.0.0.1", "--port", str(port), "--dtype", "auto" if _is_bf16(model) else "float32",
            "--enforce-eager", "--max-model-len", "4096", "--gpu-memory-utilization", "0.2",
            "--logprobs-mode", "processed_logprobs", "--max-logprobs", "20", "--enable-prefix-caching",
            "--enable-prompt-tokens-details", "--distributed-executor-backend", "uni"]


def _is_bf16(model: str) -> bool:
    try:
        import json

        with open(os.path.join(model, "config.json")) as f:
            cfg = json.load(f)
        return str(cfg.get("dtype") or cfg.get("torch_dtype")) != "float32"
    except OSError:
        return True


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextlib.contextmanager
def vllm_server(model: str, *, port: int | None = None, start_timeout: float = 600.0) -> Iterator[str]:
    """Run a vLLM server for ``model``; yield its base URL (``http://127.0.0.1:PORT/v1``).

    Raises:
        RuntimeError: the server exited or did not answer within ``start_timeout``
            seconds; the message carries the end of its log.
    """
    port = port or _free_port()
    log = tempfile.NamedTemporaryFile("w+", prefix="vllm-server-", suffix=".log", delete=False)
    # dev mode: /collective_rpc and /reset_prefix_cache, through which OpenAIPolicy.load_weights
    # pushes trained weights (bind to 127.0.0.1 only: these endpoints are not for the open network)
    env = {**os.environ, "VLLM_ENABLE_V1_MULTIPROCESSING": "0", "VLLM_SERVER_DEV_MODE": "1"}
    proc = subprocess.Popen(server_args(model, port), stdout=log, stderr=subprocess.STDOUT, env=env)
    url = f"http://127.0.0.1:{port}/v1"
    try:
        deadline = time.monotonic() + start_timeout
        while True:
            if proc.poll() is not None:
                raise RuntimeError(f"the vLLM server exited with {proc.returncode}: {_tail(log.name)}")
            try:
                if httpx.get(url + "/models", timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            if time.monotonic() > deadline:
                raise RuntimeError(f"the vLLM server did not answer within {start_timeout:.0f}s: {_tail(log.name)}")
            time.sleep(1.0)
        yield url
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        log.close()


def _tail(path: str, n: int = 3000) -> str:
    with open(path, errors="replace") as f:
        return f.read()[-n:]
