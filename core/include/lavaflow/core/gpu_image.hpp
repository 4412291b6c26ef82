// SPDX-License-Identifier: MIT
#pragma once
/// @file
/// Exportable 2D Vulkan images (dedicated allocations, opaque POSIX fd), for importers that want
/// textures or arrays rather than linear buffers: CUDA mipmapped arrays, GL textures.

#include <cstdint>
#include <memory>
#include <span>
#include <string_view>
#include <vector>

#include "lavaflow/core/error.hpp"
#include "lavaflow/core/location.hpp"
#include "lavaflow/core/unique_fd.hpp"
#include "lavaflow/core/vulkan_context.hpp"

namespace lavaflow {

/// The pixel formats every adapter can name (CUDA channel formats, GL internal formats).
enum class PixelFormat : std::uint8_t { Rgba8 = 1, R8 = 2, R32f = 3, Rgba32f = 4, Rgba16f = 5 };
[[nodiscard]] std::string_view to_string(PixelFormat f) noexcept;
[[nodiscard]] std::uint32_t bytes_per_pixel(PixelFormat f) noexcept;
[[nodiscard]] vk::Format to_vk(PixelFormat f) noexcept;

enum class ImageTiling : std::uint8_t { Optimal = 1, Linear = 2 };

struct ImageDescriptor {
  static constexpr std::uint32_t kMagic = 0x49584c46;  // "FLXI"
  static constexpr std::uint16_t kVersion = 1;
  static constexpr std::size_t kSerializedSize = 4 + 2 + 1 + 1 + 1 + 1 + 4 * 5 + 8 + 16 + 16;

  std::uint16_t version = kVersion;
  PixelFormat format = PixelFormat::Rgba8;
  ImageTiling tiling = ImageTiling::Optimal;
  bool dedicated = true;
  std::uint32_t width = 0;
  std::uint32_t height = 0;
  std::uint32_t usage = 0;  ///< VkImageUsageFlags the image was created with
  std::uint32_t memory_type_index = 0;
  std::uint32_t memory_flags = 0;  ///< VkMemoryPropertyFlags of that memory type
  std::uint64_t allocation_size = 0;
  Uuid device_uuid{};
  Uuid driver_uuid{};

  [[nodiscard]] std::vector<std::byte> serialize() const;
  [[nodiscard]] static Result<ImageDescriptor> deserialize(std::span<const std::byte> bytes);
  [[nodiscard]] Status validate() const;
  /// Tightly packed bytes of one copy of the pixels (width × height × bytes per pixel).
  [[nodiscard]] std::uint64_t packed_size() const { return std::uint64_t{width} * height * bytes_per_pixel(format); }
};

struct ImageExport {
  ImageDescriptor descriptor;
  UniqueFd fd;
};

struct GpuImageOptions {
  std::uint32_t width = 0;
  std::uint32_t height = 0;
  PixelFormat format = PixelFormat::Rgba8;
  ImageTiling tiling = ImageTiling::Optimal;
  /// Every use any importer may make: GL and CUDA expect the exporter to have allowed them.
  vk::ImageUsageFlags usage = vk::ImageUsageFlagBits::eSampled | vk::ImageUsageFlagBits::eStorage |
                              vk::ImageUsageFlagBits::eTransferSrc | vk::ImageUsageFlagBits::eTransferDst |
                              vk::ImageUsageFlagBits::eColorAttachment;
};

class GpuImage {
 public:
  /// A new device-local, dedicated, exportable 2D image (one mip level, one layer), layout UNDEFINED.
  [[nodiscard]] static Result<GpuImage> allocate(const VulkanContext& ctx, const GpuImageOptions& options);
  /// Imports an image exported elsewhere; checks the descriptor (device, driver, format support)
  /// before any driver call. Consumes `fd` on success only (and keeps it for export_handle()).
  [[nodiscard]] static Result<GpuImage> import(const VulkanContext& ctx, const ImageDescriptor& desc, UniqueFd&& fd);

  GpuImage(GpuImage&&) noexcept;
  GpuImage& operator=(GpuImage&&) noexcept;
  ~GpuImage();

  [[nodiscard]] Result<ImageExport> export_handle() const;
  [[nodiscard]] vk::Image image() const;
  [[nodiscard]] vk::DeviceMemory memory() const;
  [[nodiscard]] const ImageDescriptor& descriptor() const;
  [[nodiscard]] std::uint32_t width() const { return descriptor().width; }
  [[nodiscard]] std::uint32_t height() const { return descriptor().height; }

 private:
  struct Impl;
  explicit GpuImage(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace lavaflow
