"""The warm pool of environment containers, and garbage collection.

Isolation policy (``ToolEnvSpec.isolation``):

* ``session``: pure-state worlds. Up to ``sessions_per_container`` sessions
  share one container; acquiring picks the least-loaded live container.
* ``container``: worlds that execute agent code. Each session gets a container
  of its own, which is removed when the session closes (never reused); the
  pool keeps ``warm`` idle containers started in the background, so acquiring
  one is a list pop.

Every container is labelled (:data:`~envfactory.runtime.container.LABEL`, the
environment, the owning ``host:pid``). Nothing outlives its process:

* :meth:`Pool.shutdown` removes a pool's containers, waiting for those still starting;
* at interpreter exit, :func:`shutdown_all` shuts down every pool this process made
  (those of :func:`get_pool` and those built directly), waits for the background
  removals, then removes any container still labelled with this process as owner;
* on SIGTERM the same cleanup runs, then the process dies of SIGTERM as it would
  have. The handler is installed when the first pool is made, from the main thread,
  and only if SIGTERM still has its default action (a program's own handler is left
  alone; its normal exit runs the atexit cleanup); ``ENVFACTORY_NO_SIGTERM_HANDLER=1``
  turns it off;
* a world dropped without ``close()`` closes its session when it is collected
  (:func:`in_background` runs the close, off the collecting thread);
* :func:`gc` (``envfactory gc``) removes what a killed process (``kill -9``) left behind.

Per-session containers are removed in the background by at most
:data:`MAX_BACKGROUND` worker threads that exit when nothing is queued
(:func:`wait_background` waits for them).
"""

from __future__ import annotations

import atexit
import collections
import os
import shutil
import signal
import socket
import threading
import time
import weakref
from typing import Any, Callable, Sequence

from ..definition import ToolEnvSpec
from .container import LABEL, SOCKET_ROOT, Container, ContainerError, Limits, owner_label, session_capacity

__all__ = ["Pool", "HostLost", "get_pool", "docker_client", "resolve_docker_hosts", "engine_answers", "copy_image",
           "shutdown_all", "gc", "in_background", "wait_background"]

_client: Any = None
_client_lock = threading.Lock()
_host_clients: dict[str, Any] = {}

HOSTS_ENV = "ENVFACTORY_DOCKER_HOSTS"
"""Comma-separated Docker engines (``unix:///...``, ``tcp://...``) to spread containers over."""


def resolve_docker_hosts(hosts: "str | list[str] | tuple[str, ...] | None" = None) -> tuple[str, ...] | None:
    """The engines a pool spreads over: ``hosts`` (a list, or a comma-separated string), else
    ``$ENVFACTORY_DOCKER_HOSTS``, else ``None`` (the one default engine, ``DOCKER_HOST``'s)."""
    if hosts is None:
        hosts = os.environ.get(HOSTS_ENV) or None
    if hosts is None:
        return None
    if isinstance(hosts, str):
        hosts = hosts.split(",")
    out = tuple(dict.fromkeys(h.strip() for h in hosts if h and h.strip()))
    return out or None


def docker_client(host: str | None = None) -> Any:
    """The process's Docker client of engine ``host`` (a ``DOCKER_HOST``-style URL; ``None``:
    the default engine), one connection pool per engine for every pool."""
    global _client
    with _client_lock:
        if host is None and _client is not None:
            return _client
        if host is not None and host in _host_clients:
            return _host_clients[host]
        try:
            import docker
        except ImportError:
            raise RuntimeError("the docker runtime needs the Docker SDK: pip install 'envfactory[docker]'") from None
        try:
            c = docker.from_env(timeout=120) if host is None else docker.DockerClient(base_url=host, timeout=120)
            c.ping()
        except Exception as exc:
            where = "no Docker engine answers" if host is None else f"the Docker engine {host} does not answer"
            raise RuntimeError(f"{where} ({exc}); start one with scripts/docker-engine.sh") from None
        if host is None:
            _client = c
        else:
            _host_clients[host] = c
        return c


