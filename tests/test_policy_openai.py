"""OpenAIPolicy against a real vLLM OpenAI-compatible server started locally with the tiny model."""

from __future__ import annotations

import pytest
import torch

import envfactory
from agents.policies.policy import sampling_stats
from agents.rollout import rollout
from agents.rollout_check import invariant_problems
from agents.policies.scripted_model import ScriptedModel
from agents.models.tiny import build_tiny_model
from conftest import require_vllm

pytestmark = [pytest.mark.vllm, pytest.mark.slow]

LIST_ROOT = '<tool_call>\n{"name": "list_dir", "arguments": {"path": "/"}}\n</tool_call>'


@pytest.fixture(scope="module")
def server():
    require_vllm()
    from agents.policies.vllm_server import vllm_server

    path = build_tiny_model()
    with vllm_server(path) as url:
        yield url, path


def test_token_mode_matches_hf_logprobs(server) -> None:
    from transformers import AutoModelForCausalLM

    from agents.policies.openai_policy import OpenAIPolicy

    url, path = server
    pol = OpenAIPolicy(url, path, mode="tokens")
    model = AutoModelForCausalLM.from_pretrained(path).eval()
    prompts = [list(range(5, 300)), [7, 8, 9, 10] * 20]
    gens = pol.generate(prompts, max_new_tokens=16, temperature=0.8, top_p=0.95, seed=3)
    for p, g in zip(prompts, gens):
        assert len(g.token_ids) == len(g.logprobs) == len(g.entropies) > 0
        with torch.no_grad():
            logits = model(torch.tensor([p + g.token_ids])).logits[0, len(p) - 1:-1]
        logp, ent = sampling_stats(logits, 0.8, 0.95)
        assert torch.allclose(logp.gather(1, torch.tensor(g.token_ids)[:, None]).squeeze(1),
                              torch.tensor(g.logprobs), atol=1e-3)
        assert torch.allclose(ent, torch.tensor(g.entropies), atol=1e-4)
    again = pol.generate(prompts, max_new_tokens=16, temperature=0.8, top_p=0.95, seed=3)
    assert [g.token_ids for g in again] == [g.token_ids for g in gens]
    assert pol.prefix_tokens_reused > 0  # the server's prefix cache served the repeated prompts
    pol.close()


def test_rollout_over_http_is_token_in_token_out(server) -> None:
    from agents.policies.openai_policy import OpenAIPolicy

    url, path = server
    pol = OpenAIPolicy(url, path, mode="auto")
    mixed = ScriptedModel(pol.tokenizer, lambda p, turn: LIST_ROOT if turn == 0 else None, fallback=pol)
    trajs = [r.trajectory for r in rollout(mixed, [(envfactory.make("FileSystem-v0", max_turns=3), i) for i in range(2)],
                                           max_new_tokens=24, seed=0)]
    for t in trajs:
        assert t.error is None and t.turns >= 2 and t.token_exact
        assert invariant_problems(t, pol.tokenizer) == []
        a, b = t.turn_spans[1]
        assert all(lp < 0 for lp in t.logprobs[a:b])
    assert pol.mode == "auto"  # the server answered token prompts: no fallback to text


def test_text_only_mode_for_evaluation(server) -> None:
    from agents.policies.openai_policy import OpenAIPolicy

    url, path = server
    pol = OpenAIPolicy(url, path, mode="text")
    [t] = [r.trajectory for r in rollout(pol, [(envfactory.make("Counter-v0", max_turns=2), 0)], max_new_tokens=16, seed=0)]
    assert t.error is None and t.turns >= 1 and not t.token_exact
    assert t.messages[2]["role"] == "assistant" and t.response_ids


def _prompt_logprobs(pol, url, path, seq):
    """The server's log-probability of each token of ``seq`` after the first (prompt_logprobs)."""
    data = pol._client.post(url + "/completions", json={"model": path, "prompt": seq, "max_tokens": 1,
                                                         "prompt_logprobs": 0}).json()
    return torch.tensor([d[str(t)]["logprob"] for d, t in zip(data["choices"][0]["prompt_logprobs"][1:], seq[1:])])


def test_trained_weights_reach_the_server_after_each_step(server) -> None:
    """Last in this module: it changes the served weights (and puts the originals back)."""
    import itertools

    from transformers import AutoModelForCausalLM

    from agents import Trainer
    from agents.algorithms.objectives import GRPO
    from agents.train_config import OptimConfig, OutputConfig, SamplingConfig, TrainerConfig
    from agents.policies.openai_policy import OpenAIPolicy

    url, path = server
    pol = OpenAIPolicy(url, path, mode="tokens")
    seq = list(range(5, 70))
    before = _prompt_logprobs(pol, url, path, seq)
    calls = itertools.count()
    cfg = TrainerConfig(algorithm=GRPO(M=2), sampling=SamplingConfig(max_new_tokens=8, max_turns=1),
                        optim=OptimConfig(lr=1e-2, tasks_per_step=1), output=OutputConfig(show_progress=False))
    tr = Trainer(pol, ["Counter-v0"], cfg, model=path, reward_fn=lambda t: float(next(calls) % 2))
    try:
        row = tr.train_step()
        assert row["trained_sequences"] > 0
        after = _prompt_logprobs(pol, url, path, seq)
        with torch.no_grad():
            logits = tr.model.eval()(torch.tensor([seq])).logits[0, :-1].float()
        mine = torch.log_softmax(logits, -1).gather(1, torch.tensor(seq[1:])[:, None]).squeeze(1)
        assert (after - before).abs().max() > 1e-3, "the push changed what the server computes"
        assert torch.allclose(after, mine, atol=1e-4), (after - mine).abs().max()
    finally:
        original = AutoModelForCausalLM.from_pretrained(path)
        pol.load_weights(original.state_dict().items())
        assert torch.allclose(_prompt_logprobs(pol, url, path, seq), before, atol=1e-5)
        pol.close()


def test_pushing_weights_to_a_server_without_dev_mode_names_the_fix() -> None:
    import httpx

    from agents.policies.openai_policy import OpenAIPolicy, ServerError

    def app(request: httpx.Request) -> httpx.Response:
        return httpx.Response(404, json={"detail": "Not Found"})

    pol = OpenAIPolicy.__new__(OpenAIPolicy)
    pol.base_url, pol._client, pol._weights_dir = "http://server/v1", httpx.Client(transport=httpx.MockTransport(app)), None
    with pytest.raises(ServerError, match="VLLM_SERVER_DEV_MODE=1"):
        pol.load_weights([("w", torch.zeros(2))])
