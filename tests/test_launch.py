"""The driver launch path of programmatic dependent launch without a GPU: the argument slots, the
struct layouts ctypes builds, and when the path is taken (``optimized/launch.py``). The launches
themselves run in the GPU checks (``benches/gpu/check_kernels.py`` launches every kernel through it)."""

from __future__ import annotations

import ctypes
import struct

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from optimized import launch


def test_each_argument_gets_an_eight_byte_little_endian_slot():
    args = (np.uint64(0x1122334455667788), np.int32(-3), np.float32(1.5), np.int32(7))
    buf = launch.pack_args(args)
    assert len(buf) == 32
    assert struct.unpack_from("<Q", buf, 0)[0] == 0x1122334455667788
    assert struct.unpack_from("<i", buf, 8)[0] == -3 and buf[12:16] == b"\0\0\0\0"
    assert struct.unpack_from("<f", buf, 16)[0] == 1.5 and buf[20:24] == b"\0\0\0\0"
    assert struct.unpack_from("<i", buf, 24)[0] == 7
    assert launch.pack_args(()) == b""


@pytest.mark.parametrize("bad", [3, 2.0, np.int64(3), np.float64(1.0), None])
def test_an_unexpected_argument_type_is_a_type_error(bad):
    with pytest.raises(TypeError, match="argument 1"):
        launch.pack_args((np.int32(1), bad))


def test_struct_layouts_match_cuda_h():
    assert ctypes.sizeof(launch._LaunchAttr) == 72               # id, pad[4], value union of 64 bytes
    assert launch._LaunchAttr.value.offset == 8
    assert launch._LaunchConfig.sharedMemBytes.offset == 24
    assert launch._LaunchConfig.hStream.offset == 32 and launch._LaunchConfig.attrs.offset == 40
    assert launch._LaunchConfig.numAttrs.offset == 48 and ctypes.sizeof(launch._LaunchConfig) == 56


_ARG_KINDS = {"u64": (lambda v: np.uint64(v % 2**64), 8), "i32": (lambda v: np.int32(v % 2**31 - 2**30), 4),
              "f32": (lambda v: np.float32(v / 7.0), 4),
              "map": (lambda v: launch.TensorMap(bytes((v + i) % 256 for i in range(128))), 128)}


def _fake_driver(seen: list) -> object:
    """A stand-in ``libcuda`` whose ``cuLaunchKernelEx`` reads what the real one reads: the config, its attributes,
    and each parameter's bytes through ``kernelParams[i]`` (as many as its ``sizes``, set per launch by the test)."""
    import types

    proto = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.POINTER(launch._LaunchConfig), ctypes.c_void_p,
                             ctypes.POINTER(ctypes.c_void_p), ctypes.c_void_p)

    def launch_kernel_ex(cfg_p, func, params, extra):
        c = cfg_p.contents
        attrs = tuple((c.attrs[i].id, tuple(c.attrs[i].value[:3])) for i in range(c.numAttrs))
        seen.append(dict(grid=(c.gridDimX, c.gridDimY, c.gridDimZ), block=(c.blockDimX, c.blockDimY, c.blockDimZ),
                         smem=c.sharedMemBytes, stream=c.hStream, func=func, attrs=attrs,
                         params=[ctypes.string_at(params[i], n) for i, n in enumerate(fake.sizes)]))
        return 0

    fake = types.SimpleNamespace(cuLaunchKernelEx=proto(launch_kernel_ex), sizes=[])
    return fake


@settings(max_examples=40, deadline=None)
@given(sigs=st.lists(st.lists(st.sampled_from(sorted(_ARG_KINDS)), max_size=12), min_size=1, max_size=3),
       values=st.lists(st.integers(0, 2**40), min_size=40, max_size=40), cluster=st.sampled_from([1, 2, 4]))
def test_launch_pdl_hands_the_driver_the_bytes_of_pack_params(sigs, values, cluster):
    """``launch_pdl`` packs into a buffer kept per argument signature: launches of several signatures, each twice
    with other values, interleaved, give the driver exactly ``pack_params``' bytes at every parameter, and the
    grid, block, shared memory, stream, function and attributes asked for."""
    seen: list = []
    fake = _fake_driver(seen)
    saved = launch._state["lib"]
    launch._state["lib"] = fake
    try:
        k = 0
        for rep in range(2):
            for sig in sigs:
                args = []
                for kind in sig:
                    args.append(_ARG_KINDS[kind][0](values[k % len(values)] + rep))
                    k += 1
                fake.sizes = [_ARG_KINDS[kind][1] for kind in sig]
                launch.launch_pdl(4000 + k, (2 * cluster, 3), (128,), args, 1024 + k, 77 + k, cluster_x=cluster)
                got = seen[-1]
                raw, offsets = launch.pack_params(args)
                want = [raw[o:o + n] for o, n in zip(offsets, fake.sizes)]
                assert got["params"] == want, (sig, rep)
                assert got["grid"] == (2 * cluster, 3, 1) and got["block"] == (128, 1, 1)
                assert (got["smem"], got["stream"], got["func"]) == (1024 + k, 77 + k, 4000 + k)
                assert got["attrs"] == tuple((aid, (tuple(v) + (0, 0))[:3]) for aid, v in launch.launch_attrs(cluster))
    finally:
        launch._state["lib"] = saved
    assert len(seen) == 2 * len(sigs)


def test_launch_pdl_rejects_bad_arguments_before_the_driver(monkeypatch):
    """A wrongly typed argument is ``pack_params``' TypeError and a grid that is not a multiple of the cluster a
    ValueError, both before the driver is called; each thread packs into its own buffers."""
    import threading

    seen: list = []
    monkeypatch.setitem(launch._state, "lib", _fake_driver(seen))
    with pytest.raises(TypeError, match="argument 1"):
        launch.launch_pdl(1, (1,), (32,), (np.int32(1), 2), 0, 0)
    with pytest.raises(ValueError, match="multiple of the cluster"):
        launch.launch_pdl(1, (3,), (32,), (np.int32(1),), 0, 0, cluster_x=2)
    assert seen == []
    mine = launch._params_of((np.int32(1),))
    theirs = []
    t = threading.Thread(target=lambda: theirs.append(launch._params_of((np.int32(1),))))
    t.start()
    t.join()
    assert launch._params_of((np.int32(2),)) is mine and theirs[0] is not mine


def test_when_the_pdl_path_is_taken(monkeypatch):
    monkeypatch.setattr(launch, "_driver", lambda: object())
    monkeypatch.delenv("TURNKV_PDL", raising=False)
    launch.set_pdl(None)
    try:
        assert launch.pdl_enabled(9) and launch.pdl_enabled(10)
        assert not launch.pdl_enabled(8)                           # griddepcontrol needs sm_90
        monkeypatch.setenv("TURNKV_PDL", "0")
        assert not launch.pdl_enabled(9)
        launch.set_pdl(True)
        assert launch.pdl_enabled(9)                               # set_pdl overrides the environment
        launch.set_pdl(False)
        monkeypatch.delenv("TURNKV_PDL")
        assert not launch.pdl_enabled(9)
        monkeypatch.setattr(launch, "_driver", lambda: None)       # no cuLaunchKernelEx: CuPy's path
        launch.set_pdl(True)
        assert not launch.pdl_enabled(9)
    finally:
        launch.set_pdl(None)


def test_ops_launch_dispatch(monkeypatch):
    """``ops._launch`` without a GPU: a stand-in CuPy and kernel module. Each kernel is loaded once per
    (device, module, name) with its CUfunction handle; the PDL path passes that handle to the driver
    launch, the other path calls the CuPy kernel on the stream."""
    import contextlib
    import sys
    import types

    import torch

    from optimized import kernels, ops

    calls: list[tuple] = []

    class FakeKernel:
        def __init__(self, name):
            self.name, self.kernel = name, types.SimpleNamespace(ptr=1000 + len(calls))
            self.max_dynamic_shared_size_bytes = 0
            calls.append(("load", name))

        def __call__(self, grid, block, args, shared_mem=0):
            calls.append(("cupy", self.name, grid, block, args, shared_mem))

    fake_cupy = types.SimpleNamespace(cuda=types.SimpleNamespace(Device=lambda dev: contextlib.nullcontext()))
    monkeypatch.setitem(sys.modules, "cupy", fake_cupy)
    monkeypatch.setattr(kernels, "load", lambda module: types.SimpleNamespace(get_function=FakeKernel))
    monkeypatch.setattr(ops, "_functions", {})
    monkeypatch.setattr(ops, "_function_smem", {})
    monkeypatch.setattr(ops, "_device_index", lambda t: 0)
    monkeypatch.setattr(ops, "_cc_major", lambda dev: 9)
    monkeypatch.setattr(ops, "_stream", lambda dev: contextlib.nullcontext())
    monkeypatch.setattr(torch.cuda, "current_stream", lambda dev=None: types.SimpleNamespace(cuda_stream=77))
    monkeypatch.setattr(launch, "launch_pdl", lambda *a: calls.append(("pdl",) + a))
    ref = torch.zeros(1)
    args = (np.int32(1),)
    try:
        launch.set_pdl(True)
        monkeypatch.setattr(launch, "_driver", lambda: object())
        ops._launch(ref, "rmsnorm", "rmsnorm", (2, 1, 1), (32, 1, 1), args, smem=64 * 1024)
        ops._launch(ref, "rmsnorm", "rmsnorm", (3, 1, 1), (32, 1, 1), args, smem=64 * 1024)
        ops._launch(ref, "rmsnorm", "rmsnorm", (6, 1, 1), (32, 1, 1), args, smem=64 * 1024, cluster_x=3)
        launch.set_pdl(False)
        ops._launch(ref, "rmsnorm", "rmsnorm", (4, 1, 1), (32, 1, 1), args, smem=64 * 1024)
        n = len(calls)
        with pytest.raises(ValueError, match="cluster"):     # only the driver's path launches clusters
            ops._launch(ref, "rmsnorm", "rmsnorm", (6, 1, 1), (32, 1, 1), args, smem=64 * 1024, cluster_x=3)
        assert len(calls) == n
    finally:
        launch.set_pdl(None)
    assert calls[0] == ("load", "rmsnorm") and [c[0] for c in calls].count("load") == 1   # loaded once
    fn, handle = ops._functions[(0, "rmsnorm", "rmsnorm")]
    assert handle == 1000 and fn.max_dynamic_shared_size_bytes == 64 * 1024
    assert calls[1] == ("pdl", 1000, (2, 1, 1), (32, 1, 1), args, 64 * 1024, 77, 1)
    assert calls[2] == ("pdl", 1000, (3, 1, 1), (32, 1, 1), args, 64 * 1024, 77, 1)
    assert calls[3] == ("pdl", 1000, (6, 1, 1), (32, 1, 1), args, 64 * 1024, 77, 3)
    assert calls[4] == ("cupy", "rmsnorm", (4, 1, 1), (32, 1, 1), args, 64 * 1024)
    # the driver's attributes: PDL always, the cluster's dimensions (x, 1, 1) only when asked for
    assert launch.launch_attrs() == ((launch.ATTR_PROGRAMMATIC_STREAM_SERIALIZATION, (1,)),)
    assert launch.launch_attrs(3) == ((6, (1,)), (4, (3, 1, 1)))
    # a later launch that asks more shared memory opts the loaded kernel in again (gemm's wide tiles); less leaves it
    assert ops._function(0, "rmsnorm", "rmsnorm", 120 * 1024)[0] is fn and fn.max_dynamic_shared_size_bytes == 120 * 1024
    assert ops._function(0, "rmsnorm", "rmsnorm", 80 * 1024)[0] is fn and fn.max_dynamic_shared_size_bytes == 120 * 1024
    assert [c[0] for c in calls].count("load") == 1


