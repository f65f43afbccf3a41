"""The one configuration of a :class:`~agents.trainer.Trainer`, and the file format of ``envfactory train``.

:class:`TrainerConfig` is typed and nested, one section per concern, and its
dict form is the JSON/YAML file (``from_file`` / ``from_dict`` / ``to_dict``
round-trip; an unknown key or a wrong type is an error naming the key). Every
default is the Trainer's default. A complete file, every value its default but
``envs`` (``envfactory train --print-config`` writes it)::

    model: tiny          # what `envfactory train` trains: tiny, smol, a model folder or HF id, or {agent id: model}
    envs: [Counter-v0]   # environment names (single-agent or teams)
    device: null         # torch device of the policies `build` makes (null: cuda when there is one)
    tasks: null          # task ids ("task" or "Env-v0/task"); null: each environment's rl split
    respect_splits: true # false: eval-split tasks may be trained on, and every default is the training pool
    seed: 0              # task choice, sampling and branching of every step
    steps: 10            # RL steps of Trainer.train()
    algorithm: {name: arpo, M: 16, clip_eps: 0.2, kl_coef: 0.0, updates: 1, shuffle_rewards: false, N: 8, k: 20,
                alpha: 0.5, beta: 0.2, mode: probability, tau: 0.0, Z: 1, attribution: soft, standardize: true,
                scale: run, scale_ema: 0.1, branch_after: valid_tool_result}   # or {name: grpo | rft, M, clip_eps, kl_coef, updates, shuffle_rewards}
    sampling: {max_new_tokens: 128, temperature: 1.0, max_turns: null, max_context: null, mode: aec, processes: 1}
    optim: {lr: 1.0e-05, tasks_per_step: 4, micro_batch: 16, grad_clip: 1.0}
    learner: {parallel: auto, autocast: null, gradient_checkpointing: false,
              lora: null}   # lora: {r: 16, alpha: 32.0, dropout: 0.0, target_modules: null}
    sft: null            # {epochs: 10, lr: 0.001, batch_size: 8, tasks: null}: warm start before RL (envfactory train)
    eval: null           # {samples: 4, temperature: null, seed: 12345, tasks: null}: success before and after
    runtime: {rollout: local, workers: 2, ray_options: {}}
    output: {dir: null, save_every: 0, save_trajectories: false, show_progress: true, resume: false,
             sinks: [jsonl]}   # and tensorboard, wandb (their extras)

Write floats with a dot in YAML (``1.0e-5``): YAML reads ``1e-5`` as a string
(a numeric string is accepted for a float field for that reason).
"""

from __future__ import annotations

import dataclasses
import json
import types
import typing
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any, Literal, Union

from agents.algorithms.objectives import ARPO, GRPO, RFT
from agents.metrics import SINK_NAMES, unknown_sink

__all__ = ["TrainerConfig", "SamplingConfig", "OptimConfig", "LearnerConfig", "LoRAConfig", "SFTConfig",
           "EvalConfig", "RuntimeConfig", "OutputConfig", "ALGORITHMS"]

ALGORITHMS: dict[str, type] = {"arpo": ARPO, "grpo": GRPO, "rft": RFT}
"""The ``algorithm.name`` values and their classes (the section's other keys are the class's fields)."""


@dataclass
class SamplingConfig:
    """How rollouts are sampled.

    Attributes:
        max_new_tokens: Tokens per assistant turn.
        temperature: Sampling temperature of training rollouts (and the default of evaluation).
        max_turns: The episodes' turn (round) limit (``None``: each environment's). An episode
            ended by it is judged on its final state like any other.
        max_context: The most tokens of a role's sequence (``None``: the tokenizer's
            ``model_max_length``); a rollout none of whose roles fits another turn ends and is judged.
        mode: ``aec`` (turn order) or ``parallel`` (simultaneous moves) for teams.
        processes: CPU processes that sample each batch (:class:`agents.policies.process_policy.ProcessPolicy`,
            sharing the weights) for the policies :meth:`Trainer.from_config` makes; ``1``: the
            trainer's own process alone. A policy passed to ``Trainer`` is used as given.
    """

    max_new_tokens: int = 128
    temperature: float = 1.0
    max_turns: int | None = None
    max_context: int | None = None
    mode: Literal["aec", "parallel"] = "aec"
    processes: int = 1

    def __post_init__(self) -> None:
        if self.processes < 1:
            raise ValueError(f"sampling.processes must be at least 1, got {self.processes}")


