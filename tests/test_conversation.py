"""Tasks as conversations (envfactory.conversation): user turns, a user holding facts, per-turn checks,
the reward components, and conversations through fork, snapshot, the faces and the oracle."""

from __future__ import annotations

import asyncio
import json

import pytest

from envfactory import MultiState, Role, SnapshotError, SpecError, State, Task, ToolEnvSpec, call, tool
from envfactory.checks.scripted import ClaimPolicy, NoopPolicy, OraclePolicy, RandomPolicy, play
from envfactory.checks.verify import verify_spec
from envfactory.conversation import Conversation, UserTurn
from envfactory.episode import Episode, step_many
from envfactory.faces.gym_env import ToolGymEnv
from envfactory.snapshots import sign_snapshot


class Desk(State):
    n: int = 0
    notes: list[str] = []
    codes: dict[str, str] = {}


@tool(read_only=True)
def get_n(state: Desk) -> int:
    """Read the counter."""
    return state.n


@tool
def add(state: Desk, k: int) -> int:
    """Add to the counter.

    Args:
        k: How much to add.
    """
    state.n += k
    return f"the counter is now {state.n}"


@tool
def note(state: Desk, text: str) -> str:
    """Write a note.

    Args:
        text: The note.
    """
    state.notes.append(text)
    return "noted"


@tool
def unlock(state: Desk, account: str, code: str) -> str:
    """Unlock an account with its code.

    Args:
        account: The account name.
        code: The unlock code.
    """
    if state.codes.get(account) != code:
        raise ValueError("wrong account or code")
    state.notes.append("unlocked " + account)
    return "unlocked"


TURNS = Conversation(turns=[
    UserTurn(message="Add 2 please.", solution=[call("add", k=2)]),
    UserTurn(message="What is the counter now?", solution=[call("get_n")], checks=("state", "results")),
    UserTurn(message="Write the note 'hi'.", tools=["note"], solution=[call("note", text="hi")]),
    UserTurn(message="Delete everything.", checks=("no_call",)),
])
FACTS = Conversation(
    turns=[UserTurn(message="I'm locked out of my account, can you help?",
                    solution=[call("unlock", account="kim", code="7731")]),
           UserTurn(message="Thanks! Please also add 5 to the counter.", solution=[call("add", k=5)])],
    facts={"account name": "kim", "unlock code": "7731"},
    communicate=["5"],
)


def _spec(name: str = "ConvDesk-v0", **extra: object) -> ToolEnvSpec:
    tasks = [Task(id="turns", initial_state=Desk(), conversation=TURNS),
             Task(id="facts", initial_state=Desk(codes={"kim": "7731", "lee": "1234"}), conversation=FACTS),
             Task(id="plain", instruction="Add 1.", initial_state=Desk(), solution=[call("add", k=1)]),
             *extra.pop("tasks", [])]  # type: ignore[misc]
    return ToolEnvSpec(name=name, domain="a desk", state_type=Desk, tools=[get_n, add, note, unlock],
                       tasks=tasks, max_turns=30, **extra)  # type: ignore[arg-type]


def tc(name: str, **arguments: object) -> str:
    return '<tool_call>{"name": "%s", "arguments": %s}</tool_call>' % (name, json.dumps(arguments))


def test_the_answer_ends_the_turn_and_the_next_user_message_is_the_observation() -> None:
    ep = Episode(_spec())
    opening = ep.reset("turns")
    assert opening[-1] == {"role": "user", "content": "Add 2 please."}
    assert ep.task is not None and ep.task.instruction == "Add 2 please." and len(ep.task.solution) == 3
    r = ep.step(tc("add", k=2))
    assert r.messages[0]["role"] == "tool" and not r.terminated
    r = ep.step("Done, it is 2.")
    assert r.messages == [{"role": "user", "content": "What is the counter now?"}] and not r.terminated
    assert r.info["user_turn"] == 1 and r.reward == 0.0
    assert ep.observation() == "What is the counter now?"
    assert ep.transcript()[-2:] == [{"role": "assistant", "content": "Done, it is 2."},
                                    {"role": "user", "content": "What is the counter now?"}]
    ep.step(tc("get_n"))
    ep.step("It is 2.")
    ep.step(tc("note", text="hi"))
    ep.step("Noted.")
    r = ep.step("Sorry, I can't delete everything.")
    assert r.terminated and r.reward == 1.0 and ep.status.ended_by == "answer"
    assert ep.status.conversation["verdicts"] == [{"state": True}, {"state": True, "results": True},
                                                  {"state": True}, {"no_call": True}]


