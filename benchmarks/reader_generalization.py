"""Why does the reader fail FindLight-v3's held-out half: the new names or the new phrasings?

Plays a reader checkpoint (:func:`agents.quickstart.reader.reader_model`) greedily on five sets of
``--tasks`` tasks: the unseen half as it is, the unseen half re-asked in a held-out
phrasing, the held-out half re-asked in a training phrasing, the held-out half as it is, and
fresh supply tasks whose every name is made up (:func:`environments.find_light.made_up_name`,
the kind of name half of reader SFT's supply has: never the same one twice).

    python benchmarks/reader_generalization.py --seed 0 --tasks 40
    python benchmarks/reader_generalization.py --model smol   # SmolLM2's reader (quickstart --model smol)
    python benchmarks/reader_generalization.py --reader '{"made_up": 1.0}'   # a variant of the recipe

Measured 2026-11-25 (reader seed 0, 40 tasks each, 2 shared cores): success 0.675 / 0.225 /
0.000 / 0.000 (first call on the right item 0.875 / 0.300 / 0.000 / 0.000). New phrasings cost
two thirds of the successes; new names cost all of them. The tiny model's tokenizer attaches a
word's leading space to it, so a name in prose and the same name in a JSON argument are
different ids (" foyer" is ``Ġfo y er``, ``"foyer`` is ``f oy er``): copying a name it never
saw means re-spelling it, which reader SFT teaches only for names (and pieces) it trained on.

Measured 2026-11-29 (reader seed 0 of the 6,400-task recipe, 40 tasks each, CI machine): success
0.95 / 0.40 / 0.000 / 0.000, and **0.000 on made-up names** (first call right 0.15, container
0.05), although half of the reader's 6,400 supply tasks had made-up names: SFT did not teach it to
copy a new name, only to choose among the names it trained on, which is what the swap probe
(another training room swapped in) tests.

Measured 2026-12-06 (seed 0, another host; benchmarks/results/RESULTS.md): the recipe's reader
0.875 / 0.575 / 0.000 / 0.000 and made-up 0.125 (first call right 0.400); the ``"words"``
tokenizer (a name the same ids in prose and in a call) copies less (made-up 0.000); every supply
name made up (``--reader '{"made_up": 1.0}'``) copies more names of the generator's syllables
(made-up 0.350, first call right 0.625), at a cost on training names (0.625), with held-out real
words still 0.000.
"""

from __future__ import annotations

import argparse
import json
import random


def main() -> None:
    from agents.quickstart.experiment import MODELS, eval_tasks

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--seed", type=int, default=0, help="reader seed")
    ap.add_argument("--tasks", type=int, default=40, help="tasks per set")
    ap.add_argument("--model", default="tiny", choices=sorted(MODELS), help="whose reader (agents.quickstart.experiment.MODELS)")
    ap.add_argument("--reader", type=json.loads, default={},
                    help='JSON overrides of that model\'s reader recipe, e.g. \'{"tokenizer": "words", "made_up": 1.0}\'')
    a = ap.parse_args()

    from agents.policies.hf_policy import HFPolicy
    from agents.quickstart.probe import episode_facts, play
    from agents.quickstart.reader import reader_model
    from environments.find_light import FRAMES, HELDOUT_FRAMES, v3_supply

    halves = eval_tasks("FindLight-v3", a.tasks)
    rng = random.Random(0)

    def reframe(t, frames):
        return t.model_copy(update={"instruction": rng.choice(frames).format(item=t.metadata["item"])})

    sets = {
        "train names, train phrasings": halves["unseen"],
        "train names, held-out phrasings": [reframe(t, HELDOUT_FRAMES) for t in halves["unseen"]],
        "held-out names, train phrasings": [reframe(t, FRAMES) for t in halves["heldout"]],
        "held-out names, held-out phrasings": halves["heldout"],
        "made-up names, train phrasings": v3_supply(a.tasks, seed="made-up", made_up=1.0),
    }
    pol = HFPolicy(reader_model(a.seed, {**(MODELS[a.model]["reader"] or {}), **a.reader}))
    try:
        for name, tasks in sets.items():
            eps = play(pol, "FindLight-v3", tasks, samples=1, seed=1, temperature=0.0)
            facts = [episode_facts(t, e[0]) for t, e in zip(tasks, eps)]
            print(json.dumps({"set": name, **{k: round(sum(f[k] for f in facts) / len(facts), 3)
                                              for k in ("success", "item_first", "container_second", "shown")}}))
    finally:
        pol.close()


if __name__ == "__main__":
    main()
