"""Context-parallel (CP) attention over the paged KV cache.

**Ownership rule.** Logical block ``j`` of every sequence (key positions
``[j*block_size, (j+1)*block_size)``) belongs to CP rank ``j % cp`` (round robin by the block's
index in its sequence, its *global block index*). Every CP rank keeps the full block table,
but writes into its own page pool only the K/V of tokens in the blocks it owns.

**Attention.** Every query row is cut into splits at block boundaries (split size =
``block_size``). A CP rank computes the partial state ``(o, lse)`` of each block it owns,
causally by absolute position (``kv_pos <= q_pos``); a block the query cannot see, or a block
past the sequence, is an empty state ``o = 0, lse = -inf``. The states are all-gathered over
the CP group with their global block indices and merged with the reference's fixed-order fp32
fold (``ordered_states`` + ``merge_two``, via ``merge_states``): the fold runs in global
block order ``0, 1, 2, ...``, so the result does not depend on which rank owned which block,
nor on ``cp``.
"""

from __future__ import annotations

import torch
import torch.distributed as dist

from .attention import NEG_INF, PartialState, _expand_gqa, gather_keys, gather_pages, merge_states


def block_owner(block_index: int, cp: int) -> int:
    """The CP rank that holds logical block ``block_index`` of a sequence."""
    return block_index % cp


