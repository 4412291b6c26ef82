// SPDX-License-Identifier: MIT
#pragma once
// Catch-free helpers shared by tests and helper processes: byte patterns and GPU-side
// write/check of a GpuBuffer (through the mapping, or a staging copy when not host-visible).
#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "lavaflow/lavaflow.hpp"

namespace lftest {

inline std::byte pattern_byte(std::uint64_t seed, std::uint64_t i) {
  std::uint64_t x = (i + 1) * 0x9E3779B97F4A7C15ull ^ seed;
  x ^= x >> 29;
  return static_cast<std::byte>(x & 0xff);
}
inline void fill(std::span<std::byte> s, std::uint64_t seed) {
  for (std::uint64_t i = 0; i < s.size(); ++i) s[i] = pattern_byte(seed, i);
}
/// `n` bytes of the pattern for `seed`.
inline std::vector<std::byte> pattern(std::size_t n, std::uint64_t seed) {
  std::vector<std::byte> v(n);
  fill(v, seed);
  return v;
}
/// Index of the first wrong byte, or -1.
inline long long first_mismatch(std::span<const std::byte> s, std::uint64_t seed) {
  for (std::uint64_t i = 0; i < s.size(); ++i)
    if (s[i] != pattern_byte(seed, i)) return static_cast<long long>(i);
  return -1;
}

/// Copies with a GPU transfer and waits; returns an error text or empty.
inline std::string vk_copy_status(const lavaflow::VulkanContext& ctx, vk::Buffer src, std::uint64_t src_off,
                                  vk::Buffer dst, std::uint64_t dst_off, std::uint64_t bytes) {
  auto s = lavaflow::copy_buffer(ctx, src, src_off, dst, dst_off, bytes);
  return s ? std::string() : s.error().message();
}

/// Writes the pattern into `b` (mapped, or through a staging buffer and a GPU copy).
inline std::string gpu_fill(const lavaflow::VulkanContext& ctx, const lavaflow::GpuBuffer& b, std::uint64_t seed) {
  auto s = lavaflow::upload(ctx, b, pattern(b.size(), seed));
  return s ? std::string() : s.error().message();
}

/// Checks the pattern in `b`; returns an error text or empty.
inline std::string gpu_check(const lavaflow::VulkanContext& ctx, const lavaflow::GpuBuffer& b, std::uint64_t seed) {
  std::vector<std::byte> data(b.size());
  if (auto s = lavaflow::download(ctx, b, data); !s) return s.error().message();
  if (auto i = first_mismatch(data, seed); i >= 0) return "byte " + std::to_string(i) + " differs";
  return {};
}

/// A GPU copy submitted without waiting: optionally waiting on / signalling timeline points and
/// signalling a fence. Keeps its command buffer alive until destroyed (after the GPU is done).
struct PendingCopy {
  vk::raii::CommandPool pool{nullptr};
  vk::raii::CommandBuffers cbs{nullptr};
  vk::raii::Fence fence{nullptr};
};

inline PendingCopy submit_copy(const lavaflow::VulkanContext& ctx, vk::Buffer src, std::uint64_t src_off,
                               vk::Buffer dst, std::uint64_t dst_off, std::uint64_t bytes,
                               std::optional<lavaflow::GpuSync> wait = {},
                               std::optional<lavaflow::GpuSync> signal = {}) {
  const auto& dev = ctx.device();
  PendingCopy p;
  p.pool = vk::raii::CommandPool(dev, {vk::CommandPoolCreateFlagBits::eTransient, ctx.queue_family()});
  p.cbs = vk::raii::CommandBuffers(dev, {*p.pool, vk::CommandBufferLevel::ePrimary, 1});
  auto& cb = p.cbs[0];
  cb.begin({vk::CommandBufferUsageFlagBits::eOneTimeSubmit});
  cb.copyBuffer(src, dst, vk::BufferCopy(src_off, dst_off, bytes));
  cb.end();
  p.fence = vk::raii::Fence(dev, vk::FenceCreateInfo{});
  std::uint64_t wait_value = wait ? wait->value : 0, signal_value = signal ? signal->value : 0;
  vk::TimelineSemaphoreSubmitInfo tl(wait ? 1u : 0u, &wait_value, signal ? 1u : 0u, &signal_value);
  vk::PipelineStageFlags stage = vk::PipelineStageFlagBits::eTransfer;
  vk::Semaphore ws = wait ? wait->semaphore : vk::Semaphore{}, ss = signal ? signal->semaphore : vk::Semaphore{};
  vk::CommandBuffer raw = *cb;
  vk::SubmitInfo si(wait ? 1u : 0u, &ws, &stage, 1, &raw, signal ? 1u : 0u, &ss, &tl);
  ctx.queue().submit(si, *p.fence);
  return p;
}

}  // namespace lftest
