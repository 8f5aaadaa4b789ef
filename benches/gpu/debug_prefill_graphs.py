"""Why do graphed prefill steps sample from NaN logits? (Forty-fourth session: the GPU conformance run with the
prefill graphs on, ``h200_fortyfirst_round.sh first``, failed five TURN tests: the first logprob of a turn NaN, and
``generate`` sampling token 0 after a chunked prefill.) Runs pytest like ``count_prefill_graphs.py`` with the prefill
graphs on, with one variant of the runner, and on every graphed step whose logprobs hold a NaN prints the step and
what a second replay, the same closure run eagerly (padded) and the eager step (unpadded) give:

    python3 benches/gpu/debug_prefill_graphs.py VARIANT conformance -q --engine optimized ...

VARIANT: ``base`` (as shipped), ``no-lookahead``, ``eager-closure`` (the padded closure run without a graph),
``own-pool`` (each prefill graph in a memory pool of its own), ``no-pdl`` (``TURNKV_PDL=0``: set it in the
environment, the variant only names it in the log), ``holes`` (``base``, and around every step of every kind a
check of the KV cache's NaN canary: before the step, the cached context of the step's sequences; after it, the slots
it wrote; each hole printed with the steps that wrote the sequence's positions), ``sync-start`` (a device-wide
synchronisation before each graphed prefill step), ``after`` (after each graphed prefill step only, the canary check
of the slots it wrote), ``no-copy-stream`` (``runner.decode_copy_stream = False``). Forty-fifth session: ``trace``
(``base``, and a host-only record of which step wrote each cached position to which slot, lookahead steps and page
operations included; a NaN step's report names the writers of its canary positions, whether the slot moved since,
and the layers whose K/V rows hold the NaN), ``stream-sync-start`` (the current stream synchronised before each graphed
prefill step), ``sync-end`` (a device-wide synchronisation after each), ``sleep-start`` (3 ms of host sleep before
each, no synchronisation) and ``quiet`` (no lookahead and no copy streams). ``trace`` found the cause: chunks that
sample nothing lost their K/V writes to an upload overwritten before it was read (fixed in
``CudaRunner._run_prefill_graph``; docs/performance/agentic.md, "Agentic workload")."""
from __future__ import annotations

import math
import os
import sys
import time

import numpy as np
import pytest
import torch

import optimized.runner as orun

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import count_prefill_graphs as cpg  # noqa: E402

VARIANTS = ("base", "no-lookahead", "eager-closure", "own-pool", "no-pdl", "holes", "sync-start", "after",
            "no-copy-stream", "trace", "stream-sync-start", "sync-end", "sleep-start", "quiet")
reports: list[str] = []


def _nan_rows(t: torch.Tensor) -> list[int]:
    return torch.isnan(t.float().reshape(t.shape[0], -1)).any(dim=1).nonzero().flatten().tolist()


def _step_kind(self, batch) -> str:
    """``decode``, ``eager`` (a prefill step launched from the host) or ``graph<token bucket>``."""
    if batch.kind == "decode":
        return "decode"
    return f"graph{self.prefill_graph_key(batch)[0]}" if self._prefill_graphed(batch) else "eager"


def _rows(cache: torch.Tensor) -> torch.Tensor:
    """A layer's K or V cache as one row per slot ``[slots, n_kv * D]``."""
    return cache.view(-1, cache.shape[2] * cache.shape[3])


def _diagnose(self, batch, key, res) -> None:
    T, B, S = batch.num_tokens, len(batch.seqs), len(batch.sample_seqs)
    g = self.prefill_graphs[key]
    lines = [f"NaN step: key {key} T {T} B {B} S {S} lps {res.logprobs}",
             f"  seq_lens {batch.seq_lens.tolist()} sample_rows {batch.sample_rows.tolist()} "
             f"tables {batch.block_tables.shape} qidx {np.unique(batch.q_seq_idx).tolist()} "
             f"pos [{int(batch.positions.min())}, {int(batch.positions.max())}]"]
    out = g["out"]
    lines.append(f"  replayed logits NaN rows {_nan_rows(out['logits'])} of {out['logits'].shape[0]}")
    if self.use_graphs and "graph" in g:
        g["graph"].replay()
        lines.append(f"  second replay: lps {out['lps'][:S].tolist()} NaN logits rows {_nan_rows(out['logits'])}")
    saved = dict(out)
    g["run"]()
    lines.append(f"  closure eagerly: lps {out['lps'][:S].tolist()} NaN logits rows {_nan_rows(out['logits'])}")
    out.clear()
    out.update(saved)
    lines.extend(_state(self, batch))
    if traced[0]:
        lines.extend(_trace_lines(self, batch))
    first: list[str] = []
    hidden = _traced(self, first, lambda: self._prefill(batch.input_ids, batch.positions, batch.slot_mapping,
                                                         batch.block_tables, batch.seq_lens, batch.q_seq_idx))
    lines.append(f"  eager step: first NaN output: {first[0] if first else 'none'}")
    rows = torch.as_tensor(batch.sample_rows, device=self.dev)
    lines.append(f"  eager step: hidden NaN rows {_nan_rows(hidden)[:8]} sampled logits NaN rows "
                 f"{_nan_rows(self.logits(hidden.index_select(0, rows)))}")
    reports.extend(lines)
    print("\n".join(lines), flush=True)


