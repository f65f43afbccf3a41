"""What makes an episode snapshot trustworthy enough to restore (issue 28, hostile input).

A snapshot (:meth:`envfactory.Episode.snapshot`) is JSON data that leaves the process and may
come back edited. :meth:`~envfactory.Episode.restore` therefore checks, in order:

1. **integrity**: the snapshot carries ``"mac"``, an HMAC-SHA256 over its canonical bytes (every
   other field, as JSON with sorted keys) under the snapshot key (:func:`key_source` says which):
   ``ENVFACTORY_SNAPSHOT_KEY`` when set (processes, or hosts, that exchange snapshots set the same
   one); else the key in a key file, :func:`use_key_file`'s (a run keeps its key beside its
   snapshots), by default ``$ENVFACTORY_CACHE/snapshot.key`` (``~/.cache/envfactory``), made once
   (32 random bytes, readable by its owner only), so that a host restarted after a crash restores
   the snapshots it took before; else, when no key file can be read or made (a read-only home), a
   random key made once per process, and a refusal says so and how to fix it.
   A snapshot you edit on purpose is sealed again with :func:`sign_snapshot`;
2. **types** of the referee fields (turn counters, transcripts, the log, the verdict), each
   named when wrong (:func:`check_referee`);
3. **consistency** of the verdict with the ending: an episode still running has no success and
   no reward; one that timed out or lost its world has success ``False`` and reward 0; any other
   ending is judged again from the restored state (so its stored verdict is never believed).

Every refusal is a :class:`~envfactory.SnapshotError` naming what is wrong.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import math
import os
import secrets
from typing import Any

from .env import SnapshotError

__all__ = ["SnapshotError", "KEY_VARIABLE", "MAC_FIELD", "sign_snapshot", "check_seal", "check_referee",
           "TERMINATED_BY", "TRUNCATED_BY", "WORLD_GONE", "use_key_file", "key_source", "default_key_file"]

KEY_VARIABLE = "ENVFACTORY_SNAPSHOT_KEY"
MAC_FIELD = "mac"
_PROCESS_KEY = secrets.token_bytes(32)

TERMINATED_BY = frozenset({"finish", "terminal", "answer", "quiescence"})
TRUNCATED_BY = frozenset({"max_turns", "timeout", "world_lost"})
WORLD_GONE = frozenset({"timeout", "world_lost"})
"""Endings after which nothing is judged: success ``False``, every reward 0."""

_ROLES = frozenset({"system", "user", "assistant", "tool"})


_KEY_FILE: str | None = None  # use_key_file's path (None: the default key file)
_FILE_KEYS: dict[str, tuple[bytes, str]] = {}  # key file path -> (its key, or the process's; what it is)
_KEY_BYTES = 32


def default_key_file() -> str:
    """``$ENVFACTORY_CACHE/snapshot.key`` (``~/.cache/envfactory/snapshot.key``)."""
    root = os.environ.get("ENVFACTORY_CACHE")
    base = os.path.expanduser(root) if root else os.path.join(os.path.expanduser("~"), ".cache", "envfactory")
    return os.path.join(base, "snapshot.key")


def use_key_file(path: str | os.PathLike[str] | None) -> str:
    """Seal and check snapshots under the key in the file ``path`` (made there, readable by its
    owner only, if it does not exist): a run that keeps its snapshots in a folder keeps its key
    beside them, and a process restarted on that folder restores them. ``None``: the default
    key file again. ``ENVFACTORY_SNAPSHOT_KEY``, when set, still wins. Returns the path.

    Raises:
        OSError: the file can be neither read nor made, or others may read or write it."""
    global _KEY_FILE
    if path is None:
        _KEY_FILE = None
        return default_key_file()
    p = os.path.abspath(os.fspath(path))
    key = _read_or_make(p)  # raises: a run that names its key file wants that one, not a fallback
    _FILE_KEYS[p] = (key, f"the key file {p}")
    _KEY_FILE = p
    return p


def _read_or_make(path: str) -> bytes:
    """The key in ``path``, made first when there is none (atomically: two processes starting
    together end up with the same key)."""
    try:
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0))
    except FileNotFoundError:
        os.makedirs(os.path.dirname(path) or ".", mode=0o700, exist_ok=True)
        tmp = f"{path}.{os.getpid()}.{secrets.token_hex(4)}.tmp"
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        try:
            os.write(fd, secrets.token_hex(_KEY_BYTES).encode("ascii") + b"\n")
            os.fsync(fd)
        finally:
            os.close(fd)
        try:
            os.link(tmp, path)  # fails if another process made it meanwhile: then its key is the key
        except FileExistsError:
            pass
        finally:
            os.unlink(tmp)
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0))
    try:
        st = os.fstat(fd)
        if hasattr(os, "getuid") and (st.st_uid != os.getuid() or st.st_mode & 0o077):
            raise PermissionError(f"the snapshot key file {path} must belong to this user and be readable by "
                                  f"nobody else (chmod 600 {path}); others could forge snapshots with it")
        text = os.read(fd, 4096).decode("ascii", "replace").strip()
    finally:
        os.close(fd)
    try:
        key = bytes.fromhex(text)
    except ValueError:
        key = b""
    if len(key) < 16:
        raise ValueError(f"the snapshot key file {path} does not hold a key (at least 32 hex digits)")
    return key


def _file_key() -> tuple[bytes, str]:
    path = _KEY_FILE or default_key_file()
    got = _FILE_KEYS.get(path)
    if got is None:
        try:
            got = (_read_or_make(path), f"the key file {path}")
        except (OSError, ValueError) as exc:
            got = (_PROCESS_KEY, f"a random key of this process only (the key file {path} could not be used: "
                                 f"{type(exc).__name__}: {exc})")
        _FILE_KEYS[path] = got
    return got


def key_source() -> str:
    """Which key seals this process's snapshots: ``ENVFACTORY_SNAPSHOT_KEY``, a key file (its path),
    or a random key of this process only (and why no key file was used)."""
    if os.environ.get(KEY_VARIABLE):
        return KEY_VARIABLE
    return _file_key()[1]


def _key() -> bytes:
    shared = os.environ.get(KEY_VARIABLE)
    return shared.encode("utf-8", "surrogatepass") if shared else _file_key()[0]


def _canonical(snapshot: dict[str, Any]) -> bytes:
    body = {k: v for k, v in snapshot.items() if k != MAC_FIELD}
    try:
        return json.dumps(body, sort_keys=True, separators=(",", ":"), ensure_ascii=True).encode("ascii")
    except (TypeError, ValueError, RecursionError) as exc:
        raise SnapshotError(f"not a snapshot: it is not JSON data ({type(exc).__name__}: {exc})") from None


def _mac(snapshot: dict[str, Any]) -> str:
    return hmac.new(_key(), _canonical(snapshot), hashlib.sha256).hexdigest()


def sign_snapshot(snapshot: dict[str, Any]) -> dict[str, Any]:
    """A copy of ``snapshot`` sealed with this process's snapshot key (for a snapshot edited on
    purpose, e.g. one whose state was replaced; restore still checks its fields)."""
    out = {k: v for k, v in snapshot.items() if k != MAC_FIELD}
    out[MAC_FIELD] = _mac(out)
    return out


def check_seal(snapshot: dict[str, Any]) -> None:
    """Raise :class:`SnapshotError` unless ``snapshot``'s ``mac`` matches its contents under this
    process's key."""
    mac = snapshot.get(MAC_FIELD)
    if not isinstance(mac, str):
        raise SnapshotError("snapshot failed its integrity check: it carries no seal ('mac'); take snapshots "
                            "with Episode.snapshot(), or seal an edited one with envfactory.snapshots.sign_snapshot")
    if not hmac.compare_digest(mac.encode("ascii", "replace"), _mac(snapshot).encode("ascii")):
        raise SnapshotError(f"snapshot failed its integrity check: it was edited, or sealed under another key. "
                            f"This process checks it under {key_source()}; a snapshot restores under the key it "
                            f"was sealed with: processes and hosts that exchange snapshots set the same "
                            f"{KEY_VARIABLE}, or share a key file (envfactory.snapshots.use_key_file(path), "
                            "by default $ENVFACTORY_CACHE/snapshot.key)")


