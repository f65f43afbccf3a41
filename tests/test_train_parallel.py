"""Training beyond one process and one precision (issue 58): ``torchrun`` with gloo on CPU, plain data
parallel and FSDP2, a step equal to the one-process step on the union of the ranks' samples; LoRA through
peft; bfloat16 trainable weights refused by name; a step whose every rollout failed raises."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import require_module, require_torch

require_torch()
require_module("peft", "pip install 'envfactory[train]'")

import torch  # noqa: E402
from safetensors.torch import load_file  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))
import parallel_step  # noqa: E402

sys.path.pop(0)


def _one_process(updates: int = 1, lora: bool = False, autocast: bool = False, kl: float = 0.0,
                 lr: float = 1e-3) -> tuple[dict, list[float], dict]:
    """The same step in this process, on rank 0's and rank 1's samples together."""
    tr = parallel_step.trainer("none", lora=lora, autocast=autocast, kl=kl, lr=lr)
    try:
        rows = parallel_step.samples(tr, 0) + parallel_step.samples(tr, 1)
        parallel_step.old_logprobs(tr, rows)
        before = {k: v.detach().clone() for k, v in tr.model.state_dict().items()}
        losses = [tr._update(tr.learners[0], rows)["loss"] for _ in range(updates)]
        return {k: v.detach().clone() for k, v in tr.model.state_dict().items()}, losses, before
    finally:
        tr.close()


def _torchrun(mode: str, out: Path, *extra: str) -> tuple[dict, dict]:
    r = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2",
                        str(ROOT / "tests" / "parallel_step.py"), mode, str(out), *extra],
                       capture_output=True, text=True, timeout=600, cwd=ROOT)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-6000:]
    return load_file(str(out) + ".safetensors"), json.loads(Path(str(out) + ".json").read_text())


@pytest.mark.slow
@pytest.mark.parametrize("mode, kl", [("dp", 0.0), ("fsdp2", 0.0), ("fsdp2", 0.1), ("dp", 0.1)])
def test_a_step_on_two_processes_equals_one_process_on_the_union_of_their_samples(mode, kl, tmp_path):
    """Rank 0 trains on 3 samples, rank 1 on 5 (micro-batches of 2: FSDP2's ranks run different numbers of
    real passes); after one step every parameter equals the one-process step's on all 8, to 1e-5. With a
    KL penalty the step is two updates (the second one sees the reference: under FSDP2 it is built from the
    full state dict and sharded alike). At lr 1e-4 AdamW moves each weight by about 1e-4 a update, and the
    ranks' different summation order moves the weights whose gradient is near AdamW's epsilon by up to
    about 7e-7 (7e-6 at lr 1e-3, measured)."""
    updates = 2 if kl else 1
    got, meta = _torchrun(mode, tmp_path / mode, "--kl", str(kl), "--updates", str(updates), "--lr", "1e-4")
    assert meta["world"] == 2 and meta["mode"] == mode
    want, losses, before = _one_process(updates=updates, kl=kl, lr=1e-4)
    assert set(got) == set(want)
    moved = max(float((want[k] - before[k]).abs().max()) for k in want)
    assert moved > 5e-5  # the step moved the weights, so equality says something
    for k in want:
        assert torch.allclose(got[k].float(), want[k].float(), atol=1e-5, rtol=0), \
            (k, float((got[k].float() - want[k].float()).abs().max()))
    assert meta["losses"] == pytest.approx(losses, abs=1e-5)  # every rank reports the global loss


@pytest.mark.slow
def test_an_fsdp2_checkpoint_resumes_in_one_process(tmp_path):
    """A checkpoint written by 2 FSDP2 ranks holds full state dicts: one process loads it, with the
    sharded weights and AdamW's state, and its next step equals the step the two ranks would take."""
    got, _ = _torchrun("fsdp2", tmp_path / "ckpt", "--save", str(tmp_path / "run"))
    tr = parallel_step.trainer("none")
    try:
        tr.load(tmp_path / "run" / "step-0")
        for k, v in tr.model.state_dict().items():
            assert torch.allclose(v, got[k], atol=0, rtol=0), k
        state = tr.optimizer.state_dict()["state"]
        assert len(state) == len(list(tr.model.parameters())) and all(float(s["step"]) == 1 for s in state.values())
    finally:
        tr.close()


