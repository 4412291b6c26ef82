#!/usr/bin/env bash
# The GPU tier, in one run on the GPU machine (see ../shared/gpu/README.md), from the repository
# root, after `. .gpu-debs/unpack.sh`:
#   . .gpu-debs/unpack.sh && bash tests/gpu/run.sh
# Builds the project, then runs the whole CTest suite (on the NVIDIA Vulkan driver: the Vulkan IPC
# channel tests run with device-local memory and shared timeline semaphores), the demo and the
# benchmarks. Logs go to $OUT (or /tmp/lavaflow-gpu); exit status is CTest's.
set -uo pipefail
out=${OUT:-/tmp/lavaflow-gpu}
build=${LAVAFLOW_GPU_BUILD:-/tmp/lavaflow-gpu-build}
mkdir -p "$out"
[ -x /opt/gcc/bin/g++ ] && export CXX=${CXX:-/opt/gcc/bin/g++}
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1  # OpenMPI there, run as root
{
  nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv
  cmake -S . -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release -DLAVAFLOW_FUZZ_SECONDS=5
  cmake --build "$build" -j "$(nproc)"
} > "$out/build.log" 2>&1 || { tail -40 "$out/build.log"; exit 1; }
"$build/apps/info/lavaflow-info" > "$out/info.txt" 2>&1
ctest --test-dir "$build" -j 8 --output-on-failure --timeout 300 > "$out/ctest.log" 2>&1
rc=$?
grep -h "LAVAFLOW-SKIP" "$build/Testing/Temporary/LastTest.log" | sort -u >> "$out/ctest.log"
{
  "$build/apps/demo/lavaflow-demo" --count 2000 --size 1048576
  "$build/apps/demo/lavaflow-demo" --count 1000000 --size 64
  "$build/apps/demo/lavaflow-demo" share
} > "$out/demo.txt" 2>&1
"$build/apps/bench/lavaflow-bench" alloc > "$out/bench-alloc.txt" 2>&1
"$build/apps/bench/lavaflow-bench" local > "$out/bench-local.txt" 2>&1
tail -25 "$out/ctest.log"
exit $rc
