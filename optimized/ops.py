"""Launch wrappers of the optimized engine's CUDA kernels (``optimized/kernels/*.cu``).

Every wrapper takes torch CUDA tensors, validates shapes / dtypes / layouts (``ValueError`` with
the offending argument named), and launches one kernel through CuPy on the *current torch
stream* (``cupy.cuda.ExternalStream(torch.cuda.current_stream().cuda_stream)``). Tensors cross as
raw device pointers (bf16 data is read as ``__nv_bfloat16`` inside the kernels), so nothing is
copied, nothing synchronises with the host, and the only allocations are ``torch.empty`` outputs
on the input's device when no ``out=`` is given -- everything here can be captured in a CUDA graph
once the kernels are compiled (``optimized.kernels.load_all()`` or one eager call of each op).

Integer index tensors (block tables, lengths, positions, ids, slots) are int32. bf16 rows are
read with 16-byte loads: their base pointers must be 16-byte aligned and row strides a multiple
of 8 elements (checked).

Reference twins: ``reference/attention.py`` (paged_prefill, split_kv_partials, reduce_splits /
merge_two, merge_states), ``reference/sampling.py`` (sample_one), ``reference/model.py``
(rms_norm, apply_rope, silu * up, embedding), ``reference/kv_cache.py`` (KVCache.write).
"""

from __future__ import annotations

import functools
import math
import threading
from typing import Sequence

import numpy as np
import torch

from . import kernels, launch

__all__ = [
    "store_kvcache", "embedding", "embed_rmsnorm", "rmsnorm", "add_rmsnorm", "qk_norm_rope", "silu_mul",
    "paged_prefill", "split_kv_partials", "split_kv_reduce", "split_kv_decode", "merge_states",
    "sample", "pack_sampling_params", "prefill_smem_bytes", "prefill_variant", "prefill_variants",
    "decode_smem_bytes", "ATTN_HEAD_DIMS",
    "gemm", "gemm_choice", "gemm_tile", "GEMM_TILES", "GEMM_STAGED", "gemm_staged_smem", "GEMM_CHUNK",
    "skinny_gemm", "skinny_warps", "SKINNY_MAX_M", "skinny_swiglu",
    "skinny_staged", "SKINNY_STAGED_CONFIGS", "SKINNY_STAGED_WIDE", "SKINNY_STAGED_MAX_M",
    "skinny_cluster", "SKINNY_CLUSTER_CONFIGS", "SKINNY_CLUSTER_W8", "SKINNY_CLUSTER_MAX_M",
    "FUSED_DECODE_MAX_B",
]

#: head dims the attention kernels are instantiated for
ATTN_HEAD_DIMS = (16, 32, 64, 128)
#: query rows per CTA of the 64-row paged-prefill kernel (tokens x GQA group; the _x2 kernels take 128);
#: the GQA group must not exceed it
PREFILL_ROWS = 64

_I32_MAX = 2**31 - 1
_lock = threading.Lock()
_functions: dict[tuple[int, str, str], tuple[object, int]] = {}   # (RawKernel, its CUfunction handle)
_function_smem: dict[tuple[int, str, str], int] = {}   # the dynamic shared memory a kernel is opted in to (> 48 KB)
_streams: dict[tuple[int, int], object] = {}


#: paged-prefill kernels per head dim: variant -> (kernel name, keys per tile, query rows per CTA,
#: 16-row tiles per warp). ``paged_prefill(variant=None)`` takes ``prefill_variant``'s choice; a
#: caller (benches, checks) may name one that the device has (``prefill_variants``). Variants with
#: the same keys per tile give every row the same bits (see PrefillCfg in attention.cu): the wgmma
#: kernels (``wg*``, ``PREFILL_WGMMA``) chain each row's products in the same order as the mma.sync
#: ones, and the H200 gives them the same bits (``check_kernels.py`` requires it).
PREFILL_VARIANTS: dict[int, dict[str, tuple[str, int, int, int]]] = {
    16: {"default": ("paged_prefill_d16", 64, 64, 1)},
    32: {"default": ("paged_prefill_d32", 64, 64, 1)},
    64: {"default": ("paged_prefill_d64", 64, 64, 1), "x2": ("paged_prefill_d64_x2", 64, 128, 2)},
    128: {"default": ("paged_prefill_d128", 64, 64, 1), "x2": ("paged_prefill_d128_x2", 64, 128, 2),
          "wg64": ("paged_prefill_d128_wg64", 64, 64, 1), "wg128": ("paged_prefill_d128_wg128", 64, 128, 1),
          "ws": ("paged_prefill_d128_ws", 64, 128, 1)},
}
#: the variants built from warpgroup MMAs (``wgmma``): launched only where ``kernels.target("attention")``
#: is this target (a compute-capability-9.0 device, ``kernels.ARCH_TARGETS``)
PREFILL_WGMMA: dict[str, str] = {"wg64": "sm_90a", "wg128": "sm_90a", "ws": "sm_90a"}
#: the warp-specialised wgmma kernel (``ws``): a producer warpgroup for the copies beside the two consumer
#: warpgroups of its 128 rows (384 threads), a ring of this many K/V tile slots (WS_STAGES in attention.cu)
PREFILL_WS_STAGES: dict[str, int] = {"ws": 4}
#: CTAs a multiprocessor of the warp-specialised kernel's persistent grid: min(work items, this x SMs) CTAs take
#: the work items (tile of query tokens, KV head) in heaviest-first order, each every grid-th one, so a CTA's
#: producer copies the next item's first tiles while its consumers finish the item before. 0: one CTA per item.
WS_CTAS_PER_SM = 1
#: ... used where a step's mean chunk (query tokens per sequence, T / B) is at most this: there the items are
#: short and alike. Over longer chunks the causal items differ in work and the static assignment left CTAs idle:
#: one CTA per item, scheduled by the hardware, was faster (H200: 8 x 1024 over no prefix 1.11x flash against
#: 1.02x persistent; 32 x 256 over none 0.94x against 1.05x; docs/performance/prefill.md, "Warp specialisation")
WS_PERSISTENT_MAX_CHUNK = 256


def prefill_smem_bytes(head_dim: int, block_n: int = 64, block_m: int = 64, tiles_per_warp: int = 1,
                       swizzled: bool = False, ring: int = 0) -> int:
    """Dynamic shared memory of a paged-prefill kernel: 2 stages of K and V tiles, plus the Q tile's
    own buffer when a warp holds two row tiles (with one, Q aliases a stage). ``swizzled`` (the wgmma
    kernels): 2 K and 3 or 4 V tiles without row padding, Q always in its own buffer, and 1024 bytes
    of slack to start the tiles on a 1024-byte boundary (PrefillCfg in attention.cu). ``ring`` > 0 (the
    warp-specialised kernel, swizzled): that many slots of a K and a V tile each instead."""
    if swizzled and ring > 0:
        return (2 * ring * block_n * head_dim + block_m * (head_dim + 8)) * 2 + 1024
    if swizzled:  # a ring of 2 K tiles and one of V tiles: 4 with two warpgroups (BM = 128), else 3
        v_slots = 4 if block_m == 128 else 3
        return ((2 + v_slots) * block_n * head_dim + block_m * (head_dim + 8)) * 2 + 1024
    q_rows = block_m if tiles_per_warp > 1 else 0
    return (4 * block_n + q_rows) * (head_dim + 8) * 2


def prefill_variants(head_dim: int, dev: int) -> list[str]:
    """The paged-prefill variants device ``dev`` can run at this head dim: every entry of
    ``PREFILL_VARIANTS`` but the wgmma kernels where the attention module is not built for their target."""
    variants = PREFILL_VARIANTS.get(head_dim, {})
    if any(v in PREFILL_WGMMA for v in variants):
        target = kernels.target("attention", dev)
        return [v for v in variants if PREFILL_WGMMA.get(v, target) == target]
    return list(variants)


#: CTAs of ``split_kv_partials`` a multiprocessor holds (the one wave of the ``auto`` split rule,
#: ``reference.attention.AUTO_CTAS_PER_SM``, counts on it). Its K/V copies go through L1 (``cp.async.ca``), and
#: they want that L1: at 166 registers the kernel fits three CTAs, for which the driver picks the largest
#: shared-memory configuration (about 28 KB of L1 left), and there it ran 8-33% slower than at two
#: CTAs with 88 KB of L1 (H200; docs/performance/decode_attention.md). So it asks for the configuration that holds two.
DECODE_CTAS_PER_SM = 2

#: query heads of one KV head a ``split_kv_partials`` CTA serves (``DecodeCfg::NQ`` in attention.cu: the
#: 8-column side of its MMAs); a larger GQA group takes several CTAs
DECODE_QUERY_HEADS = 8


def decode_smem_bytes(head_dim: int) -> int:
    """Dynamic shared memory of ``split_kv_partials_d{head_dim}``."""
    return (16 + 4 * 64) * (head_dim + 8) * 2


# --------------------------------------------------------------------------------------
# launching
# --------------------------------------------------------------------------------------

_TICKETS = 1 << 16
_tickets: dict[int, torch.Tensor] = {}


def _device_index(t: torch.Tensor) -> int:
    return t.device.index if t.device.index is not None else torch.cuda.current_device()


@functools.cache
def _num_sms(dev: int) -> int:
    return torch.cuda.get_device_properties(dev).multi_processor_count


def _function(dev: int, module: str, name: str, smem: int, ctas_per_sm: int | None = None) -> tuple[object, int]:
    """The kernel (``cupy.RawKernel``) and its CUfunction handle on device ``dev``, loaded once.
    ``ctas_per_sm``: prefer the smallest shared-memory configuration that holds that many CTAs
    (``_carveout_percent``), set once with the rest."""
    key = (dev, module, name)
    entry = _functions.get(key)
    if entry is None:
        with _lock:
            entry = _functions.get(key)
            if entry is None:
                fn = kernels.load(module).get_function(name)
                if ctas_per_sm is not None:
                    fn.preferred_shared_memory_carveout = _carveout_percent(dev, fn, smem, ctas_per_sm)
                entry = _functions[key] = (fn, fn.kernel.ptr)
    # opt in above the 48 KB default, and again for a launch that asks more than any before it (gemm's wide tiles)
    if smem > _function_smem.get(key, 48 * 1024):
        with _lock:
            if smem > _function_smem.get(key, 48 * 1024):
                entry[0].max_dynamic_shared_size_bytes = smem
                _function_smem[key] = smem
    return entry


