"""LLM agents for envfactory environments: policies (HF transformers, vLLM,
OpenAI-compatible HTTP), token-in/token-out multi-turn rollouts of one agent or
a team, evaluation, and training (``agents.Trainer``).

Submodules import their heavy dependencies (torch, transformers, vllm) only
when used, so ``import agents`` stays cheap.
"""

from __future__ import annotations

from typing import Any

from agents.models.torch_extras import hide_unloadable

hide_unloadable()  # torchvision/torchaudio/torchcodec builds that cannot load must not break transformers

__all__ = ["Trainer", "TrainerConfig", "Policy", "Generation", "HFPolicy", "VLLMPolicy", "OpenAIPolicy",
           "Trajectory", "Rollout", "rollout", "build_tiny_model", "pretrained_tiny_model", "load_policy", "ARPO",
           "GRPO", "RFT", "LLMRolePolicy", "ProcessPolicy"]

_LAZY = {
    "Trainer": "agents.trainer",
    "TrainerConfig": "agents.train_config",
    "Policy": "agents.policies.policy",
    "Generation": "agents.policies.policy",
    "HFPolicy": "agents.policies.hf_policy",
    "ProcessPolicy": "agents.policies.process_policy",
    "VLLMPolicy": "agents.policies.vllm_policy",
    "OpenAIPolicy": "agents.policies.openai_policy",
    "Trajectory": "agents.rollout",
    "Rollout": "agents.rollout",
    "rollout": "agents.rollout",
    "build_tiny_model": "agents.models.tiny",
    "pretrained_tiny_model": "agents.models.pretrain",
    "load_policy": "agents.policies.policy_spec",
    "LLMRolePolicy": "agents.policies.policy_spec",
    "ARPO": "agents.algorithms.objectives",
    "GRPO": "agents.algorithms.objectives",
    "RFT": "agents.algorithms.objectives",
}


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        import importlib

        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'agents' has no attribute {name!r}")
