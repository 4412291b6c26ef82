// SPDX-License-Identifier: MIT
#pragma once
#include <cstdint>
namespace lfdemo {
/// `lavaflow-demo mesh` (run under mpiexec); returns the exit status.
int mesh_main(int argc, char** argv, std::uint64_t count, std::uint64_t size);
}  // namespace lfdemo
