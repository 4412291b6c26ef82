#!/usr/bin/env bash
# lavaflow-bench remote as an integration test: a short run (2 MPI ranks, 8 B … 64 KiB, no GPU
# staging) with --json; every size has raw MPI and lava-flow latency and bandwidth rows and the raw
# ring, huge-page and credit baselines, and every figure is a positive number. Usage: bench_remote.sh BENCH
set -uo pipefail
bench=$1
out=$("$bench" remote --max-size 65536 --no-staging --json) || { echo "FAILED: bench exited $?"; exit 1; }
for size in 8 32 128 512 2048 8192 16384 32768 65536; do
  for row in '"name":"mpi-raw","kind":"latency"' '"name":"lavaflow-mpi","kind":"latency"' '"name":"mpi-raw","kind":"bandwidth"' \
             '"name":"mpi-raw-ring","kind":"bandwidth"' '"name":"lavaflow-mpi","kind":"bandwidth"' \
             '"name":"mpi-raw-hugepages","kind":"bandwidth"' '"name":"mpi-raw-credit","kind":"bandwidth"'; do
    grep -q "{$row,\"size\":$size," <<< "$out" || { echo "FAILED: no row {$row,\"size\":$size}"; echo "$out"; exit 1; }
  done
done
if grep -Eq '"kind":"latency","size":[0-9]+,("p50_ns":0\.0|"p50_ns":[0-9.]+,"avg_ns":0\.0)|"kind":"bandwidth"[^}]*"mb_per_s":0\.0' <<< "$out"; then
  echo "FAILED: a zero figure"; echo "$out"; exit 1
fi
echo "bench remote: OK ($(grep -o '{' <<< "$out" | wc -l) rows)"