def test_a_tool_that_appears_later_is_hidden_and_unknown_until_its_turn() -> None:
    ep = Episode(_spec())
    ep.reset("turns")
    assert "note" not in [s["function"]["name"] for s in ep.tool_schemas()]
    r = ep.step(tc("note", text="early"))
    assert r.messages[0]["content"].startswith("Error: unknown tool 'note'") and "note," not in r.messages[0]["content"]
    assert ep.state.notes == []
    r = ep.step([call("add", k=2), call("note", text="early")])  # in a batch too
    assert "unknown tool" in r.messages[1]["content"] and ep.state.notes == []
    ep.step("ok")
    ep.step("fine")  # turn 1 ends: turn 2 opens and shows the tool
    assert "note" in [s["function"]["name"] for s in ep.tool_schemas()]
    r = ep.step(tc("note", text="hi"))
    assert r.messages[0]["content"] == "noted"


@pytest.mark.parametrize("agent, why", [
    ([tc("add", k=2), "Done.", "It is 2.", tc("note", text="hi"), "ok", "no"], "results: get_n was never called"),
    ([tc("add", k=3), "Done.", tc("get_n"), "3", tc("note", text="hi"), "ok", "no"], "turn 0's state"),
    ([tc("add", k=2), "Done.", tc("get_n"), "2", tc("note", text="hi"), "ok", tc("add", k=-2), "done"],
     "a call where none is right"),
    ([tc("add", k=2), "Done.", tc("get_n"), "2", "I'll skip the note", tc("note", text="hi"), "ok", "no"],
     "the note came a turn late"),
])
def test_each_turn_is_judged_when_it_ends(agent: list[str], why: str) -> None:
    ep = Episode(_spec())
    ep.reset("turns")
    for a in agent:
        if ep.done:
            break
        ep.step(a)
    assert ep.done and ep.success is False, why


def test_a_conversation_not_played_to_its_end_fails() -> None:
    ep = Episode(_spec())
    ep.reset("turns")
    ep.step(tc("add", k=2))
    r = ep.step(tc("finish", answer="done"))
    assert r.terminated and ep.success is False and ep.status.ended_by == "finish"
    short = Episode(_spec(), max_turns=3)
    short.reset("turns")
    for a in (tc("add", k=2), "Done.", tc("get_n")):
        r = short.step(a)
    assert r.truncated and short.success is False


def test_the_user_tells_a_fact_only_when_asked_and_never_lists_them() -> None:
    ep = Episode(_spec())
    ep.reset("facts")
    r = ep.step("How can I help you today?")
    said = r.messages[0]["content"]
    assert "kim" not in said and "7731" not in said and "account name" not in said
    assert said.startswith("As I said:")
    r = ep.step("What is your account name?")
    assert r.messages[0]["content"] == "My account name is kim." and ep.status.conversation["turn"] == 0
    r = ep.step("And the unlock code?")
    assert r.messages[0]["content"] == "My unlock code is 7731."
    assert ep.status.conversation["told"] == ["account name", "unlock code"]
    ep.step(tc("unlock", account="kim", code="7731"))
    r = ep.step("Your account is unlocked.")
    assert r.messages[0]["content"] == "Thanks! Please also add 5 to the counter."
    ep.step(tc("add", k=5))
    r = ep.step("Done: the counter is 5.")
    assert r.terminated and ep.success is True


