#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# Another git revision beside this tree on one GPU, in one device call (CONTRIBUTING.md#gpu-checks):
#   here:  bash scripts/gpu/build.sh               # this tree's binaries into .gpu-bin/
#          bash scripts/gpu/ab.sh build REV [NAME]  # REV's into .gpu-bin/rev-NAME/ (NAME: REV)
#   there: bash scripts/gpu/ab.sh run NAME [STAGES...]  (carry .gpu-bin; .shared and .whl harmless)
# `build` checks REV out into a scratch worktree, builds its test binary, attention benchmark and
# CLI (Release) in build-rev-NAME/ and stores them xz-compressed (a revision's three
# binaries take ~6 MB so, ~26 MB unpacked: .gpu-bin stays within a 64 MiB carry).
# `run` stages (default: tests sanitize bench; builder only when named):
#   tests     the attention suite (TEST_FILTER, default '*Attention*') of each tree
#   sanitize  compute-sanitizer memcheck and initcheck (SANITIZE_FILTER) and racecheck
#             (RACECHECK_FILTER) over small attention shapes of each tree; tests and sanitizers of
#             both trees run at once (JOBS at a time, default 8): correctness, not timing
#   bench     sparse_swa_attention_bench of each tree, alone, ROUNDS times (default 2) in the order
#             old new, new old, ...; RUNS graph replays a shape (default 30), BENCH_ARGS passed on
#   builder   `sparse-swa bench --backend cuda` of each tree, alternating the same way
# Sized for one 10-minute device call: the correctness jobs run at once (each at most 300 s,
# TEST_TIMEOUT / SANITIZE_TIMEOUT), then four benchmark runs of ~50 s; ROUNDS=1 halves the second.
# Prints one table: shape, old and new median (µs, the mean of the rounds' medians), new / old,
# each tree's largest error against the double reference and its kernel; then the tests' and
# sanitizers' verdicts. Exit 0 only if everything passed and no shape is more than TOL (0.02)
# slower. Logs and JSON go to $OUT (default /tmp/sparse_swa_out), the logs also as ab_logs.tgz.
set -uo pipefail
cd "$(dirname "$0")/../.."
cmd=${1:-}
shift || true

if [[ $cmd == build ]]; then
  set -e
  rev=${1:?usage: scripts/gpu/ab.sh build REV [NAME]}
  name=${2:-$rev}
  src=$PWD/build-rev-$name/src
  rm -rf "build-rev-$name/src" && git worktree prune
  git worktree add -f --detach "$src" "$rev" >/dev/null 2>&1
  trap 'git worktree remove --force "$src"' EXIT  # the checkout goes, the build folder stays
  # Older trees compiled their data folders in: relative ones work from the repo root there.
  # The same options as scripts/gpu/build.sh.
  cmake -S "$src" -B "build-rev-$name/build" --no-warn-unused-cli -DCMAKE_BUILD_TYPE=Release \
    -DSPARSE_SWA_CUDA=ON -DSPARSE_SWA_BENCH=OFF -DSPARSE_SWA_PYTHON=OFF \
    -DSPARSE_SWA_TEST_DATA_DIR=tests/data -DSPARSE_SWA_EXAMPLES_DIR=examples/batches \
    >"build-rev-$name/configure.log" || { tail -20 "build-rev-$name/configure.log"; exit 1; }
  cmake --build "build-rev-$name/build" -j "${JOBS:-$(nproc)}" --target sparse_swa_tests \
    sparse_swa_attention_bench sparse-swa
  rm -rf ".gpu-bin/rev-$name" && mkdir -p ".gpu-bin/rev-$name"
  for f in tests/sparse_swa_tests bench/sparse_swa_attention_bench sparse-swa; do
    b=.gpu-bin/rev-$name/$(basename "$f")
    cp "build-rev-$name/build/$f" "$b" && strip "$b" && xz -T0 -6 "$b"
  done
  git -C "$src" rev-parse HEAD >".gpu-bin/rev-$name/REVISION"
  du -sh .gpu-bin ".gpu-bin/rev-$name"
  exit 0
fi
[[ $cmd == run ]] || { sed -n '3,23p' "$0"; exit 2; }

