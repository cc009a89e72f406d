#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# A short GPU check of the prefill kernels' item ends (the row sums' exchange, the rows' scale),
# run on the GPU machine from the repo root after scripts/gpu/build.sh: the attention suite with
# the bf16 and few-heads CTAs capped at 2 (every CTA walks items), then racecheck and memcheck on
# walking, split and two-head-group shapes, each under a time limit.
set -uo pipefail
B=${BIN:-.gpu-bin}
export SPARSE_SWA_ATTENTION_WALK_CTAS=2
"$B/sparse_swa_tests" --gtest_filter='*AttentionCuda*:*Shapes/*' --gtest_brief=1 2>&1 |
  grep -E 'largest|PASSED|FAILED' | sort -u | tail -4
filter='WalkingShapes/*H40*:WalkingShapes/*H64*:SplitBf16PrefillKernelShapes/*H128*'
filter+=':SplitPrefillKernelShapes/*H48*:PrefillShapes/*H100_W1152*'
for tool in racecheck memcheck; do
  timeout "${SANITIZE_TIMEOUT:-80}" compute-sanitizer --tool "$tool" --error-exitcode 9 \
    "$B/sparse_swa_tests" --gtest_filter="$filter" --gtest_brief=1 >/tmp/san_$tool.log 2>&1
  echo "$tool: exit $?"
  grep -E 'ERROR SUMMARY|RACECHECK SUMMARY|PASSED|FAILED' /tmp/san_$tool.log | sort -u | head -4
done
