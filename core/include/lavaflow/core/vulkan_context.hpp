// SPDX-License-Identifier: MIT
#pragma once
/// @file
/// A Vulkan instance + device + queue, either created and owned by lava-flow or wrapping a user's
/// objects without owning them ("bring your own Vulkan"). Each context carries its own dispatcher:
/// several contexts in one process are independent.

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <variant>
#include <vector>
#include <vulkan/vulkan_raii.hpp>

#include "lavaflow/core/error.hpp"
#include "lavaflow/core/location.hpp"

namespace lavaflow {

/// What a physical device can do for lava-flow.
struct DeviceCapabilities {
  DeviceIdentity identity;
  std::uint32_t index = 0;  ///< position in vkEnumeratePhysicalDevices
  vk::PhysicalDeviceType type = vk::PhysicalDeviceType::eOther;
  std::string driver_name;
  std::string driver_info;
  std::uint32_t api_version = 0;
  std::uint64_t device_local_bytes = 0;
  /// What this process may still allocate there (VK_EXT_memory_budget); 0 when unknown.
  std::uint64_t device_local_budget = 0;
  /// "dddd:bb:dd.f" (VK_EXT_pci_bus_info); empty for devices without one (lavapipe).
  std::string pci_address;
  bool memory_fd_export = false;    ///< opaque-fd export of buffer memory
  bool memory_fd_import = false;    ///< opaque-fd import of buffer memory
  bool memory_host_import = false;  ///< VK_EXT_external_memory_host
  std::uint64_t host_import_alignment = 0;
  bool semaphore_fd_export = false;  ///< binary semaphore, opaque fd
  bool semaphore_fd_import = false;
  bool timeline_semaphore = false;  ///< feature present
  bool timeline_fd_export = false;  ///< timeline semaphore exportable as opaque fd
  bool fence_fd_export = false;
  std::vector<std::string> extensions;  ///< lava-flow-relevant extensions the device has
};

[[nodiscard]] std::string device_type_name(vk::PhysicalDeviceType t);

/// Lists the Vulkan devices of this machine with their capabilities (creates a temporary instance).
[[nodiscard]] Result<std::vector<DeviceCapabilities>> enumerate_devices();

/// How to pick a physical device.
struct PickBest {};  ///< discrete > integrated > virtual > CPU, first of its kind
using DeviceSelector = std::variant<PickBest, std::uint32_t /*index*/, Uuid /*device UUID*/>;

struct VulkanContextOptions {
  DeviceSelector device = PickBest{};
  std::string application_name = "lavaflow";
};

/// A user's Vulkan objects that lava-flow uses but never destroys. The user keeps them alive
/// for the lifetime of the context and of every buffer made from it. They must come from the
/// system Vulkan loader (libvulkan.so.1); `enabled_extensions` lists what the device was created
/// with, and the queue family must have one queue at index 0.
struct BorrowedVulkan {
  VkInstance instance = VK_NULL_HANDLE;
  VkPhysicalDevice physical_device = VK_NULL_HANDLE;
  VkDevice device = VK_NULL_HANDLE;
  std::uint32_t queue_family = 0;
  std::vector<std::string> enabled_extensions;
  bool timeline_semaphore_enabled = false;
};

class VulkanContext;
namespace detail {
struct VulkanState;
/// The shared state that buffers keep alive (core's own sources only: vulkan_state.hpp).
const std::shared_ptr<const VulkanState>& state_of(const VulkanContext& ctx);
}  // namespace detail

class VulkanContext {
 public:
  /// Creates an instance and device of its own (and owns them).
  [[nodiscard]] static Result<VulkanContext> create(const VulkanContextOptions& options = {});
  /// Wraps a user's instance/device without owning them.
  [[nodiscard]] static Result<VulkanContext> wrap(const BorrowedVulkan& borrowed);

  [[nodiscard]] const vk::raii::Instance& instance() const;
  [[nodiscard]] const vk::raii::PhysicalDevice& physical_device() const;
  [[nodiscard]] const vk::raii::Device& device() const;
  [[nodiscard]] const vk::raii::Queue& queue() const;
  [[nodiscard]] std::uint32_t queue_family() const;
  [[nodiscard]] const DeviceCapabilities& capabilities() const;
  [[nodiscard]] bool owns_device() const;
  /// Whether `name` is enabled on the device.
  [[nodiscard]] bool has_extension(std::string_view name) const;

  /// First memory type in `type_bits` that has all of `required` flags.
  [[nodiscard]] Result<std::uint32_t> find_memory_type(std::uint32_t type_bits, vk::MemoryPropertyFlags required) const;

 private:
  friend const std::shared_ptr<const detail::VulkanState>& detail::state_of(const VulkanContext& ctx);
  explicit VulkanContext(std::shared_ptr<const detail::VulkanState> s) : state_(std::move(s)) {}
  std::shared_ptr<const detail::VulkanState> state_;
};

}  // namespace lavaflow
