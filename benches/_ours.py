"""The kernels under test, one adapter per entry point: ``optimized.ops`` (our CUDA kernels
through CuPy) on the GPU scale, the reference's torch math on the CPU scale. Every signature
that depends on ``optimized/ops.py`` lives here."""

from __future__ import annotations

import math

import torch

from _bench import Scale
from reference import attention
from reference.attention import split_size_for


def split_for(policy: str, B: int, ctx: int, n_kv: int) -> int:
    """Split size of a decode over ``B`` sequences of ``ctx`` keys under ``policy`` (``fixed:N`` | ``auto``)."""
    kind, _, n = policy.partition(":")
    sms = torch.cuda.get_device_properties(torch.cuda.current_device()).multi_processor_count \
        if torch.cuda.is_available() else 132
    size = split_size_for(kind, int(n or 0), [ctx] * B, n_kv, num_sms=sms)
    return size if size is not None else ctx


def decode(scale: Scale, policy: str, q, k_cache, v_cache, tables, lens, ctx: int, sm_scale: float,
           fused: bool = True):
    """Closure: split-KV decode of ``q [B, n_q, D]`` (the engine's decode attention; ``fused=False``:
    the partials kernel, then the separate reduce kernel)."""
    B, n_kv = q.shape[0], k_cache.shape[2]
    split = split_for(policy, B, ctx, n_kv)
    max_splits = math.ceil(ctx / split)
    if scale.gpu:
        from optimized import ops
        return lambda: ops.split_kv_decode(q, k_cache, v_cache, tables, lens, split, sm_scale, max_splits=max_splits,
                                           fused=fused)
    t, sl = tables.long(), lens.long()
    return lambda: attention.split_kv_decode(q, k_cache, v_cache, t, sl, split, sm_scale)


def prefill(scale: Scale, q, k_cache, v_cache, tables, lens, q_seq_idx, q_pos, sm_scale: float,
            variant: str | None = None, mean_keys: float | None = None):
    """Closure: paged continued prefill of ``q [T, n_q, D]`` (GPU: ``variant`` and ``mean_keys`` as in
    ``ops.paged_prefill``: without a variant the kernel is the one the engine's runner would pick)."""
    if scale.gpu:
        from optimized import ops
        return lambda: ops.paged_prefill(q, k_cache, v_cache, tables, lens, q_seq_idx, q_pos, sm_scale,
                                         variant=variant, mean_keys=mean_keys)
    t, sl, qi, qp = tables.long(), lens.long(), q_seq_idx.long(), q_pos.long()
    return lambda: attention.paged_prefill(q, k_cache, v_cache, t, sl, qi, qp, sm_scale)


def rmsnorm(scale: Scale, x, w, eps: float):
    if scale.gpu:
        from optimized import ops
        return lambda: ops.rmsnorm(x, w, eps)
    from reference.model import rms_norm
    return lambda: rms_norm(x, w, eps)


def add_rmsnorm(scale: Scale, x, residual, w, eps: float):
    """Closure: ``residual += x`` in place, returns ``rmsnorm(residual)``."""
    if scale.gpu:
        from optimized import ops
        return lambda: ops.add_rmsnorm(x, residual, w, eps)
    from reference.model import rms_norm

    def run():
        residual.add_(x)
        return rms_norm(residual, w, eps)
    return run


def qk_norm_rope(scale: Scale, q, k, qw, kw, cos_half, sin_half, positions, eps: float):
    """Closure: per-head RMSNorm then rotate-half RoPE of ``q`` and ``k``, in place."""
    if scale.gpu:
        from optimized import ops
        return lambda: ops.qk_norm_rope(q, k, qw, kw, cos_half, sin_half, positions, eps)
    from reference.model import apply_rope, rms_norm
    cos = torch.cat([cos_half, cos_half], -1)
    sin = torch.cat([sin_half, sin_half], -1)

    def run():
        c, s_ = cos[positions.long()], sin[positions.long()]
        q.copy_(apply_rope(rms_norm(q, qw, eps), c, s_))
        k.copy_(apply_rope(rms_norm(k, kw, eps), c, s_))
    return run


def sample(scale: Scale, logits, params, positions):
    """Closure: one token (and its logprob) per row of float32 ``logits [B, V]``."""
    if scale.gpu:
        from optimized import ops
        packed = ops.pack_sampling_params(params, positions, logits.device)
        return lambda: ops.sample(logits, **packed)
    from reference.sampling import sample_batch
    return lambda: sample_batch(logits, params, positions)


def gemm(scale: Scale, x, w, out_dtype: torch.dtype, out=None):
    """Closure: the batch-invariant GEMM ``y [M, N] = x [M, K] @ w [N, K].T`` (fp32 accumulation;
    a row of ``y`` is bitwise independent of ``M``): ``ops.gemm`` on the GPU, the reference's
    row-at-a-time ``linear(..., batch_invariant=True)`` on the CPU."""
    if scale.gpu:
        from optimized import ops
        return lambda: ops.gemm(x, w, out_dtype=out_dtype, out=out)
    from reference.model import linear

    def run():
        y = linear(x, w, batch_invariant=True).to(out_dtype)
        return y if out is None else out.copy_(y)
    return run


def skinny_gemm(x, w, out_dtype: torch.dtype, out=None):
    """Closure (GPU only): the default engine's GEMM for at most 16 rows, ``ops.skinny_gemm``."""
    from optimized import ops
    return lambda: ops.skinny_gemm(x, w, out_dtype=out_dtype, out=out)


def skinny_staged(x, w, out_dtype: torch.dtype, out=None):
    """Closure (GPU only): the default engine's GEMM for at most 8 rows, ``ops.skinny_staged`` with the
    engine's configuration (``CudaRunner.staged``: every role alike)."""
    from optimized import ops
    from optimized.runner import STAGED_DEFAULT, CudaRunner
    kw = CudaRunner._staged_kw(STAGED_DEFAULT)
    return lambda: ops.skinny_staged(x, w, out_dtype=out_dtype, out=out, **kw)