@pytest.fixture
def launch_log(monkeypatch) -> list[tuple]:
    """``ops`` on CPU tensors with ``_launch`` recorded: (module, kernel, grid, block, args, ctas_per_sm) per
    launch."""
    from optimized import ops

    log: list[tuple] = []
    monkeypatch.setattr(ops, "_launch", lambda ref, module, name, grid, block, args, smem=0, ctas_per_sm=None,
                        cluster_x=1: log.append((module, name, grid, block, args, ctas_per_sm, cluster_x)))
    monkeypatch.setattr(ops, "_DEVICE_TYPES", ("cuda", "cpu"))
    return log


def test_skinny_swiglu_chooses_kernel_and_grid_and_rejects_bad_input(launch_log):
    """``ops.skinny_swiglu`` on the CPU with ``_launch`` recorded: the kernel name (M tile, warps), the
    grid (I / 8 CTAs) and I; bad shapes are ValueErrors that launch nothing."""
    import torch

    from optimized import ops

    log = launch_log
    bf = torch.bfloat16
    x = torch.randn(3, 64).to(bf)
    out = ops.skinny_swiglu(x, torch.randn(48, 64).to(bf))
    assert out.shape == (3, 24) and log[-1][:4] == ("skinny_gemm", "skinny_swiglu_m8_w8", (3, 1, 1), (256, 1, 1))
    assert int(log[-1][4][5]) == 24                                      # the kernel's I
    ops.skinny_swiglu(torch.randn(12, 64).to(bf), torch.randn(48, 64).to(bf))
    assert log[-1][1] == "skinny_swiglu_m16_w8"
    n = len(log)
    for bad_x, bad_w in ((x, torch.randn(40, 64).to(bf)),                # 2I rows, I not a multiple of 8
                         (torch.randn(17, 64).to(bf), torch.randn(48, 64).to(bf)),   # more than 16 rows
                         (x, torch.randn(48, 32).to(bf)),                # K differs from x's
                         (x.float(), torch.randn(48, 64).to(bf))):       # x not bf16
        with pytest.raises(ValueError):
            ops.skinny_swiglu(bad_x, bad_w)
    assert len(log) == n


def test_gemm_staged_launch_and_rejects_bad_input(launch_log, monkeypatch):
    """``ops.gemm`` on the CPU with ``_launch`` recorded: a decode-sized M takes the staged kernel (its rows
    and stages in the name, bf16 or fp32 out), on a persistent grid of CTAs-per-SM x SMs capped at the 16-row
    tiles, 160 threads, the stages' shared memory, room for two CTAs only where two fit; more rows than a
    forced staged tile takes, an odd N or a bad K is a ValueError that launches nothing."""
    import torch

    from optimized import ops

    monkeypatch.setattr(ops, "_device_index", lambda t: 0)
    monkeypatch.setattr(ops, "_num_sms", lambda dev: 132)
    monkeypatch.setattr(ops, "_launch", lambda ref, module, name, grid, block, args, smem=0, ctas_per_sm=None:
                        launch_log.append((module, name, grid, block, args, smem, ctas_per_sm)))
    log = launch_log
    bf = torch.bfloat16
    w = torch.randn(6144, 1024).to(bf)
    y = ops.gemm(torch.randn(3, 1024).to(bf), w)
    assert y.shape == (3, 6144) and y.dtype == bf
    assert log[-1][:4] == ("gemm", "gemm_split_16x64_bf16", (96, 1, 2), (128, 1, 1))   # 3 rows over K = 1024: split
    y = ops.gemm(torch.randn(3, 2048).to(bf), torch.randn(6144, 2048).to(bf))
    assert y.shape == (3, 6144) and y.dtype == bf
    assert log[-1][:4] == ("gemm", "gemm_staged_m8_s4c2_bf16", (132, 1, 1), (160, 1, 1))
    assert [int(a) for a in (log[-1][4][1], *log[-1][4][4:])] == [2048, 3, 6144, 2048]   # ldx, M, N, K
    assert log[-1][5:] == (ops.gemm_staged_smem(8, 4, 2), 1)
    ops.gemm(torch.randn(12, 1024).to(bf), torch.randn(64, 1024).to(bf), out_dtype=torch.float32,
             tile="staged_m16_s3c2")
    assert log[-1][1:3] == ("gemm_staged_m16_s3c2_f32", (4, 1, 1)) and log[-1][5:] == (ops.gemm_staged_smem(16, 3, 2), 1)
    ops.gemm(torch.randn(30, 1024).to(bf), w, tile="staged_m32_s4c1")
    assert log[-1][1:3] == ("gemm_staged_m32_s4c1_bf16", (132, 1, 1))
    ops.gemm(torch.randn(2, 1024).to(bf), w, tile="staged_m8_s4c1x2")
    assert log[-1][1:3] == ("gemm_staged_m8_s4c1_bf16", (264, 1, 1)) and log[-1][5:] == (ops.gemm_staged_smem(8, 4), 2)
    n = len(log)
    for bad in (dict(x=torch.randn(9, 1024).to(bf), w=w, tile="staged_m8_s4c1x2"),    # more rows than the tile
                dict(x=torch.randn(33, 1024).to(bf), w=w, tile="staged_m32_s4c1"),
                dict(x=torch.randn(2, 1024).to(bf), w=torch.randn(63, 1024).to(bf)),  # N odd
                dict(x=torch.randn(2, 1020).to(bf), w=torch.randn(64, 1020).to(bf)),  # K % 8
                dict(x=torch.randn(2, 1024).to(bf), w=w, tile="staged_m4")):          # not built
        with pytest.raises(ValueError):
            ops.gemm(bad.pop("x"), bad.pop("w"), **bad)
    assert len(log) == n


def _fake_wide_launch(monkeypatch, launch_log: list, encoder: str, encode) -> list[bool]:
    """``ops`` on the CPU as on a 132-multiprocessor device: launches recorded into ``launch_log``, ``launch.<encoder>``
    replaced by ``encode``, an empty tensor-map cache; the driver's launch path present while ``clusters[0]`` (returned)."""
    import torch

    from optimized import launch, ops
    clusters = [True]
    monkeypatch.setattr(ops, "_device_index", lambda t: 0)
    monkeypatch.setattr(ops, "_num_sms", lambda dev: 132)
    monkeypatch.setattr(ops, "_clusters_ok", lambda ref: clusters[0])
    monkeypatch.setattr(ops, "_tensor_maps", {})
    monkeypatch.setattr(launch, encoder, encode)
    monkeypatch.setattr(ops, "_kernel_tickets", lambda ref: torch.zeros(ops._TICKETS, dtype=torch.int32))
    monkeypatch.setattr(ops, "_launch", lambda ref, module, name, grid, block, args, smem=0, ctas_per_sm=None:
                        launch_log.append((module, name, grid, block, args, smem, ctas_per_sm)))
    return clusters


def test_gemm_wide_launch_and_rejects_bad_input(launch_log, monkeypatch):
    """``ops.gemm`` on the CPU with ``_launch`` recorded and the driver's path faked: the wide kernel (its rows,
    tile, columns a stage, stages and warps in the name), block tensor maps of W (boxes of the tile's rows) and
    of x (the kernel's rows, x's own row stride), a persistent grid capped at the tiles, 32 x (warps + 1)
    threads, the stages' shared memory and room for two CTAs where two fit. Without the driver's path the
    default choice is the rule without the wide kernel; a forced wide tile then, more rows than the tile takes,
    K not a multiple of 64 or an odd N is a ValueError that launches nothing and encodes no map."""
    import struct

    import torch

    from optimized import launch, ops

    maps = []

    def encode(*key):
        launch.check_matrix_map(*key)
        maps.append(key)
        return launch.TensorMap(struct.pack("<Q", len(maps)) + bytes(120))
    clusters = _fake_wide_launch(monkeypatch, launch_log, "encode_block_map", encode)
    log = launch_log
    bf = torch.bfloat16
    x = torch.randn(32, 4096 + 64).to(bf)[:, :4096]                   # rows 4160 elements apart
    w = torch.randn(6144, 4096).to(bf)
    y = ops.gemm(x, w)                                                # 192 tiles of 32 rows, two CTAs an SM
    mod, name, grid, block, args, smem, per_sm = log[-1]
    assert y.shape == (32, 6144) and y.dtype == bf
    assert (mod, name, grid, block, per_sm) == ("gemm", "gemm_wide_m32_n32_k256s3_bf16", (192, 1, 1), (160, 1, 1), 2)
    assert smem == 1024 + 3 * (32 + 32) * 256 * 2 == ops.gemm_wide_smem(32, 32, 256, 3)
    assert maps == [(w.data_ptr(), 6144, 4096, 8192, 256, 32), (x.data_ptr(), 32, 4096, 8320, 256, 32)]
    assert [type(a) for a in args[:2]] == [launch.TensorMap] * 2 and args[:2] == tuple(ops._tensor_maps.values())
    assert int(args[2]) == y.data_ptr() and [int(a) for a in args[3:]] == [32, 6144, 4096, 3, 1]   # M N K pre trigger
    y = ops.gemm(torch.randn(64, 1024).to(bf), torch.randn(151936, 1024).to(bf), out_dtype=torch.float32)
    assert y.dtype == torch.float32 and log[-1][1:4] == ("gemm_wide_m64_n64_k256s3w8_f32", (132, 1, 1), (288, 1, 1))
    assert log[-1][5:] == (ops.gemm_wide_smem(64, 64, 256, 3), 1) and maps[-1][1] == 64 and maps[-2][-1] == 64
    ops.gemm(torch.randn(64, 2048).to(bf), torch.randn(1024, 2048).to(bf))   # 32 tiles: one CTA an SM, asked for
    assert log[-1][1:4] == ("gemm_wide_m64_n32_k256s2w8_bf16", (32, 1, 1), (288, 1, 1))
    assert ops.gemm_wide_smem(64, 32, 256, 2) < log[-1][5] == ops.GEMM_WIDE_ONE_CTA_SMEM and log[-1][6] == 2
    ops.gemm(torch.randn(80, 1024).to(bf), torch.randn(6144, 1024).to(bf))
    assert log[-1][1:4] == ("gemm_wide_m128_n64_k128s4w16_bf16", (96, 1, 1), (544, 1, 1)) and maps[-1][-2:] == (128, 128)
    ops.gemm(torch.randn(3, 1024).to(bf), torch.randn(256, 1024).to(bf), tile="wide_m16_n64_k512s2")
    assert log[-1][1:4] == ("gemm_wide_m16_n64_k512s2_bf16", (4, 1, 1), (160, 1, 1))
    assert maps[-1][1:] == (3, 1024, 2048, 512, 16)                  # x: M rows; the box: the kernel's 16
    n, m = len(log), len(maps)
    for bad in (dict(x=torch.randn(33, 1024).to(bf), w=torch.randn(64, 1024).to(bf), tile="wide_m32_n32_k256s3"),
                dict(x=torch.randn(8, 1032).to(bf), w=torch.randn(64, 1032).to(bf), tile="wide_m16_n64_k256s4"),
                dict(x=torch.randn(8, 1024).to(bf), w=torch.randn(63, 1024).to(bf), tile="wide_m16_n64_k256s4")):
        with pytest.raises(ValueError):
            ops.gemm(bad.pop("x"), bad.pop("w"), **bad)
    clusters[0] = False                                               # no driver path: no tensor maps
    with pytest.raises(ValueError, match="driver"):
        ops.gemm(torch.randn(8, 1024).to(bf), torch.randn(64, 1024).to(bf), tile="wide_m16_n64_k256s4")
    assert len(log) == n and len(maps) == m
    ops.gemm(x, w)                                                    # the rule without the wide kernel
    assert log[-1][1] == "gemm_split_64x64_bf16" and len(maps) == m
    ops.gemm(torch.randn(3, 2048).to(bf), torch.randn(6144, 2048).to(bf))
    assert log[-1][1] == "gemm_staged_m8_s4c2_bf16" and len(maps) == m


