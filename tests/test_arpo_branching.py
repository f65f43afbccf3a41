"""ARPO's branching as the paper means it (issue 13): entropy moves the branch probability, each
branch point gets exactly Z siblings, H_initial stays in the first turn, and "tokens generated"
counts only what the policy sampled. Deterministic fake policies; no model is trained."""

from __future__ import annotations

import itertools

import pytest

pytest.importorskip("transformers")

import envfactory  # noqa: E402
from agents.algorithms.objectives import ARPO, GRPO, initial_entropy, standardize  # noqa: E402
from agents.algorithms.branching import sample_groups  # noqa: E402
from agents.policies.policy import Generation, Policy, default_stop_ids  # noqa: E402
from agents.rollout import Trajectory  # noqa: E402
from agents.trainer import summarize  # noqa: E402


@pytest.fixture(scope="module")
def tokenizer():
    from transformers import AutoTokenizer

    from agents.models.tiny import build_tiny_model

    return AutoTokenizer.from_pretrained(build_tiny_model())


class CountingPolicy(Policy):
    """Always calls ``increment`` (``by`` cycles over generate calls, so branches diverge). Entropy:
    ``h0`` on a first turn; on later turns the next value of ``later`` (cycled, one per turn), so the
    decisions of a round have different ``ΔH``. Counts every token it generates."""

    def __init__(self, tokenizer, h0=0.1, later=(0.10, 0.11, 0.12, 0.13, 0.14, 0.15, 0.16)):
        self.tokenizer, self.h0, self.later = tokenizer, h0, itertools.cycle(later)
        self.calls = self.generated = 0
        self.stop = default_stop_ids(tokenizer)[-1]
        self.resp = tokenizer.convert_tokens_to_ids("<tool_response>")

    def generate(self, prompts, *, max_new_tokens, temperature=1.0, top_p=1.0, stop_token_ids=None, seed=None):
        out = []
        for p in prompts:
            self.calls += 1
            text = '<tool_call>\n{"name": "increment", "arguments": {"by": %d}}\n</tool_call>' % (self.calls % 3 + 1)
            ids = self.tokenizer(text, add_special_tokens=False)["input_ids"] + [self.stop]
            h = self.h0 if self.resp not in p else next(self.later)
            self.generated += len(ids)
            out.append(Generation(ids, [-0.5] * len(ids), [h] * len(ids), "stop"))
        return out


def _sample(tokenizer, algo, n_tasks=2, seed=0, max_turns=4, **kw):
    pol = CountingPolicy(tokenizer, **kw)
    env = envfactory.make("Counter-v0", max_turns=max_turns)
    tasks = ["counter-0-12", "counter-3-11", "counter-0-11", "counter-3-12"][:n_tasks]
    return pol, sample_groups(pol, [(env, t) for t in tasks], algo, max_new_tokens=40, seed=seed)


# -- 1. the branch probability moves with entropy -------------------------------------------------
def test_standardised_delta_h_moves_the_branch_probability():
    # ΔH of a realistic round: a few hundredths apart (top-20 entropy / log|V|)
    dh = [-0.011, -0.004, 0.0, 0.006, 0.034]
    ps = ARPO(alpha=0.5, beta=0.5).branch_probabilities(dh)
    assert max(ps) - min(ps) > 0.3
    assert ps == sorted(ps)  # more entropy, more branching
    assert ARPO(alpha=0.5, beta=0.0).branch_probabilities(dh) == [0.5] * len(dh)  # the random control: P = α
    assert ARPO(alpha=0.3, beta=0.0).branch_probability(7.0) == 0.3
    # the raw scale (what the paper's formula gives on normalised entropies) is a coin flip
    raw = ARPO(alpha=0.5, beta=0.5, standardize=False).branch_probabilities(dh)
    assert max(raw) - min(raw) < 0.05
    assert standardize([0.2]) == [0.0] and standardize([0.3, 0.3]) == [0.0, 0.0]
    assert standardize([1.0, 3.0]) == pytest.approx([-1.0, 1.0])


def test_sampler_branch_probabilities_span_with_entropy_and_are_alpha_without_beta(tokenizer, monkeypatch):
    seen: list[float] = []
    orig = ARPO.branch_probability

    def record(self, x):
        p = orig(self, x)
        seen.append(p)
        return p

    monkeypatch.setattr(ARPO, "branch_probability", record)
    _, groups = _sample(tokenizer, ARPO(M=8, N=4, k=10, alpha=0.5, beta=0.5), n_tasks=4)
    assert len(seen) >= 8
    assert max(seen) - min(seen) > 0.3, f"P hardly moves with ΔH: {min(seen):.3f}..{max(seen):.3f}"
    dec = [d for g in groups for d in g.decisions]
    assert sorted(d.p for d in dec) == sorted(seen)  # every decision is recorded with its P
    assert {d.delta_h for d in dec} != {dec[0].delta_h}  # the decisions did differ in ΔH

    seen.clear()
    _, groups = _sample(tokenizer, ARPO(M=8, N=4, k=10, alpha=0.5, beta=0.0), n_tasks=4)
    assert seen and set(seen) == {0.5}


