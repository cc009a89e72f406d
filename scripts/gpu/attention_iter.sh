#!/usr/bin/env bash
# One GPU iteration of the attention kernel work, run on the H200 from the repo root:
#   scripts/gpu/attention_iter.sh [STAGES...]   stages: tests bench ncu sanitize flashmla
# Needs .gpu-bin/ (scripts/gpu/build.sh); FlashMLA's column needs .whl/ (bench/README.md).
# Logs go to $OUT; the tail of each step is printed.
set -uo pipefail
B=${BIN:-.gpu-bin}
OUT=${OUT:-/tmp/sparse_swa_out}
mkdir -p "$OUT"
stages=${*:-tests bench ncu sanitize}
has() { [[ " $stages " == *" $1 "* ]]; }
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,temperature.gpu --format=csv,noheader
if has tests; then
  timeout 300 "$B/sparse_swa_tests" --gtest_filter='*Attention*' --gtest_brief=1 \
    >"$OUT/attention_tests.log" 2>&1
  echo "tests: exit $?"
  grep -E "^\[  FAILED|largest|tests ran|PASSED|Expected|first:" "$OUT/attention_tests.log" | head -30
fi
if has bench; then
  timeout 300 "$B/sparse_swa_attention_bench" --json "$OUT/attention_bench.json" \
    2>&1 | tee "$OUT/attention_bench.txt"
fi
if has flashmla; then
  python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl &&
    PYTHONPATH=/tmp/site timeout 300 python3 bench/flashmla_bench.py --json "$OUT/flashmla.json" \
      2>&1 | tee "$OUT/flashmla.txt" | tail -20
fi
if has ncu; then
  for shape in ${NCU_SHAPES:-flash_h64_b64}; do
    timeout 200 ncu --clock-control none --section SpeedOfLight --section WarpStateStats \
      --section MemoryWorkloadAnalysis --section ComputeWorkloadAnalysis --section Occupancy \
      --section LaunchStats -k regex:ds_mla_attention --launch-skip 1 --launch-count 1 \
      "$B/sparse_swa_attention_bench" --only "$shape" --runs 2 >"$OUT/ncu_$shape.txt" 2>&1
    echo "ncu $shape: exit $?"
    grep -E "Duration|Throughput|Pipe|Stall|Registers|Achieved Occupancy|Bank|Executed Ipc" \
      "$OUT/ncu_$shape.txt" | head -40
  done
fi
if has sanitize; then
  for tool in memcheck racecheck initcheck; do
    timeout 240 compute-sanitizer --tool "$tool" --error-exitcode 9 "$B/sparse_swa_tests" \
      --gtest_filter='SplitShapes/*:AttentionCuda.*' --gtest_brief=1 >"$OUT/sanitize_$tool.log" 2>&1
    echo "sanitize $tool: exit $?"
    grep -E "ERROR SUMMARY|FAILED" "$OUT/sanitize_$tool.log" | head -5
  done
fi
