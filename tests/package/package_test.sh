#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# package_test.sh MODE BUILD_DIR SOURCE_DIR WORK_DIR EXPECTED
#   find_package:     installs BUILD_DIR into WORK_DIR/prefix, then configures the consumer
#                     (tests/package/consumer) with CMAKE_PREFIX_PATH there;
#   add_subdirectory: configures the consumer over SOURCE_DIR, CPU only, and checks that the
#                     subproject builds the library alone (no tests, benchmarks, CLI, Python).
# Then builds the consumer in WORK_DIR/build (kept: later runs are incremental), runs it and
# compares its one line with EXPECTED. Env: CMAKE, CXX, BUILD_TYPE.
set -euo pipefail
mode=$1 build=$2 source=$3 work=$4 expected=$5
cmake=${CMAKE:-cmake}
type=${BUILD_TYPE:-RelWithDebInfo}
log=$work/log
mkdir -p "$work"
: >"$log"
step() {
  if ! "$@" >>"$log" 2>&1; then
    echo "FAILED: $*"
    tail -n 40 "$log"
    exit 1
  fi
}

args=(-S "$source/tests/package/consumer" -B "$work/build" -DCMAKE_BUILD_TYPE="$type")
[[ -n "${CXX:-}" ]] && args+=(-DCMAKE_CXX_COMPILER="$CXX")
case $mode in
  find_package)
    rm -rf "$work/prefix"
    step "$cmake" --install "$build" --prefix "$work/prefix" --config "$type"
    for f in include/sparse_swa/version.h include/sparse_swa/metadata_builder.h \
      lib/cmake/sparse_swa/sparse_swaConfig.cmake lib/cmake/sparse_swa/sparse_swaConfigVersion.cmake; do
      [[ -f "$work/prefix/$f" ]] || { echo "FAILED: not installed: $f"; exit 1; }
    done
    args+=(-DCMAKE_PREFIX_PATH="$work/prefix")
    ;;
  add_subdirectory)
    # Debug (-O0): the library's sources compile fastest, and this checks the build, not speed.
    args+=(-DSPARSE_SWA_SOURCE_DIR="$source" -DSPARSE_SWA_CUDA=OFF -DCMAKE_BUILD_TYPE=Debug)
    type=Debug
    ;;
  *)
    echo "unknown mode $mode"
    exit 2
    ;;
esac
step "$cmake" "${args[@]}"
if [[ $mode == add_subdirectory ]]; then
  targets=$("$cmake" --build "$work/build" --target help 2>&1 || true)
  for t in sparse_swa_tests sparse-swa sparse_swa_cpu_bench _sparse_swa sparse_swa_json; do
    if grep -qw -- "$t" <<<"$targets"; then
      echo "FAILED: the subproject defines $t (expected the library alone)"
      exit 1
    fi
  done
fi
step "$cmake" --build "$work/build" --config "$type" -j 2
out=$("$work/build/sparse_swa_consumer")
if [[ "$out" != "$expected" ]]; then
  echo "FAILED: the consumer printed '$out', expected '$expected'"
  exit 1
fi
echo "$mode: $out"
