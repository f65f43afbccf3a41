"""Environments worth training on (issue 16): goal-level task kinds, simulated users, a
difficulty knob with an endless task supply, composed (multi-service) environments, and
what verify reports about them."""

from __future__ import annotations

import re

import itertools
import json
import statistics
from pathlib import Path

import pytest

import envfactory
from envfactory import SpecError
from envfactory.checks.scripted import OraclePolicy, TranscriberPolicy, play
from envfactory.factory.from_spec import specs_from_file
from envfactory.state import copy_state
from envfactory.users import CONFIRM, USER_TOOL, scripted_reply, user_facts
from envfactory.checks.verify import verify_spec

GOAL_KINDS = ("lookup", "conditional", "policy", "answer", "user")


def _tasks(name: str, kind: str) -> list:
    return [t for t in envfactory.spec(name).get_tasks() if t.metadata.get("kind") == kind]


def _run(spec, task, calls, answer: str = "Done."):
    """The final state and success of ``calls`` (ToolCalls) played on ``task``'s world."""
    state = spec.start_state(task)
    for c in calls:
        spec.tools_of()[c.name].invoke(state, c.arguments)
    return state, task.success(state, answer)


@pytest.mark.parametrize("name", ["RetailOrders-v1", "Telecom-v0", "Loans-v0"])
def test_every_goal_kind_is_made_solved_by_its_reference_and_names_no_target_id(name):
    spec = envfactory.spec(name)
    kinds = {t.metadata.get("kind") for t in spec.get_tasks()}
    assert set(GOAL_KINDS) <= kinds and "steps" in kinds, kinds
    ep = envfactory.make(name)
    for kind in GOAL_KINDS:
        for task in _tasks(name, kind)[:4]:
            out = play(ep, OraclePolicy(), task.id)
            assert out.success and out.reward == 1.0, (task.id, out.ended_by, out.errors)
            writes = [c for c in task.solution if not spec.tools_of()[c.name].read_only]
            ids = [v for c in writes for k, v in c.arguments.items() if k.endswith("_id")]
            assert ids or kind == "answer"
            # the rows to act on are named by what they are, never by id: they must be looked up
            assert not any(str(i) in task.instruction for i in ids), task.instruction


def test_the_transcriber_solves_no_goal_level_task():
    policy = TranscriberPolicy()
    for name in ("RetailOrders-v1", "Telecom-v0", "TravelDesk-v0"):
        spec = envfactory.spec(name)
        tools = spec.tools_of()
        goal = [t for t in spec.get_tasks() if t.metadata["kind"] != "steps"]
        solved = 0
        for task in goal:
            plan = policy.plan(task, spec.tool_schemas(), {n for n, t in tools.items() if t.read_only})
            solved += _run(spec, task, [c for c in plan if not tools[c.name].finish])[1]
        assert len(goal) >= 40 and solved <= 0.1 * len(goal), (name, solved, len(goal))


def test_lookup_fails_when_a_distractor_row_is_also_changed():
    spec = envfactory.spec("RetailOrders-v1")
    tried = 0
    for task in [t for t in _tasks("RetailOrders-v1", "lookup") if len(t.solution) >= 3][:6]:
        act = task.solution[-1]
        assert _run(spec, task, task.solution)[1]
        # the same action on every row of the table that it applies to: the unasked ones must stay
        entity = next(k[: -len("_id")] for k in act.arguments if k.endswith("_id"))
        state = spec.start_state(task)
        for c in task.solution:
            spec.tools_of()[c.name].invoke(state, c.arguments)
        extra = [k for k in state.tables[entity] if spec.tools_of()[act.name].invoke(
            copy_state(state), {**act.arguments, f"{entity}_id": k}).ok]
        if not extra:
            continue  # this world has no distractor the action could reach
        spec.tools_of()[act.name].invoke(state, {**act.arguments, f"{entity}_id": extra[0]})
        assert not task.success(state, "Done.")
        tried += 1
    assert tried, "no lookup task has a distractor the action could reach"


def test_conditional_branches_on_values_only_a_tool_shows():
    spec = envfactory.spec("Telecom-v0")
    tasks = _tasks("Telecom-v0", "conditional")
    assert tasks
    for task in tasks:
        acts = [c.name for c in task.solution if not spec.tools_of()[c.name].read_only]
        assert len(set(acts)) == 2, (task.instruction, acts)  # both branches occur
        # a condition and its alternative, in whichever of the kind's frames (envfactory/factory/tasks/realize.py)
        assert re.search(r"\b(if|when|where)\b", task.instruction, re.IGNORECASE) and (
            re.search(r"\b(otherwise|if not|the rest|everywhere else|when)\b", task.instruction, re.IGNORECASE)
            or len(re.findall(r"\bif\b", task.instruction, re.IGNORECASE)) >= 2), task.instruction  # "..., and if ..."


