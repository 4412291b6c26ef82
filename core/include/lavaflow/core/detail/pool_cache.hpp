// SPDX-License-Identifier: MIT
#pragma once
/// @file
/// The part of the memory pool that a small buffer's rent and return touch when the calling
/// thread's cache serves them: the thread's cache stacks, their counters, and the pool's closing
/// flag. MemoryPool::rent and ~PooledBuffer run that path inline, in the caller's code, so that it
/// costs no call; everything else is in pool.cpp, which builds its caches on these types. Not for
/// applications: the layout changes with the library.

#include <array>
#include <atomic>
#include <bit>
#include <cstddef>
#include <cstdint>

#include "lavaflow/core/detail/process_fence.hpp"

namespace lavaflow::detail {

struct PoolState;
struct PoolSegment;
struct ThreadCache;

inline constexpr std::uint64_t kPoolAlign = 256;
inline constexpr std::uint64_t kPoolSmallMax = std::uint64_t{1} << 20;
inline constexpr std::uint32_t kPoolSmallClasses = 44;  // 256 B .. 1 MiB: four classes per doubling above 1 KiB
inline constexpr std::uint32_t kPoolLargeBuckets = 44;  // statistics of large buffers, one bucket per doubling
inline constexpr std::uint32_t kPoolClasses = kPoolSmallClasses + kPoolLargeBuckets;
// BufferKind values 1..6, the kinds a pool rents (CpuPrivate, never exported, is not one); CpuNuma's
// slot is per node (after these), and only these have a cache the inline path finds.
inline constexpr std::uint32_t kPoolKindSlots = 6;

/// The small class of `n` bytes (1 ≤ n ≤ kPoolSmallMax).
constexpr std::uint32_t pool_small_class(std::uint64_t n) {
  if (n <= 1024) return static_cast<std::uint32_t>((n + kPoolAlign - 1) / kPoolAlign - 1);
  const auto p = static_cast<unsigned>(std::bit_width(n - 1) - 1);  // 2^p < n <= 2^(p+1)
  const std::uint64_t step = std::uint64_t{1} << (p - 2);           // a shift: division costs the fast path
  const std::uint64_t within = (((n - (std::uint64_t{1} << p)) + step - 1) >> (p - 2)) - 1;
  return static_cast<std::uint32_t>(4 + (p - 10) * 4 + within);
}

/// The pool's state as the inline return path sees it; PoolState derives from it.
struct PoolHead {
  ProcessFence fence;  // the return path against closing, trims against owners
  std::atomic<bool> closing{false};
};

/// A block a thread keeps, with its host address (null for memory not mapped here).
struct PoolCachedBlock {
  PoolSegment* segment;
  std::uint64_t offset;
  std::byte* host;
};

/// Blocks of one small class that a thread keeps: at most `limit`, in storage sized for that when
/// the cache is made, so a push never allocates.
struct PoolBlockStack {
  PoolCachedBlock* data = nullptr;
  std::uint32_t count = 0;
  std::uint32_t limit = 0;

  [[nodiscard]] bool empty() const { return count == 0; }
  [[nodiscard]] bool full() const { return count >= limit; }
  [[nodiscard]] std::size_t size() const { return count; }
  PoolCachedBlock pop() { return data[--count]; }
  void push(const PoolCachedBlock& b) { data[count++] = b; }
};

// Written by one thread, read by stats(): an increment is a plain load, add and (release) store.
// A return's counters are written after the rent's were published to the returning thread, so a
// reader that loads every "back" counter before any "out" counter (acquire) never sees more
// returned than rented.
using PoolCounter = std::atomic<std::uint64_t>;
inline void bump(PoolCounter& c, std::uint64_t v) {
  c.store(c.load(std::memory_order_relaxed) + v, std::memory_order_release);
}

/// One class's counters in one thread's cache; a power of two in size, so the fast paths index an
/// array of them with a shift.
struct alignas(64) PoolClassCounters {
  // Bytes of small classes follow from the counts (one size per class), so only large buckets
  // count bytes; hits are rents minus misses: the fast path bumps as few words as it can.
  PoolCounter rents{0}, misses{0}, returns{0}, bytes_out{0}, bytes_back{0}, requested_out{0}, requested_back{0};

  /// A rent of `requested` bytes; `large_bytes`: the block's bytes, for a large bucket only.
  void rented(std::uint64_t requested, std::uint64_t large_bytes = 0) {
    bump(rents, 1);
    if (large_bytes) bump(bytes_out, large_bytes);
    bump(requested_out, requested);
  }
  /// A return, the count last: ~MemoryPool's Dekker reads it (see PoolState::returned_fence).
  void returned(std::uint64_t requested, std::uint64_t large_bytes = 0) {
    bump(requested_back, requested);
    if (large_bytes) bump(bytes_back, large_bytes);
    bump(returns, 1);
  }
};

/// A thread's cache of one slot (memory kind), as far as the inline paths use it; pool.cpp's
/// SlotCache adds the storage and the large blocks.
struct PoolSlotCacheHead {
  std::array<PoolBlockStack, kPoolSmallClasses> blocks;
  std::array<PoolClassCounters, kPoolClasses> counters;
};

/// The last pool this thread used and its cache; cleared when caches are pruned or the thread ends.
/// One object, so the fast paths find both through one thread-pointer load. `state` is atomic
/// because trim() in another thread clears it (relaxed: a plain load on the fast path); `busy` is
/// set while this thread works on its large blocks or in a slow path, where trim() must not take
/// them from under it. `slots` are the cache's slot caches of the kinds' own slots (not per NUMA
/// node), valid while `state` is set.
struct PoolThreadLast {
  std::atomic<PoolHead*> state{nullptr};
  ThreadCache* cache = nullptr;
  std::atomic<std::uint32_t> busy{0};
  std::array<PoolSlotCacheHead*, kPoolKindSlots> slots{};
};
// constinit: trivially destructible and constant-initialised, so every use is a plain access
// through the thread pointer, with no initialisation check.
extern thread_local constinit PoolThreadLast t_pool_last;

}  // namespace lavaflow::detail
