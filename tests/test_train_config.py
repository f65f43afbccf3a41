"""The one Trainer config (issue 30): ``TrainerConfig`` is the JSON/YAML file, round-trips through both,
names a wrong key or type; a Trainer built from a file trains; ``envfactory train --config FILE``."""

from __future__ import annotations

import json

import pytest
import yaml

from agents.algorithms.objectives import ARPO, GRPO
from agents.policies.scripted_model import ScriptedModel
from agents.trainer import Trainer
from agents.train_config import (EvalConfig, LearnerConfig, LoRAConfig, OptimConfig, OutputConfig, RuntimeConfig,
                                 SamplingConfig, SFTConfig, TrainerConfig)

# one tiny GRPO step on Counter-v0: 1 task x M=2 rollouts of one 8-token turn
TINY = {"envs": ["Counter-v0"], "tasks": ["counter-0-3"], "respect_splits": False, "steps": 1,
        "algorithm": {"name": "grpo", "M": 2}, "sampling": {"max_new_tokens": 8, "max_turns": 1},
        "optim": {"lr": 1.0e-3, "tasks_per_step": 1}, "output": {"show_progress": False}}


def _every_section_changed() -> TrainerConfig:
    return TrainerConfig(
        model={"reader_0": "tiny", "writer_0": "some/model"}, envs=["MultiRecords-v0", "Counter-v0"], device="cpu",
        tasks=["records-000"], respect_splits=False, seed=7, steps=3,
        algorithm=ARPO(M=6, N=3, k=4, alpha=0.3, beta=0.0, mode="threshold", tau=0.01, Z=2, attribution="hard",
                       standardize=False, clip_eps=0.1, kl_coef=0.05, updates=2),
        sampling=SamplingConfig(max_new_tokens=16, temperature=0.7, max_turns=2, max_context=512, mode="parallel"),
        optim=OptimConfig(lr=2e-4, tasks_per_step=3, micro_batch=4, grad_clip=0.5),
        learner=LearnerConfig(parallel="dp", autocast="bf16", gradient_checkpointing=True,
                              lora=LoRAConfig(r=4, alpha=8.0, dropout=0.1, target_modules=["q_proj", "v_proj"])),
        sft=SFTConfig(epochs=2, lr=3e-3, batch_size=1, tasks=["records-001"]),
        eval=EvalConfig(samples=2, temperature=0.5, seed=1, tasks=["records-002"]),
        runtime=RuntimeConfig(rollout="ray", workers=3, ray_options={"step_timeout": 30.0}),
        output=OutputConfig(dir="runs/x", save_every=2, save_trajectories=True, show_progress=False, resume=True))


@pytest.mark.parametrize("suffix", [".yaml", ".json"])
@pytest.mark.parametrize("make", [TrainerConfig, _every_section_changed,
                                  lambda: TrainerConfig(algorithm=GRPO(M=4, kl_coef=0.1), envs=["Counter-v0"])])
def test_the_config_round_trips_through_its_file(tmp_path, suffix, make):
    cfg = make()
    path = cfg.to_file(tmp_path / f"run{suffix}")
    text = path.read_text()
    assert (json.loads(text) if suffix == ".json" else yaml.safe_load(text)) == cfg.to_dict()
    back = TrainerConfig.from_file(path)
    assert back == cfg and type(back.algorithm) is type(cfg.algorithm)
    assert back.to_dict() == cfg.to_dict()


def test_the_documented_file_is_every_default():
    import textwrap

    import agents.train_config as module

    documented = textwrap.dedent(module.__doc__.split("::\n", 1)[1].split("\n\n", 1)[0])
    assert TrainerConfig.from_dict(yaml.safe_load(documented)) == TrainerConfig(envs=["Counter-v0"])


def test_the_example_config_reads():
    from pathlib import Path

    cfg = TrainerConfig.from_file(Path(__file__).resolve().parents[1] / "examples/train/arpo_findlight.yaml")
    assert cfg.envs == ["FindLight-v0"] and cfg.algorithm == ARPO(M=8, N=4, k=8, kl_coef=0.1)
    assert cfg.sft == SFTConfig(epochs=4, lr=2e-3) and cfg.optim.lr == 5e-4
    examples = Path(__file__).resolve().parents[1] / "examples/train"
    smol = TrainerConfig.from_file(examples / "gpu_smol.yaml")  # the GPU recipes read (run when a GPU is lent)
    assert smol.model == "smol" and smol.learner == LearnerConfig(parallel="none", autocast="bf16")
    node = TrainerConfig.from_file(examples / "gpu_node.yaml")
    assert node.learner == LearnerConfig(parallel="fsdp2", autocast="bf16", gradient_checkpointing=True)


