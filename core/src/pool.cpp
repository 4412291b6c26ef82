// SPDX-License-Identifier: MIT
#include "lavaflow/core/pool.hpp"

#include <sched.h>
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <bit>
#include <map>
#include <mutex>
#include <set>
#include <tuple>

#include "lavaflow/core/cpu_buffer.hpp"
#include "lavaflow/core/detail/format.hpp"
#include "lavaflow/core/detail/process_fence.hpp"
#include "lavaflow/core/gpu_buffer.hpp"
#include "round_up.hpp"
#include "stats_server.hpp"

namespace lavaflow {
namespace detail {

namespace {

constexpr std::uint64_t kAlign = kPoolAlign;
constexpr std::uint32_t kSmallClasses = kPoolSmallClasses;
constexpr std::uint32_t kLargeBuckets = kPoolLargeBuckets;
constexpr std::uint32_t kClasses = kPoolClasses;
constexpr std::uint32_t kKindSlots = kPoolKindSlots;
constexpr std::size_t kThreadCacheMaxBlocks = 64;
constexpr std::size_t kLargeCacheEntries = 4;
constexpr std::uint64_t kRefillBytes = std::uint64_t{64} << 10;  // carved ahead per refill
constexpr std::uint64_t kMaxRent = std::uint64_t{1} << 56;       // beyond any memory

constexpr std::uint32_t small_class_of(std::uint64_t n) { return pool_small_class(n); }

constexpr std::uint64_t class_size(std::uint32_t c) {
  if (c < 4) return (c + 1) * kAlign;
  if (c < kSmallClasses) {
    const unsigned p = 10 + (c - 4) / 4;
    return (std::uint64_t{1} << p) + ((c - 4) % 4 + 1) * ((std::uint64_t{1} << p) / 4);
  }
  return std::uint64_t{1} << std::min<unsigned>(63, 21 + (c - kSmallClasses));
}

constexpr std::uint32_t large_bucket_of(std::uint64_t n) {
  const auto p = static_cast<unsigned>(std::bit_width(n - 1));  // n <= 2^p
  return kSmallClasses + std::min<std::uint32_t>(kLargeBuckets - 1, p > 21 ? p - 21 : 0);
}

/// A size's class: a small class, or a large bucket (statistics only: large blocks are exact).
constexpr std::uint32_t class_of(std::uint64_t n) {
  return n <= MemoryPool::kSmallMax ? small_class_of(n) : large_bucket_of(n);
}

/// Bytes a buffer of `size` in class `cls` occupies in its segment.
constexpr std::uint64_t block_bytes(std::uint32_t cls, std::uint64_t size) {
  return cls < kSmallClasses ? class_size(cls) : round_up(size, kAlign);
}

static_assert(small_class_of(256) == 0 && small_class_of(1024) == 3 && small_class_of(1025) == 4);
static_assert(class_size(small_class_of(1025)) == 1280 && class_size(small_class_of(2048)) == 2048);
static_assert(small_class_of(MemoryPool::kSmallMax) == kSmallClasses - 1);
static_assert(class_size(kSmallClasses - 1) == MemoryPool::kSmallMax);

using Counter = PoolCounter;
using ClassCounters = PoolClassCounters;
inline std::uint64_t get(const Counter& c) { return c.load(std::memory_order_acquire); }

struct ClassTotals {
  std::uint64_t rents = 0, hits = 0, returns = 0, bytes_out = 0, bytes_back = 0, requested_out = 0, requested_back = 0;
  /// The return side; read every thread's before any rent side (see bump).
  void add_back(const ClassCounters& c, std::uint32_t cls) {
    const auto back = get(c.returns);
    returns += back;
    bytes_back += cls < kSmallClasses ? back * class_size(cls) : get(c.bytes_back);
    requested_back += get(c.requested_back);
  }
  /// The rent side: misses before rents, which are bumped first.
  void add_out(const ClassCounters& c, std::uint32_t cls) {
    const auto missed = get(c.misses);
    const auto r = get(c.rents);
    rents += r;
    hits += r - missed;
    bytes_out += cls < kSmallClasses ? r * class_size(cls) : get(c.bytes_out);
    requested_out += get(c.requested_out);
  }
  void add(const ClassCounters& c, std::uint32_t cls) {
    add_back(c, cls);
    add_out(c, cls);
  }
  ClassTotals& operator+=(const ClassTotals& t) {
    rents += t.rents;
    hits += t.hits;
    returns += t.returns;
    bytes_out += t.bytes_out;
    bytes_back += t.bytes_back;
    requested_out += t.requested_out;
    requested_back += t.requested_back;
    return *this;
  }
};

struct Block {
  PoolSegment* segment;
  std::uint64_t offset;
};

}  // namespace

struct PoolSegment {
  std::unique_ptr<Buffer> memory;
  std::byte* base = nullptr;
  vk::Buffer vk_buffer;
  std::uint64_t vk_offset = 0;
  std::uint64_t size = 0;
  std::uint64_t id = 0;
  std::uint32_t slot = 0;
  bool small = false;
  bool holds_fd = false;
  std::map<std::uint64_t, std::uint64_t> free;  // offset -> bytes, coalesced
  std::uint64_t free_bytes = 0;
  // Host memory whose free pages can go back to the system (memfd pages, MADV_REMOVE): the page
  // ranges inside free ranges that did (offset -> bytes, page-aligned, disjoint). They are not
  // counted as reserved until a block is carved over them again.
  bool can_release = false;
  std::map<std::uint64_t, std::uint64_t> released;
  std::uint64_t released_bytes = 0;
};

namespace {

std::byte* host_of(const Block& b) { return b.segment->base ? b.segment->base + b.offset : nullptr; }
/// A block as a thread's cache keeps it (with its host address), and back.
PoolCachedBlock cached(const Block& b) { return {b.segment, b.offset, host_of(b)}; }
Block block_of(const PoolCachedBlock& b) { return {b.segment, b.offset}; }

/// Moves a map's entry at `where` (an iterator or a key) to `key` → `mapped` in its own node. It
/// allocates nothing, so the pool's indexes change this way where running out of memory must not
/// leave them half-updated.
template <class Map, class Where>
void rekey(Map& map, const Where& where, typename Map::key_type key, typename Map::mapped_type mapped) {
  auto node = map.extract(where);
  node.key() = key;
  node.mapped() = mapped;
  map.insert(std::move(node));
}

/// The same for a set's entry, which becomes `value`.
template <class Set, class Where>
void rekey(Set& set, const Where& where, typename Set::value_type value) {
  auto node = set.extract(where);
  node.value() = std::move(value);
  set.insert(std::move(node));
}

/// Segments of one slot and pool (small or large), with a best-fit index of their free ranges.
struct Arena {
  std::map<std::uint64_t, std::unique_ptr<PoolSegment>> segments;             // by id
  std::set<std::tuple<std::uint64_t, std::uint64_t, std::uint64_t>> by_size;  // (bytes, segment id, offset)
};

void track(PoolStat& s, std::int64_t delta) {
  s.current += delta;
  if (delta > 0)
    s.allocated += static_cast<std::uint64_t>(delta);
  else
    s.freed += static_cast<std::uint64_t>(-delta);
  s.peak = std::max(s.peak, s.current);
}

/// The statistics that change only under the pool's lock, so their peaks are exact.
struct LockedStats {
  PoolStat segment, reserved_bytes, active, active_bytes;
};

struct Slot {
  BufferKind kind = BufferKind::CpuShared;
  int node = -1;
  Arena arenas[2];  // 0: small, 1: large
  std::uint64_t misses = 0;
  bool used = false;
};

/// Recently returned large blocks of a thread, oldest first, with their bytes: a fixed array, so
/// that keeping one allocates nothing (one beyond kLargeCacheEntries: a return adds its block
/// before it trims).
class LargeBlocks {
 public:
  using Entry = std::pair<std::uint64_t, Block>;
  [[nodiscard]] bool empty() const { return count_ == 0; }
  [[nodiscard]] std::size_t size() const { return count_; }
  [[nodiscard]] const Entry* begin() const { return entries_.data(); }
  [[nodiscard]] const Entry* end() const { return entries_.data() + count_; }
  [[nodiscard]] const Entry& operator[](std::size_t i) const { return entries_[i]; }
  [[nodiscard]] const Entry& front() const { return entries_[0]; }
  void push_back(std::uint64_t bytes, Block b) { entries_[count_++] = {bytes, b}; }
  /// Removes entry `i`; the later ones keep their order.
  void erase(std::size_t i) {
    std::copy(entries_.begin() + static_cast<std::ptrdiff_t>(i) + 1,
              entries_.begin() + static_cast<std::ptrdiff_t>(count_),
              entries_.begin() + static_cast<std::ptrdiff_t>(i));
    --count_;
  }
  void clear() { count_ = 0; }

