#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# The GPU check, run on the GPU machine from the repo root (CONTRIBUTING.md#gpu-checks):
#   scripts/gpu/check.sh [STAGES...]
#   default stages, in this order: info tests refdiff bench python sanitize
#   only when named: smoke attention flashmla sweep ncu soak
# Needs: .gpu-bin/ (scripts/gpu/build.sh, built on the CPU machine and carried) and .shared/ (a
# copy of ../shared, carried); flashmla and sweep's FlashMLA column need .whl/ (bench/README.md).
# Writes one log per step and the JSON results to $OUT; $OUT/summary.txt gathers the logs' tails.
set -uo pipefail
B=${BIN:-.gpu-bin}
OUT=${OUT:-/tmp/sparse_swa_out}
LOGS=$(mktemp -d)  # every step's full log; $OUT gets summary.txt (their tails) and the JSON
mkdir -p "$OUT"
stages=${*:-info tests refdiff bench python sanitize}
failed=()
has() { [[ " $stages " == *" $1 "* ]]; }
# step NAME CMD...: runs CMD with its output in $LOGS/NAME.log, prints the log's tail.
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
# FlashMLA's wheel (.whl/, bench/README.md#method) into /tmp/site, for PYTHONPATH=/tmp/site.
install_flashmla() {
  python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl
}

if has info; then
  nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.sm,clocks.max.sm \
    --format=csv
  python3 -c 'import torch, triton; print("torch", torch.__version__, "triton", triton.__version__)'
fi
if has smoke; then
  # A few 8-head shapes of every attention kernel under a short limit: a kernel that hangs or
  # fails ends the call here instead of spending the device time of the later stages.
  TAIL=6 step smoke timeout "${SMOKE_TIMEOUT:-60}" "$B/sparse_swa_tests" \
    --gtest_filter="${SMOKE_FILTER:-*AttentionCudaVsCpu*/H8_*}" --gtest_brief=1
  [[ " ${failed[*]} " == *" smoke "* ]] && { echo "smoke failed: stopping"; exit 4; }
fi
if has tests; then
  # The whole suite: every CUDA test (random batches CUDA vs CPU bit for bit, graph capture and
  # replay, attention vs the double reference), then the CLI contract on the CUDA build.
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
  # The builder: the reference's bench and `sparse-swa bench` on the same scenarios.
  step anchor_bench python3 .shared/anchors/vllm_swa_builder.py bench --json "$OUT/anchor_bench.json"
  step ours_bench "$B/sparse-swa" bench --backend cuda --json "$OUT/ours_bench.json"
fi
if has attention; then
  # The attention benchmark (graph replays, flushed L2; BENCH_ARGS e.g. "--filter prefill").
  TAIL=40 step attention_bench timeout 300 "$B/sparse_swa_attention_bench" \
    --json "$OUT/attention_bench.json" ${BENCH_ARGS:-}
fi
if has flashmla; then
  # FlashMLA's sparse kernels on the same shapes, the same way.
  install_flashmla >/dev/null && TAIL=40 step flashmla env PYTHONPATH=/tmp/site timeout 300 \
    python3 bench/flashmla_bench.py --json "$OUT/flashmla.json" ${BENCH_ARGS:-}
