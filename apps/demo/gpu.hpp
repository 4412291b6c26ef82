// SPDX-License-Identifier: MIT
#pragma once
// lavaflow-demo on a GPU: frames written by a CUDA kernel in the producer and verified word by word
// by a CUDA kernel in the consumer, handed over through the channel's GPU-ordered hand-off (no CPU
// waits for either GPU). Built when the CUDA adapter is.
#include <cstdint>
#include <memory>
#include <optional>
#include <string>

#include "lavaflow/lavaflow.hpp"

namespace lfdemo {

/// user_tag of frames written on the GPU: their check is the pattern itself (every word), not a
/// checksum the producer's CPU never saw.
inline constexpr std::uint64_t kGpuPatternTag = 0x4750552d50415454ull;  // "GPU-PATT"
/// Bytes a GPU-written frame's slot holds past the frame: the GPU time its write ended.
inline constexpr std::uint64_t kStampBytes = 8;
/// Where the stamp of a `size`-byte frame lies in its slot.
inline std::uint64_t stamp_offset(std::uint64_t size) { return (size + 7) / 8 * 8; }

class GpuWriter {
 public:
  /// Unsupported (with the reason) when CUDA cannot write this producer's ring here.
  [[nodiscard]] static lavaflow::Result<std::unique_ptr<GpuWriter>> create(const lavaflow::Producer& producer);
  ~GpuWriter();
  /// Queues frame `seq` into the loan (after the consumers' GPU reads of the slot), then the
  /// signal; `corrupt`: flip this byte after the write (the demo's corruption test).
  [[nodiscard]] lavaflow::Status write(lavaflow::Loan& loan, std::uint64_t seq, std::uint64_t size,
                                       std::optional<std::uint64_t> corrupt);
  /// Waits for the queued writes.
  [[nodiscard]] lavaflow::Status finish(lavaflow::Duration timeout);
  [[nodiscard]] const std::string& device() const;

 private:
  struct Impl;
  explicit GpuWriter(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

class GpuVerifier {
 public:
  /// Unsupported (with the reason) when CUDA cannot read this consumer's ring here.
  [[nodiscard]] static lavaflow::Result<std::unique_ptr<GpuVerifier>> create(const lavaflow::Consumer& consumer);
  ~GpuVerifier();
  /// Queues the check of a GPU-written frame and its release on the GPU; the message may be
  /// dropped at once.
  [[nodiscard]] lavaflow::Status verify(lavaflow::Received& message);
  struct Report {
    std::uint64_t frames = 0;
    std::uint64_t wrong_words = 0;
    std::uint64_t first_bad_frame = ~0ull;
    double p50_us = 0, p99_us = 0;  ///< write done (producer's GPU) -> verified (ours)
  };
  /// Waits for the queued checks and reads their results.
  [[nodiscard]] lavaflow::Result<Report> finish(lavaflow::Duration timeout);
  [[nodiscard]] const std::string& device() const;

 private:
  struct Impl;
  explicit GpuVerifier(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace lfdemo
