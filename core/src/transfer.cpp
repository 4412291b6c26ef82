// SPDX-License-Identifier: MIT
#include "lavaflow/core/transfer.hpp"

#include <cstring>
#include <optional>

#include "lavaflow/core/detail/format.hpp"
#include "lavaflow/core/detail/vk_call.hpp"
#include "lavaflow/core/pool.hpp"

namespace lavaflow {

namespace {

/// Records commands into `cb`, submits them with `fence` (unsignalled) and waits for the fence.
template <class Record>
Status record_submit_wait(const VulkanContext& ctx, const vk::raii::CommandBuffer& cb, vk::Fence fence, Record&& record,
                          std::uint64_t bytes, std::chrono::milliseconds timeout) {
  cb.begin({vk::CommandBufferUsageFlagBits::eOneTimeSubmit});
  record(cb);
  cb.end();
  vk::CommandBuffer raw = *cb;
  ctx.queue().submit(vk::SubmitInfo({}, {}, raw), fence);
  const auto ns = static_cast<std::uint64_t>(std::chrono::nanoseconds(timeout).count());
  if (ctx.device().waitForFences(fence, VK_TRUE, ns) == vk::Result::eTimeout)
    return fail(Errc::Timeout, "vkWaitForFences",
                str_format("copy of {} bytes not done within {} ms", bytes, timeout.count()));
  return {};
}

Status record_submit_wait(const VulkanContext& ctx, const vk::raii::CommandBuffer& cb, vk::Fence fence, vk::Buffer src,
                          std::uint64_t src_offset, vk::Buffer dst, std::uint64_t dst_offset, std::uint64_t bytes,
                          std::chrono::milliseconds timeout) {
  return record_submit_wait(
      ctx, cb, fence,
      [&](const vk::raii::CommandBuffer& c) { c.copyBuffer(src, dst, vk::BufferCopy(src_offset, dst_offset, bytes)); },
      bytes, timeout);
}

/// One-off command buffer + fence; runs `record` and waits.
template <class Record>
Status run_once(const VulkanContext& ctx, const char* call, std::uint64_t bytes, Record&& record) {
  return detail::vk_call(call, [&]() -> Status {
    const auto& dev = ctx.device();
    vk::raii::CommandPool pool(dev, {vk::CommandPoolCreateFlagBits::eTransient, ctx.queue_family()});
    vk::raii::CommandBuffers cbs(dev, {*pool, vk::CommandBufferLevel::ePrimary, 1});
    vk::raii::Fence fence(dev, vk::FenceCreateInfo{});
    return record_submit_wait(ctx, cbs[0], *fence, record, bytes, std::chrono::seconds(10));
  });
}

void image_barrier(const vk::raii::CommandBuffer& cb, vk::Image image, vk::ImageLayout from, vk::ImageLayout to) {
  vk::ImageMemoryBarrier b(vk::AccessFlagBits::eMemoryWrite | vk::AccessFlagBits::eMemoryRead,
                           vk::AccessFlagBits::eMemoryWrite | vk::AccessFlagBits::eMemoryRead, from, to,
                           VK_QUEUE_FAMILY_IGNORED, VK_QUEUE_FAMILY_IGNORED, image,
                           vk::ImageSubresourceRange(vk::ImageAspectFlagBits::eColor, 0, 1, 0, 1));
  cb.pipelineBarrier(vk::PipelineStageFlagBits::eAllCommands, vk::PipelineStageFlagBits::eAllCommands, {}, {}, {}, b);
}

Status image_transfer(const VulkanContext& ctx, const GpuImage& image, std::span<std::byte> bytes, bool to_image,
                      vk::ImageLayout current, const char* call) {
  const auto& d = image.descriptor();
  if (bytes.size() != d.packed_size())
    return fail(Errc::InvalidArgument, call,
                str_format("{} bytes given, a {}x{} {} image holds {}", bytes.size(), d.width, d.height,
                           to_string(d.format), d.packed_size()));
  LF_TRY(auto staging, GpuBuffer::allocate(ctx, {.size = bytes.size(), .memory = GpuMemory::HostVisible}));
  if (to_image) std::memcpy(staging.host_ptr(), bytes.data(), bytes.size());
  const vk::BufferImageCopy region(0, 0, 0, vk::ImageSubresourceLayers(vk::ImageAspectFlagBits::eColor, 0, 0, 1),
                                   {0, 0, 0}, {d.width, d.height, 1});
  LF_TRY_STATUS(run_once(ctx, call, bytes.size(), [&](const vk::raii::CommandBuffer& cb) {
    const auto layout = to_image ? vk::ImageLayout::eTransferDstOptimal : vk::ImageLayout::eTransferSrcOptimal;
    image_barrier(cb, image.image(), current, layout);
    if (to_image)
      cb.copyBufferToImage(staging.buffer(), image.image(), layout, region);
    else
      cb.copyImageToBuffer(image.image(), layout, staging.buffer(), region);
    image_barrier(cb, image.image(), layout, vk::ImageLayout::eGeneral);
  }));
  if (!to_image) std::memcpy(bytes.data(), staging.host_ptr(), bytes.size());
  return {};
}

}  // namespace

Status copy_buffer(const VulkanContext& ctx, vk::Buffer src, std::uint64_t src_offset, vk::Buffer dst,
                   std::uint64_t dst_offset, std::uint64_t bytes, std::chrono::milliseconds timeout) {
  return detail::vk_call("copy_buffer", [&]() -> Status {
    const auto& dev = ctx.device();
    vk::raii::CommandPool pool(dev, {vk::CommandPoolCreateFlagBits::eTransient, ctx.queue_family()});
    vk::raii::CommandBuffers cbs(dev, {*pool, vk::CommandBufferLevel::ePrimary, 1});
    vk::raii::Fence fence(dev, vk::FenceCreateInfo{});
    return record_submit_wait(ctx, cbs[0], *fence, src, src_offset, dst, dst_offset, bytes, timeout);
  });
}

Status upload_image(const VulkanContext& ctx, const GpuImage& dst, std::span<const std::byte> pixels,
                    vk::ImageLayout current) {
  return image_transfer(ctx, dst, {const_cast<std::byte*>(pixels.data()), pixels.size()}, true, current,
                        "upload_image");
}

Status download_image(const VulkanContext& ctx, const GpuImage& src, std::span<std::byte> pixels,
                      vk::ImageLayout current) {
  return image_transfer(ctx, src, pixels, false, current, "download_image");
}

/// Staging resources are made on first need: a buffer that is mapped never needs them.
struct Stager::Impl {
  const VulkanContext* ctx;
  std::uint64_t capacity;
  std::optional<GpuBuffer> staging;
  vk::raii::CommandPool pool{nullptr};
  vk::raii::CommandBuffers cbs{nullptr};
  vk::raii::Fence fence{nullptr};

