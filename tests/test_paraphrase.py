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

import envfactory
from agents.policies.openai_policy import OpenAIChat
from envfactory import ToolCall
from envfactory.factory.tasks.paraphrase import lost, paraphrase
from envfactory.task import Task

CASSETTE = json.loads((Path(__file__).parent / "fixtures" / "paraphrase_cassette.json").read_text())["replies"]


def _replayed() -> tuple[OpenAIChat, list[dict[str, Any]]]:
    """A chat endpoint that replays the cassette: the n-th request for an instruction gets its
    n-th recorded reply; an instruction it never recorded is a 404 (the model 'fails')."""
    asked: dict[str, int] = {}
    log: list[dict[str, Any]] = []

    def handler(request: httpx.Request) -> httpx.Response:
        body = json.loads(request.content)
        log.append(body)
        instruction = body["messages"][1]["content"]
        replies = CASSETTE.get(instruction)
        if replies is None:
            return httpx.Response(404, json={"error": {"message": "no such recording"}})
        n = asked.get(instruction, 0)
        asked[instruction] = n + 1
        text = replies[min(n, len(replies) - 1)]
        return httpx.Response(200, json={"id": "r", "object": "chat.completion", "model": body["model"],
                                         "choices": [{"index": 0, "finish_reason": "stop",
                                                      "message": {"role": "assistant", "content": text}}]})

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
    assert "368" in json.dumps(log[2]["messages"][-1]) and "number 386" in log[2]["messages"][-1]["content"]
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
