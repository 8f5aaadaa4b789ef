"""The optimized twin of ``reference/runner.py``: one scheduled step on the GPU.

torch holds the memory and runs the GEMMs (``torch.matmul``, cuBLAS); every other device
computation is one of our CUDA kernels (``optimized/kernels/*.cu``) launched through CuPy on
torch's current stream (``optimized/ops.py``). Decode steps are captured in CUDA graphs, one
per batch-size bucket (two, used in turn: ``_launch_decode``); prefill runs eagerly. Per-step metadata
(ids, positions, slots, block tables, lengths, sampling parameters) is built with numpy by the scheduler
and uploaded with one host-to-device copy, on a copy stream of its own. A decode step that can be foretold
is launched one step ahead, its input ids read on the device where the step before sampled them
(``optimized/lookahead.py``; ``execute``).

Batch-invariant mode (``batch_invariant=True``, twin: the reference runner's) changes two things:
every GEMM runs through ``ops.gemm`` (``gemm.cu``: one fixed k-step order per output element,
whatever the number of rows; the gate/up GEMM with its SwiGLU epilogue where ``fuse_swiglu`` is on, the bits of
``silu_mul`` after it), and every prefill token is attended as its own split-KV row
(``split_kv_partials`` with ``row_seq``: block-table row ``q_seq_idx[t]``, length ``q_pos[t] + 1``),
the very computation a decode step makes for that position. Norms, RoPE, the KV store, the
activation and sampling are per row already. Fused RoPE (``rope_in_attention=True``) caches
pre-RoPE keys and passes the fp32 tables to the attention kernels, which rotate each K tile.
"""

from __future__ import annotations

import contextlib
import gc
import warnings

import numpy as np
import torch

from reference.attention import split_size_for
from reference.config import EngineConfig, ModelConfig
from reference.errors import BlockTableError
from reference.rope import rope_cos_sin
from reference.runner import StepResult
from reference.scheduler import PageOps, StepBatch
from reference.types import SamplingParams, SplitKVPolicy

from . import graph_edges, ops
from .lookahead import same_step

BUCKETS = (1, 2, 4, 8, 16, 32, 48, 64, 96, 128, 192, 256, 384, 512)   # decode batch sizes with a graph
LEN_BUCKETS = (256, 1024, 4096, 16384, 65536)                         # longest context a graph serves
PREFILL_GRAPH_TOKENS = (16, 32, 64, 128, 256)   # token buckets of a prefill step replayed from a graph
PREFILL_GRAPH_MAX_ROWS = 16                     # ... of at most this many sequences (row buckets: BUCKETS)


