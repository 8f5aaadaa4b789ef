"""Where a decode step's time goes: per-kernel GPU time of one step, and the step time of the
captured graph with each launch fusion / GEMM path switched on and off (A/B on one engine).

    python benches/gpu/profile_decode.py [--models qwen3-0.6b qwen3-8b] [--batches 1 8 16 32 64]
                                         [--steps 48] [--prompt 256] [--variants VARIANT ...] [--out DIR]

Diagnostic, not a benchmark of record (the numbers of record are ``benches/test_engine_decode.py``):
random bf16 weights drawn on the GPU (``conformance.cases.draw_weights``; values do not change the work), a 256-token prompt per
sequence (``--prompt``), greedy decoding of ``--steps`` tokens. For each (model, batch):

* the median wall time of a decode step (graph replay, host side included) for the variants of
  ``VARIANTS``: ``cuBLAS`` (every GEMM through ``torch.matmul``), ``skinny`` (the runner's choice:
  GEMMs of <= 8 rows through ``ops.skinny_gemm``), both with plain launches and ``split_kv="fixed:256"``,
  ``pdl`` (the same with programmatic dependent launch, the default on sm_90), ``pdl+auto`` (and
  ``split_kv="auto"``), all with the skinny gate/up GEMM's SwiGLU epilogue off, ``fused`` (and the
  epilogue on), ``w4`` (and 4-warp CTAs for GEMMs of many tiles), ``cuBLAS+pdl`` (every GEMM through
  ``torch.matmul``, our kernels with PDL and ``auto``), and on top of ``w4`` the ``MAX_ELEMS`` variants
  (weights larger than a size go to cuBLAS; ``default``: the engine's 8M elements), and on top of
  ``default`` the ``BLAS_VARIANTS`` (``lt``: torch's cuBLASLt path), the ``SKINNY_N`` variants (the runner's
  choice of skinny GEMMs by weight rows, and of o_proj's L2 prefetch before its PDL wait), the ``STAGED`` variants
  (decode GEMMs on the staged skinny kernel, by role), the ``L2_VARIANTS`` (the staged kernel's weight copies
  without an L2 hint, ``ef0``), the ``QK_VARIANTS`` (``qk-apart``: qk_norm_rope in its own launch), the
  ``CLUSTER_VARIANTS`` (``ticket``: the fused attention's fold by its ticket, not in a cluster), the
  ``HANDOFF_VARIANTS`` (``handoff0``: a decode graph's ids uploaded and copied, two read-back copies), the
  ``COPY_VARIANTS`` (``copies-inline``: one slot per graph key, its copies on the compute stream), the
  ``EMBED_VARIANTS`` (``embed-apart``: the embedding and the first norm as two launches), the ``NORM_VARIANTS``
  (``norm-apart``: the add_rmsnorms between warpgroup GEMMs as their own launches), the ``EARLY_VARIANTS``
  (``attn-late``: a decode attention after qk_norm_rope's own launch waits before it reads its first tiles;
  ``attn-trigger``: qk_norm_rope lets it be scheduled before its own wait), the
  ``QK_ROWS_VARIANTS`` (``qk-all``: qk_norm_rope in the attention launch at any batch; ``qk-16``: at most 16
  rows), the ``WAVE_VARIANTS``
  (``gu-wave0``: gate/up never on qkv's one-wave configuration), the ``WIDE_VARIANTS`` (the decode GEMMs of
  9-32 rows on the wide staged kernels by configuration whatever their size, or ``wide0``: on cuBLAS), the
  ``BLAS_PDL_VARIANTS`` (``blas-pdl``: the edges into cuBLAS's GEMM kernels programmatic, which cuBLASLt 13.1's
  kernels do not wait behind -- a measurement of what those launches cost, with wrong outputs), the
  ``DECODE_BLAS_VARIANTS`` (``blas-cublas``: the decode GEMMs on cuBLAS through torch's cuBLAS path, not its
  cuBLASLt path), the ``GEMM_CLUSTER_VARIANTS`` (``cl-*``: the GEMMs of 17-64 rows on the cluster kernel, by
  role and size), the ``WG_VARIANTS`` (``wg-*``: those GEMMs on the warpgroup kernel, by role; ``res-p1``, ``res-p2``, ``res-p8``:
  o_proj and down on 1, 2, 8 CTAs a unit), the
  ``CANON_VARIANTS`` (``canon8``, ``canon16``, ``canon9-16``, ...: steps of 1-8, 1-16, 9-16 ... rows with every
  GEMM on ``ops.gemm``, the batch-invariant mode's kernels; the default is ``runner.CANONICAL_GEMM_ROWS``,
  ``canon-off`` none), the ``KVPF_VARIANTS`` (``kvpf``: the K/V prefetch into L2 on, ``kvpf0``: off, the default;
  ``kvpf-all``: at any batch; ``kvpf-half``, ``kvpf-2x``: at most half or twice L2 of K/V a layer; ``kvpf-g1``,
  ``-g2``, ``-g4``: on 1, 2, 4 CTAs a sequence, a slower issue; ``kvpf-lines``: a line prefetch instead of a bulk
  one), the ``SPREAD_VARIANTS`` (``spread``: the warpgroup kernel's split-K fold spread over a cluster's CTAs,
  ``gather``: in CTA 0), the ``STAGES_VARIANTS`` (``s4``: the layer GEMMs on their 4-stage warpgroup configurations,
  two CTAs a multiprocessor at 32 x rows; ``s4-mlp``: all but qkv) and the
  ``ENGINE_VARIANTS`` (``sync``:
  the lookahead step off; ``t=1``: temperature-1 sampling;
  ``qwen3-sampling``: Qwen3's suggested temperature 0.6, top-k 20, top-p 0.95) and ``auto-7`` (the seventh
  session's ``auto`` split rule instead of ``reference.attention.split_size_for``'s),
  with the memory floor (weight + KV bytes over the copy ceiling measured here) and the % of it;
* one eagerly launched step under ``torch.profiler``: the GPU time per kernel name (summed over
  layers) and the number of launches, so the sum of kernel times can be set against the step time
  (the rest is launch gaps and the host).

Prints tables; with ``--out`` also writes ``profile_decode.json``.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[2]
sys.path[:0] = [str(ROOT), str(ROOT / "benches")]

import optimized  # noqa: E402
from optimized import launch, ops  # noqa: E402
from optimized import runner as opt_runner  # noqa: E402
from _bench import Scale, StepRecorder, decode_pool, kv_bytes_per_token, weight_bytes_per_step  # noqa: E402
from _ceilings import measure_ceilings  # noqa: E402
from conformance.cases import draw_weights  # noqa: E402
from reference import SamplingParams  # noqa: E402
from reference.types import SplitKVPolicy  # noqa: E402
from reference.config import named_config  # noqa: E402
from reference.attention import split_size_for  # noqa: E402

PROMPT = 256
W4_TILES = ops.SKINNY_W4_TILES
GPU = Scale("gpu")
#: variant -> (GEMMs of at most this many rows through skinny_gemm (-1: the runner's default), programmatic
#: dependent launch on, split-KV policy, the skinny gate/up GEMM's SwiGLU epilogue on, 4-warp skinny CTAs
#: from ``ops.SKINNY_W4_TILES`` tiles on (False: never))
VARIANTS: dict[str, tuple[int, bool, str, bool, bool]] = {
    "cuBLAS": (0, False, "fixed:256", False, False),     # every GEMM through torch.matmul, plain launches
    "skinny": (-1, False, "fixed:256", False, False),    # the runner's GEMM choice, plain launches (CuPy)
    "pdl": (-1, True, "fixed:256", False, False),        # the same with programmatic dependent launch (sm_90)
    "cuBLAS+pdl": (0, True, "auto", False, False),       # every GEMM through torch.matmul, our kernels with PDL, auto
    "pdl+auto": (-1, True, "auto", False, False),        # and split_kv="auto"
    "fused": (-1, True, "auto", True, False),            # and SwiGLU in the gate/up GEMM's epilogue
    "w4": (-1, True, "auto", True, True),                # and 4-warp CTAs for many-tile GEMMs
}
#: variants on top of ``w4``: the runner's ``skinny_max_elems`` (weights larger than this go to cuBLAS;
#: every other variant sends all GEMMs of <= skinny_max_m rows to skinny_gemm). "default": the engine's.
MAX_ELEMS: dict[str, int] = {"skinny<=16M": 16 << 20, "skinny<=64M": 64 << 20, "skinny<=256M": 256 << 20,
                             "default": 8 << 20}
#: variants on top of "default": the lookahead step off (``sync``: a step-synchronous engine), and
#: sampling at temperature 1 instead of greedy (``t=1``; ``t=1 sync``: both), or with Qwen3's suggested
#: temperature 0.6, top-k 20, top-p 0.95 (``qwen3-sampling``): (lookahead on, SamplingParams keywords)
ENGINE_VARIANTS: dict[str, tuple[bool, dict]] = {
    "sync": (False, {}), "t=1": (True, dict(temperature=1.0)), "t=1 sync": (False, dict(temperature=1.0)),
    "qwen3-sampling": (True, dict(temperature=0.6, top_k=20, top_p=0.95)),
}


def seventh_session_split(policy_kind: str, fixed_size: int, seq_lens: list[int], n_kv: int, num_sms: int = 132):
    """``split_kv="auto"`` as the seventh session had it (about 4 work items per multiprocessor, at least 2
    tiles of 64 keys per split up to SMs / 8 rows, else 4), for the ``auto-7`` variant's A/B against the rule
    of ``reference.attention.split_size_for``."""
    if policy_kind != "auto":
        return split_size_for(policy_kind, fixed_size, seq_lens, n_kv, num_sms)
    rows = max(1, len(seq_lens) * n_kv)
    splits = min(16, max(1, -(-4 * num_sms // rows)))
    per_split = -(-max(seq_lens + [1]) // splits)
    size = -(-per_split // 64) * 64
    return max(size, 64 * (2 if rows <= num_sms // 8 else 4))


#: variants on top of "default" that swap the runner's split-size rule: (rule)
SPLIT_RULES = {"auto-7": seventh_session_split}
#: variants on top of "default" with torch's BLAS library preference changed while their graphs are captured
#: and their prefills run (``torch.backends.cuda.preferred_blas_library``): ``lt``, torch's own cuBLASLt call
BLAS_VARIANTS: dict[str, str] = {"lt": "cublaslt"}
#: variants on top of "default" with another ``skinny_max_n`` (decode GEMMs whose weights have at most N rows
#: go to skinny_gemm whatever their size) and ``skinny_prefetch_o_max_elems`` (o_proj's skinny GEMM prefetches
#: its first weights during the attention only up to this size): ``sn-off`` as before the fourteenth session
#: (qwen3-8b's o_proj and down on cuBLAS), ``n6144`` qkv on the skinny kernel too, ``pf-o`` o_proj's prefetch
#: at any size, ``np-o`` o_proj's prefetch at none (the fourteenth session's first A/B: "skinny-n4096" was
#: ``pf-o``, "sn-np-o" the default, "skinny-np-o" qwen3-0.6b's ``np-o``)
SKINNY_N: dict[str, tuple[int, int]] = {"sn-off": (0, 8 << 20), "n6144": (6144, 8 << 20), "pf-o": (4096, 1 << 62),
                                        "np-o": (4096, -1)}
_ALL = opt_runner.GEMM_ROLES


def _st(cfg: tuple[int, int, int, int], roles=_ALL, o_pre: int = 0, pre: int | None = None
        ) -> dict[str, tuple[int, int, int, int, int]]:
    """The runner's ``staged`` for (chunk columns, stages, producer lanes, CTAs per SM) on ``roles``: ``pre``
    stages fetched before the PDL wait (default: every stage), o_proj's ``o_pre`` (the attention before it is
    latency-bound)."""
    return {r: cfg + (o_pre if r == "o_proj" else cfg[1] if pre is None else pre,) for r in roles}


_K1 = (1024, 3, 16, 2)
#: variants on top of "default" that send decode GEMMs to the staged skinny kernel (the runner's ``staged``:
#: role -> (chunk columns, stages, producer lanes, CTAs per SM, stages fetched before the PDL wait)); the
#: engine's own ``staged`` is off in every other variant
STAGED: dict[str, dict[str, tuple[int, int, int, int, int]]] = {
    "st-gu": _st((2048, 2, 16, 1), ("gate_up",)),
    "st-big": _st((2048, 2, 16, 1), ("qkv", "gate_up", "lm_head")),
    "st-all": _st((2048, 2, 16, 1)),
    "st1k-all": _st(_K1),
    "st1k-np": _st(_K1, pre=0),
    "st1k-pf": _st(_K1, o_pre=3),
    "st1k-nogu": _st(_K1, ("qkv", "o_proj", "down", "lm_head")),
    "st1k-h2k": {**_st(_K1), **_st((2048, 2, 16, 1), ("lm_head",))},
    "st1k-pre1": _st(_K1, o_pre=1, pre=1),
    "st1k-pre2": _st(_K1, o_pre=2, pre=2),
    "st1k-o1": _st(_K1, o_pre=1),
    "st1k4x1": _st((1024, 4, 16, 1), o_pre=4),
    "no-staged": {},
    # eighteenth session: 3 CTAs a multiprocessor of 512-column chunks, 4 stages (69.6 KB each) for the roles
    # whose 16-row tiles fill about 1.45 waves of the default's 2 x 132 CTAs (qwen3-8b's qkv, 384 tiles;
    # qwen3-0.6b's gate/up, 384) -- 396 CTAs take them in one wave; ``qkv-k512``: the chunks alone, 2 a SM
    "qkv3": {**_st(_K1, o_pre=2, pre=2), **_st((512, 4, 16, 3), ("qkv",), pre=2)},
    "gu3": {**_st(_K1, o_pre=2, pre=2), **_st((512, 4, 16, 3), ("gate_up",), pre=2)},
    "qkv3-gu3": {**_st(_K1, o_pre=2, pre=2), **_st((512, 4, 16, 3), ("qkv", "gate_up"), pre=2)},
    "qkv-k512": {**_st(_K1, o_pre=2, pre=2), **_st((512, 4, 16, 2), ("qkv",), pre=2)},
    # on top of the engine's default since (qkv at 3 a SM): o_proj or down there too; ``qkv2``: qkv back at 2
    "o3": {**_st(_K1, o_pre=2, pre=2), **_st((512, 4, 16, 3), ("qkv", "o_proj"), pre=2)},
    "d3": {**_st(_K1, o_pre=2, pre=2), **_st((512, 4, 16, 3), ("qkv", "down"), pre=2)},
    "qkv2": _st(_K1, o_pre=2, pre=2),
    # qkv's early stages (of 4)
    "qkv-p1": {**_st(_K1, o_pre=2, pre=2), **_st((512, 4, 16, 3), ("qkv",), pre=1)},
    "qkv-p3": {**_st(_K1, o_pre=2, pre=2), **_st((512, 4, 16, 3), ("qkv",), pre=3)},
    "qkv-p4": {**_st(_K1, o_pre=2, pre=2), **_st((512, 4, 16, 3), ("qkv",), pre=4)},
    # qkv at 3 a SM with fewer stages (52.2 / 34.8 KB a CTA), leaving shared memory for the attention's CTAs,
    # which PDL schedules while the qkv GEMM runs
    "qkv-s3": {**_st(_K1, o_pre=2, pre=2), **_st((512, 3, 16, 3), ("qkv",), pre=2)},
    "qkv-s2": {**_st(_K1, o_pre=2, pre=2), **_st((512, 2, 16, 3), ("qkv",), pre=2)},
}
#: variants on top of "default" with the staged kernel's weight copies at another L2 priority (the runner's
#: ``staged_evict_first``; every other variant: the engine's default) or another count of early stages:
#: ``ef0`` copies without a hint, as the fifteenth session ran them; ``ef-pre1`` / ``ef-pre3`` evict-first
#: with 1 / 3 stages fetched early (o_proj too); ``o-pre0`` / ``o-pre3``: o_proj with 0 / 3 early stages, the
#: rest with the default 2 (seventeenth session: the attention before o_proj now reads its K/V before its wait)
L2_VARIANTS: dict[str, tuple[bool, dict[str, tuple[int, int, int, int, int]] | None]] = {
    "ef0": (False, None), "ef-pre1": (True, _st(_K1, o_pre=1, pre=1)), "ef-pre3": (True, _st(_K1, o_pre=3)),
    "o-pre0": (True, _st(_K1, o_pre=0, pre=2)), "o-pre3": (True, _st(_K1, o_pre=3, pre=2)),
}
#: variants on top of "default" with a decode step's qk_norm_rope in its own launch before the attention
#: (the runner's ``fuse_qk_attention`` off; every other variant: on, the engine's default since the
#: seventeenth session)
QK_VARIANTS: dict[str, bool] = {"qk-apart": False}
#: variants on top of "default" with the fused attention's fold by its ticket instead of in a cluster
#: (``ops.DECODE_CLUSTER`` off)
CLUSTER_VARIANTS: dict[str, bool] = {"ticket": False}
#: variants on top of "default" with the decode graphs' ids in the uploaded metadata and two read-back copies
#: (the runner's ``decode_handoff`` off)
HANDOFF_VARIANTS: dict[str, bool] = {"handoff0": False}
#: variants on top of "default" with one device slot per decode graph key and the upload and read-back inline
#: on the compute stream (the runner's ``decode_copy_stream`` off)
COPY_VARIANTS: dict[str, bool] = {"copies-inline": False}
#: variants on top of "default" with the embedding and the first RMSNorm as two launches (``fuse_embed_norm`` off)
EMBED_VARIANTS: dict[str, bool] = {"embed-apart": False}
#: variants on top of "default" with the add_rmsnorms of a decode step on the warpgroup GEMMs as their own launches
#: (``fuse_norm_gemm`` off; read at capture)
NORM_VARIANTS: dict[str, bool] = {"norm-apart": False}
#: variants on top of "default" (``early_attention``, ``early_attention_trigger``): the decode attention after
#: qk_norm_rope's own launch waiting for it before any read, or scheduled before qk_norm_rope's own wait
EARLY_VARIANTS: dict[str, tuple[bool, bool]] = {"attn-late": (False, False), "attn-trigger": (True, True)}
#: variants on top of "default" without the runner's one-wave rule (``staged_one_wave``: gate/up on qkv's
#: configuration where its tiles fit one wave of it)
WAVE_VARIANTS: dict[str, dict] = {"gu-wave0": {}}
#: variants on top of "default" with qk_norm_rope in the attention launch at any batch or at most 16 rows (the
#: default before the fifty-fourth session) (``fuse_qk_max_rows``)
QK_ROWS_VARIANTS: dict[str, int] = {"qk-all": 1 << 30, "qk-16": 16}


def _wide(width: int, cfg: tuple[int, int, int, int, int], roles=_ALL, pre: int = 2
          ) -> dict[int, dict[str, tuple[int, int, int, int, int, int]]]:
    """The runner's ``staged_wide`` for one row width: (chunk columns, stages, producer lanes, CTAs per SM, tiles
    a stage) on ``roles``, ``pre`` stages fetched before the PDL wait."""
    return {width: {r: cfg[:4] + (pre, cfg[4]) for r in roles}}


#: variants on top of "default" with the decode GEMMs of 9-16 / 17-32 rows on the wide staged kernels (the
#: runner's ``staged_wide``; every other variant: the engine's default); ``wide0``: none of them (cuBLAS)
WIDE_VARIANTS: dict[str, dict[int, dict[str, tuple[int, int, int, int, int, int]]]] = {
    "wide0": {},
    "w16-512x2": _wide(16, (512, 4, 16, 2, 1)),
    "w16-512x3": _wide(16, (512, 3, 16, 3, 1)),
    "w32-512x3": _wide(32, (512, 3, 16, 3, 1)),
    "w32-t2": _wide(32, (512, 2, 16, 2, 2)),
    "w32-nohead": _wide(32, (512, 3, 16, 3, 1), ("qkv", "o_proj", "gate_up", "down")),
    # with the engine's size limit (``staged_wide_max_elems``), on top of the default's 16-row rule; and qkv and
    # o_proj alone, at any size
    "w32-lim": {**_wide(16, (512, 3, 16, 3, 1)), **_wide(32, (512, 3, 16, 3, 1))},
    "w32-t2lim": {**_wide(16, (512, 3, 16, 3, 1)), **_wide(32, (512, 2, 16, 2, 2))},
    "w32-qo": {**_wide(16, (512, 3, 16, 3, 1)), **_wide(32, (512, 3, 16, 3, 1), ("qkv", "o_proj"))},
}
#: the WIDE_VARIANTS that ignore the runner's ``staged_wide_max_elems`` (every other variant: the engine's limit)
WIDE_ANY_SIZE = {"w16-512x2", "w16-512x3", "w32-512x3", "w32-t2", "w32-nohead", "w32-qo"}
#: variants on top of "default" with the edges into cuBLAS's GEMM kernels programmatic (``CudaRunner.blas_pdl``)
BLAS_PDL_VARIANTS: dict[str, bool] = {"blas-pdl": True}
#: variants on top of "default" with another torch BLAS backend for the decode GEMMs on cuBLAS
#: (``CudaRunner.decode_blas``; the default: cuBLASLt)
DECODE_BLAS_VARIANTS: dict[str, str | None] = {"blas-cublas": "cublas"}
#: variants on top of "default" with the decode GEMMs of 17-64 rows on the cluster kernel (``CudaRunner.cluster_gemm``,
#: ``cluster_max_elems``): roles -> (chunk columns, stages, tiles a unit, CTAs a cluster, stages before the wait)
_CL_S4, _CL_S3, _CL_T1, _CL_K512 = (256, 4, 2, 4, 4), (256, 3, 2, 4, 3), (256, 5, 1, 4, 5), (512, 2, 2, 4, 2)
_LAYER_ROLES = ("qkv", "o_proj", "gate_up", "down")
GEMM_CLUSTER_VARIANTS: dict[str, tuple[dict[str, tuple[int, int, int, int, int]], int]] = {
    "cl-s4": ({r: _CL_S4 for r in _LAYER_ROLES}, 1 << 62),
    "cl-s3": ({r: _CL_S3 for r in _LAYER_ROLES}, 1 << 62),
    "cl-t1": ({r: _CL_T1 for r in _LAYER_ROLES}, 1 << 62),
    "cl-k512": ({r: _CL_K512 for r in _LAYER_ROLES}, 1 << 62),
    "cl-mix": ({"qkv": _CL_K512, "gate_up": _CL_K512, "o_proj": _CL_T1, "down": _CL_T1}, 1 << 62),
    "cl-head": ({r: _CL_S4 for r in _LAYER_ROLES + ("lm_head",)}, 1 << 62),
    "cl-lim": ({r: _CL_S4 for r in _LAYER_ROLES + ("lm_head",)}, 32 << 20),
}
#: variants on top of "default" with the decode GEMMs of 17-64 rows on the warpgroup kernel (``CudaRunner.wg_gemm``):
#: x tile (32, 64) -> roles -> (64-row tiles a unit, CTAs splitting K), None: ``ops.skinny_wg_split``'s; a K a
#: configuration does not take stays on cuBLAS; ``wg-off``: every one of them on cuBLAS (the default before the
#: twenty-third session; "default" is the engine's own ``runner.WG_GEMM`` on a compute-capability-9.0 GPU)
_WG_HEAD = _LAYER_ROLES + ("lm_head",)
WG_VARIANTS: dict[str, dict[int, dict[str, tuple[int, int] | None]]] = {
    "wg-off": {},
    "wg-1": {n: {r: (1, 1) for r in _LAYER_ROLES} for n in (32, 64)},
    "wg-s2": {n: {"qkv": (1, 2), "o_proj": (1, 2), "gate_up": (1, 1), "down": (1, 2)} for n in (32, 64)},
    "wg-s4": {n: {"qkv": (1, 4), "o_proj": (1, 4), "gate_up": (1, 1), "down": (1, 4)} for n in (32, 64)},
    "wg-rule": {n: {r: None for r in _LAYER_ROLES} for n in (32, 64)},
    "wg-head": {n: {r: None for r in _WG_HEAD} for n in (32, 64)},
    "wg-head32": {32: {r: None for r in _WG_HEAD}, 64: {r: None for r in ("qkv", "o_proj", "down", "lm_head")}},
    # o_proj and down (the residual epilogue where the add_rmsnorms fold) on 1, 2 or 8 CTAs a unit, the rest the rule:
    # with qwen3-0.6b's 16 units, 2 CTAs a unit puts each kernel beside its neighbour on 132 SMs (32 + 96 CTAs)
    **{f"res-p{kp}": {n: {**{r: None for r in _WG_HEAD}, "o_proj": (1, kp), "down": (1, kp)} for n in (32, 64)}
       for kp in (1, 2, 8)},
}
#: steps of (first, last) rows with every GEMM on ``ops.gemm`` (the batch-invariant kernels: the wide one, its
#: SwiGLU epilogue, its weights before the PDL wait), ``runner.canonical_gemm_min_m`` / ``canonical_gemm_max_m``
CANON_VARIANTS: dict[str, tuple[int, int]] = {"canon-off": (1, 0), "canon8": (1, 8), "canon16": (1, 16), "canon9-16": (9, 16),
                                              "canon17-32": (17, 32), "canon9-48": (9, 48), "canon33-64": (33, 64)}
#: variants on top of "default" with the decode steps' K/V prefetch into L2, off by default since the fifty-sixth
#: session (on in its first runs, where "default" had it on): (``runner.kv_prefetch_min_rows``, None: the default;
#: ``kv_prefetch_max_bytes`` as a fraction of the GPU's L2; ``kv_prefetch_ctas``; ``kv_prefetch_lines``): off (the
#: default), on, at any batch, half and twice L2, on 1/2/4 CTAs a sequence, by line prefetches
KVPF_VARIANTS: dict[str, tuple[int | None, float, int | None, bool]] = {
    "kvpf0": (None, 0.0, None, False), "kvpf": (None, 1.0, None, False), "kvpf-all": (1, 1.0, None, False),
    "kvpf-half": (None, 0.5, None, False),
    "kvpf-2x": (None, 2.0, None, False), **{f"kvpf-g{g}": (None, 1.0, g, False) for g in (1, 2, 4)},
    "kvpf-lines": (None, 1.0, None, True)}
#: the warpgroup kernel's split-K fold (``runner.wg_spread_fold``, read at capture): ``spread`` over the CTAs of a
#: cluster, ``gather`` in CTA 0
SPREAD_VARIANTS: dict[str, bool] = {"gather": False, "spread": True}
#: layer GEMMs on their warpgroup configurations of 4 stages where built (``runner.wg_stages``, read at capture: at
#: 32 x rows, two CTAs a multiprocessor, so a GEMM's CTAs can be resident beside the one before it): all four roles,
#: or all but qkv (whose 8 stages a unit then no longer all go before the wait)
STAGES_VARIANTS: dict[str, dict[str, int]] = {"s4": dict.fromkeys(_LAYER_ROLES, 4),
                                              "s4-mlp": dict.fromkeys(_LAYER_ROLES[1:], 4)}
#: the variants on top of "default" (every dict above but VARIANTS and MAX_ELEMS)
ENGINE_GROUPS = (ENGINE_VARIANTS, SPLIT_RULES, BLAS_VARIANTS, SKINNY_N, STAGED, L2_VARIANTS, QK_VARIANTS,
                 CLUSTER_VARIANTS, HANDOFF_VARIANTS, COPY_VARIANTS, EMBED_VARIANTS, NORM_VARIANTS, EARLY_VARIANTS,
                 QK_ROWS_VARIANTS,
                 WAVE_VARIANTS, WIDE_VARIANTS, BLAS_PDL_VARIANTS, DECODE_BLAS_VARIANTS,
                 GEMM_CLUSTER_VARIANTS, WG_VARIANTS, CANON_VARIANTS, KVPF_VARIANTS, SPREAD_VARIANTS, STAGES_VARIANTS)


def _params(steps: int, sampling: dict | None) -> SamplingParams:
    """``steps`` tokens, no stop token, greedy unless ``sampling`` holds other ``SamplingParams`` keywords."""
    return SamplingParams(**{"temperature": 0.0, **(sampling or {})}, max_tokens=steps, stop_token_ids=())


def step_times(eng, prompts, steps, sampling: dict | None = None) -> list[float]:
    """Wall seconds of each decode step of a generation of ``steps`` tokens (greedy unless ``sampling``
    holds other ``SamplingParams`` keywords)."""
    with StepRecorder(eng, GPU) as rec:
        eng.generate(prompts, _params(steps, sampling))
    return [d["s"] for d in rec.of("decode")]


def kernel_table(eng, prompts) -> tuple[list[tuple[str, float, int]], float]:
    """(kernel name, GPU us per step, launches) of one eagerly launched decode step, and the total."""
    from torch.profiler import ProfilerActivity, profile
    r = eng.runner
    orig = eng._execute
    state: dict = {"decodes": 0, "prof": None}

    def execute(batch):
        if batch.kind != "decode":
            return orig(batch)
        state["decodes"] += 1
        if state["decodes"] != 3:                      # the third decode step: warm, full batch
            return orig(batch)
        torch.cuda.synchronize()
        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            res = orig(batch)
            torch.cuda.synchronize()
        state["prof"] = prof
        return res
    r.use_graphs, eng._execute = False, execute
    try:
        eng.generate(prompts, SamplingParams(temperature=0.0, max_tokens=5, stop_token_ids=()))
    finally:
        r.use_graphs, eng._execute = True, orig
    agg: dict[str, list[float]] = {}
    for ev in state["prof"].events():
        if ev.device_type == torch.autograd.DeviceType.CUDA:
            a = agg.setdefault(ev.name, [0.0, 0])
            a[0] += getattr(ev, "device_time_total", 0.0) or getattr(ev, "cuda_time_total", 0.0)
            a[1] += 1
    rows = sorted(((k[:70], v[0], int(v[1])) for k, v in agg.items()), key=lambda t: -t[1])
    return rows, sum(v for _, v, _ in rows)


def graph_timeline(eng, prompts, steps: int = 8, sampling: dict | None = None
                   ) -> tuple[list[tuple[str, int, float, float]], float, float]:
    """The kernels of one replayed decode step (a warm one), from a profiler trace: per kernel name the
    launches, the summed duration and the summed *increment*: this kernel's end less the previous
    kernel's end. With programmatic dependent launch a kernel starts (and is timed) while its
    predecessor runs, so durations overlap; the increments do not, and sum to the step's span.
    Also the median idle gap of the GPU between two decode steps (the last kernel's end of one to the
    first kernel's start of the next: the host's part of a step where nothing hides it)."""
    import tempfile

    from torch.profiler import ProfilerActivity, profile
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        eng.generate(prompts, _params(steps, sampling))
        torch.cuda.synchronize()
    with tempfile.NamedTemporaryFile(suffix=".json") as f:
        prof.export_chrome_trace(f.name)
        trace = json.loads(Path(f.name).read_text())
    ks = sorted((e["ts"], e["ts"] + e["dur"], e["name"]) for e in trace["traceEvents"]
                if e.get("cat") == "kernel" and e.get("ph") == "X")
    steps_k: list[list] = []                       # split at the sampling kernel, the last of every step
    cur: list = []
    for k in ks:
        cur.append(k)
        if k[2] == "sample":
            steps_k.append(cur)
            cur = []
    if not steps_k:
        return [], 0.0, 0.0
    gaps = [b[0][0] - a[-1][1] for a, b in zip(steps_k[1:-1], steps_k[2:])]   # between decode steps
    gap = statistics.median(gaps) if gaps else 0.0
    step = steps_k[-2] if len(steps_k) > 2 else steps_k[-1]   # a warm decode step (the first ones prefill)
    agg: dict[str, list[float]] = {}
    prev_end = step[0][0]
    prev_name = ""
    for start, end, name in step:
        key = name[:60]
        if name.startswith(("skinny_staged", "skinny_cluster")) and name.endswith("_bf16"):   # the role, by the kernel before it
            key += " [o_proj]" if prev_name.startswith("split_kv") else " [down]" if prev_name.endswith("swiglu") \
                else " [qkv]"
        prev_name = name
        a = agg.setdefault(key, [0, 0.0, 0.0])
        a[0] += 1
        a[1] += end - start
        a[2] += max(end, prev_end) - prev_end
        prev_end = max(end, prev_end)
    rows = sorted(((k, int(v[0]), v[1], v[2]) for k, v in agg.items()), key=lambda r: -r[3])
    return rows, prev_end - step[0][0], gap


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", nargs="*", default=["qwen3-0.6b", "qwen3-8b"])
    ap.add_argument("--batches", nargs="*", type=int, default=[1, 8, 16, 32, 64])
    ap.add_argument("--steps", type=int, default=48)
    ap.add_argument("--profile-batches", nargs="*", type=int, default=[1, 32])
    ap.add_argument("--timeline-batches", nargs="*", type=int, default=[])
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--prompt", type=int, default=PROMPT, help="prompt tokens (the context the steps start from)")
    ap.add_argument("--variants", nargs="*",
                    choices=tuple(VARIANTS) + tuple(MAX_ELEMS) + tuple(v for group in ENGINE_GROUPS for v in group),
                    default=["cuBLAS", "skinny", "pdl"])
    ap.add_argument("--out", type=Path, default=None)
    args = ap.parse_args()
    dev = GPU.device
    blas0 = torch.backends.cuda.preferred_blas_library()
    ceiling = measure_ceilings(GPU)["copy_GBps"]
    print(f"device {torch.cuda.get_device_name()}, copy ceiling {ceiling:.0f} GB/s")
    report: dict = {"copy_GBps": ceiling, "runs": []}
    for name in args.models:
        cfg = named_config(name)
        w = draw_weights(cfg, 0, dev)
        wbytes, kv_tok = weight_bytes_per_step(cfg), kv_bytes_per_token(cfg)
        eng = optimized.Engine.from_state_dict(cfg, w, device=str(dev), block_size=16,
                                               **decode_pool(args.prompt + args.steps + 8, max(args.batches), 16))
        del w
        default_split, default_mm = str(eng.policy), eng.runner.skinny_max_m
        default_elems = eng.runner.skinny_max_elems
        default_n = (eng.runner.skinny_max_n, eng.runner.skinny_prefetch_o_max_elems)
        default_staged = (dict(eng.runner.staged), eng.runner.staged_min_elems)
        default_ef = eng.runner.staged_evict_first
        default_qk_rows = eng.runner.fuse_qk_max_rows
        default_wave = dict(eng.runner.staged_one_wave)
        default_wide = {w: dict(d) for w, d in eng.runner.staged_wide.items()}
        default_wide_max = eng.runner.staged_wide_max_elems
        default_decode_blas = eng.runner.decode_blas
        default_wg = {n: dict(d) for n, d in eng.runner.wg_gemm.items()}
        default_canon = (eng.runner.canonical_gemm_min_m, eng.runner.canonical_gemm_max_m)
        default_kvpf = (eng.runner.kv_prefetch_min_rows, torch.cuda.get_device_properties(dev).L2_cache_size)
        default_spread = eng.runner.wg_spread_fold
        print(f"\n== {name} ==  weights {wbytes / 1e9:.2f} GB/step, KV {kv_tok} B/token")
        print(f"{'batch':>5} {'variant':>8} {'ms/step':>8} {'min':>7} {'max':>7} {'floor ms':>8} {'% floor':>7}"
              f"   (median over {args.rounds} alternating rounds of the median of {args.steps} steps)")
        for batch in args.batches:
            prompts = [[(b * 131 + i * 7) % cfg.vocab_size for i in range(args.prompt)] for b in range(batch)]
            ctx = args.prompt + args.steps / 2
            floor = (wbytes + batch * ctx * kv_tok) / (ceiling * 1e9) * 1e3
            graph_sets: dict[str, dict] = {}
            pools: dict[str, object] = {}

            def use(variant: str, eng=eng, graph_sets=graph_sets, pools=pools, mm0=default_mm,
                    default_n=default_n, default_staged=default_staged, default_ef=default_ef,
                    default_qk_rows=default_qk_rows, default_wave=default_wave, default_wide=default_wide,
                    default_wide_max=default_wide_max, default_decode_blas=default_decode_blas,
                    default_wg=default_wg, default_canon=default_canon, default_kvpf=default_kvpf,
                    default_spread=default_spread) -> None:
                """The variant's settings, its own captured graphs and its own graph memory pool."""
                mm, pdl, split, fuse, w4 = VARIANTS.get(variant, VARIANTS["w4"])
                engine_variant = any(variant in group for group in ENGINE_GROUPS)
                eng.runner.fuse_qk_attention = QK_VARIANTS.get(variant, True)
                ops.DECODE_CLUSTER = CLUSTER_VARIANTS.get(variant, True)   # read at capture (its own graphs)
                eng.runner.decode_handoff = HANDOFF_VARIANTS.get(variant, True)   # read at capture
                eng.runner.decode_copy_stream = COPY_VARIANTS.get(variant, True)  # read at capture
                eng.runner.fuse_embed_norm = EMBED_VARIANTS.get(variant, True)
                eng.runner.fuse_norm_gemm = NORM_VARIANTS.get(variant, True)   # read at capture
                eng.runner.early_attention, eng.runner.early_attention_trigger = EARLY_VARIANTS.get(
                    variant, (True, False))
                eng.runner.blas_pdl = BLAS_PDL_VARIANTS.get(variant, False)   # read at capture
                eng.runner.decode_blas = DECODE_BLAS_VARIANTS.get(variant, default_decode_blas)   # read at capture
                cl_roles, cl_max = GEMM_CLUSTER_VARIANTS.get(variant, ({}, 1 << 62))
                eng.runner.cluster_gemm, eng.runner.cluster_max_elems = dict(cl_roles), cl_max
                eng.runner.wg_gemm = {n: dict(d) for n, d in WG_VARIANTS.get(variant, default_wg).items()}
                eng.runner.canonical_gemm_min_m, eng.runner.canonical_gemm_max_m = CANON_VARIANTS.get(variant, default_canon)
                eng.runner.fuse_qk_max_rows = QK_ROWS_VARIANTS.get(variant, default_qk_rows)
                kv_rows, kv_frac, kv_ctas, kv_lines = KVPF_VARIANTS.get(variant, KVPF_VARIANTS["kvpf0"])   # at capture
                eng.runner.kv_prefetch_min_rows = default_kvpf[0] if kv_rows is None else kv_rows
                eng.runner.kv_prefetch_max_bytes = int(default_kvpf[1] * kv_frac)
                eng.runner.kv_prefetch_ctas = kv_ctas
                eng.runner.kv_prefetch_lines = kv_lines
                eng.runner.wg_spread_fold = SPREAD_VARIANTS.get(variant, default_spread)   # read at capture
                eng.runner.wg_stages = dict(STAGES_VARIANTS.get(variant, {}))               # read at capture
                eng.runner.staged_one_wave = dict(WAVE_VARIANTS.get(variant, default_wave))
                eng.runner.staged_wide = {w: dict(d) for w, d in WIDE_VARIANTS.get(variant, default_wide).items()}
                eng.runner.staged_wide_max_elems = 1 << 62 if variant in WIDE_ANY_SIZE else default_wide_max
                ef, ef_staged = L2_VARIANTS.get(variant, (default_ef, None))
                eng.runner.staged_evict_first = ef
                if ef_staged is not None:
                    eng.runner.staged, eng.runner.staged_min_elems = dict(ef_staged), 0
                elif variant in STAGED and variant != "no-staged":       # forced, at any size
                    eng.runner.staged, eng.runner.staged_min_elems = dict(STAGED[variant]), 0
                elif variant == "default" or (engine_variant and variant != "no-staged"):
                    eng.runner.staged, eng.runner.staged_min_elems = dict(default_staged[0]), default_staged[1]
                else:                       # the earlier sessions' variants, and "no-staged": the staged kernel off
                    eng.runner.staged = {}
                eng.runner.skinny_max_n, eng.runner.skinny_prefetch_o_max_elems = SKINNY_N.get(variant, default_n)
                if variant in MAX_ELEMS and variant != "default":   # by size alone, as the sixth session measured
                    eng.runner.skinny_max_n = 0
                torch.backends.cuda.preferred_blas_library(BLAS_VARIANTS.get(variant, blas0))
                eng.runner.skinny_max_elems = MAX_ELEMS.get("default" if engine_variant else variant, 1 << 62)
                eng.runner.lookahead = ENGINE_VARIANTS.get(variant, (True, {}))[0]
                eng.runner.skinny_max_m = mm if mm >= 0 else mm0
                eng.runner.fuse_swiglu = fuse
                ops.SKINNY_W4_TILES = W4_TILES if w4 else 1 << 40   # read at capture (each variant captures its own)
                eng.runner.policy = SplitKVPolicy.parse(split)
                opt_runner.split_size_for = SPLIT_RULES.get(variant, split_size_for)  # read at capture
                launch.set_pdl(pdl)
                eng.runner.graphs = graph_sets.setdefault(variant, {})
                eng.runner.pool = pools.get(variant)

            def sampling_of(variant: str) -> dict:
                return ENGINE_VARIANTS.get(variant, (True, {}))[1]

            for variant in args.variants:                      # capture + warm each variant once
                use(variant)
                step_times(eng, prompts, 4, sampling_of(variant))
                pools[variant] = eng.runner.pool               # the pool its captures created
            times: dict[str, list[float]] = {v: [] for v in args.variants}
            for _ in range(args.rounds):                       # then alternate, so drift hits all alike
                for variant in args.variants:
                    use(variant)
                    times[variant].append(statistics.median(step_times(eng, prompts, args.steps, sampling_of(variant))) * 1e3)
            for variant in args.variants:
                med = statistics.median(times[variant])
                lo, hi = min(times[variant]), max(times[variant])
                print(f"{batch:>5} {variant:>8} {med:8.3f} {lo:7.3f} {hi:7.3f} {floor:8.3f} {100 * floor / med:7.1f}")
                report["runs"].append(dict(model=name, batch=batch, variant=variant, step_ms=med, round_ms=times[variant],
                                           floor_ms=floor, pct_floor=100 * floor / med))
            if batch in args.timeline_batches:
                for variant in args.variants:
                    use(variant)
                    rows, span, gap = graph_timeline(eng, prompts, sampling=sampling_of(variant))
                    print(f"   graph timeline, {variant}, batch {batch}: {span:.1f} us from the first kernel's start to "
                          f"the last one's end, GPU idle {gap:.1f} us between steps (median); per kernel: launches, "
                          f"summed duration, summed increment of the end")
                    for k, n, dur, inc in rows[:12]:
                        print(f"     {n:4d}x {dur:9.1f} us {inc:9.1f} us  {k}")
                    report["runs"].append(dict(model=name, batch=batch, variant=variant + " timeline", span_us=span, gap_us=gap,
                                               kernels=[dict(name=k, launches=n, dur_us=d, inc_us=i) for k, n, d, i in rows]))
            eng.runner.graphs, eng.runner.pool = {}, None
            graph_sets.clear()
            pools.clear()
            torch.cuda.synchronize()
            launch.set_pdl(None)
            torch.backends.cuda.preferred_blas_library(blas0)
            eng.runner.policy = SplitKVPolicy.parse(default_split)
            opt_runner.split_size_for = split_size_for
            eng.runner.skinny_max_m = default_mm
            eng.runner.fuse_swiglu = True
            ops.SKINNY_W4_TILES = W4_TILES
            eng.runner.skinny_max_elems = default_elems
            eng.runner.skinny_max_n, eng.runner.skinny_prefetch_o_max_elems = default_n
            eng.runner.lookahead = True
            eng.runner.staged, eng.runner.staged_min_elems = default_staged
            eng.runner.staged_evict_first = default_ef
            eng.runner.decode_copy_stream = eng.runner.fuse_embed_norm = eng.runner.decode_handoff = True
            eng.runner.fuse_norm_gemm = True
            eng.runner.blas_pdl = False
            eng.runner.decode_blas = default_decode_blas
            eng.runner.cluster_gemm, eng.runner.cluster_max_elems = {}, 1 << 62
            eng.runner.wg_gemm = {n: dict(d) for n, d in default_wg.items()}
            eng.runner.canonical_gemm_min_m, eng.runner.canonical_gemm_max_m = default_canon
            eng.runner.fuse_qk_attention, eng.runner.fuse_qk_max_rows = True, default_qk_rows
            eng.runner.staged_one_wave = dict(default_wave)
            ops.DECODE_CLUSTER = True
            if batch in args.profile_batches:
                rows, total = kernel_table(eng, prompts)
                print(f"   eager step at batch {batch}: kernels sum to {total / 1e3:.3f} ms GPU time "
                      f"({sum(n for _, _, n in rows)} launches)")
                for k, us, n in rows[:14]:
                    print(f"     {us:9.1f} us  {n:4d}x  {k}")
                report["runs"].append(dict(model=name, batch=batch, variant="eager profile", gpu_ms=total / 1e3,
                                           kernels=[dict(name=k, us=us, launches=n) for k, us, n in rows]))
        eng.runner.graphs.clear()
        del eng
        torch.cuda.empty_cache()
    if args.out is not None:
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / "profile_decode.json").write_text(json.dumps(report, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
