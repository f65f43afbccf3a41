"""Train an unchanged openai-SDK agent loop with GRPO (docs/training.md, "Any agent loop").

`agent` is an ordinary tool-calling loop: nothing in it knows it is being trained. The trainer
serves the policy it trains as an OpenAI-compatible endpoint, gives each run its own base URL,
records the token ids and log-probs of every completion, and scores each run with the
environment's task reward.

    python examples/train/openai_agent_loop.py --steps 2
"""

from __future__ import annotations

import argparse
from typing import Any

import openai


def agent(base_url: str, env: Any) -> None:
    """Play one episode of `env` with whatever model serves `base_url`."""
    client = openai.OpenAI(base_url=base_url, api_key="unused")
    messages = list(env.transcript())  # the system prompt and the task
    while not env.done:
        reply = client.chat.completions.create(model="policy", messages=messages, tools=env.tool_schemas())
        messages.append(reply.choices[0].message.model_dump(exclude_none=True))
        messages += env.step(messages[-1]).messages  # runs the tool calls; tool results come back


def main(argv: list[str] | None = None) -> list[dict[str, Any]]:
    from agents import GRPO, HFPolicy, Trainer, TrainerConfig, build_tiny_model
    from agents.train_config import OptimConfig, OutputConfig, SamplingConfig

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--env", default="Counter-v0")
    ap.add_argument("--model", default=None, help="an HF model path or id (default: the embedded tiny model)")
    ap.add_argument("--steps", type=int, default=2)
    args = ap.parse_args(argv)
    config = TrainerConfig(algorithm=GRPO(M=4), sampling=SamplingConfig(max_new_tokens=32, max_turns=3),
                           optim=OptimConfig(lr=5e-4, tasks_per_step=1), output=OutputConfig(show_progress=False))
    trainer = Trainer(HFPolicy(args.model or build_tiny_model()), [args.env], config)
    rows = trainer.train_agent_loop(agent, steps=args.steps)
    for row in rows:
        print(f"step {row['step']}: success {row['success']:.2f}, {row['calls']} calls, "
              f"{row['trained_tokens']} tokens trained, {row['rollout_s']:.1f}s of episodes")
    return rows


if __name__ == "__main__":
    main()
