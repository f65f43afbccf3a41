"""An LLM prompt as an environment: generate, verify in a sandbox, repair, keep what passes.

:func:`generate_from_prompt` asks any OpenAI-compatible endpoint
(``POST {llm_url}/chat/completions``) to write an environment module under the
contract in :mod:`.llm_contract`; verifies each answer in a sandbox
(:func:`.sandbox.verify_in_sandbox`); sends the failures back and asks for a
repair, for at most ``max_rounds`` answers in all; and writes only a module
that passes, next to a ``.provenance.json`` (prompt, model, endpoint, rounds,
failures of earlier rounds, code hash, verification summary).
:func:`load_generated` registers the accepted modules of a folder.
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import re
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

from .llm_contract import SYSTEM_PROMPT, extract_code, repair_message
from .sandbox import SandboxLimits, verify_in_sandbox

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
) -> GenerationResult:
    """Generate an environment from ``prompt``; keep it in ``out_dir`` only if it passes.

    Args:
        prompt: What environment to build, in plain words.
        llm_url: Base URL of an OpenAI-compatible API (e.g. ``http://host:8000/v1``).
        model: Model name sent to the endpoint.
        max_rounds: Answers requested at most (the first one plus repairs).
        min_tasks: Fewest tasks the module must ship.
        limits: Sandbox limits (timeout, memory, CPU).
        docker_image: Verify inside this image (no network) instead of a local process.
    """
    if max_rounds < 1:
        raise ValueError("max_rounds must be at least 1")
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
                                           docker_image=docker_image)
            result.rounds.append({"round": round_no, "ok": bool(report.get("ok")),
                                  "name": report.get("name"), "error": report.get("error"),
                                  "failures": report.get("failures", [])[:20]})
            if report.get("ok"):
                result.accepted, result.name = True, report["name"]
                _keep(result, code, report, prompt=prompt, model=model, llm_url=llm_url,
                      out_dir=Path(out_dir))
                break
            messages.append({"role": "user", "content": repair_message(report)})
    return result


def _keep(result: GenerationResult, code: str, report: dict[str, Any], *, prompt: str, model: str,
          llm_url: str, out_dir: Path) -> None:
    out_dir.mkdir(parents=True, exist_ok=True)
    stem = _module_name(report["name"])
    module_path = out_dir / f"{stem}.py"
    module_path.write_text(code)
    provenance = {
        "name": report["name"], "domain": report.get("domain"), "tasks": report.get("tasks"),
        "prompt": prompt, "model": model, "llm_url": llm_url,
        "rounds": len(result.rounds), "history": result.rounds[:-1],
        "sha256": hashlib.sha256(code.encode()).hexdigest(),
        "verified": True, "accepted_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    }
    prov_path = out_dir / f"{stem}.provenance.json"
    prov_path.write_text(json.dumps(provenance, indent=2))
    result.module_path, result.provenance_path = module_path, prov_path


def load_generated(directory: str | Path) -> list[Any]:
    """Register every accepted module in ``directory`` (its code must still match the
    hash in its provenance) and return their specs."""
    from ..registry import register

    specs = []
    for prov in sorted(Path(directory).glob("*.provenance.json")):
        meta = json.loads(prov.read_text())
        module_path = prov.with_name(prov.name.replace(".provenance.json", ".py"))
        code = module_path.read_text()
        if hashlib.sha256(code.encode()).hexdigest() != meta.get("sha256"):
            raise ValueError(f"{module_path} changed since it was verified; generate it again "
                             "or verify it and update its provenance")
        spec_ = importlib.util.spec_from_file_location(f"envfactory_generated.{module_path.stem}",
                                                       module_path)
        module = importlib.util.module_from_spec(spec_)
        spec_.loader.exec_module(module)
        env_spec = module.SPEC
        env_spec.metadata.setdefault("provenance", meta)
        specs.append(register(env_spec, replace=True))
    return specs
