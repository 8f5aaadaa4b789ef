"""Tensor-parallel (TP) Qwen3: the math of ``reference/model.py`` on one shard of the weights.

A TP rank ``r`` of ``tp`` holds (Megatron-style):

* column-parallel (output rows): ``q_proj`` (query heads ``r*n_q/tp ..``), ``k_proj``/``v_proj``
  (KV heads ``r*n_kv/tp ..``), ``gate_proj``/``up_proj`` (``I/tp`` rows). Query head ``h`` of the
  shard still reads KV head ``h // group`` of the shard, because ``n_q/tp = group * n_kv/tp``.
* row-parallel (input columns): ``o_proj`` and ``down_proj``; their partial products are summed
  with an all-reduce over the TP group (in float32, rounded once to the compute dtype).
* vocab-parallel: embedding and LM head rows ``[r*Vp, (r+1)*Vp)`` with ``Vp = ceil(V/tp)``.
  The embedding zeroes ids outside the shard and all-reduces (exact: one non-zero term);
  the LM head's logits shards are all-gathered and concatenated.
* replicated: the RMSNorm weights (``q_norm``/``k_norm`` act per head, so they shard trivially).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.distributed as dist

from .config import ModelConfig
from .errors import ConfigError
from .model import Attend, linear, rms_norm
from .rope import apply_rope, rope_cos_sin
from .weights import check_weights


@dataclass(slots=True)
class TPShard:
    """Which slice of each sharded dimension TP rank ``rank`` of ``tp`` holds."""

    tp: int
    rank: int
    n_q: int              # query heads of this rank
    n_kv: int             # KV heads of this rank
    inter: int            # MLP width of this rank
    vocab_start: int
    vocab_end: int
    vocab_per_rank: int   # ceil(V / tp): the padded shard height all ranks gather

    @staticmethod
    def of(cfg: ModelConfig, tp: int, rank: int) -> "TPShard":
        for what, n in (("num_attention_heads", cfg.num_attention_heads),
                        ("num_key_value_heads", cfg.num_key_value_heads),
                        ("intermediate_size", cfg.intermediate_size)):
            if n % tp:
                raise ConfigError(f"tensor parallel size {tp} must divide {what} ({n})")
        if not 0 <= rank < tp:
            raise ConfigError(f"TP rank {rank} outside [0, {tp})")
        vp = -(-cfg.vocab_size // tp)
        start = min(rank * vp, cfg.vocab_size)
        return TPShard(tp, rank, cfg.num_attention_heads // tp, cfg.num_key_value_heads // tp,
                       cfg.intermediate_size // tp, start, min(start + vp, cfg.vocab_size), vp)


def shard_weights(cfg: ModelConfig, weights: dict[str, torch.Tensor], s: TPShard) -> dict[str, torch.Tensor]:
    """This rank's slices of the full (Hugging Face named) weights."""
    check_weights(cfg, weights)
    D = cfg.head_dim
    rows = lambda w, n, r: w[r * n:(r + 1) * n]                           # noqa: E731  output rows
    cols = lambda w, n, r: w[:, r * n:(r + 1) * n]                        # noqa: E731  input columns
    out: dict[str, torch.Tensor] = {"model.norm.weight": weights["model.norm.weight"]}
    emb = weights["model.embed_tokens.weight"]
    head = emb if cfg.tie_word_embeddings else weights["lm_head.weight"]
    out["model.embed_tokens.weight"] = emb[s.vocab_start:s.vocab_end]                       # [Vr, H]
    pad = torch.zeros(s.vocab_per_rank - (s.vocab_end - s.vocab_start), head.shape[1], dtype=head.dtype)
    out["lm_head.weight"] = torch.cat([head[s.vocab_start:s.vocab_end], pad])              # [Vp, H]
    for i in range(cfg.num_hidden_layers):
        p = f"model.layers.{i}."
        w = lambda n, p=p: weights[p + n + ".weight"]                     # noqa: E731
        out |= {
            p + "input_layernorm.weight": w("input_layernorm"),
            p + "post_attention_layernorm.weight": w("post_attention_layernorm"),
            p + "self_attn.q_norm.weight": w("self_attn.q_norm"),
            p + "self_attn.k_norm.weight": w("self_attn.k_norm"),
            p + "self_attn.q_proj.weight": rows(w("self_attn.q_proj"), s.n_q * D, s.rank),     # [n_q/tp*D, H]
            p + "self_attn.k_proj.weight": rows(w("self_attn.k_proj"), s.n_kv * D, s.rank),    # [n_kv/tp*D, H]
            p + "self_attn.v_proj.weight": rows(w("self_attn.v_proj"), s.n_kv * D, s.rank),    # [n_kv/tp*D, H]
            p + "self_attn.o_proj.weight": cols(w("self_attn.o_proj"), s.n_q * D, s.rank),     # [H, n_q/tp*D]
            p + "mlp.gate_proj.weight": rows(w("mlp.gate_proj"), s.inter, s.rank),             # [I/tp, H]
            p + "mlp.up_proj.weight": rows(w("mlp.up_proj"), s.inter, s.rank),                 # [I/tp, H]
            p + "mlp.down_proj.weight": cols(w("mlp.down_proj"), s.inter, s.rank),             # [H, I/tp]
        }
    return out


def tp_all_reduce(x: torch.Tensor, tp: int, group, comm_device: torch.device) -> torch.Tensor:
    """Sum of every TP rank's ``x``, accumulated in float32, rounded once to ``x``'s dtype (both engines)."""
    if tp == 1:
        return x
    y = x.float().to(comm_device)
    dist.all_reduce(y, op=dist.ReduceOp.SUM, group=group)
    return y.to(device=x.device, dtype=x.dtype)


