"""Kernel launches through the CUDA driver's ``cuLaunchKernelEx``, with programmatic dependent launch.

``ops._launch`` sends every kernel of ``optimized/kernels`` here when PDL is on (the default on a GPU
of compute capability 9.0 or newer; ``TURNKV_PDL=0`` in the environment, or ``set_pdl(False)``,
switches it off, and then CuPy's own launch path runs). Each launch carries the attribute
``CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION``: the kernel may start while the previous
kernel of the stream is still running, and its ``pdl_wait()`` (``optimized/kernels/pdl.cuh``) holds
every thread until that kernel has completed. A CUDA graph captured from such launches keeps the
programmatic edges, so a replayed decode step overlaps each kernel's launch and prologue with the tail
of the one before (``docs/optimized.md``, "Programmatic dependent launch").

Arguments are the ``ops`` wrappers' scalars (``np.uint64`` pointers, ``np.int32``, ``np.float32``).
Each goes into its own 8-byte little-endian slot of one buffer (``pack_args``): the driver reads as
many bytes from ``kernelParams[i]`` as the kernel's i-th parameter has, so a 4-byte value sits in the
low half of its slot. ``ctypes`` reaches ``libcuda`` directly; nothing here needs CuPy except the
function handle (``cupy.cuda.Function.ptr``).
"""

from __future__ import annotations

import ctypes
import os
import struct
from typing import Sequence

import numpy as np

#: ``CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION`` (cuda.h)
ATTR_PROGRAMMATIC_STREAM_SERIALIZATION = 6
#: ``CU_LAUNCH_ATTRIBUTE_CLUSTER_DIMENSION`` (cuda.h): value ``clusterDim`` = three unsigned ints x, y, z
ATTR_CLUSTER_DIMENSION = 4


class _LaunchAttr(ctypes.Structure):
    """``CUlaunchAttribute``: a 4-byte id, 4 bytes of padding, a 64-byte value union."""
    _fields_ = [("id", ctypes.c_uint), ("pad", ctypes.c_char * 4), ("value", ctypes.c_int * 16)]


class _LaunchConfig(ctypes.Structure):
    """``CUlaunchConfig`` (ctypes inserts the 4 bytes of padding before ``hStream``, as C does)."""
    _fields_ = [("gridDimX", ctypes.c_uint), ("gridDimY", ctypes.c_uint), ("gridDimZ", ctypes.c_uint),
                ("blockDimX", ctypes.c_uint), ("blockDimY", ctypes.c_uint), ("blockDimZ", ctypes.c_uint),
                ("sharedMemBytes", ctypes.c_uint), ("hStream", ctypes.c_void_p),
                ("attrs", ctypes.POINTER(_LaunchAttr)), ("numAttrs", ctypes.c_uint)]


assert ctypes.sizeof(_LaunchAttr) == 72 and _LaunchConfig.hStream.offset == 32 and ctypes.sizeof(_LaunchConfig) == 56


def pack_args(args: Sequence[np.generic]) -> bytes:
    """One 8-byte little-endian slot per kernel argument: ``np.uint64`` whole, ``np.int32`` and
    ``np.float32`` in the low four bytes (the rest zero). Any other type is a ``TypeError``."""
    out = bytearray(8 * len(args))
    for i, a in enumerate(args):
        if isinstance(a, np.uint64):
            struct.pack_into("<Q", out, 8 * i, int(a))
        elif isinstance(a, np.int32):
            struct.pack_into("<i", out, 8 * i, int(a))
        elif isinstance(a, np.float32):
            struct.pack_into("<f", out, 8 * i, float(a))
        else:
            raise TypeError(f"kernel argument {i} has type {type(a).__name__}; "
                            "expected np.uint64, np.int32 or np.float32")
    return bytes(out)


_state: dict[str, object] = {"lib": None, "enabled": None}


def _driver():
    """``libcuda`` with ``cuLaunchKernelEx`` typed, or None when the driver lacks it."""
    lib = _state["lib"]
    if lib is None:
        try:
            lib = ctypes.CDLL("libcuda.so.1")
            fn = lib.cuLaunchKernelEx
        except (OSError, AttributeError):
            _state["lib"] = False
            return None
        fn.restype = ctypes.c_int
        fn.argtypes = [ctypes.POINTER(_LaunchConfig), ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p]
        lib.cuGetErrorName.restype = ctypes.c_int
        lib.cuGetErrorName.argtypes = [ctypes.c_int, ctypes.POINTER(ctypes.c_char_p)]
        _state["lib"] = lib
    return lib or None


