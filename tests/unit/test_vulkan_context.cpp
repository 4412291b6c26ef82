// SPDX-License-Identifier: MIT
#include "support.hpp"

using namespace lavaflow;

TEST_CASE("enumerate_devices reports identities and external-memory capabilities") {
  auto devs = enumerate_devices();
  if (!devs || devs->empty()) lftest::skip("no Vulkan device");
  for (const auto& d : *devs) {
    INFO(d.identity.name);
    CHECK_FALSE(d.identity.name.empty());
    if (d.api_version >= VK_API_VERSION_1_2) CHECK(d.identity.device_uuid != Uuid{});
  }
}

TEST_CASE("two independent contexts in one process") {
  auto a = lftest::context_or_skip();
  auto b = lftest::context_or_skip();
  CHECK(*a.device() != *b.device());
  CHECK(a.capabilities().identity == b.capabilities().identity);
  CHECK(a.owns_device());
  CHECK(a.has_extension(VK_KHR_EXTERNAL_MEMORY_FD_EXTENSION_NAME) == a.capabilities().memory_fd_export);
}

TEST_CASE("device selection by index and by UUID, and bad selectors are clear errors") {
  auto best = lftest::context_or_skip();
  const auto& caps = best.capabilities();
  auto by_index = lftest::ok(VulkanContext::create({.device = caps.index}));
  CHECK(by_index.capabilities().identity == caps.identity);
  auto by_uuid = lftest::ok(VulkanContext::create({.device = caps.identity.device_uuid}));
  CHECK(by_uuid.capabilities().index == caps.index);

  auto e = lftest::err(VulkanContext::create({.device = std::uint32_t{999}}));
  CHECK(e.code() == Errc::NotFound);
  CHECK(e.cause().find("999") != std::string::npos);
  Uuid nobody{};
  nobody.fill(0xEE);
  CHECK(lftest::err(VulkanContext::create({.device = nobody})).code() == Errc::NotFound);
}

TEST_CASE("wrapping a user's Vulkan objects never destroys them") {
  auto probe = lftest::context_or_skip();
  vk::raii::Context context;
  vk::ApplicationInfo app("user-app", 1, nullptr, 0, VK_API_VERSION_1_3);
  vk::raii::Instance instance(context, vk::InstanceCreateInfo({}, &app));
  vk::raii::PhysicalDevices pds(instance);
  auto& pd = pds[probe.capabilities().index];
  float prio = 1.0f;
  vk::DeviceQueueCreateInfo q({}, probe.queue_family(), 1, &prio);
  std::vector<const char*> ext{VK_KHR_EXTERNAL_MEMORY_FD_EXTENSION_NAME};
  vk::raii::Device device(pd, vk::DeviceCreateInfo({}, q, {}, ext));

  {
    BorrowedVulkan b{*instance, *pd, *device, probe.queue_family(), {VK_KHR_EXTERNAL_MEMORY_FD_EXTENSION_NAME}, false};
    auto ctx = lftest::ok(VulkanContext::wrap(b));
    CHECK_FALSE(ctx.owns_device());
    CHECK(ctx.capabilities().memory_fd_export);
    CHECK_FALSE(ctx.capabilities().semaphore_fd_export);  // not enabled by the user
    auto buf = lftest::ok(GpuBuffer::allocate(ctx, {.size = 4096}));
    CHECK(buf.size() == 4096);
  }
  // The user's device is still alive and usable.
  vk::raii::Buffer after(device, vk::BufferCreateInfo({}, 64, vk::BufferUsageFlagBits::eTransferDst));
  CHECK(*after);
  CHECK(lftest::err(VulkanContext::wrap(BorrowedVulkan{})).code() == Errc::InvalidArgument);
}
