// SPDX-License-Identifier: MIT
#include "external_memory.hpp"

#include <fcntl.h>
#include <unistd.h>

#include <string_view>

#include "lavaflow/core/detail/format.hpp"
#include "lavaflow/core/detail/vk_call.hpp"
#include "vulkan_state.hpp"

namespace lavaflow::detail {

Status require_fd_memory(const VulkanContext& ctx, const char* call, bool import) {
  const auto& c = ctx.capabilities();
  if (!ctx.has_extension(VK_KHR_EXTERNAL_MEMORY_FD_EXTENSION_NAME))
    return fail(Errc::Unsupported, call,
                str_format("device {} lacks {}", c.identity.name, VK_KHR_EXTERNAL_MEMORY_FD_EXTENSION_NAME));
  if (import ? !c.memory_fd_import : !c.memory_fd_export)
    return fail(
        Errc::Unsupported, call,
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

Status check_memory_type(const VulkanContext& ctx, std::uint32_t index, std::uint32_t allowed_bits, const char* call) {
  const auto& props = detail::state_of(ctx)->memory;
  if (index >= props.memoryTypeCount)
    return fail(Errc::DeviceMismatch, call,
                str_format("memory type {} does not exist on this device ({} types)", index, props.memoryTypeCount));
  if (!(allowed_bits & (1u << index)))
    return fail(Errc::DeviceMismatch, call,
                str_format("memory type {} cannot back this resource here (allowed mask {:#x})", index, allowed_bits));
  return {};
}

Result<vk::raii::DeviceMemory> import_memory(const vk::raii::Device& dev, const vk::MemoryAllocateInfo& info,
                                             const char* call) {
  auto memory = vk_call("vkAllocateMemory(import)", [&] { return vk::raii::DeviceMemory(dev, info); });
  if (memory || (memory.error().code() != Errc::OutOfMemory && memory.error().code() != Errc::InvalidArgument))
    return memory;
  return fail(Errc::Malformed, call,
              str_format("the driver refused the import ({}): the descriptor does not match the allocation behind the "
                         "fd ({} bytes, memory type {}), or the device is out of memory",
                         memory.error().cause(), info.allocationSize, info.memoryTypeIndex));
}

UniqueFd own_file_description(UniqueFd fd) {
  const auto path = str_format("/proc/self/fd/{}", fd.get());
  char target[64] = {};
  const ssize_t n = ::readlink(path.c_str(), target, sizeof target - 1);
  if (n <= 0 || !std::string_view(target, static_cast<std::size_t>(n)).starts_with("/memfd:")) return fd;
  // The allocation's size is fixed: sealing it lets importers trust the size they measure
  // (check_memory_fd). Drivers that create memfds without MFD_ALLOW_SEALING refuse; importers
  // then refuse such fds in turn, which is the safe answer.
  (void)::fcntl(fd.get(), F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW);
  const int fresh = ::open(path.c_str(), O_RDWR | O_CLOEXEC);
  if (fresh < 0) return fd;  // e.g. a write-sealed memfd: the shared description still works, one importer at a time
  return UniqueFd(fresh);    // `fd` (the shared description) is closed here
}

}  // namespace lavaflow::detail
