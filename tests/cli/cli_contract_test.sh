#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# The sparse-swa CLI end to end: the JSON contract on the shipped cases, exit codes (0 ok,
# 1 invalid input with "sparse-swa: error: ..." on stderr, 2 usage), demo and table output.
# Env: SPARSE_SWA_CLI (the binary), SPARSE_SWA_EXAMPLES (the example batch files and their
# expected outputs; default: examples/batches), SPARSE_SWA_VERSION (what --version prints;
# default: project(VERSION) of CMakeLists.txt). Run by ctest as
# `cli_contract`; prints "N passed, M failed" last and exits non-zero on any failure.
set -u

CLI=${SPARSE_SWA_CLI:?set SPARSE_SWA_CLI to the sparse-swa binary}
DATA=${SPARSE_SWA_EXAMPLES:-$(dirname "$0")/../../examples/batches}
VERSION=${SPARSE_SWA_VERSION:-$(sed -n 's/^project(sparse_swa VERSION \([0-9.]*\).*/\1/p' \
  "$(dirname "$0")/../../CMakeLists.txt")}
TMP=$(mktemp -d)
trap 'rm -rf "$TMP"' EXIT

passed=0
failed=0
pass() { passed=$((passed + 1)); echo "ok    $1"; }
fail() {
  failed=$((failed + 1))
  echo "FAIL  $1"
  shift
  for line in "$@"; do echo "      $line"; done
}

# run ARGS...: runs the CLI; sets rc and leaves stdout/stderr in $TMP/out, $TMP/err.
run() {
  "$CLI" "$@" >"$TMP/out" 2>"$TMP/err" </dev/null
  rc=$?
}

# Field-by-field JSON equality (and the same key order), as the reference's output is diffed.
same_json() {
  python3 - "$1" "$2" <<'EOF'
import json, sys
actual_text = open(sys.argv[1]).read()
expected = json.load(open(sys.argv[2]))
try:
    actual = json.loads(actual_text)
except ValueError as e:
    sys.exit(f"output is not JSON: {e}")
if actual_text.count("\n") != 1 or not actual_text.endswith("\n"):
    sys.exit("output is not exactly one line")
bad = [k for k in expected if actual.get(k, object()) != expected[k]]
extra = sorted(set(actual) - set(expected))
if bad or extra:
    sys.exit(f"fields differ: {bad}; extra keys: {extra}")
if list(actual) != list(expected):
    sys.exit(f"key order differs: {list(actual)}")
EOF
}

# expect_json NAME FILE ARGS...: exit 0, empty stderr, stdout equal to FILE.
expect_json() {
  local name=$1 expected=$2
  shift 2
  run "$@"
  if [[ $rc -ne 0 ]]; then
    fail "$name" "exit $rc, expected 0" "$(head -c 400 "$TMP/err")"
  elif [[ -s "$TMP/err" ]]; then
    fail "$name" "unexpected stderr: $(head -c 400 "$TMP/err")"
  elif ! msg=$(same_json "$TMP/out" "$expected" 2>&1); then
    fail "$name" "$msg"
  else
    pass "$name"
  fi
}

# expect_error NAME CODE NEEDLE ARGS...: exit CODE, nothing on stdout, NEEDLE in stderr.
expect_error() {
  local name=$1 code=$2 needle=$3
  shift 3
  run "$@"
  if [[ $rc -ne $code ]]; then
    fail "$name" "exit $rc, expected $code" "stderr: $(head -c 400 "$TMP/err")"
  elif [[ -s "$TMP/out" ]]; then
    fail "$name" "unexpected stdout: $(head -c 200 "$TMP/out")"
  elif ! grep -qF -- "$needle" "$TMP/err"; then
    fail "$name" "stderr lacks: $needle" "stderr: $(head -c 400 "$TMP/err")"
  else
    pass "$name"
  fi
}