 private:
  std::array<Entry, kLargeCacheEntries + 1> entries_{};
  std::size_t count_ = 0;
};

/// A thread's cache of one slot: the small classes' stacks and every class's counters (the head,
/// which the inline paths use), and recently returned large blocks.
struct SlotCache : PoolSlotCacheHead {
  explicit SlotCache(const std::array<std::size_t, kSmallClasses>& limits) {
    std::size_t total = 0;
    for (auto n : limits) total += n;
    storage = std::make_unique<PoolCachedBlock[]>(total);
    std::size_t at = 0;
    for (std::uint32_t c = 0; c < kSmallClasses; ++c) {
      blocks[c].data = storage.get() + at;
      blocks[c].limit = static_cast<std::uint32_t>(limits[c]);
      at += limits[c];
    }
  }
  std::unique_ptr<PoolCachedBlock[]> storage;
  // Recently returned large blocks, matched by exact size: a loop that rents the same large shape
  // again and again takes no lock.
  LargeBlocks large;
  std::uint64_t large_bytes = 0;
};

/// A large block of exactly `bytes` from the thread's cache, the most recently returned first.
[[gnu::always_inline]] inline std::optional<Block> take_large(SlotCache& sc, std::uint64_t bytes) {
  for (std::size_t i = sc.large.size(); i-- > 0;)
    if (sc.large[i].first == bytes) {
      const Block block = sc.large[i].second;
      sc.large.erase(i);
      sc.large_bytes -= bytes;
      return block;
    }
  return std::nullopt;
}

}  // namespace

thread_local constinit PoolThreadLast t_pool_last;

namespace {

/// Marks this thread busy with its cache for a scope (nested scopes keep it marked), then looks
/// at its fence-free side of the Dekker pair with PoolState::ask_caches_back (see there).
class BusyScope {
 public:
  BusyScope() : was_(t_pool_last.busy.load(std::memory_order_relaxed)) {
    t_pool_last.busy.store(1, std::memory_order_relaxed);
    std::atomic_signal_fence(std::memory_order_seq_cst);
  }
  BusyScope(const BusyScope&) = delete;
  BusyScope& operator=(const BusyScope&) = delete;
  ~BusyScope() { t_pool_last.busy.store(was_, std::memory_order_release); }

 private:
  std::uint32_t was_;
};

}  // namespace

struct ThreadCache {
  std::shared_ptr<PoolState> state;
  std::vector<std::unique_ptr<SlotCache>> slots;
  PoolThreadLast* owner = nullptr;  // the owning thread's t_pool_last (valid while the cache is listed)
  std::atomic<bool> trim{false};    // a trim() asked the owner to return what it keeps
};

namespace {
// Set once this thread's caches are gone (thread exit): later rents and returns, from other
// thread_local destructors, take the lock and count into the pool directly.
thread_local bool t_caches_gone = false;

/// This thread's caches, one per pool it used. A cache holds its pool's state, so a state's address
/// is never reused while a cache refers to it.
struct ThreadCaches {
  std::vector<std::unique_ptr<ThreadCache>> list;
  ~ThreadCaches();
};

}  // namespace

struct PoolState;
/// Every statistic of the pool, under its lock.
PoolStats collect_stats(const PoolState& s);

// PoolHead (fence, closing) holds what the inline return path reads.
struct PoolState : PoolHead, std::enable_shared_from_this<PoolState> {
  PoolOptions options;
  CpuTopology topology;
  std::uint64_t page_bytes = 4096;
  // Blocks a thread keeps per small class: thread_cache_bytes worth, at least two (so a rent and
  // return in turn never take the lock), at most kThreadCacheMaxBlocks.
  std::array<std::size_t, kSmallClasses> cache_limits{};
  // Large bytes a thread keeps: its option, and an eighth of a cap on cached bytes at most.
  std::uint64_t large_cache_bytes = 0;

  mutable std::mutex mutex;
  std::vector<Slot> slots;
  std::uint64_t next_segment_id = 1;
  // Exact statistics: [slot][pool], per slot, per pool, all.
  std::vector<std::array<LockedStats, 2>> locked;
  std::vector<LockedStats> locked_slot;
  std::array<LockedStats, 2> locked_pool;
  LockedStats locked_all;
  std::uint64_t num_alloc_retries = 0, num_ooms = 0, num_device_alloc = 0, num_device_free = 0;
  // Returned blocks left carved for want of memory (release_or_keep): a fixed list, so that
  // keeping one allocates nothing, retried later; beyond it a block stays carved for the pool's life.
  std::array<std::pair<Block, std::uint64_t>, 64> kept{};
  std::size_t kept_count = 0;
  std::uint64_t kept_for_good = 0;
  std::uint64_t open_fds = 0;
  // Counters of thread caches that ended, and the live caches (read by stats()).
  std::vector<std::array<ClassTotals, kClasses>> retired;
  std::vector<ThreadCache*> caches;
  // Sampled peaks of the counter-derived statistics, by group index (all, small, large, slots...).
  mutable std::vector<std::array<std::int64_t, 3>> sampled_peaks;

  bool dead = false;
  // PoolOptions::stats_label: answers other processes; stopped first when the handle closes.
  std::unique_ptr<StatsServer> stats_server;
  std::shared_ptr<PoolState> keepalive;  // set when the handle closed with buffers still rented

  std::uint32_t slot_of(BufferKind kind, int node) const {
    return kind == BufferKind::CpuNuma ? kKindSlots + static_cast<std::uint32_t>(node)
                                       : static_cast<std::uint32_t>(kind) - 1;
  }

  // --- under the lock -------------------------------------------------------------------------
  void account(std::uint32_t slot, bool large, PoolStat LockedStats::*field, std::int64_t delta) {
    track(locked[slot][large].*field, delta);
    track(locked_slot[slot].*field, delta);
    track(locked_pool[large].*field, delta);
    track(locked_all.*field, delta);
  }

  Result<std::unique_ptr<Buffer>> allocate_memory(BufferKind kind, int node, std::uint64_t bytes) const {
    switch (kind) {
      case BufferKind::GpuDeviceLocal:
      case BufferKind::GpuHostVisible: {
        if (kind == BufferKind::GpuDeviceLocal && options.device_segments) {
          LF_TRY(auto b, options.device_segments(bytes));
          if (!b || b->kind() != BufferKind::GpuDeviceLocal || b->size() < bytes)
            return fail(
                Errc::Internal, "PoolOptions::device_segments",
                str_format("gave {} for a segment of {} bytes",
                           b ? str_format("{} bytes of {}", b->size(), to_string(b->kind())) : "nothing", bytes));
          return b;
        }
        GpuBufferOptions o;
        o.size = bytes;
        o.memory = kind == BufferKind::GpuDeviceLocal ? GpuMemory::DeviceLocal : GpuMemory::HostVisible;
        LF_TRY(auto b, GpuBuffer::allocate(*options.vulkan, o));
        return std::make_unique<GpuBuffer>(std::move(b));
      }
      default: {
        CpuBufferOptions o;
        o.size = bytes;
        o.strict = true;
        o.numa_node = node;
        o.strategy = strategy_of(kind);
        if (kind == BufferKind::CpuGpuPinned) o.gpu = &*options.vulkan;
        LF_TRY(auto b, CpuBuffer::allocate(o, topology));
        return std::make_unique<CpuBuffer>(std::move(b));
      }
    }
  }

