"""SmolLM2-135M-Instruct, a real pretrained LLM, trained end to end on goal-level tool tasks and
evaluated on families it never trained on.

    python -m benchmarks.smol_agent                  # the recorded CPU run (see RESULTS.md)
    python -m benchmarks.smol_agent --device cuda    # the same recipe on a GPU
    python -m benchmarks.smol_agent --smoke          # minutes: tiny numbers, checks the pipeline

Stages, one model, one seed of everything (``--seed``):

1. **before**: the packaged SmolLM2-135M-Instruct (``agents.models.smol``, offline from PyPI), prompts
   with one-line tool signatures (:data:`agents.models.smol.SIGNATURES_TEMPLATE`).
2. **sft**: supervised on the reference plays of ``--sft-per-family`` sft-split goal-level tasks
   of each *training* family (loss on the model's own turns only, plays packed after their
   family's opening: :func:`agents.models.pretrain._shared_rows`), the top ``--train-layers`` layers.
3. **RL arms** (``--arms``), each from the SFT weights with the same tasks, samples and gradient
   steps: ``grpo`` (sparse task-completion reward) and ``rft`` (its compute-matched control:
   the same samples, gradient only on successes = continued SFT on rejection-sampled plays).

Evaluation, greedy, at every stage, on two sets fixed in advance (``--eval-heldout`` and
``--eval-seen`` tasks drawn with a fixed seed): eval-split goal-level tasks of the
``envfactory.HELDOUT_FAMILIES`` (never trained on: primary), and eval-split tasks of the training
families (unseen tasks of seen families). Beside each: the blind baselines on the same
tasks (pass, claim success, random tool calls; ``envfactory.checks.scripted``), success by
task kind, the share of episodes with a parsed tool call / a tool error, and tokens/s of
generation. Differences are paired by task with bootstrap 95% CIs (``agents.stats``), the
primary one (sft - before on held-out families) fixed in advance, the rest Holm-corrected.

Writes ``benchmarks/results/smol-agent-<date>.json`` after every stage (a stopped run keeps
what it measured) and prints one line per stage.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import random
import time
from pathlib import Path
from typing import Any

GOAL_KINDS = ("lookup", "answer", "conditional", "user", "policy", "multi_service")
"""The goal-level task kinds of the table-backed families (every kind but ``steps``/``original``)."""


def families() -> list[str]:
    """The table-backed families with goal-level tasks (those with a task supply), sorted."""
    import envfactory

    return sorted(s.name for s in envfactory.specs() if (getattr(s, "metadata", None) or {}).get("supply") is not None)


def held_out(names: list[str]) -> list[str]:
    """The families of ``names`` never trained on: the library's :data:`envfactory.HELDOUT_FAMILIES`
    (12 of the 77 table-backed families, frozen: the draw this benchmark recorded its results on)."""
    import envfactory

    return sorted(n for n in names if n in envfactory.HELDOUT_FAMILIES)


def goal_tasks(name: str, split: str) -> list[Any]:
    import envfactory

    return [t for t in envfactory.spec(name).tasks_in(split) if t.kind in GOAL_KINDS]


def draw(names: list[str], split: str, n: int, seed: int) -> list[tuple[str, Any]]:
    """``n`` ``(family, task)`` pairs drawn without replacement from the split's goal-level tasks of ``names``."""
    pool = [(name, t) for name in names for t in goal_tasks(name, split)]
    random.Random(seed).shuffle(pool)
    return sorted(pool[:n], key=lambda p: (p[0], p[1].id))


def plays(tokenizer: Any, names: list[str], per_family: int, seed: int) -> list[Any]:
    """Reference plays (the oracle's calls, then its answer) of ``per_family`` sft-split goal-level
    tasks of each family, rendered with ``tokenizer``'s chat template as rollouts render them."""
    import envfactory
    from envfactory.checks.scripted import OraclePolicy

    from agents.models.pretrain import Play

    out = []
    rng = random.Random(seed)
    for name in names:
        tasks = goal_tasks(name, "sft")
        rng.shuffle(tasks)
        env = envfactory.make(name)
        schemas = env.tool_schemas()
        try:
            for t in tasks[:per_family]:
                env.reset(t)
                for action in OraclePolicy.actions(t):
                    if env.done:
                        break
                    env.step(action)
                if env.success:  # a user task's oracle may need the user's replies in another order
                    out.append(Play(name, t.id, "sft", "oracle",
                                    tokenizer.apply_chat_template(env.transcript(), tools=schemas, tokenize=False)))
        finally:
            env.close()
    return out


