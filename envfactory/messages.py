"""Message helpers: converting episode messages for other consumers."""

from __future__ import annotations

import json
from typing import Any

__all__ = ["to_openai"]


def to_openai(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Episode messages in strict OpenAI chat format (tool-call arguments as JSON strings).

    Episode messages keep ``tool_calls[].function.arguments`` as a dict, which
    is what HF chat templates render; OpenAI-compatible servers want a string.
    """
    out = []
    for m in messages:
        if m.get("tool_calls"):
            m = dict(m)
            m["tool_calls"] = [
                {**c, "function": {**c["function"], "arguments": c["function"]["arguments"]
                 if isinstance(c["function"]["arguments"], str)
                 else json.dumps(c["function"]["arguments"])}}
                for c in m["tool_calls"]
            ]
        out.append(m)
    return out
