// SPDX-License-Identifier: MIT
#include "lavaflow/core/gpu_image.hpp"

#include "external_memory.hpp"
#include "lavaflow/core/detail/format.hpp"
#include "lavaflow/core/detail/vk_call.hpp"
#include "vulkan_state.hpp"

namespace lavaflow {

vk::Format to_vk(PixelFormat f) noexcept {
  switch (f) {
    case PixelFormat::Rgba8:
      return vk::Format::eR8G8B8A8Unorm;
    case PixelFormat::R8:
      return vk::Format::eR8Unorm;
    case PixelFormat::R32f:
      return vk::Format::eR32Sfloat;
    case PixelFormat::Rgba32f:
      return vk::Format::eR32G32B32A32Sfloat;
    case PixelFormat::Rgba16f:
      return vk::Format::eR16G16B16A16Sfloat;
  }
  return vk::Format::eUndefined;
}

struct GpuImage::Impl {
  std::shared_ptr<const detail::VulkanState> state;
  vk::raii::Image image{nullptr};
  vk::raii::DeviceMemory memory{nullptr};
  ImageDescriptor desc;
  UniqueFd imported_from;
};

namespace {

vk::raii::Image make_image(const vk::raii::Device& dev, const ImageDescriptor& d) {
  vk::ExternalMemoryImageCreateInfo ext(detail::kOpaqueFd);
  vk::ImageCreateInfo info(
      {}, vk::ImageType::e2D, to_vk(d.format), vk::Extent3D(d.width, d.height, 1), 1, 1, vk::SampleCountFlagBits::e1,
      d.tiling == ImageTiling::Optimal ? vk::ImageTiling::eOptimal : vk::ImageTiling::eLinear,
      vk::ImageUsageFlags(d.usage), vk::SharingMode::eExclusive, {}, vk::ImageLayout::eUndefined, &ext);
  return vk::raii::Image(dev, info);
}

Status check_format(const VulkanContext& ctx, const ImageDescriptor& d, const char* call) {
  vk::PhysicalDeviceExternalImageFormatInfo ext(detail::kOpaqueFd);
  vk::PhysicalDeviceImageFormatInfo2 info(
      to_vk(d.format), vk::ImageType::e2D,
      d.tiling == ImageTiling::Optimal ? vk::ImageTiling::eOptimal : vk::ImageTiling::eLinear,
      vk::ImageUsageFlags(d.usage), {}, &ext);
  auto props = detail::vk_call("vkGetPhysicalDeviceImageFormatProperties2", [&] {
    return ctx.physical_device()
        .getImageFormatProperties2<vk::ImageFormatProperties2, vk::ExternalImageFormatProperties>(info);
  });
  if (!props)
    return fail(
        Errc::Unsupported, call,
        str_format("device {} cannot make exportable {} {}x{} images with these usages: {}",
                   ctx.capabilities().identity.name, to_string(d.format), d.width, d.height, props.error().message()));
  const auto& limits = props->get<vk::ImageFormatProperties2>().imageFormatProperties.maxExtent;
  if (d.width > limits.width || d.height > limits.height)
    return fail(Errc::InvalidArgument, call,
                str_format("{}x{} exceeds the device's {}x{} limit", d.width, d.height, limits.width, limits.height));
  const auto feats = props->get<vk::ExternalImageFormatProperties>().externalMemoryProperties.externalMemoryFeatures;
  if (!(feats & vk::ExternalMemoryFeatureFlagBits::eExportable) ||
      !(feats & vk::ExternalMemoryFeatureFlagBits::eImportable))
    return fail(Errc::Unsupported, call,
                str_format("device {} cannot share {} images as opaque fds", ctx.capabilities().identity.name,
                           to_string(d.format)));
  return {};
}

}  // namespace

GpuImage::GpuImage(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
GpuImage::GpuImage(GpuImage&&) noexcept = default;
GpuImage& GpuImage::operator=(GpuImage&&) noexcept = default;
GpuImage::~GpuImage() = default;

Result<GpuImage> GpuImage::allocate(const VulkanContext& ctx, const GpuImageOptions& o) {
  constexpr const char* call = "GpuImage::allocate";
  LF_TRY_STATUS(detail::require_fd_memory(ctx, call, false));
  auto impl = std::make_unique<Impl>();
  impl->state = detail::state_of(ctx);
  auto& d = impl->desc;
  d.format = o.format;
  d.tiling = o.tiling;
  d.width = o.width;
  d.height = o.height;
  d.usage = static_cast<std::uint32_t>(o.usage);
  if (o.width == 0 || o.height == 0) return fail(Errc::InvalidArgument, call, "width and height must be non-zero");
  LF_TRY_STATUS(check_format(ctx, d, call));
  const auto& dev = ctx.device();
  LF_TRY(impl->image, detail::vk_call("vkCreateImage", [&] { return make_image(dev, d); }));
  const auto req = impl->image.getMemoryRequirements();
  LF_TRY(const std::uint32_t type, ctx.find_memory_type(req.memoryTypeBits, vk::MemoryPropertyFlagBits::eDeviceLocal));
  vk::MemoryDedicatedAllocateInfo dedicated(*impl->image, {});
  vk::ExportMemoryAllocateInfo export_info(detail::kOpaqueFd, &dedicated);
  vk::MemoryAllocateInfo alloc(req.size, type, &export_info);
  LF_TRY(impl->memory, detail::vk_call("vkAllocateMemory", [&] { return vk::raii::DeviceMemory(dev, alloc); }));
  LF_TRY_STATUS(detail::vk_call("vkBindImageMemory", [&] { impl->image.bindMemory(*impl->memory, 0); }));
  d.dedicated = true;
  d.allocation_size = req.size;
  d.memory_type_index = type;
  d.memory_flags = static_cast<std::uint32_t>(impl->state->memory.memoryTypes[type].propertyFlags);
  d.device_uuid = ctx.capabilities().identity.device_uuid;
  d.driver_uuid = ctx.capabilities().identity.driver_uuid;
  return GpuImage(std::move(impl));
}

Result<GpuImage> GpuImage::import(const VulkanContext& ctx, const ImageDescriptor& d, UniqueFd&& fd) {
  constexpr const char* call = "GpuImage::import";
  if (auto ok = d.validate(); !ok) return std::unexpected(ok.error().within(call));
  LF_TRY_STATUS(detail::check_exporter(ctx, d.device_uuid, d.driver_uuid, call));
  LF_TRY_STATUS(check_memory_fd(fd, d.allocation_size, call));
  LF_TRY_STATUS(detail::require_fd_memory(ctx, call, true));
  LF_TRY_STATUS(check_format(ctx, d, call));
  const auto& dev = ctx.device();
  auto impl = std::make_unique<Impl>();
  impl->state = detail::state_of(ctx);
  impl->desc = d;
  LF_TRY(impl->image, detail::vk_call("vkCreateImage", [&] { return make_image(dev, d); }));
  const auto req = impl->image.getMemoryRequirements();
  LF_TRY_STATUS(detail::check_memory_type(ctx, d.memory_type_index, req.memoryTypeBits, call));
  if (req.size > d.allocation_size)
    return fail(Errc::Malformed, call,
                str_format("image needs {} bytes but the allocation has {}", req.size, d.allocation_size));
  LF_TRY(UniqueFd copy, fd.dup());  // the driver takes it on success only
  vk::MemoryDedicatedAllocateInfo dedicated(*impl->image, {});
  vk::ImportMemoryFdInfoKHR import_info(detail::kOpaqueFd, copy.get(), d.dedicated ? &dedicated : nullptr);
  vk::MemoryAllocateInfo alloc(d.allocation_size, d.memory_type_index, &import_info);
  LF_TRY(impl->memory, detail::import_memory(dev, alloc, call));
  (void)copy.release();
  LF_TRY_STATUS(detail::vk_call("vkBindImageMemory", [&] { impl->image.bindMemory(*impl->memory, 0); }));
  impl->imported_from = std::move(fd);
  return GpuImage(std::move(impl));
}

Result<ImageExport> GpuImage::export_handle() const {
  if (impl_->imported_from.valid()) {
    LF_TRY(UniqueFd dup, impl_->imported_from.dup());
    UniqueFd fd = detail::own_file_description(std::move(dup));
    return ImageExport{impl_->desc, std::move(fd)};
  }
  const auto& dev = detail::get(impl_->state->device);
  LF_TRY(int raw, detail::vk_call("vkGetMemoryFdKHR", [&] {
           return dev.getMemoryFdKHR({*impl_->memory, detail::kOpaqueFd});
         }));
  UniqueFd fd(raw);
  LF_TRY_STATUS(fd.set_cloexec());
  fd = detail::own_file_description(std::move(fd));
  return ImageExport{impl_->desc, std::move(fd)};
}

vk::Image GpuImage::image() const { return *impl_->image; }
vk::DeviceMemory GpuImage::memory() const { return *impl_->memory; }
const ImageDescriptor& GpuImage::descriptor() const { return impl_->desc; }

}  // namespace lavaflow
