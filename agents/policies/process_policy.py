"""Sampling on every CPU core: an :class:`~agents.policies.hf_policy.HFPolicy` whose batches are split
across processes that share its weights.

One process samples on one core. Two torch threads in one process split each small op and
synchronise at every one: on a loaded 2-core machine they reached 0.21–0.23 of both cores'
matmul rate against 0.23–0.31 for two processes (``benchmarks/rollout_cores.py``); on a quiet
AVX-512 host the two did equally well (1.01x, ``envfactory bench --only rollout``,
``rollout_hf_2proc_vs_2threads_*``). :class:`ProcessPolicy` runs ``processes - 1`` sampler
processes beside the caller: each :meth:`~ProcessPolicy.generate` sends every process a
contiguous share of the batch (rows sorted by their ids, so that a task's samples and an
episode's turns stay in one process and its prefix cache) and samples the first share
itself while they sample theirs.

The sampler processes hold no copy of the weights: the model's parameters are moved to
shared memory (``Module.share_memory``) and each process maps the same pages, so a
trainer's in-place update (AdamW, ``load_state_dict``) is what every process samples with
next; the parameters' version counters tell the processes to drop keys/values cached
with older weights. Parameters *replaced* (new tensors, ``model.to(...)``) are noticed
and the processes restarted. Row ``i`` of a seeded batch draws from the stream of
``(seed, i)`` wherever it is sampled, so a split batch samples what its shares would
sample each in one process.

A sampler process that dies (killed, out of memory) is named in a ``RuntimeError`` and
the pool is closed; the next call starts fresh processes. The processes exit with the
caller (their pipe closes) or on :meth:`close`.

CPU only: on a GPU one process batches every row (:class:`HFPolicy` alone).
"""

from __future__ import annotations

import os
import traceback
import weakref
from typing import Any, NoReturn

import numpy as np

from agents.policies.policy import Generation, Policy, check_prompts

__all__ = ["ProcessPolicy"]


def _sampler(conn: Any, model: Any, tokenizer: Any, options: dict[str, Any]) -> None:
    """A sampler process: an HFPolicy on the shared ``model``, answering ``generate`` requests
    until the pipe closes or ``("stop",)`` comes."""
    import torch

    from agents.policies.hf_policy import HFPolicy

    torch.set_num_threads(1)
    torch.seed()  # unseeded sampling must not repeat the caller's stream (torch's default seed is fixed)
    policy = HFPolicy(model, tokenizer=tokenizer, device="cpu", threads=1, **options)
    seen = None
    while True:
        try:
            msg = conn.recv()
        except (EOFError, OSError):
            return
        if msg[0] == "stop":
            return
        _, version, prompts, rows, kw = msg
        try:
            if version != seen:  # the caller's weights changed in place since our last batch
                policy.clear_cache()
                seen = version
            before = (policy.positions_computed, policy.keys_attended, policy.prefill_tokens_computed())
            gens = policy.generate(prompts, rows=rows, **kw)
            work = (policy.positions_computed - before[0], policy.keys_attended - before[1],
                    policy.prefill_tokens_computed() - before[2])
            conn.send(("ok", [(g.token_ids, g.logprobs, g.entropies, g.finish_reason) for g in gens], work))
        except Exception as exc:  # noqa: BLE001 - the caller raises it with this process named
            conn.send(("error", f"{type(exc).__name__}: {exc}\n{traceback.format_exc(limit=6)}"))


def _stop(procs: list[Any], conns: list[Any]) -> None:
    for c in conns:
        try:
            c.send(("stop",))
        except (OSError, ValueError):
            pass
    for p in procs:
        p.join(timeout=5)
        if p.is_alive():
            p.kill()
            p.join(timeout=5)
    for c in conns:
        c.close()


