// SPDX-License-Identifier: MIT
#pragma once
#include <cstdint>
namespace lfbench {
/// `lavaflow-bench interop [--json] [--size BYTES] [--frame BYTES] [--rounds N]` (needs a CUDA GPU).
struct InteropOptions {
  std::uint64_t size = 1ull << 30;  ///< bytes the copy kernel moves
  std::uint64_t frame = 1 << 20;    ///< bytes per handed-off frame
  int rounds = 2000;                ///< hand-off round trips
  bool json = false;
};
int bench_interop(const InteropOptions& options);
/// The second process of the hand-off measurements.
int bench_interop_peer(int argc, char** argv);
}  // namespace lfbench