def check_step_metadata(batch: StepBatch, num_blocks: int, block_size: int) -> None:
    """The launch guards of DESIGN §3, vectorised over the step (numpy, before any upload).

    A table may hold pages past ``ceil(seq_len / block_size)``: admission reserves pages for the
    whole context while a long prefill runs in chunks. Every non ``-1`` entry must still be a page
    of the pool, and no page may appear twice in one table."""
    tables, lens = batch.block_tables, batch.seq_lens
    need = (lens.astype(np.int64) + block_size - 1) // block_size                    # [B]
    if (need > tables.shape[1]).any():
        raise BlockTableError("a block table is shorter than its sequence length needs")
    cols = np.arange(tables.shape[1])[None, :]                                        # [1, M]
    if (tables[cols < need[:, None]] < 0).any():
        raise BlockTableError("a block the sequence length needs has no page")
    if (tables >= num_blocks).any() or (tables < -1).any():
        raise BlockTableError("a block table holds a page id outside the pool")
    ordered = np.sort(tables, axis=1)                 # a page may be shared across sequences, never within one
    if ((ordered[:, 1:] == ordered[:, :-1]) & (ordered[:, 1:] >= 0)).any():
        raise BlockTableError("a page appears twice in one sequence's block table")
    writes = np.sort(batch.slot_mapping[batch.slot_mapping >= 0])                     # [W]
    if (writes[1:] == writes[:-1]).any():
        raise BlockTableError("two rows of the step write the same cache slot")
    if ((batch.positions < 0) | (batch.positions >= lens[batch.q_seq_idx])).any():
        raise BlockTableError("a query position is not in its sequence's cache")
    expect = tables[batch.q_seq_idx, batch.positions // block_size] * block_size + batch.positions % block_size
    if (expect != batch.slot_mapping).any():
        raise BlockTableError("a slot does not match the page its position claims")


def _valid(batch: StepBatch, num_blocks: int, block_size: int) -> bool:
    """Whether a foretold step passes the launch guards (it always should; if not, it is not launched)."""
    try:
        check_step_metadata(batch, num_blocks, block_size)
    except BlockTableError:
        return False
    return True


def _sampling_of(batch: StepBatch) -> tuple[list[SamplingParams], list[int]]:
    """The sampling parameters of a step's sampling rows and the positions of the tokens they sample."""
    return [s.params for s in batch.sample_seqs], [int(batch.positions[r]) + 1 for r in batch.sample_rows]


def _sampling_arrays(params: list[SamplingParams], positions: list[int], n: int) -> tuple[np.ndarray, np.ndarray]:
    """int32 [5, n] (top_k, seed_lo, seed_hi, pos, mode) and float32 [2, n] (temperature, top_p)."""
    ints = np.zeros((5, n), dtype=np.int64)
    flts = np.zeros((2, n), dtype=np.float32)
    flts[1] = 1.0
    for i, (sp, pos) in enumerate(zip(params, positions)):
        ints[0, i] = sp.top_k
        ints[1, i] = sp.seed & 0xFFFFFFFF
        ints[2, i] = (sp.seed >> 32) & 0xFFFFFFFF
        ints[3, i] = pos
        ints[4, i] = 1 if sp.logprobs_mode == "processed" else 0
        flts[0, i] = sp.temperature
        flts[1, i] = sp.top_p
    return ints.astype(np.uint32).view(np.int32), flts


def _lps_offset(n: int) -> int:
    """Where a decode graph's logprobs start in its sample buffer and read-back (int32 elements): after the
    ``n`` tokens, on a 16-byte boundary (``ops.sample``'s outputs are 16-byte aligned)."""
    return -(-n // 4) * 4


def _sample(logits: torch.Tensor, flts: torch.Tensor, ints: torch.Tensor, out: torch.Tensor | None = None
            ) -> tuple[torch.Tensor, torch.Tensor]:
    """``ops.sample`` with the per-row parameters packed as ``flts [2, n]`` and ``ints [5, n]``; ``out``
    (int32 ``[_lps_offset(n) + n]``): the tokens go to its first ``n``, the logprobs' bits after the offset."""
    kw = {}
    if out is not None:
        n = flts.shape[1]
        off = _lps_offset(n)
        kw = dict(tokens=out[:n], logprobs=out[off:off + n].view(torch.float32))
    return ops.sample(logits, flts[0], ints[0], flts[1], ints[1], ints[2], ints[3], ints[4], **kw)


#: the decode GEMMs by role (``CudaRunner.staged``)
GEMM_ROLES = ("qkv", "o_proj", "gate_up", "down", "lm_head")
#: the staged skinny GEMM's configuration for every role by default: (chunk columns, stages, producer lanes,
#: CTAs per multiprocessor, stages fetched before the PDL wait) -- see ``CudaRunner.staged``
STAGED_DEFAULT = (1024, 3, 16, 2, 2)
#: the staged kernels' weight copies enter L2 at evict-first priority by default (``CudaRunner.staged_evict_first``)
STAGED_EVICT_FIRST = True
#: ... and the qkv GEMM's: 512-column chunks, 4 stages, 3 CTAs a multiprocessor (69.6 KB each), two stages early.
#: qwen3-8b's qkv weight is 384 tiles of 16 rows, about 1.45 waves of the default's 264 CTAs, and one wave of
#: 396: in one process on the H200 the 8B batch-1 step went from 4.213 to 4.178 ms (batch 8: 4.631 -> 4.552),
#: qwen3-0.6b's from 0.816 to 0.799 (0.977 -> 0.962); the chunks alone at 2 a multiprocessor were slower (4.251),
#: and the same for the gate/up GEMM slower at qwen3-8b (4.239) -- docs/performance/decode_step.md, "The decode step's fixed
#: costs and the qkv GEMM's waves"
STAGED_QKV = (512, 4, 16, 3, 2)
#: the wide staged kernel for decode GEMMs of 9-16 rows (``CudaRunner.staged_wide``): 512-column chunks, 3 stages,
#: 3 CTAs a multiprocessor, two stages early, one 16-row tile a stage -- for weights of at most
#: ``STAGED_WIDE_MAX_ELEMS`` elements. In one process on the H200, against cuBLAS: qwen3-0.6b batch 16 1.252 -> 1.146
#: ms a step, batch 12 1.237 -> 1.106; qwen3-8b (qkv and o_proj staged) 4.910 -> 4.893 and 4.877 -> 4.812, and
#: slower with its gate/up and down staged too (4.966 at batch 16; alone, gate/up 50.4 against 53.5 us, down 29.1
#: against 31.2). At 17-32 rows every configuration lost to cuBLAS at both sizes (the x rows each 16-row tile reads
#: from L2 are twice its weight bytes there) -- docs/performance/gemm.md, "The staged GEMM above 8 rows"
STAGED_WIDE16 = (512, 3, 16, 3, 2, 1)
STAGED_WIDE_MAX_ELEMS = 32 << 20
#: the kernels ``CudaRunner.blas_pdl`` (a measurement switch) puts behind programmatic edges (``re.search`` on the
#: kernel's name): cuBLAS's GEMM kernels of the Hopper build ("nvjet_sm90_..."), not its split-K reduction
BLAS_PDL_KERNELS = r"^nvjet_"
#: torch's BLAS backend for the GEMMs on cuBLAS of decode steps of ``DECODE_BLAS_ROWS`` rows (``CudaRunner.decode_blas``):
#: its cuBLASLt path, where cuBLASLt 13.1 runs qwen3-8b's o_proj and down at 32 rows without splitting K (no
#: reduction kernel). In one process on the H200 the qwen3-8b step went 4.959 -> 4.854 ms at batch 32 and 5.516 ->
#: 5.384 at batch 64 (4.990 -> 4.886 and 5.544 -> 5.441 in a second run); at batch 16 it was slower (4.801 -> 4.875),
#: at 128 and 256 within the rounds' spread, and qwen3-0.6b runs the same kernels either way -- docs/performance/gemm.md,
#: "Decode GEMMs on cuBLAS: launches and backends"
DECODE_BLAS = "cublaslt"
DECODE_BLAS_ROWS = (17, 64)
#: the decode GEMMs of 17-64 rows on the warpgroup kernel by default (``CudaRunner.wg_gemm``): every role at both x
#: tiles, one 64-row tile a unit and ``ops.skinny_wg_split``'s split of K -- docs/performance/gemm.md, "The warpgroup GEMM"
WG_GEMM: dict[int, dict[str, tuple[int, int] | None]] = {32: {r: None for r in GEMM_ROLES},
                                                        64: {r: None for r in GEMM_ROLES}}
#: (first, last) rows of the GEMMs that run on ``ops.gemm`` -- the batch-invariant mode's kernels: the wide one, its
#: SwiGLU epilogue, its weights before the PDL wait -- in default mode too, where its wide kernel can launch
#: (``ops.gemm_wide_available``: the driver's launch path, sm_90+) and the weights are not TP shards (unmeasured).
#: In one process on the H200 (``benches/gpu/profile_decode.py``, the 16-row graph): qwen3-8b 4.800 -> 4.551 ms a
#: step at batch 12 and 4.867 -> 4.664 at 16, qwen3-0.6b 1.095 -> 1.099 and 1.140 -> 1.118; the 32- and 48-row
#: graphs were 5-16% slower that way, the 1- and 8-row ones up to 11% -- docs/performance/gemm.md, "The wide kernel in
#: default mode"
CANONICAL_GEMM_ROWS = (9, 16)
#: fewest rows of a decode step that prefetches each layer's K/V into L2 where that is on
#: (``CudaRunner.kv_prefetch_min_rows``; off by default): the probe (``benches/gpu/probe_kv_l2.py``, H100) measured
#: qwen3-0.6b's attention alone at 32 and 64 rows 1.5-3.4 µs faster with its K/V asked for right before a layer's
#: GEMMs; in the engine the step was slower at 1, 8, 32 and 64 rows
KV_PREFETCH_MIN_ROWS = 17


@contextlib.contextmanager
def _torch_blas(backend: str):
    """torch's process-wide BLAS backend set to ``backend`` for the body, then put back (a refused switch raises
    torch's RuntimeError and changes nothing)."""
    before = torch.backends.cuda.preferred_blas_library()
    torch.backends.cuda.preferred_blas_library(backend)
    try:
        yield
    finally:
        torch.backends.cuda.preferred_blas_library(before)


class CudaRunner:
    """Weights, KV pages and CUDA graphs of one engine on one GPU."""

    def __init__(self, cfg: ModelConfig, ecfg: EngineConfig, weights: dict[str, torch.Tensor], device: torch.device,
                 num_blocks: int, max_model_len: int, policy: SplitKVPolicy, use_graphs: bool = True) -> None:
        self.cfg, self.ecfg, self.dev = cfg, ecfg, device
        self.policy = policy
        self.num_blocks, self.block_size = num_blocks, ecfg.block_size
        self.max_model_len = max_model_len
        self.max_blocks = -(-max_model_len // ecfg.block_size)
        bf = torch.bfloat16

        def w(name: str) -> torch.Tensor:
            return weights[name].to(device=device, dtype=bf).contiguous()

        self.embed = w("model.embed_tokens.weight")                                   # [V, H]
        self.lm_head = self.embed if cfg.tie_word_embeddings else w("lm_head.weight")  # [V, H]
        self.final_norm = w("model.norm.weight")
        self.layers = []
        for i in range(cfg.num_hidden_layers):
            p = f"model.layers.{i}."
            self.layers.append({
                "in_norm": w(p + "input_layernorm.weight"),
                "post_norm": w(p + "post_attention_layernorm.weight"),
                "wqkv": torch.cat([w(p + "self_attn.q_proj.weight"), w(p + "self_attn.k_proj.weight"),
                                   w(p + "self_attn.v_proj.weight")], 0).contiguous(),   # one GEMM for q, k, v
                "wo": w(p + "self_attn.o_proj.weight"),
                "q_norm": w(p + "self_attn.q_norm.weight"), "k_norm": w(p + "self_attn.k_norm.weight"),
                "wgu": torch.cat([w(p + "mlp.gate_proj.weight"), w(p + "mlp.up_proj.weight")], 0).contiguous(),
                "wd": w(p + "mlp.down_proj.weight"),
            })
        cos, sin = rope_cos_sin(torch.arange(max_model_len), cfg.head_dim, cfg.rope_theta)  # [L, D] fp32
        half = cfg.head_dim // 2
        self.cos = cos[:, :half].contiguous().to(device)                               # [L, D/2] fp32
        self.sin = sin[:, :half].contiguous().to(device)
        shape = (num_blocks, ecfg.block_size, cfg.num_key_value_heads, cfg.head_dim)
        self.k_cache = [torch.full(shape, float("nan"), dtype=bf, device=device) for _ in range(cfg.num_hidden_layers)]
        self.v_cache = [torch.full(shape, float("nan"), dtype=bf, device=device) for _ in range(cfg.num_hidden_layers)]
        self.scale = cfg.head_dim ** -0.5
        self.use_graphs = use_graphs
        self.graphs: dict[tuple[int, int], dict] = {}
        self.pool = None
        self.invariant = ecfg.batch_invariant
        self._prefill_mean_keys: float | None = None   # set by _prefill for its forward (kernel choice only)
        self.rope = (self.cos, self.sin) if ecfg.rope_in_attention else None   # fused RoPE tables
        self.host: dict[int, tuple[list[torch.Tensor], list[torch.Tensor]]] = {}   # swapped-out KV (pinned)
        self.record_logits = False
        self._mm_fp32 = self._probe_mm_out_dtype()
        #: GEMMs of at most this many rows run through ``ops.skinny_gemm`` (default mode; 0: always cuBLAS, the
        #: staged kernels' ``staged`` and ``staged_wide`` too).
        #: 8, not the kernel's 16: on the H200 its two-tile variant was slower than cuBLAS at M = 16
        #: (docs/performance/gemm.md, "Skinny GEMM")
        self.skinny_max_m = 8
        #: ... and whose weights have at most this many elements (larger ones: cuBLAS at any M, unless
        #: ``skinny_max_n`` takes them). With PDL on, the skinny kernel won every qwen3-0.6b layer GEMM,
        #: while the 0.6b LM head (156M elements) was faster on cuBLAS, and so were qwen3-8b's qkv, gate/up
        #: and LM head (docs/performance/gemm.md, "Which GEMM a decode step uses")
        self.skinny_max_elems = 8 << 20
        #: ... or whose weights have at most this many rows (output features), whatever their size (0: none).
        #: 4096: qwen3-8b's o_proj and down, where cuBLAS splits K (a second, reducing kernel) and the
        #: skinny kernel's 256 CTAs stream without one: the 8B batch-1 step 4.876 -> 4.669 ms with the
        #: prefetch rule below, batch 8 5.205 -> 5.044 ms (docs/performance/gemm.md, "Which GEMM a decode step uses")
        self.skinny_max_n = 4096
        #: a skinny o_proj asks L2 for its first round of weights before its PDL wait -- while the attention
        #: runs -- only if its weight has at most this many elements: at qwen3-8b that round is 16 MiB, and
        #: asking for it held the attention up by 3 us a layer (4.761 ms a step with it, 4.669 without); at
        #: qwen3-0.6b it is the whole 4 MiB weight, and the step is faster with it (1.033 against 1.040 ms)
        self.skinny_prefetch_o_max_elems = 8 << 20
        #: a skinny gate/up GEMM forms the SwiGLU activation in its epilogue (the bits of the unfused
        #: skinny_gemm + silu_mul; ``False``: unfused, for A/B measurements)
        self.fuse_swiglu = True
        #: decode GEMMs (default mode, at most ``min(8, skinny_max_m)`` rows) that take the staged skinny kernel
        #: (``ops.skinny_staged``), by role -- "qkv", "o_proj", "gate_up", "down", "lm_head" -> (chunk columns,
        #: stages, producer lanes, CTAs per multiprocessor, stages fetched before the PDL wait); a role not
        #: named takes the rules above. Every role but qkv (``STAGED_QKV``): 1024-column chunks, 3 stages, 2 CTAs
        #: a multiprocessor, two stages before the wait. In one process on the H200 the qwen3-8b batch-1 step went from 4.602 to
        #: 4.456 ms with all three stages early (batch 8: 5.012 -> 4.891), and from 4.460 to 4.404 ms with two
        #: (batch 8: 4.899 -> 4.845); qwen3-0.6b from 1.071 to 0.900 ms (batch 8: 1.195 -> 1.075) --
        #: docs/performance/gemm.md, "The staged skinny GEMM"
        self.staged: dict[str, tuple[int, int, int, int, int]] = {role: STAGED_DEFAULT for role in GEMM_ROLES}
        self.staged["qkv"] = STAGED_QKV
        #: roles that take another configuration when their 16-row tiles fit in one wave of it (at most its
        #: CTAs a multiprocessor x ``num_sms``): gate/up takes qkv's where its weight has at most 396 tiles on
        #: an H200 -- qwen3-0.6b's 384 (batch 8 0.964 -> 0.952 ms a step, batch 1 0.801 either way), not
        #: qwen3-8b's 1536 (there 3 a multiprocessor was slower, 4.213 against 4.239 ms)
        self.staged_one_wave: dict[str, tuple[int, int, int, int, int]] = {"gate_up": STAGED_QKV}
        self.num_sms = torch.cuda.get_device_properties(device).multi_processor_count if device.type == "cuda" \
            else 132
        #: decode GEMMs of 9-16 and 17-32 rows (default mode) on the wide staged kernels, by row width (16, 32)
        #: and role -> (chunk columns, stages, producer lanes, CTAs per multiprocessor, stages fetched before the
        #: PDL wait, 16-row tiles a stage): one of ``ops.SKINNY_STAGED_WIDE[width]``; a role not named takes cuBLAS.
        #: Default: every role at 9-16 rows on ``STAGED_WIDE16``, none at 17-32
        self.staged_wide: dict[int, dict[str, tuple[int, int, int, int, int, int]]] = {
            16: {role: STAGED_WIDE16 for role in GEMM_ROLES}}
        #: ... for weights of at most this many elements (larger ones take cuBLAS): qwen3-8b's qkv and o_proj and
        #: every qwen3-0.6b layer GEMM, not qwen3-8b's gate/up and down or either LM head
        self.staged_wide_max_elems = STAGED_WIDE_MAX_ELEMS
        #: decode GEMMs of 17-64 rows (default mode) on the cluster kernel (``ops.skinny_cluster``), by role ->
        #: (chunk columns, stages, 16-row tiles a unit, CTAs a cluster, stages fetched before the PDL wait[, consumer
        #: warps]), the first four one of ``ops.SKINNY_CLUSTER_CONFIGS``; a role not named takes cuBLAS. Default:
        #: none (measured in docs/performance/gemm.md, "The cluster GEMM, diagnosed")
        self.cluster_gemm: dict[str, tuple[int, ...]] = {}
        #: ... for weights of at most this many elements
        self.cluster_max_elems = 1 << 62
        #: decode GEMMs of 17-64 rows (default mode) on the warpgroup kernel (``ops.skinny_wg``), ahead of
        #: ``cluster_gemm``: by the kernel's x tile (32: up to 32 rows, 64: 33-64) and role -> (64-row tiles a unit,
        #: CTAs splitting K), or None for one tile and ``ops.skinny_wg_split``'s split; a role not named, or one
        #: whose K the configuration does not take, takes the rules below. Default: ``WG_GEMM`` where the kernel can
        #: run (``ops.skinny_wg_available``: a compute-capability-9.0 GPU, PDL on), else none
        self.wg_gemm: dict[int, dict[str, tuple[int, int] | None]] = (
            {n: dict(d) for n, d in WG_GEMM.items()} if self.dev.type == "cuda" and ops.skinny_wg_available(
                torch.empty(0, device=self.dev)) else {})
        #: the warpgroup kernel's split-K fold spread over the CTAs of a cluster, each adding and storing its share
        #: of a unit's rows (``ops.skinny_wg``'s ``spread``, the same bits); default ``True``: on an H100, qwen3-0.6b
        #: batch 32 / 64 1.088 / 1.669 -> 1.076 / 1.632 ms a step (docs/performance/decode_step.md); ``False``: the
        #: fold gathered in CTA 0
        self.wg_spread_fold = True
        #: the stages of a layer GEMM's warpgroup configuration, by role, where one of that many is built for its x
        #: tile, tiles and split (``ops.skinny_wg_config``'s ``stages``: 4 at 32 x rows, small enough for two CTAs a
        #: multiprocessor, so that a GEMM's CTAs can be resident beside the GEMM before it; the same bits), else its
        #: default's; a role not named (default: none) takes its configuration's default stages
        self.wg_stages: dict[str, int] = {}
        #: ... for weights of at least this many elements (smaller ones take the rules above)
        self.staged_min_elems = 0
        #: default-mode GEMMs of ``canonical_gemm_min_m`` to ``canonical_gemm_max_m`` rows run through ``ops.gemm``
        #: -- the batch-invariant mode's kernels -- ahead of every rule above: ``CANONICAL_GEMM_ROWS`` where the wide
        #: kernel can launch, else none (max 0); ``benches/gpu/profile_decode.py``'s ``canon*`` variants set others
        self.canonical_gemm_min_m, self.canonical_gemm_max_m = (
            CANONICAL_GEMM_ROWS if self.dev.type == "cuda" and ops.gemm_wide_available(torch.empty(0, device=self.dev))
            else (1, 0))
        #: the staged kernel's weight copies enter L2 at evict-first priority (``ops.skinny_staged(evict_first=)``)
        self.staged_evict_first = STAGED_EVICT_FIRST
        #: a decode step's qk_norm_rope (and its KV store) runs inside the attention launch
        #: (``ops.split_kv_decode(norm_rope=...)``, the same bits), which reads the cached keys while the qkv
        #: GEMM is still running; ``False``: the two launches, for A/B measurements
        self.fuse_qk_attention = True
        #: ... for decode steps of at most this many rows: measured faster in one process at batch 1 and 8 on
        #: the H200 (qwen3-8b 4.326 -> 4.238 ms with the cluster fold, batch 8 4.696 -> 4.629), and since the
        #: warpgroup GEMMs and their folded norms at batch 32 and 64 on an H100 (qwen3-0.6b 1.150 -> 1.096 and
        #: 1.693 -> 1.668 ms, qwen3-8b 6.006 -> 5.833 and 6.836 -> 6.689, against the two launches with the early
        #: attention); it had been slower there before those (docs/performance/decode_step.md, "The attention's
        #: first tiles before its wait")
        self.fuse_qk_max_rows = 64
        #: a decode step's attention launched after qk_norm_rope's own launch reads the cached K/V rows of its
        #: first two tiles (less each sequence's new key, which that launch stores) before its PDL wait, while
        #: qk_norm_rope runs (``ops.split_kv_decode(early=True)``, the same bits); ``False``: it waits first, for
        #: A/B measurements (docs/performance/decode_step.md, "The attention's first tiles before its wait")
        self.early_attention = True
        #: ... and that qk_norm_rope lets the attention be scheduled before its own wait (``ops.qk_norm_rope``'s
        #: ``trigger_first``), so the attention's early copies may start while the qkv GEMM still runs
        self.early_attention_trigger = False
        #: measurement only (off): a decode step of at least ``kv_prefetch_min_rows`` rows asks L2 for each layer's
        #: cached K/V pages while the GEMMs before that layer's attention run (``ops.kv_prefetch`` on a side stream,
        #: launched first in the step for layer 0 and after each layer's attention for the next; it writes nothing, so
        #: every bit stays), at most ``kv_prefetch_max_bytes`` of K and V a layer; 0 (the default) turns it off. On an
        #: H100 it made every step measured slower, in every way of issuing it: qwen3-0.6b batch 32 1.077 -> 1.187 ms,
        #: qwen3-8b 5.710 -> 5.875 (docs/performance/decode_step.md, "The next layer's K/V in L2, in the engine")
        self.kv_prefetch_max_bytes = 0
        self.kv_prefetch_min_rows = KV_PREFETCH_MIN_ROWS
        #: ... on this many CTAs a sequence (None: ``ops.kv_prefetch_ctas``, the fastest issue)
        self.kv_prefetch_ctas: int | None = None
        #: ... by one ``prefetch.global.L2`` a line instead of a bulk prefetch a page
        self.kv_prefetch_lines = False
        #: a decode graph samples into one buffer (tokens | logprob bits) that is also its own input ids: one
        #: read-back copy a step instead of two, and a foretold step of the same graph copies no ids (its
        #: embedding reads the tokens the step before sampled); ``False``: the ids in the uploaded metadata,
        #: copied on the device, for A/B measurements. Fixed per graph at its capture.
        self.decode_handoff = True
        #: a decode graph key has two device slots used in turn, so that a step's metadata upload and its
        #: tokens' read-back run on copy streams while the graphs before and after it run, instead of
        #: between two graphs on the compute stream (``_launch_decode``); ``False``: one slot, the copies
        #: inline, for A/B measurements. Fixed per graph key at its capture.
        self.decode_copy_stream = True
        #: a step's embedding and its first RMSNorm run as one launch (``ops.embed_rmsnorm``, the same bits);
        #: ``False``: the two launches, for A/B measurements
        self.fuse_embed_norm = True
        #: a decode step whose GEMMs are all on the warpgroup kernel (17-64 rows, ``wg_gemm``) folds each add_rmsnorm
        #: between two of them into them: o_proj and down add their products into the residual stream, sum its
        #: squares and write it times the norm's weight (``ops.skinny_wg(residual=...)``), gate/up and the next qkv
        #: take that as x and scale their rows by 1 / rms (``norm=...``): two launches fewer a layer
        #: (``_fold_splits``); ``False``: the add_rmsnorm launches, for A/B measurements
        self.fuse_norm_gemm = True
        #: measurement only, and unsafe: after a decode graph's capture the full dependencies into cuBLAS's
        #: kernels whose names match ``blas_pdl_kernels`` become programmatic edges (``optimized/graph_edges.py``),
        #: so each such GEMM launches while the kernel before it runs. That is correct only for kernels that wait
        #: on the grid dependency, and cuBLASLt 13.1's do not (``benches/gpu/probe_blas_pdl.py``): behind such an
        #: edge they read their input before it is written, and qwen3-8b's tokens changed. A capture with it on
        #: warns. (``profile_decode.py``'s ``blas-pdl`` variant; docs/performance/gemm.md, "Decode GEMMs on cuBLAS:
        #: launches and backends".) Fixed per graph at its capture.
        self.blas_pdl = False
        self.blas_pdl_kernels = BLAS_PDL_KERNELS
        self.blas_pdl_edges = 0                               # edges rewritten over every capture (a counter)
        #: torch's BLAS backend ("cublas", "cublaslt"; None: torch's process-wide choice) while the GEMMs of a
        #: decode step of ``decode_blas_rows`` (first, last) rows are captured (or, without graphs, launched): a
        #: process-wide torch switch, so it is set around those decode steps only and put back after
        self.decode_blas: str | None = DECODE_BLAS if self._blas_backend_settable(DECODE_BLAS) else None
        self.decode_blas_rows: tuple[int, int] = DECODE_BLAS_ROWS
        self._copy_streams: tuple[torch.cuda.Stream, torch.cuda.Stream] | None = None
        self._prefetch_stream: torch.cuda.Stream | None = None
        #: launch the foretold next decode step before this one's tokens are read (optimized/lookahead.py)
        self.lookahead = True
        self._ahead: dict | None = None
        self.lookahead_used = self.lookahead_dropped = 0      # lookahead steps used / dropped (counters)
        #: default-mode prefill steps of at most this many tokens (and ``PREFILL_GRAPH_MAX_ROWS`` sequences) replay
        #: a graph of their buckets instead of launching each kernel from the host (``_run_prefill_graph``). On for an
        #: engine on graphs (the largest bucket), off (0) without, where a padded bucket only adds work. On the H200
        #: the trickle bench ran 1.71x (one sequence a hand-over) and 1.23x (four) faster with it, and the agentic
        #: bench takes no graphed step (forty-sixth session). Every GPU conformance test passed with it on (forty-sixth
        #: and forty-seventh sessions) once the forty-fifth session had fixed the NaN of chunks that sample nothing
        #: (the ``uploaded`` event in ``_run_prefill_graph``; docs/performance/agentic.md, "Agentic workload", says
        #: which runs)
        self.prefill_graph_max_tokens = PREFILL_GRAPH_TOKENS[-1] if use_graphs else 0
        self.prefill_graphs: dict[tuple[int, int, int], dict] = {}
        self.prefill_graph_steps = 0                          # prefill steps run through a graph (a counter)

    # ---------------------------------------------------------------- weights and pages
    def load_weights(self, weights: dict[str, torch.Tensor]) -> None:
        """Copy new weights into the existing tensors, so captured graphs stay valid."""
        self.drop_lookahead()
        def put(dst: torch.Tensor, src: torch.Tensor) -> None:
            dst.copy_(src.to(device=self.dev, dtype=dst.dtype))

        put(self.embed, weights["model.embed_tokens.weight"])
        if not self.cfg.tie_word_embeddings:
            put(self.lm_head, weights["lm_head.weight"])
        put(self.final_norm, weights["model.norm.weight"])
        for i, L in enumerate(self.layers):
            p = f"model.layers.{i}."
            for key, name in (("in_norm", "input_layernorm"), ("post_norm", "post_attention_layernorm"),
                              ("wo", "self_attn.o_proj"), ("q_norm", "self_attn.q_norm"),
                              ("k_norm", "self_attn.k_norm"), ("wd", "mlp.down_proj")):
                put(L[key], weights[p + name + ".weight"])
            nq = self.cfg.num_attention_heads * self.cfg.head_dim
            nkv = self.cfg.num_key_value_heads * self.cfg.head_dim
            put(L["wqkv"][:nq], weights[p + "self_attn.q_proj.weight"])
            put(L["wqkv"][nq:nq + nkv], weights[p + "self_attn.k_proj.weight"])
            put(L["wqkv"][nq + nkv:], weights[p + "self_attn.v_proj.weight"])
            inter = self.cfg.intermediate_size
            put(L["wgu"][:inter], weights[p + "mlp.gate_proj.weight"])
            put(L["wgu"][inter:], weights[p + "mlp.up_proj.weight"])

    def apply_ops(self, ops: PageOps) -> None:
        """Swap out (to pinned host memory), swap in, drop host copies, copy-on-write: in that order."""
        self.drop_lookahead()                     # a step with page work is never a foretold one
        for sid, pages in ops.swap_out:
            idx = torch.tensor(pages, device=self.dev)
            self.host[sid] = ([k.index_select(0, idx).cpu() for k in self.k_cache],
                              [v.index_select(0, idx).cpu() for v in self.v_cache])
        for sid, pages in ops.swap_in:
            idx = torch.tensor(pages, device=self.dev)
            ks, vs = self.host.pop(sid)
            for layer in range(len(self.k_cache)):
                self.k_cache[layer].index_copy_(0, idx, ks[layer].to(self.dev))
                self.v_cache[layer].index_copy_(0, idx, vs[layer].to(self.dev))
        for sid in ops.swap_discard:
            self.host.pop(sid, None)
        if ops.page_copies:
            src = torch.tensor([a for a, _ in ops.page_copies], device=self.dev)
            dst = torch.tensor([b for _, b in ops.page_copies], device=self.dev)
            for cache in self.k_cache + self.v_cache:
                cache.index_copy_(0, dst, cache.index_select(0, src))

    # ---------------------------------------------------------------- pieces
    def _probe_mm_out_dtype(self) -> bool:
        try:
            a = torch.ones(2, 8, dtype=torch.bfloat16, device=self.dev)
            return torch.mm(a, a.t(), out_dtype=torch.float32).dtype == torch.float32
        except (RuntimeError, TypeError):
            return False

    def _embed(self, ids: torch.Tensor) -> torch.Tensor:
        """``[T]`` int32 -> ``[T, H]`` bf16 (tensor-parallel hook: ``optimized/parallel.py`` embeds its vocab shard)."""
        return ops.embedding(ids, self.embed)

    def _embed_norm(self, ids: torch.Tensor, w: torch.Tensor, eps: float) -> tuple[torch.Tensor, torch.Tensor]:
        """The residual stream's first rows ``[T, H]`` (the embedding) and their RMSNorm with ``w``: one launch
        (``ops.embed_rmsnorm``, the same bits) unless ``fuse_embed_norm`` is off (tensor-parallel hook)."""
        if self.fuse_embed_norm:
            return ops.embed_rmsnorm(ids, self.embed, w, eps)
        residual = self._embed(ids)
        return residual, ops.rmsnorm(residual, w, eps)

    def _attend(self, i: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, slots: torch.Tensor,
                tables: torch.Tensor, lens: torch.Tensor, qidx: torch.Tensor | None, pos: torch.Tensor,
                decode_split: int | None, max_splits: int) -> torch.Tensor:
        """Attend over layer ``i``'s pages, where ``qk_norm_rope`` has just written this step's K/V
        (context-parallel hook: ``optimized/parallel.py``).

        Batch-invariant prefill comes here with ``lens`` and ``qidx`` per token (see ``_prefill``)
        and takes the split-KV path like a decode step."""
        if qidx is not None and not self.invariant:
            return ops.paged_prefill(q, self.k_cache[i], self.v_cache[i], tables, lens, qidx, pos, self.scale,
                                     rope=self.rope, mean_keys=self._prefill_mean_keys)
        return ops.split_kv_decode(q, self.k_cache[i], self.v_cache[i], tables, lens, decode_split, self.scale,
                                   max_splits=max_splits, row_seq=qidx, rope=self.rope, early=self._early_attention(qidx))

    def _early_attention(self, qidx: torch.Tensor | None) -> bool:
        """Whether the attention after qk_norm_rope's own launch reads its first tiles before its wait
        (``early_attention``; a decode step only; context-parallel hook: CP attends through its own path)."""
        return qidx is None and self.early_attention

    def _fuse_qk(self, rows: int) -> bool:
        """Whether the qk_norm_rope of a decode step of ``rows`` rows goes into its attention launch (not with
        fused RoPE, whose cache holds pre-RoPE keys; context-parallel hook: CP attends through its own path)."""
        return self.fuse_qk_attention and self.rope is None and rows <= self.fuse_qk_max_rows

    def _kv_slots(self, pos: torch.Tensor, slots: torch.Tensor) -> torch.Tensor:
        """The slots this rank writes each token's K/V to (``-1``: none); context-parallel hook."""
        return slots

    def _canonical(self, rows: int) -> bool:
        """Whether a GEMM of ``rows`` rows runs through ``ops.gemm``: always in batch-invariant mode, else from
        ``canonical_gemm_min_m`` to ``canonical_gemm_max_m`` rows."""
        return self.invariant or self.canonical_gemm_min_m <= rows <= self.canonical_gemm_max_m

    def _mm(self, x: torch.Tensor, w: torch.Tensor, prefetch: bool = True, role: str = "") -> torch.Tensor:
        """``x @ w.T``: cuBLAS, ``skinny_gemm`` for the few rows of a small decode step (``prefetch``: its
        L2 prefetch of the first weights before it waits for the kernel before it), the staged skinny
        kernel where ``staged`` names the GEMM's ``role``, or our fixed-order GEMM in batch-invariant mode."""
        if self._canonical(x.shape[0]):
            return ops.gemm(x, w)
        wg = self._wg_cfg(x.shape[0], w, role)
        if wg is not None:
            return ops.skinny_wg(x, w, wt=wg[0], kp=wg[1], spread=self.wg_spread_fold,
                                 stages=self._wg_stages(role, x.shape[0], *wg))
        cl = self._cluster_cfg(x, w, role)
        if cl is not None:
            return ops.skinny_cluster(x, w, **self._cluster_kw(cl))
        st = self._staged_cfg(x, w, role)
        if st is not None:
            return ops.skinny_staged(x, w, **self._staged_kw(st, self.staged_evict_first))
        if self._skinny(x, w):
            return ops.skinny_gemm(x, w, prefetch=prefetch)
        return torch.matmul(x, w.t())

    @staticmethod
    def _staged_kw(st: tuple[int, ...], evict_first: bool = STAGED_EVICT_FIRST) -> dict[str, int | bool]:
        """``ops.skinny_staged``'s keywords for the configuration ``st`` (a static method: the GEMM bench builds
        the engine's configuration without an engine, ``benches/_ours.py``)."""
        return dict(kc=st[0], stages=st[1], lanes=st[2], ctas_per_sm=st[3], pre=st[4],
                    tp=st[5] if len(st) > 5 else 1, evict_first=evict_first)

    @staticmethod
    def _cluster_kw(cl: tuple[int, ...]) -> dict[str, int]:
        return dict(kc=cl[0], stages=cl[1], tp=cl[2], cluster=cl[3], pre=cl[4], warps=cl[5] if len(cl) > 5 else 4)

    def _wg_cfg(self, M: int, w: torch.Tensor, role: str, swiglu: bool = False) -> tuple[int, int] | None:
        """The warpgroup kernel's (tiles a unit, CTAs splitting K) (``wg_gemm``) for this GEMM of ``M`` (17-64) rows,
        or None (also where that configuration does not take this K: ``ops.skinny_wg``)."""
        N, K = w.shape
        if self.invariant or self.skinny_max_m <= 0 or not 16 < M <= ops.SKINNY_WG_MAX_M or K % 64:
            return None
        roles = self.wg_gemm.get(ops.skinny_wg_rows(M), {})
        if role not in roles:
            return None
        cfg = roles[role] or (1, ops.skinny_wg_split(N, K, swiglu))
        kc = ops.skinny_wg_config(M, *cfg)[0]
        kp = cfg[1]
        return cfg if K % (64 * kp) == 0 and (kp == 1 or (K // kp) % kc == 0) else None

    def _wg_stages(self, role: str, M: int, wt: int, kp: int, fold: bool = False) -> int | None:
        """``wg_stages[role]`` where a configuration of that many stages is built for ``M`` rows, ``wt`` and ``kp``
        (with ``fold``: also the folded add_rmsnorm's kernels, ``ops.skinny_wg_fold_ok``), else None (the
        default's)."""
        S = self.wg_stages.get(role)
        if S is None:
            return None
        try:
            ops.skinny_wg_config(M, wt, kp, S)
        except ValueError:
            return None
        return S if not fold or ops.skinny_wg_fold_ok(M, kp, S) else None

    def _cluster_cfg(self, x: torch.Tensor, w: torch.Tensor, role: str) -> tuple[int, ...] | None:
        """The cluster kernel's configuration (``cluster_gemm``) for this GEMM of 17-64 rows, or None."""
        if (self.invariant or self.skinny_max_m <= 0 or w.shape[1] % 64
                or not 16 < x.shape[0] <= ops.SKINNY_CLUSTER_MAX_M):
            return None
        if w.numel() > self.cluster_max_elems:
            return None
        return self.cluster_gemm.get(role)

    def _staged_cfg(self, x: torch.Tensor, w: torch.Tensor, role: str) -> tuple[int, ...] | None:
        """The staged kernel's configuration (``staged``; ``staged_wide`` for 9-32 rows) for this GEMM, or None."""
        if self.invariant or self.skinny_max_m <= 0 or w.shape[1] % 8 or w.numel() < self.staged_min_elems:
            return None
        rows = x.shape[0]
        if 8 < rows <= ops.SKINNY_STAGED_MAX_M:
            if w.numel() > self.staged_wide_max_elems:
                return None
            return self.staged_wide.get(ops.skinny_staged_rows(rows), {}).get(role)
        if role not in self.staged or rows > min(8, self.skinny_max_m):
            return None
        wave = self.staged_one_wave.get(role)
        if wave is not None and -(-w.shape[0] // 16) <= wave[3] * self.num_sms:   # its tiles fit one wave of it
            return wave
        return self.staged[role]

    def _skinny(self, x: torch.Tensor, w: torch.Tensor) -> bool:
        """Whether ``x @ w.T`` (default mode) goes to ``ops.skinny_gemm``: few rows, and a small weight or
        one of few rows (``skinny_max_elems``, ``skinny_max_n``)."""
        return x.shape[0] <= self.skinny_max_m and w.shape[1] % 8 == 0 and \
            (w.numel() <= self.skinny_max_elems or w.shape[0] <= self.skinny_max_n)

    def _reduce(self, x: torch.Tensor) -> torch.Tensor:
        """The row-parallel sum after ``o_proj`` / ``down_proj``: identity on one GPU (TP hook)."""
        return x

    def logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """``[S, H]`` bf16 -> float32 ``[S, V]`` (fp32 output of the GEMM where torch allows it)."""
        if self._canonical(hidden.shape[0]):
            return ops.gemm(hidden, self.lm_head, out_dtype=torch.float32)
        wg = self._wg_cfg(hidden.shape[0], self.lm_head, "lm_head")
        if wg is not None:
            return ops.skinny_wg(hidden, self.lm_head, out_dtype=torch.float32, wt=wg[0], kp=wg[1],
                                 spread=self.wg_spread_fold)
        cl = self._cluster_cfg(hidden, self.lm_head, "lm_head")
        if cl is not None:
            return ops.skinny_cluster(hidden, self.lm_head, out_dtype=torch.float32, **self._cluster_kw(cl))
        st = self._staged_cfg(hidden, self.lm_head, "lm_head")
        if st is not None:
            return ops.skinny_staged(hidden, self.lm_head, out_dtype=torch.float32,
                                     **self._staged_kw(st, self.staged_evict_first))
        if self._skinny(hidden, self.lm_head):
            return ops.skinny_gemm(hidden, self.lm_head, out_dtype=torch.float32)
        if self._mm_fp32:
            return torch.mm(hidden, self.lm_head.t(), out_dtype=torch.float32)
        return torch.mm(hidden, self.lm_head.t()).float()

    def forward(self, ids: torch.Tensor, pos: torch.Tensor, slots: torch.Tensor, tables: torch.Tensor,
                lens: torch.Tensor, qidx: torch.Tensor | None, decode_split: int | None, max_splits: int) -> torch.Tensor:
        """Final-normed hidden states ``[T, H]`` (bf16). ``qidx is None`` marks a decode step."""
        cfg = self.cfg
        T = ids.shape[0]
        nq, nkv, D = cfg.num_attention_heads, cfg.num_key_value_heads, cfg.head_dim
        eps = cfg.rms_norm_eps
        kv_slots = self._kv_slots(pos, slots)                                         # [T]
        residual, h = self._embed_norm(ids, self.layers[0]["in_norm"], eps)          # [T, H] each
        fold = self._fold_splits(T) if qidx is None else None   # role -> kp: the add_rmsnorms inside the GEMMs
        prefetch, join = self._kv_prefetch(qidx, tables, lens)   # (layer) -> its K/V pages asked into L2
        prefetch(0)
        ssq = xw = None                                # fold: the stream's sums of squares, the stream x the weight
        for i, L in enumerate(self.layers):
            if fold and i > 0:                         # qkv of the stream normed (by down's epilogue and its rows' rms)
                qkv = self._wg_normed(xw, L["wqkv"], ssq, fold["qkv"], "qkv")
            else:
                qkv = self._mm(h, L["wqkv"], role="qkv")                              # [T, (n_q + 2 n_kv) D]
            q = qkv[:, :nq * D].view(T, nq, D)                                        # [T, n_q, D], row stride
            k = qkv[:, nq * D:(nq + nkv) * D].view(T, nkv, D)                         # [T, n_kv, D]
            v = qkv[:, (nq + nkv) * D:].view(T, nkv, D)                               # [T, n_kv, D]
            if qidx is None and self._fuse_qk(T):                                     # decode: one launch
                o = ops.split_kv_decode(q, self.k_cache[i], self.v_cache[i], tables, lens, decode_split, self.scale,
                                        max_splits=max_splits, norm_rope=(k, v, L["q_norm"], L["k_norm"], self.cos,
                                                                          self.sin, pos, kv_slots, eps))
            else:
                ops.qk_norm_rope(q, k, L["q_norm"], L["k_norm"], self.cos, self.sin, pos, eps,
                                 rotate_k=self.rope is None,
                                 store=(v, self.k_cache[i], self.v_cache[i], kv_slots),   # + the KV write
                                 trigger_first=self._early_attention(qidx) and self.early_attention_trigger)
                o = self._attend(i, q, k, v, slots, tables, lens, qidx, pos, decode_split, max_splits)  # [T, n_q, D]
            prefetch(i + 1)                            # the next layer's K/V, beside this layer's GEMMs
            if fold:                                   # residual += attn, then gate/up of its norm
                ssq, xw = self._wg_residual(o.view(T, nq * D), L["wo"], residual, L["post_norm"], fold["o_proj"],
                                            "o_proj")
                a = self._wg_normed(xw, L["wgu"], ssq, fold["gate_up"], "gate_up", swiglu=True)      # [T, I]
            else:
                attn = self._reduce(self._mm(o.view(T, nq * D), L["wo"], role="o_proj",   # [T, H]
                                             prefetch=L["wo"].numel() <= self.skinny_prefetch_o_max_elems))
                h = ops.add_rmsnorm(attn, residual, L["post_norm"], eps)              # residual += attn
                a = self._mlp_act(h, L["wgu"])                                        # [T, I]
            if fold and i + 1 < len(self.layers):      # residual += mlp (the next layer's qkv of its norm)
                ssq, xw = self._wg_residual(a, L["wd"], residual, self.layers[i + 1]["in_norm"], fold["down"],
                                            "down")
                continue
            m = self._reduce(self._mm(a, L["wd"], role="down"))                       # [T, H]
            nxt = self.layers[i + 1]["in_norm"] if i + 1 < len(self.layers) else self.final_norm
            h = ops.add_rmsnorm(m, residual, nxt, eps)                                # residual += mlp
        join()
        return h

    def _kv_prefetch(self, qidx: torch.Tensor | None, tables: torch.Tensor, lens: torch.Tensor):
        """(``prefetch(layer)``, ``join()``). On a decode step of at least ``kv_prefetch_min_rows`` rows with
        ``kv_prefetch_max_bytes`` above 0, ``prefetch`` launches ``ops.kv_prefetch`` of that layer's caches (none past
        the last layer) on the side stream ``prefetch_stream``, after everything queued so far on the current stream,
        and ``join`` makes the current stream wait for the side stream; else both do nothing. The side stream keeps
        the step's chain from waiting for the prefetch, which lasts until its pages are in L2 (off the GPU, where
        there is none, the launches go inline)."""
        on = qidx is None and self.kv_prefetch_max_bytes > 0 and tables.shape[0] >= self.kv_prefetch_min_rows
        side = self.prefetch_stream if on else None
        main = torch.cuda.current_stream(self.dev) if side is not None else None

        def prefetch(layer: int) -> None:
            if not on or layer >= len(self.layers):
                return
            if side is not None:
                side.wait_stream(main)                 # after the attention before (and the step's upload)
            with torch.cuda.stream(side) if side is not None else contextlib.nullcontext():
                ops.kv_prefetch(self.k_cache[layer], self.v_cache[layer], tables, lens, self.kv_prefetch_max_bytes,
                                ctas=self.kv_prefetch_ctas, lines=self.kv_prefetch_lines)

        def join() -> None:
            if side is not None:
                main.wait_stream(side)
        return prefetch, join

    def _fold_splits(self, T: int) -> dict[str, int] | None:
        """The CTAs splitting K (by role) of the four layer GEMMs of a decode step of ``T`` rows that folds its
        add_rmsnorms into them (``fuse_norm_gemm``), or None where it does not: all four must be on the warpgroup
        kernel with one tile a unit (gate/up with its SwiGLU epilogue) and a split the folded kernels are built for
        (``ops.skinny_wg_fold_ok``), on one GPU (tensor parallelism sums o_proj's and down's partial products
        between the GEMM and the norm)."""
        if not self.fuse_norm_gemm or type(self)._reduce is not CudaRunner._reduce or self._canonical(T):
            return None
        L = self.layers[0]
        if not (self.fuse_swiglu and L["wgu"].shape[0] % 16 == 0):
            return None
        cfgs = {role: self._wg_cfg(T, L[key], role, swiglu=role == "gate_up")
                for role, key in (("qkv", "wqkv"), ("o_proj", "wo"), ("gate_up", "wgu"), ("down", "wd"))}
        if not all(c is not None and c[0] == 1 and ops.skinny_wg_fold_ok(T, c[1]) for c in cfgs.values()):
            return None
        return {role: c[1] for role, c in cfgs.items()}

    def _wg_residual(self, x: torch.Tensor, w: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor,
                     kp: int, role: str) -> tuple[torch.Tensor, torch.Tensor]:
        """``residual += x @ w.T`` in place by the warpgroup kernel's residual epilogue (``kp`` CTAs splitting K);
        returns the new rows' sums of squares by 64 columns (``ops.skinny_wg_ssq``) and the new rows times the next
        norm's ``weight``: what the normed prologue of the GEMM after it takes."""
        ssq = ops.skinny_wg_ssq(w.shape[0], x)
        return ssq, ops.skinny_wg(x, w, kp=kp, residual=(residual, ssq, weight), spread=self.wg_spread_fold,
                                  stages=self._wg_stages(role, x.shape[0], 1, kp, fold=True))

    def _wg_normed(self, xw: torch.Tensor, w: torch.Tensor, ssq: torch.Tensor, kp: int, role: str,
                   swiglu: bool = False) -> torch.Tensor:
        """The norm of the residual stream times ``w.T`` (with ``swiglu``: its SwiGLU) by the warpgroup kernel's
        normed prologue (``kp`` CTAs splitting K): ``xw`` the stream times the norm's weight and ``ssq`` its sums of
        squares, as the residual epilogue before it wrote them."""
        return ops.skinny_wg(xw, w, swiglu=swiglu, kp=kp, norm=(ssq, self.cfg.rms_norm_eps),
                             spread=self.wg_spread_fold, stages=self._wg_stages(role, xw.shape[0], 1, kp, fold=True))

    def _mlp_act(self, h: torch.Tensor, wgu: torch.Tensor) -> torch.Tensor:
        """``silu(h Wg^T) * (h Wu^T)`` ``[T, I]``: the gate/up GEMM and the activation -- one launch
        (``ops.skinny_swiglu``, the same bits) where the GEMM is a skinny one and ``fuse_swiglu`` is on; in
        batch-invariant mode ``ops.gemm(..., swiglu=True)`` (one launch on its wide kernel, the same bits)."""
        if self._canonical(h.shape[0]):
            if self.fuse_swiglu:
                return ops.gemm(h, wgu, swiglu=True)
            return ops.silu_mul(self._mm(h, wgu, role="gate_up"))
        wg = self._wg_cfg(h.shape[0], wgu, "gate_up", swiglu=True)
        if wg is not None and self.fuse_swiglu and wgu.shape[0] % 16 == 0:
            return ops.skinny_wg(h, wgu, swiglu=True, wt=wg[0], kp=wg[1], spread=self.wg_spread_fold,
                                 stages=self._wg_stages("gate_up", h.shape[0], *wg))
        cl = self._cluster_cfg(h, wgu, "gate_up")
        if cl is not None and self.fuse_swiglu and wgu.shape[0] % 16 == 0:
            return ops.skinny_cluster(h, wgu, swiglu=True, **self._cluster_kw(cl))
        st = self._staged_cfg(h, wgu, "gate_up")
        if st is not None and self.fuse_swiglu and wgu.shape[0] % 16 == 0:
            return ops.skinny_staged(h, wgu, swiglu=True, **self._staged_kw(st, self.staged_evict_first))
        if st is None and not self.invariant and self._skinny(h, wgu) and self.fuse_swiglu and wgu.shape[0] % 16 == 0:
            return ops.skinny_swiglu(h, wgu)
        return ops.silu_mul(self._mm(h, wgu, role="gate_up"))

    # ---------------------------------------------------------------- steps
    def _upload(self, arr: np.ndarray, dtype: torch.dtype) -> torch.Tensor:
        return torch.from_numpy(np.ascontiguousarray(arr)).to(self.dev).to(dtype)

    def decode_split(self, max_len: int, batch: int) -> tuple[int | None, int]:
        """(split size, splits per sequence) for a decode graph serving ``batch`` rows of up to ``max_len`` keys.

        ``auto`` is evaluated on the graph's shape (its batch bucket and length bucket), so the
        split size is a function of those two numbers only.
        """
        split = split_size_for(self.policy.kind, self.policy.split_size, [max_len] * batch, self.cfg.num_key_value_heads)
        size = split if split is not None else max_len
        return split, -(-max_len // size)

    def execute(self, batch: StepBatch, ahead: StepBatch | None = None) -> StepResult:
        """Run one step. ``ahead``: the decode step foretold to follow the decode step ``batch``
        (``optimized/lookahead.py``), launched before this step's tokens are read back; the next
        call uses it if its batch is that step, and drops it otherwise."""
        check_step_metadata(batch, self.num_blocks, self.block_size)
        pending, self._ahead = self._ahead, None
        if batch.kind != "decode":
            self.lookahead_dropped += pending is not None
            if self._prefill_graphed(batch):
                return self._run_prefill_graph(batch)
            # the sampling rows and parameters go up before the forward is queued: a blocking upload (``.to``
            # from unpinned memory) synchronises the stream, so after the forward it would hold the host there
            rows = self._upload(batch.sample_rows, torch.int64)                       # [S]
            ints, flts = _sampling_arrays(*_sampling_of(batch), len(batch.sample_seqs))
            ints_d, flts_d = self._upload(ints, torch.int32), self._upload(flts, torch.float32)
            hidden = self._prefill(batch.input_ids, batch.positions, batch.slot_mapping, batch.block_tables,
                                   batch.seq_lens, batch.q_seq_idx)
            logits = self.logits(hidden.index_select(0, rows))                        # [S, V]
            toks, lps = _sample(logits, flts_d, ints_d)
            return StepResult(toks.tolist(), lps.tolist(), None, logits.cpu() if self.record_logits else None)
        run = None
        if pending is not None:
            src = pending.pop("src")             # (no chain of launches kept alive through "src")
            if same_step(pending.pop("batch"), pending.pop("params"), batch) and \
                    np.array_equal(batch.input_ids, src["tokens"]):
                run = pending
                self.lookahead_used += 1
            else:
                self.lookahead_dropped += 1
        if run is None:
            run = self._launch_decode(batch)
        if ahead is not None and self.wants_lookahead() and _valid(ahead, self.num_blocks, self.block_size):
            nxt = self._launch_decode(ahead, ids_from=run)
            nxt["batch"], nxt["src"] = ahead, run
            self._ahead = nxt
        return self._collect(run)

    def wants_lookahead(self) -> bool:
        """Whether a decode step launches its foretold successor (not while logits are being recorded)."""
        return self.lookahead and not self.record_logits

    def drop_lookahead(self) -> None:
        """Forget a launched lookahead step (it finishes on the GPU; its results are never read)."""
        if self._ahead is not None:
            self.lookahead_dropped += 1
            self._ahead = None

    def _prefill(self, ids: np.ndarray, positions: np.ndarray, slots: np.ndarray, tables: np.ndarray,
                 seq_lens: np.ndarray, q_seq_idx: np.ndarray) -> torch.Tensor:
        """Hidden states ``[T, H]`` of an eager prefill step (numpy metadata, uploaded here).

        Batch-invariant mode attends each token as its own split-KV row: length ``position + 1``,
        block-table row ``q_seq_idx`` (padding rows: length 0, which writes zeros), split size the
        policy's (``disabled``: one split longer than any context), ``max_splits`` enough for the
        longest row -- splits past a row's end fold in as the identity, so the count is free."""
        up = self._upload
        lens, qidx, split, max_splits = seq_lens, q_seq_idx, None, 1
        live = positions >= 0                                                             # [T] real rows
        if self.invariant:
            lens = np.where(live, positions + 1, 0).astype(np.int32)                      # [T] row lengths
            qidx = np.where(live, q_seq_idx, 0).astype(np.int32)                          # [T] table rows
            split = self.decode_split(self.max_model_len, 1)[0] or self.max_model_len     # a decode graph's split
            max_splits = max(1, -(-int(lens.max(initial=1)) // split))
        # the mean count of keys a query row sees (position + 1), for the choice of prefill kernel only
        self._prefill_mean_keys = float((positions[live] + 1).mean()) if live.any() else 0.0
        try:
            return self.forward(up(ids, torch.int32), up(positions, torch.int32), up(slots, torch.int32),
                                up(tables, torch.int32), up(lens, torch.int32), up(qidx, torch.int32), split,
                                max_splits)
        finally:
            self._prefill_mean_keys = None

    def _len_bucket(self, longest: int) -> int:
        """The context bucket of a graph whose longest sequence has ``longest`` keys (``LEN_BUCKETS``, at most
        ``max_model_len``)."""
        return min(next((b for b in LEN_BUCKETS if b >= longest), longest), self.max_model_len)

    def _prefill_graphed(self, batch: StepBatch) -> bool:
        """Whether a prefill step goes through ``_run_prefill_graph``: default mode, at most
        ``prefill_graph_max_tokens`` tokens (and the largest bucket) of at most ``PREFILL_GRAPH_MAX_ROWS`` sequences."""
        T, B = batch.num_tokens, len(batch.seqs)
        return (not self.invariant and 0 < T <= min(self.prefill_graph_max_tokens, PREFILL_GRAPH_TOKENS[-1])
                and B <= PREFILL_GRAPH_MAX_ROWS)

    def prefill_graph_key(self, batch: StepBatch) -> tuple[int, int, int]:
        """The buckets whose graph a graphed prefill step replays (its key in ``prefill_graphs``): tokens, sequences
        and context length."""
        return (next(b for b in PREFILL_GRAPH_TOKENS if b >= batch.num_tokens),
                next(b for b in BUCKETS if b >= len(batch.seqs)), self._len_bucket(int(batch.seq_lens.max())))

    def _run_prefill_graph(self, batch: StepBatch) -> StepResult:
        """A short prefill step through the graph of its buckets (captured at first use; without graphs, the same
        closure run eagerly). Its ``T`` token rows are padded to the token bucket ``n`` (token 0, position -1, slot
        -1: a row the kernels write as zeros and that caches nothing, on the last sequence's table row), its ``B``
        table rows to the row bucket ``r`` (length 0, no pages) and its sampling rows to ``r`` (row 0, read back
        and dropped). The kernels are the eager step's for ``n`` rows, except that the paged prefill kernel is
        chosen without the mean count of keys a row sees, which a graph cannot know (every variant gives the same
        bits). One packed int32 upload (its pinned buffer written again only once that upload has been read), one
        replay, the tokens read back (none when the step samples nothing: it may then still run on return)."""
        T, B, S = batch.num_tokens, len(batch.seqs), len(batch.sample_seqs)
        key = n, r, max_len = self.prefill_graph_key(batch)
        g = self.prefill_graphs.get(key)
        if g is None:
            g = self.prefill_graphs[key] = self._capture_prefill(n, r, -(-max_len // self.block_size))
        ids, pos, slots, qidx, rows, ints, flts, lens, tables = g["host_views"]
        # the last upload from these pinned buffers must have been read before they are written again: a step that
        # samples nothing (a chunk of a long prefill, S = 0) reads nothing back, so nothing else waited for it
        # (forty-fifth session: without this wait, under a crowded GPU, the next chunk's metadata overwrote the
        # buffer before the DMA read it, and that chunk's K/V were never written -- docs/performance/agentic.md)
        if g["uploaded"] is not None:
            g["uploaded"].synchronize()
        ids[:] = 0
        ids[:T] = batch.input_ids
        pos[:] = -1
        pos[:T] = batch.positions
        slots[:] = -1
        slots[:T] = batch.slot_mapping
        qidx[:] = batch.q_seq_idx[-1]
        qidx[:T] = batch.q_seq_idx
        rows[:] = 0
        rows[:S] = batch.sample_rows
        i32, f32 = _sampling_arrays(*_sampling_of(batch), r)
        ints[:] = i32
        flts[:] = f32.view(np.int32)
        lens[:] = 0
        lens[:B] = batch.seq_lens
        tables[:] = -1
        w = min(tables.shape[1], batch.block_tables.shape[1])   # (columns past the longest length: never read)
        tables[:B, :w] = batch.block_tables[:, :w]
        g["dev"].copy_(g["host"], non_blocking=True)
        g["uploaded"] = self._event()
        if self.use_graphs:
            g["graph"].replay()
        else:
            g["run"]()
        self.prefill_graph_steps += 1
        out = g["out"]
        toks, lps = out["toks"][:S].tolist(), out["lps"][:S].tolist()
        return StepResult(toks, lps, None, out["logits"][:S].cpu() if self.record_logits else None)

    def _capture_prefill(self, n: int, r: int, M: int) -> dict:
        """The buffers, the closure and (with graphs) the CUDA graph of a prefill step of ``n`` token rows, ``r``
        sequences and ``M`` block-table columns (``_run_prefill_graph``). The packed int32 metadata: ids, positions,
        slots, table rows (``n`` each) | sampling rows, the sampling ints (5) and floats (2, as bits), lengths
        (``r`` each) | tables (``r`` x ``M``)."""
        sizes = (n, n, n, n, r, 5 * r, 2 * r, r, r * M)
        host = torch.zeros(sum(sizes), dtype=torch.int32)
        if self.dev.type == "cuda":                       # so the upload is an async DMA
            host = host.pin_memory()
        dev = torch.zeros_like(host, device=self.dev)

        def views(t: torch.Tensor) -> list[torch.Tensor]:
            parts = list(torch.split(t, sizes))
            parts[5], parts[6], parts[8] = parts[5].view(5, r), parts[6].view(2, r), parts[8].view(r, M)
            return parts

        g: dict = {"host": host, "dev": dev, "host_views": [v.numpy() for v in views(host)], "out": {}, "uploaded": None}
        ids, pos, slots, qidx, rows, ints, flts, lens, tables = views(dev)
        flts = flts.view(torch.float32)

        def run() -> None:
            hidden = self.forward(ids, pos, slots, tables, lens, qidx, None, 1)            # [n, H]
            logits = self.logits(hidden.index_select(0, rows))                            # [r, V]
            toks, lps = _sample(logits, flts, ints)
            g["out"].update(toks=toks, lps=lps, logits=logits)

        g["run"] = run
        if self.use_graphs:
            host.zero_()
            host[n:3 * n] = -1                            # warm-up: every row padding, nothing written to the pages
            dev.copy_(host)
            self._warm_up(run)
            with self._capturing():
                graph = torch.cuda.CUDAGraph()
                with torch.cuda.graph(graph, pool=self.pool):
                    run()
                g["graph"] = graph
        return g

    def _launch_decode(self, batch: StepBatch, ids_from: dict | None = None) -> dict:
        """Upload the step's metadata, replay its graph and queue the copy of its tokens to the host;
        returns without waiting. ``ids_from``: a launched step whose sampled tokens are this step's
        input ids (a lookahead step; they are copied on the device, ``batch.input_ids`` is unused).

        With ``decode_copy_stream`` a graph key has two device slots, used in turn: each its own graph,
        metadata buffer and sample buffer, slot ``j`` reading its ids from slot ``1 - j``'s samples. The
        upload and the read-back then run on two copy streams of their own, off the compute stream: the
        upload of step N+1 while step N's graph runs (into the other slot's buffer), the read-back of step N
        while step N+1's graph runs. (On one copy stream the upload of step N+1 would queue behind the
        read-back of step N, which waits for step N's graph.) Events order every buffer's writer after its
        last reader:

        * the upload into a slot waits for that slot's last replay (``replayed``), and the replay waits
          for the upload (``uploaded``);
        * a replay, which writes its slot's samples, waits for their last read-back (``read``), and an ids
          copy into the other slot's samples waits for theirs;
        * the read-back waits for the replay.
        """
        params, positions = _sampling_of(batch)
        B = len(batch.seqs)
        bucket = next((b for b in BUCKETS if b >= B), B)
        max_len = self._len_bucket(int(batch.seq_lens.max()))
        split, max_splits = self.decode_split(max_len, bucket)
        key = (bucket, max_len)
        g = self.graphs.get(key)
        if g is None:
            g = self._capture(bucket, max_len, split, max_splits)
            self.graphs[key] = g
        # two pinned buffers each way, alternating: a step's upload and read-back may still be queued
        # behind the step before it while the next one is packed
        i = g["turn"]
        g["turn"] ^= 1
        slots = g["slots"]
        slot = slots[i % len(slots)]
        feeder = slots[(i + 1) % len(slots)]                  # the slot whose samples are this slot's ids
        hb = g["host"][i]
        if hb["uploaded"] is not None:
            hb["uploaded"].synchronize()
        host_t = hb["host_t"]
        # one packed int32 upload: ids | pos | slots | lens | ints(5) | flts(2, as bits) | tables
        M = g["M"]
        host = host_t.numpy()
        host[:] = 0
        n = bucket
        if ids_from is None:
            host[0:B] = batch.input_ids
        host[n:n + B] = batch.positions
        host[2 * n:3 * n] = -1
        host[2 * n:2 * n + B] = batch.slot_mapping
        host[3 * n:3 * n + B] = batch.seq_lens
        ints, flts = _sampling_arrays(params, positions, n)
        host[4 * n:9 * n] = ints.reshape(-1)
        host[9 * n:11 * n] = flts.reshape(-1).view(np.int32)
        tab = np.full((n, M), -1, dtype=np.int32)
        tab[:B, :batch.block_tables.shape[1]] = batch.block_tables
        host[11 * n:] = tab.reshape(-1)
        cs = self.copy_streams if g["cs"] else None
        if cs is not None:
            main = torch.cuda.current_stream(self.dev)
            up, back = cs
            if slot["replayed"] is not None:
                up.wait_event(slot["replayed"])               # its last replay has read its metadata
            with torch.cuda.stream(up):
                slot["dev"].copy_(host_t, non_blocking=True)
                hb["uploaded"] = self._event()
            main.wait_event(hb["uploaded"])
            if slot["read"] is not None:
                main.wait_event(slot["read"])                 # its samples have been read back
        else:
            slot["dev"].copy_(host_t, non_blocking=True)
            hb["uploaded"] = self._event()
        copy_ids = None
        if ids_from is not None:
            if ids_from["toks"].data_ptr() != slot["ids"].data_ptr():   # (a hand-off in place: no copy)
                copy_ids = ids_from["toks"]
        elif g["handoff"]:                                    # the graph reads its ids from a sample buffer
            copy_ids = slot["dev"]
        if copy_ids is not None:
            if cs is not None and g["handoff"] and feeder["read"] is not None:
                main.wait_event(feeder["read"])               # the ids go into the feeder's samples
            slot["ids"][:B].copy_(copy_ids[:B])
        if self.use_graphs:
            slot["graph"].replay()
        else:
            with self._decode_blas_backend(n):
                slot["run"]()
        res = hb["res"]                                       # int32: tokens | (16-byte boundary) logprobs (bits)
        off = _lps_offset(n)
        if cs is not None:
            slot["replayed"] = self._event()
            back.wait_event(slot["replayed"])
            with torch.cuda.stream(back):
                if not self.use_graphs and slot["both"] is None:   # eager outputs: freed only after the copy
                    slot["toks"].record_stream(back)
                    slot["lps"].record_stream(back)
                self._read_back(slot, res, n, off)
                done = slot["read"] = self._event()
        else:
            self._read_back(slot, res, n, off)
            done = self._event()
        return {"B": B, "n": n, "split": split, "toks": slot["toks"], "res": res, "done": done,
                "logits": slot["logits"], "params": params}

    @staticmethod
    def _read_back(slot: dict, res: torch.Tensor, n: int, off: int) -> None:
        """Queue the copy of a slot's tokens and logprob bits into the pinned ``res``."""
        if slot["both"] is not None:
            res.copy_(slot["both"], non_blocking=True)
        else:
            res[:n].copy_(slot["toks"], non_blocking=True)
            res[off:off + n].copy_(slot["lps"].view(torch.int32), non_blocking=True)

    def _collect(self, run: dict) -> StepResult:
        """Wait for a launched decode step and read its tokens and logprobs."""
        if run["done"] is not None:
            run["done"].synchronize()
        B, n = run["B"], run["n"]
        res = run["res"].numpy()
        run["tokens"] = res[:B].copy()
        logits = run["logits"][:B].cpu() if self.record_logits else None
        off = _lps_offset(n)
        return StepResult(res[:B].tolist(), res[off:off + B].view(np.float32).tolist(), run["split"], logits)

    def _event(self) -> torch.cuda.Event | None:
        """An event recorded on the current stream (``None`` off the GPU, where copies are synchronous)."""
        if self.dev.type != "cuda":
            return None
        ev = torch.cuda.Event()
        ev.record()
        return ev

    @property
    def prefetch_stream(self) -> torch.cuda.Stream | None:
        """The side stream of the decode steps' K/V prefetches (``_kv_prefetch``; ``None`` off the GPU)."""
        if self.dev.type != "cuda":
            return None
        if self._prefetch_stream is None:
            self._prefetch_stream = torch.cuda.Stream(self.dev)
        return self._prefetch_stream

    @property
    def copy_streams(self) -> tuple[torch.cuda.Stream, torch.cuda.Stream] | None:
        """The streams of the decode graphs' uploads and of their read-backs (``None`` off the GPU)."""
        if self.dev.type != "cuda":
            return None
        if self._copy_streams is None:
            self._copy_streams = (torch.cuda.Stream(self.dev), torch.cuda.Stream(self.dev))
        return self._copy_streams

    def _blas_backend_settable(self, backend: str) -> bool:
        """Whether torch can switch its BLAS backend to ``backend`` here (a build without cuBLASLt refuses; off the
        GPU the switch is never made, so it counts as settable). Put back at once."""
        if self.dev.type != "cuda":
            return True
        try:
            with _torch_blas(backend):
                pass
        except RuntimeError:
            return False
        return True

    @contextlib.contextmanager
    def _decode_blas_backend(self, rows: int):
        """torch's BLAS backend set to ``decode_blas`` for the body of a decode step of ``rows`` rows when they lie
        in ``decode_blas_rows`` (else, off the GPU or with None: nothing), then put back."""
        if self.decode_blas not in (None, "cublas", "cublaslt"):
            raise ValueError(f"decode_blas must be None, 'cublas' or 'cublaslt', got {self.decode_blas!r}")
        lo, hi = self.decode_blas_rows
        if self.decode_blas is None or self.dev.type != "cuda" or not lo <= rows <= hi:
            yield
            return
        with _torch_blas(self.decode_blas):
            yield

    def _capture(self, n: int, max_len: int, split: int | None, max_splits: int) -> dict:
        """The decode graph(s) of ``n`` rows and up to ``max_len`` keys: one device slot, or two used in turn
        with ``decode_copy_stream`` (``_launch_decode``)."""
        M = -(-max_len // self.block_size)
        host = []
        for _ in range(2):
            host_t = torch.zeros(11 * n + n * M, dtype=torch.int32)
            res = torch.zeros(_lps_offset(n) + n, dtype=torch.int32)
            if self.dev.type == "cuda":   # so the upload and the read-back of a step are async DMAs
                host_t, res = host_t.pin_memory(), res.pin_memory()
            host.append({"host_t": host_t, "res": res, "uploaded": None})
        handoff, two = self.decode_handoff, self.decode_copy_stream
        cs = self.copy_streams if two else None
        slots = []
        for _ in range(2 if two else 1):
            dev = torch.zeros_like(host[0]["host_t"], device=self.dev)
            both = torch.zeros(_lps_offset(n) + n, dtype=torch.int32, device=self.dev) if handoff else None  # toks | lps
            if cs is not None:            # buffers the copy streams use: freed only after their work on them
                dev.record_stream(cs[0])
                if both is not None:
                    both.record_stream(cs[1])
            slots.append({"dev": dev, "both": both, "replayed": None, "read": None})
        for j, slot in enumerate(slots):
            # the step's ids: what the step before sampled into the feeding slot (or a copy)
            slot["ids"] = slots[(j + 1) % len(slots)]["both"][:n] if handoff else slot["dev"][:n]
        g: dict = {"host": host, "slots": slots, "turn": 0, "M": M, "handoff": handoff, "cs": two}
        split_size = split if split is not None else max_len

        def runner_of(slot: dict):
            dev = slot["dev"]
            pos, kv_slots, lens = (dev[i * n:(i + 1) * n] for i in range(1, 4))
            ints = dev[4 * n:9 * n].view(5, n)
            flts = dev[9 * n:11 * n].view(torch.float32).view(2, n)
            tables = dev[11 * n:].view(n, M)

            def run() -> None:
                hidden = self.forward(slot["ids"], pos, kv_slots, tables, lens, None, split_size, max_splits)
                logits = self.logits(hidden)
                toks, lps = _sample(logits, flts, ints, slot["both"])
                slot["toks"], slot["lps"], slot["logits"] = toks, lps, logits
            return run

        for slot in slots:
            slot["run"] = runner_of(slot)
        if self.use_graphs:
            host_t = host[0]["host_t"]
            host_t.zero_()
            host_t[2 * n:3 * n] = -1                      # warm-up writes nothing into the pages
            for slot in slots:
                slot["dev"].copy_(host_t)
            self._warm_up(slots[0]["run"], self._decode_blas_backend(n))
            with self._capturing():
                for slot in slots:
                    graph = torch.cuda.CUDAGraph(keep_graph=True) if self.blas_pdl else torch.cuda.CUDAGraph()
                    with torch.cuda.graph(graph, pool=self.pool), self._decode_blas_backend(n):
                        slot["run"]()   # graphs replay one at a time: one shared pool
                    if self.blas_pdl:
                        warnings.warn("blas_pdl: cuBLAS's GEMM kernels behind programmatic edges; they do not wait "
                                      "on the kernel before, so this graph's outputs may be wrong (measurement only)",
                                      RuntimeWarning, stacklevel=2)
                        slot["pdl_edges"] = graph_edges.make_programmatic(graph.raw_cuda_graph(),
                                                                          self.blas_pdl_kernels)
                        self.blas_pdl_edges += len(slot["pdl_edges"])
                        graph.instantiate()
                    slot["graph"] = graph
        return g

    def _warm_up(self, run, ctx: contextlib.AbstractContextManager | None = None) -> None:
        """``run()`` once on a side stream before its capture: every kernel module it launches is loaded."""
        s = torch.cuda.Stream(self.dev)
        s.wait_stream(torch.cuda.current_stream(self.dev))
        with torch.cuda.stream(s), ctx or contextlib.nullcontext():
            run()
        torch.cuda.current_stream(self.dev).wait_stream(s)

    @contextlib.contextmanager
    def _capturing(self):
        """Around graph captures into the shared pool ``self.pool`` (made here the first time): no garbage collection
        inside them. Collecting an old engine there frees pinned host buffers and CUDA objects, calls a capturing
        stream forbids (the capture is invalidated); so one collection first, then the collector paused."""
        if self.pool is None:
            self.pool = torch.cuda.graph_pool_handle()
        gc.collect()
        gc_was_on = gc.isenabled()
        gc.disable()
        try:
            yield
        finally:
            if gc_was_on:
                gc.enable()

    @torch.no_grad()
    def score(self, ids: list[int], pages: list[int]) -> torch.Tensor:
        """Teacher-forced float32 logits ``[T, V]`` (CPU) through the paged prefill path, in ``pages``."""
        self.drop_lookahead()                     # the borrowed pages may be ones a lookahead step wrote
        T = len(ids)
        bs = self.block_size
        pos = np.arange(T, dtype=np.int32)
        table = np.asarray(pages, dtype=np.int32)[None, :]
        slots = table[0, pos // bs] * bs + pos % bs
        hidden = self._prefill(np.asarray(ids), pos, slots, table, np.asarray([T]), np.zeros(T, dtype=np.int32))
        return self.logits(hidden).cpu()
