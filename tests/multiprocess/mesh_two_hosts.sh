#!/usr/bin/env bash
# lavaflow-demo mesh with 4 ranks on two simulated hosts: ranks 0-1 and 2-3 each run in their own
# UTS namespace (unshare -u, as root) named simhost-a / simhost-b, launched MPMD. Asserts that
# same-host pairs took a local route (vulkan or shm), cross-host pairs took MPI, and that every
# message arrived intact.
#   mesh_two_hosts.sh MPIEXEC LAVAFLOW_DEMO [netns]
# With "netns", each host also gets its own network namespace, the two joined by a veth pair
# (10.77.x.1 <-> 10.77.x.2), and MPI is told to use TCP only (MPICH over UCX: UCX_TLS=tcp,self): the
# cross-host messages must then cross the veth link, which the script checks on its byte counters.
# Exit 77 (skipped) when this machine cannot make the namespaces, or the MPI is not MPICH.
set -uo pipefail
mpiexec=$1 demo=$2 mode=${3:-uts}
skip() { echo "LAVAFLOW-SKIP: $*"; exit 77; }
unshare -u true 2>/dev/null || skip "cannot create UTS namespaces here (unshare -u needs root or CAP_SYS_ADMIN)"
count=500 size=20000
wrap_a=() wrap_b=() env_args=()
if [ "$mode" = netns ]; then
  command -v ip > /dev/null || skip "no ip(8) (iproute2) for network namespaces"
  "$mpiexec" --version 2>&1 | grep -qi hydra || skip "the veth/TCP run is written for MPICH (Hydra); this mpiexec is another MPI"
  # Namespaces left by an earlier run that was killed (its pid is gone) go first.
  for ns in $(ip netns list 2>/dev/null | awk '/^lf-[ab]-[0-9]+/ {print $1}'); do
    kill -0 "${ns##*-}" 2>/dev/null || ip netns del "$ns" 2>/dev/null
  done
  id=$$ sub=$(( $$ % 250 + 1 ))
  ns_a=lf-a-$id ns_b=lf-b-$id
  cleanup() { ip netns del "$ns_a" 2>/dev/null; ip netns del "$ns_b" 2>/dev/null; }
  trap cleanup EXIT
  { ip netns add "$ns_a" && ip netns add "$ns_b" && ip link add "lfv$id" type veth peer name "lfw$id" &&
    ip link set "lfv$id" netns "$ns_a" && ip link set "lfw$id" netns "$ns_b" &&
    ip -n "$ns_a" addr add "10.77.$sub.1/24" dev "lfv$id" && ip -n "$ns_b" addr add "10.77.$sub.2/24" dev "lfw$id" &&
    ip -n "$ns_a" link set "lfv$id" up && ip -n "$ns_b" link set "lfw$id" up &&
    ip -n "$ns_a" link set lo up && ip -n "$ns_b" link set lo up; } 2>/dev/null ||
    skip "cannot create network namespaces joined by veth here"
  wrap_a=(ip netns exec "$ns_a") wrap_b=(ip netns exec "$ns_b")
  env_args=(-genv UCX_TLS tcp,self)
  rx_bytes() { ip -n "$ns_a" -s link show "lfv$id" | awk 'NR==4 {print $1}'; }
  before=$(rx_bytes)
fi
# The job runs in the background: 60 s at most, and over veth/TCP at most 10 s more once rank 0
# has printed its result (MPICH's MPI_Finalize can hang there: see below). Sets out and rc.
run_job() {
  local log job waited=0 done_at=
  log=$(mktemp)
  "$mpiexec" "${env_args[@]}" -n 2 "${wrap_a[@]}" unshare -u sh -c "hostname simhost-a && exec $demo mesh --count $count --size $size" : \
             -n 2 "${wrap_b[@]}" unshare -u sh -c "hostname simhost-b && exec $demo mesh --count $count --size $size" > "$log" 2>&1 &
  job=$! rc=0
  while kill -0 "$job" 2>/dev/null; do
    sleep 0.2; waited=$((waited + 1))
    [ -z "$done_at" ] && grep -q "^mesh: " "$log" && done_at=$waited
    if [ "$waited" -ge 300 ] || { [ "$mode" = netns ] && [ -n "$done_at" ] && [ $((waited - done_at)) -ge 50 ]; }; then
      kill -TERM "$job" 2>/dev/null; sleep 1; kill -KILL "$job" 2>/dev/null; rc=124; break
    fi
  done
  [ $rc -eq 124 ] || { wait "$job"; rc=$?; }
  out=$(cat "$log"); rm -f "$log"
}
run_job
if [ $rc -eq 124 ] && [ "$mode" = netns ] && echo "$out" | grep -q "mesh: OK"; then
  # The finalize race below, after a verified run: once more, for a run that ends cleanly.
  echo "$out"
  echo "(every rank verified its data, then MPI_Finalize hung — the MPICH/UCX race described below; running the job once more)"
  run_job
fi
echo "$out"
echo "$out" | grep -q "mesh: OK" || { echo "FAILED: no 'mesh: OK' (exit status $rc)"; exit 1; }
finalize_hung=0
if [ $rc -eq 124 ] && [ "$mode" = netns ] && echo "$out" | grep -q "mesh: OK"; then
  # Seen here in a third to half of the runs: every rank has verified its data and rank 0 has printed
  # the result, then MPI_Finalize hangs. gdb: one rank has closed its UCX endpoints and waits in
  # the PMI barrier (read() under PMPI_Finalize), no longer progressing UCX; the others are still
  # closing theirs (ucp_worker_progress -> uct_tcp_iface_progress under PMPI_Finalize) and wait
  # for it to answer over TCP. The known MPI-over-UCX finalize race (openucx/ucx#2682; Open MPI
  # answered it with a progress thread during its fence, open-mpi/ompi#5307; MPICH 4.0.2 has none).
  finalize_hung=1
elif [ $rc -ne 0 ]; then
  echo "FAILED: mesh exited with $rc"; exit 1
fi
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
if [ "$mode" = netns ]; then
  # Host b's two ranks send count x size bytes to each of host a's two ranks: all through the veth.
  got=$(( $(rx_bytes) - before )) want=$(( 4 * count * size ))
  echo "veth into host a: $got bytes received (cross-host payload towards it: $want bytes)"
  [ "$got" -ge "$want" ] || { echo "FAILED: the cross-host traffic did not go over the veth link"; bad=1; }
fi
[ $bad -eq 0 ] || exit 1
if [ $finalize_hung -eq 1 ]; then
  echo "LAVAFLOW-SKIP: mesh over veth/TCP verified (routes, data, veth counters), but MPICH's MPI_Finalize then hung in both runs (UCX endpoint close over TCP vs a rank already in the PMI barrier: openucx/ucx#2682); killed 10 s after the result"
  exit 77
fi
echo "two simulated hosts ($mode): same-host pairs local, cross-host pairs MPI, all data intact"
