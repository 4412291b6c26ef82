// SPDX-License-Identifier: MIT
// UnifiedBuffer on the CPU tier (lavapipe): one memory when device-local memory is host-visible,
// else lazy GPU copies in each direction ordered by the buffer's timeline, and device work that
// waits and signals on it.
#include <catch2/catch.hpp>
#include <cstring>

#include "lavaflow/lavaflow.hpp"
#include "support.hpp"

using namespace lavaflow;
using namespace std::chrono_literals;

namespace {

/// GPU work on the device side: fills the range with `word`, waiting and signalling as the access says.
void gpu_fill(const VulkanContext& ctx, const DeviceAccess& a, std::uint32_t word) {
  const auto& dev = ctx.device();
  vk::raii::CommandPool pool(dev, {vk::CommandPoolCreateFlagBits::eTransient, ctx.queue_family()});
  vk::raii::CommandBuffers cbs(dev, {*pool, vk::CommandBufferLevel::ePrimary, 1});
  cbs[0].begin({vk::CommandBufferUsageFlagBits::eOneTimeSubmit});
  cbs[0].fillBuffer(a.buffer, a.offset, a.size, word);
  cbs[0].end();
  const vk::Semaphore wait = a.wait.semaphore, signal = a.signal.semaphore;
  const vk::PipelineStageFlags stage = vk::PipelineStageFlagBits::eAllCommands;
  const vk::TimelineSemaphoreSubmitInfo values(a.wait.value, a.signal.value);
  const vk::CommandBuffer raw = *cbs[0];
  ctx.queue().submit(vk::SubmitInfo(wait, stage, raw, signal, &values));
  // The command buffer must outlive the work: wait for the signal before it goes.
  REQUIRE(dev.waitSemaphores(vk::SemaphoreWaitInfo({}, signal, a.signal.value), 5'000'000'000) == vk::Result::eSuccess);
}

/// GPU work that reads the device side: copies it into a host-visible buffer.
std::vector<std::uint32_t> gpu_read(const VulkanContext& ctx, const DeviceAccess& a) {
  auto out = lftest::ok(GpuBuffer::allocate(ctx, {.size = a.size, .memory = GpuMemory::HostVisible}));
  const auto& dev = ctx.device();
  vk::raii::CommandPool pool(dev, {vk::CommandPoolCreateFlagBits::eTransient, ctx.queue_family()});
  vk::raii::CommandBuffers cbs(dev, {*pool, vk::CommandBufferLevel::ePrimary, 1});
  cbs[0].begin({vk::CommandBufferUsageFlagBits::eOneTimeSubmit});
  cbs[0].copyBuffer(a.buffer, out.buffer(), vk::BufferCopy(a.offset, 0, a.size));
  cbs[0].end();
  const vk::Semaphore wait = a.wait.semaphore, signal = a.signal.semaphore;
  const vk::PipelineStageFlags stage = vk::PipelineStageFlagBits::eAllCommands;
  const vk::TimelineSemaphoreSubmitInfo values(a.wait.value, a.signal.value);
  const vk::CommandBuffer raw = *cbs[0];
  ctx.queue().submit(vk::SubmitInfo(wait, stage, raw, signal, &values));
  REQUIRE(dev.waitSemaphores(vk::SemaphoreWaitInfo({}, signal, a.signal.value), 5'000'000'000) == vk::Result::eSuccess);
  std::vector<std::uint32_t> words(a.size / 4);
  std::memcpy(words.data(), out.host_ptr(), a.size);
  return words;
}

}  // namespace

TEST_CASE("unified buffer: separate sides move lazily, once per change, in both directions") {
  auto ctx = lftest::context_or_skip();
  const bool pooled = GENERATE(false, true);
  std::optional<MemoryPool> pool;
  if (pooled) pool.emplace(lftest::ok(MemoryPool::create({.vulkan = ctx})));
  auto u = lftest::ok(UnifiedBuffer<std::uint32_t>::create(
      ctx, 4096, {.pool = pool ? &*pool : nullptr, .share_when_host_visible = false}));
  auto& b = u.bytes();
  CHECK_FALSE(b.shared());

  auto h = lftest::ok(u.host(Access::Write));
  for (std::uint32_t i = 0; i < h.size(); ++i) h[i] = i * 3;
  CHECK(b.newest() == Newest::Host);

  // The device reads: one upload, and none for a second read.
  auto first = lftest::ok(u.device(Access::Read));
  const auto seen = gpu_read(ctx, first);
  CHECK(seen[4095] == 4095 * 3);
  CHECK(b.uploads() == 1);
  CHECK(gpu_read(ctx, lftest::ok(u.device(Access::Read)))[7] == 21);
  CHECK(b.uploads() == 1);
  CHECK(b.newest() == Newest::Both);

  // The device writes: the host reads it after one download; reading again moves nothing.
  gpu_fill(ctx, lftest::ok(u.device(Access::Write)), 0xabcd1234);
  CHECK(b.newest() == Newest::Device);
  CHECK(lftest::ok(u.host(Access::Read))[100] == 0xabcd1234u);
  CHECK(lftest::ok(u.host(Access::Read))[4095] == 0xabcd1234u);
  CHECK(b.downloads() == 1);
  CHECK(b.writes() == 2);  // the host's first write and the device's; reads count nothing

  // Explicit moves are no-ops when the side is current, and count when they move.
  lftest::ok(b.to_host());
  lftest::ok(b.to_device());
  CHECK((b.uploads() == 1 && b.downloads() == 1));
  lftest::ok(u.host(Access::Write))[0] = 7;
  lftest::ok(b.to_device());  // queued ahead of the device access
  CHECK(b.uploads() == 2);
  CHECK(gpu_read(ctx, lftest::ok(u.device(Access::Read)))[0] == 7);
  CHECK(b.uploads() == 2);
  lftest::ok(b.synchronize());
}

TEST_CASE("unified buffer: one memory where device-local memory is host-visible, nothing moves") {
  auto ctx = lftest::context_or_skip();
  auto u = lftest::ok(UnifiedBuffer<float>::create(ctx, 1000));
  if (!u.bytes().shared())
    lftest::skip("device-local memory is not host-visible on " + ctx.capabilities().identity.name);
  lftest::ok(u.host(Access::Write))[999] = 2.5f;
  auto a = lftest::ok(u.device());
  CHECK(gpu_read(ctx, a)[999] == std::bit_cast<std::uint32_t>(2.5f));
  gpu_fill(ctx, lftest::ok(u.device(Access::Write)), std::bit_cast<std::uint32_t>(-1.0f));
  CHECK(lftest::ok(u.host(Access::Read))[0] == -1.0f);
  CHECK((u.bytes().uploads() == 0 && u.bytes().downloads() == 0));
}

TEST_CASE("unified buffer: device work that never signals is a bounded, named timeout, and a host signal ends it") {
  auto ctx = lftest::context_or_skip();
  auto u = lftest::ok(UnifiedBytes::create(ctx, 256, {.share_when_host_visible = false, .timeout = 100ms}));
  const auto a = lftest::ok(u.device(Access::Write));  // promised, never submitted
  const auto e = lftest::err(u.host(Access::Read));
  CHECK(e.code() == Errc::Timeout);
  CHECK_THAT(e.message(), Catch::Contains("promised to signal"));
  CHECK(u.downloads() == 0);  // nothing left queued behind the signal that never came
  lftest::ok(u.signal(a));    // finished some other way
  lftest::ok(u.host(Access::Read));
  CHECK(u.downloads() == 1);
  CHECK(lftest::err(u.signal(DeviceAccess{})).code() == Errc::InvalidArgument);
  CHECK(lftest::err(UnifiedBytes::create(ctx, 0)).code() == Errc::InvalidArgument);
  CHECK(lftest::err(UnifiedBuffer<double>::create(ctx, SIZE_MAX / 4)).code() == Errc::InvalidArgument);
}