def test_a_missing_key_is_its_default_and_yaml_floats_need_no_dot(tmp_path):
    assert TrainerConfig.from_dict({}) == TrainerConfig()
    path = tmp_path / "run.yaml"
    path.write_text("envs: [Counter-v0]\noptim: {lr: 1e-5}\nalgorithm: {name: grpo}\nsft: {}\n")
    cfg = TrainerConfig.from_file(path)
    assert cfg.optim == OptimConfig(lr=1e-5) and cfg.algorithm == GRPO() and cfg.sft == SFTConfig()
    assert cfg.eval is None and cfg.sampling == SamplingConfig()


@pytest.mark.parametrize("bad, message", [
    ({"trainer": {}}, "config: unknown key 'trainer'; the valid keys are ['model', 'envs',"),
    ({"optim": {"learning_rate": 1.0}}, "config.optim: unknown key 'learning_rate'; the valid keys are ['lr',"),
    ({"algorithm": {"name": "grpo", "N": 4}}, "config.algorithm (grpo): unknown key 'N'; the valid keys are ['M',"),
    ({"algorithm": {"name": "ppo"}}, "config.algorithm.name: 'ppo' is not an algorithm; use one of ['arpo', 'grpo', 'rft']"),
    ({"algorithm": {"M": 2}}, "config.algorithm (arpo): need 1 <= N <= M"),
    ({"steps": "10"}, "config.steps: expected an integer, got str '10'"),
    ({"steps": True}, "config.steps: expected an integer, got bool True"),
    ({"optim": {"lr": "fast"}}, "config.optim.lr: expected a number, got str 'fast'"),
    ({"envs": "Counter-v0"}, "config.envs: expected a list, got str 'Counter-v0'"),
    ({"envs": [3]}, "config.envs[0]: expected a string, got int 3"),
    ({"model": 3}, "config.model: expected str or a mapping, got int 3"),
    ({"sampling": {"mode": "async"}}, "config.sampling.mode: expected one of ['aec', 'parallel'], got 'async'"),
    ({"runtime": {"rollout": "k8s"}}, "config.runtime.rollout: expected one of ['local', 'ray'], got 'k8s'"),
    ({"sft": {"epoch": 3}}, "config.sft: unknown key 'epoch'; the valid keys are ['epochs',"),
    ({"eval": 4}, "config.eval: expected a mapping with keys ['samples',"),
    ({"output": {"save_trajectories": True}}, "output.save_trajectories needs output.dir"),
    (["Counter-v0"], "config: expected a mapping with keys"),
])
def test_a_wrong_key_or_type_is_an_error_naming_it(bad, message):
    with pytest.raises(ValueError) as err:
        TrainerConfig.from_dict(bad)
    assert message in str(err.value)


def test_a_bad_file_is_an_error_naming_it(tmp_path):
    for name, text, what in [("a.yaml", "envs: [Counter-v0\n", "not valid YAML"), ("a.json", "{envs: 1}", "not valid JSON"),
                             ("b.yaml", "envs: [Counter-v0]\nsteps: many\n", "config.steps")]:
        (tmp_path / name).write_text(text)
        with pytest.raises(ValueError, match=what) as err:
            TrainerConfig.from_file(tmp_path / name)
        assert str(tmp_path / name) in str(err.value)


# -- a Trainer from a file ----------------------------------------------------------------------
def test_a_trainer_built_from_a_config_file_trains_a_step(tmp_path):
    torch = pytest.importorskip("torch")
    torch.manual_seed(0)
    path = tmp_path / "run.yaml"
    path.write_text(yaml.safe_dump({**TINY, "output": {"dir": str(tmp_path / "out"), "show_progress": False}}))
    tr = Trainer.from_config(TrainerConfig.from_file(path))
    try:
        assert tr.config == TrainerConfig.from_file(path) and tr.algorithm == GRPO(M=2)
        assert [t for _, t in tr.pool] == ["counter-0-3"] and tr.optimizer.param_groups[0]["lr"] == 1e-3
        (row,) = tr.train()  # config.steps
        assert tr.step == 1 and row["episodes"] == 2 and row["algorithm"] == "GRPO"
        assert all(e.status.max_turns == 1 for e in tr.envs)
        assert (tmp_path / "out" / "checkpoints" / "step-1").is_dir()
        assert json.loads((tmp_path / "out" / "metrics.jsonl").read_text().splitlines()[-1])["step"] == 1
    finally:
        tr.close()


