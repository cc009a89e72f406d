#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# Kernel-choice A/B on the GPU machine, from the repo root: each shape timed with `--kernel` of
# each choice in turn, ROUNDS times, alternating (one binary, one session):
#   SHAPES="flash_h64_b16 ..." [KERNELS="decode prefill"] [ROUNDS=2] [BIN=.gpu-bin] \
#     scripts/gpu/ab_kernels.sh
# Prints shape, kernel, median, min, warm per run; the logs go to $OUT.
set -uo pipefail
B=${BIN:-.gpu-bin}
OUT=${OUT:-/tmp/sparse_swa_out}
mkdir -p "$OUT"
for r in $(seq "${ROUNDS:-2}"); do
  for s in ${SHAPES:?}; do
    for k in ${KERNELS:-decode prefill}; do
      log="$OUT/ab_${s}_${k}_$r.txt"
      timeout 60 "$B/sparse_swa_attention_bench" --only "$s" --runs "${RUNS:-20}" --kernel "$k" \
        >"$log" 2>&1
      line=$(grep -E "^$s +[0-9]+ " "$log")
      echo "round $r $k: ${line:-FAILED (exit $?)}" | awk '{print $1, $2, $3, $4, $5, $7, $8, $9}'
    done
  done
done
