"""The Ray runtime: worlds hosted by Ray actors, the referee on this host.

``envfactory.make(name, runtime="ray", workers=N)`` is an
:class:`~envfactory.episode.Episode` (the referee, here) over a :class:`RayWorld`:
the state lives in one of ``N`` :class:`WorldHost` actors of a :class:`RayPool`,
and each step sends the already-parsed calls there as one batch, as the Docker
runtime does. An actor hosts many worlds, of any runtime it can make
(``world_runtime="local"`` by default, or ``"docker"``: the actor then drives
containers on its own machine). New worlds (``start``, ``fork``, ``load``) are
placed round-robin over the actors, so a rollout's forks spread over the pool;
a fork on another actor travels as a state dump, which restores exactly
(``verify``'s snapshot check).

Faults, never silent:

* **A dead actor** (``ray.kill``, a crash, a lost node): each world it hosted is
  rebuilt on a live actor the next time it is used, by replaying what it has
  done since it began (its task or loaded state, then its tool-call batches,
  which the host keeps); worlds are deterministic, so the state is the one that
  was lost. The pool replaces the actor and counts ``dead_workers`` and
  ``replayed_worlds`` (:attr:`RayPool.stats`). The call is sent again once; when
  it kills the replacement too, it raises :class:`~envfactory.world.WorldLost` and
  the referee ends the episode as truncated (``info["world_lost"]``).
* **A batch that overruns** ``step_timeout``: the actor is presumed hung and is
  killed (its other worlds replay elsewhere), and the batch raises
  :class:`~envfactory.world.WorldTimeout`: the referee ends the episode as
  truncated with an error observation, and the pool counts ``timeouts``.

Ray is an optional dependency (``pip install 'envfactory[ray]'``). Without a
running Ray, the first pool starts a local one (``ray.init``); connect to a
cluster first (``ray.init(address=...)``) to spread the actors over machines.
"""

from __future__ import annotations

import itertools
import threading
from typing import Any, Sequence, cast

from ..definition import ToolEnvSpec
from ..env import EpisodeError
from ..state import State, copy_state
from ..task import Task, ToolCall
from ..tooling import ToolOutcome
from ..world import World, WorldLost, WorldTimeout

__all__ = ["RayWorld", "RayPool", "WorldHost", "get_ray_pool", "shutdown_ray_pools"]