def test_policy_tasks_obey_the_written_policy_and_a_violation_fails():
    spec = envfactory.spec("RetailOrders-v1")
    prompt = spec.render_system_prompt()
    assert spec.metadata["policies"] and all(p in prompt for p in spec.metadata["policies"])
    task = next(t for t in _tasks("RetailOrders-v1", "policy") if t.metadata["refused"] >= 1)
    assert _run(spec, task, task.solution)[1]
    # doing everything that was asked, forbidden rows included, breaks the policy and fails
    query = next(c for c in task.solution if spec.tools_of()[c.name].read_only and c.name.startswith("search"))
    act = next(c for c in task.solution if not spec.tools_of()[c.name].read_only)
    entity = next(k[: -len("_id")] for k in act.arguments if k.endswith("_id"))
    state = spec.start_state(task)
    listed = spec.tools_of()[query.name].invoke(state, query.arguments).content
    everything = [c for c in task.solution if c is not act and c.name != act.name] + [
        envfactory.ToolCall(act.name, {**act.arguments, f"{entity}_id": line.split(":")[0].split()[-1]})
        for line in listed.splitlines()]
    assert len(everything) > len(task.solution)
    assert not _run(spec, task, everything)[1]


def test_answer_tasks_judge_the_answer_and_a_list_of_candidates_earns_nothing():
    spec = envfactory.spec("Telecom-v0")
    for task in _tasks("Telecom-v0", "answer"):
        fact = task.answer_facts[0]
        assert _run(spec, task, task.solution, f"The answer is {fact}.")[1]
        assert not _run(spec, task, task.solution, "Done.")[1]  # no-op answer: nothing
        if task.answer_rivals:
            listing = " ".join([fact] + list(task.answer_rivals))
            assert not _run(spec, task, task.solution, listing)[1], task.instruction


# -- simulated users --------------------------------------------------------------------------
def test_scripted_user_tells_what_it_is_asked_and_nothing_else():
    facts = {"name": "Kim", "order id": "O-7"}
    assert scripted_reply("What's your name, please?", facts) == "My name is Kim."
    assert scripted_reply("Which ORDER is it?", facts) == "My order id is O-7."
    hint = scripted_reply("How are you?", facts)
    assert "Kim" not in hint and "O-7" not in hint  # never a fact, nor (issue 61) which facts it holds
    assert "name" not in hint and "order" not in hint
    assert "nothing" in scripted_reply("anything?", {})


def test_a_user_task_is_unsolvable_without_asking_and_solvable_with_it():
    name = "RetailOrders-v1"
    spec = envfactory.spec(name)
    task = _tasks(name, "user")[0]
    facts = user_facts(task.initial_state)
    assert facts and all(v not in task.instruction for v in task.initial_state.user.values())
    assert task.solution[0].name == USER_TOOL
    # with the asking, through a real episode: solved
    ep = envfactory.make(name)
    assert play(ep, OraclePolicy(), task.id).success
    # the twin sees the same instruction and the same tables; only the user differs
    twin = spec.metadata["user_task"](task, task.initial_state.model_copy(update={"user": task.metadata["user_twin"]}))
    assert twin.instruction == task.instruction
    assert twin.initial_state.tables == task.initial_state.tables
    # an agent that never asks acts the same in both worlds, so it can solve at most one:
    # the task's own calls (without the question) fail the twin, the twin's fail the task
    # (a user who must confirm refuses both: the silent agent then solves neither)
    silent = [c for c in task.solution if c.name != USER_TOOL]
    twin_silent = [c for c in twin.solution if c.name != USER_TOOL]
    confirms = CONFIRM in task.initial_state.user
    assert _run(spec, task, silent)[1] is not confirms and not _run(spec, twin, silent)[1]
    assert _run(spec, twin, twin_silent)[1] is not confirms and not _run(spec, task, twin_silent)[1]
    # and verify's user check holds for the family; a twin that is the task itself is caught
    report = verify_spec(spec, audit=None, api_checks=False, random_episodes=0)
    assert "user" in report.checks and report.verified, report.to_json()["failures"][:3]
    from envfactory.checks.verify import _user_twins

    broken = task.model_copy(update={"metadata": {**task.metadata, "user_twin": dict(facts)}})
    assert [f.check for f in _user_twins(spec, [broken])] == ["user"]


