"""Warm-start data: each task's verified reference solution played as a training episode.

A :class:`ReferenceActor` (a scripted role policy) plays the reference calls and the
ordinary token-in/token-out rollout records them, for one agent or every role of a
team. So an SFT sample has exactly the layout of an RL sample (the same opening,
the same inserted observations, ``loss_mask`` 1 on the role's own turns only), and
the model is taught to write what the environment really answered to.
"""

from __future__ import annotations

from typing import Any, Sequence

from envfactory.agents_scripted import oracle_actions
from envfactory.task import ToolCall

__all__ = ["ReferenceActor", "reference_rollouts", "PASS"]

PASS = "I have nothing to do this turn."


class ReferenceActor:
    """Plays the task's reference solution: one agent, call by call then the answer; a team,
    each agent's steps of the joint solution when they are next (passing otherwise), then
    ``finish`` once the plan is done."""

    name = "oracle"

    def act(self, episode: Any, agent: str, seed: int) -> str:
        task = episode.task
        if len(episode.agents) == 1:
            actions = oracle_actions(task)
            i = episode.turns_taken(agent)
            return actions[i] if i < len(actions) else ""
        plan, k = task.solution, 0
        for e in episode.log:  # the leading steps of the plan done successfully, in order
            step = plan[k] if k < len(plan) else None
            if step and e["ok"] and (e["agent"], e["name"], e["arguments"]) == (step.agent, step.name, step.arguments):
                k += 1
        if k == len(plan):
            return ToolCall("finish", {"answer": ("Done. " + " ".join(task.answer_facts)).strip()}).to_hermes()
        return ToolCall(plan[k].name, plan[k].arguments).to_hermes() if plan[k].agent == agent else PASS


def reference_rollouts(tokenizer: Any, pairs: Sequence[tuple[Any, str]]) -> list[Any]:
    """One successful :class:`~agents.rollout.Rollout` per ``(episode, task_id)``, from the
    task's reference solution, rendered with ``tokenizer``.

    Raises:
        RuntimeError: a reference solution did not succeed (the environment is not
            verified; run ``envfactory verify``).
    """
    from ..rollout import rollout

    out = []
    for env, task_id in pairs:
        (ro,) = rollout(ReferenceActor(), [(env, task_id)], tokenizer=tokenizer)
        if not ro.success:
            raise RuntimeError(f"{ro.env_name}/{task_id}: the reference solution did not succeed "
                               f"({ro.error or 'reward 0'}); run `envfactory verify {ro.env_name}`")
        out.append(ro)
    return out
