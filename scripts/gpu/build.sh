#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# Builds the binaries the GPU check runs (here, on the CPU machine; nvcc needs no GPU) and puts
# them, stripped, into .gpu-bin/ (small enough for a 64 MiB transfer), and copies ../shared (the
# reference builder the GPU check runs) into .shared/. Both folders are ignored by git; carry both.
set -euo pipefail
cd "$(dirname "$0")/../.."
cmake -S . -B build-gpu -DCMAKE_BUILD_TYPE=Release -DSPARSE_SWA_CUDA=ON -DSPARSE_SWA_BENCH=OFF \
  -DSPARSE_SWA_PYTHON=OFF >/dev/null
cmake --build build-gpu -j "$(nproc)" --target sparse_swa_tests sparse-swa sparse_swa_cuda_launch_probe \
  sparse_swa_attention_bench sparse_swa_soak sparse_swa_gather_bench
rm -rf .gpu-bin && mkdir .gpu-bin
cp build-gpu/tests/sparse_swa_tests build-gpu/sparse-swa build-gpu/bench/sparse_swa_cuda_launch_probe \
  build-gpu/bench/sparse_swa_attention_bench build-gpu/tests/sparse_swa_soak \
  build-gpu/bench/sparse_swa_gather_bench .gpu-bin/
strip .gpu-bin/*
rm -rf .shared && cp -r ../shared .shared && chmod -R u+w .shared
du -sh .gpu-bin .shared