def engine_answers(host: str | None, timeout: float = 3.0) -> str | None:
    """``None`` when engine ``host`` answers a ping within ``timeout`` seconds, else why not
    (a fresh, short-timeout connection: a hung engine cannot hold the caller for long)."""
    try:
        import docker

        api = docker.APIClient(base_url=host, timeout=timeout) if host else docker.from_env(timeout=timeout).api
        try:
            api.ping()
        finally:
            api.close()
    except Exception as exc:
        return f"{type(exc).__name__}: {str(exc)[:300]}"
    return None


def copy_image(tag: str, src: Any, dst: Any) -> bool:
    """Make image ``tag`` exist on engine ``dst``: loaded from ``src`` (``docker save | docker load``,
    streamed) when ``dst`` lacks it. ``True`` when it was copied."""
    import docker

    try:
        dst.images.get(tag)
        return False
    except docker.errors.ImageNotFound:
        pass
    stream = src.images.get(tag).save(chunk_size=1 << 20, named=True)
    dst.images.load(stream)
    dst.images.get(tag)  # raises if the load did not produce it
    return True


class HostLost(ContainerError):
    """Every Docker engine of a pool is lost (or the one a request needed); the message names them."""


class Pool:
    """Containers of one environment image (see the module docstring).

    Args:
        spec: The environment.
        image: Image tag; built (or found by content hash) when omitted.
        warm: Idle containers kept ready (``container`` isolation), or
            containers started ahead (``session`` isolation) by :meth:`prewarm`;
            per engine when there are several.
        sessions_per_container: Capacity of a shared container, clamped to what its server can
            serve (:func:`~envfactory.runtime.container.session_capacity`: 114 with the default
            limits); a session a full container refuses anyway goes to another one.
        limits: Resource limits of each container.
        docker_hosts: Docker engines (``DOCKER_HOST``-style URLs, a list or a comma-separated
            string; default ``$ENVFACTORY_DOCKER_HOSTS``, else the one default engine). With
            several, the pool is one sub-pool per engine (its own warm containers) behind one
            lock: a new session goes to the engine holding the fewest, a new container with it.
            The image is built on the first engine and copied to the others that lack it
            (``docker save | docker load``). The engines must share this machine's file system
            (the containers' sockets are bind-mounted folders here); spread over machines with
            the Ray runtime (``world_runtime="docker"``: each actor drives its own node's engines).
            An engine that stops answering is *lost*: :attr:`stats` counts it and names it, no
            session is placed there, its sessions' next requests fail as their container's death
            (the Docker runtime resumes such a world on a live engine, else raises
            :class:`ContainerError` naming the engine), and it is pinged again after
            :data:`RETRY_LOST_S` seconds (rejoining when it answers: ``hosts_recovered``).
    """

    RETRY_LOST_S = 30.0

    def __init__(self, spec: ToolEnvSpec, image: str | None = None, *, warm: int = 1,
                 sessions_per_container: int = 64, limits: Limits | None = None,
                 docker_hosts: "str | list[str] | tuple[str, ...] | None" = None,
                 _cond: threading.Condition | None = None) -> None:
        from .images import image_for

        self.spec = spec
        self.warm = warm
        self.limits = limits or Limits()
        # no more than one server can serve: each session holds one of its connections
        self.per_container = (1 if spec.isolation == "container"
                              else max(1, min(sessions_per_container, session_capacity(self.limits))))
        self._live: list[Container] = []  # session isolation: shared containers
        self._idle: list[Container] = []  # container isolation: ready, never used
        self._busy: set[Container] = set()
        self._starting = 0
        self._cond = _cond or threading.Condition()
        self._closed = False
        self._errors: list[str] = []
        self._pid = os.getpid()
        hosts = resolve_docker_hosts(docker_hosts)
        self.host = hosts[0] if hosts and len(hosts) == 1 else None  # this (sub-)pool's one named engine
        self.lost: str | None = None  # why its engine was found lost (None: it answers)
        self._lost_at = 0.0
        self._subs: list[Pool] | None = None
        self.stats: dict[str, Any] = {"hosts": 1, "lost_hosts": 0, "lost": {}, "hosts_recovered": 0,
                                      "retired_for_memory": 0}
        if hosts and len(hosts) > 1:
            self._init_hosts(hosts, image)
        else:
            self.client = docker_client(self.host)
            self.image = image or image_for([spec], client=self.client)[0]
        with _pools_lock:
            _all_pools.add(self)
        _install_sigterm_handler()

    def _init_hosts(self, hosts: tuple[str, ...], image: str | None) -> None:
        """One sub-pool per engine, sharing this pool's lock; the image copied where missing."""
        from .images import image_for

        self.hosts = hosts
        subs: list[Pool] = []
        lost: dict[str, str] = {}
        clients: dict[str, Any] = {}
        for h in hosts:
            try:
                clients[h] = docker_client(h)
            except Exception as exc:  # not reachable now: lost, tried again later
                lost[h] = f"{type(exc).__name__}: {str(exc)[:300]}"
        if not clients:
            raise HostLost(f"{self.spec.name}: no Docker engine of {', '.join(hosts)} answers: {lost}")
        if image is None:  # built (or found) on the first engine that answers
            src = next(iter(clients.values()))
            image = image_for([self.spec], client=src)[0]
        else:
            import docker

            src = None
            for c in clients.values():
                try:
                    c.images.get(image)
                    src = c
                    break
                except docker.errors.ImageNotFound:
                    pass
            if src is None:
                raise ValueError(f"{self.spec.name}: image {image} is on none of the engines {', '.join(clients)}")
        for h in hosts:
            client = clients.get(h)
            if client is not None and client is not src:
                try:
                    copy_image(image, src, client)
                except Exception as exc:
                    lost[h] = f"the image could not be copied there: {type(exc).__name__}: {str(exc)[:300]}"
                    client = None
            sub = Pool.__new__(Pool)
            sub.__dict__.update(self.__dict__)
            sub._live, sub._idle, sub._busy, sub._errors = [], [], set(), []
            sub.host, sub.client, sub.image, sub._subs = h, client, image, None
            sub.stats = {"hosts": 1, "lost_hosts": 0, "lost": {}, "hosts_recovered": 0}
            if h in lost:
                sub.lost, sub._lost_at = lost[h], time.monotonic()
            subs.append(sub)
        if all(s.lost for s in subs):
            raise HostLost(f"{self.spec.name}: no Docker engine of {', '.join(hosts)} can serve it: {lost}")
        self._subs = subs
        self.client = next(s.client for s in subs if not s.lost)
        self.image = image
        self.stats.update(hosts=len(hosts), lost_hosts=len(lost), lost=dict(lost))
        with _pools_lock:
            for sub in subs:
                _all_pools.add(sub)

    # -- several engines -----------------------------------------------------
    def _sub_of(self, c: Container) -> "Pool":
        return getattr(c, "pool", None) or self

    def _mark_lost(self, sub: "Pool", why: str) -> None:
        """Engine ``sub.host`` stopped answering: no new session there (caller holds the lock)."""
        if sub.lost is None:
            sub.lost = why
            self.stats["lost_hosts"] += 1
            self.stats["lost"][sub.host] = why
        sub._lost_at = time.monotonic()

    def _usable(self) -> list["Pool"]:
        """The sub-pools whose engine answers (a lost one is pinged again after RETRY_LOST_S)."""
        assert self._subs is not None
        out = []
        for sub in self._subs:
            if sub.lost is not None and time.monotonic() - sub._lost_at > self.RETRY_LOST_S:
                why = engine_answers(sub.host)
                if why is None and sub.client is None:  # lost from the start: connect, copy the image
                    try:
                        client = docker_client(sub.host)
                        copy_image(self.image, self.client, client)
                        sub.client = client
                    except Exception as exc:
                        why = f"{type(exc).__name__}: {str(exc)[:300]}"
                with self._cond:
                    if why is None and sub.client is not None:
                        sub.lost = None
                        self.stats["lost"].pop(sub.host, None)
                        self.stats["lost_hosts"] -= 1
                        self.stats["hosts_recovered"] += 1
                    else:
                        sub._lost_at = time.monotonic()
            if sub.lost is None:
                out.append(sub)
        return out

    def _load(self, sub: "Pool") -> int:
        if self.spec.isolation == "container":
            return len(sub._busy) - len(sub._idle)
        return sum(c.sessions for c in sub._live if not c.dead)

    def _acquire_spread(self, exclude: "Sequence[Container]" = ()) -> Container:
        """A session slot on the engine holding the fewest sessions; an engine that fails to
        start a container and then does not answer a ping is lost, and the next one tried."""
        tried: set[int] = set()
        last: Exception | None = None
        while True:
            subs = [s for s in self._usable() if id(s) not in tried]
            if not subs:
                lost = ", ".join(f"{h} ({w})" for h, w in self.stats["lost"].items())
                raise HostLost(f"{self.spec.name}: no Docker engine can take a session"
                               f"{': lost ' + lost if lost else ''}{f'; last error: {last}' if last else ''}")
            with self._cond:
                sub = min(subs, key=self._load)
            try:
                return sub.acquire(exclude)
            except Exception as exc:
                why = engine_answers(sub.host)
                if why is None:
                    raise
                with self._cond:
                    self._mark_lost(sub, why)
                tried.add(id(sub))
                last = exc

    def host_rows(self) -> list[dict[str, Any]]:
        """One row per engine: ``host``, ``up``, ``containers``, ``sessions``, ``lost`` (why)."""
        subs = self._subs or [self]
        with self._cond:
            return [{"host": s.host, "up": s.lost is None,
                     "containers": len([c for c in s._live + s._idle + list(s._busy) if not c.dead]),
                     "sessions": sum(c.sessions for c in s._live + list(s._busy) if not c.dead),
                     "lost": s.lost} for s in subs]

    # -- starting --------------------------------------------------------
    def start_container(self) -> Container:
        """Start one container now (a cold start), not yet handed to anyone (with several
        engines: on the one holding the fewest sessions)."""
        if self._subs is not None:
            subs = self._usable()
            if not subs:
                raise HostLost(f"{self.spec.name}: every Docker engine is lost: {self.stats['lost']}")
            with self._cond:
                sub = min(subs, key=self._load)
            return sub.start_container()
        c = Container(self.client, self.spec, self.image, max_sessions=self.per_container,
                      limits=self.limits, engine=self.host)
        c.pool = self
        return c

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
                try:
                    if self._closed:
                        c.remove()
                    else:
                        self._idle.append(c)
                finally:
                    self._starting -= 1
                    self._cond.notify_all()

        self._starting += 1
        try:
            threading.Thread(target=run, daemon=True, name=f"envf-start-{self.spec.name}").start()
        except BaseException:
            self._starting -= 1
            raise

    def _refill(self) -> None:
        """Keep ``warm`` idle containers on hand (caller holds the lock)."""
        while len(self._idle) + self._starting < self.warm:
            self._start_background()

    def prewarm(self, n: int | None = None) -> None:
        """Start containers ahead so that acquiring one is instant; waits for them."""
        n = self.warm if n is None else n
        if self._subs is not None:  # n per engine, in parallel
            subs = self._usable()
            errors: list[BaseException] = []

            def one(sub: Pool) -> None:
                try:
                    sub.prewarm(n)
                except BaseException as exc:
                    errors.append(exc)

            threads = [threading.Thread(target=one, args=(sub,), daemon=True) for sub in subs]
            for t in threads:
                t.start()
            for t in threads:
                t.join()
            if errors:
                raise errors[0]
            return
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
    def acquire(self, exclude: "Sequence[Container]" = ()) -> Container:
        """A container with room for one more session (the session count is taken); not one of
        ``exclude`` (shared containers that just refused a session for being full)."""
        if self._closed:
            raise RuntimeError(f"the {self.spec.name} pool is shut down")
        if self._subs is not None:
            return self._acquire_spread(exclude)
        if self.spec.isolation == "container":
            with self._cond:
                for old in [c for c in self._idle if c.retiring]:  # too old to start an episode
                    self._idle.remove(old)
                    _remove_later(old)
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
            room = [c for c in self._live
                    if c.sessions < self.per_container and not c.retiring and c not in exclude]
            if room:
                c = min(room, key=lambda c: c.sessions)
                c.sessions += 1
                return c
        c = self.start_container()
        with self._cond:
            c.sessions = 1
            self._live.append(c)
        return c

    def note_retired(self, c: Container) -> None:
        """``c`` retired for its memory (:meth:`~envfactory.runtime.container.Container.check_memory`):
        counted in :attr:`stats` (``retired_for_memory``; the last reason in ``last_retired``)."""
        with self._cond:
            self.stats["retired_for_memory"] += 1
            self.stats["last_retired"] = f"{c.name}: {c.retired_for}"

    def release(self, c: Container) -> None:
        """A session on ``c`` ended. Per-session containers are removed (in the
        background: removal takes a while and nobody waits for it)."""
        if self._subs is not None:
            return self._sub_of(c).release(c)
        with self._cond:
            c.sessions = max(0, c.sessions - 1)
            if self.spec.isolation != "container":
                if c.sessions or not c.retiring or c not in self._live:
                    return
                self._live.remove(c)  # its last session ended and it is near the end of its lifetime
            self._busy.discard(c)
        _remove_later(c)

    def discard(self, c: Container) -> None:
        """Remove a dead or misbehaving container; the pool starts a replacement. With several
        engines, one that no longer answers is marked lost (no replacement there)."""
        if self._subs is not None:
            sub = self._sub_of(c)
            why = engine_answers(sub.host)
            if why is None:
                try:
                    return sub.discard(c)
                except Exception:  # the replacement could not start: is the engine gone now?
                    why = engine_answers(sub.host)
                    if why is None:
                        raise
            c.dead = True
            with self._cond:
                self._mark_lost(sub, why)
                if c in sub._live:
                    sub._live.remove(c)
                sub._busy.discard(c)
            _remove_later(c)
            return
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
        if self._subs is not None:
            return [c for sub in self._subs for c in sub.containers()]
        with self._cond:
            return [c for c in self._live + self._idle + list(self._busy) if not c.dead]

    def shutdown(self, timeout: float = 90.0) -> None:
        """Remove every container of this pool, waiting (up to ``timeout`` seconds) for
        those still starting, which are removed as they come up. Idempotent."""
        if self._subs is not None:
            self._closed = True
            for sub in self._subs:  # a lost engine's removals fail at once
                sub.shutdown(timeout)
            return
        with self._cond:
            self._closed = True
            cs = self._live + self._idle + list(self._busy)
            self._live, self._idle, self._busy = [], [], set()
        for c in cs:
            c.remove()
        with self._cond:
            self._cond.wait_for(lambda: not self._starting, timeout)


