#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# One GPU iteration of the attention kernel work, run on the GPU machine from the repo root:
#   scripts/gpu/attention_iter.sh [STAGES...]
#   stages: smoke tests bench variants flashmla sweep ablate profile ncu ncusrc sanitize
#   (default: smoke tests bench ncu sanitize)
# Needs .gpu-bin/ (scripts/gpu/build.sh); FlashMLA's column needs .whl/ (bench/README.md).
# JSON results go to $OUT, every log into $OUT/logs.tgz (the device tool returns at most 8
# files); the tail of each step is printed.
set -uo pipefail
B=${BIN:-.gpu-bin}
OUT=${OUT:-/tmp/sparse_swa_out}
mkdir -p "$OUT"
LOGS=$(mktemp -d)
trap 'tar czf "$OUT/logs.tgz" -C "$LOGS" . 2>/dev/null' EXIT
stages=${*:-smoke tests bench ncu sanitize}
has() { [[ " $stages " == *" $1 "* ]]; }
# FlashMLA's wheel (.whl/) into /tmp/site, for PYTHONPATH=/tmp/site.
install_flashmla() {
  python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl
}
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,temperature.gpu --format=csv,noheader
if has smoke; then
  # A few shapes of each attention kernel under a short limit: a kernel that hangs or fails ends
  # the call here instead of spending the device time of every later stage (SMOKE_FILTER,
  # SMOKE_TIMEOUT seconds).
  filter='FewHeadsShapes/*H8_*:PrefillKernelShapes/*H8_*:DecodeKernelShapes/*H8_*'
  filter+=':SplitShapes/*H8*:WalkingShapes/*H8_*:AttentionCuda.Decoded*'
  timeout "${SMOKE_TIMEOUT:-60}" "$B/sparse_swa_tests" --gtest_filter="${SMOKE_FILTER:-$filter}" \
    --gtest_brief=1 >"$LOGS/smoke.log" 2>&1
  rc=$?
  echo "smoke: exit $rc"
  grep -E "^\[  FAILED|PASSED" "$LOGS/smoke.log" | sort -u | head -6
  if [[ $rc != 0 ]]; then
    [[ $rc == 124 ]] && echo "smoke: timed out (a kernel hangs?); stopping"
    exit 4
  fi
fi
if has tests; then
  # The default variant choice, then each QK / PV variant forced on every shape, then the bf16
  # prefill kernels' CTAs capped at 2 (each walks many items), then few heads on the 64-row kernel.
  for v in ${VARIANTS:-auto qk=mma pv=mma walk=2 few=0}; do
    case $v in
      qk=*) e=(SPARSE_SWA_ATTENTION_QK="${v#qk=}") ;;
      pv=*) e=(SPARSE_SWA_ATTENTION_PV="${v#pv=}") ;;
      walk=*) e=(SPARSE_SWA_ATTENTION_WALK_CTAS="${v#walk=}") ;;
      few=*) e=(SPARSE_SWA_ATTENTION_FEW_HEADS="${v#few=}") ;;
      *) e=() ;;
    esac
    env "${e[@]}" timeout 300 \
      "$B/sparse_swa_tests" --gtest_filter='*Attention*' --gtest_brief=1 \
      >"$LOGS/attention_tests_${v/=/_}.log" 2>&1
    echo "tests ($v): exit $?"
    grep -E "^\[  FAILED|largest|PASSED|first:" "$LOGS/attention_tests_${v/=/_}.log" | sort -u | head -12
  done
fi
if has bench; then
  # BENCH_ARGS: e.g. "--filter prefill --kernel decode".
  timeout 300 "$B/sparse_swa_attention_bench" --json "$OUT/attention_bench.json" ${BENCH_ARGS:-} \
    2>&1 | tee "$LOGS/attention_bench.txt"
fi
if has variants; then
  # Development builds of the bench with other pipeline depths (SPARSE_SWA_ATTENTION_STAGES).
  for v in "$B"/variants/attention_bench_*; do
    [[ -x $v ]] || continue
    echo "== $(basename "$v")"
    timeout 200 "$v" --json "$OUT/$(basename "$v").json" ${BENCH_ARGS:-} 2>&1 | tee "$LOGS/$(basename "$v").txt" |
      grep -E "^[a-z0-9_]+ +[0-9]+ "
  done
