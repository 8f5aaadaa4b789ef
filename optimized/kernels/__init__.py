"""CUDA kernels of the optimized engine, compiled at run time through CuPy's ``RawModule`` (NVRTC).

One ``.cu`` file per reference twin lives next to this module (``attention.cu``, ``gemm.cu``,
``skinny_gemm.cu``, ``skinny_wg.cu``, ``sampling.cu``, ``rmsnorm.cu``, ``rope.cu``, ``activation.cu``,
``embedding.cu``, ``kv_cache.cu``).
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

import contextlib
import os
import re
import threading
from pathlib import Path

KERNEL_DIR = Path(__file__).resolve().parent

#: skinny_wg.cu's configurations (KC, S, NX, WT, KP) and those of its folded add_rmsnorm's kernels (KC, S, NX, KP;
#: WT = 1), what ops.SKINNY_WG_CONFIGS and ops.SKINNY_WG_NORM_CONFIGS say. The first of each (NX, WT, KP) is the
#: default; the last ones, 4 stages at 32 x rows, are ``stages=4``'s (two CTAs a multiprocessor)
SKINNY_WG_CONFIGS = ((128, 8, 32, 1, 1), (128, 8, 32, 1, 2), (128, 8, 32, 1, 4), (128, 6, 32, 1, 8),
                     (128, 6, 64, 1, 1), (128, 6, 64, 1, 2), (128, 5, 64, 1, 4), (128, 3, 64, 1, 8),
                     (128, 5, 32, 2, 1), (128, 5, 32, 2, 2), (128, 4, 32, 2, 4),
                     (128, 4, 64, 2, 1), (128, 3, 64, 2, 2),
                     (128, 4, 32, 1, 1), (128, 4, 32, 1, 4))
SKINNY_WG_NORM_CONFIGS = ((128, 8, 32, 1), (128, 8, 32, 2), (128, 8, 32, 4), (128, 6, 32, 8), (128, 6, 64, 1),
                          (128, 6, 64, 2), (128, 5, 64, 4),
                          (128, 4, 32, 1), (128, 4, 32, 4))


def skinny_wg_spreads(nx: int, wt: int, kp: int) -> bool:
    """Whether the warpgroup kernel can spread its split-K fold (``skinny_wg``'s ``spread``) for an x tile of ``nx``
    rows, ``wt`` tiles a unit and ``kp`` CTAs splitting K: a unit's ``wt * nx / 8`` fragment blocks divide among the
    ``kp`` > 1 CTAs (``OWN`` in ``skinny_wg.cu``), which is where the configuration has ``_sp`` kernels."""
    return kp > 1 and (wt * nx // 8) % kp == 0


#: every kernel source of the package (file stem -> the kernels it defines)
SOURCES: dict[str, tuple[str, ...]] = {
    "attention": (
        "paged_prefill_d16", "paged_prefill_d32", "paged_prefill_d64", "paged_prefill_d128",
        "paged_prefill_d64_x2", "paged_prefill_d128_x2", "paged_prefill_d128_wg64", "paged_prefill_d128_wg128",
        "paged_prefill_d128_ws",
        "split_kv_partials_d16", "split_kv_partials_d32", "split_kv_partials_d64", "split_kv_partials_d128",
        "split_kv_qk_partials_d16", "split_kv_qk_partials_d32", "split_kv_qk_partials_d64",
        "split_kv_qk_partials_d128",
        "split_kv_reduce", "merge_states",
    ),
    "gemm": tuple(f"gemm_{tile}_{out}" for tile in ("16x32", "64x64", "128x64", "split_16x64", "split_64x64")
                  for out in ("bf16", "f32"))
    + tuple(f"gemm_staged_m{r}_s{s}c{c}_{out}" for r, s, c in ((8, 4, 1), (8, 4, 2), (16, 3, 1), (16, 3, 2),
                                                              (32, 2, 1), (32, 4, 1))
            for out in ("bf16", "f32"))
    + tuple(f"gemm_wide_{tile}_{out}" for tile in ("m16_n64_k256s4", "m16_n64_k512s2", "m32_n32_k256s3",
                                                   "m32_n64_k256s4", "m32_n64_k512s2", "m64_n32_k256s2",
                                                   "m64_n32_k256s2w8", "m64_n64_k256s3w8", "m128_n64_k128s4w8",
                                                   "m128_n32_k256s2w8", "m128_n64_k128s4w16")
            for out in ("bf16", "f32", "swiglu")),
    "skinny_gemm": tuple(f"skinny_{kind}" for m in (8, 16) for w in (4, 8, 16)
                         for kind in (f"m{m}_w{w}_bf16", f"m{m}_w{w}_f32", f"swiglu_m{m}_w{w}"))
    + tuple(f"skinny_staged_k{kc}s{s}p{pl}_{kind}" for kc, s, pl in ((512, 2, 16), (512, 3, 16), (512, 4, 16),
                                                                     (1024, 3, 16), (1024, 4, 16), (2048, 2, 16),
                                                                     (2048, 3, 16))
            for kind in ("bf16", "f32", "swiglu"))
    + tuple(f"skinny_staged_k{kc}s{s}p{pl}t{tp}_m{m}_{kind}"
            for m, kc, s, pl, tp in ((16, 512, 3, 16, 1), (16, 512, 4, 16, 1), (32, 512, 3, 16, 1),
                                     (32, 512, 2, 16, 2))
            for kind in ("bf16", "f32", "swiglu"))
    + tuple(f"skinny_cluster_k{kc}s{s}t{tp}c{c}_m64_{kind}"
            for kc, s, tp, c in ((256, 3, 2, 4), (256, 4, 2, 4), (256, 5, 1, 4), (512, 2, 2, 4))
            for kind in ("bf16", "f32", "swiglu"))
    + tuple(f"skinny_cluster_k{kc}s{s}t{tp}c{c}w8_m64_{kind}" for kc, s, tp, c in ((256, 4, 2, 4), (512, 2, 2, 4))
            for kind in ("bf16", "f32", "swiglu")),
    "skinny_wg": tuple(f"skinny_wg_k{kc}s{s}n{nx}t{wt}p{kp}_{kind}{sp}" for kc, s, nx, wt, kp in SKINNY_WG_CONFIGS
                       for sp in ("", "_sp")[:1 + skinny_wg_spreads(nx, wt, kp)]
                       for kind in ("bf16", "f32", "swiglu"))
    + tuple(f"skinny_wg_k{kc}s{s}n{nx}t1p{kp}_{kind}{sp}" for kc, s, nx, kp in SKINNY_WG_NORM_CONFIGS
            for sp in ("", "_sp")[:1 + skinny_wg_spreads(nx, 1, kp)]
            for kind in ("res", "bf16n", "swiglun")),
    "sampling": ("sample_partial", "sample"),
    "rmsnorm": ("rmsnorm", "add_rmsnorm", "embed_rmsnorm"),
    "rope": ("qk_norm_rope",),
    "activation": ("silu_mul",),
    "embedding": ("embedding",),
    "kv_cache": ("store_kvcache", "kv_prefetch"),
}

#: fixed NVRTC options. The target architecture is not listed: CuPy appends ``-arch=sm_XY`` of
#: the *current device* itself (and ``-ftz=true``); a second architecture flag would clash with it.
OPTIONS: tuple[str, ...] = ("-std=c++17",)

#: sources built for an architecture-specific target on a device of that compute capability:
#: (source, (major, minor)) -> NVRTC target. attention.cu's wgmma prefill kernels
#: (``paged_prefill_d128_wg*``) use instructions of exactly sm_90 that PTX for plain ``sm_90`` may not
#: (``wgmma.mma_async``: the "a" targets); the file's other kernels compile to the same SASS either way
#: (nvcc 13.0, compared instruction for instruction). Elsewhere the file is built as every other, and
#: the wgmma kernels trap (``ops`` never launches them there: ``ops.prefill_variants``). skinny_wg.cu
#: (the warpgroup GEMM) has nothing but wgmma kernels: they trap in a plain build, and ``ops.skinny_wg``
#: launches them only where it is built for its target.
#: ``TURNKV_ARCH_SPECIFIC=0`` turns these builds off (the plain build everywhere).
ARCH_TARGETS: dict[tuple[str, tuple[int, int]], str] = {("attention", (9, 0)): "sm_90a", ("skinny_wg", (9, 0)): "sm_90a"}

_lock = threading.Lock()
_modules: dict[tuple[str, int], object] = {}
_targets: dict[tuple[str, int], str | None] = {}


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


def arch_target(name: str, capability: tuple[int, int]) -> str | None:
    """The architecture-specific NVRTC target ``<name>.cu`` is built for on a device of compute
    ``capability`` (``ARCH_TARGETS``), or None for CuPy's plain ``sm_XY``."""
    if os.environ.get("TURNKV_ARCH_SPECIFIC", "1") == "0":
        return None
    return ARCH_TARGETS.get((name, tuple(capability)))


@contextlib.contextmanager
def _nvrtc_target(target: str):
    """CuPy's NVRTC path with ``-arch=<target>`` in place of the ``-arch=sm_XY`` it derives from the
    device (CuPy has no option for the "a" targets: its architecture is a number). CuPy takes that
    flag, with the output kind, from one helper (also part of its disk-cache key, so the two builds
    are cached apart); it is replaced for the duration of one compile, under ``_lock``."""
    from cupy.cuda import compiler

    helper = compiler._get_arch_for_options_for_nvrtc
    compiler._get_arch_for_options_for_nvrtc = lambda arch=None: (f"-arch={target}", "cubin")
    try:
        yield
    finally:
        compiler._get_arch_for_options_for_nvrtc = helper


def load(name: str):
    """``cupy.RawModule`` of ``<name>.cu`` for the current CuPy device, compiled once per process (for
    the device's ``ARCH_TARGETS`` entry where it has one)."""
    import cupy  # lazy: optional dependency

    dev = cupy.cuda.Device().id
    key = (name, dev)
    mod = _modules.get(key)
    if mod is None:
        with _lock:
            mod = _modules.get(key)
            if mod is None:
                cc = cupy.cuda.Device(dev).compute_capability  # "90"
                target = arch_target(name, (int(cc[:-1]), int(cc[-1])))
                mod = cupy.RawModule(code=source(name), options=OPTIONS)
                if target is not None:
                    with _nvrtc_target(target):
                        mod.compile()
                else:
                    mod.compile()  # compile now (not at the first launch, which may sit inside a graph capture)
                _targets[key] = target
                _modules[key] = mod
    return mod


def target(name: str, dev: int) -> str | None:
    """The architecture-specific target ``load(name)`` built for device ``dev`` (None: the plain build)."""
    import cupy

    with cupy.cuda.Device(dev):
        load(name)
    return _targets[(name, dev)]


def load_all() -> None:
    """Compile every kernel source for the current device (warm-up before graph capture)."""
    for name in SOURCES:
        load(name)


__all__ = ["ARCH_TARGETS", "KERNEL_DIR", "OPTIONS", "SOURCES", "arch_target", "load", "load_all", "source", "target",
           "with_headers"]