class WorldHost:
    """A Ray actor's body: worlds by id, each made by the registered runtime ``runtime``.

    Every method takes the world's id; specs travel once per actor (by name when
    registered, else pickled) and tasks with each ``start``/``load``.
    """

    def __init__(self, runtime: str = "local", options: dict[str, Any] | None = None) -> None:
        self.runtime, self.options = runtime, dict(options or {})
        self._specs: dict[str, ToolEnvSpec] = {}
        self._worlds: dict[str, World] = {}

    def _spec(self, spec: Any) -> ToolEnvSpec:
        if isinstance(spec, str):
            if spec not in self._specs:
                from ..registry import spec as lookup

                self._specs[spec] = lookup(spec)
            return self._specs[spec]
        self._specs.setdefault(spec.name, spec)
        return spec

    def _new(self, wid: str, spec: Any) -> World:
        from ..registry import _world_factory

        old = self._worlds.pop(wid, None)
        if old is not None:
            old.close()
        world = self._worlds[wid] = _world_factory(self.runtime)(self._spec(spec), **self.options)
        return world

    def ping(self) -> bool:
        return True

    def _task(self, spec: Any, task: Task) -> Task:
        """A registered environment's task as registered here (it arrives as a copy; the Docker
        runtime runs registered tasks only, rebuilt in the container from their id)."""
        if isinstance(spec, str):
            try:
                return self._spec(spec).task(task.id)
            except KeyError:
                pass
        return task

    def start(self, wid: str, spec: Any, task: Task, with_state: bool) -> Any:
        world = self._new(wid, spec)
        world.start(self._task(spec, task))
        return world.dump() if with_state else None

    def load(self, wid: str, spec: Any, task: Task, state: Any) -> None:
        self._new(wid, spec).load(self._task(spec, task), state)

    def run(self, wid: str, agent: str, round: int, calls: list[ToolCall], with_state: bool
            ) -> tuple[list[tuple[str, bool, str]], Any]:
        world = self._worlds[wid]
        outs = world.run(agent, round, calls)
        return [(o.content, o.ok, o.kind) for o in outs], (world.dump() if with_state else None)

    def replay(self, wid: str, batches: list[tuple[str, int, list[ToolCall]]]) -> None:
        world = self._worlds[wid]
        for agent, rnd, calls in batches:
            world.run(agent, rnd, calls)

    def dump(self, wid: str) -> Any:
        return self._worlds[wid].dump()

    def fork(self, wid: str, new: str) -> None:
        self._worlds[new] = self._worlds[wid].fork()

    def close(self, wid: str) -> None:
        world = self._worlds.pop(wid, None)
        if world is not None:
            world.close()

    def count(self) -> int:
        return len(self._worlds)

    def shutdown(self) -> None:
        """Close every world and remove this actor's containers (before the actor is killed:
        a killed process runs no exit handler)."""
        import sys

        for wid in list(self._worlds):
            try:
                self.close(wid)
            except Exception:
                pass
        pool_mod = sys.modules.get("envfactory.runtime.pool")
        if pool_mod is not None:
            pool_mod.shutdown_all(30.0)

    def node(self) -> str:
        """The Ray node this actor runs on."""
        import ray

        return ray.get_runtime_context().get_node_id()

    def engines(self) -> list[dict[str, Any]]:
        """The Docker engines this actor's container pools use, one row per pool and engine
        (:meth:`envfactory.runtime.pool.Pool.host_rows`, with ``env``); empty without Docker."""
        import sys

        pool_mod = sys.modules.get("envfactory.runtime.pool")
        if pool_mod is None:
            return []
        rows = []
        with pool_mod._pools_lock:
            pools = list(pool_mod._pools.values())
        for p in pools:
            if not p._closed:
                rows += [{"env": p.spec.name, **r} for r in p.host_rows()]
        return rows


def _ray() -> Any:
    try:
        import ray
    except ImportError as exc:
        raise RuntimeError("the ray runtime needs Ray: pip install 'envfactory[ray]'") from exc
    return ray


