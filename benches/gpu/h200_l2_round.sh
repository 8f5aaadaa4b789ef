#!/usr/bin/env bash
# Twenty-fifth session's device calls: the decode attention at large batch against cuDNN -- where the pages lie,
# the CTAs' waves, the K/V tiles by tensor copies, and an L2 prefetch of the K/V rows further ahead (the lab switch TK_DECODE_L2_AHEAD of attention.cu;
# docs/performance/decode_attention.md, "Decode attention"; run from the repository root):
#   bash benches/gpu/h200_l2_round.sh MODE
#   probe: probe_decode_l2.py on the four shapes where the kernel trails cuDNN and four where it leads: the engine's
#          build and prefetch builds (distances 3, 4 and 6 tiles; plain per-line prefetches; one row a page) over the
#          shuffled, in-order and locally shuffled pages, beside cuDNN (bits checked first)
#   waves: the engine's build at batches whose CTAs fill whole waves of two a multiprocessor (33, 132) beside 32 and 128,
#          and with 2, 3 and 4 splits a sequence (one launch) in place of one
#   tma:   the K/V tiles by tensor copies (split_kv_tma_partials_d128, ops.DECODE_TMA): three launches against the
#          cp.async kernel under a 60 s guard, check_kernels.py --only decode_tma (bits equal), then probe_decode_l2.py
#          with the base and tma variants over shuffled and in-order pages
#   ncu:   Nsight Compute (DRAM and L2 traffic, issue activity) on the base, L2-prefetch and TMA launches at 32 x 4096
#   promo: the TMA maps' L2 promotion (none, 64, 128, 256 bytes) against the cp.async kernel, shuffled pages
#   lab:   the decode lab (benches/run_gpu.sh -k kernel_decode), with its rows over pages in order
#   TAG: the files' suffix (default _MODE)
# The modes probe, tma, ncu and promo need the tree of commit 6ead9e2: the switches they measure (TK_DECODE_L2_AHEAD,
# ops.DECODE_TMA) were dropped after them, and its probe was benches/gpu/probe_decode_l2.py (now probe_decode_cudnn.py).
source benches/gpu/_env.sh
mode=${1:-probe}
tag=${TAG:-_$mode}
case $mode in
  probe|tma|ncu|promo)
    [ -f benches/gpu/probe_decode_l2.py ] || { echo "mode $mode needs the tree of 6ead9e2"; exit 1; } ;;
esac
probe=benches/gpu/probe_decode_cudnn.py
[ -f $probe ] || probe=benches/gpu/probe_decode_l2.py
nvidia-smi --query-gpu=name,clocks.max.sm,clocks.max.mem --format=csv,noheader
if [ "$mode" = probe ]; then
  timeout 400 python3 benches/gpu/probe_decode_l2.py --shapes 32x4096 32x16384 128x1024 128x4096 1x16384 8x4096 8x16384 \
    32x1024 --variants base l2a3:TK_DECODE_L2_AHEAD=3 l2a4:TK_DECODE_L2_AHEAD=4 l2a6:TK_DECODE_L2_AHEAD=6 \
    l2a4p:TK_DECODE_L2_AHEAD=4,TK_DECODE_L2_PLAIN l2a4r16:TK_DECODE_L2_AHEAD=4,TK_DECODE_L2_ROWS=16 \
    > "$OUT/probe_decode_l2$tag.log" 2>&1
  echo "probe_decode_l2 rc=$?"; grep -E "variant|DIFFER|cudnn vs|TB/s|all variants|Error|error" "$OUT/probe_decode_l2$tag.log" | cut -c1-120
fi
if [ "$mode" = waves ]; then   # batches whose CTAs fill whole waves (33 x 8 = 264 = 2 x 132), and forced split counts
  timeout 400 python3 $probe --shapes 32x4096 33x4096 32x16384 33x16384 128x1024 132x1024 \
    128x4096 132x4096 --variants base --layouts shuffled inorder --splits 2 3 4 > "$OUT/probe_decode_waves$tag.log" 2>&1
  echo "probe_decode_l2 rc=$?"; grep -E "DIFFER|TB/s|all variants|Error|error" "$OUT/probe_decode_waves$tag.log" | cut -c1-120
