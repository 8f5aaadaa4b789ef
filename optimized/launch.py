"""Kernel launches through the CUDA driver's ``cuLaunchKernelEx``, with programmatic dependent launch.

``ops._launch`` sends every kernel of ``optimized/kernels`` here when PDL is on (the default on a GPU
of compute capability 9.0 or newer; ``TURNKV_PDL=0`` in the environment, or ``set_pdl(False)``,
switches it off, and then CuPy's own launch path runs). Each launch carries the attribute
``CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION``: the kernel may start while the previous
kernel of the stream is still running, and its ``pdl_wait()`` (``optimized/kernels/pdl.cuh``) holds
every thread until that kernel has completed. A CUDA graph captured from such launches keeps the
programmatic edges, so a replayed decode step overlaps each kernel's launch and prologue with the tail
of the one before (``docs/optimized.md``, "Programmatic dependent launch").

Arguments are the ``ops`` wrappers' scalars (``np.uint64`` pointers, ``np.int32``, ``np.float32``)
and tensor maps (``TensorMap``, 128 bytes, from ``encode_matrix_map``). Each scalar goes into its own
8-byte little-endian slot of one buffer, each tensor map into 128 bytes at a multiple of 64
(``pack_params``): the driver reads as many bytes from ``kernelParams[i]`` as the kernel's i-th
parameter has, so a 4-byte value sits in the low half of its slot. ``ctypes`` reaches ``libcuda``
directly; nothing here needs CuPy except the function handle (``cupy.cuda.Function.ptr``).
"""

from __future__ import annotations

import ctypes
import os
import struct
import threading
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


class TensorMap(bytes):
    """A ``CUtensorMap`` as the driver encoded it (``encode_matrix_map``): 128 opaque bytes, passed by value
    to a kernel's ``__grid_constant__`` parameter."""

    def __new__(cls, raw: bytes) -> "TensorMap":
        if len(raw) != TENSOR_MAP_BYTES:
            raise ValueError(f"a tensor map has {TENSOR_MAP_BYTES} bytes, got {len(raw)}")
        return super().__new__(cls, raw)


#: ``sizeof(CUtensorMap)``; it is 64-byte aligned
TENSOR_MAP_BYTES = 128


def pack_params(args: Sequence[np.generic | TensorMap]) -> tuple[bytes, list[int]]:
    """The kernel arguments in one buffer and each one's offset in it: an 8-byte little-endian slot per
    scalar (``np.uint64`` whole, ``np.int32`` and ``np.float32`` in the low four bytes, the rest zero), 128
    bytes at the next multiple of 64 per ``TensorMap``. Any other type is a ``TypeError``."""
    out = bytearray()
    offsets = []
    for i, a in enumerate(args):
        if isinstance(a, TensorMap):
            out += bytes(-len(out) % 64)
            offsets.append(len(out))
            out += a
            continue
        offsets.append(len(out))
        if isinstance(a, np.uint64):
            out += struct.pack("<Q", int(a))
        elif isinstance(a, np.int32):
            out += struct.pack("<i", int(a)) + bytes(4)
        elif isinstance(a, np.float32):
            out += struct.pack("<f", float(a)) + bytes(4)
        else:
            raise TypeError(f"kernel argument {i} has type {type(a).__name__}; "
                            "expected np.uint64, np.int32, np.float32 or TensorMap")
    return bytes(out), offsets


def pack_args(args: Sequence[np.generic]) -> bytes:
    """``pack_params``'s buffer: for scalars alone, one 8-byte slot per argument."""
    return pack_params(args)[0]


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


def _attr_array(cluster_x: int) -> tuple[ctypes.Array, int]:
    """``launch_attrs(cluster_x)`` as the ``CUlaunchAttribute`` array a ``CUlaunchConfig`` points to, and its length;
    built once per ``cluster_x`` (the driver only reads it)."""
    entry = _attr_arrays.get(cluster_x)
    if entry is None:
        wanted = launch_attrs(cluster_x)
        attrs = (_LaunchAttr * len(wanted))()
        for a, (aid, vals) in zip(attrs, wanted):
            a.id = aid
            for i, v in enumerate(vals):
                a.value[i] = v
        entry = _attr_arrays[cluster_x] = (attrs, len(wanted))
    return entry


_attr_arrays: dict[int, tuple[ctypes.Array, int]] = {}