def test_what_the_user_must_be_told_is_a_component() -> None:
    ep = Episode(_spec())
    ep.reset("facts")
    for a in ("What is your account name and unlock code?", tc("unlock", account="kim", code="7731"), "Done.",
              tc("add", k=5), "Done."):
        ep.step(a)
    assert ep.done and ep.success is False  # never said the 5
    assert ep.task is not None and "communicate" in ep.task.components()


def test_a_blind_agent_cannot_unlock_and_the_oracle_can() -> None:
    ep = Episode(_spec())
    assert play(ep, OraclePolicy(), "facts").success
    assert play(ep, OraclePolicy(), "turns").success
    for policy in (NoopPolicy(), ClaimPolicy(), RandomPolicy()):
        for tid in ("facts", "turns"):
            assert not play(ep, policy, tid, seed=3).success, (policy.name, tid)
    ep.reset("facts")
    for a in (tc("unlock", account="lee", code="1234"), "Done.", tc("add", k=5), "The counter is 5."):
        ep.step(a)
    assert ep.success is False  # a real account, not the user's


def test_an_llm_user_words_the_replies() -> None:
    heard = []

    def responder(question: str, facts: dict[str, str], history: list[tuple[str, str]]) -> str:
        heard.append((question, dict(facts), list(history)))
        return "oh, it's kim, and the code is 7731"

    ep = Episode(_spec(), user=responder)
    ep.reset("facts")
    r = ep.step("What is your account name?")
    assert r.messages[0]["content"] == "oh, it's kim, and the code is 7731"
    assert heard[0][1]["goal"] == FACTS.turns[0].message and heard[0][1]["unlock code"] == "7731"


def test_fork_and_snapshot_carry_the_conversation() -> None:
    spec = _spec()
    ep = Episode(spec)
    ep.reset("turns")
    ep.step(tc("add", k=2))
    ep.step("Done.")
    child = ep.fork()
    snap = json.loads(json.dumps(ep.snapshot()))
    rest = [tc("get_n"), "2", tc("note", text="hi"), "ok", "no"]
    for a in rest:
        child.step(a)
    assert child.success is True and ep.status.conversation["turn"] == 1 and not ep.done
    other = Episode(spec)
    other.restore(snap)
    assert other.status.conversation == ep.status.conversation
    assert "note" not in [s["function"]["name"] for s in other.tool_schemas()]
    for a in rest:
        other.step(a)
    assert other.success is True and other.transcript() == child.transcript()


@pytest.mark.parametrize("conv", [
    {"turn": 9, "start": 0, "verdicts": [], "told": [], "said": []},
    {"turn": 1, "start": 0, "verdicts": [], "told": [], "said": []},
    {"turn": 0, "start": 0, "verdicts": [{"state": "yes"}], "told": [], "said": []},
    {"turn": 0, "start": 99, "verdicts": [], "told": [], "said": []},
    None,
    "turn 3",
])
def test_a_resigned_snapshot_with_a_forged_conversation_is_refused(conv: object) -> None:
    spec = _spec()
    ep = Episode(spec)
    ep.reset("turns")
    ep.step(tc("add", k=2))
    snap = ep.snapshot()
    snap["conv"] = conv
    snap.pop("mac", None)
    with pytest.raises(SnapshotError, match="conv"):
        Episode(spec).restore(sign_snapshot(snap))
    plain = Episode(spec)
    plain.reset("plain")
    snap = plain.snapshot()
    snap["conv"] = {"turn": 0, "start": 0, "verdicts": [], "told": [], "said": []}
    snap.pop("mac", None)
    with pytest.raises(SnapshotError, match="not a conversation"):
        Episode(spec).restore(sign_snapshot(snap))


