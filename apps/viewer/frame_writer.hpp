// SPDX-License-Identifier: MIT
#pragma once
// What writes the producer's frames into loaned ring buffers: a Vulkan compute shader (the ring is
// Vulkan memory), a CUDA kernel on the same memory imported into CUDA (--cuda), or the CPU (the
// ring is CPU shared memory). Each hands the frame to the channel ordered correctly for its API.
#include <memory>
#include <string>

#include "lavaflow/transports/channel.hpp"

namespace lfviewer {

struct FrameShape {
  std::uint32_t width = 0, height = 0, frame = 0;
};

class FrameWriter {
 public:
  virtual ~FrameWriter() = default;
  [[nodiscard]] virtual std::string description() const = 0;
  /// Writes frame `f` into `loan` and publishes it with `info`.
  [[nodiscard]] virtual lavaflow::Status write_and_publish(lavaflow::Producer& p, lavaflow::Loan&& loan,
                                                           const FrameShape& f, lavaflow::MessageInfo info) = 0;
};

[[nodiscard]] lavaflow::Result<std::unique_ptr<FrameWriter>> make_vulkan_writer(const lavaflow::VulkanContext& vk);
[[nodiscard]] lavaflow::Result<std::unique_ptr<FrameWriter>> make_cpu_writer();
/// Unsupported when lava-flow was built without CUDA.
[[nodiscard]] lavaflow::Result<std::unique_ptr<FrameWriter>> make_cuda_writer(const lavaflow::Producer& p);

}  // namespace lfviewer
