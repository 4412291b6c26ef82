#!/usr/bin/env bash
# `lavaflow-bench compare` as a program: exit 0 on identical runs, on a 5 % change and on changes
# within the spread; 1 on a 20 % regression of one row, naming it; 2 with the file and the cause on
# malformed input. Usage: compare.sh BENCH
set -uo pipefail
bench=$1
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

# run FILE SHM_P50 SHM_LO SHM_HI: a run file of a floor row and a channel row measured against it.
run() {
  cat > "$1" <<JSON
{"format":"lavaflow-bench-run","version":1,"environment":{"cpu":"test"},"quick":true,"repeats":3,
 "suites":[{"suite":"local","status":"ran","seconds":1}],
 "rows":[
  {"suite":"local","name":"floor-cacheline","mode":"poll","variant":"","size":4,"metric":"p50_ns","better":"lower","value":100,"lo":98,"hi":102,"samples":3},
  {"suite":"local","name":"lavaflow-shm","mode":"poll","variant":"","size":64,"metric":"p50_ns","better":"lower","value":$2,"lo":$3,"hi":$4,"samples":3,"baseline":"floor-cacheline","ratio":$(awk "BEGIN{print $2/100}"),"ratio_lo":$(awk "BEGIN{print $3/102}"),"ratio_hi":$(awk "BEGIN{print $4/98}")},
  {"suite":"pool","name":"pool-host","mode":"","variant":"","size":64,"metric":"p50_ns","better":"lower","value":20,"lo":19,"hi":21,"samples":3}
 ]}
JSON
}
fail() { echo "FAILED: $*"; exit 1; }
# expect STATUS PATTERN ARGS...: compare exits STATUS and prints PATTERN (stdout or stderr)
expect() {
  local status=$1 pattern=$2
  shift 2
  out=$("$bench" compare "$@" 2>&1)
  local rc=$?
  [ "$rc" = "$status" ] || { echo "$out"; fail "compare $* exited $rc, expected $status"; }
  grep -q -- "$pattern" <<< "$out" || { echo "$out"; fail "compare $* did not say '$pattern'"; }
}

run "$work/base.json" 200 196 204
expect 0 "0 regressed" "$work/base.json" "$work/base.json"
run "$work/up20.json" 240 235 245
expect 1 "REGRESSION: local lavaflow-shm poll 64 B p50_ns" "$work/base.json" "$work/up20.json"
expect 0 "0 regressed" "$work/base.json" "$work/up20.json" --threshold 25
run "$work/up5.json" 210 206 214
expect 0 "0 regressed" "$work/base.json" "$work/up5.json"
# 20 % worse at the median, but within both runs' spread: noise, not a regression.
run "$work/wide-base.json" 200 150 260
run "$work/wide-new.json" 240 180 300
expect 0 "worse, within noise" "$work/wide-base.json" "$work/wide-new.json"
# A directory holding run.json is a run too.
mkdir "$work/dir" && cp "$work/up20.json" "$work/dir/run.json"
expect 1 "REGRESSION" "$work/base.json" "$work/dir"

# Bad input: exit 2, naming the file and the cause.
: > "$work/empty.json"
expect 2 "empty.json: empty file" "$work/base.json" "$work/empty.json"
echo "not json {" > "$work/text.json"
expect 2 "text.json: not valid JSON" "$work/text.json" "$work/base.json"
expect 2 "missing.json: no such file" "$work/base.json" "$work/missing.json"
sed 's/"value":200/"value":"fast"/' "$work/base.json" > "$work/type.json"
expect 2 "type.json: rows\[1\].value: not a number" "$work/base.json" "$work/type.json"
sed 's/"value":200/"value":NaN/' "$work/base.json" > "$work/nan.json"
expect 2 "nan.json: not valid JSON" "$work/base.json" "$work/nan.json"
sed 's/"value":200/"value":1e999/' "$work/base.json" > "$work/huge.json"
expect 2 "huge.json: not valid JSON" "$work/base.json" "$work/huge.json"
sed 's/"size":64,/"size":18446744073709551616,/' "$work/base.json" > "$work/bigsize.json"
expect 2 "bigsize.json: rows\[1\].size: not a whole number" "$work/base.json" "$work/bigsize.json"
sed 's/"metric":"p50_ns",//' "$work/base.json" > "$work/nometric.json"
expect 2 "nometric.json: rows\[0\].metric: missing" "$work/base.json" "$work/nometric.json"
echo '{"format":"lavaflow-bench-run","version":1,"rows":[]}' > "$work/norows.json"
expect 2 "no rows in common" "$work/base.json" "$work/norows.json"
expect 2 "--threshold" "$work/base.json" "$work/base.json" --threshold nan
expect 2 "--threshold" "$work/base.json" "$work/base.json" --threshold -5

# report: a Markdown page of the run, a table per suite.
"$bench" report "$work/base.json" --out "$work/report.md" || fail "report exited $?"
grep -q "^### local" "$work/report.md" && grep -q "| lavaflow-shm | poll | 64 B |" "$work/report.md" ||
  { cat "$work/report.md"; fail "report has no local table"; }
"$bench" report "$work/text.json" > /dev/null 2>&1
[ $? = 2 ] || fail "report of a malformed run did not exit 2"
echo "bench compare: OK"
