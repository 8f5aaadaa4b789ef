#!/usr/bin/env bash
# Thirteenth session's device calls (run from the repository root): bash benches/gpu/h200_wgmma_round.sh MODE
#   first:  the wgmma prefill kernels (paged_prefill_d128_wg64 / _wg128, attention.cu built for sm_90a): which
#           target the attention module got, their registers, check_kernels' prefill and fused-RoPE sections
#           (the flash rule for every variant; bits within each MMA family) and every variant's time on the
#           twelve problems of the prefill lab (probe_kernels.py). The session ran it four times: the kernels with
#           unswizzled (interleaved) K/V tiles, then 128-byte-swizzled tiles, then P V deferred behind the next
#           S, then (the tree) the two-warpgroup kernel's S of the next tile during the softmax
#   ncu:    Nsight Compute (speed of light, warp states, compute workload) on the first launch of x2, wg64 and
#           wg128 at 8 x 1024 over 4096 and at 32 x 256 over 16384 (probe_kernels.py)
#   order:  the prefill CTAs' launch order in one process: the tree of that call (a KV head's tiles, heaviest
#           first, then the next head's) against the same file built with -DTK_PREFILL_HEAVY_FIRST (every head
#           of the heaviest tile first, from the same grid by a division in the kernel), ab_attention.py --only
#           prefill over its nine problems, every variant. (The switch left the tree after the call: the mma.sync
#           kernels now take that order from a grid of (n_kv, tiles), built by ops.paged_prefill.)
#   final2: the same as final after the order change, then the agentic workload (its own tarball)
#   conf:   conformance at CI scale on the optimized engine (every prefill now on the (n_kv, tiles) grid)
#   recheck: after a refactor that re-scheduled the wgmma kernels' SASS (the tile's softmax as a helper; the
#           same instruction count): check_kernels' prefill section and the wgmma variants beside x2 on three
#           lab problems (probe_kernels.py)
#   lab:    the prefill lab again after ops.prefill_variant went back to the mma.sync kernels everywhere
#           (the lab's rows: the engine's choice, the 64-row kernel and wg128 forced, SDPA flash and cuDNN)
#   final:  check_kernels' prefill and fused-RoPE sections (every variant bitwise equal within its tile size),
#           the engine smoke test, then the prefill lab (benches/run_gpu.sh -k kernel_prefill: the engine's
#           choice with the problem's mean keys, the mma.sync kernels forced, SDPA flash and cuDNN)
source benches/gpu/_env.sh
mode=${1:-first}
nvidia-smi --query-gpu=name,clocks.max.sm,clocks.max.mem --format=csv,noheader
build_kernels
# prefill_lab SECONDS: the prefill lab (its reports under $OUT/bench) and its rows of ours and of SDPA flash
prefill_lab() {
  run_benches "$1" "kernel_prefill"
  grep -E "paged prefill: speed|[|] (turnkv|sdpa flash)" "$OUT/bench/kernel_prefill.md" | cut -d"|" -f2-10 | head -70
}
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
  prefill_lab 420
  pack_bench
fi
if [ "$mode" = ncu ]; then
  for p in 8,1024,4096 32,256,16384; do
    for k in x2 wg64 wg128; do ncu_prefill $k $p 120; done
  done
fi
if [ "$mode" = final2 ]; then
  checks 240 check_kernels_order.log prefill fused_rope
  smoke 240
  prefill_lab 300
  pack_bench
  mv "$OUT/bench.tgz" "$OUT/bench_prefill.tgz"
  run_benches 300 "agentic"
  pack_bench
fi
if [ "$mode" = lab ]; then
  prefill_lab 300
  pack_bench
fi
if [ "$mode" = conf ]; then
  conformance_ci 330
fi
if [ "$mode" = recheck ]; then
  checks 100 check_kernels_recheck.log prefill
  timeout 60 python3 benches/gpu/probe_kernels.py --only prefill --reps 20 --prefill-problems 8,1024,0 32,256,16384 \
    2,4096,16384 > "$OUT/probe_prefill_recheck.log" 2>&1
  echo "probe rc=$?"; cat "$OUT/probe_prefill_recheck.log"
fi
