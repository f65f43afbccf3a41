"""FindLight-v3's held-out halves, the task supply, the swap twin, and the reading probe
(a scripted reader follows the swap; a scripted guesser does not)."""

from __future__ import annotations

import json
import re

import pytest

import envfactory
from envfactory.checks.scripted import OraclePolicy, play
from environments.find_light import FRAMES, HELDOUT_FRAMES, HELDOUT_NAMES, swap_answer, turned_on, v3_supply

HELD = {n for v in HELDOUT_NAMES.values() for n in v}


def _words(task) -> set[str]:
    s = task.initial_state
    return set(s.lights) | set(s.where) | set(s.where.values()) | set(re.findall(r"[a-z]+", task.instruction.lower()))


def test_heldout_names_and_phrasings_occur_only_in_evaluation_tasks() -> None:
    spec = envfactory.spec("FindLight-v3")
    tasks = spec.get_tasks()
    train = [t for t in tasks if spec.split(t) != "eval"]
    assert train and not any(_words(t) & HELD for t in train)
    held_frames = [f.split("{item}")[0] for f in HELDOUT_FRAMES]
    assert not any(t.instruction.startswith(h) for t in train for h in held_frames)
    halves = {n: [t for t in tasks if spec.split(t) == "eval" and t.metadata["names"] == n] for n in ("train", "heldout")}
    assert len(halves["train"]) == len(halves["heldout"]) == 200
    for t in halves["heldout"]:  # what the solution depends on is held out
        assert {t.metadata["room"], t.metadata["item"], t.metadata["container"]} <= HELD


def test_the_supply_is_fresh_solvable_and_never_holds_heldout_names() -> None:
    spec = envfactory.spec("FindLight-v3")
    own = {t.id for t in spec.get_tasks()}
    sup = v3_supply(300, seed=3)
    assert len({t.id for t in sup}) == 300 and not own & {t.id for t in sup}
    assert not any(_words(t) & HELD for t in sup)
    assert {t.instruction.replace(t.metadata["item"], "{item}") for t in sup} <= set(FRAMES)
    made_up = {t.metadata["room"] for t in sup} - {r for t in spec.get_tasks() for r in t.initial_state.lights}
    assert len(made_up) > 50  # names no registered task holds: recall cannot solve them
    ep = envfactory.make("FindLight-v3")
    assert all(play(ep, OraclePolicy(), t).success for t in sup[:60])
    assert [t.id for t in v3_supply(5, seed=3)] == [t.id for t in sup[:5]]  # deterministic


def test_the_swap_twin_moves_only_the_answer() -> None:
    spec = envfactory.spec("FindLight-v3")
    t = spec.tasks_in("eval")[0]
    other = sorted(r for r in t.initial_state.lights if r != t.metadata["room"])[0]
    twin = swap_answer(t, other)
    assert twin.instruction == t.instruction and twin.metadata["original_room"] == t.metadata["room"]
    ep = envfactory.make("FindLight-v3")
    assert play(ep, OraclePolicy(), twin).success and turned_on(ep.transcript()) == [other]
    ep.reset(twin)  # the original room is wrong in the twin world
    ep.step(envfactory.call("turn_on", room=t.metadata["room"]))
    assert ep.step("done").info["success"] is False
    with pytest.raises(ValueError, match="another of the task's rooms"):
        swap_answer(t, t.metadata["room"])


def _scripted(tokenizer, reads: bool):
    from agents.policies.scripted_model import ScriptedModel

    def script(ids, turn):
        text = tokenizer.decode(ids)
        if turn == 0:
            said = text.split("<|im_start|>user\n")[1].split("<|im_end|>")[0]
            item = next(m.group(1) for f in FRAMES + HELDOUT_FRAMES
                        if (m := re.fullmatch(re.escape(f).replace(re.escape("{item}"), r"(\w+)"), said)))
            return f'<tool_call>\n{json.dumps({"name": "locate", "arguments": {"thing": item}})}\n</tool_call>'
        place = re.findall(r"is in the (\w+)\.", text)[-1]
        if turn == 1:
            return f'<tool_call>\n{json.dumps({"name": "locate", "arguments": {"thing": place}})}\n</tool_call>'
        if turn == 2:
            room = place if reads else "kitchen"
            return f'<tool_call>\n{json.dumps({"name": "turn_on", "arguments": {"room": room}})}\n</tool_call>'
        return "Done."

    return ScriptedModel(tokenizer, script)


