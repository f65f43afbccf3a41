"""Language-model role policies: an ``agents.Policy`` plays one or more roles of a team.

The agents package is imported lazily (``envfactory`` never imports it at
module level). Each turn renders the agent's own conversation
(``episode.messages(agent)``: its system prompt, instruction, private notes,
tool results and received messages) with the tokenizer's chat template and
its role's tool schemas, samples one assistant turn, and returns the text; the
episode parses the tool calls. This is for evaluation; training goes through
``agents.rollout``'s token-in/token-out path.
"""

from __future__ import annotations

import zlib
from typing import Any

from .episode import MultiEpisode
from .team import PASS

__all__ = ["LLMRolePolicy", "tiny_policy", "load_llm_policy"]


class LLMRolePolicy:
    """An ``agents.Policy`` as a role policy (the same object may play every role).

    Args:
        policy: The ``agents.Policy`` backend.
        name: Label in reports.
        max_new_tokens: Sampled tokens per turn.
        temperature: Sampling temperature (0 is greedy).
    """

    stochastic = True

    def __init__(self, policy: Any, *, name: str = "llm", max_new_tokens: int = 96,
                 temperature: float = 1.0) -> None:
        from agents.chat_render import ChatRenderer

        self.policy = policy
        self.name = name
        self.max_new_tokens = max_new_tokens
        self.temperature = temperature
        self.renderer = ChatRenderer(policy.tokenizer)
        self.max_len = int(getattr(policy.tokenizer, "model_max_length", 1 << 30) or 1 << 30)
        self.truncated_prompts = 0

    def act(self, episode: MultiEpisode, agent: str, seed: int) -> Any:
        ids = self.renderer.opening(episode.messages(agent), episode.tool_schemas(agent))
        if len(ids) + self.max_new_tokens > self.max_len:
            # The conversation no longer fits the model's context: the agent passes.
            self.truncated_prompts += 1
            return PASS
        turn_seed = zlib.crc32(f"{episode.task.id}/{agent}/{episode.turns_taken(agent)}/{seed}".encode())
        gen = self.policy.generate([ids], max_new_tokens=self.max_new_tokens, temperature=self.temperature,
                                   seed=turn_seed & 0x7FFFFFFF)[0]
        tokens = gen.token_ids[:-1] if gen.finish_reason == "stop" else gen.token_ids
        return self.policy.tokenizer.decode(tokens, skip_special_tokens=False)


def tiny_policy(**kwargs: Any) -> LLMRolePolicy:
    """The embedded tiny model (``agents.tiny``) on CPU, as a role policy named ``tiny``."""
    return load_llm_policy(None, name="tiny", **kwargs)


def load_llm_policy(model: str | None, *, name: str | None = None, device: str = "cpu", **kwargs: Any
                    ) -> LLMRolePolicy:
    """A transformers model (a path or hub id; ``None`` for the tiny model) as a role policy."""
    try:
        from agents.hf_policy import HFPolicy
    except ImportError as exc:
        raise RuntimeError(f"model teams need the agents package and its 'train' extra "
                           f"(pip install -e '.[train]'): {exc}") from exc
    return LLMRolePolicy(HFPolicy(model, device=device), name=name or (model or "tiny"), **kwargs)
