"""Programmatic edges into cuBLAS's kernels in a captured CUDA graph (``CudaRunner.blas_pdl``).

Our kernels are launched with programmatic stream serialization (``optimized/launch.py``), so a captured
decode graph holds a *programmatic* edge into each of them: the kernel may start while the one before
it runs, and its ``griddepcontrol.wait`` holds every thread until that one has completed. cuBLAS
launches its kernels itself, without the attribute, so the edge into a cuBLAS GEMM is a full
dependency: the GEMM's CTAs are launched only once the kernel before has drained. A decode step of
17-256 rows has four cuBLAS GEMMs a layer.

This module rewrites such edges after the capture (the graph must be kept: ``torch.cuda.CUDAGraph(
keep_graph=True)``, then ``instantiate``). That is correct only for kernels that themselves wait on the
grid dependency before reading what the kernel before wrote. Whether cuBLAS's kernels do is a fact of
the cuBLAS build, measured on the GPU by ``benches/gpu/probe_blas_pdl.py`` (a kernel that writes the
GEMM's input 200 us after it lets dependents start: a GEMM behind a programmatic edge that does not
wait reads the old input). cuBLASLt 13.1's GEMM kernels do not wait, so ``CudaRunner.blas_pdl`` is a
measurement switch, off, and warns when it is turned on.

What is kept pure (and tested on the CPU): ``select_edges``, which edges to rewrite given the graph's
edges and its kernel nodes' names. The rest talks to ``libcuda`` through ``ctypes`` (CUDA 12.3+:
``cuGraphGetEdges_v2``, ``cuGraphAddDependencies_v2``, ``cuGraphRemoveDependencies_v2``,
``cuFuncGetName``, ``cuKernelGetName``).
"""

from __future__ import annotations

import ctypes
import re
from dataclasses import dataclass

from . import launch

#: ``CU_GRAPH_NODE_TYPE_KERNEL`` (cuda.h)
NODE_KERNEL = 0
#: ``CU_GRAPH_DEPENDENCY_TYPE_DEFAULT`` / ``_PROGRAMMATIC``
DEP_DEFAULT, DEP_PROGRAMMATIC = 0, 1
#: ``CU_GRAPH_KERNEL_NODE_PORT_DEFAULT`` / ``_PROGRAMMATIC``: the downstream kernel may launch once every
#: CTA of the upstream one has triggered (``griddepcontrol.launch_dependents``) or exited
PORT_DEFAULT, PORT_PROGRAMMATIC = 0, 1


class _EdgeData(ctypes.Structure):
    """``CUgraphEdgeData``: from_port, to_port, type, 5 reserved bytes."""
    _fields_ = [("from_port", ctypes.c_ubyte), ("to_port", ctypes.c_ubyte), ("type", ctypes.c_ubyte),
                ("reserved", ctypes.c_ubyte * 5)]


class _KernelNodeParams(ctypes.Structure):
    """``CUDA_KERNEL_NODE_PARAMS_v2`` (func is NULL when the node launches a ``CUkernel``, ``kern``)."""
    _fields_ = [("func", ctypes.c_void_p), ("grid", ctypes.c_uint * 3), ("block", ctypes.c_uint * 3),
                ("sharedMemBytes", ctypes.c_uint), ("kernelParams", ctypes.c_void_p), ("extra", ctypes.c_void_p),
                ("kern", ctypes.c_void_p), ("ctx", ctypes.c_void_p)]


assert ctypes.sizeof(_EdgeData) == 8 and _KernelNodeParams.kern.offset == 56


@dataclass(frozen=True, slots=True)
class Edge:
    """One dependency of a graph: node handles and the edge's (from_port, to_port, type)."""
    src: int
    dst: int
    from_port: int = PORT_DEFAULT
    to_port: int = 0
    type: int = DEP_DEFAULT


def select_edges(edges: list[Edge], kernels: dict[int, str], pattern: str) -> list[Edge]:
    """The full dependencies to rewrite as programmatic: edges between two kernel nodes (``kernels``: node ->
    kernel name) that are ordinary (port and type 0) and whose *downstream* kernel's name matches ``pattern``
    (``re.search``). Edges from or to other nodes (copies, memsets, event waits) stay as they are, and so do
    edges already programmatic."""
    if not isinstance(pattern, str) or not pattern:
        raise ValueError(f"pattern must be a non-empty regular expression, got {pattern!r}")
    rx = re.compile(pattern)
    return [e for e in edges
            if e.src in kernels and e.dst in kernels and e.type == DEP_DEFAULT and e.from_port == PORT_DEFAULT
            and rx.search(kernels[e.dst])]


