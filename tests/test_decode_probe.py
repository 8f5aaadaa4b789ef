"""The host side of ``benches/gpu/probe_decode_cudnn.py``'s lab switches and layouts, on the CPU with stubs in place of
the driver.

The probe times builds of ``attention.cu`` with compile-time switches; ``TK_SPLIT_SLOWEST`` changes the decode grid
(the split is the grid's z), so the probe must launch it differently. A wrong grid there would time a kernel that skips
work, so the routing is held here, before any device time is spent on it. (The forty-eighth session's ``TK_HEADS_X``,
head groups on x in thread-block clusters, ran in the forty-ninth and was removed: no faster, and slower with clusters
of 4 and 8; docs/performance/decode_attention.md.)
"""

from __future__ import annotations

import importlib
import pathlib
import sys
import types

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]
for sub in ("benches", "benches/gpu"):
    sys.path.insert(0, str(ROOT / sub))
probe = importlib.import_module("probe_decode_cudnn")
ab = importlib.import_module("ab_attention")
for sub in ("benches", "benches/gpu"):
    sys.path.remove(str(ROOT / sub))

from optimized import ops  # noqa: E402


@pytest.fixture
def launches(monkeypatch):
    """The probe's launches recorded instead of made."""
    seen = []
    monkeypatch.setattr(probe, "_launch", lambda *a: seen.append(a))
    return seen


@pytest.mark.parametrize("macros, grid", [
    ((), (2, 8, 32)),
    (("TK_SPLIT_SLOWEST",), (32, 8, 2)),
    (("TK_DIAG_COPY_ONLY", "TK_SPLIT_SLOWEST"), (32, 8, 2)),
    (("TK_DIAG_COPY_ONLY",), (2, 8, 32)),
])
def test_use_routes_a_build_to_its_launch(launches, monkeypatch, macros, grid):
    monkeypatch.setattr(probe, "install", lambda mod: None)
    monkeypatch.setattr(ops, "_launch", ops._launch)  # restored after the test
    mod = object()
    monkeypatch.setitem(probe._macros, id(mod), macros)
    probe.use(mod)
    ops._launch(object(), "attention", "split_kv_partials_d128", (2, 8, 32), (128, 1, 1), (), 74240, 2)  # (ref unread)
    assert [c[3] for c in launches] == [grid]


def test_install_forgets_the_old_modules_shared_memory_opt_in(monkeypatch):
    fake_cupy = types.ModuleType("cupy")
    fake_cupy.cuda = types.SimpleNamespace(Device=lambda: types.SimpleNamespace(id=0))
    monkeypatch.setitem(sys.modules, "cupy", fake_cupy)
    monkeypatch.setattr(ops, "_functions", {(0, "attention", "a"): 1, (0, "gemm", "g"): 2})
    monkeypatch.setattr(ops, "_function_smem", {(0, "attention", "a"): 74240, (0, "gemm", "g"): 120 * 1024})
    monkeypatch.setattr(ab.kernels, "_modules", {})
    new = object()
    ab.install(new)
    assert ab.kernels._modules[("attention", 0)] is new
    assert ops._functions == {(0, "gemm", "g"): 2}
    assert ops._function_smem == {(0, "gemm", "g"): 120 * 1024}  # the new module's kernels opt in at their launch


def test_grown_pages_are_a_prompt_run_then_one_page_a_sequence_in_turn():
    order = probe.grown_order(3, 8, device="cpu")  # 3 sequences of 8 pages: prompts of 2 pages, then 6 grown ones
    assert sorted(order.tolist()) == list(range(24))  # a permutation of the pool
    tables = order.view(3, 8).tolist()
    assert tables[0] == [0, 1, 6, 9, 12, 15, 18, 21]
    assert tables[2] == [4, 5, 8, 11, 14, 17, 20, 23]
    gen = probe.torch.Generator().manual_seed(0)
    assert probe.page_order(24, "grown", gen, per_seq=8, device="cpu").tolist() == order.tolist()
