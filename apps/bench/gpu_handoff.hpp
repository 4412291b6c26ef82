// SPDX-License-Identifier: MIT
#pragma once
// lavaflow-bench interop, GPU-resident hand-off rows (CUDA GPU): gpu-pingpong and gpu-stream,
// each next to its baselines measured in the same run.
#include <cstdint>
#include <string>
#include <vector>

#include "lavaflow/core/error.hpp"
#include "lavaflow/cuda/cuda.hpp"

namespace lfbench {

struct GpuRow {
  std::string name;     ///< gpu-pingpong-{lavaflow,cuda-ipc,same-process}, gpu-stream-{lavaflow,same-process}
  std::string variant;  ///< how the hand-off is signalled (timeline, ipc-event, event)
  std::uint64_t size = 0;
  std::size_t samples = 0;
  double p50_ns = 0, p99_ns = 0;      ///< ping-pong: round trip / 2; stream: per frame
  double gbps = 0, frames_per_s = 0;  ///< streams
  std::uint64_t errors = 0;           ///< streams: words the verifier found wrong
  bool mps = false;                   ///< the CUDA MPS daemon served this run
};

/// The four ping-pong rows for `size`-byte frames (a multiple of 16), `rounds` round trips each,
/// measured in turn in three passes.
[[nodiscard]] lavaflow::Result<std::vector<GpuRow>> gpu_pingpong(const lavaflow::VulkanContext& vk,
                                                                 const lavaflow::cuda::Interop& cu, std::uint64_t size,
                                                                 int rounds, bool mps);
/// The stream rows for `size`-byte frames: `frames` frames filled by one process's kernel and
/// verified by the other's, through a channel of `slots` ring buffers, ordered in batches of
/// `batch` frames (at most half the ring) and, unless `batch` is 1, frame by frame too; then the
/// same in one process.
[[nodiscard]] lavaflow::Result<std::vector<GpuRow>> gpu_stream(const lavaflow::VulkanContext& vk,
                                                               const lavaflow::cuda::Interop& cu, std::uint64_t size,
                                                               int frames, std::uint32_t slots, int batch, bool mps);
/// The second process of these measurements (`lavaflow-bench gpu-peer MODE …`).
int gpu_handoff_peer(int argc, char** argv);

}  // namespace lfbench
