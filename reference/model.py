"""Qwen3ForCausalLM math in plain torch.

One decoder layer, for a flat batch of ``T`` tokens at absolute ``positions``::

    h   = x + o_proj(attention(rope(q_norm(q_proj(n))), rope(k_norm(k_proj(n))), v_proj(n)))   n = input_layernorm(x)
    out = h + down_proj(silu(gate_proj(m)) * up_proj(m))                                          m = post_attention_layernorm(h)

The attention itself is a callback (``attend``): the engine decides whether it is a paged
prefill, a split-KV decode, or the dense causal attention of the no-cache oracle.
"""

from __future__ import annotations

from typing import Callable

import torch

from .config import ModelConfig
from .rope import apply_rope, rope_cos_sin
from .weights import check_weights

#: attend(layer, q [T, n_q, D], k [T, n_kv, D], v [T, n_kv, D]) -> o [T, n_q, D]
Attend = Callable[[int, torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor]


def linear(x: torch.Tensor, w: torch.Tensor, batch_invariant: bool = False) -> torch.Tensor:
    """``x [T, in] @ w[out, in].T``. Batch-invariant: one vector-matrix product per row, so a row's
    result never depends on how many rows share the call (a BLAS may block a matrix product by ``T``)."""
    if not batch_invariant or x.shape[0] == 0:
        return x @ w.T
    return torch.stack([w @ x[t] for t in range(x.shape[0])])


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """Hugging Face's Qwen3RMSNorm: normalise in float32, round to the input dtype, scale."""
    x32 = x.float()
    x32 = x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + eps)
    return weight * x32.to(x.dtype)


class Qwen3Model:
    """The weights and the forward math. No cache: attention comes from the ``attend`` callback."""

    def __init__(self, cfg: ModelConfig, weights: dict[str, torch.Tensor], dtype: torch.dtype = torch.float32,
                 batch_invariant: bool = False, rope_in_attention: bool = False, device: str = "cpu") -> None:
        check_weights(cfg, weights)
        self.cfg = cfg
        self.dtype = dtype
        self.batch_invariant = batch_invariant
        self.rope_in_attention = rope_in_attention   # attend() gets pre-RoPE keys and rotates them itself
        self.device = torch.device(device)   # the engine runs on the CPU; the oracles may run the same math on a GPU
        self.w = {k: v.detach().to(device=self.device, dtype=dtype).contiguous() for k, v in weights.items()}
        if cfg.tie_word_embeddings:
            self.w["lm_head.weight"] = self.w["model.embed_tokens.weight"]

    def layer_weight(self, i: int, name: str) -> torch.Tensor:
        return self.w[f"model.layers.{i}.{name}.weight"]

    def proj(self, x: torch.Tensor, i: int, name: str) -> torch.Tensor:
        """``x @ W.T`` for layer ``i``'s projection ``name``."""
        return linear(x, self.layer_weight(i, name), self.batch_invariant)

    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor, attend: Attend) -> torch.Tensor:
        """``input_ids, positions [T]`` -> final-normed hidden states ``[T, H]``."""
        cfg = self.cfg
        T = input_ids.shape[0]
        nq, nkv, D = cfg.num_attention_heads, cfg.num_key_value_heads, cfg.head_dim
        cos, sin = rope_cos_sin(positions, D, cfg.rope_theta)            # [T, D]
        x = self.w["model.embed_tokens.weight"][input_ids]                # [T, H]
        for i in range(cfg.num_hidden_layers):
            n = rms_norm(x, self.layer_weight(i, "input_layernorm"), cfg.rms_norm_eps)              # [T, H]
            q = self.proj(n, i, "self_attn.q_proj").view(T, nq, D)                                  # [T, n_q, D]
            k = self.proj(n, i, "self_attn.k_proj").view(T, nkv, D)                                 # [T, n_kv, D]
            v = self.proj(n, i, "self_attn.v_proj").view(T, nkv, D)                                 # [T, n_kv, D]
            q = apply_rope(rms_norm(q, self.layer_weight(i, "self_attn.q_norm"), cfg.rms_norm_eps), cos, sin)
            k = rms_norm(k, self.layer_weight(i, "self_attn.k_norm"), cfg.rms_norm_eps)
            if not self.rope_in_attention:
                k = apply_rope(k, cos, sin)
            o = attend(i, q, k, v).reshape(T, nq * D)                                               # [T, n_q*D]
            x = x + self.proj(o, i, "self_attn.o_proj")                                             # [T, H]
            m = rms_norm(x, self.layer_weight(i, "post_attention_layernorm"), cfg.rms_norm_eps)     # [T, H]
            gate = self.proj(m, i, "mlp.gate_proj")                                                 # [T, I]
            up = self.proj(m, i, "mlp.up_proj")                                                     # [T, I]
            x = x + self.proj(torch.nn.functional.silu(gate) * up, i, "mlp.down_proj")              # [T, H]
        return rms_norm(x, self.w["model.norm.weight"], cfg.rms_norm_eps)

    def logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """``[T, H]`` -> float32 ``[T, V]``."""
        return linear(hidden, self.w["lm_head.weight"], self.batch_invariant).float()
