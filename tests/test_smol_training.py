"""The pieces that train SmolLM2 (or any model) cheaply on a CPU: one-line tool signatures in
the chat template, training only the top layers, the output layer only at scored positions,
and the held-out families of ``benchmarks/smol_agent.py``. Run on the tiny model (no smol
extra needed): they are properties of the code, not of SmolLM2's weights."""

from __future__ import annotations

import json
import random

import pytest

import envfactory

from conftest import require_torch

SCHEMAS = [
    {"type": "function", "function": {
        "name": "search_orders", "description": "List orders matching the filters.",
        "parameters": {"type": "object", "required": [], "properties": {
            "customer": {"anyOf": [{"type": "string"}, {"type": "null"}], "default": None},
            "status": {"anyOf": [{"enum": ["placed", "shipped"]}, {"type": "null"}]}}}}},
    {"type": "function", "function": {
        "name": "restock_product", "description": "Set a product's stock count.",
        "parameters": {"type": "object", "required": ["product_id", "stock"], "properties": {
            "product_id": {"type": "string", "description": "Id of the product."},
            "stock": {"type": "integer"}}}}},
    {"type": "function", "function": {"name": "noop", "description": "",
                                      "parameters": {"type": "object", "properties": {}}}},
]


@pytest.fixture(scope="module")
def tiny_tok():
    require_torch()
    from transformers import AutoTokenizer

    from agents.models.tiny import build_tiny_model

    return AutoTokenizer.from_pretrained(build_tiny_model())


def _render(tok, template: str, messages: list[dict], tools=SCHEMAS, **kw) -> str:
    return tok.apply_chat_template(messages, tools=tools, tokenize=False, chat_template=template, **kw)


def test_signatures_show_each_tool_on_one_line_with_types_enums_and_optional_marks(tiny_tok) -> None:
    from agents.models.smol import SIGNATURES_TEMPLATE

    text = _render(tiny_tok, SIGNATURES_TEMPLATE, [{"role": "user", "content": "hi"}])
    tools = text.split("<tools>\n", 1)[1].split("\n</tools>", 1)[0].split("\n")
    assert tools == [
        "search_orders(customer?: string, status?: placed|shipped) - List orders matching the filters.",
        "restock_product(product_id: string, stock: integer) - Set a product's stock count.",
        "noop()",
    ]
    assert '"parameters"' not in text  # no JSON schema left


def test_signatures_render_turns_exactly_as_the_json_template_does(tiny_tok) -> None:
    """Only the tool list differs: a conversation's turns (calls, responses, the generation
    prompt) are the same text, so parsing and token accounting are unchanged."""
    from agents.models.smol import SIGNATURES_TEMPLATE
    from agents.models.tiny import CHAT_TEMPLATE

    call = '<tool_call>\n{"name": "restock_product", "arguments": {"product_id": "P-1", "stock": 3}}\n</tool_call>'
    messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Restock P-1 to 3."},
                {"role": "assistant", "content": call}, {"role": "tool", "content": "product P-1: stock=3"},
                {"role": "assistant", "content": "Done."}]
    a = _render(tiny_tok, CHAT_TEMPLATE, messages, add_generation_prompt=True)
    b = _render(tiny_tok, SIGNATURES_TEMPLATE, messages, add_generation_prompt=True)
    assert a.split("\n</tools>", 1)[1] == b.split("\n</tools>", 1)[1]
    assert a.split("<tools>\n", 1)[0].replace("You are provided with function signatures", "") == \
        b.split("<tools>\n", 1)[0].replace(
            "The functions, as name(argument: type) with ? marking optional arguments, are", "")
    assert len(b) < len(a)


