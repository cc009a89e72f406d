#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# The GPU check, run on the GPU machine from the repo root (CONTRIBUTING.md#gpu-checks):
#   scripts/gpu/check.sh [STAGES...]
#   stages: info tests refdiff bench python sanitize (default: all, in that order), and soak (only
#   when named: SOAK_ARGS=--short for a few seconds, else the full soak, tests/soak/README.md)
# Needs: .gpu-bin/ (scripts/gpu/build.sh, built on the CPU machine and carried) and .shared/ (a
# copy of ../shared, carried). Writes one log per step and the JSON results to $OUT.
set -uo pipefail
B=${BIN:-.gpu-bin}
OUT=${OUT:-/tmp/sparse_swa_out}
LOGS=$(mktemp -d)  # every step's full log; $OUT gets summary.txt (their tails) and the JSON
mkdir -p "$OUT"
stages=${*:-info tests refdiff bench python sanitize}
failed=()
has() { [[ " $stages " == *" $1 "* ]]; }
# step NAME CMD...: runs CMD with its output in $OUT/NAME.log, prints the log's tail.
step() {
  local name=$1
  shift
  echo "== $name: ${*:1:6}"
  local t0=$SECONDS
  "$@" >"$LOGS/$name.log" 2>&1
  local rc=$?
  tail -n "${TAIL:-25}" "$LOGS/$name.log"
  echo "-- $name: exit $rc, $((SECONDS - t0)) s"
  { echo "===== $name (exit $rc)"; tail -n 200 "$LOGS/$name.log"; } >>"$OUT/summary.txt"
  [[ $rc == 0 ]] || failed+=("$name")
}

if has info; then
  nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv
  python3 -c 'import torch, triton; print("torch", torch.__version__, "triton", triton.__version__)'
fi
if has tests; then
  step gtest "$B/sparse_swa_tests" --gtest_brief=1
  grep -E "^\[  FAILED|largest|compared" "$LOGS/gtest.log" | sort -u
  TAIL=5 step cli_contract env SPARSE_SWA_CLI="$B/sparse-swa" SPARSE_SWA_EXAMPLES=examples/batches \
    bash tests/cli/cli_contract_test.sh
