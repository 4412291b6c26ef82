// SPDX-License-Identifier: MIT
// lavaflow::cuda from the installed package: lists CUDA devices (none on a machine without a
// CUDA driver: exit 77, a visible skip).
#include <cstdio>
#include <lavaflow/cuda/cuda.hpp>

int main() {
  auto devices = lavaflow::cuda::devices();
  if (!devices) return std::printf("LAVAFLOW-SKIP: cuda: %s\n", devices.error().message().c_str()), 77;
  std::printf("cuda: %zu device(s)\n", devices->size());
}