def _carveout_percent(dev: int, fn, smem: int, ctas: int) -> int:
    """The smallest shared-memory carveout preference (percent of a multiprocessor's largest shared
    memory) that holds ``ctas`` CTAs of ``fn`` with ``smem`` bytes of dynamic shared memory each. The
    driver takes the smallest configuration at or above a preference, so the CTAs beyond ``ctas`` no
    longer fit and the rest of the array stays L1 (why the decode kernel wants that:
    ``DECODE_CTAS_PER_SM``)."""
    import cupy

    rt = cupy.cuda.runtime
    per_sm = rt.deviceGetAttribute(81, dev)    # cudaDevAttrMaxSharedMemoryPerMultiprocessor
    reserved = rt.deviceGetAttribute(111, dev)  # cudaDevAttrReservedSharedMemoryPerBlock
    need = ctas * (smem + int(fn.attributes["shared_size_bytes"]) + reserved)
    return min(100, -(-100 * need // per_sm))


def _stream(dev: int):
    import cupy

    ptr = torch.cuda.current_stream(dev).cuda_stream
    key = (dev, ptr)
    s = _streams.get(key)
    if s is None:
        s = cupy.cuda.ExternalStream(ptr, dev)
        _streams[key] = s
    return s


@functools.cache
def _cc_major(dev: int) -> int:
    return torch.cuda.get_device_properties(dev).major


def _launch(ref: torch.Tensor, module: str, name: str, grid: tuple, block: tuple, args: tuple, smem: int = 0,
            ctas_per_sm: int | None = None, cluster_x: int = 1) -> None:
    """One launch on the current torch stream: with programmatic dependent launch through the driver
    (``optimized/launch.py``) on compute capability 9.0+ unless ``TURNKV_PDL=0``, else through CuPy.
    ``ctas_per_sm``: see ``_function``. ``cluster_x > 1``: clusters of that many CTAs along x, which only
    the driver's path launches (the caller asks ``_clusters_ok`` first)."""
    import cupy

    dev = _device_index(ref)
    with cupy.cuda.Device(dev):
        fn, handle = _function(dev, module, name, smem, ctas_per_sm)
        if launch.pdl_enabled(_cc_major(dev)):
            launch.launch_pdl(handle, grid, block, args, smem, torch.cuda.current_stream(dev).cuda_stream,
                              cluster_x)
            return
        if cluster_x != 1:
            raise ValueError(f"{name}: a cluster launch needs the driver's launch path (PDL on, sm_90+)")
        with _stream(dev):
            fn(grid, block, args, shared_mem=smem)


def _p(t: torch.Tensor | None) -> np.uint64:
    return np.uint64(0 if t is None else t.data_ptr())


def _i(x: int) -> np.int32:
    if not (-(2**31) <= int(x) <= _I32_MAX):
        raise ValueError(f"value {x} does not fit in int32")
    return np.int32(x)


def _f(x: float) -> np.float32:
    return np.float32(x)


def _grid_1d(total: int, threads: int, max_blocks: int = 132 * 32) -> tuple[int, int, int]:
    return (max(1, min(max_blocks, -(-total // threads))), 1, 1)


# --------------------------------------------------------------------------------------
# validation
# --------------------------------------------------------------------------------------

def _need(cond: bool, msg: str) -> None:
    if not cond:
        raise ValueError(msg)


#: device types an op accepts (a CPU test of the host-side checks adds "cpu", with ``_launch`` stubbed)
_DEVICE_TYPES: tuple[str, ...] = ("cuda",)


def _tensor(name: str, t, dtype: torch.dtype | tuple[torch.dtype, ...], dims: int | None = None) -> torch.Tensor:
    # (the messages are built only on failure: these checks run for every argument of every eager launch)
    if not isinstance(t, torch.Tensor):
        raise ValueError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
    if t.device.type not in _DEVICE_TYPES:
        raise ValueError(f"{name} must be a CUDA tensor, got device {t.device}")
    if t.dtype is not dtype and (not isinstance(dtype, tuple) or t.dtype not in dtype):
        dtypes = dtype if isinstance(dtype, tuple) else (dtype,)
        raise ValueError(f"{name} must have dtype {' or '.join(map(str, dtypes))}, got {t.dtype}")
    if dims is not None and t.dim() != dims:
        raise ValueError(f"{name} must have {dims} dimensions, got shape {tuple(t.shape)}")
    return t


def _contig(name: str, t: torch.Tensor) -> None:
    if not t.is_contiguous():
        raise ValueError(f"{name} must be contiguous (shape {tuple(t.shape)}, strides {t.stride()})")


def _aligned16(name: str, t: torch.Tensor) -> None:
    if t.data_ptr() % 16:
        raise ValueError(f"{name} must start on a 16-byte boundary (data_ptr % 16 = {t.data_ptr() % 16})")


def _rows(name: str, t: torch.Tensor, inner: int) -> int:
    """bf16 tensor whose trailing ``inner`` dims are contiguous and whose dim 0 has a free stride
    (multiple of 8 elements, 16-byte aligned base). Returns the row stride in elements."""
    shape, stride = t.shape, t.stride()
    expect = 1
    for d in range(t.dim() - 1, t.dim() - 1 - inner, -1):
        if shape[d] != 1 and stride[d] != expect:
            raise ValueError(f"{name}: dims {t.dim() - inner}.. must be contiguous (shape {tuple(shape)}, "
                             f"strides {stride})")
        expect *= shape[d]
    row = stride[0] if shape[0] > 1 else expect
    if row % 8:
        raise ValueError(f"{name}: row stride {row} must be a multiple of 8 elements (16-byte rows)")
    if row > _I32_MAX:
        raise ValueError(f"{name}: row stride {row} does not fit in int32")
    _aligned16(name, t)
    return row


def _same_device(**tensors: torch.Tensor | None) -> None:
    devs = {n: t.device for n, t in tensors.items() if t is not None}
    first = next(iter(devs.values()))
    if any(d != first for d in devs.values()):
        bad = [f"{n}={d}" for n, d in devs.items() if d != first]
        raise ValueError(f"all tensors must be on {first}; got {', '.join(bad)}")


def _out(name: str, out: torch.Tensor | None, shape: tuple[int, ...], dtype: torch.dtype, like: torch.Tensor) -> torch.Tensor:
    if out is None:
        return torch.empty(shape, dtype=dtype, device=like.device)
    _tensor(name, out, dtype)
    if tuple(out.shape) != tuple(shape):
        raise ValueError(f"{name} must have shape {tuple(shape)}, got {tuple(out.shape)}")
    _contig(name, out)
    _aligned16(name, out)
    return out


def _int_vec(name: str, t: torch.Tensor, n: int | None = None) -> None:
    _tensor(name, t, torch.int32, 1)
    _contig(name, t)
    if n is not None:
        if t.shape[0] != n:
            raise ValueError(f"{name} must have length {n}, got {t.shape[0]}")


def _cache_pair(k_cache: torch.Tensor, v_cache: torch.Tensor) -> tuple[int, int, int, int]:
    _tensor("k_cache", k_cache, torch.bfloat16, 4)
    _tensor("v_cache", v_cache, torch.bfloat16, 4)
    if k_cache.shape != v_cache.shape:
        raise ValueError(f"k_cache {tuple(k_cache.shape)} and v_cache {tuple(v_cache.shape)} must have the same shape")
    _contig("k_cache", k_cache)
    _contig("v_cache", v_cache)
    _aligned16("k_cache", k_cache)
    _aligned16("v_cache", v_cache)
    N, bs, n_kv, D = k_cache.shape
    if not bs * n_kv * D <= _I32_MAX:
        raise ValueError(f"a cache page of {bs} x {n_kv} x {D} elements exceeds int32 offsets")
    # the attention kernels' row tables number a cache's 16-byte chunks (8 elements) in int32
    if not k_cache.numel() <= _CACHE_MAX_ELEMS:
        raise ValueError(f"a cache of {k_cache.numel()} elements exceeds the attention kernels' int32 16-byte chunk offsets "
                         f"(at most {_CACHE_MAX_ELEMS} elements, 32 GiB of bf16, per layer)")
    return N, bs, n_kv, D


#: most elements of one layer's K (or V) cache: its 16-byte chunks are numbered in int32 (attention.cu)
_CACHE_MAX_ELEMS = 8 * 2**31


def _block_size(bs: int) -> None:
    if not bs >= 1:
        raise ValueError(f"block_size {bs} must be >= 1")


def _cos_sin(cos: torch.Tensor, sin: torch.Tensor, D: int) -> None:
    """RoPE tables: fp32 ``cos, sin [max_pos, D/2]``, contiguous, of one shape."""
    for name, t in (("cos", cos), ("sin", sin)):
        _tensor(name, t, torch.float32, 2)
        _contig(name, t)
        if t.shape[1] != D // 2:
            raise ValueError(f"{name} must have shape [max_pos, {D // 2}], got {tuple(t.shape)}")
    if cos.shape != sin.shape:
        raise ValueError(f"cos {tuple(cos.shape)} and sin {tuple(sin.shape)} must match")


def _rope_tables(rope: tuple[torch.Tensor, torch.Tensor] | None, D: int) -> tuple[np.uint64, np.uint64, np.int32]:
    """Pointers and length of the fused-RoPE tables (``cos, sin`` fp32 ``[max_pos, D/2]``), or nulls."""
    if rope is None:
        return np.uint64(0), np.uint64(0), np.int32(0)
    cos, sin = rope
    _cos_sin(cos, sin, D)
    return _p(cos), _p(sin), _i(cos.shape[0])


def _block_tables(block_tables: torch.Tensor, seq_lens: torch.Tensor, B: int | None,
                  row_seq: torch.Tensor | None = None) -> tuple[int, int]:
    """Checks the tables and lengths; returns the table's (rows, columns). With ``row_seq`` the ``B``
    query rows pick their table rows through it, so only ``seq_lens`` and ``row_seq`` have ``B`` entries."""
    _tensor("block_tables", block_tables, torch.int32, 2)
    _contig("block_tables", block_tables)
    if row_seq is not None:
        _int_vec("seq_lens", seq_lens, B)
        _int_vec("row_seq", row_seq, B)
        return block_tables.shape[0], block_tables.shape[1]
    _int_vec("seq_lens", seq_lens)
    if block_tables.shape[0] != seq_lens.shape[0]:
        raise ValueError(f"block_tables {tuple(block_tables.shape)} and seq_lens {tuple(seq_lens.shape)} disagree on the batch")
    if B is not None:
        if block_tables.shape[0] != B:
            raise ValueError(f"block_tables must have {B} rows (one per sequence), got {block_tables.shape[0]}")
    return block_tables.shape[0], block_tables.shape[1]


def _scale(scale: float | None, D: int) -> float:
    s = D ** -0.5 if scale is None else float(scale)
    if not (s > 0 and math.isfinite(s)):
        raise ValueError(f"scale must be a finite positive number, got {s}")
    return s


# --------------------------------------------------------------------------------------
# memory ops
# --------------------------------------------------------------------------------------

def store_kvcache(k: torch.Tensor, v: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                  slot_mapping: torch.Tensor) -> None:
    """``k_cache.view(-1, n_kv, D)[slot_mapping[t]] = k[t]`` (same for v); slot ``-1`` skips the row.

    ``k, v``: bf16 ``[T, n_kv, D]`` (a token-row stride is allowed: slices of a fused qkv buffer);
    caches bf16 ``[num_blocks, block_size, n_kv, D]``; ``slot_mapping`` int32 ``[T]``.
    """
    _tensor("k", k, torch.bfloat16, 3)
    _tensor("v", v, torch.bfloat16, 3)
    N, bs, n_kv, D = _cache_pair(k_cache, v_cache)
    T = k.shape[0]
    if tuple(k.shape) != (T, n_kv, D):
        raise ValueError(f"k must have shape [T, {n_kv}, {D}], got {tuple(k.shape)}")
    if tuple(v.shape) != (T, n_kv, D):
        raise ValueError(f"v must have shape {tuple(k.shape)}, got {tuple(v.shape)}")
    if (n_kv * D) % 8 != 0:
        raise ValueError(f"n_kv * D = {n_kv * D} must be a multiple of 8")
    _int_vec("slot_mapping", slot_mapping, T)
    _same_device(k=k, v=v, k_cache=k_cache, v_cache=v_cache, slot_mapping=slot_mapping)
    if T == 0:
        return
    ks, vs = _rows("k", k, 2), _rows("v", v, 2)
    total = T * (n_kv * D // 8)
    _launch(k, "kv_cache", "store_kvcache", _grid_1d(total, 256), (256, 1, 1),
            (_p(k), _i(ks), _p(v), _i(vs), _p(k_cache), _p(v_cache), _p(slot_mapping), _i(T), _i(n_kv), _i(D)))


def kv_prefetch_ctas(B: int, max_pages: int, num_sms: int) -> int:
    """CTAs a sequence of ``kv_prefetch``: about two a multiprocessor over the ``B`` sequences (each CTA's bulk
    prefetches go through its multiprocessor's copy unit), at most one a page."""
    return max(1, min(max_pages, -(-2 * num_sms // max(B, 1))))


def kv_prefetch(k_cache: torch.Tensor, v_cache: torch.Tensor, block_tables: torch.Tensor, seq_lens: torch.Tensor,
                max_bytes: int, *, ctas: int | None = None, lines: bool = False) -> None:
    """Ask L2 for the cached K and V pages of one layer's sequences (``kv_cache.cu``'s ``kv_prefetch``): for each
    sequence ``b`` its first ``ceil(seq_lens[b] / block_size)`` pages of ``block_tables[b]`` -- at most
    ``max_bytes // (2 * page bytes * B)`` of them, so that the K and V of all ``B`` rows stay within ``max_bytes``
    -- by one bulk L2 prefetch a page, on ``ctas`` CTAs a sequence (at most one a page; None: ``kv_prefetch_ctas``,
    about two a multiprocessor: the fastest issue; fewer CTAs issue the same pages more slowly). ``lines``: one
    ``prefetch.global.L2`` a 128-byte line instead of the bulk prefetch. Writes nothing (every later output
    keeps its bits); launches nothing where that cap is below one page. The launch lasts until its pages have
    landed in L2, so a kernel that waits for it waits for them: the engine issues it on a side stream. Reads
    ``block_tables`` and ``seq_lens`` before its PDL wait (pdl.cuh), so no kernel still running may write them (a
    step's uploaded metadata). The bulk prefetch needs compute capability 9.0; below it that launch does nothing.

    caches bf16 ``[num_blocks, block_size, n_kv, D]``; ``block_tables`` int32 ``[B, M]`` (each row's pages in order,
    valid for its length), ``seq_lens`` int32 ``[B]`` (0: padding, no page).
    """
    N, bs, n_kv, D = _cache_pair(k_cache, v_cache)
    B, M = _block_tables(block_tables, seq_lens, None)
    if isinstance(max_bytes, bool) or not isinstance(max_bytes, int):
        raise TypeError(f"max_bytes must be an int, got {type(max_bytes).__name__}")
    if max_bytes < 0:
        raise ValueError(f"max_bytes must be >= 0, got {max_bytes}")
    if not isinstance(lines, bool):
        raise TypeError(f"lines must be a bool, got {type(lines).__name__}")
    if ctas is not None and (isinstance(ctas, bool) or not isinstance(ctas, int) or ctas < 1):
        raise ValueError(f"ctas must be a positive int or None, got {ctas!r}")
    _same_device(k_cache=k_cache, v_cache=v_cache, block_tables=block_tables, seq_lens=seq_lens)
    page_bytes = bs * n_kv * D * k_cache.element_size()
    if page_bytes % 16:
        raise ValueError(f"a cache page of {page_bytes} bytes is not a whole number of 16-byte chunks (bulk prefetch)")
    max_pages = min(M, max_bytes // (2 * page_bytes * max(B, 1)))
    if B == 0 or max_pages == 0:
        return
    G = kv_prefetch_ctas(B, max_pages, _num_sms(_device_index(k_cache))) if ctas is None else min(ctas, max_pages)
    _launch(k_cache, "kv_cache", "kv_prefetch", (B, G, 1), (32, 1, 1),
            (_p(k_cache), _p(v_cache), _p(block_tables), _p(seq_lens), _i(M), _i(bs), np.uint64(page_bytes),
             _i(max_pages), _i(int(lines))))


def embedding(ids: torch.Tensor, table: torch.Tensor, *, out: torch.Tensor | None = None) -> torch.Tensor:
    """``table[ids]``: int32 ``ids [T]``, bf16 ``table [V, H]`` -> bf16 ``[T, H]`` (out-of-range ids give zero rows)."""
    _int_vec("ids", ids)
    _tensor("table", table, torch.bfloat16, 2)
    _contig("table", table)
    _aligned16("table", table)
    V, H = table.shape
    if H % 8 != 0:
        raise ValueError(f"hidden size {H} must be a multiple of 8")
    T = ids.shape[0]
    out = _out("out", out, (T, H), torch.bfloat16, table)
    _same_device(ids=ids, table=table, out=out)
    if T == 0:
        return out
    _launch(table, "embedding", "embedding", _grid_1d(T * H // 8, 256), (256, 1, 1),
            (_p(ids), _p(table), _p(out), _i(T), _i(H), _i(V)))
    return out


# --------------------------------------------------------------------------------------
# norms, rope, activation
# --------------------------------------------------------------------------------------

def _norm_threads(H: int) -> int:
    return min(1024, max(32, -(-(H // 8) // 32) * 32))


def _as_rows(name: str, x: torch.Tensor) -> torch.Tensor:
    _tensor(name, x, torch.bfloat16)
    if not x.dim() >= 2:
        raise ValueError(f"{name} must have at least 2 dimensions, got shape {tuple(x.shape)}")
    if x.dim() > 2:
        if not x.is_contiguous():
            raise ValueError(f"{name} with more than 2 dimensions must be contiguous")
        x = x.view(-1, x.shape[-1])
    return x


def _norm_weight(weight: torch.Tensor, H: int) -> None:
    if H % 8 != 0:
        raise ValueError(f"hidden size {H} must be a multiple of 8")
    _tensor("weight", weight, torch.bfloat16, 1)
    _contig("weight", weight)
    _aligned16("weight", weight)
    if weight.shape[0] != H:
        raise ValueError(f"weight must have length {H}, got {weight.shape[0]}")


def rmsnorm(x: torch.Tensor, weight: torch.Tensor, eps: float, *, out: torch.Tensor | None = None) -> torch.Tensor:
    """Qwen3RMSNorm: ``weight * bf16(x * rsqrt(mean(x^2) + eps))``; bf16 ``x [..., H]`` (row stride allowed)."""
    x2 = _as_rows("x", x)
    T, H = x2.shape
    _norm_weight(weight, H)
    out = _out("out", out, tuple(x.shape), torch.bfloat16, x)
    _same_device(x=x, weight=weight, out=out)
    if T == 0:
        return out
    xs = _rows("x", x2, 1)
    o2 = out.view(-1, H)
    _launch(x, "rmsnorm", "rmsnorm", (T, 1, 1), (_norm_threads(H), 1, 1),
            (_p(x2), _i(xs), _p(weight), _p(o2), _i(H), _i(H), _f(eps)))
    return out


def embed_rmsnorm(ids: torch.Tensor, table: torch.Tensor, weight: torch.Tensor, eps: float
                  ) -> tuple[torch.Tensor, torch.Tensor]:
    """``embedding(ids, table)`` and its ``rmsnorm`` in one launch: (residual, normed), bf16 ``[T, H]`` each,
    the bits of the two launches (out-of-range ids give zero rows)."""
    _int_vec("ids", ids)
    _tensor("table", table, torch.bfloat16, 2)
    _contig("table", table)
    _aligned16("table", table)
    V, H = table.shape
    _norm_weight(weight, H)
    T = ids.shape[0]
    residual = torch.empty((T, H), dtype=torch.bfloat16, device=table.device)
    out = torch.empty((T, H), dtype=torch.bfloat16, device=table.device)
    _same_device(ids=ids, table=table, weight=weight)
    if T == 0:
        return residual, out
    _launch(table, "rmsnorm", "embed_rmsnorm", (T, 1, 1), (_norm_threads(H), 1, 1),
            (_p(ids), _p(table), _i(V), _p(residual), _p(weight), _p(out), _i(H), _f(eps)))
    return residual, out


def add_rmsnorm(x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor, eps: float, *,
                out: torch.Tensor | None = None) -> torch.Tensor:
    """``residual = bf16(residual + x)`` in place, then returns ``rmsnorm(residual)``."""
    x2 = _as_rows("x", x)
    r2 = _as_rows("residual", residual)
    T, H = x2.shape
    if tuple(r2.shape) != (T, H):
        raise ValueError(f"residual must have the shape of x {tuple(x.shape)}, got {tuple(residual.shape)}")
    _norm_weight(weight, H)
    out = _out("out", out, tuple(x.shape), torch.bfloat16, x)
    _same_device(x=x, residual=residual, weight=weight, out=out)
    if T == 0:
        return out
    xs, rs = _rows("x", x2, 1), _rows("residual", r2, 1)
    _launch(x, "rmsnorm", "add_rmsnorm", (T, 1, 1), (_norm_threads(H), 1, 1),
            (_p(x2), _i(xs), _p(r2), _i(rs), _p(weight), _p(out.view(-1, H)), _i(H), _i(H), _f(eps)))
    return out


def _qk_weights(D: int, q_weight: torch.Tensor, k_weight: torch.Tensor) -> None:
    """The q_norm / k_norm weights: contiguous bf16 ``[D]`` each."""
    for name, w in (("q_weight", q_weight), ("k_weight", k_weight)):
        _tensor(name, w, torch.bfloat16, 1)
        _contig(name, w)
        if w.shape[0] != D:
            raise ValueError(f"{name} must have length {D}, got {w.shape[0]}")


def qk_norm_rope(q: torch.Tensor, k: torch.Tensor, q_weight: torch.Tensor, k_weight: torch.Tensor,
                 cos: torch.Tensor, sin: torch.Tensor, positions: torch.Tensor, eps: float, *,
                 rotate_k: bool = True,
                 store: tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor] | None = None,
                 trigger_first: bool = False) -> None:
    """In place: per-head RMSNorm (``q_weight`` / ``k_weight [D]``) then rotate-half RoPE at ``positions``
    (``rotate_k=False``: k gets the norm only, for fused RoPE in the attention kernels).

    ``q [T, n_q, D]``, ``k [T, n_kv, D]`` bf16 (token-row strides allowed); ``cos, sin`` fp32
    ``[max_pos, D/2]``; ``positions`` int32 ``[T]`` (a position outside the table is not rotated).
    ``store = (v, k_cache, v_cache, slot_mapping)``: also ``store_kvcache(k, v, k_cache, v_cache,
    slot_mapping)`` with the finished k, in the same launch (same arguments and checks).
    ``trigger_first=True``: the next launch may be scheduled before this one waits for the one before it (two
    launches waiting at once, pdl.cuh): only for a next launch that reads, before its own wait, nothing a running
    kernel writes -- a decode step's ``split_kv_decode(early=True)`` after this launch's ``store``.
    """
    if not isinstance(trigger_first, bool):
        raise TypeError(f"trigger_first must be a bool, got {type(trigger_first).__name__}")
    _tensor("q", q, torch.bfloat16, 3)
    _tensor("k", k, torch.bfloat16, 3)
    T, n_q, D = q.shape
    if not (k.shape[0] == T and k.shape[2] == D):
        raise ValueError(f"k must have shape [{T}, n_kv, {D}], got {tuple(k.shape)}")
    n_kv = k.shape[1]
    if not (D % 2 == 0 and 2 <= D <= 256):
        raise ValueError(f"head_dim {D} must be even and <= 256")
    _qk_weights(D, q_weight, k_weight)
    _cos_sin(cos, sin, D)
    _int_vec("positions", positions, T)
    _same_device(q=q, k=k, q_weight=q_weight, k_weight=k_weight, cos=cos, sin=sin, positions=positions)
    if T == 0:
        return
    qs = q.stride(0) if T > 1 else n_q * D
    ks = k.stride(0) if T > 1 else n_kv * D
    _need(q.stride(2) == 1 and (n_q == 1 or q.stride(1) == D), "q: heads and head_dim must be contiguous")
    _need(k.stride(2) == 1 and (n_kv == 1 or k.stride(1) == D), "k: heads and head_dim must be contiguous")
    v = kc = vc = slots = None
    vs = 0
    if store is not None:
        v, kc, vc, slots = store
        _tensor("v", v, torch.bfloat16, 3)
        N, bs, c_kv, c_D = _cache_pair(kc, vc)
        if (c_kv, c_D) != (n_kv, D):
            raise ValueError(f"caches hold [{c_kv}, {c_D}] per token, k has [{n_kv}, {D}]")
        if tuple(v.shape) != (T, n_kv, D):
            raise ValueError(f"v must have shape {(T, n_kv, D)}, got {tuple(v.shape)}")
        _need(v.stride(2) == 1 and (n_kv == 1 or v.stride(1) == D), "v: heads and head_dim must be contiguous")
        _int_vec("slot_mapping", slots, T)
        _same_device(q=q, v=v, k_cache=kc, v_cache=vc, slot_mapping=slots)
        vs = v.stride(0) if T > 1 else n_kv * D
    warps = T * (n_q + n_kv)
    _launch(q, "rope", "qk_norm_rope", (-(-warps // 4), 1, 1), (128, 1, 1),
            (_p(q), _i(qs), _p(k), _i(ks), _p(q_weight), _p(k_weight), _p(cos), _p(sin), _p(positions),
             _i(T), _i(n_q), _i(n_kv), _i(D), _i(cos.shape[0]), _f(eps), _i(1 if rotate_k else 0),
             _p(v), _i(vs), _p(kc), _p(vc), _p(slots), _i(1 if trigger_first else 0)))


def silu_mul(x: torch.Tensor, *, out: torch.Tensor | None = None) -> torch.Tensor:
    """``silu(x[:, :I]) * x[:, I:]`` in fp32, rounded once: bf16 ``x [T, 2I]`` -> ``[T, I]``."""
    _tensor("x", x, torch.bfloat16, 2)
    T, I2 = x.shape
    if I2 % 16 != 0:
        raise ValueError(f"x's last dim {I2} must be 2*I with I a multiple of 8")
    I = I2 // 2
    out = _out("out", out, (T, I), torch.bfloat16, x)
    _same_device(x=x, out=out)
    if T == 0:
        return out
    xs = _rows("x", x, 1)
    _launch(x, "activation", "silu_mul", _grid_1d(T * I // 8, 256), (256, 1, 1),
            (_p(x), _i(xs), _p(out), _i(T), _i(I)))
    return out


# --------------------------------------------------------------------------------------
# attention
# --------------------------------------------------------------------------------------

def _attn_q(name: str, q: torch.Tensor) -> tuple[int, int, int, int]:
    _tensor(name, q, torch.bfloat16, 3)
    T, n_q, D = q.shape
    if D not in ATTN_HEAD_DIMS:
        raise ValueError(f"head_dim {D} not supported (kernels exist for {ATTN_HEAD_DIMS})")
    if not (q.stride(2) == 1 and (n_q == 1 or q.stride(1) == D)):
        raise ValueError(f"{name}: heads and head_dim must be contiguous")
    qs = _rows(name, q, 2) if T > 0 else n_q * D
    return T, n_q, D, qs


def _gqa(n_q: int, n_kv: int, max_group: int | None = None) -> int:
    if not (n_kv > 0 and n_q % n_kv == 0):
        raise ValueError(f"n_q = {n_q} must be a multiple of n_kv = {n_kv}")
    g = n_q // n_kv
    if max_group is not None:
        if not g <= max_group:
            raise ValueError(f"GQA group {g} exceeds {max_group}")
    return g


def paged_prefill(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, block_tables: torch.Tensor,
                  seq_lens: torch.Tensor, q_seq_idx: torch.Tensor, q_pos: torch.Tensor, scale: float | None = None,
                  *, out: torch.Tensor | None = None, variant: str | None = None,
                  rope: tuple[torch.Tensor, torch.Tensor] | None = None,
                  mean_keys: float | None = None) -> torch.Tensor:
    """Causal attention by absolute position over each sequence's pages (twin: ``reference.attention.paged_prefill``).

    ``q [T, n_q, D]`` bf16 (token-row stride allowed); caches bf16 ``[N, bs, n_kv, D]``;
    ``block_tables`` int32 ``[B, M]``; ``seq_lens`` int32 ``[B]``; ``q_seq_idx, q_pos`` int32 ``[T]``
    (``q_pos < 0``: padding row, written as zeros). The caller has run the guards
    (``check_block_tables`` / ``check_query_positions``). Rows of one sequence are best kept
    contiguous in ``T`` (one chunk per sequence, padding anywhere): the kernel stays correct
    otherwise but a CTA then makes one pass over the KV per sequence it holds.
    ``rope=(cos, sin)`` (fp32 ``[max_pos, D/2]``): the caches hold pre-RoPE keys, rotated in the
    kernel at their absolute positions (fused RoPE). ``mean_keys``: the mean count of keys a query row
    sees, where the caller knows it on the host (the runner does); only ``prefill_variant``'s choice of
    kernel reads it, never the result. Returns bf16 ``[T, n_q, D]``.
    """
    T, n_q, D, qs = _attn_q("q", q)
    N, bs, n_kv, Dc = _cache_pair(k_cache, v_cache)
    if Dc != D:
        raise ValueError(f"cache head_dim {Dc} != q head_dim {D}")
    _block_size(bs)
    G = _gqa(n_q, n_kv, PREFILL_ROWS)
    B, M = _block_tables(block_tables, seq_lens, None)
    _int_vec("q_seq_idx", q_seq_idx, T)
    _int_vec("q_pos", q_pos, T)
    out = _out("out", out, (T, n_q, D), torch.bfloat16, q)
    cos_p, sin_p, max_pos = _rope_tables(rope, D)
    _same_device(q=q, k_cache=k_cache, v_cache=v_cache, block_tables=block_tables, seq_lens=seq_lens,
                 q_seq_idx=q_seq_idx, q_pos=q_pos, out=out, cos=None if rope is None else rope[0])
    if T == 0:
        return out
    if not n_kv <= 65535:
        raise ValueError(f"n_kv = {n_kv} exceeds the grid limit")
    dev = _device_index(q)
    if variant is None:
        variant = prefill_variant(T, n_q, n_kv, D, _num_sms(dev), ws="ws" in prefill_variants(D, dev),
                                  mean_keys=mean_keys)
    if variant not in PREFILL_VARIANTS[D]:
        raise ValueError(f"unknown prefill variant {variant!r} for D={D}")
    wgmma = variant in PREFILL_WGMMA
    if wgmma:
        if variant not in prefill_variants(D, dev):
            raise ValueError(f"prefill variant {variant!r} needs the attention kernels built for {PREFILL_WGMMA[variant]} "
                             f"(a compute-capability-9.0 GPU; kernels.ARCH_TARGETS)")
    kname, block_n, block_m, mt = PREFILL_VARIANTS[D][variant]
    ring = PREFILL_WS_STAGES.get(variant, 0)
    tt = block_m // G
    tiles = -(-T // tt)
    if ring:                       # work items in heaviest-first order, WS_CTAS_PER_SM CTAs a multiprocessor
        items = tiles * n_kv
        cap = WS_CTAS_PER_SM * _num_sms(dev) if T <= WS_PERSISTENT_MAX_CHUNK * B else 0
        grid = (min(items, cap) if cap > 0 else items, 1, 1)
    elif wgmma:                    # a KV head's tiles together (attention.cu: the CTAs' order)
        grid = (tiles, n_kv, 1)
    else:                          # every KV head of the heaviest tile first
        if not tiles <= 65535:
            raise ValueError(f"{T} query tokens make {tiles} tiles of {tt}: more than the grid's 65535; "
                             f"prefill them in chunks")
        grid = (n_kv, tiles, 1)
    smem = prefill_smem_bytes(D, block_n, block_m, mt, swizzled=wgmma, ring=ring)
    threads = 3 * block_m if ring else 2 * block_m // mt   # ws: a producer warpgroup + one consumer per 64 rows
    _launch(q, "attention", kname, grid, (threads, 1, 1),
            (_p(q), _i(qs), _p(k_cache), _p(v_cache), _p(block_tables), _i(M), _p(seq_lens), _p(q_seq_idx),
             _p(q_pos), _p(out), _i(T), _i(B), _i(n_q), _i(n_kv), _i(bs), _f(_scale(scale, D)),
             cos_p, sin_p, max_pos), smem)
    return out


#: ``prefill_variant`` takes the warp-specialised kernel only where a query row sees at least this many keys on
#: average (when the caller says): on short fresh chunks its one CTA a multiprocessor does not beat x2's two (H200,
#: 32 sequences x 256 new tokens over no prefix, 128.5 keys a row: ws 0.95x x2 on the persistent grid without the
#: consumers' turns, about 0.99x with them; 64 x 128 over 128, 192.5 keys: 0.99x; 8 x 1024 over none, 512.5 keys:
#: 1.08x; docs/performance/prefill.md, "Warp specialisation")
WS_MIN_MEAN_KEYS = 256


def prefill_variant(T: int, n_q: int, n_kv: int, D: int, num_sms: int, ws: bool = False,
                    mean_keys: float | None = None) -> str:
    """The paged-prefill kernel ``paged_prefill(variant=None)`` launches. Where the two-tiles-per-warp
    kernel's grid (``x2``: 128 query rows per CTA) still gives every multiprocessor its two resident
    CTAs: the warp-specialised wgmma kernel (``ws``) where the device's build has it (``ws=True``: a
    compute-capability-9.0 GPU) unless the caller's ``mean_keys`` is below ``WS_MIN_MEAN_KEYS``, else
    x2. Smaller grids get the 64-row kernel (short prefills keep more, smaller CTAs in flight). Every
    choice gives the same bits (``PREFILL_VARIANTS``). Never ``wg64`` / ``wg128``: they gave no speed
    over the mma.sync kernels; a caller may name them. Measured on the H200 in
    docs/performance/prefill.md."""
    if "x2" not in PREFILL_VARIANTS.get(D, {}):
        return "default"
    block_m = PREFILL_VARIANTS[D]["x2"][2]
    G = max(1, n_q // max(1, n_kv))
    ctas = -(-T // max(1, block_m // G)) * n_kv
    if ctas < 2 * num_sms:
        return "default"
    if ws and "ws" in PREFILL_VARIANTS[D] and (mean_keys is None or mean_keys >= WS_MIN_MEAN_KEYS):
        return "ws"
    return "x2"


def _default_max_splits(block_tables: torch.Tensor, block_size: int, split_size: int) -> int:
    """Splits of the longest sequence a table can describe (no device read, so no host sync)."""
    return max(1, -(-(block_tables.shape[1] * block_size) // split_size))


def split_kv_partials(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, block_tables: torch.Tensor,
                      seq_lens: torch.Tensor, split_size: int, scale: float | None = None,
                      max_splits: int | None = None, *, o_part: torch.Tensor | None = None,
                      lse_part: torch.Tensor | None = None, row_seq: torch.Tensor | None = None,
                      rope: tuple[torch.Tensor, torch.Tensor] | None = None, early: bool = False,
                      _fused_out: torch.Tensor | None = None,
                      _qk: tuple | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """Partial states of every split (twin: ``reference.attention.split_kv_partials``).

    ``q [B, n_q, D]`` bf16 (one query per sequence; row stride allowed). Split ``k`` covers key
    positions ``[k*split_size, (k+1)*split_size)`` clipped to ``seq_lens[b]``. ``max_splits``
    defaults to ``ceil(max_blocks * block_size / split_size)`` (an upper bound known without reading
    the device); splits past a sequence's end write ``o = 0, lse = -inf``.
    ``row_seq`` (int32 ``[B]``): row ``b`` reads block-table row ``row_seq[b]`` instead of ``b``
    (batch-invariant prefill: one row per token, ``seq_lens`` = its position + 1; the caller's
    guards have checked the indices). ``rope``: fused RoPE, as in ``paged_prefill``.
    ``early=True`` (``split_kv_early_partials``, the same bits): a decode step after the launch that stored its
    K/V, where that launch wrote at most each sequence's last key (position ``seq_lens[b] - 1``); the cached
    rows of every other key of the first two tiles are read before the wait for that launch (pdl.cuh), so no
    kernel still running may write them. No ``row_seq``.
    Returns fp32 ``o_part [B, max_splits, n_q, D]`` and natural-log ``lse_part [B, max_splits, n_q]``.
    (``_fused_out``, bf16 ``[B, n_q, D]``: ``split_kv_decode``'s one-launch mode, where the kernel also
    folds the splits into it and the partials are scratch; see attention.cu. ``_qk``: the arguments
    ``split_kv_decode(norm_rope=...)`` checked, for ``split_kv_qk_partials``.)
    """
    B, n_q, D, qs = _attn_q("q", q)
    N, bs, n_kv, Dc = _cache_pair(k_cache, v_cache)
    if Dc != D:
        raise ValueError(f"cache head_dim {Dc} != q head_dim {D}")
    _block_size(bs)
    G = _gqa(n_q, n_kv)
    _, M = _block_tables(block_tables, seq_lens, B, row_seq)
    if not isinstance(early, bool):
        raise TypeError(f"early must be a bool, got {type(early).__name__}")
    _need(not early or (row_seq is None and _qk is None),
          "early takes no row_seq (one query row per sequence), and norm_rope's launch reads early already")
    split_size = int(split_size)
    if not 1 <= split_size <= _I32_MAX:
        raise ValueError(f"split_size must be in [1, 2**31), got {split_size}")
    S = _default_max_splits(block_tables, bs, split_size) if max_splits is None else int(max_splits)
    if not S >= 1:
        raise ValueError(f"max_splits must be >= 1, got {S}")
    o_part = _out("o_part", o_part, (B, S, n_q, D), torch.float32, q)
    lse_part = _out("lse_part", lse_part, (B, S, n_q), torch.float32, q)
    cos_p, sin_p, max_pos = _rope_tables(rope, D)
    _same_device(q=q, k_cache=k_cache, v_cache=v_cache, block_tables=block_tables, seq_lens=seq_lens,
                 o_part=o_part, lse_part=lse_part, row_seq=row_seq, cos=None if rope is None else rope[0],
                 out=_fused_out)
    if B == 0:
        return o_part, lse_part
    HG = -(-G // DECODE_QUERY_HEADS)
    _need(B <= 65535 and n_kv * HG <= 65535, "batch or KV-head count exceeds the grid limits")
    grid = (S, n_kv * HG, B)
    tickets = None
    if _fused_out is not None:  # one split per sequence never takes a ticket (its CTA writes out directly)
        if not (S == 1 or B * n_kv * HG <= _TICKETS):
            raise ValueError(f"split_kv_decode: {B * n_kv * HG} (sequence, head group) pairs "
                             f"exceed the ticket array ({_TICKETS})")
        tickets = _kernel_tickets(q)
    smem = decode_smem_bytes(D)
    if _qk is not None:  # qk_norm_rope and its KV store in the launch (split_kv_decode's norm_rope)
        k, ks, v, vs, qw, kw, cos, sin, positions, slots, eps = _qk
        cluster = _fused_out is not None and DECODE_CLUSTER and 2 <= S <= DECODE_CLUSTER_MAX and _clusters_ok(q)
        _launch(q, "attention", f"split_kv_qk_partials_d{D}", grid, (128, 1, 1),
                (_p(q), _i(qs), _p(k), _i(ks), _p(v), _i(vs), _p(qw), _p(kw), _p(cos), _p(sin), _i(cos.shape[0]),
                 _f(eps), _p(positions), _p(slots), _p(k_cache), _p(v_cache), _p(block_tables), _i(M), _p(seq_lens),
                 _p(o_part), _p(lse_part), _i(n_q), _i(n_kv), _i(bs), _i(split_size), _i(S), _f(_scale(scale, D)),
                 _p(_fused_out), _p(tickets), _i(1 if cluster else 0)), smem, DECODE_CTAS_PER_SM,
                S if cluster else 1)
        return o_part, lse_part
    _launch(q, "attention", f"split_kv_{'early_' if early else ''}partials_d{D}", grid, (128, 1, 1),
            (_p(q), _i(qs), _p(k_cache), _p(v_cache), _p(block_tables), _i(M), _p(seq_lens), _p(o_part),
             _p(lse_part), _i(n_q), _i(n_kv), _i(bs), _i(split_size), _i(S), _f(_scale(scale, D)),
             _p(row_seq), cos_p, sin_p, max_pos, _p(_fused_out), _p(tickets)), smem, DECODE_CTAS_PER_SM)
    return o_part, lse_part


def split_kv_reduce(o_part: torch.Tensor, lse_part: torch.Tensor, *, out: torch.Tensor | None = None,
                    lse_out: torch.Tensor | None = None) -> torch.Tensor:
    """Fold splits ``0 .. S-1`` in index order (twin: ``reference.attention.reduce_splits``).

    fp32 ``o_part [B, S, n_q, D]``, ``lse_part [B, S, n_q]`` -> bf16 ``out [B, n_q, D]``; the merged
    lse is written to ``lse_out`` (fp32 ``[B, n_q]``) when given.
    """
    _tensor("o_part", o_part, torch.float32, 4)
    _tensor("lse_part", lse_part, torch.float32, 3)
    _contig("o_part", o_part)
    _contig("lse_part", lse_part)
    _aligned16("o_part", o_part)
    B, S, n_q, D = o_part.shape
    if tuple(lse_part.shape) != (B, S, n_q):
        raise ValueError(f"lse_part must have shape {(B, S, n_q)}, got {tuple(lse_part.shape)}")
    _need(S >= 1, "at least one split is needed")
    if D % 4 != 0:
        raise ValueError(f"head_dim {D} must be a multiple of 4")
    out = _out("out", out, (B, n_q, D), torch.bfloat16, o_part)
    if lse_out is not None:
        lse_out = _out("lse_out", lse_out, (B, n_q), torch.float32, o_part)
    _same_device(o_part=o_part, lse_part=lse_part, out=out, lse_out=lse_out)
    if B * n_q == 0:
        return out
    total = B * n_q * (D // 4)
    _launch(o_part, "attention", "split_kv_reduce", (-(-total // 256), 1, 1), (256, 1, 1),
            (_p(o_part), _p(lse_part), _p(out), _p(lse_out), _i(B), _i(n_q), _i(D), _i(S)))
    return out


#: ``split_kv_decode(norm_rope=...)`` in one launch with 2 .. ``DECODE_CLUSTER_MAX`` splits a sequence: the
#: splits of a sequence are one thread-block cluster and fold through distributed shared memory instead of
#: a ticket (attention.cu, ``cluster_fold``; the same bits). Off (``False``): the ticket. Read at launch (a
#: CUDA graph keeps what it was captured with).
DECODE_CLUSTER = True
#: the most CTAs of a cluster (8: the portable limit, attention.cu's ``kClusterMax``)
DECODE_CLUSTER_MAX = 8


def _clusters_ok(ref: torch.Tensor) -> bool:
    """Whether a launch on ``ref``'s device can have clusters: the driver's path (PDL), sm_90+."""
    return ref.device.type == "cuda" and launch.pdl_enabled(_cc_major(_device_index(ref)))


def gemm_wide_available(ref: torch.Tensor) -> bool:
    """Whether ``gemm`` can take its wide kernel on ``ref``'s device (the tensor maps need the driver's launch path,
    sm_90+); ``gemm_choice`` decides by shape where it can."""
    return _clusters_ok(ref)


#: ``split_kv_decode`` fuses its reduce into the partials launch up to this many rows, and at any row count
#: when each sequence has one split (then nothing is folded: each CTA writes its output, where two launches
#: would write fp32 partials and copy them). Measured on the H200 (kernel lab, docs/performance/decode_attention.md): one
#: launch wins at batch 1-8 (latency-bound), two launches won by 3-9% at batch 32-128 with several splits,
#: where the separate reduce is fully parallel and the fused kernel's last CTAs fold in the tail.
FUSED_DECODE_MAX_B = 16


def split_kv_decode(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, block_tables: torch.Tensor,
                    seq_lens: torch.Tensor, split_size: int | None, scale: float | None = None, *,
                    max_splits: int | None = None, out: torch.Tensor | None = None,
                    row_seq: torch.Tensor | None = None,
                    rope: tuple[torch.Tensor, torch.Tensor] | None = None, fused: bool | None = None,
                    norm_rope: tuple | None = None, early: bool = False) -> torch.Tensor:
    """Decode attention of one query per sequence (twin: ``reference.attention.split_kv_decode``).

    ``split_size=None`` runs one split over all keys. Partials go to ``torch.empty`` scratch on the
    same device. ``row_seq`` and ``rope`` as in ``split_kv_partials``. Returns bf16 ``[B, n_q, D]``.
    ``fused=True``: one launch, the last CTA of each sequence folds its splits (and a sequence with
    one non-empty split writes no partials); ``fused=False``: ``split_kv_partials`` then
    ``split_kv_reduce``; ``None`` (default): fused for at most ``FUSED_DECODE_MAX_B`` rows or one split
    (``max_splits == 1``, or ``split_size=None``). Both give
    the same bits; the fused launches of one device share a ticket array, so they must be ordered
    (one stream), as they are in the engine.

    ``norm_rope = (k, v, q_weight, k_weight, cos, sin, positions, slot_mapping, eps)``: a decode step's
    ``qk_norm_rope(q, k, q_weight, k_weight, cos, sin, positions, eps, store=(v, k_cache, v_cache,
    slot_mapping))`` in the same launch (``split_kv_qk_partials``; the same bits as the two calls): ``q``,
    ``k [B, n_kv, D]`` and ``v`` are the qkv GEMM's raw rows, which stay as they are (the normed rows go
    to the attention and, K and V, to the caches). Each sequence's new key must be its last one:
    ``positions[b] == seq_lens[b] - 1`` and ``slot_mapping[b]`` that position's slot in ``block_tables``
    (a decode step; a row of length 0 is padding). The launch reads every other cached key before it
    waits for the kernel before it (pdl.cuh), so no kernel still running may write them. No ``row_seq``
    or ``rope``. In one launch with 2 .. ``DECODE_CLUSTER_MAX`` splits a sequence, the splits fold in a
    thread-block cluster (``DECODE_CLUSTER``; the same bits as the ticket).

    ``early=True``: the decode step's K/V were stored by the launch before this one (``qk_norm_rope(store=...)``),
    so this one may read the other cached keys of its first two tiles before it waits (``split_kv_partials``'
    ``early``; the same bits). Not with ``norm_rope`` or ``row_seq``.
    """
    _tensor("block_tables", block_tables, torch.int32, 2)
    _tensor("k_cache", k_cache, torch.bfloat16, 4)
    qk = None
    if norm_rope is not None:
        _need(row_seq is None and rope is None, "norm_rope takes neither row_seq nor rope")
        qk = _norm_rope_args(q, k_cache, v_cache, norm_rope)
    if split_size is None:
        split_size = max(1, block_tables.shape[1] * k_cache.shape[1])
        max_splits = 1
    if fused is None:
        fused = q.shape[0] <= FUSED_DECODE_MAX_B or max_splits == 1
    if not fused:
        o_part, lse_part = split_kv_partials(q, k_cache, v_cache, block_tables, seq_lens, split_size, scale,
                                             max_splits, row_seq=row_seq, rope=rope, early=early, _qk=qk)
        return split_kv_reduce(o_part, lse_part, out=out)
    _tensor("q", q, torch.bfloat16, 3)
    out = _out("out", out, tuple(q.shape), torch.bfloat16, q)
    _contig("out", out)
    split_kv_partials(q, k_cache, v_cache, block_tables, seq_lens, split_size, scale, max_splits,
                      row_seq=row_seq, rope=rope, early=early, _fused_out=out, _qk=qk)
    return out


def _norm_rope_args(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, norm_rope: tuple) -> tuple:
    """``split_kv_decode``'s ``norm_rope``, checked as ``qk_norm_rope`` checks its arguments -> the launch's
    (k, k row stride, v, v row stride, q_weight, k_weight, cos, sin, positions, slots, eps)."""
    _need(isinstance(norm_rope, tuple) and len(norm_rope) == 9,
          "norm_rope must be (k, v, q_weight, k_weight, cos, sin, positions, slot_mapping, eps)")
    k, v, qw, kw, cos, sin, positions, slots, eps = norm_rope
    B, n_q, D, _ = _attn_q("q", q)
    _, _, c_kv, c_D = _cache_pair(k_cache, v_cache)
    for name, t in (("k", k), ("v", v)):
        _tensor(name, t, torch.bfloat16, 3)
        if tuple(t.shape) != (B, c_kv, D):
            raise ValueError(f"{name} must have shape {(B, c_kv, D)}, got {tuple(t.shape)}")
        if not (t.stride(2) == 1 and (c_kv == 1 or t.stride(1) == D)):
            raise ValueError(f"{name}: heads and head_dim must be contiguous")
    if c_D != D:
        raise ValueError(f"cache head_dim {c_D} != q head_dim {D}")
    _qk_weights(D, qw, kw)
    _cos_sin(cos, sin, D)
    _int_vec("positions", positions, B)
    _int_vec("slot_mapping", slots, B)
    if not (math.isfinite(float(eps)) and float(eps) > 0):
        raise ValueError(f"eps must be a positive number, got {eps}")
    _same_device(q=q, k=k, v=v, q_weight=qw, k_weight=kw, cos=cos, sin=sin, positions=positions,
                 slot_mapping=slots, k_cache=k_cache)
    ks = _rows("k", k, 2) if B > 0 else c_kv * D
    vs = _rows("v", v, 2) if B > 0 else c_kv * D
    return k, ks, v, vs, qw, kw, cos, sin, positions, slots, float(eps)


def merge_states(o: torch.Tensor, lse: torch.Tensor, *, out: torch.Tensor | None = None,
                 lse_out: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """Fold ``N`` partial states in the given order (twin: ``reference.attention.merge_states``).

    fp32 ``o [N, ..., D]``, ``lse [N, ...]`` (already sorted by global block index, duplicates
    rejected -- that stays in Python) -> fp32 ``o [..., D]``, ``lse [...]``.
    """
    _tensor("o", o, torch.float32)
    _tensor("lse", lse, torch.float32)
    _contig("o", o)
    _contig("lse", lse)
    if not (o.dim() >= 2 and lse.dim() == o.dim() - 1 and tuple(lse.shape) == tuple(o.shape[:-1])):
        raise ValueError(f"o [N, ..., D] and lse [N, ...] disagree: {tuple(o.shape)} / {tuple(lse.shape)}")
    N, D = o.shape[0], o.shape[-1]
    _need(N >= 1, "no partial states to merge")
    R = math.prod(o.shape[1:-1])
    out = _out("out", out, tuple(o.shape[1:]), torch.float32, o)
    lse_out = _out("lse_out", lse_out, tuple(lse.shape[1:]), torch.float32, o)
    _same_device(o=o, lse=lse, out=out, lse_out=lse_out)
    if R * D == 0:
        return out, lse_out
    _launch(o, "attention", "merge_states", (-(-(R * D) // 256), 1, 1), (256, 1, 1),
            (_p(o), _p(lse), _p(out), _p(lse_out), _i(N), _i(R), _i(D)))
    return out, lse_out


# --------------------------------------------------------------------------------------
# the batch-invariant GEMM
# --------------------------------------------------------------------------------------

#: gemm.cu's chunk of the canonical order (K columns); ``KC`` in the kernel source
GEMM_CHUNK = 512
#: gemm.cu instantiations: name -> (BM, BN, warps, BK, stages, split). Every one computes each element
#: in the same canonical order, so the choice (``gemm_choice``) changes speed only.
GEMM_TILES: dict[str, tuple[int, int, int, int, int, bool]] = {
    "16x32": (16, 32, 2, 128, 4, False),
    "64x64": (64, 64, 4, 64, 4, False),
    "128x64": (128, 64, 4, 32, 4, False),
    "split_16x64": (16, 64, 4, 128, 4, True),
    "split_64x64": (64, 64, 4, 64, 4, True),
}
#: largest fp32 workspace (chunks x M x N) a split launch may take; past it the folding kernel runs
GEMM_SPLIT_WORKSPACE = 64 << 20
#: gemm.cu's staged kernels for decode rows (``gemm_staged_m{R}_s{S}c{CPS}``): name -> (x rows R a stage holds,
#: so ``M <= R``; stages S; chunks a stage CPS; CTAs a multiprocessor, ``x2`` in the name). The same canonical
#: order as ``GEMM_TILES``.
GEMM_STAGED: dict[str, tuple[int, int, int, int]] = {
    "staged_m8_s4c2": (8, 4, 2, 1),
    "staged_m8_s4c1x2": (8, 4, 1, 2),
    "staged_m16_s3c1x2": (16, 3, 1, 2),
    "staged_m16_s3c2": (16, 3, 2, 1),
    "staged_m32_s2c1x2": (32, 2, 1, 2),
    "staged_m32_s4c1": (32, 4, 1, 1),
}
#: the largest weights (N x K elements) that take the staged kernel at 9-16 and at 17-32 rows (``gemm_choice``)
GEMM_STAGED_MAX_ELEMS = {16: 9 << 19, 32: 8 << 20}
_GEMM_STAGED_THREADS = 32 * 5   # 4 consumer warps and the producer warp (kGsCW + 1)
#: the most dynamic shared memory of a staged gemm kernel that still leaves room for two CTAs a multiprocessor
#: (228 KB, less 1 KB reserved and about 2 KB of static shared memory a CTA)
GEMM_STAGED_TWO_CTAS = 110 * 1024


#: gemm.cu's wide kernels for decode rows (``gemm_wide_m{R}_n{TW}_k{KS}s{S}``; ``w8``, ``w16``: eight or sixteen
#: consumer warps, four without): name -> (x rows R a stage holds, so ``M <= R``; weight rows TW a tile; columns KS
#: a stage; stages S; consumer warps). Each stage is two tensor copies (``launch.encode_block_map``), so K must be a
#: multiple of 64. The same canonical order as ``GEMM_TILES``.
GEMM_WIDE: dict[str, tuple[int, int, int, int, int]] = {
    "wide_m16_n64_k256s4": (16, 64, 256, 4, 4),
    "wide_m16_n64_k512s2": (16, 64, 512, 2, 4),
    "wide_m32_n32_k256s3": (32, 32, 256, 3, 4),
    "wide_m32_n64_k256s4": (32, 64, 256, 4, 4),
    "wide_m32_n64_k512s2": (32, 64, 512, 2, 4),
    "wide_m64_n32_k256s2": (64, 32, 256, 2, 4),
    "wide_m64_n32_k256s2w8": (64, 32, 256, 2, 8),
    "wide_m64_n64_k256s3w8": (64, 64, 256, 3, 8),
    "wide_m128_n32_k256s2w8": (128, 32, 256, 2, 8),
    "wide_m128_n64_k128s4w8": (128, 64, 128, 4, 8),
    "wide_m128_n64_k128s4w16": (128, 64, 128, 4, 16),
}


#: a wide gemm launch copies its first stages' weights before its PDL wait (all of its stages) where the weight has at
#: least this many elements, none below (the H200, with it on every GEMM: qwen3-0.6b steps of 1-8 rows 3-6% slower;
#: qwen3-8b's 0.5-1.7% faster with the SwiGLU launch's early trigger, level with the late one; docs/performance/batch_invariant.md,
#: "The wide kernel's launches")
GEMM_WIDE_PRE_MIN_ELEMS = 16 << 20
#: stages copied before the wait when ``gemm`` is not told, whatever the weight's size (``None``: the rule above; a lab
#: switch, read at launch: a CUDA graph keeps what it was captured with). The bits do not depend on it.
GEMM_WIDE_PRE: int | None = None
#: a wide gemm launch of at most one CTA a multiprocessor asks at least this much shared memory, so that no two of its
#: CTAs share a multiprocessor: with programmatic dependent launch its CTAs are placed while the kernel before still
#: runs, on the multiprocessors that kernel frees first, which would take two each where two fit. 0: off (a lab switch)
GEMM_WIDE_ONE_CTA_SMEM = 120 * 1024
#: a SwiGLU launch of the wide gemm of at most this many rows lets the next kernel (the down GEMM) be scheduled only as
#: its CTAs exit, not as soon as each has passed its PDL wait as every other launch does: the down GEMM's CTAs would
#: otherwise be placed on the multiprocessors this launch frees first (a lab switch, read at launch; 0: never)
GEMM_SWIGLU_LATE_MAX_M = 16


def _wide_pre(pre: int | None, stages: int, elems: int) -> int:
    """The stages a wide gemm launch copies before its PDL wait: ``pre`` if given, else ``GEMM_WIDE_PRE`` if set,
    else all ``stages`` for a weight of ``GEMM_WIDE_PRE_MIN_ELEMS`` elements or more and none below."""
    if pre is not None:
        return pre
    if GEMM_WIDE_PRE is not None:
        return GEMM_WIDE_PRE
    return stages if elems >= GEMM_WIDE_PRE_MIN_ELEMS else 0


def gemm_wide_smem(rows: int, tw: int, ks: int, stages: int) -> int:
    """Dynamic shared memory of a wide gemm launch: 1 KB to align the stages to 1024 bytes (the copies' swizzle),
    then ``stages`` x (``tw`` weight rows + ``rows`` x rows) of ``ks`` bf16."""
    return 1024 + stages * (tw + rows) * ks * 2


def gemm_staged_smem(rows: int, stages: int, cps: int = 1) -> int:
    """Dynamic shared memory of a staged gemm launch: ``stages`` x (``rows`` x rows + 16 weight rows) of ``cps``
    chunks, rows ``2 cps GEMM_CHUNK + 16`` bytes apart (``gs_rs`` in gemm.cu)."""
    return stages * (rows + 16) * (cps * GEMM_CHUNK * 2 + 16)


def gemm_tile(M: int, N: int, K: int) -> str:
    """The split or folding tile (``GEMM_TILES``) for an ``M x N x K`` product: K-parallel split tiles for
    decode-sized M (at least two chunks and a small workspace), one-CTA-per-tile folding kernels otherwise.
    ``gemm_choice`` takes it wherever the staged kernel does not run."""
    chunks = -(-K // GEMM_CHUNK)
    split_ok = chunks >= 2 and chunks * M * N * 4 <= GEMM_SPLIT_WORKSPACE
    if M <= 16:
        return "split_16x64" if split_ok else "16x32"
    if M <= 64:
        return "split_64x64" if split_ok else "64x64"
    return "64x64" if M <= 256 else "128x64"


def gemm_choice(M: int, N: int, K: int, tensor_maps: bool = True) -> str:
    """The kernel ``gemm`` uses for an ``M x N x K`` product -- a speed choice only, every kernel computes the
    canonical order. From the H200's figures (docs/performance/batch_invariant.md, "The wide kernel of the batch-invariant GEMM"):

    * up to 128 rows with K a multiple of 64: the wide kernel (up to 16 rows only for N >= 4096; below that its
      64-row tiles leave most multiprocessors idle), the build by rows and N; at 65-96 rows of N >= 6144, sixteen
      consumer warps;
    * else the staged kernel for up to 8 rows over K > 1024 and for up to 16 (32) rows of small weights
      (``GEMM_STAGED_MAX_ELEMS``); else ``gemm_tile``.

    ``tensor_maps=False`` (no driver launch path, which the wide kernel's tensor maps need): the rule without the
    wide kernel."""
    if tensor_maps and K % 64 == 0 and M <= 128 and (M > 16 or N >= 4096):
        if M <= 16:
            return "wide_m16_n64_k256s4"
        if M <= 32:
            return "wide_m32_n32_k256s3" if N < 8448 else "wide_m32_n64_k256s4"
        if M <= 64:
            return "wide_m64_n32_k256s2w8" if N < 6144 else "wide_m64_n64_k256s3w8"
        if N < 6144:
            return "wide_m128_n32_k256s2w8"
        return "wide_m128_n64_k128s4w16" if M <= 96 else "wide_m128_n64_k128s4w8"
    if M == 1 or (M <= 8 and K > 2 * GEMM_CHUNK):
        return "staged_m8_s4c2"
    if M <= 16 and N * K <= GEMM_STAGED_MAX_ELEMS[16]:
        return "staged_m16_s3c2"
    if 16 < M <= 32 and N * K <= GEMM_STAGED_MAX_ELEMS[32]:
        return "staged_m32_s2c1x2"
    return gemm_tile(M, N, K)


def _kernel_tickets(ref: torch.Tensor) -> torch.Tensor:
    """The per-device ticket array of the last-CTA-folds kernels (gemm's split tiles, the fused split-KV
    decode): zeros, and every launch leaves it zero."""
    dev = _device_index(ref)
    t = _tickets.get(dev)
    if t is None:
        with _lock:
            t = _tickets.get(dev)
            if t is None:
                t = torch.zeros(_TICKETS, dtype=torch.int32, device=ref.device)
                _tickets[dev] = t
    return t


def _linear_shape(x: torch.Tensor, w: torch.Tensor) -> tuple[int, int, int]:
    """``(M, N, K)`` of ``x [M, K] @ w [N, K].T`` with the checks ``gemm`` and ``skinny_gemm`` share:
    bf16 2-D operands, equal K, ``K % 8 == 0`` (16-byte loads)."""
    _tensor("x", x, torch.bfloat16, 2)
    _tensor("w", w, torch.bfloat16, 2)
    M, K = x.shape
    N = w.shape[0]
    if w.shape[1] != K:
        raise ValueError(f"w must have shape [N, {K}], got {tuple(w.shape)}")
    if not (K % 8 == 0 and K > 0):
        raise ValueError(f"K = {K} must be a positive multiple of 8")
    return M, N, K


def _linear_out(x: torch.Tensor, w: torch.Tensor, out_dtype: torch.dtype,
                out: torch.Tensor | None, width: int | None = None) -> tuple[torch.Tensor, int]:
    """The output ``[M, width]`` (``width``: N by default; given or new) and x's row stride, after the
    layout checks the GEMM kernels need: w contiguous and 16-byte aligned, x rows contiguous and 16-byte
    aligned (row stride 0 for M = 0)."""
    M, K = x.shape
    _contig("w", w)
    _aligned16("w", w)
    if out_dtype not in (torch.bfloat16, torch.float32):
        raise ValueError(f"out_dtype must be bfloat16 or float32, got {out_dtype}")
    out = _out("out", out, (M, w.shape[0] if width is None else width), out_dtype, x)
    _contig("out", out)
    _same_device(x=x, w=w, out=out)
    if M == 0:
        return out, 0
    ldx = _rows("x", x, 1) if M > 1 else K
    _need(x.stride(1) == 1 and ldx % 8 == 0 and x.data_ptr() % 16 == 0,
          "x: rows must be contiguous, 16-byte aligned, with a row stride that is a multiple of 8")
    return out, ldx


def gemm(x: torch.Tensor, w: torch.Tensor, *, out_dtype: torch.dtype = torch.bfloat16, out: torch.Tensor | None = None,
         tile: str | None = None, swiglu: bool = False, pre: int | None = None) -> torch.Tensor:
    """``y = x @ w.T`` in a fixed reduction order (twin: ``reference.model.linear(..., batch_invariant=True)``).

    ``x [M, K]`` bf16 (row stride allowed), ``w [N, K]`` bf16 contiguous, ``K % 8 == 0``, ``N`` even;
    fp32 accumulation, output bf16 or fp32 ``[M, N]``. Row ``m`` of the result depends on row ``m``
    of ``x`` and on ``w`` only -- bitwise, whatever ``M`` is and whichever kernel runs (``tile`` forces
    one of ``GEMM_TILES``, ``GEMM_STAGED`` or ``GEMM_WIDE``; the default is ``gemm_choice``). Split tiles take an
    fp32 workspace (``torch.empty``, capturable in a CUDA graph) and a per-device ticket array; launches that share
    a device must be ordered (one stream), as they are in the engine.

    ``swiglu``: ``w = [gate | up]`` ``[2I, K]`` (``I % 8 == 0``) and the result is ``silu_mul(gemm(x, w))`` ``[M, I]``
    bf16, bit for bit: on a wide tile in one launch (the SwiGLU epilogue), elsewhere by the two launches.
    ``pre``: stages whose weights a wide tile's CTA copies before its programmatic-dependent-launch wait (default:
    ``_wide_pre``'s rule; 0: none; the bits do not depend on it).
    """
    M, N, K = _linear_shape(x, w)
    if N % 2 != 0:
        raise ValueError(f"N = {N} must be even")
    _need(N <= _I32_MAX and M <= 65535 * 16, "gemm: shape exceeds the grid limits")
    if not (pre is None or (isinstance(pre, int) and not isinstance(pre, bool) and pre >= 0)):
        raise ValueError(f"pre must be a non-negative int, got {pre!r}")
    if swiglu:
        if N % 16 != 0:
            raise ValueError(f"swiglu: w's rows {N} must be 2*I with I a multiple of 8")
        if out_dtype != torch.bfloat16:
            raise ValueError(f"swiglu: the output is bf16, got out_dtype {out_dtype}")
    maps_ok = gemm_wide_available(x)
    name = gemm_choice(M, N, K, tensor_maps=maps_ok) if tile is None else tile
    if not (name in GEMM_TILES or name in GEMM_STAGED or name in GEMM_WIDE):
        raise ValueError(f"unknown gemm tile {name!r}; known: {sorted(GEMM_TILES) + sorted(GEMM_STAGED) + sorted(GEMM_WIDE)}")
    if name in GEMM_STAGED:
        if not M <= GEMM_STAGED[name][0]:
            raise ValueError(f"gemm tile {name!r} takes at most {GEMM_STAGED[name][0]} rows, got {M}")
    if name in GEMM_WIDE:
        if not M <= GEMM_WIDE[name][0]:
            raise ValueError(f"gemm tile {name!r} takes at most {GEMM_WIDE[name][0]} rows, got {M}")
        if K % 64 != 0:
            raise ValueError(f"gemm tile {name!r} needs K a multiple of 64 (its tensor maps), got {K}")
        if not maps_ok:
            raise ValueError(f"gemm tile {name!r} needs the driver's launch path (PDL on, sm_90+): tensor maps")
    if swiglu and name not in GEMM_WIDE:   # no epilogue on the other kernels: the very bits by two launches
        if out is not None:
            _linear_out(x, w, out_dtype, out, N // 2)   # (its checks before any launch)
        return silu_mul(gemm(x, w, tile=tile), out=out)
    out, ldx = _linear_out(x, w, out_dtype, out, N // 2 if swiglu else None)
    if M == 0:
        return out
    suffix = "swiglu" if swiglu else "f32" if out_dtype == torch.float32 else "bf16"
    if name in GEMM_WIDE:
        rows, tw, ks, stages, warps = GEMM_WIDE[name]
        smem = gemm_wide_smem(rows, tw, ks, stages)
        per_sm = 2 if smem <= GEMM_STAGED_TWO_CTAS else 1
        outs = N // 2 if swiglu else N                  # output columns; a tile holds tw (swiglu: tw / 2) of them
        sms = _num_sms(_device_index(x))
        grid = skinny_staged_grid(-(-outs // (tw // 2 if swiglu else tw)), per_sm, sms)   # persistent, <= the tiles
        launch_smem = max(smem, GEMM_WIDE_ONE_CTA_SMEM) if grid <= sms else smem    # (no two CTAs on one SM)
        if swiglu:
            wmap = _tensor_map("swiglu", w.data_ptr(), N // 2, K, ks, tw)
        else:
            wmap = _tensor_map("block", w.data_ptr(), N, K, 2 * K, ks, tw)
        xmap = _tensor_map("block", x.data_ptr(), M, K, 2 * ldx, ks, rows)
        _launch(x, "gemm", f"gemm_{name}_{suffix}", (grid, 1, 1), (32 * (warps + 1), 1, 1),
                (wmap, xmap, _p(out), _i(M), _i(outs), _i(K),
                 _i(_wide_pre(pre, stages, N * K)), _i(0 if swiglu and M <= GEMM_SWIGLU_LATE_MAX_M else 1)),
                launch_smem, ctas_per_sm=per_sm)
        return out
    if name in GEMM_STAGED:
        rows, stages, cps, per_sm = GEMM_STAGED[name]
        smem = gemm_staged_smem(rows, stages, cps)
        grid = skinny_staged_grid(-(-N // 16), per_sm, _num_sms(_device_index(x)))   # persistent, <= the tiles
        # the carveout is the kernel's, whichever tile loads it first: room for as many CTAs as fit (two
        # below about 110 KB each), so the grid decides how many run
        _launch(x, "gemm", f"gemm_staged_m{rows}_s{stages}c{cps}_{suffix}", (grid, 1, 1),
                (_GEMM_STAGED_THREADS, 1, 1), (_p(x), _i(ldx), _p(w), _p(out), _i(M), _i(N), _i(K)),
                smem, ctas_per_sm=2 if smem <= GEMM_STAGED_TWO_CTAS else 1)
        return out
    bm, bn, warps, bk, stages, split = GEMM_TILES[name]
    smem = stages * (bm + bn) * (bk + 8) * 2
    chunks = -(-K // GEMM_CHUNK)
    grid = (-(-N // bn), -(-M // bm), chunks if split else 1)
    if not grid[1] <= 65535:
        raise ValueError(f"M = {M} needs more than 65535 row tiles of {bm}")
    args: tuple = (_p(x), _i(ldx), _p(w), _p(out))
    if split:   # + the fp32 workspace of the chunk partials and the tickets
        if not grid[0] * grid[1] <= _TICKETS:
            raise ValueError(f"gemm: {grid[0] * grid[1]} output tiles exceed the ticket array")
        ws = torch.empty(chunks, M, N, dtype=torch.float32, device=x.device)
        args += (_p(ws), _p(_kernel_tickets(x)))
    _launch(x, "gemm", f"gemm_{name}_{suffix}", grid, (32 * warps, 1, 1), args + (_i(M), _i(N), _i(K)), smem)
    return out


#: most rows ``skinny_gemm`` takes (two 8-column B tiles of ``mma.m16n8k16``)
SKINNY_MAX_M = 16
_SKINNY_KB = 32          # columns of one k-block (4 lanes x 8); ``kU`` blocks in flight per lane
_SKINNY_U = 8


#: from this many 16-row tiles on, ``skinny_warps`` picks CTAs of 4 warps (see there)
SKINNY_W4_TILES = 1024


def skinny_warps(N: int, K: int) -> int:
    """Warps per CTA of ``skinny_gemm`` for ``N x K`` weights (one CTA per 16 weight rows):

    * 4 when there are at least ``SKINNY_W4_TILES`` tiles: four small CTAs per SM (the register
      limit) instead of two large ones, so one CTA's start and end overlap the others' streams. On the
      H200 this took the 8B gate/up GEMM (1536 tiles) from 60.7 to 56.3 us and the LM head (9496
      tiles) from 343 to 309 us; at 384 tiles (qkv) it tied, at 256 (o_proj, down) it lost 10-20%.
    * 16 when the ``ceil(N / 16)`` CTAs of 8 warps would leave the GPU short of loads in flight
      (fewer than 2048 warps) and K is long enough to give 16 warps a full round of loads each;
    * 8 otherwise."""
    tiles = -(-N // 16)
    blocks = -(-K // _SKINNY_KB)
    if tiles >= SKINNY_W4_TILES:
        return 4
    return 16 if tiles * 8 < 2048 and blocks >= 16 * _SKINNY_U else 8


def _skinny_warps_arg(warps: int | None, N: int, K: int) -> int:
    """``warps`` (a benchmark's override: 4, 8 or 16) or ``skinny_warps(N, K)``."""
    if warps is None:
        return skinny_warps(N, K)
    if warps not in (4, 8, 16):
        raise ValueError(f"warps must be 4, 8 or 16, got {warps!r}")
    return warps


def skinny_gemm(x: torch.Tensor, w: torch.Tensor, *, out_dtype: torch.dtype = torch.bfloat16,
                out: torch.Tensor | None = None, warps: int | None = None, prefetch: bool = True) -> torch.Tensor:
    """``y = x @ w.T`` for ``M <= 16`` rows, streaming the weights (``skinny_gemm.cu``; default mode).

    ``x [M, K]`` bf16 (row stride allowed), ``w [N, K]`` bf16 contiguous, ``K % 8 == 0``, both
    16-byte aligned; fp32 accumulation, output bf16 or fp32 ``[M, N]``. The reduction order differs
    from cuBLAS's and from ``gemm``'s (not for batch-invariant mode); a row's result does not depend
    on the other rows (any ``M <= 16``), and one launch is deterministic. ``prefetch``: each CTA asks L2
    for its first round of weights before the programmatic-dependent-launch wait, while the kernel
    before it runs (no effect on the result).
    """
    M, N, K = _linear_shape(x, w)
    if not M <= SKINNY_MAX_M:
        raise ValueError(f"skinny_gemm takes at most {SKINNY_MAX_M} rows, got {M}")
    if not 0 < N <= 65535 * 16:
        raise ValueError(f"N = {N} must be in [1, {65535 * 16}]")
    out, ldx = _linear_out(x, w, out_dtype, out)
    if M == 0:
        return out
    mt = 8 if M <= 8 else 16
    kind = "f32" if out_dtype == torch.float32 else "bf16"
    warps = _skinny_warps_arg(warps, N, K)
    _launch(x, "skinny_gemm", f"skinny_m{mt}_w{warps}_{kind}", (-(-N // 16), 1, 1), (32 * warps, 1, 1),
            (_p(x), _i(ldx), _p(w), _p(out), _i(M), _i(N), _i(K), _i(int(bool(prefetch)))))
    return out


def skinny_swiglu(x: torch.Tensor, w: torch.Tensor, *, out: torch.Tensor | None = None,
                  warps: int | None = None, prefetch: bool = True) -> torch.Tensor:
    """``silu_mul(skinny_gemm(x, w))`` in one launch, bitwise: ``w = [gate | up]`` bf16 ``[2I, K]``
    (``I % 8 == 0``), ``x [M, K]`` as in ``skinny_gemm`` (``M <= 16``); returns bf16 ``[M, I]``.

    Each CTA streams 8 gate rows and the 8 matching up rows, so the activation is formed from the
    bf16-rounded gate and up in the GEMM's epilogue (``skinny_gemm.cu``). ``prefetch``: as in ``skinny_gemm``."""
    M, N2, K = _linear_shape(x, w)
    if not M <= SKINNY_MAX_M:
        raise ValueError(f"skinny_swiglu takes at most {SKINNY_MAX_M} rows, got {M}")
    if not (N2 % 16 == 0 and 0 < N2 <= 65535 * 16):
        raise ValueError(f"w must have 2*I rows with I a multiple of 8 (and I <= {65535 * 8}), got {N2}")
    I = N2 // 2
    out, ldx = _linear_out(x, w, torch.bfloat16, out, width=I)
    if M == 0:
        return out
    mt = 8 if M <= 8 else 16
    warps = _skinny_warps_arg(warps, N2, K)
    _launch(x, "skinny_gemm", f"skinny_swiglu_m{mt}_w{warps}", (I // 8, 1, 1), (32 * warps, 1, 1),
            (_p(x), _i(ldx), _p(w), _p(out), _i(M), _i(I), _i(K), _i(int(bool(prefetch)))))
    return out


#: (chunk columns KC, stages S, producer lanes PL) the staged skinny kernels are built for
#: (``skinny_staged_k{KC}s{S}p{PL}_*`` in skinny_gemm.cu)
SKINNY_STAGED_CONFIGS = ((512, 2, 16), (512, 3, 16), (512, 4, 16), (1024, 3, 16), (1024, 4, 16), (2048, 2, 16),
                         (2048, 3, 16))
#: the wider staged kernels (``skinny_staged_k{KC}s{S}p{PL}t{TP}_m{16,32}_*``): rows (16 or 32) -> the
#: (chunk columns KC, stages S, producer lanes PL, 16-row tiles a stage TP) built for that many rows. The engine
#: runs the first of the 16-row ones (``runner.STAGED_WIDE16``); the others are kept for the A/B measurements
#: (at 32 rows none beat cuBLAS on the H200; docs/performance/gemm.md, "The staged GEMM above 8 rows")
SKINNY_STAGED_WIDE = {16: ((512, 3, 16, 1), (512, 4, 16, 1)),
                      32: ((512, 3, 16, 1), (512, 2, 16, 2))}
#: the most rows a staged launch takes
SKINNY_STAGED_MAX_M = 32
_SKINNY_STAGED_THREADS = 32 * 5   # 4 consumer warps and the producer warp


def skinny_staged_smem(kc: int, stages: int, tp: int = 1) -> int:
    """Dynamic shared memory of a staged launch: ``stages`` x 16 ``tp`` rows of ``kc`` bf16, rows 64 bytes
    apart past ``2 kc`` (``st_rs`` in skinny_gemm.cu)."""
    return stages * 16 * tp * (kc * 2 + 64)


def skinny_staged_static_smem(rows: int, tp: int = 1) -> int:
    """Static shared memory of a staged kernel for ``rows`` (8, 16 or 32) and ``tp``: the per-warp partials
    of one or two units (``st_red_bufs``: two when ``tp * rows / 8 <= 2``), the barriers and the stage table
    (at most 4 stages' worth; what ptxas reports, within 64 bytes)."""
    frags = tp * (rows // 8)
    return (2 if frags <= 2 else 1) * 4 * frags * 4 * 32 * 4 + 128


def skinny_staged_rows(M: int) -> int:
    """The row width (8, 16 or 32) of the staged kernel a launch of ``M`` rows takes."""
    return 8 if M <= 8 else (16 if M <= 16 else 32)


def skinny_staged_grid(tiles: int, ctas_per_sm: int, sms: int) -> int:
    """CTAs of a staged launch (``skinny_staged``, and ``gemm``'s staged kernels): ``ctas_per_sm`` per
    multiprocessor, at most one per unit (``tiles``: the launch's units, 16-row tiles for ``tp = 1``)."""
    return max(1, min(tiles, sms * ctas_per_sm))


def _tiled_width(N: int, swiglu: bool, out_dtype: torch.dtype, kernel: str) -> tuple[int, int]:
    """The output width and 16-row tiles of a staged or cluster GEMM of ``N`` weight rows: ``N`` and ``ceil(N/16)``,
    or with ``swiglu`` (gate and up rows, bf16 out only) ``N / 2`` and ``N / 16``; ``ValueError`` otherwise."""
    if swiglu:
        if out_dtype != torch.bfloat16:
            raise ValueError(f"{kernel}(swiglu=True) writes bf16")
        if not (N % 16 == 0 and 0 < N):
            raise ValueError(f"w must have 2*I rows with I a multiple of 8, got {N}")
        width, tiles = N // 2, N // 16
    else:
        if not 0 < N:
            raise ValueError(f"N = {N} must be positive")
        width, tiles = N, -(-N // 16)
    if not N <= _I32_MAX // 2:
        raise ValueError(f"N = {N} is too large")
    return width, tiles


def skinny_staged(x: torch.Tensor, w: torch.Tensor, *, out_dtype: torch.dtype = torch.bfloat16,
                  out: torch.Tensor | None = None, swiglu: bool = False, kc: int | None = None,
                  stages: int | None = None, lanes: int = 16, ctas_per_sm: int = 2, pre: int | None = None,
                  evict_first: bool = True, tp: int = 1) -> torch.Tensor:
    """``skinny_gemm`` (or, with ``swiglu``, ``skinny_swiglu``) by the staged kernel: the weights
    stream into shared memory by bulk copies (one per row and chunk of ``kc`` columns, issued by
    ``lanes`` producer lanes), ``stages`` deep, over a persistent grid of ``ctas_per_sm`` CTAs a
    multiprocessor that take the 16-row tiles from a counter (``skinny_gemm.cu``, "The staged
    kernel"); ``(kc, stages, lanes)`` one of ``SKINNY_STAGED_CONFIGS`` for ``M <= 8`` (``kc``, ``stages`` by
    default 1024 and 3: ``runner.STAGED_DEFAULT``); for ``8 < M <= 32``, ``(kc, stages, lanes, tp)`` one of
    ``SKINNY_STAGED_WIDE[16]`` (``M <= 16``) or ``[32]`` (``kc``, ``stages`` by default the first entry's), where
    ``tp`` (1 or 2) is the 16-row tiles a stage holds and the counter hands out (``tp = 1`` for ``M <= 8``).
    ``pre``: stages each CTA may fetch before the programmatic-dependent-launch wait (default ``stages``; 0:
    none; the engine fetches 2). ``evict_first``: the weight copies bring their lines into L2 at evict-first
    priority (else with no hint), so that a step's weight stream does not push the activations and the KV cache
    out of L2.
    The bits are those of ``skinny_gemm(..., warps=4)`` (the same sums in the same order; ``M <= 16``),
    whatever the configuration, ``tp`` and the grid, and a row's bits do not depend on the other rows (any
    ``M <= 32``). Launches that share a device must be ordered (one stream): the
    tile counters are the per-device ticket array's first two entries, left zero by every launch."""
    M, N, K = _linear_shape(x, w)
    if not M <= SKINNY_STAGED_MAX_M:
        raise ValueError(f"skinny_staged takes at most {SKINNY_STAGED_MAX_M} rows, got {M}")
    rows = skinny_staged_rows(M)
    kc0, stages0 = (1024, 3) if rows == 8 else SKINNY_STAGED_WIDE[rows][0][:2]
    kc, stages = kc0 if kc is None else kc, stages0 if stages is None else stages
    if rows == 8:
        if tp != 1:
            raise ValueError(f"tp must be 1 for M <= 8, got {tp!r}")
        if (kc, stages, lanes) not in SKINNY_STAGED_CONFIGS:
            raise ValueError(f"(kc, stages, lanes) = {(kc, stages, lanes)} is not built; built: {SKINNY_STAGED_CONFIGS}")
    else:
        built = SKINNY_STAGED_WIDE[rows]
        if (kc, stages, lanes, tp) not in built:
            raise ValueError(f"(kc, stages, lanes, tp) = {(kc, stages, lanes, tp)} is not built for {M} rows; built: {built}")
    if not (isinstance(ctas_per_sm, int) and ctas_per_sm >= 1):
        raise ValueError(f"ctas_per_sm must be a positive int, got {ctas_per_sm!r}")
    pre = stages if pre is None else pre
    if not (isinstance(pre, int) and pre >= 0):
        raise ValueError(f"pre must be a non-negative int, got {pre!r}")
    if not isinstance(evict_first, bool):
        raise ValueError(f"evict_first must be a bool, got {evict_first!r}")
    width, tiles = _tiled_width(N, swiglu, out_dtype, "skinny_staged")
    out, ldx = _linear_out(x, w, out_dtype, out, width=width)
    if M == 0:
        return out
    dev = _device_index(x)
    grid = skinny_staged_grid(-(-tiles // tp), ctas_per_sm, _num_sms(dev))  # at most one CTA a unit of tp tiles
    kind = "swiglu" if swiglu else ("f32" if out_dtype == torch.float32 else "bf16")
    wide = "" if rows == 8 else f"t{tp}_m{rows}"
    _launch(x, "skinny_gemm", f"skinny_staged_k{kc}s{stages}p{lanes}{wide}_{kind}", (grid, 1, 1),
            (_SKINNY_STAGED_THREADS, 1, 1),
            (_p(x), _i(ldx), _p(w), _p(out), _i(M), _i(width), _i(K), _p(_kernel_tickets(x)), _i(pre), _i(int(evict_first))),
            skinny_staged_smem(kc, stages, tp))
    return out


#: built configurations of the cluster kernel (``skinny_gemm.cu``, "The cluster kernel"): (chunk columns, stages,
#: 16-row tiles a unit, CTAs a cluster)
SKINNY_CLUSTER_CONFIGS = ((256, 3, 2, 4), (256, 4, 2, 4), (256, 5, 1, 4), (512, 2, 2, 4))
#: ... of which these are also built with eight consumer warps (``warps=8``: two a tile)
SKINNY_CLUSTER_W8 = ((256, 4, 2, 4), (512, 2, 2, 4))
SKINNY_CLUSTER_MAX_M = 64
_cluster_capacity: dict[tuple[int, str, int], int] = {}
#: tensor maps of the cluster and warpgroup kernels' operands, by everything they encode (kind, address, rows,
#: columns, row bytes, box): a graph's buffers and the weights keep theirs; cleared when it grows past
#: ``_TENSOR_MAPS_MAX``
_tensor_maps: dict[tuple, "launch.TensorMap"] = {}
_TENSOR_MAPS_MAX = 4096


def skinny_cluster_smem(kc: int, stages: int, tp: int) -> int:
    """Dynamic shared memory of a cluster launch: 1 KB to align the stages to 1024 bytes (the copies' swizzle),
    then ``stages`` x (16 ``tp`` weight rows + 64 x rows) of ``kc`` bf16."""
    return 1024 + stages * (16 * tp + 64) * kc * 2


def skinny_cluster_grid(units: int, cluster: int, capacity: int) -> int:
    """CTAs of a cluster launch: whole clusters, at most one CTA a unit (rounded up to a cluster) and at most the
    ``capacity`` clusters the device holds at once."""
    return cluster * max(1, min(-(-units // cluster), capacity))


def _tensor_map(kind: str, *args: int) -> "launch.TensorMap":
    """The tensor map ``launch.encode_<kind>_map(*args)`` (``matrix``: the cluster kernel's, ``block`` and ``swiglu``:
    the warpgroup kernel's), cached by everything it encodes."""
    key = (kind, *args)
    m = _tensor_maps.get(key)
    if m is None:
        if len(_tensor_maps) >= _TENSOR_MAPS_MAX:
            _tensor_maps.clear()
        m = _tensor_maps[key] = getattr(launch, f"encode_{kind}_map")(*args)
    return m


def skinny_cluster(x: torch.Tensor, w: torch.Tensor, *, out_dtype: torch.dtype = torch.bfloat16,
                   out: torch.Tensor | None = None, swiglu: bool = False, kc: int = 256, stages: int = 3,
                   tp: int = 2, cluster: int = 4, pre: int | None = None, evict_first: bool = True,
                   warps: int = 4) -> torch.Tensor:
    """``skinny_gemm`` (or, with ``swiglu``, ``skinny_swiglu``) for up to ``SKINNY_CLUSTER_MAX_M`` rows by the
    cluster kernel: the weights stream through shared memory by tensor copies, and each chunk of x is copied once
    per thread-block cluster of ``cluster`` CTAs into all of them by multicast tensor copies (``skinny_gemm.cu``,
    "The cluster kernel"); ``(kc, stages, tp, cluster)`` one of ``SKINNY_CLUSTER_CONFIGS``. A unit of ``tp``
    16-row tiles per CTA at a time, assigned statically over at most as many clusters as the device holds at
    once. ``pre``: stages whose weights a CTA may fetch before the programmatic-dependent-launch wait (default
    ``stages``). ``evict_first``: as ``skinny_staged``. ``warps``: consumer warps, 4, or 8 (two a tile) for the
    configurations of ``SKINNY_CLUSTER_W8``. K must be a multiple of 64 (the tensor maps' blocks). Needs the
    driver's launch path (PDL on, sm_90+). A row's bits are those of ``skinny_staged`` at up to 8 rows (the same
    sums in the same order), whatever the configuration, warps and grid."""
    M, N, K = _linear_shape(x, w)
    if not M <= SKINNY_CLUSTER_MAX_M:
        raise ValueError(f"skinny_cluster takes at most {SKINNY_CLUSTER_MAX_M} rows, got {M}")
    if (kc, stages, tp, cluster) not in SKINNY_CLUSTER_CONFIGS:
        raise ValueError(f"(kc, stages, tp, cluster) = {(kc, stages, tp, cluster)} is not built; built: {SKINNY_CLUSTER_CONFIGS}")
    if isinstance(warps, bool) or not (warps == 4 or (warps == 8 and (kc, stages, tp, cluster) in SKINNY_CLUSTER_W8)):
        raise ValueError(f"warps = {warps!r}: 4, or 8 for the configurations {SKINNY_CLUSTER_W8}")
    pre = stages if pre is None else pre
    if not (isinstance(pre, int) and not isinstance(pre, bool) and pre >= 0):
        raise ValueError(f"pre must be a non-negative int, got {pre!r}")
    if not isinstance(evict_first, bool):
        raise ValueError(f"evict_first must be a bool, got {evict_first!r}")
    width, tiles = _tiled_width(N, swiglu, out_dtype, "skinny_cluster")
    if K % 64 != 0:
        raise ValueError(f"skinny_cluster needs K a multiple of 64 (its tensor maps), got {K}")
    _need(_clusters_ok(x), "skinny_cluster needs thread-block clusters: the driver's launch path (PDL on), sm_90+")
    out, ldx = _linear_out(x, w, out_dtype, out, width=width)
    if M == 0:
        return out
    dev = _device_index(x)
    kind = "swiglu" if swiglu else ("f32" if out_dtype == torch.float32 else "bf16")
    name = f"skinny_cluster_k{kc}s{stages}t{tp}c{cluster}{'w8' if warps == 8 else ''}_m64_{kind}"
    smem = skinny_cluster_smem(kc, stages, tp)
    threads = 32 * (warps + 1)
    key = (dev, name, smem)
    cap = _cluster_capacity.get(key)
    if cap is None:
        import cupy
        with cupy.cuda.Device(dev):
            _, handle = _function(dev, "skinny_gemm", name, smem)
            cap = _cluster_capacity[key] = launch.max_active_clusters(handle, (threads, 1, 1), smem, cluster)
        if not cap >= 1:
            raise ValueError(f"{name}: the device holds no cluster of {cluster} CTAs with {smem} bytes of shared memory")
    grid = skinny_cluster_grid(-(-tiles // tp), cluster, cap)
    wmap = _tensor_map("matrix", w.data_ptr(), N, K, 2 * K, kc, 8)
    xmap = _tensor_map("matrix", x.data_ptr(), M, K, 2 * ldx, kc, 64 // cluster)
    _launch(x, "skinny_gemm", name, (grid, 1, 1), (threads, 1, 1),
            (wmap, xmap, _p(out), _i(M), _i(width), _i(K), _i(pre), _i(int(evict_first))),
            smem, cluster_x=cluster)
    return out



#: built configurations of the warpgroup kernel (``skinny_wg.cu``): (chunk columns, stages, x rows a tile (the
#: wgmma's N: 32 or 64), 64-row weight tiles a unit, CTAs that split K (a cluster)); the stages are what fits
#: 227 KB beside the split-K landing area
SKINNY_WG_CONFIGS = kernels.SKINNY_WG_CONFIGS
SKINNY_WG_MAX_M = 64
#: the configurations (chunk columns, stages, x rows, CTAs splitting K; 64-row units) built with the folded
#: add_rmsnorm's kernels (``skinny_wg``'s ``residual=`` and ``norm=``): every one of one tile a unit but (128, 3, 64, 8),
#: whose residual epilogue spills
SKINNY_WG_NORM_CONFIGS = kernels.SKINNY_WG_NORM_CONFIGS
#: whether a configuration (x rows, tiles a unit, CTAs splitting K) has the spread fold's ``_sp`` kernels: a unit's
#: ``wt * nx / 8`` fragment blocks divide among ``kp`` > 1 CTAs (``OWN`` in ``skinny_wg.cu``)
skinny_wg_spreads = kernels.skinny_wg_spreads
#: the target ``skinny_wg.cu`` must be built for (wgmma): a compute-capability-9.0 device (``kernels.ARCH_TARGETS``)
SKINNY_WG_TARGET = "sm_90a"
_SKINNY_WG_THREADS = 160
#: the carveout preference of every warpgroup kernel (``_carveout_percent``): two CTAs a multiprocessor, which is the
#: largest shared-memory configuration for all of them (where two do not fit the preference is capped there), so that
#: where two fit (the 4-stage configurations at 32 x rows) a GEMM's CTAs can be resident beside the GEMM's before it
_SKINNY_WG_CTAS_PER_SM = 2


def skinny_wg_smem(kc: int, stages: int, nx: int, wt: int, kp: int, spread: bool = False) -> int:
    """Dynamic shared memory of a warpgroup-kernel launch: 1 KB to align the stages to 1024 bytes, ``stages`` x
    (64 ``wt`` weight rows + ``nx`` x rows) of ``kc`` bf16, and the landing area of ``kp - 1`` CTAs' fp32
    partials (``wg_stage_bytes``, ``wg_recv_bytes`` in ``skinny_wg.cu``); with the fold ``spread`` (its ``_sp``
    kernels) each peer sends only the CTA's share, a ``kp``-th of a unit's partials."""
    return 1024 + stages * (64 * wt + nx) * kc * 2 + (kp - 1) * 64 * wt * nx * 4 // (kp if spread else 1)


def skinny_wg_rows(M: int) -> int:
    """The x rows of the warpgroup kernel's tile for ``M`` rows: 32 up to 32, else 64."""
    return 32 if M <= 32 else 64


#: the warpgroup kernel's split rule (``skinny_wg_split``): weights of at least ``WG_SPLIT_BYTES`` want at least
#: ``WG_MIN_CTAS[1]`` CTAs at work, smaller ones ``WG_MIN_CTAS[0]``. Measured on the H200 (132 SMs) at the qwen3-0.6b
#: and qwen3-8b GEMMs, 32 and 64 rows (docs/performance/gemm.md, "The warpgroup GEMM"): a small GEMM pays for a split
#: with its reduction (qwen3-0.6b's qkv: 3.9 µs on 64 CTAs, 4.9 on 128), a large one needs every SM pulling (qwen3-8b's
#: o_proj: 11.8 µs on 64 CTAs, 9.8 on 128)
WG_SPLIT_BYTES = 16 << 20
WG_MIN_CTAS = (64, 128)


def skinny_wg_split(N: int, K: int, swiglu: bool = False, wt: int = 1, kc: int = 128) -> int:
    """CTAs splitting K (1, 2, 4, 8) for the warpgroup kernel on a ``[N, K]`` weight (``swiglu``: ``[gate | up]``):
    the fewest that put its units (64 ``wt`` weight rows each) on at least ``WG_MIN_CTAS[large]`` CTAs, ``large``
    the weight's bytes reaching ``WG_SPLIT_BYTES``, and at most what K takes (a multiple of 64 ``kp``, of ``kc kp``
    when split)."""
    units = -(-N // (64 * wt))
    target = WG_MIN_CTAS[2 * N * K >= WG_SPLIT_BYTES]
    kp = next((k for k in (1, 2, 4, 8) if units * k >= target), 8)
    while kp > 1 and K % (kc * kp):
        kp //= 2
    return kp


def skinny_wg_available(ref: torch.Tensor) -> bool:
    """Whether ``skinny_wg`` can launch on ``ref``'s device: the driver's launch path (PDL on) and the kernels built
    for ``SKINNY_WG_TARGET`` (a compute-capability-9.0 GPU; compiles ``skinny_wg.cu`` on its first call)."""
    return _clusters_ok(ref) and kernels.target("skinny_wg", _device_index(ref)) == SKINNY_WG_TARGET


def skinny_wg_config(M: int, wt: int, kp: int, stages: int | None = None) -> tuple[int, int, int, int, int]:
    """The built configuration (``SKINNY_WG_CONFIGS``) for ``M`` rows, ``wt`` tiles a unit and ``kp`` CTAs
    splitting K: the first listed, or the one of ``stages`` stages; ``ValueError`` if there is none."""
    nx = skinny_wg_rows(M)
    for cfg in SKINNY_WG_CONFIGS:
        if cfg[2:] == (nx, wt, kp) and stages in (None, cfg[1]):
            return cfg
    raise ValueError(f"no skinny_wg configuration for {M} rows (x tile {nx}), wt = {wt!r}, kp = {kp!r}"
                     f"{'' if stages is None else f', stages = {stages!r}'}; built: {SKINNY_WG_CONFIGS}")


def skinny_wg_ssq(N: int, ref: torch.Tensor) -> torch.Tensor:
    """The sums of squares a residual-epilogue ``skinny_wg`` writes for ``N`` output columns: fp32 ``[units, 64]``
    (a 64-column unit a row, an x row a column), on ``ref``'s device."""
    return torch.empty(-(-N // 64), 64, dtype=torch.float32, device=ref.device)


def skinny_wg_fold_ok(M: int, kp: int, stages: int | None = None) -> bool:
    """Whether the folded add_rmsnorm's kernels (``skinny_wg(residual=...)``, ``norm=...``) are built for ``M`` rows
    with ``kp`` CTAs splitting K (and one 64-row tile a unit; ``stages``: of that many stages, None: the default
    configuration's): ``SKINNY_WG_NORM_CONFIGS``."""
    if not 0 < M <= SKINNY_WG_MAX_M:
        return False
    try:
        _, stages, nx, _, _ = skinny_wg_config(M, 1, kp, stages)
    except ValueError:
        return False
    return any(c[1:] == (stages, nx, kp) for c in SKINNY_WG_NORM_CONFIGS)


def skinny_wg(x: torch.Tensor, w: torch.Tensor, *, out_dtype: torch.dtype = torch.bfloat16,
              out: torch.Tensor | None = None, swiglu: bool = False, wt: int = 1, kp: int = 1,
              pre: int | None = None, evict_first: bool = True, spread: bool = False,
              residual: tuple[torch.Tensor, torch.Tensor, torch.Tensor] | None = None,
              norm: tuple[torch.Tensor, float] | None = None, stages: int | None = None) -> torch.Tensor:
    """``skinny_gemm`` (or, with ``swiglu``, ``skinny_swiglu``) for up to ``SKINNY_WG_MAX_M`` rows by the warpgroup
    kernel (``skinny_wg.cu``): tensor copies stream 64 ``wt`` weight rows and the x rows through shared memory,
    one warpgroup multiplies them by ``wgmma``, and ``kp`` > 1 CTAs of a cluster split K, CTA 0 adding the others'
    partials in rank order. The configuration is ``skinny_wg_config(M, wt, kp, stages)`` (``stages`` None: the
    default one; 4 at 32 x rows: the configurations small enough for two CTAs a multiprocessor, the same bits as
    every other). ``pre``: stages whose weights a CTA may fetch before the programmatic-dependent-launch wait
    (default: all of them). ``evict_first``: as
    ``skinny_staged``. ``spread``: with ``kp`` > 1, every CTA of a cluster adds up and stores its share of a unit's
    partials (its ``wt * nx / 8 / kp`` blocks of 8 x rows by 64 weight rows, the others sent to their owners), where
    that share is whole (``skinny_wg_spreads``: the configuration's ``_sp`` kernels), instead of CTA 0 all of them;
    the sums keep the rank order, so the bits are the same. K must be a multiple of 64 ``kp``, and of 128 ``kp``
    when ``kp`` > 1. Needs the driver's launch path (PDL on) and a compute-capability-9.0 device (the kernels'
    ``sm_90a`` build). Deterministic: the same inputs and configuration give the same bits; another split or tiling
    sums in another order (another stage count does not).

    The add_rmsnorm between two GEMMs (``s = s + o``, then ``rms_norm(s) * weight``) folded into them (``wt`` 1 and a
    configuration of ``SKINNY_WG_NORM_CONFIGS``: ``skinny_wg_fold_ok``):

    * ``residual = (stream, ssq, weight)``: the residual epilogue. ``stream`` (bf16 ``[M, N]``, contiguous) becomes
      ``bf16(stream + bf16(x @ w.T))`` in place, as ``add_rmsnorm`` updates it; ``ssq`` (``skinny_wg_ssq(N, x)``)
      gets the squares of each new row summed over each 64-column unit; returns ``bf16(stream * weight)`` (bf16
      ``[M, N]``; ``weight``: the norm's, bf16 ``[N]``), the x of the GEMM after it.
    * ``norm = (ssq, eps)``: the normed prologue. ``x`` is that weighted stream and ``ssq`` (fp32 ``[parts, 64]``)
      the sums the residual epilogue wrote; each product row is scaled by ``1 / sqrt(sum(ssq[:, m]) / K + eps)``
      before it is stored (or goes into the SwiGLU). The result is ``rms_norm(stream) * weight`` times ``w.T`` with
      the roundings in other places than ``add_rmsnorm`` and a plain GEMM put them (DESIGN §4's default mode)."""
    M, N, K = _linear_shape(x, w)
    if not M <= SKINNY_WG_MAX_M:
        raise ValueError(f"skinny_wg takes at most {SKINNY_WG_MAX_M} rows, got {M}")
    kc, stages, nx, wt, kp = skinny_wg_config(M, wt, kp, stages)
    fused, xw = _skinny_wg_fused(x, w, M, N, K, kp, stages, out_dtype, out, swiglu, wt, residual, norm)
    pre = stages if pre is None else pre
    if not (isinstance(pre, int) and not isinstance(pre, bool) and pre >= 0):
        raise ValueError(f"pre must be a non-negative int, got {pre!r}")
    if not isinstance(evict_first, bool):
        raise ValueError(f"evict_first must be a bool, got {evict_first!r}")
    if not isinstance(spread, bool):
        raise ValueError(f"spread must be a bool, got {spread!r}")
    width, _ = _tiled_width(N, swiglu, out_dtype, "skinny_wg")
    if not (K % (64 * kp) == 0 and (kp == 1 or (K // kp) % kc == 0)):
        raise ValueError(f"skinny_wg with kp = {kp} needs K a multiple of {64 * kp if kp == 1 else kc * kp}, got {K}")
    if not skinny_wg_available(x):
        raise ValueError(f"skinny_wg needs the driver's launch path (PDL on) and its kernels built for "
                         f"{SKINNY_WG_TARGET} (a compute-capability-9.0 GPU)")
    dev = _device_index(x)
    out, ldx = _linear_out(x, w, out_dtype, residual[0] if residual is not None else out, width=width)
    if M == 0:
        return out if xw is None else xw
    kind = "swiglu" if swiglu else ("f32" if out_dtype == torch.float32 else "bf16")
    kind = "res" if residual is not None else kind + "n" if norm is not None else kind
    spread = spread and skinny_wg_spreads(nx, wt, kp)
    kind += "_sp" if spread else ""   # the spread fold's twin
    name = f"skinny_wg_k{kc}s{stages}n{nx}t{wt}p{kp}_{kind}"
    smem = skinny_wg_smem(kc, stages, nx, wt, kp, spread)
    if kp > 1:
        key = (dev, name, smem)
        cap = _cluster_capacity.get(key)
        if cap is None:
            import cupy
            with cupy.cuda.Device(dev):
                _, handle = _function(dev, "skinny_wg", name, smem, _SKINNY_WG_CTAS_PER_SM)
                cap = _cluster_capacity[key] = launch.max_active_clusters(handle, (_SKINNY_WG_THREADS, 1, 1), smem, kp)
            if not cap >= 1:
                raise ValueError(f"{name}: the device holds no cluster of {kp} CTAs with {smem} bytes of shared memory")
    else:
        cap = _num_sms(dev)  # one CTA a multiprocessor (its shared memory)
    outs = 32 * wt if swiglu else 64 * wt  # output columns of a unit
    grid = kp * min(-(-width // outs), cap)
    if swiglu:
        wmap = _tensor_map("swiglu", w.data_ptr(), width, K, kc, 64 * wt)
    else:
        wmap = _tensor_map("block", w.data_ptr(), N, K, 2 * K, kc, 64 * wt)
    xmap = _tensor_map("block", x.data_ptr(), M, K, 2 * ldx, kc, nx)
    _launch(x, "skinny_wg", name, (grid, 1, 1), (_SKINNY_WG_THREADS, 1, 1),
            (wmap, xmap, _p(out), _i(M), _i(width), _i(K), _i(pre), _i(int(evict_first))) + fused, smem,
            ctas_per_sm=_SKINNY_WG_CTAS_PER_SM, cluster_x=kp)
    return out if xw is None else xw


def _skinny_wg_fused(x, w, M, N, K, kp, stages, out_dtype, out, swiglu, wt, residual, norm
                     ) -> tuple[tuple, torch.Tensor | None]:
    """``skinny_wg``'s residual-epilogue / normed-prologue arguments checked: the kernel's last six (ssq_in, ssq_out,
    norm weight, xw, parts, eps; null and zero for neither) and the residual epilogue's new xw output (else None)."""
    if residual is None and norm is None:
        return (_p(None), _p(None), _p(None), _p(None), _i(0), _f(0.0)), None
    if residual is not None and norm is not None:
        raise ValueError("skinny_wg takes the residual epilogue (residual=) or the normed prologue (norm=), not both")
    if not skinny_wg_fold_ok(M, kp, stages) or wt != 1:
        raise ValueError(f"the folded add_rmsnorm is built for one tile a unit and {SKINNY_WG_NORM_CONFIGS} "
                         f"(chunk, stages, x rows, kp), got {M} rows, wt = {wt!r}, kp = {kp!r}, stages = {stages!r}")
    if out_dtype != torch.bfloat16 or out is not None:
        raise ValueError("the folded add_rmsnorm (residual=, norm=) writes bf16 and takes no out=")
    if norm is not None:
        if not (isinstance(norm, tuple) and len(norm) == 2):
            raise ValueError("norm must be (ssq, eps)")
        nssq, eps = norm
        _tensor("norm ssq", nssq, torch.float32, 2)
        _contig("norm ssq", nssq)
        if tuple(nssq.shape) != (-(-K // 64), 64):
            raise ValueError(f"norm ssq must be [K / 64, 64] = [{-(-K // 64)}, 64], got {tuple(nssq.shape)}")
        _same_device(x=x, norm_ssq=nssq)
        return (_p(nssq), _p(None), _p(None), _p(None), _i(nssq.shape[0]), _f(float(eps))), None
    if not (isinstance(residual, tuple) and len(residual) == 3):
        raise ValueError("residual must be (stream, ssq, weight)")
    stream, ssq, weight = residual
    if swiglu:
        raise ValueError("the residual epilogue stores the product, not a SwiGLU")
    _tensor("residual stream", stream, torch.bfloat16, 2)
    _contig("residual stream", stream)
    if tuple(stream.shape) != (M, N):
        raise ValueError(f"the residual stream must be [{M}, {N}], got {tuple(stream.shape)}")
    _tensor("ssq", ssq, torch.float32, 2)
    _contig("ssq", ssq)
    if tuple(ssq.shape) != (-(-N // 64), 64):
        raise ValueError(f"ssq must be [{-(-N // 64)}, 64] (skinny_wg_ssq), got {tuple(ssq.shape)}")
    _norm_weight(weight, N)
    _same_device(x=x, stream=stream, ssq=ssq, weight=weight)
    xw = torch.empty(M, N, dtype=torch.bfloat16, device=x.device)
    return (_p(None), _p(ssq), _p(weight), _p(xw), _i(0), _f(0.0)), xw


# --------------------------------------------------------------------------------------
# sampling
# --------------------------------------------------------------------------------------

SAMPLE_CHUNK = 4096               # logits of a row per sample_partial CTA (CHUNK in sampling.cu)
SAMPLE_PARTIAL_THREADS = 256      # PART_THREADS in sampling.cu
SAMPLE_PARTIAL_WORDS = 8          # sizeof(Partial) / 4 in sampling.cu
SAMPLE_SLOTS = 128                # candidates a chunk of a small-top-k row may export (SLOTS in sampling.cu)
SAMPLE_TOPK_CAP = 64              # rows with 0 < top_k <= this take the candidate path (TOPK_CAP)
SAMPLE_MAX_V = 1 << 30            # chunk indices stay inside int32
SAMPLE_MAX_ROWS = 65535           # rows are sample_partial's grid y


def sample(logits: torch.Tensor, temperature: torch.Tensor, top_k: torch.Tensor, top_p: torch.Tensor,
           seed_lo: torch.Tensor, seed_hi: torch.Tensor, pos: torch.Tensor, mode: torch.Tensor, *,
           tokens: torch.Tensor | None = None, logprobs: torch.Tensor | None = None
           ) -> tuple[torch.Tensor, torch.Tensor]:
    """One token per row of fp32 ``logits [B, V]`` (twin: ``reference.sampling.sample_one``).

    Per-row parameters, each a contiguous ``[B]`` tensor: ``temperature`` fp32 (0: greedy),
    ``top_k`` int32 (0 disables), ``top_p`` fp32 (1 disables), ``seed_lo`` / ``seed_hi`` int32 or
    uint32 (the two 32-bit halves of the 64-bit seed), ``pos`` int32 (absolute position of the
    sampled token), ``mode`` int32 (0 raw logprob, 1 processed). ``pack_sampling_params`` builds
    them from ``SamplingParams``. Returns int32 ``tokens [B]`` and fp32 ``logprobs [B]``.

    Two launches: ``sample_partial`` reads each row once in ``sample_chunks(V)`` chunks spread over
    the GPU (max, log-sum-exp, argmax; the Gumbel-max token of plain rows; the candidates of rows
    with a top-k of at most ``SAMPLE_TOPK_CAP``), then ``sample`` folds them, one CTA per row, and
    runs the top-k / top-p passes of the rows that have them (over the candidates where it can).
    """
    _tensor("logits", logits, torch.float32, 2)
    B, V = logits.shape
    _need(logits.stride(1) == 1 or V == 1, "logits rows must be contiguous")
    if not 1 <= V <= SAMPLE_MAX_V:
        raise ValueError(f"vocabulary size {V} out of range 1..{SAMPLE_MAX_V}")
    if not B <= SAMPLE_MAX_ROWS:
        raise ValueError(f"at most {SAMPLE_MAX_ROWS} rows per call, got {B}")
    ld = logits.stride(0) if B > 1 else V
    checks = (("temperature", temperature, torch.float32), ("top_k", top_k, torch.int32),
              ("top_p", top_p, torch.float32), ("seed_lo", seed_lo, (torch.int32, torch.uint32)),
              ("seed_hi", seed_hi, (torch.int32, torch.uint32)), ("pos", pos, torch.int32),
              ("mode", mode, torch.int32))
    for name, t, dt in checks:
        _tensor(name, t, dt, 1)
        _contig(name, t)
        if t.shape[0] != B:
            raise ValueError(f"{name} must have length {B}, got {t.shape[0]}")
    tokens = _out("tokens", tokens, (B,), torch.int32, logits)
    logprobs = _out("logprobs", logprobs, (B,), torch.float32, logits)
    _same_device(logits=logits, temperature=temperature, top_k=top_k, top_p=top_p, seed_lo=seed_lo,
                 seed_hi=seed_hi, pos=pos, mode=mode, tokens=tokens, logprobs=logprobs)
    if B == 0:
        return tokens, logprobs
    C = sample_chunks(V)
    part = torch.empty((B, C, SAMPLE_PARTIAL_WORDS), dtype=torch.float32, device=logits.device)  # Partial [B, C]
    cand = torch.empty((B, C, SAMPLE_SLOTS, 2), dtype=torch.float32, device=logits.device)      # Cand [B, C, SLOTS]
    row_args = (_p(logits), _i(ld), _i(V), _p(temperature), _p(top_k), _p(top_p), _p(seed_lo), _p(seed_hi),
                _p(pos), _p(mode))
    _launch(logits, "sampling", "sample_partial", (C, B, 1), (SAMPLE_PARTIAL_THREADS, 1, 1),
            row_args + (_p(part), _p(cand)))
    _launch(logits, "sampling", "sample", (B, 1, 1), (1024, 1, 1),
            row_args + (_p(part), _p(cand), _i(C), _p(tokens), _p(logprobs)))
    return tokens, logprobs


def sample_chunks(V: int) -> int:
    """How many ``sample_partial`` CTAs read one row of ``V`` logits (a function of ``V`` only)."""
    return -(-V // SAMPLE_CHUNK)


def _u32_as_i32(x: int) -> int:
    x &= 0xFFFFFFFF
    return x - 2**32 if x >= 2**31 else x


def pack_sampling_params(params: Sequence, positions: Sequence[int], device: torch.device | str
                         ) -> dict[str, torch.Tensor]:
    """The per-row tensors ``sample`` takes, from ``SamplingParams`` objects and token positions.

    (Builds host tensors and copies them to ``device``: call it outside graph capture.)
    """
    if len(params) != len(positions):
        raise ValueError(f"{len(params)} params but {len(positions)} positions")
    seeds = [int(sp.seed) for sp in params]
    host = {
        "temperature": torch.tensor([float(sp.temperature) for sp in params], dtype=torch.float32),
        "top_k": torch.tensor([int(sp.top_k) for sp in params], dtype=torch.int32),
        "top_p": torch.tensor([float(sp.top_p) for sp in params], dtype=torch.float32),
        "seed_lo": torch.tensor([_u32_as_i32(s) for s in seeds], dtype=torch.int32),
        "seed_hi": torch.tensor([_u32_as_i32(s >> 32) for s in seeds], dtype=torch.int32),
        "pos": torch.tensor([int(p) for p in positions], dtype=torch.int32),
        "mode": torch.tensor([1 if getattr(sp, "logprobs_mode", "raw") == "processed" else 0 for sp in params],
                             dtype=torch.int32),
    }
    return {k: v.to(device, non_blocking=False) for k, v in host.items()}
