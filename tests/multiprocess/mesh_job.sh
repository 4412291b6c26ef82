#!/usr/bin/env bash
# lavaflow-launch -n N PROGRAM MODE (mesh_vulkan, mesh_cuda, mesh_nccl): every rank that stays must report
# "NAME rank R: MODE OK", and the launcher's status must be the leaving rank's (3) in modes exit and hosts-exit,
# else 0. Exit 77 (a visible skip) when the ranks found no device to run on.
#   mesh_job.sh LAVAFLOW_LAUNCH PROGRAM N MODE NAME
set -uo pipefail
launch=$1 prog=$2 n=$3 mode=$4 name=$5
out=$("$launch" -n "$n" "$prog" "$mode" 2>&1)
status=$?
echo "$out"
skipped=$(grep -c "SKIP:" <<< "$out")
if [ "$skipped" -ge "$n" ]; then exit 77; fi
if [ "$skipped" -gt 0 ]; then echo "FAILED: $skipped of $n ranks skipped: the others had a device"; exit 1; fi
stay=$n want=0 token="OK ("
case $mode in
  mismatch | staged-mismatch | hosts-mismatch | squat | stranger) token="$mode OK" ;;
  exit | hosts-exit) stay=$((n - 1)) want=3 token="$mode OK" ;;
  late | late-nonblocking | staged-late | hosts-late | hosts-hang) stay=$((n - 1)) token="$mode OK" ;;
esac
for ((r = 0; r < stay; r++)); do
  grep -q "$name rank $r: $token" <<< "$out" || { echo "FAILED: rank $r did not report '$token'"; exit 1; }
done
[ "$status" -eq "$want" ] || { echo "FAILED: lavaflow-launch exited $status, not $want"; exit 1; }
echo "$name $mode on $n ranks: OK"