def blind(pairs: list[tuple[str, Any]], max_turns: int) -> dict[str, float]:
    """Success of the scripted blind policies on ``pairs``: pass at once, claim success, random
    tool calls drawn from the schemas (one episode each, seed 0)."""
    import envfactory
    from envfactory.checks.scripted import ClaimPolicy, NoopPolicy, RandomPolicy

    out = {}
    for pol in (NoopPolicy(), ClaimPolicy(), RandomPolicy()):
        wins = 0
        for name, task in pairs:
            env = envfactory.make(name, max_turns=max_turns)
            try:
                env.reset(task)
                agent = env.agents[0]
                while not env.done:
                    env.step(pol.act(env, agent, 0))
                wins += bool(env.success)
            finally:
                env.close()
        out[pol.name] = round(wins / max(1, len(pairs)), 4)
    return out


def evaluate(policy: Any, pairs: list[tuple[str, Any]], *, max_new_tokens: int, max_turns: int,
             seed: int) -> dict[str, Any]:
    """One greedy episode per task: per-task success (in ``pairs`` order) and what the model did."""
    import envfactory

    from agents.algorithms.objectives import GRPO


    from agents.algorithms.branching import sample_groups

    episodes = {name: envfactory.make(name, max_turns=max_turns) for name in dict.fromkeys(n for n, _ in pairs)}
    t0 = time.perf_counter()
    try:
        groups = sample_groups(policy, [(episodes[n], t) for n, t in pairs], GRPO(M=1),
                               max_new_tokens=max_new_tokens, temperature=0.0, seed=seed)
    finally:
        for e in episodes.values():
            e.close()
    secs = time.perf_counter() - t0
    trajs = [next(iter(g.episodes[0].trajectories.values())) for g in groups]
    success = [float(g.episodes[0].success) for g in groups]
    kinds: dict[str, list[float]] = {}
    for (_, t), s in zip(pairs, success):
        kinds.setdefault(t.kind, []).append(s)
    sampled = sum(sum(tr.loss_mask) for tr in trajs)
    return {
        "success": round(sum(success) / max(1, len(success)), 4),
        "per_task": success,
        "by_kind": {k: {"n": len(v), "success": round(sum(v) / len(v), 4)} for k, v in sorted(kinds.items())},
        "called_a_tool": round(sum(tr.tool_calls > 0 for tr in trajs) / max(1, len(trajs)), 4),
        "tool_errors_per_episode": round(sum(tr.tool_errors for tr in trajs) / max(1, len(trajs)), 3),
        "parse_errors_per_episode": round(sum(tr.parse_errors for tr in trajs) / max(1, len(trajs)), 3),
        "tool_calls_per_episode": round(sum(tr.tool_calls for tr in trajs) / max(1, len(trajs)), 3),
        "sampled_tokens": sampled, "seconds": round(secs, 1),
        "tokens_per_second": round(sampled / secs, 1) if secs else None,
    }