  /// `self`: the calling thread's cache of this pool, if it has one (given back first on a retry).
  Result<PoolSegment*> add_segment(std::uint32_t slot, bool large, std::uint64_t asked, ThreadCache* self) {
    auto& s = slots[slot];
    auto memory = allocate_memory(s.kind, s.node, asked);
    // A refusal or an allocator's broken promise (Internal) is not a lack of memory: nothing to retry.
    if (!memory && memory.error().code() != Errc::Unsupported && memory.error().code() != Errc::InvalidArgument &&
        memory.error().code() != Errc::Internal) {
      // Cached memory may be what stands in the way: release it and try once more.
      ++num_alloc_retries;
      if (self) flush(*self);
      ask_caches_back(self);
      release_free_segments(0);
      memory = allocate_memory(s.kind, s.node, asked);
      if (!memory) ++num_ooms;
    }
    if (!memory) return std::unexpected(memory.error().within("MemoryPool::rent"));
    // An allocator that rounds up (CUDA granules) gives more than asked: all of it is carved.
    const std::uint64_t bytes = std::max(asked, (*memory)->size());
    auto seg = std::make_unique<PoolSegment>();
    seg->memory = std::move(*memory);
    seg->base = seg->memory->host_ptr();
    if (auto* gpu = dynamic_cast<GpuBuffer*>(seg->memory.get())) {
      seg->vk_buffer = gpu->buffer();
      seg->vk_offset = gpu->offset();
    } else if (auto* cpu = dynamic_cast<CpuBuffer*>(seg->memory.get())) {
      seg->vk_buffer = cpu->gpu_buffer();
      seg->holds_fd = true;
    }
    seg->size = bytes;
    seg->can_release = (s.kind == BufferKind::CpuShared || s.kind == BufferKind::CpuNuma) && seg->base != nullptr;
    seg->id = next_segment_id++;
    seg->slot = slot;
    seg->small = !large;
    seg->free.emplace(0, bytes);
    seg->free_bytes = bytes;
    // A new memfd's pages hold no memory until they are first touched: they start out as given
    // back, and count as reserved once a block is carved over them.
    const bool untouched = seg->can_release;  // memfd kinds only: huge pages are populated
    if (untouched) {
      seg->released.emplace(0, bytes);
      seg->released_bytes = bytes;
    }
    // Listed in both indexes or in neither (std::bad_alloc frees the segment with `seg`).
    auto* raw = seg.get();
    auto& arena = s.arenas[large];
    const auto listed = arena.segments.emplace(raw->id, std::move(seg)).first;
    try {
      arena.by_size.emplace(bytes, raw->id, 0);
    } catch (...) {
      arena.segments.erase(listed);
      throw;
    }
    if (raw->holds_fd) ++open_fds;
    ++num_device_alloc;
    account(slot, large, &LockedStats::segment, 1);
    account(slot, large, &LockedStats::reserved_bytes, untouched ? 0 : static_cast<std::int64_t>(bytes));
    return raw;
  }

  void drop_segment(PoolSegment* seg) {
    auto& arena = slots[seg->slot].arenas[!seg->small];
    const bool large = !seg->small;
    arena.by_size.erase({seg->size, seg->id, 0});
    if (seg->holds_fd) --open_fds;
    ++num_device_free;
    account(seg->slot, large, &LockedStats::segment, -1);
    account(seg->slot, large, &LockedStats::reserved_bytes,
            -static_cast<std::int64_t>(seg->size - seg->released_bytes));
    arena.segments.erase(seg->id);
  }

  /// Gives the pages wholly inside free range [offset, offset + len) of `seg` back to the system.
  /// Pages given back earlier inside it are taken in; the range's remaining pages are counted out
  /// of reserved_bytes.
  void release_pages(PoolSegment* seg, std::uint64_t offset, std::uint64_t len) {
    if (!seg->can_release) return;
    const std::uint64_t a = round_up(offset, page_bytes), b = (offset + len) / page_bytes * page_bytes;
    if (b <= a || ::madvise(seg->base + a, b - a, MADV_REMOVE) != 0) return;
    std::uint64_t before = 0;                 // released earlier inside [a, b): a free range holds all of them
    decltype(seg->released)::node_type node;  // the first of them becomes the whole: no allocation
    for (auto it = seg->released.lower_bound(a); it != seg->released.end() && it->first < b;) {
      before += it->second;
      if (node.empty())
        node = seg->released.extract(it++);
      else
        it = seg->released.erase(it);
    }
    if (node.empty()) {
      seg->released.emplace(a, b - a);
    } else {
      node.key() = a;
      node.mapped() = b - a;
      seg->released.insert(std::move(node));
    }
    seg->released_bytes += b - a - before;
    account(seg->slot, !seg->small, &LockedStats::reserved_bytes, -static_cast<std::int64_t>(b - a - before));
  }

  /// A block carved at [offset, offset + bytes): its pages (rounded out) count as reserved again.
  /// Needs a new node only when the block lies inside one range given back, made before anything
  /// changes: a std::bad_alloc leaves the record as it was.
  void take_back_pages(PoolSegment* seg, std::uint64_t offset, std::uint64_t bytes) {
    if (seg->released.empty()) return;
    const std::uint64_t a = offset / page_bytes * page_bytes, b = round_up(offset + bytes, page_bytes);
    auto it = seg->released.upper_bound(a);
    if (it != seg->released.begin()) --it;
    std::uint64_t taken = 0;
    while (it != seg->released.end() && it->first < b) {
      const std::uint64_t r0 = it->first, r1 = it->first + it->second;
      if (r1 <= a) {
        ++it;
        continue;
      }
      taken += std::min(r1, b) - std::max(r0, a);
      if (r0 < a && r1 > b) {  // the block splits the range: its tail becomes a range of its own
        seg->released.emplace_hint(std::next(it), b, r1 - b);
        it->second = a - r0;
        break;
      }
      if (r0 < a) {  // its head stays
        it->second = a - r0;
        ++it;
      } else if (r1 > b) {  // its tail stays, in the same node; no range beyond it overlaps
        rekey(seg->released, it, b, r1 - b);
        break;
      } else {
        it = seg->released.erase(it);
      }
    }
    seg->released_bytes -= taken;
    account(seg->slot, !seg->small, &LockedStats::reserved_bytes, static_cast<std::int64_t>(taken));
  }

  /// Gives back the free pages of every host segment (after the wholly free segments went).
  void release_free_pages() {
    for (auto& slot : slots)
      for (auto& arena : slot.arenas)
        for (auto& [id, seg] : arena.segments)
          if (seg->can_release)
            for (const auto& [offset, len] : seg->free) release_pages(seg.get(), offset, len);
  }

  /// Releases wholly free segments until cached bytes are at most `keep` (0: all of them).
  void release_free_segments(std::uint64_t keep) {
    for (auto& slot : slots)
      for (auto& arena : slot.arenas) {
        for (auto it = arena.segments.begin(); it != arena.segments.end();) {
          auto* seg = (it++)->second.get();
          if (cached_bytes() <= keep && keep != 0) return;
          if (seg->free_bytes == seg->size) drop_segment(seg);
        }
      }
  }

  std::uint64_t cached_bytes() const {
    return static_cast<std::uint64_t>(locked_all.reserved_bytes.current - locked_all.active_bytes.current);
  }

  /// The cap on cached bytes now (PoolOptions::max_cached_bytes and max_cached_share).
  std::uint64_t cache_cap() const {
    std::uint64_t cap = options.max_cached_bytes;
    if (options.max_cached_share > 0) {
      // In double, and clamped before the conversion (a share of a huge pool could exceed 2^64).
      const auto active = static_cast<double>(std::max<std::int64_t>(locked_all.active_bytes.current, 0));
      cap = std::min(cap, std::max(options.segment_bytes / 2,
                                   static_cast<std::uint64_t>(std::min(active * options.max_cached_share, 0x1p63))));
    }
    return cap;
  }

  /// Best fit among the free ranges, or a new segment. `missed` is set when a segment was added;
  /// `self` as for add_segment.
  Result<Block> carve(std::uint32_t slot, bool large, std::uint64_t bytes, bool& missed, ThreadCache* self) {
    auto& arena = slots[slot].arenas[large];
    auto it = arena.by_size.lower_bound({bytes, 0, 0});
    if (it == arena.by_size.end()) {
      const std::uint64_t seg_bytes = large ? std::max(options.segment_bytes, round_up(bytes, std::uint64_t{2} << 20))
                                            : options.small_segment_bytes;
      LF_TRY_STATUS(add_segment(slot, large, seg_bytes, self));
      missed = true;
      it = arena.by_size.lower_bound({bytes, 0, 0});
    }
    const auto [have, id, offset] = *it;
    auto* seg = arena.segments.at(id).get();
    // The one step that may need memory goes first: should it fail, nothing has changed.
    take_back_pages(seg, offset, bytes);
    if (have > bytes) {  // the rest of the range stays free, in the nodes the whole range had
      rekey(arena.by_size, it, {have - bytes, id, offset + bytes});
      rekey(seg->free, offset, offset + bytes, have - bytes);
    } else {
      arena.by_size.erase(it);
      seg->free.erase(offset);
    }
    seg->free_bytes -= bytes;
    account(slot, large, &LockedStats::active, 1);
    account(slot, large, &LockedStats::active_bytes, static_cast<std::int64_t>(bytes));
    return Block{seg, offset};
  }

