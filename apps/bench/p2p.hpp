// SPDX-License-Identifier: MIT
#pragma once
// lavaflow-bench p2p: GPU0 → GPU1 transfers (two CUDA devices).
#include <cstdint>

namespace lfbench {

struct P2POptions {
  std::uint64_t min_size = 1ull << 20;  ///< smallest transfer, bytes
  std::uint64_t max_size = 1ull << 30;  ///< largest transfer, bytes (sizes go ×4 from min_size)
  bool json = false;
};
/// Rows per size: p2p-lavaflow (a channel from a producer process on GPU 0 to a consumer process
/// that copies each message to GPU 1 over the peer link), p2p-cuda-memcpy-peer (cudaMemcpyPeerAsync
/// inside one process: the link's floor) and p2p-host-staged (through pinned host memory).
int bench_p2p(const P2POptions& options);
/// The consumer process of p2p-lavaflow (`lavaflow-bench p2p-peer DIR SIZE COUNT FD`).
int p2p_peer(int argc, char** argv);

}  // namespace lfbench
