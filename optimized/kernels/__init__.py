"""CUDA kernels of the optimized engine, compiled at run time through CuPy's ``RawModule`` (NVRTC).

One ``.cu`` file per reference twin lives next to this module (``attention.cu``, ``gemm.cu``,
``skinny_gemm.cu``, ``sampling.cu``, ``rmsnorm.cu``, ``rope.cu``, ``activation.cu``, ``embedding.cu``, ``kv_cache.cu``).
Each exposes plain ``extern "C" __global__`` kernels (templated internals are instantiated under
explicit names such as ``paged_prefill_d128``) and includes ``<cuda_bf16.h>`` and, for the
tensor-core kernels, the local header ``mma.cuh``. nvcc finds that header beside the source (see
``python -m optimized.kernels.build_check``); for NVRTC ``source()`` pastes local headers into the
text, so CuPy's disk cache (keyed by the text) notices a change to a header too.

``load(name)`` compiles ``<name>.cu`` once per process and device (memoised). CuPy also caches the
compiled binary on disk, keyed by the source text, the options and the NVRTC version, so a second
process on the same machine skips compilation: the cache lives in ``~/.cupy/kernel_cache`` unless
the ``CUPY_CACHE_DIR`` environment variable names another folder (set it before CuPy compiles
anything, e.g. to a folder shared by the workers of one machine). Compile (call ``load`` or run
one launch of each kernel) before any CUDA-graph capture.

CuPy is imported lazily, inside the functions, so ``import optimized`` works without CuPy.
"""

from __future__ import annotations

import re
import threading
from pathlib import Path

KERNEL_DIR = Path(__file__).resolve().parent

#: every kernel source of the package (file stem -> the kernels it defines)
SOURCES: dict[str, tuple[str, ...]] = {
    "attention": (
        "paged_prefill_d16", "paged_prefill_d32", "paged_prefill_d64", "paged_prefill_d128",
        "paged_prefill_d64_x2", "paged_prefill_d128_x2",
        "split_kv_partials_d16", "split_kv_partials_d32", "split_kv_partials_d64", "split_kv_partials_d128",
        "split_kv_reduce", "merge_states",
    ),
    "gemm": tuple(f"gemm_{tile}_{out}" for tile in ("16x32", "64x64", "128x64", "split_16x64", "split_64x64")
                  for out in ("bf16", "f32")),
    "skinny_gemm": tuple(f"skinny_{kind}" for m in (8, 16) for w in (4, 8, 16)
                         for kind in (f"m{m}_w{w}_bf16", f"m{m}_w{w}_f32", f"swiglu_m{m}_w{w}")),
    "sampling": ("sample_partial", "sample"),
    "rmsnorm": ("rmsnorm", "add_rmsnorm"),
    "rope": ("qk_norm_rope",),
    "activation": ("silu_mul",),
    "embedding": ("embedding",),
    "kv_cache": ("store_kvcache",),
}

#: fixed NVRTC options. The target architecture is not listed: CuPy appends ``-arch=sm_XY`` of
#: the *current device* itself (and ``-ftz=true``); a second architecture flag would clash with it.
OPTIONS: tuple[str, ...] = ("-std=c++17",)

_lock = threading.Lock()
_modules: dict[tuple[str, int], object] = {}


_LOCAL_INCLUDE = re.compile(r'^#include "([A-Za-z0-9_]+\.cuh)"[ \t]*$', re.MULTILINE)


def source(name: str) -> str:
    """The text of ``<name>.cu`` with its local ``#include "x.cuh"`` headers pasted in (once each)."""
    if name not in SOURCES:
        raise KeyError(f"unknown kernel source {name!r}; known: {sorted(SOURCES)}")
    return with_headers((KERNEL_DIR / f"{name}.cu").read_text())


def with_headers(text: str) -> str:
    """A kernel source ``text`` with the local ``#include "x.cuh"`` headers of ``KERNEL_DIR`` pasted in,
    each once (what NVRTC compiles: it does not search the source's folder)."""
    seen: set[str] = set()

    def paste(m: re.Match) -> str:
        header = m.group(1)
        if header in seen:
            return ""
        seen.add(header)
        return _LOCAL_INCLUDE.sub(paste, (KERNEL_DIR / header).read_text())

    return _LOCAL_INCLUDE.sub(paste, text)


def load(name: str):
    """``cupy.RawModule`` of ``<name>.cu`` for the current CuPy device, compiled once per process."""
    import cupy  # lazy: optional dependency

    dev = cupy.cuda.Device().id
    key = (name, dev)
    mod = _modules.get(key)
    if mod is None:
        with _lock:
            mod = _modules.get(key)
            if mod is None:
                mod = cupy.RawModule(code=source(name), options=OPTIONS)
                mod.compile()  # compile now (not at the first launch, which may sit inside a graph capture)
                _modules[key] = mod
    return mod


def load_all() -> None:
    """Compile every kernel source for the current device (warm-up before graph capture)."""
    for name in SOURCES:
        load(name)


__all__ = ["KERNEL_DIR", "OPTIONS", "SOURCES", "load", "load_all", "source", "with_headers"]
