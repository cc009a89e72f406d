#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# Environment-switch A/B on the GPU machine, from the repo root: each shape timed with each value
# of one environment variable in turn, ROUNDS times, alternating (one binary, one session):
#   VAR=SPARSE_SWA_ATTENTION_X VALUES="0 1" SHAPES="pro_h128_b64 ..." [ROUNDS=2] [BIN=.gpu-bin] \
#     scripts/gpu/ab_env.sh
# Prints round, value, shape, median, min, warm per run; the logs go to $OUT.
set -uo pipefail
B=${BIN:-.gpu-bin}
OUT=${OUT:-/tmp/sparse_swa_out}
mkdir -p "$OUT"
for r in $(seq "${ROUNDS:-2}"); do
  for s in ${SHAPES:?}; do
    for v in ${VALUES:-0 1}; do
      log="$OUT/ab_${s}_${v}_$r.txt"
      env "${VAR:?}=$v" timeout 60 "$B/sparse_swa_attention_bench" --only "$s" \
        --runs "${RUNS:-20}" ${BENCH_ARGS:-} >"$log" 2>&1
      line=$(grep -E "^$s +[0-9]+ " "$log")
      echo "round $r $v: ${line:-FAILED (exit $?)}" | awk '{print $1, $2, $3, $4, $5, $7, $8, $9}'
    done
  done
done