def test_branch_probability_metrics(tokenizer):
    _, groups = _sample(tokenizer, ARPO(M=8, N=4, k=10, alpha=0.5, beta=0.5), n_tasks=2)
    s = summarize(groups)
    ps = [d.p for g in groups for d in g.decisions]
    assert s["branch_decisions"] == len(ps) > 0
    assert (s["branch_p_min"], s["branch_p_max"]) == (min(ps), max(ps))
    assert s["branch_p_mean"] == pytest.approx(sum(ps) / len(ps))
    made = sum(d.branched for g in groups for d in g.decisions)
    assert s["branched_fraction"] == pytest.approx(made / len(ps))
    assert made * 1 == s["branches"]  # Z = 1: one branch per decision that branched
    _, plain = _sample(tokenizer, GRPO(M=2), n_tasks=1)
    assert summarize(plain)["branch_decisions"] == 0 and summarize(plain)["branch_p_mean"] is None


# -- 2. exactly Z siblings per branch point; no re-branching at a branch's own origin ----------------
def _branch_point(lineage, i):
    """The point branch ``i`` was forked at: (the trajectory that generated that prefix, its length)."""
    p, s = lineage.parent[i], lineage.shared[i]
    while lineage.parent[p] >= 0 and s <= lineage.shared[p]:
        p = lineage.parent[p]
    return p, s


@pytest.mark.parametrize("M,N,Z", [(9, 1, 2), (8, 1, 2), (11, 2, 3), (6, 2, 1)])
def test_each_branch_point_gets_exactly_Z_branches(tokenizer, M, N, Z):
    _, groups = _sample(tokenizer, ARPO(M=M, N=N, Z=Z, k=10, alpha=1.0, beta=0.0), n_tasks=2, max_turns=5)
    for g in groups:
        lin = g.lineage
        points: dict[tuple[int, int], int] = {}
        for i, kind in enumerate(g.kinds):
            if kind == "branch":
                points[_branch_point(lin, i)] = points.get(_branch_point(lin, i), 0) + 1
                p = lin.parent[i]
                # a branch never branches again at the point it was forked at
                assert not (lin.parent[p] >= 0 and lin.shared[i] == lin.shared[p]), (i, p)
        assert points and set(points.values()) == {Z}, points
        assert len(g.kinds) == M and g.kinds.count("initial") == N
        assert g.kinds.count("branch") == Z * len(points)
        # branching always wanted more: what is left over (less than Z) is filled with fresh rollouts
        assert g.kinds.count("fill") == (M - N) - Z * len(points) < Z
        assert sum(d.branched for d in g.decisions) == len(points)


# -- 3. H_initial is limited to the first turn -------------------------------------------------------
def test_initial_entropy_window_stays_in_the_first_turn():
    t = Trajectory(env_name="X-v0", task_id="t", response_ids=list(range(18)),
                   loss_mask=[1] * 5 + [0] * 3 + [1] * 10, entropies=[0.1] * 5 + [0.0] * 3 + [0.9] * 10,
                   turn_spans=[(0, 5), (8, 18)])
    assert initial_entropy(t, 10) == pytest.approx(0.1)  # the first turn has only 5 tokens
    assert initial_entropy(t, 3) == pytest.approx(0.1)
    assert ARPO(k=10).delta_h(t) == pytest.approx(0.8)
    assert initial_entropy(Trajectory(env_name="X-v0", task_id="t"), 10) == 0.0


# -- 4. tokens generated = tokens the policy sampled, copies of prefixes not counted again ------------
def test_tokens_generated_counts_sampled_tokens_only(tokenizer):
    pol, groups = _sample(tokenizer, ARPO(M=8, N=2, k=10, alpha=1.0, beta=0.0), n_tasks=2)
    assert sum(k == "branch" for g in groups for k in g.kinds) > 0
    s = summarize(groups)
    assert s["tokens_generated"] == pol.generated
    in_trajectories = sum(sum(t.loss_mask) for g in groups for t in g.trajectories)
    assert in_trajectories > pol.generated  # branches hold copies of their parents' turns
