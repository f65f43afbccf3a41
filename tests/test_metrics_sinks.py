"""Metric sinks (issue 27, logging): ``output.sinks`` and ``Trainer(sinks=[...])`` send every row of a run to
JSONL (unchanged), TensorBoard, Weights & Biases and any callable; the config file carries ``sinks``; an
unknown sink or a missing extra is an error that says what to do."""

from __future__ import annotations

import json
import sys
import types

import pytest
import yaml

from agents.train_config import OutputConfig, TrainerConfig
from conftest import require_module

# two tiny GRPO steps on Counter-v0: 1 task x M=2 rollouts of one 8-token turn
TINY = {"envs": ["Counter-v0"], "tasks": ["counter-0-3"], "respect_splits": False, "steps": 2,
        "algorithm": {"name": "grpo", "M": 2}, "sampling": {"max_new_tokens": 8, "max_turns": 1},
        "optim": {"lr": 1.0e-3, "tasks_per_step": 1}}


class FakeWandb(types.ModuleType):
    """Stands in for ``wandb`` (not installed here) and records the calls made to it."""

    def __init__(self) -> None:
        super().__init__("wandb")
        self.calls: list[tuple[str, tuple, dict]] = []

    def __getattr__(self, name: str):
        if name not in ("init", "log", "define_metric", "finish"):
            raise AttributeError(name)
        return lambda *a, **kw: self.calls.append((name, a, kw))


def _flat(d: dict, path: str = "") -> dict[str, float]:
    """A row's numbers by their path, as the trackers should receive them (the spec, written out again)."""
    out: dict[str, float] = {}
    for k, v in d.items():
        if isinstance(v, dict):
            out.update(_flat(v, f"{path}{k}/"))
        elif isinstance(v, (int, float)):
            out[f"{path}{k}"] = float(v)
    return out


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    """A 2-step run from a YAML file with ``sinks: [jsonl, tensorboard, wandb]`` (a fake wandb) and a callable."""
    torch = pytest.importorskip("torch")
    pytest.importorskip("transformers")
    require_module("tensorboard", "pip install 'envfactory[tensorboard]'; scripts/setup.sh installs it")
    from agents.policies.hf_policy import HFPolicy
    from agents.models.tiny import build_tiny_model
    from agents.trainer import Trainer

    tmp = tmp_path_factory.mktemp("sinks")
    path = tmp / "run.yaml"
    path.write_text(yaml.safe_dump({**TINY, "output": {"dir": str(tmp / "out"), "show_progress": False,
                                                      "sinks": ["jsonl", "tensorboard", "wandb"]}}))
    cfg = TrainerConfig.from_file(path)
    seen: list[dict] = []
    wandb = FakeWandb()
    with pytest.MonkeyPatch.context() as mp:
        mp.setitem(sys.modules, "wandb", wandb)
        torch.manual_seed(0)
        tr = Trainer(HFPolicy(build_tiny_model(), device="cpu"), cfg.envs, cfg, sinks=[seen.append])
        try:
            rows = tr.train()
        finally:
            tr.close()
    assert [r["step"] for r in rows] == [1, 2]
    return types.SimpleNamespace(out=tmp / "out", rows=rows, seen=seen, wandb=wandb, config=cfg)


def test_the_config_file_carries_sinks_and_defaults_to_jsonl(tmp_path):
    assert TrainerConfig().output.sinks == ["jsonl"]  # nothing changes by default
    assert TrainerConfig.from_dict({"output": {}}).output.sinks == ["jsonl"]
    cfg = TrainerConfig(envs=["Counter-v0"], output=OutputConfig(dir="runs/x", sinks=["jsonl", "tensorboard"]))
    for name in ("run.yaml", "run.json"):
        back = TrainerConfig.from_file(cfg.to_file(tmp_path / name))
        assert back == cfg and back.output.sinks == ["jsonl", "tensorboard"]
    assert yaml.safe_load((tmp_path / "run.yaml").read_text())["output"]["sinks"] == ["jsonl", "tensorboard"]
    (tmp_path / "hand.yaml").write_text("output: {sinks: [tensorboard, wandb]}\n")
    assert TrainerConfig.from_file(tmp_path / "hand.yaml").output.sinks == ["tensorboard", "wandb"]


def test_an_unknown_sink_is_an_error_naming_it_and_the_sinks(tmp_path):
    (tmp_path / "bad.yaml").write_text("output: {sinks: [jsonl, tensorbord]}\n")
    with pytest.raises(ValueError, match="unknown sink 'tensorbord'") as err:
        TrainerConfig.from_file(tmp_path / "bad.yaml")
    assert "['jsonl', 'tensorboard', 'wandb']" in str(err.value) and "bad.yaml" in str(err.value)
    with pytest.raises(ValueError, match="unknown sink 'csv'"):
        OutputConfig(sinks=["csv"])
    with pytest.raises(ValueError, match="config.output.sinks: expected a list"):
        TrainerConfig.from_dict({"output": {"sinks": "tensorboard"}})


