#!/usr/bin/env bash
# Fetches the peers of probe_decode_peers.py into .whl/ (ignored by git), on a machine that reaches PyPI, for a
# device call that carries .whl (the device machine reaches no registry). Run from the repository root:
#   bash benches/gpu/fetch_peers.sh
# * FlashInfer 0.7.2.post1 (a pure-Python wheel that compiles its kernels at first use, 62 MB): its package less
#   what its attention kernels never include (the data/csrc subfolders and CUTLASS's examples, tests and Python),
#   as one .tar.xz of about 12 MB, unpacked on the device into the install target;
# * apache-tvm-ffi (FlashInfer's compiled-module interface) and nvidia-cudnn-frontend (cuDNN's graph API, for
#   cuDNN's paged decode), as wheels for the device's Python 3.12.
# Every other requirement FlashInfer's import needs (click, einops, ninja, numpy, nvidia-ml-py, packaging,
# requests, tabulate, tqdm) is on the device's image.
set -euo pipefail
FI=0.7.2.post1
mkdir -p .whl
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
plat=(--only-binary=:all: --python-version 3.12 --implementation cp --platform manylinux_2_28_x86_64
      --platform manylinux_2_27_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64)
python3 -m pip download -q --no-deps "${plat[@]}" -d "$tmp" "flashinfer-python==$FI"
python3 -m pip download -q --no-deps "${plat[@]}" -d .whl "apache-tvm-ffi==0.1.15.post2" "nvidia-cudnn-frontend==1.32.0"
(cd "$tmp" && unzip -q flashinfer_python-*.whl 'flashinfer/*' &&
  tar cf fi.tar --exclude=flashinfer/data/csrc --exclude=flashinfer/data/cutlass/python \
    --exclude=flashinfer/data/cutlass/examples --exclude=flashinfer/data/cutlass/test \
    --exclude=flashinfer/data/cutlass/media --exclude=flashinfer/data/cutlass/docs flashinfer &&
  find flashinfer/data/csrc -maxdepth 1 -type f -print0 | xargs -0 tar rf fi.tar)  # (csrc's own files, not its folders)
xz -T2 -6 < "$tmp/fi.tar" > ".whl/flashinfer-python-$FI-trimmed.tar.xz"
ls -la .whl
