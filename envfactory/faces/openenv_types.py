"""The wire types of the OpenEnv face (:class:`EnvfactoryAction`, :class:`EnvfactoryObservation`),
shared by its server (:mod:`.openenv_server`) and its typed client (:mod:`.openenv_client`); the
first of envfactory's modules to load ``openenv-core``, and the one that loads it without its
optional Gradio web UI."""

from __future__ import annotations

import os
import sys
from typing import Any, Literal, Optional

from pydantic import Field

__all__ = ["EnvfactoryAction", "EnvfactoryObservation", "WEB_INTERFACE_MODULE"]

WEB_INTERFACE_MODULE = "openenv.core.env_server.web_interface"


def _web_interface_wanted() -> bool:
    """openenv-core's own switch for its Gradio web UI (``create_app`` reads it when called)."""
    return os.getenv("ENABLE_WEB_INTERFACE", "false").lower() in ("true", "1", "yes")


# openenv-core's package __init__ imports its Gradio web UI (7 of a server's ~11 s of imports on a
# loaded machine) and treats it as optional: a ModuleNotFoundError leaves create_web_interface_app
# None. Unless the web UI is asked for, it is held back while openenv-core loads, then released, so
# create_app(..., ENABLE_WEB_INTERFACE=true) can still import it when it is called.
_held_back = (WEB_INTERFACE_MODULE not in sys.modules and "openenv.core" not in sys.modules
              and not _web_interface_wanted())
if _held_back:
    sys.modules[WEB_INTERFACE_MODULE] = None  # type: ignore[assignment]  # import -> ModuleNotFoundError
try:
    from openenv.core.env_server.types import Action, Observation
finally:
    if _held_back and sys.modules.get(WEB_INTERFACE_MODULE, 0) is None:
        del sys.modules[WEB_INTERFACE_MODULE]


class EnvfactoryAction(Action):
    """One assistant turn: model text and/or structured tool calls."""

    text: str = Field(default="", description="The agent's message: Hermes <tool_call>{...}</tool_call> blocks "
                                              "(several allowed) or a bare JSON call; no call ends the episode")
    tool_calls: Optional[list[dict[str, Any]]] = Field(
        default=None, description="OpenAI-style tool calls ({'name', 'arguments'} or {'function': {...}})")
    # openenv's MCP tool interface (MCPToolClient sends these over the same /ws step): openenv-core
    # routes them to its own action types only for servers without an action class of their own
    type: Optional[Literal["list_tools", "call_tool"]] = Field(
        default=None, description="MCP tool interface: 'list_tools', or 'call_tool' with tool_name and arguments")
    tool_name: Optional[str] = None
    arguments: Optional[dict[str, Any]] = None


class EnvfactoryObservation(Observation):
    """What the agent sees after a reset or a step (``reward`` and ``done`` from the base class)."""

    text: str = Field(default="", description="reset: the instruction; step: the tool responses, joined")
    messages: list[dict[str, Any]] = Field(default_factory=list, description="the new chat messages")
    task_id: Optional[str] = None
    instruction: str = ""
    system_prompt: str = ""
    tools: list[dict[str, Any]] = Field(default_factory=list, description="reset: OpenAI tool schemas")
    max_turns: Optional[int] = None
    success: Optional[bool] = None
    info: dict[str, Any] = Field(default_factory=dict)
