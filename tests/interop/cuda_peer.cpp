// SPDX-License-Identifier: MIT
// Helper process for the CUDA tests: a channel consumer whose CUDA stream waits on the channel's
// timeline (no CPU wait for the producer's GPU work) and reads every message on the GPU.
//   lavaflow_cuda_peer consume DIR NAME COUNT
// Message i must hold lftest::fill(…, i). Exit 0 when all COUNT verified and each ring buffer was
// imported once; 77 when CUDA cannot run here.
#include <cuda_runtime_api.h>

#include <cstdio>
#include <string>

#include "lavaflow/cuda/cuda.hpp"
#include "lavaflow/transports/local.hpp"
#include "vk_helpers.hpp"

using namespace lavaflow;

int main(int argc, char** argv) {
  if (argc != 5 || std::string(argv[1]) != "consume") {
    std::fprintf(stderr, "usage: lavaflow_cuda_peer consume DIR NAME COUNT\n");
    return 2;
  }
  const std::uint64_t count = std::stoull(argv[4]);
  auto c = Consumer::open(
      argv[3], {.host_wait_for_gpu = false, .connect_timeout = std::chrono::seconds(20), .directory = argv[2]});
  if (!c) return std::fprintf(stderr, "cuda_peer: %s\n", c.error().message().c_str()), 1;
  if (!(*c)->vulkan()) return std::fprintf(stderr, "cuda_peer: channel is not on the Vulkan transport\n"), 1;
  auto cu = cuda::Interop::create(*(*c)->vulkan());
  if (!cu) return std::printf("LAVAFLOW-SKIP: %s\n", cu.error().message().c_str()), 77;
  cuda::ChannelImports imports(*cu);
  cudaStream_t stream;
  if (cudaStreamCreate(&stream) != cudaSuccess) return 1;
  std::vector<std::byte> seen;
  std::uint64_t gpu_ordered = 0;
  for (std::uint64_t i = 0; i < count; ++i) {
    auto r = (*c)->receive(std::chrono::seconds(20));
    if (!r)
      return std::fprintf(stderr, "cuda_peer: message %llu: %s\n", static_cast<unsigned long long>(i),
                          r.error().message().c_str()),
             1;
    auto buf = imports.buffer(*r);
    if (!buf) return std::fprintf(stderr, "cuda_peer: %s\n", buf.error().message().c_str()), 1;
    gpu_ordered += r->gpu_wait().has_value();
    if (auto ok = imports.wait(stream, *r); !ok)
      return std::fprintf(stderr, "cuda_peer: %s\n", ok.error().message().c_str()), 1;
    seen.resize(r->info().size);
    if (cudaMemcpyAsync(seen.data(), (*buf)->data(), seen.size(), cudaMemcpyDeviceToHost, stream) != cudaSuccess ||
        cudaStreamSynchronize(stream) != cudaSuccess)
      return std::fprintf(stderr, "cuda_peer: CUDA copy failed\n"), 1;
    if (auto bad = lftest::first_mismatch(seen, i); bad >= 0)
      return std::fprintf(stderr, "cuda_peer: message %llu byte %lld differs\n", static_cast<unsigned long long>(i),
                          bad),
             1;
  }
  std::printf(
      "cuda_peer: %llu messages verified on the GPU (%llu ordered by the channel's GPU counters); %zu buffers "
      "imported for %u slots\n",
      static_cast<unsigned long long>(count), static_cast<unsigned long long>(gpu_ordered), imports.imported(),
      (*c)->slots());
  // Each ring buffer once, and a flag channel's block of GPU flags.
  const std::size_t flags = (*c)->gpu_sync() == GpuSyncKind::Flag ? 1 : 0;
  return imports.imported() <= (*c)->slots() + flags ? 0 : 1;
}