def set_pdl(on: bool | None) -> None:
    """Force programmatic dependent launch on or off for the launches that follow (``None``: back to
    the default, ``TURNKV_PDL`` and the device). Graphs captured earlier keep the launches they hold."""
    _state["enabled"] = on


def pdl_enabled(major: int) -> bool:
    """Whether launches on a device of compute capability ``major`` take the PDL path."""
    on = _state["enabled"]
    if on is None:
        on = os.environ.get("TURNKV_PDL", "1") != "0"
    return bool(on) and major >= 9 and _driver() is not None


def launch_attrs(cluster_x: int = 1) -> tuple[tuple[int, tuple[int, ...]], ...]:
    """The launch attributes of ``launch_pdl`` as (id, value ints): programmatic stream serialization, and
    with ``cluster_x > 1`` thread-block clusters of ``cluster_x`` CTAs along the grid's x."""
    attrs: tuple[tuple[int, tuple[int, ...]], ...] = ((ATTR_PROGRAMMATIC_STREAM_SERIALIZATION, (1,)),)
    if cluster_x > 1:
        attrs += ((ATTR_CLUSTER_DIMENSION, (int(cluster_x), 1, 1)),)
    return attrs


def launch_pdl(func_ptr: int, grid: tuple, block: tuple, args: Sequence[np.generic], smem: int, stream: int,
               cluster_x: int = 1) -> None:
    """``cuLaunchKernelEx`` of the CUfunction ``func_ptr`` on ``stream`` with programmatic stream
    serialization allowed (and, ``cluster_x > 1``, clusters of that many CTAs along x: the grid's x must be
    a multiple of it). Raises ``RuntimeError`` with the driver's error name on failure."""
    lib = _driver()
    if lib is None:
        raise RuntimeError("the CUDA driver has no cuLaunchKernelEx")
    buf = ctypes.create_string_buffer(pack_args(args), 8 * max(1, len(args)))
    base = ctypes.addressof(buf)
    params = (ctypes.c_void_p * max(1, len(args)))(*[base + 8 * i for i in range(len(args))])
    wanted = launch_attrs(cluster_x)
    attrs = (_LaunchAttr * len(wanted))()
    for a, (aid, vals) in zip(attrs, wanted):
        a.id = aid
        for i, v in enumerate(vals):
            a.value[i] = v
    gx, gy, gz = (tuple(grid) + (1, 1))[:3]
    bx, by, bz = (tuple(block) + (1, 1))[:3]
    if cluster_x > 1 and gx % cluster_x:
        raise ValueError(f"grid x {gx} is not a multiple of the cluster's {cluster_x}")
    cfg = _LaunchConfig(gx, gy, gz, bx, by, bz, smem, stream, attrs, len(wanted))
    rc = lib.cuLaunchKernelEx(ctypes.byref(cfg), func_ptr, params, None)
    if rc != 0:
        raise driver_error(lib, rc, "cuLaunchKernelEx")


def driver_error(lib, rc: int, what: str) -> RuntimeError:
    """The ``RuntimeError`` for the driver call ``what`` that returned ``rc``: its error name and number."""
    name = ctypes.c_char_p()
    lib.cuGetErrorName(rc, ctypes.byref(name))
    return RuntimeError(f"{what} failed: {(name.value or b'?').decode()} ({rc})")


def max_active_clusters(func_ptr: int, block: tuple, smem: int, cluster_x: int) -> int:
    """``cuOccupancyMaxActiveClusters``: how many clusters of ``cluster_x`` CTAs of the CUfunction ``func_ptr``
    (``block`` threads, ``smem`` bytes of dynamic shared memory each) the device can hold at once. Raises
    ``RuntimeError`` with the driver's error name on failure."""
    lib = _driver()
    if lib is None:
        raise RuntimeError("the CUDA driver has no cuLaunchKernelEx")
    if not isinstance(cluster_x, int) or cluster_x < 1:
        raise ValueError(f"cluster_x must be a positive int, got {cluster_x!r}")
    wanted = launch_attrs(cluster_x)
    attrs = (_LaunchAttr * len(wanted))()
    for a, (aid, vals) in zip(attrs, wanted):
        a.id = aid
        for i, v in enumerate(vals):
            a.value[i] = v
    bx, by, bz = (tuple(block) + (1, 1))[:3]
    cfg = _LaunchConfig(cluster_x * 256, 1, 1, bx, by, bz, smem, None, attrs, len(wanted))
    n = ctypes.c_int(0)
    fn = lib.cuOccupancyMaxActiveClusters
    rc = fn(ctypes.byref(n), ctypes.c_void_p(func_ptr), ctypes.byref(cfg))
    if rc != 0:
        raise driver_error(lib, rc, "cuOccupancyMaxActiveClusters")
    return n.value