def tp_all_gather_vocab(x: torch.Tensor, tp: int, vocab: int, group, comm_device: torch.device) -> torch.Tensor:
    """``[T, Vp]`` vocabulary shards of every TP rank -> ``[T, V]`` in vocabulary order (both engines)."""
    if tp == 1:
        return x[:, :vocab]
    y = x.contiguous().to(comm_device)
    parts = [torch.empty_like(y) for _ in range(tp)]
    dist.all_gather(parts, y, group=group)
    return torch.cat(parts, dim=-1)[:, :vocab].to(x.device)


class ShardedQwen3:
    """One TP rank's shard of the model; every collective runs over ``group`` (``None`` when ``tp == 1``)."""

    def __init__(self, cfg: ModelConfig, weights: dict[str, torch.Tensor], shard: TPShard, group=None,
                 dtype: torch.dtype = torch.float32, batch_invariant: bool = False,
                 rope_in_attention: bool = False, comm_device: torch.device | str = "cpu") -> None:
        self.cfg = cfg
        self.shard = shard
        self.group = group
        self.dtype = dtype
        self.batch_invariant = batch_invariant
        self.rope_in_attention = rope_in_attention
        self.comm_device = torch.device(comm_device)
        self.w = {k: v.detach().to(device="cpu", dtype=dtype).contiguous()
                  for k, v in shard_weights(cfg, weights, shard).items()}

    def with_weights(self, weights: dict[str, torch.Tensor]) -> "ShardedQwen3":
        """The same shard of new full weights (``update_weights``)."""
        return ShardedQwen3(self.cfg, weights, self.shard, self.group, self.dtype, self.batch_invariant,
                            self.rope_in_attention, self.comm_device)

    # ---------------------------------------------------------------- collectives
    def all_reduce(self, x: torch.Tensor) -> torch.Tensor:
        return tp_all_reduce(x, self.shard.tp, self.group, self.comm_device)

    def all_gather_vocab(self, x: torch.Tensor) -> torch.Tensor:
        return tp_all_gather_vocab(x, self.shard.tp, self.cfg.vocab_size, self.group, self.comm_device)

    # ---------------------------------------------------------------- math
    def proj(self, x: torch.Tensor, i: int, name: str) -> torch.Tensor:
        return linear(x, self.w[f"model.layers.{i}.{name}.weight"], self.batch_invariant)

    def embed(self, ids: torch.Tensor) -> torch.Tensor:
        """Vocab-parallel embedding: ``ids [T]`` -> ``[T, H]``."""
        s = self.shard
        local = ids - s.vocab_start                                       # [T]
        inside = (local >= 0) & (local < s.vocab_end - s.vocab_start)     # [T]
        table = self.w["model.embed_tokens.weight"]                       # [Vr, H]
        if table.shape[0] == 0:
            return self.all_reduce(torch.zeros(ids.shape[0], self.cfg.hidden_size, dtype=self.dtype))
        rows = table[torch.where(inside, local, 0)]                       # [T, H]
        return self.all_reduce(torch.where(inside[:, None], rows, 0.0).to(self.dtype))

    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor, attend: Attend) -> torch.Tensor:
        """``input_ids, positions [T]`` -> final-normed hidden states ``[T, H]`` (replicated on every TP rank).
        ``attend(layer, q [T, n_q/tp, D], k, v [T, n_kv/tp, D]) -> [T, n_q/tp, D]``."""
        cfg, w, eps = self.cfg, self.w, self.cfg.rms_norm_eps
        T = input_ids.shape[0]
        nq, nkv, D = self.shard.n_q, self.shard.n_kv, cfg.head_dim
        cos, sin = rope_cos_sin(positions, D, cfg.rope_theta)            # [T, D]
        x = self.embed(input_ids)                                         # [T, H]
        for i in range(cfg.num_hidden_layers):
            p = f"model.layers.{i}."
            n = rms_norm(x, w[p + "input_layernorm.weight"], eps)                                  # [T, H]
            q = self.proj(n, i, "self_attn.q_proj").view(T, nq, D)                                 # [T, n_q/tp, D]
            k = self.proj(n, i, "self_attn.k_proj").view(T, nkv, D)                                # [T, n_kv/tp, D]
            v = self.proj(n, i, "self_attn.v_proj").view(T, nkv, D)                                # [T, n_kv/tp, D]
            q = apply_rope(rms_norm(q, w[p + "self_attn.q_norm.weight"], eps), cos, sin)
            k = rms_norm(k, w[p + "self_attn.k_norm.weight"], eps)
            if not self.rope_in_attention:
                k = apply_rope(k, cos, sin)
            o = attend(i, q, k, v).reshape(T, nq * D)                                              # [T, n_q/tp*D]
            x = x + self.all_reduce(self.proj(o, i, "self_attn.o_proj"))                           # [T, H]
            m = rms_norm(x, w[p + "post_attention_layernorm.weight"], eps)                         # [T, H]
            a = torch.nn.functional.silu(self.proj(m, i, "mlp.gate_proj")) * self.proj(m, i, "mlp.up_proj")  # [T, I/tp]
            x = x + self.all_reduce(self.proj(a, i, "mlp.down_proj"))                              # [T, H]
        return rms_norm(x, w["model.norm.weight"], eps)

    def logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """Vocab-parallel LM head: ``[T, H]`` -> float32 ``[T, V]`` (every TP rank gets all of it)."""
        return self.all_gather_vocab(linear(hidden, self.w["lm_head.weight"], self.batch_invariant).float())