def test_a_config_compares_equal_before_and_after_training():
    """The config is a value: training keeps its run state (ARPO's running ΔH scale, the step) on the
    Trainer, so the config it was given compares equal afterwards, and its algorithm cannot be changed."""
    import copy
    import dataclasses

    torch = pytest.importorskip("torch")
    torch.manual_seed(0)
    cfg = TrainerConfig.from_dict({**TINY, "steps": 2, "sampling": {"max_new_tokens": 8, "max_turns": 3},
                                   "algorithm": {"name": "arpo", "M": 4, "N": 2, "k": 4, "branch_after": "any"}})
    before = copy.deepcopy(cfg)
    tr = Trainer.from_config(cfg)
    try:
        tr.train()
        # a sampling round in which ARPO decides on branches (a scripted model calls a tool, then answers)
        learner = tr.team
        tr.team = ScriptedModel(learner.tokenizer, lambda ids, turn: '<tool_call>{"name": "increment", '
                                '"arguments": {}}</tool_call>' if turn < 2 else "Done.")
        tr._groups(tr.pool[:1], tr.algorithm, seed=0, temperature=1.0)
        tr.team = learner
        assert tr.branch_scale is not None and tr.branch_scale.mean_square is not None  # ARPO decided
        assert tr.config is cfg and cfg == before and cfg.to_dict() == before.to_dict()
        assert vars(cfg.algorithm) == vars(before.algorithm)  # no hidden field (compare=False) changed either
        with pytest.raises(dataclasses.FrozenInstanceError):
            cfg.algorithm.N = 3  # type: ignore[misc]
    finally:
        tr.close()


def test_a_team_config_builds_a_learner_per_role():
    pytest.importorskip("torch")
    cfg = TrainerConfig.from_dict({"model": {"reader_0": "tiny", "writer_0": "tiny"}, "envs": ["MultiRecords-v0"],
                                   "algorithm": {"name": "grpo", "M": 2}})
    tr = Trainer.from_config(cfg)
    assert sorted(ln.label for ln in tr.learners) == ["reader_0", "writer_0"]
    tr.close()
    with pytest.raises(ValueError, match="envs is empty"):
        Trainer.from_config(TrainerConfig())


def test_a_trainer_takes_only_a_trainer_config():
    pytest.importorskip("torch")
    from agents import Trainer

    with pytest.raises(TypeError, match="config must be a TrainerConfig"):
        Trainer(object(), ["Counter-v0"], {"steps": 1})


# -- envfactory train --config FILE ---------------------------------------------------------------
def test_cli_train_runs_a_config_file(tmp_path, capsys):
    pytest.importorskip("torch")
    from envfactory.cli import main

    path = tmp_path / "run.json"
    path.write_text(json.dumps({**TINY, "steps": 5}))
    out = tmp_path / "out"
    rc = main(["train", "--config", str(path), "--steps", "1", "--output-dir", str(out), "--json"])
    doc = json.loads(capsys.readouterr().out)
    assert rc == 0, doc
    assert doc["steps"] == 1 and doc["algorithm"] == "GRPO" and doc["tasks"] == 1 and doc["last"]["episodes"] == 2
    assert doc["output_dir"] == str(out) and (out / "checkpoints" / "step-1").is_dir()


def test_cli_train_names_a_bad_key_and_prints_a_config_to_start_from(tmp_path, capsys):
    from envfactory.cli import main

    path = tmp_path / "run.yaml"
    path.write_text("envs: [Counter-v0]\noptim: {lrate: 0.1}\n")
    assert main(["train", "--config", str(path), "--json"]) == 2
    error = json.loads(capsys.readouterr().out)["error"]
    assert "config.optim: unknown key 'lrate'" in error and "'lr'" in error and str(path) in error

    assert main(["train", "--print-config"]) == 0
    printed = yaml.safe_load(capsys.readouterr().out)
    assert TrainerConfig.from_dict(printed) == TrainerConfig(envs=["Counter-v0"])
    assert main(["train", "--config", str(tmp_path / "missing.yaml")]) == 2
    assert "missing.yaml" in capsys.readouterr().err  # errors go to stderr
