"""The warm pool of environment containers, and garbage collection.

Isolation policy (``ToolEnvSpec.isolation``):

* ``session``: pure-state worlds. Up to ``sessions_per_container`` sessions
  share one container; acquiring picks the least-loaded live container.
* ``container``: worlds that execute agent code. Each session gets a container
  of its own, which is removed when the session closes (never reused); the
  pool keeps ``warm`` idle containers started in the background, so acquiring
  one is a list pop.

Every container is labelled (:data:`~envfactory.runtime.container.LABEL`, the
environment, the owning ``host:pid``). Pools remove their containers on
:meth:`Pool.shutdown`, at interpreter exit, and :func:`gc` removes what a
crashed process left behind.
"""

from __future__ import annotations

import atexit
import os
import shutil
import socket
import threading
from typing import Any

from ..definition import ToolEnvSpec
from .container import LABEL, SOCKET_ROOT, Container, ContainerError, Limits

__all__ = ["Pool", "get_pool", "shutdown_all", "gc"]

_client: Any = None
_client_lock = threading.Lock()


def docker_client() -> Any:
    """The process's Docker client (one connection pool for every pool)."""
    global _client
    with _client_lock:
        if _client is None:
            try:
                import docker
            except ImportError:
                raise RuntimeError("the docker runtime needs the Docker SDK: pip install 'envfactory[docker]'") from None
            try:
                _client = docker.from_env(timeout=120)
                _client.ping()
            except Exception as exc:
                _client = None
                raise RuntimeError(f"no Docker engine answers ({exc}); start one with scripts/docker-engine.sh") from None
        return _client


class Pool:
    """Containers of one environment image (see the module docstring).

    Args:
        spec: The environment.
        image: Image tag; built (or found by content hash) when omitted.
        warm: Idle containers kept ready (``container`` isolation), or
            containers started ahead (``session`` isolation) by :meth:`prewarm`.
        sessions_per_container: Capacity of a shared container.
        limits: Resource limits of each container.
    """

    def __init__(self, spec: ToolEnvSpec, image: str | None = None, *, warm: int = 1,
                 sessions_per_container: int = 64, limits: Limits | None = None) -> None:
        from ..images import image_for

        self.spec = spec
        self.client = docker_client()
        self.image = image or image_for([spec], client=self.client)[0]
        self.warm = warm
        self.per_container = 1 if spec.isolation == "container" else sessions_per_container
        self.limits = limits or Limits()
        self._live: list[Container] = []  # session isolation: shared containers
        self._idle: list[Container] = []  # container isolation: ready, never used
        self._busy: set[Container] = set()
        self._starting = 0
        self._cond = threading.Condition()
        self._closed = False
        self._errors: list[str] = []

    # -- starting --------------------------------------------------------
    def start_container(self) -> Container:
        """Start one container now (a cold start), not yet handed to anyone."""
        return Container(self.client, self.spec, self.image, max_sessions=self.per_container,
                         limits=self.limits)

    def _start_background(self) -> None:
        def run() -> None:
            try:
                c = self.start_container()
            except Exception as exc:
                with self._cond:
                    self._starting -= 1
                    self._errors.append(str(exc))
                    self._cond.notify_all()
                return
            with self._cond:
                self._starting -= 1
                if self._closed:
                    c.remove()
                    self._cond.notify_all()
                    return
                self._idle.append(c)
                self._cond.notify_all()

        self._starting += 1
        threading.Thread(target=run, daemon=True, name=f"envf-start-{self.spec.name}").start()

    def _refill(self) -> None:
        """Keep ``warm`` idle containers on hand (caller holds the lock)."""
        while len(self._idle) + self._starting < self.warm:
            self._start_background()

    def prewarm(self, n: int | None = None) -> None:
        """Start containers ahead so that acquiring one is instant; waits for them."""
        n = self.warm if n is None else n
        with self._cond:
            if self.spec.isolation == "container":
                self.warm = max(self.warm, n)
                self._refill()
                self._cond.wait_for(lambda: len(self._idle) >= n or (self._errors and not self._starting), 120)
                self._raise_errors()
                return
            need = n - len([c for c in self._live if not c.dead])
        for _ in range(max(0, need)):
            c = self.start_container()
            with self._cond:
                self._live.append(c)

    def _raise_errors(self) -> None:
        if self._errors:
            err, self._errors = self._errors[0], []
            raise ContainerError(f"{self.spec.name}: starting a container failed: {err}")

    # -- acquire / release ----------------------------------------------
    def acquire(self) -> Container:
        """A container with room for one more session (the session count is taken)."""
        if self._closed:
            raise RuntimeError(f"the {self.spec.name} pool is shut down")
        if self.spec.isolation == "container":
            with self._cond:
                if not self._idle:
                    self._refill()
                    if not self._starting:
                        self._start_background()
                    self._cond.wait_for(lambda: self._idle or (self._errors and not self._starting), 120)
                    self._raise_errors()
                    if not self._idle:
                        raise ContainerError(f"{self.spec.name}: no container became ready within 120s")
                c = self._idle.pop()
                c.sessions = 1
                self._busy.add(c)
                self._refill()
                return c
        with self._cond:
            self._live = [c for c in self._live if not c.dead]
            room = [c for c in self._live if c.sessions < self.per_container]
            if room:
                c = min(room, key=lambda c: c.sessions)
                c.sessions += 1
                return c
        c = self.start_container()
        with self._cond:
            c.sessions = 1
            self._live.append(c)
        return c

    def release(self, c: Container) -> None:
        """A session on ``c`` ended. Per-session containers are removed (in the
        background: removal takes a while and nobody waits for it)."""
        with self._cond:
            c.sessions = max(0, c.sessions - 1)
            if self.spec.isolation != "container":
                return
            self._busy.discard(c)
        _remove_later(c)

    def discard(self, c: Container) -> None:
        """Remove a dead or misbehaving container; the pool starts a replacement."""
        c.dead = True
        with self._cond:
            if c in self._live:
                self._live.remove(c)
            self._busy.discard(c)
            if not self._closed:
                if self.spec.isolation == "container":
                    self._refill()
        c.remove()
        if self.spec.isolation != "container" and not self._closed and self.warm > 0:
            with self._cond:
                if not any(not x.dead for x in self._live):
                    self._live.append(self.start_container())

    def containers(self) -> list[Container]:
        with self._cond:
            return [c for c in self._live + self._idle + list(self._busy) if not c.dead]

    def shutdown(self) -> None:
        """Remove every container of this pool. Idempotent."""
        with self._cond:
            self._closed = True
            cs = self._live + self._idle + list(self._busy)
            self._live, self._idle, self._busy = [], [], set()
        for c in cs:
            c.remove()
        with self._cond:  # containers still starting are removed as they come up
            self._cond.wait_for(lambda: not self._starting, 60)


