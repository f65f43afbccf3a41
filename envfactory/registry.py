"""The registry: register environments, find them through entry points, make them.

Built-in and third-party environments register themselves when their module is
imported. Packages announce such modules in the entry-point group
``envfactory.environments``; :func:`discover` imports each (calling it if it is
a function). Every registered environment is also a Gymnasium id,
``envfactory/<Name>-v<N>``.
"""

from __future__ import annotations

import importlib
import inspect
import os
import sys
import warnings
from importlib import metadata
from typing import Any

from .definition import SpecError
from .episode import Episode

__all__ = ["register", "make", "make_multi", "spec", "specs", "discover", "ENTRY_POINT_GROUP", "RUNTIMES"]

ENTRY_POINT_GROUP = "envfactory.environments"
GYM_NAMESPACE = "envfactory"
# runtime name -> the World class that hosts the state ("module:attribute", imported on use)
RUNTIMES = {"local": "envfactory.world:LocalWorld", "docker": "envfactory.runtime.docker:ContainerWorld"}

_REGISTRY: dict[str, Any] = {}
_discovered = False
_discovery_errors: dict[str, str] = {}


def register(env_spec: Any, *, replace: bool = False) -> Any:
    """Register an environment definition and its Gymnasium id.

    Args:
        env_spec: A :class:`ToolEnvSpec`.
        replace: Allow replacing an existing registration of the same name.

    Returns:
        The spec, so that ``SPEC = register(ToolEnvSpec(...))`` reads naturally.
    """
    name = getattr(env_spec, "name", None)
    if not isinstance(name, str):
        raise SpecError(f"cannot register {env_spec!r}: it has no name")
    if name in _REGISTRY and _REGISTRY[name] is not env_spec and not replace:
        raise SpecError(
            f"an environment named {name!r} is already registered "
            f"(from {_REGISTRY[name].module}); pass replace=True to override it"
        )
    if getattr(env_spec, "module", None) is None:
        frame = inspect.currentframe()
        caller = frame.f_back if frame else None
        env_spec.module = caller.f_globals.get("__name__") if caller else None
    _REGISTRY[name] = env_spec
    _register_gym(env_spec)
    return env_spec


def _register_gym(env_spec: Any) -> None:
    import gymnasium

    gym_id = f"{GYM_NAMESPACE}/{env_spec.name}"
    if getattr(env_spec, "multi_agent", False):
        return
    if gym_id in gymnasium.registry:
        del gymnasium.registry[gym_id]
    gymnasium.register(
        id=gym_id,
        entry_point="envfactory.gym_env:ToolGymEnv",
        kwargs={"env_name": env_spec.name},
        disable_env_checker=False,
    )


def discover(*, force: bool = False, _defer_on_error: bool = False) -> dict[str, str]:
    """Import every module announced in the ``envfactory.environments`` group.

    A plugin that fails to import is reported (returned and warned about), not
    fatal: one broken package must not hide every other environment.
    Set ``ENVFACTORY_NO_PLUGINS=1`` to skip discovery.

    Returns:
        ``{entry point name: error}`` for plugins that failed.
    """
    global _discovered
    if (_discovered and not force) or os.environ.get("ENVFACTORY_NO_PLUGINS") == "1":
        return dict(_discovery_errors)
    _discovered = True
    for ep in metadata.entry_points(group=ENTRY_POINT_GROUP):
        try:
            obj = ep.load()
            if callable(obj) and not inspect.ismodule(obj):
                obj()
        except Exception as exc:  # report, keep going
            if _defer_on_error:
                # `import envfactory` was triggered from inside a plugin module's own
                # import (a circular, partial import): try again on first use.
                _discovered = False
                return {}
            _discovery_errors[ep.name] = f"{type(exc).__name__}: {exc}"
            warnings.warn(
                f"envfactory: environment plugin {ep.name!r} ({ep.value}) failed to load: {exc}",
                RuntimeWarning,
                stacklevel=2,
            )
    return dict(_discovery_errors)


def spec(name: str) -> Any:
    """The registered spec called ``name`` (``envfactory/`` prefix allowed)."""
    if name.startswith(GYM_NAMESPACE + "/"):
        name = name[len(GYM_NAMESPACE) + 1 :]
    if name not in _REGISTRY:
        discover()
    try:
        return _REGISTRY[name]
    except KeyError:
        known = ", ".join(sorted(_REGISTRY)) or "none"
        raise KeyError(f"no environment named {name!r}; registered: {known}") from None


def specs() -> list[Any]:
    """Every registered spec, sorted by name."""
    discover()
    return [_REGISTRY[k] for k in sorted(_REGISTRY)]


def _world_factory(runtime: str) -> Any:
    """The world class registered for ``runtime`` (imported on first use)."""
    try:
        target = RUNTIMES[runtime]
    except (KeyError, TypeError):
        raise ValueError(f"unknown runtime {runtime!r}; choose one of {', '.join(RUNTIMES)}") from None
    module, _, attr = target.partition(":")
    try:
        return getattr(importlib.import_module(module), attr)
    except ImportError as exc:
        raise RuntimeError(f"the {runtime} runtime is not available: {exc}") from exc


def make(name: str, runtime: str = "local", *, max_turns: int | None = None, **world_options: Any) -> Episode:
    """Create a live episode of a registered environment, for one agent or a team.

    Args:
        name: Registered name, e.g. ``"FileSystem-v0"`` or ``"MultiRecords-v0"``.
        runtime: Where the world runs: ``"local"`` (in-process) or ``"docker"``
            (a hardened container); the referee always runs here.
        max_turns: Overrides the environment's turn (round) limit.
        **world_options: Passed to the world (e.g. ``step_timeout`` for docker).
    """
    s = spec(name)
    world = _world_factory(runtime)(s, **world_options)
    return Episode(s, world, max_turns=max_turns)


def make_multi(name: str, runtime: str = "local", **kwargs: Any) -> Episode:
    """:func:`make` for a team environment (it refuses a single-agent one)."""
    s = spec(name)
    if not s.multi_agent:
        raise TypeError(f"{s.name} is a single-agent environment; create it with envfactory.make(...)")
    return make(name, runtime, **kwargs)