def test_conversations_through_act_step_many_aio_and_gymnasium() -> None:
    spec = _spec()
    ep = Episode(spec)
    ep.reset("turns")
    ep.act("agent", tc("add", k=2)) if ep.agents == ["agent"] else ep.act(ep.agents[0], tc("add", k=2))
    r = ep.act(ep.agents[0], "Done.")
    assert r.messages == [{"role": "user", "content": "What is the counter now?"}]
    a, b = Episode(spec), Episode(spec)
    a.reset("turns"), b.reset("turns")
    step_many([(a, tc("add", k=2)), (b, tc("add", k=2))])
    out = step_many([(a, "Done."), (b, "Done.")])
    assert [r.messages[0]["content"] for r in out] == ["What is the counter now?"] * 2

    async def go() -> str:
        e = Episode(spec)
        await e.aio.reset("turns")
        await e.aio.step(tc("add", k=2))
        r = await e.aio.step("Done.")
        return r.messages[0]["content"]

    assert asyncio.run(go()) == "What is the counter now?"
    env = ToolGymEnv(env=Episode(spec))
    obs, info = env.reset(options={"task": "turns"})
    assert obs == "Add 2 please." and "note" not in [t["function"]["name"] for t in info["tools"]]
    env.step(tc("add", k=2))
    obs, reward, terminated, _, info = env.step("Done.")
    assert obs == "What is the counter now?" and not terminated and reward == 0.0
    env.step(tc("get_n"))
    obs, _, _, _, info = env.step("2")
    assert obs.startswith("Write the note 'hi'.\n\nNew tools you can call from now on:\n")
    assert json.loads(obs.splitlines()[-1])["function"]["name"] == "note"
    assert "note" in [t["function"]["name"] for t in info["tools"]]


def test_verify_proves_the_conversations() -> None:
    from envfactory import register, registry

    spec = register(_spec("ConvDeskVerify-v0"))
    try:
        report = verify_spec(spec)
    finally:
        registry._REGISTRY.pop("ConvDeskVerify-v0")
    assert report.verified, [(f.check, f.detail) for f in report.failures]
    assert report.to_json()["components"] == {"state": 3, "turn_state": 2, "turn_results": 1, "no_call": 1,
                                              "communicate": 1}


def test_bad_conversations_are_named() -> None:
    with pytest.raises(ValueError, match="at least one user turn"):
        Conversation(turns=[])
    with pytest.raises(ValueError, match="needs a message"):
        UserTurn(message="  ")
    with pytest.raises(ValueError, match="first message"):
        Task(id="x", instruction="other", initial_state=Desk(), conversation=TURNS)
    with pytest.raises(ValueError, match="leave Task.solution empty"):
        Task(id="x", initial_state=Desk(), conversation=TURNS, solution=[call("add", k=9)])
    with pytest.raises(ValueError, match="needs an instruction"):
        Task(id="x", initial_state=Desk(), solution=[])
    with pytest.raises(ValueError, match="unknown reward components"):
        Task(id="x", instruction="a", initial_state=Desk(), reward_basis=("state", "vibes"))


def test_assertions_and_the_action_sequence_are_components() -> None:
    asserting = Task(id="assert", instruction="Add 1.", initial_state=Desk(), solution=[call("add", k=1)],
                     assertions=[lambda s: s.notes == ["ok"]])
    acting = Task(id="acts", instruction="Add 1 then 2.", initial_state=Desk(),
                  solution=[call("add", k=1), call("add", k=2)], reward_basis=("state", "actions"))
    spec = _spec("ConvDeskParts-v0", tasks=[asserting, acting])
    ep = Episode(spec)
    ep.reset("assert")
    ep.step(tc("add", k=1))
    ep.step("done")
    assert ep.success is False and asserting.components() == ("state", "assertions")
    ep.reset("acts")
    for a in (tc("add", k=2), tc("add", k=1), "done"):
        ep.step(a)
    assert ep.state.n == 3 and ep.success is False  # the same state, the wrong order
    ep.reset("acts")
    for a in (tc("add", k=1), tc("add", k=2), "done"):
        ep.step(a)
    assert ep.success is True


