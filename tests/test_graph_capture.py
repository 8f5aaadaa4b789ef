"""The optimized runner's CUDA-graph path on the CPU: ``CudaRunner._capture`` (decode graphs),
``_capture_prefill`` (the short prefill steps' graphs), ``_warm_up`` and ``_capturing``, run with the stand-in
kernels and the stand-in graph API of ``_graph_standin.py``. A capture records the step once; every later step
of its bucket is a replay of the record, with nothing of the runner's Python run again. So an engine on graphs
gives the eager engine's tokens only if the captured step reads everything that changes from one step to the
next from its device buffers, and reads nothing back to the host while it is captured."""

from __future__ import annotations

import gc

import numpy as np
import pytest
import torch

import reference
from _graph_standin import CaptureError, install
from _helpers import TINY, rollout_turns, tiny_weights
from _standins import _standin_ops

#: the last one crosses a graph's context bucket (256 keys) in its first turn
PROMPTS = [[(7 * i + j) % 512 for j in range(n)] for i, n in enumerate((3, 4, 9, 17, 30, 250))]


def _capture(graph, run) -> None:
    gc.disable()                              # as the runner's ``_capturing`` does
    try:
        with torch.cuda.graph(graph):
            run()
    finally:
        gc.enable()


def test_the_standin_graph_replays_its_record_and_refuses_what_a_capture_cannot(monkeypatch):
    """The stand-in itself: a capture leaves the buffers as they were and its results unwritten; a replay recomputes
    the recorded calls from the buffers' new contents and keeps the Python choices made at capture; a replay after
    a buffer has moved, a host read, a copy from the host, a running garbage collector, a second capture of one graph
    and a replay of a graph never captured are refused."""
    ops = _standin_ops()
    sg = install(monkeypatch, ops)
    x = torch.arange(8, dtype=torch.float32).view(1, 8)                      # [1, 8] a device buffer
    steps = torch.zeros(1, dtype=torch.int32)                                # a counter the graph bumps
    out: dict[str, torch.Tensor] = {}
    double = [True]

    def run() -> None:
        y = x * 2 if double[0] else x * 3                                    # a Python choice: baked at capture
        out["y"] = ops.silu_mul(y)                                           # [1, 4] a kernel
        steps.add_(1)

    g = torch.cuda.CUDAGraph()
    _capture(g, run)
    recorded = out["y"]
    print("after the capture", recorded.tolist(), steps.tolist())
    assert bool(recorded.isnan().all()) and steps.tolist() == [0], "a capture runs nothing"
    double[0] = False
    x.copy_(torch.arange(8, dtype=torch.float32).view(1, 8) + 1)
    g.replay()
    g.replay()
    y = 2 * (torch.arange(8, dtype=torch.float32) + 1)
    want = torch.nn.functional.silu(y[:4]) * y[4:]
    print("replayed", out["y"].tolist(), "expected", want.tolist())
    assert out["y"] is recorded and torch.equal(out["y"][0], want), "a replay recomputes from the new contents"
    assert steps.tolist() == [2] and (sg.captures, sg.replays) == (1, 2)

    x.data = x.clone()                                                       # the buffer moves
    with pytest.raises(CaptureError, match="has moved"):
        g.replay()
    with pytest.raises(CaptureError, match="never captured"):
        torch.cuda.CUDAGraph().replay()
    with pytest.raises(CaptureError, match="captured twice"):
        _capture(g, run)
    for read in (lambda: x.sum().item(), lambda: x.tolist(), lambda: int(x[0, 0]), lambda: bool(x[0, 0]),
                 lambda: x.cpu()):
        with pytest.raises(CaptureError, match="host read"):
            _capture(torch.cuda.CUDAGraph(), read)
    host = np.arange(4, dtype=np.int32)
    for copy in (lambda: torch.tensor([1, 2]), lambda: torch.as_tensor([1.0]), lambda: torch.from_numpy(host)):
        with pytest.raises(CaptureError, match="copy from host"):
            _capture(torch.cuda.CUDAGraph(), copy)
    with pytest.raises(CaptureError, match="garbage collector"):
        with torch.cuda.graph(torch.cuda.CUDAGraph()):
            pass


