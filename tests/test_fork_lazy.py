"""fork() is copy-on-write at the state's granularity (issue 60): O(1) in the state, the copy
taken by the first writing call on a side, never by reads; every side independent as before."""

import json

import pytest

import envfactory
from envfactory import quotas, world
from envfactory.task import call

WRITE = call("write_file", path="/tmp/x.txt", content="child").to_hermes()
READ = call("read_file", path="/home/user/notes/todo.txt").to_hermes()


@pytest.fixture
def copies(monkeypatch):
    """The whole-state copies LocalWorld takes (fork, or the first write after one)."""
    made = []
    real = world.copy_state

    def counting(state):
        made.append(state)
        return real(state)

    monkeypatch.setattr(world, "copy_state", counting)
    return made


def _fs(task="fs-015", steps=1):
    env = envfactory.make("FileSystem-v0")
    env.reset(task)
    for c in env.task.solution[:steps]:
        env.step(c.to_hermes())
    return env


def _state(ep):
    """The state as a snapshot writes it (a read: no copy), a set's members in order."""
    state = ep.snapshot()["state"]
    if "fs" in state:
        state["fs"]["dirs"] = sorted(state["fs"]["dirs"])
    return state


def _files(ep):
    return _state(ep)["fs"]["files"]


def test_fork_of_a_big_state_copies_nothing_until_a_write(copies):
    env = envfactory.make("FileSystem-v0")
    task = env.spec.task("fs-015")
    big = task.initial_state.model_copy(deep=True)
    for i in range(20_000):
        big.fs.files[f"/home/user/bulk/f{i}.txt"] = f"line {i}"
    env.reset(task.model_copy(update={"initial_state": big}))
    env.step(task.solution[0].to_hermes())
    children = [env.fork() for _ in range(50)]
    assert copies == []  # O(1): no copy of the 20,000 files at fork
    before = _files(env)
    assert all(_files(c) == before for c in children[:3]) and copies == []  # snapshots read, never copy
    children[0].step(WRITE)
    assert len(copies) == 1  # the first write on a side copies that side's state
    assert "/tmp/x.txt" in _files(children[0]) and "/tmp/x.txt" not in _files(env)
    assert all("/tmp/x.txt" not in _files(c) for c in children[1:3])


def test_writes_on_either_side_are_independent_and_the_last_holder_writes_in_place(copies):
    env = _fs()
    child = env.fork()
    child.step(WRITE)
    assert len(copies) == 1
    env.step(call("delete_file", path="/home/user/notes/todo.txt").to_hermes())
    assert len(copies) == 1  # the parent is the state's last holder: no copy
    assert "/home/user/notes/todo.txt" in _files(child) and "/tmp/x.txt" not in _files(env)
    assert "/home/user/notes/todo.txt" not in _files(env) and _files(child)["/tmp/x.txt"] == "child"


def test_reads_share_and_answer_alike(copies):
    env = _fs()
    child = env.fork()
    r1, r2 = child.step(READ), env.step(READ)
    assert r1.messages == r2.messages and "Move /home/user/inbox" in r1.messages[-1]["content"]
    assert copies == [] and env._world.view() is child._world.view()  # read-only tools never copy
    s1, s2 = _state(env), _state(child)
    assert s1 == s2 and copies == []


def test_a_user_changing_env_state_changes_only_that_side():
    env = _fs()
    child = env.fork()
    child.state.fs.files["/tmp/by_user.txt"] = "u"  # the public state is that side's own
    assert "/tmp/by_user.txt" not in _files(env)
    env.state.fs.files["/tmp/parent_user.txt"] = "p"
    assert "/tmp/parent_user.txt" not in _files(child)
    # a state a caller holds from before the fork stays the parent's alone
    held = env.state
    other = env.fork()
    held.fs.files["/tmp/later.txt"] = "l"
    assert "/tmp/later.txt" in _files(env) and "/tmp/later.txt" not in _files(other)
    other.step(WRITE)
    assert "/tmp/x.txt" not in env.state.fs.files


def test_three_sides_sharing_one_state(copies):
    env = _fs()
    a = env.fork()
    b = a.fork()  # a fork of a fork: three sides, one state
    c = env.fork()
    assert copies == []
    for i, ep in enumerate([a, b, c, env]):
        ep.step(call("write_file", path=f"/tmp/side{i}.txt", content=str(i)).to_hermes())
    assert len(copies) == 3  # the last of the four writes in place
    for i, ep in enumerate([a, b, c, env]):
        mine = {p for p in _files(ep) if p.startswith("/tmp/side")}
        assert mine == {f"/tmp/side{i}.txt"}, (i, mine)


def test_dropped_or_closed_forks_leave_the_last_holder_in_place(copies):
    env = _fs()
    child = env.fork()
    child.close()
    del child
    env.step(WRITE)
    assert copies == []
    other = env.fork()
    other.close()
    other.step(READ)  # a closed in-process episode still plays (and still shares)
    del other
    env.step(call("write_file", path="/tmp/y.txt", content="y").to_hermes())
    assert copies == []
    gone = env.fork()
    gone.reset("fs-001")  # a new state for that side: the old one is the parent's alone again
    env.step(call("write_file", path="/tmp/z.txt", content="z").to_hermes())
    assert copies == [] and "/tmp/z.txt" not in _files(gone)


