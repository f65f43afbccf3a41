"""A restarted host resumes a crashed run's snapshots (issue 63).

Before: the snapshot key was random per process unless ``ENVFACTORY_SNAPSHOT_KEY`` was set, so a
snapshot saved by a run that crashed was refused by the restarted process ("edited, or sealed under
another key"), and nothing said that the key had been the process's own. Now the key lives in a
key file (``$ENVFACTORY_CACHE/snapshot.key`` by default, or beside a run with
``envfactory.snapshots.use_key_file``), made once, readable by its owner only; where none can be
used, the refusal says the key was this process's own and how to share one.

Runtime: about 5 s (three child processes).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import pytest

from envfactory import snapshots
from envfactory.env import SnapshotError

TAKE = textwrap.dedent("""
    import json, sys, envfactory
    from envfactory import snapshots
    if len(sys.argv) > 2:
        snapshots.use_key_file(sys.argv[2])
    env = envfactory.make("Counter-v0")
    env.reset(task="counter-0-8")
    env.step('<tool_call>{"name": "increment", "arguments": {"by": 3}}</tool_call>')
    json.dump(env.snapshot(), open(sys.argv[1], "w"))
""")
RESTORE = textwrap.dedent("""
    import json, sys, envfactory
    from envfactory import snapshots
    if len(sys.argv) > 2:
        snapshots.use_key_file(sys.argv[2])
    env = envfactory.make("Counter-v0")
    try:
        env.restore(json.load(open(sys.argv[1])))
    except envfactory.SnapshotError as exc:
        print("REFUSED", exc)
        sys.exit(0)
    print("RESTORED", env.state.value)
""")


def _run(code: str, *args: str, cache: str) -> str:
    env = {k: v for k, v in os.environ.items() if k != snapshots.KEY_VARIABLE}
    env["ENVFACTORY_CACHE"] = cache
    out = subprocess.run([sys.executable, "-c", code, *args], env=env, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    return out.stdout


def test_a_new_process_restores_the_snapshot_a_crashed_one_took(tmp_path) -> None:
    cache = str(tmp_path / "cache")
    snap = str(tmp_path / "snap.json")
    _run(TAKE, snap, cache=cache)
    assert "RESTORED 3" in _run(RESTORE, snap, cache=cache)
    key = tmp_path / "cache" / "snapshot.key"
    assert key.stat().st_mode & 0o777 == 0o600
    other = str(tmp_path / "other-cache")  # another key: refused, and the refusal says under which key
    said = _run(RESTORE, snap, cache=other)
    assert "REFUSED" in said and f"{other}/snapshot.key" in said


def test_a_run_keeps_its_key_beside_its_snapshots(tmp_path) -> None:
    run = tmp_path / "run"
    run.mkdir()
    snap, key = str(run / "snap.json"), str(run / "snapshot.key")
    _run(TAKE, snap, key, cache=str(tmp_path / "a"))
    assert "RESTORED 3" in _run(RESTORE, snap, key, cache=str(tmp_path / "b"))  # another cache, the run's key


def test_without_a_key_file_the_refusal_says_the_key_was_the_process_s_own(tmp_path, monkeypatch) -> None:
    """A cache that cannot hold a key file (here a file where its folder should be): the process's
    own random key, as before, and a refusal that says so, and how to share a key."""
    blocked = tmp_path / "blocked"
    blocked.write_text("not a folder")
    monkeypatch.setenv("ENVFACTORY_CACHE", str(blocked))
    monkeypatch.delenv(snapshots.KEY_VARIABLE, raising=False)
    snap = str(tmp_path / "snap.json")
    _run(TAKE, snap, cache=str(blocked))
    said = _run(RESTORE, snap, cache=str(blocked))
    assert "REFUSED" in said and "a random key of this process only" in said and snapshots.KEY_VARIABLE in said


def test_a_key_file_others_can_read_is_refused(tmp_path, monkeypatch) -> None:
    monkeypatch.delenv(snapshots.KEY_VARIABLE, raising=False)
    key = tmp_path / "snapshot.key"
    key.write_text("ab" * 32)
    key.chmod(0o644)
    with pytest.raises(PermissionError, match="chmod 600"):
        snapshots.use_key_file(key)
    key.chmod(0o600)
    try:
        assert snapshots.use_key_file(key) == str(key)
        import envfactory

        env = envfactory.make("Counter-v0")
        env.reset(task="counter-0-8")
        snap = env.snapshot()
        assert snapshots.key_source() == f"the key file {key}"
        env.restore(json.loads(json.dumps(snap)))
        snapshots.use_key_file(None)
        with pytest.raises(SnapshotError, match="sealed under another key"):
            env.restore(snap)
    finally:
        snapshots.use_key_file(None)
