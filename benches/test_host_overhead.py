"""Host side of a decode step: what the CPU spends per step before and after the GPU's work —
scheduling, the numpy step metadata, the launch guards, the packed upload buffer — measured
without a model (a null runner). It bounds how close to the memory roofline small models can get:
at qwen3-0.6b the GPU floor of a batch-1 step is about 0.3 ms.
"""

from __future__ import annotations

import time

import numpy as np
import pytest

from optimized import ops as _ops
from optimized.runner import _sampling_arrays, check_step_metadata
from reference import SamplingParams
from reference.config import EngineConfig, named_config
from reference.engine import EngineCore
from reference.runner import StepResult

GROUP = "host_overhead"
_REAL_LAUNCH = _ops._launch                   # ``ops._launch`` before any test replaces it

# ---------------------------------------------------------------- problem sizes (one table)
BATCHES = (1, 32, 256)
PROMPT = 1000
STEPS = 64
PACK_BLOCKS = 512                     # block-table columns of a decode graph (8192 tokens / 16)


class NullEngine(EngineCore):
    """The reference host side with a runner that only checks and packs the step (no model)."""

    def __init__(self, cfg, ecfg):
        super().__init__(cfg, ecfg)
        self.guard_s = self.pack_s = 0.0
        self.steps = 0

    def _execute(self, batch):
        t0 = time.perf_counter()
        check_step_metadata(batch, self.num_blocks, self.config.block_size)
        t1 = time.perf_counter()
        if batch.kind == "decode":
            n, M = len(batch.seqs), PACK_BLOCKS
            host = np.zeros(11 * n + n * M, dtype=np.int32)
            host[0:n], host[n:2 * n] = batch.input_ids, batch.positions
            host[2 * n:3 * n], host[3 * n:4 * n] = batch.slot_mapping, batch.seq_lens
            ints, flts = _sampling_arrays([s.params for s in batch.sample_seqs],
                                          [int(batch.positions[r]) + 1 for r in batch.sample_rows], n)
            host[4 * n:9 * n], host[9 * n:11 * n] = ints.reshape(-1), flts.reshape(-1).view(np.int32)
            tab = np.full((n, M), -1, dtype=np.int32)
            tab[:, :batch.block_tables.shape[1]] = batch.block_tables
            host[11 * n:] = tab.reshape(-1)
            self.guard_s += t1 - t0
            self.pack_s += time.perf_counter() - t1
            self.steps += 1
        k = len(batch.sample_seqs)
        return StepResult([5] * k, [0.0] * k, None)


@pytest.fixture(scope="module", autouse=True)
def _describe(results):
    results.describe(GROUP, "Host side of a decode step (no model)", columns=[
        ("batch", "batch", ""), ("step_ms", "host ms / step", ".3f"), ("guard_ms", "guards ms", ".3f"),
        ("pack_ms", "packing ms", ".3f"), ("steps", "decode steps", "")],
        plots=[dict(x="batch", y="step_ms", series=None, logx=True, xlabel="batch", ylabel="ms per step",
                    title="host time per decode step")])


@pytest.mark.parametrize("batch", BATCHES)
def test_host_overhead(batch, results):
    cfg = named_config("qwen3-0.6b")
    eng = NullEngine(cfg, EngineConfig(block_size=16, max_model_len=8192, num_blocks=batch * 520 + 10,
                                       max_num_seqs=batch, split_kv="fixed:256"))
    sp = SamplingParams(max_tokens=STEPS, stop_token_ids=())
    for _ in range(batch):
        eng.rollout_add(list(range(1, PROMPT + 1)), sp)
    eng.rollout_run_turns()                                  # first turn: warm-up
    for sid in list(eng._seqs):
        eng.rollout_continue(sid, [3] * 10)
    eng.guard_s = eng.pack_s = 0.0
    eng.steps = 0
    t = time.perf_counter()
    eng.rollout_run_turns()
    wall = time.perf_counter() - t
    assert eng.steps == STEPS - 1 and eng.num_free_blocks < eng.num_blocks
    results.add(GROUP, batch=batch, step_ms=wall / eng.steps * 1e3, guard_ms=eng.guard_s / eng.steps * 1e3,
                pack_ms=eng.pack_s / eng.steps * 1e3, steps=eng.steps)


# ================================================================ the eager prefill step's Python side
PREFILL_GROUP = "host_prefill"
PREFILL_TOKENS = (16, 64)             # rows of a short observation's prefill: every GEMM is ours (ops.gemm; skinny_wg)
PREFILL_LAYERS = 4                    # qwen3-0.6b's layers cut to 4 (the host cost is per layer; the memory is not)
PREFILL_CTX = 1800                    # keys the chunk's last token sees