class _Params:
    """The ``kernelParams`` of one argument signature (the arguments' types in order): ``pack_params``'s layout as
    one ``struct`` format, a buffer it packs into and the array of pointers into that buffer, made once and reused
    launch after launch (``cuLaunchKernelEx`` has copied the arguments when it returns). One per thread
    (``_params_of``), so that two threads never pack into one buffer."""

    __slots__ = ("layout", "buf", "ptrs")

    def __init__(self, args: Sequence[np.generic | TensorMap]) -> None:
        raw, offsets = pack_params(args)              # the layout and its type checks
        fmt, at = ["<"], 0
        for a, off in zip(args, offsets):
            if off > at:
                fmt.append(f"{off - at}x")
            fmt.append("128s" if isinstance(a, TensorMap) else "Q" if isinstance(a, np.uint64)
                       else "i4x" if isinstance(a, np.int32) else "f4x")
            at = off + (TENSOR_MAP_BYTES if isinstance(a, TensorMap) else 8)
        self.layout = struct.Struct("".join(fmt))
        if self.layout.size != len(raw):
            raise AssertionError(f"kernelParams layout {fmt} is {self.layout.size} bytes, pack_params' {len(raw)}")
        self.buf = ctypes.create_string_buffer(max(8, len(raw)))
        base = ctypes.addressof(self.buf)
        self.ptrs = (ctypes.c_void_p * max(1, len(args)))(*[base + o for o in offsets])

    def pack(self, args: Sequence[np.generic | TensorMap]) -> ctypes.Array:
        """Write ``args`` into the buffer (the same bytes as ``pack_params``); returns the pointer array."""
        self.layout.pack_into(self.buf, 0, *args)
        return self.ptrs


_local = threading.local()


def _params_of(args: Sequence[np.generic | TensorMap]) -> _Params:
    """This thread's ``_Params`` for the signature of ``args`` (a wrong type raises ``pack_params``' TypeError)."""
    cache = getattr(_local, "params", None)
    if cache is None:
        cache = _local.params = {}
    key = tuple(map(type, args))
    p = cache.get(key)
    if p is None:
        p = cache[key] = _Params(args)
    return p


def launch_pdl(func_ptr: int, grid: tuple, block: tuple, args: Sequence[np.generic], smem: int, stream: int,
               cluster_x: int = 1) -> None:
    """``cuLaunchKernelEx`` of the CUfunction ``func_ptr`` on ``stream`` with programmatic stream
    serialization allowed (and, ``cluster_x > 1``, clusters of that many CTAs along x: the grid's x must be
    a multiple of it). Raises ``RuntimeError`` with the driver's error name on failure. The arguments go
    through ``_params_of`` (``pack_params``' bytes in a buffer kept per signature): an eager step makes
    hundreds of these calls, and this one is on its host's path (docs/performance/agentic.md, "Host cost of eager ops")."""
    lib = _driver()
    if lib is None:
        raise RuntimeError("the CUDA driver has no cuLaunchKernelEx")
    gx, gy, gz = (tuple(grid) + (1, 1))[:3]
    bx, by, bz = (tuple(block) + (1, 1))[:3]
    if cluster_x > 1 and gx % cluster_x:
        raise ValueError(f"grid x {gx} is not a multiple of the cluster's {cluster_x}")
    params = _params_of(args).pack(args)
    attrs, n_attrs = _attr_array(cluster_x)
    cfg = _LaunchConfig(gx, gy, gz, bx, by, bz, smem, stream, attrs, n_attrs)
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
    attrs, n_attrs = _attr_array(cluster_x)
    bx, by, bz = (tuple(block) + (1, 1))[:3]
    cfg = _LaunchConfig(cluster_x * 256, 1, 1, bx, by, bz, smem, None, attrs, n_attrs)
    n = ctypes.c_int(0)
    fn = lib.cuOccupancyMaxActiveClusters
    rc = fn(ctypes.byref(n), ctypes.c_void_p(func_ptr), ctypes.byref(cfg))
    if rc != 0:
        raise driver_error(lib, rc, "cuOccupancyMaxActiveClusters")
    return n.value


#: ``CUtensorMapDataType``, ``CUtensorMapSwizzle`` and ``CUtensorMapL2promotion`` values (cuda.h) that
#: ``encode_matrix_map`` uses
_TMAP_BFLOAT16, _TMAP_SWIZZLE_128B, _TMAP_L2_256B = 9, 3, 3


def check_matrix_map(addr: int, rows: int, cols: int, row_bytes: int, box_cols: int, box_rows: int) -> None:
    """The ``ValueError`` of ``encode_matrix_map`` for arguments it cannot encode (no driver needed)."""
    for name, v in (("rows", rows), ("cols", cols), ("row_bytes", row_bytes), ("box_cols", box_cols),
                    ("box_rows", box_rows)):
        if not isinstance(v, int) or isinstance(v, bool) or v < 1:
            raise ValueError(f"{name} must be a positive int, got {v!r}")
    if cols % 64 or box_cols % 64:
        raise ValueError(f"cols ({cols}) and box_cols ({box_cols}) must be multiples of 64")
    if box_cols // 64 > 256 or box_rows > 256:
        raise ValueError(f"a box spans at most 256 blocks and 256 rows, got {box_cols // 64} and {box_rows}")
    if addr % 16 or row_bytes % 16 or row_bytes < 2 * cols or row_bytes >= 1 << 40:
        raise ValueError(f"the matrix must start 16-byte aligned with rows a multiple of 16 bytes apart, at least "
                         f"2 cols bytes: address {addr:#x}, row_bytes {row_bytes}, cols {cols}")


