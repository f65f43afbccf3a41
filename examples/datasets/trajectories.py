"""Episodes as a Hugging Face dataset: play a few episodes with a scripted policy (the reference
solution, then the answer), write them with :func:`agents.trajectories.save_trajectories`, load
them back with ``datasets.load_dataset`` and as trajectories (what ``Trainer.sft(trajectories=...)``
reads; ``envfactory eval --save-trajectories DIR`` writes the same format for a model).

    python examples/datasets/trajectories.py [Bank-v0] [--out runs/trajectories] [--episodes 4]
"""

from __future__ import annotations

import argparse
import json

import datasets

import envfactory
from agents.rollout import Trajectory, env_version
from agents.trajectories import load_trajectories, save_trajectories


def play(name: str, n: int) -> list[Trajectory]:
    spec = envfactory.spec(name)
    out = []
    for task in spec.tasks_in("sft")[:n]:
        env = envfactory.make(name)
        env.reset(task.id)
        for call in task.solution:
            env.step(call.to_hermes())
        if not env.done:
            env.step("Done. " + " ".join(task.answer_facts))
        status = env.status
        out.append(Trajectory(env_name=name, task_id=task.id, messages=list(env.transcript()), tools=env.tool_schemas(),
                              reward=env.rewards["agent_0"], success=bool(env.success), terminated=status.terminated,
                              truncated=status.truncated, tool_calls=len(status.log), turns=status.round,
                              token_exact=False,  # text only (no model sampled it): for SFT on text, not RL
                              env_version=env_version(spec), seed=0))
    return out


def main(argv: list[str] | None = None) -> dict:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("env", nargs="?", default="Bank-v0")
    p.add_argument("--out", default="runs/trajectories")
    p.add_argument("--episodes", type=int, default=4)
    args = p.parse_args(argv)
    trajectories = play(args.env, args.episodes)
    path = save_trajectories(trajectories, args.out)
    ds = datasets.load_dataset("json", data_files=str(path), split="train")
    back = load_trajectories(path)
    doc = {"path": str(path), "rows": len(ds), "columns": sorted(ds.column_names),
           "rewards": [t.reward for t in back], "round_trip": [t.to_json() for t in back] == [t.to_json() for t in trajectories]}
    print(json.dumps(doc))
    return doc


if __name__ == "__main__":
    main()
