#!/usr/bin/env bash
# Twenty-fourth session's device calls: the warp-specialised wgmma prefill (paged_prefill_d128_ws, variant "ws";
# docs/performance/prefill.md, "Warp specialisation"; run from the repository root):
#   bash benches/gpu/h200_ws_round.sh MODE
#   first:  one small ws launch against x2 under a 60 s guard (a hang of the new barriers stops the call there),
#           check_kernels.py --only prefill fused_rope (every variant, bits equal within a tile size; stops on a
#           failure), then probe_ws.py over the prefill lab's twelve problems (x2, wg128, ws and SDPA flash in one
#           process)
#   engine: (ws on by default, a persistent grid of ops.WS_CTAS_PER_SM CTAs a multiprocessor) the sanity launches and
#           checks as in first, the consumers taking turns (-DTK_WS_PINGPONG) against free drift in one process
#           (ab_attention.py, ws only), probe_ws.py on problems around the rule's threshold (WS_MIN_MEAN_KEYS) and on
#           small grids (the 64-row, x2 and ws kernels, ws with a CTA per work item: ws:0), the lab's problems
#           (x2, ws:0, ws, ws:2), the engine smoke test
#   checks: (the consumers' turns on by default, the persistent grid up to 256-token chunks) the sanity launches and
#           checks as in first, conformance at CI scale and the GPU-scale qwen3-8b clauses, then the prefill lab (benches/run_gpu.sh -k
#           kernel_prefill)
#   agentic: the agentic bench (benches/run_gpu.sh -k agentic)
#   abagentic: ab_agentic_prefill.py, the agentic workload's engine run with ws against x2 in one process
#   ncu:    Nsight Compute on the first ws launch at 8 x 1024 over 4096 and 32 x 256 over 16384 (the thirteenth session's
#           profiles of x2, wg64 and wg128 are at the same problems)
#   TAG: the files' suffix (default _MODE)
source benches/gpu/_env.sh
mode=${1:-first}
tag=${TAG:-_$mode}
nvidia-smi --query-gpu=name,clocks.max.sm,clocks.max.mem --format=csv,noheader
build_kernels
# sanity_and_checks: the 60 s guarded ws launches, then check_kernels' prefill and fused-RoPE sections (exit on a failure)
sanity_and_checks() {
  timeout 60 python3 - > "$OUT/ws_sanity$tag.log" 2>&1 <<'PY'
import sys
sys.path.insert(0, 'benches')
import torch
from _attn import paged_problem
from optimized import ops
gen = torch.Generator(device="cuda").manual_seed(1)
for nseq, C, P in ((2, 64, 0), (3, 100, 300), (4, 256, 1024)):
    p = paged_problem(nseq, P + C, 8, 128, 16, torch.bfloat16, "cuda", gen)
    q = torch.randn(nseq * C, 32, 128, device="cuda", generator=gen).to(torch.bfloat16)
    pos = torch.arange(P, P + C, device="cuda", dtype=torch.int32).repeat(nseq)
    idx = torch.arange(nseq, device="cuda", dtype=torch.int32).repeat_interleave(C)
    a = ops.paged_prefill(q, p.k_cache, p.v_cache, p.tables, p.lens, idx, pos, variant="x2")
    b = ops.paged_prefill(q, p.k_cache, p.v_cache, p.tables, p.lens, idx, pos, variant="ws")
    torch.cuda.synchronize()
    print(nseq, C, P, "bitwise" if torch.equal(a, b) else f"DIFFER max {(a.float() - b.float()).abs().max().item():.3e}")
PY
  rc=$?; echo "ws sanity rc=$rc"; cat "$OUT/ws_sanity$tag.log" | tail -8
  [ $rc -ne 0 ] && exit 1
  checks 300 check_kernels_ws$tag.log prefill fused_rope
  grep -q "FAIL" "$OUT/check_kernels_ws$tag.log" && exit 1
}
if [ "$mode" = first ]; then
  sanity_and_checks
  timeout 240 python3 benches/gpu/probe_ws.py > "$OUT/probe_ws$tag.log" 2>&1
  echo "probe_ws rc=$?"; cat "$OUT/probe_ws$tag.log"
fi
if [ "$mode" = engine ]; then
  sanity_and_checks
  # the consumers taking turns to issue their MMAs (-DTK_WS_PINGPONG, "base") against the tree's free drift ("new");
  # (after this call the turns became the default and the switch TK_WS_NO_PINGPONG turns them off)
  V=optimized/kernels ab 170 attention.cu ab_ws_pingpong$tag.log --base-define TK_WS_PINGPONG --only prefill --variants ws
  # the rule's threshold (mean keys a row sees: 128.5 to 512.5) and small grids, the 64-row, x2 and ws kernels
  timeout 170 python3 benches/gpu/probe_ws.py --variants default x2 ws:0 ws --rounds 3 --problems 32,256,0 64,128,128 \
    64,256,128 32,512,0 128,128,256 16,512,128 8,1024,0 2,512,1024 4,512,1024 8,256,1024 > "$OUT/probe_ws_rule$tag.log" 2>&1
  echo "probe_ws rule rc=$?"; cat "$OUT/probe_ws_rule$tag.log"
  timeout 170 python3 benches/gpu/probe_ws.py --variants x2 ws:0 ws ws:2 --rounds 3 > "$OUT/probe_ws_lab$tag.log" 2>&1
  echo "probe_ws lab rc=$?"; cat "$OUT/probe_ws_lab$tag.log"
  smoke 100; mv "$OUT/engine_smoke.log" "$OUT/engine_smoke_ws$tag.log"
fi
if [ "$mode" = checks ]; then   # the tree with ws on by default: conformance, then the prefill lab
  sanity_and_checks
  conformance_both 240 conformance_gpu_qwen3-8b_ws.log 240
  mv "$OUT/conformance_ci_optimized.log" "$OUT/conformance_ci_optimized_ws.log"
  bench_packed 200 "kernel_prefill" run_gpu_kernel_prefill_ws.log
fi
if [ "$mode" = agentic ]; then
  bench_packed 420 "agentic" run_gpu_agentic_ws.log
fi
if [ "$mode" = abagentic ]; then   # the agentic workload's engine run with ws against x2, in one process
  timeout 400 python3 benches/gpu/ab_agentic_prefill.py --rounds 3 > "$OUT/ab_agentic_prefill$tag.log" 2>&1
  echo "ab_agentic_prefill rc=$?"; tail -12 "$OUT/ab_agentic_prefill$tag.log"
fi
if [ "$mode" = ncu ]; then   # Nsight Compute on the first ws launch at the thirteenth session's two problems
  for p in 8,1024,4096 32,256,16384; do ncu_prefill ws $p 110; done
fi
