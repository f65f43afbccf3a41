"""Trainer: SFT warm start, one ARPO step, checkpoint resume giving the same next step."""

from __future__ import annotations

import json

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

from agents.algorithms.objectives import ARPO, GRPO  # noqa: E402
from agents.policies.hf_policy import HFPolicy  # noqa: E402
from agents.models.tiny import build_tiny_model  # noqa: E402
from agents.train_config import OptimConfig, OutputConfig, SamplingConfig, TrainerConfig  # noqa: E402
from agents.trainer import Trainer  # noqa: E402

TASKS = ["counter-0-2", "counter-0-4"]


def _trainer(out, seed=0):
    from agents.policies.hf_policy import HFPolicy
    from agents.models.tiny import build_tiny_model

    torch.manual_seed(0)
    policy = HFPolicy(build_tiny_model(), device="cpu")
    # A random model never succeeds; a reward that varies within a group makes the updates non-trivial.
    cfg = TrainerConfig(algorithm=ARPO(M=4, N=2, k=4), tasks=TASKS, respect_splits=False, seed=seed,
                        sampling=SamplingConfig(max_new_tokens=12, max_turns=2),
                        optim=OptimConfig(lr=1e-3, tasks_per_step=2),
                        output=OutputConfig(dir=str(out), show_progress=False))
    return Trainer(policy, ["Counter-v0"], cfg, reward_fn=lambda t: float(t.response_ids[0] % 2))


def _weights(model):
    return {k: v.detach().clone() for k, v in model.state_dict().items()}


@pytest.mark.slow
def test_resume_gives_the_same_next_step(tmp_path):
    a = _trainer(tmp_path / "a")
    a.train(1)
    w1 = _weights(a.model)
    a.train(2)
    w2 = _weights(a.model)
    assert any(not torch.equal(w1[k], w2[k]) for k in w1), "step 2 changed nothing: the test would be vacuous"
    row2 = [r for r in a.log.rows if r.get("step") == 2][0]

    b = _trainer(tmp_path / "b")
    b.output_dir = tmp_path / "a"
    b.train(2, resume=str(tmp_path / "a" / "checkpoints" / "step-1"))
    assert b.step == 2
    w2b = _weights(b.model)
    for k in w2:
        assert torch.allclose(w2[k], w2b[k], atol=1e-6), k
    rowb = [r for r in b.log.rows if r.get("step") == 2][0]
    assert rowb["tokens_generated"] == row2["tokens_generated"] and rowb["success"] == row2["success"]
    lines = [json.loads(x) for x in (tmp_path / "a" / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in lines if r.get("phase") == "train"] == [1, 2]  # resumed rows replace, not repeat
    assert (tmp_path / "a" / "learning_curve.png").stat().st_size > 1000


@pytest.mark.slow
def test_sft_learns_the_reference_solutions(tmp_path):
    t = _trainer(tmp_path)
    first = t.sft(epochs=1, lr=3e-3)["final_nll"]
    last = t.sft(epochs=20, lr=3e-3)["final_nll"]
    assert last < first / 2


def test_evaluation_tasks_are_never_trained_on(tmp_path) -> None:
    # issue 13: the three splits hold everywhere; asking to train (RL or SFT) on an eval-split task is an error
    import envfactory

    spec = envfactory.spec("Counter-v0")
    ev, rl, sft = (spec.tasks_in(s)[0].id for s in ("eval", "rl", "sft"))
    policy = HFPolicy(build_tiny_model(), device="cpu")
    with pytest.raises(ValueError, match="evaluation-split"):
        Trainer(policy, ["Counter-v0"], TrainerConfig(algorithm=GRPO(M=2), tasks=[ev]))
    tr = Trainer(policy, ["Counter-v0"], TrainerConfig(algorithm=GRPO(M=2)))
    assert {t for _, t in tr.pool} == {t.id for t in spec.tasks_in("rl")} and rl in {t for _, t in tr.pool}
    assert {t for _, t in tr.pairs(purpose="eval")} == {t.id for t in spec.tasks_in("eval")}
    assert sft in {t for _, t in tr.pairs(purpose="sft")}
    with pytest.raises(ValueError, match="evaluation-split"):
        tr.sft([ev], epochs=1)
    assert Trainer(policy, ["Counter-v0"], TrainerConfig(algorithm=GRPO(M=2), tasks=[ev], respect_splits=False)).pool
