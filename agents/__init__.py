"""LLM agents for envfactory environments: policies (HF transformers, vLLM,
OpenAI-compatible HTTP), token-in/token-out multi-turn rollouts of one agent or
a team, evaluation, and training (``agents.Trainer``).

Submodules import their heavy dependencies (torch, transformers, vllm) only
when used, so ``import agents`` stays cheap.
"""

from __future__ import annotations

from typing import Any

from .torch_extras import hide_unloadable

hide_unloadable()  # torchvision/torchaudio/torchcodec builds that cannot load must not break transformers

__all__ = ["Trainer", "TrainerConfig", "Policy", "Generation", "HFPolicy", "VLLMPolicy", "OpenAIPolicy",
           "Trajectory", "Rollout", "rollout", "build_tiny_model", "pretrained_tiny_model", "load_policy", "ARPO",
           "GRPO", "LLMRolePolicy", "ProcessPolicy"]

_LAZY = {
    "Trainer": "agents.trainer",
    "TrainerConfig": "agents.train_config",
    "Policy": "agents.policy",
    "Generation": "agents.policy",
    "HFPolicy": "agents.hf_policy",
    "ProcessPolicy": "agents.process_policy",
    "VLLMPolicy": "agents.vllm_policy",
    "OpenAIPolicy": "agents.openai_policy",
    "Trajectory": "agents.rollout",
    "Rollout": "agents.rollout",
    "rollout": "agents.rollout",
    "build_tiny_model": "agents.tiny",
    "pretrained_tiny_model": "agents.pretrain",
    "load_policy": "agents.policy_spec",
    "LLMRolePolicy": "agents.policy_spec",
    "ARPO": "agents.algorithms.arpo",
    "GRPO": "agents.algorithms.arpo",
}


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        import importlib

        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'agents' has no attribute {name!r}")
