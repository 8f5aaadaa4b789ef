"""Attention problems of the kernel lab: a paged cache and its dense twin, the high- and
low-precision references, and the torch SDPA peers."""

from __future__ import annotations

import math
from contextlib import nullcontext
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from _bench import Scale


@dataclass
class PagedProblem:
    """``B`` sequences of ``ctx`` cached keys each, in pages of ``block`` tokens (shuffled unless made in order).

    ``k_cache, v_cache [num_blocks, block, n_kv, D]`` (a few extra pages hold NaN, as stale pages
    may), ``tables [B, nblk]`` int32, ``lens [B]`` int32.
    """

    k_cache: torch.Tensor
    v_cache: torch.Tensor
    tables: torch.Tensor
    lens: torch.Tensor
    ctx: int

    def dense(self) -> tuple[torch.Tensor, torch.Tensor]:
        """The same keys and values as a dense ``[B, ctx, n_kv, D]`` cache (a gather of the pages)."""
        B, nblk = self.tables.shape
        _, bs, nkv, D = self.k_cache.shape
        idx = self.tables.long()
        k = self.k_cache[idx].reshape(B, nblk * bs, nkv, D)[:, :self.ctx].contiguous()
        v = self.v_cache[idx].reshape(B, nblk * bs, nkv, D)[:, :self.ctx].contiguous()
        return k, v

    @property
    def kv_bytes(self) -> int:
        B = self.tables.shape[0]
        _, _, nkv, D = self.k_cache.shape
        return 2 * B * self.ctx * nkv * D * self.k_cache.element_size()


