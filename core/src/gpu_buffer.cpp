// SPDX-License-Identifier: MIT
#include "lavaflow/core/gpu_buffer.hpp"

#include "external_memory.hpp"
#include "lavaflow/core/detail/format.hpp"
#include "lavaflow/core/detail/vk_call.hpp"
#include "round_up.hpp"
#include "vulkan_state.hpp"

namespace lavaflow {

struct GpuBuffer::Impl {
  std::shared_ptr<const detail::VulkanState> state;  // keeps the device alive
  vk::raii::Buffer buffer{nullptr};
  vk::raii::DeviceMemory memory{nullptr};
  std::byte* mapped = nullptr;
  ExportDescriptor desc;
  BufferKind kind = BufferKind::GpuDeviceLocal;
  UniqueFd imported_from;  // the fd this memory was imported from: re-exported as duplicates

  ~Impl() {
    if (mapped) memory.unmapMemory();
  }
};

namespace {

using detail::kOpaqueFd;
using detail::round_up;
constexpr auto kHandle = kOpaqueFd;

vk::raii::Buffer make_buffer(const vk::raii::Device& dev, std::uint64_t size, vk::BufferUsageFlags usage) {
  vk::ExternalMemoryBufferCreateInfo ext(kHandle);
  vk::BufferCreateInfo info({}, size, usage, vk::SharingMode::eExclusive, {}, &ext);
  return vk::raii::Buffer(dev, info);
}

}  // namespace

GpuBuffer::GpuBuffer(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
GpuBuffer::GpuBuffer(GpuBuffer&&) noexcept = default;
GpuBuffer& GpuBuffer::operator=(GpuBuffer&&) noexcept = default;
GpuBuffer::~GpuBuffer() = default;

Result<GpuBuffer> GpuBuffer::allocate(const VulkanContext& ctx, const GpuBufferOptions& o) {
  constexpr const char* call = "GpuBuffer::allocate";
  if (o.size == 0) return fail(Errc::InvalidArgument, call, "size is 0");
  if (o.size > ctx.capabilities().device_local_bytes && ctx.capabilities().device_local_bytes != 0)
    return fail(Errc::InvalidArgument, call,
                str_format("size {} exceeds the device's {} bytes of device-local memory", o.size,
                           ctx.capabilities().device_local_bytes));
  LF_TRY_STATUS(detail::require_fd_memory(ctx, call, false));
  const auto& dev = ctx.device();
  auto impl = std::make_unique<Impl>();
  impl->state = detail::state_of(ctx);
  impl->kind = o.memory == GpuMemory::DeviceLocal ? BufferKind::GpuDeviceLocal : BufferKind::GpuHostVisible;
  const std::uint64_t buffer_size = round_up(o.size + kGpuTailPadding, 256);

  LF_TRY(impl->buffer, detail::vk_call("vkCreateBuffer", [&] { return make_buffer(dev, buffer_size, o.usage); }));
  const auto req = impl->buffer.getMemoryRequirements();
  constexpr auto mapped = vk::MemoryPropertyFlagBits::eHostVisible | vk::MemoryPropertyFlagBits::eHostCoherent;
  const auto wanted = o.memory == GpuMemory::DeviceLocal
                          ? vk::MemoryPropertyFlags(vk::MemoryPropertyFlagBits::eDeviceLocal)
                      : o.memory == GpuMemory::HostVisible ? mapped
                                                           : mapped | vk::MemoryPropertyFlagBits::eDeviceLocal;
  auto found = ctx.find_memory_type(req.memoryTypeBits, wanted);
  if (!found && o.memory == GpuMemory::DeviceLocalMapped) found = ctx.find_memory_type(req.memoryTypeBits, mapped);
  LF_TRY(const std::uint32_t type, std::move(found));

  vk::MemoryDedicatedAllocateInfo dedicated({}, *impl->buffer);
  vk::ExportMemoryAllocateInfo export_info(kHandle, &dedicated);
  vk::MemoryAllocateInfo alloc(req.size, type, &export_info);
  LF_TRY(impl->memory, detail::vk_call("vkAllocateMemory", [&] { return vk::raii::DeviceMemory(dev, alloc); }));
  LF_TRY_STATUS(detail::vk_call("vkBindBufferMemory", [&] { impl->buffer.bindMemory(*impl->memory, 0); }));

  const auto flags = impl->state->memory.memoryTypes[type].propertyFlags;
  if (flags & vk::MemoryPropertyFlagBits::eHostVisible) {
    LF_TRY(void* p, detail::vk_call("vkMapMemory", [&] { return impl->memory.mapMemory(0, VK_WHOLE_SIZE); }));
    impl->mapped = static_cast<std::byte*>(p);
  }
  auto& d = impl->desc;
  d.kind = impl->kind;
  d.dedicated = true;
  d.allocation_size = req.size;
  d.buffer_size = buffer_size;
  d.offset = 0;
  d.size = o.size;
  d.memory_type_index = type;
  d.usage = static_cast<std::uint32_t>(o.usage);
  d.memory_flags = static_cast<std::uint32_t>(flags);
  d.device_uuid = ctx.capabilities().identity.device_uuid;
  d.driver_uuid = ctx.capabilities().identity.driver_uuid;
  return GpuBuffer(std::move(impl));
}

Result<GpuBuffer> GpuBuffer::import(const VulkanContext& ctx, const ExportDescriptor& d, UniqueFd&& fd) {
  constexpr const char* call = "GpuBuffer::import";
  if (auto ok = d.validate(); !ok) return std::unexpected(ok.error().within(call));
  if (!is_gpu(d.kind))
    return fail(Errc::InvalidArgument, call,
                str_format("descriptor is for a {} buffer, not GPU memory", to_string(d.kind)));
  LF_TRY_STATUS(detail::check_exporter(ctx, d.device_uuid, d.driver_uuid, call));
  LF_TRY_STATUS(check_memory_fd(fd, d.allocation_size, call));
  LF_TRY_STATUS(detail::require_fd_memory(ctx, call, true));
  const auto& mem_props = detail::state_of(ctx)->memory;
  LF_TRY_STATUS(detail::check_memory_type(ctx, d.memory_type_index, ~0u, call));

  const auto& dev = ctx.device();
  auto impl = std::make_unique<Impl>();
  impl->state = detail::state_of(ctx);
  impl->kind = d.kind;
  impl->desc = d;
  const auto usage = vk::BufferUsageFlags(d.usage);
  LF_TRY(impl->buffer, detail::vk_call("vkCreateBuffer", [&] { return make_buffer(dev, d.buffer_size, usage); }));
  const auto req = impl->buffer.getMemoryRequirements();
  LF_TRY_STATUS(detail::check_memory_type(ctx, d.memory_type_index, req.memoryTypeBits, call));
  if (req.size > d.allocation_size)
    return fail(Errc::Malformed, call,
                str_format("buffer needs {} bytes but the allocation has {}", req.size, d.allocation_size));

  // Vulkan takes the fd on success only; hand it a duplicate so that a failure after a
  // successful vkAllocateMemory (which closed the duplicate) still leaves the caller's fd open.
  LF_TRY(UniqueFd copy, fd.dup());
  vk::MemoryDedicatedAllocateInfo dedicated({}, *impl->buffer);
  vk::ImportMemoryFdInfoKHR import_info(vk::ExternalMemoryHandleTypeFlagBits::eOpaqueFd, copy.get(),
                                        d.dedicated ? &dedicated : nullptr);
  vk::MemoryAllocateInfo alloc(d.allocation_size, d.memory_type_index, &import_info);
  LF_TRY(impl->memory, detail::import_memory(dev, alloc, call));
  (void)copy.release();  // the driver owns it now
  LF_TRY_STATUS(detail::vk_call("vkBindBufferMemory", [&] { impl->buffer.bindMemory(*impl->memory, 0); }));
  if (vk::MemoryPropertyFlags(d.memory_flags) & vk::MemoryPropertyFlagBits::eHostVisible &&
      mem_props.memoryTypes[d.memory_type_index].propertyFlags & vk::MemoryPropertyFlagBits::eHostVisible) {
    LF_TRY(void* p, detail::vk_call("vkMapMemory", [&] { return impl->memory.mapMemory(0, VK_WHOLE_SIZE); }));
    impl->mapped = static_cast<std::byte*>(p);
  }
  // Success: the import consumed the caller's handle. Keep it so that imported memory can be handed
  // on to another API (CUDA, GL, OpenCL) — Vulkan cannot re-export memory it did not allocate.
  impl->imported_from = std::move(fd);
  return GpuBuffer(std::move(impl));
}

Result<ExportDescriptor> GpuBuffer::describe_foreign(const VulkanContext& ctx, std::uint64_t allocation_size,
                                                     std::uint64_t size) {
  constexpr const char* call = "GpuBuffer::describe_foreign";
  if (size == 0 || size > allocation_size)
    return fail(Errc::InvalidArgument, call,
                str_format("range of {} bytes in an allocation of {}", size, allocation_size));
  LF_TRY_STATUS(detail::require_fd_memory(ctx, call, true));
  const GpuBufferOptions defaults;
  LF_TRY(auto probe,
         detail::vk_call("vkCreateBuffer", [&] { return make_buffer(ctx.device(), allocation_size, defaults.usage); }));
  const auto req = probe.getMemoryRequirements();
  if (req.size > allocation_size)
    return fail(Errc::InvalidArgument, call,
                str_format("a buffer over {} bytes needs {} bytes of memory here", allocation_size, req.size));
  LF_TRY(const std::uint32_t type, ctx.find_memory_type(req.memoryTypeBits, vk::MemoryPropertyFlagBits::eDeviceLocal));
  ExportDescriptor d;
  d.kind = BufferKind::GpuDeviceLocal;
  d.dedicated = false;
  d.allocation_size = allocation_size;
  d.buffer_size = allocation_size;
  d.offset = 0;
  d.size = size;
  d.memory_type_index = type;
  d.usage = static_cast<std::uint32_t>(defaults.usage);
  // Not host-visible, whatever the type offers: foreign memory is not mapped by lava-flow.
  d.memory_flags = static_cast<std::uint32_t>(vk::MemoryPropertyFlagBits::eDeviceLocal);
  d.device_uuid = ctx.capabilities().identity.device_uuid;
  d.driver_uuid = ctx.capabilities().identity.driver_uuid;
  return d;
}

std::uint64_t GpuBuffer::size() const { return impl_->desc.size; }
BufferKind GpuBuffer::kind() const { return impl_->kind; }
std::byte* GpuBuffer::host_ptr() const { return impl_->mapped ? impl_->mapped + impl_->desc.offset : nullptr; }
vk::Buffer GpuBuffer::buffer() const { return *impl_->buffer; }
vk::DeviceMemory GpuBuffer::memory() const { return *impl_->memory; }
std::uint64_t GpuBuffer::offset() const { return impl_->desc.offset; }
const ExportDescriptor& GpuBuffer::descriptor() const { return impl_->desc; }

Result<Export> GpuBuffer::export_handle() const {
  if (impl_->imported_from.valid()) {
    LF_TRY(UniqueFd dup, impl_->imported_from.dup());
    UniqueFd fd = detail::own_file_description(std::move(dup));
    return Export{impl_->desc, std::move(fd)};
  }
  vk::MemoryGetFdInfoKHR info(*impl_->memory, kHandle);
  const auto& dev = detail::get(impl_->state->device);
  LF_TRY(int raw, detail::vk_call("vkGetMemoryFdKHR", [&] { return dev.getMemoryFdKHR(info); }));
  UniqueFd fd(raw);
  LF_TRY_STATUS(fd.set_cloexec());
  fd = detail::own_file_description(std::move(fd));
  return Export{impl_->desc, std::move(fd)};
}

}  // namespace lavaflow
