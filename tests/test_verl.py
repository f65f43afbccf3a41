"""verl's agent loops (envfactory/faces/verl.py), tested with verl's own package.

verl 0.9 pins ``transformers<5.11`` (this project runs a newer one), so it runs in a virtual
environment of its own that sees this Python's packages (``system_site_packages``: torch's CPU
build, ray, datasets, numpy; a torch pin in a fresh venv would pull GBs of CUDA) and shadows the
clashing ones. verl is installed with ``--no-deps`` and an explicit list, the least that imports
``verl.experimental.agent_loop`` and builds verl's ``AgentLoopWorker``: verl's full requirements add
wandb, ray's ``[default]`` extras, pybind11 and more that the agent loop never imports. The list:
verl itself; ``transformers<5.11`` with the ``tokenizers`` and ``huggingface-hub`` it accepts;
hydra-core, omegaconf and the antlr4 runtime omegaconf's grammar was generated with; tensordict
and its pyvers; codetiming and pylatexenc (imported at verl's module level). Built once under
``$ENVFACTORY_CACHE/venvs``: 101 s on a shared, loaded 2-core machine with pip's cache warm
(``venv_python`` fails the test under CI when it cannot be built); the tests then take about
2.5 minutes.

In that venv, ``examples/verl/rollout.py`` runs verl's own rollout path (its shipped trainer
config, ``RLHFDataset`` + ``collate_fn`` over envfactory's parquet rows, a ``uid`` per prompt and
``rollout.n`` interleaved copies as its trainer makes, verl's ``AgentLoopWorker`` instantiating the
registered loop through Hydra and padding its outputs) with a scripted LLM server client and the
embedded tiny tokenizer: the reference solution of a Counter-v0 task is reward 1 (verl's
``rm_scores``), a wrong play 0; the ARPO loop returns ``rollout.n`` samples of one ``uid`` whose
worlds were forked (distinct end states, each replayed here through ``envfactory.make`` to the same
reward and state); bad rows fail naming what is wrong. Here: the module imports without verl, and
its dataset rows."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest

from conftest import import_without, venv_python

import envfactory

ROOT = Path(__file__).resolve().parents[1]
ROLLOUT = ROOT / "examples" / "verl" / "rollout.py"
PATCH = ROOT / "examples" / "verl" / "run_group.patch"
VERL_REQUIREMENTS = [
    "--no-deps", "verl==0.9.0", "transformers>=5.5.3,<5.11,!=5.6.0", "tokenizers>=0.22.0,<=0.23.0",
    "huggingface-hub>=1.5.0,<2.0", "hydra-core>=1.3,<1.4", "omegaconf>=2.2,<2.4", "antlr4-python3-runtime==4.9.3",
    "tensordict==0.10.0", "pyvers==0.2.3", "codetiming==1.4.0", "pylatexenc==2.11",
]
CALL = '<tool_call>{"name": "increment", "arguments": {"by": %d}}</tool_call>'


# -- without verl (this Python) --------------------------------------------------------------
def test_the_module_imports_without_verl_and_names_the_package():
    out = import_without("verl", "envfactory.faces.verl", "print('names', m.AGENT_NAME, m.ARPO_AGENT_NAME); "
                                                          "m.agent_loop_classes()")
    assert "names envfactory envfactory_arpo" in out
    assert "ImportError: envfactory's verl agent loops need verl (pip install 'verl==0.9.*'" in out


def test_rows_are_verl_dataset_rows_of_the_split():
    from envfactory.faces.verl import verl_rows

    s = envfactory.spec("Counter-v0")
    rows = verl_rows("Counter-v0", split="rl")
    assert [r["extra_info"]["task_id"] for r in rows] == [t.id for t in s.get_tasks() if s.split(t.id) == "rl"]
    row = rows[0]
    assert row["agent_name"] == "envfactory" and row["data_source"] == "envfactory/Counter-v0"
    assert [m["role"] for m in row["prompt"]] == ["system", "user"]
    assert row["prompt"][1]["content"] == s.task(row["extra_info"]["task_id"]).instruction
    assert [r["extra_info"]["index"] for r in rows] == list(range(len(rows)))
    assert row["reward_model"]["ground_truth"] == row["extra_info"]["task_id"]
    json.dumps(rows)  # parquet/JSON-ready
    group = verl_rows("Counter-v0", tasks=["counter-0-3"], agent_name="envfactory_arpo", arpo={"N": 2})
    assert group[0]["agent_name"] == "envfactory_arpo" and group[0]["extra_info"]["arpo"] == {"N": 2}
    assert group[0]["extra_info"]["split"] == "eval"  # a named task is written whatever its split


def test_bad_rows_are_refused_naming_what_is_wrong():
    from envfactory.faces.verl import _row, verl_rows

    with pytest.raises(KeyError, match="no environment named 'Countr-v0'"):
        verl_rows("Countr-v0")
    with pytest.raises(ValueError, match="MultiDeal-v0 is a team environment"):
        verl_rows("MultiDeal-v0")
    with pytest.raises(ValueError, match="split must be one of .*got .nope."):
        verl_rows("Counter-v0", split="nope")
    with pytest.raises(ValueError, match=r"unknown ARPO settings \['n'\]"):
        verl_rows("Counter-v0", arpo={"n": 2})
    with pytest.raises(ValueError, match="needs the row's env_name"):
        _row({"extra_info": {"task_id": "counter-0-1"}})
    with pytest.raises(ValueError, match="needs the row's task_id or seed"):
        _row({"extra_info": {"env_name": "Counter-v0"}})
    assert _row({"env_name": "Counter-v0", "extra_info": {"seed": 3}})["seed"] == 3


# -- with verl (a venv of its own) ------------------------------------------------------------
@pytest.fixture(scope="module")
def verl_python() -> str:
    return venv_python("verl-0.9.0", VERL_REQUIREMENTS, system_site_packages=True, timeout=900)


GROUP = {"task": "counter-0-1", "agent": "envfactory_arpo", "n": 4, "first": CALL % 1,  # ARPO: always branch
         "arpo": {"N": 2, "alpha": 1.0, "beta": 0.0, "seed": 0}}


def _rollout(python: str, plays: list[dict[str, Any]], pythonpath: list[str]) -> list[dict[str, Any]]:
    from agents import build_tiny_model

    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    env["PYTHONPATH"] = os.pathsep.join([*pythonpath, str(ROOT)])
    r = subprocess.run([python, str(ROLLOUT), "Counter-v0", build_tiny_model(), "--plays", json.dumps(plays)],
                       cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-5000:]
    return json.loads(r.stdout.strip().splitlines()[-1])


@pytest.fixture(scope="module")
def played(verl_python: str) -> list[dict[str, Any]]:
    plays = [
        {"task": "counter-0-1", "turns": [CALL % 1, "It shows 1."]},                     # the reference solution
        {"task": "counter-0-2", "turns": [CALL % 1, "Done, it shows 2."]},               # wrong: it shows 1
        GROUP,
        {"task": "counter-0-1", "turns": ["x"], "extra": {"env_name": "Countr-v0"}},
        {"task": "counter-0-1", "turns": ["x"], "extra": {"task_id": "counter-9-9"}},
        {"task": "counter-0-1", "turns": ["x"], "extra": {"env_name": None}},
    ]
    return _rollout(verl_python, plays, [])


def _replay(sample: dict[str, Any]) -> tuple[float, str]:
    """The sample's model turns (mask 1) played again on a fresh episode: its reward and end state."""
    e = envfactory.make("Counter-v0", split="all")
    e.reset(task=sample["facts"]["task_id"])
    reward = 0.0
    for mask, text in sample["segments"]:
        if mask:
            reward = e.step(text.replace("<|im_end|>", "")).reward
    assert e.done
    return reward, e.state.hash()


