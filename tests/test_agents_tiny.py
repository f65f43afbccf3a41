"""The embedded tiny model: built offline, cached, loadable, with a tool-aware chat template."""

from __future__ import annotations

import dataclasses
import json
import os
import time

import envfactory
from agents.models.tiny import TOOL_TOKENS, build_tiny_model


def test_build_is_cached_and_loads_offline(tmp_path, monkeypatch) -> None:
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    t0 = time.perf_counter()
    path = build_tiny_model(tmp_path)
    built_s = time.perf_counter() - t0
    t0 = time.perf_counter()
    assert build_tiny_model(tmp_path) == path
    assert time.perf_counter() - t0 < built_s  # the second call reuses the cache
    assert build_tiny_model(tmp_path, seed=1) != path  # the seed is part of the key
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

    cfg = AutoConfig.from_pretrained(path)
    assert cfg.model_type == "qwen2" and cfg.hidden_size // cfg.num_attention_heads == 64
    tok = AutoTokenizer.from_pretrained(path)
    model = AutoModelForCausalLM.from_pretrained(path)
    assert model.get_input_embeddings().weight.shape[0] == len(tok) == cfg.vocab_size


def test_tokenizer_and_chat_template() -> None:
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(build_tiny_model())
    for t in ["<|im_start|>", "<|im_end|>", *TOOL_TOKENS]:
        assert len(tok(t, add_special_tokens=False)["input_ids"]) == 1, t
    env = envfactory.make("Bank-v0")
    msgs = env.reset(0)
    call = env.spec.get_tasks()[0].solution[0]
    env.step(call.to_hermes())
    text = tok.apply_chat_template(env.transcript(), tools=env.tool_schemas(), tokenize=False)
    assert "<tools>" in text and json.dumps(env.tool_schemas()[0], ensure_ascii=False) in text
    assert msgs[1]["content"] in text and "<tool_response>\n" in text
    opening = tok.apply_chat_template(msgs, tools=env.tool_schemas(), tokenize=False)
    assert text.count("<tool_call>") == opening.count("<tool_call>") + 1  # the call is rendered once
    ids = tok(text, add_special_tokens=False)["input_ids"]
    assert tok.decode(ids) == text  # byte-level BPE round-trips
    # a parsed call given only as structured tool_calls is rendered Hermes-style
    structured = [msgs[0], msgs[1], {"role": "assistant", "content": "", "tool_calls": [
        {"type": "function", "function": {"name": call.name, "arguments": call.arguments}}]}]
    assert f'<tool_call>\n{{"name": "{call.name}", "arguments": ' in tok.apply_chat_template(structured, tokenize=False)


def test_tokenizer_corpus_leaves_out_evaluation_tasks() -> None:
    # Nothing built before training may have seen an evaluation task (issue 13): every Lights-v0
    # task has its own instruction, so each eval instruction must be absent and each other present.
    from agents.models.tiny import corpus

    texts = "\n".join(corpus())
    spec = envfactory.spec("Lights-v0")
    evaluation = spec.tasks_in("eval")
    assert evaluation
    for t in spec.get_tasks():
        assert (t.instruction in texts) == (spec.split(t) != "eval"), t.id


def test_registering_an_environment_leaves_the_embedded_model_unchanged(monkeypatch) -> None:
    """The tokenizer (and default pretraining) corpus is pinned (tiny.CORPUS_ENVS): a new environment
    must not silently change the embedded model, and with it every figure measured on it."""
    from envfactory import registry
    from agents.models.tiny import CORPUS_ENVS, corpus

    before = corpus()
    lights = envfactory.spec("Lights-v0")
    newcomer = dataclasses.replace(lights, name="Newcomer-v0",
                                   description="A newcomer, with words nobody pretrained on: zygomorphic quincunx.")
    monkeypatch.setitem(registry._REGISTRY, "Newcomer-v0", newcomer)
    assert "Newcomer-v0" in {s.name for s in envfactory.specs()} and "Newcomer-v0" not in CORPUS_ENVS
    assert corpus() == before


def test_a_build_folder_left_by_a_killed_process_is_swept_by_the_next_build(tmp_path) -> None:
    """Before: a process killed while building (SIGKILL, no ``finally``) left its
    ``.building-*`` folder in the model cache for good, e.g. a killed quickstart's worker
    mid-save. Now the next build removes it; a live builder's and another host's stay."""
    import socket
    import subprocess
    import sys

    from agents.models.tiny import publish_folder

    child = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    host = socket.gethostname()
    dead = tmp_path / f".building-{host}-{int(child.stdout)}-abc123"
    live = tmp_path / f".building-{host}-{os.getpid()}-def456"
    other = tmp_path / f".building-elsewhere-{int(child.stdout)}-ghi789"
    odd = tmp_path / ".building-x7y8z9"  # the old naming: its owner is unknown, so it stays
    for d in (dead, live, other, odd):
        (d / "model").mkdir(parents=True)

    def build(tmp):
        assert tmp.name.startswith(f".building-{host}-{os.getpid()}-")
        (tmp / "done").write_text("1")

    publish_folder(tmp_path / "model-a", "done", build)
    assert (tmp_path / "model-a" / "done").exists()
    assert not dead.exists() and live.exists() and other.exists() and odd.exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(["model-a", ".lock-model-a", live.name, other.name,
                                                                 odd.name])


