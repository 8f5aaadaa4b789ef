"""Ceilings measured in the same run: device-to-device copy bandwidth and bf16 GEMM TFLOP/s.

The session fixture ``ceilings`` (``_ceilings.py``) measures them once for every bench; this file
records them and times the copy once more through pytest-benchmark.
"""

from __future__ import annotations

import torch

from _bench import Scale, time_fn
from _ceilings import COPY_BYTES

GROUP = "ceilings"


def test_ceilings(benchmark, scale: Scale, ceilings: dict, results) -> None:
    results.describe(GROUP, "Ceilings: copy bandwidth and bf16 GEMM rate", columns=[
        ("what", "ceiling", ""), ("value", "value", ".4g"), ("unit", "unit", ""), ("detail", "problem", ""),
        ("ms", "median ms", ".4g")])
    n = COPY_BYTES[scale.name] // 2
    src = torch.randn(n, device=scale.device).to(torch.bfloat16)
    dst = torch.empty_like(src)
    t = time_fn(benchmark, lambda i: dst.copy_(src), scale, budget_s=0.2)
    assert torch.equal(dst, src)
    again = 2 * src.numel() * 2 / (t.median_ms / 1e3) / 1e9
    results.add(GROUP, what="device-to-device copy (read + write)", value=ceilings["copy_GBps"], unit="GB/s",
                detail=f"{ceilings['copy_bytes'] / 2**30:.2f} GiB moved", ms=ceilings["copy_ms"])
    results.add(GROUP, what="copy, timed again (pytest-benchmark rounds)", value=again, unit="GB/s",
                detail="same problem", ms=t.median_ms)
    results.add(GROUP, what="bf16 GEMM (torch.matmul)", value=ceilings["gemm_TFLOPs"], unit="TFLOP/s",
                detail=ceilings["gemm_shape"], ms=ceilings["gemm_ms"])
    if scale.gpu:
        results.note(GROUP, "DESIGN §5 expects about 4250 GB/s copy and 790 TFLOP/s bf16 on an H200.")
    assert ceilings["copy_GBps"] > 0 and ceilings["gemm_TFLOPs"] > 0