@dataclass
class OptimConfig:
    """The RL updates.

    Attributes:
        lr: AdamW learning rate.
        tasks_per_step: Tasks per step; each gets ``algorithm.M`` rollouts.
        micro_batch: Sequences per forward/backward pass (gradients accumulate).
        grad_clip: Global gradient-norm clip (0 disables); SFT uses it too.
    """

    lr: float = 1e-5
    tasks_per_step: int = 4
    micro_batch: int = 16
    grad_clip: float = 1.0


@dataclass
class LoRAConfig:
    """LoRA adapters (through ``peft``) instead of training every weight.

    Attributes:
        r, alpha, dropout: The adapters' rank, scale numerator (``alpha / r`` scales them) and dropout.
        target_modules: Module names to adapt (``None``: every linear layer of the decoder).
    """

    r: int = 16
    alpha: float = 32.0
    dropout: float = 0.0
    target_modules: list[str] | None = None

    def __post_init__(self) -> None:
        if self.r < 1:
            raise ValueError(f"lora.r must be at least 1, got {self.r}")


@dataclass
class LearnerConfig:
    """How each learner's model is trained (:mod:`agents.learner`).

    Attributes:
        parallel: ``auto`` (data parallel when ``torchrun`` started several processes, else one
            process), ``none``, ``dp`` (every rank a whole model, gradients summed) or ``fsdp2``
            (parameters, gradients and optimizer state sharded by PyTorch's ``fully_shard``). Each rank
            samples its own tasks; a step equals the one-process step on the union of their batches
            (:mod:`agents.models.parallel`).
        autocast: ``bf16``: training's forward passes in bfloat16 under ``torch.autocast``, over float32
            weights (the master copy AdamW updates); ``null``: float32 throughout. Trainable weights that
            are not float32 are refused either way (AdamW on bfloat16 weights loses most small updates).
        gradient_checkpointing: Recompute each decoder layer's activations in the backward pass instead
            of keeping them (less memory, a second forward's time).
        lora: LoRA adapters (``peft``) on a frozen base (which may then be bfloat16); the KL reference
            is the base with the adapters off (no copy of the model).
    """

    parallel: Literal["auto", "none", "dp", "fsdp2"] = "auto"
    autocast: Literal["bf16"] | None = None
    gradient_checkpointing: bool = False
    lora: LoRAConfig | None = None


@dataclass
class SFTConfig:
    """The supervised warm start (:meth:`~agents.trainer.Trainer.sft`'s defaults).

    Attributes:
        epochs, lr, batch_size: Passes over the examples, AdamW learning rate, examples per step.
        tasks: Tasks whose reference solutions it trains on (``None``: the ``sft`` split; in a
            :func:`agents.trainer.train_from_config` run, the config's ``tasks`` when it names some).
    """

    epochs: int = 10
    lr: float = 1e-3
    batch_size: int = 8
    tasks: list[str] | None = None


@dataclass
class EvalConfig:
    """Evaluation (:meth:`~agents.trainer.Trainer.evaluate`'s defaults).

    Attributes:
        samples: Sampled episodes per task.
        temperature: ``None``: the sampling temperature.
        seed: The sampling seed (the same for every evaluation, so they are paired).
        tasks: Task ids (``None``: the ``eval`` split).
    """

    samples: int = 4
    temperature: float | None = None
    seed: int = 12345
    tasks: list[str] | None = None


@dataclass
class RuntimeConfig:
    """Where the rollouts' worlds live.

    Attributes:
        rollout: ``local`` (this process) or ``ray``: every environment's worlds (forks
            included) live in ``workers`` Ray actors (:mod:`envfactory.runtime.ray_world`),
            round-robin; the referee, the policy and the batch stay here, so a seed gives the
            same batch as ``local``. A dead actor's worlds are rebuilt elsewhere by replay; the
            pool's ``dead_workers``, ``replayed_worlds`` and ``timeouts`` are in each step's metrics.
        workers: Ray actors for ``rollout: ray``.
        ray_options: More :class:`envfactory.runtime.ray_world.RayPool` options (``world_runtime``,
            ``step_timeout``, world options).
    """

    rollout: Literal["local", "ray"] = "local"
    workers: int = 2
    ray_options: dict[str, Any] = field(default_factory=dict)


