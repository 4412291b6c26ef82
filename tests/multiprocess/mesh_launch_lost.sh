#!/usr/bin/env bash
# lavaflow-launch -n 3 with a rank that exits (status 3) after one collective: ranks 0 and 1 must
# each get PeerLost naming it, and the launcher must exit with that rank's status.
#   mesh_launch_lost.sh LAVAFLOW_LAUNCH MESH_LAUNCH
set -uo pipefail
out=$("$1" -n 3 "$2" exit 2>&1)
status=$?
echo "$out"
for r in 0 1; do
  grep -q "mesh-launch rank $r: lost rank OK" <<< "$out" || { echo "FAILED: rank $r did not report the lost rank"; exit 1; }
done
[ "$status" -eq 3 ] || { echo "FAILED: lavaflow-launch exited $status, not the lost rank's 3"; exit 1; }
echo "mesh launch lost rank: OK"
