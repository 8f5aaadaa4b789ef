"""The optimized engine's host side as a conformance engine on the CPU: ``optimized.Engine`` with the stand-in
kernels of ``_standins.py`` and the stand-in CUDA-graph API of ``_graph_standin.py``, so that the engine-level
tests of the shared suite (TURN, STATE, MEM, SAMPLE, LOGIT, ORACLE, INVARIANT, SPLITK's policy test) judge the
runner's scheduling, step metadata, graph capture and replay, lookahead and prefill-graph paths without a GPU
(``nox -s conformance-host``):

    PYTHONPATH=tests python -m pytest conformance --engine _standin_engine:optimized_host -m "not kernel_api"

The six tests marked ``kernel_api`` (PAGED's and SPLITK's kernel tests) call the engine's CUDA kernels directly
(``engine.kernels``), which the stand-ins do not replace: they are deselected, not judged. The stand-ins are the
reference's functions, so what is judged here is the host code around the kernels, not the kernels' arithmetic
(the GPU conformance run and ``benches/gpu/check_kernels.py`` judge those).

The first factory call patches the process for good (``optimized.runner.ops``, ``torch.cuda``'s graph API): a
conformance run builds every engine through one factory."""
from __future__ import annotations

import dataclasses
from typing import Any

import pytest

from _graph_standin import install
from _standins import _standin_ops, run_on_cpu

from conformance.engines import _config, _optimized_supports, _weights


class _NoLog(list):
    """The stand-ins' launch log, discarded (a conformance run launches millions of stand-in kernels)."""

    def append(self, item: Any) -> None:
        pass


_PATCH = pytest.MonkeyPatch()
_INSTALLED: list[bool] = []


def _install() -> None:
    if _INSTALLED:
        return
    ops = _standin_ops(_NoLog())
    ops.allow_no_hint = True                 # a prefill graph's replay chooses its kernel without the hint
    run_on_cpu(_PATCH.setattr, ops)
    install(_PATCH, ops)
    _INSTALLED.append(True)


def _build(model: Any, weights: dict | None, prefill_graph_tokens: int | None, **engine_kwargs: Any):
    import optimized
    _install()
    cfg = _config(model)
    eng = optimized.Engine.from_state_dict(cfg, _weights(cfg, weights), device="cpu", use_graphs=True,
                                           **engine_kwargs)
    if prefill_graph_tokens is not None:
        eng.runner.prefill_graph_max_tokens = prefill_graph_tokens
    return eng


def optimized_host(model: Any, weights: dict | None = None, **engine_kwargs: Any):
    """The optimized engine as built by default (on graphs, every runner switch at its default: the short prefill
    steps replayed from graphs too)."""
    return _build(model, weights, None, **engine_kwargs)


def optimized_host_no_prefill_graphs(model: Any, weights: dict | None = None, **engine_kwargs: Any):
    """The same with the prefill graphs off (``runner.prefill_graph_max_tokens = 0``: every prefill step eager)."""
    return _build(model, weights, 0, **engine_kwargs)


def broken_prefill_graph_positions(model: Any, weights: dict | None = None, **engine_kwargs: Any):
    """Broken on purpose (``tests/test_graph_capture.py`` checks that the TURN clause catches it through this
    harness): with the prefill graphs on, every prefill step replayed from a graph sees its positions one too far."""
    eng = _build(model, weights, 256, **engine_kwargs)
    run = eng.runner._run_prefill_graph

    def shifted(batch):
        return run(dataclasses.replace(batch, positions=batch.positions + 1))

    eng.runner._run_prefill_graph = shifted
    return eng


def poisoned_kv_canary(model: Any, weights: dict | None = None, **engine_kwargs: Any):
    """Broken on purpose (``tests/test_graph_capture.py`` runs ``benches/gpu/debug_prefill_graphs.py`` on it): with
    the prefill graphs on, after the engine's third step the first token that step cached has its layer-0 K row set
    back to the pool's canary (NaN), as a lost KV write would leave it, so the script has a NaN step to explain."""
    eng = _build(model, weights, 256, **engine_kwargs)
    r = eng.runner
    execute, steps = r.execute, [0]

    def poisoned(batch, ahead=None):
        res = execute(batch, ahead)
        steps[0] += 1
        if steps[0] == 3:
            slot = int(batch.slot_mapping[batch.slot_mapping >= 0][0])
            r.k_cache[0][slot // r.block_size, slot % r.block_size] = float("nan")
        return res

    r.execute = poisoned
    return eng


for _factory in (optimized_host, optimized_host_no_prefill_graphs, broken_prefill_graph_positions,
                 poisoned_kv_canary):
    _factory.supports = _optimized_supports