def encode_matrix_map(addr: int, rows: int, cols: int, row_bytes: int, box_cols: int, box_rows: int) -> TensorMap:
    """``cuTensorMapEncodeTiled`` of the bf16 matrix ``[rows, cols]`` at device address ``addr`` (rows
    ``row_bytes`` apart) seen as 3-D: (64 columns, cols / 64 blocks of them, rows), with boxes of
    (64, ``box_cols`` / 64, ``box_rows``), 128-byte swizzle, zeros past the edges and L2 promotion of 256 bytes
    (``skinny_gemm.cu``, "The cluster kernel"). ``ValueError`` for what it cannot encode (``check_matrix_map``),
    ``RuntimeError`` with the driver's error name if the driver refuses."""
    check_matrix_map(addr, rows, cols, row_bytes, box_cols, box_rows)
    return encode_tiled_map(addr, (64, cols // 64, rows), (128, row_bytes), (64, box_cols // 64, box_rows))


def encode_block_map(addr: int, rows: int, cols: int, row_bytes: int, box_cols: int, box_rows: int) -> TensorMap:
    """The same matrix seen as (64 columns, rows, cols / 64 blocks), boxes of (64, ``box_rows``, ``box_cols`` /
    64): a box lands block after block, each block's rows 128 bytes apart (``skinny_wg.cu``'s layout, wgmma's
    canonical K-major one). ``ValueError`` / ``RuntimeError`` as ``encode_matrix_map``."""
    check_matrix_map(addr, rows, cols, row_bytes, box_cols, box_rows)
    return encode_tiled_map(addr, (64, rows, cols // 64), (row_bytes, 128), (64, box_rows, box_cols // 64))


def encode_swiglu_map(addr: int, half_rows: int, cols: int, box_cols: int, box_rows: int) -> TensorMap:
    """The contiguous bf16 ``[gate | up]`` weight ``[2 half_rows, cols]`` seen as 5-D: (64 columns, 8 rows, gate |
    up, half_rows / 8 groups, cols / 64 blocks), boxes of (64, 8, 2, ``box_rows`` / 16, ``box_cols`` / 64): a box
    lands block after block, each block's 8-row groups gate, up, gate, up, .. (``skinny_wg.cu``'s SwiGLU layout).
    ``half_rows`` % 8 == 0 and ``box_rows`` % 16 == 0. ``ValueError`` / ``RuntimeError`` as ``encode_matrix_map``."""
    check_matrix_map(addr, 2 * half_rows, cols, 2 * cols, box_cols, box_rows)
    if half_rows % 8 or box_rows % 16:
        raise ValueError(f"half_rows ({half_rows}) must be a multiple of 8 and box_rows ({box_rows}) of 16")
    row = 2 * cols
    return encode_tiled_map(addr, (64, 8, 2, half_rows // 8, cols // 64), (row, half_rows * row, 8 * row, 128),
                            (64, 8, 2, box_rows // 16, box_cols // 64))


def encode_tiled_map(addr: int, dims: tuple[int, ...], strides: tuple[int, ...], box: tuple[int, ...]) -> TensorMap:
    """``cuTensorMapEncodeTiled`` of bf16 elements at ``addr``: ``dims`` innermost first (the first contiguous),
    the byte ``strides`` of the others, a ``box`` per copy; 128-byte swizzle, zeros past the edges, L2 promotion
    of 256 bytes. ``RuntimeError`` with the driver's error name if the driver refuses."""
    if not 1 <= len(dims) <= 5 or len(strides) != len(dims) - 1 or len(box) != len(dims):
        raise ValueError(f"a tensor map has 1-5 dims, one stride fewer and a box dim each: {dims}, {strides}, {box}")
    lib = _driver()
    if lib is None:
        raise RuntimeError("the CUDA driver has no cuLaunchKernelEx")
    n = len(dims)
    store = ctypes.create_string_buffer(TENSOR_MAP_BYTES + 64)
    at = -ctypes.addressof(store) % 64  # the driver wants the map 64-byte aligned
    c_dims = (ctypes.c_uint64 * n)(*dims)
    c_strides = (ctypes.c_uint64 * max(1, n - 1))(*strides)
    c_box = (ctypes.c_uint32 * n)(*box)
    steps = (ctypes.c_uint32 * n)(*([1] * n))
    rc = lib.cuTensorMapEncodeTiled(ctypes.c_void_p(ctypes.addressof(store) + at), ctypes.c_int(_TMAP_BFLOAT16),
                                    ctypes.c_uint(n), ctypes.c_void_p(addr), c_dims, c_strides, c_box, steps,
                                    ctypes.c_int(0), ctypes.c_int(_TMAP_SWIZZLE_128B), ctypes.c_int(_TMAP_L2_256B),
                                    ctypes.c_int(0))
    if rc != 0:
        raise driver_error(lib, rc, "cuTensorMapEncodeTiled")
    return TensorMap(store.raw[at:at + TENSOR_MAP_BYTES])
