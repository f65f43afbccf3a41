"""``agents.Trainer``: SFT warm start and GRPO/ARPO training of one agent or a team.

The loop, step by step (each a separate, obvious piece)::

    groups  = sample_groups(team, tasks, algorithm)         # M rollouts per task (ARPO branches), a trajectory per role
    Â       = algorithm.advantages(rewards of a role in a group) # outcome reward, group-normalised (RFT: 1 per success)
    loss    = policy_loss(log π_θ, log π_old, Â, loss_mask)  # clipped ratio (+ β·KL), token-mean, observations masked
    optimizer.step() per learner, μ times; push weights to the inference engine (vLLM: load_weights)

A *learner* is one trainable model with its optimizer (and, with a KL penalty,
its frozen reference). With one shared :class:`~agents.policies.policy.Policy` (a single
agent, or self-play) every role's trajectories train the same model; with
``{agent id: Policy}`` each distinct policy trains only on the trajectories of
the roles it plays. Rollouts are token-in/token-out (:mod:`agents.rollout`): the
trainer scores exactly the ids the policy sampled, and ``log π_old`` is the
sampling log-probability the backend recorded.
"""

from __future__ import annotations

import copy
import dataclasses
import random
import time
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Callable, Sequence

from agents.algorithms.advantages import group_advantages
from agents.algorithms.branching import Group, sample_groups
from agents.algorithms.logprobs import token_logprobs
from agents.algorithms.loss import policy_loss
from agents.algorithms.objectives import ARPO, GRPO, Algorithm
from agents.metrics import MetricsLog, make_sinks, plot_learning_curve, progress
from agents.algorithms.sft import reference_rollouts
from agents.models import adapters, parallel
from agents.models.checkpoint import latest_checkpoint, load_checkpoint, save_checkpoint
from agents.rollout import Trajectory
from agents.train_config import EvalConfig, SFTConfig, TrainerConfig

__all__ = ["Trainer", "Learner", "Sample", "summarize", "shuffle_rewards", "train_from_config"]

TaskIds = Sequence[str] | None


@dataclass
class Sample:
    """One role trajectory as a training row: its ids, where scoring starts, the loss mask,
    the sampling log-probs and each response token's advantage."""

    agent: str
    ids: list[int]
    start: int
    mask: list[int]
    old_logprobs: list[float]
    advantages: list[float]
    signal: bool = True
    """Whether it carries a policy-gradient signal: its group's advantages are not all zero (RFT: its
    own advantage is not zero); else it is trained on for the KL term only."""


@dataclass
class Learner:
    """A trainable model, its optimizer, the agent ids it plays and its KL reference."""

    policy: Any
    model: Any
    optimizer: Any
    agents: set[str] = field(default_factory=set)
    ref_model: Any = None

    @property
    def label(self) -> str:
        return ",".join(sorted(self.agents))

    @property
    def pad_id(self) -> int:
        tok = self.policy.tokenizer
        return int(tok.pad_token_id) if tok.pad_token_id is not None else 0

    def sync(self) -> None:
        """Push the trained weights to the sampling backend when it does not share them."""
        if self.model is not getattr(self.policy, "model", None):
            self.policy.load_weights(list(parallel.full_state_dict(self.model)[0].items()))


