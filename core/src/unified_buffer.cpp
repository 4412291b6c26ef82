// SPDX-License-Identifier: MIT
#include "lavaflow/core/unified_buffer.hpp"

#include <deque>
#include <optional>
#include <utility>

#include "lavaflow/core/detail/format.hpp"
#include "lavaflow/core/detail/vk_call.hpp"
#include "lavaflow/core/gpu_buffer.hpp"
#include "lavaflow/core/gpu_semaphore.hpp"
#include "lavaflow/core/pool.hpp"

namespace lavaflow {

namespace {

/// One side's memory: owned, or rented from a pool; the range the copies and the caller use.
struct Side {
  std::optional<GpuBuffer> owned;
  PooledBuffer rented;
  const Buffer& get() const {
    if (owned) return *owned;
    return rented;
  }
  vk::Buffer buffer;
  std::uint64_t offset = 0;
  std::byte* host = nullptr;
};

Result<Side> make_side(const VulkanContext& ctx, std::uint64_t bytes, GpuMemory memory, MemoryPool* pool) {
  Side s;
  if (pool) {
    LF_TRY(s.rented, pool->rent(bytes, memory == GpuMemory::DeviceLocal ? BufferKind::GpuDeviceLocal
                                                                        : BufferKind::GpuHostVisible));
    s.buffer = s.rented.gpu_buffer();
    s.offset = s.rented.gpu_offset();
    s.host = s.rented.host_ptr();
  } else {
    LF_TRY(auto b, GpuBuffer::allocate(ctx, {.size = bytes, .memory = memory}));
    s.owned.emplace(std::move(b));
    s.buffer = s.owned->buffer();
    s.host = s.owned->host_ptr();
  }
  return s;
}

}  // namespace

struct UnifiedBytes::Impl {
  VulkanContext ctx;
  std::uint64_t bytes = 0;
  UnifiedOptions options;
  Side device;
  std::optional<Side> host;  // none when both sides are the device memory
  // The timeline: exportable where the driver can (other APIs then order their work on it), else
  // a plain one. `timeline` is whichever exists.
  std::optional<GpuSemaphore> shareable;
  vk::raii::Semaphore own{nullptr};
  vk::Semaphore timeline;
  vk::raii::CommandPool commands{nullptr};
  // Copies still on the GPU, with the value that ends each: their command buffers live until then.
  std::deque<std::pair<std::uint64_t, vk::raii::CommandBuffer>> in_flight;
  std::uint64_t issued = 0;    // the highest value anything queued or promised will signal
  std::uint64_t promised = 0;  // the highest value a device access promised
  Newest newest = Newest::Both;
  std::uint64_t uploads = 0, downloads = 0, writes = 0;

  explicit Impl(VulkanContext c) : ctx(std::move(c)) {}

  UnifiedSync at(std::uint64_t value) const { return {timeline, value}; }

  std::uint64_t reached() const {
    std::uint64_t v = 0;
    const auto& dev = ctx.device();
    const auto r = dev.getDispatcher()->vkGetSemaphoreCounterValue(*dev, timeline, &v);
    if (r != VK_SUCCESS)
      throw vk::SystemError(vk::make_error_code(static_cast<vk::Result>(r)), "vkGetSemaphoreCounterValue");
    return v;
  }

  /// Waits on the host until the timeline reaches `value`.
  Status wait(std::uint64_t value, const char* call) const {
    return detail::vk_call(call, [&]() -> Status {
      const auto ns = static_cast<std::uint64_t>(std::chrono::nanoseconds(options.timeout).count());
      if (ctx.device().waitSemaphores(vk::SemaphoreWaitInfo({}, timeline, value), ns) == vk::Result::eTimeout) {
        // Name what holds it up: a device access whose promised signal never came, or a copy.
        const std::uint64_t now = reached();
        if (now < promised)
          return fail(Errc::Timeout, call,
                      str_format("device work that promised to signal {} has not (signal it, or UnifiedBytes::signal)",
                                 now + 1));
        return fail(Errc::Timeout, call, str_format("GPU copy ending at {} not done in time", value));
      }
      return {};
    });
  }

