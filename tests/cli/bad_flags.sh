#!/usr/bin/env bash
# Every app and subcommand, every flag that takes a value: unknown flags, negative, overflowing,
# out-of-range and non-numeric values end at once (no waiting, no device start-up) with exit
# status 2 and one line on stderr that names the flag.
#   bad_flags.sh BIN_DIR (the build's apps/ directory)
set -uo pipefail
bin=$1
failures=0 checked=0

# expect_usage_error FLAG_NAMED PROGRAM ARGS...
expect_usage_error() {
  local named=$1
  shift
  local err start elapsed rc
  err=$(mktemp)
  start=$(date +%s%N)
  timeout 10 "$@" >/dev/null 2>"$err"
  rc=$?
  elapsed=$((($(date +%s%N) - start) / 1000000))
  checked=$((checked + 1))
  if [ "$rc" -ne 2 ] || [ "$(wc -l <"$err")" -ne 1 ] || ! grep -q -- "$named" "$err" || [ "$elapsed" -gt 2000 ]; then
    echo "FAILED: $* -> exit $rc after ${elapsed} ms, stderr: $(cat "$err")"
    failures=$((failures + 1))
  fi
  rm -f "$err"
}

# check_numeric PROGRAM... -- FLAG MIN MAX [PREFIX ARGS...]: the value cases of one whole-number flag.
check_whole() {
  local flag=$1 min=$2 max=$3
  shift 3
  local cmd=("$@")
  expect_usage_error "$flag" "${cmd[@]}" "$flag" -1
  expect_usage_error "$flag" "${cmd[@]}" "$flag" 99999999999999999999
  expect_usage_error "$flag" "${cmd[@]}" "$flag" 18446744073709551617
  expect_usage_error "$flag" "${cmd[@]}" "$flag" abc
  expect_usage_error "$flag" "${cmd[@]}" "$flag" 1.5
  expect_usage_error "$flag" "${cmd[@]}" "$flag" ""
  expect_usage_error "$flag" "${cmd[@]}" "$flag"
  [ "$min" -gt 0 ] && expect_usage_error "$flag" "${cmd[@]}" "$flag" $((min - 1))
  [ "$max" != "-" ] && expect_usage_error "$flag" "${cmd[@]}" "$flag" $((max + 1))
}
check_real() {
  local flag=$1 max=$2
  shift 2
  local cmd=("$@")
  for v in -1 nan inf abc 1e400 $((max * 2)); do expect_usage_error "$flag" "${cmd[@]}" "$flag" "$v"; done
}
check_unknown() {
  expect_usage_error "--no-such-flag" "$@" --no-such-flag
  expect_usage_error "--no-such-flag" "$@" --no-such-flag 7
}

demo=$bin/demo/lavaflow-demo
check_unknown "$demo"
check_whole --count 0 1099511627776 "$demo"
check_whole --seconds 0 604800 "$demo"
check_whole --size 1 4294967296 "$demo"
expect_usage_error --transport "$demo" --transport mpi
expect_usage_error --transport "$demo" --transport tcp
expect_usage_error --verify "$demo" --verify gpu2
expect_usage_error --verify "$demo" consume --channel x --verify ""
check_whole --corrupt-frame 0 1099511627776 "$demo"
check_unknown "$demo" produce --channel x
for f in "--count 0 1099511627776" "--seconds 0 604800" "--size 1 4294967296" "--consumers 1 16" "--slots 0 62" \
  "--interval-us 0 60000000"; do
  # shellcheck disable=SC2086
  check_whole $f "$demo" produce --channel x
done
expect_usage_error --transport "$demo" produce --channel x --transport vulkan2
expect_usage_error --channel "$demo" produce
check_unknown "$demo" consume --channel x
check_whole --count 0 1099511627776 "$demo" consume --channel x
check_whole --timeout 0 604800 "$demo" consume --channel x
expect_usage_error --channel "$demo" consume
check_unknown "$demo" mesh
check_whole --count 1 1099511627776 "$demo" mesh
check_whole --size 1 4294967296 "$demo" mesh
check_unknown "$demo" share
check_whole --size 1 4294967296 "$demo" share

check_unknown "$bin/info/lavaflow-info"
expect_usage_error "--json" "$bin/info/lavaflow-info" --json=maybe

