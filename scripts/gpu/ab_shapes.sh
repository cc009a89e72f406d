#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# Alternating A/B on the GPU machine, from the repo root: each shape timed under each choice in
# turn, ROUNDS times (one session, so clocks and L2 state drift alike for every choice):
#   CHOICES="kernel:decode kernel:prefill" SHAPES="flash_h64_b16 ..." scripts/gpu/ab_shapes.sh
# A choice is kernel:NAME (`--kernel NAME`), env:VAR=VALUE (that variable set) or bin:NAME
# (.gpu-bin/var-NAME/'s benchmark: scripts/gpu/build_variants.sh; bin:head is .gpu-bin's own), or
# several of these joined by commas (bin:NAME,env:VAR=VALUE).
# [ROUNDS=2] [RUNS=20] [BENCH_ARGS=...]. Prints round, choice, shape, median, min, warm. A choice
# that fails once (a hang runs into the 60 s limit) is skipped from then on.
set -uo pipefail
failed=" "
for r in $(seq "${ROUNDS:-2}"); do
  for s in ${SHAPES:?}; do
    for choice in ${CHOICES:?}; do
      if [[ $failed == *" $choice "* ]]; then
        echo "round $r $choice: skipped (failed before)"
        continue
      fi
      bench=.gpu-bin/sparse_swa_attention_bench
      env=()
      args=()
      IFS=, read -ra parts <<<"$choice"
      for part in "${parts[@]}"; do
        case $part in
          kernel:*) args+=(--kernel "${part#kernel:}") ;;
          env:*) env+=("${part#env:}") ;;
          bin:head) ;;
          bin:*) bench=.gpu-bin/var-${part#bin:}/sparse_swa_attention_bench ;;
          *) echo "unknown choice: $part" >&2; exit 2 ;;
        esac
      done
      line=$(env "${env[@]}" timeout 60 "$bench" --only "$s" --runs "${RUNS:-20}" "${args[@]}" \
        ${BENCH_ARGS:-} 2>&1 | grep -E "^$s +[0-9]+ ")
      [[ -n $line ]] || failed+="$choice "
      echo "round $r $choice: ${line:-FAILED}" | awk '{print $1, $2, $3, $4, $6, $7, $8}'
    done
  done
done