def test_signatures_render_every_registered_environment_shorter(tiny_tok) -> None:
    from agents.models.smol import SIGNATURES_TEMPLATE
    from agents.models.tiny import CHAT_TEMPLATE

    for name in ("RetailOrders-v1", "AutoRepair-v0", "FindLight-v3", "Bank-v0"):
        env = envfactory.make(name)
        try:
            env.reset()
            schemas = env.tool_schemas()
            text = _render(tiny_tok, SIGNATURES_TEMPLATE, env.transcript()[:2], tools=schemas)
            lines = text.split("<tools>\n", 1)[1].split("\n</tools>", 1)[0].split("\n")
            assert [ln.split("(", 1)[0] for ln in lines] == [s["function"]["name"] for s in schemas], name
            assert len(text) < len(_render(tiny_tok, CHAT_TEMPLATE, env.transcript()[:2], tools=schemas)), name
        finally:
            env.close()


def test_freeze_below_trains_only_the_top_layers_and_a_step_changes_only_them() -> None:
    require_torch()
    import torch
    from transformers import AutoModelForCausalLM

    from agents.models.smol import freeze_below
    from agents.models.tiny import build_tiny_model

    model = AutoModelForCausalLM.from_pretrained(build_tiny_model(), dtype=torch.float32)
    n_layers = len(model.model.layers)
    total = sum(p.numel() for p in model.parameters())
    top = sum(p.numel() for p in model.model.layers[-1].parameters()) + sum(
        p.numel() for p in model.model.norm.parameters())
    assert freeze_below(model, 1) == top
    before = {k: v.clone() for k, v in model.state_dict().items()}
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    ids = torch.randint(0, 100, (1, 16))
    model(input_ids=ids, labels=ids).loss.backward()
    opt.step()
    changed = {k for k, v in model.state_dict().items() if not torch.equal(v, before[k])}
    assert changed and all(k.startswith(f"model.layers.{n_layers - 1}.") or k.startswith("model.norm.")
                           for k in changed), sorted(changed)
    assert freeze_below(model, None) == total == freeze_below(model, n_layers + 3)
    with pytest.raises(ValueError, match="at least 1"):
        freeze_below(model, 0)


def test_scored_only_losses_equal_the_full_losses_at_scored_positions_and_train_the_same() -> None:
    require_torch()
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from agents.models.pretrain import _loss_sums, _shared_rows
    from agents.quickstart.reader import reader_plays, sft_step
    from agents.models.tiny import build_tiny_model

    path = build_tiny_model()
    tok = AutoTokenizer.from_pretrained(path)
    plays = reader_plays(tok, {"env": "FindLight-v3", "sft_tasks": 6, "supply": 0, "made_up": 0.5}, 0)
    rows = _shared_rows(plays, lambda t: tok(t, add_special_tokens=False)["input_ids"], 2, 512,
                        tok.convert_tokens_to_ids("<|endoftext|>"), random.Random(0), assistant_only=True)
    models = [AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32) for _ in range(2)]
    full, valid = _loss_sums(models[0], rows, 0, 2)
    part, valid2 = _loss_sums(models[0], rows, 0, 2, scored_only=True)
    assert torch.equal(valid, valid2) and int(valid.sum()) > 10
    assert torch.allclose(full[valid], part[valid], atol=1e-5)
    assert float(part.detach()[~valid].abs().sum()) == 0.0
    losses = []
    for m, scored in zip(models, (False, True)):
        opt = torch.optim.AdamW(m.parameters(), lr=1e-3)
        losses.append([sft_step(m, opt, rows, i, 1, 1e-3, scored_only=scored) for i in range(2)])
    assert losses[0] == pytest.approx(losses[1], abs=1e-4)


def test_smol_agent_holds_out_whole_families_from_sft() -> None:
    from benchmarks.smol_agent import GOAL_KINDS, draw, families, held_out

    fams = families()
    test = held_out(fams)
    assert len(test) == 12 and test == held_out(list(reversed(fams))) and set(test) <= set(fams)
    train = [f for f in fams if f not in test]
    pairs = draw(test, "eval", 30, 1)
    assert len(pairs) == 30 and pairs == draw(test, "eval", 30, 1)
    assert {n for n, _ in pairs} <= set(test)
    assert all(t.kind in GOAL_KINDS and envfactory.spec(n).split(t) == "eval" for n, t in pairs)
    assert not set(train) & {n for n, _ in pairs}
    json.dumps([f"{n}/{t.id}" for n, t in pairs])  # the results file names them
