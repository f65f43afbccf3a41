"""Splits that test generalization: whole families, task kinds and frames held out of training
(``envfactory.HELDOUT_FAMILIES``, ``HELDOUT_KINDS``, ``HELDOUT_PHRASING``), drawn through every face
with ``split="seen" | "heldout-family" | "heldout-kind" | "heldout-phrasing"``."""

from __future__ import annotations

import json
from pathlib import Path

import gymnasium
import pytest

import envfactory
import envfactory.faces.pettingzoo_env as multi
from envfactory.definition import DRAW_SPLITS, GENERALIZATION_SPLITS, generalization_group, within_split
from envfactory.faces.mcp_server import EpisodeService

ROOT = Path(__file__).resolve().parents[1]
HELD = "Pharmacy-v1"        # a held-out family
KIND = "AutoRepair-v0"      # a training family with eval-split conditional (held-out kind) tasks
PLAIN = "Library-v1"        # a training family with no held-out kind


def _ids(name: str, split: str) -> set[str]:
    return {t.id for t in envfactory.spec(name).tasks_in(split)}


def test_the_heldout_families_are_the_ones_the_benchmark_recorded():
    """Stable: the frozen set is the 12 families smol_agent's recorded run evaluated on, and the
    benchmark now takes them from the library."""
    from benchmarks.smol_agent import held_out

    recorded = json.loads((ROOT / "benchmarks/results/smol-agent-2026-11-25.json").read_text())
    assert sorted(envfactory.HELDOUT_FAMILIES) == recorded["families"]["heldout"]
    assert len(set(envfactory.HELDOUT_FAMILIES)) == 12
    assert held_out(recorded["families"]["train"] + recorded["families"]["heldout"]) == recorded["families"]["heldout"]
    known = {s.name for s in envfactory.specs()}
    assert set(envfactory.HELDOUT_FAMILIES) <= known
    from envfactory.factory.spec_file import TASK_KINDS

    assert set(envfactory.HELDOUT_KINDS) <= set(TASK_KINDS)


@pytest.mark.parametrize("name", [HELD, KIND, PLAIN])
def test_the_generalization_splits_are_disjoint_and_within_their_hash_split(name):
    spec = envfactory.spec(name)
    seen, fam, kind, words = (_ids(name, s) for s in GENERALIZATION_SPLITS)
    groups = [seen, fam, kind, words]
    assert all(not (a & b) for i, a in enumerate(groups) for b in groups[i + 1:])
    assert seen <= _ids(name, "train") and fam | kind | words <= _ids(name, "eval")
    for t in spec.get_tasks():
        if t.id in seen:
            assert name not in envfactory.HELDOUT_FAMILIES and t.kind not in envfactory.HELDOUT_KINDS
            assert t.metadata.get("phrasing") != envfactory.HELDOUT_PHRASING
        group = generalization_group(name, t.kind, t.metadata.get("phrasing"))
        assert (t.id in seen or t.id in fam or t.id in kind or t.id in words) == (
            spec.split(t) != "eval" if group == "seen" else spec.split(t) == "eval")


def test_each_family_lands_where_it_should():
    assert _ids(HELD, "seen") == set() and _ids(HELD, "heldout-kind") == set()
    assert _ids(HELD, "heldout-family") == _ids(HELD, "eval")  # every eval task of a held-out family
    kind_tasks = envfactory.spec(KIND).tasks_in("heldout-kind")
    assert kind_tasks and {t.kind for t in kind_tasks} == set(envfactory.HELDOUT_KINDS)
    assert all(t.kind not in envfactory.HELDOUT_KINDS for t in envfactory.spec(KIND).tasks_in("seen"))
    plain = envfactory.spec(PLAIN)
    assert _ids(PLAIN, "seen") == {t.id for t in plain.tasks_in("train")
                                   if t.metadata.get("phrasing") != envfactory.HELDOUT_PHRASING}
    assert not _ids(PLAIN, "heldout-family")
    # the held-out frame: eval tasks worded in it, of every kind not held out; none of them seen
    words = plain.tasks_in("heldout-phrasing")
    assert words and all(t.metadata["phrasing"] == envfactory.HELDOUT_PHRASING and plain.split(t) == "eval"
                         for t in words)
    # the frame's words appear only where it is held out (a lookup's fifth frame: "<request>, please.")
    assert not any(t.instruction.endswith(", please.") for t in plain.tasks_in("seen") if t.kind == "lookup")


