"""``agents.Trainer``: SFT warm start and GRPO/ARPO training over tool-use environments.

The loop, step by step (each a separate, obvious piece)::

    groups  = sample_groups(policy, tasks, algorithm)        # rollout: M trajectories per task (ARPO branches)
    Â       = group_advantages(rewards of each group)        # sparse outcome reward, group-normalised
    loss    = policy_loss(log π_θ, log π_old, Â, loss_mask)  # clipped ratio, token-mean, tool tokens masked
    optimizer.step(); push weights to the inference engine   # vLLM: VLLMPolicy.load_weights

Rollouts are token-in/token-out (:mod:`agents.rollout`): the trainer scores
exactly the ids the policy sampled. ``log π_old`` is the sampling log-probability
the backend recorded (the behaviour policy), so a mismatch between inference
and training numerics is corrected by the importance ratio instead of ignored.
"""

from __future__ import annotations

import copy
import inspect
import random
import time
from dataclasses import asdict
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Sequence

from .algorithms.advantages import group_advantages, hard_token_advantages, soft_token_advantages
from .algorithms.arpo import ARPO, GRPO, Group, sample_groups
from .algorithms.logprobs import token_logprobs
from .algorithms.loss import policy_loss
from .algorithms.metrics import MetricsLog, plot_learning_curve, progress
from .algorithms.sft import reference_trajectories
from .checkpoint import latest_checkpoint, load_checkpoint, save_checkpoint

if TYPE_CHECKING:
    import torch

    from envfactory import Environment

    from .policy import Policy

__all__ = ["Trainer"]

TaskFilter = Sequence[str] | Callable[[str, str], bool] | None


def _all_multi_agent(names: Sequence[str]) -> bool:
    import envfactory

    flags = {bool(getattr(envfactory.spec(n), "multi_agent", False)) for n in names}
    if flags == {True, False}:
        raise ValueError(f"{list(names)} mixes single- and multi-agent environments: train them separately")
    return flags == {True}


