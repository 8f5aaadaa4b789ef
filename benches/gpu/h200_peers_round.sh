#!/usr/bin/env bash
# Thirty-second session's device call: the decode attention against other paged decode kernels over the same pages,
# cuDNN on the dense cache beside them (docs/performance/decode_attention.md, "Other paged decode kernels on the same pages"). Run from
# the repository root with .whl carried (bash benches/gpu/fetch_peers.sh fills it):
#   bash benches/gpu/h200_peers_round.sh checks   # install, build FlashInfer's kernels, every output's check at 8 x 4k
#   bash benches/gpu/h200_peers_round.sh          # probe_decode_peers.py at its six shapes, three rounds
# SHAPES, ROUNDS, PEERS override the defaults; TAG the log's suffix. FlashInfer compiles its kernels into .fiws/
# (ignored by git), which a warm device machine keeps between calls.
source benches/gpu/_env.sh
tag=${TAG:-}
nvidia-smi --query-gpu=name,clocks.max.sm,clocks.max.mem --format=csv,noheader
build_kernels
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
  && tar xJf .whl/flashinfer-python-*-trimmed.tar.xz -C /tmp/site || { echo "peers: install failed"; exit 1; }
export PYTHONPATH="$PYTHONPATH:/tmp/site" FLASHINFER_WORKSPACE_BASE="$PWD/.fiws" FLASHINFER_CUDA_ARCH_LIST=9.0a MAX_JOBS=16
cudnn_lib=$(python3 -c "import nvidia.cudnn, os; print(os.path.join(list(nvidia.cudnn.__path__)[0], 'lib'))" 2>/dev/null)
[ -n "$cudnn_lib" ] && export LD_LIBRARY_PATH="$cudnn_lib:${LD_LIBRARY_PATH:-}"
if [ "${1:-}" = checks ]; then
  timeout 560 python3 benches/gpu/probe_decode_peers.py --shapes ${SHAPES:-8x4096} --rounds 0 ${PEERS:+--peers $PEERS} \
    > "$OUT/probe_decode_peers_checks$tag.log" 2>&1
  echo "probe checks rc=$?"; grep -vE "^\s+(File|raise|\^|- )|nanobind" "$OUT/probe_decode_peers_checks$tag.log" | cut -c1-300 | tail -40
  exit 0
fi
timeout 560 python3 benches/gpu/probe_decode_peers.py ${SHAPES:+--shapes $SHAPES} --rounds ${ROUNDS:-3} \
  ${PEERS:+--peers $PEERS} > "$OUT/probe_decode_peers$tag.log" 2>&1
echo "probe_decode_peers rc=$?"
grep -E "TB/s|NOT RUN|FAILS|DIFFER|Error|graph timing" "$OUT/probe_decode_peers$tag.log" | cut -c1-170
exit 0
