#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# Before/after of the Python call costs in one device session (host CPUs differ between
# sessions): builds the Python module of this tree and of an earlier one side by side, then runs
# bench/python_overhead.py --device cuda --repeat 3 on each, alternately (the order swapped every
# round), ROUNDS processes each, pinned to one CPU (PIN_CPU); prints the fastest and the median
# process per call (device hosts are noisy and a whole process can run slow).
#   here:   mkdir .prev-tree && git archive REV | tar -x -C .prev-tree &&
#             rm -r .prev-tree/tests/fuzz/corpus    # 20 MiB the module does not need
#           then carry .prev-tree
#   device: scripts/gpu/python_overhead_ab.sh [.prev-tree]
set -uo pipefail
PREV=${1:-.prev-tree}
OUT=${OUT:-/tmp/sparse_swa_out}
mkdir -p "$OUT"
[[ -x /usr/bin/c++ ]] && export CXX=/usr/bin/c++ CUDAHOSTCXX=/usr/bin/c++
install() {  # SRC TARGET BUILD_DIR
  python3 -m pip install --no-build-isolation --no-deps --no-index -q --target "$2" \
    -C build-dir="$3" --upgrade "$1" >"$OUT/pip_$(basename "$2").log" 2>&1
}
t0=$SECONDS
install "$PREV" /tmp/pysite-prev /tmp/pybuild-prev &
install . /tmp/pysite /tmp/pybuild2 &
wait
echo "built both in $((SECONDS - t0)) s"
pin=()
command -v taskset >/dev/null && pin=(taskset -c "${PIN_CPU:-2}")
runs=$(mktemp -d)
for r in $(seq "${ROUNDS:-6}"); do
  order="prev new"
  ((r % 2 == 0)) && order="new prev"
  for site in $order; do
    dir=/tmp/pysite
    [[ $site == prev ]] && dir=/tmp/pysite-prev
    PYTHONPATH=$dir "${pin[@]}" python3 bench/python_overhead.py --device cuda --repeat 3 \
      >"$runs/$site.$r.txt" 2>&1
  done
done
cat "$runs"/*.txt >"$OUT/python_overhead_ab_runs.txt"
# Per call and build: the fastest process and the median process (CPU time, us).
python3 - "$runs" <<'PY'
import collections, glob, os, statistics, sys
t = collections.defaultdict(list)
for f in sorted(glob.glob(os.path.join(sys.argv[1], "*.txt"))):
    site = os.path.basename(f).split(".")[0]
    for line in open(f):
        parts = line.rsplit(None, 2)
        if len(parts) == 3 and "(torch CUDA" in parts[0]:
            t[(parts[0].strip(), site)].append(float(parts[1]))
calls = sorted({c for c, _ in t}, key=lambda c: list(k for k, _ in t).index(c))
print(f"{'call (CPU us; fastest / median process)':58s} {'before':>14s} {'after':>14s}")
for c in calls:
    cols = []
    for site in ("prev", "new"):
        v = t.get((c, site), [])
        cols.append(f"{min(v):.2f} / {statistics.median(v):.2f}" if v else "-")
    print(f"{c:58s} {cols[0]:>14s} {cols[1]:>14s}")
PY
