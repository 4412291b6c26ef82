// SPDX-License-Identifier: MIT
#pragma once
/// @file
/// A memory pool for every kind of memory lava-flow allocates. Buffers are carved from a few large
/// exportable allocations (segments), so renting is cheap, a thousand small buffers cost a handful of
/// fds, and a rented buffer still crosses processes: its export is the segment's fd with the
/// buffer's offset and size in the descriptor, which every importer already honours.

#include <cstdint>
#include <filesystem>
#include <functional>
#include <limits>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "lavaflow/core/buffer.hpp"
#include "lavaflow/core/detail/pool_cache.hpp"
#include "lavaflow/core/vulkan_context.hpp"

namespace lavaflow {

struct PoolOptions {
  /// The device for the GPU kinds and CpuGpuPinned; the pool keeps this handle. Without it, renting
  /// those kinds fails with Unsupported.
  std::optional<VulkanContext> vulkan;
  /// Where GpuDeviceLocal segments come from instead of `vulkan` (the CUDA adapter's pool of
  /// cuMemCreate memory sets it: cuda::make_pool): a Buffer of GpuDeviceLocal kind and at least the
  /// bytes asked for, called under the pool's lock.
  std::function<Result<std::unique_ptr<Buffer>>(std::uint64_t bytes)> device_segments;
  /// Segment size of the large pool (buffers above kSmallMax). A larger request gets a segment of its
  /// own size, which is cached like any other after the buffer returns.
  std::uint64_t segment_bytes = std::uint64_t{64} << 20;
  /// Segment size of the small pool (buffers up to kSmallMax).
  std::uint64_t small_segment_bytes = std::uint64_t{2} << 20;
  /// Cap on cached bytes (reserved but not rented). A return that takes the pool above it releases
  /// wholly free segments until it is below; host shared memory (CpuShared, CpuNuma) also gives
  /// the pages of the returned free range back to the system when its segment is still in use
  /// (reserved_bytes counts only backed bytes; a later rent there gets fresh zeroed pages, not a
  /// new segment). Blocks that threads keep (below) are outside the cap; with a cap, a thread
  /// keeps at most an eighth of it in large blocks.
  std::uint64_t max_cached_bytes = std::numeric_limits<std::uint64_t>::max();
  /// A second cap, that follows the load (0: none): cached bytes at most this share of the bytes
  /// rented out, but never less than half a large segment (`segment_bytes`), so that a pool with
  /// little out still keeps what it just had; with it, a thread keeps at most a quarter of a large
  /// segment in large blocks. It bounds fragmentation (reserved − in use) for workloads of many
  /// sizes; the price is that a block of a whole segment or more is not kept when little else is
  /// out (its next rent allocates again), which is why it is off by default.
  double max_cached_share = 0;
  /// Host shared memory (CpuShared, CpuNuma) only: the free pages that the pool keeps touched
  /// beyond this share of the host bytes rented out, and beyond half a large segment, go back to
  /// the system as blocks return, as malloc gives large blocks back (the large blocks a thread
  /// keeps for itself, below, stay warm). The segments and their fds stay: a later
  /// rent there is a hit that gets fresh zeroed pages. A new segment's pages count as reserved
  /// only once a block is carved over them. 0: every touched page stays.
  double host_page_share = 0.05;
  /// Bytes per size class that each thread keeps for itself (the lock-free path); 0: every rent
  /// and return takes the pool's lock.
  std::uint64_t thread_cache_bytes = std::uint64_t{512} << 10;
  /// Bytes of large buffers (a few, matched by exact size) that each thread keeps; 0: none.
  std::uint64_t thread_cache_large_bytes = std::uint64_t{64} << 20;
  /// Non-empty: while the pool lives, other processes of this user can read its statistics
  /// (`lavaflow-info --pool`, read_published_pools) from a socket named pool-<pid>-<label>.sock
  /// in `stats_directory` (empty: runtime_directory()). A thread of the pool's answers them.
  std::string stats_label;
  std::filesystem::path stats_directory;
};

struct RentOptions {
  std::uint64_t size = 0;
  BufferKind kind = BufferKind::CpuShared;
  /// CpuNuma only: the node to rent on; -1: the node of the calling CPU.
  int numa_node = -1;
};

/// A buffer rented from a MemoryPool; returns itself to the pool when destroyed. Move-only. It
/// exports like any other buffer: the descriptor names `size()` bytes at the buffer's place in its
/// segment, and importers map that range. The fd is the segment's, though: a process that receives
/// it can reach the segment's other buffers too, and a block returned to the pool is rented again
/// with whatever bytes it held. Share pooled buffers with processes you trust; give others buffers
/// from a pool of their own (or above `segment_bytes`, which get a segment each).
///
/// A small buffer's rent and return run inline in the caller and read the calling thread's cache
/// through a thread-local: a coroutine that holds one across a suspension after which it may
/// resume on another thread returns it (reset()) before it suspends, since compilers may keep a
/// thread-local's address across the suspension.
class PooledBuffer final : public Buffer {
 public:
  PooledBuffer() = default;
  // Inline, as is the destructor: a rent returns the buffer through a Result, and the moves and
  // the moved-from destructor then cost nothing.
  PooledBuffer(PooledBuffer&& o) noexcept
      : pool_(std::exchange(o.pool_, nullptr)),
        segment_(o.segment_),
        offset_(o.offset_),
        host_(std::exchange(o.host_, nullptr)),
        size_(o.size_),
        place_(o.place_) {}
  PooledBuffer& operator=(PooledBuffer&& o) noexcept {
    if (this != &o) {
      reset();
      pool_ = std::exchange(o.pool_, nullptr);
      segment_ = o.segment_;
      offset_ = o.offset_;
      host_ = std::exchange(o.host_, nullptr);
      size_ = o.size_;
      place_ = o.place_;
    }
    return *this;
  }
  ~PooledBuffer() override {
    if (pool_) give_back();
  }