fi
if has sweep; then
  # The decode batch-size sweep, ours and FlashMLA's (when .whl/ holds it), merged into one
  # table; SWEEP_CACHE=bf16 on bf16 caches (FlashMLA: flash_mla_sparse_fwd), SWEEP_RUNS replays.
  cache=${SWEEP_CACHE:-fp8_ds_mla}
  TAIL=3 step sweep timeout 400 "$B/sparse_swa_attention_bench" --sweep --cache "$cache" \
    --runs "${SWEEP_RUNS:-20}" --json "$OUT/sweep_$cache.json"
  if ls .whl/*.whl >/dev/null 2>&1 && install_flashmla >/dev/null; then
    TAIL=3 step sweep_flashmla env PYTHONPATH=/tmp/site timeout 300 python3 \
      bench/flashmla_bench.py --sweep --cache "$cache" --runs "${SWEEP_RUNS:-20}" \
      --json "$OUT/sweep_flashmla_$cache.json"
  fi
  python3 scripts/gpu/sweep_table.py "$OUT/sweep_$cache.json" "$OUT/sweep_flashmla_$cache.json" |
    tee "$OUT/sweep_$cache.md"
fi
if has ncu; then
  # Nsight Compute on the first kernels of each NCU_SHAPES shape's first call (NCU_LAUNCHES of
  # them whose name matches the regex NCU_KERNEL), the report in $OUT; NCU_SRC=1 also writes the
  # per-instruction stall samples (SASS, CSV).
  for shape in ${NCU_SHAPES:-flash_h64_b64}; do
    TAIL=40 step "ncu_$shape" timeout 240 ncu --clock-control none --set full \
      --import-source no -k "regex:${NCU_KERNEL:-.}" --launch-count "${NCU_LAUNCHES:-2}" \
      -f -o "$OUT/ncu_$shape" "$B/sparse_swa_attention_bench" --only "$shape" --runs 2
    ncu -i "$OUT/ncu_$shape.ncu-rep" --page details --section SpeedOfLight \
      --section WarpStateStats --section MemoryWorkloadAnalysis --section Occupancy |
      grep -E "Duration|Throughput|Stall|Registers|Achieved Occupancy|Executed Ipc" | head -40
    [[ ${NCU_SRC:-0} == 1 ]] && ncu -i "$OUT/ncu_$shape.ncu-rep" --page source --csv \
      --print-source sass >"$OUT/sass_$shape.csv"
  done
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
    # The toolchain behind the build, for a crash report.
    TAIL=30 step toolchain bash -c 'c++ --version | head -1
      python3 -m pip show nanobind scikit-build-core numpy | grep -E "^(Name|Version)"
      ldd /tmp/pysite/sparse_swa/*.so
      grep -E "CMAKE_CXX_COMPILER:|CMAKE_CXX_FLAGS:|CMAKE_CUDA_HOST_COMPILER" \
        /tmp/pybuild2/CMakeCache.txt'
  fi
  # The vLLM drop-in against vLLM 0.33's builders and the seed's, with their counts (-s).
  TAIL=30 step vllm_differentials env PYTHONPATH=/tmp/pysite python3 -m pytest -q -rs -s \
    -p no:cacheprovider tests/python/test_vllm_033_builder.py tests/python/test_vllm_integration.py
  # One V4-Flash decode step from Python (plain functions, then torch.ops), and the vLLM drop-in
  # against vLLM's builder.
  TAIL=12 step decode_step env PYTHONPATH=/tmp/pysite python3 bench/decode_step.py
  TAIL=12 step decode_step_torch_ops env PYTHONPATH=/tmp/pysite python3 bench/decode_step.py \
    --torch-ops
  TAIL=10 step vllm_dropin_bench env PYTHONPATH=/tmp/pysite python3 bench/vllm_dropin_bench.py \
    --anchors .shared/anchors
  TAIL=8 step vllm_groups_bench env PYTHONPATH=/tmp/pysite python3 bench/vllm_groups_bench.py \
    --json "$OUT/vllm_groups_bench.json"
  TAIL=40 step engine_example env PYTHONPATH=/tmp/pysite python3 examples/engine_step.py \
    --anchors .shared/anchors
  # Host cost of a Python build() / sparse_attention() call on torch CUDA tensors.
  TAIL=12 step python_overhead env PYTHONPATH=/tmp/pysite python3 bench/python_overhead.py \
    --device cuda
fi
if has sanitize; then
  # Every CUDA test (the attention shapes too) under memcheck and initcheck; racecheck, much
  # slower, over the builder, consumer and codec tests, the attention behaviour tests and the
  # attention shapes of 1 and 3 heads. Fewer random cases: the sanitizers run the kernels slower.
  export SPARSE_SWA_DIFF_CASES=200 SPARSE_SWA_CONSUMER_CASES=200 SPARSE_SWA_CONCURRENT_STEPS=4
  for tool in memcheck initcheck racecheck; do
    filter='*Cuda*'
    [[ $tool == racecheck ]] && filter='CudaBuilder*:ConsumersCuda*:*KvCodecCuda*:AttentionCuda.*'\
':*AttentionCudaVsCpu*/H1_*:*AttentionCudaVsCpu*/H3_*'
    TAIL=8 step "sanitize_$tool" timeout "${SANITIZE_TIMEOUT:-300}" compute-sanitizer \
      --tool "$tool" --error-exitcode 9 "$B/sparse_swa_tests" --gtest_filter="$filter" \
      --gtest_brief=1
  done
fi
if has soak; then
  # The CUDA builder replayed from graphs and the attention called over and over, sampled results
  # against the CPU, memory before and after (tests/soak/README.md); the summary goes to
  # $OUT/soak.json. SOAK_ARGS=--short for a few seconds.
  TAIL=30 step soak timeout "${SOAK_TIMEOUT:-540}" "$B/sparse_swa_soak" --json="$OUT/soak.json" \
    ${SOAK_ARGS:-}
fi
echo "failed steps: ${failed[*]:-none}"
[[ ${#failed[@]} == 0 ]]