# --- The JSON contract on every case with an expected output --------------------------------
num_cases=0
for expected in "$DATA"/*.expected.json; do
  batch=${expected%.expected.json}.json
  [[ -f "$batch" ]] || continue
  num_cases=$((num_cases + 1))
  name=$(basename "$batch" .json)
  expect_json "build $name" "$expected" build --input "$batch"
  expect_json "build $name --backend cpu --format json" "$expected" build --input "$batch" \
    --backend cpu --format json
done
if [[ $num_cases -ge 2 ]]; then pass "found $num_cases cases"; else fail "found $num_cases cases, expected >= 2"; fi

# The file given positionally, as check-config takes its file; mixed with --input, one line each
# in command-line order.
expect_json "build FILE (positional)" "$DATA/mixed_mtp.expected.json" build "$DATA/mixed_mtp.json"
run build "$DATA/mixed_mtp.json" --input "$DATA/padded_decode.json"
if [[ $rc -eq 0 && $(wc -l <"$TMP/out") -eq 2 ]] &&
  head -1 "$TMP/out" >"$TMP/first" && same_json "$TMP/first" "$DATA/mixed_mtp.expected.json" &&
  tail -1 "$TMP/out" >"$TMP/second" && same_json "$TMP/second" "$DATA/padded_decode.expected.json"; then
  pass "build FILE --input FILE (two lines, in order)"
else
  fail "build FILE --input FILE (two lines, in order)" "exit $rc" "$(head -c 300 "$TMP/err")"
fi

# Stdin as the input file.
if "$CLI" build --input - <"$DATA/mixed_mtp.json" >"$TMP/out" 2>"$TMP/err" &&
  msg=$(same_json "$TMP/out" "$DATA/mixed_mtp.expected.json" 2>&1); then
  pass "build --input - (stdin)"
else
  fail "build --input - (stdin)" "${msg:-exit $?}" "$(head -c 400 "$TMP/err")"
fi

# --- Invalid input: exit 1 and a message naming the field ----------------------------------
# mutate NAME PYTHON: writes $TMP/NAME.json, mixed_mtp.json changed by PYTHON (on `d`).
mutate() {
  python3 - "$DATA/mixed_mtp.json" "$TMP/$1.json" "$2" <<'EOF'
import json, sys
d = json.load(open(sys.argv[1]))
exec(sys.argv[3])
open(sys.argv[2], "w").write(json.dumps(d))
EOF
}

mutate float_int 'd["batch"]["seq_lens"][1] = 2.5'
expect_error "float where an integer belongs" 1 \
  "sparse-swa: error: batch.seq_lens[1]: expected an integer, got 2.5" build --input "$TMP/float_int.json"
mutate float_whole 'd["config"]["window_size"] = 8.0'
expect_error "integral float where an integer belongs" 1 \
  "config.window_size: expected an integer, got 8.0" build --input "$TMP/float_whole.json"
mutate string_int 'd["config"]["block_size"] = "4"'
expect_error "string where an integer belongs" 1 \
  'config.block_size: expected an integer, got "4"' build --input "$TMP/string_int.json"
mutate big_int 'd["batch"]["query_start_loc"][3] = 2**40'
expect_error "integer outside int32" 1 \
  "batch.query_start_loc[3]: expected an int32 integer, got 1099511627776" \
  build --input "$TMP/big_int.json"
mutate missing 'del d["config"]["max_model_len"]'
expect_error "missing required field" 1 \
  "config.max_model_len: expected an integer, got nothing (the field is required)" \
  build --input "$TMP/missing.json"
mutate ragged 'd["batch"]["block_table"][1] = [5, 11]'
expect_error "ragged block_table" 1 "batch.block_table[1]: expected 4 entries" \
  build --input "$TMP/ragged.json"
mutate span_key 'd["config"]["max_image_tokens"] = 4; d["batch"]["image_spans"] = {"two": [[6, 7]]}'
expect_error "image span key not an integer" 1 \
  'batch.image_spans["two"]: expected a request index (a decimal integer key), got "two"' \
  build --input "$TMP/span_key.json"
mutate span_req 'd["config"]["max_image_tokens"] = 4; d["batch"]["image_spans"] = {"5": [[6, 7]]}'
expect_error "image span of a request that does not exist" 1 \
  'batch.image_spans["5"]: expected a request index in [0, 3)' build --input "$TMP/span_req.json"
mutate method 'd["config"]["speculative_method"] = "eagle"'
expect_error "unknown speculative_method" 1 \
  'config.speculative_method: expected one of none, mtp, dspark, got "eagle"' \
  build --input "$TMP/method.json"
mutate causal 'd["batch"]["causal"] = False'
expect_error "causal=false without dspark" 1 "batch.causal: false" build --input "$TMP/causal.json"
mutate seq_short 'd["batch"]["seq_lens"][2] = 3'
expect_error "seq_len shorter than the query" 1 "batch.seq_lens[2]: expected >= the query length 4" \
  build --input "$TMP/seq_short.json"
mutate ratio 'd["chunk_plan_requests"][1]["compress_ratio"] = 3'
expect_error "chunk plan ratio outside {1, 2, 4, 128}" 1 \
  "chunk_plan_requests[1].compress_ratio: expected a compress ratio in {1, 2, 4, 128}, got 3" \
  build --input "$TMP/ratio.json"
mutate config_ratio 'd["config"]["compress_ratios"] = [1, 8]'
expect_error "config compress ratio outside {1, 2, 4, 128}" 1 "config.compress_ratios[1]" \
  build --input "$TMP/config_ratio.json"
printf '{"config": {"window_size": 8,, }' >"$TMP/malformed.json"
expect_error "malformed JSON" 1 "$TMP/malformed.json: malformed JSON: [json.exception.parse_error.101] parse error at line 1" \
  build --input "$TMP/malformed.json"
printf '' >"$TMP/empty.json"
expect_error "empty file" 1 "malformed JSON" build --input "$TMP/empty.json"
printf '[1, 2]' >"$TMP/array.json"
expect_error "top level not an object" 1 'expected a JSON object with "config" and "batch"' \
  build --input "$TMP/array.json"
expect_error "unreadable file" 1 "$TMP/no_such.json: cannot read the batch file" \
  build --input "$TMP/no_such.json"
expect_error "directory as input" 1 "cannot read the batch file (it is a directory)" \
  build --input "$TMP"
# Resource limits: a file past 256 MiB (sparse: nothing is written or read) and nesting past 64.
truncate -s $((256 * 1024 * 1024 + 1)) "$TMP/huge.json"
expect_error "batch file over the size limit" 1 \
  "$TMP/huge.json: 268435457 bytes, more than the batch file limit of 268435456 bytes" \
  build --input "$TMP/huge.json"
python3 -c 'print("{\"config\": " + "[" * 65 + "]" * 65 + "}")' >"$TMP/deep.json"
expect_error "JSON nested past the depth limit" 1 \
  "$TMP/deep.json: JSON nested deeper than 64 levels (at byte 74)" build --input "$TMP/deep.json"
printf '{"config": {"window_size": 1e999}}' >"$TMP/config_overflow.json"
expect_error "check-config: a number past the double range" 1 \
  "$TMP/config_overflow.json: malformed JSON: [json.exception.out_of_range.406] number overflow" \
  check-config --consumer sparse_swa "$TMP/config_overflow.json"
expect_error "check-config: nesting past the depth limit" 1 "JSON nested deeper than 64 levels" \
  check-config --consumer sparse_swa "$TMP/deep.json"
mutate table_error 'd["batch"]["seq_lens"][1] = 2.5'
expect_error "table format, invalid input" 1 "batch.seq_lens[1]" \
  build --input "$TMP/table_error.json" --format table

# --- Usage errors: exit 2 ------------------------------------------------------------------
expect_error "no subcommand" 2 "subcommand is required"
expect_error "unknown subcommand" 2 \
  "sparse-swa: usage error: unknown command 'frobnicate' (expected one of build, demo, bench, attend, check-config)" \
  frobnicate
expect_error "build without a file" 2 \
  "sparse-swa: usage error: a batch file (sparse-swa build FILE, or --input FILE) is required" build
expect_error "unknown --backend" 2 "--backend: tpu not in {cpu,cuda}" \
  build --input "$DATA/mixed_mtp.json" --backend tpu
expect_error "unknown --format" 2 "--format: yaml not in {json,table}" \
  build --input "$DATA/mixed_mtp.json" --format yaml
expect_error "unknown option" 2 "usage error" build --input "$DATA/mixed_mtp.json" --frobnicate
expect_error "demo with an argument" 2 "usage error" demo extra

# --- Version, help, table, demo ------------------------------------------------------------
run --version
if [[ $rc -eq 0 && ! -s "$TMP/err" && -n "$VERSION" && "$(cat "$TMP/out")" == "sparse-swa $VERSION" ]]; then
  pass "--version"
else
  fail "--version" "exit $rc, expected 'sparse-swa $VERSION'" "$(head -c 200 "$TMP/out")" \
    "$(head -c 200 "$TMP/err")"
fi

run --help
if [[ $rc -eq 0 ]] && grep -q "build" "$TMP/out" && grep -q "demo" "$TMP/out"; then
  pass "--help"
else
  fail "--help" "exit $rc"
fi

run build --input "$DATA/mixed_mtp.json" --format table
if [[ $rc -eq 0 && ! -s "$TMP/err" ]] && grep -q "^split   decodes: 2 requests / 3 tokens" "$TMP/out" &&
  grep -q "31 12..15 36..38" "$TMP/out" && grep -q "compress_ratio 4, chunk_size 4:  \[0,1) N=2 M=12" "$TMP/out"; then
  pass "build --format table"
else
  fail "build --format table" "exit $rc" "$(head -c 600 "$TMP/out")" "$(head -c 300 "$TMP/err")"
fi

run build --input "$DATA/vision_prefill.json" --format table
if [[ $rc -eq 0 ]] && grep -q "img L/R" "$TMP/out"; then
  pass "build --format table (image visibility column)"
else
  fail "build --format table (image visibility column)" "exit $rc" "$(head -c 300 "$TMP/err")"
fi

run demo
if [[ $rc -eq 0 && ! -s "$TMP/err" ]] && grep -q "=== Step 3 of 3" "$TMP/out" &&
  grep -q "non-causal (DSpark draft)" "$TMP/out" && grep -q "CUDA-graph padding" "$TMP/out" &&
  grep -q "img L/R" "$TMP/out"; then
  pass "demo"
else
  fail "demo" "exit $rc" "$(head -c 300 "$TMP/err")"
fi

# --- bench and attend ------------------------------------------------------------------------
# bench: the CPU backend by default; one right-aligned table, no always-zero columns.
run bench --iters 1 --json "$TMP/bench.json"
if [[ $rc -eq 0 && ! -s "$TMP/err" ]] && grep -q "backend cpu" "$TMP/out" &&
  python3 - "$TMP/out" "$TMP/bench.json" <<'EOF3'
import json, sys
lines = open(sys.argv[1]).read().splitlines()
table = lines[lines.index(next(l for l in lines if "build_us" in l)):]
assert table[0].split() == ["scenario", "tokens", "build_us", "update_us", "output"], table[0]
assert len({len(l) for l in table}) == 1, "columns not aligned"
assert all(l.split()[-1] in ("B", "KiB", "MiB") for l in table[1:]), "byte counts not readable"
rows = json.load(open(sys.argv[2]))
assert len(rows) == len(table) - 1 and all(r["backend"] == "cpu" for r in rows)
assert all(r["build_host_us_median"] == r["build_wall_us_median"] for r in rows)
assert all(isinstance(r["output_bytes"], int) and "device_us_per_build" not in r for r in rows)
EOF3
then
  pass "bench (cpu by default, aligned table, JSON)"
else
  fail "bench (cpu by default, aligned table, JSON)" "exit $rc" "$(head -c 600 "$TMP/out")" \
    "$(head -c 300 "$TMP/err")"
fi

# attend: out-of-range values are invalid input (exit 1) named by their flag.
expect_error "attend --window 0" 1 "sparse-swa: error: --window: expected 1..65536, got 0" \
  attend --window 0
expect_error "attend --block-size 48" 1 \
  "sparse-swa: error: --block-size: expected a multiple of 32 in 32..4096, got 48" \
  attend --block-size 48
expect_error "attend --decode-requests 5000" 1 \
  "sparse-swa: error: --decode-requests: expected 0..4096, got 5000" attend --decode-requests 5000
expect_error "attend --prefill-len 1" 1 "sparse-swa: error: --prefill-len: expected 2..4096, got 1" \
  attend --prefill-len 1
expect_error "attend --heads 129" 1 "sparse-swa: error: --heads: expected 1..128, got 129" \
  attend --heads 129
expect_error "attend --cache fp16" 1 \
  "sparse-swa: error: --cache: expected fp8_ds_mla, bf16 or fp8_e4m3, got 'fp16'" attend --cache fp16
expect_error "attend with no requests" 1 "--decode-requests, --prefill-requests: expected at least one" \
  attend --decode-requests 0 --prefill-requests 0
expect_error "attend --heads abc (not a number: usage)" 2 "usage error" attend --heads abc
# The cache holds the pages the step reads, not --max-context's worth.
run attend --max-context 1048576 --decode-requests 2 --prefill-requests 1 --heads 4
if [[ $rc -eq 0 ]] && grep -qE "swa cache: [0-9]{1,2} pages of 64 tokens" "$TMP/out"; then
  pass "attend --max-context 1048576 (pages of the windows only)"
else
  fail "attend --max-context 1048576" "exit $rc" "$(head -c 400 "$TMP/out")" "$(head -c 300 "$TMP/err")"
fi

# --- build --consumer NAME: one more key, "consumer", after the reference's keys ---------------
# Without --consumer the output is byte for byte the expected file (the reference diff).
for expected in "$DATA"/*.expected.json; do
  batch=${expected%.expected.json}.json
  name=$(basename "$batch" .json)
  run build --input "$batch"
  if [[ $rc -eq 0 ]] && cmp -s "$TMP/out" "$expected"; then
    pass "build $name without --consumer: byte-identical to $(basename "$expected")"
  else
    fail "build $name without --consumer: byte-identical to $(basename "$expected")" "exit $rc" \
      "$(cmp "$TMP/out" "$expected" 2>&1 | head -c 200)"
  fi
done

# consumer_matches FILE EXPECTED NAME: the reference keys equal EXPECTED's, then "consumer" last
# with the SWA-only golden values of mixed_mtp.json (docs/semantics.md#example-1-mixed-mtp-batch).
consumer_matches() {
  python3 - "$1" "$2" "$3" <<'EOF2'
import json, sys
text = open(sys.argv[1]).read()
expected = json.load(open(sys.argv[2]))
if text.count("\n") != 1 or not text.endswith("\n"):
    sys.exit("output is not exactly one line")
actual = json.loads(text)
if list(actual) != list(expected) + ["consumer"]:
    sys.exit(f"keys: {list(actual)}")
bad = [k for k in expected if actual[k] != expected[k]]
if bad:
    sys.exit(f"reference fields differ: {bad}")
c = actual["consumer"]
checks = {
    "name": (c["name"], sys.argv[3]),
    "mixed.lens": (c["mixed"]["lens"], [8] * 7),
    "mixed.indices[1]": (c["mixed"]["indices"][1], [20, 21, 22, 23, 44, -1, -1, -1]),
    "mixed.swa_lens": (c["mixed"]["swa_lens"], [8, 5, 6, 7, 8, 8, 8]),
    "ragged.indptr": (c["ragged"]["indptr"], [0, 8, 13, 19]),
    "combined_prefill[0].rows[0][:8]": (c["combined_prefill"][0]["rows"][0][:8],
                                        [0, 1, 2, 3, 4, 5, 6, -1]),
    "combined_prefill[0].lens": (c["combined_prefill"][0]["lens"], [7, 8, 8, 8]),
}
wrong = [f"{k}: got {a}, expected {e}" for k, (a, e) in checks.items() if a != e]
if wrong:
    sys.exit("; ".join(wrong))
if not isinstance(c["dispatch"]["accepted"], bool):
    sys.exit("dispatch.accepted is not a bool")
EOF2
}

for consumer in flashmla_sparse_decode flashinfer_sm120_decode flashinfer_sm100 rocm_ragged sparse_swa; do
  run build --input "$DATA/mixed_mtp.json" --consumer "$consumer"
  if [[ $rc -ne 0 || -s "$TMP/err" ]]; then
    fail "build --consumer $consumer" "exit $rc" "$(head -c 400 "$TMP/err")"
  elif ! msg=$(consumer_matches "$TMP/out" "$DATA/mixed_mtp.expected.json" "$consumer" 2>&1); then
    fail "build --consumer $consumer" "$msg"
  else
    pass "build --consumer $consumer (reference keys unchanged, consumer key last)"
  fi
done

run build --input "$DATA/mixed_mtp.json" --consumer flashmla_sparse_decode --heads 128
if [[ $rc -eq 0 ]] && python3 -c '
import json, sys
d = json.load(open(sys.argv[1]))["consumer"]["dispatch"]
assert d["heads"] == 128 and d["accepted"] is False, d
assert d["first_rejected"].startswith("decode causal swaonly: heads 128, topk 8"), d
' "$TMP/out" 2>"$TMP/py"; then
  pass "build --consumer flashmla_sparse_decode --heads 128 (W 8 rejected, tuple named)"
else
  fail "build --consumer flashmla_sparse_decode --heads 128" "exit $rc" "$(head -c 400 "$TMP/py")"
fi

run build --input "$DATA/mixed_mtp.json" --input "$DATA/padded_decode.json" --consumer sparse_swa
if [[ $rc -eq 0 ]] && [[ $(wc -l <"$TMP/out") -eq 2 ]] &&
  [[ $(grep -c '"consumer": {"name": "sparse_swa"' "$TMP/out") -eq 2 ]]; then
  pass "build two inputs --consumer (one line each, consumer key on both)"
else
  fail "build two inputs --consumer" "exit $rc" "$(head -c 300 "$TMP/err")"
fi

expect_error "unknown --consumer" 2 \
  "--consumer: flashattention not in {flashmla_sparse_decode,flashinfer_sm120_decode,flashinfer_sm100,rocm_ragged,sparse_swa}" \
  build --input "$DATA/mixed_mtp.json" --consumer flashattention
expect_error "--heads without --consumer" 2 "--heads requires --consumer" \
  build --input "$DATA/mixed_mtp.json" --heads 8
expect_error "--heads 0" 2 "--heads" \
  build --input "$DATA/mixed_mtp.json" --consumer sparse_swa --heads 0
expect_error "--consumer with --format table" 2 "--consumer: needs --format json" \
  build --input "$DATA/mixed_mtp.json" --consumer sparse_swa --format table
expect_error "--consumer, invalid batch: exit 1" 1 "batch.seq_lens[1]" \
  build --input "$TMP/float_int.json" --consumer sparse_swa

# --- The CUDA backend: the same output on a GPU build with a device, else exit 1 + message ---
run build --input "$DATA/mixed_mtp.json" --backend cuda
if [[ $rc -eq 0 ]]; then
  if msg=$(same_json "$TMP/out" "$DATA/mixed_mtp.expected.json" 2>&1); then
    pass "build --backend cuda (matches the CPU contract)"
  else
    fail "build --backend cuda (matches the CPU contract)" "$msg"
  fi
elif [[ $rc -eq 1 && ! -s "$TMP/out" ]] && grep -q "^sparse-swa: error: .*cuda" "$TMP/err"; then
  pass "build --backend cuda without a usable CUDA backend: exit 1 ($(head -c 120 "$TMP/err"))"
else
  fail "build --backend cuda" "exit $rc" "$(head -c 300 "$TMP/err")"
fi
run demo --backend cuda
if [[ $rc -eq 0 ]] && grep -q "=== Step 3 of 3" "$TMP/out"; then
  pass "demo --backend cuda"
elif [[ $rc -eq 1 ]] && grep -q "^sparse-swa: error: .*cuda" "$TMP/err"; then
  pass "demo --backend cuda without a usable CUDA backend: exit 1"
else
  fail "demo --backend cuda" "exit $rc" "$(head -c 300 "$TMP/err")"
fi

run build --input "$DATA/mixed_mtp.json" --backend cuda --consumer rocm_ragged
if [[ $rc -eq 0 ]]; then
  if msg=$(consumer_matches "$TMP/out" "$DATA/mixed_mtp.expected.json" rocm_ragged 2>&1); then
    pass "build --backend cuda --consumer rocm_ragged (host consumers on the copied metadata)"
  else
    fail "build --backend cuda --consumer rocm_ragged" "$msg"
  fi
elif [[ $rc -eq 1 && ! -s "$TMP/out" ]] && grep -q "^sparse-swa: error: .*cuda" "$TMP/err"; then
  pass "build --backend cuda --consumer without a usable CUDA backend: exit 1"
else
  fail "build --backend cuda --consumer rocm_ragged" "exit $rc" "$(head -c 300 "$TMP/err")"
fi

echo "$passed passed, $failed failed"
[[ $failed -eq 0 ]]