MAX_BACKGROUND = 4
"""The most threads that remove containers and close dropped sessions at once."""

_queue: collections.deque[Callable[[], Any]] = collections.deque()
_removals: set[threading.Thread] = set()  # the live background workers (at most MAX_BACKGROUND)
_bg_lock = threading.Lock()
_bg_idle = threading.Condition(_bg_lock)


def in_background(fn: Callable[[], Any]) -> None:
    """Run ``fn`` on a background worker (at most :data:`MAX_BACKGROUND` of them; a
    worker exits when the queue is empty, so none lingers and none accumulates)."""
    with _bg_lock:
        _queue.append(fn)
        if len(_removals) >= MAX_BACKGROUND:
            return
        t = threading.Thread(target=_worker, daemon=True, name="envf-background")
        _removals.add(t)
    try:
        t.start()
    except RuntimeError:  # no thread now (interpreter shutdown): run it here
        with _bg_lock:
            _removals.discard(t)
        _drain()


def _worker() -> None:
    me = threading.current_thread()
    while True:
        with _bg_lock:
            if not _queue:  # seeing the queue empty and leaving are one step: nothing is stranded
                _removals.discard(me)
                _bg_idle.notify_all()
                return
            fn = _queue.popleft()
        _run_quietly(fn)


def _drain() -> None:
    while True:
        with _bg_lock:
            if not _queue:
                return
            fn = _queue.popleft()
        _run_quietly(fn)