def _state(self, batch) -> list[str]:
    """The ticket array's nonzero entries and, per sequence, the canary (NaN) positions of its cached context."""
    out = []
    t = getattr(orun.ops, "_tickets", {}).get(self.dev.index if self.dev.index is not None else 0)
    if t is not None:
        nz = torch.nonzero(t).flatten()
        out.append(f"  tickets: {nz.numel()} nonzero {[(int(i), int(t[i])) for i in nz[:8]]}")
    for b, seq in enumerate(batch.seqs):
        mine, bad = _context_canary(self, batch, batch.q_seq_idx, b)
        out.append(f"  seq {seq.seq_id}: context {int(mine.min()) if mine.size else 0} step "
                   f"{_ranges(sorted(mine.tolist()))} canary at {_ranges(bad.tolist()) or 'none'}")
    return out


def _context_canary(self, batch, qidx: np.ndarray, b: int) -> tuple[np.ndarray, np.ndarray]:
    """Sequence ``b``'s positions in the step (``qidx``: each token's sequence row) and the positions of its cached
    context before them that hold the canary."""
    mine = batch.positions[qidx == b]
    ps = np.arange(int(mine.min()) if mine.size else 0)
    bs = self.block_size
    return mine, ps[_nan_slots(self, batch.block_tables[b, ps // bs] * bs + ps % bs)]


def _unwritten(self, batch, kind: str, step: int | None = None) -> None:
    """Report the slots the step wrote that still hold the canary (counted by ``kind``)."""
    live = batch.slot_mapping >= 0
    bad = _nan_slots(self, batch.slot_mapping[live])
    if bad.any():
        at = "" if step is None else f"step {step} "
        _report(f"unwritten after {kind}: {at}T {batch.num_tokens} B {len(batch.seqs)} seq_lens {batch.seq_lens.tolist()} "
                f"NaN at rows {np.nonzero(live)[0][bad].tolist()[:16]} positions "
                f"{batch.positions[live][bad].tolist()[:16]}")


def _traced(self, first: list[str], fn):
    """``fn()`` with the forward's ops and GEMMs checked: the first whose output holds a NaN goes into ``first``."""
    names = ("embed_rmsnorm", "rmsnorm", "qk_norm_rope", "paged_prefill", "split_kv_decode", "add_rmsnorm")
    saved = {n: getattr(orun.ops, n) for n in names if hasattr(orun.ops, n)}
    calls = [0]

    def check(name, val, args):
        calls[0] += 1
        ts = [val] if isinstance(val, torch.Tensor) else [a for a in args[:2] if isinstance(a, torch.Tensor)]
        for t in ts:
            if not first and t.is_floating_point() and torch.isnan(t).any():
                first.append(f"{name} (call {calls[0]}, NaN rows {_nan_rows(t)[:8]} of {t.shape[0]})")

    def wrap(name, f):
        def g(*args, **kwargs):
            val = f(*args, **kwargs)
            check(name, val, args)
            return val
        return g

    for n, f in saved.items():
        setattr(orun.ops, n, wrap(n, f))
    self._mm = wrap("_mm", type(self)._mm.__get__(self))
    self._mlp_act = wrap("_mlp_act", type(self)._mlp_act.__get__(self))
    try:
        return fn()
    finally:
        for n, f in saved.items():
            setattr(orun.ops, n, f)
        del self._mm, self._mlp_act


def install(variant: str) -> None:
    run = orun.CudaRunner._run_prefill_graph
    capture = orun.CudaRunner._capture_prefill

    def checked(self, batch):
        if variant in ("no-lookahead", "quiet"):
            self.lookahead = False
        if variant == "sync-start":
            torch.cuda.synchronize()
        if variant == "stream-sync-start":
            torch.cuda.current_stream(self.dev).synchronize()
        if variant == "sleep-start":
            time.sleep(0.003)
        if variant == "eager-closure":
            graphs, self.use_graphs = self.use_graphs, False
            try:
                res = run(self, batch)
            finally:
                self.use_graphs = graphs
        else:
            res = run(self, batch)
        if variant == "after":
            _unwritten(self, batch, "graph")
        if variant == "sync-end":
            torch.cuda.synchronize()
        if any(math.isnan(x) for x in res.logprobs):
            try:
                _diagnose(self, batch, self.prefill_graph_key(batch), res)
            except Exception as e:          # the diagnosis must not hide the failure it diagnoses
                print(f"diagnosis failed: {e!r}", flush=True)
        return res

    def own_pool(self, n, r, M):
        pool = self.pool
        self.pool = torch.cuda.graph_pool_handle()
        try:
            return capture(self, n, r, M)
        finally:
            self.pool = pool

    orun.CudaRunner._run_prefill_graph = checked
    if variant in ("no-copy-stream", "quiet"):
        init = orun.CudaRunner.__init__

        def init_one_stream(self, *args, **kwargs):
            init(self, *args, **kwargs)
            self.decode_copy_stream = False
        orun.CudaRunner.__init__ = init_one_stream
    if variant == "own-pool":
        orun.CudaRunner._capture_prefill = own_pool


def _ranges(ps: list[int]) -> str:
    out, i = [], 0
    while i < len(ps):
        j = i
        while j + 1 < len(ps) and ps[j + 1] == ps[j] + 1:
            j += 1
        out.append(f"{ps[i]}" if i == j else f"{ps[i]}-{ps[j]}")
        i = j + 1
    return ",".join(out)


def _nan_slots(self, slots: np.ndarray) -> np.ndarray:
    """Which of ``slots`` hold the canary (NaN) in layer 0's or the last layer's K or V cache."""
    if slots.size == 0:
        return np.zeros(0, dtype=bool)
    idx = torch.as_tensor(slots.astype(np.int64), device=self.dev)
    bad = torch.zeros(len(slots), dtype=torch.bool, device=self.dev)
    for c in (self.k_cache[0], self.v_cache[0], self.k_cache[-1], self.v_cache[-1]):
        bad |= torch.isnan(_rows(c).index_select(0, idx).float()).any(dim=1)
    return bad.cpu().numpy()


counts: dict[str, int] = {}
printed = [0]


def _report(line: str) -> None:
    kind = line.split(":")[0]
    counts[kind] = counts.get(kind, 0) + 1
    if printed[0] < 14:
        printed[0] += 1
        print(line, flush=True)


traced = [False]
#: (runner id, sequence id) -> position -> (step number, kind, slot written)
writes: dict[tuple[int, int], dict[int, tuple[int, str, int]]] = {}
#: runner id -> [(step number, page operation)]
page_log: dict[int, list[tuple[int, str]]] = {}
trace_step = [0]


def _qidx(batch) -> np.ndarray:
    """Each token row's sequence row (a decode step: one row each)."""
    return np.arange(len(batch.seqs)) if batch.kind == "decode" else batch.q_seq_idx


def install_holes() -> None:
    execute = orun.CudaRunner.execute

    def checked(self, batch, ahead=None):
        trace_step[0] += 1
        n, kind, qidx = trace_step[0], _step_kind(self, batch), _qidx(batch)
        for b, seq in enumerate(batch.seqs):           # the cached context before the step
            mine, bad = _context_canary(self, batch, qidx, b)
            if bad.size:
                h = writes.get((id(self), seq.seq_id), {})
                who = sorted({f"{h[p][1]}@{h[p][0]}" if p in h else "never@" for p in bad.tolist()})[:6]
                _report(f"hole before {kind}: step {n} seq {seq.seq_id} len {int(batch.seq_lens[b])} step positions "
                        f"{_ranges(sorted(mine.tolist()))} NaN at {_ranges(bad.tolist())} written by {who}")
        res = execute(self, batch, ahead)
        _unwritten(self, batch, kind, n)
        _record(self, batch, kind)
        return res

    orun.CudaRunner.execute = checked


def _record(self, batch, kind: str) -> None:
    """File the slot each of the step's positions is written to (host only: no device work, no synchronisation)."""
    qidx = _qidx(batch)
    for b, seq in enumerate(batch.seqs):
        h = writes.setdefault((id(self), seq.seq_id), {})
        rows = np.nonzero(qidx == b)[0]
        for p, sl in zip(batch.positions[rows].tolist(), batch.slot_mapping[rows].tolist()):
            if sl >= 0:
                h[int(p)] = (trace_step[0], kind, int(sl))


def install_trace() -> None:
    """``trace``: ``_record`` around every step, every launched lookahead step and every page operation."""
    traced[0] = True
    execute, launch, apply_ops = (orun.CudaRunner.execute, orun.CudaRunner._launch_decode,
                                  orun.CudaRunner.apply_ops)

    def exec_traced(self, batch, ahead=None):
        trace_step[0] += 1
        _record(self, batch, _step_kind(self, batch))
        return execute(self, batch, ahead)

    def launch_traced(self, batch, ids_from=None):
        if ids_from is not None:
            _record(self, batch, "ahead")
        return launch(self, batch, ids_from)

    def ops_traced(self, ops):
        log = page_log.setdefault(id(self), [])
        for name in ("swap_out", "swap_in"):
            for sid, pages in getattr(ops, name):
                log.append((trace_step[0], f"{name} seq {sid} pages {list(pages)[:6]}"))
        if ops.page_copies:
            log.append((trace_step[0], f"page_copies {list(ops.page_copies)[:6]}"))
        return apply_ops(self, ops)

    orun.CudaRunner.execute = exec_traced
    orun.CudaRunner._launch_decode = launch_traced
    orun.CudaRunner.apply_ops = ops_traced


def _trace_lines(self, batch) -> list[str]:
    """For each sequence of a NaN step: who wrote its canary positions, and whether to the slot its table names now;
    for the first such position, the layers whose K and V rows hold a NaN; the runner's page operations."""
    out, first = [], None
    bs = self.block_size
    for b, seq in enumerate(batch.seqs):
        _, bad = _context_canary(self, batch, batch.q_seq_idx, b)
        if not bad.size:
            continue
        h = writes.get((id(self), seq.seq_id), {})
        now = batch.block_tables[b, bad // bs] * bs + bad % bs
        groups: dict[str, tuple[list[int], set[int]]] = {}
        for p, sl in zip(bad.tolist(), now.tolist()):
            w = h.get(p)
            tag = "never written" if w is None else w[1] + ("" if w[2] == sl else " to another slot")
            ps, steps = groups.setdefault(tag, ([], set()))
            ps.append(p)
            if w is not None:
                steps.add(w[0])
        out.append(f"  trace seq {seq.seq_id}: " + "; ".join(
            f"{_ranges(ps)} by {t}" + (f" (steps {_ranges(sorted(st))})" if st else "") for t, (ps, st) in groups.items()))
        if first is None:
            first = (seq.seq_id, int(bad[0]), int(now[0]))
    if first is not None:
        sid, p, sl = first
        kn = [i for i, c in enumerate(self.k_cache) if torch.isnan(_rows(c)[sl]).any()]
        vn = [i for i, c in enumerate(self.v_cache) if torch.isnan(_rows(c)[sl]).any()]
        row = _rows(self.k_cache[0])[sl].float()
        out.append(f"  trace seq {sid} position {p} slot {sl}: K NaN in layers {_ranges(kn) or 'none'}, V NaN in layers "
                   f"{_ranges(vn) or 'none'} of {len(self.k_cache)}; layer-0 K row {int(torch.isnan(row).sum())}/"
                   f"{row.numel()} NaN")
    ops = page_log.get(id(self), [])
    out.append(f"  trace: step {trace_step[0]}, {len(ops)} page operations" + (f", last: {ops[-3:]}" if ops else ""))
    return out


def main(argv: list[str]) -> int:
    if not argv or argv[0] not in VARIANTS:
        sys.exit(f"debug_prefill_graphs.py: the first argument is one of {VARIANTS}")
    variant, argv = argv[0], argv[1:]
    install(variant)
    if variant == "holes":
        install_holes()
    if variant == "trace":
        install_trace()
    cpg.install(256)
    rc = pytest.main(argv)
    print(f"variant {variant}: {len([r for r in reports if r.startswith('NaN step')])} NaN steps; {cpg.summary()}",
          flush=True)
    if variant in ("holes", "after"):
        print(f"holes: {counts or 'none'}", flush=True)
    return int(rc)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
