// SPDX-License-Identifier: MIT
#include "lavaflow/core/accelerators.hpp"

#include <algorithm>
#include <fstream>

#include "device_type_rank.hpp"
#include "lavaflow/core/detail/format.hpp"

namespace lavaflow {

std::string_view to_string(Api api) noexcept {
  switch (api) {
    case Api::Vulkan:
      return "Vulkan";
    case Api::Cuda:
      return "CUDA";
    case Api::OpenCL:
      return "OpenCL";
    case Api::OpenGL:
      return "OpenGL";
  }
  return "unknown";
}

bool Accelerator::reachable_from(Api api) const {
  return std::ranges::any_of(apis, [&](const ApiDevice& d) { return d.api == api; });
}

int numa_node_of_pci(const std::string& pci_address) {
  // The address is one we formatted ourselves, but it names a path: accept only its own shape.
  if (pci_address.size() != 12 || !std::ranges::all_of(pci_address, [](char c) {
        return (c >= '0' && c <= '9') || (c >= 'a' && c <= 'f') || c == ':' || c == '.';
      }))
    return -1;
  std::ifstream in("/sys/bus/pci/devices/" + pci_address + "/numa_node");
  int node = -1;
  if (!(in >> node)) return -1;
  return node;
}

Accelerators Accelerators::from(std::vector<DeviceCapabilities> vulkan) {
  Accelerators a;
  for (auto& d : vulkan) {
    Accelerator acc;
    acc.uuid = d.identity.device_uuid;
    acc.name = d.identity.name;
    acc.type = d.type;
    acc.memory_bytes = d.device_local_bytes;
    acc.memory_budget_bytes = d.device_local_budget;
    acc.pci_address = d.pci_address;
    acc.numa_node = numa_node_of_pci(d.pci_address);
    acc.apis.push_back(
        {Api::Vulkan, d.identity.name, d.index,
         str_format("{} ({}), memory export {}, timeline export {}", device_type_name(d.type), d.driver_name,
                    d.memory_fd_export ? "yes" : "no", d.timeline_fd_export ? "yes" : "no")});
    acc.vulkan = std::move(d);
    a.list_.push_back(std::move(acc));
  }
  return a;
}

Result<Accelerators> Accelerators::discover() {
  LF_TRY(auto vulkan, enumerate_devices());
  return from(std::move(vulkan));
}

void Accelerators::add(ApiDevice device, std::optional<Uuid> uuid, std::uint64_t memory_bytes, std::string pci_address,
                       vk::PhysicalDeviceType type) {
  auto same = uuid ? std::ranges::find_if(list_, [&](const Accelerator& a) { return a.uuid == uuid; }) : list_.end();
  if (same == list_.end()) {
    Accelerator acc;
    acc.uuid = uuid;
    acc.name = device.name;
    acc.type = type;
    list_.push_back(std::move(acc));
    same = list_.end() - 1;
  }
  if (!same->memory_bytes) same->memory_bytes = memory_bytes;
  if (same->pci_address.empty() && !pci_address.empty()) {
    same->pci_address = std::move(pci_address);
    same->numa_node = numa_node_of_pci(same->pci_address);
  }
  if (same->type == vk::PhysicalDeviceType::eOther) same->type = type;
  same->apis.push_back(std::move(device));
}

std::string Accelerators::share(std::size_t a, std::size_t b) const {
  if (a >= list_.size() || b >= list_.size()) return {};
  const Accelerator &x = list_[a], &y = list_[b];
  if (a == b) {
    if (x.vulkan && x.vulkan->memory_fd_export && x.vulkan->memory_fd_import)
      return "the same device: opaque-fd memory across its APIs and processes";
    return x.apis.size() > 1 ? "the same device, but Vulkan cannot export memory here" : "";
  }
  if (x.vulkan && y.vulkan && x.vulkan->memory_host_import && y.vulkan->memory_host_import)
    return "host memory that both devices import (VK_EXT_external_memory_host)";
  if (x.type == vk::PhysicalDeviceType::eCpu && y.type == vk::PhysicalDeviceType::eCpu)
    return "host memory, used in place by both (CPU devices)";
  return {};
}

Result<const Accelerator*> Accelerators::best(const AcceleratorNeeds& needs) const {
  const Accelerator* pick = nullptr;
  std::string why;
  for (const auto& a : list_) {
    std::string lacks;
    for (Api api : needs.apis)
      if (!a.reachable_from(api))
        lacks += str_format("{}not reachable from {}", lacks.empty() ? "" : ", ", to_string(api));
    if (needs.type && a.type != *needs.type)
      lacks += str_format("{}a {} device", lacks.empty() ? "" : ", ", device_type_name(a.type));
    if (a.memory_bytes < needs.min_memory_bytes)
      lacks +=
          str_format("{}{} bytes of memory, not {}", lacks.empty() ? "" : ", ", a.memory_bytes, needs.min_memory_bytes);
    if (needs.memory_export && !(a.vulkan && a.vulkan->memory_fd_export))
      lacks += str_format("{}no exportable memory", lacks.empty() ? "" : ", ");
    if (needs.shared_timeline && !(a.vulkan && a.vulkan->timeline_fd_export))
      lacks += str_format("{}no exportable timeline semaphores", lacks.empty() ? "" : ", ");
    if (!lacks.empty()) {
      why += str_format("{}{}: {}", why.empty() ? "" : "; ", a.name, lacks);
      continue;
    }
    if (!pick || detail::device_type_rank(a.type) < detail::device_type_rank(pick->type) ||
        (detail::device_type_rank(a.type) == detail::device_type_rank(pick->type) &&
         a.memory_bytes > pick->memory_bytes))
      pick = &a;
  }
  if (!pick)
    return fail(Errc::NotFound, "Accelerators::best",
                list_.empty() ? std::string("no accelerator on this machine") : why);
  return pick;
}

}  // namespace lavaflow
