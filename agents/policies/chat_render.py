"""Rendering an episode's messages into token ids with a tokenizer's chat template.

Token-in/token-out rollouts never re-tokenize what the model wrote. They need
only two renderings from the template:

* the opening: system (with the tool schemas) + user + the assistant header;
* the ids to *insert* after a sampled assistant turn: the rest of the assistant
  turn's closing markup, then the environment's new messages, then (if the
  episode goes on) the next assistant header. These come from rendering a fixed
  base conversation with and without the new messages and taking the
  difference, so they match what the template would render in context.
"""

from __future__ import annotations

from typing import Any

__all__ = ["ChatRenderer", "TemplateError", "renderer_for"]

_MARK = "\u2063ENVFACTORY-CONTENT\u2063"
_BASE = [
    {"role": "system", "content": "S"},
    {"role": "user", "content": "U"},
    {"role": "assistant", "content": _MARK},
]


class TemplateError(ValueError):
    """The tokenizer's chat template cannot be used for incremental rendering."""


class ChatRenderer:
    """Chat-template rendering for one tokenizer.

    Attributes:
        close: The text the template puts right after an assistant message's
            content (e.g. ``"<|im_end|>\\n"``).
    """

    def __init__(self, tokenizer: Any) -> None:
        if not getattr(tokenizer, "chat_template", None):
            raise TemplateError(
                "the tokenizer has no chat_template; use a chat model's tokenizer "
                "(or agents.models.tiny.build_tiny_model(), which has one)"
            )
        self.tokenizer = tokenizer
        base = self.render(_BASE)
        if base.count(_MARK) != 1:
            raise TemplateError("the chat template does not render assistant content verbatim")
        self._base = base.replace(_MARK, "A")
        self._base_msgs = [*_BASE[:2], {"role": "assistant", "content": "A"}]
        self.close = base.split(_MARK, 1)[1]

    def render(self, messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None = None,
               add_generation_prompt: bool = False) -> str:
        """The template's text for ``messages`` (and ``tools``)."""
        return self.tokenizer.apply_chat_template(
            messages, tools=tools or None, tokenize=False, add_generation_prompt=add_generation_prompt
        )

    def encode(self, text: str) -> list[int]:
        """Token ids of already-rendered text (special tokens in it are recognised; none are added)."""
        return list(self.tokenizer(text, add_special_tokens=False)["input_ids"])

    def decode(self, ids: list[int]) -> str:
        """Text of ids, special tokens included, spacing untouched."""
        return self.tokenizer.decode(ids, skip_special_tokens=False, clean_up_tokenization_spaces=False)

    def opening(self, messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None) -> list[int]:
        """Ids of the opening messages with the tool schemas, ending in the assistant header."""
        return self.encode(self.render(messages, tools, add_generation_prompt=True))

    def continuation(self, new_messages: list[dict[str, Any]], add_generation_prompt: bool) -> str:
        """Text the template renders for ``new_messages`` after an assistant turn
        (the assistant's closing markup excluded)."""
        full = self.render(self._base_msgs + list(new_messages), add_generation_prompt=add_generation_prompt)
        if not full.startswith(self._base):
            raise TemplateError(
                "the chat template re-renders earlier messages when new ones follow; "
                "incremental token-in/token-out rendering needs a prefix-stable template"
            )
        return full[len(self._base):]


_RENDERERS: dict[int, ChatRenderer] = {}


def renderer_for(tokenizer: Any) -> ChatRenderer:
    """The (cached) :class:`ChatRenderer` of a tokenizer (or of anything with a ``tokenizer``)."""
    tokenizer = getattr(tokenizer, "tokenizer", tokenizer)
    r = _RENDERERS.get(id(tokenizer))
    if r is None or r.tokenizer is not tokenizer:
        r = _RENDERERS[id(tokenizer)] = ChatRenderer(tokenizer)
    return r
