// SPDX-License-Identifier: MIT
// lavaflow::opencl from the installed package: lists OpenCL devices.
#include <cstdio>
#include <lavaflow/opencl/opencl.hpp>

int main() {
  auto devices = lavaflow::cl::devices();
  if (!devices) return std::printf("opencl: %s\n", devices.error().message().c_str()), 1;
  std::printf("opencl: %zu device(s)\n", devices->size());
}
