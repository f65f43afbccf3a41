"""BFCL v4 multi-turn as envfactory environments (environments/bfcl.py, issue 61): built from the
installed ``bfcl_eval`` (skipped on a laptop without it, a failure under CI=true), and scored as
BFCL's own checker scores.

The agreement sweep plays scripted agents through every entry of the four categories as
envfactory episodes and asserts that each episode's success is BFCL's verdict on the same calls
(the episode's calls in BFCL's decoded format, judged by ``multi_turn_checker`` as BFCL's runner
calls it):

* ``gold``: the oracle (per turn the gold calls, then an answer);
* ``noop``: answers every turn without a call;
* ``drop_reads``: the gold calls without the read-only ones (under the old final-state judging it
  earned reward 1 on 156 of the 186 entries BFCL's checker fails);
* ``wrong_write``: the gold calls and one extra write at one turn (a write of the entry's own gold
  from another turn, or of a plausible one, that changes what BFCL compares when it can);
* ``eager``: the gold calls and a read at every turn without gold calls (what tells BFCL's runner,
  which does not judge irrelevance, from ``irrelevance=True``).
"""

from __future__ import annotations

import copy
import json
import importlib
import inspect
import pickle
import re
import time
import zlib
from collections import Counter
from typing import Any, Callable

import pytest

from conftest import require_module

import envfactory
from envfactory.checks.scripted import NoopPolicy, OraclePolicy, play
from envfactory.episode import Episode
from envfactory.task import ToolCall, call


@pytest.fixture(scope="module", autouse=True)
def _bfcl_installed() -> None:
    require_module("bfcl_eval", "pip install --no-deps bfcl-eval==2026.3.23 mpmath (scripts/setup.sh installs it)")


def _bfcl() -> Any:
    return importlib.import_module("environments.bfcl")


CATEGORIES = ["base", "miss_param", "miss_func", "long_context"]


def _name(category: str) -> str:
    return next(n for n, c in _bfcl().CATEGORIES.items() if c == category)


# -- the scripted agents -------------------------------------------------------------------------------
def _play_plan(ep: Episode, task_id: str, plan: list[list[ToolCall]],
               extra: Callable[[Episode, int], list[ToolCall]] | None = None) -> None:
    """Per turn: the plan's calls (one a step), then ``extra(episode, turn)``'s, then an answer."""
    ep.reset(task_id)
    for k, calls in enumerate(plan):
        for c in calls:
            ep.step(c.to_hermes())
        for c in extra(ep, k) if extra is not None else ():  # (chosen on the state the turn's calls left)
            ep.step(c.to_hermes())
        ep.step("Done.")
    assert ep.done, (task_id, ep.status.conversation)


# plausible writes, besides the entry's own gold ones, by class
_WRITES = {
    "GorillaFileSystem": [call("touch", file_name="draft_notes.txt"), call("mkdir", dir_name="scratch")],
    "MessageAPI": [call("add_contact", user_name="Zoe")],
    "TwitterAPI": [call("follow_user", username_to_follow="zoe_dev"),
                   call("post_tweet", content="Quick update from the team.")],
    "TicketAPI": [call("create_ticket", title="Printer jam", description="The second-floor printer is jammed.")],
    "TradingBot": [call("add_to_watchlist", stock="NVDA"), call("fund_account", amount=500.0)],
    "TravelAPI": [],
    "VehicleControlAPI": [call("setHeadlights", mode="on"), call("adjustClimateControl", temperature=30.0),
                          call("set_navigation", destination="123 Main St, Springfield, IL 62701")],
    "MathAPI": [],
}


def _wrong_write(spec: Any, task: Any, chosen: Counter) -> Callable[[Episode, int], list[ToolCall]]:
    """At one turn (by the entry id's CRC), after its gold calls: a write among the entry's gold
    writes of other turns and plausible ones, the first that changes what BFCL compares (the first
    shown one when none does)."""
    conv = task.conversation
    at = zlib.crc32(task.id.encode()) % len(conv.turns)
    tools = spec.all_tools
    involved = task.metadata["bfcl"]["involved_classes"]
    pool = [c for k, t in enumerate(conv.turns) if k != at for c in t.solution if not tools[c.name].read_only]
    pool += [c for cls in involved for c in _WRITES[cls]]

    def extra(ep: Episode, k: int) -> list[ToolCall]:
        if k != at:
            return []
        shown = {s["function"]["name"] for s in ep.tool_schemas()}
        mine = [c for c in pool if c.name in shown]
        before = conv.state_view(ep.state)
        for c in mine:
            trial = ep.fork()
            trial.step(c.to_hermes())
            if conv.state_view(trial.state) != before:
                chosen["changes"] += 1
                return [c]
        chosen["changes nothing"] += 1
        return mine[:1]

    return extra