def main(argv: list[str] | None = None) -> dict[str, Any]:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--sft-per-family", type=int, default=6)
    ap.add_argument("--sft-epochs", type=int, default=1)
    ap.add_argument("--sft-lr", type=float, default=1e-4)
    ap.add_argument("--seq-len", type=int, default=2048)
    ap.add_argument("--train-layers", type=int, default=8, help="train the top N layers (0: all)")
    ap.add_argument("--eval-heldout", type=int, default=96)
    ap.add_argument("--eval-seen", type=int, default=48)
    ap.add_argument("--max-turns", type=int, default=8)
    ap.add_argument("--max-new-tokens", type=int, default=96)
    ap.add_argument("--arms", nargs="*", default=["grpo", "rft"])
    ap.add_argument("--rl-steps", type=int, default=3)
    ap.add_argument("--rl-lr", type=float, default=2e-5)
    ap.add_argument("--tasks-per-step", type=int, default=8)
    ap.add_argument("--M", type=int, default=4)
    ap.add_argument("--threads", type=int, default=None)
    ap.add_argument("--out", default=None)
    ap.add_argument("--save-sft", default=None, help="save the model after SFT into this folder")
    ap.add_argument("--from-sft", default=None,
                    help="skip 'before' and SFT: start from a folder --save-sft wrote (and its results file)")
    ap.add_argument("--smoke", action="store_true", help="a few tasks of each stage, to check the pipeline")
    a = ap.parse_args(argv)
    if a.smoke:
        a.sft_per_family, a.eval_heldout, a.eval_seen, a.rl_steps, a.tasks_per_step, a.M = 1, 4, 2, 1, 2, 2
        a.seq_len, a.max_turns, a.max_new_tokens = 1024, 4, 48

    import torch
    from transformers import AutoTokenizer

    from agents.algorithms.objectives import GRPO, RFT
    from agents.policies.hf_policy import HFPolicy
    from agents.models.pretrain import _shared_rows, assistant_mask, rows_on
    from agents.quickstart.reader import packed_sft
    from agents.models.smol import freeze_below, smol_model_path
    from agents.stats import bootstrap_mean, holm, paired_bootstrap
    from agents.train_config import OptimConfig, OutputConfig, SamplingConfig, TrainerConfig
    from agents.trainer import Trainer

    if a.threads:
        torch.set_num_threads(a.threads)
    t_start = time.perf_counter()
    say = lambda m: print(f"[{time.perf_counter() - t_start:6.0f}s] {m}", flush=True)  # noqa: E731
    out_path = Path(a.out or f"benchmarks/results/smol-agent-{datetime.date.today().isoformat()}"
                    f"{'-smoke' if a.smoke else ''}.json")
    fams = families()
    test_fams = held_out(fams)
    train_fams = [f for f in fams if f not in test_fams]
    if a.smoke:
        train_fams = train_fams[:6]
    sets = {"heldout_families": draw(test_fams, "eval", a.eval_heldout, 1),
            "seen_families": draw(train_fams, "eval", a.eval_seen, 2)}
    res: dict[str, Any] = {
        "benchmark": "smol_agent", "device": a.device, "torch_threads": torch.get_num_threads(),
        "config": {k: v for k, v in vars(a).items() if k != "out"},
        "families": {"train": train_fams, "heldout": test_fams},
        "eval_tasks": {k: [f"{n}/{t.id}" for n, t in v] for k, v in sets.items()},
        "blind": {}, "stages": {}, "arms": {}, "load": [round(x, 2) for x in os.getloadavg()],
    }

    def save() -> None:
        res["seconds"] = round(time.perf_counter() - t_start, 1)
        out_path.parent.mkdir(parents=True, exist_ok=True)
        out_path.write_text(json.dumps(res, indent=1))

    def stage(label: str, pol: Any) -> None:
        res["stages"][label] = {k: evaluate(pol, v, max_new_tokens=a.max_new_tokens, max_turns=a.max_turns,
                                            seed=a.seed) for k, v in sets.items()}
        save()
        r = res["stages"][label]
        say(f"{label}: held-out families {r['heldout_families']['success']:.3f}, seen families "
            f"{r['seen_families']['success']:.3f}; called a tool {r['heldout_families']['called_a_tool']:.2f}; "
            f"{r['heldout_families']['tokens_per_second']} tok/s")

    def sft(policy: Any) -> Any:
        """SFT on the training families' reference plays; the trained model (in ``policy``)."""
        t0 = time.perf_counter()
        ps = plays(tok, train_fams, a.sft_per_family, a.seed)

        def encode(text: str) -> list[int]:
            return tok(text, add_special_tokens=False)["input_ids"]

        lens = [len(assistant_mask(encode, p.text[p.text.index("<|im_start|>user\n"):])[0]) for p in ps[:60]]
        opening = len(encode(ps[0].text.split("<|im_start|>user\n", 1)[0]))
        per_row = max(1, int((a.seq_len - opening) // (sum(lens) / len(lens))))
        n_rows = max(1, round(a.sft_epochs * len(ps) / per_row))
        pad = tok.convert_tokens_to_ids("<|endoftext|>")
        rows = rows_on(_shared_rows(ps, encode, n_rows, a.seq_len, pad, random.Random(a.seed),
                                    assistant_only=True), a.device)
        model = policy.model
        trainable = freeze_below(model, a.train_layers or None)
        asked = sum(min(a.sft_per_family, len(goal_tasks(n, "sft"))) for n in train_fams)
        say(f"sft: {len(ps)} plays ({asked - len(ps)} reference solutions that did not succeed left out) "
            f"of {len(train_fams)} families in {n_rows} rows of {a.seq_len} (~{per_row} plays "
            f"each), {trainable / 1e6:.1f}M of {sum(p.numel() for p in model.parameters()) / 1e6:.1f}M parameters train")
        losses = packed_sft(model, rows, steps=n_rows, batch=1, lr=a.sft_lr, log=say, label="sft", started=t_start,
                            scored_only=True)
        model.eval()
        policy.clear_cache()
        secs = time.perf_counter() - t0
        res["sft"] = {"plays": len(ps), "plays_left_out": asked - len(ps), "rows": n_rows, "seq_len": a.seq_len, "trainable_params": trainable,
                      "nll_first": round(losses[0], 4), "nll_last": round(sum(losses[-5:]) / len(losses[-5:]), 4),
                      "seconds": round(secs, 1), "positions_per_second": round(n_rows * a.seq_len / secs, 1)}
        if a.save_sft:
            from agents.quickstart.reader import save_beside_base

            save_beside_base(model, path, Path(a.save_sft))
        stage("sft", policy)
        return model

    say(f"{len(train_fams)} training families, {len(test_fams)} held out: {', '.join(test_fams)}")
    for k, v in sets.items():
        res["blind"][k] = blind(v, a.max_turns)
    say(f"blind baselines: {res['blind']}")
    path = smol_model_path(tools="signatures")
    tok = AutoTokenizer.from_pretrained(path)
    torch.manual_seed(a.seed)
    if a.from_sft:
        earlier = json.loads(out_path.read_text())
        for k in ("stages", "sft"):
            res[k] = earlier[k]
        res["stages"] = {k: v for k, v in res["stages"].items() if k in ("before", "sft")}
        policy = HFPolicy(a.from_sft, device=a.device)
        model = policy.model
        freeze_below(model, a.train_layers or None)
        say(f"from {a.from_sft}: before and sft results from {out_path}")
    else:
        policy = HFPolicy(path, device=a.device)
        stage("before", policy)
        model = sft(policy)
    after_sft = {k: v.detach().clone() for k, v in model.state_dict().items()}

    # -- RL arms from the same SFT weights -------------------------------------------------
    for arm in a.arms:
        model.load_state_dict(after_sft)
        policy.clear_cache()
        algo = (GRPO if arm == "grpo" else RFT)(M=a.M)
        a0 = time.perf_counter()
        tr = Trainer(policy, train_fams, TrainerConfig(
            tasks=[f"{n}/{t.id}" for n in train_fams for t in goal_tasks(n, "rl")], seed=a.seed, steps=a.rl_steps,
            algorithm=algo, sampling=SamplingConfig(max_new_tokens=a.max_new_tokens, temperature=1.0,
                                                    max_turns=a.max_turns),
            optim=OptimConfig(lr=a.rl_lr, tasks_per_step=a.tasks_per_step),
            output=OutputConfig(show_progress=False)))
        steps = []
        for i in range(a.rl_steps):
            steps.append(tr.train_step())
            say(f"{arm}: step {i + 1}/{a.rl_steps} training success {steps[-1]['success']:.3f}")
        tr.close()
        model.eval()
        policy.clear_cache()
        res["arms"][arm] = {"train_success": [x["success"] for x in steps],
                            "tokens_sampled": sum(x["tokens_generated"] for x in steps),
                            "tokens_trained": sum(x["trained_tokens"] for x in steps),
                            "seconds": round(time.perf_counter() - a0, 1)}
        stage(arm, policy)

    # -- comparisons, paired by task -------------------------------------------------------
    def grid(label: str, k: str) -> list[list[float]]:
        return [res["stages"][label][k]["per_task"]]

    cmp: dict[str, Any] = {}
    for k in sets:
        for label in res["stages"]:
            res["stages"][label][k]["ci"] = bootstrap_mean(grid(label, k))
        cmp[f"sft_minus_before/{k}"] = paired_bootstrap(grid("before", k), grid("sft", k))
        for arm in a.arms:
            cmp[f"{arm}_minus_sft/{k}"] = paired_bootstrap(grid("sft", k), grid(arm, k))
        if "grpo" in a.arms and "rft" in a.arms:
            cmp[f"grpo_minus_rft/{k}"] = paired_bootstrap(grid("rft", k), grid("grpo", k))
    primary = "sft_minus_before/heldout_families"
    res["primary"] = primary
    res["compare"] = cmp
    res["holm"] = holm({k: v["p"] for k, v in cmp.items() if k != primary and "p" in v})
    save()
    for k, v in cmp.items():
        say(f"{k}: {v['mean']:+.3f} [{v['ci'][0]:+.3f}, {v['ci'][1]:+.3f}]")
    say(f"wrote {out_path}")
    return res


if __name__ == "__main__":
    main()
