"""Host-side pieces around the decode graphs' cuBLAS GEMMs: which captured edges ``optimized.graph_edges`` would
rewrite (the ``blas_pdl`` measurement switch), and the runner's BLAS backend around decode steps (``decode_blas``).
Neither needs a GPU: the driver calls and torch's backend switch are what the GPU runs measured
(``benches/gpu/probe_blas_pdl.py``, ``profile_decode.py``); here the choices around them."""

from __future__ import annotations

import types

import pytest
import torch

from optimized import graph_edges as ge
from optimized.runner import DECODE_BLAS, DECODE_BLAS_ROWS, CudaRunner

NAMES = {1: "add_rmsnorm", 2: "nvjet_sm90_tst_64x32_64x16_4x1_v_bz_TNT", 3: "split_kv_partials_d128",
         4: "nvjet_sm90_tst_64x32_64x16_2x1_v_bz_splitK_TNT", 5: "void cublasLt::splitKreduce_kernel<32, 16>",
         6: "silu_mul"}
MEMCPY = 100                                            # a node that is not a kernel


def test_select_edges_takes_full_kernel_to_kernel_edges_into_matching_kernels_only():
    prog = dict(from_port=ge.PORT_PROGRAMMATIC, type=ge.DEP_PROGRAMMATIC)
    edges = [
        ge.Edge(1, 2),              # norm -> GEMM: rewritten
        ge.Edge(2, 3, **prog),      # GEMM -> ours, already programmatic: kept
        ge.Edge(3, 4),              # attention -> split-K GEMM: rewritten
        ge.Edge(4, 5),              # GEMM -> its reduction: not a match, kept
        ge.Edge(MEMCPY, 2),         # a copy -> GEMM: not kernel to kernel, kept
        ge.Edge(5, 6),              # reduction -> ours (full edge, ours does not match): kept
    ]
    got = ge.select_edges(edges, NAMES, r"^nvjet_")
    assert got == [edges[0], edges[2]]
    assert ge.select_edges(edges, NAMES, r"^nvjet_|splitKreduce") == [edges[0], edges[2], edges[3]]
    assert ge.select_edges(edges, NAMES, r"^no_such_kernel$") == []


@pytest.mark.parametrize("bad", ["", None, 3])
def test_select_edges_rejects_a_pattern_that_is_not_a_regular_expression(bad):
    with pytest.raises(ValueError, match="pattern"):
        ge.select_edges([ge.Edge(1, 2)], NAMES, bad)


def test_edge_data_layouts_match_cuda_h():
    assert ge._EdgeData.from_port.offset == 0 and ge._EdgeData.type.offset == 2
    assert ge._KernelNodeParams.kernelParams.offset == 40 and ge._KernelNodeParams.kern.offset == 56


class _Backend:
    """A stand-in for ``torch.backends.cuda.preferred_blas_library``: records every switch."""

    def __init__(self) -> None:
        self.current, self.calls = "cublas", []

    def __call__(self, backend=None):
        if backend is not None:
            self.calls.append(backend)
            self.current = backend
        return self.current


def _fake_runner(**kw) -> types.SimpleNamespace:
    base = dict(dev=torch.device("cuda"), decode_blas=DECODE_BLAS, decode_blas_rows=DECODE_BLAS_ROWS)
    return types.SimpleNamespace(**{**base, **kw})


def test_decode_blas_is_set_around_steps_of_its_rows_and_put_back(monkeypatch):
    fake = _Backend()
    monkeypatch.setattr(torch.backends.cuda, "preferred_blas_library", fake)
    r = _fake_runner()
    lo, hi = DECODE_BLAS_ROWS
    for rows in (lo, 32, hi):
        with CudaRunner._decode_blas_backend(r, rows):
            assert fake.current == DECODE_BLAS
        assert fake.current == "cublas"
    assert fake.calls == [DECODE_BLAS, "cublas"] * 3
    for rows in (1, 8, lo - 1, hi + 1, 256):          # other steps: no switch at all
        with CudaRunner._decode_blas_backend(r, rows):
            assert fake.current == "cublas"
    with CudaRunner._decode_blas_backend(_fake_runner(decode_blas=None), 32):
        assert fake.current == "cublas"
    with CudaRunner._decode_blas_backend(_fake_runner(dev=torch.device("cpu")), 32):
        assert fake.current == "cublas"
    assert len(fake.calls) == 6


def test_decode_blas_is_put_back_when_the_step_raises(monkeypatch):
    fake = _Backend()
    monkeypatch.setattr(torch.backends.cuda, "preferred_blas_library", fake)
    with pytest.raises(RuntimeError, match="boom"):
        with CudaRunner._decode_blas_backend(_fake_runner(), 32):
            raise RuntimeError("boom")
    assert fake.current == "cublas"


def test_decode_blas_rejects_an_unknown_backend_before_switching(monkeypatch):
    fake = _Backend()
    monkeypatch.setattr(torch.backends.cuda, "preferred_blas_library", fake)
    with pytest.raises(ValueError, match="decode_blas"):
        with CudaRunner._decode_blas_backend(_fake_runner(decode_blas="hipblaslt"), 32):
            pass
    assert fake.calls == [] and fake.current == "cublas"


def test_a_torch_without_cublaslt_leaves_decode_blas_off(monkeypatch):
    class NoLt(_Backend):
        def __call__(self, backend=None):
            if backend == "cublaslt":
                raise RuntimeError("Cannot set preferred backend to cuBLASLt")
            return super().__call__(backend)

    fake = NoLt()
    monkeypatch.setattr(torch.backends.cuda, "preferred_blas_library", fake)
    assert CudaRunner._blas_backend_settable(_fake_runner(), "cublaslt") is False
    assert fake.current == "cublas"                      # put back even though the switch failed
    assert CudaRunner._blas_backend_settable(_fake_runner(), "cublas") is True
    assert CudaRunner._blas_backend_settable(_fake_runner(dev=torch.device("cpu")), "cublaslt") is True


def test_the_engine_keeps_the_default_decode_blas_and_blas_pdl_off(opt_engine):
    eng = opt_engine()
    assert eng.runner.decode_blas == DECODE_BLAS and eng.runner.decode_blas_rows == DECODE_BLAS_ROWS
    assert eng.runner.blas_pdl is False
