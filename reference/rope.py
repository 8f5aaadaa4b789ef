"""Rotary position embedding, Qwen3 flavour: rotate-half, float32 cos/sin, theta from the config."""

from __future__ import annotations

import torch


def rope_cos_sin(positions: torch.Tensor, head_dim: int, theta: float) -> tuple[torch.Tensor, torch.Tensor]:
    """float32 ``cos, sin [T, D]`` for rotate-half RoPE (frequencies repeated over both halves)."""
    inv_freq = 1.0 / (theta ** (torch.arange(0, head_dim, 2, dtype=torch.int64).float() / head_dim))  # [D/2]
    inv_freq = inv_freq.to(positions.device)
    freqs = positions.float()[:, None] * inv_freq[None, :]                # [T, D/2]
    emb = torch.cat([freqs, freqs], dim=-1)                               # [T, D]
    return emb.cos(), emb.sin()


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """``x [T, n, D]``: ``x*cos + rotate_half(x)*sin`` in float32, rounded to ``x``'s dtype."""
    half = x.shape[-1] // 2
    x32 = x.float()
    rotated = torch.cat([-x32[..., half:], x32[..., :half]], dim=-1)      # [T, n, D]
    return (x32 * cos[:, None, :] + rotated * sin[:, None, :]).to(x.dtype)