def _check_tokens(sample: dict[str, Any]) -> None:
    mask, logprobs = sample["mask"], sample["logprobs"]
    assert len(mask) == len(sample["response_ids"]) == len(logprobs) and mask[0] == 1 and mask[-1] == 1
    assert all(lp == 0.0 for m, lp in zip(mask, logprobs) if not m)           # tool tokens: no log-prob
    assert all(lp < 0.0 for m, lp in zip(mask, logprobs) if m)                 # sampled: the server's
    assert sample["reward_at"] == (len(mask) - 1 if sample["reward"] else None)  # verl's rm_scores: the last token
    tool = [text for m, text in sample["segments"] if not m]
    assert all(t.lstrip("\n").startswith("<|im_start|>user\n<tool_response>") for t in tool)
    assert all(t.endswith("<|im_start|>assistant\n") for t in tool)


@pytest.mark.slow
def test_verls_worker_plays_the_reference_solution_to_reward_1_and_a_wrong_play_to_0(played):
    oracle, wrong = played[0]["samples"], played[1]["samples"]
    assert len(oracle) == 1 and len(wrong) == 1
    assert oracle[0]["reward"] == 1.0 and oracle[0]["facts"]["success"] is True
    assert oracle[0]["facts"]["ended_by"] == "answer" and oracle[0]["facts"]["turns"] == 2
    assert [m for m, _ in oracle[0]["segments"]] == [1, 0, 1]
    assert "<tool_response>\n1\n</tool_response>" in oracle[0]["segments"][1][1]  # the tool's answer, as tokens
    assert wrong[0]["reward"] == 0.0 and wrong[0]["facts"]["success"] is False
    for sample in (oracle[0], wrong[0]):
        _check_tokens(sample)
        assert _replay(sample) == (sample["reward"], sample["facts"]["state_hash"])
    # one request id per trajectory (verl's sticky session), the prompt growing turn by turn
    requests = played[0]["requests"]
    assert len({r["request_id"] for r in requests}) == 1 and requests[1]["prompt_len"] > requests[0]["prompt_len"]
    assert requests[0]["prompt_len"] == len(oracle[0]["prompt_ids"])