@pytest.fixture
def stubbed_ops(monkeypatch):
    """``optimized.ops`` on CPU tensors as on an H200 without its driver: every check and choice of the wrappers runs,
    the launch is logged, not made; the driver-side helpers (kernel handles, tensor maps, cluster capacity, the
    build target) answer as on a compute-capability-9.0 GPU. Returns the launch log (kernel names)."""
    import contextlib
    import sys
    import types

    import optimized.kernels as kernels
    from optimized import ops

    log: list[str] = []
    fake = types.ModuleType("cupy")
    fake.cuda = types.SimpleNamespace(Device=lambda dev: contextlib.nullcontext())
    monkeypatch.setitem(sys.modules, "cupy", fake)
    monkeypatch.setattr(ops, "_launch", lambda ref, module, name, *a, **k: log.append(name))
    monkeypatch.setattr(ops, "_DEVICE_TYPES", ("cuda", "cpu"))
    monkeypatch.setattr(ops, "_device_index", lambda t: 0)
    monkeypatch.setattr(ops, "_num_sms", lambda dev: 132)
    monkeypatch.setattr(ops, "_cc_major", lambda dev: 9)
    monkeypatch.setattr(ops, "_clusters_ok", lambda ref: True)
    monkeypatch.setattr(ops, "_function", lambda *a, **k: (None, 0))
    monkeypatch.setattr(ops, "_tensor_map", lambda *a, **k: ops.launch.TensorMap(bytes(128)))
    monkeypatch.setattr(ops, "prefill_variants", lambda D, dev: list(ops.PREFILL_VARIANTS.get(D, {})))
    monkeypatch.setattr(ops.launch, "max_active_clusters", lambda *a, **k: 16)
    monkeypatch.setattr(kernels, "target", lambda name, dev: ops.SKINNY_WG_TARGET if name == "skinny_wg" else None)
    return log


def _null_driver(monkeypatch, log: list[str]) -> list[int]:
    """On top of ``stubbed_ops``: ``ops._launch`` itself runs (the kernel handle, the PDL choice, the stream) and
    ``launch.launch_pdl`` packs the arguments and calls ``cuLaunchKernelEx`` of a stand-in driver, a C-callable
    that counts the launches and returns 0 (a ctypes callback: a little dearer than a C function). The torch
    stream is a stand-in too. Returns the driver's launch count."""
    import ctypes
    import types

    import torch

    calls = [0]

    def launch_kernel_ex(cfg, func, params, extra):
        calls[0] += 1
        return 0

    proto = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p)
    fake = types.SimpleNamespace(cuLaunchKernelEx=proto(launch_kernel_ex))
    monkeypatch.setitem(_ops.launch._state, "lib", fake)
    monkeypatch.setitem(_ops.launch._state, "enabled", True)
    stream = types.SimpleNamespace(cuda_stream=0)
    monkeypatch.setattr(torch.cuda, "current_stream", lambda dev=None: stream)
    def logged(ref, module, name, *a, **k):
        log.append(name)
        _REAL_LAUNCH(ref, module, name, *a, **k)         # (``stubbed_ops`` has replaced ``ops._launch`` by now)

    monkeypatch.setattr(_ops, "_launch", logged)
    return calls


def _no_pure_checks(monkeypatch) -> None:
    """On top of ``stubbed_ops``: the wrappers' checks that only check (they return nothing a launch needs) made
    no-ops, as a launch path that trusted its caller would skip them. What is left is the shape arithmetic, the
    kernel choice and the argument packing: the floor of such a lean path."""
    from optimized import ops

    for name in ("_contig", "_aligned16", "_same_device", "_int_vec", "_block_size"):
        monkeypatch.setattr(ops, name, lambda *a, **k: None)
    monkeypatch.setattr(ops, "_tensor", lambda name, t, dtype, dims=None: t)


