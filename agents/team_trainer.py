"""``TeamTrainer``: GRPO for teams of LLM agents on multi-agent environments (self-play or a policy per role).

The loop mirrors :class:`agents.Trainer`, with joint episodes::

    for each chosen task: M joint episodes          # team_rollout: one token-in/token-out trajectory per role
    r[a][i]  = reward of agent a in episode i       # joint sparse success, or a's payoff (mixed-motive)
    Â[a][i] = (r[a][i] − mean_i r[a]) / std_i r[a] # GRPO, over the M joint episodes of the task, per role
    every token of a's trajectory i gets Â[a][i]; inserted ids (observations, teammates' letters) have mask 0
    loss  = clipped ratio, token-mean, per learner; optimizer.step() per learner

A *learner* is one trainable model with its optimizer. With one shared
:class:`~agents.policy.Policy` (self-play) every role's trajectories train the
same model; with ``{agent id: Policy}`` each distinct policy trains only on the
trajectories of the roles it plays (two roles mapped to the same object share
it). ``log π_old`` is the sampling log-probability the backend recorded.
"""

from __future__ import annotations

import random
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from .algorithms.advantages import group_advantages
from .algorithms.logprobs import token_logprobs
from .algorithms.loss import policy_loss
from .algorithms.metrics import MetricsLog, progress
from .team_rollout import Team, TeamEpisode, team_rollout

__all__ = ["Learner", "Sample", "TeamTrainer"]

RewardFn = Callable[[str, Any, TeamEpisode], float]


@dataclass
class Sample:
    """One role trajectory as a training row of its learner."""

    agent: str
    ids: list[int]
    start: int
    mask: list[int]
    old_logprobs: list[float]
    advantage: float


@dataclass
class Learner:
    """A trainable model (``policy.model``), its optimizer and the agent ids it plays."""

    policy: Any
    optimizer: Any
    agents: set[str] = field(default_factory=set)

    @property
    def model(self) -> Any:
        return self.policy.model


