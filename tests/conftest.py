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
from typing import Any

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


def require_module(module: str, install: str) -> None:
    """Skip (laptop) or fail (CI) unless ``module`` is importable; ``install`` says how to get it."""
    if importlib.util.find_spec(module) is None:
        _missing(module, f"the {module} package is not installed ({install})")


def require_torch() -> None:
    """Skip (laptop) or fail (CI) unless torch (the 'train' extra) is importable."""
    require_module("torch", "bash scripts/setup.sh installs the pinned CPU build")


# Modules the CI machine must have (scripts/setup.sh installs them). Under CI=true a
# skip caused by one of them missing -- pytest.importorskip("torch") at module or test
# level, or a skipif whose reason names it -- is turned into a failure.
CI_REQUIRED_MODULES = ("torch", "transformers", "ray", "tensorboard")


def serve_mcp_http(name: str, *extra: str, env: dict | None = None) -> tuple[subprocess.Popen, str | None, str]:
    """Start ``envfactory serve NAME --protocol mcp --transport streamable-http --port 0`` (plus
    ``extra``) from the repository; returns (process, the URL it announced or None, its log so far)."""
    import re
    import sys
    import time
    from pathlib import Path

    root = Path(__file__).resolve().parents[1]
    proc = subprocess.Popen([sys.executable, "-m", "envfactory.cli", "serve", name, "--protocol", "mcp",
                             "--transport", "streamable-http", "--port", "0", *extra], cwd=root,
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                            env={**os.environ, "PYTHONPATH": str(root), **(env or {})})
    url, deadline, seen = None, time.monotonic() + 60, []
    assert proc.stderr is not None
    while url is None and time.monotonic() < deadline:
        line = proc.stderr.readline()
        if not line:
            break
        seen.append(line)
        m = re.search(r"(http://\S+/mcp)", line)
        url = m.group(1) if m else None
    return proc, url, "".join(seen)


def venv_python(name: str, requirements: list[str], *, base: str | None = None, timeout: float = 600,
                system_site_packages: bool = False) -> str:
    """The Python of a virtual environment of its own, ``$ENVFACTORY_CACHE/venvs/NAME`` (default
    cache ``~/.cache/envfactory``), built once with ``base`` (default: this Python) and
    ``pip install REQUIREMENTS`` from the package registry, for a package whose pins or import name
    clash with this project's (the OpenAI Agents SDK, NeMo Gym). A venv is used once its build
    finished (a ``.built`` file; a half-built one is built again). ``system_site_packages`` lets the
    venv see this Python's packages (torch's CPU build, say, which a looser pin in a fresh venv would
    replace by several GB of CUDA packages); what ``requirements`` install shadows them. When it cannot be built the test
    skips on a laptop and fails under CI=true (where the registry is reachable)."""
    import sys
    from pathlib import Path

    root = Path(os.environ.get("ENVFACTORY_CACHE") or Path.home() / ".cache" / "envfactory")
    venv = root / "venvs" / name
    python, built = venv / "bin" / "python", venv / ".built"
    if not built.exists():
        try:
            shutil.rmtree(venv, ignore_errors=True)
            flags = ["--system-site-packages"] if system_site_packages else []
            subprocess.run([base or sys.executable, "-m", "venv", *flags, str(venv)], check=True, capture_output=True,
                           timeout=120)
            subprocess.run([str(python), "-m", "pip", "install", "-q", *requirements], check=True,
                           capture_output=True, text=True, timeout=timeout)
            built.write_text("\n".join(requirements) + "\n")
        except (subprocess.SubprocessError, OSError) as exc:
            out = getattr(exc, "stderr", "") or ""
            shutil.rmtree(venv, ignore_errors=True)
            msg = f"could not build a virtual environment with {' '.join(requirements)}: {exc} {str(out)[-500:]}"
            if IN_CI:
                pytest.fail(msg + " (CI=true: the package registry is reachable there)")
            pytest.skip(msg)
    return str(python)


def import_without(missing: str, module: str, touch: str) -> str:
    """In a fresh interpreter where ``missing`` cannot be imported: ``import MODULE as m`` (printing
    ``imported``), then ``touch`` (code using ``m`` that needs ``missing``; its ``ImportError``
    printed as ``ImportError: ...``). Its standard output; a crash fails the test. For the faces that
    must import without their trainer installed (verl, verifiers, NeMo Gym)."""
    import sys
    from pathlib import Path

    code = (f"import sys\nsys.modules[{missing!r}] = None\nimport {module} as m\nprint('imported')\n"
            f"try:\n    {touch}\nexcept ImportError as exc:\n    print('ImportError:', exc)\n")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                       cwd=Path(__file__).resolve().parents[1])
    assert r.returncode == 0 and "imported" in r.stdout, r.stderr
    return r.stdout


@pytest.fixture(scope="module")
def amplify():
    """``tests/adversarial/amplify_env.py`` (issue 63's amplifying tools) with ``Amplify-v0``
    registered for the module's tests, taken out of the registry after them."""
    import sys

    sys.path.insert(0, os.path.join(os.path.dirname(__file__), "adversarial"))
    try:
        import amplify_env
    finally:
        sys.path.pop(0)
    from envfactory import registry

    registry.register(amplify_env.SPEC, replace=True)
    yield amplify_env
    registry._REGISTRY.pop(amplify_env.SPEC.name, None)


def stop_process(proc: subprocess.Popen) -> None:
    """Terminate ``proc``, killing it after 10 s."""
    proc.terminate()
    try:
        proc.wait(timeout=10)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


def _missing_required(reason: str) -> str | None:
    for module in CI_REQUIRED_MODULES:
        if module in reason and importlib.util.find_spec(module) is None:
            return module
    return None


def _skip_reason(report: pytest.CollectReport | pytest.TestReport) -> str:
    longrepr = report.longrepr
    if isinstance(longrepr, tuple) and len(longrepr) == 3:
        return str(longrepr[2])
    return str(longrepr or "")


def _missing_message(report: pytest.CollectReport | pytest.TestReport) -> str | None:
    if not (IN_CI and report.skipped):
        return None
    reason = _skip_reason(report)
    module = _missing_required(reason)
    if module is None:
        return None
    return (f"{module} is required but unavailable ({reason}) -- CI=true: a missing {module} is a failure, "
            "not a skip; scripts/setup.sh installs it")


class _MissingModule(pytest.Item):
    """Stands for a test module skipped at import because a CI-required module is missing:
    it fails (a collection error would stop the whole run instead)."""

    def __init__(self, *, message: str, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.message = message

    def runtest(self) -> None:
        pytest.fail(self.message, pytrace=False)

    def reportinfo(self) -> tuple[Any, int | None, str]:
        return self.path, None, self.name


@pytest.hookimpl(hookwrapper=True)
def pytest_make_collect_report(collector: pytest.Collector):
    outcome = yield
    report = outcome.get_result()
    message = _missing_message(report)
    if message is not None and isinstance(collector, pytest.Module):
        report.outcome, report.longrepr = "passed", None
        report.result = [_MissingModule.from_parent(collector, name="required-module-missing", message=message)]


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo):
    outcome = yield
    report = outcome.get_result()
    message = _missing_message(report)
    if message is not None:
        report.outcome, report.longrepr = "failed", message


@pytest.fixture(scope="module", autouse=True)
def _drop_contained_specs():
    """Generated modules registered by a test module (container-only specs, which the in-process
    `verify --all` of later tests cannot play) are unregistered when it ends."""
    yield
    from envfactory import registry

    for name, s in list(registry._REGISTRY.items()):
        if getattr(s, "make_world", None) is not None:
            del registry._REGISTRY[name]
