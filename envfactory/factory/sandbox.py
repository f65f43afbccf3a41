"""Verify an untrusted environment module in a sandbox: a hardened container by default.

Run as ``python -I -m envfactory.factory.sandbox MODULE.py [--min-tasks N]``:
it imports the file, finds its :class:`~envfactory.ToolEnvSpec` (``SPEC``, or the
only ToolEnvSpec defined), runs the verification suite on the local runtime,
checks that its manifest can be built (:func:`.contained.manifest_of`: what the
host will need to run it contained) and prints one JSON line:
``{"ok", "name", "domain", "tasks", "failures", "error"}``.

:func:`verify_in_sandbox` runs that command where the module cannot reach the host:

* ``sandbox="container"`` (the default): in a container of the envfactory image
  (:func:`envfactory.runtime.images.image_for`, built offline from the local base image), with
  no network, a read-only root (``/tmp``: a small tmpfs), a non-root user, every
  capability dropped, ``no-new-privileges``, memory / CPU / pid limits, a capped log,
  and the module's file alone mounted read-only; killed and removed at the wall-clock
  timeout. Without a Docker engine it raises :class:`SandboxUnavailable`, which names
  the opt-in below.
* ``sandbox="process"``: UNSAFE, an explicit opt-in for machines without Docker: a
  child process with CPU, memory, file-size and open-file rlimits, a wall-clock
  timeout (the whole process group is killed), an empty environment and the module's
  folder as working directory, but **with this host's network and file system**: the
  module's code (LLM-written) runs on the host as this user.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import traceback
from pathlib import Path
from typing import Any

__all__ = ["verify_in_sandbox", "verify_module_file", "sandbox_image", "SandboxLimits", "SandboxUnavailable",
           "SANDBOXES"]

SANDBOXES = ("container", "process")
CONTAINER_UID = 10001


class SandboxUnavailable(RuntimeError):
    """The container sandbox cannot run here (no Docker engine, no base image); the message names
    ``sandbox="process"``, the unsafe opt-in."""


class SandboxLimits:
    """Resource limits of one sandboxed verification."""

    def __init__(self, timeout_s: float = 120.0, memory_mb: int = 2048, cpu_s: int | None = None,
                 file_mb: int = 16, open_files: int = 256) -> None:
        self.timeout_s = timeout_s
        self.memory_mb = memory_mb
        self.cpu_s = cpu_s or int(timeout_s) + 1
        self.file_mb = file_mb
        self.open_files = open_files

    def apply(self) -> None:  # runs in the child, before exec
        import resource

        os.setsid()
        mb = 1 << 20
        resource.setrlimit(resource.RLIMIT_AS, (self.memory_mb * mb, self.memory_mb * mb))
        resource.setrlimit(resource.RLIMIT_CPU, (self.cpu_s, self.cpu_s))
        resource.setrlimit(resource.RLIMIT_FSIZE, (self.file_mb * mb, self.file_mb * mb))
        resource.setrlimit(resource.RLIMIT_NOFILE, (self.open_files, self.open_files))
        resource.setrlimit(resource.RLIMIT_CORE, (0, 0))


def verify_module_file(path: str, min_tasks: int = 1) -> dict[str, Any]:
    """Import ``path`` and verify its environment (in this process)."""
    from envfactory.definition import SpecError
    from envfactory.episode import Episode
    from envfactory.factory.contained import find_spec_in, manifest_of
    from envfactory.checks.verify import verify_spec

    doc: dict[str, Any] = {"ok": False, "name": None, "domain": None, "tasks": 0, "failures": [],
                           "error": None}
    try:
        spec_ = importlib.util.spec_from_file_location("envfactory_generated_candidate", path)
        if spec_ is None or spec_.loader is None:
            raise ImportError(f"{path} is not a Python module")
        module = importlib.util.module_from_spec(spec_)
        spec_.loader.exec_module(module)
    except BaseException:
        doc["error"] = "importing the module failed:\n" + _tail(traceback.format_exc())
        return doc
    try:
        found = find_spec_in(module)
    except SpecError as exc:
        doc["error"] = str(exc)
        return doc
    doc["name"], doc["domain"] = found.name, found.domain
    try:
        report = verify_spec(found, make_env=lambda: Episode(found))
    except BaseException:
        doc["error"] = "the verification suite crashed:\n" + _tail(traceback.format_exc())
        return doc
    doc["tasks"] = report.tasks
    doc["failures"] = [f.to_json() for f in report.failures]
    if report.tasks < min_tasks:
        doc["failures"].append({"check": "tasks", "detail": f"the environment has {report.tasks} "
                                f"tasks; at least {min_tasks} are required"})
    try:
        manifest_of(found)  # what the host needs to run it contained
    except Exception as exc:
        doc["failures"].append({"check": "manifest", "detail": f"{type(exc).__name__}: {_tail(str(exc), 1000)}"})
    doc["ok"] = not doc["failures"]
    return doc


def _tail(text: str, limit: int = 2000) -> str:
    return text if len(text) <= limit else "...\n" + text[-limit:]


def sandbox_image(sandbox: str = "container", docker_image: str | None = None) -> str | None:
    """The image a ``sandbox`` verifies in (``None`` for ``"process"``), built if needed;
    :class:`SandboxUnavailable` when the container sandbox cannot run here."""
    if sandbox not in SANDBOXES:
        raise ValueError(f"sandbox must be one of {SANDBOXES}, got {sandbox!r}")
    if sandbox == "process":
        if docker_image:
            raise ValueError("docker_image needs sandbox='container'")
        return None
    try:
        from envfactory.runtime.images import image_for
        from envfactory.runtime.pool import docker_client

        client = docker_client()
        if docker_image:
            return docker_image
        return image_for([], client=client)[0]
    except (RuntimeError, ImportError) as exc:  # ImageError is a RuntimeError
        raise SandboxUnavailable(
            f"generated modules are verified in a Docker container by default, and that sandbox cannot run "
            f"here: {exc}. Start a Docker engine (scripts/docker-engine.sh; scripts/base-image.sh builds the "
            "base image), or pass sandbox='process' to verify in a local rlimit-only process instead "
            "(UNSAFE: the module's code then runs on this host, with its network and file system)") from None


def verify_in_sandbox(module_path: Path, *, min_tasks: int = 1, limits: SandboxLimits | None = None,
                      docker_image: str | None = None, sandbox: str = "container") -> dict[str, Any]:
    """Verify ``module_path`` in a container (default) or, with ``sandbox="process"`` (UNSAFE,
    see the module docstring), in a child process; never raises on the module's behaviour.

    Args:
        min_tasks: Fewest tasks the module must ship.
        limits: Timeout, memory and the rest.
        docker_image: The image to verify in (default: the envfactory image, built offline).
        sandbox: ``"container"`` or ``"process"``.

    Raises:
        SandboxUnavailable: the container sandbox cannot run here (no Docker engine).
    """
    limits = limits or SandboxLimits()
    module_path = Path(module_path).resolve()
    image = sandbox_image(sandbox, docker_image)
    if image is not None:
        return _verify_in_container(module_path, image, min_tasks, limits)
    cmd = [sys.executable, "-I", "-m", "envfactory.factory.sandbox", str(module_path),
           "--min-tasks", str(min_tasks)]
    env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": str(module_path.parent),
           "ENVFACTORY_NO_PLUGINS": "1", "LANG": "C.UTF-8"}
    proc = subprocess.Popen(cmd, cwd=module_path.parent, env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, preexec_fn=limits.apply)
    try:
        out, err = proc.communicate(timeout=limits.timeout_s)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.communicate()
        return _timed_out(limits)
    why = f"exit status {proc.returncode}"
    if proc.returncode and proc.returncode < 0:
        why += f" (killed by signal {-proc.returncode}: over a CPU or memory limit?)"
    return _report(out, err, why)


def _timed_out(limits: SandboxLimits) -> dict[str, Any]:
    return {"ok": False, "failures": [], "error": f"verification timed out after "
            f"{limits.timeout_s:.0f}s (an infinite loop or a very slow tool?)"}


def _report(out: str, err: str, why: str) -> dict[str, Any]:
    """The report line of the verification's stdout, or an error saying why there is none."""
    for line in reversed(out.strip().splitlines()):
        if line.startswith("{"):
            try:
                doc = json.loads(line)
            except (json.JSONDecodeError, RecursionError):
                break
            if isinstance(doc, dict) and isinstance(doc.get("ok"), bool):
                doc.setdefault("failures", [])
                return doc
            break
    return {"ok": False, "failures": [], "error": f"the sandboxed verification produced no report "
            f"({why}); its stderr ends with:\n{_tail(err, 1500)}"}


