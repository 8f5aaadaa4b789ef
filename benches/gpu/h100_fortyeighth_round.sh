#!/usr/bin/env bash
# Forty-eighth session's device calls on an 80 GB H100 (run from the repository root). No kernel lab had run on an
# H100 before: every decode-attention and prefill figure against cuDNN and flash came from an H200.
#   bash benches/gpu/h100_fortyeighth_round.sh labs      # the kernel labs (decode, prefill, small kernels, GEMM) and
#                                                         # probe_decode_cudnn.py at the four shapes where the H200
#                                                         # lab trails cuDNN and two beside them: pages shuffled and in
#                                                         # order, 16 and 256 tokens a page
#   bash benches/gpu/h100_fortyeighth_round.sh decode80  # the engine decode bench (h200_fortyseventh_round.sh decode80)
#   bash benches/gpu/h100_fortyeighth_round.sh grown     # probe_decode_cudnn.py over pages shuffled, in order and
#                                                         # grown (a prompt run, then one page a sequence in turn, as
#                                                         # the engine decodes a batch), the engine's build beside
#                                                         # cuDNN (any H100 or H200; SHAPES: fewer shapes). Its
#                                                         # first form, mode heads, also timed the lab switch
#                                                         # TK_HEADS_X (forty-ninth session, at fc49945; removed since)
source benches/gpu/_env.sh
mode=${1:-labs}
nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm,clocks.max.mem --format=csv,noheader
date +%T
[ "$mode" = grown ] || build_kernels  # (grown: the probe builds attention.cu itself)
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
if [ "$mode" = grown ]; then
  timeout 300 python3 benches/gpu/probe_decode_cudnn.py \
    --shapes ${SHAPES:-32x16384 128x4096 32x4096 128x1024 8x16384 8x4096 32x1024} \
    --layouts shuffled inorder grown --rounds 3 > "$OUT/probe_decode_grown.log" 2>&1
  echo "probe_decode_cudnn rc=$?"
  grep -E "DIFFER|TB/s|cudnn vs|Error|error|equal$" "$OUT/probe_decode_grown.log" | cut -c1-120
fi
date +%T
exit 0