name=${1:?usage: scripts/gpu/ab.sh run NAME [STAGES...]}
shift
stages=" ${*:-tests sanitize bench} "
has() { [[ $stages == *" $1 "* ]]; }
NEW=${BIN:-.gpu-bin}
OUT=${OUT:-/tmp/sparse_swa_out}
R=$OUT/ab
rm -rf "$R" && mkdir -p "$R/logs"
trap 'tar czf "$OUT/ab_logs.tgz" -C "$R" . 2>/dev/null' EXIT
# The old tree's binaries, unpacked.
OLD=$(mktemp -d)
for z in ".gpu-bin/rev-$name"/*.xz; do
  [[ -f $z ]] || { echo "no .gpu-bin/rev-$name/*.xz (scripts/gpu/ab.sh build REV $name)"; exit 2; }
  out=$OLD/$(basename "$z" .xz)
  if command -v xz >/dev/null; then xz -dc "$z" >"$out"; else
    python3 -c 'import lzma, shutil, sys
shutil.copyfileobj(lzma.open(sys.argv[1]), sys.stdout.buffer)' "$z" >"$out"
  fi
  chmod +x "$out"
done
echo "old: $name = $(cat ".gpu-bin/rev-$name/REVISION" 2>/dev/null); new: $NEW"
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm,temperature.gpu \
  --format=csv,noheader | tee "$R/gpu.txt"

# Correctness: every job of both trees, JOBS at a time; each leaves its log and exit code.
jobs_list=()
if has tests; then
  for side in old new; do jobs_list+=("$side tests"); done
fi
if has sanitize; then
  for tool in memcheck initcheck racecheck; do
    for side in old new; do jobs_list+=("$side $tool"); done
  done
fi
# Small shapes of every kernel (1, 3 and 8 heads) and the behaviour tests; racecheck, far
# slower, on 1 and 3 heads.
small='*AttentionCudaVsCpu*/H1_*:*AttentionCudaVsCpu*/H3_*'
run_job() {
  local side=$1 job=$2 dir=$NEW filter
  [[ $side == old ]] && dir=$OLD
  case $job in
    tests) timeout "${TEST_TIMEOUT:-300}" "$dir/sparse_swa_tests" \
      --gtest_filter="${TEST_FILTER:-*Attention*}" --gtest_brief=1 ;;
    *)
      filter=${SANITIZE_FILTER:-AttentionCuda.*:$small:*AttentionCudaVsCpu*/H8_*}
      [[ $job == racecheck ]] && filter=${RACECHECK_FILTER:-$small}
      timeout "${SANITIZE_TIMEOUT:-300}" compute-sanitizer --tool "$job" --error-exitcode 9 \
        "$dir/sparse_swa_tests" --gtest_filter="$filter" --gtest_brief=1 ;;
  esac >"$R/logs/${side}_$job.log" 2>&1
  echo $? >"$R/logs/${side}_$job.rc"
}
t0=$SECONDS
for j in "${jobs_list[@]}"; do
  while (($(jobs -rp | wc -l) >= ${JOBS:-8})); do wait -n; done
  run_job $j &
