#!/usr/bin/env bash
# lavaflow-demo mesh with 4 ranks on two simulated hosts: ranks 0-1 and 2-3 each run in their own
# UTS namespace (unshare -u, as root) named simhost-a / simhost-b, launched MPMD. Asserts that
# same-host pairs took a local route (vulkan or shm), cross-host pairs took MPI, and that every
# message arrived intact. Exit 77 (skipped) when this machine cannot make UTS namespaces.
#   mesh_two_hosts.sh MPIEXEC LAVAFLOW_DEMO
set -uo pipefail
mpiexec=$1 demo=$2
if ! unshare -u true 2>/dev/null; then
  echo "LAVAFLOW-SKIP: cannot create UTS namespaces here (unshare -u needs root or CAP_SYS_ADMIN)"
  exit 77
fi
out=$("$mpiexec" -n 2 unshare -u sh -c "hostname simhost-a && exec $demo mesh --count 500 --size 20000" : \
                 -n 2 unshare -u sh -c "hostname simhost-b && exec $demo mesh --count 500 --size 20000" 2>&1)
rc=$?
echo "$out"
[ $rc -eq 0 ] || { echo "FAILED: mesh exited with $rc"; exit 1; }
echo "$out" | grep -q "mesh: OK" || { echo "FAILED: no 'mesh: OK'"; exit 1; }
host_of() { case $1 in 0|1) echo a ;; *) echo b ;; esac; }
bad=0
for from in 0 1 2 3; do
  for to in 0 1 2 3; do
    [ "$from" = "$to" ] && continue
    line=$(echo "$out" | grep "route $from -> $to:")
    transport=$(echo "$line" | sed -E 's/.*route [0-9]+ -> [0-9]+: ([a-z]+) .*/\1/')
    if [ "$(host_of $from)" = "$(host_of $to)" ]; then
      case $transport in vulkan|shm) ;; *) echo "FAILED: same-host pair $from -> $to took '$transport'"; bad=1 ;; esac
    else
      [ "$transport" = mpi ] || { echo "FAILED: cross-host pair $from -> $to took '$transport'"; bad=1; }
    fi
  done
done
[ $bad -eq 0 ] && echo "two simulated hosts: same-host pairs local, cross-host pairs MPI, all data intact"
exit $bad
