"""The registry: register environments, find them through entry points, make them.

Built-in and third-party environments register themselves when their module is
imported. Packages announce such modules in the entry-point group
``envfactory.environments``; :func:`discover` imports each (calling it if it is
a function). Every registered environment is also a Gymnasium id,
``envfactory/<Name>-v<N>``.
"""

from __future__ import annotations

import inspect
import os
import sys
import warnings
from importlib import metadata
from typing import Any

from .env import Environment
from .spec import EnvSpec, SpecError

__all__ = ["register", "make", "make_multi", "spec", "specs", "discover", "ENTRY_POINT_GROUP", "RUNTIMES"]

ENTRY_POINT_GROUP = "envfactory.environments"
GYM_NAMESPACE = "envfactory"
RUNTIMES = ("local", "docker")

_REGISTRY: dict[str, Any] = {}
_discovered = False
_discovery_errors: dict[str, str] = {}


def register(env_spec: Any, *, replace: bool = False) -> Any:
    """Register an environment definition and its Gymnasium id.

    Args:
        env_spec: An :class:`EnvSpec` (or a multi-agent spec; anything with
            ``name`` and ``describe()``).
        replace: Allow replacing an existing registration of the same name.

    Returns:
        The spec, so that ``SPEC = register(EnvSpec(...))`` reads naturally.
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


def make(name: str, runtime: str = "local", **kwargs: Any) -> Environment:
    """Create a live environment.

    Args:
        name: Registered name, e.g. ``"FileSystem-v0"``.
        runtime: ``"local"`` (in-process) or ``"docker"`` (hardened container).
        **kwargs: Passed to the runtime (e.g. ``max_turns``).
    """
    s = spec(name)
    if getattr(s, "multi_agent", False):
        raise TypeError(
            f"{s.name} is a multi-agent environment; create it with envfactory.make_multi(...) "
            "or its PettingZoo env()/parallel_env()"
        )
    if runtime == "local":
        from .runtime.local import LocalEnv

        return LocalEnv(s, **kwargs)
    if runtime == "docker":
        try:
            from .runtime.docker import DockerEnv
        except ImportError as exc:
            raise RuntimeError(f"the docker runtime is not available: {exc}") from exc
        return DockerEnv(s, **kwargs)
    raise ValueError(f"unknown runtime {runtime!r}; choose one of {', '.join(RUNTIMES)}")


def make_multi(name: str, runtime: str = "local", **kwargs: Any) -> Any:
    """Create a live multi-agent episode (:class:`envfactory.multi.MultiEpisode`).

    Args:
        name: Registered multi-agent environment name, e.g. ``"MultiRecords-v0"``.
        runtime: ``"local"`` (in-process) or ``"docker"``.
        **kwargs: Passed to the runtime (e.g. ``max_rounds``).

    For PettingZoo views use :func:`envfactory.multi.env` (AEC) or
    :func:`envfactory.multi.parallel_env`.
    """
    s = spec(name)
    if not getattr(s, "multi_agent", False):
        raise TypeError(f"{s.name} is a single-agent environment; create it with envfactory.make(...)")
    if runtime == "local":
        from .multi.episode import MultiEpisode

        return MultiEpisode(s, **kwargs)
    if runtime == "docker":
        try:
            from .runtime.docker import DockerMultiEpisode  # type: ignore[attr-defined]
        except ImportError as exc:
            raise RuntimeError(
                f"the docker runtime does not serve multi-agent environments yet ({exc}); "
                "use runtime='local'"
            ) from exc
        return DockerMultiEpisode(s, **kwargs)
    raise ValueError(f"unknown runtime {runtime!r}; choose one of {', '.join(RUNTIMES)}")
