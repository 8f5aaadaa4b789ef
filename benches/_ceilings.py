"""The two physical limits every bench is divided by, measured in the same run.

* copy: a large device-to-device copy, bytes read + bytes written over time (``dst.copy_(src)``);
* GEMM: a large bf16 ``torch.matmul`` (cuBLAS, fp32 accumulation) on random data, 2·M·N·K over time.
"""

from __future__ import annotations

import statistics
import time

import torch

from _bench import Scale

#: problem sizes (cpu, gpu)
COPY_BYTES = {"cpu": 32 << 20, "gpu": 2 << 30}
GEMM_MNK = {"cpu": (512, 512, 512), "gpu": (8192, 8192, 8192)}
REPS = {"cpu": 5, "gpu": 30}


def _median_time(fn, scale: Scale, reps: int, warmup: int = 3) -> float:
    """Median seconds of ``fn`` (CUDA events on the GPU, after warm-up)."""
    for _ in range(warmup):
        fn()
    ts = []
    for _ in range(reps):
        if scale.gpu:
            a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            a.record()
            fn()
            b.record()
            b.synchronize()
            ts.append(a.elapsed_time(b) / 1e3)
        else:
            t0 = time.perf_counter()
            fn()
            ts.append(time.perf_counter() - t0)
    return statistics.median(ts)


def measure_ceilings(scale: Scale) -> dict:
    dev = scale.device
    n = COPY_BYTES[scale.name] // 2
    src = torch.randn(n, device=dev, dtype=torch.float32).to(torch.bfloat16)   # random data, never zeros
    dst = torch.empty_like(src)
    t_copy = _median_time(lambda: dst.copy_(src), scale, REPS[scale.name])
    assert torch.equal(dst, src), "copy ceiling: the copy is wrong"
    copy_bytes = 2 * src.numel() * src.element_size()
    src = dst = None   # free before the GEMM buffers

    M, N, K = GEMM_MNK[scale.name]
    g = torch.Generator(device=dev).manual_seed(0)
    a = torch.randn(M, K, device=dev, generator=g).to(torch.bfloat16)
    b = torch.randn(K, N, device=dev, generator=g).to(torch.bfloat16)
    c = torch.matmul(a, b)
    rows = torch.arange(0, M, max(1, M // 64), device=dev)
    ref = (a[rows].double() @ b.double())
    rel = float((c[rows].double() - ref).norm() / ref.norm())
    assert rel < 1e-2, f"GEMM ceiling: relative error {rel:.2e} vs float64"
    t_gemm = _median_time(lambda: torch.matmul(a, b, out=c), scale, REPS[scale.name])
    return {
        "copy_GBps": copy_bytes / t_copy / 1e9, "copy_bytes": copy_bytes, "copy_ms": t_copy * 1e3,
        "gemm_TFLOPs": 2 * M * N * K / t_gemm / 1e12, "gemm_shape": f"{M}x{N}x{K}", "gemm_ms": t_gemm * 1e3,
        "gemm_rel_err": rel,
    }
