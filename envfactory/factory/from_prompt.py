"""An LLM prompt as an environment: generate, verify in a sandbox, repair, keep what passes.

:func:`generate_from_prompt` asks any OpenAI-compatible endpoint
(``POST {llm_url}/chat/completions``) to write an environment module under the
contract in :mod:`.llm_contract`; verifies each answer in a sandbox
(:func:`.sandbox.verify_in_sandbox`: a hardened container without network by
default; ``sandbox="process"`` is the unsafe opt-in); sends the failures back and
asks for a repair, for at most ``max_rounds`` answers in all; and writes only a
module that passes, next to a ``.provenance.json`` (prompt, model, endpoint, rounds,
failures of earlier rounds, code hash, verification summary, the sandbox it ran in).

:func:`load_generated` registers the accepted modules of a folder **without importing
them on this host**: each runs only in containers of its own image, the host holds
a JSON manifest of it, and its success checks are judged in a container
(:mod:`.contained`, which describes the trust model). ``envfactory.make(name)`` of
such an environment runs it on the docker runtime.
"""

from __future__ import annotations

import hashlib
import json
import re
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

from envfactory.factory.llm_contract import SYSTEM_PROMPT, extract_code, repair_message
from envfactory.factory.sandbox import SandboxLimits, sandbox_image, verify_in_sandbox

__all__ = ["GenerationResult", "generate_from_prompt", "load_generated", "LLMError"]


class LLMError(RuntimeError):
    """The endpoint could not be reached or answered in an unexpected shape."""


@dataclass
class GenerationResult:
    """Outcome of a generation: accepted or not, where it was kept, and each round's report."""

    accepted: bool
    rounds: list[dict[str, Any]] = field(default_factory=list)
    module_path: Path | None = None
    provenance_path: Path | None = None
    name: str | None = None

    def to_json(self) -> dict[str, Any]:
        return {"accepted": self.accepted, "name": self.name, "rounds": len(self.rounds),
                "module": str(self.module_path) if self.module_path else None,
                "provenance": str(self.provenance_path) if self.provenance_path else None,
                "history": self.rounds}


def _endpoint(llm_url: str) -> str:
    url = llm_url.rstrip("/")
    return url if url.endswith("/chat/completions") else url + "/chat/completions"


def chat(client: httpx.Client, llm_url: str, model: str, messages: list[dict[str, str]],
         api_key: str | None = None) -> str:
    """One chat completion; returns the assistant's text."""
    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    try:
        r = client.post(_endpoint(llm_url), json={"model": model, "messages": messages,
                                                  "temperature": 0.0}, headers=headers)
    except httpx.HTTPError as exc:
        raise LLMError(f"cannot reach the LLM endpoint {_endpoint(llm_url)}: {exc}") from exc
    if r.status_code != 200:
        raise LLMError(f"the LLM endpoint answered HTTP {r.status_code}: {r.text[:300]}")
    try:
        return r.json()["choices"][0]["message"]["content"] or ""
    except (ValueError, KeyError, IndexError, TypeError) as exc:
        raise LLMError(f"the LLM endpoint's answer is not an OpenAI chat completion: "
                       f"{r.text[:300]}") from exc


def _module_name(env_name: str) -> str:
    return re.sub(r"[^a-z0-9_]", "_", env_name.lower())