def test_every_face_draws_only_from_a_generalization_split():
    want = _ids(HELD, "heldout-family")
    ep = envfactory.make(HELD, split="heldout-family")
    assert {t.id for t in ep._tasks} == want
    for s in range(20):
        ep.reset(seed=s)
        assert ep.task.id in want
    gym = gymnasium.make(f"envfactory/{KIND}", split="seen")
    seen = _ids(KIND, "seen")
    assert all(gym.reset(seed=s)[1]["task_id"] in seen for s in range(30))
    gym_kind = gymnasium.make(f"envfactory/{KIND}", split="heldout-kind")
    assert all(gym_kind.reset(seed=s)[1]["task_id"] in _ids(KIND, "heldout-kind") for s in range(10))
    view = multi.parallel_env("MultiRecords-v0", split="seen")  # a team family: no kind held out
    team_seen = _ids("MultiRecords-v0", "seen")
    for s in range(10):
        view.reset(seed=s)
        assert view.episode.task.id in team_seen
    svc = EpisodeService(KIND, split="heldout-kind")
    try:
        assert {r["task_id"] for r in svc.list_tasks()} == _ids(KIND, "heldout-kind")
        eval_seen = next(t.id for t in envfactory.spec(KIND).tasks_in("eval")  # right hash split, wrong kind
                         if t.kind not in envfactory.HELDOUT_KINDS
                         and t.metadata.get("phrasing") != envfactory.HELDOUT_PHRASING)
        with pytest.raises(KeyError, match="counts for 'seen'"):
            svc.start("k", task_id=eval_seen)
        with pytest.raises(KeyError, match="'sft' split"):
            svc.start("k", task_id=envfactory.spec(KIND).tasks_in("sft")[0].id)
        with pytest.raises(ValueError, match="not served"):
            svc.list_tasks("eval")  # a wider split than the one served
    finally:
        svc.close()
    with pytest.raises(envfactory.SpecError, match="no task in the 'seen' split"):
        envfactory.make(HELD, split="seen").reset(seed=0)


def test_the_openenv_face_serves_a_generalization_split():
    pytest.importorskip("openenv")
    from openenv.core.generic_client import GenericEnvClient

    from envfactory.faces.openenv_server import BackgroundServer, EnvfactoryClient

    want = _ids(KIND, "heldout-kind")
    with BackgroundServer(KIND, split="heldout-kind") as url:
        with GenericEnvClient(base_url=url).sync() as env:
            assert all(env.reset(seed=s).observation["task_id"] in want for s in range(6))
        assert {r["task_id"] for r in EnvfactoryClient(base_url=url).list_tasks()} == want
    with BackgroundServer(KIND, split="all") as url:
        with GenericEnvClient(base_url=url).sync() as env:
            assert env.reset(seed=3, split="seen").observation["task_id"] == \
                envfactory.spec(KIND).draw_task("seen", 3).id


def test_a_server_of_every_task_serves_the_generalization_splits_and_cli_names_them():
    assert within_split("all", "heldout-family") == "heldout-family"
    assert within_split("eval", "heldout-kind") == "heldout-kind"
    assert within_split("train", "seen") == "seen"
    with pytest.raises(ValueError, match="not served"):
        within_split("heldout-family", "heldout-kind")
    from envfactory.cli import main

    for split in GENERALIZATION_SPLITS:
        assert split in DRAW_SPLITS
    with pytest.raises(SystemExit):
        main(["serve", HELD, "--split", "nope"])
