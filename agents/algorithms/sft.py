"""Warm-start data: each task's verified reference solution rendered as a training episode.

A :class:`TeacherPolicy` "samples" the reference actions, and the ordinary
token-in/token-out rollout records them. So an SFT sample has exactly the
layout of an RL sample (the same opening, the same inserted tool-response ids,
``loss_mask`` 1 on the assistant's tokens only), and the model is taught to
write what the environment really answered to.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Sequence

from ..policy import Generation, Policy, default_stop_ids

if TYPE_CHECKING:
    from envfactory import Environment

    from ..rollout import Trajectory

__all__ = ["TeacherPolicy", "reference_trajectories"]


class TeacherPolicy(Policy):
    """Emits a fixed script of assistant turns (one prompt at a time), each ending in the stop token."""

    def __init__(self, tokenizer: Any, turns: Sequence[str]) -> None:
        from ..rollout import renderer_for

        self.tokenizer = tokenizer
        self._turns = list(turns)
        self._stop = default_stop_ids(tokenizer)[-1]
        self._encode = renderer_for(self).encode

    def generate(self, prompts: list[list[int]], *, max_new_tokens: int, temperature: float = 1.0,
                 top_p: float = 1.0, stop_token_ids: list[int] | None = None,
                 seed: int | None = None) -> list[Generation]:
        if len(prompts) != 1:
            raise ValueError("TeacherPolicy plays one episode at a time")
        if not self._turns:
            raise RuntimeError("TeacherPolicy: the reference script has no turns left")
        ids = self._encode(self._turns.pop(0)) + [self._stop]
        return [Generation(ids, [0.0] * len(ids), [0.0] * len(ids), "stop")]

    def prefill_tokens_computed(self) -> int:
        return 0

    def next_turn_tokens(self) -> int:
        """Ids the next scripted turn takes (its stop token included)."""
        return len(self._encode(self._turns[0])) + 1 if self._turns else 1


def reference_trajectories(tokenizer: Any, pairs: Sequence[tuple["Environment", str]],
                           max_turns: int = 64) -> list["Trajectory"]:
    """One successful trajectory per ``(env, task_id)`` from the task's reference solution.

    Raises:
        RuntimeError: a reference solution did not earn reward 1 (the environment
            is not verified; run ``envfactory verify``).
    """
    from envfactory.agents_scripted import oracle_actions

    from ..rollout import advance, start

    out = []
    for env, task_id in pairs:
        task = env.spec.task(task_id)
        teacher = TeacherPolicy(tokenizer, oracle_actions(task))
        state = start(teacher, env, task_id, max_turns=max_turns)
        while not state.done:
            advance(teacher, [state], max_new_tokens=teacher.next_turn_tokens(), temperature=0.0)
        if not state.traj.success:
            raise RuntimeError(
                f"{env.spec.name}/{task_id}: the reference solution did not succeed "
                f"({state.traj.error or 'reward 0'}); run `envfactory verify {env.spec.name}`"
            )
        out.append(state.traj)
    return out