@pytest.mark.parametrize("sink,extra", [("wandb", "wandb"), ("tensorboard", "tensorboard")])
def test_a_missing_package_names_the_extra_to_install(tmp_path, monkeypatch, sink, extra):
    pytest.importorskip("torch")
    pytest.importorskip("transformers")
    from agents.policies.hf_policy import HFPolicy
    from agents.models.tiny import build_tiny_model
    from agents.trainer import Trainer

    monkeypatch.setitem(sys.modules, extra, None)  # `import <extra>` raises ImportError, as when not installed
    cfg = TrainerConfig.from_dict({**TINY, "output": {"dir": str(tmp_path), "sinks": ["jsonl", sink]}})
    with pytest.raises(ImportError, match=rf"pip install 'envfactory\[{extra}\]'"):
        Trainer(HFPolicy(build_tiny_model(), device="cpu"), cfg.envs, cfg)


def test_a_sink_object_must_write_or_be_callable():
    from agents.metrics import make_sinks

    with pytest.raises(ValueError, match="write\\(row\\) and close\\(\\)"):
        make_sinks([], None, objects=[42])
    with pytest.raises(ValueError, match="tensorboard sink writes under output.dir"):
        make_sinks(["tensorboard"], None)


def test_jsonl_is_unchanged_one_json_object_per_row(run):
    lines = (run.out / "metrics.jsonl").read_text().splitlines()
    assert lines == [json.dumps(r) for r in run.rows]  # the file format other code and tests read
    assert [json.loads(x)["step"] for x in lines] == [1, 2]


def test_a_callable_sink_sees_every_row(run):
    assert run.seen == run.rows


def test_tensorboard_scalars_equal_the_rows(run):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    acc = EventAccumulator(str(run.out / "tensorboard"), size_guidance={"scalars": 0})
    acc.Reload()
    want: dict[str, list[tuple[int, float]]] = {}
    for row in run.rows:
        for name, value in _flat({k: v for k, v in row.items() if k not in ("step", "phase")}).items():
            want.setdefault(f"train/{name}", []).append((row["step"], value))
    assert {"train/success", "train/loss", "train/grad_norm"} <= set(want)
    assert any(t.startswith("train/learners/") for t in want)  # per-learner figures, under the learner
    assert sorted(acc.Tags()["scalars"]) == sorted(want)
    for tag, points in want.items():
        got = [(e.step, e.value) for e in acc.Scalars(tag)]
        assert [s for s, _ in got] == [s for s, _ in points], tag
        assert [v for _, v in got] == pytest.approx([v for _, v in points], rel=1e-6, abs=1e-6), tag


def test_wandb_gets_init_then_a_log_per_row_then_finish(run):
    """Checks the adapter's calls into the ``wandb`` module (a recording fake), not wandb itself."""
    names = [c[0] for c in run.wandb.calls]
    assert names[0] == "init" and names[-1] == "finish" and names.count("finish") == 1
    init = run.wandb.calls[0][2]
    assert init["dir"] == str(run.out) and init["config"] == run.config.to_dict()
    logged = [c[1][0] for c in run.wandb.calls if c[0] == "log"]
    assert len(logged) == len(run.rows)
    for row, got in zip(run.rows, logged):
        flat = _flat({k: v for k, v in row.items() if k not in ("step", "phase")})
        assert got == {**{f"train/{k}": v for k, v in flat.items()}, "train/step": row["step"]}
    assert ("define_metric", ("train/*",), {"step_metric": "train/step"}) in run.wandb.calls


def test_tensorboard_tags_an_sft_row_by_its_learner_at_its_epoch(tmp_path):
    require_module("tensorboard", "pip install 'envfactory[tensorboard]'; scripts/setup.sh installs it")
    pytest.importorskip("torch")
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    from agents.metrics import TensorBoardSink

    sink = TensorBoardSink(tmp_path)
    for epoch, nll in [(1, 2.5), (2, 1.25)]:
        sink.write({"phase": "sft", "learner": "reader_0", "epoch": epoch, "nll": nll})
    sink.close()
    acc = EventAccumulator(str(tmp_path))
    acc.Reload()
    assert acc.Tags()["scalars"] == ["sft/reader_0/nll"]
    assert [(e.step, e.value) for e in acc.Scalars("sft/reader_0/nll")] == [(1, 2.5), (2, 1.25)]