done
wait
((${#jobs_list[@]})) && echo "tests and sanitizers: $((SECONDS - t0)) s"

# Timing: each tree alone, rounds in the order old new, new old, ...
order() { if (($1 % 2)); then echo old new; else echo new old; fi; }
if has bench; then
  for r in $(seq "${ROUNDS:-2}"); do
    for side in $(order "$r"); do
      dir=$NEW
      [[ $side == old ]] && dir=$OLD
      timeout "${BENCH_TIMEOUT:-300}" "$dir/sparse_swa_attention_bench" --runs "${RUNS:-30}" \
        --json "$R/bench_${side}_$r.json" ${BENCH_ARGS:-} >"$R/logs/bench_${side}_$r.log" 2>&1
      echo "bench round $r $side: exit $?"
    done
  done
fi
if has builder; then
  for r in $(seq "${ROUNDS:-2}"); do
    for side in $(order "$r"); do
      dir=$NEW
      [[ $side == old ]] && dir=$OLD
      "$dir/sparse-swa" bench --backend cuda --json "$R/builder_${side}_$r.json" \
        >"$R/logs/builder_${side}_$r.log" 2>&1
      echo "builder round $r $side: exit $?"
    done
  done
fi

python3 - "$R" "${TOL:-0.02}" <<'EOF' | tee "$OUT/ab_summary.txt"
import glob, json, os, re, statistics, sys
R, tol = sys.argv[1], float(sys.argv[2])
bad = []

def rounds(kind, side):
    out = []
    for path in sorted(glob.glob(f"{R}/{kind}_{side}_*.json")):
        try:
            out.append(json.load(open(path)))
        except (OSError, ValueError):
            bad.append(f"{os.path.basename(path)} unreadable")
    return out

def merged(kind, side, key, field):
    """{name: (mean of the rounds' field, last result)} over every round of one tree."""
    acc = {}
    for doc in rounds(kind, side):
        for r in doc["results"] if isinstance(doc, dict) else doc:
            acc.setdefault(key(r), []).append(r)
    return {k: (statistics.mean(x[field] for x in v), v[-1]) for k, v in acc.items()}

bench_old = merged("bench", "old", lambda r: r["shape"], "median_us")
bench_new = merged("bench", "new", lambda r: r["shape"], "median_us")
if bench_old or bench_new:
    print("| shape | old µs | new µs | new / old | old max err | new max err "
          "| kernel old / new |")
    print("|---|---:|---:|---:|---:|---:|---|")
    for shape in list(bench_old) + [s for s in bench_new if s not in bench_old]:
        o, n = bench_old.get(shape), bench_new.get(shape)
        ratio = n[0] / o[0] if o and n and o[0] > 0 else None
        flag = ""
        if ratio is not None and ratio > 1 + tol:
            flag = " SLOWER"
            bad.append(f"{shape} {ratio:.3f}x")
        for side, v in (("old", o), ("new", n)):
            if v and not v[1].get("ok", False):
                flag += f" {side} FAILED CHECK"
                bad.append(f"{shape} {side} output out of tolerance")
        if not (o and n):
            flag += " (one tree only)"
        cell = lambda v, f: f.format(v) if v is not None else "—"
        print(f"| {shape} | {cell(o and o[0], '{:.1f}')} | {cell(n and n[0], '{:.1f}')} | "
              f"{cell(ratio, '{:.3f}')}{flag} | {cell(o and o[1].get('max_err'), '{:.3g}')} | "
              f"{cell(n and n[1].get('max_err'), '{:.3g}')} | "
              f"{o[1].get('kernel', '?') if o else '—'} / "
              f"{n[1].get('kernel', '?') if n else '—'} |")
    ratios = [bench_new[s][0] / bench_old[s][0] for s in bench_old if s in bench_new]
    if ratios:
        print(f"\n{len(ratios)} shapes; new / old from {min(ratios):.3f} to {max(ratios):.3f}, "
              f"geometric mean {statistics.geometric_mean(ratios):.3f}")

# `sparse-swa bench --json`: one list of scenarios, named here by their batch.
scenario = lambda r: f"{r['decodes']} decodes + {r['prefills']} x {r['prefill_len']} {r['method']}"
b_old = merged("builder", "old", scenario, "build_wall_us_median")
b_new = merged("builder", "new", scenario, "build_wall_us_median")
if b_old and b_new:
    print("\n| builder scenario | old wall µs | new wall µs | new / old | old device µs "
          "| new device µs |")
    print("|---|---:|---:|---:|---:|---:|")
    for s in b_old:
        if s in b_new:
            o, n = b_old[s], b_new[s]
            print(f"| {s} | {o[0]:.2f} | {n[0]:.2f} | {n[0] / o[0]:.3f} | "
                  f"{o[1]['device_us_per_build']:.2f} | {n[1]['device_us_per_build']:.2f} |")

print()
for rc_path in sorted(glob.glob(f"{R}/logs/*.rc")):
    job = os.path.basename(rc_path)[:-3]
    rc = open(rc_path).read().strip()
    log = open(rc_path[:-3] + ".log", errors="replace").read()
    passed = re.findall(r"\[  PASSED  \] (\d+) test", log)
    failed = sorted(set(re.findall(r"^\[  FAILED  \] (\S+)", log, re.M)))
    notes = re.findall(r"(ERROR SUMMARY: \d+ errors?|RACECHECK SUMMARY: \d+ hazards?[^\n]*)", log)
    largest = re.findall(r"largest \|cuda - ref_double\| over all shapes: (\S+)", log)
    line = f"{job}: exit {rc}, {passed[-1] if passed else 0} passed"
    line += "".join(f", {n}" for n in notes) + (f", largest error {largest[-1]}" if largest else "")
    if failed:
        line += f", FAILED: {' '.join(failed[:8])}"
    print(line)
    if rc != "0":
        bad.append(f"{job} exit {rc}")
print("\nverdict:", "PASS" if not bad else "FAIL: " + "; ".join(bad[:20]))
sys.exit(1 if bad else 0)
EOF
