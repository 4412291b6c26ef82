#!/usr/bin/env bash
# CI's benchmark regression gate: a quick run of the channel hot path (local) and the memory pool
# (pool), three repetitions each, compared with the committed baseline of this machine class,
# ratios to same-run baselines only (the floor, a futex wake-up, malloc, a fresh Vulkan
# allocation), so that a slower or busier machine of the same class is not a regression.
# A class is the core count and the CPU model: the ratios themselves move between CPU models
# (a cache-line transfer costs twice as much on one as on another), so a baseline recorded on
# another model says nothing here.
#
# Threshold 50 %, beyond the spread: between runs on the 2-core CI VM the busy-poll ratios move by
# a few percent and the blocking rows (scheduler wake-ups) by tens of percent, which their spread
# mostly absorbs. A busy-poll round trip costs little more than one cache-line transfer, so one
# more transfer (or ~150 ns of work) per message nearly doubles its ratio and fails here. Rows of
# messages the consumer reads through beyond one cache line are recorded but not compared: their
# memory traffic moves with the VM's neighbours, not with either floor.
# Usage: regression.sh BENCH BASELINES_DIR
set -uo pipefail
bench=$1
# "Intel(R) Xeon(R) Processor" -> intel-xeon, "AMD EPYC" -> amd-epyc.
model=$(sed -n 's/^model name[[:space:]]*:[[:space:]]*//p' /proc/cpuinfo | head -n 1)
slug=$(printf '%s' "$model" | tr '[:upper:]' '[:lower:]' | sed -E 's/\((r|tm)\)//g; s/\b(processor|cpu)\b//g; s/[^a-z0-9]+/-/g; s/^-+|-+$//g')
class="ci-$(nproc)core-${slug:-unknown}"
baseline="$2/$class/run.json"
[ -f "$baseline" ] || { echo "LAVAFLOW-SKIP: no benchmark baseline for machine class $class ($model; bench/baselines/README.md says how to record one)"; exit 77; }
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
# A regression must show twice: a row that fails once in a noisy spell of the VM (another tenant,
# a migration) and passes on the next run is noise; a slower hot path fails both runs.
for attempt in 1 2; do
  rm -rf "$work/run"
  "$bench" run --suites local,pool --quick --repeat 3 --out "$work/run" || { echo "FAILED: bench run exited $?"; exit 1; }
  "$bench" compare --ratios-only --threshold 50 "$baseline" "$work/run"
  rc=$?
  [ $rc = 0 ] && break
  [ $rc = 1 ] && [ $attempt = 1 ] && { echo "regressions in run 1: running again to see whether they hold"; continue; }
  echo "FAILED: compare exited $rc against $baseline"
  exit 1
done
echo "bench regression: OK (against $class)"
