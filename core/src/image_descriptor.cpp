// SPDX-License-Identifier: MIT
// The image descriptor's wire form and its checks, apart from the Vulkan image code: a peer sends
// these bytes, and the fuzz target links this file alone.
#include "lavaflow/core/detail/format.hpp"
#include "lavaflow/core/detail/wire.hpp"
#include "lavaflow/core/gpu_image.hpp"

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

}  // namespace lavaflow