class Trainer:
    """Train a policy, or a team of them, on environments' tasks with sparse rewards.

    Args:
        policy: One ``Policy`` for every role (a single agent, or self-play), or
            ``{agent id: Policy}`` (a learner per distinct policy). With
            :class:`~agents.policies.hf_policy.HFPolicy`, ``policy.model`` is trained in place;
            with another backend (vLLM, an OpenAI-compatible server) pass ``model``.
        envs: Environments (episodes or registered names), single-agent or teams; their tasks form the pool.
        config: Every setting (:class:`~agents.train_config.TrainerConfig`; default: its defaults):
            the algorithm (ARPO, GRPO or RFT), the tasks (default: the ``rl`` split of every environment,
            :meth:`envfactory.ToolEnvSpec.split`; an ``eval``-split task is an error unless
            ``respect_splits`` is false), sampling, optimisation, SFT and evaluation defaults,
            where the worlds run and what is written.
        model: The HF module (or its path) to train when the policy's backend does not own its
            weights; they are pushed to the policy's ``load_weights`` after every step.
        reward_fn: Replaces the reward: ``reward_fn(trajectory) -> float`` (the trajectory names its
            ``agent``; default: the agent's sparse reward from the environment).
        curriculum: An :class:`agents.curriculum.Curriculum`: each step's tasks come from the
            environments' endless task supplies at its current difficulty (raised as training
            succeeds) instead of the fixed pool; its state is saved in checkpoints.
        sinks: More places every metric row goes, besides ``config.output.sinks``: objects with
            ``write(row)`` and ``close()`` (:class:`~agents.metrics.MetricsSink`), or
            callables taking a row. :meth:`close` closes them.

    ``model``, ``reward_fn``, ``curriculum`` and ``sinks`` are objects (a module, code, a stateful
    curriculum), so they are arguments rather than entries of the config file.
    """

    def __init__(self, policy: Any, envs: Sequence[Any], config: TrainerConfig | None = None, *,
                 model: Any = None, reward_fn: Callable[[Trajectory], float] | None = None,
                 curriculum: Any = None, sinks: Sequence[Any] = ()) -> None:
        import torch

        import envfactory

        cfg = self.config = config if config is not None else TrainerConfig()
        if not isinstance(cfg, TrainerConfig):
            raise TypeError(f"config must be a TrainerConfig (TrainerConfig.from_dict / from_file read one), "
                            f"not {type(cfg).__name__}")
        self.team, self.algorithm = policy, cfg.algorithm
        self.world = parallel.world(cfg.learner.parallel)  # one process, or this rank under torchrun
        # run state, never on the config: ARPO's running ΔH scale (saved with each checkpoint)
        self.branch_scale = cfg.algorithm.running_scale() if isinstance(cfg.algorithm, ARPO) else None
        self.envs = [envfactory.make(e) if isinstance(e, str) else e for e in envs]
        self._owned = [e for e, given in zip(self.envs, envs) if e is not given]  # closed by close()
        self.ray_pool = None
        if cfg.runtime.rollout == "ray":
            from envfactory.episode import Episode
            from envfactory.runtime.ray_world import RayPool, RayWorld

            self.ray_pool = RayPool(cfg.runtime.workers, **cfg.runtime.ray_options)
            self.envs = [Episode(e.spec, RayWorld(e.spec, pool=self.ray_pool), max_turns=e.status.max_turns)
                         for e in self.envs]
            self._owned = list(self.envs)
        if cfg.sampling.max_turns is not None:  # the config's turn limit over each episode's own
            for e in self.envs:
                e._max_turns = cfg.sampling.max_turns  # (fixed at make(): only the Trainer overrides it)
        self.learners: list[Learner] = []
        for agent in dict.fromkeys(a for e in self.envs for a in e.agents):
            if isinstance(policy, Mapping) and agent not in policy:
                raise KeyError(f"the team has no policy for agent {agent!r} (it has {sorted(policy)}); "
                               "give one per agent id, or pass a single Policy for self-play")
            pol = policy[agent] if isinstance(policy, Mapping) else policy
            ln = next((x for x in self.learners if x.policy is pol), None)
            if ln is None:
                ln = Learner(pol, self._prepare(self._model_of(pol, model)), None)
                if self.world.mode == "fsdp2" and ln.model is not getattr(pol, "model", None):
                    raise ValueError(f"learner.parallel: fsdp2 samples with the sharded model itself; "
                                     f"{type(pol).__name__} keeps its own weights: use an HFPolicy, or dp")
                ln.optimizer = torch.optim.AdamW(adapters.trainable_parameters(ln.model), lr=cfg.optim.lr,
                                                 betas=(0.9, 0.99), weight_decay=0.0)
                self.learners.append(ln)
            ln.agents.add(agent)
        self.respect_splits = cfg.respect_splits
        self.curriculum = curriculum
        if curriculum is not None:
            curriculum.bind(self.envs)
        self.pool = self._select(cfg.tasks, "rl")
        if not self.pool:
            raise ValueError("no tasks to train on: check config.tasks against the environments' task ids")
        self.reward_fn, self.seed = reward_fn, cfg.seed
        self.output_dir = Path(cfg.output.dir) if cfg.output.dir else None
        self.step = 0
        self.log = MetricsLog()
        try:
            # under torchrun rank 0 writes the run's metrics (every rank keeps its rows in memory)
            self.log.sinks = (make_sinks(cfg.output.sinks, self.output_dir, objects=sinks, config=cfg.to_dict())
                              if self.world.main else [])
        except Exception:  # e.g. a sink's package missing: let go of the worlds made so far
            self.close()
            raise
        self.last_samples: dict[str, list[Sample]] = {}
        self.last_runs: list[Any] = []  # train_agent_loop: the last step's runs (agents.harness.agent_loop.Run)

    def _model_of(self, pol: Any, model: Any) -> Any:
        import torch

        if model is not None and isinstance(self.team, Mapping):
            raise ValueError("model= goes with one shared policy; a team trains each policy's own .model")
        m = model if model is not None else getattr(pol, "model", None)
        if m is None:
            raise ValueError(f"{type(pol).__name__} has no trainable .model; pass model= (the HF module to "
                             "train), whose weights are pushed to the policy after each step")
        if isinstance(m, str):
            from transformers import AutoModelForCausalLM

            m = AutoModelForCausalLM.from_pretrained(m, dtype=torch.float32)
        if isinstance(m, (torch.nn.parallel.DistributedDataParallel, torch.nn.DataParallel)):
            raise TypeError(f"the model is wrapped in {type(m).__name__}, which the sampler cannot generate with; "
                            "pass the bare model and set learner.parallel to dp (or fsdp2): under torchrun the "
                            "Trainer sums the gradients across the processes itself")
        if m is not getattr(pol, "model", None) and not hasattr(pol, "load_weights"):
            raise ValueError(f"{type(pol).__name__} cannot receive weights (no load_weights); "
                             "train an HFPolicy's own model instead")
        return m

    def _prepare(self, m: Any) -> Any:
        """The learner's model as ``config.learner`` trains it: LoRA adapters, gradient checkpointing, float32
        trainable weights (refused otherwise, by name), sharded across the ranks (FSDP2)."""
        lc = self.config.learner
        if lc.lora is not None and not adapters.has_lora(m):
            adapters.add_lora(m, lc.lora)
        if lc.gradient_checkpointing:
            m.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
        adapters.check_trainable(m)
        return parallel.shard(m, self.world)

    def _sampling(self) -> Any:
        """The learners' parameters gathered while the policies sample (FSDP2; else nothing to do)."""
        import contextlib

        stack = contextlib.ExitStack()
        for ln in self.learners:
            stack.enter_context(parallel.gathered(ln.model))
        return stack

    # -- learners ------------------------------------------------------------
    def learner_of(self, agent: str) -> Learner:
        """The learner that plays ``agent``."""
        for ln in self.learners:
            if agent in ln.agents:
                return ln
        raise KeyError(f"no learner plays {agent!r}")

    def _sole(self) -> Learner:
        if len(self.learners) != 1:
            raise AttributeError(f"this trainer has {len(self.learners)} learners; use learner_of(agent)")
        return self.learners[0]

    @property
    def policy(self) -> Any:
        return self._sole().policy

    @property
    def model(self) -> Any:
        return self._sole().model

    @property
    def optimizer(self) -> Any:
        return self._sole().optimizer

    def _pad_id(self) -> int:
        return self._sole().pad_id

    # -- tasks -------------------------------------------------------------
    def _select(self, tasks: TaskIds, purpose: str) -> list[tuple[Any, str]]:
        """The ``(episode, task id)`` pairs ``tasks`` names, for ``purpose`` (``rl``, ``sft`` or
        ``eval``); ``None``: that split. Training on an evaluation task is an error."""
        pool, leaked = [], []
        for env in self.envs:
            spec = env.spec
            for t in spec.get_tasks():
                split = spec.split(t) if self.respect_splits else None
                if tasks is None:
                    chosen = split is None or split == purpose
                else:
                    chosen = t.id in tasks or f"{spec.name}/{t.id}" in tasks
                if chosen:
                    pool.append((env, t.id))
                    if split == "eval" and purpose != "eval":
                        leaked.append(f"{spec.name}/{t.id}")
        if leaked:
            raise ValueError(f"{len(leaked)} evaluation-split tasks asked for {purpose} training "
                             f"({', '.join(leaked[:5])}{', ...' if len(leaked) > 5 else ''}): evaluation tasks "
                             "are never trained on (spec.split); set config.respect_splits to false to allow it")
        return pool

    def pairs(self, tasks: TaskIds = None, purpose: str = "rl") -> list[tuple[Any, str]]:
        """``(episode, task_id)`` for ``tasks`` (default: the training pool for ``rl``, else the
        ``purpose`` split; the training pool when the trainer does not respect splits)."""
        if tasks is None and (purpose == "rl" or not self.respect_splits):
            return self.pool
        return self._select(tasks, purpose)

    def _groups(self, pairs: list[tuple[Any, str]], algo: Algorithm, seed: int, temperature: float) -> list[Group]:
        s = self.config.sampling
        with self._sampling():
            return sample_groups(self.team, pairs, algo, max_new_tokens=s.max_new_tokens, temperature=temperature,
                                 seed=seed, mode=s.mode, max_context=s.max_context,
                                 scale=self.branch_scale if algo is self.algorithm else None)

    # -- evaluation ----------------------------------------------------------
    def evaluate(self, tasks: TaskIds = None, *, samples: int | None = None, temperature: float | None = None,
                 seed: int | None = None) -> dict[str, Any]:
        """Success rate over ``samples`` episodes of each task (default: the ``eval`` split;
        every task when the trainer does not respect splits). An argument left ``None`` is
        ``config.eval``'s (:class:`~agents.train_config.EvalConfig`'s default without one)."""
        ev = self.config.eval or EvalConfig()
        temperature = next(t for t in (temperature, ev.temperature, self.config.sampling.temperature) if t is not None)
        return summarize(self._groups(self.pairs(tasks if tasks is not None else ev.tasks, "eval"),
                                      GRPO(M=ev.samples if samples is None else samples),
                                      ev.seed if seed is None else seed, temperature))

    # -- SFT warm start -------------------------------------------------------
    def sft(self, tasks: TaskIds = None, *, epochs: int | None = None, lr: float | None = None,
            batch_size: int | None = None, seed: int | None = None, trajectories: Any = None,
            successful_only: bool = True, log: Callable[[str], None] | None = None,
            log_every: int = 0) -> dict[str, Any]:
        """Warm start every learner on its own roles' turns of the tasks' verified reference
        solutions (loss on the sampled-turn tokens only). ``tasks`` defaults to the ``sft`` split.
        ``tasks``, ``epochs``, ``lr`` and ``batch_size`` left ``None`` are ``config.sft``'s
        (:class:`~agents.train_config.SFTConfig`'s defaults without one); ``seed``: ``config.seed``.

        Args:
            trajectories: Train on recorded trajectories instead (a file or folder written by
                :func:`agents.trajectories.save_trajectories`, or ``Trajectory`` objects): each
                learner on its own roles' token ids with their loss masks; ``successful_only``
                keeps only those that succeeded (rejection sampling). Their ids must come from
                this learner's tokenizer.
            log, log_every: Called with a progress line (step, mean NLL since the last line) every
                ``log_every`` optimizer steps.

        Raises:
            RuntimeError: a reference solution did not succeed (run ``envfactory verify``).
            ValueError: a recorded trajectory of an ``eval``-split task (with ``respect_splits``).
        """
        import torch

        sc = self.config.sft or SFTConfig()
        tasks = sc.tasks if tasks is None else tasks
        epochs, lr = sc.epochs if epochs is None else epochs, sc.lr if lr is None else lr
        batch_size = sc.batch_size if batch_size is None else batch_size
        grad_clip = self.config.optim.grad_clip
        rng = random.Random(self.seed if seed is None else seed)
        started, out = time.perf_counter(), {}
        recorded = self._recorded(trajectories, successful_only) if trajectories is not None else None
        for ln in self.learners:  # rendered with this learner's tokenizer
            if recorded is not None:
                rows = [t for t in recorded if t.agent in ln.agents]
            else:
                rows = [t for ro in reference_rollouts(ln.policy.tokenizer, self.pairs(tasks, "sft"))
                        for a, t in ro.trajectories.items() if a in ln.agents and sum(t.loss_mask)]
            opt = torch.optim.AdamW(ln.model.parameters(), lr=lr, betas=(0.9, 0.99), weight_decay=0.0)
            ln.model.train()
            losses: list[float] = []
            for epoch in range(epochs):
                rng.shuffle(rows)
                for b in range(0, len(rows), batch_size):
                    batch = rows[b:b + batch_size]
                    lps = token_logprobs(ln.model, [t.prompt_ids + t.response_ids for t in batch],
                                         [len(t.prompt_ids) for t in batch], pad_id=ln.pad_id)
                    masks = [torch.tensor(t.loss_mask, dtype=lp.dtype, device=lp.device) for t, lp in zip(batch, lps)]
                    loss = -sum((lp * m).sum() for lp, m in zip(lps, masks)) / max(sum(float(m.sum()) for m in masks), 1.0)
                    opt.zero_grad(set_to_none=True)
                    loss.backward()
                    if grad_clip:
                        torch.nn.utils.clip_grad_norm_(ln.model.parameters(), grad_clip)
                    opt.step()
                    losses.append(float(loss.item()))
                    if log is not None and log_every and len(losses) % log_every == 0:
                        steps = epochs * -(-len(rows) // batch_size)
                        recent = losses[-log_every:]
                        log(f"step {len(losses)}/{steps} nll {sum(recent) / len(recent):.3f}")
                self.log.write({"phase": "sft", "learner": ln.label, "epoch": epoch + 1, "nll": losses[-1]})
                if self.config.output.show_progress:
                    progress("sft", epoch + 1, epochs, started, nll=losses[-1])
            ln.sync()
            out[ln.label] = {"examples": len(rows), "final_nll": losses[-1] if losses else None}
        return {"examples": sum(v["examples"] for v in out.values()), "epochs": epochs,
                "final_nll": out[self.learners[0].label]["final_nll"], "learners": out,
                "seconds": round(time.perf_counter() - started, 2)}

    def _recorded(self, trajectories: Any, successful_only: bool) -> list[Trajectory]:
        """Recorded trajectories fit for SFT (token-exact, no error, sampled tokens to learn)."""
        import envfactory

        from agents.trajectories import load_trajectories

        trajs = load_trajectories(trajectories) if isinstance(trajectories, (str, Path)) else list(trajectories)
        leaked = []
        for t in trajs if self.respect_splits else ():
            try:
                spec = envfactory.spec(t.env_name)
            except KeyError:  # an environment this process does not know: no split to check
                continue
            try:
                split = spec.split(t.task_id)
            except KeyError:  # a task the environment does not hold (a generated supply task): not its eval
                continue
            if split == "eval":
                leaked.append(f"{t.env_name}/{t.task_id}")
        if leaked:
            raise ValueError(f"{len(leaked)} recorded trajectories are of evaluation-split tasks "
                             f"({', '.join(sorted(set(leaked))[:5])}): evaluation tasks are never trained on "
                             "(spec.split); set config.respect_splits to false to allow it")
        return [t for t in trajs if t.token_exact and t.error is None and sum(t.loss_mask)
                and (t.success or not successful_only)]

    # -- RL ------------------------------------------------------------------
    @classmethod
    def from_config(cls, config: TrainerConfig) -> "Trainer":
        """The Trainer a config file describes: an HFPolicy of ``config.model`` (the embedded tiny
        model for ``tiny``, SmolLM2-135M-Instruct from its PyPI package for ``smol``; a learner per role
        when ``model`` is a mapping) on ``config.envs``. Under ``torchrun`` each rank's policy is on its own
        GPU (the process group starts first)."""
        from agents.policies.hf_policy import HFPolicy
        from agents.models.tiny import build_tiny_model

        if not config.envs:
            raise ValueError("envs is empty: name the environments to train on (e.g. envs: [Counter-v0])")
        parallel.world(config.learner.parallel)  # starts the process group and picks this rank's GPU

        def path(m: str) -> Any:
            if m == "smol":
                from agents.models.smol import smol_model_path

                return smol_model_path()
            return build_tiny_model() if m == "tiny" else m

        def policy(m: str) -> Any:
            pol = HFPolicy(path(m), device=config.device)
            if config.sampling.processes > 1:  # ProcessPolicy refuses a policy off the CPU
                from agents.policies.process_policy import ProcessPolicy

                return ProcessPolicy(pol, config.sampling.processes)
            return pol

        model = config.model
        team = {a: policy(m) for a, m in model.items()} if isinstance(model, dict) else policy(model)
        return cls(team, list(config.envs), config=config)

    def train(self, steps: int | None = None, *, resume: bool | str | None = None) -> list[dict[str, Any]]:
        """Run RL steps until ``self.step == steps``; return this call's metric rows.

        Args:
            steps: Default ``config.steps``.
            resume: ``True`` continues from the latest checkpoint in ``output_dir``;
                a path continues from that checkpoint (default ``config.output.resume``).
        """
        out = self.config.output
        steps = self.config.steps if steps is None else steps
        resume = out.resume if resume is None else resume
        if resume:
            self.load(latest_checkpoint(self.output_dir / "checkpoints") if resume is True else resume)
        started, rows = time.perf_counter(), []
        while self.step < steps:
            row = self.train_step()
            rows.append(row)
            if out.show_progress:
                progress(self.algorithm.name.lower(), self.step, steps, started, success=row["success"],
                         loss=row["loss"])
            if self.output_dir and out.save_every and self.step % out.save_every == 0:
                self.save()
        if self.output_dir:
            self.save()
            self.plot()
        return rows

    def _step_rng(self) -> random.Random:
        """The random stream of this step's task choice and sampling seeds (each rank its own)."""
        if self.world.size == 1:
            return random.Random(self.seed * 1_000_003 + self.step)
        return random.Random(f"{self.seed}:{self.step}:{self.world.rank}")

    def train_step(self) -> dict[str, Any]:
        """One step: sample groups, compute advantages, ``algorithm.updates`` clipped-loss updates
        of every learner on its own samples, push weights."""
        t0 = time.perf_counter()
        rng = self._step_rng()
        level = self.curriculum.level if self.curriculum is not None else None
        n = self.config.optim.tasks_per_step
        chosen = (self.curriculum.draw(n) if self.curriculum is not None
                  else rng.sample(self.pool, min(n, len(self.pool))))
        groups = self._groups(chosen, self.algorithm, rng.randrange(2**31), self.config.sampling.temperature)
        t_rollout = time.perf_counter() - t0
        errors = [e.error for g in groups for e in g.episodes]
        failed = bool(errors) and all(x is not None for x in errors)
        if self.world.max(float(failed)):  # every rank raises (one alone would leave the others waiting)
            where = (f"all {len(errors)} of this process's rollouts failed; the first error: {errors[0]}" if failed
                     else "every rollout of another rank failed (its error is in its output)")
            raise RuntimeError(f"step {self.step + 1}: {where}; there is nothing to train on")
        self.last_samples = self.samples(groups)
        per = {ln.label: self._update(ln, self.last_samples[ln.label]) for ln in self.learners}
        self.step += 1
        st = list(per.values())
        row = {"phase": "train", "step": self.step, "algorithm": self.algorithm.name, **summarize(groups),
               "loss": sum(s["loss"] for s in st), "kl": _wmean([(s["kl"], s["tokens"]) for s in st]),
               "clip_fraction": _wmean([(s["clip_fraction"], s["tokens"]) for s in st]),
               "trained_sequences": sum(s["sequences"] for s in st), "trained_tokens": sum(s["tokens"] for s in st),
               "grad_norm": max(s["grad_norm"] for s in st), "learners": per,
               "rollout_s": round(t_rollout, 3), "step_s": round(time.perf_counter() - t0, 3)}
        if self.ray_pool is not None:
            row["ray"] = dict(self.ray_pool.stats)
        if self.curriculum is not None:
            row["difficulty"] = level
            row["promoted"] = self.curriculum.observe(row["success"])
        if self.config.output.save_trajectories:
            from agents.trajectories import save_trajectories

            save_trajectories([t for g in groups for e in g.episodes for t in e.trajectories.values()],
                              self.output_dir / "trajectories.jsonl", append=True)
        self.log.write(row)
        return row

    def train_agent_loop(self, fn: Callable[[str, Any], Any], steps: int | None = None) -> list[dict[str, Any]]:
        """RL on an unchanged agent loop that calls a chat endpoint: run until ``self.step == steps``.

        ``fn(base_url, env)`` is any loop over the ``openai`` SDK (``OpenAI(base_url=base_url)``,
        ``chat.completions.create``, tool calls run on ``env``); it is played ``algorithm.M`` times
        per task on forks of the task's episode, every call served by this trainer's policy through
        an :class:`agents.harness.endpoint.ChatEndpoint` (sampling at ``config.sampling``'s temperature and
        ``max_new_tokens``, whatever the request asks, so the loss scores tokens as drawn) and
        recorded token for token. A run's reward is what ``fn`` returned when it is a number, else
        the episode's (``reward_fn`` overrides both); then group-normalised advantages and the same
        clipped update as :meth:`train` (:mod:`agents.harness.agent_loop`). One learner only; ARPO trains as
        GRPO (an opaque loop cannot be forked mid-turn). Returns this call's metric rows.
        """
        from agents.harness.agent_loop import advantaged, run_agent_loop
        from agents.harness.endpoint import ChatEndpoint

        ln, s = self._sole(), self.config.sampling
        steps = self.config.steps if steps is None else steps
        rows = []
        with ChatEndpoint(ln.policy, max_tokens=s.max_new_tokens, temperature=s.temperature, top_p=1.0,
                          max_context=s.max_context) as endpoint:
            while self.step < steps:
                t0 = time.perf_counter()
                rng = self._step_rng()
                chosen = rng.sample(self.pool, min(self.config.optim.tasks_per_step, len(self.pool)))
                runs = run_agent_loop(fn, endpoint, chosen, self.algorithm.M, prefix=f"step{self.step}")
                t_rollout = time.perf_counter() - t0
                rows_in = advantaged(runs, self.algorithm, lambda r: self.reward(r.trajectories[0])
                                     if self.reward_fn is not None and r.trajectories else r.reward)
                self.last_samples = {ln.label: [
                    Sample(t.agent, t.prompt_ids + t.response_ids, len(t.prompt_ids), list(t.loss_mask),
                           list(t.logprobs), [a] * len(t.response_ids), signal) for t, a, signal in rows_in]}
                st = self._update(ln, self.last_samples[ln.label])
                self.step += 1
                self.last_runs = runs
                trajs = [t for r in runs for t in r.trajectories]
                n = max(len(runs), 1)
                row = {"phase": "train", "step": self.step, "algorithm": self.algorithm.name, "source": "agent_loop",
                       "episodes": len(runs), "success": sum(r.success for r in runs) / n,
                       "reward": sum(r.reward for r in runs) / n, "errors": sum(r.error is not None for r in runs),
                       "calls": sum(t.turns for t in trajs), "chains": len(trajs),
                       "tokens_generated": sum(sum(t.loss_mask) for t in trajs), "loss": st["loss"], "kl": st["kl"],
                       "clip_fraction": st["clip_fraction"], "trained_sequences": st["sequences"],
                       "trained_tokens": st["tokens"], "grad_norm": st["grad_norm"],
                       "rollout_s": round(t_rollout, 3), "step_s": round(time.perf_counter() - t0, 3)}
                self.log.write(row)
                rows.append(row)
                if self.config.output.save_trajectories:
                    from agents.trajectories import save_trajectories

                    save_trajectories(trajs, self.output_dir / "trajectories.jsonl", append=True)
                if self.output_dir and self.config.output.save_every and self.step % self.config.output.save_every == 0:
                    self.save()
        if self.output_dir:
            self.save()
        return rows

    def samples(self, groups: list[Group]) -> dict[str, list[Sample]]:
        """Per learner (by label), the role trajectories with signal and their token advantages.

        A group's rewards (per role) become advantages by ``algorithm.advantages`` (GRPO/ARPO:
        group-normalised; RFT: 1 for a success). With ``algorithm.shuffle_rewards`` (the
        shuffled-rewards control) each role's rewards are first permuted across every
        trajectory of the batch (all groups), seeded by the trainer's seed and step."""
        algo = self.algorithm
        to_adv = getattr(algo, "advantages", group_advantages)
        per_sample = getattr(algo, "signal", "group") == "sample"
        rewards = {(gi, agent): [self.reward(e.trajectories[agent]) for e in g.episodes]
                   for gi, g in enumerate(groups) for agent in g.agents}
        if getattr(algo, "shuffle_rewards", False):
            rewards = shuffle_rewards(rewards, random.Random(f"shuffle-rewards:{self.seed}:{self.step}"))
        out: dict[str, list[Sample]] = {ln.label: [] for ln in self.learners}
        for gi, g in enumerate(groups):
            for agent in g.agents:
                trajs = [e.trajectories[agent] for e in g.episodes]
                adv = to_adv(rewards[gi, agent])
                signals = [a != 0.0 for a in adv] if per_sample else [any(adv)] * len(adv)
                if not any(signals) and not algo.kl_coef:
                    continue  # equal rewards: no signal (as DAPO's dynamic sampling drops such groups)
                # (with a KL penalty such a group is kept for the KL term only: signal=False keeps it
                # out of the policy-gradient token-mean, see agents.algorithms.loss)
                tok_adv = algo.token_advantages(adv, [len(t.response_ids) for t in trajs], g.lineages[agent])
                rows = out[self.learner_of(agent).label]
                for t, a, signal in zip(trajs, tok_adv, signals):
                    if not signal and not algo.kl_coef:
                        continue  # RFT: a failure is not trained on
                    if sum(t.loss_mask) and t.error is None and t.token_exact:
                        rows.append(Sample(agent, t.prompt_ids + t.response_ids, len(t.prompt_ids),
                                           list(t.loss_mask), list(t.logprobs), a, signal))
        return out

    def reward(self, traj: Trajectory) -> float:
        """The scalar reward of a finished role trajectory (sparse success unless ``reward_fn`` says otherwise)."""
        return float(self.reward_fn(traj)) if self.reward_fn is not None else traj.reward

    def _update(self, ln: Learner, samples: list[Sample]) -> dict[str, Any]:
        """``algorithm.updates`` clipped-loss steps of ``ln`` on its own samples (none on any rank: no step).

        With a KL penalty the reference is the model as it stands before its first update (or the
        one a checkpoint restored): built here, so :meth:`train_step` called on its own applies
        the KL term as :meth:`train` does; with LoRA it is the base, adapters off. Under ``torchrun``
        the token counts of the token-mean and the gradients are summed over the ranks, so the step
        equals the one-process step on the union of the ranks' samples (:mod:`agents.models.parallel`)."""
        import contextlib

        import torch

        w, lc, algo = self.world, self.config.learner, self.algorithm
        lora = adapters.has_lora(ln.model)
        if algo.kl_coef and ln.ref_model is None and not lora:
            ln.ref_model = _frozen_copy(ln.model, w)
        # the token-mean's and the policy-gradient token-mean's counts, and the samples, over every rank
        n_tokens, n_pg_tokens, n_samples = (int(x) for x in w.sums(sum(sum(s.mask) for s in samples),
                                                                   sum(sum(s.mask) for s in samples if s.signal),
                                                                   len(samples)))
        updates = algo.updates if n_samples else 0
        micro_batch, temperature = self.config.optim.micro_batch, self.config.sampling.temperature
        batches = [samples[b:b + micro_batch] for b in range(0, len(samples), micro_batch)]
        if w.mode == "fsdp2":  # FSDP2 gathers and reduces in every pass: each rank runs as many (empty ones: no-ops)
            batches += [[] for _ in range(int(w.max(len(batches))) - len(batches))]
        params = adapters.trainable_parameters(ln.model)
        device = params[0].device
        autocast = torch.autocast(device.type, dtype=torch.bfloat16, enabled=lc.autocast == "bf16")
        share = not lc.gradient_checkpointing  # the shared prefix reuses a KV cache that checkpointing turns off
        scale = parallel.loss_scale(w)

        def reference() -> Any:
            return adapters.adapters_off(ln.model) if lora else contextlib.nullcontext()

        stats, grad_norm, refs = [], 0.0, {}  # refs: the reference's log-probs, once per micro-batch
        ln.model.train()
        for _ in range(updates):
            ln.optimizer.zero_grad(set_to_none=True)
            for b, mb in enumerate(batches):
                seqs, starts = ([s.ids for s in mb], [s.start for s in mb]) if mb else ([[ln.pad_id] * 2], [1])
                with autocast:
                    lps = token_logprobs(ln.model, seqs, starts, temperature=temperature, pad_id=ln.pad_id,
                                         share_prefix=share)
                    if algo.kl_coef and b not in refs:
                        with torch.no_grad(), reference():
                            refs[b] = _pad([r.float() for r in token_logprobs(
                                ln.ref_model if ln.ref_model is not None else ln.model, seqs, starts,
                                temperature=temperature, pad_id=ln.pad_id, share_prefix=share)])
                if not mb:
                    (lps[0].sum() * 0.0).backward()  # an empty pass: FSDP2's collectives, no gradient
                    continue
                dev = lps[0].device
                loss, st = policy_loss(_pad([lp.float() for lp in lps]),
                                       _pad([torch.tensor(s.old_logprobs, device=dev) for s in mb]),
                                       _pad([torch.tensor(s.advantages, device=dev) for s in mb]),
                                       _pad([torch.tensor(s.mask, device=dev) for s in mb]),
                                       clip_eps=algo.clip_eps, ref_logp=refs.get(b), kl_coef=algo.kl_coef,
                                       num_tokens=n_tokens, pg_num_tokens=n_pg_tokens)
                (loss * scale).backward()
                stats.append(st)
            parallel.sum_gradients(params, w)
            grad_norm = float(torch.nn.utils.clip_grad_norm_(params, self.config.optim.grad_clip or float("inf")))
            ln.optimizer.step()
        ln.model.eval()
        if updates:
            ln.sync()
        return {"sequences": len(samples), "tokens": n_tokens, "pg_tokens": n_pg_tokens,
                "loss": w.sum(sum(s.loss for s in stats)) / max(updates, 1),
                "kl": _wmean([(s.kl, s.tokens) for s in stats]),
                "clip_fraction": _wmean([(s.clip_fraction, s.tokens) for s in stats]), "grad_norm": grad_norm}

    # -- checkpoints, plots ------------------------------------------------------
    def _parts(self) -> dict[str, dict[str, Any]]:
        """Checkpoint folder per learner: the top for one learner, its agent ids for several."""
        one = len(self.learners) == 1
        return {"" if one else ln.label: {"model": ln.model, "optimizer": ln.optimizer,
                                          "tokenizer": ln.policy.tokenizer, "reference": ln.ref_model}
                for ln in self.learners}

    def save(self, path: str | None = None) -> Path:
        """Write a checkpoint (default ``output_dir/checkpoints/step-<n>``)."""
        root = Path(path) if path else (self.output_dir / "checkpoints" if self.output_dir else None)
        if root is None:
            raise ValueError("Trainer.save: pass a path, or set config.output.dir")
        state = {"seed": self.seed, "algorithm": asdict(self.algorithm), "algorithm_name": self.algorithm.name}
        if self.branch_scale is not None:
            state["branch_scale"] = self.branch_scale.mean_square
        if self.curriculum is not None:
            state["curriculum"] = self.curriculum.state_dict()
        return save_checkpoint(root, self.step, self._parts(), state=state)

    def load(self, path: str | Path | None) -> None:
        """Restore every learner's weights, optimizer state and KL reference, and the step counter."""
        if path is None:
            raise FileNotFoundError("no checkpoint to resume from: none saved under output_dir/checkpoints yet")
        for ln in self.learners:
            if ln.ref_model is None and (Path(path) / self._sub(ln) / "reference.safetensors").exists():
                ln.ref_model = _frozen_copy(ln.model, self.world)
        meta = load_checkpoint(path, self._parts())
        self.step = int(meta["step"])
        # ARPO's running ΔH scale (checkpoints written before it left the config kept it in "algorithm")
        saved = meta.get("branch_scale", (meta.get("algorithm") or {}).get("run_mean_square"))
        if self.branch_scale is not None and saved is not None:
            self.branch_scale.mean_square = float(saved)
        if self.curriculum is not None and "curriculum" in meta:
            self.curriculum.load_state_dict(meta["curriculum"])
        self.log.truncate_after(self.step)
        for ln in self.learners:
            ln.sync()

    def _sub(self, ln: Learner) -> str:
        return "" if len(self.learners) == 1 else ln.label

    def plot(self) -> str | None:
        """Draw ``output_dir/learning_curve.png`` from this run's metric rows."""
        rows = [r for r in self.log.rows if r.get("phase") == "train"]
        if not self.output_dir or not rows or not self.world.main:
            return None
        return plot_learning_curve({"training success": [(r["step"], r["success"]) for r in rows]},
                                   self.output_dir / "learning_curve.png",
                                   title=f"{self.algorithm.name}: success of the sampled episodes")

    def close(self) -> None:
        """Close the metric sinks, the environments the trainer made (not those it was given),
        and its Ray actors."""
        self.log.close()
        for e in self._owned:
            e.close()
        if self.ray_pool is not None:
            self.ray_pool.close()


def shuffle_rewards(rewards: dict[Any, list[float]], rng: random.Random) -> dict[Any, list[float]]:
    """The shuffled-rewards control: ``{(group, agent): rewards}`` with each agent's rewards
    permuted across all its trajectories of the batch (every group) by ``rng``; the multiset
    of each agent's rewards is kept, the link to what each trajectory did is cut."""
    out = {k: list(v) for k, v in rewards.items()}
    for agent in dict.fromkeys(a for _, a in rewards):
        slots = [(k, i) for k, v in rewards.items() if k[1] == agent for i in range(len(v))]
        values = [rewards[k][i] for k, i in slots]
        rng.shuffle(values)
        for (k, i), r in zip(slots, values):
            out[k][i] = r
    return out


def summarize(groups: list[Group]) -> dict[str, Any]:
    """Success, rewards, tool calls per solved episode, tokens and branching figures of some groups.

    ``tokens_generated`` counts the tokens the policy sampled for these groups: a branch's
    copy of its parent's prefix is counted once, in the parent (``trained_tokens``, in a
    training row, counts every sampled-token position trained on, copies included).
    ``branch_p_min/mean/max`` describe ARPO's branch probability ``P`` over its branching
    decisions, ``branched_fraction`` the share of decisions that made branches (``None``
    without decisions). ``branch_changes_reward`` is the share of branches (per role) whose
    reward differs from their parent's (``None`` without branches);
    ``branch_points_skipped_errors`` counts potential branch points skipped because the
    observation was a tool or parse error, ``branch_points_skipped`` those skipped for any
    reason (a turn without tool calls too; see :attr:`~agents.algorithms.branching.Group.skipped`).
    """
    eps = [e for g in groups for e in g.episodes]
    trajs = [t for e in eps for t in e.trajectories.values()]
    solved = [e for e in eps if e.success]
    rewards: dict[str, list[float]] = {}
    for t in trajs:
        rewards.setdefault(t.agent, []).append(t.reward)
    per_branch = [x for g in groups for x in g.branch_prefill_tokens]
    n = max(len(eps), 1)
    sampled = 0
    for g in groups:
        for i, e in enumerate(g.episodes):
            for a, t in e.trajectories.items():
                lin = g.lineages.get(a)
                copied = lin.shared[i] if lin is not None and i < len(lin.shared) else 0
                sampled += sum(t.loss_mask[copied:])
    ps = [d.p for g in groups for d in g.decisions]
    changed = [g.episodes[i].trajectories[a].reward != g.episodes[p].trajectories[a].reward
               for g in groups for a, lin in g.lineages.items() for i, p in enumerate(lin.parent)
               if p >= 0 and i < len(g.episodes)]
    skipped = [g.skipped for g in groups]
    return {
        "episodes": len(eps),
        "success": sum(e.success for e in eps) / n,
        "reward": sum(t.reward for t in trajs) / max(len(trajs), 1),
        "rewards": {a: sum(v) / len(v) for a, v in rewards.items()},
        "rounds": sum(e.rounds for e in eps) / n,
        "tool_calls_per_solved": (sum(t.tool_calls for e in solved for t in e.trajectories.values()) / len(solved)
                                  if solved else None),
        "tokens_generated": sampled,
        "branches": sum(k == "branch" for g in groups for k in g.kinds),
        "branch_decisions": len(ps),
        "branch_p_min": min(ps) if ps else None,
        "branch_p_mean": sum(ps) / len(ps) if ps else None,
        "branch_p_max": max(ps) if ps else None,
        "branched_fraction": (sum(d.branched for g in groups for d in g.decisions) / len(ps)) if ps else None,
        "branch_changes_reward": sum(changed) / len(changed) if changed else None,
        "branch_points_skipped_errors": sum(k.get("tool_error", 0) + k.get("parse_error", 0) for k in skipped),
        "branch_points_skipped": sum(sum(k.values()) for k in skipped),
        "fills": sum(k == "fill" for g in groups for k in g.kinds),
        "prefill_tokens_per_branch": sum(per_branch) / len(per_branch) if per_branch else None,
        "errors": sum(e.error is not None for e in eps),
        "per_task": {f"{g.env_name}/{g.task_id}": sum(e.success for e in g.episodes) / max(len(g.episodes), 1)
                     for g in groups},
    }


def _wmean(pairs: list[tuple[float, int]]) -> float:
    n = sum(w for _, w in pairs)
    return sum(v * w for v, w in pairs) / n if n else 0.0


def _pad(rows: list[Any]) -> Any:
    import torch

    return torch.nn.utils.rnn.pad_sequence([r.to(torch.float32) for r in rows], batch_first=True)


def _frozen_copy(model: Any, world: parallel.World) -> Any:
    """The KL reference: a frozen copy of ``model`` (under FSDP2 built from its full state dict and sharded
    the same way: a sharded module cannot be deep-copied)."""
    if parallel.is_sharded(model):
        from transformers import AutoModelForCausalLM

        state, _ = parallel.full_state_dict(model, everywhere=True)
        ref = AutoModelForCausalLM.from_config(model.config)
        ref.load_state_dict(state, strict=False)
        ref.to(next(model.parameters()).device)
        ref = parallel.shard(ref, world)
    else:
        ref = copy.deepcopy(model)
    ref.eval()
    for p in ref.parameters():
        p.requires_grad_(False)
    return ref


def train_from_config(config: TrainerConfig | dict[str, Any]) -> dict[str, Any]:
    """Build the Trainer of ``config``; evaluate (``eval``), warm-start (``sft``, unless resuming),
    train ``steps`` steps and evaluate again; return a summary. The ``envfactory train`` run."""
    cfg = config if isinstance(config, TrainerConfig) else TrainerConfig.from_dict(config)
    if cfg.output.dir is None:  # a file run always keeps its metrics and checkpoints
        cfg = dataclasses.replace(cfg, output=dataclasses.replace(cfg.output, dir="runs/train"))
    trainer = Trainer.from_config(cfg)
    try:
        summary: dict[str, Any] = {"algorithm": trainer.algorithm.name, "tasks": len(trainer.pool),
                                   "learners": [ln.label for ln in trainer.learners]}
        if cfg.eval:
            summary["success_before"] = trainer.evaluate()["success"]
        if cfg.sft and not cfg.output.resume:
            # a file run warm-starts on its own tasks when it names some (as envfactory train always has)
            summary["sft"] = trainer.sft(cfg.sft.tasks if cfg.sft.tasks is not None else cfg.tasks)
        rows = trainer.train()
        if cfg.eval:
            summary["success_after"] = trainer.evaluate()["success"]
        summary.update(steps=trainer.step, last=rows[-1] if rows else None, output_dir=str(trainer.output_dir),
                       checkpoint=str(trainer.output_dir / "checkpoints"))
    finally:
        for ln in trainer.learners:
            ln.policy.close()
        trainer.close()
    return summary
