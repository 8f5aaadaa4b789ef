"""One decode step of lookahead: launch step N+1 before step N's tokens reach the host.

A synchronous engine leaves the GPU idle while the host reads step N's tokens, applies them,
schedules step N+1, packs its metadata and launches it. Everything step N+1 needs except its input
ids is known before step N ends *if every sequence of step N goes on*: positions and lengths grow
by one, a sequence crossing a page boundary takes the next free page, the sampling parameters stay.
And its input ids are step N's sampled tokens, which are already on the GPU.

So, while step N runs, ``next_decode`` predicts step N+1 (``None`` when it cannot: a sequence that
ends at step N by length, a sequence waiting for admission, a shared page, too few free pages, ...)
and the runner launches it with its ids copied on the device from step N's tokens. Nothing of the
host state changes: the prediction only peeks at the pages the scheduler would hand out.

The scheduler stays the single source of truth. At the next step the engine schedules as always;
``same_step`` compares that real batch with the prediction, field by field, and the runner checks
that the real input ids are the tokens the prediction was fed. Equal: the launched step *is* the
real step (same graph, same inputs) and its results are used. Different (a sequence sampled a stop
token, the pool was rearranged, ...): the launched step is dropped and the real one runs. A dropped
step wrote K/V only into slots no sequence has written yet (each sequence's next position, or a
free page), so its writes are overwritten before anything reads them. A lookahead never outlives
the run loop that made it (``rollout_run_turns``, ``generate``); the runner drops it before any
other use of the pages (page operations, scoring, weight updates).
"""

from __future__ import annotations

import numpy as np

from reference.kv_cache import blocks_for
from reference.scheduler import StepBatch


def next_decode(engine, batch: StepBatch) -> StepBatch | None:
    """The decode step the scheduler will build after ``batch`` if every sequence of ``batch``
    samples a token and goes on; ``None`` if that step cannot be foretold. Changes nothing."""
    sch, blocks = engine.scheduler, engine.blocks
    seqs = batch.seqs
    if batch.kind != "decode" or sch.waiting or len(sch.running) != len(seqs):
        return None
    if any(a is not b for a, b in zip(sch.running, seqs)):          # the next batch keeps this order
        return None
    bs = blocks.block_size
    lens: list[int] = []                                             # each table's length at step N+1
    grows: list[int] = []                                            # rows that take a new page
    for r, seq in enumerate(seqs):
        n = seq.num_tokens                                           # the position step N+1 feeds
        if seq.followers or not seq.prefill_done:
            return None
        if n + 1 >= engine.max_model_len or n + 1 - seq.turn_start >= seq.params.max_tokens:
            return None                                              # step N ends it by length
        j = n // bs
        if j < len(seq.block_table):
            if blocks.refcount(seq.block_table[j]) != 1:             # a shared page: copy-on-write first
                return None
        elif blocks_for(n + 1, bs) != len(seq.block_table) + 1:
            return None
        else:
            grows.append(r)
        lens.append(max(len(seq.block_table), blocks_for(n + 1, bs)))
    if len(grows) > blocks.num_free:
        return None                                                  # the scheduler would evict
    pages = blocks.peek(len(grows))                                  # what grow() will hand out, in row order
    B = len(seqs)
    tables = np.full((B, max(lens)), -1, dtype=np.int32)             # [B, M]
    tables[:, :batch.block_tables.shape[1]] = batch.block_tables
    for r, page in zip(grows, pages):
        tables[r, len(seqs[r].block_table)] = page
    positions = (batch.positions + 1).astype(np.int32)               # [B]
    rows = np.arange(B)
    slots = tables[rows, positions // bs] * bs + positions % bs      # [B]
    return StepBatch(kind="decode", seqs=list(seqs), chunks=[1] * B,
                     input_ids=np.zeros(B, dtype=np.int64),          # fed on the device from step N's tokens
                     positions=positions, q_seq_idx=batch.q_seq_idx.copy(), slot_mapping=slots.astype(np.int32),
                     block_tables=tables, seq_lens=(batch.seq_lens + 1).astype(np.int32),
                     sample_rows=batch.sample_rows.copy(), sample_seqs=list(batch.sample_seqs))


def same_step(pred: StepBatch, params: list, real: StepBatch) -> bool:
    """Whether ``real`` is the step ``pred`` foretold, input ids aside: the same sequences in the same
    order with the same sampling parameters (``params``: those ``pred`` was launched with), positions,
    slots, block tables and lengths, and no page work."""
    if real.kind != "decode" or real.ops or len(real.seqs) != len(pred.seqs):
        return False
    if any(a is not b for a, b in zip(pred.seqs, real.seqs)):
        return False
    if len(real.sample_seqs) != len(params) or any(
            a is not b or a.params is not p for a, b, p in zip(pred.sample_seqs, real.sample_seqs, params)):
        return False
    return all(np.array_equal(getattr(pred, f), getattr(real, f))      # shapes and values
               for f in ("positions", "q_seq_idx", "slot_mapping", "block_tables", "seq_lens", "sample_rows"))
