"""Rubrics beside the sparse task reward: criteria over what the episode really did, an LLM judge
through any policy backend, and the rollout recording grades without changing the reward by default."""

from __future__ import annotations

import pytest

import envfactory
from envfactory import EpisodeError, ToolCall
from envfactory.evaluation.rubric import (Criterion, Rubric, answer_mentions, at_most_calls, no_tool_errors,
                                          task_success)

NAME = "FileSystem-v0"


def _facts_task():
    return next(t for t in envfactory.spec(NAME).get_tasks() if t.answer_facts and len(t.solution) >= 1)


def _play(task, calls, answer):
    ep = envfactory.make(NAME, split="all")
    ep.reset(task.id)
    for c in calls:
        ep.step([c])
    ep.step({"role": "assistant", "content": answer})
    return ep


def test_rubric_grades_what_the_episode_did():
    task = _facts_task()
    rubric = Rubric([task_success(), no_tool_errors(weight=0.5), at_most_calls(len(task.solution), weight=0.5),
                     answer_mentions()])
    good = rubric.grade(_play(task, task.solution, "Done. " + " ".join(task.answer_facts)))
    assert good.parts == {"task_success": 1.0, "no_tool_errors": 1.0, "at_most_calls": 1.0, "answer_mentions": 1.0}
    assert good.score == 1.0 and not good.errors
    bad_call = ToolCall("read_file", {"path": "/no/such/file"})
    sloppy = rubric.grade(_play(task, [bad_call] + list(task.solution) * 2, "no idea"))
    assert sloppy.parts["task_success"] == 0.0 and sloppy.parts["no_tool_errors"] == 0.0
    assert sloppy.parts["answer_mentions"] == 0.0 and sloppy.parts["at_most_calls"] < 1.0
    weights = {"task_success": 1.0, "no_tool_errors": 0.5, "at_most_calls": 0.5, "answer_mentions": 1.0}
    assert sloppy.score == pytest.approx(sum(weights[k] * v for k, v in sloppy.parts.items()) / 3.0)


def test_claims_earn_nothing_and_a_broken_criterion_scores_zero():
    task = _facts_task()
    claim = _play(task, [], "I did everything: " + " ".join(task.answer_facts))  # names the facts, never looked
    grade = Rubric([task_success(), Criterion("broken", lambda f: 1 / 0), Criterion("too_big", lambda f: 2.0)]
                   ).grade(claim)
    assert grade.parts == {"task_success": 0.0, "broken": 0.0, "too_big": 0.0}
    assert grade.errors["broken"].startswith("ZeroDivisionError") and "outside [0, 1]" in grade.errors["too_big"]


def test_rubric_refuses_what_it_cannot_grade():
    ep = envfactory.make(NAME)
    ep.reset(seed=0)
    with pytest.raises(EpisodeError, match="has not ended"):
        Rubric([task_success()]).grade(ep)
    with pytest.raises(ValueError, match="distinct names"):
        Rubric([task_success(), task_success()])
    with pytest.raises(ValueError, match="positive weight"):
        Rubric([task_success(weight=0)])
    with pytest.raises(ValueError, match="weight must be"):
        task_success(weight=float("nan"))


@pytest.fixture(scope="module")
def tokenizer():
    from agents.policies.hf_policy import HFPolicy
    from agents.models.tiny import build_tiny_model

    return HFPolicy(build_tiny_model(), device="cpu").tokenizer


def test_llm_judge_through_a_policy(tokenizer):
    from agents.policies.judge import LLMJudge
    from agents.policies.scripted_model import ScriptedModel as ScriptedPolicy

    task = _facts_task()
    ep = _play(task, task.solution, "Done. " + " ".join(task.answer_facts))
    seen = []

    def judge_says(text):
        def script(prompt, turn):
            seen.append(tokenizer.decode(prompt))
            return text
        return ScriptedPolicy(tokenizer, script)

    q = "Did the agent read a file?"
    yes = Rubric([LLMJudge(judge_says("Yes."), q)]).grade(ep)
    assert yes.parts == {"judge": 1.0}, yes.errors
    assert Rubric([LLMJudge(judge_says("no"), q, name="read")]).grade(ep).parts == {"read": 0.0}
    unsure = Rubric([LLMJudge(judge_says("perhaps"), q)]).grade(ep)
    assert unsure.parts == {"judge": 0.0} and "neither yes nor no" in unsure.errors["judge"]
    # the judge saw the task, the calls with their results, the answer and the question
    assert task.instruction in seen[0] and q in seen[0] and task.solution[0].name in seen[0]


def test_rollout_records_the_grade_and_keeps_the_sparse_reward(tokenizer):
    from agents.rollout import rollout
    from agents.policies.scripted_model import ScriptedModel as ScriptedPolicy

    task = _facts_task()
    call = task.solution[0]
    text = f'<tool_call>{{"name": "{call.name}", "arguments": {__import__("json").dumps(call.arguments)}}}</tool_call>'
    pol = ScriptedPolicy(tokenizer, lambda p, turn: text if turn == 0 else "Done.")
    rubric = Rubric([task_success(), no_tool_errors()])
    plain = rollout(pol, [(envfactory.make(NAME, split="all"), task.id)], max_new_tokens=64, rubric=rubric)[0]
    t = plain.trajectory
    assert t.rubric == {"task_success": 0.0, "no_tool_errors": 1.0, "score": 0.5}
    assert t.reward == 0.0  # the task reward, untouched by default
    shaped = rollout(pol, [(envfactory.make(NAME, split="all"), task.id)], max_new_tokens=64, rubric=rubric,
                     rubric_as_reward=True)[0]
    assert shaped.trajectory.reward == 0.5
