// SPDX-License-Identifier: MIT
#include "lavaflow/core/gpu_image.hpp"

#include "external_memory.hpp"
#include "lavaflow/core/detail/format.hpp"
#include "lavaflow/core/detail/vk_call.hpp"
#include "lavaflow/core/detail/wire.hpp"
#include "vulkan_state.hpp"

namespace lavaflow {

std::string_view to_string(PixelFormat f) noexcept {
  switch (f) {
    case PixelFormat::Rgba8:
      return "rgba8";
    case PixelFormat::R8:
      return "r8";
    case PixelFormat::R32f:
      return "r32f";
    case PixelFormat::Rgba32f:
      return "rgba32f";
    case PixelFormat::Rgba16f:
      return "rgba16f";
  }
  return "unknown";
}

std::uint32_t bytes_per_pixel(PixelFormat f) noexcept {
  switch (f) {
    case PixelFormat::Rgba8:
      return 4;
    case PixelFormat::R8:
      return 1;
    case PixelFormat::R32f:
      return 4;
    case PixelFormat::Rgba32f:
      return 16;
    case PixelFormat::Rgba16f:
      return 8;
  }
  return 0;
}

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

std::vector<std::byte> ImageDescriptor::serialize() const {
  wire::Writer w;
  w.put(kMagic);
  w.put(version);
  w.put(format);
  w.put(tiling);
  w.put(static_cast<std::uint8_t>(dedicated));
  w.put(std::uint8_t{0});
  w.put(width);
  w.put(height);
  w.put(usage);
  w.put(memory_type_index);
  w.put(memory_flags);
  w.put(allocation_size);
  w.put(device_uuid);
  w.put(driver_uuid);
  return std::move(w).take();
}

Result<ImageDescriptor> ImageDescriptor::deserialize(std::span<const std::byte> bytes) {
  constexpr const char* call = "ImageDescriptor::deserialize";
  wire::Reader r(bytes, call);
  LF_TRY(auto magic, r.get<std::uint32_t>());
  if (magic != kMagic)
    return fail(Errc::Malformed, call, str_format("bad magic {:#x}, not an image descriptor", magic));
  ImageDescriptor d;
  LF_TRY(d.version, r.get<std::uint16_t>());
  if (d.version != kVersion)
    return fail(Errc::VersionMismatch, call,
                str_format("image descriptor version {}, this build reads version {}", d.version, kVersion));
  if (bytes.size() != kSerializedSize)
    return fail(Errc::Malformed, call,
                str_format("{} bytes, a version {} image descriptor has {}", bytes.size(), kVersion, kSerializedSize));
  LF_TRY(auto format, r.get<std::uint8_t>());
  d.format = static_cast<PixelFormat>(format);
  LF_TRY(auto tiling, r.get<std::uint8_t>());
  d.tiling = static_cast<ImageTiling>(tiling);
  LF_TRY(auto dedicated, r.get<std::uint8_t>());
  if (dedicated > 1) return fail(Errc::Malformed, call, "dedicated flag is neither 0 nor 1");
  d.dedicated = dedicated == 1;
  LF_TRY(auto reserved, r.get<std::uint8_t>());
  if (reserved != 0) return fail(Errc::Malformed, call, "reserved byte is not 0");
  LF_TRY(d.width, r.get<std::uint32_t>());
  LF_TRY(d.height, r.get<std::uint32_t>());
  LF_TRY(d.usage, r.get<std::uint32_t>());
  LF_TRY(d.memory_type_index, r.get<std::uint32_t>());
  LF_TRY(d.memory_flags, r.get<std::uint32_t>());
  LF_TRY(d.allocation_size, r.get<std::uint64_t>());
  LF_TRY_STATUS(r.get(d.device_uuid));
  LF_TRY_STATUS(r.get(d.driver_uuid));
  LF_TRY_STATUS(r.expect_end());
  if (auto ok = d.validate(); !ok) return std::unexpected(ok.error().within(call));
  return d;
}

Status ImageDescriptor::validate() const {
  constexpr const char* call = "ImageDescriptor::validate";
  if (version != kVersion)
    return fail(Errc::VersionMismatch, call, str_format("version {}, expected {}", version, kVersion));
  const auto f = static_cast<std::uint8_t>(format);
  if (f < 1 || f > 5) return fail(Errc::Malformed, call, str_format("unknown pixel format {}", f));
  const auto t = static_cast<std::uint8_t>(tiling);
  if (t < 1 || t > 2) return fail(Errc::Malformed, call, str_format("unknown tiling {}", t));
  if (width == 0 || height == 0 || width > 65536 || height > 65536)
    return fail(Errc::Malformed, call, str_format("extent {}x{} outside 1..65536", width, height));
  if (allocation_size < packed_size())
    return fail(Errc::Malformed, call,
                str_format("allocation of {} bytes cannot hold {}x{} {} pixels", allocation_size, width, height,
                           to_string(format)));
  if (memory_type_index >= 32)
    return fail(Errc::Malformed, call, str_format("memory type index {} out of range", memory_type_index));
  return {};
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