def test_snapshot_and_restore_of_a_sharing_side():
    env = _fs(steps=1)
    child = env.fork()
    snap = json.loads(json.dumps(child.snapshot()))
    assert snap["state"] == env.snapshot()["state"]
    child.step(WRITE)
    env.step(call("write_file", path="/tmp/p.txt", content="p").to_hermes())
    third = env.fork()
    third.restore(snap)  # a sharing side loads a state: it leaves the shared one
    assert _state(third) == {"fs": {**snap["state"]["fs"], "dirs": sorted(snap["state"]["fs"]["dirs"])}}
    env.step(call("write_file", path="/tmp/q.txt", content="q").to_hermes())
    assert "/tmp/q.txt" not in _files(third) and "/tmp/p.txt" not in _files(third)
    for a in [c.to_hermes() for c in third.task.solution[1:]]:
        third.step(a)
    assert third.success is None or third.status.log  # it plays on from the snapshot
    assert "/tmp/x.txt" in _files(child) and "/tmp/x.txt" not in _files(third)


@pytest.mark.parametrize("side", ["child", "parent"])
def test_quota_undo_on_a_sharing_side_restores_exactly_that_side(monkeypatch, side):
    env = _fs(steps=1)
    env.step(call("write_file", path="/tmp/before.txt", content="b" * 100).to_hermes())  # journaled
    child = env.fork()
    same = _state(env)
    monkeypatch.setattr(quotas, "MAX_STATE_BYTES", quotas.state_size(env._world.view()) + 2_000)
    over, other = (child, env) if side == "child" else (env, child)
    r = over.step(call("write_file", path="/tmp/big.txt", content="x" * 5_000).to_hermes())
    assert quotas.STATE_QUOTA_PREFIX in r.messages[-1]["content"]
    assert _state(over) == same and _state(other) == same
    over.step(call("write_file", path="/tmp/small.txt", content="s").to_hermes())
    assert "/tmp/small.txt" in _files(over) and "/tmp/small.txt" not in _files(other)
    other.step(call("write_file", path="/tmp/big.txt", content="x" * 5_000).to_hermes())  # over too
    assert _state(other) == same


def test_team_forks_are_independent(copies):
    env = envfactory.make("MultiRecords-v0")
    env.reset(0)
    sol = env.task.solution
    env.act(sol[0].agent, sol[0].to_hermes())  # reader_0 searches (a read)
    child = env.fork()
    assert copies == []
    nxt = child.status.next_agent
    child.act(nxt, call("read_messages").to_hermes())  # a team's batch writes who acts: it copies
    assert len(copies) == 1
    before = _state(env)
    child.act(child.status.next_agent, sol[1].to_hermes())  # a letter on the child's side only
    assert _state(env) == before
    assert len(_state(child)["mail"]["letters"]) == len(before["mail"]["letters"]) + 1
    assert env._world.view().acting == "" and child._world.view().acting == ""
    env.act(env.status.next_agent, call("read_messages").to_hermes())
    assert len(copies) == 1  # the parent is the last holder


def test_a_closed_fork_that_plays_on_still_copies_before_writing(copies):
    env = _fs()
    child = env.fork()
    child.close()
    child.step(WRITE)
    assert len(copies) == 1 and "/tmp/x.txt" not in _files(env)


def test_subclasses_fork_by_a_copy_unless_they_opt_in(copies):
    """A LocalWorld subclass (an MCP server's world) forks by a copy unless it opts in."""
    from envfactory.world import LocalWorld

    class Mine(LocalWorld):
        pass

    class Lazy(LocalWorld):
        _lazy_fork = True

    spec = envfactory.registry.spec("FileSystem-v0")
    for cls, copied in ((Mine, 1), (Lazy, 0), (LocalWorld, 0)):
        copies.clear()
        ep = envfactory.Episode(spec, cls(spec))
        ep.reset(0)
        ep.fork()
        assert len(copies) == copied, cls


def test_forks_written_from_threads_stay_independent():
    from concurrent.futures import ThreadPoolExecutor

    env = _fs()
    kids = [env.fork() for _ in range(8)]
    grand = [k.fork() for k in kids[:4]]
    sides = kids + grand + [env]

    def play(i):
        for j in range(5):
            sides[i].step(call("write_file", path=f"/tmp/s{i}_{j}.txt", content=str(i)).to_hermes())

    with ThreadPoolExecutor(8) as pool:
        list(pool.map(play, range(len(sides))))
    for i, ep in enumerate(sides):
        mine = {p for p in _files(ep) if p.startswith("/tmp/s")}
        assert mine == {f"/tmp/s{i}_{j}.txt" for j in range(5)}, i
