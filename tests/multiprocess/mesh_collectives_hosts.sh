#!/usr/bin/env bash
# mesh_collectives on two simulated hosts of uneven size: ranks 0-1 in a UTS namespace named
# simhost-a, rank 2 in one named simhost-b (unshare -u, as root), launched MPMD. The native backend
# then reduces inside each host in shared memory and between the hosts' leaders over MPI.
#   mesh_collectives_hosts.sh MPIEXEC MESH_COLLECTIVES
# Exit 77 (skipped) when this machine cannot make UTS namespaces.
set -uo pipefail
mpiexec=$1 prog=$2
unshare -u true 2>/dev/null || { echo "LAVAFLOW-SKIP: cannot create UTS namespaces here (unshare -u needs root or CAP_SYS_ADMIN)"; exit 77; }
exec "$mpiexec" -n 2 unshare -u sh -c "hostname simhost-a && exec $prog all" : \
                -n 1 unshare -u sh -c "hostname simhost-b && exec $prog all"