#: (engine keywords, runner switches, prefill-graph tokens; None: the default, on for an engine on graphs): the
#: default engine, with the prefill graphs off, batch-invariant (whose prefill steps never take a graph), and with
#: the decode steps' sample hand-off and lookahead off, and with every decode step's K/V prefetch into L2 (at any batch)
MODES = {
    "default": ({}, {}, None),
    "no-prefill-graphs": ({}, {}, 0),
    "invariant": ({"batch_invariant": True}, {}, None),
    "no-handoff-no-lookahead": ({}, {"decode_handoff": False, "lookahead": False}, None),
    "kv-prefetch": ({}, {"kv_prefetch_min_rows": 1, "kv_prefetch_max_bytes": 50 << 20}, None),
}


@pytest.mark.parametrize("mode", list(MODES))
def test_engine_on_captured_graphs_gives_the_eager_engines_tokens(opt_engine, monkeypatch, mode):
    """An engine on (stand-in) CUDA graphs against the same engine eager: the same tokens and logprobs, bit for
    bit, over three turns of six sequences, greedy and sampled, finishing at different steps (so the batch moves
    between graph buckets), one of them past 256 keys (the next context bucket); every decode launch is a replay
    of a captured graph, each graph captured once. With the prefill graphs on (the default on graphs), the short
    prefill steps of the default mode replay too."""
    import optimized.runner as orun

    engine_kw, switches, prefill_graph_tokens = MODES[mode]
    sg = install(monkeypatch, orun.ops)
    # only a prefill graph's replay may choose its kernel without the hint: batch-invariant steps never take one
    monkeypatch.setattr(orun.ops, "allow_no_hint", prefill_graph_tokens != 0 and not engine_kw.get("batch_invariant"))
    sps = [reference.SamplingParams(max_tokens=n, stop_token_ids=(), logprobs=True) for n in (3, 6, 9)] + \
          [reference.SamplingParams(temperature=0.9, top_p=0.9, max_tokens=n, stop_token_ids=(), seed=s,
                                    logprobs=True) for n, s in ((5, 1), (11, 2), (9, 3))]
    engine_kw = {"max_model_len": 512, **engine_kw}
    eager, graphed = opt_engine(**engine_kw), opt_engine(use_graphs=True, **engine_kw)
    for eng in (eager, graphed):
        for name, value in switches.items():
            setattr(eng.runner, name, value)
    r = graphed.runner
    assert eager.runner.prefill_graph_max_tokens == 0, "off without graphs"
    if prefill_graph_tokens is None:
        assert r.prefill_graph_max_tokens == orun.PREFILL_GRAPH_TOKENS[-1], "on (the largest bucket) on graphs"
    else:
        r.prefill_graph_max_tokens = prefill_graph_tokens
    launched = [0]
    launch = r._launch_decode

    def counted(batch, ids_from=None):
        launched[0] += 1
        return launch(batch, ids_from)

    r._launch_decode = counted
    want = rollout_turns(eager, PROMPTS, sps)
    got = rollout_turns(graphed, PROMPTS, sps)
    keys = sorted(r.graphs)
    print(f"decode graphs {keys}, prefill graphs {sorted(r.prefill_graphs)}: {sg.captures} captures, "
          f"{sg.replays} replays ({launched[0]} decode launches, {r.prefill_graph_steps} prefill-graph steps, "
          f"{r.lookahead_used} lookahead steps used)")
    assert got[0] == want[0], "a replayed graph changed the tokens"
    assert got[1] == want[1], "a replayed graph changed the logprobs"
    assert len({b for b, _ in keys}) >= 3 and len({n for _, n in keys}) == 2, "several batch and context buckets"
    assert (r.lookahead_used > 0) == r.lookahead
    slots = sum(len(g["slots"]) for g in r.graphs.values())
    assert sg.captures == slots + len(r.prefill_graphs), "each graph is captured once"
    assert sg.replays == launched[0] + r.prefill_graph_steps, "every graphed step is one replay"
    assert (r.prefill_graph_steps > 0) == (r.prefill_graph_max_tokens > 0 and not r.invariant)
    assert eager.runner.prefill_graph_steps == 0


MACHINES = 30                         # hypothesis machines of up to 30 calls each