class Trainer:
    """Train a policy on environments' tasks with sparse task-success rewards.

    Args:
        policy: The sampling backend. With :class:`~agents.hf_policy.HFPolicy`,
            ``policy.model`` is trained in place; with any other backend (vLLM)
            pass ``model`` (the HF module to train) and the trainer pushes its
            weights to the backend's ``load_weights`` after every step.
        envs: Environments (instances or registered names); their tasks form the pool.
        algorithm: :class:`ARPO` (default) or :class:`GRPO`.
        tasks: Which tasks to train on: ids (``"task"`` or ``"Env-v0/task"``), or
            ``f(env_name, task_id) -> bool``; default every task.
        lr: AdamW learning rate of the RL updates.
        tasks_per_step: Tasks per step; each gets ``algorithm.M`` trajectories.
        max_new_tokens: Tokens per assistant turn.
        max_turns: Assistant turns per episode (default: the environment's).
        micro_batch: Sequences per forward/backward pass (gradients accumulate).
        grad_clip: Global gradient-norm clip (0 disables).
        format_coef: Optional reward for a trajectory without parse errors (off unless asked for).
        reward_fn: Replaces the reward: ``reward_fn(trajectory) -> float`` (default: the
            environment's sparse task success, plus the format term when ``format_coef``).
        seed: Seeds task choice, sampling and branching of every step (a resumed run repeats them).
        output_dir: Where ``metrics.jsonl``, ``learning_curve.png`` and ``checkpoints/`` go.
        save_every: Save a checkpoint every this many steps (0: only at the end of :meth:`train`).
    """

    def __new__(cls, policy: Any = None, envs: Sequence[Any] = (), algorithm: ARPO | None = None, **kw: Any) -> Any:
        """Multi-agent environments (every name in ``envs``) give a :class:`~agents.team_trainer.TeamTrainer`.

        ``policy`` is then one ``Policy`` for every role (self-play) or ``{agent id: Policy}``;
        team training is GRPO over joint episodes (``algorithm.M`` per task): pass ``GRPO(...)``,
        as ARPO's branching has no joint-episode counterpart here. ``reward_fn`` then takes
        ``(agent, trajectory, episode)``.
        """
        names = [e for e in envs if isinstance(e, str)]
        if cls is Trainer and names and len(names) == len(envs) and _all_multi_agent(names):
            from .team_trainer import TeamTrainer

            algo = algorithm if algorithm is not None else GRPO()
            if algo.branching:
                raise ValueError("multi-agent training is GRPO over joint episodes: pass algorithm=GRPO(M=...); "
                                 "ARPO's entropy-triggered branching is for single-agent environments")
            unsupported = [f for f, off in (("updates", 1), ("kl_coef", 0.0)) if getattr(algo, f) != off]
            if unsupported:
                raise ValueError(f"team training does not take {unsupported} (one on-policy update, no KL "
                                 "penalty); leave them at their defaults")
            # what TeamTrainer takes by keyword, less what is set here from the arguments
            allowed = set(inspect.signature(TeamTrainer).parameters) - {"team", "envs", "M", "clip_eps"}
            extra = sorted(set(kw) - allowed)
            if extra:
                raise TypeError(f"Trainer on multi-agent environments does not take {extra}")
            return TeamTrainer(policy, names, M=algo.M, clip_eps=algo.clip_eps, **kw)
        return super().__new__(cls)

    def __init__(self, policy: "Policy", envs: Sequence["Environment | str"], algorithm: ARPO | None = None, *,
                 tasks: TaskFilter = None, model: Any = None, lr: float = 1e-5, tasks_per_step: int = 4,
                 max_new_tokens: int = 128, temperature: float = 1.0, max_turns: int | None = None,
                 micro_batch: int = 16, grad_clip: float = 1.0, format_coef: float = 0.0,
                 reward_fn: Callable[[Any], float] | None = None, seed: int = 0,
                 output_dir: str | None = None, save_every: int = 0, show_progress: bool = True) -> None:
        import torch

        import envfactory

        self.policy = policy
        self.algorithm = algorithm if algorithm is not None else ARPO()
        self.model = model if model is not None else getattr(policy, "model", None)
        if self.model is None:
            raise ValueError(f"{type(policy).__name__} has no trainable .model; pass model= (the HF module to "
                             "train), whose weights are pushed to the policy after each step")
        if isinstance(self.model, str):
            from transformers import AutoModelForCausalLM

            self.model = AutoModelForCausalLM.from_pretrained(self.model, dtype=torch.float32)
        self.push_weights = self.model is not getattr(policy, "model", None)
        if self.push_weights and not hasattr(policy, "load_weights"):
            raise ValueError(f"{type(policy).__name__} cannot receive weights (no load_weights); "
                             "train an HFPolicy's own model instead")
        self.envs = [envfactory.make(e) if isinstance(e, str) else e for e in envs]
        self.pool = self._select(tasks)
        if not self.pool:
            raise ValueError("no tasks to train on: check the tasks= filter against the environments' task ids")
        self.lr, self.tasks_per_step, self.max_new_tokens = lr, tasks_per_step, max_new_tokens
        self.temperature, self.max_turns, self.micro_batch = temperature, max_turns, micro_batch
        self.grad_clip, self.format_coef, self.reward_fn, self.seed = grad_clip, format_coef, reward_fn, seed
        self.output_dir = Path(output_dir) if output_dir else None
        self.save_every, self.show_progress = save_every, show_progress
        self.optimizer = torch.optim.AdamW(self.model.parameters(), lr=lr, betas=(0.9, 0.99), weight_decay=0.0)
        self.ref_model: Any = None
        self.step = 0
        self.log = MetricsLog(self.output_dir / "metrics.jsonl" if self.output_dir else None)

    # -- tasks -------------------------------------------------------------
    def _select(self, tasks: TaskFilter) -> list[tuple["Environment", str]]:
        pool = []
        for env in self.envs:
            for t in env.spec.get_tasks():
                name = env.spec.name
                if tasks is None or (callable(tasks) and tasks(name, t.id)) or (
                        not callable(tasks) and (t.id in tasks or f"{name}/{t.id}" in tasks)):
                    pool.append((env, t.id))
        return pool

    def pairs(self, tasks: TaskFilter = None) -> list[tuple["Environment", str]]:
        """``(env, task_id)`` for ``tasks`` (default: the training pool)."""
        return self.pool if tasks is None else self._select(tasks)

    # -- evaluation ----------------------------------------------------------
    def evaluate(self, tasks: TaskFilter = None, *, samples: int = 4, temperature: float | None = None,
                 seed: int = 12345) -> dict[str, Any]:
        """Success rate over ``samples`` episodes of each task (default: the training pool)."""
        temp = self.temperature if temperature is None else temperature
        groups = sample_groups(self.policy, self.pairs(tasks), GRPO(M=samples), max_new_tokens=self.max_new_tokens,
                               temperature=temp, seed=seed, max_turns=self.max_turns)
        return summarize(groups)

    # -- SFT warm start -------------------------------------------------------
    def sft(self, tasks: TaskFilter = None, *, epochs: int = 10, lr: float = 1e-3, batch_size: int = 8,
            seed: int | None = None) -> dict[str, Any]:
        """Warm start on the tasks' verified reference solutions (loss on assistant tokens only)."""
        import torch

        trajs = reference_trajectories(self.policy.tokenizer, self.pairs(tasks))
        opt = torch.optim.AdamW(self.model.parameters(), lr=lr, betas=(0.9, 0.99), weight_decay=0.0)
        rng = random.Random(self.seed if seed is None else seed)
        started, losses = time.perf_counter(), []
        self.model.train()
        for epoch in range(epochs):
            order = list(range(len(trajs)))
            rng.shuffle(order)
            for b in range(0, len(order), batch_size):
                batch = [trajs[i] for i in order[b:b + batch_size]]
                lps = token_logprobs(self.model, [t.prompt_ids + t.response_ids for t in batch],
                                     [len(t.prompt_ids) for t in batch], pad_id=self._pad_id())
                masks = [torch.tensor(t.loss_mask, dtype=lp.dtype, device=lp.device) for t, lp in zip(batch, lps)]
                n = sum(float(m.sum()) for m in masks)
                loss = -sum((lp * m).sum() for lp, m in zip(lps, masks)) / max(n, 1.0)
                opt.zero_grad(set_to_none=True)
                loss.backward()
                if self.grad_clip:
                    torch.nn.utils.clip_grad_norm_(self.model.parameters(), self.grad_clip)
                opt.step()
                losses.append(float(loss.item()))
            self.log.write({"phase": "sft", "epoch": epoch + 1, "nll": losses[-1]})
            if self.show_progress:
                progress("sft", epoch + 1, epochs, started, nll=losses[-1])
        self._sync()
        return {"examples": len(trajs), "epochs": epochs, "final_nll": losses[-1] if losses else None,
                "seconds": round(time.perf_counter() - started, 2)}

    # -- RL ------------------------------------------------------------------
    def train(self, steps: int, *, resume: bool | str = False) -> list[dict[str, Any]]:
        """Run RL steps until ``self.step == steps``; return this call's metric rows.

        Args:
            resume: ``True`` continues from the latest checkpoint in ``output_dir``;
                a path continues from that checkpoint.
        """
        if resume:
            self.load(latest_checkpoint(self.output_dir / "checkpoints") if resume is True else resume)
        if self.algorithm.kl_coef and self.ref_model is None:
            self.ref_model = _frozen_copy(self.model)
        started, rows = time.perf_counter(), []
        while self.step < steps:
            row = self.train_step()
            rows.append(row)
            if self.show_progress:
                progress(self.algorithm.name.lower(), self.step, steps, started, success=row["success"],
                         loss=row["loss"])
            if self.output_dir and self.save_every and self.step % self.save_every == 0:
                self.save()
        if self.output_dir:
            self.save()
            self.plot()
        return rows

    def train_step(self) -> dict[str, Any]:
        """One step: sample groups, compute advantages, ``algorithm.updates`` clipped-loss updates, push weights."""
        import torch

        t0 = time.perf_counter()
        rng = random.Random(self.seed * 1_000_003 + self.step)
        chosen = rng.sample(self.pool, min(self.tasks_per_step, len(self.pool)))
        groups = sample_groups(self.policy, chosen, self.algorithm, max_new_tokens=self.max_new_tokens,
                               temperature=self.temperature, seed=rng.randrange(2**31), max_turns=self.max_turns)
        t_rollout = time.perf_counter() - t0
        samples = self._samples(groups)
        n_tokens = sum(sum(s[2]) for s in samples)
        stats: list[Any] = []
        grad_norm = 0.0
        updates = self.algorithm.updates if samples else 0
        refs: dict[int, Any] = {}  # the reference policy's log-probs, once per micro-batch
        self.model.train()
        for _ in range(updates):
            self.optimizer.zero_grad(set_to_none=True)
            for b in range(0, len(samples), self.micro_batch):
                mb = samples[b:b + self.micro_batch]
                seqs, starts = [s[0] for s in mb], [s[1] for s in mb]
                lps = token_logprobs(self.model, seqs, starts, temperature=self.temperature, pad_id=self._pad_id())
                if self.ref_model is not None and b not in refs:
                    with torch.no_grad():
                        refs[b] = _pad([x.detach() for x in token_logprobs(self.ref_model, seqs, starts,
                                                                          temperature=self.temperature,
                                                                          pad_id=self._pad_id())])
                ref = refs.get(b)
                dev = lps[0].device
                loss, st = policy_loss(_pad(lps), _pad([torch.tensor(s[3], device=dev) for s in mb]),
                                       _pad([torch.tensor(s[4], device=dev) for s in mb]),
                                       _pad([torch.tensor(s[2], device=dev) for s in mb]),
                                       clip_eps=self.algorithm.clip_eps, ref_logp=ref,
                                       kl_coef=self.algorithm.kl_coef, num_tokens=n_tokens)
                loss.backward()
                stats.append(st)
            if self.grad_clip:
                grad_norm = float(torch.nn.utils.clip_grad_norm_(self.model.parameters(), self.grad_clip))
            self.optimizer.step()
        if samples:
            self._sync()
        self.step += 1
        row = {"phase": "train", "step": self.step, "algorithm": self.algorithm.name, **summarize(groups),
               "loss": sum(s.loss for s in stats) / max(updates, 1), "kl": _wmean([(s.kl, s.tokens) for s in stats]),
               "clip_fraction": _wmean([(s.clip_fraction, s.tokens) for s in stats]),
               "trained_sequences": len(samples), "trained_tokens": n_tokens, "grad_norm": grad_norm,
               "rollout_s": round(t_rollout, 3), "step_s": round(time.perf_counter() - t0, 3)}
        self.log.write(row)
        return row

    def _samples(self, groups: list[Group]) -> list[tuple[list[int], int, list[int], list[float], list[float]]]:
        """``(ids, prompt_len, loss_mask, old_logprobs, token_advantages)`` of every trajectory with signal."""
        out = []
        for g in groups:
            rewards = [self.reward(t) for t in g.trajectories]
            adv = group_advantages(rewards)
            if not any(adv) and not self.algorithm.kl_coef:
                continue  # equal rewards: no signal (as DAPO's dynamic sampling drops such groups)
            lengths = [len(t.response_ids) for t in g.trajectories]
            tok_adv = (hard_token_advantages(adv, lengths, g.lineage) if self.algorithm.attribution == "hard"
                       else soft_token_advantages(adv, lengths))
            for t, a in zip(g.trajectories, tok_adv):
                if t.response_ids and t.token_exact:
                    out.append((t.prompt_ids + t.response_ids, len(t.prompt_ids), t.loss_mask, t.logprobs, a))
        return out

    def reward(self, traj: Any) -> float:
        """The scalar reward of a finished trajectory (sparse success unless configured otherwise)."""
        if self.reward_fn is not None:
            return float(self.reward_fn(traj))
        return traj.reward + (self.format_coef if traj.parse_errors == 0 and traj.tool_calls else 0.0)

    # -- weights, checkpoints, plots -------------------------------------------
    def _pad_id(self) -> int:
        tok = self.policy.tokenizer
        return int(tok.pad_token_id) if tok.pad_token_id is not None else 0

    def _sync(self) -> None:
        if self.push_weights:
            self.policy.load_weights(list(self.model.state_dict().items()))

    def save(self, path: str | None = None) -> Path:
        """Write a checkpoint (default ``output_dir/checkpoints/step-<n>``)."""
        root = Path(path) if path else (self.output_dir / "checkpoints" if self.output_dir else None)
        if root is None:
            raise ValueError("Trainer.save: pass a path or construct the Trainer with output_dir=")
        state = {"seed": self.seed, "algorithm": asdict(self.algorithm), "algorithm_name": self.algorithm.name}
        ckpt = save_checkpoint(root, self.step, model=self.model, optimizer=self.optimizer, state=state,
                               tokenizer=self.policy.tokenizer)
        if self.ref_model is not None:
            from safetensors.torch import save_model

            save_model(self.ref_model, str(ckpt / "reference.safetensors"))
        return ckpt

    def load(self, path: str | Path | None) -> None:
        """Restore weights, optimizer state and the step counter from a checkpoint folder."""
        if path is None:
            raise FileNotFoundError("no checkpoint to resume from: none saved under output_dir/checkpoints yet")
        meta = load_checkpoint(path, model=self.model, optimizer=self.optimizer)
        self.step = int(meta["step"])
        ref = Path(path) / "reference.safetensors"
        if ref.exists():
            from safetensors.torch import load_model

            self.ref_model = _frozen_copy(self.model)
            load_model(self.ref_model, str(ref))
        self.log.truncate_after(self.step)
        self._sync()

    def plot(self) -> str | None:
        """Draw ``output_dir/learning_curve.png`` from this run's metric rows."""
        rows = [r for r in self.log.rows if r.get("phase") == "train"]
        if not self.output_dir or not rows:
            return None
        return plot_learning_curve({"training success": [(r["step"], r["success"]) for r in rows]},
                                   self.output_dir / "learning_curve.png",
                                   title=f"{self.algorithm.name}: success of the sampled trajectories")


