"""Verify an untrusted environment module in a separate, resource-limited process.

Run as ``python -I -m envfactory.factory.sandbox MODULE.py [--min-tasks N]``:
it imports the file, finds its :class:`~envfactory.ToolEnvSpec` (``SPEC``, or the
only ToolEnvSpec defined), runs the verification suite on the local runtime and
prints one JSON line: ``{"ok", "name", "domain", "tasks", "failures", "error"}``.

:func:`verify_in_sandbox` runs that command with CPU, memory, file-size and
open-file limits, a wall-clock timeout (the whole process group is killed), an
empty environment and the module's folder as working directory; or, with
``docker_image``, inside a container without network.
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
import traceback
from pathlib import Path
from typing import Any

__all__ = ["verify_in_sandbox", "verify_module_file", "SandboxLimits"]


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
    from envfactory.episode import Episode
    from envfactory.definition import ToolEnvSpec
    from envfactory.verify import verify_spec

    doc: dict[str, Any] = {"ok": False, "name": None, "domain": None, "tasks": 0, "failures": [],
                           "error": None}
    try:
        spec_ = importlib.util.spec_from_file_location("envfactory_generated_candidate", path)
        module = importlib.util.module_from_spec(spec_)
        spec_.loader.exec_module(module)
    except BaseException:
        doc["error"] = "importing the module failed:\n" + _tail(traceback.format_exc())
        return doc
    found = getattr(module, "SPEC", None)
    if not isinstance(found, ToolEnvSpec):
        specs = [v for v in vars(module).values() if isinstance(v, ToolEnvSpec)]
        if len(specs) != 1:
            doc["error"] = (f"the module must define exactly one ToolEnvSpec as SPEC; found {len(specs)} "
                            "ToolEnvSpec objects")
            return doc
        found = specs[0]
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
    doc["ok"] = not doc["failures"]
    return doc


def _tail(text: str, limit: int = 2000) -> str:
    return text if len(text) <= limit else "...\n" + text[-limit:]


def verify_in_sandbox(module_path: Path, *, min_tasks: int = 1, limits: SandboxLimits | None = None,
                      docker_image: str | None = None) -> dict[str, Any]:
    """Verify ``module_path`` in a child process (or a container); never raises on its behaviour."""
    limits = limits or SandboxLimits()
    module_path = Path(module_path).resolve()
    if docker_image:
        if shutil.which("docker") is None:
            raise RuntimeError("docker_image was given but the docker CLI is not installed")
        cmd = ["docker", "run", "--rm", "--network", "none", "--read-only", "--tmpfs", "/tmp",
               "--memory", f"{limits.memory_mb}m", "--pids-limit", "64", "--cpus", "1",
               "-v", f"{module_path.parent}:/candidate:ro", docker_image,
               "python", "-I", "-m", "envfactory.factory.sandbox", f"/candidate/{module_path.name}",
               "--min-tasks", str(min_tasks)]
        preexec = None
    else:
        cmd = [sys.executable, "-I", "-m", "envfactory.factory.sandbox", str(module_path),
               "--min-tasks", str(min_tasks)]
        preexec = limits.apply
    env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": str(module_path.parent),
           "ENVFACTORY_NO_PLUGINS": "1", "LANG": "C.UTF-8"}
    proc = subprocess.Popen(cmd, cwd=module_path.parent, env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, preexec_fn=preexec)
    try:
        out, err = proc.communicate(timeout=limits.timeout_s)
    except subprocess.TimeoutExpired:
        if preexec is not None:
            os.killpg(proc.pid, signal.SIGKILL)
        else:
            proc.kill()
        proc.communicate()
        return {"ok": False, "failures": [], "error": f"verification timed out after "
                f"{limits.timeout_s:.0f}s (an infinite loop or a very slow tool?)"}
    for line in reversed(out.strip().splitlines()):
        if line.startswith("{"):
            try:
                return json.loads(line)
            except json.JSONDecodeError:
                break
    why = f"exit status {proc.returncode}"
    if proc.returncode and proc.returncode < 0:
        why += f" (killed by signal {-proc.returncode}: over a CPU or memory limit?)"
    return {"ok": False, "failures": [], "error": f"the sandboxed verification produced no report "
            f"({why}); its stderr ends with:\n{_tail(err, 1500)}"}


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