def test_an_llm_user_answers_on_the_host_and_its_failures_are_observations():
    name = "RetailOrders-v1"
    task = _tasks(name, "user")[0]
    heard = []

    def user(question, facts, history):
        heard.append((question, dict(facts), list(history)))
        return f"I am {facts['name']}."

    ep = envfactory.make(name, user=user)
    ep.reset(task=task.id)
    ask = '<tool_call>{"name": "ask_user", "arguments": {"question": "Who are you?"}}</tool_call>'
    assert ep.step(ask).messages[0]["content"] == f"I am {task.initial_state.user['name']}."
    assert ep.step(ask).messages[0]["content"].startswith("I am")
    assert heard[1][2] == [("Who are you?", f"I am {task.initial_state.user['name']}.")]  # the history
    bad = ep.step('<tool_call>{"name": "ask_user", "arguments": {"q": 1}}</tool_call>').messages[0]["content"]
    assert bad.startswith("Error") and len(heard) == 2  # invalid arguments never reach the user

    def broken(question, facts, history):
        raise RuntimeError("model server down")

    ep2 = envfactory.make(name, user=broken)
    ep2.reset(task=task.id)
    r = ep2.step(ask)
    assert "model server down" in r.messages[0]["content"] and not r.done
    ep.close(), ep2.close()


@pytest.mark.slow
def test_llm_user_over_a_policy_backend():
    pytest.importorskip("torch")
    from agents.policies.hf_policy import HFPolicy
    from agents.policies.users import LLMUser

    user = LLMUser(HFPolicy(None), max_new_tokens=12, temperature=0.0)
    msgs = user.messages("What is your name?", {"name": "Kim"}, [("hi", "hello")])
    assert "Kim" in msgs[0]["content"] and [m["role"] for m in msgs] == ["system", "user", "assistant", "user"]
    ep = envfactory.make("RetailOrders-v1", user=user)
    task = _tasks("RetailOrders-v1", "user")[0]
    ep.reset(task=task.id)
    first = ep.step('<tool_call>{"name": "ask_user", "arguments": {"question": "Your name?"}}</tool_call>')
    again = envfactory.make("RetailOrders-v1", user=user)
    again.reset(task=task.id)
    second = again.step('<tool_call>{"name": "ask_user", "arguments": {"question": "Your name?"}}</tool_call>')
    assert first.messages[0]["content"] == second.messages[0]["content"]  # replies are seeded
    assert isinstance(first.messages[0]["content"], str)


# -- the difficulty knob -----------------------------------------------------------------------
@pytest.mark.parametrize("name", ["RetailOrders-v1", "Telecom-v0", "TravelDesk-v0"])
def test_difficulty_raises_reference_length_and_table_size_monotonically(name):
    means, sizes = [], []
    for d in range(1, 6):
        tasks = list(itertools.islice(envfactory.task_supply(name, d, seed=0), 30))
        assert all(t.metadata["difficulty"] == d for t in tasks)
        means.append(statistics.mean(len(t.solution) for t in tasks))
        sizes.append(statistics.mean(sum(len(r) for r in t.initial_state.tables.values()) for t in tasks))
    assert all(a < b for a, b in zip(means, means[1:])), means
    assert all(a < b for a, b in zip(sizes, sizes[1:])), sizes


def test_task_supply_is_endless_seeded_and_every_task_is_solvable():
    spec = envfactory.spec("Loans-v0")
    a = list(itertools.islice(envfactory.task_supply("Loans-v0", 3, seed=7), 25))
    b = list(itertools.islice(envfactory.task_supply("Loans-v0", 3, seed=7), 25))
    c = list(itertools.islice(envfactory.task_supply("Loans-v0", 3, seed=8), 25))
    assert [t.instruction for t in a] == [t.instruction for t in b]
    assert [t.instruction for t in a] != [t.instruction for t in c]
    assert len({t.id for t in a}) == 25 and not {t.id for t in a} & {t.id for t in spec.get_tasks()}
    ep = envfactory.make("Loans-v0")
    for t in a:  # a supplied task plays in a real episode like a registered one
        assert play(ep, OraclePolicy(), t).success, t.id
    only = list(itertools.islice(envfactory.task_supply("Loans-v0", 2, kinds=["user"]), 5))
    assert {t.metadata["kind"] for t in only} == {"user"}
    with pytest.raises(ValueError, match="difficulty"):
        envfactory.task_supply("Loans-v0", 9)
    with pytest.raises(ValueError, match="no procedural task supply"):
        envfactory.task_supply("FileSystem-v0")