  Status ensure(std::uint64_t bytes, const char* call) {
    if (bytes > capacity)
      return fail(Errc::InvalidArgument, call, str_format("{} bytes exceed the stager's {}", bytes, capacity));
    if (staging) return {};
    LF_TRY(auto buf, GpuBuffer::allocate(*ctx, {.size = capacity, .memory = GpuMemory::HostVisible}));
    LF_TRY_STATUS(detail::vk_call("Stager", [&] {
      const auto& dev = ctx->device();
      pool = vk::raii::CommandPool(dev, {vk::CommandPoolCreateFlagBits::eResetCommandBuffer, ctx->queue_family()});
      cbs = vk::raii::CommandBuffers(dev, {*pool, vk::CommandBufferLevel::ePrimary, 1});
      fence = vk::raii::Fence(dev, vk::FenceCreateInfo{});
    }));
    staging.emplace(std::move(buf));
    return {};
  }

  Status copy(vk::Buffer src, std::uint64_t src_off, vk::Buffer dst, std::uint64_t dst_off, std::uint64_t bytes) {
    return detail::vk_call("Stager copy", [&]() -> Status {
      cbs[0].reset();
      ctx->device().resetFences(*fence);
      return record_submit_wait(*ctx, cbs[0], *fence, src, src_off, dst, dst_off, bytes, std::chrono::seconds(10));
    });
  }
};

namespace {

/// The Vulkan buffer and offset where a buffer's bytes start in Vulkan memory.
Result<std::pair<vk::Buffer, std::uint64_t>> vulkan_range(const Buffer& b, const char* call) {
  if (const auto* g = dynamic_cast<const GpuBuffer*>(&b)) return std::pair{g->buffer(), g->offset()};
  if (const auto* p = dynamic_cast<const PooledBuffer*>(&b); p && p->gpu_buffer())
    return std::pair{p->gpu_buffer(), p->gpu_offset()};
  return fail(Errc::InvalidArgument, call,
              str_format("a {} buffer that is neither mapped here nor in Vulkan memory", to_string(b.kind())));
}

}  // namespace

Status upload(const VulkanContext& ctx, const Buffer& dst, std::span<const std::byte> data) {
  LF_TRY(auto stager, Stager::create(ctx, data.size()));
  return stager.upload(dst, data);
}

Status download(const VulkanContext& ctx, const Buffer& src, std::span<std::byte> out) {
  LF_TRY(auto stager, Stager::create(ctx, out.size()));
  return stager.download(src, out);
}

Stager::Stager(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
Stager::Stager(Stager&&) noexcept = default;
Stager& Stager::operator=(Stager&&) noexcept = default;
Stager::~Stager() = default;

Result<Stager> Stager::create(const VulkanContext& ctx, std::uint64_t capacity) {
  return Stager(std::unique_ptr<Impl>(new Impl{&ctx, capacity}));
}

Status Stager::upload(const Buffer& dst, std::span<const std::byte> data) {
  if (data.size() > dst.size())
    return fail(Errc::InvalidArgument, "Stager::upload",
                str_format("{} bytes do not fit a {} byte buffer", data.size(), dst.size()));
  if (auto* p = dst.host_ptr()) {
    std::memcpy(p, data.data(), data.size());
    return {};
  }
  LF_TRY(const auto range, vulkan_range(dst, "Stager::upload"));
  LF_TRY_STATUS(impl_->ensure(data.size(), "Stager::upload"));
  std::memcpy(impl_->staging->host_ptr(), data.data(), data.size());
  return impl_->copy(impl_->staging->buffer(), 0, range.first, range.second, data.size());
}

Status Stager::download(const Buffer& src, std::span<std::byte> out) {
  if (out.size() > src.size())
    return fail(Errc::InvalidArgument, "Stager::download",
                str_format("{} bytes requested from a {} byte buffer", out.size(), src.size()));
  if (auto* p = src.host_ptr()) {
    std::memcpy(out.data(), p, out.size());
    return {};
  }
  LF_TRY(const auto range, vulkan_range(src, "Stager::download"));
  LF_TRY_STATUS(impl_->ensure(out.size(), "Stager::download"));
  LF_TRY_STATUS(impl_->copy(range.first, range.second, impl_->staging->buffer(), 0, out.size()));
  std::memcpy(out.data(), impl_->staging->host_ptr(), out.size());
  return {};
}

}  // namespace lavaflow