def summarize(groups: list[Group]) -> dict[str, Any]:
    """Success, tool calls per solved task, tokens generated and branching figures of some groups."""
    trajs = [t for g in groups for t in g.trajectories]
    solved = [t for t in trajs if t.success]
    per_branch = [x for g in groups for x in g.branch_prefill_tokens]
    return {
        "episodes": len(trajs),
        "success": sum(t.success for t in trajs) / max(len(trajs), 1),
        "reward": sum(t.reward for t in trajs) / max(len(trajs), 1),
        "tool_calls_per_solved": sum(t.tool_calls for t in solved) / len(solved) if solved else None,
        "tokens_generated": sum(sum(t.loss_mask) for t in trajs),
        "branches": sum(k == "branch" for g in groups for k in g.kinds),
        "fills": sum(k == "fill" for g in groups for k in g.kinds),
        "prefill_tokens_per_branch": sum(per_branch) / len(per_branch) if per_branch else None,
        "errors": sum(t.error is not None for t in trajs),
    }


def _wmean(pairs: list[tuple[float, int]]) -> float:
    n = sum(w for _, w in pairs)
    return sum(v * w for v, w in pairs) / n if n else 0.0


def _pad(rows: list["torch.Tensor"]) -> "torch.Tensor":
    import torch

    return torch.nn.utils.rnn.pad_sequence([r.to(torch.float32) for r in rows], batch_first=True)


def _frozen_copy(model: Any) -> Any:
    ref = copy.deepcopy(model)
    ref.eval()
    for p in ref.parameters():
        p.requires_grad_(False)
    return ref
