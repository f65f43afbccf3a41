"""The quickstart pipeline end to end, on a tiny budget: splits, paired arms and controls,
the reading report, statistics, per-seed files, report."""

from __future__ import annotations

import dataclasses
import json
import sys

import pytest

pytest.importorskip("torch")
pytest.importorskip("transformers")

import envfactory  # noqa: E402
from agents.quickstart.experiment import (RECORDED_HOST, QuickstartConfig, _finished, check_splits, host,  # noqa: E402
                                         host_line, recorded_host, run_quickstart)


@pytest.mark.slow
def test_quickstart_measures_every_arm_on_evaluation_tasks_only(tmp_path) -> None:
    cfg = QuickstartConfig(seeds=[0, 1], arms=["arpo", "rft", "grpo_shuffled"],
                           reader={"pretrained": False, "supply": 6, "sft_tasks": 4, "seq_len": 1024,
                                   "check": {"tasks": 2, "min_success": 0.25, "rounds": 2}},
                           rl_steps=1, M=2, N=1, tasks_per_step=1, max_new_tokens=8, eval_tasks=3,
                           eval_samples=1, workers=1, output_dir=str(tmp_path / "out"),
                           cache_dir=str(tmp_path / "cache"))
    s = run_quickstart(cfg)
    spec = envfactory.spec(cfg.env)
    assert set(s["tasks"]) == {"unseen", "heldout"}
    assert all(spec.split(t) == "eval" for ts in s["tasks"].values() for t in ts)
    assert all(spec.task(t).metadata["names"] == "heldout" for t in s["tasks"]["heldout"])
    assert set(s["success"]["unseen"]) == {"before", "sft", "arpo", "rft", "grpo_shuffled"}
    assert set(s["success"]["heldout"]) == {"sft", "arpo", "rft", "grpo_shuffled"}
    assert s["primary_comparison"] == "arpo_minus_rft/unseen" and s["primary"]["seeds"] == 2
    assert s["primary"]["tasks"] == 3 and "arpo_minus_rft/unseen" not in s["holm"]
    assert {"sft_minus_before/unseen", "grpo_shuffled_minus_rft/heldout"} <= set(s["holm"])
    r = s["reading"]["unseen"]["sft"]
    assert {"item_first", "shown", "success_given_shown", "swap"} <= set(r)
    for seed in (0, 1):  # each seed's results are on disk on their own
        row = json.loads((tmp_path / "out" / f"seed-{seed}.json").read_text())
        assert row["seed"] == seed and row["arms"]["rft"]["tokens_sampled"] > 0
    assert s["blind"]["unseen"]["random"] == pytest.approx(1 / 8)
    assert json.loads((tmp_path / "out" / "summary.json").read_text())["arms"] == cfg.arms
    assert "Primary (fixed in advance)" in (tmp_path / "out" / "report.md").read_text()
    # started again, the finished seeds of this recipe are kept; another recipe runs them again
    said: list[str] = []
    again = run_quickstart(cfg, log=said.append)
    assert said[1:] == ["seed 0: kept from " + str(tmp_path / "out" / "seed-0.json"),
                        "seed 1: kept from " + str(tmp_path / "out" / "seed-1.json")]
    assert said[0] == host_line(host(), recorded_host())  # first: whether the recorded figures apply here
    assert s["host"] == host() and host_line(host(), recorded_host()) in (tmp_path / "out" / "report.md").read_text()
    assert again["success"] == s["success"]
    assert _finished(dataclasses.replace(cfg, rl_steps=2), 0) is None and _finished(cfg, 0) is not None
    assert _finished(dataclasses.replace(cfg, resume=False), 0) is not None  # a --fresh run's seeds are kept later