def _check(lib, rc: int, what: str) -> None:
    if rc != 0:
        raise launch.driver_error(lib, rc, what)


def _lib():
    """``libcuda`` as ``optimized/launch.py`` loads it."""
    lib = launch._driver()
    if lib is None:
        raise RuntimeError("the CUDA driver is missing (or has no cuLaunchKernelEx)")
    return lib


def kernel_names(graph: int) -> dict[int, str]:
    """Node handle -> kernel name of every kernel node of the ``CUgraph`` ``graph``."""
    lib = _lib()
    n = ctypes.c_size_t(0)
    _check(lib, lib.cuGraphGetNodes(ctypes.c_void_p(graph), None, ctypes.byref(n)), "cuGraphGetNodes")
    nodes = (ctypes.c_void_p * max(1, n.value))()
    _check(lib, lib.cuGraphGetNodes(ctypes.c_void_p(graph), nodes, ctypes.byref(n)), "cuGraphGetNodes")
    out: dict[int, str] = {}
    for node in nodes[:n.value]:
        t = ctypes.c_int(-1)
        _check(lib, lib.cuGraphNodeGetType(ctypes.c_void_p(node), ctypes.byref(t)), "cuGraphNodeGetType")
        if t.value != NODE_KERNEL:
            continue
        p = _KernelNodeParams()
        _check(lib, lib.cuGraphKernelNodeGetParams_v2(ctypes.c_void_p(node), ctypes.byref(p)),
               "cuGraphKernelNodeGetParams")
        name = ctypes.c_char_p()
        if p.func:
            _check(lib, lib.cuFuncGetName(ctypes.byref(name), ctypes.c_void_p(p.func)), "cuFuncGetName")
        else:
            _check(lib, lib.cuKernelGetName(ctypes.byref(name), ctypes.c_void_p(p.kern)), "cuKernelGetName")
        out[int(node)] = (name.value or b"").decode()
    return out


def graph_edges(graph: int) -> list[Edge]:
    """Every dependency of the ``CUgraph`` ``graph``, with its edge data."""
    lib = _lib()
    n = ctypes.c_size_t(0)
    _check(lib, lib.cuGraphGetEdges_v2(ctypes.c_void_p(graph), None, None, None, ctypes.byref(n)), "cuGraphGetEdges")
    k = max(1, n.value)
    src, dst, data = (ctypes.c_void_p * k)(), (ctypes.c_void_p * k)(), (_EdgeData * k)()
    _check(lib, lib.cuGraphGetEdges_v2(ctypes.c_void_p(graph), src, dst, data, ctypes.byref(n)), "cuGraphGetEdges")
    return [Edge(int(src[i]), int(dst[i]), data[i].from_port, data[i].to_port, data[i].type) for i in range(n.value)]


def make_programmatic(graph: int, pattern: str) -> list[tuple[str, str]]:
    """Rewrite ``select_edges(...)`` of the ``CUgraph`` ``graph`` as programmatic edges (port and type
    programmatic); returns the (upstream, downstream) kernel names of the edges rewritten. An edge is removed
    and added back one at a time, so a failure leaves every other edge as it was (and raises)."""
    lib = _lib()
    kernels = kernel_names(graph)
    chosen = select_edges(graph_edges(graph), kernels, pattern)
    g = ctypes.c_void_p(graph)
    for e in chosen:
        a, b = (ctypes.c_void_p * 1)(e.src), (ctypes.c_void_p * 1)(e.dst)
        old = (_EdgeData * 1)()
        old[0].from_port, old[0].to_port, old[0].type = e.from_port, e.to_port, e.type
        new = (_EdgeData * 1)()
        new[0].from_port, new[0].type = PORT_PROGRAMMATIC, DEP_PROGRAMMATIC
        _check(lib, lib.cuGraphRemoveDependencies_v2(g, a, b, old, ctypes.c_size_t(1)), "cuGraphRemoveDependencies")
        rc = lib.cuGraphAddDependencies_v2(g, a, b, new, ctypes.c_size_t(1))
        if rc != 0:                                  # put the full dependency back before raising
            lib.cuGraphAddDependencies_v2(g, a, b, old, ctypes.c_size_t(1))
            _check(lib, rc, "cuGraphAddDependencies")
    return [(kernels[e.src], kernels[e.dst]) for e in chosen]

