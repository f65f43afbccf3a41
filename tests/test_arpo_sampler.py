"""ARPO's branching rollout with a deterministic fake policy: budget, forks, prefixes, entropy."""

from __future__ import annotations

import json
import re

import pytest

pytest.importorskip("transformers")

import envfactory  # noqa: E402
from agents.algorithms.objectives import ARPO, GRPO, initial_entropy  # noqa: E402
from agents.algorithms.branching import sample_groups  # noqa: E402
from agents.policies.policy import Generation, Policy, default_stop_ids  # noqa: E402


@pytest.fixture(scope="module")
def tokenizer():
    from transformers import AutoTokenizer

    from agents.models.tiny import build_tiny_model

    return AutoTokenizer.from_pretrained(build_tiny_model())


class FakePolicy(Policy):
    """Emits ``increment(by)`` calls; ``by`` cycles 1, 2, 3 over *calls of generate*, so a branch
    takes a different step than its parent did. Entropy: ``h0`` on a first turn, ``h1`` later."""

    def __init__(self, tokenizer, h0=0.1, h1=0.9):
        self.tokenizer, self.h0, self.h1 = tokenizer, h0, h1
        self.calls = 0
        self.stop = default_stop_ids(tokenizer)[-1]
        self.prompts: list[list[int]] = []

    def generate(self, prompts, *, max_new_tokens, temperature=1.0, top_p=1.0, stop_token_ids=None, seed=None):
        out = []
        for p in prompts:
            self.calls += 1
            self.prompts.append(list(p))
            by = (self.calls % 3) + 1
            text = '<tool_call>\n{"name": "increment", "arguments": {"by": %d}}\n</tool_call>' % by
            ids = self.tokenizer(text, add_special_tokens=False)["input_ids"] + [self.stop]
            first = p.count(self.tokenizer.convert_tokens_to_ids("<tool_response>")) == 0
            h = self.h0 if first else self.h1
            out.append(Generation(ids, [-0.5] * len(ids), [h] * len(ids), "stop"))
        return out

    def prefill_tokens_computed(self) -> int:
        return sum(len(p) for p in self.prompts)  # no cache: every prompt token is recomputed


def _groups(tokenizer, algo, n_tasks=2, seed=0, **kw):
    env = envfactory.make("Counter-v0", max_turns=4)
    tasks = ["counter-0-12", "counter-3-11"][:n_tasks]
    return sample_groups(FakePolicy(tokenizer, **kw), [(env, t) for t in tasks], algo, max_new_tokens=40, seed=seed)


def _calls_and_values(traj):
    """(by of each increment, counter value each tool response reported), from the trajectory's messages."""
    bys, values = [], []
    for m in traj.messages:
        if m["role"] == "assistant":
            bys += [int(x) for x in re.findall(r'"by": (\d+)', m["content"])]
        elif m["role"] == "tool":
            values.append(int(m["content"]))
    return bys, values


@pytest.mark.parametrize("algo", [ARPO(M=7, N=3, alpha=1.0, beta=0.0), ARPO(M=7, N=3, alpha=0.0, beta=0.0),
                                  ARPO(M=5, N=2, Z=3, alpha=0.3), GRPO(M=4)])
def test_budget_is_exactly_M(tokenizer, algo):
    groups = _groups(tokenizer, algo)
    for g in groups:
        assert len(g.trajectories) == algo.M == len(g.kinds) == len(g.lineage.parent)
        assert g.kinds.count("initial") == algo.initial
    if isinstance(algo, GRPO):
        assert all(k == "initial" for g in groups for k in g.kinds)
    elif algo.alpha == 0.0 and algo.beta == 0.0:  # never branches: fresh trajectories fill the budget
        assert all(g.kinds.count("fill") == algo.M - algo.N for g in groups)
    elif algo.alpha == 1.0:  # always branches: the budget is spent on branches, none filled
        assert all(g.kinds.count("branch") == algo.M - algo.N for g in groups)


