#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# Sanitizer CI (`make sanitize`, CONTRIBUTING.md), CPU only. Exits non-zero when any step fails;
# runs every step anyway.
#   1. build-asan/: the library, CLI and tests with AddressSanitizer + UndefinedBehaviorSanitizer
#      (SPARSE_SWA_SANITIZE=ON, SPARSE_SWA_CUDA=OFF) and its ctest (GoogleTest + CLI contract);
#   2. every malformed input of tests/data/errors through the sanitized CLI: exit 1 and the
#      message listed in tests/data/errors/cases.json on stderr, no sanitizer report;
#   3. build-fuzz/: the libFuzzer targets (clang++): each replays tests/fuzz/regressions/<target>
#      (known crashers), then fuzzes for FUZZ_SECONDS (default 30) from its seed corpus in
#      tests/fuzz/corpus/<target> (new inputs go to build-fuzz/fuzz-work/, not the repository).
#   4. build-tsan/: the library and tests with ThreadSanitizer (SPARSE_SWA_TSAN=ON); the
#      concurrency tests (several CPU builders, consumers and attention calls in several threads,
#      results equal to serial runs).
# Environment: FUZZ_SECONDS, JOBS (default nproc), ASAN_DIR, FUZZ_DIR, TSAN_DIR, SKIP_ASAN=1,
# SKIP_FUZZ=1, SKIP_TSAN=1.
# A crash leaves its input in $FUZZ_DIR/fuzz-work/<target>/artifacts/; replay it with
#   $FUZZ_DIR/tests/fuzz/<target> <artifact>
set -uo pipefail
cd "$(dirname "$0")/../.."

FUZZ_SECONDS=${FUZZ_SECONDS:-30}
JOBS=${JOBS:-$(nproc)}
ASAN_DIR=${ASAN_DIR:-build-asan}
FUZZ_DIR=${FUZZ_DIR:-build-fuzz}
TSAN_DIR=${TSAN_DIR:-build-tsan}
FUZZ_TARGETS=(fuzz_batch_json fuzz_consumers fuzz_kv_decode fuzz_attention fuzz_kv_codec)

export ASAN_OPTIONS=${ASAN_OPTIONS:-abort_on_error=1:detect_leaks=1:strict_string_checks=1:check_initialization_order=1}
export UBSAN_OPTIONS=${UBSAN_OPTIONS:-print_stacktrace=1:halt_on_error=1}

start=$(date +%s)
failures=()
step() { echo; echo "=== $* ($(( $(date +%s) - start )) s)"; }
fail() { echo "FAILED: $*"; failures+=("$*"); }

if [[ "${SKIP_ASAN:-0}" != 1 ]]; then
  step "ASan+UBSan build in $ASAN_DIR"
  # -O1: the sanitizers' usual level, and a third less compile time than -O2 on 2 cores.
  if cmake -S . -B "$ASAN_DIR" -DCMAKE_BUILD_TYPE=RelWithDebInfo \
       "-DCMAKE_CXX_FLAGS_RELWITHDEBINFO=-O1 -g -DNDEBUG" -DSPARSE_SWA_SANITIZE=ON \
       -DSPARSE_SWA_CUDA=OFF -DSPARSE_SWA_BENCH=OFF -DSPARSE_SWA_PYTHON=OFF >/dev/null &&
     cmake --build "$ASAN_DIR" -j "$JOBS"; then
    step "ctest in $ASAN_DIR"
    ctest --test-dir "$ASAN_DIR" --output-on-failure -j "$JOBS" || fail "ctest ($ASAN_DIR)"

    step "tests/data/errors through the sanitized CLI"
    python3 - "$ASAN_DIR/sparse-swa" <<'EOF' || fail "CLI error inputs"
import json, pathlib, subprocess, sys
cli = sys.argv[1]
root = pathlib.Path("tests/data/errors")
bad = 0
cases = json.loads((root / "cases.json").read_text())
for case in cases:
    path = root / "inputs" / (case["id"] + ".json")
    if not path.exists():
        continue  # an API case
    run = subprocess.run([cli, "build", "--input", str(path)], capture_output=True, timeout=60)
    # The CLI names the file where the library says "batch file".
    want = "sparse-swa: error: " + case["message"].replace("batch file:", str(path) + ":", 1)
    got = run.stderr.decode("utf-8", "replace").strip()
    if run.returncode != 1 or got != want or run.stdout:
        bad += 1
        print(f"{case['id']}: exit {run.returncode}\n  expected: {want}\n  got:      {got}")
