"""verl's own rollout path plays envfactory episodes through envfactory's verl agent loops.

Run in a Python with verl 0.9 (``PYTHONPATH`` the repository; see docs/faces.md's verl section)::

    python examples/verl/rollout.py Counter-v0 MODEL_DIR --plays '[...]'

What verl's trainer does for a rollout step, with verl's own classes and its shipped trainer
config (``verl/trainer/config/_generated_ppo_trainer.yaml``): envfactory's rows
(:func:`envfactory.faces.verl.verl_rows`) go to parquet and through verl's ``RLHFDataset`` and
``collate_fn``; each prompt gets a ``uid`` and is repeated ``rollout.n`` times (interleaved), as
``RayPPOTrainer.fit`` does; verl's ``AgentLoopWorker`` (built from the config, its tokenizer the
model folder's) runs the registered agent loop of each row and pads the outputs into its
``DataProto``. The model is a scripted stand-in for verl's LLM server client
(``generate(request_id, prompt_ids=..., sampling_params=...) -> TokenOutput``): each play names
the completions it returns, turn by turn (``"turns"``; ``"extra"`` overrides the row's
``extra_info``), or ``"policy": "alternate"`` (turn 1 the
first completion; later turns alternate between answering with the counter's last value and
incrementing by 1, one global call counter, so forked branches go different ways); its log-probs
are ``-0.1 * (1 + position % 5)``.

Prints one JSON line: per play, every sample's ids, mask, log-probs, reward (verl's ``rm_scores``)
and envfactory's facts (``extra_fields["envfactory"]``), decoded text and ``uid``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import re
import sys
import tempfile
import uuid
from typing import Any

import numpy as np
import verl
from datasets import Dataset
from omegaconf import OmegaConf
from verl.experimental.agent_loop.agent_loop import AgentLoopWorker
from verl.protocol import DataProto
from verl.utils.dataset.rl_dataset import RLHFDataset, collate_fn
from verl.workers.rollout.replica import TokenOutput

from envfactory.faces.verl import register_verl, verl_rows


class ScriptedServer:
    """verl's LLM server client, scripted: ``generate`` returns the play's next completion's ids."""

    def __init__(self, tokenizer: Any, script: dict[str, Any]) -> None:
        self.tokenizer, self.script = tokenizer, script
        self.count = 0
        self.requests: list[dict[str, Any]] = []

    def _text(self, prompt: str) -> str:
        script = self.script
        turn = prompt.count("<|im_start|>assistant") - 1  # this turn's number, from 0
        if script["policy"] == "turns":
            return script["turns"][turn]
        if turn == 0:
            return script["first"]
        self.count += 1
        if self.count % 2:
            shown = re.findall(r"<tool_response>\s*(\S+?)\s*</tool_response>", prompt)
            return f"It shows {shown[-1] if shown else '?'}."
        return '<tool_call>{"name": "increment", "arguments": {"by": 1}}</tool_call>'

    async def generate(self, request_id: str, *, prompt_ids: list[int], sampling_params: dict[str, Any],
                       **kwargs: Any) -> Any:
        prompt = self.tokenizer.decode(prompt_ids, skip_special_tokens=False)
        text = self._text(prompt)
        ids = self.tokenizer.encode(text + "<|im_end|>", add_special_tokens=False)
        self.requests.append({"request_id": request_id, "prompt_len": len(prompt_ids)})
        await asyncio.sleep(0)
        return TokenOutput(token_ids=ids, log_probs=[-0.1 * (1 + i % 5) for i in range(len(ids))],
                           stop_reason="completed")


def config(model: str, n: int) -> Any:
    cfg = OmegaConf.load(os.path.join(os.path.dirname(verl.__file__), "trainer/config/_generated_ppo_trainer.yaml"))
    cfg.actor_rollout_ref.model.path = model
    cfg.actor_rollout_ref.rollout.name = "vllm"
    cfg.actor_rollout_ref.rollout.n = n
    cfg.data.max_prompt_length = 1536
    cfg.data.max_response_length = 768
    cfg.data.return_raw_chat = True
    return cfg