  [[nodiscard]] std::uint64_t size() const override { return size_; }
  [[nodiscard]] BufferKind kind() const override;
  [[nodiscard]] std::byte* host_ptr() const override { return host_; }
  [[nodiscard]] Result<Export> export_handle() const override;

  /// Bytes reserved for this buffer (its size class); at least size().
  [[nodiscard]] std::uint64_t capacity() const;
  /// The Vulkan buffer that covers the segment (GPU kinds and CpuGpuPinned; null otherwise) and this
  /// buffer's offset inside it.
  [[nodiscard]] vk::Buffer gpu_buffer() const;
  [[nodiscard]] std::uint64_t gpu_offset() const;
  /// The allocation this buffer lives in, and the buffer's offset in that allocation's user range;
  /// only while the buffer is rented (a returned or moved-from buffer has none).
  [[nodiscard]] const Buffer& segment() const;
  [[nodiscard]] std::uint64_t offset() const { return offset_; }
  /// Returns the buffer to the pool now (idempotent).
  void reset() noexcept {
    if (pool_) {
      give_back();
      pool_ = nullptr;
      segment_ = nullptr;
      host_ = nullptr;
    }
  }
  /// Gives the buffer up without returning its memory: for memory that other processes may still
  /// read or write (a channel's ring while consumers hold it). The block is never rented again; it
  /// goes with its segment when the pool is destroyed. Counts as a return in the statistics.
  void retire() noexcept;
  [[nodiscard]] explicit operator bool() const { return pool_ != nullptr; }

 private:
  friend class MemoryPool;
  friend struct detail::PoolState;
  PooledBuffer(detail::PoolHead* pool, detail::PoolSegment* segment, std::uint64_t offset, std::byte* host,
               std::uint64_t size, std::uint32_t slot, std::uint32_t size_class)
      : pool_(pool),
        segment_(segment),
        offset_(offset),
        host_(host),
        size_(size),
        place_(std::uint64_t{slot} << 32 | size_class) {}