  /// A block goes back to its segment's free ranges, or where memory for their index runs out,
  /// stays carved (active) until a later release or trim() finds memory for it; `host_policy`
  /// false: host pages stay (a block handed back to be carved again at once). Return paths
  /// cannot fail, so this never throws.
  void release_or_keep(Block b, std::uint64_t bytes, bool host_policy = true) noexcept {
    try {
      release(b, bytes, host_policy);
    } catch (const std::bad_alloc&) {
      if (kept_count < kept.size())
        kept[kept_count++] = {b, bytes};
      else
        ++kept_for_good;
      return;
    }
    if (kept_count != 0) retry_kept();
  }

  /// Blocks kept carved for want of memory go back while memory can be had for them (after a
  /// release that found some, and at trim()).
  void retry_kept() noexcept {
    while (kept_count != 0) {
      const auto [b, bytes] = kept[kept_count - 1];
      try {
        release(b, bytes);
      } catch (const std::bad_alloc&) {
        return;
      }
      --kept_count;
    }
  }

  /// A block goes back to its segment's free ranges (see release_or_keep). A block next to a free
  /// range takes over that range's index entries; only one with no free neighbour needs new ones,
  /// made before anything changes, so that std::bad_alloc leaves the ranges as they were.
  void release(Block b, std::uint64_t bytes, bool host_policy = true) {
    auto* seg = b.segment;
    const bool large = !seg->small;
    auto& arena = slots[seg->slot].arenas[large];
    std::uint64_t offset = b.offset;
    std::uint64_t len = bytes;
    const auto next = seg->free.lower_bound(offset);
    const auto prev = next == seg->free.begin() ? seg->free.end() : std::prev(next);
    const bool with_prev = prev != seg->free.end() && prev->first + prev->second == offset;
    const bool with_next = next != seg->free.end() && next->first == offset + bytes;
    // The merged range takes over a neighbour's entries.
    using Index = decltype(arena.by_size)::value_type;
    if (with_prev) {
      const std::uint64_t prev_len = prev->second;
      offset = prev->first;
      len += prev_len;
      if (with_next) {
        arena.by_size.erase({next->second, seg->id, next->first});
        len += next->second;
        seg->free.erase(next);
      }
      prev->second = len;
      rekey(arena.by_size, Index{prev_len, seg->id, offset}, {len, seg->id, offset});
    } else if (with_next) {
      const std::uint64_t next_len = next->second;
      len += next_len;
      rekey(seg->free, next, offset, len);
      rekey(arena.by_size, Index{next_len, seg->id, offset + bytes}, {len, seg->id, offset});
    } else {
      const auto range = seg->free.emplace(offset, len).first;
      try {
        arena.by_size.emplace(len, seg->id, offset);
      } catch (...) {
        seg->free.erase(range);
        throw;
      }
    }
    seg->free_bytes += bytes;
    account(seg->slot, large, &LockedStats::active, -1);
    account(seg->slot, large, &LockedStats::active_bytes, -static_cast<std::int64_t>(bytes));
    try {
      give_back_pages(seg, offset, len, host_policy);
    } catch (const std::bad_alloc&) {
      // The block is free; only the record of pages given back is missing: they count as reserved.
    }
  }

  /// After free range [offset, offset + len) of `seg` grew: the cache cap and the host page share.
  void give_back_pages(PoolSegment* seg, std::uint64_t offset, std::uint64_t len, bool host_policy) {
    const std::uint64_t cap = cache_cap();
    if (cached_bytes() > cap) {
      // Above the cap: a segment this return left wholly free goes back (its fd too) with the
      // other wholly free ones; in host memory still in use, this free range's pages go back.
      if (seg->free_bytes == seg->size || !seg->can_release)
        release_free_segments(std::max<std::uint64_t>(cap, 1));
      else
        release_pages(seg, offset, len);
      return;
    }
    // Host memory beyond its share: a segment this return left wholly free goes (its fd too),
    // else the free range's pages.
    if (host_policy && seg->can_release && host_pages_over()) {
      if (seg->free_bytes == seg->size)
        drop_segment(seg);
      else
        release_pages(seg, offset, len);
    }
  }

  /// While host memory is above its share: `seg` goes when wholly free, else its free ranges' pages.
  void trim_host_pages(PoolSegment* seg) {
    if (!seg->can_release || !host_pages_over()) return;
    if (seg->free_bytes == seg->size) return drop_segment(seg);
    for (const auto& [offset, len] : seg->free) release_pages(seg, offset, len);
  }

  /// Whether the touched free pages of host memory exceed PoolOptions::host_page_share.
  bool host_pages_over() const {
    if (options.host_page_share <= 0) return false;
    std::int64_t reserved = 0, active = 0;
    for (std::uint32_t i = 0; i < slots.size(); ++i)
      if (slots[i].kind == BufferKind::CpuShared || slots[i].kind == BufferKind::CpuNuma) {
        reserved += locked_slot[i].reserved_bytes.current;
        active += locked_slot[i].active_bytes.current;
      }
    const auto cached = static_cast<double>(std::max<std::int64_t>(reserved - active, 0));
    const double keep = std::max(static_cast<double>(options.segment_bytes / 2),
                                 static_cast<double>(std::max<std::int64_t>(active, 0)) * options.host_page_share);
    return cached > keep;
  }

  std::int64_t outstanding() const {
    std::int64_t n = 0;
    for (const auto& slot : retired)
      for (const auto& c : slot) n += static_cast<std::int64_t>(c.rents - c.returns);
    for (const auto* tc : caches)  // every return before any rent (see bump)
      for (const auto& sc : tc->slots)
        if (sc)
          for (const auto& c : sc->counters) n -= static_cast<std::int64_t>(get(c.returns));
    for (const auto* tc : caches)
      for (const auto& sc : tc->slots)
        if (sc)
          for (const auto& c : sc->counters) n += static_cast<std::int64_t>(get(c.rents));
    return n;
  }

  /// Under the lock, once the handle closed: when no buffer is rented any more, releases every
  /// segment and hands back the state's hold on itself, for the caller to drop after unlocking.
  [[nodiscard]] std::shared_ptr<PoolState> release_if_last() {
    if (dead || outstanding() != 0) return nullptr;
    release_everything();
    return std::move(keepalive);
  }

  void release_everything() {
    dead = true;
    options.vulkan.reset();  // idle threads' caches may hold this state a while: not the device
    options.device_segments = nullptr;
    for (auto& slot : slots)
      for (auto& arena : slot.arenas) {
        arena.by_size.clear();
        arena.segments.clear();
      }
    kept_count = 0;
    open_fds = 0;
  }

  /// Returns the blocks a thread keeps to the segments (under the lock).
  void flush(ThreadCache& tc) {
    for (auto& sc : tc.slots) {
      if (!sc) continue;
      for (std::uint32_t c = 0; c < kSmallClasses; ++c) {
        auto& stack = sc->blocks[c];
        for (std::uint32_t i = 0; i < stack.count; ++i) release_or_keep(block_of(stack.data[i]), class_size(c));
        stack.count = 0;
      }
      for (auto [bytes, b] : sc->large) release_or_keep(b, bytes);
      sc->large.clear();
      sc->large_bytes = 0;
    }
  }

  /// Folds a thread's cache into the pool: blocks back to the segments, counters into `retired`.
  void retire(ThreadCache& tc) {
    std::lock_guard lock(mutex);
    retire_locked(tc);
  }
  void retire_locked(ThreadCache& tc) {
    std::erase(caches, &tc);
    if (!dead) flush(tc);
    for (std::size_t s = 0; s < tc.slots.size(); ++s) {
      auto& sc = tc.slots[s];
      if (!sc) continue;
      for (std::uint32_t c = 0; c < kClasses; ++c) retired[s][c].add(sc->counters[c], c);
      sc.reset();
    }
  }