_removals: list[threading.Thread] = []


def _remove_later(c: Container) -> None:
    t = threading.Thread(target=c.remove, daemon=True, name=f"envf-rm-{c.name}")
    t.start()
    _removals.append(t)


_pools: dict[tuple[str, str | None, str], Pool] = {}
_pools_lock = threading.Lock()


def get_pool(spec: ToolEnvSpec, image: str | None = None, **options: Any) -> Pool:
    """The process-wide pool of ``spec`` (created on first use with ``options``)."""
    key = (spec.name, image, repr(sorted(options.items())))
    with _pools_lock:
        pool = _pools.get(key)
        if pool is None or pool._closed or pool.spec is not spec:
            pool = _pools[key] = Pool(spec, image, **options)
        return pool


def shutdown_all() -> None:
    """Remove every container this process started (runs at interpreter exit)."""
    with _pools_lock:
        pools = list(_pools.values())
        _pools.clear()
    for p in pools:
        p.shutdown()
    for t in list(_removals):
        t.join(timeout=30)
    _removals.clear()


atexit.register(shutdown_all)


def gc(*, everything: bool = False) -> list[dict[str, Any]]:
    """Remove envfactory containers left behind by processes that are gone.

    Args:
        everything: Remove every envfactory container, including those of live processes.

    Returns:
        One row per removed container: ``id``, ``name``, ``env``, ``owner``.
    """
    client = docker_client()
    host = socket.gethostname()
    removed = []
    for c in client.containers.list(all=True, filters={"label": f"{LABEL}=1"}):
        labels = c.labels
        owner = labels.get("org.envfactory.owner", "")
        o_host, _, o_pid = owner.rpartition(":")
        if not everything and o_host == host and o_pid.isdigit() and _alive(int(o_pid)):
            continue
        try:
            c.remove(force=True)
        except Exception:
            continue
        sock_dir = labels.get("org.envfactory.socket_dir", "")
        if sock_dir.startswith(SOCKET_ROOT + os.sep):
            shutil.rmtree(sock_dir, ignore_errors=True)
        removed.append({"id": c.id[:12], "name": c.name, "env": labels.get("org.envfactory.env"), "owner": owner})
    return removed


def _alive(pid: int) -> bool:
    if pid == os.getpid():
        return True
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True