_BUILDER = """
import sys, time
from pathlib import Path
from agents.models.tiny import publish_folder

dest, log = Path(sys.argv[1]), Path(sys.argv[2])

def build(tmp):
    with open(log, "a") as f:
        f.write("built\\n")
    time.sleep(1.0)
    (tmp / "done").write_text("1")

publish_folder(dest, "done", build)
assert (dest / "done").exists()
"""


def test_concurrent_builders_of_one_folder_build_it_once(tmp_path) -> None:
    """Before: every quickstart worker that needed the pretrained base built it at once (two
    ``.building-*`` folders, each a core's 400 s, one thrown away at the rename). Now the later
    builders wait for the first and find its folder published: one build for three processes."""
    import subprocess
    import sys

    log = tmp_path / "log"
    procs = [subprocess.Popen([sys.executable, "-c", _BUILDER, str(tmp_path / "model-a"), str(log)])
             for _ in range(3)]
    assert [p.wait(timeout=120) for p in procs] == [0, 0, 0]
    assert log.read_text().splitlines() == ["built"]
    assert not list(tmp_path.glob(".building-*"))


def test_a_builder_that_waits_for_another_is_told_and_does_not_build(tmp_path) -> None:
    """The later builder of a folder calls ``waiting()`` (the quickstart's workers log it: before,
    a worker sat silent through another's pretraining) and returns with the first one's folder."""
    import threading

    from agents.models.tiny import publish_folder

    dest, started, release, waited = tmp_path / "model-a", threading.Event(), threading.Event(), []

    def slow(tmp):
        started.set()
        assert release.wait(30)
        (tmp / "done").write_text("1")

    def never(tmp):
        raise AssertionError("built twice")

    first = threading.Thread(target=publish_folder, args=(dest, "done", slow))
    first.start()
    assert started.wait(30)
    second = threading.Thread(target=publish_folder, args=(dest, "done", never),
                              kwargs={"waiting": lambda: (waited.append(1), release.set())})
    second.start()
    first.join(30)
    second.join(30)
    assert waited == [1] and (dest / "done").read_text() == "1"
    assert not first.is_alive() and not second.is_alive()


def _pieces(tok, text: str) -> list[int]:
    return tok(text, add_special_tokens=False)["input_ids"]


def test_the_words_tokenizer_spells_a_name_alike_in_prose_and_in_a_call(tmp_path) -> None:
    # With Qwen2's split a word carries the character before it, so a name the tokenizer never
    # merged is other ids after a space than after a quote ("foyer": Ġfo y er / " f oy er) and a
    # model must re-spell it to copy it. The "words" tokenizer cuts a run of letters alone
    # wherever it stands: the name's ids in an instruction occur verbatim in the call.
    import random

    import pytest
    from transformers import AutoTokenizer

    from agents.models.tiny import TOKENIZERS
    from environments.find_light import HELDOUT_NAMES, made_up_name

    rng = random.Random(0)
    names = [x for v in HELDOUT_NAMES.values() for x in v] + [made_up_name(rng) for _ in range(40)]
    qwen = AutoTokenizer.from_pretrained(build_tiny_model(tmp_path))
    words_path = build_tiny_model(tmp_path, tokenizer="words")
    assert words_path != build_tiny_model(tmp_path) and set(TOKENIZERS) == {"qwen", "words"}
    words = AutoTokenizer.from_pretrained(words_path)

    def alike(tok, name: str) -> bool:
        in_prose = _pieces(tok, f"Where did my {name} go?")
        in_call = _pieces(tok, f'{{"name": "locate", "arguments": {{"item": "{name}"}}}}')
        alone = _pieces(tok, name)
        return any(in_prose[i:i + len(alone)] == alone for i in range(len(in_prose))) and \
            any(in_call[i:i + len(alone)] == alone for i in range(len(in_call)))

    assert all(alike(words, n) for n in names)
    assert sum(alike(qwen, n) for n in names) < len(names) / 2  # what the default tokenizer does
    text = "Turn on the light in the zorblat, then 'foyer' & \"den\".\n  done"
    assert words.decode(_pieces(words, text)) == text  # byte-level: still round-trips exactly
    with pytest.raises(ValueError, match="unknown tokenizer"):
        build_tiny_model(tmp_path, tokenizer="chars")


def test_the_default_tokenizer_keys_its_cache_as_before_it_could_be_chosen() -> None:
    # Cached tiny models (and every checkpoint and figure built on them) keep their folders.
    from agents.models.tiny import _key

    texts = ["a", "b"]
    assert _key(texts, 0) == _key(texts, 0, "qwen") != _key(texts, 0, "words")
