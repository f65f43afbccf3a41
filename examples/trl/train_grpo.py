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
and last quarters of the steps and how many weight tensors changed.
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
    rewards = [h["reward"] for h in steps]
    k = max(1, len(rewards) // 4)                         # first and last quarter of the steps
    out = {"env": args.env, "model": path, "steps": len(steps), "reward_by_step": rewards,
           "reward_first": sum(rewards[:k]) / k if rewards else None,
           "reward_last": sum(rewards[-k:]) / k if rewards else None,
           "reward_std_by_step": [h["reward_std"] for h in steps],
           "successes": sum(bool(r["success"]) for r in env.history), "rollouts": len(env.history),
           "tensors_changed": changed, "tensors": len(before), "log_history": steps, "history": env.history}
    if rewards:
        print(f"reward by step: {' '.join(f'{r:.2f}' for r in rewards)}")
        print(f"reward: first quarter {out['reward_first']:.3f} -> last quarter {out['reward_last']:.3f} "
              f"({'rising' if out['reward_last'] > out['reward_first'] else 'not rising'}); "
              f"{out['successes']}/{out['rollouts']} rollouts succeeded; {changed}/{len(before)} weight tensors changed")
    print(json.dumps({k: v for k, v in out.items() if k not in ("log_history", "history")}))
    return out


if __name__ == "__main__":
    main()