def owned_slots(slot_mapping: torch.Tensor, positions: torch.Tensor, block_size: int, cp: int,
                cp_rank: int) -> torch.Tensor:
    """``slot_mapping [T]`` with ``-1`` (skipped by ``KVCache.write``) for tokens of blocks another rank owns."""
    owned = (positions // block_size) % cp == cp_rank                    # [T]
    return torch.where(owned & (positions >= 0), slot_mapping, -1)


def owned_block_indices(num_blocks: int, cp: int, cp_rank: int) -> list[int]:
    """The global block indices ``< num_blocks`` rank ``cp_rank`` owns: ``cp_rank, cp_rank + cp, ...``."""
    return list(range(cp_rank, num_blocks, cp))


def owned_block_partials(
    q: torch.Tensor,            # [T, n_q, D]
    k_cache: torch.Tensor,      # [N, bs, n_kv, D]
    v_cache: torch.Tensor,      # [N, bs, n_kv, D]
    block_tables: torch.Tensor, # [B, M] int
    q_seq_idx: torch.Tensor,    # [T] int
    q_pos: torch.Tensor,        # [T] int, -1 marks a padding row
    cp: int,
    cp_rank: int,
    scale: float | None = None,
    rope_theta: float | None = None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Partial states of every query row over each block this rank owns.

    Returns ``o [T, J, n_q, D]``, ``lse [T, J, n_q]`` (float32) and ``index [J]`` (int64), where
    ``J = ceil(M / cp)`` and slot ``i`` holds global block ``index[i] = cp_rank + i*cp``
    (``-1``: past every table, no block). Keys are read only at positions ``<= q_pos``, all of
    which this rank wrote, and masked scores are selected away, never multiplied into V.
    """
    T, n_q, D = q.shape
    bs = k_cache.shape[1]
    scale = D ** -0.5 if scale is None else scale
    M = block_tables.shape[1]
    blocks = owned_block_indices(M, cp, cp_rank)
    J = -(-M // cp)
    index = torch.full((J,), -1, dtype=torch.int64)                       # [J]
    index[:len(blocks)] = torch.tensor(blocks, dtype=torch.int64)
    o = torch.zeros(T, J, n_q, D, dtype=torch.float32)                    # [T, J, n_q, D]
    lse = torch.full((T, J, n_q), NEG_INF, dtype=torch.float32)           # [T, J, n_q]
    for b in range(block_tables.shape[0]):
        rows = torch.nonzero((q_seq_idx == b) & (q_pos >= 0)).flatten()  # [t_b]
        if rows.numel() == 0:
            continue
        pos = q_pos[rows].long()                                          # [t_b]
        last = int(pos.max())
        qb = q[rows].float()                                              # [t_b, n_q, D]
        for i, j in enumerate(blocks):
            start = j * bs
            if start > last:
                break                                                     # no row sees this block: empty states
            end = min(start + bs, last + 1)
            k = _expand_gqa(gather_keys(k_cache, block_tables[b], start, end, rope_theta), n_q).float()  # [L, n_q, D]
            v = _expand_gqa(gather_pages(v_cache, block_tables[b], start, end), n_q).float()  # [L, n_q, D]
            s = torch.einsum("thd,lhd->htl", qb, k) * scale               # [n_q, t_b, L]
            visible = torch.arange(start, end)[None, :] <= pos[:, None]   # [t_b, L]
            s = torch.where(visible[None], s, NEG_INF)
            m = s.amax(dim=-1)                                            # [n_q, t_b]
            m_safe = torch.where(torch.isfinite(m), m, 0.0)               # a row that sees nothing: no -inf - -inf
            e = torch.where(visible[None], torch.exp(s - m_safe[..., None]), 0.0)  # [n_q, t_b, L]
            denom = e.sum(dim=-1)                                         # [n_q, t_b]
            seen = denom > 0
            denom_safe = torch.where(seen, denom, 1.0)
            ob = torch.einsum("htl,lhd->thd", e, v) / denom_safe.T[..., None]      # [t_b, n_q, D]
            o[rows, i] = torch.where(seen.T[..., None], ob, 0.0)
            lse[rows, i] = torch.where(seen, m_safe + torch.log(denom_safe), NEG_INF).T
    return o, lse, index


def _all_gather(x: torch.Tensor, group, size: int, comm_device: torch.device) -> list[torch.Tensor]:
    """All-gather ``x`` over ``group`` (through ``comm_device``: the CPU for gloo, a GPU for NCCL)."""
    y = x.contiguous().to(comm_device)
    out = [torch.empty_like(y) for _ in range(size)]
    dist.all_gather(out, y, group=group)
    return [t.to(x.device) for t in out]


def merge_gathered(o: list[torch.Tensor], lse: list[torch.Tensor], index: list[torch.Tensor]) -> torch.Tensor:
    """Every rank's ``(o [T, J, n_q, D], lse [T, J, n_q], index [J])`` -> ``[T, n_q, D]``, folded in
    global block order with the reference merge (duplicates raise ``MergeError``)."""
    states = [PartialState(o_r[:, i], lse_r[:, i], int(idx_r[i]))
              for o_r, lse_r, idx_r in zip(o, lse, index) for i in range(idx_r.shape[0]) if int(idx_r[i]) >= 0]
    out, _ = merge_states(states)
    return out


def cp_attention(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, block_tables: torch.Tensor,
                 q_seq_idx: torch.Tensor, q_pos: torch.Tensor, cp: int, cp_rank: int, group=None,
                 comm_device: torch.device | str = "cpu", rope_theta: float | None = None) -> torch.Tensor:
    """Attention of every query row ``q [T, n_q, D]`` over its sequence's keys ``0 .. q_pos``, split by
    block across the CP group: owned partial states, all-gather, fixed-order fp32 merge. Returns
    ``[T, n_q, D]`` in ``q``'s dtype, identical on every CP rank."""
    o, lse, index = owned_block_partials(q, k_cache, v_cache, block_tables, q_seq_idx, q_pos, cp, cp_rank,
                                         rope_theta=rope_theta)
    if cp > 1:
        dev = torch.device(comm_device)
        o_all, lse_all, idx_all = (_all_gather(x, group, cp, dev) for x in (o, lse, index))
    else:
        o_all, lse_all, idx_all = [o], [lse], [index]
    return merge_gathered(o_all, lse_all, idx_all).to(q.dtype)