def test_the_probe_tells_a_reader_from_a_guesser() -> None:
    from transformers import AutoTokenizer

    from agents.quickstart.probe import blind_baselines, reading_report
    from agents.models.tiny import build_tiny_model

    tok = AutoTokenizer.from_pretrained(build_tiny_model())
    tasks = envfactory.spec("FindLight-v3").tasks_in("eval")[:12]
    reader = reading_report(_scripted(tok, True), "FindLight-v3", tasks, samples=2)
    assert reader["success"] == 1.0 and reader["item_first"] == 1.0 and reader["shown"] == 1.0
    assert reader["swap"]["moved"] == 1.0 and reader["swap"]["stayed"] == 0.0
    guesser = reading_report(_scripted(tok, False), "FindLight-v3", tasks, samples=2)
    kitchen = [t for t in tasks if t.metadata["room"] == "kitchen"]
    assert guesser["success"] == pytest.approx(len(kitchen) / len(tasks), abs=1e-3)
    assert guesser["success_given_shown"] == guesser["success"]  # shown, yet no better
    if guesser["swap"]["solved"]:
        assert guesser["swap"]["moved"] == 0.0 and guesser["swap"]["stayed"] == 1.0
    b = blind_baselines(tasks)
    assert b["random"] == pytest.approx(1 / 8) and 0 < b["most_frequent"] <= 1


def test_packed_sft_scores_exactly_the_model_s_own_tokens() -> None:
    """assistant_mask encodes a conversation as the whole text encodes, and marks exactly the ids a
    rollout's loss mask marks (the model's turns and their closing <|im_end|>)."""
    import random

    from transformers import AutoTokenizer

    from agents.algorithms.sft import reference_rollouts
    from agents.models.pretrain import _shared_rows, assistant_mask
    from agents.quickstart.reader import READER_CONFIG, reader_plays
    from agents.models.tiny import build_tiny_model

    tok = AutoTokenizer.from_pretrained(build_tiny_model())

    def encode(text: str) -> list[int]:
        return tok(text, add_special_tokens=False)["input_ids"]

    plays = reader_plays(tok, {**READER_CONFIG, "supply": 3, "sft_tasks": 0}, seed=0)  # supply plays only
    env = envfactory.make("FindLight-v3")
    from environments.find_light import v3_supply

    ros = reference_rollouts(tok, [(env, t) for t in v3_supply(3, seed=0)])
    for play_, ro in zip(plays, ros):
        rest = play_.text[play_.text.index("<|im_start|>user\n"):]
        ids, mask = assistant_mask(encode, rest)
        assert ids == encode(rest)
        t = ro.trajectory
        own = [i for i, m in zip(t.response_ids, t.loss_mask) if m]
        assert [i for i, m in zip(ids, mask) if m] == own
    opening = encode(plays[0].text[:plays[0].text.index("<|im_start|>user\n")])
    fit = len(opening) + sum(len(encode(p.text[p.text.index("<|im_start|>user\n"):])) for p in plays)
    rows = _shared_rows(plays, encode, 1, fit, 0, random.Random(0), assistant_only=True)  # exactly the 3 plays
    scored = int((rows.labels != -100).sum())
    assert scored == sum(sum(ro.trajectory.loss_mask) for ro in ros)


