"""Policy specs for the command line: one string names a model backend or a scripted baseline.

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
==========================  ==================================================
"""

from __future__ import annotations

from typing import Any

from .policy import Policy

__all__ = ["load_policy", "SCRIPTED", "PolicySpecError"]

SCRIPTED = ("oracle", "random", "noop")


class PolicySpecError(ValueError):
    """A policy spec that names no known backend."""


def load_policy(spec: str, **kwargs: Any) -> Policy | str:
    """The :class:`Policy` a spec names, or the scripted baseline's name (``oracle``...).

    Raises:
        PolicySpecError: the spec is malformed (the message lists the accepted forms).
    """
    s = spec.strip()
    if s in SCRIPTED:
        return s
    kind, _, arg = s.partition(":")
    if s == "tiny":
        from .hf_policy import HFPolicy

        return HFPolicy(None, **kwargs)
    if kind == "hf" and arg:
        from .hf_policy import HFPolicy

        return HFPolicy(None if arg == "tiny" else arg, **kwargs)
    if kind == "vllm" and arg:
        from .vllm_policy import VLLMPolicy

        return VLLMPolicy(None if arg == "tiny" else arg, **kwargs)
    if kind == "openai" and arg:
        url, _, model = arg.partition("#")
        model, _, tok = model.partition("@")
        if not url or not model:
            raise PolicySpecError(f"{spec!r}: write openai:URL#MODEL, e.g. openai:http://127.0.0.1:8000/v1#my-model")
        from .openai_policy import OpenAIPolicy

        return OpenAIPolicy(url, model, tokenizer=tok or None, **kwargs)
    raise PolicySpecError(
        f"unknown policy spec {spec!r}; use tiny, hf:PATH, vllm:PATH, openai:URL#MODEL, "
        "or a scripted baseline: oracle, random, noop"
    )