class ProcessPolicy(Policy):
    """``policy``'s sampling split over ``processes`` processes (the caller's included) that
    share its weights (see the module docstring). Everything but :meth:`generate`,
    :meth:`clear_cache` and :meth:`close` is ``policy``'s own (``model``, ``tokenizer``, the
    work counters, which add up the processes' work).

    Args:
        policy: The :class:`~agents.policies.hf_policy.HFPolicy` to sample with (on CPU). Its model's
            parameters are moved to shared memory.
        processes: Samplers in all (``1``: ``policy`` alone; default: one per CPU core).
        timeout: Seconds a sampler process may take to answer a batch (``None``: no limit; a
            process that exits is noticed within a second either way).
    """

    def __init__(self, policy: Any, processes: int | None = None, *, timeout: float | None = None) -> None:
        from agents.policies.hf_policy import HFPolicy

        if not isinstance(policy, HFPolicy):
            raise TypeError(f"ProcessPolicy splits an HFPolicy's batches, not a {type(policy).__name__}'s")
        if policy.device.type != "cpu":
            raise ValueError(f"ProcessPolicy is for CPU sampling; on {policy.device} one process batches every row")
        n = processes if processes is not None else (os.cpu_count() or 1)
        if int(n) < 1:
            raise ValueError(f"processes must be at least 1, got {processes}")
        self.inner = policy
        self.tokenizer = policy.tokenizer
        self.processes = int(n)
        self.timeout = timeout
        self._procs: list[Any] = []
        self._conns: list[Any] = []
        self._params: tuple[int, ...] = ()
        self._cleared = 0  # clear_cache calls: the processes drop their caches too
        self._finalizer: Any = None

    def __getattr__(self, name: str) -> Any:  # model, pad_id, counters, threads ...: the policy's
        if name == "inner":
            raise AttributeError(name)
        return getattr(self.inner, name)

    @property
    def model(self) -> Any:
        return self.inner.model

    def prefill_tokens_computed(self) -> int:
        return self.inner.prefill_tokens_computed()

    def clear_cache(self) -> None:
        self.inner.clear_cache()
        self._cleared += 1

    # -- the processes ---------------------------------------------------------
    def _signature(self) -> tuple[int, ...]:
        return tuple(p.data_ptr() for p in self.inner.model.parameters())

    def _start(self) -> None:
        """Start the sampler processes, or restart them when the parameters were replaced."""
        if self._procs and self._signature() == self._params:
            return
        self.close()
        import torch.multiprocessing as tmp

        model = self.inner.model
        model.share_memory()
        self.inner.clear_cache()  # the lean decoder's fused weights were made from the old storage
        self._params = self._signature()
        ctx = tmp.get_context("spawn")
        options = {"prefix_cache_tokens": self.inner._cache.max_tokens}
        for _ in range(self.processes - 1):
            here, there = ctx.Pipe()
            p = ctx.Process(target=_sampler, args=(there, model, self.tokenizer, options), daemon=True,
                            name="envfactory-sampler")
            p.start()
            there.close()
            self._procs.append(p)
            self._conns.append(here)
        self._finalizer = weakref.finalize(self, _stop, self._procs, self._conns)

    def close(self) -> None:
        if self._finalizer is not None:
            self._finalizer()
            self._finalizer = None
        self._procs, self._conns = [], []

    # -- sampling ---------------------------------------------------------------
    def generate(self, prompts: list[list[int]], *, max_new_tokens: int, temperature: float = 1.0,
                 top_p: float = 1.0, stop_token_ids: list[int] | None = None,
                 seed: int | None = None) -> list[Generation]:
        if not check_prompts(prompts, max_new_tokens):
            return []
        kw: dict[str, Any] = dict(max_new_tokens=max_new_tokens, temperature=temperature, top_p=top_p,
                  stop_token_ids=stop_token_ids, seed=seed)
        n = min(self.processes, len(prompts))
        if n <= 1:
            return self.inner.generate(prompts, **kw)
        self._start()
        from agents.policies.decode import decode_attention

        order = decode_attention.sort_rows([np.asarray(p, dtype=np.int64) for p in prompts])
        shares = [s.tolist() for s in np.array_split(np.asarray(order), n)]
        version = (self.inner._param_version(), self._cleared)
        for conn, rows in zip(self._conns, shares[1:]):
            try:
                conn.send(("gen", version, [list(prompts[i]) for i in rows], rows, kw))
            except (OSError, ValueError) as exc:
                self._failed(f"could not send a batch to a sampler process ({exc})")
        out: list[Generation | None] = [None] * len(prompts)
        try:
            for i, g in zip(shares[0], self.inner.generate([prompts[i] for i in shares[0]], rows=shares[0], **kw)):
                out[i] = g
        finally:  # the other shares are read even when ours raised: the pipes stay in step
            replies = [self._receive(k, len(rows)) for k, rows in enumerate(shares[1:])]
        failed = [(self._procs[k].pid, r[1]) for k, r in enumerate(replies) if r[0] == "error"]
        if failed:
            raise RuntimeError(f"sampler process {failed[0][0]} failed: {failed[0][1]}")
        for rows, (_, gens, work) in zip(shares[1:], replies):
            for i, g in zip(rows, gens):
                out[i] = Generation(*g)
            self.inner.positions_computed += work[0]
            self.inner.keys_attended += work[1]
            self.inner._prefill += work[2]
        return out  # type: ignore[return-value]

    def _receive(self, k: int, rows: int) -> tuple[Any, ...]:
        """Process ``k``'s answer: ``("ok", generations, work)`` or ``("error", text)``; raises
        (and stops every process) when it died, broke its pipe or outlived ``timeout``."""
        conn, proc = self._conns[k], self._procs[k]
        waited = 0.0
        while not conn.poll(1.0):
            waited += 1.0
            if not proc.is_alive():
                self._failed(f"sampler process {proc.pid} exited with code {proc.exitcode} "
                             f"while sampling {rows} rows")
            if self.timeout is not None and waited >= self.timeout:
                self._failed(f"sampler process {proc.pid} gave no answer for {rows} rows in {waited:.0f} s")
        try:
            return conn.recv()
        except (EOFError, OSError) as exc:
            self._failed(f"sampler process {proc.pid}'s pipe broke ({type(exc).__name__})")

    def _failed(self, why: str) -> "NoReturn":
        self.close()
        raise RuntimeError(f"ProcessPolicy: {why}; the sampler processes were stopped (the next call starts new ones)")