def _run_quietly(fn: Any) -> None:
    try:
        fn()
    except Exception:  # a removal that fails leaves the container to gc; keep going
        pass


def wait_background(timeout: float = 60.0) -> bool:
    """Wait until every queued removal / close has run; ``False`` if ``timeout`` passed first."""
    deadline = time.monotonic() + timeout
    with _bg_lock:
        while _queue or _removals:
            left = deadline - time.monotonic()
            if left <= 0:
                return False
            if not _removals:  # queued, no worker (one could not start): run them here
                break
            _bg_idle.wait(min(left, 0.5))
        else:
            return True
    _drain()
    return True


def _remove_later(c: Container) -> None:
    in_background(c.remove)


_pools: dict[tuple[str, str | None, str], Pool] = {}
_pools_lock = threading.RLock()
_all_pools: "weakref.WeakSet[Pool]" = weakref.WeakSet()  # every pool made here, get_pool's or not


def get_pool(spec: ToolEnvSpec, image: str | None = None, **options: Any) -> Pool:
    """The process-wide pool of ``spec`` (created on first use with ``options``; ``docker_hosts``
    defaults to ``$ENVFACTORY_DOCKER_HOSTS``)."""
    hosts = resolve_docker_hosts(options.pop("docker_hosts", None))
    if hosts is not None:
        options["docker_hosts"] = hosts
    key = (spec.name, image, repr(sorted(options.items())))
    with _pools_lock:
        pool = _pools.get(key)
        if pool is None or pool._closed or pool.spec is not spec:
            pool = _pools[key] = Pool(spec, image, **options)
        return pool