def test_a_kind_the_family_cannot_make_is_reported_not_searched_forever(tmp_path: Path):
    base = (Path(__file__).parents[1] / "environments" / "specs" / "retail.yaml").read_text()
    never = tmp_path / "never.yaml"  # a policy no seeded order can break: no policy task exists
    never.write_text(base.replace("tasks: {kinds: [steps]}", "tasks: {kinds: all}").split("# the written")[0]
                     + "policies: [{operation: ship_order, field: quantity, above: 100}]\n")
    supply = specs_from_file(never)[0].metadata["supply"]
    assert next(supply(2, 0, ["lookup"])).metadata["kind"] == "lookup"
    with pytest.raises(RuntimeError, match="no policy task"):
        next(supply(2, 0, ["policy"]))


# -- composed files, spec errors, registration --------------------------------------------------
def test_a_composed_environment_spans_two_services():
    spec = envfactory.spec("TravelDesk-v0")
    tables = spec.get_tasks()[0].initial_state.tables
    assert {"flight", "booking", "guest", "room"} <= set(tables)
    multi = _tasks("TravelDesk-v0", "multi_service")
    assert len(multi) >= 5
    flights = {op for op in ("search_flights", "cancel_booking", "change_cabin", "add_miles", "get_booking",
                             "list_bookings", "find_travellers", "get_traveller")}
    for task in multi:
        names = {c.name for c in task.solution}
        assert names & flights and names - flights, names  # tools of both services
        assert len(task.metadata["services"]) == 2


def test_composed_names_that_clash_are_prefixed(tmp_path: Path):
    specs_dir = Path(__file__).parents[1] / "environments" / "specs"
    (tmp_path / "twice.yaml").write_text(
        f"name: Twice-v0\ndomain: twice\nservices: [{specs_dir / 'retail.yaml'}, {specs_dir / 'car_rental.yaml'}]\n")
    spec = specs_from_file(tmp_path / "twice.yaml")[0]
    assert "customer" in spec.get_tasks()[0].initial_state.tables
    assert "car_rental_customer" in spec.get_tasks()[0].initial_state.tables
    assert "car_rental_find_customers" in spec.all_tools or "find_customers" in spec.all_tools


def test_bad_spec_files_are_named_errors(tmp_path: Path):
    base = (Path(__file__).parents[1] / "environments" / "specs" / "retail.yaml").read_text()
    bad_kind = tmp_path / "k.yaml"
    bad_kind.write_text(base.replace("tasks: {kinds: [steps]}", "tasks: {kinds: [telepathy]}"))
    with pytest.raises(SpecError, match="telepathy"):
        specs_from_file(bad_kind)
    bad_policy = tmp_path / "p.yaml"
    bad_policy.write_text(base + "policies: [{operation: fly_away, field: quantity, above: 2}]\n")
    with pytest.raises(SpecError, match="fly_away"):
        specs_from_file(bad_policy)
    missing = tmp_path / "c.yaml"
    missing.write_text("name: Gone-v0\ndomain: x\nservices: [nope.yaml, other.yaml]\n")
    with pytest.raises(SpecError, match="service file 'nope.yaml' not found"):
        specs_from_file(missing)


def test_v0_families_keep_their_published_tasks():
    """The first-published families (in the tokenizer's pinned corpus) keep step-by-step tasks
    only; their goal-level twin is the -v1 variant of the same world."""
    v0, v1 = envfactory.spec("RetailOrders-v0"), envfactory.spec("RetailOrders-v1")
    assert all("kind" not in t.metadata for t in v0.get_tasks())
    assert "ask_user" not in v0.all_tools and "ask_user" in v1.all_tools
    assert v0.render_system_prompt() != v1.render_system_prompt()


