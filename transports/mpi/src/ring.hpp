// SPDX-License-Identifier: MIT
#pragma once
// Private to lavaflow::mpi: the ring buffers of a channel over MPI, the checks of its options, and
// the GPU copies of staged messages.
#include <sys/mman.h>

#include <bit>
#include <climits>
#include <memory>
#include <optional>
#include <vector>

#include "checks.hpp"
#include "lavaflow/core/cpu_buffer.hpp"
#include "lavaflow/core/detail/format.hpp"
#include "lavaflow/core/vulkan_context.hpp"
#include "lavaflow/mpi/mpi.hpp"
#include "wire.hpp"

namespace lavaflow::mpi::detail {

/// What export_handle() says for every buffer of a channel over MPI.
inline Error stays_here() {
  return Error(Errc::Unsupported, "export_handle",
               "a ring buffer of a channel over MPI stays in its process: MPI moves its bytes");
}

/// A ring buffer of a channel over MPI, as the MPI transport makes it (allocate on the producer's
/// side, import of the producer's announcement on the consumer's): private memory that MPI sends
/// from and receives into and that never leaves the process as an fd. It is an anonymous mapping of
/// its own rather than a memfd mapping, which MPI libraries (MPICH over UCX) handle on their fast
/// path, and its pages are fresh: memory from the malloc heap may have been touched before in 4 KiB
/// pages. A buffer of at least kHugeRing bytes is backed by transparent huge pages (2 MiB-aligned,
/// MADV_HUGEPAGE before its first touch) unless TransportEnv::huge_pages is off: MPI's single-copy
/// path pins the pages of every large message (CMA), and a 2 MiB page costs it what a 4 KiB page
/// does (design note 0010 has the measurements). With GPU staging (TransportEnv::vulkan) it is
/// pinned host memory instead (a CpuBuffer imported into Vulkan), which the GPU's copy engine reaches.
constexpr std::uint64_t kHugeRing = 256u << 10, kHugePage = 2u << 20;

/// `total` bytes of fresh anonymous memory aligned to `align` (a multiple of the page size): a
/// larger mapping whose unaligned head and tail are given back.
inline std::byte* map_aligned(std::uint64_t total, std::uint64_t align) {
  const std::uint64_t extra = align > 4096 ? align : 0;
  void* m = ::mmap(nullptr, total + extra, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (m == MAP_FAILED) return nullptr;
  auto* base = static_cast<std::byte*>(m);
  if (extra == 0) return base;
  const auto addr = reinterpret_cast<std::uintptr_t>(base);
  const std::uint64_t head = (align - addr % align) % align;
  if (head > 0) ::munmap(base, head);
  if (extra - head > 0) ::munmap(base + head + total, extra - head);
  return base + head;
}

class RingBlock final : public Buffer {
 public:
  [[nodiscard]] static Result<std::unique_ptr<RingBlock>> create(const TransportEnv& env, std::uint64_t size) {
    constexpr const char* call = "mpi ring buffer";
    if (size == 0 || size > kMaxRingBlock)
      return fail(Errc::InvalidArgument, call, str_format("{} bytes: outside 1..{}", size, kMaxRingBlock));
    std::unique_ptr<RingBlock> r(new RingBlock(size));
    std::uint64_t total = (size + 4095) / 4096 * 4096;
    if (env.vulkan) {
      auto b =
          CpuBuffer::allocate({.size = total, .strategy = CpuStrategy::GpuPinned, .gpu = env.vulkan, .strict = true});
      if (!b) return std::unexpected(b.error().within(str_format("{} (GPU staging)", call)));
      r->at_ = b->host_ptr();
      r->pinned_.emplace(std::move(*b));
      std::memset(r->at_, 0, total);
      return r;
    }
    std::uint64_t align = 4096;
    const bool huge = env.huge_pages && total >= kHugeRing;  // asked for: the kernel may still say no
    if (huge) {
      align = kHugePage;
      total = (total + kHugePage - 1) / kHugePage * kHugePage;
    }
    std::byte* p = map_aligned(total, align);
    if (p == nullptr) return fail(Errc::OutOfMemory, call, str_format("{} bytes: {}", total, std::strerror(errno)));
    r->mapping_.reset({p, total});
    if (huge) (void)::madvise(p, total, MADV_HUGEPAGE);  // advice: without THP the ring still works
    std::memset(p, 0, total);  // faulted in now (in huge pages where granted), not on the message path
    r->at_ = p;
    return r;
  }

  [[nodiscard]] std::uint64_t size() const override { return size_; }
  [[nodiscard]] BufferKind kind() const override { return pinned_ ? BufferKind::CpuGpuPinned : BufferKind::CpuPrivate; }
  [[nodiscard]] std::byte* host_ptr() const override { return at_; }
  [[nodiscard]] Result<Export> export_handle() const override { return std::unexpected(stays_here()); }
  /// GPU staging: the Vulkan buffer over the same pages; null otherwise.
  [[nodiscard]] vk::Buffer gpu_buffer() const { return pinned_ ? pinned_->gpu_buffer() : vk::Buffer{}; }

  /// Far beyond any ring (a slot is under 2 GiB, a ring at most 1024 slots), and small enough that no
  /// size overflows.
  static constexpr std::uint64_t kMaxRingBlock = std::uint64_t{1} << 44;

 private:
  explicit RingBlock(std::uint64_t size) : size_(size) {}
  UniqueMapping mapping_;
  std::optional<CpuBuffer> pinned_;
  std::byte* at_ = nullptr;
  std::uint64_t size_;
};

/// The ring of a channel: slot_size + kMaxTrailer bytes per slot, page-aligned. Without GPU staging
/// every slot is in one block (so that the ring as a whole reaches the huge-page size); with it each
/// slot is a block of its own.
struct Ring {
  std::vector<std::unique_ptr<Buffer>> blocks;
  std::vector<std::byte*> at;       // where each slot starts
  std::vector<vk::Buffer> staging;  // GPU staging: each slot's Vulkan buffer (the slot at offset 0)
  std::uint64_t slot_bytes = 0;     // slot_size + kMaxTrailer
  [[nodiscard]] std::byte* host_ptr(std::uint32_t slot) const { return at[slot]; }
  [[nodiscard]] std::span<std::byte> bytes(std::uint32_t slot) const { return {at[slot], slot_bytes}; }
};

/// One slot of a Ring as the Buffer a Loan or Received shows: `slot_size` bytes (the trailer's
/// room after them is the channel's own).
class RingSlot final : public Buffer {
 public:
  RingSlot(std::byte* at, std::uint64_t size, BufferKind kind) : at_(at), size_(size), kind_(kind) {}
  [[nodiscard]] std::uint64_t size() const override { return size_; }
  [[nodiscard]] BufferKind kind() const override { return kind_; }
  [[nodiscard]] std::byte* host_ptr() const override { return at_; }
  [[nodiscard]] Result<Export> export_handle() const override { return std::unexpected(stays_here()); }

 private:
  std::byte* at_;
  std::uint64_t size_;
  BufferKind kind_;
};

/// The ring's slots as Buffers, for the Producer or Consumer around the channel's link.
inline std::vector<std::unique_ptr<Buffer>> slot_buffers(const Ring& ring, std::uint64_t slot_size) {
  std::vector<std::unique_ptr<Buffer>> out;
  const auto kind = ring.staging.empty() ? BufferKind::CpuPrivate : BufferKind::CpuGpuPinned;
  for (auto* at : ring.at) out.push_back(std::make_unique<RingSlot>(at, slot_size, kind));
  return out;
}

/// A channel's ring through the MPI transport: the producer's from allocate(), the consumer's from
/// import() of the shape the producer announced.
enum class RingSide : std::uint8_t { Producer, Consumer };
inline Result<Ring> make_ring(RingSide side, std::uint32_t slots, std::uint64_t slot_size, const TransportEnv& env) {
  Ring r;
  r.slot_bytes = slot_size + kMaxTrailer;
  const std::uint64_t stride = (r.slot_bytes + 4095) / 4096 * 4096;
  const bool staged = env.vulkan != nullptr;
  const std::uint32_t blocks = staged ? slots : 1;
  const std::uint64_t block_bytes = staged ? stride : stride * slots;
  const auto transport = mpi_transport();
  for (std::uint32_t k = 0; k < blocks; ++k) {
    Result<std::unique_ptr<Buffer>> b;
    if (side == RingSide::Producer) {
      b = transport->allocate(env, block_bytes);
    } else {
      ExportDescriptor d;
      d.kind = staged ? BufferKind::CpuGpuPinned : BufferKind::CpuPrivate;
      d.allocation_size = d.buffer_size = d.size = block_bytes;
      b = transport->import(env, d, UniqueFd{});
    }
    if (!b) return std::unexpected(b.error().within(str_format("mpi ring of {} slots of {} bytes", slots, stride)));
    r.blocks.push_back(std::move(*b));
  }
  for (std::uint32_t k = 0; k < slots; ++k) {
    const auto& block = static_cast<const RingBlock&>(*r.blocks[staged ? k : 0]);
    r.at.push_back(block.host_ptr() + (staged ? 0 : k * stride));
    if (staged) r.staging.push_back(block.gpu_buffer());
  }
  return r;
}

/// GPU copies between ring buffers and GPU buffers, one submission per chunk, each with its own
/// fence: the CPU sends (or the GPU uploads) chunk k while the GPU copies chunk k + 1. Fences, not a
/// timeline semaphore, so that it works on every driver (lavapipe included).
class ChunkCopier {
 public:
  static Result<std::unique_ptr<ChunkCopier>> create(const VulkanContext& vk) {
    try {
      auto c = std::unique_ptr<ChunkCopier>(new ChunkCopier(vk));
      c->pool_ =
          vk::raii::CommandPool(vk.device(), {vk::CommandPoolCreateFlagBits::eResetCommandBuffer, vk.queue_family()});
      return c;
    } catch (const vk::SystemError& e) {
      return fail(Errc::Driver, "vkCreateCommandPool", e.what());
    }
  }
  ~ChunkCopier() {
    for (auto& c : copies_)
      if (c.busy) (void)vk_.device().waitForFences(*c.fence, VK_TRUE, 10'000'000'000ull);
  }

  /// Queues a copy; returns a ticket for wait().
  Result<std::size_t> copy(vk::Buffer src, std::uint64_t src_offset, vk::Buffer dst, std::uint64_t dst_offset,
                           std::uint64_t bytes) {
    try {
      std::size_t i = 0;  // a command buffer whose last copy is done, else a new one
      while (i < copies_.size() && copies_[i].busy && copies_[i].fence.getStatus() != vk::Result::eSuccess) ++i;
      if (i == copies_.size())
        copies_.push_back(
            {std::move(vk::raii::CommandBuffers(vk_.device(), {*pool_, vk::CommandBufferLevel::ePrimary, 1})[0]),
             vk::raii::Fence(vk_.device(), vk::FenceCreateInfo{}), false});
      auto& c = copies_[i];
      if (c.busy) vk_.device().resetFences(*c.fence);
      c.cb.reset();
      c.cb.begin({vk::CommandBufferUsageFlagBits::eOneTimeSubmit});
      c.cb.copyBuffer(src, dst, vk::BufferCopy(src_offset, dst_offset, bytes));
      vk::MemoryBarrier visible(vk::AccessFlagBits::eTransferWrite,
                                vk::AccessFlagBits::eHostRead | vk::AccessFlagBits::eMemoryRead);
      c.cb.pipelineBarrier(vk::PipelineStageFlagBits::eTransfer,
                           vk::PipelineStageFlagBits::eHost | vk::PipelineStageFlagBits::eAllCommands, {}, visible, {},
                           {});
      c.cb.end();
      vk::CommandBuffer raw = *c.cb;
      vk_.queue().submit(vk::SubmitInfo({}, {}, raw), *c.fence);
      c.busy = true;
      return i;
    } catch (const vk::SystemError& e) {
      return fail(Errc::Driver, "vkQueueSubmit(chunk copy)", e.what());
    }
  }
  Status wait(std::size_t ticket, Duration timeout) {
    const auto ns =
        timeout == kForever ? UINT64_MAX : static_cast<std::uint64_t>(std::chrono::nanoseconds(timeout).count());
    if (vk_.device().waitForFences(*copies_.at(ticket).fence, VK_TRUE, ns) != vk::Result::eSuccess)
      return fail(Errc::Timeout, "vkWaitForFences(chunk copy)", "the GPU did not finish a chunk copy in time");
    return {};
  }

 private:
  explicit ChunkCopier(const VulkanContext& vk) : vk_(vk) {}
  struct Copy {
    vk::raii::CommandBuffer cb;
    vk::raii::Fence fence;
    bool busy;
  };
  const VulkanContext& vk_;
  vk::raii::CommandPool pool_{nullptr};
  std::vector<Copy> copies_;  // destroyed before the pool
};

inline Status check_staging(const ChannelOptions& o, const GpuBuffer& gpu, std::uint64_t offset, std::uint64_t size,
                            const char* call) {
  if (!o.vulkan)
    return fail(Errc::InvalidArgument, call, "GPU staging needs ChannelOptions::vulkan (the GPU buffer's device)");
  if (offset > gpu.size() || size > gpu.size() - offset)
    return fail(Errc::InvalidArgument, call,
                str_format("range [{}, +{}) outside the {}-byte GPU buffer", offset, size, gpu.size()));
  return {};
}

inline Status check_options(const ChannelOptions& o, const char* call) {
  LF_TRY_STATUS(detail::check_channel(o.channel, call));
  if (o.policy == FullPolicy::DropOldest)
    return fail(Errc::Unsupported, call, "DropOldest is not available over MPI: a sent message cannot be taken back");
  if (o.slots == 0 || o.slots > 1024)
    return fail(Errc::InvalidArgument, call, str_format("{} slots, allowed 1..1024", o.slots));
  if (o.slot_size == 0 || o.slot_size > static_cast<std::uint64_t>(INT_MAX) - kMaxTrailer)
    return fail(Errc::InvalidArgument, call,
                str_format("slot size {} outside 1..{} (one MPI count holds a slot and its trailer)", o.slot_size,
                           static_cast<std::uint64_t>(INT_MAX) - kMaxTrailer));
  if (!std::has_single_bit(o.chunk) || o.chunk < (1u << kMinChunkLog2) || o.chunk > (1u << kMaxChunkLog2))
    return fail(Errc::InvalidArgument, call, str_format("chunk {} is not a power of two in 4 KiB..1 GiB", o.chunk));
  return {};
}

}  // namespace lavaflow::mpi::detail