def shutdown_all(timeout: float = 120.0) -> None:
    """Remove every container this process started (runs at interpreter exit and on
    SIGTERM): shut down every pool made here, wait for the background removals, then
    remove whatever container is still labelled with this process as its owner."""
    deadline = time.monotonic() + timeout
    if not _pools_lock.acquire(timeout=10):  # held by the thread a signal interrupted
        try:
            pools = list(_all_pools)
        except RuntimeError:  # changed size while being read
            pools = []
    else:
        try:
            pools = list(_pools.values()) + list(_all_pools)
            _pools.clear()
        finally:
            _pools_lock.release()
    pid = os.getpid()
    pools = [p for p in dict.fromkeys(pools) if p._pid == pid]  # never a forked parent's
    stoppers = []
    for p in pools:  # in parallel: each may wait for containers still starting
        t = threading.Thread(target=p.shutdown, args=(max(1.0, deadline - time.monotonic() - 10),), daemon=True)
        try:
            t.start()
        except RuntimeError:  # no new threads at this point of the interpreter's exit (3.12+)
            p.shutdown(max(1.0, deadline - time.monotonic() - 10))
            continue
        stoppers.append(t)
    for t in stoppers:
        t.join(max(0.0, deadline - time.monotonic() - 5))
    wait_background(max(0.0, deadline - time.monotonic() - 5))
    try:
        _remove_owned()
    except Exception:
        pass