class RayPool:
    """``workers`` :class:`WorldHost` actors and the place of every world on them.

    Args:
        workers: Actors (each a process, on any node of the Ray cluster).
        world_runtime: The runtime each actor makes its worlds with (``"local"``, ``"docker"``).
        step_timeout: Seconds a batch may take before its actor is presumed hung.
        start_timeout: Seconds an actor may take to start (a new process importing envfactory).
        scheduling_strategy: Where Ray places the actors (default ``"SPREAD"``: over the
            cluster's nodes, best effort; ``None``: Ray's default placement); a list gives each
            slot its own (e.g. ``NodeAffinitySchedulingStrategy`` per node), a replacement
            actor keeps its slot's.
        **world_options: Passed to the actors' worlds, e.g. ``docker_hosts=[...]`` with
            ``world_runtime="docker"``: the Docker engines each actor spreads its containers over
            (URLs as seen from the actor's node; default there: ``$ENVFACTORY_DOCKER_HOSTS``, else
            its default engine).
    """

    def __init__(self, workers: int = 2, *, world_runtime: str = "local", step_timeout: float = 30.0,
                 start_timeout: float = 180.0, scheduling_strategy: Any = "SPREAD",
                 **world_options: Any) -> None:
        if workers < 1:
            raise ValueError("workers must be at least 1")
        ray = _ray()
        if not ray.is_initialized():
            ray.init(include_dashboard=False, log_to_driver=False, ignore_reinit_error=True)
        self.workers, self.world_runtime, self.step_timeout = workers, world_runtime, step_timeout
        self.world_options, self.start_timeout = world_options, start_timeout
        self.scheduling_strategy = scheduling_strategy
        self._remote = ray.remote(max_restarts=0)(WorldHost)
        self._lock = threading.Lock()
        self._actors = [self._spawn(wait=False, slot=i) for i in range(workers)]
        ray.get([a.ping.remote() for a in self._actors], timeout=start_timeout)
        self._turn = itertools.count()
        self._ids = itertools.count()
        self.stats = {"dead_workers": 0, "replayed_worlds": 0, "timeouts": 0}
        self.closed = False

    def _spawn(self, wait: bool = True, slot: int = 0) -> Any:
        opts: dict[str, Any] = {"num_cpus": 0}
        strategy = self.scheduling_strategy
        if isinstance(strategy, (list, tuple)):
            strategy = strategy[slot % len(strategy)]
        if strategy is not None:
            opts["scheduling_strategy"] = strategy
        actor = self._remote.options(**opts).remote(self.world_runtime, self.world_options)
        if wait:  # started before anyone's step_timeout runs on it
            _ray().get(actor.ping.remote(), timeout=self.start_timeout)
        return actor

    def new_id(self) -> str:
        return f"w{next(self._ids)}"

    def place(self) -> int:
        """The slot of the next world (round-robin)."""
        return next(self._turn) % self.workers

    def actor(self, slot: int) -> Any:
        if self.closed:
            raise EpisodeError("the ray pool is closed")
        return self._actors[slot]

    def call(self, slot: int, method: str, *args: Any, timeout: float | None = None) -> Any:
        """``actor.method(*args)``, waited for; raises Ray's errors (see :class:`RayWorld`)."""
        ray = _ray()
        return ray.get(getattr(self.actor(slot), method).remote(*args), timeout=timeout)

    def replace(self, slot: int, actor: Any, *, timed_out: bool = False) -> None:
        """Swap in a fresh actor for ``actor`` at ``slot`` (once, however many worlds notice it)."""
        with self._lock:
            if self._actors[slot] is not actor:
                return  # another world has already replaced it
            try:
                _ray().kill(actor, no_restart=True)
            except Exception:  # already gone
                pass
            self._actors[slot] = self._spawn(slot=slot)
            self.stats["timeouts" if timed_out else "dead_workers"] += 1

    def worlds(self) -> list[int]:
        """How many worlds each actor hosts now."""
        return [self.call(i, "count") for i in range(self.workers)]

    def nodes(self) -> list[str]:
        """The Ray node of each actor."""
        return [self.call(i, "node") for i in range(self.workers)]

    def engines(self) -> list[dict[str, Any]]:
        """The Docker engines the actors' worlds use: one row per actor, pool and engine
        (``worker``, ``env``, ``host``, ``up``, ``containers``, ``sessions``, ``lost``)."""
        return [{"worker": i, **r} for i in range(self.workers) for r in self.call(i, "engines")]

    def close(self, shutdown_timeout: float = 45.0) -> None:
        """Kill every actor (their worlds are gone; each first removes its containers, up to
        ``shutdown_timeout`` seconds in all). Idempotent."""
        if self.closed:
            return
        self.closed = True
        if self.world_runtime != "local":
            try:
                _ray().get([a.shutdown.remote() for a in self._actors], timeout=shutdown_timeout)
            except Exception:  # a dead or hung actor: `envfactory gc` removes what it left
                pass
        for a in self._actors:
            try:
                _ray().kill(a, no_restart=True)
            except Exception:
                pass


_POOLS: dict[tuple[Any, ...], RayPool] = {}
_POOLS_LOCK = threading.Lock()


