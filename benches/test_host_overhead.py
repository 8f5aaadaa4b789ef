"""Host side of a decode step: what the CPU spends per step before and after the GPU's work —
scheduling, the numpy step metadata, the launch guards, the packed upload buffer — measured
without a model (a null runner). It bounds how close to the memory roofline small models can get:
at qwen3-0.6b the GPU floor of a batch-1 step is about 0.3 ms.
"""

from __future__ import annotations

import time

import numpy as np
import pytest

from optimized.runner import _sampling_arrays, check_step_metadata
from reference import SamplingParams
from reference.config import EngineConfig, named_config
from reference.engine import EngineCore
from reference.runner import StepResult

GROUP = "host_overhead"

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