@dataclass
class OutputConfig:
    """What a run writes and shows.

    Attributes:
        dir: Where ``metrics.jsonl``, ``learning_curve.png`` and ``checkpoints/`` go (``None``:
            nothing is written; ``envfactory train`` then writes to ``runs/train``).
        save_every: A checkpoint every this many steps (0: only at the end of ``train``).
        save_trajectories: Append every step's trajectories to ``dir/trajectories.jsonl``
            (:mod:`agents.trajectories`; ``Trainer.sft(trajectories=...)`` trains on them).
        show_progress: A progress bar (tqdm) on stderr when it is a terminal.
        resume: ``true``: ``train`` continues from the latest checkpoint in ``dir``; a path:
            from that checkpoint.
        sinks: Where the metric rows go (:mod:`agents.metrics`): ``jsonl``
            (``dir/metrics.jsonl``), ``tensorboard`` (``dir/tensorboard``; ``pip install
            'envfactory[tensorboard]'``), ``wandb`` (a Weights & Biases run; ``pip install
            'envfactory[wandb]'``). Objects and callables go to ``Trainer(sinks=[...])``.
    """

    dir: str | None = None
    save_every: int = 0
    save_trajectories: bool = False
    show_progress: bool = True
    resume: bool | str = False
    sinks: list[str] = field(default_factory=lambda: ["jsonl"])

    def __post_init__(self) -> None:
        for name in self.sinks:
            if name not in SINK_NAMES:
                raise ValueError(unknown_sink(name))


@dataclass
class TrainerConfig:
    """Everything a :class:`~agents.trainer.Trainer` is configured by, besides its policy and environments.

    ``Trainer(policy, envs, config=TrainerConfig(...))``; the dict form is the file of
    ``envfactory train --config FILE`` (see the module docstring for every key). ``model``,
    ``envs`` and ``device`` say what :meth:`build` makes; a Trainer given its policy and
    environments does not read them.
    """

    model: str | dict[str, str] = "tiny"
    envs: list[str] = field(default_factory=list)
    device: str | None = None
    tasks: list[str] | None = None
    respect_splits: bool = True
    seed: int = 0
    steps: int = 10
    algorithm: ARPO | GRPO | RFT = field(default_factory=ARPO)
    sampling: SamplingConfig = field(default_factory=SamplingConfig)
    optim: OptimConfig = field(default_factory=OptimConfig)
    learner: LearnerConfig = field(default_factory=LearnerConfig)
    sft: SFTConfig | None = None
    eval: EvalConfig | None = None
    runtime: RuntimeConfig = field(default_factory=RuntimeConfig)
    output: OutputConfig = field(default_factory=OutputConfig)

    def __post_init__(self) -> None:
        if not isinstance(self.algorithm, tuple(ALGORITHMS.values())):
            raise TypeError(f"algorithm must be ARPO(...), GRPO(...) or RFT(...), not {type(self.algorithm).__name__}")
        if self.output.save_trajectories and self.output.dir is None:
            raise ValueError("output.save_trajectories needs output.dir (they go to <dir>/trajectories.jsonl)")

    # -- the file format -------------------------------------------------------
    @classmethod
    def from_dict(cls, d: Any) -> "TrainerConfig":
        """Build a config from its dict form (a parsed file); a missing key keeps its default,
        ``null`` in a section that is optional (``sft``, ``eval``) turns it off.

        Raises:
            ValueError: an unknown key (naming it and the valid ones), a value of the wrong
                type (naming the key and the type wanted), or a value an algorithm refuses.
        """
        return _build(cls, d, "config")

    @classmethod
    def from_file(cls, path: str | Path) -> "TrainerConfig":
        """Read a JSON (``.json``) or YAML (any other name) file.

        Raises:
            OSError: the file cannot be read.
            ValueError: it does not parse, its YAML aliases expand it beyond
                ``envfactory.factory.yaml_budget.MAX_YAML_NODES`` nodes (an alias bomb), or
                :meth:`from_dict` refuses it.
        """
        text = Path(path).read_text()
        if str(path).endswith(".json"):
            try:
                d = json.loads(text)
            except ValueError as exc:
                raise ValueError(f"{path}: not valid JSON: {exc}") from exc
        else:
            import yaml

            from envfactory.factory.yaml_budget import load_yaml

            try:  # the spec files' loader: an alias bomb is refused before anything expands it
                d = load_yaml(text, path, what="a training config")
            except yaml.YAMLError as exc:  # its message carries the line and column
                raise ValueError(f"{path}: not valid YAML: {exc}") from exc
        try:
            return cls.from_dict({} if d is None else d)  # an empty file: every default
        except ValueError as exc:
            raise ValueError(f"{path}: {exc}") from exc

    def to_dict(self) -> dict[str, Any]:
        """The dict form (plain JSON/YAML values); ``from_dict(to_dict())`` gives an equal config."""
        return _plain(self)

    def to_file(self, path: str | Path) -> Path:
        """Write the dict form as JSON (``.json``) or YAML (any other name); return the path."""
        path = Path(path)
        if path.suffix == ".json":
            path.write_text(json.dumps(self.to_dict(), indent=2) + "\n")
        else:
            import yaml

            path.write_text(yaml.safe_dump(self.to_dict(), sort_keys=False))
        return path


