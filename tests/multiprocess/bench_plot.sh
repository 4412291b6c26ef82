#!/usr/bin/env bash
# lavaflow-bench as an integration test: a short `local` run (real processes) with --json and
# --plot; the JSON names every transport and baseline, the plot is a PNG. Usage: bench_plot.sh BENCH
set -uo pipefail
bench=$1
command -v gnuplot > /dev/null || { echo "LAVAFLOW-SKIP: gnuplot not installed (apt install gnuplot-nox)"; exit 77; }
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
"$bench" local --quick --iterations 500 --json --plot "$work/local.png" > "$work/local.json" || { echo "FAILED: bench exited $?"; exit 1; }
for name in lavaflow-shm lavaflow-vulkan floor-cacheline futex-pingpong uds-pingpong; do
  grep -q "\"name\":\"$name\"" "$work/local.json" || { echo "FAILED: no $name in the JSON"; cat "$work/local.json"; exit 1; }
done
[ "$(head -c 8 "$work/local.png" | od -An -tx1 | tr -d ' \n')" = 89504e470d0a1a0a ] || { echo "FAILED: --plot wrote no PNG"; exit 1; }
echo "bench plot: OK ($(stat -c %s "$work/local.png") bytes)"
