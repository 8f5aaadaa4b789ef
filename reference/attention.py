"""Attention over the paged KV cache: the kernel math of DESIGN §3, in plain torch.

Layout (shared with ``optimized/kernels/attention.cu``):

* ``k_cache``, ``v_cache``: ``[num_blocks, block_size, n_kv, D]``; token ``p`` of a sequence
  lives in page ``block_table[p // block_size]`` at slot ``p % block_size``.
* ``block_tables``: int ``[B, max_blocks]``; entries past a sequence's last block are ``-1``.
* ``seq_lens``: int ``[B]``, tokens of each sequence whose K/V are in the cache.
* Query heads ``h`` read KV head ``h // (n_q // n_kv)`` (GQA).

Every softmax runs in float32. Positions past ``seq_lens`` (or past a query's own position)
are *selected away* with ``torch.where``, never multiplied by a zero probability: stale
pages may hold NaN, and ``0 * NaN = NaN``.
"""

from __future__ import annotations

import numbers
from dataclasses import dataclass

import torch

from .errors import BlockTableError, MergeError
from .rope import apply_rope, rope_cos_sin

NEG_INF = float("-inf")


# --------------------------------------------------------------------------------------
# guards
# --------------------------------------------------------------------------------------

def check_block_tables(block_tables: torch.Tensor, seq_lens: torch.Tensor, num_blocks: int, block_size: int) -> None:
    """Reject a malformed table before any launch (typed ``BlockTableError``).

    * every sequence length is ``>= 0`` and its table has ``ceil(len / block_size)`` leading valid entries;
    * every valid entry is a physical page id in ``[0, num_blocks)``; entries past them are ``-1``;
    * no page appears twice in one sequence's table. (Several sequences may read one page: group
      prefix sharing. Writes are checked separately: no two rows of a step write one slot.)
    """
    if block_tables.dim() != 2 or seq_lens.dim() != 1 or block_tables.shape[0] != seq_lens.shape[0]:
        raise BlockTableError(f"block_tables {tuple(block_tables.shape)} and seq_lens {tuple(seq_lens.shape)} disagree")
    for b in range(block_tables.shape[0]):
        seen: set[int] = set()
        n = int(seq_lens[b])
        if n < 0:
            raise BlockTableError(f"sequence {b}: negative length {n}")
        need = (n + block_size - 1) // block_size
        row = [int(x) for x in block_tables[b]]
        if need > len(row):
            raise BlockTableError(f"sequence {b}: length {n} needs {need} blocks, table has {len(row)} columns")
        for j, page in enumerate(row):
            if j < need:
                if not (0 <= page < num_blocks):
                    raise BlockTableError(f"sequence {b}: block {j} -> page {page} outside [0, {num_blocks})")
                if page in seen:
                    raise BlockTableError(f"sequence {b}: page {page} appears twice in its table")
                seen.add(page)
            elif page != -1:
                raise BlockTableError(f"sequence {b}: entry {j} = {page} past the sequence's {need} blocks must be -1")


def check_query_positions(q_seq_idx: torch.Tensor, q_pos: torch.Tensor, seq_lens: torch.Tensor) -> None:
    """Each real query row claims a cache position its sequence already holds: ``0 <= pos < seq_len``."""
    if q_seq_idx.shape != q_pos.shape or q_pos.dim() != 1:
        raise BlockTableError(f"q_seq_idx {tuple(q_seq_idx.shape)} and q_pos {tuple(q_pos.shape)} disagree")
    for t in range(q_pos.shape[0]):
        p = int(q_pos[t])
        if p < 0:
            continue  # padding row
        b = int(q_seq_idx[t])
        if not (0 <= b < seq_lens.shape[0]):
            raise BlockTableError(f"query {t}: sequence index {b} out of range")
        if p >= int(seq_lens[b]):
            raise BlockTableError(f"query {t}: position {p} is not in the cache (sequence {b} holds {int(seq_lens[b])})")


# --------------------------------------------------------------------------------------
# gathering a sequence's keys and values out of its pages
# --------------------------------------------------------------------------------------