def test_graphed_and_eager_engines_agree_under_random_api_calls(opt_engine, monkeypatch):
    """hypothesis, stateful: one random sequence of API calls (add, groups, partial and whole runs, continue,
    finish, abort, single-shot generation, teacher-forced scores, weight updates with and without recomputing the
    KV, preemption and swap in a small pool) goes to two optimized engines, eager and on (stand-in) graphs, drawn in
    default or batch-invariant mode, the graphed one with prefill graphs of up to 64 or 16 tokens (so its longer
    prefill steps go eagerly; the eager engine's all do). Every result (turn outputs, trajectories, generations,
    scores, typed errors) is the same in both, bit for bit."""
    import random

    from hypothesis import settings
    from hypothesis import strategies as st
    from hypothesis.stateful import RuleBasedStateMachine, initialize, precondition, rule, run_state_machine_as_test

    import optimized.runner as orun
    from reference.weights import random_weights

    sg = install(monkeypatch, orun.ops)
    monkeypatch.setattr(orun.ops, "allow_no_hint", True)
    weights_b = random_weights(TINY, seed=3)
    seen = {"machines": 0, "calls": 0, "prefill_graph_steps": 0, "weight_updates": 0, "scores": 0}

    class Twins(RuleBasedStateMachine):
        @initialize(invariant=st.booleans(), prefill_graphs=st.sampled_from([64, 16]), swap=st.sampled_from([0, 6]),
                    blocks=st.sampled_from([14, 24]), seed=st.integers(0, 2**16))
        def start(self, invariant, prefill_graphs, swap, blocks, seed):
            kw = dict(block_size=4, num_blocks=blocks, max_model_len=48, max_num_batched_tokens=24, max_num_seqs=6,
                      swap_space=swap, split_kv="fixed:5", batch_invariant=invariant)
            self.engs = (opt_engine(**kw), opt_engine(use_graphs=True, **kw))
            self.engs[1].runner.prefill_graph_max_tokens = prefill_graphs
            self.rng = random.Random(seed)
            self.live: list[int] = []
            seen["machines"] += 1

        def _both(self, name, *args):
            """The call on both engines: the same result, or the same typed error."""
            res = []
            for eng in self.engs:
                try:
                    out = getattr(eng, name)(*args)
                    res.append(("ok", out.tolist() if isinstance(out, torch.Tensor) else out))
                except reference.TurnKVError as e:
                    res.append(("error", type(e).__name__))
            assert res[0] == res[1], (name, args, res)
            seen["calls"] += 1
            return res[0]

        def _sp(self):
            r = self.rng
            return reference.SamplingParams(temperature=r.choice([0.0, 0.9]), top_p=r.choice([1.0, 0.9]),
                                            max_tokens=r.randint(1, 10), stop_token_ids=(r.randrange(512),),
                                            seed=r.randrange(2**32), logprobs=True)

        def _ids(self, n):
            return [self.rng.randrange(TINY.vocab_size) for _ in range(n)]

        @rule(n=st.integers(1, 20))
        def add(self, n):
            if len(self.live) < 8:
                self.live.append(self._both("rollout_add", self._ids(n), self._sp())[1])

        @rule(n=st.integers(1, 12), k=st.integers(2, 4))
        def add_group(self, n, k):
            if len(self.live) < 8:
                self.live += self._both("rollout_add_group", self._ids(n), [self._sp() for _ in range(k)])[1]

        @rule(steps=st.one_of(st.none(), st.integers(0, 4)))
        def run(self, steps):
            self._both("rollout_run_turns", steps)

        @precondition(lambda self: self.live)
        @rule(i=st.integers(0, 7), n=st.integers(0, 14))
        def cont(self, i, n):
            self._both("rollout_continue", self.live[i % len(self.live)], self._ids(n))

        @precondition(lambda self: self.live)
        @rule(i=st.integers(0, 7))
        def finish(self, i):
            self._both("rollout_finish", self.live.pop(i % len(self.live)))

        @precondition(lambda self: self.live)
        @rule(i=st.integers(0, 7))
        def abort(self, i):
            self._both("abort", self.live[i % len(self.live)])

        @rule(n=st.integers(1, 10), k=st.integers(1, 3))
        def generate(self, n, k):
            self._both("generate", [self._ids(n) for _ in range(k)], self._sp())

        @rule(n=st.integers(1, 30))
        def score(self, n):
            self._both("score", self._ids(n))
            seen["scores"] += 1

        @rule(recompute=st.booleans())
        def update_weights(self, recompute):
            w = weights_b if self.engs[0].weights_version % 2 == 0 else tiny_weights(0)
            self._both("update_weights", w, recompute)
            seen["weight_updates"] += 1

        def teardown(self):
            if not hasattr(self, "engs"):
                return
            for sid in list(self.live):
                self._both("rollout_finish", sid)
            for eng in self.engs:
                assert eng.num_free_blocks == eng.num_blocks, "pages leaked"
            seen["prefill_graph_steps"] += self.engs[1].runner.prefill_graph_steps

    run_state_machine_as_test(Twins, settings=settings(max_examples=MACHINES, stateful_step_count=30, deadline=None))
    seen.update(captures=sg.captures, replays=sg.replays)
    print("stateful twins:", seen)
    assert seen["machines"] >= MACHINES and seen["calls"] >= 10 * MACHINES
    assert seen["replays"] > 2 * MACHINES and seen["prefill_graph_steps"] > 0
    assert seen["weight_updates"] > 0 and seen["scores"] > 0


