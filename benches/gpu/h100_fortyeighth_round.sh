#!/usr/bin/env bash
# Forty-eighth session's device calls on an 80 GB H100 (run from the repository root). No kernel lab had run on an
# H100 before: every decode-attention and prefill figure against cuDNN and flash came from an H200.
#   bash benches/gpu/h100_fortyeighth_round.sh labs      # the kernel labs (decode, prefill, small kernels, GEMM) and
#                                                         # probe_decode_cudnn.py at the four shapes where the H200
#                                                         # lab trails cuDNN and two beside them: pages shuffled and in
#                                                         # order, 16 and 256 tokens a page
#   bash benches/gpu/h100_fortyeighth_round.sh decode80  # the engine decode bench (h200_fortyseventh_round.sh decode80)
#   bash benches/gpu/h100_fortyeighth_round.sh heads     # probe_decode_cudnn.py with the lab switch TK_HEADS_X=C: the
#                                                         # decode grid's x is the head group and C CTAs along it are one
#                                                         # thread-block cluster (C = 2, 4, 8), so that the CTAs of
#                                                         # a sequence's heads, which read the same pages, share a GPC;
#                                                         # pages shuffled, in order and grown (a prompt run, then one
#                                                         # page a sequence in turn, as the engine decodes a batch;
#                                                         # any H100 or H200); SHAPES,
#                                                         # VARIANTS: fewer shapes or builds than the default
source benches/gpu/_env.sh
mode=${1:-labs}
nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm,clocks.max.mem --format=csv,noheader
date +%T
[ "$mode" = heads ] || build_kernels  # (heads: the probe builds attention.cu and its variants itself)
if [ "$mode" = labs ]; then
  bench_packed 300 "kernel_decode or kernel_prefill or kernel_small or kernel_gemm" "run_gpu_labs_h100.log"
  mv "$OUT/bench.tgz" "$OUT/bench_labs.tgz"
  grep -E "^\[(MET |miss|n/a )\]" "$OUT/run_gpu_labs_h100.log" | cut -c1-200 | head -30
  date +%T
  timeout 200 python3 benches/gpu/probe_decode_cudnn.py --shapes 32x4096 32x16384 128x1024 128x4096 33x4096 8x4096 \
    --layouts shuffled inorder --block-sizes 16 256 --rounds 3 > "$OUT/probe_decode_pages_h100.log" 2>&1
  echo "probe_decode_cudnn rc=$?"
  grep -E "DIFFER|TB/s|cudnn vs|Error|error|equal$" "$OUT/probe_decode_pages_h100.log" | cut -c1-120
fi
if [ "$mode" = decode80 ]; then
  bench_packed 420 "engine_decode" "run_gpu_engine_decode.log"
  mv "$OUT/bench.tgz" "$OUT/bench_engine_decode.tgz"
  grep -E "^\[(MET |miss|n/a )\]|SKIPPED|out of memory" "$OUT/run_gpu_engine_decode.log" | cut -c1-200 | head -20
fi
if [ "$mode" = heads ]; then
  timeout 420 python3 benches/gpu/probe_decode_cudnn.py --shapes ${SHAPES:-32x16384 32x4096 128x4096 8x16384} \
    --layouts shuffled inorder grown --variants base ${VARIANTS:-hx2:TK_HEADS_X=2 hx4:TK_HEADS_X=4 hx8:TK_HEADS_X=8} \
    --rounds 3 > "$OUT/probe_decode_heads.log" 2>&1
  echo "probe_decode_cudnn rc=$?"
  grep -E "DIFFER|TB/s|cudnn vs|clusters of|Error|error|equal$" "$OUT/probe_decode_heads.log" | cut -c1-120
fi
date +%T
exit 0
