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
  alone; its normal exit runs the atexit cleanup); ``ENVF_NO_SIGTERM_HANDLER=1``
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
from typing import Any, Callable

from ..definition import ToolEnvSpec
from .container import LABEL, SOCKET_ROOT, Container, ContainerError, Limits, owner_label

__all__ = ["Pool", "get_pool", "shutdown_all", "gc", "in_background", "wait_background"]

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
        self._pid = os.getpid()
        with _pools_lock:
            _all_pools.add(self)
        _install_sigterm_handler()

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
            room = [c for c in self._live if c.sessions < self.per_container and not c.retiring]
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
                if c.sessions or not c.retiring or c not in self._live:
                    return
                self._live.remove(c)  # its last session ended and it is near the end of its lifetime
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

    def shutdown(self, timeout: float = 90.0) -> None:
        """Remove every container of this pool, waiting (up to ``timeout`` seconds) for
        those still starting, which are removed as they come up. Idempotent."""
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
    """The process-wide pool of ``spec`` (created on first use with ``options``)."""
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
    if _client is None:  # this process never talked to Docker: it started nothing
        return
    for row in _labelled(_client, owner=owner_label()):
        _remove_row(_client, row)


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
    if _handler_installed or os.environ.get("ENVF_NO_SIGTERM_HANDLER") == "1":
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
    for row in _labelled(client):
        labels = row.get("Labels") or {}
        owner = labels.get("org.envfactory.owner", "")
        o_host, _, o_pid = owner.rpartition(":")
        if not everything and o_host == host and o_pid.isdigit() and _alive(int(o_pid)):
            continue
        if not _remove_row(client, row):
            continue
        name = (row.get("Names") or ["?"])[0].lstrip("/")
        removed.append({"id": row["Id"][:12], "name": name, "env": labels.get("org.envfactory.env"), "owner": owner})
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

