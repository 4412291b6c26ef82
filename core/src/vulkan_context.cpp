// SPDX-License-Identifier: MIT
#include "lavaflow/core/vulkan_context.hpp"

#include <algorithm>
#include <cstring>

#include "device_type_rank.hpp"
#include "lavaflow/core/detail/format.hpp"
#include "lavaflow/core/detail/vk_call.hpp"
#include "vulkan_state.hpp"

namespace lavaflow {

const std::shared_ptr<const detail::VulkanState>& detail::state_of(const VulkanContext& ctx) { return ctx.state_; }
namespace {

constexpr const char* kWantedExtensions[] = {
    VK_KHR_EXTERNAL_MEMORY_FD_EXTENSION_NAME,
    VK_KHR_EXTERNAL_SEMAPHORE_FD_EXTENSION_NAME,
    VK_KHR_EXTERNAL_FENCE_FD_EXTENSION_NAME,
    VK_EXT_EXTERNAL_MEMORY_HOST_EXTENSION_NAME,
};

constexpr std::uint32_t kMinDeviceApi = VK_API_VERSION_1_2;

vk::raii::Instance make_instance(const vk::raii::Context& context, const std::string& app_name) {
  vk::ApplicationInfo app(app_name.c_str(), 1, "lavaflow", 1, VK_API_VERSION_1_3);
  vk::InstanceCreateInfo info({}, &app);
  return vk::raii::Instance(context, info);
}

bool contains(const std::vector<std::string>& v, std::string_view s) {
  return std::find(v.begin(), v.end(), s) != v.end();
}

DeviceCapabilities query_capabilities(const vk::raii::PhysicalDevice& pd, std::uint32_t index) {
  DeviceCapabilities c;
  c.index = index;
  for (const auto& e : pd.enumerateDeviceExtensionProperties()) {
    for (const char* want : kWantedExtensions)
      if (std::strcmp(e.extensionName, want) == 0) c.extensions.emplace_back(want);
  }
  const bool host_ext = contains(c.extensions, VK_EXT_EXTERNAL_MEMORY_HOST_EXTENSION_NAME);
  const bool mem_fd = contains(c.extensions, VK_KHR_EXTERNAL_MEMORY_FD_EXTENSION_NAME);
  const bool sem_fd = contains(c.extensions, VK_KHR_EXTERNAL_SEMAPHORE_FD_EXTENSION_NAME);
  const bool fence_fd = contains(c.extensions, VK_KHR_EXTERNAL_FENCE_FD_EXTENSION_NAME);

  const auto base = pd.getProperties();
  c.api_version = base.apiVersion;
  c.type = base.deviceType;
  c.identity.name = base.deviceName.data();
  if (c.api_version < kMinDeviceApi) return c;  // too old to query the rest; unusable for lava-flow

  auto chain = pd.getProperties2<vk::PhysicalDeviceProperties2, vk::PhysicalDeviceIDProperties,
                                 vk::PhysicalDeviceDriverProperties>();
  const auto& id = chain.get<vk::PhysicalDeviceIDProperties>();
  std::copy(id.deviceUUID.begin(), id.deviceUUID.end(), c.identity.device_uuid.begin());
  std::copy(id.driverUUID.begin(), id.driverUUID.end(), c.identity.driver_uuid.begin());
  const auto& drv = chain.get<vk::PhysicalDeviceDriverProperties>();
  c.driver_name = drv.driverName.data();
  c.driver_info = drv.driverInfo.data();
  if (host_ext) {
    auto hp = pd.getProperties2<vk::PhysicalDeviceProperties2, vk::PhysicalDeviceExternalMemoryHostPropertiesEXT>();
    c.host_import_alignment =
        hp.get<vk::PhysicalDeviceExternalMemoryHostPropertiesEXT>().minImportedHostPointerAlignment;
    c.memory_host_import = true;
  }
  const auto mem = pd.getMemoryProperties();
  for (std::uint32_t i = 0; i < mem.memoryHeapCount; ++i)
    if (mem.memoryHeaps[i].flags & vk::MemoryHeapFlagBits::eDeviceLocal)
      c.device_local_bytes += mem.memoryHeaps[i].size;
  // Query-only extensions: the device need not enable them for the physical device to answer.
  bool pci = false, budget = false;
  for (const auto& e : pd.enumerateDeviceExtensionProperties()) {
    pci = pci || std::strcmp(e.extensionName, VK_EXT_PCI_BUS_INFO_EXTENSION_NAME) == 0;
    budget = budget || std::strcmp(e.extensionName, VK_EXT_MEMORY_BUDGET_EXTENSION_NAME) == 0;
  }
  if (pci) {
    const auto b = pd.getProperties2<vk::PhysicalDeviceProperties2, vk::PhysicalDevicePCIBusInfoPropertiesEXT>()
                       .get<vk::PhysicalDevicePCIBusInfoPropertiesEXT>();
    c.pci_address = str_format("{:04x}:{:02x}:{:02x}.{:x}", b.pciDomain, b.pciBus, b.pciDevice, b.pciFunction);
  }
  if (budget) {
    const auto m =
        pd.getMemoryProperties2<vk::PhysicalDeviceMemoryProperties2, vk::PhysicalDeviceMemoryBudgetPropertiesEXT>();
    const auto& heaps = m.get<vk::PhysicalDeviceMemoryProperties2>().memoryProperties;
    const auto& b = m.get<vk::PhysicalDeviceMemoryBudgetPropertiesEXT>();
    for (std::uint32_t i = 0; i < heaps.memoryHeapCount; ++i)
      if (heaps.memoryHeaps[i].flags & vk::MemoryHeapFlagBits::eDeviceLocal) c.device_local_budget += b.heapBudget[i];
  }

  if (mem_fd) {
    vk::PhysicalDeviceExternalBufferInfo bi({},
                                            vk::BufferUsageFlagBits::eStorageBuffer |
                                                vk::BufferUsageFlagBits::eTransferSrc |
                                                vk::BufferUsageFlagBits::eTransferDst,
                                            vk::ExternalMemoryHandleTypeFlagBits::eOpaqueFd);
    const auto f = pd.getExternalBufferProperties(bi).externalMemoryProperties.externalMemoryFeatures;
    c.memory_fd_export = bool(f & vk::ExternalMemoryFeatureFlagBits::eExportable);
    c.memory_fd_import = bool(f & vk::ExternalMemoryFeatureFlagBits::eImportable);
  }
  auto features = pd.getFeatures2<vk::PhysicalDeviceFeatures2, vk::PhysicalDeviceVulkan12Features>();
  c.timeline_semaphore = features.get<vk::PhysicalDeviceVulkan12Features>().timelineSemaphore;
  if (sem_fd) {
    vk::PhysicalDeviceExternalSemaphoreInfo si(vk::ExternalSemaphoreHandleTypeFlagBits::eOpaqueFd);
    const auto f = pd.getExternalSemaphoreProperties(si).externalSemaphoreFeatures;
    c.semaphore_fd_export = bool(f & vk::ExternalSemaphoreFeatureFlagBits::eExportable);
    c.semaphore_fd_import = bool(f & vk::ExternalSemaphoreFeatureFlagBits::eImportable);
    if (c.timeline_semaphore) {
      vk::SemaphoreTypeCreateInfo type(vk::SemaphoreType::eTimeline, 0);
      si.pNext = &type;
      const auto tf = pd.getExternalSemaphoreProperties(si).externalSemaphoreFeatures;
      c.timeline_fd_export = bool(tf & vk::ExternalSemaphoreFeatureFlagBits::eExportable);
    }
  }
  if (fence_fd) {
    vk::PhysicalDeviceExternalFenceInfo fi(vk::ExternalFenceHandleTypeFlagBits::eOpaqueFd);
    c.fence_fd_export =
        bool(pd.getExternalFenceProperties(fi).externalFenceFeatures & vk::ExternalFenceFeatureFlagBits::eExportable);
  }
  return c;
}

Result<std::uint32_t> pick_device(const std::vector<DeviceCapabilities>& devs, const DeviceSelector& sel) {
  const char* call = "VulkanContext::create";
  if (devs.empty()) return fail(Errc::NotFound, call, "no Vulkan physical device (is a Vulkan driver installed?)");
  auto usable = [](const DeviceCapabilities& d) { return d.api_version >= kMinDeviceApi; };
  if (const auto* idx = std::get_if<std::uint32_t>(&sel)) {
    if (*idx >= devs.size())
      return fail(Errc::NotFound, call, str_format("device index {} out of range ({} devices)", *idx, devs.size()));
    if (!usable(devs[*idx]))
      return fail(
          Errc::Unsupported, call,
          str_format("device {} ({}) supports only Vulkan {}.{}; lava-flow needs 1.2", *idx, devs[*idx].identity.name,
                     VK_API_VERSION_MAJOR(devs[*idx].api_version), VK_API_VERSION_MINOR(devs[*idx].api_version)));
    return *idx;
  }
  if (const auto* uuid = std::get_if<Uuid>(&sel)) {
    for (const auto& d : devs)
      if (usable(d) && d.identity.device_uuid == *uuid) return d.index;
    return fail(Errc::NotFound, call, "no Vulkan device with UUID " + to_string(*uuid));
  }
  const DeviceCapabilities* best = nullptr;
  for (const auto& d : devs)
    if (usable(d) && (!best || detail::device_type_rank(d.type) < detail::device_type_rank(best->type))) best = &d;
  if (!best) return fail(Errc::Unsupported, call, "no Vulkan 1.2 device found");
  return best->index;
}

std::uint32_t pick_queue_family(const vk::raii::PhysicalDevice& pd) {
  const auto families = pd.getQueueFamilyProperties();
  for (std::uint32_t i = 0; i < families.size(); ++i)
    if (families[i].queueFlags & vk::QueueFlagBits::eCompute) return i;
  return 0;
}

}  // namespace

std::string device_type_name(vk::PhysicalDeviceType t) {
  switch (t) {
    case vk::PhysicalDeviceType::eDiscreteGpu:
      return "discrete GPU";
    case vk::PhysicalDeviceType::eIntegratedGpu:
      return "integrated GPU";
    case vk::PhysicalDeviceType::eVirtualGpu:
      return "virtual GPU";
    case vk::PhysicalDeviceType::eCpu:
      return "CPU";
    default:
      return "other";
  }
}

Result<std::vector<DeviceCapabilities>> enumerate_devices() {
  return detail::vk_call("enumerate_devices", [] {
    vk::raii::Context context;
    auto instance = make_instance(context, "lavaflow-enumerate");
    std::vector<DeviceCapabilities> out;
    std::uint32_t i = 0;
    for (const auto& pd : vk::raii::PhysicalDevices(instance)) out.push_back(query_capabilities(pd, i++));
    return out;
  });
}

Result<VulkanContext> VulkanContext::create(const VulkanContextOptions& options) {
  return detail::vk_call("VulkanContext::create", [&]() -> Result<VulkanContext> {
    vk::raii::Context context;
    auto instance = make_instance(context, options.application_name);
    vk::raii::PhysicalDevices pds(instance);
    std::vector<DeviceCapabilities> caps;
    for (std::uint32_t i = 0; i < pds.size(); ++i) caps.push_back(query_capabilities(pds[i], i));
    LF_TRY(const std::uint32_t index, pick_device(caps, options.device));
    vk::raii::PhysicalDevice physical = std::move(pds[index]);

    const std::uint32_t family = pick_queue_family(physical);
    const float priority = 1.0f;
    vk::DeviceQueueCreateInfo queue_info({}, family, 1, &priority);
    std::vector<const char*> ext;
    for (const auto& e : caps[index].extensions) ext.push_back(e.c_str());
    vk::PhysicalDeviceVulkan12Features f12;
    f12.timelineSemaphore = caps[index].timeline_semaphore;
    vk::DeviceCreateInfo dinfo({}, queue_info, {}, ext, nullptr, &f12);
    vk::raii::Device device(physical, dinfo);
    vk::raii::Queue queue(device, family, 0);
    auto memory = physical.getMemoryProperties();

    auto state = std::make_shared<detail::VulkanState>(
        detail::VulkanState{std::move(context), std::move(instance), std::move(physical), std::move(device),
                            std::move(queue), family, caps[index], caps[index].extensions, memory});
    return VulkanContext(std::move(state));
  });
}

Result<VulkanContext> VulkanContext::wrap(const BorrowedVulkan& b) {
  if (!b.instance || !b.physical_device || !b.device)
    return fail(Errc::InvalidArgument, "VulkanContext::wrap", "instance, physical_device and device are all required");
  return detail::vk_call("VulkanContext::wrap", [&]() -> Result<VulkanContext> {
    vk::raii::Context context;
    vk::raii::Instance instance(context, b.instance);
    vk::raii::PhysicalDevice physical(instance, b.physical_device);
    std::uint32_t index = 0;
    for (const auto& pd : vk::raii::PhysicalDevices(instance)) {
      if (static_cast<VkPhysicalDevice>(*pd) == b.physical_device) break;
      ++index;
    }
    DeviceCapabilities caps = query_capabilities(physical, index);
    if (caps.api_version < kMinDeviceApi)
      return fail(Errc::Unsupported, "VulkanContext::wrap", "device supports less than Vulkan 1.2");
    // Only what the user enabled counts.
    std::erase_if(caps.extensions, [&](const std::string& e) { return !contains(b.enabled_extensions, e); });
    if (!contains(caps.extensions, VK_KHR_EXTERNAL_MEMORY_FD_EXTENSION_NAME))
      caps.memory_fd_export = caps.memory_fd_import = false;
    if (!contains(caps.extensions, VK_KHR_EXTERNAL_SEMAPHORE_FD_EXTENSION_NAME))
      caps.semaphore_fd_export = caps.semaphore_fd_import = caps.timeline_fd_export = false;
    if (!contains(caps.extensions, VK_EXT_EXTERNAL_MEMORY_HOST_EXTENSION_NAME)) caps.memory_host_import = false;
    if (!contains(caps.extensions, VK_KHR_EXTERNAL_FENCE_FD_EXTENSION_NAME)) caps.fence_fd_export = false;
    caps.timeline_semaphore = caps.timeline_semaphore && b.timeline_semaphore_enabled;
    caps.timeline_fd_export = caps.timeline_fd_export && caps.timeline_semaphore;
    vk::raii::Device device(physical, b.device);
    vk::raii::Queue queue(device, b.queue_family, 0);
    auto memory = physical.getMemoryProperties();
    auto enabled = caps.extensions;
    auto state = std::make_shared<detail::VulkanState>(
        detail::VulkanState{std::move(context), detail::Borrowed<vk::raii::Instance>(std::move(instance)),
                            std::move(physical), detail::Borrowed<vk::raii::Device>(std::move(device)),
                            std::move(queue), b.queue_family, std::move(caps), std::move(enabled), memory});
    return VulkanContext(std::move(state));
  });
}

const vk::raii::Instance& VulkanContext::instance() const { return detail::get(state_->instance); }
const vk::raii::PhysicalDevice& VulkanContext::physical_device() const { return state_->physical; }
const vk::raii::Device& VulkanContext::device() const { return detail::get(state_->device); }
const vk::raii::Queue& VulkanContext::queue() const { return state_->queue; }
std::uint32_t VulkanContext::queue_family() const { return state_->queue_family; }
const DeviceCapabilities& VulkanContext::capabilities() const { return state_->caps; }
bool VulkanContext::owns_device() const { return std::holds_alternative<vk::raii::Device>(state_->device); }
bool VulkanContext::has_extension(std::string_view name) const { return contains(state_->enabled, name); }

Result<std::uint32_t> VulkanContext::find_memory_type(std::uint32_t type_bits, vk::MemoryPropertyFlags required) const {
  const auto& mem = state_->memory;
  for (std::uint32_t i = 0; i < mem.memoryTypeCount; ++i)
    if ((type_bits & (1u << i)) && (mem.memoryTypes[i].propertyFlags & required) == required) return i;
  return fail(Errc::Unsupported, "VulkanContext::find_memory_type",
              str_format("no memory type in mask {:#x} with flags {}", type_bits, vk::to_string(required)));
}

}  // namespace lavaflow