  // --- thread caches ----------------------------------------------------------------------------
  /// This thread's cache, which returns what it keeps first when a trim() asked (from a slow path
  /// or a large block's path: inside a BusyScope).
  ThreadCache& cache() {
    // The thread's last pool first, through trivially destructible thread_locals (no guard check).
    ThreadCache* tc = t_pool_last.cache;
    // Acquire: a trim that cleared the last pool stored `trim` before, so the load of `trim`
    // below sees it.
    if (t_pool_last.state.load(std::memory_order_acquire) != this) {
      tc = &find_cache();
      t_pool_last.cache = tc;
      for (std::uint32_t i = 0; i < kKindSlots; ++i) t_pool_last.slots[i] = tc->slots[i].get();
      t_pool_last.state.store(this, std::memory_order_relaxed);
    }
    if (tc->trim.load(std::memory_order_acquire)) [[unlikely]]
      return_for_trim(*tc);
    return *tc;
  }

  void return_for_trim(ThreadCache& tc) {
    std::lock_guard lock(mutex);
    if (!dead) flush(tc);
    tc.trim.store(false, std::memory_order_relaxed);
  }

  /// Under the lock (trim(), a failed allocation): every other thread's cache of this pool is
  /// asked to come back. Each owner returns its cache on its next rent or return, which a trim
  /// sends down the slow path by clearing the owner's last pool. Owners that are not inside a
  /// BusyScope lose their large blocks here at once: the owner stores `busy` and then loads
  /// `trim`; this stores `trim`, fences every thread with membarrier() and then loads `busy` — one
  /// of the two sees the other, and an owner that sees `trim` waits for this lock. Small blocks
  /// stay until the owner's next call: its fast path touches them without marking itself busy.
  void ask_caches_back(ThreadCache* self) {
    bool asked = false;
    for (auto* tc : caches) {
      if (tc == self) continue;
      tc->trim.store(true, std::memory_order_relaxed);
      PoolHead* expected = this;
      tc->owner->state.compare_exchange_strong(expected, nullptr, std::memory_order_release, std::memory_order_relaxed);
      asked = true;
    }
    // Owners fence nothing between `busy` and `trim`: only an expedited membarrier orders them.
    if (!asked || !fence.expedited() || !fence.heavy()) return;
    for (auto* tc : caches)
      if (tc != self && tc->owner->busy.load(std::memory_order_acquire) == 0) flush_large(*tc);
  }

  void flush_large(ThreadCache& tc) {
    for (auto& sc : tc.slots) {
      if (!sc) continue;
      for (auto [bytes, b] : sc->large) release_or_keep(b, bytes);
      sc->large.clear();
      sc->large_bytes = 0;
    }
  }

  ThreadCache& find_cache() {
    static thread_local ThreadCaches mine;
    t_pool_last.state.store(nullptr, std::memory_order_relaxed);  // the pruning below may free the cache it points to
    for (auto& tc : mine.list)
      if (tc->state.get() == this) return *tc;
    // Drop caches of pools that are gone, then make one for this pool. Only pools whose lock is
    // free now: this thread may be inside another pool's locked code (a pool whose segments are
    // rented from this one allocates or drops them under its own lock), and a pool whose lock is
    // taken is pruned at a later miss.
    std::erase_if(mine.list, [](const auto& tc) {
      std::unique_lock lock(tc->state->mutex, std::try_to_lock);
      if (!lock.owns_lock() || !tc->state->dead) return false;
      tc->state->retire_locked(*tc);
      return true;
    });
    auto tc = std::make_unique<ThreadCache>();
    tc->state = shared_from_this();
    tc->slots.resize(slots.size());
    tc->owner = &t_pool_last;
    mine.list.reserve(mine.list.size() + 1);  // so that a listed cache is always kept
    {
      std::lock_guard lock(mutex);
      caches.push_back(tc.get());
    }
    mine.list.push_back(std::move(tc));
    return *mine.list.back();
  }

  SlotCache& slot_cache(ThreadCache& tc, std::uint32_t slot) {
    auto& sc = tc.slots[slot];
    if (!sc) {
      // Under the lock: stats() reads other threads' slot pointers.
      auto fresh = std::make_unique<SlotCache>(cache_limits);
      std::lock_guard lock(mutex);
      sc = std::move(fresh);
      slots[slot].used = true;
      if (&tc == t_pool_last.cache && slot < kKindSlots) t_pool_last.slots[slot] = sc.get();
    }
    return *sc;
  }

  // --- rent / return ----------------------------------------------------------------------------
  // MemoryPool::rent and ~PooledBuffer serve a small block from or to this thread's cache inline
  // (pool_cache.hpp); what they leave comes here. rent_rest() and give_back_rest() serve a large
  // block from or to the thread's cache (and a small block of a NUMA node's slot back to it), and
  // send everything else through the slow paths.
  [[gnu::always_inline]] Result<PooledBuffer> rent_rest(std::uint64_t size, BufferKind kind);
  [[gnu::noinline]] Result<PooledBuffer> rent_slow(RentOptions o);
  Result<PooledBuffer> rent_uncached(RentOptions o);
  Result<PooledBuffer> rent_large(RentOptions o, SlotCache& sc);
  Result<PooledBuffer> rent_locked(std::uint64_t size, std::uint32_t slot);
  [[gnu::always_inline]] void give_back_rest(PooledBuffer& b) noexcept;
  [[gnu::noinline]] void give_back_slow(PooledBuffer& b) noexcept;
  void give_back_large(PooledBuffer& b, SlotCache& sc) noexcept;
  void give_back_uncached(PooledBuffer& b) noexcept;
  /// What a returned buffer is left as: no pool, segment or memory (size() and offset() keep
  /// their last values).
  static void empty(PooledBuffer& b) noexcept {
    b.pool_ = nullptr;
    b.segment_ = nullptr;
    b.host_ = nullptr;
  }
  /// Counts a return into the pool's own totals under the lock; `free_block`: the block goes back
  /// to its segment's free ranges (false: it is retired).
  void give_back_locked(PooledBuffer& b, bool free_block = true) noexcept;
  void retire(PooledBuffer& b) noexcept;
  void finish_if_last();