def paged_problem(B: int, ctx: int, n_kv: int, D: int, block: int, dtype: torch.dtype, device, gen: torch.Generator,
                  stale_pages: int = 4, in_order: bool = False) -> PagedProblem:
    """The lab's paged problem: pages in one random order over the whole cache, or, ``in_order``, every
    sequence's pages consecutive (what a fresh allocator hands out; the stale pages after them)."""
    nblk = -(-ctx // block)
    used = B * nblk
    n = used + stale_pages
    k = torch.randn(n, block, n_kv, D, device=device, dtype=torch.float32, generator=gen).to(dtype)
    v = torch.randn(n, block, n_kv, D, device=device, dtype=torch.float32, generator=gen).to(dtype)
    perm = torch.arange(n, device=device) if in_order else torch.randperm(n, device=device, generator=gen)
    pages = perm[:used]
    k[perm[used:]] = float("nan")
    v[perm[used:]] = float("nan")
    tail = nblk * block - ctx                     # slots past the last key of each sequence: stale
    tables = pages.view(B, nblk).to(torch.int32)
    if tail:
        last = tables[:, -1].long()
        k[last, block - tail:] = float("nan")
        v[last, block - tail:] = float("nan")
    lens = torch.full((B,), ctx, dtype=torch.int32, device=device)
    return PagedProblem(k, v, tables, lens, ctx)


# -------------------------------------------------------------------------------- references

def attention_math(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, q_pos: torch.Tensor | None, scale: float,
                   dtype: torch.dtype, lowp: bool, chunk_bytes: int = 1 << 30) -> torch.Tensor:
    """Dense attention ``q [B, Tq, n_q, D]`` over ``k, v [B, L, n_kv, D]`` (GQA by head groups).

    ``q_pos [Tq]`` (absolute positions, the keys at ``<= q_pos`` are visible) or ``None`` (all
    visible). ``lowp=False``: everything in ``dtype`` (float32 / float64) from the upcast inputs.
    ``lowp=True``: the low-precision reference run, as the flash-attention paper defines it:
    ``Q K^T`` and ``P V`` in the inputs' dtype, the softmax in float32, ``P`` rounded to the input
    dtype. Computed in chunks of sequences and heads to bound memory. Returns float32 ``[B, Tq, n_q, D]``.
    """
    B, Tq, nq, D = q.shape
    L, nkv = k.shape[1], k.shape[2]
    g = nq // nkv
    out = torch.empty(B, Tq, nq, D, dtype=torch.float32, device=q.device)
    per_head = max(1, 3 * g * Tq * L * 4 + 2 * L * D * 8)
    heads = max(1, min(nkv, chunk_bytes // per_head))
    mask = None
    if q_pos is not None:
        mask = torch.arange(L, device=q.device)[None, :] <= q_pos.long()[:, None]          # [Tq, L]
    cdt = q.dtype if lowp else dtype
    for b in range(B):
        for h0 in range(0, nkv, heads):
            h1 = min(nkv, h0 + heads)
            qq = q[b, :, h0 * g:h1 * g].reshape(Tq, h1 - h0, g, D).permute(1, 2, 0, 3).to(cdt)   # [h, g, Tq, D]
            kk = k[b, :, h0:h1].permute(1, 0, 2).to(cdt)                                     # [h, L, D]
            vv = v[b, :, h0:h1].permute(1, 0, 2).to(cdt)                                     # [h, L, D]
            s = torch.matmul(qq, kk[:, None].transpose(-1, -2))                              # [h, g, Tq, L]
            s = s.to(torch.float32 if lowp else dtype) * scale
            if mask is not None:
                s = s.masked_fill(~mask, float("-inf"))
            p = torch.softmax(s, dim=-1)
            o = torch.matmul(p.to(cdt), vv[:, None])                                         # [h, g, Tq, D]
            out[b, :, h0 * g:h1 * g] = o.permute(2, 0, 1, 3).reshape(Tq, (h1 - h0) * g, D).float()
    return out


def high_dtype(scale: Scale) -> torch.dtype:
    return torch.float32 if scale.gpu else torch.float64


# -------------------------------------------------------------------------------- SDPA peers

def sdpa_backend(name: str):
    from torch.nn.attention import SDPBackend, sdpa_kernel
    b = {"flash": SDPBackend.FLASH_ATTENTION, "cudnn": SDPBackend.CUDNN_ATTENTION, "math": SDPBackend.MATH,
         "efficient": SDPBackend.EFFICIENT_ATTENTION}[name]
    return sdpa_kernel(b)


def sdpa_call(backend: str, q4: torch.Tensor, k4: torch.Tensor, v4: torch.Tensor, scale: float, causal: str,
              gqa: str):
    """A closure running SDPA on ``q4 [B, n_q, Tq, D]``, ``k4, v4 [B, n_kv, L, D]``.

    ``causal``: ``none`` | ``square`` (``is_causal=True``, Tq == L) | ``lower_right`` (prefix
    problem: query ``i`` sees keys ``<= L - Tq + i``). Lower-right on the flash backend calls
    ``torch.ops.aten._scaled_dot_product_flash_attention(..., is_causal=True)`` directly (flash's
    causal mask is bottom-right aligned; ``causal_lower_right`` would silently fall back to the
    memory-efficient kernel when flash declines); other backends get a boolean mask.
    ``gqa``: ``enable_gqa`` (native GQA: SDPA's flag, or the flash op's own head broadcast) or
    ``repeat_interleave`` (K/V heads materialised ``n_q / n_kv`` times before timing).
    """
    nq, nkv = q4.shape[1], k4.shape[1]
    if gqa == "repeat_interleave" and nq != nkv:
        k4 = k4.repeat_interleave(nq // nkv, dim=1)
        v4 = v4.repeat_interleave(nq // nkv, dim=1)
    Tq, L = q4.shape[2], k4.shape[2]
    if backend == "flash" and causal == "lower_right":
        op = torch.ops.aten._scaled_dot_product_flash_attention
        return lambda: op(q4, k4, v4, 0.0, True, False, scale=scale)[0]
    kw = {"scale": scale}
    if gqa == "enable_gqa" and nq != k4.shape[1]:
        kw["enable_gqa"] = True
    if causal == "square":
        kw["is_causal"] = True
    elif causal == "lower_right":
        kw["attn_mask"] = (torch.arange(L, device=q4.device)[None, :]
                           <= (L - Tq + torch.arange(Tq, device=q4.device))[:, None])

    def run():
        with sdpa_backend(backend) if backend else nullcontext():
            return F.scaled_dot_product_attention(q4, k4, v4, **kw)

    return run


def gqa_modes(nq: int, nkv: int, repeat_bytes: int, limit: int = 16 << 30) -> list[str]:
    """The GQA modes to try, in order (repeat_interleave only when its copy fits in ``limit``)."""
    modes = ["enable_gqa"]
    if nq != nkv and repeat_bytes <= limit:
        modes.append("repeat_interleave")
    return modes


def tflops(flops: float, ms: float) -> float:
    return flops / (ms / 1e3) / 1e12 if ms > 0 else math.nan