@pytest.mark.slow
@pytest.mark.parametrize("lora", [False, True])
def test_fsdp2_trains_with_the_loss_falling(lora, tmp_path):
    """Five updates on fixed samples under FSDP2 (2 ranks), every weight or LoRA adapters: the loss falls;
    with LoRA only the adapters moved."""
    got, meta = _torchrun("fsdp2", tmp_path / "run", *(["--lora"] if lora else []), "--updates", "5")
    losses = meta["losses"]
    assert losses[-1] < losses[0] - 1e-3, losses
    tr = parallel_step.trainer("none", lora=lora)
    base = {k: v.detach().clone() for k, v in tr.model.state_dict().items()}
    tr.close()
    moved = [k for k in got if not torch.equal(got[k], base[k])]
    if lora:
        assert moved and all("lora_" in k for k in moved)  # the base is frozen
    else:
        assert len(moved) == len(got)


def test_lora_trains_in_one_process_with_the_loss_falling():
    """LoRA through peft: only the adapters are trainable (a small share of the weights), five updates make
    the loss fall, and the KL reference is the base with the adapters off (no copy of the model)."""
    _, losses, _ = _one_process(updates=5, lora=True)
    assert losses[-1] < losses[0] - 1e-3, losses
    tr = parallel_step.trainer("none", lora=True)
    try:
        from agents.models.adapters import adapters_off, trainable_parameters

        n = sum(p.numel() for p in trainable_parameters(tr.model))
        assert 0 < n < 0.05 * sum(p.numel() for p in tr.model.parameters())
        rows = parallel_step.samples(tr, 0)
        parallel_step.old_logprobs(tr, rows)
        tr._update(tr.learners[0], rows)
        ids = torch.tensor([rows[0].ids])
        with torch.no_grad():
            trained = tr.model(ids).logits
            with adapters_off(tr.model):
                base = tr.model(ids).logits
        assert not torch.allclose(trained, base)  # the adapters changed the model; off, it is the base
        assert tr.learners[0].ref_model is None
    finally:
        tr.close()


def test_bf16_trainable_weights_are_refused_by_name():
    """AdamW over bfloat16 weights silently trains almost nothing: the Trainer refuses them, naming the
    dtype and the fix, unless they are LoRA adapters over a bfloat16 base (which stay float32)."""
    from agents.policies.hf_policy import HFPolicy
    from agents.models.tiny import build_tiny_model
    from agents.trainer import Trainer
    from agents.train_config import TrainerConfig

    cfg = TrainerConfig.from_dict({k: v for k, v in parallel_step.TINY.items()})
    pol = HFPolicy(build_tiny_model(), device="cpu", dtype=torch.bfloat16)
    with pytest.raises(TypeError, match=r"trainable weights are bfloat16.*float32.*learner\.autocast: bf16"):
        Trainer(pol, ["Counter-v0"], config=cfg)
    lora = TrainerConfig.from_dict({**parallel_step.TINY, "learner": {"lora": {"r": 4}}})
    tr = Trainer(pol, ["Counter-v0"], config=lora)
    try:
        from agents.models.adapters import trainable_parameters

        assert {p.dtype for p in trainable_parameters(tr.model)} == {torch.float32}
        assert tr.model.model.embed_tokens.weight.dtype == torch.bfloat16  # the frozen base stays bfloat16
    finally:
        tr.close()


