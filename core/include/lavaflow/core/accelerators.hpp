// SPDX-License-Identifier: MIT
#pragma once
/// @file
/// The accelerator manager: every device this machine's APIs can reach, matched by device UUID
/// into one list of physical accelerators, with memory, budget, PCI address and NUMA node, which
/// APIs reach each one, and which can share memory with which. Core lists what Vulkan sees; each
/// adapter adds what its API sees (`lavaflow::cuda::add_devices`, `lavaflow::cl::add_devices`,
/// `lavaflow::gl::add_devices`), so core links no other API.

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "lavaflow/core/vulkan_context.hpp"

namespace lavaflow {

enum class Api : std::uint8_t { Vulkan, Cuda, OpenCL, OpenGL };
[[nodiscard]] std::string_view to_string(Api api) noexcept;

/// One API's view of an accelerator.
struct ApiDevice {
  Api api = Api::Vulkan;
  std::string name;
  std::uint32_t index = 0;  ///< Vulkan physical-device index, CUDA ordinal, OpenCL device position
  std::string detail;       ///< capabilities in words
};

struct Accelerator {
  std::optional<Uuid> uuid;  ///< the device UUID, when an API reports one
  std::string name;
  vk::PhysicalDeviceType type = vk::PhysicalDeviceType::eOther;
  std::uint64_t memory_bytes = 0;
  std::uint64_t memory_budget_bytes = 0;  ///< 0 when no API says
  std::string pci_address;                ///< "dddd:bb:dd.f", empty when none
  int numa_node = -1;                     ///< from sysfs for the PCI address; -1 when unknown
  std::vector<ApiDevice> apis;
  std::optional<DeviceCapabilities> vulkan;  ///< when Vulkan reaches it

  [[nodiscard]] bool reachable_from(Api api) const;
};

/// What a caller needs of an accelerator (best()).
struct AcceleratorNeeds {
  std::vector<Api> apis;                       ///< every one must reach it
  std::optional<vk::PhysicalDeviceType> type;  ///< exactly this kind
  std::uint64_t min_memory_bytes = 0;
  bool memory_export = false;    ///< exportable memory (opaque fd, through Vulkan)
  bool shared_timeline = false;  ///< exportable timeline semaphores
};

class Accelerators {
 public:
  /// The Vulkan devices of this machine (a temporary instance), each with its PCI address and
  /// NUMA node where it has them.
  [[nodiscard]] static Result<Accelerators> discover();
  /// From a list the caller already has (tests, or a context's own capabilities).
  [[nodiscard]] static Accelerators from(std::vector<DeviceCapabilities> vulkan);

  /// Adds what another API reports: merged into the accelerator with the same UUID (which takes
  /// its memory size and PCI address if it had none), else a new accelerator.
  void add(ApiDevice device, std::optional<Uuid> uuid, std::uint64_t memory_bytes = 0, std::string pci_address = {},
           vk::PhysicalDeviceType type = vk::PhysicalDeviceType::eOther);
  [[nodiscard]] const std::vector<Accelerator>& list() const { return list_; }

  /// How memory of accelerator `a` reaches accelerator `b` (indices into list()), in words; empty
  /// when it cannot.
  [[nodiscard]] std::string share(std::size_t a, std::size_t b) const;

  /// The best accelerator meeting `needs` (discrete > integrated > virtual > CPU, then more
  /// memory); NotFound naming, for each accelerator, what it lacks.
  [[nodiscard]] Result<const Accelerator*> best(const AcceleratorNeeds& needs) const;

 private:
  std::vector<Accelerator> list_;
};

/// The NUMA node sysfs gives for a PCI address ("dddd:bb:dd.f"); -1 when unknown.
[[nodiscard]] int numa_node_of_pci(const std::string& pci_address);

}  // namespace lavaflow