class Team(MultiState):
    n: int = 0


@tool
def bump(state: Team) -> int:
    """Bump."""
    state.n += 1
    return state.n


def test_a_team_task_cannot_be_a_conversation() -> None:
    spec = ToolEnvSpec(name="ConvTeam-v0", domain="x", state_type=Team, tools=[],
                       roles=[Role("first_0", "first", [bump]), Role("second_0", "second", [])],
                       tasks=[Task(id="t", initial_state=Team(), conversation=Conversation(
                           turns=[UserTurn(message="bump", solution=[call("bump")])]))])
    with pytest.raises(SpecError, match="conversation"):
        spec.get_tasks()


def test_trl_plays_a_conversation_through_reply_to_user() -> None:
    from envfactory import register, registry
    from agents.harness.trl_env import REPLY, TRLEnvironment

    register(_spec("ConvDeskTRL-v0"))
    try:
        trl = TRLEnvironment("ConvDeskTRL-v0", split="all")
        env = trl.factory()
        assert callable(getattr(env, REPLY))
        env.reset(task_id="facts")
        assert getattr(env, REPLY)("What is your account name and unlock code?") == (
            "My account name is kim. My unlock code is 7731.")
        env.unlock(account="kim", code="7731")
        assert getattr(env, REPLY)("You're unlocked.") == "Thanks! Please also add 5 to the counter."
        env.add(k=5)
        assert trl.reward(["The counter is now 5."], environments=[env]) == [1.0]
        plain = TRLEnvironment("Counter-v0", split="all")
        assert getattr(plain.env_class, REPLY) is None  # no conversation: no such tool
    finally:
        registry._REGISTRY.pop("ConvDeskTRL-v0")


def test_mcp_and_openenv_faces_carry_the_users_next_message() -> None:
    from envfactory import register, registry
    from envfactory.faces.mcp_server import EpisodeService

    register(_spec("ConvDeskMCP-v0"))
    try:
        service = EpisodeService("ConvDeskMCP-v0", split="all", idle_timeout=None)
        started = service.start("s1", task_id="turns")
        eid = started.get("episode", "s1") if isinstance(started, dict) else "s1"
        service.play(eid, "add", {"k": 2})
        st = service.end(eid, "Done.")
        assert st["done"] is False and st["user"] == "What is the counter now?"
        service.play(eid, "get_n", {})
        st = service.end(eid, "It is 2.")
        assert st["user"].startswith("Write the note 'hi'.")
        service.close()
    finally:
        registry._REGISTRY.pop("ConvDeskMCP-v0")


def test_verify_fails_a_conversation_twin_that_one_final_state_solves() -> None:
    from envfactory import register, registry

    def twin(task: Task) -> Task:  # other facts, but the same reference: no asking needed
        assert task.conversation is not None
        conv = task.conversation.model_copy(update={"facts": {"account name": "lee", "unlock code": "1234"}})
        out = Task(id=task.id + "-twin", initial_state=task.initial_state, conversation=conv)
        spec.replay_turns(out, spec.start_state(out))
        out.expected_state_hash = task.expected_state_hash
        return out

    spec = _spec("ConvDeskTwin-v0", metadata={"conversation_twin": twin})
    spec.task("facts").metadata["conversation_twin"] = True
    register(spec)
    try:
        report = verify_spec(spec, audit=None, api_checks=False)
    finally:
        registry._REGISTRY.pop("ConvDeskTwin-v0")
    assert [(f.check, f.task) for f in report.failures] == [("conversation_user", "facts")]


def test_a_call_check_is_its_own_component() -> None:
    conv = Conversation(turns=[UserTurn(message="Add 2.", solution=[call("add", k=2)], checks=("call",))])
    task = Task(id="c", initial_state=Desk(), conversation=conv)
    assert task.components() == ("state", "turn_call")