  [[nodiscard]] std::uint32_t slot() const { return static_cast<std::uint32_t>(place_ >> 32); }
  [[nodiscard]] std::uint32_t size_class() const { return static_cast<std::uint32_t>(place_); }

  /// Gives the block back: a small one to the calling thread's cache when the thread keeps blocks of
  /// its kind and class and has room (inline: no call), anything else through the pool. May leave
  /// this buffer's fields as they were.
  void give_back() noexcept {
    auto& last = detail::t_pool_last;
    const std::uint32_t cls = size_class(), slot = this->slot();
    if (last.state.load(std::memory_order_relaxed) == pool_ && slot < detail::kPoolKindSlots &&
        cls < detail::kPoolSmallClasses) [[likely]] {
      if (detail::PoolSlotCacheHead* sc = last.slots[slot]) [[likely]] {
        if (auto& stack = sc->blocks[cls]; !stack.full()) [[likely]] {
          stack.push({segment_, offset_, host_});
          sc->counters[cls].returned(size_);
          // Dekker with ~MemoryPool: it stores `closing` and then counts the returns; this thread
          // counts its return and then loads `closing`. One of the two sees the other.
          pool_->fence.light();
          if (pool_->closing.load(std::memory_order_relaxed)) [[unlikely]]
            returned_after_close();
          return;
        }
      }
    }
    give_back_slow();
  }
  void give_back_slow() noexcept;
  /// The pool's handle closed: the last buffer back releases it.
  void returned_after_close() noexcept;

  detail::PoolHead* pool_ = nullptr;
  detail::PoolSegment* segment_ = nullptr;
  std::uint64_t offset_ = 0;
  std::byte* host_ = nullptr;  // the segment's mapping at offset_; null for memory not mapped here
  std::uint64_t size_ = 0;
  // Slot and size class in one word: a move copies it with one load and one store, which the CPU
  // forwards from the constructor's store (two narrower stores would stall the load).
  std::uint64_t place_ = 0;
};

/// One statistic in PyTorch's `memory_stats()` shape.
struct PoolStat {
  std::int64_t current = 0;
  std::int64_t peak = 0;
  std::uint64_t allocated = 0;  ///< total ever added
  std::uint64_t freed = 0;      ///< total ever removed
};

/// The statistics of one group (all, small_pool, large_pool, or one memory kind).
///  - allocation / allocated_bytes: rented buffers (bytes of their size classes);
///  - requested_bytes: what callers asked for;
///  - active / active_bytes: blocks carved out of segments (rented, or kept by a thread's cache);
///  - segment / reserved_bytes: memory held from the system or driver;
///  - inactive_split_bytes: free bytes inside segments that are partly in use (current only).
/// Peaks of segment, reserved and active are exact. Renting and returning take no lock, so the
/// peaks of allocation, allocated_bytes and requested_bytes are the largest values that stats()
/// has seen; the active peak bounds them from above.
struct PoolStatGroup {
  PoolStat allocation, segment, active;
  PoolStat allocated_bytes, reserved_bytes, active_bytes, requested_bytes, inactive_split_bytes;
};

struct PoolClassStats {
  std::uint64_t size = 0;  ///< the class's block size (large buffers: the power of two bounding the bucket)
  std::uint64_t rents = 0, hits = 0, returns = 0;
};

struct PoolKindStats {
  BufferKind kind = BufferKind::CpuShared;
  int numa_node = -1;  ///< CpuNuma: the node; -1 otherwise
  PoolStatGroup stats;
  std::uint64_t hits = 0, misses = 0;
};

struct PoolStats {
  PoolStatGroup all, small_pool, large_pool;
  std::vector<PoolKindStats> kinds;     ///< kinds that were rented at least once
  std::vector<PoolClassStats> classes;  ///< classes that were rented at least once
  /// A rent is a hit when no new segment was needed for it, a miss when one was.
  std::uint64_t num_hits = 0, num_misses = 0;
  /// Segment allocations that failed, after which cached memory was released and the allocation
  /// retried once; and those that failed again (the rent returned OutOfMemory or the driver's error).
  std::uint64_t num_alloc_retries = 0, num_ooms = 0;
  /// Returned blocks still carved (active) because memory for the free ranges' index ran out:
  /// they go back at the next release that finds memory or at trim() (past a fixed number of
  /// them, with the pool).
  std::uint64_t num_kept_carved = 0;
  std::uint64_t num_device_alloc = 0, num_device_free = 0;
  /// fds the pool holds open (CPU segments keep their memfd; Vulkan segments hold none until exported).
  std::uint64_t open_fds = 0;

