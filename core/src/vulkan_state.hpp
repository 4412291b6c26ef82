// SPDX-License-Identifier: MIT
#pragma once
// Private: what a VulkanContext holds. Owned or borrowed objects are distinguished by type.
#include <variant>

#include "lavaflow/core/vulkan_context.hpp"

namespace lavaflow::detail {

/// A Vulkan-Hpp RAII object that refers to a handle somebody else owns: released, never destroyed.
template <class T>
class Borrowed {
 public:
  explicit Borrowed(T obj) : obj_(std::move(obj)) {}
  Borrowed(Borrowed&&) noexcept = default;
  Borrowed& operator=(Borrowed&&) noexcept = default;
  ~Borrowed() { (void)obj_.release(); }
  [[nodiscard]] const T& get() const { return obj_; }

 private:
  T obj_;
};

template <class T>
using Held = std::variant<T, Borrowed<T>>;

template <class T>
const T& get(const Held<T>& h) {
  if (const auto* owned = std::get_if<T>(&h)) return *owned;
  return std::get<Borrowed<T>>(h).get();
}

struct VulkanState {
  // Members die in reverse order: queue, device, physical device, instance, then the loader.
  vk::raii::Context context;
  Held<vk::raii::Instance> instance;
  vk::raii::PhysicalDevice physical;
  Held<vk::raii::Device> device;
  vk::raii::Queue queue;
  std::uint32_t queue_family = 0;
  DeviceCapabilities caps;
  std::vector<std::string> enabled;
  vk::PhysicalDeviceMemoryProperties memory;
};

}  // namespace lavaflow::detail