@pytest.mark.slow
def test_units_of_work_on_two_workers_give_what_one_process_gives(tmp_path) -> None:
    """Seeds split into units (a start, then each arm) over two worker processes: every seed's
    figures equal those of the seeds run one after another in this process, and an arm's do not
    depend on the arms before it (three seeds: the last seed's arms run side by side)."""
    base = dict(arms=["arpo", "rft"], reader={"pretrained": False, "supply": 6, "sft_tasks": 4, "seq_len": 1024,
                                              "check": None},
                rl_steps=1, M=2, N=1, tasks_per_step=1, max_new_tokens=8, eval_tasks=3, eval_samples=1,
                cache_dir=str(tmp_path / "cache"))
    one = run_quickstart(QuickstartConfig(seeds=[0, 1, 2], workers=1, output_dir=str(tmp_path / "one"), **base))
    said: list[str] = []
    two = run_quickstart(QuickstartConfig(seeds=[0, 1, 2], workers=2, output_dir=str(tmp_path / "two"), **base),
                         log=said.append)
    assert two["seeds"] == [0, 1, 2] and said == [host_line(host(), recorded_host())]  # worker progress: stderr
    assert two["success"] == one["success"] and two["compare"] == one["compare"]
    for a, b in zip(one["per_seed"], two["per_seed"]):
        assert list(b["stages"]) == ["before", "sft", "arpo", "rft"] and list(b["arms"]) == ["arpo", "rft"]
        assert a["stages"] == b["stages"]
        for arm in ("arpo", "rft"):
            assert {k: v for k, v in a["arms"][arm].items() if "seconds" not in k} == \
                   {k: v for k, v in b["arms"][arm].items() if "seconds" not in k}
        assert json.loads((tmp_path / "two" / f"seed-{b['seed']}.json").read_text())["stages"] == b["stages"]
    alone = run_quickstart(QuickstartConfig(seeds=[0], workers=1, output_dir=str(tmp_path / "alone"),
                                            **{**base, "arms": ["rft"]}))
    assert alone["per_seed"][0]["stages"]["rft"] == one["per_seed"][0]["stages"]["rft"]


def _dying_unit(cfg: dict, seed: int, arm: str | None) -> str:
    """A unit of work that kills its worker process (as the OOM killer does) the first time it
    runs a unit named in ``<output_dir>/die`` (every time, for a name ending in ``!``)."""
    import os
    from pathlib import Path

    out, name = Path(cfg["output_dir"]), f"{seed}-{arm}"
    plan = (out / "die").read_text().split()
    if f"{name}!" in plan or (name in plan and not (out / f"died-{name}").exists()):
        (out / f"died-{name}").touch()
        os._exit(9)
    return name


def test_a_dead_worker_loses_only_its_units_and_the_run_goes_on_in_fewer(tmp_path) -> None:
    """Before: a worker killed by the kernel (seed 1 of a SmolLM2 quickstart, 13.5 GB) broke the
    pool, and BrokenProcessPool ended the whole run. Now the units in flight run again in a pool
    of one worker fewer; every unit's result arrives once."""
    from agents.quickstart.experiment import _run_units

    (tmp_path / "die").write_text("0-rft")
    cfg = QuickstartConfig(seeds=[0, 1], output_dir=str(tmp_path))
    got, said = [], []
    _run_units(cfg, [0, 1], 2, _dying_unit, lambda s, a, r: got.append((s, a, r)), said.append)
    assert sorted((s, a or "") for s, a, _ in got) == [(0, ""), (0, "arpo"), (0, "rft"), (1, ""), (1, "arpo"), (1, "rft")]
    assert all(r == f"{s}-{a}" for s, a, r in got)
    assert [g[:2] for g in got].index((0, None)) < [g[:2] for g in got].index((0, "rft"))
    assert len(said) == 1 and said[0].startswith("a worker died") and "seed 0 rft" in said[0] and "in 1 worker" in said[0]
    # a unit that kills every worker it runs in: an error naming it, after what finished was handed over
    (tmp_path / "die").write_text("1-arpo!")
    got.clear()
    with pytest.raises(RuntimeError, match="seed 1 arpo.*one worker left"):
        _run_units(cfg, [0, 1], 2, _dying_unit, lambda s, a, r: got.append((s, a)), said.append)
    # which other units finished first depends on timing; seed 1's start must have (its arm ran), once
    assert (1, None) in got and (1, "arpo") not in got and len(got) == len(set(got))


def test_overlapping_splits_and_unknown_arms_are_errors() -> None:
    with pytest.raises(ValueError, match="RL and evaluation"):
        check_splits(["a"], ["b", "c"], ["c"])
    with pytest.raises(ValueError, match="arms"):
        QuickstartConfig(arms=["ppo"])
    with pytest.raises(ValueError, match="seeds must differ"):
        QuickstartConfig(seeds=[1, 1])


