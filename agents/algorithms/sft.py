"""Warm-start data: each task's verified reference solution played as a training episode.

The scripted :class:`~envfactory.checks.scripted.OraclePolicy` plays the reference calls
and the ordinary token-in/token-out rollout records them, for one agent or every role of
a team. So an SFT sample has exactly the layout of an RL sample (the same opening,
the same inserted observations, ``loss_mask`` 1 on the role's own turns only), and
the model is taught to write what the environment really answered to.
"""

from __future__ import annotations

from typing import Any, Sequence

from envfactory.checks.scripted import OraclePolicy

__all__ = ["reference_rollouts"]


def reference_rollouts(tokenizer: Any, pairs: Sequence[tuple[Any, str]]) -> list[Any]:
    """One successful :class:`~agents.rollout.Rollout` per ``(episode, task_id)``, from the
    task's reference solution, rendered with ``tokenizer``.

    Raises:
        RuntimeError: a reference solution did not succeed (the environment is not
            verified; run ``envfactory verify``).
    """
    from agents.rollout import rollout

    out = []
    for env, task_id in pairs:
        (ro,) = rollout(OraclePolicy(), [(env, task_id)], tokenizer=tokenizer)
        if not ro.success:
            raise RuntimeError(f"{ro.env_name}/{task_id}: the reference solution did not succeed "
                               f"({ro.error or 'reward 0'}); run `envfactory verify {ro.env_name}`")
        out.append(ro)
    return out
