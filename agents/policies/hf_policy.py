"""HFPolicy: batched sampling with a transformers causal LM (CPU or GPU).

Sampling is our own loop over ``model.forward`` (not ``model.generate``) so
that the logprob and entropy of each sampled id are those of the distribution
it was drawn from, and so that a prompt can start from the cached keys/values
of an earlier sequence (:class:`~agents.policies.decode.prefix_cache.PrefixCache`).

Batch layout: row ``i`` of the attention cache holds the reused prefix (``c_i``
ids), padding up to the longest reused prefix, left padding, the rest of the
prompt, then the sampled ids. Padding slots are masked out and position ids are
passed explicitly, so every row computes exactly what it would alone. Rows are
sorted by their ids (prompts with a common prefix side by side) and sampling's
one-token steps run :mod:`agents.policies.decode.decode_attention`, which reads such a prefix
once per run of rows instead of once per row.
"""

from __future__ import annotations

import os
from typing import Any, Sequence

import numpy as np
import torch

from agents.policies.decode import decode_attention
from agents.policies.policy import Generation, Policy, check_prompts, default_stop_ids, sampling_stats
from agents.policies.decode.prefix_cache import PrefixCache, common_prefix_len

__all__ = ["HFPolicy", "sample_ids", "smol_policy"]


def _growing_cache(n_layers: int, capacity: int) -> Any:
    """A DynamicCache whose layers write into preallocated buffers (one copy per
    token instead of re-concatenating the whole cache at every decoding step)."""
    from transformers import DynamicCache
    from transformers.cache_utils import DynamicLayer

    class GrowingLayer(DynamicLayer):
        def update(self, key_states: torch.Tensor, value_states: torch.Tensor, *args: Any, **kwargs: Any):
            if not self.is_initialized:
                self.lazy_initialization(key_states, value_states)
                self._n = 0
                self._k = self._v = None
            n, need = key_states.shape[-2], self._n + key_states.shape[-2]
            if self._k is None or need > self._k.shape[-2]:
                cap = max(need, capacity, 2 * (self._k.shape[-2] if self._k is not None else 0))
                k = key_states.new_empty((*key_states.shape[:2], cap, key_states.shape[-1]))
                v = value_states.new_empty((*value_states.shape[:2], cap, value_states.shape[-1]))
                if self._n:
                    k[:, :, : self._n] = self._k[:, :, : self._n]
                    v[:, :, : self._n] = self._v[:, :, : self._n]
                self._k, self._v = k, v
            self._k[:, :, self._n:need] = key_states
            self._v[:, :, self._n:need] = value_states
            self._n = need
            self.keys, self.values = self._k[:, :, :need], self._v[:, :, :need]
            return self.keys, self.values

    cache = DynamicCache()
    cache.layers = [GrowingLayer() for _ in range(n_layers)]
    cache.layer_class_to_replicate = None
    return cache


def sample_ids(logp: torch.Tensor, gens: list[torch.Generator] | None = None) -> torch.Tensor:
    """One id per row of ``logp`` (``[rows, vocab]`` log-probabilities, ``-inf`` allowed), by
    inverse CDF: one uniform per row, from row ``i``'s generator ``gens[i]`` when given. Eight
    times cheaper here than ``torch.multinomial`` row by row (which draws an exponential per
    vocabulary entry) at 16 rows x 4k ids."""
    rows, dev = logp.shape[0], logp.device
    u = torch.rand(rows, device=dev) if gens is None else torch.cat(
        [torch.rand(1, generator=g, device=dev) for g in gens])
    cdf = logp.exp().cumsum(dim=-1)
    # u in (0, 1]: the first id whose cumulative mass reaches u * total has mass > 0
    tok = torch.searchsorted(cdf, ((1.0 - u)[:, None] * cdf[:, -1:]).contiguous()).squeeze(1)
    return tok.clamp_max(cdf.shape[-1] - 1)


def _keep_rows(cache: Any, rows: list[int]) -> Any:
    """The batch cache of :func:`_growing_cache` with only ``rows`` (in that order)."""
    idx = torch.tensor(rows, dtype=torch.long, device=cache.layers[0]._k.device)
    for layer in cache.layers:
        layer._k, layer._v = layer._k.index_select(0, idx), layer._v.index_select(0, idx)
        layer.keys, layer.values = layer._k[:, :, : layer._n], layer._v[:, :, : layer._n]
    return cache


