"""Language-model pretraining of the tiny model (issue 13): a corpus of plays of the environments'
non-evaluation tasks, a few steps that lower a held-out loss, a cache keyed by corpus, config and
seed, and a folder transformers loads offline."""

from __future__ import annotations

import json
import random
import time
from pathlib import Path

import pytest

import envfactory

torch = pytest.importorskip("torch")

from agents.models.pretrain import (  # noqa: E402
    PRETRAIN_CONFIG, PRETRAIN_MODEL, Play, _key, _loss_sums, _shared_rows, _train, check_no_eval, pretrain,
    pretrain_corpus,
)
from agents.models.tiny import build_tiny_model  # noqa: E402

# a few small steps: the test checks the mechanism, the default recipe is measured by `envfactory pretrain`
SMALL = {"batch": 1, "seq_len": 1536, "warmup": 1, "lr": 3e-3, "heldout_tokens": 2048}


@pytest.fixture(scope="module")
def tokenizer():
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(build_tiny_model())


@pytest.fixture(scope="module")
def small_run(tmp_path_factory):
    """One pretraining of 3 small steps in a fresh cache: (report, seconds it took, cache dir)."""
    cache = tmp_path_factory.mktemp("models")
    t0 = time.perf_counter()
    doc = pretrain(seed=0, steps=3, cache_dir=cache, config=SMALL)
    return doc, time.perf_counter() - t0, cache


def test_corpus_leaves_out_every_evaluation_task(tokenizer) -> None:
    plays = pretrain_corpus(tokenizer, envs=["Lights-v0", "FindLight-v0"])
    check_no_eval(plays)
    # every Lights-v0 task has its own instruction: each evaluation instruction is absent, each other present
    spec = envfactory.spec("Lights-v0")
    assert spec.tasks_in("eval")
    texts = "\n".join(p.text for p in plays if p.env == "Lights-v0")
    for t in spec.get_tasks():
        assert (t.instruction in texts) == (spec.split(t) != "eval"), t.id
    # FindLight-v0: exactly the non-evaluation tasks are played, by the oracle and with detours
    fl = envfactory.spec("FindLight-v0")
    played = {p.task_id for p in plays if p.env == "FindLight-v0"}
    assert played == {t.id for t in fl.get_tasks() if fl.split(t) != "eval"}
    assert {p.kind for p in plays} == {"oracle", "detour"}
    # the plays are conversations in the tiny model's chat markup, with the environments' real outputs
    p = next(p for p in plays if p.env == "FindLight-v0" and p.kind == "oracle")
    task = fl.task(p.task_id)
    assert p.text.startswith("<|im_start|>system\n") and "<tools>" in p.text
    item, room = task.metadata["item"], task.metadata["room"]
    assert f"<tool_response>\nThe {item} is in the {room}.\n</tool_response>" in p.text
    assert f'{{"name": "turn_on", "arguments": {{"room": "{room}"}}}}' in p.text
    from agents.rollout import renderer_for  # a rollout's opening is where the play's text starts

    env = envfactory.make("FindLight-v0")
    assert p.text.startswith(renderer_for(tokenizer).render(env.reset(task), env.tool_schemas(), True))
    # the check catches an evaluation task's play
    ev = fl.tasks_in("eval")[0]
    with pytest.raises(ValueError, match="evaluation"):
        check_no_eval([*plays, Play("FindLight-v0", ev.id, "sft", "oracle", p.text)])


