"""hypothesis stateful test of the engine API: add / run / continue / finish / abort / weight
updates in random order, random lengths, a tiny pool under pressure, invalid calls mixed in.

Invariants after every operation: pages are accounted exactly (free + held == pool, reference
counts equal the tables that hold each page), every sequence sits in the queue its state says,
and a rejected call leaves ``snapshot()`` unchanged. At teardown everything is finished and no
page or host copy is left. CI runs at least 10,000 operations (100 machines x 100 steps).
"""

from __future__ import annotations

import random
from collections import Counter

import pytest
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

import reference
from reference import SamplingParams
from reference.sequence import SeqState
from reference.weights import random_weights

from _helpers import TINY, tiny_weights

WEIGHTS_B = random_weights(TINY, seed=3)
MIN_OPS = 10_000
OPS_MACHINES = 200     # hypothesis draws run lengths up to 100 steps; 200 machines give well over MIN_OPS
TYPED = (reference.TurnKVError,)


class EngineMachine(RuleBasedStateMachine):
    total_ops = 0       # over every machine hypothesis runs (checked below: at least 10,000)
    machines = 0

    @initialize(swap=st.sampled_from([0, 6]), blocks=st.sampled_from([14, 24]), seed=st.integers(0, 2**16),
                seats=st.sampled_from([1, 3, 6]), chunking=st.sampled_from(["even", "greedy"]))
    def start(self, swap, blocks, seed, seats, chunking):
        self.eng = reference.Engine.from_state_dict(TINY, tiny_weights(0), block_size=4, num_blocks=blocks,
                                                    max_model_len=48, max_num_batched_tokens=24, max_num_seqs=seats,
                                                    swap_space=swap, split_kv="fixed:5", prefill_chunking=chunking)
        self.rng = random.Random(seed)
        EngineMachine.machines += 1
        self.live: list[int] = []
        self.finished: list[int] = []
        self.ops = 0

    # ---------------------------------------------------------------- helpers
    def _rejected(self, fn, *args):
        before = self.eng.snapshot()
        with pytest.raises(TYPED):
            fn(*args)
        assert self.eng.snapshot() == before, f"{fn.__name__} was rejected but changed the engine's state"

    def _sp(self):
        r = self.rng
        return SamplingParams(temperature=r.choice([0.0, 0.9]), top_p=r.choice([1.0, 0.9]), top_k=r.choice([0, 20]),
                              max_tokens=r.randint(1, 5), stop_token_ids=(r.randrange(512),), seed=r.randrange(2**32))

    def _ids(self, n):
        return [self.rng.randrange(TINY.vocab_size) for _ in range(n)]

    # ---------------------------------------------------------------- rules
    @rule(n=st.integers(1, 20))
    def add(self, n):
        self.ops += 1
        if len(self.live) < 8:
            self.live.append(self.eng.rollout_add(self._ids(n), self._sp()))

    @rule(n=st.integers(1, 12), k=st.integers(2, 4))
    def add_group(self, n, k):
        self.ops += 1
        if len(self.live) < 8:
            self.live += self.eng.rollout_add_group(self._ids(n), [self._sp() for _ in range(k)])

    @rule(steps=st.one_of(st.none(), st.integers(0, 4)))
    def run(self, steps):
        self.ops += 1
        outs = self.eng.rollout_run_turns(steps)
        for sid, out in outs.items():
            assert self.eng.state(sid) in ("paused", "finished")
            assert out.stop_reason in ("stop_token", "max_tokens", "context_limit")
            assert len(out.token_ids) >= 1
        if steps is None:
            assert not any(self.eng.state(s) in ("waiting", "running") for s in self.live), "run_turns left work"

    @precondition(lambda self: self.live)
    @rule(i=st.integers(0, 7), n=st.integers(0, 14))
    def cont(self, i, n):
        self.ops += 1
        sid = self.live[i % len(self.live)]
        seq = self.eng._seqs[sid]
        if seq.state == SeqState.PAUSED and seq.num_tokens + n + 1 <= self.eng.max_model_len:
            self.eng.rollout_continue(sid, self._ids(n))
        else:
            self._rejected(self.eng.rollout_continue, sid, self._ids(n))

    @precondition(lambda self: self.live)
    @rule(i=st.integers(0, 7))
    def finish(self, i):
        self.ops += 1
        sid = self.live.pop(i % len(self.live))
        tr = self.eng.rollout_finish(sid)
        n = len(tr.token_ids)
        assert len(tr.assistant_mask) == n and len(tr.logprobs) == n and len(tr.weights_versions) == n
        assert tr.spans[0].start == 0 and tr.spans[-1].end == n
        assert all(a.end == b.start for a, b in zip(tr.spans, tr.spans[1:])), "spans must tile the tokens"
        for span in tr.spans:
            assert all(tr.assistant_mask[t] == (span.kind == "assistant") for t in range(span.start, span.end))
        self.finished.append(sid)

    @precondition(lambda self: self.live)
    @rule(i=st.integers(0, 7))
    def abort(self, i):
        self.ops += 1
        sid = self.live[i % len(self.live)]
        if self.eng.state(sid) in ("waiting", "running"):
            out = self.eng.abort(sid)
            assert out.stop_reason == "aborted" and self.eng.state(sid) == "paused"
        else:
            self._rejected(self.eng.abort, sid)

    @rule(recompute=st.booleans())
    def update_weights(self, recompute):
        self.ops += 1
        self.eng.update_weights(WEIGHTS_B if self.eng.weights_version % 2 == 0 else tiny_weights(0), recompute)

    @rule(kind=st.sampled_from(["unknown", "finished", "bad_token", "empty", "long", "neg"]))
    def invalid(self, kind):
        self.ops += 1
        e = self.eng
        if kind == "unknown":
            self._rejected(e.rollout_continue, 10**6, [1])
        elif kind == "finished" and self.finished:
            self._rejected(e.rollout_finish, self.finished[-1])
        elif kind == "bad_token":
            self._rejected(e.rollout_add, [1, TINY.vocab_size], SamplingParams())
        elif kind == "empty":
            self._rejected(e.rollout_add, [], SamplingParams())
        elif kind == "long":
            self._rejected(e.rollout_add, [1] * e.max_model_len, SamplingParams())
        elif kind == "neg" and self.live:
            self._rejected(e.rollout_continue, self.live[0], [-1])

    # ---------------------------------------------------------------- invariants
    @invariant()
    def pages_accounted(self):
        e = self.eng
        held = Counter(p for s in e._seqs.values() for p in s.block_table)
        free = e.blocks.free_pages()
        assert len(free) == len(set(free)) and not (set(free) & set(held)), "a page is both free and held"
        assert len(free) + len(held) == e.num_blocks, "a page leaked"
        for page, n in held.items():
            assert e.blocks.refcount(page) == n, f"page {page}: refcount {e.blocks.refcount(page)} != {n} tables"
        swapped = sum(s.swapped for s in e._seqs.values())
        assert swapped == e.scheduler.swap_used <= e.config.swap_space

    @invariant()
    def queues_match_states(self):
        sch = self.eng.scheduler
        for s in self.eng._seqs.values():
            where = [s in sch.waiting, s in sch.running, s in sch.paused]
            assert sum(where) <= 1
            if s.state == SeqState.RUNNING:
                assert where[1]
            elif s.state == SeqState.PAUSED:
                assert where[2]
            elif s.state == SeqState.FINISHED:
                assert not any(where) and not s.block_table

    def teardown(self):
        if not hasattr(self, "eng"):
            return
        EngineMachine.total_ops += self.ops
        for sid in list(self.live):
            self.eng.rollout_finish(sid)
        assert self.eng.num_free_blocks == self.eng.num_blocks, "pages leaked at teardown"
        assert not self.eng.runner.host and self.eng.scheduler.swap_used == 0, "host copies leaked"


EngineMachine.TestCase.settings = settings(max_examples=OPS_MACHINES, stateful_step_count=100, deadline=None)


def test_engine_api_stateful():
    EngineMachine.total_ops = EngineMachine.machines = 0
    EngineMachine.TestCase("runTest").runTest()
    print(f"stateful: {EngineMachine.total_ops} operations over {EngineMachine.machines} machines")
    assert EngineMachine.total_ops >= MIN_OPS, f"only {EngineMachine.total_ops} operations ran"
