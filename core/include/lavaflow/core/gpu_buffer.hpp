// SPDX-License-Identifier: MIT
#pragma once
/// @file
/// Exportable Vulkan buffers: dedicated allocations exported as opaque POSIX fds.

#include <memory>

#include "lavaflow/core/buffer.hpp"
#include "lavaflow/core/vulkan_context.hpp"

namespace lavaflow {

/// DeviceLocalMapped: device-local memory the host can also map (a resizable BAR, or any memory on
/// integrated and CPU drivers), else plain host-visible memory — for small words that GPU work
/// polls (fast when local) and the host reads now and then.
enum class GpuMemory : std::uint8_t { DeviceLocal, HostVisible, DeviceLocalMapped };

struct GpuBufferOptions {
  std::uint64_t size = 0;
  GpuMemory memory = GpuMemory::DeviceLocal;
  vk::BufferUsageFlags usage = vk::BufferUsageFlagBits::eStorageBuffer | vk::BufferUsageFlagBits::eTransferSrc |
                               vk::BufferUsageFlagBits::eTransferDst;
};

/// Extra bytes lava-flow allocates past the requested size so every importer can map the whole
/// requested range (llvmpipe's GL rejects a buffer reaching the last 16 bytes of imported memory).
inline constexpr std::uint64_t kGpuTailPadding = 256;

class GpuBuffer final : public Buffer {
 public:
  /// A new dedicated, exportable allocation on `ctx`'s device.
  [[nodiscard]] static Result<GpuBuffer> allocate(const VulkanContext& ctx, const GpuBufferOptions& options);
  /// Imports memory exported by another process or context. Checks the descriptor (version,
  /// range, device and driver UUID) before any driver call. Consumes `fd` on success only: on
  /// failure the caller still owns it. The buffer keeps the fd, so export_handle() on an imported
  /// buffer hands the same memory on (to CUDA, GL, OpenCL or a further process).
  [[nodiscard]] static Result<GpuBuffer> import(const VulkanContext& ctx, const ExportDescriptor& desc, UniqueFd&& fd);

  /// A descriptor under which import() takes memory that another API allocated on this device and
  /// exported as an opaque fd (e.g. CUDA's cuMemCreate): not dedicated, a device-local memory
  /// type this device allows for buffers, the buffer spanning the whole allocation and the user's
  /// range its first `size` bytes.
  [[nodiscard]] static Result<ExportDescriptor> describe_foreign(const VulkanContext& ctx,
                                                                 std::uint64_t allocation_size, std::uint64_t size);

  GpuBuffer(GpuBuffer&&) noexcept;
  GpuBuffer& operator=(GpuBuffer&&) noexcept;
  ~GpuBuffer() override;

  [[nodiscard]] std::uint64_t size() const override;
  [[nodiscard]] BufferKind kind() const override;
  [[nodiscard]] std::byte* host_ptr() const override;
  [[nodiscard]] Result<Export> export_handle() const override;

  [[nodiscard]] vk::Buffer buffer() const;
  [[nodiscard]] vk::DeviceMemory memory() const;
  /// Offset of the user's range inside buffer().
  [[nodiscard]] std::uint64_t offset() const;
  [[nodiscard]] const ExportDescriptor& descriptor() const;

 private:
  struct Impl;
  explicit GpuBuffer(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace lavaflow
