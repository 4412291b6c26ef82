// SPDX-License-Identifier: MIT
#pragma once
/// @file
/// The common interface of GPU and CPU buffers, and the plain-data export descriptor that travels
/// (with one fd) to another process or API.

#include <cstddef>
#include <cstdint>
#include <span>
#include <string_view>
#include <vector>

#include "lavaflow/core/error.hpp"
#include "lavaflow/core/location.hpp"
#include "lavaflow/core/unique_fd.hpp"

namespace lavaflow {

enum class BufferKind : std::uint8_t {
  GpuDeviceLocal = 1,  ///< Vulkan memory, device-local (may also be host-visible on UMA/CPU drivers)
  GpuHostVisible = 2,  ///< Vulkan memory, host-visible and coherent
  CpuShared = 3,       ///< memfd shared memory
  CpuNuma = 4,         ///< memfd bound to one NUMA node
  CpuHugePages = 5,    ///< memfd on huge pages (MFD_HUGETLB)
  CpuGpuPinned = 6,    ///< memfd also imported into Vulkan (VK_EXT_external_memory_host)
  CpuPrivate = 7,      ///< this process's own memory (e.g. a ring that MPI sends from): never exported
};
[[nodiscard]] std::string_view to_string(BufferKind k) noexcept;
[[nodiscard]] constexpr bool is_gpu(BufferKind k) noexcept {
  return k == BufferKind::GpuDeviceLocal || k == BufferKind::GpuHostVisible;
}

/// Everything an importer needs besides the fd. Plain data; `serialize()` gives a versioned,
/// fixed layout that `deserialize()` validates completely.
struct ExportDescriptor {
  static constexpr std::uint32_t kMagic = 0x44584c46;  // "FLXD"
  static constexpr std::uint16_t kVersion = 1;
  static constexpr std::size_t kSerializedSize = 4 + 2 + 1 + 1 + 8 * 4 + 4 + 4 + 4 + 16 + 16;

  std::uint16_t version = kVersion;
  BufferKind kind = BufferKind::CpuShared;
  bool dedicated = false;               ///< Vulkan dedicated allocation (GPU kinds)
  std::uint64_t allocation_size = 0;    ///< bytes of the memory object behind the fd
  std::uint64_t buffer_size = 0;        ///< VkBuffer creation size (GPU kinds), equals allocation for CPU
  std::uint64_t offset = 0;             ///< start of the user's range inside the buffer
  std::uint64_t size = 0;               ///< length of the user's range
  std::uint32_t memory_type_index = 0;  ///< exporter's Vulkan memory type (GPU kinds)
  std::uint32_t usage = 0;              ///< VkBufferUsageFlags the buffer was created with
  std::uint32_t memory_flags = 0;       ///< VkMemoryPropertyFlags of that memory type
  Uuid device_uuid{};                   ///< exporter's device (zero for CPU kinds)
  Uuid driver_uuid{};                   ///< exporter's driver (zero for CPU kinds)

  [[nodiscard]] std::vector<std::byte> serialize() const;
  [[nodiscard]] static Result<ExportDescriptor> deserialize(std::span<const std::byte> bytes);
  /// Internal consistency (range inside the allocation, known kind, non-zero size).
  [[nodiscard]] Status validate() const;
};

/// An exported buffer: the descriptor and the one fd that refers to its memory.
struct Export {
  ExportDescriptor descriptor;
  UniqueFd fd;
};

/// What every lava-flow buffer offers.
class Buffer {
 public:
  virtual ~Buffer() = default;
  /// Bytes usable by the caller.
  [[nodiscard]] virtual std::uint64_t size() const = 0;
  [[nodiscard]] virtual BufferKind kind() const = 0;
  /// The mapped bytes, or nullptr when the memory is not host-visible.
  [[nodiscard]] virtual std::byte* host_ptr() const = 0;
  /// A new fd (owned by the returned Export) and descriptor for another process or API.
  [[nodiscard]] virtual Result<Export> export_handle() const = 0;

  /// The mapped bytes as a span (empty when not host-visible).
  [[nodiscard]] std::span<std::byte> bytes() const {
    auto* p = host_ptr();
    return p ? std::span<std::byte>(p, size()) : std::span<std::byte>();
  }

 protected:
  Buffer() = default;
  Buffer(Buffer&&) = default;
  Buffer& operator=(Buffer&&) = default;
};

}  // namespace lavaflow