def get_ray_pool(workers: int = 2, *, world_runtime: str = "local", step_timeout: float = 30.0,
                 **world_options: Any) -> RayPool:
    """The process-wide pool for these settings (created on first use)."""
    key = (workers, world_runtime, step_timeout,
           tuple(sorted((k, tuple(v) if isinstance(v, list) else v) for k, v in world_options.items())))
    with _POOLS_LOCK:
        pool = _POOLS.get(key)
        if pool is None or pool.closed:
            pool = _POOLS[key] = RayPool(workers, world_runtime=world_runtime, step_timeout=step_timeout,
                                         **world_options)
        return pool


def shutdown_ray_pools() -> None:
    """Close every process-wide pool (their actors are killed)."""
    with _POOLS_LOCK:
        for pool in _POOLS.values():
            pool.close()
        _POOLS.clear()


class RayWorld(World):
    """The state of one episode in a Ray actor (see the module docstring).

    Args:
        spec: The environment definition (registered ones travel by name).
        pool: The actors (default: the process-wide pool for ``workers`` and the options).
        workers, world_runtime, step_timeout, **world_options: For the default pool.
    """

    def __init__(self, spec: ToolEnvSpec, *, pool: RayPool | None = None, workers: int = 2,
                 world_runtime: str = "local", step_timeout: float = 30.0, **world_options: Any) -> None:
        self.spec = spec
        self.pool = pool or get_ray_pool(workers, world_runtime=world_runtime, step_timeout=step_timeout,
                                         **world_options)
        self._validate = spec.state_type.model_validate
        self._with_state = spec.multi_agent or spec.terminal is not None
        self._ref = self._spec_ref(spec)
        self._wid: str | None = None
        self._slot, self._actor = -1, cast(Any, None)  # where this world lives (the actor handle, to notice a replacement)
        self._task: Task | None = None
        self._origin: Any = None  # the loaded state this world began from (None: its task's start)
        self._batches: list[tuple[str, int, list[ToolCall]]] = []  # every batch since then, for a replay
        self._state: State | None = None  # the last state fetched and validated; None when stale

    @staticmethod
    def _spec_ref(spec: ToolEnvSpec) -> Any:
        from ..registry import spec as lookup

        try:
            return spec.name if lookup(spec.name) is spec else spec
        except KeyError:
            return spec

    # -- the World interface ----------------------------------------------
    def start(self, task: Task) -> None:
        self._drop()
        self._task, self._origin, self._batches, self._state = task, None, [], None
        self._wid = self.pool.new_id()
        self._place()
        self._state = self._checked(self._call("start", self._wid, self._ref, task, self._with_state, rebuild=False))

    def run(self, agent: str, round: int, calls: Sequence[ToolCall]) -> list[ToolOutcome]:
        if self._wid is None:
            raise EpisodeError(f"{self.spec.name}: no world before reset()")
        calls = list(calls)
        self._state = None
        outs, state = self._call("run", self._wid, agent, round, calls, self._with_state,
                                 timeout=self.pool.step_timeout)
        self._batches.append((agent, round, calls))
        if self._with_state:
            self._state = self._checked(state)
        if len(outs) != len(calls):
            raise RuntimeError(f"{self.spec.name}: the ray world answered {len(outs)} outcomes for {len(calls)} calls")
        return [ToolOutcome(c, ok, kind) for c, ok, kind in outs]

    def state(self) -> State:
        if self._state is None:
            if self._wid is None:
                raise EpisodeError(f"{self.spec.name}: no state before reset()")
            state = self._checked(self._call("dump", self._wid))
            if state is None:
                raise WorldLost(f"{self.spec.name}: the ray worker returned no state")
            self._state = state
        return self._state

    def fork(self) -> "RayWorld":
        """A world with an equal state on the pool's next actor (the same actor: a local
        fork there; another: this world's dump, loaded)."""
        if self._wid is None:
            raise EpisodeError(f"{self.spec.name}: nothing to fork; call reset() first")
        child = RayWorld.__new__(RayWorld)
        child.__dict__.update(self.__dict__)
        child._wid = self.pool.new_id()
        child._place()
        child._state = None if self._state is None else copy_state(self._state)
        if child._actor is self._actor:
            self._call("fork", self._wid, child._wid)
            child._slot, child._actor = self._slot, self._actor  # (self may have been rebuilt elsewhere)
            child._batches = list(self._batches)
        else:
            child._origin, child._batches = self.dump(), []
            child._call("load", child._wid, child._ref, child._task, child._origin, rebuild=False)
        return child

    def dump(self) -> Any:
        return self.state().model_dump(mode="json")

    def load(self, task: Task, state: Any) -> None:
        checked = self._validate(state)  # a ValidationError (ValueError) before anything moves
        self._drop()
        self._task, self._origin, self._batches = task, checked.model_dump(mode="json"), []
        self._wid = self.pool.new_id()
        self._place()
        self._call("load", self._wid, self._ref, task, self._origin, rebuild=False)
        self._state = checked

    def close(self) -> None:
        self._drop()
        self._state = None

    # -- faults --------------------------------------------------------------
    def _drop(self) -> None:
        if self._wid is not None and not self.pool.closed and self._actor is not None:
            try:
                _ray().get(self._actor.close.remote(self._wid), timeout=self.pool.step_timeout)
            except Exception:  # a dead or hung actor: its worlds are gone with it
                pass
        self._wid = None

    def _place(self) -> None:
        """Put this world on the pool's next actor (round-robin)."""
        self._slot = self.pool.place()
        self._actor = self.pool.actor(self._slot)

    def _call(self, method: str, *args: Any, timeout: float | None = None, rebuild: bool = True) -> Any:
        """Call this world's actor. An actor found dead, or replaced since this world was placed on
        it (another world noticed its death first), is left behind: the world is rebuilt on a live
        one (``rebuild``: its history replayed; else, for start/load, just placed anew) and the
        call made there, once. An overrun kills the actor and raises :class:`WorldTimeout`."""
        ray = _ray()
        from ray.exceptions import GetTimeoutError, RayActorError

        limit = timeout or self.pool.step_timeout
        for attempt in (0, 1):
            if self._actor is not self.pool.actor(self._slot):  # replaced: this world went with the old one
                self._rebuild() if rebuild else self._place()
            actor = self._actor
            try:
                return ray.get(getattr(actor, method).remote(*args), timeout=limit)
            except GetTimeoutError:
                self.pool.replace(self._slot, actor, timed_out=True)
                self._wid = None
                raise WorldTimeout(f"{self.spec.name}: the ray worker did not answer within "
                                   f"{self.pool.step_timeout:g}s; it was replaced") from None
            except RayActorError as exc:
                self.pool.replace(self._slot, actor)
                if attempt:  # its replacement died too: the episode ends as truncated (world lost)
                    self._wid = None
                    raise WorldLost(f"{self.spec.name}: the ray worker died, and its replacement too "
                                    f"({type(exc).__name__}: {str(exc)[:300]})") from None
        raise AssertionError("unreachable")

    def _rebuild(self) -> None:
        """Recreate this world on a live actor from its origin and its batches."""
        self._place()
        ray, actor, limit = _ray(), self._actor, self.pool.step_timeout
        if self._origin is None:
            ray.get(actor.start.remote(self._wid, self._ref, self._task, False), timeout=limit)
        else:
            ray.get(actor.load.remote(self._wid, self._ref, self._task, self._origin), timeout=limit)
        if self._batches:
            ray.get(actor.replay.remote(self._wid, self._batches), timeout=limit * len(self._batches))
        with self.pool._lock:
            self.pool.stats["replayed_worlds"] += 1

    def _checked(self, data: Any) -> State | None:
        return None if data is None else self._validate(data)

    def __repr__(self) -> str:
        tid = self._task.id if self._task else None
        return f"<RayWorld {self.spec.name} task={tid} worker={self._slot}>"
