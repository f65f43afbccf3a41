"""One hardened environment container and the host's two channels into it.

A :class:`Container` is started from an environment image with no network, a
read-only root (``/tmp`` is a tmpfs), uid 10001, every capability dropped,
``no-new-privileges``, memory / CPU / pid limits and labels that
``envfactory gc`` finds it by. Its server listens on a Unix socket in a host
folder bind-mounted at ``/run/envf``. The folder is writable by the container's
user only until the server listens; then the host takes it back (owner: the host's
user, mode 0755), so agent code can neither fill the host's disk through it nor
move the socket (``/tmp`` and ``/dev/shm`` are size-capped tmpfs, in memory).

Who is on the other end of the socket: agent code in the container runs as
the same uid as the server; were the socket replaced by its own listener
(as it could before the folder was sealed), every connection the host opens
still checks the peer's pid
(``SO_PEERCRED``) against the server's, pinned on the first connection, which
is made before any agent action runs. The secret token stops such code from
issuing calls to the real server.

The host does not trust what comes back either: a control call has one deadline
(``control_timeout``) over its whole exchange, headers and body, however slowly
the bytes drip; its body is capped at :data:`MAX_CONTROL_BODY`; and a reply that
is not a JSON object is a :class:`ContainerError` (the container marked dead).
"""

from __future__ import annotations

import json as _json
import logging
import os
import secrets
import shutil
import socket
import struct
import tempfile
import threading
import time
from dataclasses import dataclass
from typing import Any

import httpcore
import httpx

from .. import quotas
from ..definition import ToolEnvSpec
from ..world import WorldLost
from .batch import BatchChannel
from .wire import MAGIC, TOKEN_HEADER, FrameDecodeError, recv_frame, send_frame

log = logging.getLogger(__name__)

__all__ = ["Container", "ContainerError", "ContainerBusy", "ContainerLost", "Limits", "LABEL", "SOCKET_ROOT",
           "owner_label", "MAX_CONTROL_BODY", "CONTROL_CONNECTIONS", "MAX_ABANDONED_RUNNING", "server_connections",
           "session_capacity"]

MAX_CONTROL_BODY = 1 << 20
"""The most bytes of a control call's reply the host reads (real replies are tiny)."""

LABEL = "org.envfactory.managed"
SOCKET_ROOT = os.environ.get("ENVFACTORY_SOCKET_ROOT", f"/tmp/envf-{os.getuid()}")
CONTAINER_UID = 10001
_UCRED = struct.Struct("3i")


class ContainerError(RuntimeError):
    """A container died, timed out or misbehaved; the message names the
    environment, the session and the container, and says what happens next."""


class ContainerBusy(ContainerError):
    """The container's server refused a new session or channel for being full (its session or
    connection limit); the container is fine: the session goes to another one."""


class ContainerLost(ContainerError, WorldLost):
    """The container holding a world was lost (it died, or its engine stopped answering)
    and the world could not be resumed on a fresh one (resume failed, was turned off, or
    the re-sent request died too). Raised from a step, the referee ends the episode as
    truncated with this message as the error observation (``info["world_lost"]``)."""


