"""The frame-keyed scripted agent (benchmarks/frame_agent.py): it reads only the instruction, the
policy lines, the tool schemas and the tool outputs, and it does solve goal-level tasks by their
frame (behaviour; its solve rate is the benchmark's figure, in benchmarks/results/)."""

from __future__ import annotations

import envfactory
from benchmarks.frame_agent import GOAL_KINDS, FrameAgent, families, rows_of, solve


def test_rows_of_reads_the_listing_format():
    text = "order O-5: customer=C-5, product=P-3, quantity=1, status=placed\nUpdated order O-6: status=shipped"
    assert rows_of(text) == [{"id": "O-5", "customer": "C-5", "product": "P-3", "quantity": "1", "status": "placed",
                              "_entity": "order"}, {"id": "O-6", "status": "shipped", "_entity": "order"}]


def test_it_solves_a_conditional_task_told_in_its_frame_and_not_the_same_task_rephrased():
    """The agent is keyed to the frames the tasks had before the language layer (one sentence
    per kind): told a task in that frame it solves it; told the same task as the layer now
    phrases it, it does not."""
    import re

    spec = envfactory.spec("RetailOrders-v1")
    said = re.compile(r"(?:For|Go through|Check|Please handle|I'd like you to review|Look at) (?:every|each) "
                      r"(?:(placed|shipped) )?order(?: (?:of|for) (?:the )?customer (?:named )?([A-Z]\w*))?"
                      r"(?: that is (placed|shipped))?[ .:;,].*?its (quantity|product's price|product's stock) is "
                      r"(?:at least )?\$?([\d,]+)(?: or more)?[,:] (cancel|ship) it")
    tried = 0
    for task in spec.get_tasks():
        m = said.search(task.instruction)
        if task.kind != "conditional" or not m or not (m.group(1) or m.group(3)):
            continue
        status, who, what, n, act = m.group(1) or m.group(3), m.group(2), *m.groups()[3:]
        other = "ship" if act == "cancel" else "cancel"
        of = f" of the customer named {who}" if who else ""
        old = (f"For every order{of} whose status is {status}: if its {what} is at least {n.replace(',', '')}, "
               f"{act} it; otherwise {other} it.")
        assert not solve("RetailOrders-v1", task), task.instruction
        assert solve("RetailOrders-v1", task.model_copy(update={"instruction": old})), old
        tried += 1
    assert tried


def test_it_plays_every_goal_kind_to_the_end_on_a_few_families():
    kinds = set()
    # families until every kind has been played (a kind is played on the first one with it)
    for name in ("RetailOrders-v1", "MobilityDesk-v0", "Museum-v0", "TravelDesk-v0", "HomeBuying-v0"):
        for task in envfactory.spec(name).tasks_in("eval"):
            if task.kind not in GOAL_KINDS or task.kind in kinds - {"lookup", "conditional"}:
                continue
            env = envfactory.make(name, split="all")
            env.reset(task)
            agent = FrameAgent(env)
            agent.play()
            assert env.done  # it always ends the episode, solved or not
            kinds.add(task.kind)
            env.close()
    assert set(GOAL_KINDS) <= kinds


def test_it_solves_at_most_a_fifth_of_the_goal_level_tasks():
    """Issue 26's bar: the frame-keyed agent (keyed to the one-frame-per-kind sentences the tasks
    had before the language layer and the task grammar) solves at most 20% of the goal-level
    eval tasks. Here over every fourth family (the benchmark plays all of them)."""
    solved = total = 0
    for name in families()[::4]:
        for task in envfactory.spec(name).tasks_in("eval"):
            if task.kind in GOAL_KINDS:
                solved += solve(name, task)
                total += 1
    assert total > 150
    assert solved <= 0.2 * total, (solved, total)
