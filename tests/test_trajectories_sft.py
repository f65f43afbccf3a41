"""Trajectories as an SFT dataset (issue 27): ``to_sft_dataset`` gives a conversational
``datasets.Dataset`` (``messages`` and ``tools`` real lists) that TRL's ``SFTTrainer`` trains on
unchanged, and whose messages the chat template renders into exactly the recorded sample."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
datasets = pytest.importorskip("datasets")

import envfactory  # noqa: E402
from agents.trajectories import save_trajectories, to_sft_dataset  # noqa: E402


@pytest.fixture(scope="module")
def tiny():
    from transformers import AutoTokenizer

    from agents.models.tiny import build_tiny_model

    path = build_tiny_model()
    return path, AutoTokenizer.from_pretrained(path)


@pytest.fixture(scope="module")
def references(tiny):
    """Lights-v0's reference solutions played with the tiny model's tokenizer (all succeed)."""
    from agents.algorithms.sft import reference_rollouts

    spec = envfactory.spec("Lights-v0")
    pairs = [(envfactory.make("Lights-v0"), t.id) for t in spec.tasks_in("sft")[:3]]
    return [ro.trajectory for ro in reference_rollouts(tiny[1], pairs)]


def test_rows_are_conversations_that_render_the_recorded_sample(tiny, references, tmp_path):
    tok = tiny[1]
    ds = to_sft_dataset(save_trajectories(references, tmp_path))  # from the file, as from objects
    assert len(ds) == len(references)
    for row, t in zip(ds, references):
        assert isinstance(row["messages"], list) and isinstance(row["tools"], list)
        assert all(isinstance(m, dict) and {"role", "content"} <= set(m) for m in row["messages"])
        assert row["messages"] == t.messages and row["tools"] == t.tools
        assert row["env_name"] == "Lights-v0" and row["task_id"] == t.task_id and row["success"] is True
        text = tok.apply_chat_template(row["messages"], tools=row["tools"], tokenize=False)
        assert text == tok.decode(t.prompt_ids + t.response_ids, skip_special_tokens=False,
                                  clean_up_tokenization_spaces=False)


def test_successful_only_and_unfit_trajectories(references):
    failed = references[0].copy()
    failed.success, failed.reward = False, 0.0
    broken = references[1].copy()
    broken.error = "container died"
    assert len(to_sft_dataset([failed, broken, references[2]])) == 1
    assert len(to_sft_dataset([failed, broken, references[2]], successful_only=False)) == 2
    with pytest.raises(ValueError, match="successful_only"):
        to_sft_dataset([failed])


def test_trl_sft_trainer_trains_on_it_unchanged(tiny, references, tmp_path):
    trl = pytest.importorskip("trl")
    from transformers import AutoModelForCausalLM

    path, tok = tiny
    model = AutoModelForCausalLM.from_pretrained(path)
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    args = trl.SFTConfig(output_dir=str(tmp_path / "out"), max_steps=1, per_device_train_batch_size=1,
                         report_to=[], use_cpu=True, save_strategy="no", logging_steps=1,
                         learning_rate=1e-2, dataloader_num_workers=0)
    trainer = trl.SFTTrainer(model=model, args=args, train_dataset=to_sft_dataset(references),
                             processing_class=tok)
    trainer.train()
    assert any(not torch.equal(before[n], p.detach()) for n, p in model.named_parameters())