# -- typed parsing ------------------------------------------------------------------
def _build(cls: type, d: Any, where: str) -> Any:
    """``cls`` (a dataclass) from a mapping, checking every key and value against its type hints."""
    hints = typing.get_type_hints(cls)
    keys = [f.name for f in fields(cls) if f.init]
    if not isinstance(d, dict):
        raise ValueError(f"{where}: expected a mapping with keys {keys}, got {type(d).__name__} {d!r}")
    unknown = [k for k in d if k not in keys]
    if unknown:
        raise ValueError(f"{where}: unknown key {unknown[0]!r}; the valid keys are {keys}")
    kw = {k: _value(v, hints[k], f"{where}.{k}") for k, v in d.items()}
    try:
        return cls(**kw)
    except (TypeError, ValueError) as exc:
        raise ValueError(f"{where}: {exc}") from exc


def _algorithm(d: Any, where: str) -> Any:
    if not isinstance(d, dict):
        raise ValueError(f"{where}: expected a mapping such as {{name: arpo, M: 8}}, got {type(d).__name__} {d!r}")
    d = dict(d)
    name = str(d.pop("name", "arpo")).lower()
    if name not in ALGORITHMS:
        raise ValueError(f"{where}.name: {name!r} is not an algorithm; use one of {sorted(ALGORITHMS)}")
    return _build(ALGORITHMS[name], d, f"{where} ({name})")


def _value(v: Any, tp: Any, where: str) -> Any:
    """``v`` checked against the type ``tp`` (nested dataclasses built)."""
    origin, args = typing.get_origin(tp), typing.get_args(tp)
    if tp is Any:
        return v
    if origin in (Union, types.UnionType):
        if v is None and type(None) in args:
            return None
        options = [a for a in args if a is not type(None)]
        if set(options) == set(ALGORITHMS.values()):
            return _algorithm(v, where)
        if len(options) == 1:  # an optional section: its own errors name the key
            return _value(v, options[0], where)
        for a in options:
            try:
                return _value(v, a, where)
            except ValueError:
                continue
        raise ValueError(f"{where}: expected {_name(tp)}, got {type(v).__name__} {v!r}")
    if dataclasses.is_dataclass(tp):
        return _build(tp, v, where)
    if origin is Literal:
        if v not in args:
            raise ValueError(f"{where}: expected one of {list(args)}, got {v!r}")
        return v
    if origin is list:
        if not isinstance(v, list):
            raise ValueError(f"{where}: expected a list, got {type(v).__name__} {v!r}")
        return [_value(x, args[0], f"{where}[{i}]") for i, x in enumerate(v)] if args else list(v)
    if origin is dict:
        if not isinstance(v, dict):
            raise ValueError(f"{where}: expected a mapping, got {type(v).__name__} {v!r}")
        return {_value(k, args[0], where): _value(x, args[1], f"{where}.{k}") for k, x in v.items()} if args else dict(v)
    if tp is bool:
        if not isinstance(v, bool):
            raise ValueError(f"{where}: expected true or false, got {type(v).__name__} {v!r}")
        return v
    if tp is int:
        if isinstance(v, bool) or not isinstance(v, int):
            raise ValueError(f"{where}: expected an integer, got {type(v).__name__} {v!r}")
        return v
    if tp is float:
        if isinstance(v, str):  # YAML 1.1 reads 1e-5 (no dot) as a string
            try:
                return float(v)
            except ValueError:
                pass
        if isinstance(v, bool) or not isinstance(v, (int, float)):
            raise ValueError(f"{where}: expected a number, got {type(v).__name__} {v!r}")
        return float(v)
    if tp is str:
        if not isinstance(v, str):
            raise ValueError(f"{where}: expected a string, got {type(v).__name__} {v!r}")
        return v
    raise TypeError(f"{where}: no rule to read {tp!r} (a TrainerConfig field of an unsupported type)")


def _name(tp: Any) -> str:
    origin = typing.get_origin(tp)
    if origin in (Union, types.UnionType):
        return " or ".join(_name(a) for a in typing.get_args(tp))
    if origin is not None:
        return {list: "a list", dict: "a mapping", Literal: f"one of {list(typing.get_args(tp))}"}.get(origin, str(tp))
    return "null" if tp is type(None) else getattr(tp, "__name__", str(tp))


def _plain(obj: Any) -> Any:
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        d = {f.name: _plain(getattr(obj, f.name)) for f in fields(obj) if f.init}
        if isinstance(obj, tuple(ALGORITHMS.values())):
            d = {"name": obj.name.lower(), **d}
        return d
    if isinstance(obj, dict):
        return {k: _plain(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_plain(v) for v in obj]
    return obj
