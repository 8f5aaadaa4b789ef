"""The scheduler: which sequences run in the next step, and the step's metadata.

A step is either a **prefill** step (chunks of uncached tokens of admitted sequences: fresh
prompts, or ``[pending token] + observation`` on resume) or a **decode** step (one pending
token for every sequence whose prefill is done). Prefill steps go first. A prefill step's token
budget is ``max_num_batched_tokens``, or with ``prefill_chunking="even"`` (the default) an equal
share of the pending prefill tokens over the fewest steps that budget allows (``prefill_budget``).

Blocks: admission reserves pages for the sequence's whole context (``num_tokens``); a decode
step grows each table by at most one page. Paused sequences keep their pages and are counted
like everything else. When a request does not fit, room is made in this order, never losing a
token: paused sequences (longest paused first), then waiting sequences that hold pages (queue
tail first) have their KV **swapped** to host memory while the swap space lasts, else
**dropped** (recomputed at their next prefill); then, for decode only, running sequences
(latest admitted first) are preempted: KV dropped, back to the head of the queue.

Device work the host side decides (swap out, swap in, copy-on-write page copies) is attached
to the next step as a list of operations, which the runner performs before its forward pass,
in that order; so a page freed by a swap-out can be reused in the same step.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field
from itertools import islice

import numpy as np

from .config import EngineConfig
from .errors import OutOfBlocksError
from .kv_cache import BlockManager
from .kv_cache import blocks_for as blocks_for_tokens
from .sequence import Sequence, SeqState


@dataclass(slots=True)
class PageOps:
    """Device work decided on the host, done by the runner before a step's forward pass, in this order."""

    swap_out: list[tuple[int, list[int]]] = field(default_factory=list)   # (seq_id, pages) copied to host memory
    swap_in: list[tuple[int, list[int]]] = field(default_factory=list)    # (seq_id, pages) restored from host memory
    swap_discard: list[int] = field(default_factory=list)                 # seq_ids whose host copy is dropped
    page_copies: list[tuple[int, int]] = field(default_factory=list)      # copy-on-write (src, dst) pages

    def __bool__(self) -> bool:
        return bool(self.swap_out or self.swap_in or self.swap_discard or self.page_copies)


@dataclass(slots=True)
class StepBatch:
    """Everything one model step needs, as numpy arrays built once per step."""

    kind: str                    # "prefill" | "decode"
    seqs: list[Sequence]
    chunks: list[int]            # tokens each sequence processes in this step
    input_ids: np.ndarray        # [T] int64
    positions: np.ndarray        # [T] int32, absolute positions
    q_seq_idx: np.ndarray        # [T] int32, row of block_tables / seq_lens
    slot_mapping: np.ndarray     # [T] int32, page * block_size + offset
    block_tables: np.ndarray     # [B, M] int32, -1 past each table
    seq_lens: np.ndarray         # [B] int32, cached tokens after this step's writes
    sample_rows: np.ndarray      # [S] int64, row of each sampling sequence's last token
    sample_seqs: list[Sequence] = field(default_factory=list)
    ops: PageOps = field(default_factory=PageOps)

    @property
    def num_tokens(self) -> int:
        return int(self.input_ids.shape[0])


