#!/usr/bin/env bash
# A build with every optional backend OFF (LAVAFLOW_WITH_<X>=OFF for each) still has all
# local channels: configures the tree so, checks that no optional library was built and that
# lavaflow-demo needs no MPI, then runs its local job (producer and consumer processes) through
# shared memory and through Vulkan IPC; installs it and checks that the package has no component
# of a backend that was not built (no headers, and asking for one fails naming it).
#   no_backends.sh SOURCE_DIR BUILD_DIR GENERATOR CXX_COMPILER
set -euo pipefail
src=$1 bin=$2 generator=$3 cxx=$4
cmake -S "$src" -B "$bin" -G "$generator" -DCMAKE_CXX_COMPILER="$cxx" -DCMAKE_BUILD_TYPE=Debug \
      -DLAVAFLOW_BUILD_TESTS=OFF -DLAVAFLOW_INSTALL=ON -DLAVAFLOW_WERROR=ON \
      -DLAVAFLOW_WITH_MPI=OFF -DLAVAFLOW_WITH_CUDA=OFF -DLAVAFLOW_WITH_OPENCL=OFF -DLAVAFLOW_WITH_OPENGL=OFF \
      -DLAVAFLOW_WITH_GLOO=OFF -DLAVAFLOW_WITH_NCCL=OFF -DLAVAFLOW_WITH_PYTHON=OFF > "$bin.configure.log" ||
  { cat "$bin.configure.log"; echo "FAILED: configure with every optional backend OFF"; exit 1; }
grep "lavaflow:" "$bin.configure.log"
cmake --build "$bin" --target lavaflow-demo lavaflow-info > "$bin.build.log" 2>&1 ||
  { tail -40 "$bin.build.log"; echo "FAILED: build with every optional backend OFF"; exit 1; }
for lib in mpi cuda opencl opengl mesh_cuda mesh_nccl; do
  if [ -n "$(find "$bin" -name "liblavaflow_$lib.*")" ]; then echo "FAILED: lavaflow_$lib built with its backend OFF"; exit 1; fi
done
demo=$bin/apps/demo/lavaflow-demo
if ldd "$demo" | grep -Ei "libmpi|libcuda|libOpenCL|libGL"; then echo "FAILED: lavaflow-demo links an optional backend"; exit 1; fi
"$bin/apps/info/lavaflow-info" > /dev/null
for transport in shm vulkan; do
  "$demo" --count 2000 --size 65536 --transport "$transport" || { echo "FAILED: local channel over $transport"; exit 1; }
done
# The MPI-only job says so instead of failing obscurely.
if "$demo" mesh > "$bin.mesh.log" 2>&1 || ! grep -q "MPI is not built" "$bin.mesh.log"; then
  cat "$bin.mesh.log"; echo "FAILED: lavaflow-demo mesh without MPI did not refuse with the reason"; exit 1
fi
# The installed package: core, transports and mesh only, and a request for an absent component fails naming it.
cmake --build "$bin" > "$bin.build-all.log" 2>&1 || { tail -40 "$bin.build-all.log"; echo "FAILED: full build"; exit 1; }
rm -rf "$bin/prefix"
cmake --install "$bin" --prefix "$bin/prefix" > /dev/null
bash "$(dirname "$0")/check_install.sh" "$bin/prefix" "$bin" core transports mesh c
for c in cuda opencl opengl mpi mesh_mpi mesh_cuda mesh_nccl; do
  if cmake -S "$(dirname "$0")/consumer" -B "$bin/consumer-$c" -G "$generator" -DCMAKE_PREFIX_PATH="$bin/prefix" \
       -DCMAKE_CXX_COMPILER="$cxx" -DLAVAFLOW_COMPONENTS="core;transports;$c" > "$bin.consumer-$c.log" 2>&1 ||
     ! grep -q "lavaflow component '$c' is not part of this installation" "$bin.consumer-$c.log"; then
    cat "$bin.consumer-$c.log"; echo "FAILED: find_package(lavaflow COMPONENTS $c) without $c did not fail naming it"; exit 1
  fi
done
cmake -S "$(dirname "$0")/consumer" -B "$bin/consumer" -G "$generator" -DCMAKE_PREFIX_PATH="$bin/prefix" \
      -DCMAKE_CXX_COMPILER="$cxx" -DLAVAFLOW_COMPONENTS="core;transports;mesh" > /dev/null
cmake --build "$bin/consumer" > /dev/null
"$bin/consumer/use-core" && "$bin/consumer/use-transports" && "$bin/consumer/use-mesh"
echo "no optional backends: local channels (shm, vulkan) OK"
