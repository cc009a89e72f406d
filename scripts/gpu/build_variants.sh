#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# Builds extra `sparse-swa` binaries for a side-by-side bench on the GPU machine (scripts/gpu/
# bench_variants.sh), into .gpu-bin/variants/NAME:
#   scripts/gpu/build_variants.sh NAME=CUDA_FLAGS ...   (e.g. fastmath=--use_fast_math)
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
  cmake --build "build-variant-$name" -j "$(nproc)" --target sparse-swa
  cp "build-variant-$name/sparse-swa" ".gpu-bin/variants/$name"
  strip ".gpu-bin/variants/$name"
  [[ $src == "$root" ]] || git worktree remove --force "$src"
done
du -sh .gpu-bin
