"""The benches' handling of device memory: a peer that runs out of it is reported, not timed, and leaves the card's
memory to the benches after it; the agentic bench never holds the engine and transformers' model at once.

The forty-seventh session's agentic bench on an 80 GB H100 (``benches/results/h100/forty_seventh_session/
agentic_oom``) ran transformers' re-prefill beside the engine's KV pool and ran out of memory; the failed test's
traceback kept its tensors, so the next bench's ceilings ran out of memory too. These tests hold the fix on the CPU.
"""

from __future__ import annotations

import importlib
import pathlib
import sys
import weakref

import pytest
import torch

BENCHES = pathlib.Path(__file__).resolve().parents[1] / "benches"
sys.path.insert(0, str(BENCHES))
_bench = importlib.import_module("_bench")
agentic = importlib.import_module("test_agentic")
engine_decode = importlib.import_module("test_engine_decode")
sys.path.remove(str(BENCHES))

OOM = "CUDA out of memory. Tried to allocate 1.38 GiB. GPU 0 has a total capacity of 79.18 GiB"


def test_run_or_out_of_memory_returns_the_value():
    assert _bench.run_or_out_of_memory(lambda: 42) == (42, None)


def test_out_of_memory_is_reported_and_its_tensors_released():
    held: list[weakref.ref] = []

    def peer():
        activations = torch.ones(1024)           # what a peer's frames hold when it runs out of memory
        held.append(weakref.ref(activations))
        raise torch.OutOfMemoryError(OOM)

    value, message = _bench.run_or_out_of_memory(peer)
    print(f"message: {message!r}")
    assert value is None
    assert message == "CUDA out of memory", message
    assert held and held[0]() is None, "the frames of the failed peer still hold its tensors"


def test_other_errors_propagate():
    def broken():
        raise ValueError("not a memory error")

    with pytest.raises(ValueError, match="not a memory error"):
        _bench.run_or_out_of_memory(broken)


def test_engine_and_transformers_never_share_the_device():
    work = agentic.Workload(_bench.Scale("cpu"))
    eng = weakref.ref(work.engine())
    hf = work.hf()
    assert work._engine is None and eng() is None, "building transformers' model kept the engine alive"
    hf = weakref.ref(hf)
    work.engine()
    assert work._hf is None and hf() is None, "building the engine kept transformers' model alive"
    work.close()


class _Benchmark:
    """pytest-benchmark's ``pedantic``, untimed, and like it usable once a test (a second call raises, as pytest-benchmark's
    ``FixtureAlreadyUsed`` did on an H100 in the forty-ninth session when a retry called it again)."""

    def __init__(self) -> None:
        self.extra_info: dict = {}
        self.used = False

    def pedantic(self, fn, rounds, iterations, warmup_rounds):
        assert not self.used, "pedantic called twice in one test (pytest-benchmark: FixtureAlreadyUsed)"
        self.used = True
        fn()


def test_agentic_peer_out_of_memory_is_reported(monkeypatch):
    """A transformers variant that runs out of memory: a skip that names the cause, a table row that says so, a note,
    and the model released; the engine's variants and the targets' inputs are untouched."""
    def generate(*args, **kwargs):
        raise torch.OutOfMemoryError(OOM)

    monkeypatch.setattr(agentic, "hf_generate", generate)
    scale = _bench.Scale("cpu")
    work = agentic.Workload(scale)
    results = _bench.Collector()
    variant = "transformers re-prefill"
    with pytest.raises(pytest.skip.Exception, match="does not fit on this device"):
        agentic.test_agentic(_Benchmark(), scale, results, work, variant)
    rows = results.group(agentic.GROUP).records
    # one call over every sequence, then sub-batches halved down to the scale's smallest, all out of memory
    assert rows == [{"variant": variant, "out_of_memory": "CUDA out of memory, in sub-batches of 1 too"}], rows
    assert any(variant in n and "out of device memory" in n for n in results.group(agentic.GROUP).notes)
    assert work._hf is None and variant not in work.out
    work.close()