  /// Brings the device side's bytes to the host side and waits for them. The device work comes
  /// first, waited for on the host: a copy queued behind a signal that has not come would stay
  /// queued after a timeout, with its buffers, and some drivers serve such a wait by moving the
  /// whole queue to a submit thread.
  Status download(const char* call) {
    LF_TRY_STATUS(wait(issued, call));
    LF_TRY(const auto done, copy(false, call));
    LF_TRY_STATUS(wait(done, call));
    newest = Newest::Both;
    return {};
  }

  /// A write access was given out: `side` now holds the newest bytes where the sides are apart.
  void wrote(Newest side) {
    ++writes;
    if (host) newest = side;
  }

  /// Queues a copy between the sides after everything issued so far; returns its end value.
  Result<std::uint64_t> copy(bool to_device, const char* call) {
    const Side& src = to_device ? *host : device;
    const Side& dst = to_device ? device : *host;
    return detail::vk_call(call, [&]() -> Result<std::uint64_t> {
      const auto& dev = ctx.device();
      const std::uint64_t now = reached();
      while (!in_flight.empty() && in_flight.front().first <= now) in_flight.pop_front();
      vk::raii::CommandBuffers cbs(dev, {*commands, vk::CommandBufferLevel::ePrimary, 1});
      vk::raii::CommandBuffer cb = std::move(cbs[0]);
      cb.begin({vk::CommandBufferUsageFlagBits::eOneTimeSubmit});
      cb.copyBuffer(src.buffer, dst.buffer, vk::BufferCopy(src.offset, dst.offset, bytes));
      if (!to_device) {  // the host reads what the copy wrote
        const vk::MemoryBarrier to_host(vk::AccessFlagBits::eTransferWrite, vk::AccessFlagBits::eHostRead);
        cb.pipelineBarrier(vk::PipelineStageFlagBits::eTransfer, vk::PipelineStageFlagBits::eHost, {}, to_host, {}, {});
      }
      cb.end();
      const std::uint64_t wait_value = issued, signal_value = issued + 1;
      const vk::Semaphore s = timeline;
      const vk::PipelineStageFlags stage = vk::PipelineStageFlagBits::eAllCommands;
      const vk::TimelineSemaphoreSubmitInfo values(wait_value, signal_value);
      const vk::CommandBuffer raw = *cb;
      ctx.queue().submit(vk::SubmitInfo(s, stage, raw, s, &values));
      issued = signal_value;
      in_flight.emplace_back(signal_value, std::move(cb));
      ++(to_device ? uploads : downloads);
      return signal_value;
    });
  }
};

UnifiedBytes::UnifiedBytes(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
UnifiedBytes::UnifiedBytes(UnifiedBytes&&) noexcept = default;
UnifiedBytes& UnifiedBytes::operator=(UnifiedBytes&& o) noexcept {
  if (this != &o) {
    if (impl_) (void)synchronize();
    impl_ = std::move(o.impl_);
  }
  return *this;
}
UnifiedBytes::~UnifiedBytes() {
  if (impl_) (void)synchronize();
}

Result<UnifiedBytes> UnifiedBytes::create(const VulkanContext& ctx, std::uint64_t bytes,
                                          const UnifiedOptions& options) {
  constexpr const char* call = "UnifiedBytes::create";
  if (bytes == 0) return fail(Errc::InvalidArgument, call, "size 0");
  if (!ctx.capabilities().timeline_semaphore)
    return fail(Errc::Unsupported, call, "the device has no timeline semaphores to order the transfers");
  auto impl = std::make_unique<Impl>(ctx);
  impl->bytes = bytes;
  impl->options = options;
  LF_TRY(impl->device, make_side(ctx, bytes, GpuMemory::DeviceLocal, options.pool));
  if (!impl->device.host || !options.share_when_host_visible) {
    LF_TRY(auto h, make_side(ctx, bytes, GpuMemory::HostVisible, options.pool));
    if (!h.host) return fail(Errc::Internal, call, "host-visible memory without a mapping");
    impl->host.emplace(std::move(h));
  }
  if (GpuSemaphore::supported(ctx, SemaphoreKind::Timeline, false)) {
    LF_TRY(auto t, GpuSemaphore::create(ctx, SemaphoreKind::Timeline));
    impl->shareable.emplace(std::move(t));
    impl->timeline = impl->shareable->semaphore();
  }
  LF_TRY_STATUS(detail::vk_call(call, [&]() -> Status {
    if (!impl->shareable) {
      const vk::SemaphoreTypeCreateInfo type(vk::SemaphoreType::eTimeline, 0);
      impl->own = vk::raii::Semaphore(ctx.device(), vk::SemaphoreCreateInfo({}, &type));
      impl->timeline = *impl->own;
    }
    impl->commands =
        vk::raii::CommandPool(ctx.device(), {vk::CommandPoolCreateFlagBits::eTransient, ctx.queue_family()});
    return {};
  }));
  return UnifiedBytes(std::move(impl));
}

std::uint64_t UnifiedBytes::size() const { return impl_->bytes; }
bool UnifiedBytes::shared() const { return !impl_->host; }
Newest UnifiedBytes::newest() const { return impl_->newest; }
std::uint64_t UnifiedBytes::uploads() const { return impl_->uploads; }
const Buffer& UnifiedBytes::device_buffer() const { return impl_->device.get(); }
const GpuSemaphore* UnifiedBytes::shareable_timeline() const { return impl_->shareable ? &*impl_->shareable : nullptr; }
std::uint64_t UnifiedBytes::downloads() const { return impl_->downloads; }
std::uint64_t UnifiedBytes::writes() const { return impl_->writes; }

Result<std::span<std::byte>> UnifiedBytes::host(Access access) {
  constexpr const char* call = "UnifiedBytes::host";
  auto& m = *impl_;
  if (m.host && m.newest == Newest::Device) {
    LF_TRY_STATUS(m.download(call));
  } else if (!m.host || access != Access::Read) {
    // One memory, or a host write: whatever the GPU still does with the memory comes first.
    LF_TRY_STATUS(m.wait(m.issued, call));
  }
  if (access != Access::Read) m.wrote(Newest::Host);
  Side& side = m.host ? *m.host : m.device;
  return std::span<std::byte>(side.host, m.bytes);
}

Result<DeviceAccess> UnifiedBytes::device(Access access) {
  constexpr const char* call = "UnifiedBytes::device";
  auto& m = *impl_;
  if (m.host && m.newest == Newest::Host) {
    LF_TRY_STATUS(m.copy(true, call));
    m.newest = Newest::Both;
  }
  if (access != Access::Read) m.wrote(Newest::Device);
  const std::uint64_t wait = m.issued;
  m.issued = m.promised = wait + 1;
  return DeviceAccess{m.device.buffer, m.device.offset, m.bytes, m.at(wait), m.at(wait + 1)};
}

Status UnifiedBytes::signal(const DeviceAccess& access) {
  constexpr const char* call = "UnifiedBytes::signal";
  auto& m = *impl_;
  if (access.signal.semaphore != m.timeline || access.signal.value == 0 || access.signal.value > m.issued)
    return fail(Errc::InvalidArgument, call, "not an access of this buffer");
  return detail::vk_call(call, [&]() -> Status {
    // The value it waits for first: the access's signals come in order.
    LF_TRY_STATUS(m.wait(access.wait.value, call));
    if (m.reached() < access.signal.value)
      m.ctx.device().signalSemaphore(vk::SemaphoreSignalInfo(m.timeline, access.signal.value));
    return {};
  });
}

Status UnifiedBytes::to_device() {
  auto& m = *impl_;
  if (!m.host || m.newest != Newest::Host) return {};
  LF_TRY_STATUS(m.copy(true, "UnifiedBytes::to_device"));
  m.newest = Newest::Both;
  return {};
}

Status UnifiedBytes::to_host() {
  auto& m = *impl_;
  if (!m.host || m.newest != Newest::Device) return {};
  return m.download("UnifiedBytes::to_host");
}

Status UnifiedBytes::synchronize() {
  auto& m = *impl_;
  LF_TRY_STATUS(m.wait(m.issued, "UnifiedBytes::synchronize"));
  m.in_flight.clear();
  return {};
}

}  // namespace lavaflow