def test_autocast_trains_float32_weights_with_bfloat16_forward_passes():
    """``learner.autocast: bf16``: the forward passes run in bfloat16, the float32 weights are the master
    copy AdamW updates; at ARPO's learning rate (1e-6) ten steps move every trainable weight."""
    tr = parallel_step.trainer("none", autocast=True)
    try:
        for g in tr.optimizer.param_groups:
            g["lr"] = 1e-6
        rows = parallel_step.samples(tr, 0) + parallel_step.samples(tr, 1)
        parallel_step.old_logprobs(tr, rows)
        before = {n: p.detach().clone() for n, p in tr.model.named_parameters()}
        for _ in range(10):
            tr._update(tr.learners[0], rows)
        moved = sum(int((p.detach() != before[n]).sum()) for n, p in tr.model.named_parameters())
        total = sum(p.numel() for p in tr.model.parameters())
        assert all(p.dtype == torch.float32 for p in tr.model.parameters())
        assert moved >= 0.99 * total, moved / total
    finally:
        tr.close()


def test_gradient_checkpointing_gives_the_same_step():
    """``learner.gradient_checkpointing``: activations recomputed in the backward pass (the shared-prefix
    log-probs then run every sequence in full: checkpointing turns the KV cache off) and the same step."""
    after = []
    for checkpointing in (False, True):
        tr = parallel_step.trainer("none", kl=0.1, checkpointing=checkpointing)
        try:
            assert tr.model.is_gradient_checkpointing == checkpointing
            rows = parallel_step.samples(tr, 0) + parallel_step.samples(tr, 1)
            parallel_step.old_logprobs(tr, rows)
            losses = [tr._update(tr.learners[0], rows)["loss"] for _ in range(2)]
            after.append((losses, {k: v.detach().clone() for k, v in tr.model.state_dict().items()}))
        finally:
            tr.close()
    (plain, a), (ckpt, b) = after
    assert ckpt == pytest.approx(plain, abs=1e-5)
    assert all(torch.allclose(a[k], b[k], atol=1e-5, rtol=0) for k in a)


def test_a_wrapper_the_sampler_cannot_use_names_itself():
    from agents.policies.hf_policy import HFPolicy
    from agents.models.tiny import build_tiny_model
    from agents.trainer import Trainer
    from agents.train_config import TrainerConfig

    pol = HFPolicy(build_tiny_model(), device="cpu")
    with pytest.raises(TypeError, match="DataParallel.*learner.parallel"):
        Trainer(pol, ["Counter-v0"], config=TrainerConfig.from_dict(parallel_step.TINY),
                model=torch.nn.DataParallel(pol.model))


def test_a_step_whose_every_rollout_failed_raises_with_the_first_error():
    """A backend that fails every request: the step raises, naming the first error, instead of returning
    success 0 and loss 0 as if it had trained."""
    tr = parallel_step.trainer("none")
    try:
        def broken(*args, **kwargs):
            raise RuntimeError("backend down (test)")

        tr.team.generate = broken
        with pytest.raises(RuntimeError, match=r"rollouts failed; the first error: .*backend down \(test\)"):
            tr.train_step()
        assert tr.step == 0
    finally:
        tr.close()


@pytest.mark.slow
def test_envfactory_train_runs_under_torchrun(tmp_path):
    """The documented command: ``torchrun --nproc-per-node 2 -m envfactory.cli train --config FILE``, a
    warm start, one step of plain data parallel and the evaluations; rank 0 alone writes the metrics (one
    training row, not two) and the checkpoint."""
    import yaml

    out = tmp_path / "run"
    cfg = {"model": "tiny", "envs": ["Counter-v0"], "steps": 1, "respect_splits": False,
           "algorithm": {"name": "grpo", "M": 2}, "sampling": {"max_new_tokens": 8},
           "optim": {"lr": 1.0e-3, "tasks_per_step": 1}, "sft": {"epochs": 1, "tasks": ["counter-0-3"]},
           "eval": {"samples": 1, "tasks": ["counter-0-3"]}, "output": {"dir": str(out), "show_progress": False}}
    (tmp_path / "run.yaml").write_text(yaml.safe_dump(cfg))
    r = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2", "-m",
                        "envfactory.cli", "train", "--config", str(tmp_path / "run.yaml")],
                       capture_output=True, text=True, timeout=900, cwd=ROOT)
    assert r.returncode == 0, r.stderr[-4000:]
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert [x["step"] for x in rows if x.get("phase") == "train"] == [1]
    assert (out / "checkpoints" / "step-1" / "model.safetensors").is_file()
