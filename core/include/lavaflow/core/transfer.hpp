// SPDX-License-Identifier: MIT
#pragma once
/// @file
/// Moving bytes in and out of GPU buffers that may not be host-visible: a GPU copy, and upload /
/// download through a host-visible staging buffer (or the mapping, when there is one). Each call
/// waits for the GPU with a fence, bounded by `timeout`.

#include <chrono>
#include <memory>
#include <span>

#include "lavaflow/core/gpu_buffer.hpp"
#include "lavaflow/core/gpu_image.hpp"

namespace lavaflow {

/// GPU copy of `bytes` from src to dst, submitted on ctx's queue; waits for completion.
[[nodiscard]] Status copy_buffer(const VulkanContext& ctx, vk::Buffer src, std::uint64_t src_offset, vk::Buffer dst,
                                 std::uint64_t dst_offset, std::uint64_t bytes,
                                 std::chrono::milliseconds timeout = std::chrono::seconds(10));

/// Writes `data` at the start of `dst`'s range: a GpuBuffer, or a PooledBuffer of Vulkan memory (its
/// range of the segment); mapped memory is written directly. InvalidArgument when it does not fit
/// or the buffer is in no Vulkan memory.
[[nodiscard]] Status upload(const VulkanContext& ctx, const Buffer& dst, std::span<const std::byte> data);

/// Reads `out.size()` bytes from the start of `src`'s range (the buffers upload() takes).
[[nodiscard]] Status download(const VulkanContext& ctx, const Buffer& src, std::span<std::byte> out);

/// Writes tightly packed pixels (width × height × bytes per pixel) into the whole image, which is
/// in layout `current`, and leaves it in VK_IMAGE_LAYOUT_GENERAL (the layout lava-flow tells other
/// APIs about).
[[nodiscard]] Status upload_image(const VulkanContext& ctx, const GpuImage& dst, std::span<const std::byte> pixels,
                                  vk::ImageLayout current = vk::ImageLayout::eUndefined);
/// Reads the whole image as tightly packed pixels; leaves it in VK_IMAGE_LAYOUT_GENERAL.
[[nodiscard]] Status download_image(const VulkanContext& ctx, const GpuImage& src, std::span<std::byte> pixels,
                                    vk::ImageLayout current = vk::ImageLayout::eGeneral);

/// Reusable staging for repeated uploads/downloads of up to `capacity` bytes (one host-visible
/// buffer, one command buffer, one fence — made on first use with unmapped memory), for streams of
/// messages in device-local memory where a fresh staging allocation per message would dominate.
class Stager {
 public:
  [[nodiscard]] static Result<Stager> create(const VulkanContext& ctx, std::uint64_t capacity);
  Stager(Stager&&) noexcept;
  Stager& operator=(Stager&&) noexcept;
  ~Stager();
  /// Writes `data` at the start of `dst`'s range (mapped memory directly, else staged GPU copy).
  [[nodiscard]] Status upload(const Buffer& dst, std::span<const std::byte> data);
  /// Reads `out.size()` bytes from the start of `src`'s range.
  [[nodiscard]] Status download(const Buffer& src, std::span<std::byte> out);

 private:
  struct Impl;
  explicit Stager(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace lavaflow
