"""Registry, Gymnasium adapter and the CLI's machine-readable output."""

import json
import subprocess
import sys

import gymnasium
import pytest

import envfactory
from envfactory import ToolEnvSpec, SpecError, State, Task, call, tool


def test_gymnasium_make_reset_step():
    env = gymnasium.make("envfactory/Counter-v0")
    obs, info = env.reset(seed=3)
    assert obs == envfactory.spec("Counter-v0").task(info["task_id"]).instruction
    assert info["tools"][0]["function"]["name"] == "increment"
    obs, reward, term, trunc, info = env.step('<tool_call>{"name": "read_counter", "arguments": {}}</tool_call>')
    assert obs.startswith("<tool_response>") and not term
    assert env.observation_space.contains(obs)
    assert info["messages"][-1]["role"] == "tool"
    obs2, info2 = env.reset(seed=3)
    assert info2["task_id"] == info["task_id"]
    _, info3 = env.reset(options={"task": "counter-3-7"})
    assert info3["task_id"] == "counter-3-7"


def test_gymnasium_and_make_pick_the_same_task_for_every_seed():
    for name in ("Helpdesk-v0", "Bank-v0"):
        ours, gym_env = envfactory.make(name), gymnasium.make(f"envfactory/{name}")
        for seed in range(20):
            ours.reset(seed=seed)
            _, info = gym_env.reset(seed=seed)
            assert info["task_id"] == ours.task.id, (name, seed)
        ids = set()
        for seed in range(20):  # an unseeded reset draws from the seeded np_random, and reproducibly
            gym_env.reset(seed=seed)
            ids.add(gym_env.reset()[1]["task_id"])
        assert len(ids) > 1


def test_step_info_carries_what_is_new_and_the_transcript_is_one_call_away():
    env = gymnasium.make("envfactory/Counter-v0")
    _, info = env.reset(options={"task": "counter-0-2"})
    conversation = list(info["messages"])
    assert [m["role"] for m in conversation] == ["system", "user"]
    for action in ('<tool_call>{"name": "increment", "arguments": {"by": 1}}</tool_call>'
                   '<tool_call>{"name": "read_counter", "arguments": {}}</tool_call>', "Done."):
        *_, info = env.step(action)
        assert info["messages"][0] == {"role": "assistant", "content": info["messages"][0]["content"],
                                       **({"tool_calls": info["messages"][0]["tool_calls"]}
                                          if "tool_calls" in info["messages"][0] else {})}
        conversation += info["messages"]
    assert [m["role"] for m in conversation] == ["system", "user", "assistant", "tool", "tool", "assistant"]
    assert conversation == env.unwrapped.messages == env.unwrapped.env.transcript()


def test_observations_are_sanitised_into_the_text_space():
    env = gymnasium.make("envfactory/FileSystem-v0")
    env.reset(options={"task": 0})
    env.step('<tool_call>{"name": "write_file", "arguments": {"path": "/tmp/e", "content": "hi \\ud83d\\ude00 \\u0007"}}</tool_call>')
    obs, *_ = env.step('<tool_call>{"name": "read_file", "arguments": {"path": "/tmp/e"}}</tool_call>')
    assert env.observation_space.contains(obs) and "\ufffd" in obs


def test_register_validates_and_refuses_duplicates():
    class S(State):
        x: int = 0

    @tool
    def bump(state: S) -> str:
        """Bump."""
        state.x += 1
        return "ok"

    def mk(name):
        return ToolEnvSpec(name=name, domain="test", state_type=S, tools=[bump],
                       tasks=[Task(id="t", instruction="bump", initial_state=S(), solution=[call("bump")])])

    with pytest.raises(SpecError, match="must look like"):
        mk("bad name")
    spec = envfactory.register(mk("TestBump-v0"))
    try:
        with pytest.raises(SpecError, match="already registered"):
            envfactory.register(mk("TestBump-v0"))
        with pytest.raises(SpecError, match="no task in the 'train' split"):  # its one task hashes to eval
            gymnasium.make("envfactory/TestBump-v0").reset(seed=0)
        env = gymnasium.make("envfactory/TestBump-v0", split="all")
        env.reset(seed=0)
        assert spec.module == __name__
    finally:
        from envfactory import registry
        registry._REGISTRY.pop("TestBump-v0")
        gymnasium.registry.pop("envfactory/TestBump-v0")


def test_make_errors_are_named():
    with pytest.raises(KeyError, match="no environment named 'Nope-v0'"):
        envfactory.make("Nope-v0")
    with pytest.raises(ValueError, match="unknown runtime"):
        envfactory.make("Counter-v0", runtime="moon")


def test_builtins_are_found_through_the_entry_point():
    from importlib import metadata

    eps = [ep for ep in metadata.entry_points(group=envfactory.ENTRY_POINT_GROUP)]
    assert any(ep.value == "environments:register_all" for ep in eps)
    assert {"FileSystem-v0", "Helpdesk-v0", "Bank-v0"} <= {s.name for s in envfactory.specs()}


def _cli(*args):
    r = subprocess.run([sys.executable, "-m", "envfactory.cli", *args], capture_output=True, text=True,
                       timeout=600)
    return r.returncode, r.stdout, r.stderr


def test_cli_list_json_shape():
    code, out, err = _cli("list", "--json")
    assert code == 0, err
    rows = json.loads(out)
    names = {r["name"] for r in rows}
    assert {"FileSystem-v0", "Helpdesk-v0", "Bank-v0"} <= names
    for r in rows:
        assert isinstance(r["domain"], str) and isinstance(r["multi_agent"], bool)
        assert isinstance(r["tasks"], int) and isinstance(r["tools"], int) and r["tasks"] > 0


def test_cli_verify_json_shape():
    code, out, err = _cli("verify", "Counter-v0", "Bank-v0", "--json")
    assert code == 0, err
    doc = json.loads(out)
    assert [e["name"] for e in doc["environments"]] == ["Counter-v0", "Bank-v0"]
    for e in doc["environments"]:
        assert e["verified"] is True and e["failures"] == [] and e["tasks"] > 0 and e["domain"]
    assert doc["totals"]["environments"] == 2
    code, out, _ = _cli("verify", "Nope-v0", "--json")
    assert code == 2 and "Nope-v0" in json.loads(out)["error"]


def test_cli_bench_json_keys_carry_units():
    code, out, err = _cli("bench", "--only", "fork", "--only", "step", "--json")
    assert code == 0, err
    doc = json.loads(out)
    assert {"step_envfactory_us", "step_plain_gymnasium_us", "step_envfactory_vs_plain_ratio",
            "fork_max_us"} <= set(doc)
    for k, v in doc.items():
        if isinstance(v, float):
            assert k.endswith(("_us", "_ms", "_s", "_ratio")), k
