#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# compile_alone.sh CXX INCLUDE_DIR GENERATED_INCLUDE_DIR UNIT.cc...: each unit (one public
# header's #include) through CXX -fsyntax-only with -Wall -Wextra -Wpedantic -Werror.
set -u
cxx=$1 include=$2 generated=$3
shift 3
failed=0
for unit in "$@"; do
  if ! "$cxx" -std=c++20 -fsyntax-only -Wall -Wextra -Wpedantic -Werror -I"$include" \
    -I"$generated" "$unit"; then
    echo "FAIL  $(head -1 "$unit")"
    failed=$((failed + 1))
  fi
done
echo "$# headers, $failed failed ($cxx)"
[[ $failed -eq 0 && $# -gt 0 ]]
