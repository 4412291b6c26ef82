// SPDX-License-Identifier: MIT
#pragma once
// Private: the checks every opaque-fd import (buffers, images) makes before any driver call.
#include <vulkan/vulkan_raii.hpp>

#include "lavaflow/core/error.hpp"
#include "lavaflow/core/unique_fd.hpp"
#include "lavaflow/core/vulkan_context.hpp"

namespace lavaflow::detail {

inline constexpr auto kOpaqueFd = vk::ExternalMemoryHandleTypeFlagBits::eOpaqueFd;

/// Unsupported unless the device exports (or imports) opaque-fd memory.
[[nodiscard]] Status require_fd_memory(const VulkanContext& ctx, const char* call, bool import);
/// DeviceMismatch unless the memory was exported by this context's device and driver.
[[nodiscard]] Status check_exporter(const VulkanContext& ctx, const Uuid& device_uuid, const Uuid& driver_uuid,
                                    const char* call);
/// DeviceMismatch unless `index` names a memory type of this device allowed by `allowed_bits`.
[[nodiscard]] Status check_memory_type(const VulkanContext& ctx, std::uint32_t index, std::uint32_t allowed_bits,
                                       const char* call);

/// vkAllocateMemory with an imported fd: a driver that finds the descriptor's size, memory type or
/// dedication at odds with the memory behind the fd answers out-of-memory or invalid-handle, which
/// would name the wrong cause. The error says the descriptor does not match the allocation.
[[nodiscard]] Result<vk::raii::DeviceMemory> import_memory(const vk::raii::Device& dev,
                                                           const vk::MemoryAllocateInfo& info, const char* call);

/// An exported fd with a file description of its own. Drivers whose opaque fds are memfds
/// (lavapipe) hand out dup()s of one description, so every export of a buffer shares one file
/// offset — and lavapipe's import seeks to 0 and read()s a header through it: two processes
/// importing the same buffer at once can read each other's half-moved offset and fail with
/// VK_ERROR_INVALID_EXTERNAL_HANDLE. A memfd is sealed against shrinking and growing (importers
/// check its size, check_memory_fd) and reopened through /proc/self/fd (same memory, new
/// description); any other fd, or a memfd that cannot be reopened, is returned as it is.
[[nodiscard]] UniqueFd own_file_description(UniqueFd fd);

}  // namespace lavaflow::detail