fi
if [ "$mode" = tma ]; then   # the K/V tiles by tensor copies: a guarded first launch, the bitwise checks, then the probe
  timeout 60 python3 - > "$OUT/tma_sanity$tag.log" 2>&1 <<'PY'
import sys
sys.path.insert(0, 'benches')
import torch
from _attn import paged_problem
from optimized import ops
gen = torch.Generator(device="cuda").manual_seed(1)
for B, L in ((2, 100), (8, 1000), (32, 4096)):
    p = paged_problem(B, L, 8, 128, 16, torch.bfloat16, "cuda", gen)
    q = torch.randn(B, 32, 128, device="cuda", generator=gen).to(torch.bfloat16)
    a = ops.split_kv_decode(q, p.k_cache, p.v_cache, p.tables, p.lens, None)
    ops.DECODE_TMA = True
    b = ops.split_kv_decode(q, p.k_cache, p.v_cache, p.tables, p.lens, None)
    ops.DECODE_TMA = False
    torch.cuda.synchronize()
    print(B, L, "bitwise" if torch.equal(a, b) else f"DIFFER max {(a.float() - b.float()).abs().max().item():.3e}")
PY
  rc=$?; echo "tma sanity rc=$rc"; tail -8 "$OUT/tma_sanity$tag.log"
  [ $rc -ne 0 ] && exit 1
  checks 200 check_kernels_decode_tma$tag.log decode_tma
  timeout 300 python3 benches/gpu/probe_decode_l2.py --shapes 32x4096 32x16384 128x1024 128x4096 1x16384 8x4096 \
    8x16384 32x1024 33x4096 --variants base tma --layouts shuffled inorder > "$OUT/probe_decode_tma$tag.log" 2>&1
  echo "probe_decode_l2 rc=$?"; grep -E "DIFFER|TB/s|all variants|Error|error" "$OUT/probe_decode_tma$tag.log" | cut -c1-100
fi
if [ "$mode" = ncu ]; then   # Nsight Compute: DRAM and L2 traffic of base, the L2 prefetch (4 tiles) and TMA at 32 x 4096
  m=gpu__time_duration.sum,dram__bytes_read.sum,dram__throughput.avg.pct_of_peak_sustained_elapsed
  m+=,lts__t_sectors_op_read.sum,lts__t_sector_op_read_hit_rate.pct,l1tex__m_xbar2l1tex_read_bytes.sum
  m+=,smsp__issue_active.avg.pct_of_peak_sustained_active,sm__warps_active.avg.pct_of_peak_sustained_active
  timeout 300 ncu --clock-control none -k "regex:split_kv" --launch-count 4 --metrics "$m" \
    python3 benches/gpu/probe_decode_l2.py --shapes 32x4096 --variants base l2a4:TK_DECODE_L2_AHEAD=4 tma \
    --layouts shuffled --rounds 0 > "$OUT/ncu_decode_l2_tma$tag.txt" 2>&1
  echo "ncu rc=$?"; grep -E "split_kv|duration|bytes|throughput|sectors|hit_rate|issue_active|warps_active" \
    "$OUT/ncu_decode_l2_tma$tag.txt" | cut -c1-120 | head -60
fi
if [ "$mode" = promo ]; then   # the TMA maps' L2 promotion: none, 64, 128 and 256 bytes, against the cp.async kernel
  timeout 300 python3 benches/gpu/probe_decode_l2.py --shapes 32x4096 128x1024 128x4096 8x4096 1x16384 \
    --variants base tma0 tma1 tma2 tma3 --layouts shuffled > "$OUT/probe_decode_tma_promo$tag.log" 2>&1
  echo "probe_decode_l2 rc=$?"; grep -E "DIFFER|TB/s|all variants|Error|error" "$OUT/probe_decode_tma_promo$tag.log" | cut -c1-100
fi
if [ "$mode" = lab ]; then   # the decode lab on the engine's kernels, with the rows over pages in order
  bench_packed 420 "kernel_decode" run_gpu_kernel_decode_inorder.log
fi
