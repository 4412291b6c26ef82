// SPDX-License-Identifier: MIT
// The accelerator manager on the CPU tier: lavapipe as Vulkan sees it, devices of other APIs
// merged by UUID, sharing between accelerators, and best() with what each one lacks.
#include <catch2/catch.hpp>

#include "lavaflow/lavaflow.hpp"
#include "support.hpp"

using namespace lavaflow;

TEST_CASE("accelerators: Vulkan's devices, other APIs merged by UUID, best() names what each lacks") {
  auto acc = Accelerators::discover();
  if (!acc || acc->list().empty())
    lftest::skip("no Vulkan device: " + (acc ? std::string("none") : acc.error().message()));
  const Accelerator first = acc->list().front();  // a copy: add() may move the list
  REQUIRE(first.uuid.has_value());
  REQUIRE(first.reachable_from(Api::Vulkan));
  REQUIRE_FALSE(first.reachable_from(Api::Cuda));
  REQUIRE(first.vulkan.has_value());
  REQUIRE(first.memory_bytes > 0);
  if (first.pci_address.empty()) REQUIRE(first.numa_node == -1);  // lavapipe has no PCI address

  // Another API's view of the same device joins it; an unknown UUID is a new accelerator.
  const auto before = acc->list().size();
  acc->add({Api::OpenCL, "same device through OpenCL", 0, ""}, *first.uuid, 123);
  REQUIRE(acc->list().size() == before);
  REQUIRE(acc->list().front().reachable_from(Api::OpenCL));
  REQUIRE(acc->list().front().memory_bytes == first.memory_bytes);  // Vulkan's figure stays
  Uuid other{};
  other[0] = 0xee;
  acc->add({Api::Cuda, "a GPU only CUDA sees", 3, ""}, other, 1 << 30, "0000:65:00.0",
           vk::PhysicalDeviceType::eDiscreteGpu);
  REQUIRE(acc->list().size() == before + 1);
  const auto& gpu = acc->list().back();
  REQUIRE(gpu.type == vk::PhysicalDeviceType::eDiscreteGpu);
  REQUIRE(gpu.pci_address == "0000:65:00.0");

  // Sharing: one device with itself when Vulkan exports memory; two devices through host memory
  // only when both import it; nothing between a Vulkan device and one Vulkan does not reach.
  if (first.vulkan->memory_fd_export && first.vulkan->memory_fd_import)
    REQUIRE(acc->share(0, 0).find("same device") != std::string::npos);
  REQUIRE(acc->share(0, acc->list().size() - 1).empty());
  REQUIRE(acc->share(0, 99).empty());

  // best(): the discrete GPU ranks first when nothing more is asked...
  auto any = acc->best({});
  REQUIRE(any);
  REQUIRE((*any)->type == vk::PhysicalDeviceType::eDiscreteGpu);
  // ... but only Vulkan devices can export memory, and a need nobody meets names each one's gap.
  auto exporting = acc->best({.apis = {Api::Vulkan}, .memory_export = first.vulkan->memory_fd_export});
  REQUIRE(exporting);
  REQUIRE((*exporting)->reachable_from(Api::Vulkan));
  auto none = acc->best({.apis = {Api::Vulkan, Api::OpenGL}, .min_memory_bytes = std::uint64_t{1} << 60});
  REQUIRE_FALSE(none);
  REQUIRE(none.error().code() == Errc::NotFound);
  REQUIRE(none.error().message().find("not reachable from OpenGL") != std::string::npos);
  REQUIRE(none.error().message().find("bytes of memory") != std::string::npos);
}

TEST_CASE("accelerators: a PCI address is read from sysfs only in its own shape") {
  REQUIRE(numa_node_of_pci("../../../etc/passwd") == -1);
  REQUIRE(numa_node_of_pci("") == -1);
  REQUIRE(numa_node_of_pci("ffff:ff:1f.7") == -1);  // well formed, no such device
}
