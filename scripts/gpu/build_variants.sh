#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# Builds extra binaries for side-by-side runs on the GPU machine: `sparse-swa` into
# .gpu-bin/variants/NAME (scripts/gpu/bench_variants.sh) and the attention benchmark into
# .gpu-bin/var-NAME/ (scripts/gpu/ab_shapes.sh's bin:NAME). Run after scripts/gpu/build.sh, which
# empties .gpu-bin/:
#   scripts/gpu/build_variants.sh NAME=CUDA_FLAGS ...   (e.g. fastmath=--use_fast_math;
#       profile=-DSPARSE_SWA_ATTENTION_PROFILE: the per-role cycle accounts that
#       attention_iter.sh's profile stage prints)
#   scripts/gpu/build_variants.sh base@REV ...          (the tree at git revision REV)
set -euo pipefail
cd "$(dirname "$0")/../.."
root=$PWD
mkdir -p .gpu-bin/variants
for spec in "$@"; do
  if [[ $spec == *@* ]]; then
    name=${spec%%@*}
    src=$(mktemp -d)
    git worktree add -f --detach "$src" "${spec#*@}" >/dev/null
    flags=""
  else
    name=${spec%%=*}
    src=$root
    flags=${spec#*=}
  fi
  cmake -S "$src" -B "build-variant-$name" -DCMAKE_BUILD_TYPE=Release -DSPARSE_SWA_CUDA=ON \
    -DSPARSE_SWA_BENCH=OFF -DSPARSE_SWA_TESTS=OFF -DSPARSE_SWA_PYTHON=OFF \
    "-DCMAKE_CUDA_FLAGS=$flags" >/dev/null
  cmake --build "build-variant-$name" -j "$(nproc)" --target sparse-swa sparse_swa_attention_bench
  cp "build-variant-$name/sparse-swa" ".gpu-bin/variants/$name"
  strip ".gpu-bin/variants/$name"
  mkdir -p ".gpu-bin/var-$name"
  cp "build-variant-$name/bench/sparse_swa_attention_bench" ".gpu-bin/var-$name/"
  strip ".gpu-bin/var-$name/sparse_swa_attention_bench"
  [[ $src == "$root" ]] || git worktree remove --force "$src"
done
du -sh .gpu-bin