def _eager(spec: Any, task: Any) -> Callable[[Episode, int], list[ToolCall]]:
    """At each turn without gold calls: a read the agent is shown that needs no argument."""
    def extra(ep: Episode, k: int) -> list[ToolCall]:
        if task.conversation.turns[k].solution:
            return []
        tools = spec.all_tools
        reads = sorted(s["function"]["name"] for s in ep.tool_schemas() if tools[s["function"]["name"]].read_only
                       and not s["function"]["parameters"].get("required"))
        return [call(reads[0])] if reads else []

    return extra


AGENTS = ("gold", "noop", "drop_reads", "wrong_write", "eager")


def sweep(spec: Any, category: str, *, irrelevance: bool = False) -> tuple[dict[str, Counter], list[tuple]]:
    """Every agent on every entry: (per agent, the counts of envfactory's and BFCL's successes and
    of their disagreements; the disagreements)."""
    bfcl = _bfcl()
    ep = Episode(spec)
    tools = spec.all_tools
    counts: dict[str, Counter] = {a: Counter() for a in AGENTS}
    chosen: Counter = Counter()
    differ = []
    for task in spec.get_tasks():
        gold = [list(t.solution) for t in task.conversation.turns]
        for agent in AGENTS:
            if agent == "gold":
                play(ep, OraclePolicy(), task.id)
            elif agent == "noop":
                play(ep, NoopPolicy(), task.id)
            elif agent == "drop_reads":
                _play_plan(ep, task.id, [[c for c in turn if not tools[c.name].read_only] for turn in gold])
            elif agent == "wrong_write":
                _play_plan(ep, task.id, gold, _wrong_write(spec, task, chosen))
            else:
                _play_plan(ep, task.id, gold, _eager(spec, task))
            ours = bool(ep.success)
            theirs, result = bfcl.bfcl_valid(category, task.id, bfcl.decoded_calls(ep.transcript()),
                                             irrelevance=irrelevance)
            c = counts[agent]
            c["envfactory"] += ours
            c["bfcl"] += theirs
            if ours != theirs:
                c["disagree"] += 1
                differ.append((agent, task.id, ours, theirs, ep.status.conversation["verdicts"],
                               result.get("error_type")))
    counts["wrong_write"].update({f"write {k}": v for k, v in chosen.items()})
    return counts, differ


# measured with bfcl-eval 2026.3.23: agent -> category -> successes (envfactory's = BFCL's)
EXPECTED = {
    "gold": {"base": 200, "miss_param": 200, "miss_func": 200, "long_context": 200},
    "noop": {"base": 0, "miss_param": 0, "miss_func": 0, "long_context": 0},
    "drop_reads": {"base": 15, "miss_param": 16, "miss_func": 16, "long_context": 16},
    "wrong_write": {"base": 6, "miss_param": 16, "miss_func": 16, "long_context": 5},
    "eager": {"base": 200, "miss_param": 200, "miss_func": 200, "long_context": 200},
}


@pytest.mark.parametrize("category", CATEGORIES)
def test_envfactory_and_bfcl_agree_on_every_entry(category):
    """Before: an agent that skipped every read-only call earned reward 1 on 156 of the 186
    entries BFCL's checker fails (the final state alone was judged). Now every agent's success is
    BFCL's verdict, entry by entry, and the gold earns 1 on all 200."""
    start = time.perf_counter()
    counts, differ = sweep(envfactory.spec(_name(category)), category)
    took = time.perf_counter() - start
    print(f"\n{category} ({took:.1f}s): " + "; ".join(f"{a} {dict(c)}" for a, c in counts.items()))
    assert not differ, differ[:10]
    for agent, by_category in EXPECTED.items():
        assert counts[agent]["envfactory"] == by_category[category], (agent, category, dict(counts[agent]))


