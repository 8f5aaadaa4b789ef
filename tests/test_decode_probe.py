"""The host side of ``benches/gpu/probe_decode_cudnn.py``'s lab switches, on the CPU with stubs in place of the driver.

The probe times builds of ``attention.cu`` with compile-time switches; two of them change the decode grid, so the probe
must launch them differently: ``TK_SPLIT_SLOWEST`` (the split is the grid's z) and ``TK_HEADS_X=C`` (the head groups
are the grid's x, in thread-block clusters of C CTAs; forty-eighth session). A wrong grid there would time a kernel
that skips work, so the routing is held here, before any device time is spent on it.
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

from optimized import launch, ops  # noqa: E402


class _Ref:  # a tensor's device, as the launcher reads it
    class device:
        index = 0


@pytest.fixture
def launches(monkeypatch):
    """The probe's launches recorded instead of made; the device holds 33 clusters of any size."""
    seen = []
    monkeypatch.setattr(probe, "_launch", lambda *a: seen.append(a))
    monkeypatch.setattr(ops, "_function", lambda dev, module, name, smem, ctas: ("fn", 1234))
    monkeypatch.setattr(launch, "max_active_clusters", lambda handle, block, smem, cluster: 33)
    monkeypatch.setattr(probe, "_cluster_said", set())
    return seen


def test_heads_x_puts_the_head_groups_on_x_in_clusters(launches, capsys):
    go = probe._launch_heads_x(8)
    go(_Ref, "attention", "split_kv_partials_d128", (2, 8, 32), (128, 1, 1), ("args",), 74240, 2)
    go(_Ref, "attention", "split_kv_partials_d128", (1, 8, 128), (128, 1, 1), ("args",), 74240, 2)
    assert launches == [
        (_Ref, "attention", "split_kv_partials_d128", (8, 2, 32), (128, 1, 1), ("args",), 74240, 2, 8),
        (_Ref, "attention", "split_kv_partials_d128", (8, 1, 128), (128, 1, 1), ("args",), 74240, 2, 8),
    ]
    out = capsys.readouterr().out
    print(out)
    assert out.count("clusters of 8 along the heads: the device holds 33 at once (264 CTAs)") == 1  # once per size


def test_heads_x_leaves_other_kernels_as_they_are(launches):
    go = probe._launch_heads_x(4)
    go(_Ref, "attention", "split_kv_qk_partials_d128", (2, 8, 4), (128, 1, 1), (), 74240, 2, 2)
    go(_Ref, "attention", "split_kv_reduce", (64, 1, 1), (256, 1, 1), ())
    assert launches == [
        (_Ref, "attention", "split_kv_qk_partials_d128", (2, 8, 4), (128, 1, 1), (), 74240, 2, 2),
        (_Ref, "attention", "split_kv_reduce", (64, 1, 1), (256, 1, 1), (), 0, None, 1),
    ]


def test_heads_x_without_a_cluster_asks_no_capacity(launches, monkeypatch, capsys):
    monkeypatch.setattr(launch, "max_active_clusters", lambda *a: pytest.fail("no cluster, no capacity query"))
    probe._launch_heads_x(1)(_Ref, "attention", "split_kv_partials_d64", (3, 4, 2), (128, 1, 1), (), 39168, 2)
    assert launches == [(_Ref, "attention", "split_kv_partials_d64", (4, 3, 2), (128, 1, 1), (), 39168, 2, 1)]
    assert "clusters" not in capsys.readouterr().out


@pytest.mark.parametrize("macros, grid, cluster", [
    ((), (2, 8, 32), 1),
    (("TK_SPLIT_SLOWEST",), (32, 8, 2), 1),
    (("TK_HEADS_X=4",), (8, 2, 32), 4),
    (("TK_DIAG_COPY_ONLY", "TK_HEADS_X=2"), (8, 2, 32), 2),
    (("TK_HEADS_X",), (8, 2, 32), 1),
])
def test_use_routes_a_build_to_its_launch(launches, monkeypatch, macros, grid, cluster):
    monkeypatch.setattr(probe, "install", lambda mod: None)
    monkeypatch.setattr(ops, "_launch", ops._launch)  # restored after the test
    mod = object()
    monkeypatch.setitem(probe._macros, id(mod), macros)
    probe.use(mod)
    ops._launch(_Ref, "attention", "split_kv_partials_d128", (2, 8, 32), (128, 1, 1), (), 74240, 2)
    assert [(c[3], c[-1] if len(c) == 9 else 1) for c in launches] == [(grid, cluster)]


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