def _remove_owned() -> None:
    """Remove every container labelled as owned by this process (the last sweep)."""
    for client in [_client, *_host_clients.values()]:
        if client is None:  # this process never talked to that engine: it started nothing there
            continue
        try:
            rows = _labelled(client, owner=owner_label())
        except Exception:  # a lost engine: nothing to do there now
            continue
        for row in rows:
            _remove_row(client, row)


def _labelled(client: Any, owner: str | None = None) -> list[dict[str, Any]]:
    """The envfactory containers (one row each, as the engine lists them: no per-container
    inspect, which would race with removals elsewhere), optionally of one owner."""
    labels = [f"{LABEL}=1"] + ([f"org.envfactory.owner={owner}"] if owner else [])
    return client.api.containers(all=True, filters={"label": labels})


def _remove_row(client: Any, row: dict[str, Any]) -> bool:
    """Force-remove a listed container and its socket folder; ``False`` if that failed."""
    try:
        client.api.remove_container(row["Id"], force=True)
    except Exception as exc:
        if getattr(getattr(exc, "response", None), "status_code", None) != 404:  # gone already: fine
            return False
    sock_dir = (row.get("Labels") or {}).get("org.envfactory.socket_dir", "")
    if sock_dir.startswith(SOCKET_ROOT + os.sep):
        shutil.rmtree(sock_dir, ignore_errors=True)
    return True


