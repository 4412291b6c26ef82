// SPDX-License-Identifier: MIT
// lavaflow::mesh_cuda from the installed package: CUDA collectives over a one-rank Mock group
// (exit 77, a visible skip, on a machine without a CUDA device).
#include <cuda_runtime_api.h>

#include <cstdio>
#include <lavaflow/mesh/mock.hpp>
#include <lavaflow/mesh_cuda/cuda_collectives.hpp>

int main() {
  int devices = 0;
  if (cudaGetDeviceCount(&devices) != cudaSuccess || devices == 0)
    return std::printf("LAVAFLOW-SKIP: mesh_cuda: no CUDA device\n"), 77;
  auto world = lavaflow::mesh::MockWorld::create(1);
  auto host = world->communicator("solo", {0}, 0);
  if (!host) return std::printf("mesh_cuda: %s\n", host.error().message().c_str()), 1;
  auto c = lavaflow::mesh::CudaCollectives::open(**host, {});
  std::printf("mesh_cuda: %s\n", c ? "opened" : c.error().message().c_str());
  return c ? 0 : 1;
}