def test_count_prefill_graphs_switches_them_on_and_counts_every_replayed_step(opt_engine, monkeypatch):
    """``benches/gpu/count_prefill_graphs.py`` (the device scripts run the conformance suite through it, with the
    prefill graphs on): every runner on graphs gets the switch, one without graphs keeps it off, and its counts
    are the runner's own (steps, captured keys)."""
    import importlib.util
    import pathlib

    import optimized.runner as orun

    path = pathlib.Path(__file__).resolve().parents[1] / "benches" / "gpu" / "count_prefill_graphs.py"
    spec = importlib.util.spec_from_file_location("count_prefill_graphs", path)
    cpg = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(cpg)
    install(monkeypatch, orun.ops)
    monkeypatch.setattr(orun.ops, "allow_no_hint", True)
    for name in ("__init__", "_run_prefill_graph"):                         # so the patches go after the test
        monkeypatch.setattr(orun.CudaRunner, name, getattr(orun.CudaRunner, name))
    cpg.install(64)
    eager, graphed = opt_engine(max_model_len=512), opt_engine(use_graphs=True, max_model_len=512)
    assert eager.runner.prefill_graph_max_tokens == 0 and graphed.runner.prefill_graph_max_tokens == 64
    sps = [reference.SamplingParams(max_tokens=n, stop_token_ids=(), logprobs=True) for n in (3, 6, 9, 4, 5, 7)]
    want, got = rollout_turns(eager, PROMPTS, sps), rollout_turns(graphed, PROMPTS, sps)
    print(cpg.summary())
    assert got == want, "the prefill graphs changed the tokens or logprobs"
    r = graphed.runner
    assert sum(cpg.steps.values()) == r.prefill_graph_steps > 0
    assert sorted(cpg.captures) == sorted(r.prefill_graphs) and set(cpg.steps) <= {n for n, _, _ in r.prefill_graphs}
    assert eager.runner.prefill_graph_steps == 0


def test_a_prefill_graphs_pinned_inputs_are_written_again_only_after_their_upload_was_read(opt_engine, monkeypatch):
    """The forty-fifth session's NaN with the prefill graphs on: a graphed step that samples nothing (a chunk of a
    long prefill) reads nothing back, so ``_run_prefill_graph`` returned with its upload from the graph's pinned
    buffer still queued; the next chunk of the same key wrote that buffer, the late DMA carried the next chunk's
    metadata, and the first chunk's K/V were never written. On the CPU the copies are synchronous, so the test
    holds the runner to the rule instead: every upload's event (a stand-in here) is waited on before the buffer is
    written again, and at that wait the buffer still holds what the upload was to carry. Chunked prefills (16
    tokens a step) give steps that sample nothing."""
    import optimized.runner as orun

    install(monkeypatch, orun.ops)
    monkeypatch.setattr(orun.ops, "allow_no_hint", True)
    eng = opt_engine(use_graphs=True, max_model_len=512, max_num_batched_tokens=16)
    r = eng.runner
    r.prefill_graph_max_tokens = 256
    uploads: list = []
    key: list = [None]

    class Upload:
        """A stand-in event of one upload: the pinned buffer as the copy was queued, and whether it was waited on."""

        def __init__(self, host: torch.Tensor) -> None:
            self.host, self.queued, self.waited = host, host.clone(), False

        def synchronize(self) -> None:
            assert torch.equal(self.host, self.queued), "the pinned buffer was written before its upload was read"
            self.waited = True

    def event():
        if key[0] is None:                    # (a decode step's event: none on the CPU, as before)
            return None
        up = Upload(r.prefill_graphs[key[0]]["host"])
        uploads.append((key[0], up))
        return up

    run = r._run_prefill_graph
    silent, steps = [0], [0]

    def watched(batch):
        key[0] = r.prefill_graph_key(batch)
        silent[0] += not len(batch.sample_seqs)
        steps[0] += 1
        try:
            return run(batch)
        finally:
            key[0] = None

    monkeypatch.setattr(r, "_event", event)
    monkeypatch.setattr(r, "_run_prefill_graph", watched)
    sps = [reference.SamplingParams(max_tokens=n, stop_token_ids=(), logprobs=True) for n in (3, 6, 9, 4, 5, 7)]
    rollout_turns(eng, PROMPTS, sps)
    last = {k: up for k, up in uploads}
    late = [(k, i) for i, (k, up) in enumerate(uploads) if up is not last[k] and not up.waited]
    print(f"{steps[0]} graphed prefill steps over {len(r.prefill_graphs)} keys, {silent[0]} of them sampling nothing")
    assert silent[0] > 0 and steps[0] > len(r.prefill_graphs), "no key was reused after a step that samples nothing"
    assert len(uploads) == steps[0], f"{steps[0]} graphed steps recorded {len(uploads)} upload events to wait on"
    assert not late, f"uploads never waited on before their buffer was written again: {late[:4]}"


