// SPDX-License-Identifier: MIT
// lavaflow::mesh_nccl from the installed package: an NCCL group of one rank over a one-rank Mock
// group, and an all_reduce on device memory (exit 77, a visible skip, without a CUDA device).
#include <cuda_runtime_api.h>

#include <cstdio>
#include <lavaflow/mesh/mock.hpp>
#include <lavaflow/mesh_nccl/nccl.hpp>

int main() {
  int devices = 0;
  if (cudaGetDeviceCount(&devices) != cudaSuccess || devices == 0)
    return std::printf("LAVAFLOW-SKIP: mesh_nccl: no CUDA device\n"), 77;
  auto world = lavaflow::mesh::MockWorld::create(1);
  auto host = world->communicator("solo", {0}, 0);
  if (!host) return std::printf("mesh_nccl: %s\n", host.error().message().c_str()), 1;
  auto c = lavaflow::mesh::open_nccl(**host, {});
  if (!c) return std::printf("mesh_nccl: %s\n", c.error().message().c_str()), 1;
  void* p = nullptr;
  if (cudaMalloc(&p, 64) != cudaSuccess) return std::printf("mesh_nccl: cudaMalloc failed\n"), 1;
  const std::span<std::byte> buf(static_cast<std::byte*>(p), 64);
  const auto s = (*c)->all_reduce(buf, buf, lavaflow::mesh::DType::F32, lavaflow::mesh::ReduceOp::Sum).wait();
  (void)cudaFree(p);
  std::printf("mesh_nccl: %s\n", s ? "all_reduce on one rank" : s.error().message().c_str());
  return s ? 0 : 1;
}
