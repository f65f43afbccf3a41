"""The policy interface: batched sampling of token ids with their logprobs and entropy.

Every backend (:class:`~agents.policies.hf_policy.HFPolicy`, :class:`~agents.policies.vllm_policy.VLLMPolicy`,
:class:`~agents.policies.openai_policy.OpenAIPolicy`) takes prompts as token ids and returns
exactly the ids it sampled, so rollouts are token-in/token-out: the ids a model
sampled are the ids it is trained on.

Definitions every backend follows:

* ``logprobs[i]`` is ``log p(token_ids[i])`` under the *sampling* distribution:
  ``softmax(logits / temperature)`` restricted to the top-p nucleus and renormalised.
  With ``temperature == 0`` (greedy) it is the log-softmax of the raw logits.
* ``entropies[i]`` is the entropy of the top-k (k = :data:`ENTROPY_TOP_K`)
  probabilities of that same distribution, renormalised, divided by ``log(vocab_size)``.
* ``finish_reason`` is ``"stop"`` when a stop token was sampled (it is the last
  of ``token_ids``), else ``"length"``.
"""

from __future__ import annotations

import math
from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Sequence

if TYPE_CHECKING:
    import torch
    import transformers

__all__ = ["Generation", "Policy", "ENTROPY_TOP_K", "default_stop_ids", "sampling_stats", "check_prompts"]

ENTROPY_TOP_K = 20


@dataclass
class Generation:
    """One sampled continuation of one prompt."""

    token_ids: list[int]
    logprobs: list[float]
    entropies: list[float]
    finish_reason: str  # "stop" | "length"
    text: str | None = field(default=None, repr=False)
    """The decoded text when a backend has it (text-only servers have only this)."""


def check_prompts(prompts: list[list[int]], max_new_tokens: int) -> bool:
    """Whether there is anything to sample (``False`` for no prompts); raises for the arguments
    every backend's :meth:`Policy.generate` refuses, with the same errors."""
    if any(len(p) == 0 for p in prompts):
        raise ValueError("every prompt needs at least one token id")
    if max_new_tokens < 1:
        raise ValueError("max_new_tokens must be at least 1")
    return bool(prompts)


class Policy(ABC):
    """A language model that samples continuations of token-id prompts.

    This is the trainable, token-level contract. What plays a role in an episode is an
    :class:`envfactory.checks.scripted.RolePolicy` (``act(episode, agent, seed)``); a model
    plays one through :class:`agents.policies.policy_spec.LLMRolePolicy`, or through
    :mod:`agents.rollout` when its turns are training samples.
    """

    tokenizer: "transformers.PreTrainedTokenizerBase"

    @abstractmethod
    def generate(self, prompts: list[list[int]], *, max_new_tokens: int, temperature: float = 1.0,
                 top_p: float = 1.0, stop_token_ids: list[int] | None = None,
                 seed: int | None = None) -> list[Generation]:
        """Sample one continuation per prompt, in order.

        Args:
            prompts: Token ids of each prompt (at least one id each).
            max_new_tokens: Upper bound on sampled ids per prompt.
            temperature: Softmax temperature; 0 samples greedily.
            top_p: Nucleus sampling mass (1.0 disables it).
            stop_token_ids: Sampling stops after any of these ids (it is kept in
                ``token_ids``). ``None`` means :func:`default_stop_ids` of the tokenizer.
            seed: Makes sampling reproducible; prompt ``i`` of a batch draws from
                its own stream seeded by ``(seed, i)``.
        """

    _prefill = 0  # backends count the prompt tokens they run here

    def prefill_tokens_computed(self) -> int:
        """Cumulative prompt tokens actually run through the model (not served
        from a KV or prefix cache) since this policy was created."""
        return self._prefill

    def close(self) -> None:
        """Release engines, processes and connections. Idempotent."""

    def __enter__(self) -> "Policy":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


_STOP_IDS: dict[int, tuple[Any, int, list[int]]] = {}


def default_stop_ids(tokenizer: Any) -> list[int]:
    """The ids that end an assistant turn: the tokenizer's EOS and ``<|im_end|>`` when it has them.

    Cached per tokenizer (and its size: added tokens look again): the look-up reads the whole
    vocabulary, milliseconds a call, and rollouts ask on every scripted turn."""
    size = len(tokenizer) if hasattr(tokenizer, "__len__") else -1
    hit = _STOP_IDS.get(id(tokenizer))
    if hit is not None and hit[0] is tokenizer and hit[1] == size:
        return list(hit[2])
    ids: list[int] = []
    if getattr(tokenizer, "eos_token_id", None) is not None:
        ids.append(int(tokenizer.eos_token_id))
    im_end = tokenizer.convert_tokens_to_ids("<|im_end|>") if "<|im_end|>" in tokenizer.get_vocab() else None
    if im_end is not None and im_end not in ids:
        ids.append(int(im_end))
    if not ids:
        raise ValueError(
            "the tokenizer has neither an eos_token nor <|im_end|>; pass stop_token_ids explicitly"
        )
    _STOP_IDS[id(tokenizer)] = (tokenizer, size, ids)
    return list(ids)


def sampling_stats(logits: "torch.Tensor", temperature: float, top_p: float
                   ) -> tuple["torch.Tensor", "torch.Tensor"]:
    """The sampling distribution's log-probabilities and normalised top-k entropy.

    Args:
        logits: ``[batch, vocab]`` raw next-token logits (any float dtype).

    Returns:
        ``(logp, entropy)``: ``logp`` is ``[batch, vocab]`` float32 log-probabilities
        of the distribution to sample from (``-inf`` outside the nucleus), ``entropy``
        is ``[batch]`` (see the module docstring).
    """
    import torch

    x = logits.float()
    vocab = x.shape[-1]
    if temperature > 0:
        x = x / temperature
    logp = torch.log_softmax(x, dim=-1)
    if temperature > 0 and top_p < 1.0:
        sorted_lp, order = torch.sort(logp, dim=-1, descending=True)
        cum = sorted_lp.exp().cumsum(dim=-1)
        # keep the smallest prefix whose mass reaches top_p (the first token always stays)
        drop_sorted = (cum - sorted_lp.exp()) >= top_p
        drop = torch.zeros_like(drop_sorted).scatter(-1, order, drop_sorted)
        logp = torch.log_softmax(logp.masked_fill(drop, float("-inf")), dim=-1)
    top = torch.topk(logp, min(ENTROPY_TOP_K, vocab), dim=-1).values
    p = torch.softmax(top, dim=-1)
    ent = -(p * torch.where(p > 0, p.log(), torch.zeros_like(p))).sum(-1) / math.log(vocab)
    return logp, ent


def entropy_from_top_logprobs(top_logprobs: Sequence[float], vocab_size: int) -> float:
    """:data:`ENTROPY_TOP_K` entropy from a server's top log-probabilities (renormalised)."""
    vals = sorted((v for v in top_logprobs if v is not None and v > float("-inf")), reverse=True)
    vals = vals[:ENTROPY_TOP_K]
    if not vals:
        return 0.0
    m = vals[0]
    ps = [math.exp(v - m) for v in vals]
    z = sum(ps)
    return -sum((q / z) * math.log(q / z) for q in ps if q > 0) / math.log(vocab_size)
