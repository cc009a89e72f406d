#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# A/B of development builds on the GPU machine, from the repo root:
#   VARS="name1 name2" [BENCH_ARGS=...] scripts/gpu/ab_variants.sh
# Each variant is .gpu-bin/var-NAME/{sparse_swa_tests,sparse_swa_attention_bench} (built here from
# a patched tree, as bench/README.md's variant log describes); "head" is .gpu-bin itself. Runs
# each variant's attention tests, then every benchmark one after the other in this one session.
# (A tests run takes ~35 s, a full benchmark ~50 s; BENCH_ARGS="--filter prefill" ~25 s.)
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
# WITH_HEAD=0 leaves out the benchmark of .gpu-bin itself (when the session already has it).
heads=head
[[ ${WITH_HEAD:-1} == 0 ]] && heads=
for v in $heads ${VARS:-}; do
  b=.gpu-bin/var-$v/sparse_swa_attention_bench
  [[ $v == head ]] && b=.gpu-bin/sparse_swa_attention_bench
  echo "== bench $v"
  timeout 150 "$b" --json "$OUT/bench_$v.json" ${BENCH_ARGS:-} >"$OUT/bench_$v.txt" 2>&1
  echo "exit $?"
  grep -E "^[a-z0-9_]+ +[0-9]+ " "$OUT/bench_$v.txt" | awk '{print $1, $3, $4, $5}'
done
