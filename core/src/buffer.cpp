// SPDX-License-Identifier: MIT
#include "lavaflow/core/buffer.hpp"

#include "lavaflow/core/detail/format.hpp"
#include "lavaflow/core/detail/wire.hpp"

namespace lavaflow {

std::string_view to_string(BufferKind k) noexcept {
  switch (k) {
    case BufferKind::GpuDeviceLocal:
      return "gpu-device-local";
    case BufferKind::GpuHostVisible:
      return "gpu-host-visible";
    case BufferKind::CpuShared:
      return "cpu-shared";
    case BufferKind::CpuNuma:
      return "cpu-numa";
    case BufferKind::CpuHugePages:
      return "cpu-hugepages";
    case BufferKind::CpuGpuPinned:
      return "cpu-gpu-pinned";
    case BufferKind::CpuPrivate:
      return "cpu-private";
  }
  return "unknown";
}

std::vector<std::byte> ExportDescriptor::serialize() const {
  wire::Writer w;
  w.put(kMagic);
  w.put(version);
  w.put(kind);
  w.put(static_cast<std::uint8_t>(dedicated));
  w.put(allocation_size);
  w.put(buffer_size);
  w.put(offset);
  w.put(size);
  w.put(memory_type_index);
  w.put(usage);
  w.put(memory_flags);
  w.put(device_uuid);
  w.put(driver_uuid);
  return std::move(w).take();
}

Result<ExportDescriptor> ExportDescriptor::deserialize(std::span<const std::byte> bytes) {
  constexpr const char* call = "ExportDescriptor::deserialize";
  wire::Reader r(bytes, call);
  LF_TRY(auto magic, r.get<std::uint32_t>());
  if (magic != kMagic)
    return fail(Errc::Malformed, call, str_format("bad magic {:#x}, not an export descriptor", magic));
  ExportDescriptor d;
  LF_TRY(d.version, r.get<std::uint16_t>());
  if (d.version != kVersion)
    return fail(Errc::VersionMismatch, call,
                str_format("descriptor format version {}, this build reads version {}", d.version, kVersion));
  if (bytes.size() != kSerializedSize)
    return fail(Errc::Malformed, call,
                str_format("{} bytes, a version {} descriptor has {}", bytes.size(), kVersion, kSerializedSize));
  LF_TRY(auto kind, r.get<std::uint8_t>());
  d.kind = static_cast<BufferKind>(kind);
  LF_TRY(auto dedicated, r.get<std::uint8_t>());
  if (dedicated > 1) return fail(Errc::Malformed, call, "dedicated flag is neither 0 nor 1");
  d.dedicated = dedicated == 1;
  LF_TRY(d.allocation_size, r.get<std::uint64_t>());
  LF_TRY(d.buffer_size, r.get<std::uint64_t>());
  LF_TRY(d.offset, r.get<std::uint64_t>());
  LF_TRY(d.size, r.get<std::uint64_t>());
  LF_TRY(d.memory_type_index, r.get<std::uint32_t>());
  LF_TRY(d.usage, r.get<std::uint32_t>());
  LF_TRY(d.memory_flags, r.get<std::uint32_t>());
  LF_TRY_STATUS(r.get(d.device_uuid));
  LF_TRY_STATUS(r.get(d.driver_uuid));
  LF_TRY_STATUS(r.expect_end());
  if (auto ok = d.validate(); !ok) return std::unexpected(ok.error().within(call));
  return d;
}

Status ExportDescriptor::validate() const {
  constexpr const char* call = "ExportDescriptor::validate";
  if (version != kVersion)
    return fail(Errc::VersionMismatch, call, str_format("version {}, expected {}", version, kVersion));
  const auto k = static_cast<std::uint8_t>(kind);
  if (kind == BufferKind::CpuPrivate)
    return fail(Errc::Malformed, call, "buffer kind cpu-private: that memory never leaves its process");
  if (k < 1 || k > 7) return fail(Errc::Malformed, call, str_format("unknown buffer kind {}", k));
  if (size == 0) return fail(Errc::Malformed, call, "size is 0");
  if (buffer_size > allocation_size)
    return fail(Errc::Malformed, call,
                str_format("buffer size {} exceeds allocation size {}", buffer_size, allocation_size));
  if (offset > buffer_size || size > buffer_size - offset)
    return fail(Errc::Malformed, call,
                str_format("range [{}, +{}) exceeds the buffer's {} bytes", offset, size, buffer_size));
  if (is_gpu(kind) && memory_type_index >= 32)
    return fail(Errc::Malformed, call, str_format("memory type index {} out of range", memory_type_index));
  return {};
}

}  // namespace lavaflow
