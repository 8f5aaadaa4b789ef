#!/usr/bin/env bash
# One device call for the decode-step round (logs under $OUT): kernel checks and the engine smoke test
# through the launch path in force, then the split-KV decode latency sweep (PDL off / on) and
# profile_decode (plain launches, PDL, PDL + split_kv="auto") at both model shapes.
#   bash benches/gpu/h200_decode_round.sh
source "$(dirname "${BASH_SOURCE[0]}")/_env.sh"
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
build_kernels
timeout 200 python3 benches/gpu/check_kernels.py > "$OUT"/check_kernels.log 2>&1; echo "check_kernels rc=$?"
grep -E "FAIL" "$OUT"/check_kernels.log | head -20; tail -1 "$OUT"/check_kernels.log
timeout 100 python3 benches/gpu/engine_smoke.py > "$OUT"/engine_smoke.log 2>&1; echo "engine_smoke rc=$?"
grep -E "^\[(ok|FAIL)|FAILED|Error" "$OUT"/engine_smoke.log | head
timeout 90 python3 benches/gpu/probe_kernels.py --only sweep --reps 20 > "$OUT"/probe_sweep.log 2>&1; echo "sweep rc=$?"
cat "$OUT"/probe_sweep.log | tail -8
timeout 260 python3 benches/gpu/profile_decode.py --batches 1 8 32 64 --profile-batches 1 --variants skinny pdl pdl+auto --out "$OUT" > "$OUT"/profile_decode.log 2>&1; echo "profile rc=$?"
grep -v "^ " "$OUT"/profile_decode.log | tail -40