@dataclass(frozen=True)
class Limits:
    """Resource limits of one container (memory in MiB, CPUs, processes+threads, /tmp and /dev/shm in MiB,
    and its lifetime in seconds: its server exits then, whoever holds it, so even a container
    whose owner was killed stops; the pool stops giving out a container at 90% of its lifetime
    and removes it once its last session ends; ``None``: no limit)."""

    memory_mb: int = 512
    cpus: float = 1.0
    pids: int = 256
    tmpfs_mb: int = 64
    shm_mb: int = 16
    max_lifetime_s: float | None = 24 * 3600.0
    retire_memory: float | None = 0.5
    """The share of ``memory_mb`` past which a container retires (``None``: never): it takes no new
    session, each of its sessions moves to another container at its next episode start, and it is
    removed once the last one ends. A long-lived server's memory creeps up with fragmentation that
    no trim returns (a shared container grew 12-15 MiB a minute under the million-output fuzz, and
    was OOM-killed at its limit); retiring it at half leaves the other half for the transient peaks
    of one call. Measured by the engine (the container's memory cgroup, less its inactive page
    cache, as ``docker stats`` counts it), at most every :data:`MEMORY_CHECK_S` seconds, when a
    session on it starts an episode; past the mark twice in a row (a transient peak passes)."""
    work_archive_mb: int = 8
    """``isolation="container"``: the most a snapshot's archive of the work folder (``/tmp``, where
    agent code writes; tar.gz, MiB; at most 24, half a reply frame) may take. While the folder
    archives to more, the world cannot be resumed after its container dies (its episode then
    ends as truncated, naming this cap), nor forked or dumped (:class:`EpisodeError`, naming it)."""


MEMORY_CHECK_S = 2.0
"""The least seconds between two measurements of one container's memory (:meth:`Container.check_memory`)."""
CONTROL_CONNECTIONS = 8
"""The most connections the host holds open to one container for control calls (its HTTP pool)."""
MAX_ABANDONED_RUNNING = 4
"""Abandoned ops still running (blocked where the server cannot stop them, each holding a connection)
past which a shared container takes no new session
(:meth:`~envfactory.runtime.docker_session.SessionLink.abandon`)."""


