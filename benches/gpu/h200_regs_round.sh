#!/usr/bin/env bash
# Twenty-ninth session's device calls: does a decode kernel whose K/V tiles come through registers (128-bit
# global loads, then shared-memory stores) read faster at batch 32 than the cp.async copies
# (docs/performance/decode_attention.md, "K/V tiles through registers"; run from the repository root):
#   bash benches/gpu/h200_regs_round.sh MODE
#   regs:  probe_decode_cudnn.py at the shapes where the kernel trails cuDNN and three beside them, pages shuffled and in
#          order, with the tree's build (base) and
#            rs:     -DTK_REG_STAGE: the kernel with tile j + 1 loaded into registers (ld.global.nc) while tile j is
#                    computed, stored to shared memory at the next iteration's top (the bits must be base's);
#            rsna:   the same with the loads' .L1::no_allocate (-DTK_LDG_NA);
#            copy:   -DTK_DIAG_COPY_ONLY (the copies-only build of the twenty-eighth session);
#            regs:   -DTK_DIAG_COPY_ONLY,TK_DIAG_REGLOAD: copies only, the tiles by 128-bit loads into two register
#                    sets (tile j + 1 loaded while tile j is consumed: the cp.async pipeline's depth), folded into a word;
#            regsts: the same, stored to shared memory (TK_DIAG_REGLOAD=2)
#          (the diagnostic builds' outputs are wrong by design: the probe reports them as DIFFER and exits 1). The
#          TK_REG_STAGE and TK_LDG_NA switches left the tree after the call: this mode needs the tree of a5334f1
#   diagregs: the same probe with base, copy, regs and regsts only (the tree's switches)
#   tail:  where the arithmetic's cost sits: the kernel, the copies-only build, and the kernel without the arithmetic of
#          each CTA's last tile (last: -DTK_DIAG_FREE_TILE=1) or, as the control, of its first (first: =2), pages
#          shuffled and in order at batch 128-256 over 1-4k keys and at 32 x 4096, five rounds
#   SHAPES, ROUNDS: other shapes and rounds; TAG: the files' suffix (default _MODE)
source benches/gpu/_env.sh
mode=${1:-regs}
tag=${TAG:-_$mode}
if [ "$mode" = regs ] && ! grep -q TK_REG_STAGE optimized/kernels/attention.cu; then
  echo "mode regs needs the tree of a5334f1 (attention.cu with the TK_REG_STAGE switch)"; exit 1
fi
nvidia-smi --query-gpu=name,clocks.max.sm,clocks.max.mem --format=csv,noheader
build_kernels
# probe DEFAULT_SHAPES DEFAULT_ROUNDS VARIANT...: probe_decode_cudnn.py over shuffled and in-order pages into
# $OUT/probe_decode_regs$tag.log (SHAPES, ROUNDS override the defaults), then its timing lines
probe() {
  local shapes=$1 rounds=$2
  shift 2
  timeout 480 python3 benches/gpu/probe_decode_cudnn.py --shapes ${SHAPES:-$shapes} --layouts shuffled inorder \
    --variants "$@" --rounds ${ROUNDS:-$rounds} > "$OUT/probe_decode_regs$tag.log" 2>&1
  echo "probe_decode_cudnn rc=$? (1: the diagnostic builds' outputs differ, as they must)"
  grep -E "TB/s" "$OUT/probe_decode_regs$tag.log" | cut -c1-120
}
wide="32x4096 32x16384 128x1024 128x4096 32x8192 33x16384 64x8192"
copies="copy:TK_DIAG_COPY_ONLY regs:TK_DIAG_COPY_ONLY,TK_DIAG_REGLOAD regsts:TK_DIAG_COPY_ONLY,TK_DIAG_REGLOAD=2"
if [ "$mode" = regs ]; then
  probe "$wide" 3 base rs:TK_REG_STAGE rsna:TK_REG_STAGE,TK_LDG_NA $copies
  grep -E "rs |rsna |DIFFER|Error|error" "$OUT/probe_decode_regs$tag.log" | grep -vE "(copy|regs|regsts) " | cut -c1-120
fi
[ "$mode" = diagregs ] && probe "$wide" 3 base $copies
[ "$mode" = tail ] && probe "128x1024 256x1024 128x2048 128x4096 32x4096" 5 base copy:TK_DIAG_COPY_ONLY \
  last:TK_DIAG_FREE_TILE=1 first:TK_DIAG_FREE_TILE=2
exit 0