print(f"{sum(1 for c in cases if (root / 'inputs' / (c['id'] + '.json')).exists())} inputs, "
      f"{bad} wrong")
sys.exit(1 if bad else 0)
EOF
  else
    fail "ASan build"
  fi
fi

if [[ "${SKIP_FUZZ:-0}" != 1 ]]; then
  step "libFuzzer build in $FUZZ_DIR"
  if cmake -S . -B "$FUZZ_DIR" -DCMAKE_BUILD_TYPE=RelWithDebInfo -DCMAKE_CXX_COMPILER=clang++ \
       "-DCMAKE_CXX_FLAGS_RELWITHDEBINFO=-O1 -g -DNDEBUG" \
       -DSPARSE_SWA_FUZZ=ON -DSPARSE_SWA_CUDA=OFF -DSPARSE_SWA_TESTS=OFF -DSPARSE_SWA_BENCH=OFF \
       -DSPARSE_SWA_CLI=OFF -DSPARSE_SWA_PYTHON=OFF >/dev/null &&
     cmake --build "$FUZZ_DIR" -j "$JOBS"; then
    for target in "${FUZZ_TARGETS[@]}"; do
      step "$target for ${FUZZ_SECONDS} s"
      work="$FUZZ_DIR/fuzz-work/$target"
      mkdir -p "$work/corpus" "$work/artifacts"
      # Known crashers first, one by one (CI stays red until each is fixed).
      for input in tests/fuzz/regressions/"$target"/*; do
        [[ -f "$input" ]] || continue
        if ! "$FUZZ_DIR/tests/fuzz/$target" -rss_limit_mb=2048 "$input" >"$work/replay.log" 2>&1; then
          grep -m1 -E "runtime error|what\(\)|ERROR: AddressSanitizer|^$target: " "$work/replay.log"
          fail "$target regression $input"
        fi
      done
      # Seeds: the corpus and, for the JSON reader, the malformed inputs of the error table.
      extra=()
      seeds=(tests/fuzz/corpus/$target)
      if [[ "$target" == fuzz_batch_json ]]; then
        extra=(-dict=tests/fuzz/batch_json.dict)
        seeds+=(tests/data/errors/inputs)
      fi
      if "$FUZZ_DIR/tests/fuzz/$target" -max_total_time="$FUZZ_SECONDS" -timeout=10 \
           -rss_limit_mb=2048 -print_final_stats=1 -artifact_prefix="$work/artifacts/" \
           "${extra[@]}" "$work/corpus" "${seeds[@]}" >"$work/log" 2>&1; then
        grep -E "^stat::number_of_executed_units|^Done" "$work/log" | tr '\n' ' '
        echo
      else
        grep -E -m5 "runtime error|what\(\)|ERROR: |^$target: |^SUMMARY|Test unit written" "$work/log"
        fail "$target (log: $work/log, input: $work/artifacts/)"
      fi
    done
  else
    fail "libFuzzer build"
  fi
fi

if [[ "${SKIP_TSAN:-0}" != 1 ]]; then
  step "ThreadSanitizer build in $TSAN_DIR"
  if cmake -S . -B "$TSAN_DIR" -DCMAKE_BUILD_TYPE=RelWithDebInfo \
       "-DCMAKE_CXX_FLAGS_RELWITHDEBINFO=-O1 -g -DNDEBUG" -DSPARSE_SWA_TSAN=ON \
       -DSPARSE_SWA_CUDA=OFF -DSPARSE_SWA_BENCH=OFF -DSPARSE_SWA_CLI=OFF \
       -DSPARSE_SWA_PYTHON=OFF >/dev/null &&
     cmake --build "$TSAN_DIR" -j "$JOBS" --target sparse_swa_tests; then
    step "concurrency tests under ThreadSanitizer"
    TSAN_OPTIONS=${TSAN_OPTIONS:-halt_on_error=1:second_deadlock_stack=1} \
      "$TSAN_DIR/tests/sparse_swa_tests" --gtest_filter='Concurrent*' || fail "TSan concurrency tests"
  else
    fail "TSan build"
  fi
fi

step "done"
echo "sanitize.sh took $(( $(date +%s) - start )) s"
if (( ${#failures[@]} )); then
  printf 'FAILED: %s\n' "${failures[@]}"
  exit 1
fi
echo "all sanitizer and fuzzing checks passed"