  [[nodiscard]] double reuse_rate() const;
  /// reserved − allocated bytes: what the pool holds beyond what is rented.
  [[nodiscard]] std::int64_t fragmentation_bytes() const;
  /// A flat JSON object with PyTorch-style keys ("allocated_bytes.all.current", ...).
  [[nodiscard]] std::string to_json() const;
};

/// Rents buffers of every memory kind. Thread-safe. The pool handle is move-only; destroying it
/// while buffers are still rented is allowed: the pool's memory is released when the last of them
/// returns.
class MemoryPool {
 public:
  /// Largest size served by the small pool (size classes, per-thread caches).
  static constexpr std::uint64_t kSmallMax = detail::kPoolSmallMax;
  /// Every buffer's offset and capacity are multiples of this.
  static constexpr std::uint64_t kAlignment = detail::kPoolAlign;

  [[nodiscard]] static Result<MemoryPool> create(PoolOptions options = {});

  MemoryPool(MemoryPool&& other) noexcept;
  MemoryPool& operator=(MemoryPool&& other) noexcept;
  ~MemoryPool();

  [[nodiscard]] Result<PooledBuffer> rent(std::uint64_t size, BufferKind kind = BufferKind::CpuShared) {
    // A small block from the calling thread's cache, inline (no call): the common case of a thread
    // that rents and returns one shape again and again. Everything else goes out of line.
    auto& last = detail::t_pool_last;
    const auto k = static_cast<std::uint32_t>(kind) - 1;
    if (k < detail::kPoolKindSlots && kind != BufferKind::CpuNuma && size - 1 < kSmallMax && head_ != nullptr &&
        last.state.load(std::memory_order_relaxed) == head_) [[likely]] {
      if (detail::PoolSlotCacheHead* sc = last.slots[k]) [[likely]] {
        const std::uint32_t cls = detail::pool_small_class(size);
        if (auto& stack = sc->blocks[cls]; !stack.empty()) [[likely]] {
          const detail::PoolCachedBlock b = stack.pop();
          sc->counters[cls].rented(size);
          return PooledBuffer(head_, b.segment, b.offset, b.host, size, k, cls);
        }
      }
    }
    return rent_slow(size, kind);
  }
  [[nodiscard]] Result<PooledBuffer> rent(const RentOptions& options);
  /// Releases every wholly free segment and the free pages of host segments still in use, after
  /// returning the calling thread's cached blocks and the large blocks that other threads keep and
  /// are not using at that moment (where the kernel has membarrier). Other threads return their
  /// small blocks (and large ones they were using) at their next rent or return.
  void trim();
  [[nodiscard]] PoolStats stats() const;
  /// The pool's options (not on a moved-from pool).
  [[nodiscard]] const PoolOptions& options() const;

 private:
  explicit MemoryPool(std::shared_ptr<detail::PoolState> state);
  [[nodiscard]] Result<PooledBuffer> rent_slow(std::uint64_t size, BufferKind kind);
  std::shared_ptr<detail::PoolState> state_;
  detail::PoolHead* head_ = nullptr;  // state_'s, for the inline rent path
};

}  // namespace lavaflow