def gather_pages(cache: torch.Tensor, table_row: torch.Tensor, start: int, end: int) -> torch.Tensor:
    """Token rows ``[start, end)`` of one sequence: ``[end - start, n_kv, D]``, read page by page."""
    block_size = cache.shape[1]
    pos = torch.arange(start, end)                                        # [L]
    pages = table_row[pos // block_size].long()                           # [L]
    return cache[pages, pos % block_size]                                 # [L, n_kv, D]


def gather_keys(cache: torch.Tensor, table_row: torch.Tensor, start: int, end: int,
                rope_theta: float | None = None) -> torch.Tensor:
    """Keys ``[start, end)`` of one sequence, ``[L, n_kv, D]``. With ``rope_theta`` the cache holds
    pre-RoPE keys (the fused-RoPE option) and they are rotated here, at their absolute positions,
    with the same float32 cos/sin as the unfused path."""
    k = gather_pages(cache, table_row, start, end)
    if rope_theta is None:
        return k
    cos, sin = rope_cos_sin(torch.arange(start, end), k.shape[-1], rope_theta)
    return apply_rope(k, cos, sin)


def _expand_gqa(x: torch.Tensor, n_q: int) -> torch.Tensor:
    """``[L, n_kv, D] -> [L, n_q, D]``: query head ``h`` reads KV head ``h // group``."""
    group = n_q // x.shape[1]
    return x.repeat_interleave(group, dim=1)


# --------------------------------------------------------------------------------------
# paged continued prefill
# --------------------------------------------------------------------------------------

def paged_prefill(
    q: torch.Tensor,            # [T, n_q, D]
    k_cache: torch.Tensor,      # [N, bs, n_kv, D]
    v_cache: torch.Tensor,      # [N, bs, n_kv, D]
    block_tables: torch.Tensor, # [B, M] int
    seq_lens: torch.Tensor,     # [B] int
    q_seq_idx: torch.Tensor,    # [T] int
    q_pos: torch.Tensor,        # [T] int, -1 marks a padding row
    scale: float | None = None,
    rope_theta: float | None = None,
) -> torch.Tensor:              # [T, n_q, D], same dtype as q
    """Each real query attends causally, by absolute position, over its sequence's pages.

    Query ``t`` of sequence ``b`` at position ``p`` sees keys ``0 .. p`` of ``b`` (``kv_pos <= p``).
    A padding row (``q_pos < 0``) writes zeros and reads nothing.
    """
    T, n_q, D = q.shape
    scale = D ** -0.5 if scale is None else scale
    out = torch.zeros(T, n_q, D, dtype=torch.float32)                     # [T, n_q, D]
    for b in range(block_tables.shape[0]):
        rows = torch.nonzero((q_seq_idx == b) & (q_pos >= 0)).flatten()  # [t_b]
        if rows.numel() == 0:
            continue
        L = int(q_pos[rows].max()) + 1
        k = _expand_gqa(gather_keys(k_cache, block_tables[b], 0, L, rope_theta), n_q).float()  # [L, n_q, D]
        v = _expand_gqa(gather_pages(v_cache, block_tables[b], 0, L), n_q).float()  # [L, n_q, D]
        qb = q[rows].float()                                              # [t_b, n_q, D]
        s = torch.einsum("thd,lhd->htl", qb, k) * scale                   # [n_q, t_b, L]
        visible = torch.arange(L)[None, :] <= q_pos[rows][:, None]        # [t_b, L]
        s = torch.where(visible[None], s, NEG_INF)
        p = torch.softmax(s, dim=-1)                                      # [n_q, t_b, L]
        p = torch.where(visible[None], p, 0.0)
        out[rows] = torch.einsum("htl,lhd->thd", p, v)                    # keys 0..L-1 are all written
    return out.to(q.dtype)


# --------------------------------------------------------------------------------------
# split-KV (flash-decoding) decode
# --------------------------------------------------------------------------------------

def num_splits(seq_len: int, split_size: int) -> int:
    """A sequence of ``seq_len`` keys has ``ceil(seq_len / split_size)`` splits (0 for an empty one)."""
    return (seq_len + split_size - 1) // split_size


def check_splits(split_size: int, seq_lens, max_splits: int | None = None) -> tuple[int, int]:
    """The split-KV launch guard: ``split_size`` an int >= 1 and ``max_splits`` (if given) at least the splits
    the longest sequence needs. Returns ``(split_size, splits to launch)``; typed ``BlockTableError`` otherwise."""
    if isinstance(split_size, bool) or not isinstance(split_size, numbers.Integral) or split_size < 1:
        raise BlockTableError(f"split_size must be an int >= 1, got {split_size!r}")
    split_size = int(split_size)
    needed = max([num_splits(int(n), split_size) for n in seq_lens] + [1])
    if max_splits is not None and max_splits < needed:
        raise BlockTableError(f"max_splits={max_splits} is fewer than the {needed} splits the longest sequence needs")
    return split_size, needed if max_splits is None else max_splits


def split_kv_partials(
    q: torch.Tensor,            # [B, n_q, D]
    k_cache: torch.Tensor,      # [N, bs, n_kv, D]
    v_cache: torch.Tensor,      # [N, bs, n_kv, D]
    block_tables: torch.Tensor, # [B, M]
    seq_lens: torch.Tensor,     # [B]
    split_size: int,
    scale: float | None = None,
    max_splits: int | None = None,
    rope_theta: float | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Partial states of every split: ``o [B, S, n_q, D]`` and ``lse [B, S, n_q]``, float32.

    Split ``k`` of a sequence covers key positions ``[k*split_size, (k+1)*split_size)`` clipped
    to its length. ``S = max_splits`` (default: the most any sequence has); a split with no keys
    writes ``o = 0, lse = -inf``. The query is the sequence's last token, so every cached key is visible.
    """
    B, n_q, D = q.shape
    scale = D ** -0.5 if scale is None else scale
    split_size, S = check_splits(split_size, seq_lens, max_splits)
    lens = [int(x) for x in seq_lens]
    o = torch.zeros(B, S, n_q, D, dtype=torch.float32)                    # [B, S, n_q, D]
    lse = torch.full((B, S, n_q), NEG_INF, dtype=torch.float32)           # [B, S, n_q]
    for b in range(B):
        for k in range(S):
            start, end = k * split_size, min((k + 1) * split_size, lens[b])
            if start >= end:
                continue  # empty split: o = 0, lse = -inf
            kk = _expand_gqa(gather_keys(k_cache, block_tables[b], start, end, rope_theta), n_q).float()  # [L, n_q, D]
            vv = _expand_gqa(gather_pages(v_cache, block_tables[b], start, end), n_q).float()  # [L, n_q, D]
            s = torch.einsum("hd,lhd->hl", q[b].float(), kk) * scale       # [n_q, L]
            m = s.max(dim=-1, keepdim=True).values                        # [n_q, 1]
            e = torch.exp(s - m)                                          # [n_q, L]
            denom = e.sum(dim=-1)                                         # [n_q]
            o[b, k] = torch.einsum("hl,lhd->hd", e, vv) / denom[:, None]
            lse[b, k] = m.squeeze(-1) + torch.log(denom)
    return o, lse


def merge_two(o_a: torch.Tensor, lse_a: torch.Tensor, o_b: torch.Tensor, lse_b: torch.Tensor
              ) -> tuple[torch.Tensor, torch.Tensor]:
    """Merge two partial states (``o [..., D]``, ``lse [...]``, float32) with both NaN guards.

    An all ``-inf`` maximum is mapped to 0 before subtracting (no ``-inf - -inf``), and a zero
    weight sum gives ``o = 0, lse = -inf``. An empty state (weight 0) contributes nothing, not
    ``0 * o``. Nothing else is masked: a NaN state (a poisoned read) propagates, as it must.
    """
    m = torch.maximum(lse_a, lse_b)                                       # [...], NaN if either is NaN
    m_safe = torch.where(torch.isneginf(m), 0.0, m)
    w_a = torch.exp(lse_a - m_safe)                                       # exp(-inf) = 0 for an empty state
    w_b = torch.exp(lse_b - m_safe)
    total = w_a + w_b
    empty = total == 0
    o = (torch.where(w_a[..., None] == 0, 0.0, o_a * w_a[..., None])
         + torch.where(w_b[..., None] == 0, 0.0, o_b * w_b[..., None])) / torch.where(empty, 1.0, total)[..., None]
    o = torch.where(empty[..., None], 0.0, o)
    lse = torch.where(empty, float("-inf"), m_safe + torch.log(torch.where(empty, 1.0, total)))
    return o, lse


def reduce_splits(o: torch.Tensor, lse: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Fold splits ``0 .. S-1``: ``o [B, S, n_q, D]``, ``lse [B, S, n_q]`` -> ``[B, n_q, D]``, ``[B, n_q]``.

    One maximum over the splits, then each split's weight ``w_k = exp(lse_k - m)`` and the two sums
    ``sum_k w_k`` and ``sum_k w_k o_k`` taken in index order, then one division -- the same value as
    folding the splits pairwise with ``merge_two`` in order, with one ``exp`` per split and one division
    per element in place of a chain of ``S - 1`` divisions and logarithms (docs/kernels.md). The guards
    are ``merge_two``'s: an all ``-inf`` maximum is taken as 0, an empty split (weight 0) adds nothing,
    not ``0 * o``, and a zero weight sum gives ``o = 0, lse = -inf``.
    """
    m = lse.max(dim=1).values                                             # [B, n_q], NaN if any is NaN
    m_safe = torch.where(torch.isneginf(m), 0.0, m)
    w = torch.exp(lse - m_safe[:, None])                                  # [B, S, n_q], 0 for an empty split
    total = w[:, 0]                                                       # [B, n_q]
    acc = torch.where(w[:, 0, :, None] == 0, 0.0, o[:, 0] * w[:, 0, :, None])  # [B, n_q, D]
    for k in range(1, o.shape[1]):
        total = total + w[:, k]
        acc = acc + torch.where(w[:, k, :, None] == 0, 0.0, o[:, k] * w[:, k, :, None])
    empty = total == 0                                                    # [B, n_q]
    out = torch.where(empty[..., None], 0.0, acc / torch.where(empty, 1.0, total)[..., None])
    out_lse = torch.where(empty, float("-inf"), m_safe + torch.log(torch.where(empty, 1.0, total)))
    return out, out_lse


def split_kv_decode(
    q: torch.Tensor,            # [B, n_q, D]
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    block_tables: torch.Tensor,
    seq_lens: torch.Tensor,
    split_size: int | None,
    scale: float | None = None,
    rope_theta: float | None = None,
) -> torch.Tensor:              # [B, n_q, D]
    """Decode attention of one query per sequence; ``split_size=None`` runs one split over all keys."""
    if split_size is None:
        split_size = max([int(x) for x in seq_lens] + [1])
    o, lse = split_kv_partials(q, k_cache, v_cache, block_tables, seq_lens, split_size, scale, rope_theta=rope_theta)
    out, _ = reduce_splits(o, lse)
    return out.to(q.dtype)


# --------------------------------------------------------------------------------------
# partial-state merge (context parallel)
# --------------------------------------------------------------------------------------

@dataclass(slots=True)
class PartialState:
    """Attention over one range of KV blocks: ``o [..., D]`` and natural-log ``lse [...]``, float32."""

    o: torch.Tensor
    lse: torch.Tensor
    global_block_index: int


def ordered_states(states: list[PartialState]) -> list[PartialState]:
    """The merge order: sorted by ``global_block_index``; duplicates and shape mismatches raise ``MergeError``."""
    if not states:
        raise MergeError("no partial states to merge")
    order = sorted(states, key=lambda s: s.global_block_index)
    for a, b in zip(order, order[1:]):
        if a.global_block_index == b.global_block_index:
            raise MergeError(f"duplicate global_block_index {a.global_block_index}")
    shape = order[0].lse.shape
    for s in order:
        if s.lse.shape != shape or s.o.shape[:-1] != shape:
            raise MergeError(f"partial state shapes disagree: {tuple(s.o.shape)} / {tuple(s.lse.shape)}")
    return order


def merge_states(states: list[PartialState]) -> tuple[torch.Tensor, torch.Tensor]:
    """Sort by ``global_block_index``, reject duplicates, fold in float32 in that order."""
    order = ordered_states(states)
    o, lse = order[0].o.float(), order[0].lse.float()
    for s in order[1:]:
        o, lse = merge_two(o, lse, s.o.float(), s.lse.float())
    return o, lse


def dense_causal_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: float | None = None) -> torch.Tensor:
    """No-cache oracle attention: ``q [T, n_q, D]``, ``k, v [T, n_kv, D]`` -> ``[T, n_q, D]``, causal, float32 softmax."""
    T, n_q, D = q.shape
    scale = D ** -0.5 if scale is None else scale
    kk = _expand_gqa(k, n_q).float()
    vv = _expand_gqa(v, n_q).float()
    s = torch.einsum("thd,lhd->htl", q.float(), kk) * scale              # [n_q, T, T]
    mask = torch.ones(T, T, dtype=torch.bool, device=q.device).tril()
    s = s.masked_fill(~mask, NEG_INF)
    return torch.einsum("htl,lhd->thd", torch.softmax(s, dim=-1), vv).to(q.dtype)



#: ``auto``'s rule, fitted to split-KV decode timings on an H200 (docs/performance/decode_attention.md, "Split size of a
#: decode step"): one wave of work items (sequence x KV head x split), this many per multiprocessor --
#: the optimized decode kernel's occupancy at head dim 128 (two 128-thread CTAs per multiprocessor, the
#: shared-memory configuration its launch asks for: ``optimized.ops.DECODE_CTAS_PER_SM``, kept equal to
#: this by a test); a second, partial wave costs nearly as much as a full one ...
AUTO_CTAS_PER_SM = 2
#: ... but at most this many splits per sequence (the fold's sums over the partial states are serial in their number),
AUTO_MAX_SPLITS = 16
#: whole K/V tiles of the decode kernel per split ...
AUTO_TILE = 64
#: ... and at least 2 tiles per split while the rows (sequences x KV heads) fill at most a sixteenth of the
#: multiprocessors, else at least 4: short splits lose more to their prologue, partial state and fold
#: than they gain in parallelism
AUTO_MIN_TILES = (2, 4)


def split_size_for(policy_kind: str, fixed_size: int, seq_lens: list[int], n_kv: int, num_sms: int = 132) -> int | None:
    """The split size a decode step uses under a policy (``None``: one split over all keys).

    ``auto`` (``B`` sequences, the longest of ``max_len`` keys, ``rows = B * n_kv``)::

        splits = clamp(floor(AUTO_CTAS_PER_SM * num_sms / rows), 1, AUTO_MAX_SPLITS)
        size   = ceil(max_len / splits), rounded up to whole tiles of AUTO_TILE keys
        size   = max(size, AUTO_TILE * (2 if rows <= num_sms // 16 else 4))

    It depends on the batch shape, so batch-invariant mode forbids it.
    """
    if policy_kind == "disabled":
        return None
    if policy_kind == "fixed":
        return fixed_size
    max_len = max(seq_lens + [1])
    rows = max(1, len(seq_lens) * n_kv)
    splits = min(AUTO_MAX_SPLITS, max(1, AUTO_CTAS_PER_SM * num_sms // rows))
    size = -(-max_len // splits)
    size = -(-size // AUTO_TILE) * AUTO_TILE
    return max(size, AUTO_TILE * AUTO_MIN_TILES[0 if rows <= num_sms // 16 else 1])


def invariant_attention(
    q: torch.Tensor,            # [T, n_q, D]
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    block_tables: torch.Tensor, # [B, M]
    q_seq_idx: torch.Tensor,    # [T]
    q_pos: torch.Tensor,        # [T], -1 marks padding
    split_size: int | None,
    scale: float | None = None,
    rope_theta: float | None = None,
) -> torch.Tensor:              # [T, n_q, D]
    """Batch-invariant attention: every query row, in prefill or decode, is computed alone as a
    split-KV decode over its visible keys ``0 .. q_pos`` with splits at absolute positions
    ``k * split_size``, folded in order. A row's result depends only on its own keys, never on
    its batch mates or on whether it arrived in a prefill chunk or a decode step."""
    out = torch.zeros(q.shape, dtype=torch.float32)                       # [T, n_q, D]
    for t in range(q.shape[0]):
        p = int(q_pos[t])
        if p < 0:
            continue
        b = int(q_seq_idx[t])
        size = split_size if split_size is not None else p + 1
        o, lse = split_kv_partials(q[t:t + 1], k_cache, v_cache, block_tables[b:b + 1],
                                   torch.tensor([p + 1]), size, scale, rope_theta=rope_theta)  # [1, S, n_q, D]
        out[t] = reduce_splits(o, lse)[0][0]
    return out.to(q.dtype)