# -- the referee fields -------------------------------------------------------------------------
def _int(v: Any, lo: int = 0) -> bool:
    return v.__class__ is int and v >= lo


def _str_or_none(v: Any) -> bool:
    return v is None or isinstance(v, str)


def _message(m: Any) -> str | None:
    """Why ``m`` is not a transcript message (``None``: it is one)."""
    if not isinstance(m, dict):
        return f"a message is a dict, not {type(m).__name__}"
    if m.get("role") not in _ROLES:
        return f"role {m.get('role')!r} is none of {sorted(_ROLES)}"
    if not _str_or_none(m.get("content")):
        return "content is not a string"
    for key in ("tool_call_id", "name"):
        if key in m and not isinstance(m[key], str):
            return f"{key} is not a string"
    calls = m.get("tool_calls")
    if calls is not None:
        if not isinstance(calls, list):
            return "tool_calls is not a list"
        for c in calls:
            if not (isinstance(c, dict) and isinstance(c.get("id"), str) and isinstance(c.get("function"), dict)):
                return "a tool call is not {id, function: {name, arguments}}"
    return None


def _messages(v: Any) -> str | None:
    if not isinstance(v, list):
        return f"a list of messages, not {type(v).__name__}"
    for i, m in enumerate(v):
        why = _message(m)
        if why:
            return f"message {i}: {why}"
    return None


def _per_agent(name: str, v: Any, agents: tuple[str, ...], ok: Any, what: str, *, all_agents: bool = True) -> None:
    if not isinstance(v, dict):
        raise SnapshotError(f"snapshot field {name!r}: a dict by agent, not {type(v).__name__}")
    unknown = set(v) - set(agents)
    if unknown:
        raise SnapshotError(f"snapshot field {name!r}: unknown agents {sorted(unknown)} (the agents are {list(agents)})")
    if all_agents and set(v) != set(agents):
        raise SnapshotError(f"snapshot field {name!r}: needs every agent {list(agents)}, has {sorted(v)}")
    for a, x in v.items():
        why = ok(x)
        if why is False or isinstance(why, str):
            raise SnapshotError(f"snapshot field {name!r}[{a!r}]: {why if isinstance(why, str) else what}, "
                                f"got {str(x)[:80]!r}")


