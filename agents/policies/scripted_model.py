"""Model policies without a model, for tests and demos of the rollout machinery.

Both are :class:`~agents.policies.policy.Policy` objects (token ids in, token ids out), not the
role policies of :mod:`envfactory.checks.scripted` (``act(episode, agent, seed)``).
:class:`ScriptedModel` "samples" given texts: each assistant turn of each
episode is the next text of its script, tokenized, followed by ``<|im_end|>``
(logprob 0, entropy 0). :class:`RecordingPolicy` wraps any policy and keeps
every generation it returned, so tests can check that rollouts train on
exactly the sampled ids.
"""

from __future__ import annotations

from typing import Any, Callable

from agents.policies.policy import Generation, Policy, default_stop_ids

__all__ = ["ScriptedModel", "RecordingPolicy"]


class ScriptedModel(Policy):
    """A model policy that answers with scripted texts.

    Args:
        tokenizer: The tokenizer rollouts render with.
        script: ``script(prompt_ids, turn) -> text | None`` where ``turn`` counts
            the assistant turns already in the prompt (0 for the first); ``None``
            hands the prompt to ``fallback`` (a real policy) instead.
        fallback: The policy that samples the turns the script leaves out.
        fail_on: Raise ``RuntimeError`` for prompts whose text contains this string
            (simulates a backend failing a request).
    """

    def __init__(self, tokenizer: Any, script: Callable[[list[int], int], str | None], *,
                 fail_on: str | None = None, fallback: Policy | None = None) -> None:
        self.tokenizer = tokenizer
        self.fallback = fallback
        self.script = script
        self.fail_on = fail_on
        self._assistant = tokenizer("<|im_start|>assistant", add_special_tokens=False)["input_ids"]

    def _turn(self, prompt: list[int]) -> int:
        a, n = self._assistant, len(self._assistant)
        return sum(1 for i in range(len(prompt) - n + 1) if prompt[i:i + n] == a) - 1

    def generate(self, prompts: list[list[int]], *, max_new_tokens: int, temperature: float = 1.0,
                 top_p: float = 1.0, stop_token_ids: list[int] | None = None,
                 seed: int | None = None) -> list[Generation]:
        stop = (stop_token_ids or default_stop_ids(self.tokenizer))[0]
        out: list[Generation | None] = []
        delegated: list[int] = []
        for i, p in enumerate(prompts):
            if self.fail_on and self.fail_on in self.tokenizer.decode(p):
                raise RuntimeError(f"scripted backend failure (prompt contains {self.fail_on!r})")
            text = self.script(p, self._turn(p))
            if text is None:
                if self.fallback is None:
                    raise ValueError("the script returned None and there is no fallback policy")
                delegated.append(i)
                out.append(None)
                continue
            self._prefill += len(p)
            ids = self.tokenizer(text, add_special_tokens=False)["input_ids"]
            ids = (ids + [stop])[:max_new_tokens]
            finish = "stop" if ids[-1] == stop else "length"
            out.append(Generation(ids, [0.0] * len(ids), [0.0] * len(ids), finish))
        if delegated:
            gens = self.fallback.generate([prompts[i] for i in delegated], max_new_tokens=max_new_tokens,
                                          temperature=temperature, top_p=top_p, stop_token_ids=stop_token_ids,
                                          seed=seed)
            for i, g in zip(delegated, gens):
                out[i] = g
        return out  # type: ignore[return-value]


class RecordingPolicy(Policy):
    """Delegates to ``inner`` and records ``(prompt, generation)`` of every call."""

    def __init__(self, inner: Policy) -> None:
        self.inner = inner
        self.tokenizer = inner.tokenizer
        self.calls: list[tuple[list[int], Generation]] = []

    def prefill_tokens_computed(self) -> int:
        return self.inner.prefill_tokens_computed()

    def generate(self, prompts: list[list[int]], **kw: Any) -> list[Generation]:
        gens = self.inner.generate(prompts, **kw)
        self.calls += [(list(p), g) for p, g in zip(prompts, gens)]
        return gens