def generate_from_prompt(
    prompt: str,
    *,
    llm_url: str,
    model: str,
    out_dir: str | Path = "generated",
    max_rounds: int = 3,
    api_key: str | None = None,
    min_tasks: int = 5,
    request_timeout_s: float = 120.0,
    limits: SandboxLimits | None = None,
    docker_image: str | None = None,
    sandbox: str = "container",
) -> GenerationResult:
    """Generate an environment from ``prompt``; keep it in ``out_dir`` only if it passes.

    Args:
        prompt: What environment to build, in plain words.
        llm_url: Base URL of an OpenAI-compatible API (e.g. ``http://host:8000/v1``).
        model: Model name sent to the endpoint.
        max_rounds: Answers requested at most (the first one plus repairs).
        min_tasks: Fewest tasks the module must ship.
        limits: Sandbox limits (timeout, memory, CPU).
        docker_image: Verify inside this image instead of the envfactory image (built offline).
        sandbox: ``"container"`` (default: a hardened container without network) or
            ``"process"`` (UNSAFE opt-in: an rlimit-only child process with this host's
            network and file system; see :mod:`.sandbox`).

    Raises:
        SandboxUnavailable: the container sandbox cannot run here (no Docker engine),
            before any request is sent; the message names ``sandbox="process"``.
    """
    if max_rounds < 1:
        raise ValueError("max_rounds must be at least 1")
    image = sandbox_image(sandbox, docker_image)  # fails fast, before the LLM is asked anything
    where = ({"kind": "container", "image": image} if image else
             {"kind": "process", "unsafe": "the module ran on this host, with its network and file system"})
    messages = [{"role": "system", "content": SYSTEM_PROMPT}, {"role": "user", "content": prompt}]
    result = GenerationResult(accepted=False)
    with httpx.Client(timeout=request_timeout_s) as client, tempfile.TemporaryDirectory() as tmp:
        for round_no in range(1, max_rounds + 1):
            answer = chat(client, llm_url, model, messages, api_key)
            messages.append({"role": "assistant", "content": answer})
            code = extract_code(answer)
            if code is None:
                report: dict[str, Any] = {"ok": False, "failures": [], "error":
                                          "the answer contains no Python module (one ```python block)"}
            else:
                candidate = Path(tmp) / f"candidate_{round_no}.py"
                candidate.write_text(code)
                report = verify_in_sandbox(candidate, min_tasks=min_tasks, limits=limits,
                                           docker_image=image, sandbox=sandbox)
            result.rounds.append({"round": round_no, "ok": bool(report.get("ok")),
                                  "name": report.get("name"), "error": report.get("error"),
                                  "failures": report.get("failures", [])[:20]})
            if report.get("ok") and code is not None:  # (ok: the candidate was a module)
                result.accepted, result.name = True, report["name"]
                _keep(result, code, report, prompt=prompt, model=model, llm_url=llm_url,
                      out_dir=Path(out_dir), sandbox=where)
                break
            messages.append({"role": "user", "content": repair_message(report)})
    return result


def _keep(result: GenerationResult, code: str, report: dict[str, Any], *, prompt: str, model: str,
          llm_url: str, out_dir: Path, sandbox: dict[str, Any]) -> None:
    out_dir.mkdir(parents=True, exist_ok=True)
    stem = _module_name(report["name"])
    module_path = out_dir / f"{stem}.py"
    module_path.write_text(code)
    provenance = {
        "name": report["name"], "domain": report.get("domain"), "tasks": report.get("tasks"),
        "prompt": prompt, "model": model, "llm_url": llm_url,
        "rounds": len(result.rounds), "history": result.rounds[:-1],
        "sha256": hashlib.sha256(code.encode()).hexdigest(),
        "verified": True, "sandbox": sandbox, "accepted_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    }
    prov_path = out_dir / f"{stem}.provenance.json"
    prov_path.write_text(json.dumps(provenance, indent=2))
    result.module_path, result.provenance_path = module_path, prov_path


def load_generated(directory: str | Path, *, judge_timeout: float = 30.0) -> list[Any]:
    """Register every accepted module in ``directory`` (its code must still match the hash in
    its provenance) and return their specs, never importing a module on this host.

    Each module runs only in containers (:mod:`.contained`): its image is built (offline,
    once per content) from the envfactory image plus the module, its manifest is read from
    a judge container of that image, and the spec registered from it
    (:class:`~.contained.ContainedSpec`) runs on the docker runtime, with its tasks' success,
    ``terminal`` and payoff judged in that judge container. Needs a Docker engine.

    Args:
        judge_timeout: Seconds one request to a judge container may take.
    """
    from envfactory.registry import register
    from envfactory.factory.contained import load_contained

    specs = []
    for prov in sorted(Path(directory).glob("*.provenance.json")):
        meta = json.loads(prov.read_text())
        module_path = prov.with_name(prov.name.replace(".provenance.json", ".py"))
        code = module_path.read_text()
        if hashlib.sha256(code.encode()).hexdigest() != meta.get("sha256"):
            raise ValueError(f"{module_path} changed since it was verified; generate it again "
                             "or verify it and update its provenance")
        name = meta.get("name")
        if not isinstance(name, str):
            raise ValueError(f"{prov} names no environment")
        env_spec = load_contained(code, name=name, stem=module_path.stem, judge_timeout=judge_timeout)
        env_spec.metadata.setdefault("provenance", meta)
        specs.append(register(env_spec, replace=True))
    return specs