def test_verify_reports_reference_lengths_per_kind_and_difficulty_against_the_depth_goals(capsys):
    from envfactory.cli import main

    assert main(["verify", "RetailOrders-v1", "TravelDesk-v0", "--json", "--no-audit", "--workers", "1"]) == 0
    doc = json.loads(capsys.readouterr().out)
    tasks = [t for n in ("RetailOrders-v1", "TravelDesk-v0") for t in envfactory.spec(n).get_tasks()]
    totals = doc["totals"]
    for kind in {t.kind for t in tasks}:  # per kind: mean and max reference length, from the tasks themselves
        lens = [len(t.solution) for t in tasks if t.kind == kind]
        got = totals["kinds"][kind]
        assert got["tasks"] == len(lens) and got["max_len"] == max(lens), (kind, got)
        assert got["mean_len"] == pytest.approx(statistics.mean(lens), abs=0.01)
        assert got["long"] == sum(n >= 10 for n in lens)
    hard = [len(t.solution) for t in tasks if t.difficulty >= 4]
    depth = totals["depth"]
    assert depth["hard_tasks"] == len(hard) > 0 and depth["hard_long"] == sum(n >= 10 for n in hard)
    assert depth["hard_long_share"] == pytest.approx(depth["hard_long"] / len(hard), abs=1e-3)
    assert depth["goals"] == {"goal_level_mean_len": 6.0, "hard_long_share": 0.2}
    assert depth["met"]["hard_long_share"] == (depth["hard_long_share"] >= 0.2)
    assert depth["goal_level_mean_len"] == totals["kinds"]["goal_level"]["mean_len"]
    stated = [len(t.solution) for t in tasks if t.metadata.get("difficulty", 0) >= 4]
    assert depth["stated"]["hard_tasks"] == len(stated) and depth["stated"]["hard_long"] == sum(n >= 10 for n in stated)
    assert sum(d["tasks"] for d in totals["difficulty"].values()) == len(tasks)
    for e in doc["environments"]:  # and each environment's own figures add up to the totals
        assert sum(d["tasks"] for d in e["difficulty"].values()) == e["tasks"]
    assert main(["verify", "RetailOrders-v1", "--no-audit", "--workers", "1"]) == 0
    assert "tasks of difficulty >= 4 need >= 10 calls" in capsys.readouterr().out


def test_verify_reports_kinds_lengths_and_the_transcriber_by_kind(capsys):
    from envfactory.cli import main

    assert main(["verify", "RetailOrders-v1", "TravelDesk-v0", "--json", "--workers", "2"]) == 0
    doc = json.loads(capsys.readouterr().out)
    names = [e["name"] for e in doc["environments"]]
    assert names == ["RetailOrders-v1", "TravelDesk-v0"]  # in the order asked, from two workers
    kinds = doc["totals"]["kinds"]
    assert {"lookup", "policy", "user", "multi_service", "goal_level"} <= set(kinds)
    assert kinds["goal_level"]["mean_len"] >= 3 and kinds["goal_level"]["max_len"] >= 5
    for e in doc["environments"]:
        assert e["verified"] and e["kinds"], e["failures"]
        assert e["audit"]["transcriber"]["by_kind"]
    by_kind = doc["audit"]["transcriber"]["by_kind"]
    assert by_kind["goal_level"]["tasks"] > 80 and by_kind["goal_level"]["rate"] <= 0.1


# -- a curriculum over the supply ------------------------------------------------------------------
def test_curriculum_promotes_on_success_and_draws_fresh_seeded_tasks():
    from agents.curriculum import Curriculum

    cur = Curriculum(start=1, top=3, promote_at=0.5, patience=2)
    cur.bind([envfactory.make("Loans-v0"), envfactory.make("Telecom-v0")])
    first = cur.draw(4)
    assert [e.spec.name for e, _ in first] == ["Loans-v0", "Telecom-v0"] * 2
    assert all(t.metadata["difficulty"] == 1 for _, t in first)
    registered = {t.id for t in envfactory.spec("Loans-v0").get_tasks()}
    assert not registered & {t.id for _, t in first}  # never a registered (so never an eval) task
    assert cur.observe(0.9) is False and cur.observe(0.2) is False and cur.observe(0.6) is False
    assert cur.observe(0.7) is True and cur.level == 2  # two in a row at 0.5 or more
    assert all(t.metadata["difficulty"] == 2 for _, t in cur.draw(2))
    saved = cur.state_dict()
    nxt = [t.instruction for _, t in cur.draw(3)]
    again = Curriculum(start=1, top=3, promote_at=0.5, patience=2)
    again.bind([envfactory.make("Loans-v0"), envfactory.make("Telecom-v0")])
    again.load_state_dict(saved)
    assert [t.instruction for _, t in again.draw(3)] == nxt  # a resumed run draws the same tasks
    for _ in range(4):
        cur.observe(1.0)
    assert cur.level == 3  # never past top
    with pytest.raises(ValueError, match="no procedural task supply"):
        Curriculum().bind([envfactory.make("FileSystem-v0")])