@pytest.mark.slow
def test_the_arpo_loop_returns_a_group_of_samples_with_forked_worlds(played):
    _check_group(played[2]["samples"], served_by="run")  # unchanged verl: one run() call per sample


def _check_group(group: list[dict[str, Any]], served_by: str) -> None:
    assert len(group) == 4 and len({s["uid"] for s in group}) == 1      # rollout.n samples of one prompt
    facts = [s["facts"] for s in group]
    assert {f["served_by"] for f in facts} == {served_by}
    assert [f["kind"] for f in facts] == ["initial", "initial", "branch", "branch"]
    assert sorted(f["parent"] for f in facts if f["kind"] == "branch") == [0, 1]
    assert len({f["state_hash"] for f in facts}) >= 3                   # the worlds went different ways
    assert {s["reward"] for s in group} == {0.0, 1.0}                   # a group GRPO/ARPO can learn from
    for s in group:
        _check_tokens(s)
        # each sample's own world: its turns replayed from scratch give its reward and end state
        assert _replay(s) == (s["reward"], s["facts"]["state_hash"])
    for s in group:
        f = s["facts"]
        if f["kind"] == "branch":  # a branch shares its parent's token prefix, up to the branch point
            parent = group[f["parent"]]
            n = f["shared_tokens"]
            assert n > 0 and s["response_ids"][:n] == parent["response_ids"][:n]
            assert s["mask"][n - 1] == 0  # it branched right after a tool response


@pytest.mark.slow
def test_bad_rows_fail_in_verls_worker_naming_what_is_wrong(played):
    assert "no environment named 'Countr-v0'" in played[3]["error"]
    assert "Counter-v0 has no task 'counter-9-9'" in played[4]["error"]
    assert "needs the row's env_name" in played[5]["error"]


CHUNKS = """
from verl.experimental.agent_loop.agent_loop import chunk_on_uid, group_rows
from envfactory.faces.verl import register_verl
import json, numpy as np
register_verl()
uids = np.array(["a"] * 4 + ["b"] * 4 + ["c"] * 4, dtype=object)
names = np.array(["envfactory_arpo"] * 8 + ["envfactory"] * 4, dtype=object)
print(json.dumps({"two": chunk_on_uid(12, uids, 2), "three": chunk_on_uid(12, uids, 3),
                  "five": chunk_on_uid(12, uids, 5), "no_uid": chunk_on_uid(6, None, 4),
                  "rows": group_rows({"uid": uids, "agent_name": names})}))
"""


@pytest.mark.slow
def test_the_upstream_patch_makes_a_group_one_run_group_call(verl_python: str, tmp_path: Path):
    """examples/verl/run_group.patch applied to a copy of the venv's verl: the worker calls the ARPO loop's
    run_group once for the prompt's rows, and the manager's chunks never cut a uid."""
    where = subprocess.run([verl_python, "-c", "import os, verl; print(os.path.dirname(verl.__file__))"],
                           capture_output=True, text=True, timeout=300, check=True).stdout.strip()
    shutil.copytree(where, tmp_path / "verl")
    tool = ["patch", "-p1", "-i", str(PATCH)] if shutil.which("patch") else ["git", "apply", "-p1", str(PATCH)]
    subprocess.run(tool, cwd=tmp_path, check=True, capture_output=True, timeout=60)
    (group,) = _rollout(verl_python, [GROUP], [str(tmp_path)])
    _check_group(group["samples"], served_by="run_group")
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    env["PYTHONPATH"] = os.pathsep.join([str(tmp_path), str(ROOT)])
    r = subprocess.run([verl_python, "-c", CHUNKS], cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]
    out = json.loads(r.stdout.strip().splitlines()[-1])
    assert out["two"] == [[0, 4], [4, 12]] and out["three"] == [[0, 4], [4, 8], [8, 12]]
    assert out["five"] == [[0, 4], [4, 8], [8, 12]]  # never more chunks than uids
    assert out["no_uid"] == [[0, 2], [2, 3], [3, 4], [4, 6]]
    assert out["rows"] == [[0, 1, 2, 3], [4, 5, 6, 7], [8], [9], [10], [11]]
