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
# The Python package is built for the python3 first on PATH (there: the one with PyTorch, CuPy
# and pybind11), when it has pybind11.
python_flags=()
if py=$(command -v python3) && pybind=$("$py" -c "import pybind11; print(pybind11.get_cmake_dir())" 2> /dev/null); then
  python_flags=(-DLAVAFLOW_PYTHON="$py" -Dpybind11_DIR="$pybind")
fi
{
  nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv
  cmake -S . -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release -DLAVAFLOW_FUZZ_SECONDS=5 "${python_flags[@]}"
  cmake --build "$build" -j "$(nproc)"
} > "$out/build.log" 2>&1 || { tail -40 "$out/build.log"; exit 1; }
"$build/apps/info/lavaflow-info" > "$out/info.txt" 2>&1
# Skip the long local-channel benchmark and the 1M streams when only the adapters are wanted.
quick=${LAVAFLOW_GPU_QUICK:-0}
# The 1,000,000-message Vulkan-IPC streams verify every message on the CPU; with device-local
# rings that is a GPU copy + fence per message each way (~3k msg/s on an H100), too slow for one
# device command. They run on lavapipe in CI; here the same processes run 100k messages below.
# LAVAFLOW_GPU_TESTS=REGEX runs only the matching tests (a quick re-run of one area).
ctest --test-dir "$build" -j 8 --output-on-failure --timeout 300 -E "1,000,000 messages.*Vulkan IPC" \
  ${LAVAFLOW_GPU_TESTS:+-R "$LAVAFLOW_GPU_TESTS"} > "$out/ctest.log" 2>&1
rc=$?
grep -h "LAVAFLOW-SKIP" "$build/Testing/Temporary/LastTest.log" | sort -u >> "$out/ctest.log"
stream() {  # transport consumers count
  local name="gpu-stream-$1-$2" pids=()
  for _ in $(seq "$2"); do "$build/apps/demo/lavaflow-demo" consume --channel "$name" --count "$3" --timeout 120 & pids+=($!); done
  "$build/apps/demo/lavaflow-demo" produce --channel "$name" --count "$3" --size 64 --transport "$1" --consumers "$2" --slots 32 || rc=1
  for p in "${pids[@]}"; do wait "$p" || rc=1; done
}
# The main job as a new user runs it (no MPS): frames written and verified by GPU kernels, then by
# Vulkan compute shaders, then with the CPU writing and verifying.
"$build/apps/demo/lavaflow-demo" > "$out/demo-gpu.txt" 2>&1 || rc=1
"$build/apps/demo/lavaflow-demo" --verify vulkan > "$out/demo-vulkan.txt" 2>&1 || rc=1
"$build/apps/demo/lavaflow-demo" --verify cpu --seconds 2 > "$out/demo-cpu.txt" 2>&1 || rc=1
if [ "$quick" != 1 ]; then
{
  "$build/apps/demo/lavaflow-demo" --count 2000 --size 1048576
  "$build/apps/demo/lavaflow-demo" share
  stream vulkan 1 100000
  stream vulkan 3 30000
  stream shm 3 1000000
} 2>&1 | grep -v " / " > "$out/demo.txt"
"$build/apps/bench/lavaflow-bench" alloc > "$out/bench-alloc.txt" 2>&1
"$build/apps/bench/lavaflow-bench" local > "$out/bench-local.txt" 2>&1
fi
# The GPU hand-off benches both ways: as a new user runs them (the GPU time-slices between the two
# processes), and with the CUDA MPS server started for this run only (its pipe and log
# directories private to it, the server quit before the command ends).
"$build/apps/bench/lavaflow-bench" interop > "$out/bench-interop.txt" 2>&1 || rc=1
"$build/apps/bench/lavaflow-bench" interop --json > "$out/bench-interop.json" 2> "$out/bench-interop.err" || rc=1
if command -v nvidia-cuda-mps-control > /dev/null; then
  mps=$(mktemp -d /tmp/lavaflow-mps-XXXXXX)
  mkdir -p "$mps/pipe" "$mps/log"
  export CUDA_MPS_PIPE_DIRECTORY=$mps/pipe CUDA_MPS_LOG_DIRECTORY=$mps/log
  if nvidia-cuda-mps-control -d; then
    "$build/apps/info/lavaflow-info" > "$out/info-mps.txt" 2>&1
    "$build/apps/bench/lavaflow-bench" interop > "$out/bench-interop-mps.txt" 2>&1 || rc=1
    "$build/apps/bench/lavaflow-bench" interop --json > "$out/bench-interop-mps.json" 2> "$out/bench-interop-mps.err" || rc=1
    echo quit | nvidia-cuda-mps-control
  else
    echo "MPS: nvidia-cuda-mps-control -d failed" > "$out/bench-interop-mps.txt"
  fi
  unset CUDA_MPS_PIPE_DIRECTORY CUDA_MPS_LOG_DIRECTORY
  rm -rf "$mps"
fi
"$build/apps/bench/lavaflow-bench" remote > "$out/bench-remote.txt" 2>&1 || rc=1  # no gnuplot there
# The viewer headless (EGL on the GPU; no X server there): Vulkan compute and CUDA producers, paced
# and flat out; every screenshot checked pixel by pixel, by the viewer and by the PNG checker.
viewer="$build/apps/viewer/lavaflow-viewer"
if [ -x "$viewer" ]; then
  {
    for mode in "" "--cuda"; do
      for fps in 60 0; do
        name="viewer${mode:+-cuda}-fps$fps"
        echo "== lavaflow-viewer --headless $mode --fps $fps --frames 600"
        "$viewer" --headless $mode --fps "$fps" --frames 600 --screenshot "$out/$name.png" || rc=1
        "$build/tests/multiprocess/lavaflow_png_check" "$out/$name.png" || rc=1
      done
    done
  } > "$out/viewer.txt" 2>&1
fi
tail -25 "$out/ctest.log"
exit $rc
