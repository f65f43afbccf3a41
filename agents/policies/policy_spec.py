"""Policy specs for the command line: one string names a model backend or a scripted baseline;
and :class:`LLMRolePolicy`, a model as a team role policy (team evaluation).

==========================  ==================================================
``tiny``                    the embedded tiny model on HF transformers
``hf:PATH``                 any transformers checkpoint (folder or hub id)
``vllm:PATH``               the same through an in-process vLLM engine
                            (``vllm:tiny`` for the tiny model)
``openai:URL#MODEL``        an OpenAI-compatible server (``URL#MODEL@TOKENIZER``
                            when the model name is not a tokenizer path)
``oracle``                  scripted: each task's reference solution
``random``                  scripted: random schema-typed tool calls
``noop``                    scripted: answers at once, doing nothing
``claim``                   scripted: claims success without acting
==========================  ==================================================

The scripted ones are :mod:`envfactory.checks.scripted`'s policy objects.
"""

from __future__ import annotations

from typing import Any

from envfactory.checks.scripted import SCRIPTED, scripted_policy

from agents.policies.policy import Policy

__all__ = ["load_policy", "SCRIPTED", "PolicySpecError", "LLMRolePolicy", "load_llm_policy"]


class PolicySpecError(ValueError):
    """A policy spec that names no known backend."""


def load_policy(spec: str, **kwargs: Any) -> Any:
    """The model :class:`Policy` a spec names, or the scripted role policy (``oracle``...,
    a :class:`~envfactory.checks.scripted.RolePolicy`; :func:`envfactory.checks.scripted.scripted_policy`).

    Raises:
        PolicySpecError: the spec is malformed (the message lists the accepted forms).
    """
    s = spec.strip()
    if s in SCRIPTED:
        return scripted_policy(s)
    kind, _, arg = s.partition(":")
    if s == "tiny":
        from agents.policies.hf_policy import HFPolicy

        return HFPolicy(None, **kwargs)
    if kind == "hf" and arg:
        from agents.policies.hf_policy import HFPolicy

        return HFPolicy(None if arg == "tiny" else arg, **kwargs)
    if kind == "vllm" and arg:
        from agents.policies.vllm_policy import VLLMPolicy

        return VLLMPolicy(None if arg == "tiny" else arg, **kwargs)
    if kind == "openai" and arg:
        url, _, model = arg.partition("#")
        model, _, tok = model.partition("@")
        if not url or not model:
            raise PolicySpecError(f"{spec!r}: write openai:URL#MODEL, e.g. openai:http://127.0.0.1:8000/v1#my-model")
        from agents.policies.openai_policy import OpenAIPolicy

        return OpenAIPolicy(url, model, tokenizer=tok or None, **kwargs)
    raise PolicySpecError(
        f"unknown policy spec {spec!r}; use tiny, hf:PATH, vllm:PATH, openai:URL#MODEL, "
        f"or a scripted baseline: {', '.join(SCRIPTED)}"
    )


class LLMRolePolicy:
    """A model :class:`Policy` as a :class:`~envfactory.checks.scripted.RolePolicy`
    (``act(episode, agent, seed) -> text``), for
    team evaluation (``envfactory eval-team``); the same object may play every role.

    Each turn renders the agent's own conversation (``episode.transcript(agent)``: its
    system prompt, instruction, private notes, tool results and letters) with its role's
    tool schemas, samples one assistant turn and returns the text; the episode parses the
    tool calls. Training goes through :mod:`agents.rollout`'s token-in/token-out path instead.
    """

    stochastic = True

    def __init__(self, policy: Policy, *, name: str = "llm", max_new_tokens: int = 96,
                 temperature: float = 1.0) -> None:
        from agents.policies.chat_render import renderer_for

        self.policy, self.name = policy, name
        self.max_new_tokens, self.temperature = max_new_tokens, temperature
        self.renderer = renderer_for(policy.tokenizer)
        self.max_len = int(getattr(policy.tokenizer, "model_max_length", 1 << 30) or 1 << 30)
        self.truncated_prompts = 0

    def act(self, episode: Any, agent: str, seed: int) -> str:
        import zlib

        ids = self.renderer.opening(episode.transcript(agent), episode.tool_schemas(agent))
        if len(ids) + self.max_new_tokens > self.max_len:
            self.truncated_prompts += 1  # the conversation no longer fits the model's context: pass
            return ""
        turn_seed = zlib.crc32(f"{episode.task.id}/{agent}/{episode.status.turns_taken(agent)}/{seed}".encode())
        gen = self.policy.generate([ids], max_new_tokens=self.max_new_tokens, temperature=self.temperature,
                                   seed=turn_seed & 0x7FFFFFFF)[0]
        tokens = gen.token_ids[:-1] if gen.finish_reason == "stop" else gen.token_ids
        return self.policy.tokenizer.decode(tokens, skip_special_tokens=False)


def load_llm_policy(model: str | None, *, name: str | None = None, device: str = "cpu", **kwargs: Any
                    ) -> LLMRolePolicy:
    """A transformers model (a path or hub id; ``None`` for the tiny model) as a role policy."""
    from agents.policies.hf_policy import HFPolicy

    return LLMRolePolicy(HFPolicy(model, device=device), name=name or (model or "tiny"), **kwargs)
