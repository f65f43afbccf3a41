"""Shared test helpers.

Tests that need an engine (Docker, vLLM) call :func:`require_docker` /
:func:`require_vllm`. On a laptop without the engine they skip; under CI
(``CI=true``) a missing engine is a failure, never a silent skip.
"""

from __future__ import annotations

import importlib.util
import os
import shutil
import subprocess

import pytest

IN_CI = os.environ.get("CI", "").lower() in ("1", "true", "yes")


def _missing(what: str, why: str) -> None:
    msg = f"{what} is required but unavailable: {why}"
    if IN_CI:
        pytest.fail(msg + " (CI=true: a missing engine is a failure; .ci/run installs and starts it)")
    pytest.skip(msg)


def docker_available() -> tuple[bool, str]:
    if shutil.which("docker") is None:
        return False, "the docker CLI is not installed"
    try:
        import docker  # noqa: F401
    except ImportError:
        return False, "the docker Python SDK is not installed (pip install docker)"
    try:
        r = subprocess.run(["docker", "info"], capture_output=True, timeout=20)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return False, f"docker info failed: {exc}"
    if r.returncode != 0:
        return False, "no Docker engine answers (run scripts/docker-engine.sh)"
    return True, ""


def require_docker() -> None:
    """Skip (laptop) or fail (CI) unless a Docker engine answers."""
    ok, why = docker_available()
    if not ok:
        _missing("Docker", why)


def require_vllm() -> None:
    """Skip (laptop) or fail (CI) unless vLLM is importable."""
    if importlib.util.find_spec("vllm") is None:
        _missing("vLLM", "the vllm package is not installed (run scripts/install-vllm.sh)")
