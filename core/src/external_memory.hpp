// SPDX-License-Identifier: MIT
#pragma once
// Private: the checks every opaque-fd import (buffers, images) makes before any driver call.
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
/// InvalidArgument unless `fd` is an open descriptor.
[[nodiscard]] Status check_open_fd(const UniqueFd& fd, const char* call);
/// DeviceMismatch unless `index` names a memory type of this device allowed by `allowed_bits`.
[[nodiscard]] Status check_memory_type(const VulkanContext& ctx, std::uint32_t index, std::uint32_t allowed_bits,
                                       const char* call);

}  // namespace lavaflow::detail
