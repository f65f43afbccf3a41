"""One contract for whatever plays a role: :class:`envfactory.checks.scripted.RolePolicy`.

Scripted agents, environments' own experts and a model behind its adapter all satisfy it,
and :func:`play` takes any of them. The token-level model :class:`agents.policies.policy.Policy` is a
different contract with its own name (its test double is :class:`agents.policies.scripted_model.ScriptedModel`).
"""

from __future__ import annotations

import pytest

import envfactory
from envfactory.checks.scripted import (ClaimPolicy, NoopPolicy, OraclePolicy, RandomPolicy, RolePolicy,
                                        ScriptPolicy, TranscriberPolicy, play)
from envfactory.evaluation.eval import ExpertPolicy
from environments.game_battleship import ExpertAdmiral, NaiveAdmiral

SOLVE = '<tool_call>\n{"name": "increment", "arguments": {"by": 3}}\n</tool_call>'  # counter-0-3 in one call


@pytest.mark.parametrize("policy", [OraclePolicy(), NoopPolicy(), ClaimPolicy(), RandomPolicy(), TranscriberPolicy(),
                                    ScriptPolicy([]), ExpertPolicy(), ExpertAdmiral(), NaiveAdmiral()],
                         ids=lambda p: type(p).__name__)
def test_every_scripted_agent_is_a_role_policy(policy):
    assert isinstance(policy, RolePolicy)


def test_an_object_without_act_is_not_a_role_policy():
    class Named:
        name = "nameless"

    assert not isinstance(Named(), RolePolicy)


def test_play_takes_any_object_with_name_and_act():
    class Solver:  # no base class: the contract is structural
        name = "solver"

        def act(self, episode, agent, seed):
            return SOLVE if episode.status.turns_taken(agent) == 0 else "Done: it shows 3."

    assert play(envfactory.make("Counter-v0"), Solver(), "counter-0-3").reward == 1.0


def test_a_model_plays_a_role_through_its_adapter():
    pytest.importorskip("torch")
    from transformers import AutoTokenizer

    from agents.policies.policy import Policy
    from agents.policies.policy_spec import LLMRolePolicy
    from agents.policies.scripted_model import ScriptedModel
    from agents.models.tiny import build_tiny_model

    model = ScriptedModel(AutoTokenizer.from_pretrained(build_tiny_model()),
                          lambda p, turn: SOLVE if turn == 0 else "Done: it shows 3.")
    assert isinstance(model, Policy) and not isinstance(model, RolePolicy)
    role = LLMRolePolicy(model, name="scripted-model")
    assert isinstance(role, RolePolicy)
    assert play(envfactory.make("Counter-v0"), role, "counter-0-3").reward == 1.0