bench=$bin/bench/lavaflow-bench
check_unknown "$bench" alloc
check_whole --reps 1 100000 "$bench" alloc
check_unknown "$bench" local
check_whole --iterations 100 100000000 "$bench" local
expect_usage_error --cpus "$bench" local --cpus 0
expect_usage_error --cpus "$bench" local --cpus 0,-1
expect_usage_error --cpus "$bench" local --cpus 0,4096
expect_usage_error --cpus "$bench" local --cpus a,b
expect_usage_error --plot "$bench" local --plot
check_unknown "$bench" remote
check_whole --max-size 8 4194304 "$bench" remote
check_whole --ring-bytes 8 1073741824 "$bench" remote
check_unknown "$bench" interop
check_whole --size 1048576 68719476736 "$bench" interop
check_whole --frames 16 1000000 "$bench" interop
check_whole --slots 0 62 "$bench" interop
check_whole --rounds 10 10000000 "$bench" interop
check_whole --batch 1 31 "$bench" interop
expect_usage_error --parts "$bench" interop --parts stream,bogus
expect_usage_error --parts "$bench" interop --parts ""
check_unknown "$bench" collectives
check_whole --ranks 2 64 "$bench" collectives
check_whole --max-size 8 1073741824 "$bench" collectives
check_unknown "$bench" device-collectives
check_whole --ranks 2 16 "$bench" device-collectives
check_whole --max-size 0 1073741824 "$bench" device-collectives
check_whole --chunk-bytes 0 268435456 "$bench" device-collectives
expect_usage_error --chunk-bytes "$bench" device-collectives --chunk-bytes 65535
expect_usage_error --chunk-bytes "$bench" device-collectives --chunk-bytes 100000
check_whole --hosts 1 8 "$bench" device-collectives
expect_usage_error --hosts "$bench" device-collectives --ranks 4 --hosts 3
expect_usage_error --hosts "$bench" device-collectives --ranks 2 --hosts 2
check_unknown "$bench" run --out /nonexistent/run
check_whole --repeat 1 50 "$bench" run --out /nonexistent/run
expect_usage_error --suites "$bench" run --out /nonexistent/run --suites local,nosuch
expect_usage_error --out "$bench" run --quick
check_unknown "$bench" compare a.json b.json
check_real --threshold 1000 "$bench" compare a.json b.json
check_unknown "$bench" report a.json
launch=$bin/launch/lavaflow-launch
check_unknown "$launch" -n 2
check_whole --ranks 1 1024 "$launch"
check_whole --timeout 0 604800 "$launch" -n 2
if [ -x "$bin/bench/lavaflow-bench-remote" ]; then
  check_whole --max-size 8 4194304 "$bin/bench/lavaflow-bench-remote"
  check_whole --ring-bytes 8 1073741824 "$bin/bench/lavaflow-bench-remote"
fi

viewer=$bin/viewer/lavaflow-viewer
if [ -x "$viewer" ]; then
  for cmd in "" "produce --channel x"; do
    # shellcheck disable=SC2086
    check_unknown "$viewer" $cmd
    for f in "--frames 0 1099511627776" "--width 1 16384" "--height 1 16384"; do
      # shellcheck disable=SC2086
      check_whole $f "$viewer" $cmd
    done
    # shellcheck disable=SC2086
    check_real --fps 10000 "$viewer" $cmd
    # shellcheck disable=SC2086
    check_real --timeout 604800 "$viewer" $cmd
    # shellcheck disable=SC2086
    expect_usage_error --transport "$viewer" $cmd --transport mpi
  done
fi
if [ -x "$bin/cuda-over-vulkan/cuda-over-vulkan" ]; then
  c=$bin/cuda-over-vulkan/cuda-over-vulkan
  check_unknown "$c"
  for f in "--rounds 1 1000000000" "--words 1 4294967296" "--width 1 16384" "--height 1 16384"; do
    # shellcheck disable=SC2086
    check_whole $f "$c"
  done
fi

echo "$checked bad invocations checked, $failures failed"
[ "$failures" -eq 0 ] && echo "every bad flag value: exit 2, one line naming the flag, at once"
exit $((failures > 0))