class TeamTrainer:
    """Train a team on multi-agent environments' tasks.

    Args:
        team: One ``Policy`` for every role (self-play) or ``{agent id: Policy}``. Each
            distinct policy must be trainable in place (``policy.model``, e.g. ``HFPolicy``).
        envs: Multi-agent environment names (``envfactory.make_multi``).
        M: Joint episodes per task (the GRPO group).
        tasks: Task ids (``"id"`` or ``"Env-v0/id"``) to train on; default every task.
        mode: ``aec`` (turn order) or ``parallel`` (simultaneous moves).
        max_rounds: Overrides the environments' round limit.
        reward_fn: ``reward_fn(agent, trajectory, episode) -> float`` replaces the environment's
            per-agent reward (default: ``episode.rewards[agent]``).
        lr, tasks_per_step, max_new_tokens, temperature, micro_batch, grad_clip, clip_eps, seed:
            as in :class:`agents.Trainer`.
        output_dir: Where ``metrics.jsonl`` goes (optional).
    """

    def __init__(self, team: Team, envs: Sequence[str], *, M: int = 8, tasks: Sequence[str] | None = None,
                 mode: str = "aec", max_rounds: int | None = None, reward_fn: RewardFn | None = None,
                 lr: float = 1e-5, tasks_per_step: int = 2, max_new_tokens: int = 96, temperature: float = 1.0,
                 micro_batch: int = 8, grad_clip: float = 1.0, clip_eps: float = 0.2, seed: int = 0,
                 output_dir: str | None = None, show_progress: bool = False) -> None:
        import torch

        import envfactory

        if M < 2:
            raise ValueError(f"M={M}: group-normalised advantages need at least 2 joint episodes per task")
        self.team, self.envs, self.M, self.mode = team, list(envs), M, mode
        self.specs = {n: envfactory.spec(n) for n in self.envs}
        for n, s in self.specs.items():
            if not getattr(s, "multi_agent", False):
                raise TypeError(f"{n} is a single-agent environment; train it with agents.Trainer")
        self.pool = [(n, t.id) for n, s in self.specs.items() for t in s.get_tasks()
                     if tasks is None or t.id in tasks or f"{n}/{t.id}" in tasks]
        if not self.pool:
            raise ValueError("no tasks to train on: check tasks= against the environments' task ids")
        self.learners: dict[int, Learner] = {}
        for n, s in self.specs.items():
            for a in s.agent_ids:
                pol = team[a] if isinstance(team, Mapping) else team
                if isinstance(team, Mapping) and a not in team:
                    raise KeyError(f"{n}: the team has no policy for agent {a!r} (it has {sorted(team)})")
                if getattr(pol, "model", None) is None:
                    raise ValueError(f"the policy of {a} ({type(pol).__name__}) has no trainable .model; "
                                     "use an HFPolicy (trained in place)")
                if id(pol) not in self.learners:
                    opt = torch.optim.AdamW(pol.model.parameters(), lr=lr, betas=(0.9, 0.99), weight_decay=0.0)
                    self.learners[id(pol)] = Learner(pol, opt)
                self.learners[id(pol)].agents.add(a)
        self.max_rounds, self.reward_fn, self.lr, self.tasks_per_step = max_rounds, reward_fn, lr, tasks_per_step
        self.max_new_tokens, self.temperature, self.micro_batch = max_new_tokens, temperature, micro_batch
        self.grad_clip, self.clip_eps, self.seed, self.show_progress = grad_clip, clip_eps, seed, show_progress
        self.step = 0
        self.log = MetricsLog(f"{output_dir}/metrics.jsonl" if output_dir else None)
        self.last_samples: dict[int, list[Sample]] = {}

    def learner_of(self, agent: str) -> Learner:
        """The learner that plays ``agent``."""
        for lr in self.learners.values():
            if agent in lr.agents:
                return lr
        raise KeyError(f"no learner plays {agent!r}")

    # -- rollouts ---------------------------------------------------------
    def _episodes(self, pairs: Sequence[tuple[str, str]], team: Team, m: int, seed: int, *,
                  temperature: float, tokenizer: Any = None) -> list[list[TeamEpisode]]:
        import envfactory

        kw = {} if self.max_rounds is None else {"max_rounds": self.max_rounds}
        jobs = [(envfactory.make_multi(n, **kw), tid) for n, tid in pairs for _ in range(m)]
        eps = team_rollout(team, jobs, mode=self.mode, max_new_tokens=self.max_new_tokens,
                           temperature=temperature, seed=seed, tokenizer=tokenizer)
        return [eps[i * m:(i + 1) * m] for i in range(len(pairs))]

    def evaluate(self, tasks: Sequence[str] | None = None, *, samples: int = 4, temperature: float | None = None,
                 seed: int = 12345) -> dict[str, Any]:
        """Joint success over ``samples`` episodes of each task (default: the training pool)."""
        pairs = self.pool if tasks is None else [p for p in self.pool if p[1] in tasks or f"{p[0]}/{p[1]}" in tasks]
        groups = self._episodes(pairs, self.team, samples, seed,
                                temperature=self.temperature if temperature is None else temperature)
        return summarize(groups)

    # -- SFT on reference joint solutions ------------------------------------
    def sft(self, *, epochs: int = 10, lr: float = 1e-3, batch_size: int = 8, seed: int | None = None
            ) -> dict[str, Any]:
        """Warm start every learner on the oracle's play of the tasks' joint solutions (its own roles only).

        Raises:
            RuntimeError: a reference joint solution did not succeed (run ``envfactory verify``).
        """
        import torch

        from envfactory.multi.team import OraclePolicy

        rng = random.Random(self.seed if seed is None else seed)
        started, out = time.perf_counter(), {}
        for ln in self.learners.values():  # the oracle's play, rendered with this learner's tokenizer
            eps = [e for g in self._episodes(self.pool, OraclePolicy(), 1, 0, temperature=0.0,
                                             tokenizer=ln.policy.tokenizer) for e in g]
            bad = [f"{e.env_name}/{e.task_id}" for e in eps if not e.success]
            if bad:
                raise RuntimeError(f"reference joint solutions failed for {bad}; run `envfactory verify`")
            rows = [t for e in eps for a, t in e.trajectories.items() if a in ln.agents and sum(t.loss_mask)]
            opt = torch.optim.AdamW(ln.model.parameters(), lr=lr, betas=(0.9, 0.99), weight_decay=0.0)
            ln.model.train()
            losses: list[float] = []
            for epoch in range(epochs):
                rng.shuffle(rows)
                for b in range(0, len(rows), batch_size):
                    batch = rows[b:b + batch_size]
                    lps = token_logprobs(ln.model, [t.prompt_ids + t.response_ids for t in batch],
                                         [len(t.prompt_ids) for t in batch], pad_id=_pad_id(ln.policy))
                    masks = [torch.tensor(t.loss_mask, dtype=lp.dtype, device=lp.device) for t, lp in zip(batch, lps)]
                    loss = -sum((lp * m).sum() for lp, m in zip(lps, masks)) / max(sum(float(m.sum()) for m in masks), 1.0)
                    opt.zero_grad(set_to_none=True)
                    loss.backward()
                    if self.grad_clip:
                        torch.nn.utils.clip_grad_norm_(ln.model.parameters(), self.grad_clip)
                    opt.step()
                    losses.append(float(loss.item()))
                self.log.write({"phase": "sft", "learner": sorted(ln.agents), "epoch": epoch + 1, "nll": losses[-1]})
                if self.show_progress:
                    progress("sft", epoch + 1, epochs, started, nll=losses[-1])
            out[",".join(sorted(ln.agents))] = {"examples": len(rows), "final_nll": losses[-1] if losses else None}
        return {"learners": out, "seconds": round(time.perf_counter() - started, 2)}

    # -- RL -----------------------------------------------------------------
    def reward(self, agent: str, traj: Any, episode: TeamEpisode) -> float:
        """Agent ``agent``'s reward for its trajectory of ``episode``."""
        if self.reward_fn is not None:
            return float(self.reward_fn(agent, traj, episode))
        return float(episode.rewards.get(agent, 0.0))

    def samples(self, groups: list[list[TeamEpisode]]) -> dict[int, list[Sample]]:
        """Per learner, the role trajectories with signal and their group-normalised advantages."""
        out: dict[int, list[Sample]] = {k: [] for k in self.learners}
        for group in groups:
            for agent in group[0].trajectories:
                trajs = [e.trajectories[agent] for e in group]
                adv = group_advantages([self.reward(agent, t, e) for t, e in zip(trajs, group)])
                if not any(adv):
                    continue  # equal rewards: no signal for this role in this group
                key = id(self.learner_of(agent).policy)
                for t, a in zip(trajs, adv):
                    if sum(t.loss_mask) and t.error is None and t.token_exact:
                        out[key].append(Sample(agent, t.prompt_ids + t.response_ids, len(t.prompt_ids),
                                               list(t.loss_mask), list(t.logprobs), a))
        return out

    def train(self, steps: int) -> list[dict[str, Any]]:
        """Run steps until ``self.step == steps``; return this call's metric rows."""
        started, rows = time.perf_counter(), []
        while self.step < steps:
            rows.append(self.train_step())
            if self.show_progress:
                progress("team-grpo", self.step, steps, started, success=rows[-1]["success"])
        return rows

    def train_step(self) -> dict[str, Any]:
        """Sample M joint episodes per chosen task, compute per-role advantages, update every learner."""
        t0 = time.perf_counter()
        rng = random.Random(self.seed * 1_000_003 + self.step)
        chosen = rng.sample(self.pool, min(self.tasks_per_step, len(self.pool)))
        groups = self._episodes(chosen, self.team, self.M, rng.randrange(2**31), temperature=self.temperature)
        t_roll = time.perf_counter() - t0
        self.last_samples = self.samples(groups)
        per: dict[str, Any] = {}
        for key, ln in self.learners.items():
            per[",".join(sorted(ln.agents))] = self._update(ln, self.last_samples[key])
        self.step += 1
        row = {"phase": "train", "step": self.step, **summarize(groups), "learners": per,
               "rollout_s": round(t_roll, 3), "step_s": round(time.perf_counter() - t0, 3)}
        self.log.write(row)
        return row

    def _update(self, ln: Learner, samples: list[Sample]) -> dict[str, Any]:
        """One clipped-loss step of ``ln`` on its own samples (no samples: no step)."""
        import torch

        if not samples:
            return {"sequences": 0, "tokens": 0, "loss": 0.0}
        n_tokens = sum(sum(s.mask) for s in samples)
        ln.model.train()
        ln.optimizer.zero_grad(set_to_none=True)
        total = 0.0
        for b in range(0, len(samples), self.micro_batch):
            mb = samples[b:b + self.micro_batch]
            lps = token_logprobs(ln.model, [s.ids for s in mb], [s.start for s in mb],
                                 temperature=self.temperature, pad_id=_pad_id(ln.policy))
            dev = lps[0].device
            loss, st = policy_loss(_pad(lps), _pad([torch.tensor(s.old_logprobs, device=dev) for s in mb]),
                                   _pad([torch.full((len(s.mask),), s.advantage, device=dev) for s in mb]),
                                   _pad([torch.tensor(s.mask, device=dev) for s in mb]),
                                   clip_eps=self.clip_eps, num_tokens=n_tokens)
            loss.backward()
            total += st.loss
        grad_norm = float(torch.nn.utils.clip_grad_norm_(ln.model.parameters(), self.grad_clip or float("inf")))
        ln.optimizer.step()
        ln.model.eval()
        return {"sequences": len(samples), "tokens": n_tokens, "loss": total, "grad_norm": grad_norm}


def summarize(groups: list[list[TeamEpisode]]) -> dict[str, Any]:
    """Joint success, mean reward per agent, rounds and errors of some joint episodes."""
    eps = [e for g in groups for e in g]
    rewards: dict[str, list[float]] = {}
    for e in eps:
        for a, r in e.rewards.items():
            rewards.setdefault(a, []).append(r)
    return {"episodes": len(eps), "success": sum(e.success for e in eps) / max(len(eps), 1),
            "reward": {a: sum(v) / len(v) for a, v in rewards.items()},
            "rounds": sum(e.rounds for e in eps) / max(len(eps), 1),
            "tokens_generated": sum(sum(t.loss_mask) for e in eps for t in e.trajectories.values()),
            "errors": sum(e.error is not None for e in eps)}


def _pad_id(policy: Any) -> int:
    tok = policy.tokenizer
    return int(tok.pad_token_id) if tok.pad_token_id is not None else 0


def _pad(rows: list[Any]) -> Any:
    import torch

    return torch.nn.utils.rnn.pad_sequence([r.to(torch.float32) for r in rows], batch_first=True)
