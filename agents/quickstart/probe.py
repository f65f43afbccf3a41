"""Does the model read what its tools return? Measured on FindLight, where success needs
the room that ``locate`` answers.

A success rate alone cannot tell reading from guessing: a model that turns on a
likely room gets some tasks right without ever looking. :func:`reading_report`
plays tasks and reports, besides success,

* the **chain**: how often the first call looks up the instruction's item, the
  second the container the first answer named, and whether the target room was
  ever *shown* (appeared in a tool response);
* **success given shown** and **success given not shown**: a reader succeeds
  mostly after seeing the room; a guesser is as good either way (about 1 / rooms);
* the **swap probe** (counterfactual): every task is played again in its twin world
  where ``locate`` answers another of the task's rooms and only that room counts
  (:func:`environments.find_light.swap_answer`; the instruction is the same). With
  greedy decoding each (task, twin) pair is deterministic: ``moved`` is the share of
  the tasks solved in the original world whose twin is solved too (the success
  followed the tool's answer), ``stayed`` the share whose twin turned on the
  original room (the model recalled or guessed instead of reading).
"""

from __future__ import annotations

import random
from typing import Any, Sequence

__all__ = ["play", "episode_facts", "reading_report", "blind_baselines"]


def play(policy: Any, env_name: str, tasks: Sequence[Any], *, samples: int = 1, seed: int = 0,
         temperature: float = 1.0, max_new_tokens: int = 48) -> list[list[Any]]:
    """``samples`` episodes of each task (``Task`` objects or ids of ``env_name``), all batched
    together; per task, its finished :class:`~agents.rollout.Rollout` objects."""
    import envfactory

    from agents.algorithms.objectives import GRPO


    from agents.algorithms.branching import sample_groups

    envs = [envfactory.make(env_name) for _ in tasks]
    try:
        groups = sample_groups(policy, list(zip(envs, tasks)), GRPO(M=samples), max_new_tokens=max_new_tokens,
                               temperature=temperature, seed=seed)
    finally:
        for e in envs:
            e.close()
    return [g.episodes for g in groups]


def episode_facts(task: Any, episode: Any) -> dict[str, Any]:
    """What one FindLight episode did: ``success``, ``item_first`` (its first call was
    ``locate(item)``), ``container_second`` (its second was ``locate(container)``), ``shown``
    (the target room appeared in a tool response), ``turned_on`` (rooms it asked to switch on)."""
    from environments.find_light import turned_on

    msgs = episode.trajectory.messages
    room = task.metadata["room"]
    calls = [c for m in msgs if m.get("role") == "assistant" for c in _calls(m)]
    tool_text = [str(m.get("content") or "") for m in msgs if m.get("role") == "tool"]
    first = calls[0] if calls else None
    second = calls[1] if len(calls) > 1 else None
    container = task.metadata.get("container")
    return {
        "success": bool(episode.success),
        "item_first": bool(first and first.name == "locate"
                           and str(first.arguments.get("thing", "")).strip().lower() == task.metadata["item"]),
        "container_second": container is None or bool(
            second and second.name == "locate" and str(second.arguments.get("thing", "")).strip().lower() == container),
        "shown": any(f"the {room}." in t.lower() for t in tool_text),
        "turned_on": turned_on(msgs),
    }


def _calls(message: dict[str, Any]) -> list[Any]:
    from envfactory.parsing import parse_text

    content = message.get("content")
    return parse_text(content).calls if isinstance(content, str) else []


def _rate(xs: list[bool]) -> float | None:
    return round(sum(xs) / len(xs), 4) if xs else None


def reading_report(policy: Any, env_name: str, tasks: Sequence[Any], *, samples: int = 4, seed: int = 0,
                   temperature: float = 1.0, swap: bool = True, max_new_tokens: int = 48) -> dict[str, Any]:
    """Success and what explains it (see the module docstring) over ``samples`` sampled episodes
    of each FindLight task, plus the greedy swap probe (``swap``). ``tasks``: ``Task`` objects."""
    from environments.find_light import swap_answer

    tasks = list(tasks)
    facts = [[episode_facts(t, e) for e in eps]
             for t, eps in zip(tasks, play(policy, env_name, tasks, samples=samples, seed=seed,
                                           temperature=temperature, max_new_tokens=max_new_tokens))]
    flat = [f for fs in facts for f in fs]
    out: dict[str, Any] = {
        "tasks": len(tasks), "episodes": len(flat),
        "success": _rate([f["success"] for f in flat]),
        "per_task": [sum(f["success"] for f in fs) / len(fs) for fs in facts],
        "item_first": _rate([f["item_first"] for f in flat]),
        "container_second": _rate([f["container_second"] for f in flat]),
        "shown": _rate([f["shown"] for f in flat]),
        "success_given_shown": _rate([f["success"] for f in flat if f["shown"]]),
        "success_given_not_shown": _rate([f["success"] for f in flat if not f["shown"]]),
    }
    if swap:
        rng = random.Random(seed)
        twins = [swap_answer(t, rng.choice(sorted(r for r in t.initial_state.lights if r != t.metadata["room"])))
                 for t in tasks]
        both = play(policy, env_name, tasks + twins, samples=1, seed=seed, temperature=0.0,
                    max_new_tokens=max_new_tokens)
        orig = [episode_facts(t, eps[0]) for t, eps in zip(tasks, both[:len(tasks)])]
        swapped = [episode_facts(t, eps[0]) for t, eps in zip(twins, both[len(tasks):])]
        solved = [i for i, f in enumerate(orig) if f["success"]]
        out["swap"] = {
            "greedy_success": _rate([f["success"] for f in orig]),
            "twin_success": _rate([f["success"] for f in swapped]),
            "solved": len(solved),
            "moved": _rate([swapped[i]["success"] for i in solved]),
            "stayed": _rate([twins[i].metadata["original_room"] in swapped[i]["turned_on"] for i in solved]),
        }
    return out


def blind_baselines(tasks: Sequence[Any]) -> dict[str, float]:
    """What policies that never read a tool result get on FindLight ``tasks``: ``random`` (one of the
    task's rooms at random, in expectation) and ``most_frequent`` (always the room most often the
    answer among these tasks, where the task has it)."""
    from collections import Counter

    tasks = list(tasks)
    rnd = sum(1 / len(t.initial_state.lights) for t in tasks) / len(tasks)
    top, _ = Counter(t.metadata["room"] for t in tasks).most_common(1)[0]
    freq = sum(t.metadata["room"] == top for t in tasks) / len(tasks)
    return {"random": round(rnd, 4), "most_frequent": round(freq, 4), "most_frequent_room": top}
