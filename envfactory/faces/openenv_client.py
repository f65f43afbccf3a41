"""The typed OpenEnv client of :mod:`envfactory.faces.openenv_server` (also importable from there as
``envfactory.faces.openenv_server.EnvfactoryClient``). A module of its own so that a server never
imports openenv-core's client side."""

from __future__ import annotations

from typing import Any

from openenv.core.client_types import StepResult
from openenv.core.env_client import EnvClient
from openenv.core.env_server.types import State

from .openenv_types import EnvfactoryAction, EnvfactoryObservation

__all__ = ["EnvfactoryClient"]


class EnvfactoryClient(EnvClient[EnvfactoryAction, EnvfactoryObservation, State]):
    """A typed OpenEnv client (optional: ``GenericEnvClient`` plays the same server with dicts)::

        with EnvfactoryClient(base_url=url).sync() as env:
            obs = env.reset(task_id="counter-0-1").observation      # an EnvfactoryObservation
            r = env.step(EnvfactoryAction(text='<tool_call>{"name": "increment", "arguments": {"by": 1}}</tool_call>'))

    ``token``: the server's (``envfactory serve --token``); it travels as HTTP Basic credentials of
    the WebSocket URL, which is also how openenv-core's own clients pass it
    (``GenericEnvClient(base_url="http://envfactory:TOKEN@host:port")``).
    """

    def __init__(self, base_url: str, *args: Any, token: str | None = None, **kw: Any) -> None:
        super().__init__(base_url, *args, **kw)
        if token is not None:
            from urllib.parse import quote, urlsplit, urlunsplit

            ws_url: str = self._ws_url  # type: ignore[has-type]  # (set by EnvClient.__init__)
            parts = urlsplit(ws_url)
            netloc = f"envfactory:{quote(token, safe='')}@{parts.netloc.rpartition('@')[2]}"
            self._ws_url = urlunsplit(parts._replace(netloc=netloc))

    def list_tasks(self, split: str | None = None) -> list[dict[str, Any]]:
        """The tasks the server serves (``task_id``, ``split``, ``kind``, ``instruction``), optionally
        those of one ``split`` within the server's (``GET /tasks``)."""
        import httpx

        ws = self._ws_url[: -len("/ws")]  # EnvClient keeps only the WebSocket URL (credentials too)
        url = ws.replace("ws://", "http://", 1).replace("wss://", "https://", 1)
        r = httpx.get(url + "/tasks", params={} if split is None else {"split": split}, timeout=30)
        if r.status_code != 200:
            raise ValueError(r.json().get("detail", r.text) if r.headers.get("content-type", "").startswith(
                "application/json") else r.text)
        return r.json()["tasks"]

    def _step_payload(self, action: EnvfactoryAction) -> dict[str, Any]:
        return action.model_dump(exclude_defaults=True) if isinstance(action, EnvfactoryAction) else dict(action)

    def _parse_result(self, payload: dict[str, Any]) -> StepResult[EnvfactoryObservation]:
        obs = EnvfactoryObservation(**payload.get("observation", {}), reward=payload.get("reward"),
                                    done=payload.get("done", False))
        return StepResult(observation=obs, reward=payload.get("reward"), done=payload.get("done", False))

    def _parse_state(self, payload: dict[str, Any]) -> State:
        return State(**payload)
