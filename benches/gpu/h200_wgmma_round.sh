#!/usr/bin/env bash
# Thirteenth session's device calls (run from the repository root): bash benches/gpu/h200_wgmma_round.sh MODE
#   first:  the wgmma prefill kernels (paged_prefill_d128_wg64 / _wg128, attention.cu built for sm_90a): which
#           target the attention module got, their registers, check_kernels' prefill and fused-RoPE sections
#           (the flash rule for every variant; bits within each MMA family) and every variant's time on the
#           twelve problems of the prefill lab (probe_kernels.py). The session ran it four times: the kernels with
#           unswizzled (interleaved) K/V tiles, then 128-byte-swizzled tiles, then P V deferred behind the next
#           S, then (the tree) the two-warpgroup kernel's S of the next tile during the softmax
#   final:  check_kernels' prefill and fused-RoPE sections (every variant bitwise equal within its tile size),
#           the engine smoke test, then the prefill lab (benches/run_gpu.sh -k kernel_prefill: the engine's
#           choice with the problem's mean keys, the mma.sync kernels forced, SDPA flash and cuDNN)
source benches/gpu/_env.sh
mode=${1:-first}
nvidia-smi --query-gpu=name,clocks.max.sm,clocks.max.mem --format=csv,noheader
build_kernels
LAB="32,256,0 32,256,1024 32,256,4096 32,256,16384 8,1024,0 8,1024,1024 8,1024,4096 8,1024,16384 2,4096,0 2,4096,1024 2,4096,4096 2,4096,16384"
if [ "$mode" = first ]; then
  python3 - <<'PY' 2>&1 | tee "$OUT/wg_build.log"
import torch
from optimized import kernels, ops
print("attention target:", kernels.target("attention", 0), "variants:", ops.prefill_variants(128, 0))
mod = kernels.load("attention")
for n in ("paged_prefill_d128_x2", "paged_prefill_d128", "paged_prefill_d128_wg64", "paged_prefill_d128_wg128"):
    a = mod.get_function(n).attributes
    print(n, "regs", a["num_regs"], "local", a["local_size_bytes"], "static smem", a["shared_size_bytes"])
PY
  checks 240 check_kernels_wg.log prefill fused_rope
  grep -E "vs \[default\]" "$OUT/check_kernels_wg.log" | head -20
  timeout 200 python3 benches/gpu/probe_kernels.py --only prefill --reps 20 --prefill-problems $LAB \
    > "$OUT/probe_prefill_wg.log" 2>&1
  echo "probe rc=$?"; cat "$OUT/probe_prefill_wg.log" | tail -60
fi
if [ "$mode" = final ]; then
  checks 240 check_kernels_wg_final.log prefill fused_rope
  smoke 240
  run_benches 420 "kernel_prefill"
  grep -E "paged prefill: speed|[|] (turnkv|sdpa flash)" "$OUT/bench/kernel_prefill.md" | cut -d"|" -f2-10 | head -70
  pack_bench
fi