def test_gemm_swiglu_launch_and_rejects_bad_input(launch_log, monkeypatch):
    """``ops.gemm(..., swiglu=True)`` on the CPU with ``_launch`` recorded and the tensor maps' encoding faked: on a
    wide tile, the ``_swiglu`` kernel with ``launch.encode_swiglu_map``'s 5-D map of ``[gate | up]`` (boxes of the
    tile's rows: 8 gate rows, 8 up rows, ..), I output columns, tiles of half the tile's rows, ``pre`` (by default the
    build's stages for a weight of ``GEMM_WIDE_PRE_MIN_ELEMS`` or more, none below) and ``trigger`` (0, the next
    kernel scheduled as the CTAs exit, up to ``GEMM_SWIGLU_LATE_MAX_M`` rows); elsewhere (more than 128 rows, no driver
    path) the GEMM and ``silu_mul``, two launches. An fp32 output, w's rows not 2 I with I % 8 == 0, a negative
    ``pre``, or more rows than a forced tile takes is a ValueError that launches nothing and encodes no map."""
    import struct

    import torch

    from optimized import launch, ops

    maps = []

    def encode(addr, dims, strides, box):
        maps.append((addr, dims, strides, box))
        return launch.TensorMap(struct.pack("<Q", len(maps)) + bytes(120))
    clusters = _fake_wide_launch(monkeypatch, launch_log, "encode_tiled_map", encode)
    log = launch_log
    bf = torch.bfloat16
    x = torch.randn(32, 4096).to(bf)
    w = torch.randn(2 * 12288, 4096).to(bf)                           # the 8B gate/up weight
    y = ops.gemm(x, w, swiglu=True)
    mod, name, grid, block, args, smem, per_sm = log[-1]
    assert y.shape == (32, 12288) and y.dtype == bf and int(args[2]) == y.data_ptr()
    assert ops.gemm_choice(32, 24576, 4096) == "wide_m32_n64_k256s4"
    assert (mod, name, grid, block, per_sm) == ("gemm", "gemm_wide_m32_n64_k256s4_swiglu", (132, 1, 1), (160, 1, 1), 1)
    assert smem == ops.gemm_wide_smem(32, 64, 256, 4) and [int(a) for a in args[3:]] == [32, 12288, 4096, 4, 1]
    row = 2 * 4096                                                     # (64 columns, 8 rows, gate | up, groups, blocks)
    assert maps[0] == (w.data_ptr(), (64, 8, 2, 12288 // 8, 64), (row, 12288 * row, 8 * row, 128), (64, 8, 2, 4, 4))
    assert maps[1] == (x.data_ptr(), (64, 32, 64), (row, 128), (64, 32, 4))
    ops.gemm(torch.randn(5, 4096).to(bf), w, swiglu=True)                    # 5 rows: the down GEMM waits for the exit
    assert [int(a) for a in log[-1][4][3:]] == [5, 12288, 4096, 4, 0]
    ops.gemm(torch.randn(5, 1024).to(bf), torch.randn(6144, 1024).to(bf))    # 6.3M elements: no weights before the wait
    assert log[-1][1] == "gemm_wide_m16_n64_k256s4_bf16" and [int(a) for a in log[-1][4][3:]] == [5, 6144, 1024, 0, 1]
    w06, m0 = torch.randn(6144, 1024).to(bf), len(maps)
    ops.gemm(torch.randn(5, 1024).to(bf), w06, swiglu=True, pre=0)                   # 0.6B, 5 rows
    assert log[-1][1:4] == ("gemm_wide_m16_n64_k256s4_swiglu", (96, 1, 1), (160, 1, 1))         # 3072 / 32 tiles
    assert [int(a) for a in log[-1][4][3:]] == [5, 3072, 1024, 0, 0]
    assert (w06.data_ptr(), (64, 8, 2, 4, 4)) in [(m[0], m[3]) for m in maps[m0:]]   # (x's map may be a cached one)
    n = len(log)
    y = ops.gemm(torch.randn(200, 1024).to(bf), torch.randn(6144, 1024).to(bf), swiglu=True)   # > 128 rows
    assert y.shape == (200, 3072) and [r[1] for r in log[n:]] == ["gemm_64x64_bf16", "silu_mul"]
    n, m = len(log), len(maps)
    for bad in (dict(x=x, w=w, swiglu=True, out_dtype=torch.float32),
                dict(x=x, w=torch.randn(24, 4096).to(bf), swiglu=True),             # I = 12
                dict(x=x, w=w, swiglu=True, pre=-1),
                dict(x=x, w=w, pre=True),
                dict(x=torch.randn(33, 4096).to(bf), w=w, swiglu=True, tile="wide_m32_n64_k256s4"),
                dict(x=x, w=w, swiglu=True, out=torch.empty(32, 24576, dtype=bf))):     # out: [M, I]
        with pytest.raises(ValueError):
            ops.gemm(bad.pop("x"), bad.pop("w"), **bad)
    assert len(log) == n and len(maps) == m
    clusters[0] = False                                               # no driver path: the two launches
    out = torch.empty(32, 12288, dtype=bf)
    assert ops.gemm(x, w, swiglu=True, out=out) is out and len(maps) == m
    assert [r[1] for r in log[n:]] == ["gemm_split_64x64_bf16", "silu_mul"]


def test_skinny_staged_launch_and_rejects_bad_input(launch_log, monkeypatch):
    """``ops.skinny_staged`` on the CPU with ``_launch`` recorded: the kernel (chunk, stages, producer lanes,
    output kind; for 9-32 rows tiles a stage and row width), a persistent grid of CTAs-per-SM x SMs capped at
    the units, 160 threads, the stages' dynamic shared memory, the kernel's N (I with SwiGLU) and the
    early-stage count; every built configuration has its kernels; bad input is a ValueError that launches
    nothing."""
    import torch

    from optimized import kernels, ops

    monkeypatch.setattr(ops, "_device_index", lambda t: 0)
    monkeypatch.setattr(ops, "_num_sms", lambda dev: 132)
    monkeypatch.setattr(ops, "_kernel_tickets", lambda ref: torch.zeros(ops._TICKETS, dtype=torch.int32))
    monkeypatch.setattr(ops, "_launch", lambda ref, module, name, grid, block, args, smem=0, ctas_per_sm=None:
                        launch_log.append((module, name, grid, block, args, smem)))
    log = launch_log
    bf = torch.bfloat16
    x = torch.randn(3, 4096).to(bf)
    out = ops.skinny_staged(x, torch.randn(6144, 4096).to(bf))
    mod, name, grid, block, args, smem = log[-1]
    assert out.shape == (3, 6144) and out.dtype == bf
    assert (mod, name, grid, block) == ("skinny_gemm", "skinny_staged_k1024s3p16_bf16", (264, 1, 1), (160, 1, 1))
    assert smem == 3 * 16 * (2 * 1024 + 64) == ops.skinny_staged_smem(1024, 3)
    assert [int(a) for a in args[4:7]] == [3, 6144, 4096] and int(args[8]) == 3        # M, N, K; pre = stages
    assert int(args[9]) == 1                                                            # evict-first copies
    ops.skinny_staged(x, torch.randn(64, 4096).to(bf), kc=2048, stages=2, ctas_per_sm=1, evict_first=False)
    assert log[-1][1:3] == ("skinny_staged_k2048s2p16_bf16", (4, 1, 1)) and int(log[-1][4][8]) == 2   # 4 tiles
    assert int(log[-1][4][9]) == 0
    out = ops.skinny_staged(x, torch.randn(2 * 8 * 300, 4096).to(bf), swiglu=True, kc=512, stages=4, ctas_per_sm=2,
                            pre=0)
    mod, name, grid, block, args, smem = log[-1]
    assert out.shape == (3, 2400) and name == "skinny_staged_k512s4p16_swiglu"
    assert grid == (264, 1, 1) and int(args[5]) == 2400 and int(args[8]) == 0        # 2 x 132 CTAs < 300 tiles; I
    out = ops.skinny_staged(x[:1], torch.randn(100, 4096).to(bf), out_dtype=torch.float32, kc=1024, stages=3,
                            ctas_per_sm=2)
    assert out.dtype == torch.float32 and log[-1][1] == "skinny_staged_k1024s3p16_f32" and log[-1][2] == (7, 1, 1)
    # 9-16 rows and 17-32 rows: the wide kernels, named by (kc, stages, lanes, tp) and the row width; with tp = 2
    # the grid is capped at the units of two tiles
    x16, x32 = torch.randn(16, 4096).to(bf), torch.randn(17, 4096).to(bf)
    ops.skinny_staged(x16, torch.randn(6144, 4096).to(bf))          # kc, stages: the width's first configuration
    assert log[-1][1:3] == ("skinny_staged_k512s3p16t1_m16_bf16", (264, 1, 1)) and int(log[-1][4][4]) == 16
    assert log[-1][5] == 3 * 16 * (2 * 512 + 64) and int(log[-1][4][8]) == 3                          # pre = stages
    out = ops.skinny_staged(x32, torch.randn(2 * 8 * 300, 4096).to(bf), swiglu=True, kc=512, stages=2, tp=2)
    mod, name, grid, block, args, smem = log[-1]
    assert out.shape == (17, 2400) and name == "skinny_staged_k512s2p16t2_m32_swiglu" and grid == (150, 1, 1)
    assert smem == 2 * 32 * (2 * 512 + 64) == ops.skinny_staged_smem(512, 2, 2) and int(args[4]) == 17
    ops.skinny_staged(x32[:9], torch.randn(100, 4096).to(bf), out_dtype=torch.float32, kc=512, stages=4)
    assert log[-1][1:3] == ("skinny_staged_k512s4p16t1_m16_f32", (7, 1, 1))
    ops.skinny_staged(x32, torch.randn(100, 4096).to(bf), ctas_per_sm=3)
    assert log[-1][1:3] == ("skinny_staged_k512s3p16t1_m32_bf16", (7, 1, 1))
    names = set(kernels.SOURCES["skinny_gemm"])
    for kc, S, pl in ops.SKINNY_STAGED_CONFIGS:
        assert {f"skinny_staged_k{kc}s{S}p{pl}_{kind}" for kind in ("bf16", "f32", "swiglu")} <= names
    for rows, built in ops.SKINNY_STAGED_WIDE.items():
        for kc, S, pl, tp in built:
            assert {f"skinny_staged_k{kc}s{S}p{pl}t{tp}_m{rows}_{kind}" for kind in ("bf16", "f32", "swiglu")} <= names
    wide = sum(len(b) for b in ops.SKINNY_STAGED_WIDE.values())
    assert sum(n.startswith("skinny_staged") for n in names) == 3 * (len(ops.SKINNY_STAGED_CONFIGS) + wide)
    assert [ops.skinny_staged_rows(m) for m in (1, 8, 9, 16, 17, 32)] == [8, 8, 16, 16, 32, 32]
    n = len(log)
    for kw, bx, bw in ((dict(), torch.randn(33, 64).to(bf), torch.randn(32, 64).to(bf)),      # more than 32 rows
                       (dict(tp=2), x, torch.randn(32, 4096).to(bf)),                          # tp = 2 needs > 8 rows
                       (dict(tp=3, kc=512, stages=2), x32, torch.randn(32, 4096).to(bf)),      # no such tp
                       (dict(kc=2048, stages=2), x16, torch.randn(32, 4096).to(bf)),           # not built for 16
                       (dict(kc=1024, stages=3, tp=1), x32, torch.randn(32, 4096).to(bf)),     # not built for 32
                       (dict(stages=5), x, torch.randn(32, 4096).to(bf)),                      # no such kernel
                       (dict(kc=256), x, torch.randn(32, 4096).to(bf)),
                       (dict(lanes=1), x, torch.randn(32, 4096).to(bf)),
                       (dict(ctas_per_sm=0), x, torch.randn(32, 4096).to(bf)),
                       (dict(pre=-1), x, torch.randn(32, 4096).to(bf)),
                       (dict(evict_first=1), x, torch.randn(32, 4096).to(bf)),                # a bool, not an int
                       (dict(swiglu=True), x, torch.randn(40, 4096).to(bf)),                   # I not a multiple of 8
                       (dict(swiglu=True, out_dtype=torch.float32), x, torch.randn(48, 4096).to(bf)),
                       (dict(), x, torch.randn(48, 2048).to(bf)),                              # K differs
                       (dict(), torch.randn(3, 60).to(bf), torch.randn(48, 60).to(bf))):       # K % 8
        with pytest.raises(ValueError):
            ops.skinny_staged(bx, bw, **kw)
    assert len(log) == n


def test_skinny_cluster_launch_and_rejects_bad_input(launch_log, monkeypatch):
    """``ops.skinny_cluster`` on the CPU with ``_launch`` recorded: the kernel (chunk, stages, tiles a unit,
    cluster, output kind), whole clusters of at most one CTA a unit and at most the clusters the device holds
    (the driver's occupancy query, asked once per kernel), 160 threads, 1 KB + the stages' dynamic shared memory,
    clusters along x; the tensor maps of w (8-row boxes) and x (64 / cluster rows, its row stride), encoded once
    per operand; every built configuration has its kernels; bad input -- K not a multiple of 64, no cluster launch
    path -- is a ValueError that launches nothing."""
    import torch

    from optimized import kernels, launch, ops

    import contextlib
    import sys
    import types

    queries, maps = [], []
    fake_cupy = types.SimpleNamespace(cuda=types.SimpleNamespace(Device=lambda dev: contextlib.nullcontext()))
    monkeypatch.setitem(sys.modules, "cupy", fake_cupy)              # (the occupancy query sets the device first)
    monkeypatch.setattr(ops, "_device_index", lambda t: 0)
    monkeypatch.setattr(ops, "_clusters_ok", lambda ref: True)
    monkeypatch.setattr(ops, "_function", lambda dev, module, name, smem, ctas_per_sm=None: (None, 7))
    monkeypatch.setattr(ops, "_cluster_capacity", {})
    monkeypatch.setattr(ops, "_tensor_maps", {})
    monkeypatch.setattr(launch, "max_active_clusters",
                        lambda handle, block, smem, c: queries.append((handle, block, smem, c)) or 32)

    def encode(*key):
        launch.check_matrix_map(*key)
        maps.append(key)
        return launch.TensorMap(struct.pack("<Q", len(maps)) + bytes(120))
    monkeypatch.setattr(launch, "encode_matrix_map", encode)
    monkeypatch.setattr(ops, "_launch", lambda ref, module, name, grid, block, args, smem=0, ctas_per_sm=None,
                        cluster_x=1: launch_log.append((module, name, grid, block, args, smem, cluster_x)))
    log = launch_log
    bf = torch.bfloat16
    x = torch.randn(64, 1024).to(bf)
    w = torch.randn(4096, 1024).to(bf)
    out = ops.skinny_cluster(x, w)                                    # 256 tiles: 128 units of 2, 32 clusters of 4
    mod, name, grid, block, args, smem, cx = log[-1]
    assert out.shape == (64, 4096) and out.dtype == bf
    assert (mod, name, grid, block, cx) == ("skinny_gemm", "skinny_cluster_k256s3t2c4_m64_bf16", (128, 1, 1),
                                            (160, 1, 1), 4)
    assert smem == 1024 + 3 * (32 + 64) * 2 * 256 == ops.skinny_cluster_smem(256, 3, 2)
    assert maps == [(w.data_ptr(), 4096, 1024, 2048, 256, 8), (x.data_ptr(), 64, 1024, 2048, 256, 16)]
    assert [type(a) for a in args[:2]] == [launch.TensorMap] * 2 and args[:2] == tuple(ops._tensor_maps.values())
    assert int(args[2]) == out.data_ptr() and [int(a) for a in args[3:]] == [64, 4096, 1024, 3, 1]   # M N K pre evict
    assert queries == [(7, (160, 1, 1), smem, 4)]
    xs = torch.randn(20, 2056).to(bf)[:, :2048]                       # rows 2056 elements apart
    ops.skinny_cluster(xs, torch.randn(1024, 2048).to(bf), stages=5, tp=1, pre=2, evict_first=False)   # 64 units
    assert log[-1][1:3] == ("skinny_cluster_k256s5t1c4_m64_bf16", (64, 1, 1))
    assert [int(a) for a in log[-1][4][3:8]] == [20, 1024, 2048, 2, 0]
    assert maps[-1] == (xs.data_ptr(), 20, 2048, 2 * 2056, 256, 16)
    out = ops.skinny_cluster(x[:33], torch.randn(2 * 3072, 1024).to(bf), swiglu=True)   # 384 tiles: more than held
    assert out.shape == (33, 3072) and log[-1][1:3] == ("skinny_cluster_k256s3t2c4_m64_swiglu", (128, 1, 1))
    assert maps[-2][1:] == (2 * 3072, 1024, 2048, 256, 8)            # the weight map spans gate and up
    ops.skinny_cluster(x[:17], torch.randn(24, 1024).to(bf), out_dtype=torch.float32, stages=4)   # one cluster
    assert log[-1][1:3] == ("skinny_cluster_k256s4t2c4_m64_f32", (4, 1, 1))
    ops.skinny_cluster(x, torch.randn(4096, 1024).to(bf), kc=512, stages=2, warps=8)   # eight consumer warps
    assert log[-1][1:4] == ("skinny_cluster_k512s2t2c4w8_m64_bf16", (128, 1, 1), (288, 1, 1))
    assert queries[-1][1:] == ((288, 1, 1), ops.skinny_cluster_smem(512, 2, 2), 4)
    assert len(queries) == 5                                           # once per kernel (name and smem)
    n_maps = len(maps)
    ops.skinny_cluster(x, w)
    assert len(queries) == 5 and len(maps) == n_maps                   # the same operands: the maps cached
    assert [ops.skinny_cluster_grid(u, 4, 32) for u in (1, 4, 5, 128, 129, 1000)] == [4, 4, 8, 128, 128, 128]
    names = set(kernels.SOURCES["skinny_gemm"])
    for kc, S, tp, c in ops.SKINNY_CLUSTER_CONFIGS:
        assert {f"skinny_cluster_k{kc}s{S}t{tp}c{c}_m64_{kind}" for kind in ("bf16", "f32", "swiglu")} <= names
        # beside the fold's static tp x 16 KB and the barriers, under the 227 KB a CTA may have, less 1 KB reserved
        assert ops.skinny_cluster_smem(kc, S, tp) + tp * 16384 + 128 <= 226 * 1024
    for kc, S, tp, c in ops.SKINNY_CLUSTER_W8:
        assert {f"skinny_cluster_k{kc}s{S}t{tp}c{c}w8_m64_{kind}" for kind in ("bf16", "f32", "swiglu")} <= names
    assert sum(n.startswith("skinny_cluster") for n in names) == 3 * (len(ops.SKINNY_CLUSTER_CONFIGS)
                                                                      + len(ops.SKINNY_CLUSTER_W8))
    n = len(log)
    w = torch.randn(32, 1024).to(bf)
    for kw, bx, bw in ((dict(), torch.randn(65, 1024).to(bf), w),                  # more than 64 rows
                       (dict(kc=512), x, w), (dict(stages=6), x, w), (dict(tp=3), x, w), (dict(cluster=2), x, w),
                       (dict(pre=-1), x, w), (dict(pre=True), x, w),
                       (dict(warps=8), x, w), (dict(warps=6, stages=4), x, w), (dict(warps=True), x, w),
                       (dict(evict_first=1), x, w),                                 # a bool, not an int
                       (dict(swiglu=True), x, torch.randn(40, 1024).to(bf)),         # I not a multiple of 8
                       (dict(swiglu=True, out_dtype=torch.float32), x, torch.randn(48, 1024).to(bf)),
                       (dict(), x, torch.randn(48, 2048).to(bf)),                    # K differs
                       (dict(), torch.randn(20, 1000).to(bf), torch.randn(48, 1000).to(bf)),   # K % 64
                       (dict(), torch.randn(20, 60).to(bf), torch.randn(48, 60).to(bf))):   # K % 8
        with pytest.raises(ValueError):
            ops.skinny_cluster(bx, bw, **kw)
    monkeypatch.setattr(ops, "_clusters_ok", lambda ref: False)
    with pytest.raises(ValueError, match="cluster"):
        ops.skinny_cluster(x, w)
    assert len(log) == n


@pytest.fixture
def wg_launch(launch_log, monkeypatch):
    """``ops.skinny_wg`` on the CPU with ``_launch`` recorded: a compute-capability-9.0 device of 132
    multiprocessors with the sm_90a build and the driver's launch path, cluster occupancy queries and tensor-map
    encodings recorded. Yields (launch log, occupancy queries, maps)."""
    import contextlib
    import sys
    import types


    from optimized import kernels, launch, ops

    queries, maps = [], []
    fake_cupy = types.SimpleNamespace(cuda=types.SimpleNamespace(Device=lambda dev: contextlib.nullcontext()))
    monkeypatch.setitem(sys.modules, "cupy", fake_cupy)
    monkeypatch.setattr(ops, "_device_index", lambda t: 0)
    monkeypatch.setattr(ops, "_num_sms", lambda dev: 132)
    monkeypatch.setattr(ops, "_clusters_ok", lambda ref: True)
    monkeypatch.setattr(kernels, "target", lambda name, dev: "sm_90a" if name == "skinny_wg" else None)
    monkeypatch.setattr(ops, "_function", lambda dev, module, name, smem, ctas_per_sm=None: (None, 9))
    monkeypatch.setattr(ops, "_cluster_capacity", {})
    monkeypatch.setattr(ops, "_tensor_maps", {})
    monkeypatch.setattr(launch, "max_active_clusters",
                        lambda handle, block, smem, c: queries.append((handle, block, smem, c)) or 132 // c)

    def encoder(kind):
        def encode(*key):
            maps.append((kind,) + key)
            return launch.TensorMap(struct.pack("<Q", len(maps)) + bytes(120))
        return encode
    monkeypatch.setattr(launch, "encode_block_map", encoder("block"))
    monkeypatch.setattr(launch, "encode_swiglu_map", encoder("swiglu"))
    monkeypatch.setattr(ops, "_launch", lambda ref, module, name, grid, block, args, smem=0, ctas_per_sm=None,
                        cluster_x=1: launch_log.append((module, name, grid, block, args, smem, cluster_x, ctas_per_sm)))
    yield launch_log, queries, maps


def test_skinny_wg_launch_and_rejects_bad_input(wg_launch, monkeypatch):
    """``ops.skinny_wg`` on the CPU with ``_launch`` recorded: the kernel of ``skinny_wg_config`` (x tile 32 up to 32
    rows, else 64), 160 threads, its shared memory (stages and split-K landing area), clusters of ``kp`` along x,
    ``spread=True`` the ``_sp`` twin where ``skinny_wg_spreads`` (else the same kernel),
    a grid of at most one cluster a unit and at most one CTA a multiprocessor (``kp`` = 1) or the clusters the
    device holds (``kp`` > 1, asked once per kernel); the block maps of w and x (64 ``wt``-row and NX-row boxes of
    128 columns, x's row stride) and the SwiGLU map of ``[gate | up]``, cached; every built configuration has its
    kernels and fits 227 KB, the first of a (nx, wt, kp) its default and ``stages=4``'s small enough for two CTAs a
    multiprocessor; bad input -- more than 64 rows, an unbuilt (wt, kp) or stage count, K not a multiple of 64 kp (or of
    128 kp when split), a float32 SwiGLU, a non-bool spread, no driver launch path, a device without the sm_90a build -- is a
    ValueError that launches nothing."""
    import torch

    from optimized import kernels, launch, ops

    log, queries, maps = wg_launch
    bf = torch.bfloat16
    x = torch.randn(64, 1024 + 64).to(bf)[:, :1024]                   # rows 1088 elements apart
    w = torch.randn(24576, 1024).to(bf)
    out = ops.skinny_wg(x, w)                                         # 384 units of 64 rows, 132 CTAs
    mod, name, grid, block, args, smem, cx, _ = log[-1]
    assert out.shape == (64, 24576) and out.dtype == bf
    assert (mod, name, grid, block, cx) == ("skinny_wg", "skinny_wg_k128s6n64t1p1_bf16", (132, 1, 1), (160, 1, 1), 1)
    assert smem == 1024 + 6 * (64 + 64) * 128 * 2 == ops.skinny_wg_smem(128, 6, 64, 1, 1)
    assert maps == [("block", w.data_ptr(), 24576, 1024, 2048, 128, 64), ("block", x.data_ptr(), 64, 1024, 2176, 128, 64)]
    assert [type(a) for a in args[:2]] == [launch.TensorMap] * 2 and args[:2] == tuple(ops._tensor_maps.values())
    assert int(args[2]) == out.data_ptr() and [int(a) for a in args[3:8]] == [64, 24576, 1024, 6, 1]   # M N K pre evict
    assert [float(a) for a in args[8:]] == [0] * 6                    # no folded add_rmsnorm: null, zero
    assert queries == []                                               # no cluster: no occupancy query
    x2 = torch.randn(20, 2048).to(bf)
    ops.skinny_wg(x2, torch.randn(1024, 2048).to(bf), kp=8, pre=2, evict_first=False)   # 16 units, split 8 ways
    assert log[-1][1:3] == ("skinny_wg_k128s6n32t1p8_bf16", (128, 1, 1)) and log[-1][6] == 8
    assert log[-1][5] == 1024 + 6 * 96 * 256 + 7 * 64 * 32 * 4 == ops.skinny_wg_smem(128, 6, 32, 1, 8)
    assert [int(a) for a in log[-1][4][3:8]] == [20, 1024, 2048, 2, 0]
    assert queries == [(9, (160, 1, 1), log[-1][5], 8)]
    assert maps[-1] == ("block", x2.data_ptr(), 20, 2048, 4096, 128, 32)
    ops.skinny_wg(x2, torch.randn(1024, 2048).to(bf), kp=8, spread=True)   # 4 blocks of 8 x rows: not over 8 CTAs
    assert log[-1][1] == "skinny_wg_k128s6n32t1p8_bf16" and not ops.skinny_wg_spreads(32, 1, 8)
    ops.skinny_wg(x2, torch.randn(1024, 2048).to(bf), kp=4, spread=True)   # one block each: the _sp twin
    assert log[-1][1] == "skinny_wg_k128s8n32t1p4_bf16_sp" and [int(a) for a in log[-1][4][3:8]] == [20, 1024, 2048, 8, 1]
    assert log[-1][5] == 1024 + 8 * 96 * 256 + 3 * 2048 == ops.skinny_wg_smem(128, 8, 32, 1, 4, True)   # a share each
    ops.skinny_wg(x2, torch.randn(1024, 2048).to(bf), kp=4, spread=True, stages=4)   # 4 stages: two CTAs an SM
    assert log[-1][1] == "skinny_wg_k128s4n32t1p4_bf16_sp" and [int(a) for a in log[-1][4][3:8]] == [20, 1024, 2048, 4, 1]
    assert log[-1][5] == 1024 + 4 * 96 * 256 + 3 * 2048 and 2 * (log[-1][5] + 3 * 1024) <= 228 * 1024
    assert log[-1][7] == log[-2][7] == 2              # the carveout preference: two CTAs (capped at the largest)
    assert ops.skinny_wg_spreads(64, 1, 8) and ops.skinny_wg_spreads(32, 2, 8) and not ops.skinny_wg_spreads(32, 1, 1)
    out = ops.skinny_wg(x[:40], torch.randn(2 * 3072, 1024).to(bf), swiglu=True, wt=2)   # 48 units of 64 outputs
    assert out.shape == (40, 3072) and log[-1][1:3] == ("skinny_wg_k128s4n64t2p1_swiglu", (48, 1, 1))
    assert maps[-2][0] == "swiglu" and maps[-2][2:] == (3072, 1024, 128, 128)   # (half rows, K, box cols, box rows)
    ops.skinny_wg(x[:17], torch.randn(24, 1024).to(bf), out_dtype=torch.float32, kp=2)   # one unit: one cluster
    assert log[-1][1:3] == ("skinny_wg_k128s8n32t1p2_f32", (2, 1, 1))
    n_maps, n_q = len(maps), len(queries)
    ops.skinny_wg(x, w)
    assert len(maps) == n_maps and len(queries) == n_q                # the same operands: the maps cached
    names = set(kernels.SOURCES["skinny_wg"])
    for kc, S, nx, wt, kp in ops.SKINNY_WG_CONFIGS:
        assert {f"skinny_wg_k{kc}s{S}n{nx}t{wt}p{kp}_{kind}" for kind in ("bf16", "f32", "swiglu")} <= names
        assert ops.skinny_wg_smem(kc, S, nx, wt, kp) <= 227 * 1024 - 256   # skinny_wg.cu's static_assert
        assert ops.skinny_wg_config(nx, wt, kp, S) == (kc, S, nx, wt, kp)
        default = next(c for c in ops.SKINNY_WG_CONFIGS if c[2:] == (nx, wt, kp))   # the first listed
        assert ops.skinny_wg_config(nx, wt, kp) == default and ops.skinny_wg_config(nx, wt, kp, default[1]) == default
    for nx, kp in ((32, 1), (32, 4)):                               # stages=4: two CTAs a multiprocessor (spread
        smem = ops.skinny_wg_smem(128, 4, nx, 1, kp, ops.skinny_wg_spreads(nx, 1, kp))   # where split), with the
        assert 2 * (smem + 3 * 1024) <= 228 * 1024 and ops.skinny_wg_fold_ok(nx, kp, 4)   # static and reserved KB
    assert not ops.skinny_wg_fold_ok(32, 2, 4) and ops.skinny_wg_fold_ok(32, 2) and ops.skinny_wg_fold_ok(32, 2, 8)
    for kc, S, nx, kp in ops.SKINNY_WG_NORM_CONFIGS:                # the folded add_rmsnorm's kernels (wt 1)
        assert (kc, S, nx, 1, kp) in ops.SKINNY_WG_CONFIGS
        assert {f"skinny_wg_k{kc}s{S}n{nx}t1p{kp}_{kind}" for kind in ("res", "bf16n", "swiglun")} <= names
        assert ops.skinny_wg_smem(kc, S, nx, 1, kp) + 1024 <= 227 * 1024 - 256   # + its static sums of squares
    spreads = [c for c in ops.SKINNY_WG_CONFIGS if ops.skinny_wg_spreads(c[2], c[3], c[4])]   # their _sp twins
    spreads_norm = [c for c in ops.SKINNY_WG_NORM_CONFIGS if ops.skinny_wg_spreads(c[2], 1, c[3])]
    for kc, S, nx, wt, kp in spreads:
        assert {f"skinny_wg_k{kc}s{S}n{nx}t{wt}p{kp}_{kind}_sp" for kind in ("bf16", "f32", "swiglu")} <= names
    for kc, S, nx, kp in spreads_norm:
        assert {f"skinny_wg_k{kc}s{S}n{nx}t1p{kp}_{kind}_sp" for kind in ("res", "bf16n", "swiglun")} <= names
    assert len(names) == 3 * (len(ops.SKINNY_WG_CONFIGS) + len(ops.SKINNY_WG_NORM_CONFIGS) + len(spreads)
                              + len(spreads_norm))
    n = len(log)
    for kw, bx, bw in ((dict(), torch.randn(65, 1024).to(bf), w),                   # more than 64 rows
                       (dict(wt=3), x, w), (dict(kp=3), x, w), (dict(wt=2, kp=4), x, w),   # not built at 64 rows
                       (dict(pre=-1), x, w), (dict(pre=True), x, w), (dict(evict_first=1), x, w),
                       (dict(spread=1), x, w), (dict(stages=4), x, w), (dict(stages=5), x[:20], w),   # unbuilt stages
                       (dict(swiglu=True), x, torch.randn(40, 1024).to(bf)),         # I not a multiple of 8
                       (dict(swiglu=True, out_dtype=torch.float32), x, torch.randn(48, 1024).to(bf)),
                       (dict(), x, torch.randn(48, 2048).to(bf)),                    # K differs
                       (dict(), torch.randn(20, 1000).to(bf), torch.randn(48, 1000).to(bf)),   # K % 64
                       (dict(kp=8), torch.randn(20, 1536).to(bf), torch.randn(48, 1536).to(bf))):  # K % (128 kp)
        with pytest.raises(ValueError):
            ops.skinny_wg(bx, bw, **kw)
    monkeypatch.setattr(kernels, "target", lambda name, dev: None)
    with pytest.raises(ValueError, match="sm_90a"):
        ops.skinny_wg(x, w)
    monkeypatch.setattr(ops, "_clusters_ok", lambda ref: False)
    with pytest.raises(ValueError, match="launch path"):
        ops.skinny_wg(x, w)
    assert len(log) == n

def test_skinny_wg_folded_norm_arguments_and_rejects_bad_input(wg_launch):
    """``ops.skinny_wg``'s folded add_rmsnorm on the CPU with ``_launch`` recorded. ``residual=(stream, ssq,
    weight)``: the ``_res`` kernel writing into the stream in place, into ssq ``[N / 64, 64]`` and into a new xw
    ``[M, N]`` (returned). ``norm=(ssq, eps)``: the ``_bf16n`` / ``_swiglun`` kernel with the parts and eps.
    ``skinny_wg_fold_ok``: the configurations built (``SKINNY_WG_NORM_CONFIGS``). Bad input -- both at once, wt 2,
    an unbuilt split, float32 or out=, a SwiGLU residual epilogue, a stream, ssq or weight of the wrong shape,
    dtype or layout, an ssq of other parts than K / 64 -- is a ValueError that launches nothing and writes
    nothing."""
    import torch

    from optimized import ops

    log, _, _ = wg_launch
    bf = torch.bfloat16
    o, wo = torch.randn(32, 2048).to(bf), torch.randn(1024, 2048).to(bf)    # o_proj at qwen3-0.6b's shape
    res, nw = torch.randn(32, 1024).to(bf), torch.randn(1024).to(bf)
    ssq = ops.skinny_wg_ssq(1024, o)
    assert ssq.shape == (16, 64) and ssq.dtype == torch.float32
    xw = ops.skinny_wg(o, wo, kp=4, residual=(res, ssq, nw))
    assert xw.shape == (32, 1024) and xw.dtype == bf and xw.data_ptr() not in (res.data_ptr(), ssq.data_ptr())
    _, name, grid, _, args, _, cx, _ = log[-1]
    assert (name, grid, cx) == ("skinny_wg_k128s8n32t1p4_res", (64, 1, 1), 4)
    assert int(args[2]) == res.data_ptr() and [int(a) for a in args[3:8]] == [32, 1024, 2048, 8, 1]
    assert [int(a) for a in args[8:13]] == [0, ssq.data_ptr(), nw.data_ptr(), xw.data_ptr(), 0]
    wgu = torch.randn(2 * 3072, 1024).to(bf)
    out = ops.skinny_wg(xw, wgu, swiglu=True, norm=(ssq, 1e-6))               # gate/up
    _, name, grid, _, args, _, _, _ = log[-1]
    assert out.shape == (32, 3072) and (name, grid) == ("skinny_wg_k128s8n32t1p1_swiglun", (96, 1, 1))
    assert [int(a) for a in args[8:13]] == [ssq.data_ptr(), 0, 0, 0, 16] and float(args[13]) == np.float32(1e-6)
    ops.skinny_wg(xw[:20], torch.randn(4096, 1024).to(bf), kp=2, norm=(ssq, 1e-6))   # qkv, 20 rows, split 2
    assert log[-1][1] == "skinny_wg_k128s8n32t1p2_bf16n"
    assert ops.skinny_wg_fold_ok(64, 4) and ops.skinny_wg_fold_ok(17, 8) and not ops.skinny_wg_fold_ok(64, 8)
    assert not ops.skinny_wg_fold_ok(65, 1) and not ops.skinny_wg_fold_ok(32, 3)
    ssq.fill_(1.0)                                                          # (the recorded launches wrote nothing)
    before, snap, ssq_snap = len(log), res.clone(), ssq.clone()
    x = torch.randn(32, 1024).to(bf)
    for kw in (dict(residual=(res, ssq, nw), norm=(ssq, 1e-6)),            # both at once
               dict(wt=2, norm=(ssq, 1e-6)), dict(out_dtype=torch.float32, norm=(ssq, 1e-6)),
               dict(out=torch.empty(32, 4096, dtype=bf), norm=(ssq, 1e-6)),
               dict(norm=(ssq,)), dict(norm=(ssq[:, :32].contiguous(), 1e-6)), dict(norm=(ssq.to(bf), 1e-6)),
               dict(norm=(ssq[:8], 1e-6)), dict(norm=(ssq.t(), 1e-6)), dict(residual=(res, ssq))):
        with pytest.raises(ValueError):
            ops.skinny_wg(x, torch.randn(4096, 1024).to(bf), **kw)
    with pytest.raises(ValueError):                                         # 40 rows split 8: not built
        ops.skinny_wg(torch.randn(40, 2048).to(bf), wo, kp=8, residual=(torch.randn(40, 1024).to(bf), ssq, nw))
    for kw, w in ((dict(residual=(res, ssq, nw), swiglu=True), torch.randn(2048, 2048).to(bf)),
                  (dict(residual=(res[:, :512], ssq, nw)), wo),              # not [M, N]
                  (dict(residual=(res.float(), ssq, nw)), wo),
                  (dict(residual=(torch.randn(1024, 32).to(bf).t(), ssq, nw)), wo),   # strided
                  (dict(residual=(res, ssq[:8], nw)), wo), (dict(residual=(res, ssq.double(), nw)), wo),
                  (dict(residual=(res, ssq, nw[:512])), wo), (dict(residual=(res, ssq, nw.float())), wo)):
        with pytest.raises(ValueError):
            ops.skinny_wg(o, w, kp=4, **kw)
    assert len(log) == before and torch.equal(res, snap) and torch.equal(ssq, ssq_snap)


def test_skinny_wg_split_rule_at_the_measured_shapes():
    """``ops.skinny_wg_split``: the fewest CTAs splitting K that put the units on 64 CTAs (weights under 16 MB) or 128
    (from 16 MB), as measured on the H200 at the qwen3 shapes (docs/performance/gemm.md, "The warpgroup GEMM"), and no
    more than K takes."""
    from optimized import ops

    want = {  # (N, K, swiglu): kp -- qwen3-8b's qkv, o_proj, gate_up, down, LM head, then qwen3-0.6b's
        (6144, 4096, False): 2, (4096, 4096, False): 2, (24576, 4096, True): 1, (4096, 12288, False): 2,
        (151936, 4096, False): 1,
        (4096, 1024, False): 1, (1024, 2048, False): 4, (6144, 1024, True): 1, (1024, 3072, False): 4,
        (151936, 1024, False): 1}
    assert {k: ops.skinny_wg_split(*k) for k in want} == want
    assert ops.skinny_wg_split(64, 8192) == 8            # one unit: at most 8 CTAs ...
    assert ops.skinny_wg_split(64, 1536) == 4            # ... and no more than K takes (1536 / 8 % 128 != 0)
    assert ops.skinny_wg_split(64, 64) == 1

def test_tensor_maps_pack_at_64_bytes_and_bad_matrices_are_value_errors():
    """``pack_params``: a ``TensorMap``'s 128 bytes at the next multiple of 64 after the scalars before it, the
    scalars after it in 8-byte slots; a tensor map is exactly 128 bytes. ``check_matrix_map`` (what
    ``encode_matrix_map`` asks before the driver): K and the box's columns multiples of 64, at most 256 blocks and
    rows a box, 16-byte alignment and row strides of at least a row."""
    tm = launch.TensorMap(bytes(range(128)))
    raw, offs = launch.pack_params((np.uint64(5), tm, np.int32(-1), tm))
    assert offs == [0, 64, 192, 256] and len(raw) == 384
    assert raw[64:192] == bytes(range(128)) and raw[256:] == bytes(range(128)) and raw[8:64] == bytes(56)
    assert struct.unpack_from("<i", raw, 192)[0] == -1
    with pytest.raises(ValueError, match="128"):
        launch.TensorMap(bytes(64))
    launch.check_matrix_map(1 << 20, 4096, 1024, 2048, 256, 8)
    for bad in ((1 << 20, 4096, 1000, 2000, 256, 8), (1 << 20, 4096, 1024, 2048, 96, 8),
                (1 << 20, 4096, 1024, 2048, 256, 300), (1 << 20 | 8, 4096, 1024, 2048, 256, 8),
                (1 << 20, 4096, 1024, 2056, 256, 8), (1 << 20, 4096, 1024, 1024, 256, 8),
                (1 << 20, 0, 1024, 2048, 256, 8), (1 << 20, 4096, 1024, 2048, 256, True)):
        with pytest.raises(ValueError):
            launch.check_matrix_map(*bad)


def test_sample_launches_partials_then_rows_and_rejects_bad_input(launch_log):
    """``ops.sample`` on the CPU with ``_launch`` recorded: ``sample_partial`` over (chunks, rows), then
    ``sample`` over the rows with the same partials buffer and its chunk count; bad input launches nothing."""
    import torch

    from optimized import ops
    from reference import SamplingParams

    log = launch_log
    B, V = 3, 151936
    logits = torch.randn(B, V)
    pk = ops.pack_sampling_params([SamplingParams(temperature=1.0)] * B, [5, 6, 7], "cpu")
    toks, lps = ops.sample(logits, **pk)
    assert toks.shape == (B,) and toks.dtype == torch.int32 and lps.dtype == torch.float32
    (m1, n1, g1, b1, a1, *_), (m2, n2, g2, b2, a2, *_) = log
    C = ops.sample_chunks(V)
    assert (m1, n1, g1, b1) == ("sampling", "sample_partial", (C, B, 1), (ops.SAMPLE_PARTIAL_THREADS, 1, 1))
    assert (m2, n2, g2, b2) == ("sampling", "sample", (B, 1, 1), (1024, 1, 1))
    assert a1[:10] == a2[:10] and int(a1[10]) == int(a2[10]) != 0      # same row arguments, same partials
    assert int(a1[11]) == int(a2[11]) != 0 and int(a1[11]) != int(a1[10])   # same candidates buffer
    assert int(a2[12]) == C and int(a1[1]) == V and int(a1[2]) == V     # C; row stride and V
    n = len(log)
    for bad in (logits.double(), logits[:, ::2], torch.randn(B, V)[:2]):
        with pytest.raises((ValueError, TypeError)):
            ops.sample(bad, **pk)
    with pytest.raises(ValueError, match="rows per call"):
        big = ops.pack_sampling_params([SamplingParams()] * (ops.SAMPLE_MAX_ROWS + 1), [0] * (ops.SAMPLE_MAX_ROWS + 1), "cpu")
        ops.sample(torch.zeros(ops.SAMPLE_MAX_ROWS + 1, 4), **big)
    assert len(log) == n


def test_embed_rmsnorm_launches_one_cta_per_row_and_rejects_bad_input(launch_log):
    """``ops.embed_rmsnorm`` on the CPU with ``_launch`` recorded: one launch of ``embed_rmsnorm``, a CTA per
    id with ``rmsnorm``'s thread count, the two outputs' pointers in its arguments; bad input launches nothing."""
    import torch

    from optimized import ops

    log = launch_log
    bf = torch.bfloat16
    table, w, ids = torch.randn(50, 4096).to(bf), torch.rand(4096).to(bf), torch.tensor([3, 7, 1], dtype=torch.int32)
    resid, normed = ops.embed_rmsnorm(ids, table, w, 1e-6)
    assert resid.shape == normed.shape == (3, 4096) and resid.dtype == normed.dtype == bf
    (module, name, grid, block, args, *_), = log
    assert (module, name, grid, block) == ("rmsnorm", "embed_rmsnorm", (3, 1, 1), (ops._norm_threads(4096), 1, 1))
    assert [int(a) for a in args[:6]] == [ids.data_ptr(), table.data_ptr(), 50, resid.data_ptr(), w.data_ptr(),
                                          normed.data_ptr()] and int(args[6]) == 4096
    for bad in ((ids.long(), table, w), (ids, table.float(), w), (ids, table, w[:64]), (ids, table[:, :4092], w[:4092])):
        with pytest.raises((ValueError, TypeError)):
            ops.embed_rmsnorm(*bad, 1e-6)
    assert len(log) == 1


def test_split_kv_decode_launches_once_with_one_split_at_any_batch(launch_log, monkeypatch):
    """``ops.split_kv_decode``'s default launch mode: one launch (the reduce fused in) up to
    ``FUSED_DECODE_MAX_B`` rows or with one split per sequence; partials + reduce with several splits
    past that many rows. A one-split launch takes no tickets, so any batch may use it."""
    import torch

    from optimized import ops

    log = launch_log
    monkeypatch.setattr(ops, "_kernel_tickets", lambda ref: torch.zeros(ops._TICKETS, dtype=torch.int32))
    n_q, n_kv, D, bs = 8, 2, 64, 16
    kc = torch.zeros(64, bs, n_kv, D, dtype=torch.bfloat16)
    for B, max_splits, kernels in ((4, 3, ["split_kv_partials_d64"]),
                                   (40, 1, ["split_kv_partials_d64"]),
                                   (40, 3, ["split_kv_partials_d64", "split_kv_reduce"])):
        q = torch.zeros(B, n_q, D, dtype=torch.bfloat16)
        tables = torch.zeros(B, 4, dtype=torch.int32)
        lens = torch.full((B,), 40, dtype=torch.int32)
        del log[:]
        out = ops.split_kv_decode(q, kc, kc, tables, lens, 16 if max_splits > 1 else 64, max_splits=max_splits)
        assert out.shape == (B, n_q, D) and [name for _, name, *_ in log] == kernels, (B, max_splits)
        assert log[0][2] == (max_splits, n_kv, B)                          # grid: (splits, KV heads, rows)
    q = torch.zeros(ops._TICKETS // n_kv + 1, n_q, D, dtype=torch.bfloat16)   # more (row, head) pairs than tickets
    tables = torch.zeros(q.shape[0], 4, dtype=torch.int32)
    lens = torch.full((q.shape[0],), 40, dtype=torch.int32)
    del log[:]
    ops.split_kv_decode(q, kc, kc, tables, lens, None)                   # one split: fused, no ticket needed
    assert [name for _, name, *_ in log] == ["split_kv_partials_d64"]
    with pytest.raises(ValueError, match="ticket array"):
        ops.split_kv_decode(q, kc, kc, tables, lens, 16, max_splits=3, fused=True)


def test_qk_norm_rope_passes_trigger_first_last_and_rejects_a_non_bool(launch_log):
    """``ops.qk_norm_rope``'s ``trigger_first`` is the launch's last argument (1 / 0; the kernel then lets the
    next launch be scheduled before its own wait); anything but a bool is a TypeError that launches nothing."""
    import torch

    from optimized import ops

    log = launch_log
    T, n_q, n_kv, D = 3, 4, 2, 32
    bf = torch.bfloat16
    q, k, v = torch.zeros(T, n_q, D, dtype=bf), torch.zeros(T, n_kv, D, dtype=bf), torch.zeros(T, n_kv, D, dtype=bf)
    w = torch.ones(D, dtype=bf)
    cos, sin = torch.zeros(16, D // 2), torch.zeros(16, D // 2)
    pos = torch.arange(T, dtype=torch.int32)
    kc = torch.zeros(4, 4, n_kv, D, dtype=bf)
    store = (v, kc, kc.clone(), pos)
    for trigger in (False, True):
        ops.qk_norm_rope(q, k, w, w, cos, sin, pos, 1e-6, store=store, trigger_first=trigger)
        assert log[-1][1] == "qk_norm_rope" and len(log[-1][4]) == 22 and int(log[-1][4][21]) == int(trigger)
    n = len(log)
    with pytest.raises(TypeError):
        ops.qk_norm_rope(q, k, w, w, cos, sin, pos, 1e-6, store=store, trigger_first=1)
    assert len(log) == n


def test_split_kv_decode_early_launches_the_early_kernel_and_rejects_bad_input(launch_log, monkeypatch):
    """``split_kv_decode(early=True)``: ``split_kv_early_partials`` with ``split_kv_partials``' grid and
    arguments, in the one-launch mode and before ``split_kv_reduce``. ``early`` with ``row_seq`` or
    ``norm_rope``, or not a bool, is a typed error that launches nothing."""
    import torch

    from optimized import ops

    log = launch_log
    monkeypatch.setattr(ops, "_kernel_tickets", lambda ref: torch.zeros(ops._TICKETS, dtype=torch.int32))
    n_q, n_kv, D, bs = 8, 2, 64, 16
    kc = torch.zeros(64, bs, n_kv, D, dtype=torch.bfloat16)
    for B, max_splits, kernels in ((4, 3, ["split_kv_early_partials_d64"]),
                                   (40, 3, ["split_kv_early_partials_d64", "split_kv_reduce"])):
        q = torch.zeros(B, n_q, D, dtype=torch.bfloat16)
        tables = torch.zeros(B, 4, dtype=torch.int32)
        lens = torch.full((B,), 40, dtype=torch.int32)
        del log[:]
        ops.split_kv_decode(q, kc, kc, tables, lens, 16, max_splits=max_splits)
        plain = log[:]
        del log[:]
        out = ops.split_kv_decode(q, kc, kc, tables, lens, 16, max_splits=max_splits, early=True)
        assert out.shape == (B, n_q, D) and [name for _, name, *_ in log] == kernels, B
        assert plain[0][1] == "split_kv_partials_d64" and log[0][2:4] == plain[0][2:4]    # grid, block
        # the same arguments but the scratch partials, the output and the tickets (new tensors each call here)
        same = [i for i in range(len(plain[0][4])) if i not in (7, 8, 19, 20)]
        assert [int(log[0][4][i]) for i in same] == [int(plain[0][4][i]) for i in same]
        assert log[0][5:] == plain[0][5:]
    q = torch.zeros(3, n_q, D, dtype=torch.bfloat16)
    tables, lens = torch.zeros(3, 4, dtype=torch.int32), torch.full((3,), 40, dtype=torch.int32)
    cos, sin = torch.zeros(100, D // 2), torch.zeros(100, D // 2)
    k = v = torch.zeros(3, n_kv, D, dtype=torch.bfloat16)
    w = torch.ones(D, dtype=torch.bfloat16)
    n = len(log)
    for kw_bad, err in ((dict(row_seq=torch.arange(3, dtype=torch.int32)), ValueError),
                        (dict(norm_rope=(k, v, w, w, cos, sin, lens - 1, torch.arange(3, dtype=torch.int32), 1e-6)),
                         ValueError),
                        (dict(early=1), TypeError)):
        for fused in (True, False):                 # one launch, and the partials before split_kv_reduce
            with pytest.raises(err):
                ops.split_kv_decode(q, kc, kc, tables, lens, 16, max_splits=3, fused=fused,
                                    **{"early": True, **kw_bad})
    assert len(log) == n, "a rejected call launched"


def test_split_kv_decode_with_norm_rope_launches_the_qk_kernel_and_rejects_bad_input(launch_log, monkeypatch):
    """``split_kv_decode(norm_rope=...)``: one ``split_kv_qk_partials`` launch (+ the reduce past
    ``FUSED_DECODE_MAX_B`` rows with several splits) on the qkv buffer's raw rows -- k, v and their row
    strides, the norm weights, tables, positions, slots and eps in the kernel's order, the grid of
    ``split_kv_partials``. Bad arguments are typed errors that launch nothing."""
    import torch

    from optimized import ops

    log = launch_log
    monkeypatch.setattr(ops, "_kernel_tickets", lambda ref: torch.zeros(ops._TICKETS, dtype=torch.int32))
    n_q, n_kv, D, bs = 8, 2, 64, 16
    bf, i32 = torch.bfloat16, torch.int32
    kc = torch.zeros(64, bs, n_kv, D, dtype=bf)
    cos, sin = torch.zeros(100, D // 2), torch.zeros(100, D // 2)
    qw, kw = torch.ones(D, dtype=bf), torch.ones(D, dtype=bf)

    def inputs(B):
        qkv = torch.zeros(B, (n_q + 2 * n_kv) * D, dtype=bf)
        q = qkv[:, :n_q * D].view(B, n_q, D)
        k = qkv[:, n_q * D:(n_q + n_kv) * D].view(B, n_kv, D)
        v = qkv[:, (n_q + n_kv) * D:].view(B, n_kv, D)
        return q, k, v, torch.zeros(B, 4, dtype=i32), torch.full((B,), 40, dtype=i32), torch.arange(B, dtype=i32)

    for B, kernels, clusters in ((4, ["split_kv_qk_partials_d64"], True), (4, ["split_kv_qk_partials_d64"], False),
                                 (40, ["split_kv_qk_partials_d64", "split_kv_reduce"], True)):
        q, k, v, tables, lens, slots = inputs(B)
        pos = lens - 1
        monkeypatch.setattr(ops, "_clusters_ok", lambda ref, ok=clusters: ok)
        del log[:]
        out = ops.split_kv_decode(q, kc, kc, tables, lens, 16, max_splits=3,
                                  norm_rope=(k, v, qw, kw, cos, sin, pos, slots, 1e-6))
        assert out.shape == (B, n_q, D) and [name for _, name, *_ in log] == kernels, B
        _, _, grid, block, args, ctas, cluster_x = log[0]
        fused = B <= ops.FUSED_DECODE_MAX_B
        # the fold in a cluster of the 3 splits: one launch (fused), where clusters can be launched
        assert (cluster_x, int(args[29])) == ((3, 1) if fused and clusters else (1, 0)), (B, clusters)
        assert grid == (3, n_kv, B) and block == (128, 1, 1) and ctas == ops.DECODE_CTAS_PER_SM
        W = (n_q + 2 * n_kv) * D
        assert [int(a) for a in args[:6]] == [q.data_ptr(), W, k.data_ptr(), W, v.data_ptr(), W]
        assert [int(a) for a in args[6:11]] == [qw.data_ptr(), kw.data_ptr(), cos.data_ptr(), sin.data_ptr(), 100]
        assert abs(float(args[11]) - 1e-6) < 1e-12 and int(args[12]) == pos.data_ptr() and int(args[13]) == slots.data_ptr()
        assert int(args[14]) == int(args[15]) == kc.data_ptr() and int(args[16]) == tables.data_ptr()
        assert [int(a) for a in args[17:19]] == [4, lens.data_ptr()]
        assert [int(a) for a in args[21:26]] == [n_q, n_kv, bs, 16, 3] and abs(float(args[26]) - D ** -0.5) < 1e-6
        assert (int(args[27]) != 0) == fused and len(args) == 30
    q, k, v, tables, lens, slots = inputs(4)                         # more splits than a cluster takes: the ticket
    monkeypatch.setattr(ops, "_clusters_ok", lambda ref: True)
    del log[:]
    ops.split_kv_decode(q, kc, kc, tables, lens, 4, max_splits=ops.DECODE_CLUSTER_MAX + 1,
                        norm_rope=(k, v, qw, kw, cos, sin, lens - 1, slots, 1e-6))
    assert log[0][6] == 1 and int(log[0][4][29]) == 0 and ops.DECODE_CLUSTER_MAX == 8
    from optimized import kernels
    assert "constexpr int kClusterMax = 8;" in kernels.source("attention")
    q, k, v, tables, lens, slots = inputs(3)
    good = (k, v, qw, kw, cos, sin, lens - 1, slots, 1e-6)
    n = len(log)
    bad = [dict(norm_rope=good[:8]),                                                    # not 9 items
           dict(norm_rope=(k[:2],) + good[1:]),                                          # k rows != q rows
           dict(norm_rope=(k, v.float()) + good[2:]),                                    # v not bf16
           dict(norm_rope=good[:2] + (qw[:8],) + good[3:]),                              # weight length
           dict(norm_rope=good[:4] + (cos[:, :4],) + good[5:]),                          # table width
           dict(norm_rope=good[:6] + ((lens - 1).long(),) + good[7:]),                   # positions not int32
           dict(norm_rope=good[:7] + (slots[:2],) + good[8:]),                           # slots length
           dict(norm_rope=good[:8] + (0.0,)),                                            # eps
           dict(norm_rope=good, row_seq=torch.arange(3, dtype=i32)),                     # no row_seq
           dict(norm_rope=good, rope=(cos, sin))]                                        # no fused K rotation
    for kw_bad in bad:
        with pytest.raises((ValueError, TypeError)):
            ops.split_kv_decode(q, kc, kc, tables, lens, 16, max_splits=3, **kw_bad)
    assert len(log) == n, "a rejected call launched"


def test_decode_ctas_take_eight_query_heads_and_ask_for_two_per_multiprocessor(launch_log, monkeypatch):
    """A ``split_kv_partials`` CTA serves up to ``DECODE_QUERY_HEADS`` = 8 query heads of one KV head (the
    8-column side of its MMAs, ``DecodeCfg::NQ``): a GQA group of 16 takes two CTAs, of 5 or 8 one. Its
    launch asks for a shared-memory configuration of ``DECODE_CTAS_PER_SM`` = 2 CTAs."""
    import torch

    from optimized import ops

    log = launch_log
    monkeypatch.setattr(ops, "_kernel_tickets", lambda ref: torch.zeros(ops._TICKETS, dtype=torch.int32))
    D, bs, n_kv = 64, 16, 2
    kc = torch.zeros(8, bs, n_kv, D, dtype=torch.bfloat16)
    for G, groups in ((1, 1), (5, 1), (8, 1), (9, 2), (16, 2), (17, 3)):
        q = torch.zeros(3, G * n_kv, D, dtype=torch.bfloat16)
        del log[:]
        ops.split_kv_decode(q, kc, kc, torch.zeros(3, 4, dtype=torch.int32), torch.full((3,), 40, dtype=torch.int32), None)
        assert log[0][2] == (1, n_kv * groups, 3) and log[0][5] == ops.DECODE_CTAS_PER_SM == 2, (G, log[0])
    from optimized import kernels

    assert ops.DECODE_QUERY_HEADS == 8 and f"NQ = {ops.DECODE_QUERY_HEADS};" in kernels.source("attention")


def test_carveout_preference_holds_the_ctas_asked_for_and_no_more(monkeypatch):
    """``ops._carveout_percent``: the smallest percentage of a multiprocessor's shared memory that holds
    ``ctas`` CTAs (dynamic + static + the driver's reserve each). The H200's numbers: 228 KiB a
    multiprocessor, 1 KiB reserved a CTA, the decode kernel's 73984 + 1808 bytes."""
    import sys
    import types

    from optimized import ops

    attrs = {81: 233472, 111: 1024}
    rt = types.SimpleNamespace(deviceGetAttribute=lambda attr, dev: attrs[attr])
    monkeypatch.setitem(sys.modules, "cupy", types.SimpleNamespace(cuda=types.SimpleNamespace(runtime=rt)))
    fn = types.SimpleNamespace(attributes={"shared_size_bytes": 1808})
    two = ops._carveout_percent(0, fn, 73984, 2)
    assert two == 66                                       # ceil(100 * 153632 / 233472)
    per_cta = 73984 + 1808 + 1024
    assert two * attrs[81] / 100 >= 2 * per_cta            # two fit in what it asks for ...
    assert 164 * 1024 < 3 * per_cta                        # ... and the 164 KiB configuration above it holds no third
    assert ops._carveout_percent(0, fn, 73984, 3) == 99
    assert ops._carveout_percent(0, fn, 200_000, 2) == 100  # more than there is: the largest


def test_attention_rejects_a_cache_past_int32_chunk_offsets(launch_log, monkeypatch):
    """The attention kernels' row tables hold a cache slot's offset in 16-byte chunks as an int32: a
    layer's cache of more than 8 * 2**31 elements is refused before any launch (a "meta" cache: no memory)."""
    import torch

    from optimized import ops

    monkeypatch.setattr(ops, "_DEVICE_TYPES", ("cuda", "cpu", "meta"))
    n_kv, D, bs = 8, 128, 16
    fits = ops._CACHE_MAX_ELEMS // (bs * n_kv * D)
    for pages, ok in ((fits, True), (fits + 1, False)):
        kc = torch.empty(pages, bs, n_kv, D, dtype=torch.bfloat16, device="meta")
        if ok:
            assert ops._cache_pair(kc, kc) == (pages, bs, n_kv, D)
            continue
        with pytest.raises(ValueError, match="16-byte chunk offsets"):
            ops._cache_pair(kc, kc)
        q = torch.zeros(1, 32, D, dtype=torch.bfloat16)
        tables = torch.zeros(1, 4, dtype=torch.int32)
        lens = torch.full((1,), 40, dtype=torch.int32)
        with pytest.raises(ValueError, match="16-byte chunk offsets"):
            ops.split_kv_decode(q, kc, kc, tables, lens, None)
        assert launch_log == []


def test_paged_prefill_launches_the_wgmma_kernels_only_on_their_build(launch_log, monkeypatch):
    """``variant="wg128"`` (or ``wg64``) launches its kernel with 128 (64) rows a CTA, two (one) warpgroups
    and the swizzled tiles' shared memory where the attention module is built for sm_90a, and is a
    ValueError elsewhere, before any launch; the engine's own choice is x2 without that build and the
    warp-specialised ``ws`` with it (x2 where the caller's ``mean_keys`` is below ``WS_MIN_MEAN_KEYS``)."""
    import torch

    from optimized import kernels, ops

    monkeypatch.setattr(ops, "_device_index", lambda t: 0)
    monkeypatch.setattr(ops, "_num_sms", lambda dev: 132)
    n_q, n_kv, D, bs, T = 32, 8, 128, 16, 8192
    q = torch.zeros(T, n_q, D, dtype=torch.bfloat16)
    kc = torch.zeros(T // bs, bs, n_kv, D, dtype=torch.bfloat16)
    tables = torch.arange(T // bs, dtype=torch.int32).view(1, -1)
    lens = torch.full((1,), T, dtype=torch.int32)
    qidx = torch.zeros(T, dtype=torch.int32)
    pos = torch.arange(T, dtype=torch.int32)
    for target in (None, "sm_90a"):
        monkeypatch.setattr(kernels, "target", lambda name, dev, t=target: t)
        launch_log.clear()
        if target is None:
            for v in ("wg64", "wg128", "ws"):
                with pytest.raises(ValueError, match="sm_90a"):
                    ops.paged_prefill(q, kc, kc, tables, lens, qidx, pos, variant=v)
            assert launch_log == [] and ops.prefill_variants(D, 0) == ["default", "x2"]
            ops.paged_prefill(q, kc, kc, tables, lens, qidx, pos)
            assert launch_log[-1][1] == "paged_prefill_d128_x2"
            continue
        assert ops.prefill_variants(D, 0) == ["default", "x2", "wg64", "wg128", "ws"]
        for v, rows in (("wg64", 64), ("wg128", 128)):
            ops.paged_prefill(q, kc, kc, tables, lens, qidx, pos, variant=v)
            module, name, grid, block, *_ = launch_log[-1]
            assert (module, name) == ("attention", f"paged_prefill_d128_{v}")
            assert grid == (T // (rows // 4), n_kv, 1) and block == (2 * rows, 1, 1)
        # the warp-specialised kernel: 384 threads (producer + two consumer warpgroups), the ring's shared
        # memory, every KV head of the heaviest tile first like the mma.sync kernels
        # one sequence of 8192 tokens: a long chunk, so one CTA per work item (tile of 32 tokens, KV head)
        ops.paged_prefill(q, kc, kc, tables, lens, qidx, pos, variant="ws")
        module, name, grid, block, *rest = launch_log[-1]
        assert (module, name) == ("attention", "paged_prefill_d128_ws")
        items = n_kv * T // (128 // 4)
        assert grid == (items, 1, 1) and block == (384, 1, 1)
        # 32 sequences of 256 tokens (mean chunk <= WS_PERSISTENT_MAX_CHUNK): the persistent grid
        tables32 = torch.arange(T // bs, dtype=torch.int32).view(32, -1)
        lens32 = torch.full((32,), T // 32, dtype=torch.int32)
        qidx32 = torch.arange(32, dtype=torch.int32).repeat_interleave(T // 32)
        pos32 = torch.arange(T // 32, dtype=torch.int32).repeat(32)
        ops.paged_prefill(q, kc, kc, tables32, lens32, qidx32, pos32, variant="ws")
        assert launch_log[-1][2] == (ops.WS_CTAS_PER_SM * 132, 1, 1)
        monkeypatch.setattr(ops, "WS_CTAS_PER_SM", 0)          # off: one CTA per work item
        ops.paged_prefill(q, kc, kc, tables32, lens32, qidx32, pos32, variant="ws")
        assert launch_log[-1][2] == (items, 1, 1)
        monkeypatch.setattr(ops, "WS_CTAS_PER_SM", 1)
        ops.paged_prefill(q[:64], kc, kc, tables, lens, qidx[:64], pos[:64], variant="ws")
        assert launch_log[-1][2] == (n_kv * 2, 1, 1)            # fewer items than multiprocessors: one CTA each
        # the engine's choice on this build: ws, unless the caller's mean keys a row sees is short
        ops.paged_prefill(q, kc, kc, tables, lens, qidx, pos)
        assert launch_log[-1][1] == "paged_prefill_d128_ws"
        ops.paged_prefill(q, kc, kc, tables, lens, qidx, pos, mean_keys=ops.WS_MIN_MEAN_KEYS)
        assert launch_log[-1][1] == "paged_prefill_d128_ws"
        ops.paged_prefill(q, kc, kc, tables, lens, qidx, pos, mean_keys=ops.WS_MIN_MEAN_KEYS - 1)
        assert launch_log[-1][1] == "paged_prefill_d128_x2"
        # the mma.sync kernels take every KV head of the heaviest tile first: grid (n_kv, tiles)
        assert launch_log[-1][2] == (n_kv, T // (128 // 4), 1) and launch_log[-1][3] == (128, 1, 1)
        ops.paged_prefill(q[:64], kc, kc, tables, lens, qidx[:64], pos[:64])
        assert launch_log[-1][1:4] == ("paged_prefill_d128", (n_kv, 64 // (64 // 4), 1), (128, 1, 1))


def test_paged_prefill_refuses_more_tiles_than_the_grid_holds_before_any_launch(launch_log, monkeypatch):
    """The mma.sync kernels run on the grid (n_kv, tiles): more than 65535 tiles of query tokens is a
    ValueError naming the fix (chunks), raised before a launch ("meta" tensors: no memory)."""
    import torch

    from optimized import ops

    monkeypatch.setattr(ops, "_DEVICE_TYPES", ("cuda", "cpu", "meta"))
    monkeypatch.setattr(ops, "_device_index", lambda t: 0)
    monkeypatch.setattr(ops, "_num_sms", lambda dev: 132)
    n_q, n_kv, D, bs = 64, 1, 128, 16               # a GQA group of 64: one token a 64-row tile
    kc = torch.empty(8, bs, n_kv, D, dtype=torch.bfloat16, device="meta")
    tables = torch.zeros(1, 8, dtype=torch.int32, device="meta")
    lens = torch.zeros(1, dtype=torch.int32, device="meta")
    for T, ok in ((65535, True), (65536, False)):
        q = torch.empty(T, n_q, D, dtype=torch.bfloat16, device="meta")
        qidx = torch.empty(T, dtype=torch.int32, device="meta")
        if ok:
            ops.paged_prefill(q, kc, kc, tables, lens, qidx, qidx, variant="default")
            assert launch_log[-1][2] == (n_kv, T, 1)
            continue
        n = len(launch_log)
        with pytest.raises(ValueError, match="prefill them in chunks"):
            ops.paged_prefill(q, kc, kc, tables, lens, qidx, qidx, variant="default")
        assert len(launch_log) == n


def test_kv_prefetch_launches_its_ctas_capped_by_bytes_and_rejects_bad_input(launch_log, monkeypatch):
    """``ops.kv_prefetch``: a row of ``kv_prefetch_ctas`` CTAs a sequence (about two a multiprocessor in all, at most
    one a page), the table's columns, the block size, a page's bytes and the pages a row may ask for
    (``max_bytes // (2 x page bytes x rows)``, at most the table's columns); no launch where that is below one page
    or the batch is empty; a bad argument is a typed error that launches nothing."""
    import torch

    from optimized import ops

    log = launch_log
    monkeypatch.setattr(ops, "_device_index", lambda t: 0)
    monkeypatch.setattr(ops, "_num_sms", lambda dev: 6)
    assert [ops.kv_prefetch_ctas(B, p, 132) for B, p in ((32, 19), (32, 5), (64, 100), (300, 9), (1, 1000))] == \
        [9, 5, 5, 1, 264]
    n_kv, D, bs, B, M = 2, 64, 16, 5, 7
    kc, vc = torch.zeros(32, bs, n_kv, D, dtype=torch.bfloat16), torch.zeros(32, bs, n_kv, D, dtype=torch.bfloat16)
    tables = torch.arange(B * M, dtype=torch.int32).view(B, M) % 32
    lens = torch.tensor([1, 100, 0, 17, 112], dtype=torch.int32)
    page = bs * n_kv * D * 2                                                    # 4096 bytes
    for max_bytes, pages in ((1 << 30, M), (2 * page * B * 3, 3), (2 * page * B * 3 + 2 * page * B - 1, 3),
                             (2 * page * B, 1), (2 * page * B - 1, 0), (0, 0)):
        del log[:]
        ops.kv_prefetch(kc, vc, tables, lens, max_bytes)
        if pages == 0:
            assert log == [], max_bytes
            continue
        (module, name, grid, block, args, _, _), = log
        assert (module, name, grid, block) == ("kv_cache", "kv_prefetch", (B, min(pages, 3), 1), (32, 1, 1))
        assert [int(a) for a in args[:4]] == [kc.data_ptr(), vc.data_ptr(), tables.data_ptr(), lens.data_ptr()]
        assert [int(a) for a in args[4:]] == [M, bs, page, pages, 0], (max_bytes, args)
    for ctas, want in ((1, 1), (2, 2), (100, M)):     # a fixed count of CTAs a sequence (at most one a page)
        del log[:]
        ops.kv_prefetch(kc, vc, tables, lens, 1 << 30, ctas=ctas)
        assert log[0][2] == (B, want, 1) and [int(a) for a in log[0][4][4:]] == [M, bs, page, M, 0], ctas
    del log[:]
    ops.kv_prefetch(kc, vc, tables, lens, 1 << 30, lines=True)       # a line prefetch instead: the last argument
    assert [int(a) for a in log[0][4][4:]] == [M, bs, page, M, 1]
    del log[:]
    ops.kv_prefetch(kc, vc, tables[:0], lens[:0], 1 << 30)
    assert log == []
    for ctas in (0, -1, True, 1.5):
        with pytest.raises(ValueError):
            ops.kv_prefetch(kc, vc, tables, lens, 1 << 30, ctas=ctas)
    with pytest.raises(TypeError):
        ops.kv_prefetch(kc, vc, tables, lens, 1 << 30, lines=1)
    bad = [((kc, vc, tables, lens, 1.5), TypeError), ((kc, vc, tables, lens, True), TypeError),
           ((kc, vc, tables, lens, -1), ValueError), ((kc, vc[:16], tables, lens, 1 << 20), ValueError),
           ((kc, vc.float(), tables, lens, 1 << 20), ValueError), ((kc, vc, tables.long(), lens, 1 << 20), ValueError),
           ((kc, vc, tables, lens[:3], 1 << 20), ValueError), ((kc, vc, tables.t(), lens, 1 << 20), ValueError)]
    for args, err in bad:
        with pytest.raises(err):
            ops.kv_prefetch(*args)
    assert log == [], "a rejected call launched"