@pytest.mark.parametrize("path", ("wrappers", "unchecked", "driver"))
@pytest.mark.parametrize("tokens", PREFILL_TOKENS)
def test_host_prefill(tokens, path, stubbed_ops, monkeypatch, results):
    """The host time of one eager prefill forward of the optimized runner (``CudaRunner._prefill``: the uploads,
    every layer's op wrappers and the runner's kernel choices) for ``tokens`` new tokens of one sequence at
    qwen3-0.6b's shapes, ``PREFILL_LAYERS`` layers, with the GEMM rules of an H200 (``ops.gemm`` at 9-16 rows, the
    warpgroup GEMM at 17-64); the GPU's work is not done. ``path``: ``wrappers`` stops at ``ops._launch``;
    ``driver`` also runs ``ops._launch`` and ``launch.launch_pdl`` (argument packing, the ``ctypes`` call) into a
    stand-in driver (``_null_driver``); ``unchecked`` is ``wrappers`` without the checks that only check
    (``_no_pure_checks``), what a lean launch path could save at most. Checked first: the output's shape and dtype,
    the embedding's launch, then the same kernels in every layer, with ``unchecked`` the same kernels as with the
    checks, and with ``driver`` that every launch reached the driver. This is the part of an eager step the GPU
    waits for when its kernels are short (docs/performance/agentic.md, "Host cost of eager ops")."""
    import dataclasses

    import torch

    from optimized import runner as orun
    from reference.types import SplitKVPolicy
    from reference.weights import expected_shapes

    results.describe(PREFILL_GROUP, "Host side of an eager prefill forward (qwen3-0.6b shapes, no GPU)",
                     columns=[("path", "path", ""), ("tokens", "tokens", ""), ("layers", "layers", ""),
                              ("launches", "launches", ""),
                              ("forward_ms", "host ms / forward", ".3f"), ("per_launch_us", "us / launch", ".1f"),
                              ("per_layer_ms", "ms / layer", ".3f")],
                     plots=[dict(x="tokens", y="per_launch_us", series="path", xlabel="tokens",
                                 ylabel="us per launch", title="host time per eager launch")])
    cfg = dataclasses.replace(named_config("qwen3-0.6b"), num_hidden_layers=PREFILL_LAYERS)
    weights = {n: torch.zeros(s, dtype=torch.bfloat16) for n, s in expected_shapes(cfg).items()}
    bs = 16
    ecfg = EngineConfig(block_size=bs, max_model_len=PREFILL_CTX + bs, num_blocks=-(-PREFILL_CTX // bs) + 1)
    r = orun.CudaRunner(cfg, ecfg, weights, torch.device("cpu"), ecfg.num_blocks, ecfg.max_model_len,
                        SplitKVPolicy.parse("auto"), use_graphs=False)
    r.wg_gemm = {n: dict(d) for n, d in orun.WG_GEMM.items()}          # as on an H200 (the CPU runner has none)
    r.canonical_gemm_min_m, r.canonical_gemm_max_m = orun.CANONICAL_GEMM_ROWS
    T = tokens
    pos = np.arange(PREFILL_CTX - T, PREFILL_CTX, dtype=np.int32)                          # [T]
    tables = np.arange(ecfg.num_blocks - 1, dtype=np.int32)[None, :]                       # [1, M]
    slots = (tables[0, pos // bs] * bs + pos % bs).astype(np.int32)                        # [T]
    args = (np.arange(T, dtype=np.int64) % 1000, pos, slots, tables, np.array([PREFILL_CTX], dtype=np.int32),
            np.zeros(T, dtype=np.int32))
    calls = _null_driver(monkeypatch, stubbed_ops) if path == "driver" else None
    checked = None
    if path == "unchecked":                   # the kernels and their order must not depend on the checks
        r._prefill(*args)
        checked = list(stubbed_ops)
        stubbed_ops.clear()
        _no_pure_checks(monkeypatch)
    out = r._prefill(*args)                                                                 # warm-up, checked
    assert tuple(out.shape) == (T, cfg.hidden_size) and out.dtype == torch.bfloat16
    log = list(stubbed_ops)
    assert checked is None or log == checked, (log, checked)
    assert calls is None or calls[0] == len(log), (calls, len(log))
    assert log[0] == "embed_rmsnorm" and (len(log) - 1) % PREFILL_LAYERS == 0, log
    per_layer = (len(log) - 1) // PREFILL_LAYERS
    layers = [log[1 + i * per_layer:1 + (i + 1) * per_layer] for i in range(PREFILL_LAYERS)]
    assert all(k == layers[0] for k in layers), ("every layer launches the same kernels", layers)
    reps, rounds = 20, 5
    stubbed_ops.clear()
    times = []
    for _ in range(rounds):
        t = time.perf_counter()
        for _ in range(reps):
            r._prefill(*args)
        times.append((time.perf_counter() - t) / reps)
    dt = float(np.median(times))                                # the median round (a shared CPU is noisy)
    assert len(stubbed_ops) == rounds * reps * len(log)
    assert calls is None or calls[0] == (1 + rounds * reps) * len(log)
    results.add(PREFILL_GROUP, path=path, tokens=T, layers=PREFILL_LAYERS, launches=len(log), forward_ms=dt * 1e3,
                per_launch_us=dt / len(log) * 1e6, per_layer_ms=dt / PREFILL_LAYERS * 1e3)