class HFPolicy(Policy):
    """A transformers model as a :class:`~agents.policies.policy.Policy`.

    Args:
        model_or_path: A folder or hub id for ``from_pretrained``, a loaded
            ``PreTrainedModel``, or ``None`` for the tiny default model
            (:func:`agents.models.tiny.build_tiny_model`).
        device: ``"cpu"``, ``"cuda"``, ...; default: CUDA when available.
        tokenizer: Required when passing a model object whose ``name_or_path``
            does not name its tokenizer.
        dtype: Weights dtype when loading from a path (default: the checkpoint's).
        prefix_cache_tokens: Tokens of keys/values kept for reuse (0 disables reuse).
        threads: torch CPU threads while sampling (restored afterwards). Default on
            CPU: 1. Decoding small batches is dominated by per-op overhead and
            OpenMP synchronisation; on the project's 2-core machines one thread
            sampled 4-6x more tokens/s than two when other processes were busy
            (vLLM's CPU backend makes the same choice). ``0`` keeps torch's setting.

    ``self.model`` is the torch module a trainer updates in place. The prefix
    cache notices in-place weight updates (parameter version counters) and drops
    keys/values computed with the old weights; call :meth:`clear_cache` after
    replacing parameters some other way.
    """

    def __init__(self, model_or_path: Any = None, *, device: str | None = None, tokenizer: Any = None,
                 dtype: Any = None, prefix_cache_tokens: int = 32768, threads: int | None = None) -> None:
        from transformers import AutoModelForCausalLM, AutoTokenizer

        if device is None:
            device = "cuda" if torch.cuda.is_available() else "cpu"
        self.device = torch.device(device)
        if model_or_path is None:
            from agents.models.tiny import build_tiny_model

            model_or_path = build_tiny_model()
        if isinstance(model_or_path, (str, os.PathLike)):
            path = str(model_or_path)
            self.model = AutoModelForCausalLM.from_pretrained(path, dtype=dtype or "auto",
                                                              attn_implementation="sdpa")
            self.tokenizer = tokenizer or AutoTokenizer.from_pretrained(path)
        elif isinstance(model_or_path, torch.nn.Module):
            self.model = model_or_path
            if tokenizer is None:
                name = getattr(model_or_path, "name_or_path", "")
                if not name:
                    raise ValueError("HFPolicy(model): pass tokenizer= (the model does not name its checkpoint)")
                tokenizer = AutoTokenizer.from_pretrained(name)
            self.tokenizer = tokenizer
        else:
            raise TypeError(f"HFPolicy takes a path, a hub id or a torch model, not {type(model_or_path).__name__}")
        self.model.to(self.device)
        self.threads = (1 if self.device.type == "cpu" else 0) if threads is None else int(threads)
        self.vocab_size = int(self.model.get_output_embeddings().weight.shape[0])
        self.pad_id = self.tokenizer.pad_token_id if self.tokenizer.pad_token_id is not None else 0
        self._cache = PrefixCache(prefix_cache_tokens)
        self._weights_version = self._param_version()
        self.prefix_tokens_reused = 0  # prompt tokens served from the prefix cache
        # the work sampling did, for a FLOP count (benchmarks/rollout.py): positions run through
        # the model (prompt and fed sampled ids; padding and finished rows not counted) and the
        # real keys they attended to
        self.positions_computed = 0
        self.keys_attended = 0
        self.min_shared_prefix = 32  # shorter shared prefixes are not worth a separate forward
        self.decode_attention = True  # agents.policies.decode.decode_attention while sampling (False: transformers' own)
        # weights of the linear layers: the prefill grouping's cost model (a position's matmul work)
        self._linear_params = sum(m.weight.numel() for m in self.model.modules() if isinstance(m, torch.nn.Linear))
        self.lean_decode = True  # agents.policies.decode.lean_decode's one-token steps where the model supports them
        self._lean: Any = None  # its fused weights, rebuilt when the parameters change

    # -- bookkeeping -------------------------------------------------------
    def clear_cache(self) -> None:
        """Forget every cached key/value (e.g. after swapping the model's weights)."""
        self._cache.clear()
        self._lean = None

    def _lean_decoder(self) -> Any:
        """The :class:`~agents.policies.decode.lean_decode.LeanDecoder` for the current weights, or ``None`` where
        it is turned off or does not support the model."""
        if not self.lean_decode:
            return None
        if self._lean is None:
            from agents.policies.decode import lean_decode

            self._lean = lean_decode.LeanDecoder(self.model) if lean_decode.supports(self.model) else False
        return self._lean or None

    def _param_version(self) -> int:
        return sum(p._version for p in self.model.parameters())

    # -- sampling ----------------------------------------------------------
    def generate(self, prompts: list[list[int]], *, max_new_tokens: int, temperature: float = 1.0,
                 top_p: float = 1.0, stop_token_ids: list[int] | None = None,
                 seed: int | None = None, rows: Sequence[int] | None = None) -> list[Generation]:
        """See :meth:`Policy.generate`. ``rows``: the index each prompt has in a larger batch
        split across samplers (:class:`agents.policies.process_policy.ProcessPolicy`): prompt ``i`` then
        draws from the stream of ``(seed, rows[i])``, as it would in the whole batch."""
        if not check_prompts(prompts, max_new_tokens):
            return []
        version = self._param_version()
        if version != self._weights_version:  # trained in place: cached keys/values are stale
            self._cache.clear()
            self._weights_version = version
            self._lean = None
        stops = set(default_stop_ids(self.tokenizer) if stop_token_ids is None else stop_token_ids)
        was_training = self.model.training
        threads = torch.get_num_threads()
        attention = self.model.config._attn_implementation
        self.model.eval()
        try:
            if self.threads:
                torch.set_num_threads(self.threads)
            if self.decode_attention and attention in ("sdpa", "eager"):
                self.model.set_attn_implementation(decode_attention.register())
            with torch.inference_mode():
                return self._generate(prompts, max_new_tokens, temperature, top_p, stops, seed, rows)
        finally:
            self.model.train(was_training)
            if self.model.config._attn_implementation != attention:
                self.model.set_attn_implementation(attention)
            if self.threads:
                torch.set_num_threads(threads)

    def _share_prefixes(self, seqs: list[np.ndarray], depth: int = 0) -> None:
        """Compute once, and cache, the prefixes that several prompts of a batch share
        (a task's system prompt and tools; the N samples of a group; ARPO branches)."""
        if len(seqs) < 2 or depth > 4 or self._cache.max_tokens == 0:
            return
        order = sorted(range(len(seqs)), key=lambda i: seqs[i].tolist())
        shared: dict[bytes, np.ndarray] = {}
        for a, b in zip(order, order[1:]):  # in sorted order a longest common prefix is a neighbour's
            n = common_prefix_len(seqs[a], seqs[b])
            for i in (a, b):
                if n - self._cache.lookup(seqs[i])[1] >= self.min_shared_prefix:
                    pre = seqs[i][:n]
                    shared[pre.tobytes()] = pre
        if not shared:
            return
        prefixes = list(shared.values())
        self._share_prefixes(prefixes, depth + 1)
        cache, mask, _, _, _ = self._prefill_batch(prefixes)
        self._keep(prefixes, [[] for _ in prefixes], cache, mask)

    def _prefill_batch(self, prompts: list[np.ndarray], extra: int = 0
                       ) -> tuple[Any, torch.Tensor, torch.Tensor, list[int], list[int]]:
        """Run the uncached part of every prompt; return (cache, mask, last logits, next positions,
        ids reused per row: they sit at columns ``[0, reused)``).
        ``extra``: room to reserve in the cache for the tokens to be sampled.

        Rows whose uncached parts differ in length run in separate forwards
        (:meth:`_prefill_groups`): one padded forward over all rows computes every row at the
        longest row's length, and a first turn's whole prompt batched with a later turn's tool
        result costs the short rows the long one's length (measured: 2.4 s for 4 rows where
        their own tokens need 0.25 s). The results land in one batch cache of the layout in the
        module docstring."""
        B = len(prompts)
        hits = [self._cache.lookup(p) for p in prompts]
        reuse = [min(n, len(p) - 1) if e is not None else 0 for (e, n), p in zip(hits, prompts)]
        C = max(reuse)
        rest = [p[c:] for p, c in zip(prompts, reuse)]
        W = max(len(r) for r in rest)
        mask = torch.zeros((B, C + W), dtype=torch.long)
        for i, (r, c) in enumerate(zip(rest, reuse)):
            mask[i, :c] = 1
            mask[i, C + W - len(r):] = 1
        n_layers = self.model.config.get_text_config().num_hidden_layers
        cache = _growing_cache(n_layers, C + W + extra)
        keys: list[torch.Tensor] = []
        values: list[torch.Tensor] = []
        logits: torch.Tensor | None = None
        groups = self._prefill_groups(rest, reuse)
        for rows in groups:
            g_hits = [hits[i] for i in rows]
            g_cache, g_logits = self._prefill_group([rest[i] for i in rows], [reuse[i] for i in rows], g_hits,
                                                    extra if len(groups) == 1 else 0)
            if len(rows) == B:  # one group (rows in batch order): its cache is the batch's
                return g_cache, mask, g_logits, [len(p) for p in prompts], reuse
            if logits is None:  # the batch cache's buffers, written in place by every group below
                logits = g_logits.new_empty((B, g_logits.shape[-1]))
                for layer, batch_layer in zip(g_cache.layers, cache.layers):
                    k = layer.keys
                    zero = k.new_zeros((B, k.shape[1], C + W, k.shape[3]))
                    batch_layer.update(zero, zero)  # copies into the layer's own key and value buffers
                    keys.append(batch_layer.keys)
                    values.append(batch_layer.values)
            idx = torch.tensor(rows, dtype=torch.long, device=g_logits.device)
            logits[idx] = g_logits
            gw = g_cache.layers[0].keys.shape[2]  # the group's own (Cg + Wg) columns
            for li, layer in enumerate(g_cache.layers):
                for n, i in enumerate(rows):
                    c, w = reuse[i], len(rest[i])
                    keys[li][i, :, :c] = layer.keys[n, :, :c]
                    values[li][i, :, :c] = layer.values[n, :, :c]
                    keys[li][i, :, C + W - w:] = layer.keys[n, :, gw - w:]
                    values[li][i, :, C + W - w:] = layer.values[n, :, gw - w:]
        assert logits is not None
        return cache, mask, logits, [len(p) for p in prompts], reuse

    def _prefill_groups(self, rest: list[np.ndarray], reuse: list[int]) -> list[list[int]]:
        """Rows in groups that one padded forward each computes with little waste: by the
        length of their uncached part, longest first; a row joins the current group while the
        group's padded work (rows x longest part, each position's linear layers and attention
        over the group's widest cache) stays within 1.25x its rows' own work plus what one more
        forward costs (taken as 32 positions)."""
        cfg = self.model.config.get_text_config()
        head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads
        # a position's linear layers in units of one attended column (4 x layers x heads x head_dim FLOPs)
        lin = self._linear_params / (2 * cfg.num_hidden_layers * cfg.num_attention_heads * head_dim)
        order = sorted(range(len(rest)), key=lambda i: (-len(rest[i]), -reuse[i]))
        groups: list[list[int]] = []
        own = padded_w = cmax = 0.0
        for i in order:
            w, c = len(rest[i]), reuse[i]
            mine = w * (lin + c + w / 2)
            if groups:
                g = groups[-1]
                padded = (len(g) + 1) * padded_w * (lin + max(cmax, c) + padded_w / 2)
                if padded <= 1.25 * (own + mine) + 32 * (lin + cmax):
                    g.append(i)
                    own += mine
                    cmax = max(cmax, c)
                    continue
            groups.append([i])
            own, padded_w, cmax = mine, w, c
        return [sorted(g) for g in groups]  # batch order within a group: one group is the batch as given

    def _prefill_group(self, rest: list[np.ndarray], reuse: list[int], hits: list[Any], extra: int = 0
                       ) -> tuple[Any, torch.Tensor]:
        """One padded forward over ``rest`` (each row after its ``reuse`` cached ids); returns the
        group's cache (layout: reused prefix at ``[0, c)``, padding, the rest right-aligned; room
        for ``extra`` more columns) and each row's last logits."""
        B = len(rest)
        C = max(reuse)
        W = max(len(r) for r in rest)
        dev = self.device
        ids = torch.full((B, W), self.pad_id, dtype=torch.long)
        pos = torch.zeros((B, W), dtype=torch.long)
        mask = torch.zeros((B, C + W), dtype=torch.long)
        for i, (r, c) in enumerate(zip(rest, reuse)):
            ids[i, W - len(r):] = torch.from_numpy(r)
            pos[i, W - len(r):] = torch.arange(c, c + len(r))
            mask[i, :c] = 1
            mask[i, C + W - len(r):] = 1
        cache = _growing_cache(self.model.config.get_text_config().num_hidden_layers, C + W + extra)
        if C > 0:
            ref = next(e for (e, _), c in zip(hits, reuse) if c > 0).kv
            for li, (k0, _) in enumerate(ref):
                k = torch.zeros((B, k0.shape[0], C, k0.shape[2]), dtype=k0.dtype, device=dev)
                v = torch.zeros_like(k)
                for i, ((e, _), c) in enumerate(zip(hits, reuse)):
                    if c:
                        k[i, :, :c] = e.kv[li][0][:, :c]
                        v[i, :, :c] = e.kv[li][1][:, :c]
                cache.layers[li].update(k, v)
        self._prefill += sum(len(r) for r in rest)
        self.positions_computed += sum(len(r) for r in rest)
        self.keys_attended += sum(len(r) * c + len(r) * (len(r) + 1) // 2 for r, c in zip(rest, reuse))
        self.prefix_tokens_reused += sum(reuse)
        out = self.model(input_ids=ids.to(dev), attention_mask=mask.to(dev), position_ids=pos.to(dev),
                         past_key_values=cache, use_cache=True, logits_to_keep=1)
        return out.past_key_values, out.logits[:, -1, :]

    def _generate(self, prompts: list[list[int]], max_new: int, temperature: float, top_p: float,
                  stops: set[int], seed: int | None, rows: Sequence[int] | None = None) -> list[Generation]:
        B = len(prompts)
        if rows is not None and len(rows) != B:
            raise ValueError(f"rows: {len(rows)} row indices for {B} prompts")
        # rows sorted by their ids, so that prompts sharing a prefix are neighbours (decode_attention
        # reads a shared prefix once per run of rows); results go back in the caller's order
        given = [np.asarray(p, dtype=np.int64) for p in prompts]
        order = decode_attention.sort_rows(given)
        arrs = [given[i] for i in order]
        self._share_prefixes(arrs)
        cache, mask, logits, next_pos, reused = self._prefill_batch(arrs, extra=max_new)
        dev = self.device
        plan = decode_attention.plan_batch(arrs, reused, mask) \
            if self.model.config._attn_implementation == decode_attention.NAME else None
        lean = self._lean_decoder() if plan is not None else None
        gens = None
        if seed is not None:  # row i of the caller draws from its own generator, wherever it sits in the batch
            stream = list(range(B)) if rows is None else [int(r) for r in rows]
            gens = [torch.Generator(device=dev).manual_seed((int(seed) * 1_000_003 + stream[i]) % (2**63))
                    for i in order]
        out_ids: list[list[int]] = [[] for _ in range(B)]
        out_lp: list[list[float]] = [[] for _ in range(B)]
        out_ent: list[list[float]] = [[] for _ in range(B)]
        finish = ["length"] * B
        live = list(range(B))  # the row of arrs each batch row holds: finished rows leave the batch
        active = [True] * B  # per batch row
        for step in range(max_new):
            logp, ent = sampling_stats(logits[:, : self.vocab_size], temperature, top_p)
            if temperature <= 0:
                tok = logp.argmax(dim=-1)
            else:
                tok = sample_ids(logp, gens)
            lp = logp.gather(1, tok[:, None]).squeeze(1).tolist()
            ent_l = ent.tolist()
            tok_l = tok.tolist()
            for j, i in enumerate(live):
                if not active[j]:
                    continue
                out_ids[i].append(tok_l[j])
                out_lp[i].append(lp[j])
                out_ent[i].append(ent_l[j])
                if tok_l[j] in stops:
                    active[j] = False
                    finish[i] = "stop"
            if not any(active) or step == max_new - 1:
                break
            done = [j for j, a in enumerate(active) if not a]
            if len(done) * 4 >= len(live):  # a quarter of the batch is finished: they leave it
                self._keep([arrs[live[j]] for j in done], [out_ids[live[j]] for j in done], cache, mask, done)
                keep = [j for j, a in enumerate(active) if a]
                cache, mask = _keep_rows(cache, keep), mask[keep]
                next_pos = [next_pos[j] for j in keep]
                if gens is not None:
                    gens = [gens[j] for j in keep]
                tok_l = [tok_l[j] for j in keep]
                live, active = [live[j] for j in keep], [True] * len(keep)
                if plan is not None:
                    plan = decode_attention.plan_batch([arrs[i] for i in live], [reused[i] for i in live], mask)
            # feed the sampled ids; finished rows still in the batch feed padding that nothing attends to
            col = torch.tensor([[1 if a else 0] for a in active], dtype=torch.long)
            mask = torch.cat([mask, col], dim=1)
            pos = torch.tensor([[p] for p in next_pos], dtype=torch.long)
            self.positions_computed += sum(active)
            self.keys_attended += sum(n + 1 for n, a in zip(next_pos, active) if a)
            next_pos = [n + 1 if a else n for n, a in zip(next_pos, active)]
            feed = torch.tensor([[t if a else self.pad_id] for t, a in zip(tok_l, active)], dtype=torch.long)
            if lean is not None:
                logits = lean.step(feed[:, 0].to(dev), pos[:, 0].to(dev), cache, mask.to(dev), plan)
                continue
            extra = {"ef_plan": plan} if plan is not None else {}  # only decode_attention reads it
            out = self.model(input_ids=feed.to(dev), attention_mask=mask.to(dev), position_ids=pos.to(dev),
                             past_key_values=cache, use_cache=True, logits_to_keep=1, **extra)
            cache = out.past_key_values
            logits = out.logits[:, -1, :]
        self._keep([arrs[i] for i in live], [out_ids[i] for i in live], cache, mask)
        gens_out: list[Generation | None] = [None] * B
        for row, i in enumerate(order):
            gens_out[i] = Generation(out_ids[row], out_lp[row], out_ent[row], finish[row])
        return gens_out  # type: ignore[return-value]

    def _keep(self, prompts: list[np.ndarray], sampled: list[list[int]], cache: Any, mask: torch.Tensor,
              rows: list[int] | None = None) -> None:
        """Store each row's keys/values (prompt + every sampled id that was fed); ``rows``: the
        batch row of each prompt (default: the i-th)."""
        if self._cache.max_tokens == 0:
            return
        layers = [(layer.keys, layer.values) for layer in cache.layers]
        for n, (p, s) in enumerate(zip(prompts, sampled)):
            i = n if rows is None else rows[n]
            cols = torch.nonzero(mask[i], as_tuple=True)[0].to(self.device)
            ids = np.concatenate([p, np.asarray(s[:-1], dtype=np.int64)]) if s else p
            if len(cols) != len(ids):  # an invariant of the layout; never store a misaligned cache
                raise RuntimeError(f"HFPolicy cache layout error: {len(cols)} kept slots for {len(ids)} ids")
            kv = [(k[i].index_select(1, cols), v[i].index_select(1, cols)) for k, v in layers]
            self._cache.add(ids, kv)


def smol_policy(device: str | None = None, tools: str = "json", **kw: Any) -> HFPolicy:
    """SmolLM2-135M-Instruct as an :class:`HFPolicy` (converted on first use).

    Args:
        device: ``"cpu"``, ``"cuda"``, ...; default: CUDA when available.
        tools: How prompts show tools (:func:`smol_model_path`).
        **kw: Passed on to :class:`HFPolicy` (``threads``, ``dtype``, ...).
    """
    from agents.models.smol import smol_model_path

    return HFPolicy(smol_model_path(tools=tools), device=device, **kw)