async def play(worker: Any, tokenizer: Any, data: Any, rows: list[dict[str, Any]], n: int) -> list[dict[str, Any]]:
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "rows.parquet")
        Dataset.from_list(rows).to_parquet(path)
        dataset = RLHFDataset(data_files=[path], tokenizer=tokenizer, config=data)
        batch = DataProto.from_single_dict(collate_fn([dataset[i] for i in range(len(dataset))]))
    batch.non_tensor_batch["uid"] = np.array([str(uuid.uuid4()) for _ in range(len(batch))], dtype=object)
    keep = {"data_source", "reward_model", "extra_info", "uid"}  # RayPPOTrainer._get_gen_batch
    gen = batch.pop(batch_keys=[], non_tensor_batch_keys=list(set(batch.non_tensor_batch) - keep))
    gen.non_tensor_batch.update(batch.non_tensor_batch)
    gen.meta_info["global_steps"] = 1
    gen = gen.repeat(repeat_times=n, interleave=True)
    out = await worker.generate_sequences(gen)
    samples = []
    for i in range(len(out)):
        mask = out.batch["response_mask"][i]
        length = int(out.batch["attention_mask"][i, out.batch["prompts"].shape[1]:].sum())
        prompt = out.batch["prompts"][i]
        prompt_ids = prompt[out.batch["attention_mask"][i, :prompt.shape[0]].bool()].tolist()
        response_ids = out.batch["responses"][i, :length].tolist()
        samples.append({
            "uid": str(out.non_tensor_batch["uid"][i]), "prompt_ids": prompt_ids, "response_ids": response_ids,
            "mask": mask[:length].tolist(), "logprobs": out.batch["rollout_log_probs"][i, :length].tolist(),
            "reward": float(out.batch["rm_scores"][i].sum()), "reward_at": int(out.batch["rm_scores"][i].nonzero()[0, 0])
            if out.batch["rm_scores"][i].any() else None,
            "facts": out.non_tensor_batch["envfactory"][i], "num_turns": int(out.non_tensor_batch["__num_turns__"][i]),
            "model_text": [tokenizer.decode([t for t, m in zip(response_ids, mask[:length].tolist()) if m])],
            "segments": _segments(tokenizer, response_ids, mask[:length].tolist()),
        })
    return samples


def _segments(tokenizer: Any, ids: list[int], mask: list[int]) -> list[list[Any]]:
    """The response cut where the mask changes: ``[mask, text]`` pieces."""
    out: list[list[Any]] = []
    for t, m in zip(ids, mask):
        if out and out[-1][0] == m:
            out[-1][1].append(t)
        else:
            out.append([m, [t]])
    return [[m, tokenizer.decode(ts, skip_special_tokens=False)] for m, ts in out]


async def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("env")
    parser.add_argument("model", help="a model folder (its tokenizer and config: verl's HFModelConfig loads it)")
    parser.add_argument("--plays", required=True, help="JSON list of {task, turns | first, agent, n, arpo}")
    args = parser.parse_args()
    register_verl()
    results = []
    for spec in json.loads(args.plays):
        n = int(spec.get("n", 1))
        worker = AgentLoopWorker(config(args.model, n), None)
        rows = verl_rows(args.env, split="all", tasks=[spec["task"]], agent_name=spec.get("agent", "envfactory"),
                         arpo=spec.get("arpo"))
        rows[0]["extra_info"].update(spec.get("extra", {}))  # a bad row, to see its error
        script = ({"policy": "turns", "turns": spec["turns"]} if "turns" in spec
                  else {"policy": "alternate", "first": spec["first"]})
        server = ScriptedServer(worker.tokenizer, script)
        worker.llm_client = server
        try:
            samples = await play(worker, worker.tokenizer, worker.config.data, rows, n)
            results.append({"samples": samples, "requests": server.requests})
        except Exception as exc:  # a named failure is a result too
            results.append({"error": f"{type(exc).__name__}: {exc}"})
    print(json.dumps(results, default=str))


if __name__ == "__main__":
    sys.exit(asyncio.run(main()))
