"""Trajectory datasets (issue 15): episodes written as JSONL or Parquet, read by `datasets.load_dataset`
and back into trajectories unchanged; `envfactory eval --save-trajectories`; the trainer writes every
step's; `Trainer.sft(trajectories=...)` trains on them (and refuses evaluation-split tasks)."""

from __future__ import annotations

import json

import pytest

torch = pytest.importorskip("torch")
datasets = pytest.importorskip("datasets")

import envfactory  # noqa: E402
from agents import Trainer  # noqa: E402
from agents.algorithms.objectives import GRPO  # noqa: E402
from agents.rollout import env_version, rollout  # noqa: E402
from agents.policies.scripted_model import ScriptedModel  # noqa: E402
from agents.train_config import OptimConfig, OutputConfig, SamplingConfig, TrainerConfig  # noqa: E402
from agents.trajectories import load_trajectories, save_trajectories  # noqa: E402
from envfactory.cli import main  # noqa: E402


@pytest.fixture(scope="module")
def played():
    """Lights-v0 episodes of the tiny model whose first turn is the reference call: some succeed."""
    from agents.policies.hf_policy import HFPolicy
    from agents.models.tiny import build_tiny_model

    torch.manual_seed(0)
    hf = HFPolicy(build_tiny_model(), device="cpu")
    spec = envfactory.spec("Lights-v0")
    tasks = spec.tasks_in("sft")
    by_text = {t.instruction: t.solution[0].to_hermes() for t in tasks}

    def first(prompt, turn):
        if turn:
            return None
        text = hf.tokenizer.decode(prompt)
        return next((call for instr, call in by_text.items() if instr in text), None)

    pol = ScriptedModel(hf.tokenizer, first, fallback=hf)
    trajs = [r.trajectory for r in rollout(pol, [(envfactory.make("Lights-v0", max_turns=2), t.id) for t in tasks],
                                           max_new_tokens=40, seed=5)]
    return hf, trajs


@pytest.mark.parametrize("fmt", ["jsonl", "parquet"])
def test_round_trip_through_datasets(played, tmp_path, fmt):
    _, trajs = played
    path = save_trajectories(trajs, tmp_path, format=fmt)
    assert path.name == f"trajectories.{fmt}"
    ds = datasets.load_dataset("json" if fmt == "jsonl" else "parquet", data_files=str(path), split="train")
    assert len(ds) == len(trajs)
    row, first = ds[0], trajs[0]
    assert row["env_name"] == "Lights-v0" and row["env_version"] == env_version(envfactory.spec("Lights-v0"))
    assert row["task_id"] == first.task_id and row["seed"] == first.seed == 5
    assert row["prompt_ids"] == first.prompt_ids and row["response_ids"] == first.response_ids
    assert row["loss_mask"] == first.loss_mask and row["reward"] == first.reward
    assert row["logprobs"] == pytest.approx(first.logprobs)
    assert json.loads(row["messages"]) == first.messages and json.loads(row["tools"]) == first.tools
    back = load_trajectories(path)
    assert [t.to_json() for t in back] == [t.to_json() for t in trajs]


def test_cli_eval_saves_a_dataset(tmp_path, capsys):
    code = main(["eval", "--env", "Counter-v0", "--policy", "tiny", "--episodes", "2", "--max-new-tokens", "8",
                 "--max-turns", "2", "--json", "--save-trajectories", str(tmp_path / "ds")])
    doc = json.loads(capsys.readouterr().out)
    assert code == 0 and doc["trajectories_dataset"].endswith("trajectories.jsonl")
    ds = datasets.load_dataset("json", data_files=doc["trajectories_dataset"], split="train")
    assert len(ds) == 2 and set(ds["env_name"]) == {"Counter-v0"}
    assert {envfactory.spec("Counter-v0").split(t) for t in ds["task_id"]} == {"eval"}


def test_trainer_writes_its_steps_and_sft_trains_on_recorded_successes(played, tmp_path):
    hf, trajs = played
    wins = [t for t in trajs if t.success]
    assert wins
    cfg = TrainerConfig(algorithm=GRPO(M=2), sampling=SamplingConfig(max_new_tokens=8, max_turns=1),
                        optim=OptimConfig(lr=1e-3, tasks_per_step=1),
                        output=OutputConfig(dir=str(tmp_path / "run"), save_trajectories=True, show_progress=False))
    tr = Trainer(hf, ["Lights-v0"], cfg)
    tr.train_step()
    written = load_trajectories(tmp_path / "run" / "trajectories.jsonl")
    assert len(written) == 2 and all(t.env_name == "Lights-v0" for t in written)
    path = save_trajectories(trajs, tmp_path / "recorded.jsonl")
    before = [p.detach().clone() for p in hf.model.parameters()]
    out = tr.sft(trajectories=path, epochs=1)
    assert out["examples"] == len(wins)
    assert any(not torch.equal(a, b) for a, b in zip(before, hf.model.parameters()))
    assert tr.sft(trajectories=path, epochs=1, successful_only=False)["examples"] == len(trajs)
    leaked = [t.copy() for t in wins[:1]]
    leaked[0].task_id = envfactory.spec("Lights-v0").tasks_in("eval")[0].id
    with pytest.raises(ValueError, match="evaluation-split"):
        tr.sft(trajectories=leaked)


def test_one_format_whatever_the_writer(played, tmp_path, capsys):
    """The evaluation CLI's --trajectories FILE, --save-trajectories DIR and the library write the same
    rows; a file of the old nested layout still reads; a row that is not a trajectory names its line."""
    _, trajs = played
    rows = [json.loads(line) for line in save_trajectories(trajs, tmp_path / "lib.jsonl").read_text().splitlines()]
    assert all(isinstance(r["messages"], str) and isinstance(r["tools"], str) for r in rows)
    nested = tmp_path / "nested.jsonl"
    nested.write_text("".join(json.dumps(t.to_json()) + "\n" for t in trajs))
    assert load_trajectories(nested) == trajs
    bad = tmp_path / "bad.jsonl"
    bad.write_text(json.dumps(rows[0]) + "\n" + json.dumps({**rows[0], "reward": "high"}) + "\n")
    with pytest.raises(ValueError, match=r"bad.jsonl:2: not a trajectory row"):
        load_trajectories(bad)
    code = main(["eval", "--env", "Counter-v0", "--policy", "noop", "--json", "--trajectories", str(tmp_path / "t.txt")])
    assert code == 2 and "name a .jsonl or .parquet file" in json.loads(capsys.readouterr().out)["error"]