def _run_on_standin(*args: str) -> tuple[int, str]:
    """``python ARGS`` from the repository root, with ``tests/`` (so ``_standin_engine``) on the path, in a
    subprocess: its exit status and output."""
    import os
    import pathlib
    import subprocess
    import sys

    root = pathlib.Path(__file__).resolve().parents[1]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(root / "tests"), str(root)])}
    res = subprocess.run([sys.executable, *args], cwd=root, env=env, capture_output=True, text=True, timeout=600)
    return res.returncode, res.stdout + res.stderr


@pytest.mark.parametrize("variant", ["base", "trace"])
def test_debug_prefill_graphs_explains_a_nan_step(variant):
    """``benches/gpu/debug_prefill_graphs.py`` (the forty-fourth session's diagnosis of graphed prefill steps that
    sampled from NaN logits on the GPU), on the stand-in engine whose KV cache loses one write on purpose
    (``_standin_engine:poisoned_kv_canary``), in a subprocess: it finds the NaN step, names the context position that
    holds the canary and the first op of the eager forward that gives a NaN (the attention, which reads it). With
    ``trace`` (the forty-fifth session's) it also names the step that wrote that position and the layer whose K row
    holds the NaN (the poison is layer 0's K only)."""
    import re

    rc, out = _run_on_standin("benches/gpu/debug_prefill_graphs.py", variant, "conformance", "-p", "no:cacheprovider",
                              "-q", "-s", "-x", "--engine", "_standin_engine:poisoned_kv_canary", "-m", "TURN", "-k",
                              "test_batch_compositions and mha-d16")
    print("\n".join(line for line in out.splitlines() if not line.startswith("."))[-3000:])
    assert rc != 0, "the poisoned engine passed its TURN test"
    assert "diagnosis failed" not in out
    steps = re.search(rf"variant {variant}: (\d+) NaN steps; prefill graphs: (\d+) steps", out)
    assert steps and int(steps.group(1)) >= 1 and int(steps.group(2)) > 0, "no NaN step was diagnosed"
    assert re.search(r"canary at \d", out), "the diagnosis did not find the canary in the context"
    assert "first NaN output: paged_prefill" in out
    if variant == "trace":
        assert re.search(r"trace seq \d+: [\d,-]+ by (decode|eager|graph\d+) \(steps [\d,-]+\)", out), \
            "the trace did not name the step that wrote the canary position"
        assert re.search(r"trace seq \d+ position \d+ slot \d+: K NaN in layers 0, V NaN in layers none", out), \
            "the trace did not find the poisoned layer-0 K row"


@pytest.mark.parametrize("factory, caught", [("optimized_host", False),
                                             ("broken_prefill_graph_positions", True)])
def test_the_host_conformance_run_catches_a_broken_prefill_graph(factory, caught):
    """``nox -s conformance-host`` judges the optimized engine's host side through ``tests/_standin_engine.py``. Here
    its TURN tests at one shape, in a subprocess: the engine as built (prefill graphs on) passes, and the same engine
    with the replayed prefill steps' positions one too far fails with a TURN failure (so that run is no rubber
    stamp for the prefill graphs)."""
    import re

    rc, out = _run_on_standin("-m", "pytest", "conformance", "-p", "no:cacheprovider", "-q", "-x", "--engine",
                              f"_standin_engine:{factory}", "-m", "TURN", "-k", "gqa2")
    print(out[-1500:])
    if caught:
        assert rc == 1, f"the broken engine was not caught (rc {rc}):\n{out[-3000:]}"
        assert set(re.findall(r"CONFORMANCE FAILURE \[(\w+)\]", out)) == {"TURN"}, out[-3000:]
    else:
        assert rc == 0 and " passed" in out, out[-3000:]
