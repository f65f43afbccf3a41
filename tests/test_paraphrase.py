"""The optional paraphrase pass (envfactory/factory/tasks/paraphrase.py): a chat model's rewording is
kept only if it keeps every id, quoted value, number and name and adds none; otherwise, or when
the model fails, the task keeps its own words. Played against a replayed endpoint (recorded
replies, served through agents.policies.openai_policy.OpenAIChat over an httpx mock transport), and on
real tasks whose reworded instructions keep their reference solutions."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import httpx
import pytest

import envfactory
from agents.policies.openai_policy import OpenAIChat
from envfactory import ToolCall
from envfactory.factory.tasks.paraphrase import BACK_PROMPT, NO_OTHER, lost, maps_back, paraphrase, strays
from envfactory.task import Task

CASSETTE = json.loads((Path(__file__).parent / "fixtures" / "paraphrase_cassette.json").read_text())["replies"]


def _reply(body: dict[str, Any], text: str) -> httpx.Response:
    return httpx.Response(200, json={"id": "r", "object": "chat.completion", "model": body["model"],
                                     "choices": [{"index": 0, "finish_reason": "stop",
                                                  "message": {"role": "assistant", "content": text}}]})


def _replayed() -> tuple[OpenAIChat, list[dict[str, Any]]]:
    """A chat endpoint that replays the cassette: the n-th request for an instruction gets its
    n-th recorded reply; an instruction it never recorded is a 404 (the model 'fails')."""
    asked: dict[str, int] = {}
    log: list[dict[str, Any]] = []

    def handler(request: httpx.Request) -> httpx.Response:
        body = json.loads(request.content)
        log.append(body)
        instruction = body["messages"][1]["content"]
        if body["messages"][0]["content"] == BACK_PROMPT:  # the second pass: the task it reworded
            request_text, listing = instruction.split("\n\nTasks:\n")
            text = request_text.removeprefix("Request: ")
            options = [line.split(". ", 1)[1] for line in listing.splitlines()]
            picked = next(i for i, o in enumerate(options, 1) if text in CASSETTE.get(o, []))
            return _reply(body, str(picked))
        replies = CASSETTE.get(instruction)
        if replies is None:
            return httpx.Response(404, json={"error": {"message": "no such recording"}})
        n = asked.get(instruction, 0)
        asked[instruction] = n + 1
        return _reply(body, replies[min(n, len(replies) - 1)])

    return OpenAIChat("http://replay.invalid/v1", "recorded", transport=httpx.MockTransport(handler)), log


def _task(i: int, instruction: str) -> Task:
    spec = envfactory.spec("RetailOrders-v1")
    base = spec.get_tasks()[0]
    return base.model_copy(update={"id": f"p-{i}", "instruction": instruction})


def test_rewordings_that_keep_every_fact_are_taken_and_others_refused():
    chat, log = _replayed()
    instructions = list(CASSETTE) + ["Ship every order of customer Kim."]  # the last: never recorded
    tasks = [_task(i, text) for i, text in enumerate(instructions)]
    out, report = paraphrase(tasks, chat.complete)
    by_id = {t.id: t for t in out}
    # 1: kept every fact at once; 2: changed 386 to 368, then got it right on the second try
    assert by_id["p-0"].instruction.startswith("Please go through Ned's placed orders")
    assert by_id["p-1"].instruction == "Can you put a quote of 386 dollars on every repair order that's still diagnosing?"
    rewords = [b for b in log if b["messages"][0]["content"] != BACK_PROMPT]
    assert "368" in json.dumps(rewords[2]["messages"][-1]) and "number 386" in rewords[2]["messages"][-1]["content"]
    # each rewording that kept its facts was read back, among the other tasks, as its own task
    backs = [b["messages"][1]["content"] for b in log if b["messages"][0]["content"] == BACK_PROMPT]
    assert len(backs) == 2 and all(b.count("\n") >= 4 for b in backs)
    # 3: lost the quoted note twice: its own words; 4: added an id (a guess): its own words
    assert by_id["p-2"].instruction == instructions[2] and by_id["p-3"].instruction == instructions[3]
    refused = {r["id"]: r["reasons"] for r in report["refused"]}
    assert refused["p-2"] == ["quoted 'keep the old parts'"] and "added id O-4" in refused["p-3"]
    # 5: the endpoint failed: its own words, and the error named
    assert by_id["p-4"].instruction == instructions[4]
    assert report["errors"][0]["id"] == "p-4" and "404" in report["errors"][0]["error"]
    assert (report["reworded"], report["kept"]) == (2, 3)
    assert by_id["p-1"].metadata["worded_by_layer"] == instructions[1]


def test_what_lost_counts():
    assert lost("Quote $1,200 on order O-7 for Kim.", "Put a 1200 dollar quote on Kim's order O-7.") == []
    assert lost("Quote $1,200 on order O-7 for Kim.", "Quote $1,200 on Kim's order.") == ["id O-7"]
    assert lost("Cancel every order of Kim.", "Cancel every order of Kim and O-2.") == ["added id O-2"]
    assert lost("Mark it 'done' for Ivy.", "Mark it as done for Ivy.") == ["quoted 'done'"]
    assert lost("Tell me how many orders Ned has.", "How many orders are there?") == ["name Ned"]


def test_reworded_real_tasks_keep_their_reference_and_check():
    """A model that rewords by rule (it keeps every fact): each reworded task's reference still
    earns 1 and a no-op 0, since only the words change."""
    spec = envfactory.spec("RetailOrders-v1")
    tasks = [t for t in spec.tasks_in("eval") if t.kind in ("lookup", "conditional")][:4]

    def polite(messages: list[dict[str, Any]]) -> str:
        text = messages[1]["content"]
        if messages[0]["content"] == BACK_PROMPT:  # reads its rewording back to the task it came from
            request, listing = text.split("\n\nTasks:\n")
            return next(line.split(".")[0] for line in listing.splitlines() if line.split(". ", 1)[1] in request)
        return "Hi! " + text + " Thanks a lot."

    out, report = paraphrase(tasks, polite)
    assert report["reworded"] == len(tasks)
    for t in out:
        assert t.instruction.startswith("Hi! ")
        env = envfactory.make("RetailOrders-v1", split="all")
        env.reset(t)
        for c in t.solution:
            env.step([ToolCall(c.name, dict(c.arguments))])
        r = env.step("Done.")
        assert r.reward == 1.0, t.instruction
        env.reset(t)
        assert env.step("Done.").reward == 0.0
        env.close()


def _tasks(*instructions: str) -> list[Task]:
    return [_task(i, text) for i, text in enumerate(instructions)]


def test_a_rewording_read_back_as_another_task_is_refused():
    """The second pass: a rewording that keeps every fact but drops a condition reads as the sibling
    task without it; a reply naming no task is refused too; the task keeps its own words."""
    a = "Cancel every placed order of Kim over $50."
    b = "Cancel every placed order of Kim."
    asked: list[str] = []

    def model(messages: list[dict[str, Any]]) -> str:
        if messages[0]["content"] == BACK_PROMPT:
            asked.append(messages[1]["content"])
            request, listing = messages[1]["content"].split("\n\nTasks:\n")
            options = [line.split(". ", 1)[1] for line in listing.splitlines()]
            return str(options.index(b) + 1) if "50" not in request else "I am not sure"
        return "Please cancel Kim's placed orders." if messages[1]["content"] == b else "Kim: cancel over $50, placed."

    out, report = paraphrase(_tasks(a, b), model, tries=1)
    assert out[0].instruction == a  # kept its facts, but the second pass named no task
    assert out[1].instruction == "Please cancel Kim's placed orders."  # read back as itself
    refused = {r["id"]: r["reasons"] for r in report["refused"]}
    assert refused == {"p-0": ["the second pass named no task ('I am not sure')"]}
    assert all(a in q and b in q for q in asked)  # each listing holds both

    def confused(messages: list[dict[str, Any]]) -> str:
        if messages[0]["content"] == BACK_PROMPT:
            listing = messages[1]["content"].split("\n\nTasks:\n")[1]
            return next(line.split(".")[0] for line in listing.splitlines() if line.endswith(b))
        return messages[1]["content"].replace(" over $50", "") + " Over 50 dollars."

    out, report = paraphrase(_tasks(a, b), confused, tries=1)
    assert out[0].instruction == a
    assert report["refused"][0]["reasons"] == [f"read as another task ({b!r})"]


def test_a_rewording_that_keeps_a_name_and_loses_the_request_is_refused():
    """SmolLM2-135M's "Benedikt, no." for a count request kept every fact the fact check looks at
    and was read back as its task (the only one naming Benedikt): now it keeps too little."""
    a, b = "Tell me how many tickets of subscriber Benedikt there are.", "Escalate ticket TK-80."

    def model(messages: list[dict[str, Any]]) -> str:
        if messages[0]["content"] == BACK_PROMPT:
            listing = messages[1]["content"].split("\n\nTasks:\n")[1]
            return next(line.split(".")[0] for line in listing.splitlines() if "Benedikt" in line)
        return "Benedikt, no." if "Benedikt" in messages[1]["content"] else messages[1]["content"]

    out, report = paraphrase(_tasks(a, b), model, tries=1)
    assert out[0].instruction == a
    assert report["refused"][0]["reasons"] == ["kept too little of the request (1 of 5 content words)"]


def test_a_rewording_wrapped_in_a_preamble_and_a_comment_is_refused():
    """SmolLM2-135M's 'Here's a rewritten version ...' + the request + a comment on its tweaks."""
    a = "Change the cabin of every booking whose cabin is economy to business."
    wrapped = (f"Here's a rewritten version of the request with the requested content:\n\n{a}\n\nI made a few "
               "tweaks to the original request to ensure it's exactly what you're looking for.")
    assert strays(a, wrapped) == f"far longer than the request ({len(wrapped)} characters for {len(a)})"
    assert strays(a, "Please move every economy booking to business class.") is None


def test_one_task_alone_cannot_be_read_back_and_keeps_its_words():
    calls: list[Any] = []
    out, report = paraphrase(_tasks("Ship every order of Kim."), lambda m: calls.append(m) or "Ship Kim's orders.")
    assert out[0].instruction == "Ship every order of Kim." and calls == []  # the model was not asked
    assert report["refused"] == [{"id": "p-0", "reasons": [NO_OTHER]}]
    # given the environment's other instructions, it can
    def kim(m: list[dict[str, Any]]) -> str:
        if m[0]["content"] != BACK_PROMPT:
            return "Ship all of Kim's orders."
        listing = m[1]["content"].split("\n\nTasks:\n")[1]
        return next(line.split(".")[0] for line in listing.splitlines() if "Kim" in line)

    out, report = paraphrase(_tasks("Ship every order of Kim."), kim, distractors=["Ship every order of Ned."])
    assert report["reworded"] == 1 and out[0].instruction == "Ship all of Kim's orders."
    ok, why = maps_back("Ship every order of Kim.", "Ship Kim's orders.", [], lambda m: "1")
    assert (ok, why) == (False, NO_OTHER)


@pytest.mark.slow
def test_the_pass_runs_offline_on_a_local_model():
    """The embedded tiny model (untrained: quality not claimed) through PolicyChat runs the whole
    pass end to end: every task is either reworded (facts kept, read back as itself) or keeps its
    own words with a reason, and every task still earns 1 with its reference."""
    pytest.importorskip("torch")
    from agents.policies.hf_policy import HFPolicy
    from agents.policies.users import PolicyChat

    spec = envfactory.spec("RetailOrders-v1")
    tasks = spec.tasks_in("eval")[:3]
    out, report = paraphrase(tasks, PolicyChat(HFPolicy(None), max_tokens=24).complete,
                             distractors=[t.instruction for t in spec.tasks_in("eval")[3:12]])
    assert report["reworded"] + report["kept"] == 3 and not report["errors"]
    assert len(report["refused"]) == report["kept"]
    for before, after in zip(tasks, out):
        assert after.solution == before.solution and after.id == before.id
        assert after.instruction == before.instruction or not lost(before.instruction, after.instruction)
