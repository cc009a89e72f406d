#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# A/B of development builds on the GPU machine, from the repo root:
#   VARS="name1 name2" [BENCH_ARGS=...] scripts/gpu/ab_variants.sh
# Each variant is .gpu-bin/var-NAME/{sparse_swa_tests,sparse_swa_attention_bench} (built here from
# a patched tree, as bench/README.md's variant log describes); "head" is .gpu-bin itself. Runs
# each variant's attention tests, then every benchmark one after the other in this one session.
set -uo pipefail
OUT=${OUT:-/tmp/sparse_swa_out}
mkdir -p "$OUT"
for v in ${VARS:-}; do
  echo "== tests $v"
  timeout 120 ".gpu-bin/var-$v/sparse_swa_tests" --gtest_filter="${TEST_FILTER:-*Attention*}" \
    --gtest_brief=1 >"$OUT/tests_$v.log" 2>&1
  echo "exit $?"
  grep -E "^\[  FAILED|PASSED|largest" "$OUT/tests_$v.log" | sort -u | head -5
done
for v in head ${VARS:-}; do
  b=.gpu-bin/var-$v/sparse_swa_attention_bench
  [[ $v == head ]] && b=.gpu-bin/sparse_swa_attention_bench
  echo "== bench $v"
  timeout 150 "$b" --json "$OUT/bench_$v.json" ${BENCH_ARGS:-} >"$OUT/bench_$v.txt" 2>&1
  echo "exit $?"
  grep -E "^[a-z0-9_]+ +[0-9]+ " "$OUT/bench_$v.txt" | awk '{print $1, $3, $4, $5}'
done
