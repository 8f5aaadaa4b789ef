"""The driver launch path of programmatic dependent launch without a GPU: the argument slots, the
struct layouts ctypes builds, and when the path is taken (``optimized/launch.py``). The launches
themselves run in the GPU checks (``benches/gpu/check_kernels.py`` launches every kernel through it)."""

from __future__ import annotations

import ctypes
import struct

import numpy as np
import pytest

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
