// SPDX-License-Identifier: MIT
// The CUDA adapter's pool: core's MemoryPool with cuMemCreate segments for GpuDeviceLocal.
#include <optional>
#include <utility>

#include "lavaflow/core/detail/format.hpp"
#include "lavaflow/cuda/cuda.hpp"
#include "runtime.hpp"

namespace lavaflow::cuda {

namespace {

/// One cuMemCreate allocation as a pool segment. It has no host mapping; its export is the one
/// Vulkan importers take, where the pool has a Vulkan device on the same GPU.
class CudaSegment final : public lavaflow::Buffer {
 public:
  CudaSegment(ExportableAllocation memory, std::optional<VulkanContext> vulkan)
      : memory_(std::move(memory)), vulkan_(std::move(vulkan)) {}
  [[nodiscard]] std::uint64_t size() const override { return memory_.size(); }
  [[nodiscard]] BufferKind kind() const override { return BufferKind::GpuDeviceLocal; }
  [[nodiscard]] std::byte* host_ptr() const override { return nullptr; }
  [[nodiscard]] Result<Export> export_handle() const override {
    if (!vulkan_)
      return fail(Errc::Unsupported, "cuda::pool export_handle",
                  "the pool has no Vulkan device to export CUDA memory for; a CUDA peer maps it through "
                  "cuda::export_pooled");
    return memory_.export_for(*vulkan_);
  }
  [[nodiscard]] const ExportableAllocation& memory() const { return memory_; }

 private:
  ExportableAllocation memory_;
  std::optional<VulkanContext> vulkan_;
};

const CudaSegment* segment_of(const PooledBuffer& b) {
  return b ? dynamic_cast<const CudaSegment*>(&b.segment()) : nullptr;
}

}  // namespace

Result<MemoryPool> make_pool(const Interop& interop, PoolOptions options) {
  std::optional<VulkanContext> vulkan;
  if (options.vulkan && options.vulkan->capabilities().identity.device_uuid == interop.device().uuid)
    vulkan = options.vulkan;
  options.device_segments = [interop, vulkan](std::uint64_t bytes) -> Result<std::unique_ptr<lavaflow::Buffer>> {
    // Allocating makes the pool's device current; the renting thread's own stays current after.
    auto memory = [&] {
      const detail::KeepCurrentDevice keep;
      return interop.allocate_exportable(bytes, true);  // the pool carves the granules' tail too
    }();
    if (!memory) return std::unexpected(memory.error());
    return std::make_unique<CudaSegment>(std::move(*memory), vulkan);
  };
  return MemoryPool::create(std::move(options));
}

void* device_pointer(const PooledBuffer& buffer) {
  const auto* s = segment_of(buffer);
  return s ? static_cast<std::byte*>(s->memory().data()) + buffer.offset() : nullptr;
}

Result<PooledExport> export_pooled(const PooledBuffer& buffer) {
  const auto* s = segment_of(buffer);
  if (!s)
    return fail(Errc::InvalidArgument, "cuda::export_pooled",
                buffer ? "the buffer is not CUDA memory of a cuda::make_pool pool" : "the buffer was returned");
  LF_TRY(auto fd, s->memory().export_fd());
  return PooledExport{std::move(fd), s->memory().allocation_size(), s->memory().size(), buffer.offset(), buffer.size()};
}

}  // namespace lavaflow::cuda