def _counts(v: Any) -> bool:
    return isinstance(v, dict) and all(isinstance(k, str) and _int(x) for k, x in v.items())


def _reward(v: Any) -> bool:
    return v.__class__ in (int, float) and math.isfinite(v)


def _log_entry(e: Any, agents: tuple[str, ...]) -> bool:
    return (isinstance(e, list) and len(e) == 6 and _int(e[0], 1) and e[1] in agents and _str_or_none(e[2])
            and isinstance(e[4], str) and (e[5] is None or e[5].__class__ is bool))


def check_referee(snap: dict[str, Any], agents: tuple[str, ...]) -> None:
    """Raise :class:`SnapshotError` naming the first referee field of ``snap`` (a decoded
    snapshot) whose type or value an episode of ``agents`` cannot hold, or a verdict that
    contradicts the ending."""
    agents = tuple(agents)
    tid = snap.get("task_id")
    if not (isinstance(tid, str) or _int(tid)):
        raise SnapshotError(f"snapshot field 'task_id': a task id, got {str(tid)[:80]!r}")
    if not _int(snap.get("max_turns"), 1):
        raise SnapshotError(f"snapshot field 'max_turns': an integer of at least 1, got {snap.get('max_turns')!r}")
    if not _int(snap.get("round"), 1):
        raise SnapshotError(f"snapshot field 'round': an integer of at least 1, got {str(snap.get('round'))[:80]!r}")
    pos = snap.get("pos")
    if not (pos.__class__ is int and 0 <= pos <= len(agents)):
        raise SnapshotError(f"snapshot field 'pos': an integer from 0 to {len(agents)}, got {str(pos)[:80]!r}")
    _per_agent("transcripts", snap.get("transcripts"), agents, _messages, "a list of messages")
    _per_agent("last_tool", snap.get("last_tool"), agents, _messages, "a list of messages")
    _per_agent("seen_mail", snap.get("seen_mail"), agents, _int, "a count (an integer of at least 0)")
    _per_agent("acted", snap.get("acted"), agents, _int, "a count (an integer of at least 0)")
    _per_agent("counts", snap.get("counts"), agents, _counts, "{name: count}")
    _per_agent("rewards", snap.get("rewards"), agents, _reward, "a finite number")
    _per_agent("last_words", snap.get("last_words"), agents, lambda x: isinstance(x, str), "a string",
               all_agents=False)
    passed = snap.get("passed")
    if not (isinstance(passed, list) and all(p in agents for p in passed)):
        raise SnapshotError(f"snapshot field 'passed': a list of agents, got {str(passed)[:80]!r}")
    log = snap.get("log")
    if not isinstance(log, list):
        raise SnapshotError(f"snapshot field 'log': a list, not {type(log).__name__}")
    for i, e in enumerate(log):
        if not _log_entry(e, agents):
            raise SnapshotError(f"snapshot field 'log'[{i}]: [round, agent, tool, arguments, kind, read_only], "
                                f"got {str(e)[:80]!r}")
    for name in ("terminated", "truncated"):
        if snap.get(name).__class__ is not bool:
            raise SnapshotError(f"snapshot field {name!r}: true or false, got {str(snap.get(name))[:80]!r}")
    if not (snap.get("success") is None or snap.get("success").__class__ is bool):
        raise SnapshotError(f"snapshot field 'success': true, false or null, got {str(snap.get('success'))[:80]!r}")
    if not _str_or_none(snap.get("answer")):
        raise SnapshotError(f"snapshot field 'answer': a string or null, got {str(snap.get('answer'))[:80]!r}")
    ended_by, terminated, truncated = snap.get("ended_by"), snap["terminated"], snap["truncated"]
    if terminated and truncated:
        raise SnapshotError("snapshot fields 'terminated' and 'truncated': an episode ends one way, not both")
    if not (terminated or truncated):
        if ended_by is not None:
            raise SnapshotError(f"snapshot field 'ended_by': {ended_by!r}, but the episode has not ended")
        if snap["success"] is not None or snap["answer"] is not None or any(snap["rewards"].values()):
            raise SnapshotError("snapshot fields 'success', 'answer' and 'rewards': an episode still running "
                                "has no success, no answer and reward 0")
        return
    endings = TERMINATED_BY if terminated else TRUNCATED_BY
    if ended_by not in endings:
        raise SnapshotError(f"snapshot field 'ended_by': one of {sorted(endings)} for an episode "
                            f"{'terminated' if terminated else 'truncated'}, got {str(ended_by)[:80]!r}")
    if ended_by in WORLD_GONE and (snap["success"] is not False or any(snap["rewards"].values())):
        raise SnapshotError(f"snapshot fields 'success' and 'rewards': an episode ended by {ended_by} has "
                            "success false and reward 0")
