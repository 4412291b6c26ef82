// SPDX-License-Identifier: MIT
#pragma once
// Catch-free helpers shared by tests and helper processes: byte patterns and GPU-side
// write/check of a GpuBuffer (through the mapping, or a staging copy when not host-visible).
#include <cstdint>
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
  std::vector<std::byte> data(b.size());
  fill(data, seed);
  auto s = lavaflow::upload(ctx, b, data);
  return s ? std::string() : s.error().message();
}

/// Checks the pattern in `b`; returns an error text or empty.
inline std::string gpu_check(const lavaflow::VulkanContext& ctx, const lavaflow::GpuBuffer& b, std::uint64_t seed) {
  std::vector<std::byte> data(b.size());
  if (auto s = lavaflow::download(ctx, b, data); !s) return s.error().message();
  if (auto i = first_mismatch(data, seed); i >= 0) return "byte " + std::to_string(i) + " differs";
  return {};
}

}  // namespace lftest