def test_irrelevance_is_judged_only_when_asked():
    """BFCL's runner (2026.3.23) does not call multi_turn_irrelevance_checker: a read in a turn whose
    right answer is no call fails nothing. bfcl_spec(irrelevance=True) judges it (the "no_call"
    check), and agrees with the checker plus the irrelevance checker."""
    bfcl = _bfcl()
    spec = bfcl.bfcl_spec("miss_param", name="BFCLIrrelevanceProbe-v0", irrelevance=True)
    counts, differ = sweep(spec, "miss_param", irrelevance=True)
    print("\nmiss_param, irrelevance judged: " + "; ".join(f"{a} {dict(c)}" for a, c in counts.items()))
    assert not differ, differ[:10]
    assert [counts[a]["envfactory"] for a in AGENTS] == [200, 0, 16, 6, 0]


# -- how the environments are made ------------------------------------------------------------------------
def test_the_four_environments_are_announced_and_hold_every_entry():
    import environments

    bfcl = _bfcl()
    module, names = "environments.bfcl", tuple(bfcl.CATEGORIES)
    assert environments.OPTIONAL[module] == ("bfcl_eval", names)
    assert all(environments.SINGLE_AGENT[n] == module for n in names)
    for name, category in bfcl.CATEGORIES.items():
        spec = envfactory.spec(name)
        entries = bfcl.entries(category)
        gold = bfcl.ground_truth(category)
        tasks = spec.get_tasks()
        assert [t.id for t in tasks] == [e["id"] for e in entries] and len(tasks) == 200
        assert not spec.replay_errors, list(spec.replay_errors.items())[:3]
        assert not spec.finish_tool and spec.max_turns == bfcl.STEP_LIMIT * max(len(e["question"]) for e in entries)
        for t, e in zip(tasks, entries):
            turns = t.conversation.turns
            assert len(turns) == len(e["question"]) == len(gold[e["id"]])
            for turn, messages, calls in zip(turns, e["question"], gold[e["id"]]):
                assert turn.message == (messages[0]["content"] if messages else
                                        "I have updated some more functions you can choose from. What about now?")
                assert [bfcl.call_string(c.name, c.arguments) for c in turn.solution] == \
                    [bfcl.call_string(*_named(s)) for s in calls]
                assert turn.checks == (("call", "state", "results") if calls else ())
            assert t.components() == ("turn_call", "turn_state", "turn_results")


def _named(text: str) -> tuple[str, dict[str, Any]]:
    c = _bfcl().parse_call(text)
    return c.name, c.arguments


def test_an_entry_shows_its_classes_functions_and_the_missed_ones_from_their_turn():
    bfcl = _bfcl()
    docs = bfcl._docs()
    for category in ("base", "miss_func"):
        spec = envfactory.spec(_name(category))
        ep = Episode(spec)
        tasks = spec.get_tasks()
        for task in tasks[::7] + [t for t in tasks if t.id == "multi_turn_miss_func_49"]:
            e = next(x for x in bfcl.entries(category) if x["id"] == task.id)
            own = {m for m, c in bfcl._owners().items() if c in e["involved_classes"]}
            reveal = {n: int(k) for k, ns in (e.get("missed_function") or {}).items() for n in ns}
            if task.id == "multi_turn_miss_func_49":
                reveal["tail"] = 1  # BFCL adds it at turn 3, its gold calls it at turn 1
            ep.reset(task.id)
            for k in range(len(task.conversation.turns)):
                shown = {s["function"]["name"]: s["function"] for s in ep.tool_schemas()}
                hidden = {n for n, at in reveal.items() if at > k}
                assert set(shown) == own - hidden, (task.id, k)
                for n, f in shown.items():  # BFCL's own doc, as its OpenAI handler sends it
                    assert f["description"] == docs[n]["description"]
                    assert set(f["parameters"]["properties"]) == set(docs[n]["parameters"]["properties"])
                    assert f["parameters"]["type"] == "object"
                for c in task.conversation.turns[k].solution:
                    ep.step(c.to_hermes())
                ep.step("Done.")


def test_a_hidden_function_is_an_unknown_tool():
    spec = envfactory.spec(_name("miss_func"))
    ep = Episode(spec)
    task = spec.task("multi_turn_miss_func_0")  # sort is added at turn 3
    ep.reset(task.id)
    out = ep.step(call("sort", file_name="final_report.pdf").to_hermes()).messages[0]["content"]
    assert out.startswith("Error: unknown tool 'sort'")
    out = ep.step(call("send_message", receiver_id="USR002", message="hi").to_hermes()).messages[0]["content"]
    assert out.startswith("Error: unknown tool 'send_message'")  # MessageAPI: not an involved class