@pytest.mark.parametrize("variant", ["transformers re-prefill", "transformers + cache"])
def test_agentic_peer_runs_in_sub_batches_where_one_call_does_not_fit(monkeypatch, variant):
    """A transformers variant whose one call over every sequence runs out of memory runs in halved sub-batches, one
    call after another: the same tokens as one call (greedy, each sequence alone in its rows), the table's row and a
    note say how it ran, and the target's detail says so where it is the peer of the target."""
    real = agentic.hf_generate
    scale = _bench.Scale("cpu")
    s = scale.name
    # as on the H100: the warm-up's short contexts fit in one call, the timed run's later turns only two sequences a call
    longest_warm_up = agentic.PROMPT[s] + 2 * agentic.OBS[s] + agentic.WARM_GEN
    calls: list[tuple[int, bool]] = []

    def generate(model, ids, *args, **kwargs):
        oom = ids.shape[0] > 2 and ids.shape[1] > longest_warm_up
        calls.append((ids.shape[0], oom))
        if oom:
            raise torch.OutOfMemoryError(OOM)
        return real(model, ids, *args, **kwargs)

    work = agentic.Workload(scale)
    whole = work.transformers(agentic.TURNS[s], agentic.GEN[s], reuse=variant == "transformers + cache")
    assert whole["sub_batches"] == 1
    monkeypatch.setattr(agentic, "hf_generate", generate)
    results = _bench.Collector()
    agentic.test_agentic(_Benchmark(), scale, results, work, "resume")
    agentic.test_agentic(_Benchmark(), scale, results, work, variant)
    print(f"generate calls (sequences, out of memory): {calls}")
    first = [oom for _, oom in calls].index(True)                 # the timed run's first long turn over every sequence
    assert calls[0][0] == agentic.SEQS[s] and {n for n, _ in calls[first + 1:]} == {2}, calls
    out = work.out[variant]
    assert out["sub_batches"] == agentic.SEQS[s] // 2
    assert out["tokens"] == whole["tokens"], "sub-batches changed transformers' tokens"
    row = [r for r in results.group(agentic.GROUP).records if r["variant"] == variant]
    assert len(row) == 1 and row[0]["seqs_per_call"] == 2 and "out_of_memory" not in row[0], row
    assert any(variant in n and "sub-batches of 2" in n for n in results.group(agentic.GROUP).notes)
    if variant == "transformers + cache":
        agentic.test_agentic_targets(scale, {"copy_GBps": 10.0, "gemm_TFLOPs": 1.0}, results, work)
        detail = results.group(agentic.GROUP).targets[0]["detail"]
        assert f"in {agentic.SEQS[s] // 2} sub-batches" in detail, detail
    work.close()


def test_agentic_run_records_the_allocator_retries_over_it(monkeypatch):
    """Each timed agentic run records how often torch's caching allocator retried a failed ``cudaMalloc`` during it
    (the counter's growth over the run, not over the warm-up before it); on the CPU there is no such counter."""
    stats = {"num_alloc_retries": 5}
    monkeypatch.setattr(torch.cuda, "memory_stats", lambda *a, **k: dict(stats))
    assert _bench.alloc_retries(_bench.Scale("gpu")) == 5
    assert _bench.alloc_retries(_bench.Scale("cpu")) is None

    scale = _bench.Scale("cpu")
    work = agentic.Workload(scale)
    results = _bench.Collector()
    agentic.test_agentic(_Benchmark(), scale, results, work, "resume")
    assert results.group(agentic.GROUP).records[-1]["alloc_retries"] is None

    real = agentic.Workload.resume

    def resume(self, *args, **kwargs):           # every call, warm-up and timed run alike, retries 3 times
        stats["num_alloc_retries"] += 3
        return real(self, *args, **kwargs)

    monkeypatch.setattr(agentic.Workload, "resume", resume)
    monkeypatch.setattr(agentic, "alloc_retries", lambda s: stats["num_alloc_retries"])
    agentic.test_agentic(_Benchmark(), scale, results, work, "resume")
    assert stats["num_alloc_retries"] == 11                         # the warm-up's 3 and the timed run's 3
    assert results.group(agentic.GROUP).records[-1]["alloc_retries"] == 3
    work.close()


def test_engine_decode_peer_out_of_memory_is_reported(monkeypatch):
    """The engine decode bench's transformers peer running out of memory at the target batch: a skip that names the
    cause, a row that says so, the target reported with no value (not met, not missed), the peer released."""
    def generate(*args, **kwargs):
        raise torch.OutOfMemoryError(OOM)

    monkeypatch.setattr(engine_decode, "hf_generate", generate)
    scale = _bench.Scale("cpu")
    bundle = engine_decode.Bundle("tiny", scale)
    results = _bench.Collector()
    batch = engine_decode.TARGET_BATCH["cpu"]
    ceilings = {"copy_GBps": 10.0, "gemm_TFLOPs": 1.0}
    with pytest.raises(pytest.skip.Exception, match="does not fit on this device"):
        engine_decode.test_engine_decode(_Benchmark(), scale, ceilings, results, bundle, batch, "transformers")
    group = results.group(engine_decode.GROUP)
    assert group.records == [{"model": "tiny", "batch": batch, "impl": "transformers",
                              "out_of_memory": "CUDA out of memory"}], group.records
    assert [(t["value"], t["met"]) for t in group.targets] == [(None, None)], group.targets
    assert "out of device memory" in group.targets[0]["detail"]
    assert bundle._hf is None
    bundle.close()
