#!/usr/bin/env bash
# Twenty-seventh session's device calls (the base files of ab, chains and short left the tree after 332ce8d and
# 66fc77f): the split-KV decode's online softmax with a lazy rescale (a query's reference maximum moves only when a
# score passes it by more than kRescaleSlack = 8 log2 units; otherwise one vote replaces the reduction over lanes
# and the rescale: attention.cu, online_softmax_t) against the reduce-every-tile softmax before it
# (docs/performance/decode_attention.md, "Decode attention"; run from the repository root):
#   bash benches/gpu/h200_lazy_rescale_round.sh MODE
#   ab:     check_kernels.py on the decode sections (splitkv -- with its rising-scores cases, which drive the
#           rescale path --, fused, qk, fused_rope, invariant), ab_attention.py --bits-may-differ against
#           benches/gpu/ab_variants/lazy_rescale_base_attention.cu (the tree's attention.cu before the change;
#           roundings differ, each side's accuracy is check_kernels.py's to show), then probe_decode_cudnn.py
#           at the shapes where the kernel trailed cuDNN (and 33 x 4096, 8 x 4096, 1 x 16384)
#   chains: ab_attention.py --bits-may-differ of benches/gpu/ab_variants/four_chains_attention.cu (the scores'
#           D/16 MMAs in four dependency chains instead of two) against the tree's attention.cu, then verify's steps
#   verify: every check_kernels.py section, the engine smoke test and conformance at CI scale
#   lab:    the decode lab and the engine decode benches (benches kernel_decode, engine_decode: reports in bench.tgz)
#   short:  ab_attention.py --bits-may-differ against lazy_rescale_base_attention.cu (as in ab) at the engine bench's
#           decode shapes (contexts of 256-320 keys: 288, at batch 32-256) and 256 x 1024, five rounds
#   gpuconf: conformance at the GPU scale on the optimized engine: the clauses the decode kernel serves at the
#           qwen3-0.6b shape (SPLITK, INVARIANT, TURN, SAMPLE) beside the qwen3-8b subset (LOGIT, SPLITK, PAGED)
#   agentic: the agentic workload and the ceilings (benches agentic, ceilings: reports in bench.tgz)
#   TAG: the files' suffix (default _MODE)
source benches/gpu/_env.sh
mode=${1:-ab}
tag=${TAG:-_$mode}  # (the ab call's files were renamed *_lazy_rescale.log after it)
if { [ "$mode" = ab ] || [ "$mode" = short ]; } && [ ! -f benches/gpu/ab_variants/lazy_rescale_base_attention.cu ]; then
  echo "mode $mode needs the tree of ee898e1 (ab) or 66fc77f (short), with benches/gpu/ab_variants/lazy_rescale_base_attention.cu"; exit 1
fi
if [ "$mode" = chains ] && [ ! -f benches/gpu/ab_variants/four_chains_attention.cu ]; then
  echo "mode chains needs the tree of 332ce8d (with benches/gpu/ab_variants/four_chains_attention.cu)"; exit 1
fi
nvidia-smi --query-gpu=name,clocks.max.sm,clocks.max.mem --format=csv,noheader
build_kernels
if [ "$mode" = ab ]; then
  checks 200 check_kernels_decode$tag.log splitkv fused qk fused_rope invariant
  ab 170 lazy_rescale_base_attention.cu ab_lazy_rescale.log --only decode --rounds 3 --bits-may-differ
  probe_trailing 200 "probe_decode_cudnn$tag.log"
fi
if [ "$mode" = chains ]; then
  V=optimized/kernels ab 120 attention.cu ab_four_chains.log --new benches/gpu/ab_variants/four_chains_attention.cu \
    --only decode --rounds 3 --bits-may-differ
fi
if [ "$mode" = verify ] || [ "$mode" = chains ]; then
  all_checks 200 check_kernels$tag.log
  smoke 100   # engine_smoke.log
  conformance_ci 150   # conformance_ci_optimized.log
fi
if [ "$mode" = lab ]; then
  bench_packed 400 "kernel_decode or engine_decode" run_gpu_lab$tag.log
fi
if [ "$mode" = short ]; then
  ab 200 lazy_rescale_base_attention.cu ab_lazy_rescale_short.log --only decode --rounds 5 --bits-may-differ \
    --decode-shapes 256x288 128x288 64x288 32x288 256x1024
fi
if [ "$mode" = gpuconf ]; then
  conformance_gpu 280 qwen3-8b conformance_gpu_qwen3-8b$tag.log > "$OUT/c8.summary" &
  conformance_gpu 300 "qwen3-0.6b and (splitk or invariant or turn or sample)" conformance_gpu_qwen3-0.6b$tag.log
  wait; cat "$OUT/c8.summary"; rm -f "$OUT/c8.summary"
fi
if [ "$mode" = agentic ]; then
  bench_packed 400 "agentic or ceilings" run_gpu_agentic$tag.log
fi
