#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# Side-by-side bench on the GPU machine: the reference builder once, then `sparse-swa bench` of
# .gpu-bin/sparse-swa and of every binary in .gpu-bin/variants/ (scripts/gpu/build_variants.sh),
# each twice, alternating, so that drift between them shows. JSON results go to $OUT.
set -uo pipefail
OUT=${OUT:-/tmp/sparse_swa_out}
mkdir -p "$OUT"
python3 .shared/anchors/vllm_swa_builder.py bench --json "$OUT/anchor_bench.json" | tail -n 8
bins=(.gpu-bin/sparse-swa .gpu-bin/variants/*)
for round in 1 2; do
  for b in "${bins[@]}"; do
    [[ -x $b ]] || continue
    name=$(basename "$b")
    echo "== $name (round $round)"
    "$b" bench --backend cuda --json "$OUT/bench_${name}_$round.json" | tail -n 10
  done
done
python3 .shared/anchors/vllm_swa_builder.py bench --json "$OUT/anchor_bench_2.json" | tail -n 8
