#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# The Python module's device tests without a full `pip install` (check.sh's python stage): the
# extension target alone, built on the GPU machine against its Python, then pytest on FILES
# (default tests/python/test_device_paths.py). Run from the repo root:
#   scripts/gpu/python_device_tests.sh [FILES...]
set -uo pipefail
OUT=${OUT:-/tmp/sparse_swa_out}
mkdir -p "$OUT"
# The system compiler where there is one (see check.sh: a statically linked libstdc++ crashes).
[[ -x /usr/bin/c++ ]] && export CXX=/usr/bin/c++ CUDAHOSTCXX=/usr/bin/c++
build=${PYBUILD:-/tmp/pybuild-tests}
{
  cmake -S . -B "$build" -DCMAKE_BUILD_TYPE=Release -DSPARSE_SWA_PYTHON=ON -DSPARSE_SWA_CUDA=ON \
    -DSPARSE_SWA_TESTS=OFF -DSPARSE_SWA_BENCH=OFF -DSPARSE_SWA_CLI=OFF \
    -DPython_EXECUTABLE="$(command -v python3)" &&
    cmake --build "$build" -j "$(nproc)" --target _sparse_swa
} >"$OUT/python_build.log" 2>&1
rc=$?
echo "python module build: exit $rc"
[[ $rc == 0 ]] || { tail -20 "$OUT/python_build.log"; exit "$rc"; }
PYTHONPATH="$build/python" timeout "${PYTEST_TIMEOUT:-300}" python3 -X faulthandler -m pytest -q \
  -rfE -p no:cacheprovider "${@:-tests/python/test_device_paths.py}" 2>&1 | tail -30