def test_the_model_chooses_its_reader_learning_rate_and_primary_half() -> None:
    """``model="smol"`` brings SmolLM2's reader recipe (under the caller's overrides) and RL learning
    rate; the tiny model's recipe is the one its results were recorded with (no ``model`` key)."""
    from agents.quickstart.experiment import MODELS, _recipe
    from agents.quickstart.reader import _FORMAT, READER_CONFIG, SMOL_READER_CONFIG

    tiny = QuickstartConfig()
    assert tiny.rl_lr == 2e-4 and "model" not in _recipe(tiny)
    assert _recipe(tiny)["reader"] == {**READER_CONFIG, "format": _FORMAT}
    smol = QuickstartConfig(model="smol", reader={"supply": 3})
    assert smol.rl_lr == MODELS["smol"]["rl_lr"] != tiny.rl_lr
    assert smol.reader == {**SMOL_READER_CONFIG, "supply": 3} and smol.reader["base"] == "smol"
    assert QuickstartConfig(**dataclasses.asdict(smol)) == smol  # a worker rebuilds the same config
    assert _recipe(smol)["model"] == "smol" and QuickstartConfig(model="smol", rl_lr=1e-3).rl_lr == 1e-3
    assert MODELS["smol"]["primary_half"] == "heldout" and MODELS["tiny"]["primary_half"] == "unseen"
    with pytest.raises(ValueError, match="model must be one of"):
        QuickstartConfig(model="gpt-2")
    with pytest.raises(ValueError, match="model="):
        QuickstartConfig(reader={"base": "smol"})


def test_the_dev_split_is_fresh_tasks_no_seed_trains_or_is_evaluated_on() -> None:
    """Variants are chosen on ``eval_split="dev"``: tasks of the training names and phrasings
    that are in no split of the environment and in no reader's supply stream."""
    from agents.quickstart.experiment import _algorithm, _recipe, eval_tasks
    from environments.find_light import HELDOUT_NAMES, v3_supply

    dev = eval_tasks("FindLight-v3", split="dev")["unseen"]
    assert len(dev) == 200 and len({t.id for t in dev}) == 200
    assert [t.id for t in dev] == [t.id for t in eval_tasks("FindLight-v3", split="dev")["unseen"]]
    spec = envfactory.spec("FindLight-v3")
    taken = {t.id for t in spec.tasks()} | {t.id for seed in range(10) for t in v3_supply(50, seed=seed)}
    assert not taken & {t.id for t in dev}
    held = {x for v in HELDOUT_NAMES.values() for x in v}
    assert not any(x in t.instruction for t in dev for x in held)
    assert len(eval_tasks("FindLight-v3", 7, "dev")["unseen"]) == 7
    with pytest.raises(ValueError, match="FindLight-v3 only"):
        eval_tasks("FindLight-v2", split="dev")
    with pytest.raises(ValueError, match="eval_split"):
        QuickstartConfig(eval_split="test")
    # the default leaves the recipe of results recorded before the field existed; dev is a recipe of its own
    assert "eval_split" not in _recipe(QuickstartConfig())
    assert _recipe(QuickstartConfig(eval_split="dev"))["eval_split"] == "dev"
    assert _algorithm("grpo_neg25", QuickstartConfig()).negatives == 0.25


def _assert_measured_since(root, commit: str, results: str) -> None:
    """``commit`` descends from ``FIGURES_SINCE``: a recipe compared equal while the code measured
    something else (the KL term that RL never applied, found at stop 48) is caught here."""
    import os
    import subprocess

    from agents.quickstart.experiment import FIGURES_SINCE

    def git(*args: str) -> int:
        return subprocess.run(["git", *args], cwd=root, capture_output=True).returncode

    if git("cat-file", "-e", f"{FIGURES_SINCE}^{{commit}}") or git("cat-file", "-e", f"{commit}^{{commit}}"):
        why = "the git history of FIGURES_SINCE or of the results' commit is not in this checkout"
        if os.environ.get("CI", "").lower() in ("1", "true", "yes"):
            pytest.fail(why + " (CI=true: run on a full clone)")
        pytest.skip(why)
    assert git("merge-base", "--is-ancestor", FIGURES_SINCE, commit) == 0, \
        f"{results} was measured at {commit[:10]}, before {FIGURES_SINCE[:10]} changed what it measures: measure again"


