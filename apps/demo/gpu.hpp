// SPDX-License-Identifier: MIT
#pragma once
// lavaflow-demo on a GPU: frames written by the producer's GPU and every word verified by the
// consumer's GPU, in separate processes, handed over through the channel's GPU-ordered hand-off
// (no CPU waits for either GPU). Two implementations: CUDA kernels (where the CUDA adapter is
// built) and Vulkan compute shaders (on any GPU whose driver shares timeline semaphores).
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>

#include "lavaflow/lavaflow.hpp"

namespace lfdemo {

/// user_tag of frames written on the GPU: their check is the pattern itself (every word), not a
/// checksum the producer's CPU never saw.
inline constexpr std::uint64_t kGpuPatternTag = 0x4750552d50415454ull;  // "GPU-PATT"
/// Bytes a GPU-written frame's slot holds past the frame: the GPU time its write ended (CUDA).
inline constexpr std::uint64_t kStampBytes = 8;
/// Where the stamp of a `size`-byte frame lies in its slot.
inline std::uint64_t stamp_offset(std::uint64_t size) { return (size + 7) / 8 * 8; }

class GpuWriter {
 public:
  virtual ~GpuWriter() = default;
  /// Queues frame `seq` into the loan (after the consumers' GPU reads of the slot), then the
  /// signal; `corrupt`: flip this byte after the write (the demo's corruption test).
  [[nodiscard]] virtual lavaflow::Status write(lavaflow::Loan& loan, std::uint64_t seq, std::uint64_t size,
                                               std::optional<std::uint64_t> corrupt) = 0;
  /// Waits for the queued writes.
  [[nodiscard]] virtual lavaflow::Status finish(lavaflow::Duration timeout) = 0;
  /// The device and how it writes, for the summary.
  [[nodiscard]] virtual std::string description() const = 0;
};

class GpuVerifier {
 public:
  struct Report {
    std::uint64_t frames = 0;
    std::uint64_t wrong_words = 0;
    std::uint64_t first_bad_frame = ~0ull;
    double p50_us = 0, p99_us = 0;
    std::string latency;  ///< what p50/p99 measure
  };
  virtual ~GpuVerifier() = default;
  /// Queues the check of a GPU-written frame and its release on the GPU; the message may be
  /// dropped at once.
  [[nodiscard]] virtual lavaflow::Status verify(lavaflow::Received& message) = 0;
  /// Waits for the queued checks and reads their results.
  [[nodiscard]] virtual lavaflow::Result<Report> finish(lavaflow::Duration timeout) = 0;
  /// The device and how it verifies, for the summary.
  [[nodiscard]] virtual std::string description() const = 0;
};

/// `api`: "cuda", "vulkan", or "gpu" (CUDA where built and usable, else Vulkan compute).
/// Unsupported, with the reason, when that API cannot write this producer's ring here.
[[nodiscard]] lavaflow::Result<std::unique_ptr<GpuWriter>> make_gpu_writer(const lavaflow::Producer& producer,
                                                                           std::string_view api);
[[nodiscard]] lavaflow::Result<std::unique_ptr<GpuVerifier>> make_gpu_verifier(const lavaflow::Consumer& consumer,
                                                                               std::string_view api);

// The implementations (gpu_cuda.cpp, gpu_vulkan.cpp); Unsupported where not built.
[[nodiscard]] lavaflow::Result<std::unique_ptr<GpuWriter>> make_cuda_writer(const lavaflow::Producer& producer);
[[nodiscard]] lavaflow::Result<std::unique_ptr<GpuVerifier>> make_cuda_verifier(const lavaflow::Consumer& consumer);
[[nodiscard]] lavaflow::Result<std::unique_ptr<GpuWriter>> make_vulkan_writer(const lavaflow::Producer& producer);
[[nodiscard]] lavaflow::Result<std::unique_ptr<GpuVerifier>> make_vulkan_verifier(const lavaflow::Consumer& consumer);

}  // namespace lfdemo