  /// After a return is counted: releases the pool if its handle closed and this was the last buffer.
  void returned_fence() noexcept {
    // Dekker with ~MemoryPool: it stores `closing` and then counts the returns; this thread counts
    // its return and then loads `closing`. One of the two sees the other. membarrier() on the
    // closing side makes the fence here a compiler fence only.
    fence.light();
    if (closing.load(std::memory_order_relaxed)) [[unlikely]]
      finish_if_last();
  }
};

namespace {

ThreadCaches::~ThreadCaches() {
  t_caches_gone = true;
  t_pool_last.state.store(nullptr, std::memory_order_relaxed);
  for (auto& tc : list) tc->state->retire(*tc);
}

int current_node() {
  unsigned cpu = 0, node = 0;
  if (::getcpu(&cpu, &node) != 0) return 0;
  return static_cast<int>(node);
}

}  // namespace

inline Result<PooledBuffer> PoolState::rent_rest(std::uint64_t size, BufferKind kind) {
  // Only a slot with a cache was rented from before, so its kind needs no further check.
  const RentOptions o{size, kind, -1};
  const auto k = static_cast<std::uint32_t>(kind);
  if (k - 1 < kKindSlots && kind != BufferKind::CpuNuma && size - 1 >= MemoryPool::kSmallMax &&
      t_pool_last.state.load(std::memory_order_relaxed) == this)
    if (auto* sc = static_cast<SlotCache*>(t_pool_last.slots[k - 1])) return rent_large(o, *sc);
  return rent_slow(o);
}

Result<PooledBuffer> PoolState::rent_large(RentOptions o, SlotCache& sc) {
  const BusyScope busy;
  if (t_pool_last.cache->trim.load(std::memory_order_acquire)) [[unlikely]]
    return rent_slow(o);
  const std::uint64_t bytes = round_up(o.size, kAlign);
  if (o.size > kMaxRent || sc.large.empty()) return rent_slow(o);
  const auto block = take_large(sc, bytes);
  if (!block) return rent_slow(o);
  const std::uint32_t cls = large_bucket_of(o.size);
  sc.counters[cls].rented(o.size, bytes);
  return PooledBuffer(this, block->segment, block->offset, host_of(*block), o.size, slot_of(o.kind, -1), cls);
}

Result<PooledBuffer> PoolState::rent_slow(RentOptions o) {
  // The pool's own bookkeeping (its indexes, a thread's cache) may find no memory: every step
  // that needs some leaves the pool as it was, so the rent fails as any lack of memory does.
  try {
    return rent_uncached(o);
  } catch (const std::bad_alloc&) {
    return fail(Errc::OutOfMemory, "MemoryPool::rent", "no memory left for the pool's own bookkeeping");
  }
}

Result<PooledBuffer> PoolState::rent_uncached(RentOptions o) {
  constexpr const char* call = "MemoryPool::rent";
  const auto k = static_cast<std::uint8_t>(o.kind);
  if (o.kind == BufferKind::CpuPrivate)
    return fail(Errc::InvalidArgument, call,
                str_format("{} memory is not pooled: a pool's buffers are shareable", to_string(o.kind)));
  if (k < 1 || k > kKindSlots) return fail(Errc::InvalidArgument, call, str_format("unknown buffer kind {}", k));
  if (o.size == 0) return fail(Errc::InvalidArgument, call, "size is 0");
  if (o.size > kMaxRent) return fail(Errc::InvalidArgument, call, str_format("size {} is beyond any memory", o.size));
  if ((is_gpu(o.kind) || o.kind == BufferKind::CpuGpuPinned) && !options.vulkan &&
      !(o.kind == BufferKind::GpuDeviceLocal && options.device_segments))
    return fail(Errc::Unsupported, call,
                str_format("{} memory needs a Vulkan device, and the pool was created without one", to_string(o.kind)));
  if (o.numa_node < -1)
    return fail(Errc::InvalidArgument, call, str_format("NUMA node {} (use -1 for the caller's node)", o.numa_node));
  int node = -1;
  if (o.kind == BufferKind::CpuNuma) {
    node = o.numa_node >= 0 ? o.numa_node : current_node();
    if (node >= topology.numa_nodes)
      return fail(Errc::InvalidArgument, call,
                  str_format("NUMA node {} does not exist ({} nodes)", node, topology.numa_nodes));
  } else if (o.numa_node != -1) {
    return fail(Errc::InvalidArgument, call, str_format("a NUMA node is only for {}", to_string(BufferKind::CpuNuma)));
  }
  const std::uint32_t slot = slot_of(o.kind, node);
  if (t_caches_gone) [[unlikely]]
    return rent_locked(o.size, slot);
  const BusyScope busy;
  auto& tc = cache();
  auto& sc = slot_cache(tc, slot);
  const std::uint32_t cls = class_of(o.size);
  const bool small = cls < kSmallClasses;
  const std::uint64_t bytes = block_bytes(cls, o.size);
  auto& counters = sc.counters[cls];

  Block block{};
  bool missed = false;
  bool found = false;
  auto* stack = small ? &sc.blocks[cls] : nullptr;
  if (stack && !stack->empty()) {
    block = block_of(stack->pop());
    found = true;
  } else if (!small) {
    if (auto b = take_large(sc, bytes)) {
      block = *b;
      found = true;
    }
  }
  if (!found) {
    std::lock_guard lock(mutex);
    bool carved = false;
    if (!small && !sc.large.empty()) {
      // The pool would grow while this thread keeps large blocks that did not match: they go
      // back first, for this block to be carved from (their ranges coalesce with their neighbours).
      auto& arena = slots[slot].arenas[1];
      if (arena.by_size.lower_bound({bytes, 0, 0}) == arena.by_size.end()) {
        // Their pages stay until the block is carved (it may take them, warm); then what is left
        // free of their segments follows the host page share. Segments by id: one may go meanwhile.
        std::array<std::uint64_t, kLargeCacheEntries> handed{};
        std::size_t n_handed = 0;
        for (auto [n, b] : sc.large) {
          if (n_handed < handed.size()) handed[n_handed++] = b.segment->id;  // before: a cap may drop it
          release_or_keep(b, n, false);
        }
        sc.large.clear();
        sc.large_bytes = 0;
        LF_TRY(block, carve(slot, !small, bytes, missed, &tc));
        try {
          for (std::size_t i = 0; i < n_handed; ++i)
            if (auto it = arena.segments.find(handed[i]); it != arena.segments.end()) trim_host_pages(it->second.get());
        } catch (const std::bad_alloc&) {
          // The pages stay (counted as reserved): the block is carved, and this rent goes on.
        }
        carved = true;
      }
    }
    if (!carved) {
      LF_TRY(block, carve(slot, !small, bytes, missed, &tc));
    }
    if (small) {
      // Fill part of the thread's cache for this class under the same lock.
      const std::size_t fill = std::min<std::uint64_t>(stack->limit / 2, kRefillBytes / bytes);  // may be 0
      try {  // the block is carved: a refill that finds no memory only ends early
        for (std::size_t i = 0; i < fill; ++i) {
          bool more_missed = false;
          auto extra = carve(slot, false, bytes, more_missed, &tc);
          if (!extra) break;
          stack->push(cached(*extra));
          missed = missed || more_missed;
        }
      } catch (const std::bad_alloc&) {
      }
    }
    if (missed) ++slots[slot].misses;
  }
  counters.rented(o.size, small ? 0 : bytes);
  if (missed) bump(counters.misses, 1);  // after rents (see ClassTotals::add_out)
  return PooledBuffer(this, block.segment, block.offset, host_of(block), o.size, slot, cls);
}

Result<PooledBuffer> PoolState::rent_locked(std::uint64_t size, std::uint32_t slot) {
  const std::uint32_t cls = class_of(size);
  const bool small = cls < kSmallClasses;
  const std::uint64_t bytes = block_bytes(cls, size);
  std::lock_guard lock(mutex);
  bool missed = false;
  LF_TRY(const Block block, carve(slot, !small, bytes, missed, nullptr));
  slots[slot].used = true;  // as a thread's cache for the slot would have marked it
  auto& t = retired[slot][cls];
  ++t.rents;
  t.hits += missed ? 0 : 1;
  t.bytes_out += bytes;
  t.requested_out += size;
  if (missed) ++slots[slot].misses;
  return PooledBuffer(this, block.segment, block.offset, host_of(block), size, slot, cls);
}

void PoolState::retire(PooledBuffer& b) noexcept {
  // Not released into the free ranges: the block stays carved (active) until its segment goes.
  give_back_locked(b, false);
  empty(b);
}

void PoolState::give_back_locked(PooledBuffer& b, bool free_block) noexcept {
  const std::uint32_t cls = b.size_class();
  const std::uint64_t bytes = block_bytes(cls, b.size_);
  // This thread holds no cache (and so no reference) for the pool: once the lock is released the
  // state may be gone, so the closing check happens under it.
  std::shared_ptr<PoolState> last;
  std::lock_guard lock(mutex);
  if (free_block && !dead) release_or_keep(Block{b.segment_, b.offset_}, bytes);
  auto& t = retired[b.slot()][cls];
  ++t.returns;
  t.bytes_back += bytes;
  t.requested_back += b.size_;
  if (closing.load()) last = release_if_last();
}

inline void PoolState::give_back_rest(PooledBuffer& b) noexcept {
  // A small block goes back to this thread's cache while the cache has room. (No cache for the
  // slot: the block was rented by another thread.)
  if (t_pool_last.state.load(std::memory_order_relaxed) == this) [[likely]] {
    const std::uint32_t cls = b.size_class();
    const std::uint32_t slot = b.slot();
    SlotCache* sc =
        slot < kKindSlots ? static_cast<SlotCache*>(t_pool_last.slots[slot]) : t_pool_last.cache->slots[slot].get();
    if (sc && cls >= kSmallClasses) return give_back_large(b, *sc);
    if (sc && !sc->blocks[cls].full()) [[likely]] {
      sc->blocks[cls].push(PoolCachedBlock{b.segment_, b.offset_, b.host_});
      sc->counters[cls].returned(b.size_);
      empty(b);
      returned_fence();
      return;
    }
  }
  give_back_slow(b);
}

void PoolState::give_back_large(PooledBuffer& b, SlotCache& sc) noexcept {
  const BusyScope busy;
  if (t_pool_last.cache->trim.load(std::memory_order_acquire)) [[unlikely]]
    return give_back_slow(b);
  const std::uint64_t bytes = round_up(b.size_, kAlign);
  if (sc.large.size() >= kLargeCacheEntries || sc.large_bytes + bytes > large_cache_bytes) return give_back_slow(b);
  sc.large.push_back(bytes, Block{b.segment_, b.offset_});
  sc.large_bytes += bytes;
  sc.counters[b.size_class()].returned(b.size_, bytes);
  empty(b);
  returned_fence();
}

void PoolState::give_back_slow(PooledBuffer& b) noexcept {
  give_back_uncached(b);
  empty(b);
}

void PoolState::give_back_uncached(PooledBuffer& b) noexcept {
  if (t_caches_gone) [[unlikely]]
    return give_back_locked(b);
  const BusyScope busy;
  SlotCache* cached = nullptr;
  try {
    cached = &slot_cache(cache(), b.slot());
  } catch (const std::bad_alloc&) {
    return give_back_locked(b);  // no memory for a cache of this thread's: straight to the segments
  }
  auto& sc = *cached;
  const std::uint32_t cls = b.size_class();
  const bool small = cls < kSmallClasses;
  const std::uint64_t bytes = block_bytes(cls, b.size_);
  const Block block{b.segment_, b.offset_};
  // Counted before the block goes back to its segment: a stats() in between sees the buffer
  // returned while its block is still carved (active), never a block gone while still rented.
  sc.counters[cls].returned(b.size_, small ? 0 : bytes);
  if (small && sc.blocks[cls].limit > 0) {
    auto& stack = sc.blocks[cls];
    if (stack.full()) {
      // Full: half of it goes back to the segments.
      std::lock_guard lock(mutex);
      const auto keep = static_cast<std::uint32_t>(stack.size() / 2);
      for (std::uint32_t i = keep; i < stack.count; ++i) release_or_keep(block_of(stack.data[i]), bytes);
      stack.count = keep;
    }
    stack.push(PoolCachedBlock{b.segment_, b.offset_, b.host_});
  } else if (!small && bytes <= large_cache_bytes) {
    sc.large.push_back(bytes, block);
    sc.large_bytes += bytes;
    if (sc.large.size() > kLargeCacheEntries || sc.large_bytes > large_cache_bytes) {
      std::lock_guard lock(mutex);
      while (sc.large.size() > kLargeCacheEntries || sc.large_bytes > large_cache_bytes) {
        release_or_keep(sc.large.front().second, sc.large.front().first);
        sc.large_bytes -= sc.large.front().first;
        sc.large.erase(0);
      }
    }
  } else {
    std::lock_guard lock(mutex);
    release_or_keep(block, bytes);
  }
  returned_fence();
}

void PoolState::finish_if_last() {
  std::shared_ptr<PoolState> last;
  std::lock_guard lock(mutex);
  last = release_if_last();
}

}  // namespace detail

// --- PooledBuffer ----------------------------------------------------------------------------------

void PooledBuffer::retire() noexcept {
  if (pool_) static_cast<detail::PoolState*>(pool_)->retire(*this);
}

void PooledBuffer::give_back_slow() noexcept { static_cast<detail::PoolState*>(pool_)->give_back_rest(*this); }
void PooledBuffer::returned_after_close() noexcept { static_cast<detail::PoolState*>(pool_)->finish_if_last(); }

BufferKind PooledBuffer::kind() const { return pool_ ? segment_->memory->kind() : BufferKind::CpuShared; }
std::uint64_t PooledBuffer::capacity() const { return pool_ ? detail::block_bytes(size_class(), size_) : 0; }
vk::Buffer PooledBuffer::gpu_buffer() const { return pool_ ? segment_->vk_buffer : vk::Buffer{}; }
std::uint64_t PooledBuffer::gpu_offset() const { return pool_ ? segment_->vk_offset + offset_ : 0; }
const Buffer& PooledBuffer::segment() const { return *segment_->memory; }

Result<Export> PooledBuffer::export_handle() const {
  if (!pool_) return fail(Errc::InvalidArgument, "PooledBuffer::export_handle", "the buffer was returned");
  LF_TRY(Export e, segment_->memory->export_handle());
  e.descriptor.offset += offset_;
  e.descriptor.size = size_;
  return e;
}

// --- MemoryPool ------------------------------------------------------------------------------------

MemoryPool::MemoryPool(std::shared_ptr<detail::PoolState> state) : state_(std::move(state)), head_(state_.get()) {}
MemoryPool::MemoryPool(MemoryPool&& o) noexcept : state_(std::move(o.state_)), head_(std::exchange(o.head_, nullptr)) {}
MemoryPool& MemoryPool::operator=(MemoryPool&& o) noexcept {
  if (this != &o) {
    MemoryPool gone(std::move(*this));
    state_ = std::move(o.state_);
    head_ = std::exchange(o.head_, nullptr);
  }
  return *this;
}

MemoryPool::~MemoryPool() {
  if (!state_) return;
  auto& s = *state_;
  std::shared_ptr<detail::PoolState> handle = std::move(state_);
  s.stats_server.reset();  // its thread reads the state: before anything here changes it
  std::lock_guard lock(s.mutex);
  s.closing.store(true, std::memory_order_seq_cst);
  const bool fenced = s.fence.heavy();
  // Without a barrier a concurrent return may be missed: keep the memory (a leak) rather than risk
  // freeing it under that return.
  if (fenced && s.outstanding() == 0)
    s.release_everything();
  else
    s.keepalive = std::move(handle);  // the last return releases it (finish_if_last)
}

Result<MemoryPool> MemoryPool::create(PoolOptions o) {
  constexpr const char* call = "MemoryPool::create";
  if (o.segment_bytes == 0 || o.small_segment_bytes < kSmallMax)
    return fail(Errc::InvalidArgument, call,
                str_format("segment sizes must be > 0 and the small one >= {} bytes (got {} and {})", kSmallMax,
                           o.segment_bytes, o.small_segment_bytes));
  if (o.segment_bytes > (std::uint64_t{1} << 48) || o.small_segment_bytes > (std::uint64_t{1} << 48))
    return fail(Errc::InvalidArgument, call, "segment size beyond any memory");
  if (!(o.host_page_share >= 0 && o.host_page_share <= 1e6))  // NaN too
    return fail(Errc::InvalidArgument, call,
                str_format("host_page_share {} is not a share (0 turns it off)", o.host_page_share));
  if (!(o.max_cached_share >= 0 && o.max_cached_share <= 1e6))  // NaN too
    return fail(Errc::InvalidArgument, call,
                str_format("max_cached_share {} is not a share (0 turns it off)", o.max_cached_share));
  auto s = std::make_shared<detail::PoolState>();
  s->options = std::move(o);
  s->options.segment_bytes = detail::round_up(s->options.segment_bytes, detail::kAlign);
  s->options.small_segment_bytes = detail::round_up(s->options.small_segment_bytes, detail::kAlign);
  s->topology = CpuTopology::detect();
  // Blocks in thread caches are outside the caps: bounded too, a share of what the caps allow.
  s->large_cache_bytes = std::min(s->options.thread_cache_large_bytes, s->options.max_cached_bytes / 8);
  if (s->options.max_cached_share > 0)
    s->large_cache_bytes = std::min(s->large_cache_bytes, s->options.segment_bytes / 4);
  for (std::uint32_t c = 0; c < detail::kSmallClasses; ++c)
    s->cache_limits[c] = s->options.thread_cache_bytes == 0
                             ? 0
                             : std::clamp<std::uint64_t>(s->options.thread_cache_bytes / detail::class_size(c), 2,
                                                         detail::kThreadCacheMaxBlocks);
  if (const long page = ::sysconf(_SC_PAGESIZE); page > 0) s->page_bytes = static_cast<std::uint64_t>(page);
  const std::size_t nslots = detail::kKindSlots + static_cast<std::size_t>(std::max(1, s->topology.numa_nodes));
  s->slots.resize(nslots);
  for (std::uint32_t i = 0; i < nslots; ++i) {
    s->slots[i].kind = i < detail::kKindSlots ? static_cast<BufferKind>(i + 1) : BufferKind::CpuNuma;
    s->slots[i].node = i < detail::kKindSlots ? -1 : static_cast<int>(i - detail::kKindSlots);
  }
  s->locked.resize(nslots);
  s->locked_slot.resize(nslots);
  s->retired.resize(nslots);
  s->sampled_peaks.assign(3 + nslots, {0, 0, 0});
  if (!s->options.stats_label.empty()) {
    // The server is stopped before the state can go (~MemoryPool), so a plain pointer serves.
    LF_TRY(s->stats_server,
           detail::StatsServer::start(s->options.stats_directory, s->options.stats_label,
                                      [state = s.get()] { return detail::collect_stats(*state).to_json(); }));
  }
  return MemoryPool(std::move(s));
}

namespace {
[[gnu::cold]] Result<PooledBuffer> moved_from() {
  return fail(Errc::InvalidArgument, "MemoryPool::rent", "the pool was moved from");
}
}  // namespace

Result<PooledBuffer> MemoryPool::rent_slow(std::uint64_t size, BufferKind kind) {
  if (!state_) [[unlikely]]
    return moved_from();
  return state_->rent_rest(size, kind);
}
Result<PooledBuffer> MemoryPool::rent(const RentOptions& o) {
  if (o.numa_node == -1) return rent(o.size, o.kind);
  if (!state_) [[unlikely]]
    return moved_from();
  return state_->rent_slow(o);
}
const PoolOptions& MemoryPool::options() const { return state_->options; }

void MemoryPool::trim() {
  if (!state_) return;
  auto& s = *state_;
  const detail::BusyScope busy;
  auto* tc = detail::t_caches_gone ? nullptr : &s.cache();
  std::lock_guard lock(s.mutex);
  if (tc) s.flush(*tc);
  s.ask_caches_back(tc);
  s.retry_kept();
  s.release_free_segments(0);
  s.release_free_pages();
}

// --- statistics ------------------------------------------------------------------------------------

namespace {

void apply_locked(PoolStatGroup& g, const detail::LockedStats& l) {
  g.segment = l.segment;
  g.reserved_bytes = l.reserved_bytes;
  g.active = l.active;
  g.active_bytes = l.active_bytes;
}

void apply_counters(PoolStatGroup& g, const detail::ClassTotals& t, std::array<std::int64_t, 3>& peaks) {
  auto fill = [](PoolStat& s, std::uint64_t out, std::uint64_t back, std::int64_t& peak) {
    s.allocated = out;
    s.freed = back;
    s.current = static_cast<std::int64_t>(out - back);
    peak = std::max(peak, s.current);
    s.peak = peak;
  };
  fill(g.allocation, t.rents, t.returns, peaks[0]);
  fill(g.allocated_bytes, t.bytes_out, t.bytes_back, peaks[1]);
  fill(g.requested_bytes, t.requested_out, t.requested_back, peaks[2]);
}

}  // namespace

PoolStats MemoryPool::stats() const { return state_ ? detail::collect_stats(*state_) : PoolStats{}; }

PoolStats detail::collect_stats(const PoolState& s) {
  std::lock_guard lock(s.mutex);
  const std::size_t nslots = s.slots.size();
  std::vector<std::array<ClassTotals, kClasses>> totals = s.retired;
  for (const auto* tc : s.caches)  // every return before any rent (see bump)
    for (std::size_t i = 0; i < nslots; ++i)
      if (tc->slots[i])
        for (std::uint32_t c = 0; c < kClasses; ++c) totals[i][c].add_back(tc->slots[i]->counters[c], c);
  for (const auto* tc : s.caches)
    for (std::size_t i = 0; i < nslots; ++i)
      if (tc->slots[i])
        for (std::uint32_t c = 0; c < kClasses; ++c) totals[i][c].add_out(tc->slots[i]->counters[c], c);

  PoolStats out;
  ClassTotals all_t, pool_t[2];
  std::vector<ClassTotals> slot_t(nslots);
  std::array<ClassTotals, kClasses> class_t{};
  for (std::size_t i = 0; i < nslots; ++i)
    for (std::uint32_t c = 0; c < kClasses; ++c) {
      const auto& t = totals[i][c];
      all_t += t;
      pool_t[c >= kSmallClasses] += t;
      slot_t[i] += t;
      class_t[c] += t;
    }
  auto& peaks = s.sampled_peaks;
  apply_locked(out.all, s.locked_all);
  apply_counters(out.all, all_t, peaks[0]);
  apply_locked(out.small_pool, s.locked_pool[0]);
  apply_counters(out.small_pool, pool_t[0], peaks[1]);
  apply_locked(out.large_pool, s.locked_pool[1]);
  apply_counters(out.large_pool, pool_t[1], peaks[2]);

  std::uint64_t split[2] = {0, 0};
  for (std::size_t i = 0; i < nslots; ++i) {
    const auto& slot = s.slots[i];
    std::uint64_t slot_split = 0;
    for (int large = 0; large < 2; ++large)
      for (const auto& [id, seg] : slot.arenas[large].segments)
        if (seg->free_bytes != seg->size) {  // free bytes still backed by memory
          split[large] += seg->free_bytes - seg->released_bytes;
          slot_split += seg->free_bytes - seg->released_bytes;
        }
    if (!slot.used) continue;
    PoolKindStats k;
    k.kind = slot.kind;
    k.numa_node = slot.node;
    apply_locked(k.stats, s.locked_slot[i]);
    apply_counters(k.stats, slot_t[i], peaks[3 + i]);
    k.stats.inactive_split_bytes.current = static_cast<std::int64_t>(slot_split);
    k.hits = slot_t[i].hits;
    k.misses = slot.misses;
    out.kinds.push_back(std::move(k));
  }
  out.small_pool.inactive_split_bytes.current = static_cast<std::int64_t>(split[0]);
  out.large_pool.inactive_split_bytes.current = static_cast<std::int64_t>(split[1]);
  out.all.inactive_split_bytes.current = static_cast<std::int64_t>(split[0] + split[1]);
  for (std::uint32_t c = 0; c < kClasses; ++c)
    if (class_t[c].rents) out.classes.push_back({class_size(c), class_t[c].rents, class_t[c].hits, class_t[c].returns});
  out.num_hits = all_t.hits;
  out.num_misses = all_t.rents - all_t.hits;
  out.num_alloc_retries = s.num_alloc_retries;
  out.num_ooms = s.num_ooms;
  out.num_kept_carved = s.kept_count + s.kept_for_good;
  out.num_device_alloc = s.num_device_alloc;
  out.num_device_free = s.num_device_free;
  out.open_fds = s.open_fds;
  return out;
}

double PoolStats::reuse_rate() const {
  const auto n = num_hits + num_misses;
  return n ? static_cast<double>(num_hits) / static_cast<double>(n) : 0.0;
}

std::int64_t PoolStats::fragmentation_bytes() const { return all.reserved_bytes.current - all.allocated_bytes.current; }

std::string PoolStats::to_json() const {
  std::string j = "{";
  auto key = [&](std::string_view k, auto v) {
    if (j.size() > 1) j += ", ";
    j += str_format("\"{}\": {}", k, v);
  };
  auto group = [&](std::string_view name, const PoolStatGroup& g) {
    const std::pair<const char*, const PoolStat*> stats[] = {{"allocation", &g.allocation},
                                                             {"segment", &g.segment},
                                                             {"active", &g.active},
                                                             {"allocated_bytes", &g.allocated_bytes},
                                                             {"reserved_bytes", &g.reserved_bytes},
                                                             {"active_bytes", &g.active_bytes},
                                                             {"requested_bytes", &g.requested_bytes},
                                                             {"inactive_split_bytes", &g.inactive_split_bytes}};
    for (const auto& [stat, v] : stats) {
      key(str_format("{}.{}.current", stat, name), v->current);
      key(str_format("{}.{}.peak", stat, name), v->peak);
      key(str_format("{}.{}.allocated", stat, name), v->allocated);
      key(str_format("{}.{}.freed", stat, name), v->freed);
    }
  };
  group("all", all);
  group("small_pool", small_pool);
  group("large_pool", large_pool);
  for (const auto& k : kinds) {
    const std::string name =
        k.numa_node >= 0 ? str_format("{}.node{}", to_string(k.kind), k.numa_node) : std::string(to_string(k.kind));
    group(name, k.stats);
    key(str_format("num_hits.{}", name), k.hits);
    key(str_format("num_misses.{}", name), k.misses);
  }
  for (const auto& c : classes) {
    key(str_format("size_class.{}.rents", c.size), c.rents);
    key(str_format("size_class.{}.hits", c.size), c.hits);
    key(str_format("size_class.{}.returns", c.size), c.returns);
  }
  key("num_hits", num_hits);
  key("num_misses", num_misses);
  key("reuse_rate", str_format("{:.6f}", reuse_rate()));
  key("fragmentation_bytes", fragmentation_bytes());
  key("num_alloc_retries", num_alloc_retries);
  key("num_ooms", num_ooms);
  key("num_kept_carved", num_kept_carved);
  key("num_device_alloc", num_device_alloc);
  key("num_device_free", num_device_free);
  key("open_fds", open_fds);
  return j + "}";
}

}  // namespace lavaflow