def _verify_in_container(module_path: Path, image: str, min_tasks: int, limits: SandboxLimits) -> dict[str, Any]:
    """The verification command in a hardened, throw-away container (see the module docstring)."""
    import docker

    from envfactory.runtime.container import LABEL, owner_label
    from envfactory.runtime.pool import docker_client

    client = docker_client()
    stage = Path(tempfile.mkdtemp(prefix="envf-verify-"))
    container = None
    try:
        shutil.copyfile(module_path, stage / "candidate.py")
        (stage / "candidate.py").chmod(0o644)
        stage.chmod(0o755)  # the container's user (another uid) reads it; nothing else is in there
        container = client.containers.run(
            image, ["python", "-I", "-m", "envfactory.factory.sandbox", "/candidate/candidate.py",
                    "--min-tasks", str(int(min_tasks))],
            detach=True, init=True, network_mode="none", read_only=True,
            tmpfs={"/tmp": f"rw,nosuid,nodev,size={max(1, limits.file_mb)}m"},
            user=f"{CONTAINER_UID}:{CONTAINER_UID}", cap_drop=["ALL"], security_opt=["no-new-privileges"],
            mem_limit=f"{limits.memory_mb}m", memswap_limit=f"{limits.memory_mb}m", nano_cpus=int(1e9),
            pids_limit=64, shm_size="16m", working_dir="/tmp",
            environment={"ENVFACTORY_NO_PLUGINS": "1", "HOME": "/tmp", "LANG": "C.UTF-8"},
            volumes={str(stage): {"bind": "/candidate", "mode": "ro"}},
            log_config=docker.types.LogConfig(type="json-file", config={"max-size": "4m", "max-file": "1"}),
            labels={LABEL: "1", "org.envfactory.env": "sandbox-verify", "org.envfactory.owner": owner_label()},
        )
        try:
            status = container.wait(timeout=limits.timeout_s)
        except Exception:  # the engine's wait timed out: the module is still running
            return _timed_out(limits)
        code = status.get("StatusCode")
        out = container.logs(stdout=True, stderr=False, tail=200).decode("utf-8", "replace")
        err = container.logs(stdout=False, stderr=True, tail=60).decode("utf-8", "replace")
        why = f"exit status {code}"
        if code == 137:
            why += " (killed: over the memory limit?)"
        return _report(out, err, why)
    finally:
        if container is not None:
            try:
                container.remove(force=True)
            except Exception:
                pass
        shutil.rmtree(stage, ignore_errors=True)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description="verify one environment module file")
    p.add_argument("module")
    p.add_argument("--min-tasks", type=int, default=1)
    args = p.parse_args(argv)
    doc = verify_module_file(args.module, args.min_tasks)
    sys.stdout.write("\n" + json.dumps(doc) + "\n")
    return 0 if doc["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
