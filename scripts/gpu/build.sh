#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# Builds the binaries the GPU checks run (here, on the CPU machine; nvcc needs no GPU) and puts
# them, stripped, into .gpu-bin/ (small enough for a 64 MiB transfer), and copies ../shared (the
# reference builder check.sh runs) into .shared/. Both folders are ignored by git; carry both.
# Another revision's binaries (scripts/gpu/ab.sh build) stay in .gpu-bin/rev-*/.
set -euo pipefail
cd "$(dirname "$0")/../.."
bins=(tests/sparse_swa_tests sparse-swa
  bench/sparse_swa_attention_bench tests/sparse_swa_soak)
cmake -S . -B build-gpu -DCMAKE_BUILD_TYPE=Release -DSPARSE_SWA_CUDA=ON -DSPARSE_SWA_BENCH=OFF \
  -DSPARSE_SWA_PYTHON=OFF >/dev/null
cmake --build build-gpu -j "$(nproc)" --target "${bins[@]##*/}"
mkdir -p .gpu-bin
for f in "${bins[@]}"; do
  cp "build-gpu/$f" .gpu-bin/
  strip ".gpu-bin/${f##*/}"
done
rm -rf .shared && cp -r ../shared .shared && chmod -R u+w .shared
du -sh .gpu-bin .shared
