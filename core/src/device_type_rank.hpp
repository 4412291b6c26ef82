// SPDX-License-Identifier: MIT
#pragma once
// The preference among Vulkan device types, shared by VulkanContext's PickBest and
// Accelerators::best(): discrete > integrated > virtual > CPU > other (lower is better).
#include <vulkan/vulkan.hpp>

namespace lavaflow::detail {

inline int device_type_rank(vk::PhysicalDeviceType t) {
  switch (t) {
    case vk::PhysicalDeviceType::eDiscreteGpu:
      return 0;
    case vk::PhysicalDeviceType::eIntegratedGpu:
      return 1;
    case vk::PhysicalDeviceType::eVirtualGpu:
      return 2;
    case vk::PhysicalDeviceType::eCpu:
      return 3;
    default:
      return 4;
  }
}

}  // namespace lavaflow::detail
