#!/usr/bin/env bash
# mesh_collectives on two simulated hosts (unshare -u, as root; launched MPMD): first of uneven
# size — ranks 0-1 in a UTS namespace named simhost-a, rank 2 in simhost-b — where the native
# backend reduces inside each host in shared memory and between the hosts' leaders over MPI; then
# one rank per host on two, three and five hosts, where the leaders exchange straight from the
# callers' buffers (small all_reduces point to point, by recursive doubling: three hosts take its
# path for host counts that are not a power of two, five also doubles twice); then a rank late
# for a call on a host of its own, whom the other host's timeout must name.
#   mesh_collectives_hosts.sh MPIEXEC MESH_COLLECTIVES
# Exit 77 (skipped) when this machine cannot make UTS namespaces.
set -uo pipefail
mpiexec=$1 prog=$2
unshare -u true 2>/dev/null || { echo "LAVAFLOW-SKIP: cannot create UTS namespaces here (unshare -u needs root or CAP_SYS_ADMIN)"; exit 77; }
for shape in "2 1" "1 1" "1 1 1" "1 1 1 1 1"; do
  echo "--- ranks per host: ${shape// / + }"
  args=() host=0
  for n in $shape; do
    [ $host -gt 0 ] && args+=(:)
    args+=(-n "$n" unshare -u sh -c "hostname simhost-$host && exec $prog all")
    host=$((host + 1))
  done
  "$mpiexec" "${args[@]}" || { echo "FAILED: the ${shape// / + } job exited $?"; exit 1; }
done
# A rank late for a call on a host of its own: the other host's timeout names it. (With more
# ranks on that host, those that are not its leader name the leader, which waits on the others.)
# The timed-out exchange's send is let go to MPI, and the peer that gave up never takes it: MPICH
# holds that request at exit, which LeakSanitizer (in the sanitizer build) reports inside
# libmpich. Leak checks are off for this job only; address and UB checks stay.
echo "--- timeout, ranks per host: 1 + 1"
[ -n "${ASAN_OPTIONS:-}" ] && export ASAN_OPTIONS="$ASAN_OPTIONS:detect_leaks=0"
"$mpiexec" -n 1 unshare -u sh -c "hostname simhost-0 && exec $prog timeout" : \
           -n 1 unshare -u sh -c "hostname simhost-1 && exec $prog timeout" ||
  { echo "FAILED: the 1 + 1 timeout job exited $?"; exit 1; }
