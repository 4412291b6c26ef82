// SPDX-License-Identifier: MIT
#pragma once
#include <cstdint>
#include <set>
#include <string>
namespace lfbench {
/// `lavaflow-bench interop [--json] [--size BYTES] [--rounds N] [--frames N] [--slots N] [--batch N]
/// [--parts copy,import,pingpong,stream]` (needs a CUDA GPU).
struct InteropOptions {
  std::uint64_t size = 1ull << 30;  ///< bytes the copy kernel moves
  int rounds = 2000;                ///< gpu-pingpong round trips per row
  int frames = 2000;                ///< gpu-stream frames at 1 MiB (a quarter of that at 16 MiB)
  std::uint32_t slots = 0;          ///< gpu-stream ring buffers (0: the channel's default)
  int batch = 8;                    ///< gpu-stream frames per GPU wait and signal
  /// Which rows to measure (empty: all): copy, import, pingpong, stream.
  std::set<std::string> parts;
  bool json = false;
};
int bench_interop(const InteropOptions& options);
}  // namespace lfbench