class Scheduler:
    def __init__(self, cfg: EngineConfig, blocks: BlockManager) -> None:
        self.cfg = cfg
        self.blocks = blocks
        self.waiting: deque[Sequence] = deque()
        self.running: list[Sequence] = []      # admission order
        self.paused: list[Sequence] = []       # pause order
        self.evictions = 0                     # KV drops (recompute later)
        self.preemptions = 0                   # running sequences sent back to the queue
        self.swaps = 0                         # KV swapped out to host memory
        self.swap_used = 0                     # pages held in host memory
        self.ops = PageOps()                   # device work for the next step

    # ---- state transitions -----------------------------------------------------------
    def add(self, seq: Sequence) -> None:
        seq.state = SeqState.WAITING
        self.waiting.append(seq)

    def resume(self, seq: Sequence) -> None:
        self.paused.remove(seq)
        self.add(seq)

    def pause(self, seq: Sequence) -> None:
        """End of a turn (or an abort): out of the running list or the queue, KV kept."""
        if seq in self.running:
            self.running.remove(seq)
        elif seq in self.waiting:
            self.waiting.remove(seq)
        seq.state = SeqState.PAUSED
        self.paused.append(seq)

    def preempt(self, seq: Sequence) -> None:
        """A running sequence goes back to the head of the queue; its KV is dropped and recomputed."""
        self.running.remove(seq)
        self.drop_kv(seq)
        seq.state = SeqState.WAITING
        self.waiting.appendleft(seq)
        self.preemptions += 1

    def finish(self, seq: Sequence) -> None:
        """Take ``seq`` out of every queue and free its pages."""
        for q in (self.running, self.paused):
            if seq in q:
                q.remove(seq)
        if seq in self.waiting:
            self.waiting.remove(seq)
        self.drop_kv(seq)
        seq.state = SeqState.FINISHED

    def take_ops(self) -> PageOps:
        ops, self.ops = self.ops, PageOps()
        return ops

    def has_work(self) -> bool:
        return bool(self.waiting or self.running)

    # ---- making room -------------------------------------------------------------------
    def drop_kv(self, seq: Sequence) -> None:
        """Forget a sequence's KV, in the pool and in host memory; it is recomputed at its next prefill."""
        self.blocks.free(seq.block_table)
        if seq.swapped:
            self.ops.swap_discard.append(seq.seq_id)
            self.swap_used -= seq.swapped
            seq.swapped = 0
        seq.num_cached = 0
        seq.prefill_done = False

    def _evict(self, seq: Sequence) -> None:
        """Free a non-running sequence's pages: swap its KV to host memory if there is room, else drop it."""
        pages = blocks_for_tokens(seq.num_cached, self.blocks.block_size)
        if pages and self.swap_used + pages <= self.cfg.swap_space:
            self.ops.swap_out.append((seq.seq_id, seq.block_table[:pages]))
            self.swap_used += pages
            seq.swapped = pages
            self.blocks.free(seq.block_table)
            self.swaps += 1
        else:
            self.evictions += 1
            self.drop_kv(seq)

    def _make_room(self, need: int, keep: set[int], allow_running: bool) -> bool:
        """Free pages until ``need`` are free; never touches sequences whose id is in ``keep``."""
        victims: list[Sequence] = [s for s in self.paused if s.block_table]
        victims += [s for s in reversed(self.waiting) if s.block_table and s.seq_id not in keep]
        for seq in victims:
            if self.blocks.num_free >= need:
                return True
            self._evict(seq)
        while allow_running and self.blocks.num_free < need:
            candidates = [s for s in self.running if s.seq_id not in keep]
            if not candidates:
                break
            self.preempt(candidates[-1])
        return self.blocks.num_free >= need

    # ---- building a step ---------------------------------------------------------------
    def schedule(self) -> StepBatch | None:
        return self._schedule_prefill() or self._schedule_decode()

    def prefill_budget(self) -> int:
        """The next prefill step's token budget.

        ``greedy``: ``max_num_batched_tokens``. ``even``: the prefill tokens now pending ``T`` (the
        sequences still prefilling, then the waiting queue as far as ``max_num_seqs`` admits) need
        ``n = ceil(T / max_num_batched_tokens)`` steps either way; each step takes ``ceil(T / n)``, so
        the steps differ by at most one token. Greedy would leave a last step of ``T mod budget``
        tokens, which on a GPU costs its launches' host time however few tokens it has (with 64
        resumes of 257 tokens under 16384: a step of 64 tokens). The pool may admit fewer than
        counted, and the step may then be smaller than greedy's (its budget is over half of
        ``max_num_batched_tokens`` whenever it is not all of it); the next step counts again."""
        cap = self.cfg.max_num_batched_tokens
        if self.cfg.prefill_chunking == "greedy":
            return cap
        pending = sum(s.num_uncached for s in self.running if not s.prefill_done)
        admissible = max(0, self.cfg.max_num_seqs - len(self.running))
        pending += sum(s.num_uncached for s in islice(self.waiting, admissible))
        if pending <= cap:
            return cap
        steps = -(-pending // cap)                        # ceil(T / budget): the fewest steps that hold T
        return -(-pending // steps)                       # ceil(T / steps): equal shares

    def _schedule_prefill(self) -> StepBatch | None:
        budget = self.prefill_budget()
        chosen: list[tuple[Sequence, int]] = []
        for seq in self.running:                          # admitted sequences still prefilling
            if not seq.prefill_done and budget > 0:
                chunk = min(seq.num_uncached, budget)
                chosen.append((seq, chunk))
                budget -= chunk
        while self.waiting and budget > 0 and len(self.running) < self.cfg.max_num_seqs:
            seq = self.waiting[0]
            need = (self.blocks.delta(seq.block_table, seq.num_tokens)
                    + self.blocks.shared_in_range(seq.block_table, seq.num_cached, seq.num_tokens))
            if need > self.blocks.num_free and not self._make_room(need, {seq.seq_id}, allow_running=False):
                break
            self.blocks.grow(seq.block_table, seq.num_tokens)
            if seq.swapped:                                # bring its KV back from host memory
                self.ops.swap_in.append((seq.seq_id, seq.block_table[:seq.swapped]))
                self.swap_used -= seq.swapped
                seq.swapped = 0
            self.ops.page_copies += self.blocks.copy_on_write(seq.block_table, seq.num_cached, seq.num_tokens)
            self.waiting.popleft()
            seq.state = SeqState.RUNNING
            seq.prefill_done = False
            self.running.append(seq)
            chunk = min(seq.num_uncached, budget)
            chosen.append((seq, chunk))
            budget -= chunk
        if not chosen:
            if self.waiting and not self.running:
                raise OutOfBlocksError("the KV pool cannot admit any waiting sequence")  # unreachable by construction
            return None
        return self._build("prefill", chosen)

    def _schedule_decode(self) -> StepBatch | None:
        ready = [s for s in self.running if s.prefill_done]
        if not ready:
            return None
        def pages_needed(seqs: list[Sequence]) -> int:
            return sum(self.blocks.delta(s.block_table, s.num_tokens)
                       + self.blocks.shared_in_range(s.block_table, s.num_cached, s.num_tokens) for s in seqs)

        need = pages_needed(ready)
        if need > self.blocks.num_free:
            self._make_room(need, {ready[0].seq_id}, allow_running=True)
            ready = [s for s in self.running if s.prefill_done]
            if pages_needed(ready) > self.blocks.num_free:
                raise OutOfBlocksError("decode cannot grow a single sequence")  # unreachable: max_model_len fits the pool
        for s in ready:
            self.blocks.grow(s.block_table, s.num_tokens)
            self.ops.page_copies += self.blocks.copy_on_write(s.block_table, s.num_cached, s.num_tokens)
        return self._build("decode", [(s, 1) for s in ready])

    def _build(self, kind: str, chosen: list[tuple[Sequence, int]]) -> StepBatch:
        bs = self.blocks.block_size
        ids: list[int] = []
        pos: list[int] = []
        qidx: list[int] = []
        sample_rows: list[int] = []
        sample_seqs: list[Sequence] = []
        for b, (seq, chunk) in enumerate(chosen):
            start = seq.num_cached
            ids += seq.token_ids[start:start + chunk]
            pos += list(range(start, start + chunk))
            qidx += [b] * chunk
            if start + chunk == seq.num_tokens:           # the chunk reaches the end: sample from its last row
                sample_rows.append(len(ids) - 1)
                sample_seqs.append(seq)
        width = max(len(s.block_table) for s, _ in chosen)
        tables = np.full((len(chosen), width), -1, dtype=np.int32)
        for b, (seq, _) in enumerate(chosen):
            tables[b, :len(seq.block_table)] = seq.block_table
        positions = np.asarray(pos, dtype=np.int32)
        q_seq_idx = np.asarray(qidx, dtype=np.int32)
        slots = tables[q_seq_idx, positions // bs] * bs + positions % bs
        return StepBatch(
            kind=kind,
            seqs=[s for s, _ in chosen],
            chunks=[c for _, c in chosen],
            input_ids=np.asarray(ids, dtype=np.int64),
            positions=positions,
            q_seq_idx=q_seq_idx,
            slot_mapping=slots.astype(np.int32),
            block_tables=tables,
            seq_lens=np.asarray([s.num_cached + c for s, c in chosen], dtype=np.int32),
            sample_rows=np.asarray(sample_rows, dtype=np.int64),
            sample_seqs=sample_seqs,
            ops=self.take_ops(),
        )
