#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# Binary A/B on the GPU machine, from the repo root: each shape timed with .gpu-bin's benchmark
# ("head") and each variant's (.gpu-bin/var-NAME/, built from a patched tree) in turn, ROUNDS
# times, alternating (one session):
#   VARS="name ..." SHAPES="pro_h128_b64 ..." [ROUNDS=2] scripts/gpu/ab_bins.sh
# Prints round, binary, shape, median, min, warm per run.
set -uo pipefail
for r in $(seq "${ROUNDS:-2}"); do
  for s in ${SHAPES:?}; do
    for v in head ${VARS:?}; do
      b=.gpu-bin/var-$v/sparse_swa_attention_bench
      [[ $v == head ]] && b=.gpu-bin/sparse_swa_attention_bench
      line=$(timeout 60 "$b" --only "$s" --runs "${RUNS:-20}" ${BENCH_ARGS:-} 2>&1 |
        grep -E "^$s +[0-9]+ ")
      echo "round $r $v: ${line:-FAILED}" | awk '{print $1, $2, $3, $4, $6, $7, $8}'
    done
  done
done
