"""One-token decoding steps of a Llama-family model without transformers' module stack.

:class:`~agents.policies.hf_policy.HFPolicy` samples one token per row per step. At the tiny
model's size, transformers' forward spends more time in Python (a module call, a mask
and a shape check per sub-layer) and in ``F.linear`` than in arithmetic: measured here
at 16 rows, one step's 29 ``F.linear`` calls took 3.4 ms at one row where the same
products on pre-transposed weights take 2.4 ms, and the forward around them another
4-7 ms. :class:`LeanDecoder` runs the same arithmetic for Qwen2 and Llama checkpoints
(the tiny default model, SmolLM2) with the projections fused (q/k/v in one product,
gate/up in one), weights transposed once, the rotary angles computed once per step
for every layer, and :mod:`agents.policies.decode.decode_attention` reading the cache.

It reads the model's own rotary embedding module, so every RoPE variant the model
supports is computed as transformers does; it refuses (``supports`` is False) what it
does not reproduce exactly: other architectures, sliding-window layers, biased MLPs or
output projections (Llama's ``attention_bias``), adapters wrapped around the linear layers
(PEFT), activations other than SiLU.
Prefill (many positions per row) and training always run the model's own forward.

Its fused weights are copies (for SmolLM2 in float32, about 0.5 GB more): ``HFPolicy``
builds a new decoder whenever the parameters' version counters show an in-place update (a
training step, ``load_state_dict``) and after ``clear_cache()``; :meth:`LeanDecoder.refresh`
rebuilds them for a caller that holds one.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from agents.policies.decode import decode_attention

__all__ = ["LeanDecoder", "supports"]

_ARCHS = {"Qwen2ForCausalLM", "LlamaForCausalLM"}


def supports(model: Any) -> bool:
    """Whether :class:`LeanDecoder` computes exactly what ``model``'s forward does."""
    if type(model).__name__ not in _ARCHS:
        return False
    cfg = model.config
    if getattr(cfg, "hidden_act", None) != "silu" or getattr(cfg, "mlp_bias", False):
        return False
    if getattr(cfg, "pretraining_tp", 1) not in (None, 1):
        return False
    if any(t != "full_attention" for t in (getattr(cfg, "layer_types", None) or [])):
        return False
    for layer in model.model.layers:
        att, mlp = layer.self_attn, layer.mlp
        mods = (att.q_proj, att.k_proj, att.v_proj, att.o_proj, mlp.gate_proj, mlp.up_proj, mlp.down_proj)
        if any(type(m) is not torch.nn.Linear for m in mods):  # LoRA or quantised wrappers
            return False
        if any(m.bias is not None for m in mods[3:]):  # o_proj (Llama's attention_bias) or the MLP's
            return False
        if len({m.bias is None for m in mods[:3]}) != 1:  # q/k/v biases: all or none
            return False
        if getattr(att, "sliding_window", None):
            return False
    return type(model.lm_head) is torch.nn.Linear and model.lm_head.bias is None


@dataclass
class _Layer:
    qkv: torch.Tensor  # (hidden, q + k + v), transposed and fused
    qkv_bias: torch.Tensor | None
    o: torch.Tensor  # (q, hidden)
    gate_up: torch.Tensor  # (hidden, 2 x intermediate)
    down: torch.Tensor  # (intermediate, hidden)
    norm_in: torch.Tensor
    norm_post: torch.Tensor


class LeanDecoder:
    """Decode steps of ``model`` (see the module docstring); call :meth:`refresh` after the
    weights change."""

    def __init__(self, model: Any) -> None:
        if not supports(model):
            raise ValueError(f"LeanDecoder does not support {type(model).__name__} with this configuration")
        self.model = model
        cfg = model.config
        self.heads = cfg.num_attention_heads
        self.kv_heads = cfg.num_key_value_heads
        self.head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads
        self.eps = float(cfg.rms_norm_eps)
        self.inter = cfg.intermediate_size
        self.scaling = self.head_dim ** -0.5
        self.refresh()

    @torch.no_grad()
    def refresh(self) -> None:
        """(Re)build the fused, transposed copies of the weights."""
        m = self.model.model
        layers = []
        for layer in m.layers:
            att, mlp = layer.self_attn, layer.mlp
            bias = None
            if att.q_proj.bias is not None:
                bias = torch.cat([att.q_proj.bias, att.k_proj.bias, att.v_proj.bias]).detach().clone()
            layers.append(_Layer(
                qkv=torch.cat([att.q_proj.weight, att.k_proj.weight, att.v_proj.weight]).t().contiguous(),
                qkv_bias=bias,
                o=att.o_proj.weight.t().contiguous(),
                gate_up=torch.cat([mlp.gate_proj.weight, mlp.up_proj.weight]).t().contiguous(),
                down=mlp.down_proj.weight.t().contiguous(),
                norm_in=layer.input_layernorm.weight.detach().clone(),
                norm_post=layer.post_attention_layernorm.weight.detach().clone()))
        self.layers = layers
        self.norm = m.norm.weight.detach().clone()
        self.head = self.model.lm_head.weight.t().contiguous()
        self.embed = m.embed_tokens.weight

    def _rms(self, x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
        h = x.float()
        h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + self.eps)
        return w * h.to(x.dtype)

    @torch.inference_mode()
    def step(self, ids: torch.Tensor, positions: torch.Tensor, cache: Any, mask: torch.Tensor,
             plan: decode_attention.DecodePlan | None) -> torch.Tensor:
        """Feed one id per row (``ids``, ``positions``: (B,) long) whose keys/values are
        appended to ``cache`` (one layer per model layer, ``update(k, v)`` returning the
        whole (B, kv_heads, L, head_dim) keys and values); ``mask``: (B, L) with 1 where
        a row has a real key, the new column included. Returns the (B, vocab) logits."""
        B = ids.shape[0]
        H, Hk, D = self.heads, self.kv_heads, self.head_dim
        x = self.embed[ids]
        cos, sin = self.model.model.rotary_emb(x, positions[:, None])  # (B, 1, D), the model's own RoPE
        cos, sin = cos.reshape(B, 1, D), sin.reshape(B, 1, D)
        half = D // 2
        bias = torch.zeros((B, 1, 1, mask.shape[-1]), dtype=x.dtype, device=x.device).masked_fill(
            mask.reshape(B, 1, 1, -1) == 0, float("-inf"))  # additive, built once for every layer
        nq, nk = H * D, Hk * D
        for li, w in enumerate(self.layers):
            h = self._rms(x, w.norm_in)
            qkv = h @ w.qkv if w.qkv_bias is None else torch.addmm(w.qkv_bias, h, w.qkv)
            q = qkv[:, :nq].reshape(B, H, D)
            k = qkv[:, nq:nq + nk].reshape(B, Hk, D)
            v = qkv[:, nq + nk:].reshape(B, Hk, 1, D)
            q = q * cos + torch.cat((-q[..., half:], q[..., :half]), dim=-1) * sin
            k = k * cos + torch.cat((-k[..., half:], k[..., :half]), dim=-1) * sin
            keys, values = cache.layers[li].update(k.reshape(B, Hk, 1, D), v)
            a = decode_attention._decode(q.reshape(B, H, 1, D), keys, values, bias, self.scaling, plan)
            x = x + a.reshape(B, nq) @ w.o
            h = self._rms(x, w.norm_post)
            gu = h @ w.gate_up
            x = x + (torch.nn.functional.silu(gu[:, :self.inter]) * gu[:, self.inter:]) @ w.down
        return self._rms(x, self.norm) @ self.head