atexit.register(shutdown_all)

_handler_installed = False


def _install_sigterm_handler() -> None:
    """On SIGTERM, remove this process's containers, then die of SIGTERM (see the module
    docstring). Only from the main thread, only over the default action, once."""
    global _handler_installed
    if _handler_installed or os.environ.get("ENVFACTORY_NO_SIGTERM_HANDLER") == "1":
        return
    if threading.current_thread() is not threading.main_thread():
        return  # signal.signal works only there; the next pool made there installs it
    try:
        previous = signal.getsignal(signal.SIGTERM)
        if previous is not signal.SIG_DFL:
            _handler_installed = True  # the program handles SIGTERM itself: leave it be
            return
        signal.signal(signal.SIGTERM, _on_sigterm)
    except (ValueError, OSError):
        return
    _handler_installed = True


def _on_sigterm(signum: int, frame: Any) -> None:
    # The cleanup runs on its own thread: this (main) thread may hold a lock it needs.
    t = threading.Thread(target=shutdown_all, args=(60.0,), daemon=True, name="envf-sigterm")
    t.start()
    t.join(75)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)  # chain to the default action: die of SIGTERM
    os.kill(os.getpid(), signal.SIGTERM)


def _after_fork_in_child() -> None:
    """A forked child owns none of its parent's containers."""
    global _pools_lock, _bg_lock, _bg_idle
    _pools.clear()
    _all_pools.clear()
    _queue.clear()
    _removals.clear()
    _pools_lock = threading.RLock()
    _bg_lock = threading.Lock()
    _bg_idle = threading.Condition(_bg_lock)


os.register_at_fork(after_in_child=_after_fork_in_child)


def gc(*, everything: bool = False, docker_hosts: "str | list[str] | tuple[str, ...] | None" = None
       ) -> list[dict[str, Any]]:
    """Remove envfactory containers left behind by processes that are gone: only what this host
    can prove dead (an owner process of this host that no longer runs). A container owned by
    another host (an engine shared between machines) is left alone: its owner may be alive.

    Args:
        everything: Remove every envfactory container, including those of live processes and of
            other hosts.
        docker_hosts: The engines to clean (default ``$ENVFACTORY_DOCKER_HOSTS``, else the
            default engine).

    Returns:
        One row per removed container: ``id``, ``name``, ``env``, ``owner`` (and ``engine``
        when engines were named).
    """
    hosts = resolve_docker_hosts(docker_hosts)
    if hosts is None:
        return _gc(docker_client(), everything)
    rows = []
    for h in hosts:
        try:
            client = docker_client(h)
        except RuntimeError:  # a lost engine: nothing can be removed there now
            continue
        rows += [{**row, "engine": h} for row in _gc(client, everything)]
    return rows


def _gc(client: Any, everything: bool) -> list[dict[str, Any]]:
    host = socket.gethostname()
    removed = []
    for row in _labelled(client):
        labels = row.get("Labels") or {}
        owner = labels.get("org.envfactory.owner", "")
        if not (everything or provably_dead(owner, host)):
            continue
        if not _remove_row(client, row):
            continue
        name = (row.get("Names") or ["?"])[0].lstrip("/")
        removed.append({"id": row["Id"][:12], "name": name, "env": labels.get("org.envfactory.env"), "owner": owner})
    return removed


def provably_dead(owner: str, host: str) -> bool:
    """Whether a container labelled with ``owner`` (``host:pid``) can be proven abandoned from
    ``host``: its owner is a process of this host that no longer runs. A container of another
    host (an engine shared between machines) cannot be: its owner may be alive there."""
    o_host, _, o_pid = owner.rpartition(":")
    return o_host == host and o_pid.isdigit() and not _alive(int(o_pid))


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

