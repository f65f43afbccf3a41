"""LLM agents for envfactory environments: policies (HF transformers, vLLM,
OpenAI-compatible HTTP), token-in/token-out multi-turn rollouts, evaluation,
and training (``agents.Trainer``).

Submodules import their heavy dependencies (torch, transformers, vllm) only
when used, so ``import agents`` stays cheap.
"""

from __future__ import annotations

from typing import Any

__all__ = ["Trainer", "Policy", "Generation", "HFPolicy", "VLLMPolicy", "OpenAIPolicy", "Trajectory",
           "rollout", "build_tiny_model", "load_policy", "TeamTrainer", "team_rollout", "TeamEpisode"]

_LAZY = {
    "Trainer": "agents.trainer",
    "Policy": "agents.policy",
    "Generation": "agents.policy",
    "HFPolicy": "agents.hf_policy",
    "VLLMPolicy": "agents.vllm_policy",
    "OpenAIPolicy": "agents.openai_policy",
    "Trajectory": "agents.rollout",
    "rollout": "agents.rollout",
    "build_tiny_model": "agents.tiny",
    "load_policy": "agents.policy_spec",
    "TeamTrainer": "agents.team_trainer",
    "team_rollout": "agents.team_rollout",
    "TeamEpisode": "agents.team_rollout",
}


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        import importlib

        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'agents' has no attribute {name!r}")