def test_read_only_marks_say_which_methods_never_change_their_instance():
    """READ_ONLY against every gold call of the four categories, run on BFCL's own instances: a
    method marked read-only never changes any attribute (public or private); every other method a
    gold call makes changed one at least once. The tools carry the marks."""
    bfcl = _bfcl()
    from bfcl_eval.constants.executable_backend_config import STATELESS_CLASSES

    changed: dict[str, list[bool]] = {}
    for category in CATEGORIES:
        gold = bfcl.ground_truth(category)
        for e in bfcl.entries(category):
            inst = {}
            for n in e["involved_classes"]:
                inst[n] = bfcl.bfcl_class(n)()
                if n not in STATELESS_CLASSES:
                    inst[n]._load_scenario(copy.deepcopy(e["initial_config"].get(n, {})),
                                           long_context="long_context" in category)
            for text in (s for turn in gold[e["id"]] for s in turn):
                c = bfcl.parse_call(text)
                obj = inst[bfcl._owners()[c.name]]
                before = pickle.dumps(obj)
                getattr(obj, c.name)(**copy.deepcopy(c.arguments))
                changed.setdefault(c.name, []).append(pickle.dumps(obj) != before)
    marked = {m for ms in bfcl.READ_ONLY.values() for m in ms}
    assert not [m for m in marked if any(changed.get(m, []))]
    assert not [m for m, seen in changed.items() if m not in marked and not any(seen)]
    for name in bfcl.CATEGORIES:
        tools = envfactory.spec(name).all_tools
        assert {n for n, t in tools.items() if t.read_only} == marked
        assert set(tools) == set(bfcl._owners())


def _bfcl_execute(category: str, entry: dict, calls: list[str], model: str) -> tuple[list[str], dict]:
    from bfcl_eval.eval_checker.multi_turn_eval.multi_turn_utils import execute_multi_turn_func_call

    return execute_multi_turn_func_call(calls, entry["initial_config"], entry["involved_classes"], model, entry["id"],
                                        long_context="long_context" in category, is_evaL_run=True)


def _drop_instances(model: str) -> None:
    from bfcl_eval.eval_checker.multi_turn_eval import multi_turn_utils

    g = vars(multi_turn_utils)
    for k in [k for k in g if k.startswith(model + "_")]:
        del g[k]


@pytest.mark.parametrize("category", CATEGORIES)
def test_every_gold_result_reads_as_bfcls_execution_renders_it(category):
    """The results the "results" check compares: each turn's reference results (replayed by
    envfactory's tools) are, string for string, what BFCL's execution answers to the gold."""
    bfcl = _bfcl()
    spec = envfactory.spec(_name(category))
    gold = bfcl.ground_truth(category)
    for task, entry in zip(spec.get_tasks(), bfcl.entries(category)):
        model = "render_probe_" + re.sub(r"\W", "_", entry["id"])
        try:
            for k, calls in enumerate(gold[entry["id"]]):
                want, _ = _bfcl_execute(category, entry, calls, model)
                assert task._turn_refs[k][1] == want, (entry["id"], k)
        finally:
            _drop_instances(model)


def test_errors_and_wrong_arguments_read_as_bfcls_execution_renders_them():
    """An exception is ``Error during execution: <message>`` (BFCL's words, ``str(e)``), arguments
    reach the method unchecked, as BFCL's ``eval`` passes them."""
    bfcl = _bfcl()
    spec = envfactory.spec(_name("base"))
    ep = Episode(spec)
    entry = next(e for e in bfcl.entries("base") if "TravelAPI" in e["involved_classes"])
    probes = [call("get_flight_cost", travel_from="XXX", travel_to="YYY", travel_date="2024-11-15",
                   travel_class="economy"),
              call("get_flight_cost", travel_from="SFO", travel_to="LAX"),
              call("list_all_airports", bogus=1),
              call("compute_exchange_rate", base_currency="USD", target_currency="RMB", value="100")]
    ep.reset(entry["id"])
    model = "error_probe"
    try:
        want, _ = _bfcl_execute("base", entry, [bfcl.call_string(c.name, c.arguments) for c in probes], model)
    finally:
        _drop_instances(model)
    got = [ep.step(c.to_hermes()).messages[0]["content"] for c in probes]
    assert got == want and all(w.startswith("Error during execution: ") for w in want[:3]), (got, want)