def test_branches_share_their_parents_prefix_and_own_an_independent_environment(tokenizer):
    groups = _groups(tokenizer, ARPO(M=8, N=2, alpha=1.0, beta=0.0))
    branches = diverged = 0
    for g in groups:
        start = g.trajectories[0].messages[1]["content"]
        value0 = int(re.search(r"shows (\d+)", start).group(1))
        for i, t in enumerate(g.trajectories):
            p, shared = g.lineage.parent[i], g.lineage.shared[i]
            if p >= 0:
                branches += 1
                parent = g.trajectories[p]
                assert 0 < shared < len(t.response_ids)
                assert t.response_ids[:shared] == parent.response_ids[:shared]
                assert t.loss_mask[:shared] == parent.loss_mask[:shared]
                diverged += t.response_ids[shared:] != parent.response_ids[shared:]  # sampled its own turns
            # Every reported value is this trajectory's own running sum: a sibling's increments
            # (made on its fork of the same world) never show up here.
            bys, values = _calls_and_values(t)
            running, expect = value0, []
            for b in bys:
                running += b
                expect.append(running)
            assert values == expect
    assert branches == 12 and diverged >= 6


def test_tool_tokens_are_masked_out(tokenizer):
    g = _groups(tokenizer, ARPO(M=4, N=2, alpha=1.0, beta=0.0), n_tasks=1)[0]
    resp_open = tokenizer.convert_tokens_to_ids("<tool_response>")
    for t in g.trajectories:
        sampled = [x for x, m in zip(t.response_ids, t.loss_mask) if m]
        inserted = [x for x, m in zip(t.response_ids, t.loss_mask) if not m]
        assert resp_open in inserted and resp_open not in sampled
        assert all(lp == 0.0 for lp, m in zip(t.logprobs, t.loss_mask) if not m)


def test_entropy_decides_branching_and_highest_delta_h_wins(tokenizer):
    # ΔH = 0.9 - 0.1 = 0.8 > tau: branch; the reverse (ΔH = -0.8) never branches in threshold mode.
    # (k=10 keeps the window inside one turn, which is longer than 10 tokens)
    up = _groups(tokenizer, ARPO(M=6, N=2, k=10, mode="threshold", tau=0.5), h0=0.1, h1=0.9)
    down = _groups(tokenizer, ARPO(M=6, N=2, k=10, mode="threshold", tau=0.5), h0=0.9, h1=0.1)
    assert all(g.kinds.count("branch") == 4 for g in up)
    assert all(g.kinds.count("branch") == 0 and g.kinds.count("fill") == 4 for g in down)
    assert all(d == pytest.approx(0.8) for g in up for d in g.delta_h if d is not None)
    # H_initial is each trajectory's own first-k mean, recomputed from its tokens
    t = up[0].trajectories[0]
    assert initial_entropy(t, 10) == pytest.approx(0.1)
    assert initial_entropy(t, 40) == pytest.approx(0.1)  # the window never runs past the first turn


def test_branch_prefill_is_measured(tokenizer):
    g = _groups(tokenizer, ARPO(M=4, N=2, alpha=1.0, beta=0.0), n_tasks=1)[0]
    # the fake backend has no cache: a branch recomputes its whole prefix
    assert len(g.branch_prefill_tokens) == 2
    for x, i in zip(g.branch_prefill_tokens, [i for i, k in enumerate(g.kinds) if k == "branch"]):
        t = g.trajectories[i]
        assert x == len(t.prompt_ids) + g.lineage.shared[i]


def test_seeded_sampling_is_reproducible(tokenizer):
    a = _groups(tokenizer, ARPO(M=6, N=2, alpha=0.5, beta=0.0), seed=3)
    b = _groups(tokenizer, ARPO(M=6, N=2, alpha=0.5, beta=0.0), seed=3)
    assert [g.kinds for g in a] == [g.kinds for g in b]
    assert json.dumps([t.response_ids for g in a for t in g.trajectories]) == \
        json.dumps([t.response_ids for g in b for t in g.trajectories])