def test_shown_figures_are_generated_from_a_results_file_of_the_current_recipe() -> None:
    """The quickstart figures RESULTS.md shows (FIGURES_PAGE; the README is a front page without
    figures) are exactly figures_block() of the results file they name,
    that file records the commit it came from, and its recipe is what the code runs today: a
    changed default (a reader recipe, a learning rate) fails here until the figures are measured again."""
    from pathlib import Path

    from agents.quickstart.experiment import FIGURES_PAGE, RUN_OPTIONS, _recipe, figures_block, page_figures

    root = Path(__file__).resolve().parents[1]
    results, block = page_figures(root / FIGURES_PAGE)
    s = json.loads((root / results).read_text())
    assert block == figures_block(s), f"{FIGURES_PAGE}'s quickstart figures differ from {results}: run write_figures"
    assert s["commit"] and len(s["commit"]) == 40
    now = _recipe(QuickstartConfig(**{k: s["config"][k] for k in RUN_OPTIONS if k in s["config"]}))
    assert s["recipe"] == json.loads(json.dumps(now)), f"{results} was measured with another recipe: measure again"
    _assert_measured_since(root, s["commit"], results)
    changed = dict(s, success={**s["success"], "unseen": {**s["success"]["unseen"], "sft": {
        **s["success"]["unseen"]["sft"], "mean": s["success"]["unseen"]["sft"]["mean"] + 0.01}}})
    assert figures_block(changed) != block  # the comparison can fail


def test_write_figures_rewrites_only_the_block_between_the_markers(tmp_path) -> None:
    """write_figures (run after a new quickstart) puts figures_block() of the results file between
    the markers of the page and leaves the rest of the page as it was."""
    from pathlib import Path

    from agents.quickstart.experiment import FIGURES_PAGE, figures_block, page_figures, write_figures

    root = Path(__file__).resolve().parents[1]
    results, block = page_figures(root / FIGURES_PAGE)
    page = tmp_path / "RESULTS.md"
    page.write_text("# before\n\n<!-- quickstart-figures: old.json -->\nstale\n<!-- /quickstart-figures -->\n\nafter\n")
    write_figures(root / results, page)
    named, shown = page_figures(page)
    assert Path(named) == root / results and shown == block == figures_block(json.loads((root / results).read_text()))
    text = page.read_text()
    assert text.startswith("# before\n\n<!-- quickstart-figures: ")
    assert text.endswith("<!-- /quickstart-figures -->\n\nafter\n")


def test_a_seed_whose_reader_sft_did_not_take_is_named_in_the_figures_and_the_report() -> None:
    """A seed no better than a random room after reader SFT (as seed 3 of the 2026-12-02 run) is
    named where its figures are shown, so that low means are not read as what reading gives."""
    import copy
    from pathlib import Path

    from agents.quickstart.experiment import _report, figures_block

    root = Path(__file__).resolve().parents[1]
    s = json.loads((root / "benchmarks/results/quickstart-2026-12-02.json").read_text())
    assert "Reader SFT did not take on seed 3 (0.033)" in figures_block(s)
    assert "did not take on seed 3" in _report(s, "curve.png")
    fine = copy.deepcopy(s)
    for r in fine["per_seed"]:
        r["stages"]["sft"]["unseen"]["success"] = max(r["stages"]["sft"]["unseen"]["success"], 0.5)
    assert "did not take" not in figures_block(fine) and "did not take" not in _report(fine, "curve.png")
    edge = copy.deepcopy(fine)  # exactly a random room's success is no better than it
    edge["per_seed"][1]["stages"]["sft"]["unseen"]["success"] = edge["blind"]["unseen"]["random"]
    assert f"seed {edge['per_seed'][1]['seed']} " in figures_block(edge)


def test_the_host_line_says_when_a_run_departs_from_the_recorded_one(tmp_path) -> None:
    here = {"cpu": "Some CPU", "cores": 2, "kernels": "AVX512", "torch": "2.13.0"}
    assert "as the recorded run's" in host_line(here, dict(here, cpu="Other CPU", cores=8))
    for other in ({"kernels": "AVX2"}, {"torch": "2.14.0"}):
        line = host_line(dict(here, **other), here)
        assert "departs from it" in line and "second round" in line
    # the recorded host is the shown results file's own, when it names one
    results = tmp_path / "r.json"
    results.write_text(json.dumps({"host": dict(here, kernels="AVX2")}))
    page = tmp_path / "RESULTS.md"
    page.write_text(f"x\n<!-- quickstart-figures: {results} -->\nblock\n<!-- /quickstart-figures -->\n")
    assert recorded_host(page)["kernels"] == "AVX2"
    page.write_text(f"x\n<!-- quickstart-figures: {tmp_path / 'gone.json'} -->\nb\n<!-- /quickstart-figures -->\n")
    assert recorded_host(page) == RECORDED_HOST