def test_every_seed_starts_from_one_pretrained_checkpoint_unless_told(monkeypatch) -> None:
    """Reader SFT of every seed starts from pretraining seed ``base_seed`` (0), or from the seed's
    own checkpoint with ``base_seed=None``; the random build ignores it."""
    import agents.models.pretrain as pretrain
    import agents.models.tiny as tiny
    from agents.quickstart.reader import base_model

    calls = []
    monkeypatch.setattr(pretrain, "pretrained_tiny_model",
                        lambda seed=0, **kw: calls.append(kw) or f"pretrained-{seed}")
    monkeypatch.setattr(tiny, "build_tiny_model",
                        lambda cache_dir=None, seed=0, tokenizer="qwen": f"random-{seed}-{tokenizer}")
    assert [base_model(s) for s in (0, 3, 4)] == ["pretrained-0"] * 3
    assert base_model(3, {"base_seed": None}) == "pretrained-3"
    assert base_model(3, {"base_seed": 2}) == "pretrained-2"
    assert base_model(3, {"pretrained": False}) == "random-3-qwen"
    # pretraining's progress reaches the caller's log (before, the quickstart's pretraining was silent)
    assert base_model(1, log=print, device="cuda") == "pretrained-0"
    assert calls[-1] == {"log": print, "device": "cuda", "tokenizer": "qwen"}
    # the recipe's tokenizer (agents.models.tiny.TOKENIZERS) reaches the base it starts from
    assert base_model(3, {"pretrained": False, "tokenizer": "words"}) == "random-3-words"
    base_model(3, {"tokenizer": "words"})
    assert calls[-1]["tokenizer"] == "words"


def test_the_base_can_be_smol_or_a_model_folder_and_a_wrong_one_is_named(monkeypatch, tmp_path) -> None:
    """``base`` chooses what reader SFT starts from: the packaged SmolLM2 (its signatures template),
    any local HF model folder, and an error naming the choices for anything else."""
    import agents.models.smol as smol
    from agents.quickstart.reader import base_model

    monkeypatch.setattr(smol, "smol_model_path", lambda cache_dir=None, tools="json": f"smol-{tools}")
    assert base_model(0, {"base": "smol"}) == "smol-signatures"
    (tmp_path / "config.json").write_text("{}")
    assert base_model(5, {"base": str(tmp_path)}) == str(tmp_path)
    with pytest.raises(ValueError, match="'tiny', 'smol' or a local HF model folder"):
        base_model(0, {"base": str(tmp_path / "nothing-here")})


def test_the_copy_check_runs_sft_again_until_it_passes_and_a_pass_changes_nothing(tmp_path, monkeypatch) -> None:
    """A reader that fails the copy check gets another round of SFT on fresh plays, up to
    ``rounds`` in all, each round's check recorded; one that passes the first check has exactly
    the weights it has without the check (the check neither trains nor draws from the seed's RNG)."""
    from safetensors.torch import load_file

    from agents.quickstart.reader import reader_model

    small = {"pretrained": False, "supply": 4, "sft_tasks": 2, "seq_len": 1024}
    lines: list[str] = []
    failing = reader_model(0, {**small, "check": {"tasks": 2, "min_success": 1.0, "rounds": 2}},
                           cache_dir=tmp_path, log=lines.append)  # a random model solves nothing
    meta = json.loads((tmp_path / failing / "envfactory-reader.json").read_text())
    assert len(meta["rounds"]) == 2 and [r["check"] for r in meta["rounds"]] == [0.0, 0.0]
    assert meta["steps"] == sum(r["steps"] for r in meta["rounds"]) and meta["rounds"][1]["plays"] == 4
    assert any("round 2, 4 fresh plays" in m for m in lines)
    assert any("still fails after 2 rounds" in m for m in lines)

    passing = reader_model(0, {**small, "check": {"tasks": 2, "min_success": 0.0, "rounds": 2}}, cache_dir=tmp_path)
    unchecked = reader_model(0, {**small, "check": None}, cache_dir=tmp_path)
    assert len({failing, passing, unchecked}) == 3  # the check is part of the recipe's cache key
    assert len(json.loads((tmp_path / passing / "envfactory-reader.json").read_text())["rounds"]) == 1
    a, b = (load_file(f"{d}/model.safetensors") for d in (passing, unchecked))
    assert a.keys() == b.keys() and all(a[k].equal(b[k]) for k in a)
    # "check": None is the recipe before the check existed: readers cached then are found again
    # (SmolLM2's reader recipe says None; before the fix its folder changed with the new key)
    import agents.quickstart.reader as reader_mod

    before = {k: v for k, v in reader_mod.READER_CONFIG.items() if k != "check"}
    monkeypatch.setattr(reader_mod, "READER_CONFIG", before)
    assert reader_model(0, small, cache_dir=tmp_path) == unchecked
    # the tokenizer chooses the base, which keys the reader: the default, named, is the same reader
    assert reader_model(0, {**small, "tokenizer": "qwen"}, cache_dir=tmp_path) == unchecked