def server_connections(max_sessions: int, limits: Limits) -> int:
    """Connections one container's server serves at once (``ENVFACTORY_MAX_CONNECTIONS``): the
    sessions plus 64, at most half the pid limit (each connection is a server thread)."""
    return max(4, min(max_sessions + 64, limits.pids // 2))


def session_capacity(limits: Limits) -> int:
    """The most sessions one container's server can serve at once: each holds a channel (a
    connection), and the connection limit (:func:`server_connections`, half the pid limit) also
    has to leave room for the host's control calls (:data:`CONTROL_CONNECTIONS`), a health probe
    and the abandoned ops a container may still hold (:data:`MAX_ABANDONED_RUNNING`). A pool's
    ``sessions_per_container`` is clamped to it (114 with the default 256 pids)."""
    return max(1, limits.pids // 2 - CONTROL_CONNECTIONS - MAX_ABANDONED_RUNNING - 2)


def owner_label() -> str:
    return f"{socket.gethostname()}:{os.getpid()}"


def _peer_pid(sock: socket.socket) -> int:
    return _UCRED.unpack(sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, _UCRED.size))[0]


_deadline = threading.local()  # .at: the monotonic deadline of this thread's control call


def _left(timeout: float | None, exc: type[Exception]) -> float | None:
    at = getattr(_deadline, "at", None)
    if at is None:
        return timeout
    left = at - time.monotonic()
    if left <= 0:
        raise exc("the control call ran past its deadline")
    return left if timeout is None else min(timeout, left)


class _DeadlineStream(httpcore.NetworkStream):
    """A stream whose every read and write stops at the current control call's deadline
    (httpx's own timeouts are per read: a reply dripped a byte at a time would never hit them)."""

    def __init__(self, inner: httpcore.NetworkStream) -> None:
        self._inner = inner

    def read(self, max_bytes: int, timeout: float | None = None) -> bytes:
        return self._inner.read(max_bytes, _left(timeout, httpcore.ReadTimeout))

    def write(self, buffer: bytes, timeout: float | None = None) -> None:
        self._inner.write(buffer, _left(timeout, httpcore.WriteTimeout))

    def close(self) -> None:
        self._inner.close()

    def start_tls(self, *args: Any, **kwargs: Any) -> httpcore.NetworkStream:
        return self._inner.start_tls(*args, **kwargs)

    def get_extra_info(self, info: str) -> Any:
        return self._inner.get_extra_info(info)


class _VerifiedBackend(httpcore.SyncBackend):
    """httpcore's socket backend, refusing a peer that is not the pinned server."""

    def __init__(self, container: "Container") -> None:
        self._c = container

    def connect_unix_socket(self, path: str, timeout: float | None = None,
                            socket_options: Any = None) -> httpcore.NetworkStream:
        stream = super().connect_unix_socket(path, timeout, socket_options)
        self._c.check_peer(stream.get_extra_info("socket"))
        return _DeadlineStream(stream)


class Container:
    """A running environment container (see the module docstring).

    Args:
        client: A ``docker.DockerClient``.
        spec: The environment it serves.
        image: The image tag (from :func:`envfactory.runtime.images.image_for`).
        max_sessions: Sessions the server accepts at once.
        limits: Resource limits.
        control_timeout: Seconds allowed for each control call.
        start_timeout: Seconds allowed for the server to come up.
        engine: The Docker engine's URL when it is not the default one (for messages).
        command: What the container runs instead of the image's server (``None``: the server).
            The benchmarks' transport floor (:mod:`benchmarks.docker_runtime`) runs a bare echo
            server this way, under the very same hardening, limits and socket.
    """

    def __init__(self, client: Any, spec: ToolEnvSpec, image: str, *, max_sessions: int,
                 limits: Limits, control_timeout: float = 30.0, start_timeout: float = 60.0,
                 engine: str | None = None, command: list[str] | None = None) -> None:
        self.spec = spec
        self.engine = engine
        self.client = client
        self.token = secrets.token_hex(16)
        self.sessions = 0
        self.dead = False
        self.control_timeout = control_timeout
        self._batch: BatchChannel | None = None  # opened by batch_channel()
        self._no_batch = False
        self._batch_lock = threading.Lock()
        self.abandoned_running = 0  # abandoned sessions' ops the server reported still running
        self.pool: Any = None  # the ContainerPool that started it, if any (set by the pool)
        self._pid: int | None = None
        os.makedirs(SOCKET_ROOT, mode=0o700, exist_ok=True)
        self.host_dir = tempfile.mkdtemp(prefix="c", dir=SOCKET_ROOT)
        if os.getuid() == 0:
            os.chown(self.host_dir, CONTAINER_UID, CONTAINER_UID)
            os.chmod(self.host_dir, 0o770)
        else:  # cannot chown: the container user needs write access to bind its socket
            os.chmod(self.host_dir, 0o777)
        # The secret goes in a file the server deletes before it listens: an
        # environment variable would also be readable in docker-init's
        # /proc/1/environ by any process in the container.
        token_file = os.path.join(self.host_dir, "token")
        fd = os.open(token_file, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o400)
        os.write(fd, self.token.encode())
        os.close(fd)
        if os.getuid() == 0:
            os.chown(token_file, CONTAINER_UID, CONTAINER_UID)
        else:
            os.chmod(token_file, 0o444)
        self.socket_path = os.path.join(self.host_dir, "s")
        self.name = f"envf-{spec.name.lower()}-{secrets.token_hex(4)}"
        t0 = time.perf_counter()
        life = limits.max_lifetime_s
        self.retire_at = None if not life else time.monotonic() + 0.9 * life
        self.retired_for: str | None = None  # why it retired before its lifetime's end (memory)
        self.memory_limit = limits.memory_mb << 20
        self.retire_memory = limits.retire_memory
        self._memory_checked = 0.0
        self._memory_high = False  # the last measurement was past the mark
        try:
            self._c = client.containers.run(
                image,
                command=command,
                name=self.name,
                detach=True,
                init=True,
                network_mode="none",
                read_only=True,
                tmpfs={"/tmp": f"rw,nosuid,nodev,size={limits.tmpfs_mb}m"},
                user=f"{CONTAINER_UID}:{CONTAINER_UID}",
                cap_drop=["ALL"],
                security_opt=["no-new-privileges"],
                mem_limit=f"{limits.memory_mb}m",
                memswap_limit=f"{limits.memory_mb}m",
                nano_cpus=int(limits.cpus * 1e9),
                pids_limit=limits.pids,
                shm_size=f"{limits.shm_mb}m",
                volumes={self.host_dir: {"bind": "/run/envf", "mode": "rw"}},
                environment={
                    "ENVFACTORY_ENV": spec.name,
                    "ENVFACTORY_MODULE": spec.module or "",
                    "ENVFACTORY_TOKEN_FILE": "/run/envf/token",
                    "ENVFACTORY_SOCKET": "/run/envf/s",
                    "ENVFACTORY_MAX_SESSIONS": str(max_sessions),
                    # each connection is a server thread: stay well inside the pid limit
                    "ENVFACTORY_MAX_CONNECTIONS": str(server_connections(max_sessions, limits)),
                    # agent code runs in child processes: none outlives the call that started it
                    "ENVFACTORY_REAP_AGENT_PROCESSES": "1" if spec.isolation == "container" else "0",
                    "ENVFACTORY_MAX_LIFETIME_S": str(float(life)) if life else "",
                    # agent code's files travel with each snapshot (crash resume, fork)
                    "ENVFACTORY_WORK_DIR": "/tmp" if spec.isolation == "container" else "",
                    "ENVFACTORY_WORK_ARCHIVE_MAX": str(limits.work_archive_mb << 20),
                    # the host's per-session quotas: the same observations on both runtimes
                    "ENVFACTORY_MAX_STATE_BYTES": str(quotas.MAX_STATE_BYTES),
                    "ENVFACTORY_MAX_OBSERVATION_CHARS": str(quotas.MAX_OBSERVATION_CHARS),
                },
                labels={
                    LABEL: "1",
                    "org.envfactory.env": spec.name,
                    "org.envfactory.isolation": spec.isolation,
                    "org.envfactory.owner": owner_label(),
                    "org.envfactory.socket_dir": self.host_dir,
                },
            )
        except Exception:
            shutil.rmtree(self.host_dir, ignore_errors=True)
            raise
        self.id = self._c.id
        try:
            self._wait_ready(start_timeout)
            transport = httpx.HTTPTransport(uds=self.socket_path)
            transport._pool = httpcore.ConnectionPool(uds=self.socket_path, network_backend=_VerifiedBackend(self),
                                                      max_connections=CONTROL_CONNECTIONS,
                                                      max_keepalive_connections=CONTROL_CONNECTIONS)
            self.http = httpx.Client(transport=transport, base_url="http://envf",
                                     headers={TOKEN_HEADER: self.token}, timeout=control_timeout)
        except BaseException:
            self.remove()
            raise
        self.start_seconds = time.perf_counter() - t0

    def _wait_ready(self, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        next_check = time.monotonic() + 2.0
        while not os.path.exists(self.socket_path):
            now = time.monotonic()
            if now > next_check:
                next_check = now + 2.0
                if self.status()["Status"] != "running":
                    raise ContainerError(f"{self.spec.name}: container {self.name} exited while starting: "
                                         f"{self.describe_exit()}; logs: {self.logs()}")
            if now > deadline:
                raise ContainerError(f"{self.spec.name}: the server in container {self.name} did not come up "
                                     f"within {timeout}s; logs: {self.logs()}")
            time.sleep(0.002)
        self._seal()
        # The first connection pins the server's pid; no agent code has run yet.
        s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            s.connect(self.socket_path)
            self._pid = _peer_pid(s)
        finally:
            s.close()

    def _seal(self) -> None:
        """The server listens (it deleted its token file first): from now on nothing in the
        container may write to the socket folder, which is on the host's disk. The folder
        goes back to this process's user (root: ``root``), mode 0755, so agent code (the
        container's user, another uid) can neither fill the host disk through it nor move
        the server's socket; connecting to the socket needs no write access to the folder."""
        if os.getuid() == 0:
            os.chown(self.host_dir, 0, 0)
        elif os.getuid() == CONTAINER_UID:  # the container's user owns the folder: it could undo this
            import warnings

            warnings.warn(f"envfactory: this process runs as uid {CONTAINER_UID}, the containers' user, so "
                          "agent code could write to the socket folders; run as another user", stacklevel=3)
        os.chmod(self.host_dir, 0o755)

    def check_peer(self, sock: socket.socket) -> None:
        """Refuse a connection whose listener is not the pinned server process."""
        pid = _peer_pid(sock)
        if pid != self._pid:
            sock.close()
            self.dead = True
            raise ContainerError(
                f"{self.spec.name}: the socket of container {self.name} is served by pid {pid}, not by the "
                f"environment server (pid {self._pid}): something in the container replaced it. "
                "The container is treated as compromised; start a new episode."
            )

    # -- channels --------------------------------------------------------
    def call(self, method: str, path: str, json: Any = None) -> dict[str, Any]:
        """One HTTP control call, its JSON object reply; :class:`ContainerError` if the
        container is gone, overruns the deadline, or answers anything but a JSON object."""
        timeout = self.http.timeout.read
        _deadline.at = None if timeout is None else time.monotonic() + timeout
        try:
            with self.http.stream(method, path, json=json) as r:
                body = bytearray()
                for chunk in r.iter_raw():
                    body += chunk
                    if len(body) > MAX_CONTROL_BODY:
                        raise self._broken(f"its reply to {method} {path} is over {MAX_CONTROL_BODY} bytes")
                status = r.status_code
        except httpx.TimeoutException as exc:
            raise ContainerError(f"{self.spec.name}: control call {method} {path} to container {self.name} "
                                 f"timed out ({exc})") from None
        except httpx.DecodingError as exc:
            raise self._broken(f"its reply to {method} {path} could not be decoded ({exc})") from None
        except (httpx.TransportError, OSError) as exc:
            if self.answers():  # the host's side failed (its descriptor, its pipe): not the container
                raise ContainerError(f"{self.spec.name}: control call {method} {path} to container {self.name} "
                                     f"failed on the host's side ({exc}); the container still answers and "
                                     "was kept") from None
            self.dead = True
            raise ContainerError(f"{self.spec.name}: container {self.name} is unreachable "
                                 f"({self.describe_exit()}): {exc}") from None
        finally:
            _deadline.at = None
        try:
            doc = _json.loads(bytes(body))
        except (ValueError, RecursionError) as exc:
            raise self._broken(f"its reply to {method} {path} is not JSON ({type(exc).__name__})") from None
        if doc.__class__ is not dict:
            raise self._broken(f"its reply to {method} {path} is a {type(doc).__name__}, not an object")
        if status != 200:
            kind, err = doc.get("kind"), str(doc.get("error"))[:2000]
            if status in (409, 503) and method == "POST":  # full: its session or connection limit
                raise ContainerBusy(f"{self.spec.name}: container {self.name} refused {method} {path}: "
                                    f"HTTP {status}: {err}")
            if kind in ("KeyError", "ValueError", "TypeError"):
                raise {"KeyError": KeyError, "ValueError": ValueError, "TypeError": TypeError}[kind](err)
            raise ContainerError(f"{self.spec.name}: {method} {path} failed in container {self.name}: "
                                 f"HTTP {status}: {err}")
        return doc

    def _broken(self, what: str) -> ContainerError:
        """The container broke the protocol: it is marked dead (removed by its owner)."""
        self.dead = True
        return ContainerError(f"{self.spec.name}: container {self.name} is untrustworthy: {what}")

    def open_channel(self, session: str, timeout: float) -> socket.socket:
        """A framed step channel bound to ``session`` (peer verified, token sent)."""
        return self._open_framed({"token": self.token, "session": session}, timeout)

    def batch_channel(self) -> BatchChannel | None:
        """This container's batch channel (:mod:`envfactory.runtime.batch`), opened on first use;
        ``None`` when the container is dead or its server has none (an image built before it, or
        over its connection bound: then the turns use their sessions' channels)."""
        ch = self._batch
        if ch is not None and not ch.broken:
            return ch
        if self._no_batch or self.dead:
            return None
        with self._batch_lock:
            if (self._batch is None or self._batch.broken) and not self._no_batch and not self.dead:
                try:
                    self._batch = BatchChannel(self, self._open_framed({"token": self.token, "batch": True},
                                                                       self.control_timeout))
                except ContainerError as exc:
                    self._no_batch = True
                    log.info("%s: container %s has no batch channel (%s); step_many uses the sessions' "
                             "channels", self.spec.name, self.name, str(exc)[:300])
            ch = self._batch
        return None if ch is None or ch.broken else ch

    def _open_framed(self, hello: dict[str, Any], timeout: float) -> socket.socket:
        s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        deadline = time.monotonic() + timeout
        try:
            s.settimeout(timeout)
            s.connect(self.socket_path)
            self.check_peer(s)
            s.sendall(MAGIC)
            send_frame(s, hello)
            reply = recv_frame(s, deadline)
        except ContainerError:
            raise
        except FrameDecodeError as exc:
            s.close()
            raise self._broken(f"its channel handshake is not JSON ({exc})") from None
        except OSError as exc:
            s.close()
            refused = isinstance(exc, (ConnectionRefusedError, FileNotFoundError))
            if not refused and self.answers():
                # the container is fine; the server closed this connection unread (over its
                # connection bound) or the host's side failed: the session goes elsewhere
                raise ContainerBusy(f"{self.spec.name}: cannot open a channel to container {self.name}: {exc} "
                                    "(the container still answers and was kept)") from None
            self.dead = True
            if refused:
                # the server holds its listening socket for life: a path that no longer reaches
                # it was replaced or removed from inside the container (or the server died)
                raise ContainerError(
                    f"{self.spec.name}: cannot open a channel to container {self.name}: its socket no longer "
                    f"reaches the environment server ({exc}; {self.describe_exit()}): something in the "
                    "container replaced or removed it, or the server died. Start a new episode.") from None
            raise ContainerError(f"{self.spec.name}: cannot open a channel to container {self.name}: {exc}") from None
        if reply.__class__ is not dict:
            s.close()
            raise self._broken(f"its channel handshake is a {type(reply).__name__}, not an object")
        if reply.get("ok") is not True:
            s.close()
            if reply.get("kind") == "busy":  # over its connection limit: the container is fine
                raise ContainerBusy(f"{self.spec.name}: container {self.name} refused the channel: "
                                    f"{str(reply.get('error'))[:2000]}")
            raise ContainerError(f"{self.spec.name}: container {self.name} refused the channel: "
                                 f"{str(reply.get('error'))[:2000]}")
        return s

    def answers(self, timeout: float = 5.0) -> bool:
        """Evidence from the container that it lives: its server (the pinned pid) answers a health
        request on a fresh connection within ``timeout`` seconds (an HTTP status line, a refusal
        for being busy included). What the host's own side raised (``EBADF`` on a descriptor it
        closed, ``EPIPE`` on a write side it shut, a transport's error) is no such evidence, nor
        its absence: ask the container. A connection refused, closed unanswered or timed out: it
        does not answer."""
        if self.dead or self._pid is None:
            return False
        s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            s.settimeout(timeout)
            s.connect(self.socket_path)
            if _peer_pid(s) != self._pid:
                return False
            s.sendall(f"GET /health HTTP/1.1\r\nHost: envf\r\n{TOKEN_HEADER}: {self.token}\r\n"
                      "Connection: close\r\n\r\n".encode("latin-1"))
            head = b""
            while len(head) < 9:
                chunk = s.recv(9 - len(head))
                if not chunk:
                    break
                head += chunk
            return head == b"HTTP/1.1 "
        except OSError:
            return False
        finally:
            s.close()

    # -- lifecycle -------------------------------------------------------
    @property
    def retiring(self) -> bool:
        """Near the end of its lifetime (``Limits.max_lifetime_s``): no new sessions here."""
        at = getattr(self, "retire_at", None)
        return at is not None and time.monotonic() >= at

    def retire(self) -> None:
        """Take no new session here from now on; the pool removes it once its last session ends."""
        self.retire_at = time.monotonic()

    def memory_used(self) -> int | None:
        """Bytes the container's memory cgroup holds less its inactive page cache (what ``docker
        stats`` shows; what the OOM killer weighs, but for cache it can drop), from the engine;
        ``None`` when the engine does not say."""
        try:
            ms = self.client.api.stats(self.id, stream=False, one_shot=True).get("memory_stats") or {}
        except Exception:
            return None
        usage, stats = ms.get("usage"), ms.get("stats") or {}
        if not isinstance(usage, int) or not isinstance(stats, dict):
            return None
        cache = stats.get("total_inactive_file", stats.get("inactive_file", 0))  # cgroup v1 / v2
        return usage - (cache if isinstance(cache, int) and 0 <= cache <= usage else 0)

    def check_memory(self) -> bool:
        """Retire the container when its memory is past ``Limits.retire_memory`` of its limit at
        two measurements in a row (at most one every :data:`MEMORY_CHECK_S` seconds: a call's
        transient peak passes, a creep stays); whether it retired now."""
        if self.retire_memory is None or self.retiring or self.dead:
            return False
        now = time.monotonic()
        if now - self._memory_checked < MEMORY_CHECK_S:
            return False
        self._memory_checked = now
        used = self.memory_used()
        high = used is not None and used > self.retire_memory * self.memory_limit
        # twice in a row: one call's transient peak (a big dump, say) passes; a creep stays
        if used is None or not (high and self._memory_high):
            self._memory_high = high
            return False
        self.retired_for = f"memory {used >> 20} MiB of {self.memory_limit >> 20} MiB"
        self.retire()
        return True

    def status(self) -> dict[str, Any]:
        try:
            return self.client.api.inspect_container(self.id)["State"]
        except Exception as exc:
            if getattr(getattr(exc, "response", None), "status_code", None) == 404:
                return {"Status": "removed"}
            # the engine itself does not answer (stopped, or its host lost)
            return {"Status": "engine unreachable", "Error": f"{type(exc).__name__}: {str(exc)[:200]}"}

    def describe_exit(self) -> str:
        st = self.status()
        if st.get("Status") == "running":
            return "still running"
        if st.get("Status") == "removed":
            return "container removed"
        if st.get("Status") == "engine unreachable":
            return (f"its Docker engine {self.engine or '(default)'} does not answer: the host is lost "
                    f"({st.get('Error')})")
        return f"status {st.get('Status')}, exit code {st.get('ExitCode')}, OOM-killed {st.get('OOMKilled')}"

    def logs(self) -> str:
        try:
            return self.client.api.logs(self.id, tail=20).decode(errors="replace")
        except Exception:
            return "(no logs)"

    def remove(self) -> None:
        """Force-remove the container and its socket folder. Idempotent."""
        self.dead = True
        http = getattr(self, "http", None)
        if http is not None:
            http.close()
        batch = getattr(self, "_batch", None)
        if batch is not None:
            batch.close()
        try:
            self.client.api.remove_container(self.id, force=True)
        except Exception:  # already gone
            pass
        shutil.rmtree(self.host_dir, ignore_errors=True)

    def __repr__(self) -> str:
        return f"<Container {self.name} sessions={self.sessions} dead={self.dead}>"