def test_shared_rows_score_each_play_as_a_rollout_sees_it(tokenizer) -> None:
    """A row holds one opening and several conversations; each conversation's losses are those of
    the play alone (opening at position 0), as in a rollout."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(build_tiny_model(), attn_implementation="sdpa").eval()
    plays = pretrain_corpus(tokenizer, envs=["FindLight-v0"], detours=0)[:4]
    rows = _shared_rows(plays, lambda t: tokenizer(t, add_special_tokens=False)["input_ids"], 1, 1024, 0,
                        random.Random(0))
    seg, ids = rows.seg[0], rows.ids[0]
    assert int(seg.max()) >= 3
    with torch.no_grad():
        losses, _ = _loss_sums(model, rows, 0, 1)
        P = int((seg == 0).sum())
        for k in (1, 2):
            alone = torch.cat([ids[:P], ids[seg == k]])[None]
            ref = torch.nn.functional.cross_entropy(model(input_ids=alone).logits[0, :-1], alone[0, 1:],
                                                    reduction="none")
            assert torch.allclose(ref[P:], losses[0][seg == k][:-1], atol=1e-4)


def test_a_few_steps_lower_the_held_out_loss(small_run) -> None:
    doc, _, _ = small_run
    assert not doc["cached"] and doc["config"]["steps"] == 3
    assert doc["loss_after"] < doc["loss_before"] - 0.5, doc
    assert doc["conversation_loss_after"] < doc["conversation_loss_before"], doc
    assert len(doc["corpus_hash"]) == 16 and doc["heldout_plays"] > 0 and doc["train_plays"] > doc["heldout_plays"]


def test_cached_and_keyed_by_seed_steps_and_corpus(small_run) -> None:
    doc, trained_s, cache = small_run
    weights = Path(doc["path"]) / "model.safetensors"
    mtime = weights.stat().st_mtime_ns
    t0 = time.perf_counter()
    again = pretrain(seed=0, steps=3, cache_dir=cache, config=SMALL)
    assert again["cached"] and again["path"] == doc["path"] and time.perf_counter() - t0 < trained_s
    assert weights.stat().st_mtime_ns == mtime  # not retrained
    assert again["loss_after"] == doc["loss_after"]  # the report of the run that built it
    base = json.loads((Path(doc["path"]) / "envfactory-tiny.json").read_text())["pretrain"]["base"]
    cfg = {**PRETRAIN_CONFIG, **SMALL, "steps": 3, "betas": list(PRETRAIN_CONFIG["betas"])}
    key = _key(base, doc["corpus_hash"], cfg, 0)
    assert Path(doc["path"]).name.endswith(key)
    assert _key(base, doc["corpus_hash"], cfg, 1) != key
    assert _key(base, doc["corpus_hash"], {**cfg, "steps": 4}, 0) != key
    assert _key(base, "0" * 16, cfg, 0) != key


def test_output_loads_offline(small_run, monkeypatch) -> None:
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

    path = small_run[0]["path"]
    cfg = AutoConfig.from_pretrained(path)
    assert cfg.model_type == "qwen2" and cfg.hidden_size // cfg.num_attention_heads == 64
    assert all(getattr(cfg, k) == v for k, v in PRETRAIN_MODEL.items())
    tok = AutoTokenizer.from_pretrained(path)
    model = AutoModelForCausalLM.from_pretrained(path)
    assert model.get_input_embeddings().weight.shape[0] == len(tok) == cfg.vocab_size
    assert tok.chat_template == AutoTokenizer.from_pretrained(build_tiny_model()).chat_template
    assert sum(f.stat().st_size for f in Path(path).iterdir()) < 20e6
    ids = tok.apply_chat_template([{"role": "user", "content": "hi"}], add_generation_prompt=True,
                                  return_tensors="pt", return_dict=True)["input_ids"]
    assert model.generate(ids, max_new_tokens=2, do_sample=False).shape[1] > ids.shape[1]


def test_same_seed_same_weights(tokenizer, tmp_path) -> None:
    plays = pretrain_corpus(tokenizer, envs=["Lights-v0", "FindLight-v0"])
    cfg = {**PRETRAIN_CONFIG, **SMALL, "steps": 2, "heldout_share": 0.2}
    out = []
    for name in ("a", "b"):
        (tmp_path / name).mkdir()
        _train(tmp_path / name, build_tiny_model(), plays, cfg, 0, lambda m: None)
        out.append((tmp_path / name / "model.safetensors").read_bytes())
    assert out[0] == out[1]


def test_pretraining_without_a_log_shows_a_tqdm_bar_on_a_terminal(tokenizer, tmp_path, monkeypatch) -> None:
    import io
    import sys

    class Terminal(io.StringIO):
        def isatty(self) -> bool:
            return True

    plays = pretrain_corpus(tokenizer, envs=["Lights-v0"])
    cfg = {**PRETRAIN_CONFIG, **SMALL, "steps": 2, "heldout_share": 0.2}
    for name, log, stream in [("bar", None, Terminal()), ("lines", [].append, Terminal()), ("pipe", None, io.StringIO())]:
        monkeypatch.setattr(sys, "stderr", stream)
        (tmp_path / name).mkdir()
        _train(tmp_path / name, build_tiny_model(), plays, cfg, 0, log)
        shown = stream.getvalue()
        assert ("pretrain: 100%" in shown and "2/2" in shown and "loss=" in shown) == (name == "bar"), (name, shown)


PINNED_CORPUS_HASH = "3715870021f12f30"
"""The default pretraining corpus's hash, with which every quickstart figure of RESULTS.md was
measured (on two installs). A change to a corpus environment's tools, tasks or error texts changes
it, and with it the pretrained models and every figure: if the change is intended, bump the
recipe's format, re-measure, and update this constant with the figures."""


def test_the_default_pretraining_corpus_is_pinned():
    from agents.models.pretrain import corpus_hash, pretrain_corpus

    assert corpus_hash(pretrain_corpus()) == PINNED_CORPUS_HASH, (
        "the default pretraining corpus changed (see PINNED_CORPUS_HASH): the embedded model's "
        "figures no longer hold until re-measured")


def test_the_tokenizer_option_pretrains_on_its_own_random_build(small_run) -> None:
    # pretrained_tiny_model(tokenizer="words") trains on the words tokenizer's build, in a folder
    # of its own; the default's folder and key are those it had before the option existed.
    from transformers import AutoTokenizer

    doc, _, cache = small_run
    words = pretrain(seed=0, steps=3, cache_dir=cache, config={**SMALL, "tokenizer": "words"})
    assert not words["cached"] and words["path"] != doc["path"]
    assert words["base"] == Path(build_tiny_model(cache, tokenizer="words")).name != doc["base"]
    tok = AutoTokenizer.from_pretrained(words["path"])
    assert tok.convert_ids_to_tokens(tok(" zorblat")["input_ids"])[0] == "Ġ"  # the space is a piece of its own
    named = pretrain(seed=0, steps=3, cache_dir=cache, config={**SMALL, "tokenizer": "qwen"})
    assert named["cached"] and named["path"] == doc["path"]  # the default, named, is the same checkpoint
