#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# ncu of one launch of our bf16 prefill kernel beside one of FlashMLA's flash_mla_sparse_fwd on
# the same shape (same sections, same clocks), so that their instruction mixes, pipe use and
# stalls can be read side by side. On the GPU machine, from the repo root:
#   scripts/gpu/ncu_beside_flashmla.sh [SHAPE]     (default prefill_h64_t4096_bf16)
# Needs .gpu-bin/ (scripts/gpu/build.sh) and .whl/ (the sgl-flash-mla wheel). Reports go to $OUT.
set -uo pipefail
B=${BIN:-.gpu-bin}
OUT=${OUT:-/tmp/sparse_swa_out}
shape=${1:-prefill_h64_t4096_bf16}
mkdir -p "$OUT"
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl
sections=(--section SpeedOfLight --section ComputeWorkloadAnalysis --section InstructionStats
  --section WarpStateStats --section SchedulerStats --section MemoryWorkloadAnalysis
  --section LaunchStats --section Occupancy)
metrics=smsp__inst_executed.sum,smsp__inst_executed_pipe_tensor_op_gmma.sum,\
smsp__inst_executed_op_shared_ld.sum,smsp__inst_executed_op_shared_st.sum,\
smsp__sass_inst_executed_op_shared_ld.sum,sm__cycles_elapsed.avg,gpu__time_duration.sum
summary() {
  grep -E "Duration|Elapsed Cycles|Executed Ipc|Issue Slots|Tensor|Registers|inst_executed|\
shared_ld|shared_st|No Eligible|Warp Cycles Per Issued|Stall|Executed Instructions " "$1" | head -60
}
# profile NAME KERNEL_REGEX COMMAND...: one launch (the second) into $OUT/ncu_NAME.txt, summarised.
profile() {
  local name=$1 kernel=$2
  shift 2
  timeout 240 ncu --clock-control none "${sections[@]}" --metrics "$metrics" -k "regex:$kernel" \
    --launch-skip 1 --launch-count 1 "$@" --only "$shape" --runs 2 >"$OUT/ncu_$name.txt" 2>&1
  echo "== $name: exit $?"
  summary "$OUT/ncu_$name.txt"
}
profile ours ds_mla_prefill_bf16 "$B/sparse_swa_attention_bench"
PYTHONPATH=/tmp/site profile flashmla sparse_attn_fwd python3 bench/flashmla_bench.py
# SRC=1: both kernels again with the full set, their SASS with per-instruction executed counts and
# stall samples (CSV), the opcode mix by name and the stall sections.
profile_full() {
  local name=$1 kernel=$2
  shift 2
  timeout 240 ncu --clock-control none --set full --import-source no -k "regex:$kernel" \
    --launch-skip 1 --launch-count 1 -f -o "/tmp/$name" "$@" --only "$shape" --runs 2 >/dev/null 2>&1
  echo "== $name (full): exit $?"
  ncu -i "/tmp/$name.ncu-rep" --page source --csv --print-source sass >"$OUT/sass_$name.csv" 2>&1
  ncu -i "/tmp/$name.ncu-rep" --page raw --metrics sass__inst_executed_per_opcode \
    --print-metric-instances details >"$OUT/opcodes_$name.txt" 2>&1
  ncu -i "/tmp/$name.ncu-rep" --page details --section WarpStateStats --section SchedulerStats \
    >"$OUT/stalls_$name.txt" 2>&1
  gzip -f "$OUT/sass_$name.csv"
  echo "$name: $(wc -c <"$OUT/sass_$name.csv.gz") bytes of sass csv"
}
if [[ ${SRC:-0} == 1 ]]; then
  profile_full ours ds_mla_prefill_bf16 "$B/sparse_swa_attention_bench"
  PYTHONPATH=/tmp/site profile_full flashmla sparse_attn_fwd python3 bench/flashmla_bench.py
fi