def test_the_turn_state_is_what_bfcls_state_checker_compares():
    """The current directory, the random generators and a file's modification time are not
    compared (BFCL's _compare_instances leaves out private attributes): an agent that ends a turn
    in another directory passes its state check; one that leaves a file behind fails it."""
    spec = envfactory.spec(_name("base"))
    task = spec.task("multi_turn_base_0")
    ep = Episode(spec)
    turn0 = task.conversation.turns[0].solution  # cd document, mkdir temp, mv
    ep.reset(task.id)
    for c in turn0 + [call("cd", folder="temp")]:
        ep.step(c.to_hermes())
    ep.step("Done.")
    assert ep.status.conversation["verdicts"][0] == {"call": True, "state": True, "results": True}
    ep.reset(task.id)
    for c in turn0 + [call("touch", file_name="left_behind.txt")]:
        ep.step(c.to_hermes())
    ep.step("Done.")
    assert ep.status.conversation["verdicts"][0]["state"] is False


def test_the_environments_verify():
    from envfactory.checks.verify import verify_spec

    report = verify_spec(envfactory.spec(_name("miss_func")))
    assert report.verified, [(f.check, f.detail) for f in report.failures][:5]


def test_eval_reports_bfcls_verdict_beside_success():
    """``envfactory eval`` on a BFCL environment: how many episodes BFCL's checker calls valid
    (``suite``), from each episode's transcript, beside envfactory's success."""
    from agents.eval import evaluate

    bfcl = _bfcl()
    name = _name("miss_param")
    for policy, valid in (("oracle", 12), ("noop", 0)):
        doc = evaluate([name], policy, episodes=12, split=None)
        suite = doc["environments"][0]["suite"]
        assert suite["name"] == "BFCL multi_turn_checker" and suite["episodes"] == 12
        assert suite["valid"] == valid == doc["environments"][0]["successes"] and suite["agree"] == 12
        assert all(r["suite_valid"] is (valid > 0) for r in doc["episodes"])
    # a model's transcript carries its calls' arguments as JSON text (OpenAI) or as objects
    ep = Episode(envfactory.spec(name))
    play(ep, OraclePolicy(), "multi_turn_miss_param_0")
    as_text = [{**m, "tool_calls": [{**c, "function": {**c["function"], "arguments": json.dumps(c["function"]["arguments"])}}
                                    for c in m["tool_calls"]]} if m.get("tool_calls") else m for m in ep.transcript()]
    assert bfcl.decoded_calls(as_text) == bfcl.decoded_calls(ep.transcript())
    assert bfcl.judge("miss_param", "multi_turn_miss_param_0", as_text)


@pytest.mark.docker
def test_the_environments_run_in_docker_as_in_process():
    """The Docker runtime's image installs bfcl-eval (the spec's ``image_requirements``): the same
    episodes, the same verdicts, in a container as in-process, for the gold and a no-op on the first
    entries of each category; fork and snapshot in the container."""
    from conftest import require_docker
    from envfactory.checks.scripted import episode_trace

    require_docker()
    for category in CATEGORIES:
        name = _name(category)
        local = envfactory.make(name, split="all")
        docker = envfactory.make(name, runtime="docker", split="all")
        try:
            for task in local.spec.get_tasks()[:3]:
                for policy in (OraclePolicy(), NoopPolicy()):
                    a = episode_trace(local, policy, task.id)
                    view_a = task.conversation.state_view(local.state)
                    b = episode_trace(docker, policy, task.id)
                    # the final state's whole dump holds a clock reading (a file's modification time,
                    # which BFCL never compares): everything else, and what BFCL compares, is equal
                    assert a[:-1] == b[:-1] and a[-1][:-1] == b[-1][:-1], f"{name} {task.id}: local and docker differ"
                    assert view_a == task.conversation.state_view(docker.state)
            docker.reset(task.id)
            docker.step(OraclePolicy().act(docker, docker.agents[0], 0))
            child, snap = docker.fork(), docker.snapshot()
            assert child.state.hash() == docker.state.hash()
            other = envfactory.make(name, runtime="docker", split="all")
            other.restore(snap)
            assert other.state.hash() == docker.state.hash()
            child.close(), other.close()
        finally:
            docker.close()
