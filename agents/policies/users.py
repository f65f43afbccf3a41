"""An LLM as the simulated user of an environment (see :mod:`envfactory.users`).

``envfactory.make(name, user=LLMUser(policy))`` has every ``ask_user`` call answered by a
language model playing the user: it sees a system prompt with the user's private facts and
the request, then the agent's questions so far with its own earlier replies, and writes one
short reply. Any :class:`agents.policies.policy.Policy` backend serves (HF transformers, vLLM,
OpenAI-compatible HTTP with a local tokenizer), and so does any chat endpoint
(``LLMUser.from_chat(base_url, model)``: ``/v1/chat/completions``, messages in, text out, no
tokenizer); the scripted user stays the default for tests and CPU training. A backend that fails
(a server down, an HTTP error, an answer without text) becomes the ``ask_user`` tool's error
observation (:func:`envfactory.users.host_reply`), never an exception out of ``step``.
"""

from __future__ import annotations

import zlib
from typing import Any, Protocol, runtime_checkable

from agents.policies.policy import Policy

__all__ = ["ChatModel", "LLMUser", "PolicyChat", "USER_PROMPT"]

USER_PROMPT = (
    "You are a customer talking to a support agent. What you know about yourself:\n{facts}\n"
    "Answer the agent's question in one short sentence, truthfully, using only these facts. "
    "If the question asks for none of them, say what you can tell instead. Never make up facts. "
    "If the agent asks you to confirm an action that serves your goal, say yes."
)


@runtime_checkable
class ChatModel(Protocol):
    """A text-only chat model (e.g. :class:`agents.policies.openai_policy.OpenAIChat`): messages in, text out."""

    def complete(self, messages: list[dict[str, Any]], *, max_tokens: int = ..., temperature: float = ...,
                 seed: int | None = ...) -> str: ...


class PolicyChat:
    """A :class:`Policy` whose tokenizer has a chat template, as a :class:`ChatModel`: a local model
    (HF transformers, vLLM, the embedded tiny model) wherever a chat endpoint would serve, e.g. the
    task paraphrase pass (:func:`envfactory.factory.tasks.paraphrase.paraphrase`)."""

    def __init__(self, policy: Policy, *, max_tokens: int = 96, temperature: float = 0.0) -> None:
        self.policy, self.max_tokens, self.temperature = policy, max_tokens, temperature

    def complete(self, messages: list[dict[str, Any]], *, max_tokens: int | None = None,
                 temperature: float | None = None, seed: int | None = None) -> str:
        tok: Any = self.policy.tokenizer
        ids = tok.apply_chat_template(messages, add_generation_prompt=True, tokenize=True)
        if hasattr(ids, "keys"):  # transformers >= 5 returns a BatchEncoding (a mapping, not a dict)
            ids = ids["input_ids"]
        gen = self.policy.generate([list(ids)], max_new_tokens=self.max_tokens if max_tokens is None else max_tokens,
                                   temperature=self.temperature if temperature is None else temperature, seed=seed)[0]
        tokens = gen.token_ids[:-1] if gen.finish_reason == "stop" else gen.token_ids
        return tok.decode(tokens, skip_special_tokens=True).strip()


class LLMUser:
    """A :class:`Policy` or a chat model as the user: ``user(question, facts, history) -> reply``.

    Args:
        policy: Any policy backend with a tokenizer that has a chat template, or a
            :class:`ChatModel` (see :meth:`from_chat`), which is sent the messages as they are.
        max_new_tokens: The longest reply.
        temperature: Sampling temperature (0 for greedy).
        seed: Base seed; each reply's seed also depends on the question and the history, so a
            replayed conversation gets the same replies.
    """

    def __init__(self, policy: Policy | ChatModel, *, max_new_tokens: int = 48, temperature: float = 0.7,
                 seed: int = 0) -> None:
        self.policy, self.max_new_tokens, self.temperature, self.seed = policy, max_new_tokens, temperature, seed

    @classmethod
    def from_chat(cls, base_url: str, model: str, api_key: str | None = None, *, timeout: float = 60.0,
                  transport: Any = None, **kwargs: Any) -> "LLMUser":
        """The user played by a model behind any OpenAI-compatible chat endpoint
        (``POST {base_url}/v1/chat/completions``); ``kwargs`` as for the constructor."""
        from agents.policies.openai_policy import OpenAIChat

        return cls(OpenAIChat(base_url, model, api_key=api_key, timeout=timeout, transport=transport), **kwargs)

    def messages(self, question: str, facts: dict[str, str], history: list[tuple[str, str]]) -> list[dict[str, Any]]:
        """The user model's conversation: its facts, then the agent's questions and its replies."""
        lines = "\n".join(f"- {k}: {v}" for k, v in facts.items()) or "- (nothing in particular)"
        out: list[dict[str, Any]] = [{"role": "system", "content": USER_PROMPT.format(facts=lines)}]
        for q, a in history:
            out += [{"role": "user", "content": q}, {"role": "assistant", "content": a}]
        out.append({"role": "user", "content": question})
        return out

    def __call__(self, question: str, facts: dict[str, str], history: list[tuple[str, str]]) -> str:
        messages = self.messages(question, facts, history)
        seed = zlib.crc32(f"{self.seed}/{question}/{len(history)}".encode()) & 0x7FFFFFFF
        model = self.policy if isinstance(self.policy, ChatModel) else PolicyChat(self.policy)
        return model.complete(messages, max_tokens=self.max_new_tokens, temperature=self.temperature,
                              seed=seed).strip()
