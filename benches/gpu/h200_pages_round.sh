#!/usr/bin/env bash
# Twenty-eighth session's device calls: what the decode attention's gap to cuDNN at batch 32-128 owes to the cache's
# 16-token pages, its layout and its arithmetic, and whether the copies' L2 prefetch size changes it
# (docs/performance/decode_attention.md, "Page size, layout and a kernel without arithmetic"; run from the repository root):
#   bash benches/gpu/h200_pages_round.sh MODE
#   probe:  probe_decode_cudnn.py at the four shapes where the kernel trails cuDNN and two beside them, the same keys
#           in pages of 16, 64 and 256 tokens (shuffled and in order), with the tree's build (base) and builds whose
#           .ca copies carry .L2::128B / .L2::256B (-DTK_CP_CA_PREFETCH; a cache hint: the bits must be base's). The
#           switch left the tree after the run: this mode needs the tree of 7e2351d
#   hnd:    probe_decode_cudnn.py at the four shapes, the cache's layout against one KV head a page (hnd: every KV head
#           of a sequence as a sequence of its own, as in an [N, n_kv, block_size, D] cache; hnd-inorder: each CTA's
#           keys in one contiguous run, as in cuDNN's dense copy), pages of 16 and 256 tokens
#   diag:   probe_decode_cudnn.py at 32 x 4096, 32 x 16384 and 128 x 4096 (pages in order, and hnd-inorder) with two
#           diagnostic builds of attention.cu (wrong outputs, timing only: the probe reports them as DIFFER):
#           -DTK_DIAG_COPY_ONLY (the key loop's copies, waits and barriers, no scores, softmax or P V) and
#           -DTK_DIAG_NO_PV (no P V); SHAPES, ROUNDS: other shapes and rounds (default the three above, 3)
#   diagcg: the copies-only build with every copy by .cg (bypassing L1: -DTK_DIAG_COPY_ONLY,TK_CP_ASYNC_CG) beside the
#           copies-only build and the kernel, pages shuffled and in order, at 32 x 4096, 32 x 16384 and 128 x 4096
#   smem64: the copies-only build in 64 KB of shared memory a CTA (-DTK_DIAG_SMEM64: unpadded tile rows, Q over a
#           stage; the probe gives it that size and the carveout of the 132 KB configuration, which leaves L1 about
#           124 KB where the engine's two CTAs of 74 KB leave it 88 KB; the configuration taken is not read back) beside the
#           copies-only build and the kernel
#   TAG: the files' suffix (default _MODE)
source benches/gpu/_env.sh
mode=${1:-probe}
tag=${TAG:-_$mode}
if [ "$mode" = probe ] && ! grep -q TK_CP_CA_PREFETCH optimized/kernels/mma.cuh; then
  echo "mode probe needs the tree of 7e2351d (mma.cuh with the TK_CP_CA_PREFETCH switch)"; exit 1
fi
nvidia-smi --query-gpu=name,clocks.max.sm,clocks.max.mem --format=csv,noheader
build_kernels
if [ "$mode" = probe ]; then
  timeout 420 python3 benches/gpu/probe_decode_cudnn.py --shapes 32x4096 32x16384 128x1024 128x4096 33x4096 8x4096 \
    --variants base pf128:TK_CP_CA_PREFETCH=128 pf256:TK_CP_CA_PREFETCH=256 --layouts shuffled inorder \
    --block-sizes 16 64 256 --rounds 3 > "$OUT/probe_decode_pages$tag.log" 2>&1
  echo "probe_decode_cudnn rc=$?"
  grep -E "DIFFER|TB/s|cudnn vs|Error|error|equal$" "$OUT/probe_decode_pages$tag.log" | cut -c1-120
fi
if [ "$mode" = hnd ]; then
  timeout 420 python3 benches/gpu/probe_decode_cudnn.py --shapes 32x4096 32x16384 128x1024 128x4096 \
    --layouts shuffled inorder hnd hnd-inorder --block-sizes 16 256 --rounds 3 > "$OUT/probe_decode_hnd$tag.log" 2>&1
  echo "probe_decode_cudnn rc=$?"
  grep -E "DIFFER|TB/s|cudnn vs|Error|error|equal$" "$OUT/probe_decode_hnd$tag.log" | cut -c1-120
fi
if [ "$mode" = diag ]; then
  timeout 300 python3 benches/gpu/probe_decode_cudnn.py --shapes ${SHAPES:-32x4096 32x16384 128x4096} \
    --layouts inorder hnd-inorder --variants base copy:TK_DIAG_COPY_ONLY nopv:TK_DIAG_NO_PV --rounds ${ROUNDS:-3} \
    > "$OUT/probe_decode_diag$tag.log" 2>&1
  echo "probe_decode_cudnn rc=$? (1: the diagnostic builds' outputs differ, as they must)"
  grep -E "TB/s|cudnn vs|Error|error" "$OUT/probe_decode_diag$tag.log" | cut -c1-120
fi
if [ "$mode" = diagcg ]; then
  timeout 300 python3 benches/gpu/probe_decode_cudnn.py --shapes 32x4096 32x16384 128x4096 --layouts shuffled inorder \
    --variants base copy:TK_DIAG_COPY_ONLY copycg:TK_DIAG_COPY_ONLY,TK_CP_ASYNC_CG --rounds 3 \
    > "$OUT/probe_decode_diag$tag.log" 2>&1
  echo "probe_decode_cudnn rc=$? (1: the diagnostic builds' outputs differ, as they must)"
  grep -E "TB/s|cudnn vs|Error|error" "$OUT/probe_decode_diag$tag.log" | cut -c1-120
fi
if [ "$mode" = smem64 ]; then
  timeout 300 python3 benches/gpu/probe_decode_cudnn.py --shapes 32x4096 32x16384 128x4096 33x16384 \
    --layouts shuffled inorder --variants base copy:TK_DIAG_COPY_ONLY copy64:TK_DIAG_COPY_ONLY,TK_DIAG_SMEM64 \
    --rounds 3 > "$OUT/probe_decode_diag$tag.log" 2>&1
  echo "probe_decode_cudnn rc=$? (1: the diagnostic builds' outputs differ, as they must)"
  grep -E "TB/s|cudnn vs|Error|error" "$OUT/probe_decode_diag$tag.log" | cut -c1-120
fi
