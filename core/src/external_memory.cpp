// SPDX-License-Identifier: MIT
#include "external_memory.hpp"

#include <fcntl.h>
#include <unistd.h>

#include <string_view>

#include "lavaflow/core/format.hpp"
#include "vulkan_state.hpp"

namespace lavaflow::detail {

Status require_fd_memory(const VulkanContext& ctx, const char* call, bool import) {
  const auto& c = ctx.capabilities();
  if (!ctx.has_extension(VK_KHR_EXTERNAL_MEMORY_FD_EXTENSION_NAME))
    return fail(Errc::Unsupported, call,
                str_format("device {} lacks {}", c.identity.name, VK_KHR_EXTERNAL_MEMORY_FD_EXTENSION_NAME));
  if (import ? !c.memory_fd_import : !c.memory_fd_export)
    return fail(Errc::Unsupported, call,
                str_format("device {} cannot {} opaque-fd buffer memory", c.identity.name, import ? "import" : "export"));
  return {};
}

Status check_exporter(const VulkanContext& ctx, const Uuid& device_uuid, const Uuid& driver_uuid, const char* call) {
  const auto& me = ctx.capabilities().identity;
  if (device_uuid != me.device_uuid)
    return fail(Errc::DeviceMismatch, call,
                str_format("memory comes from device {}, this context's device {} is {}", to_string(device_uuid),
                           me.name, to_string(me.device_uuid)));
  if (driver_uuid != me.driver_uuid)
    return fail(Errc::DeviceMismatch, call,
                str_format("memory comes from driver {}, this context's driver is {}", to_string(driver_uuid),
                           to_string(me.driver_uuid)));
  return {};
}

Status check_open_fd(const UniqueFd& fd, const char* call) { return check_handle_fd(fd, call); }

Status check_memory_type(const VulkanContext& ctx, std::uint32_t index, std::uint32_t allowed_bits, const char* call) {
  const auto& props = ctx.state()->memory;
  if (index >= props.memoryTypeCount)
    return fail(Errc::DeviceMismatch, call,
                str_format("memory type {} does not exist on this device ({} types)", index, props.memoryTypeCount));
  if (!(allowed_bits & (1u << index)))
    return fail(Errc::DeviceMismatch, call,
                str_format("memory type {} cannot back this resource here (allowed mask {:#x})", index, allowed_bits));
  return {};
}

UniqueFd own_file_description(UniqueFd fd) {
  const auto path = str_format("/proc/self/fd/{}", fd.get());
  char target[64] = {};
  const ssize_t n = ::readlink(path.c_str(), target, sizeof target - 1);
  if (n <= 0 || !std::string_view(target, static_cast<std::size_t>(n)).starts_with("/memfd:")) return fd;
  const int fresh = ::open(path.c_str(), O_RDWR | O_CLOEXEC);
  if (fresh < 0) return fd;  // e.g. a write-sealed memfd: the shared description still works, one importer at a time
  return UniqueFd(fresh);    // `fd` (the shared description) is closed here
}

}  // namespace lavaflow::detail