@pytest.mark.slow
def test_trainer_runs_a_curriculum_and_checkpoints_it(tmp_path):
    torch = pytest.importorskip("torch")
    from agents.algorithms.objectives import GRPO
    from agents.curriculum import Curriculum
    from agents.policies.hf_policy import HFPolicy
    from agents.models.tiny import build_tiny_model
    from agents.train_config import OptimConfig, OutputConfig, SamplingConfig, TrainerConfig
    from agents.trainer import Trainer

    torch.manual_seed(0)
    cur = Curriculum(start=2, promote_at=0.5, patience=1)
    cfg = TrainerConfig(algorithm=GRPO(M=2), sampling=SamplingConfig(max_new_tokens=8, max_turns=1),
                        optim=OptimConfig(lr=1e-3, tasks_per_step=1),
                        output=OutputConfig(dir=str(tmp_path), show_progress=False))
    trainer = Trainer(HFPolicy(build_tiny_model(), device="cpu"), ["Loans-v0"], cfg,
                      reward_fn=lambda t: float(t.response_ids[0] % 2), curriculum=cur)
    rows = trainer.train(2)
    # the untrained model solves nothing: it stays at difficulty 2, on two fresh supplied tasks
    assert [(r["difficulty"], r["promoted"], r["success"]) for r in rows] == [(2, False, 0.0)] * 2
    assert cur.drawn == {"Loans-v0/2": 2}
    state = json.loads((tmp_path / "checkpoints" / "step-2" / "trainer_state.json").read_text())
    assert state["curriculum"] == {"level": 2, "recent": [0.0], "drawn": {"Loans-v0/2": 2}}


def test_cli_tasks_synth_draws_from_the_supply(capsys):
    from envfactory.cli import main

    assert main(["tasks", "synth", "Loans-v0", "--difficulty", "4", "--kinds", "lookup,user", "--n", "4",
                 "--json"]) == 0
    docs = json.loads(capsys.readouterr().out)
    assert [d["kind"] for d in docs] == ["lookup", "user", "lookup", "user"]
    assert {d["difficulty"] for d in docs} == {4}
    assert main(["tasks", "synth", "Bank-v0", "--difficulty", "2", "--json"]) == 2
    assert "no procedural task supply" in json.loads(capsys.readouterr().out)["error"]


def test_only_people_play_the_user(tmp_path: Path):
    """A room or an event never says "Hi, I'm a room here": the user is a row of a person-like
    entity (by name or label, or the spec's ``person:`` flag)."""
    import re as _re

    for name in ("Calendar-v1", "Recipes-v1", "Events-v1", "Mailbox-v1"):
        for t in _tasks(name, "user"):
            who = _re.match(r"Hi, I'm an? (.+?) here", t.instruction).group(1)
            assert who not in ("room", "ingredient", "event", "folder", "department", "plan"), (name, who)
    base = (Path(__file__).parents[1] / "environments" / "specs" / "retail.yaml").read_text()
    nobody = tmp_path / "nobody.yaml"
    nobody.write_text(base.replace("tasks: {kinds: [steps]}", "tasks: {kinds: all}")
                      .replace("  customer:\n    id_prefix: C-", "  customer:\n    person: false\n    id_prefix: C-"))
    supply = specs_from_file(nobody)[0].metadata["supply"]
    with pytest.raises(RuntimeError, match="no user task"):
        next(supply(2, 0, ["user"]))
    assert next(supply(2, 0, ["lookup"])).kind == "lookup"


def test_a_synthesis_probe_never_writes_the_rows_it_was_made_from():
    """Task synthesis tries a tool on a copy that copies a row only when the tool reaches it
    (task_kinds._ProbeRows): every way in (get, indexing, values, items, pop) gives a copy."""
    from envfactory.factory.tasks.kinds import _ProbeRows

    rows = {"a": {"x": 1}, "b": {"x": 2}}
    probe = _ProbeRows(rows)
    probe.get("a")["x"] = 9
    probe["b"]["y"] = 3
    for r in probe.values():
        r["z"] = 1
    for _, r in probe.items():
        r["w"] = 1
    probe.pop("a")["gone"] = True
    probe["c"] = {"x": 5}
    assert rows == {"a": {"x": 1}, "b": {"x": 2}}
    assert probe == {"b": {"x": 2, "y": 3, "z": 1, "w": 1}, "c": {"x": 5}}
