"""Train with TRL's ``GRPOTrainer`` on an envfactory environment (environment mode: multi-turn, stateful,
the reward from the environment), here the embedded tiny model on FindLight-v3's rl split, on CPU.

    python examples/trl/train_grpo.py                                  # FindLight-v3, tiny model after SFT
    python examples/trl/train_grpo.py --env Bank-v0 --model PATH --tasks 0   # any HF causal LM, every rl task

See ``agents/harness/trl_env.py``: one ``envfactory.make(NAME)`` episode per rollout, the environment's tools
as methods, the sparse reward (1.0 on success) ending each episode with the rollout's final answer.

The default model is the tiny model after reader SFT (``agents.quickstart.reader.reader_model``: pretraining, then
supervised plays of FindLight-v3's sft split; built the first time, minutes on 2 cores, progress on stderr,
cached afterwards), as RL is meant to start: from a model that sometimes succeeds. From the pretrained
model alone (``--model pretrained``) almost no rollout succeeds, every group's rewards are equal, GRPO's
advantages are all zero and the weights do not move with the sparse reward; ``--shaping`` then adds
partial credit for error-free calls.

By default it trains on the first 4 tasks of the rl split (``--tasks 0``: all of them), 24 steps of 16
rollouts (2 tasks x 8), so every task is drawn equally often in each quarter of the run and the reward
of the first and last quarters compare the same tasks; on the whole split a step's reward is dominated by
which two tasks it drew. A rising reward here is the policy getting better at the tasks it trains on,
not at unseen ones (the quickstart measures that against a control). ``--max-completion-length`` counts
the tool results too (TRL appends them to the completion): at 128 two thirds of FindLight-v3's rollouts
were cut off before their final answer. The script prints the reward of each step, the mean of the first
and last quarters of the steps, how many weight tensors changed, and the learning signal: how training
moved the log-probability of the first quarter's rewarded completions against the others
(:func:`learning_signal`).
Whether the last quarter's reward beats the first depends on headroom: a reader that already succeeds
on nearly every rollout of these tasks (about 97% on some hosts' kernels) leaves the reward no room to
rise, while the signal shows what the sparse reward taught on any host.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from typing import Any


def main(argv: list[str] | None = None) -> dict[str, Any]:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--env", default="FindLight-v3")
    ap.add_argument("--model", default="reader",
                    help="an HF model folder, or 'reader' (the tiny model after reader SFT on FindLight-v3, the default) "
                         "or 'pretrained' (the tiny model after pretraining only)")
    ap.add_argument("--steps", type=int, default=24)
    ap.add_argument("--tasks", type=int, default=4, help="train on the first N tasks of the rl split (0: all of them)")
    ap.add_argument("--generations", type=int, default=8, help="rollouts per task (GRPO group size)")
    ap.add_argument("--batch", type=int, default=16, help="rollouts per step (a multiple of --generations)")
    ap.add_argument("--max-completion-length", type=int, default=256,
                    help="tokens per rollout, the tool results included")
    ap.add_argument("--lr", type=float, default=3e-4)
    ap.add_argument("--shaping", type=float, default=0.0,
                    help="partial credit: + shaping x share of tool calls that ran without error (0: sparse reward)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--output-dir", default="runs/trl-grpo")
    args = ap.parse_args(argv)
    os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")

    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from trl import GRPOConfig, GRPOTrainer

    from agents import pretrained_tiny_model
    from agents.quickstart.reader import reader_model
    from agents.harness.trl_env import TRLEnvironment, prepare_tokenizer

    def say(line: str) -> None:
        print(line, file=sys.stderr, flush=True)

    if args.model == "reader":
        path = reader_model(seed=0, log=say)              # one published checkpoint; --seed varies the RL run
    elif args.model == "pretrained":
        path = pretrained_tiny_model(seed=0)              # progress bar on stderr while it is built
    else:
        path = args.model
    tokenizer = prepare_tokenizer(AutoTokenizer.from_pretrained(path))   # envfactory's tool-call parser
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)
    env = TRLEnvironment(args.env, split="rl", shaping=args.shaping)     # never the eval split
    if args.tasks:
        env = TRLEnvironment(args.env, tasks=[t.id for t in env.tasks[:args.tasks]], shaping=args.shaping)
    before = {k: v.detach().clone() for k, v in model.named_parameters()}

    config = GRPOConfig(
        output_dir=args.output_dir, max_steps=args.steps, per_device_train_batch_size=args.batch,
        num_generations=args.generations, max_completion_length=args.max_completion_length,
        max_tool_calling_iterations=env.spec.max_turns, learning_rate=args.lr, beta=0.0, temperature=1.0,
        logging_steps=1, save_strategy="no", report_to="none", use_cpu=not torch.cuda.is_available(),
        bf16=False, seed=args.seed)
    trainer = GRPOTrainer(model=model, processing_class=tokenizer, args=config, train_dataset=env.dataset(),
                          environment_factory=env.factory, reward_funcs=env.reward)
    trainer.train()

    steps = [h for h in trainer.state.log_history if "reward" in h and "step" in h]
    changed = sum(bool((before[k] != v.detach()).any()) for k, v in model.named_parameters())
    signal = learning_signal(model, tokenizer, env, before)
    rewards = [h["reward"] for h in steps]
    k = max(1, len(rewards) // 4)                         # first and last quarter of the steps
    out = {"env": args.env, "model": path, "steps": len(steps), "reward_by_step": rewards,
           "reward_first": sum(rewards[:k]) / k if rewards else None,
           "reward_last": sum(rewards[-k:]) / k if rewards else None,
           "reward_std_by_step": [h["reward_std"] for h in steps],
           "successes": sum(bool(r["success"]) for r in env.history), "rollouts": len(env.history),
           "tensors_changed": changed, "tensors": len(before), **signal, "log_history": steps,
           "history": env.history}
    if rewards:
        print(f"reward by step: {' '.join(f'{r:.2f}' for r in rewards)}")
        print(f"reward: first quarter {out['reward_first']:.3f} -> last quarter {out['reward_last']:.3f} "
              f"({'rising' if out['reward_last'] > out['reward_first'] else 'not rising'}); "
              f"{out['successes']}/{out['rollouts']} rollouts succeeded; {changed}/{len(before)} weight tensors changed")
        print(f"learning signal: log-prob per token of the rewarded completions {out['logprob_rewarded']:+.4f}, "
              f"of the others {out['logprob_unrewarded']:+.4f} (difference {out['learning_signal']:+.4f})")
    print(json.dumps({k: v for k, v in out.items() if k not in ("log_history", "history")}))
    return out


def learning_signal(model: Any, tokenizer: Any, env: Any, before: dict[str, Any]) -> dict[str, float]:
    """How training moved the model on the completions it sampled at the start, whatever the starting
    success rate: over the rollouts of the first quarter of the steps (sampled by the starting weights or
    a few updates from them), the change (after - before) of each one's mean log-probability per sampled
    token (tool results left out), averaged over the rewarded rollouts (success) and over the others;
    their difference is ``learning_signal`` (undefined, NaN, when all of them succeeded or none did), and
    ``logprob_moved`` is the mean size of the change. GRPO with the sparse reward raises the rewarded
    completions against the others: a positive difference. A constant reward gives every advantage 0, so
    the weights and the difference stay at 0. (Over every rollout of the run the comparison would be
    confounded: a late rollout was sampled by the trained weights, which favour it whatever its reward.)"""
    import torch

    sampled = [r for r in env.history if "completion_ids" in r]
    rows = sampled[:max(1, len(sampled) // 4)]  # the first quarter, in the order TRL scored them
    after = env.completion_logprobs(model, tokenizer, rows)
    trained = {k: v.detach().clone() for k, v in model.named_parameters()}
    with torch.no_grad():
        for k, v in model.named_parameters():
            v.copy_(before[k])
        start = env.completion_logprobs(model, tokenizer, rows)
        for k, v in model.named_parameters():
            v.copy_(trained[k])
    delta = [a - b for a, b in zip(after, start)]
    up = [d for d, r in zip(delta, rows) if r["success"]]
    down = [d for d, r in zip(delta, rows) if not r["success"]]
    mean = (lambda xs: sum(xs) / len(xs) if xs else float("nan"))
    return {"logprob_rewarded": mean(up), "logprob_unrewarded": mean(down),
            "learning_signal": mean(up) - mean(down), "logprob_moved": mean([abs(d) for d in delta])}


if __name__ == "__main__":
    main()