fi
if has flashmla; then
  install_flashmla &&
    PYTHONPATH=/tmp/site timeout 300 python3 bench/flashmla_bench.py --json "$OUT/flashmla.json" \
      2>&1 | tee "$LOGS/flashmla.txt" | tail -40
fi
if has sweep; then
  # The decode batch-size sweep (--sweep), ours and FlashMLA's (when .whl/ holds it), one table;
  # SWEEP_CACHE=bf16 on bf16 caches (FlashMLA: flash_mla_sparse_fwd).
  cache=${SWEEP_CACHE:-fp8_ds_mla}
  timeout 400 "$B/sparse_swa_attention_bench" --sweep --cache "$cache" --runs "${SWEEP_RUNS:-20}" \
    --json "$OUT/sweep_$cache.json" >"$LOGS/sweep_$cache.txt" 2>&1
  if ls .whl/*.whl >/dev/null 2>&1; then
    install_flashmla &&
      PYTHONPATH=/tmp/site timeout 300 python3 bench/flashmla_bench.py --sweep --cache "$cache" \
        --runs "${SWEEP_RUNS:-20}" --json "$OUT/sweep_flashmla_$cache.json" \
        >"$LOGS/sweep_flashmla_$cache.txt" 2>&1
  fi
  python3 scripts/gpu/sweep_table.py "$OUT/sweep_$cache.json" "$OUT/sweep_flashmla_$cache.json"
fi
if has ablate; then
  # Development: the pipeline with parts left out (results are wrong by design; time only).
  for ab in ${ABLATIONS:-0 1 2 4 8 3 9 6 15}; do
    printf "ablate %2s: " "$ab"
    SPARSE_SWA_ATTENTION_ABLATE=$ab timeout 60 "$B/sparse_swa_attention_bench" --only \
      "${ABLATE_SHAPE:-flash_h64_b64}" --runs 10 | tail -1
  done
fi
if has profile; then
  # Per-role cycle accounts of the profile build (.gpu-bin/var-profile/, built by
  # scripts/gpu/build_variants.sh profile=-DSPARSE_SWA_ATTENTION_PROFILE): bit 16 prints them,
  # 64 / 128 leave the decode's shared-memory stores / reads out.
  for ab in ${PROFILE_BITS:-16 80 144 208}; do
    echo "profile ablate $ab:"
    SPARSE_SWA_ATTENTION_ABLATE=$ab timeout 60 "$B/var-profile/sparse_swa_attention_bench" --only \
      "${ABLATE_SHAPE:-flash_h64_b64}" --runs 5 2>&1 | grep -E "^profile|^flash|^pro_|^swa|^tp|^mtp|^prefill" | head -${PROFILE_LINES:-40}
  done
fi
if has ncu; then
  for shape in ${NCU_SHAPES:-flash_h64_b64}; do
    timeout 200 ncu --clock-control none --section SpeedOfLight --section WarpStateStats \
      --section MemoryWorkloadAnalysis --section ComputeWorkloadAnalysis --section Occupancy \
      --section LaunchStats -k regex:${NCU_KERNEL:-ds_mla_attention} --launch-skip 1 --launch-count 1 \
      "$B/sparse_swa_attention_bench" --only "$shape" --runs 2 >"$LOGS/ncu_$shape.txt" 2>&1
    echo "ncu $shape: exit $?"
    grep -E "Duration|Throughput|Pipe|Stall|Registers|Achieved Occupancy|Bank|Executed Ipc" \
      "$LOGS/ncu_$shape.txt" | head -40
  done
fi
if has ncusrc; then
  # Per-instruction stall samples of one launch (SASS with the samples' columns, CSV).
  shape=${NCU_SHAPES:-flash_h64_b64}
  timeout 240 ncu --clock-control none --set full --import-source no -k regex:${NCU_KERNEL:-ds_mla_attention} \
    --launch-skip 1 --launch-count 1 -f -o /tmp/prof "$B/sparse_swa_attention_bench" \
    --only "$shape" --runs 2 >/tmp/ncusrc.log 2>&1
  echo "ncu source: exit $?"; tail -3 /tmp/ncusrc.log
  ncu -i /tmp/prof.ncu-rep --page source --csv --print-source sass >"$LOGS/sass_$shape.csv" 2>&1
  echo "sass csv: $(wc -l <"$LOGS/sass_$shape.csv") lines"; head -c 600 "$LOGS/sass_$shape.csv"; echo
  ncu -i /tmp/prof.ncu-rep --page details --section WarpStateStats --section SchedulerStats \
    >"$LOGS/ncu_stalls_$shape.txt" 2>&1
fi
if has sanitize; then
  # The tensor-core kernel's paths (split and merge on both kernels, masking, lens, graph replay,
  # small heads, page size 2, both cache kinds, query groups, two head groups) under each tool;
  # racecheck on the smaller cases (it runs far slower).
  for tool in memcheck initcheck racecheck; do
    filter='SplitShapes/*:SplitBf16Shapes/*:PrefillShapes/*H8*:PrefillShapes/*H1_*:AttentionCuda.*'
    filter+=':PrefillKernelShapes/*H1_*:PrefillKernelShapes/*H3_*:PrefillKernelShapes/*H8_*'
    filter+=':DecodeKernelShapes/*H1_*:DecodeKernelShapes/*H8_*:DecodeKernelShapes/*H3_*'
    filter+=':GroupShapes/*:SplitPrefillKernelShapes/*:SplitBf16PrefillKernelShapes/*'
    filter+=':PrefillKernelShapes/*H100_*:PrefillKernelShapes/*H128_*:WalkingShapes/*'
    filter+=':FewHeadsShapes/*:LastWaveShapes/*:LastWavePrefillKernelShapes/*'
    [[ $tool == racecheck ]] &&
      filter='SplitShapes/*H8*:SplitShapes/*H3*:SplitBf16Shapes/*H8*:AttentionCuda.Device*'\
':PrefillKernelShapes/*H1_*:PrefillKernelShapes/*H3_*:GroupShapes/*H3_*:GroupShapes/*H1_*'\
':SplitPrefillKernelShapes/*H8*:SplitPrefillKernelShapes/*H3*:SplitBf16PrefillKernelShapes/*H8*'\
':PrefillKernelShapes/*H128_W1_*:FewHeadsShapes/*H5_*:FewHeadsShapes/*H12_*'\
':FewHeadsShapes/*H3_*'
    # SANITIZE_FILTER replaces the filter for every tool.
    timeout "${SANITIZE_TIMEOUT:-150}" compute-sanitizer --tool "$tool" --error-exitcode 9 \
      "$B/sparse_swa_tests" --gtest_filter="${SANITIZE_FILTER:-$filter}" --gtest_brief=1 >"$LOGS/sanitize_$tool.log" 2>&1
    echo "sanitize $tool: exit $?"
    grep -E "ERROR SUMMARY|FAILED|PASSED" "$LOGS/sanitize_$tool.log" | head -5
  done
  # The bf16 prefill kernel's CTAs capped at 2, so that each walks many items.
  for tool in memcheck racecheck; do
    SPARSE_SWA_ATTENTION_WALK_CTAS=2 timeout "${SANITIZE_TIMEOUT:-150}" compute-sanitizer \
      --tool "$tool" --error-exitcode 9 "$B/sparse_swa_tests" --gtest_brief=1 \
      --gtest_filter='PrefillKernelShapes/*H1_*:PrefillKernelShapes/*H3_*:WalkingShapes/*H8_*' \
      >"$LOGS/sanitize_walk_$tool.log" 2>&1
    echo "sanitize walk=2 $tool: exit $?"
    grep -E "ERROR SUMMARY|FAILED|PASSED" "$LOGS/sanitize_walk_$tool.log" | head -5
  done
fi