fi
if has refdiff; then
  d=$(mktemp -d)
  python3 scripts/gpu/random_batches.py --count "${REFDIFF_COUNT:-600}" --seed "${SEED:-1}" \
    --out "$d"
  files=("$d"/*.json)
  examples=()
  # The seed's reference has no SWA bounded replay: examples with a replay_start are not its.
  for f in examples/batches/*.json; do
    [[ $f == *.expected.json ]] || grep -q '"replay_start"' "$f" || examples+=("$f")
  done
  # The reference's own output on the shipped examples, then on the random batches.
  python3 .shared/anchors/vllm_swa_builder.py run "${examples[@]}" >"$LOGS/ref_examples.jsonl"
  "$B/sparse-swa" build --backend cuda "${examples[@]/#/--input=}" >"$LOGS/ours_examples.jsonl" \
    2>"$LOGS/ours_examples.err" || { echo "!! sparse-swa build failed:"; head -5 "$LOGS/ours_examples.err"; }
  TAIL=12 step refdiff_examples python3 scripts/gpu/compare_outputs.py "$LOGS/ref_examples.jsonl" \
    "$LOGS/ours_examples.jsonl" "${examples[@]}"
  t0=$SECONDS
  python3 .shared/anchors/vllm_swa_builder.py run "${files[@]}" >"$d/ref.jsonl"
  echo "reference run: $((SECONDS - t0)) s for ${#files[@]} batches"
  "$B/sparse-swa" build --backend cuda "${files[@]/#/--input=}" >"$d/ours.jsonl" \
    2>"$LOGS/ours_refdiff.err" || { echo "!! sparse-swa build failed:"; head -5 "$LOGS/ours_refdiff.err"; }
  TAIL=12 step refdiff python3 scripts/gpu/compare_outputs.py "$d/ref.jsonl" "$d/ours.jsonl" \
    "${files[@]}"
fi
if has bench; then
  step anchor_bench python3 .shared/anchors/vllm_swa_builder.py bench --json "$OUT/anchor_bench.json"
  step ours_bench "$B/sparse-swa" bench --backend cuda --json "$OUT/ours_bench.json"
fi
if has python; then
  # The Python module built there (its CUDA backend included) and its GPU tests and example.
  # A default compiler that links libstdc++ statically into the extension makes it crash in its
  # own iostreams beside numpy/torch; build with the system compiler where there is one.
  [[ -x /usr/bin/c++ ]] && export CXX=/usr/bin/c++ CUDAHOSTCXX=/usr/bin/c++
  step pip_install python3 -m pip install --no-build-isolation --no-deps --no-index -q \
    --target /tmp/pysite -C build-dir=/tmp/pybuild2 --upgrade .
  # Every test runs (no -x); the tail lists the failures. PROBE=1 locates a crash after a failure.
  TAIL=60 step pytest timeout "${PYTEST_TIMEOUT:-420}" env PYTHONPATH=/tmp/pysite python3 \
    -X faulthandler -m pytest -q -rfE -p no:cacheprovider tests/python
  if [[ "${PROBE:-0}" == 1 && " ${failed[*]} " == *" pytest "* ]]; then  # with and without torch
    TAIL=6 step probe env PYTHONPATH=/tmp/pysite python3 scripts/gpu/python_crash_probe.py
    TAIL=6 step probe_torch env PYTHONPATH=/tmp/pysite python3 scripts/gpu/python_crash_probe.py --torch
    step pip_install_debug python3 -m pip install --no-build-isolation --no-deps --no-index -q \
      --target /tmp/pysite-dbg -C build-dir=/tmp/pybuild-dbg -C cmake.build-type=RelWithDebInfo .
    TAIL=40 step probe_gdb env PYTHONPATH=/tmp/pysite-dbg cuda-gdb -batch -ex run -ex bt \
      --args python3 scripts/gpu/python_crash_probe.py
    TAIL=30 step toolchain bash scripts/gpu/toolchain_facts.sh
  fi
  # One V4-Flash decode step from Python (plain functions, then torch.ops), and the vLLM drop-in
  # against vLLM's builder.
  TAIL=12 step decode_step env PYTHONPATH=/tmp/pysite python3 bench/decode_step.py
  TAIL=12 step decode_step_torch_ops env PYTHONPATH=/tmp/pysite python3 bench/decode_step.py \
    --torch-ops
  TAIL=10 step vllm_dropin_bench env PYTHONPATH=/tmp/pysite python3 bench/vllm_dropin_bench.py \
    --anchors .shared/anchors
  TAIL=40 step engine_example env PYTHONPATH=/tmp/pysite python3 examples/engine_step.py \
    --anchors .shared/anchors
  # Host cost of a Python build() / sparse_attention() call on torch CUDA tensors.
  TAIL=12 step python_overhead env PYTHONPATH=/tmp/pysite python3 bench/python_overhead.py \
    --device cuda
fi
if has sanitize; then
  # Every CUDA test (the sampled attention shapes too) under memcheck and initcheck; racecheck,
  # much slower, over the builder, consumer, codec and attention-kernel tests. Fewer random cases
  # under the sanitizers: they run the same kernels far slower.
  export SPARSE_SWA_DIFF_CASES=200 SPARSE_SWA_CONSUMER_CASES=200 SPARSE_SWA_CONCURRENT_STEPS=4
  for tool in memcheck initcheck racecheck; do
    filter='*Cuda*'
    [[ $tool == racecheck ]] && filter='CudaBuilder*:ConsumersCuda*:*KvCodecCuda*:AttentionCuda.*'
    TAIL=8 step "sanitize_$tool" timeout "${SANITIZE_TIMEOUT:-240}" compute-sanitizer \
      --tool "$tool" --error-exitcode 9 "$B/sparse_swa_tests" --gtest_filter="$filter" \
      --gtest_brief=1
  done
fi
if has soak; then
  # The CUDA builder replayed from graphs and the attention called over and over, sampled results
  # against the CPU, memory before and after; the summary goes to $OUT/soak.json.
  TAIL=30 step soak timeout "${SOAK_TIMEOUT:-540}" "$B/sparse_swa_soak" --json="$OUT/soak.json" \
    ${SOAK_ARGS:-}
fi
echo "failed steps: ${failed[*]:-none}"
[[ ${#failed[@]} == 0 ]]
