// SPDX-License-Identifier: MIT
#include <fcntl.h>
#include <linux/membarrier.h>
#include <pthread.h>
#include <sched.h>
#include <sys/file.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <condition_variable>
#include <csignal>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <mutex>
#include <nlohmann/json.hpp>
#include <optional>
#include <random>
#include <set>
#include <thread>

#include "lavaflow/core/pool.hpp"
#include "lavaflow/core/published_stats.hpp"
#include "support.hpp"

using namespace lavaflow;

namespace {

ino_t inode_of(const Export& e) {
  struct stat st {};
  REQUIRE(::fstat(e.fd.get(), &st) == 0);
  return st.st_ino;
}

/// Rents a buffer of a random size (a power of two below 2^`max_log2`, plus up to 99), writes its first
/// and last 64 bytes (disjoint: the tail is empty below 128 bytes), yields, and checks them: a
/// failed rent, or bytes that changed meanwhile (another thread holding the same memory), counts
/// in `errors`. Nothing when the rent failed.
std::optional<PooledBuffer> rent_and_check(MemoryPool& pool, std::mt19937_64& rng, unsigned max_log2,
                                           std::atomic<int>& errors) {
  const auto size = std::uint64_t{1} << (rng() % max_log2);
  auto b = pool.rent(size + rng() % 100);
  if (!b) {
    ++errors;
    return std::nullopt;
  }
  const std::uint64_t seed = rng();
  auto head = b->bytes().subspan(0, std::min<std::uint64_t>(b->size(), 64));
  auto tail = b->bytes().subspan(b->size() >= 128 ? b->size() - 64 : b->size());
  lftest::fill(head, seed);
  lftest::fill(tail, seed + 1);
  std::this_thread::yield();
  if (lftest::first_mismatch(head, seed) != -1 || lftest::first_mismatch(tail, seed + 1) != -1) ++errors;
  return std::move(*b);
}

/// Waits up to `limit` for forked `child` to end; false (the child killed) when it did not.
bool wait_child(pid_t child, int& status, std::chrono::milliseconds limit) {
  const auto end = std::chrono::steady_clock::now() + limit;
  while (::waitpid(child, &status, WNOHANG) == 0) {
    if (std::chrono::steady_clock::now() >= end) {
      ::kill(child, SIGKILL);
      ::waitpid(child, &status, 0);
      return false;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  return true;
}

}  // namespace

TEST_CASE("pool: rented host buffers have their size, aligned disjoint ranges, and return on drop") {
  auto pool = lftest::ok(MemoryPool::create());
  const std::uint64_t sizes[] = {
      1, 255, 256, 257, 4093, 65536, MemoryPool::kSmallMax, MemoryPool::kSmallMax + 1, std::uint64_t{70} << 20};
  std::vector<PooledBuffer> live;
  std::vector<std::pair<std::byte*, std::uint64_t>> ranges;
  for (auto size : sizes) {
    INFO("size " << size);
    auto b = lftest::ok(pool.rent(size));
    CHECK(b.size() == size);
    CHECK(b.kind() == BufferKind::CpuShared);
    CHECK(b.capacity() >= size);
    CHECK(b.capacity() % MemoryPool::kAlignment == 0);
    CHECK(b.offset() % MemoryPool::kAlignment == 0);
    REQUIRE(b.host_ptr() != nullptr);
    CHECK(reinterpret_cast<std::uintptr_t>(b.host_ptr()) % MemoryPool::kAlignment == 0);
    lftest::fill(b.bytes(), size);
    ranges.emplace_back(b.host_ptr(), b.capacity());
    live.push_back(std::move(b));
    // A moved-from buffer is empty: no pool, no memory, nothing to return twice.
    CHECK_FALSE(b);
    CHECK(b.host_ptr() == nullptr);
  }
  std::sort(ranges.begin(), ranges.end());
  for (std::size_t i = 1; i < ranges.size(); ++i) CHECK(ranges[i - 1].first + ranges[i - 1].second <= ranges[i].first);
  for (std::size_t i = 0; i < live.size(); ++i) CHECK(lftest::first_mismatch(live[i].bytes(), sizes[i]) == -1);

  auto s = pool.stats();
  CHECK(s.all.allocation.current == static_cast<std::int64_t>(live.size()));
  std::int64_t requested = 0;
  for (auto size : sizes) requested += static_cast<std::int64_t>(size);
  CHECK(s.all.requested_bytes.current == requested);
  CHECK(s.all.reserved_bytes.current >= s.all.allocated_bytes.current);
  CHECK(s.all.allocated_bytes.current >= requested);
  live.back().reset();
  CHECK_FALSE(live.back());
  CHECK(live.back().host_ptr() == nullptr);
  live.back().reset();  // idempotent
  live.clear();
  s = pool.stats();
  CHECK(s.all.allocation.current == 0);
  CHECK(s.all.allocated_bytes.current == 0);
  CHECK(s.all.requested_bytes.current == 0);
  CHECK(s.all.allocation.allocated == std::size(sizes));
  CHECK(s.all.allocation.freed == std::size(sizes));
  CHECK(s.all.requested_bytes.peak == requested);  // the peak stats() saw, above (see PoolStatGroup)
}

TEST_CASE("pool: a returned buffer is rented again without a new allocation") {
  auto pool = lftest::ok(MemoryPool::create());
  for (std::uint64_t size : {std::uint64_t{4096}, std::uint64_t{8} << 20}) {
    INFO("size " << size);
    std::byte* first = nullptr;
    {
      auto b = lftest::ok(pool.rent(size));
      first = b.host_ptr();
    }
    const auto before = pool.stats();
    for (int i = 0; i < 100; ++i) {
      auto b = lftest::ok(pool.rent(size));
      CHECK(b.host_ptr() == first);
    }
    const auto after = pool.stats();
    CHECK(after.num_device_alloc == before.num_device_alloc);
    CHECK(after.num_hits == before.num_hits + 100);
  }
  const auto s = pool.stats();
  CHECK(s.num_misses == 2);
  CHECK(s.reuse_rate() > 0.98);
}

TEST_CASE(
    "pool: a thread keeps at most its cache limit of returned blocks, and without a cache every block goes back") {
  constexpr std::uint64_t kSize = 64 << 10;
  for (std::uint64_t cache_bytes : {std::uint64_t{512} << 10, std::uint64_t{0}}) {
    INFO("thread_cache_bytes " << cache_bytes);
    auto pool = lftest::ok(MemoryPool::create({.thread_cache_bytes = cache_bytes}));
    std::uint64_t first_round_allocations = 0;
    for (int round = 0; round < 2; ++round) {
      std::vector<PooledBuffer> live;
      for (int i = 0; i < 200; ++i) {
        live.push_back(lftest::ok(pool.rent(kSize)));
        lftest::fill(live.back().bytes(), static_cast<std::uint64_t>(i));
      }
      for (int i = 0; i < 200; ++i) CHECK(lftest::first_mismatch(live[i].bytes(), static_cast<std::uint64_t>(i)) == -1);
      CHECK(pool.stats().all.allocation.current == 200);
      live.clear();
      const auto s = pool.stats();
      CHECK(s.all.allocation.current == 0);
      // Blocks still carved out are the thread's: at most its limit for the class.
      CHECK(s.all.active.current <= static_cast<std::int64_t>(cache_bytes / kSize));
      if (round == 0) first_round_allocations = s.num_device_alloc;
    }
    const auto s = pool.stats();
    CHECK(s.all.allocation.allocated == 400);
    CHECK(s.all.allocation.freed == 400);
    CHECK(s.num_device_alloc == first_round_allocations);  // the second round fits in the first's segments
  }
}

TEST_CASE("pool: a thousand small buffers share a few segments and fds, and export their own bytes") {
  const auto fds_before = lftest::open_fds();
  auto pool = lftest::ok(MemoryPool::create());
  std::vector<PooledBuffer> live;
  for (int i = 0; i < 1000; ++i) {
    live.push_back(lftest::ok(pool.rent(1000 + static_cast<std::uint64_t>(i % 7) * 100)));
    lftest::fill(live.back().bytes(), static_cast<std::uint64_t>(i));
  }
  const auto s = pool.stats();
  CHECK(s.num_device_alloc <= 2);
  CHECK(s.open_fds == s.num_device_alloc);
  CHECK(lftest::open_fds() <= fds_before + 2);

  auto a = lftest::ok(live[3].export_handle());
  auto b = lftest::ok(live[900].export_handle());
  CHECK(inode_of(a) == inode_of(b));  // one memory object
  CHECK(a.descriptor.offset != b.descriptor.offset);
  CHECK(a.descriptor.size == live[3].size());
  auto imported = lftest::ok(CpuBuffer::import(a.descriptor, std::move(a.fd)));
  CHECK(imported.size() == live[3].size());
  CHECK(lftest::first_mismatch(imported.bytes(), 3) == -1);
}

TEST_CASE("pool: a rented buffer crosses into another process, which sees exactly its bytes") {
  auto pool = lftest::ok(MemoryPool::create());
  auto filler = lftest::ok(pool.rent(3000));  // so the buffer under test does not start the segment
  auto b = lftest::ok(pool.rent(5000));
  REQUIRE(b.offset() > 0);
  lftest::fill(b.bytes(), 41);
  auto ex = lftest::ok(b.export_handle());
  auto [mine, theirs] = lftest::ok(socket_pair());
  const pid_t pid = ::fork();
  REQUIRE(pid >= 0);
  if (pid == 0) {
    mine.reset();
    auto msg = recv_message(theirs.get(), std::chrono::seconds(10));
    if (!msg || msg->fds.size() != 1) std::_Exit(10);
    auto desc = ExportDescriptor::deserialize(msg->payload);
    if (!desc) std::_Exit(11);
    auto got = CpuBuffer::import(*desc, std::move(msg->fds[0]));
    if (!got || got->size() != 5000) std::_Exit(12);
    if (lftest::first_mismatch(got->bytes(), 41) != -1) std::_Exit(13);
    lftest::fill(got->bytes(), 42);
    std::_Exit(0);
  }
  theirs.reset();
  const int fd = ex.fd.get();
  REQUIRE(send_message(mine.get(), ex.descriptor.serialize(), std::span<const int>(&fd, 1)));
  int status = 0;
  REQUIRE(::waitpid(pid, &status, 0) == pid);
  REQUIRE(WIFEXITED(status));
  CHECK(WEXITSTATUS(status) == 0);
  CHECK(lftest::first_mismatch(b.bytes(), 42) == -1);
}

TEST_CASE("pool: an importer that maps the descriptor's range writes only that range, not the neighbours") {
  auto pool = lftest::ok(MemoryPool::create());
  auto left = lftest::ok(pool.rent(512));
  auto mid = lftest::ok(pool.rent(512));
  auto right = lftest::ok(pool.rent(512));
  lftest::fill(left.bytes(), 1);
  lftest::fill(right.bytes(), 3);
  auto ex = lftest::ok(mid.export_handle());
  auto imported = lftest::ok(CpuBuffer::import(ex.descriptor, std::move(ex.fd)));
  std::fill(imported.bytes().begin(), imported.bytes().end(), std::byte{0xee});
  CHECK(lftest::first_mismatch(left.bytes(), 1) == -1);
  CHECK(lftest::first_mismatch(right.bytes(), 3) == -1);
  CHECK(std::all_of(mid.bytes().begin(), mid.bytes().end(), [](std::byte x) { return x == std::byte{0xee}; }));
}

TEST_CASE("pool: bad requests are refused with the cause") {
  auto pool = lftest::ok(MemoryPool::create());
  CHECK(lftest::err(pool.rent(0)).code() == Errc::InvalidArgument);
  CHECK(lftest::err(pool.rent(std::uint64_t{1} << 62)).code() == Errc::InvalidArgument);
  CHECK(lftest::err(pool.rent(64, static_cast<BufferKind>(0))).code() == Errc::InvalidArgument);
  CHECK(lftest::err(pool.rent(64, static_cast<BufferKind>(99))).code() == Errc::InvalidArgument);
  const auto private_kind = lftest::err(pool.rent(64, BufferKind::CpuPrivate));
  CHECK(private_kind.code() == Errc::InvalidArgument);
  CHECK(private_kind.cause().find("not pooled") != std::string::npos);
  CHECK(lftest::err(pool.rent(RentOptions{64, BufferKind::CpuShared, 0})).code() == Errc::InvalidArgument);
  CHECK(lftest::err(pool.rent(RentOptions{64, BufferKind::CpuNuma, 4096})).code() == Errc::InvalidArgument);
  CHECK(lftest::err(pool.rent(RentOptions{64, BufferKind::CpuNuma, -7})).code() == Errc::InvalidArgument);
  MemoryPool moved = std::move(pool);
  CHECK(lftest::err(pool.rent(64)).code() == Errc::InvalidArgument);  // NOLINT(bugprone-use-after-move)
  pool = std::move(moved);
  auto gpu = lftest::err(pool.rent(64, BufferKind::GpuDeviceLocal));
  CHECK(gpu.code() == Errc::Unsupported);
  CHECK(gpu.cause().find("Vulkan") != std::string::npos);
  CHECK(lftest::err(MemoryPool::create({.small_segment_bytes = 4096})).code() == Errc::InvalidArgument);
  CHECK(lftest::err(MemoryPool::create({.segment_bytes = 0})).code() == Errc::InvalidArgument);
  CHECK(pool.stats().all.segment.current == 0);
}

TEST_CASE("pool: a failing allocation releases cached memory and is retried once") {
  auto pool = lftest::ok(MemoryPool::create());
  { auto cached = lftest::ok(pool.rent(std::uint64_t{8} << 20)); }
  CHECK(pool.stats().all.reserved_bytes.current > 0);
  // No address space has room for this: mmap fails, and the pool releases its cache first.
  auto e = lftest::err(pool.rent(std::uint64_t{1} << 55));
  INFO(e.message());
  const auto s = pool.stats();
  CHECK(s.num_alloc_retries == 1);
  CHECK(s.num_ooms == 1);
  CHECK(s.all.reserved_bytes.current == 0);
  CHECK(s.all.segment.current == 0);
}

TEST_CASE("pool: the cap on cached bytes and trim() release free segments") {
  SECTION("cap 0: a returned large buffer's segment goes back at once") {
    auto pool = lftest::ok(MemoryPool::create({.max_cached_bytes = 0}));
    { auto b = lftest::ok(pool.rent(std::uint64_t{16} << 20)); }
    const auto s = pool.stats();
    CHECK(s.all.reserved_bytes.current == 0);
    CHECK(s.num_device_free == 1);
  }
  SECTION("cap of one segment: a second free segment is released, the first kept") {
    const std::uint64_t seg = std::uint64_t{64} << 20;
    auto pool = lftest::ok(MemoryPool::create({.max_cached_bytes = seg, .host_page_share = 0}));
    {
      auto a = lftest::ok(pool.rent(seg));
      auto b = lftest::ok(pool.rent(seg));
      CHECK(pool.stats().all.segment.current == 2);
    }
    const auto s = pool.stats();
    CHECK(s.all.segment.current == 1);
    CHECK(static_cast<std::uint64_t>(s.all.reserved_bytes.current) <= seg);
  }
  SECTION("the cap that follows the load: a share of the bytes rented out, never below half a segment") {
    const std::uint64_t seg = std::uint64_t{8} << 20, mib = 1 << 20;
    auto pool = lftest::ok(MemoryPool::create({.segment_bytes = seg,
                                               .max_cached_share = 0.25,
                                               .host_page_share = 0,  // this cap alone
                                               .thread_cache_bytes = 0,
                                               .thread_cache_large_bytes = 0}));
    std::vector<PooledBuffer> out;
    for (int i = 0; i < 32; ++i) out.push_back(lftest::ok(pool.rent(seg)));  // a segment each
    auto cached = [&] {
      const auto s = pool.stats();
      return static_cast<std::uint64_t>(s.all.reserved_bytes.current - s.all.active_bytes.current);
    };
    out.resize(16);  // 128 MiB still out: up to a quarter of it stays cached
    CHECK(cached() <= 32 * mib);
    CHECK(cached() >= 24 * mib);
    out.clear();  // nothing out: half a segment at most
    CHECK(cached() <= seg / 2);
    CHECK(lftest::err(MemoryPool::create({.max_cached_share = -1})).code() == Errc::InvalidArgument);
    CHECK(lftest::err(MemoryPool::create({.max_cached_share = std::nan("")})).code() == Errc::InvalidArgument);
  }
  SECTION("trim() returns this thread's cached blocks and every free segment") {
    auto pool = lftest::ok(MemoryPool::create({.host_page_share = 0}));  // keeps the big block for trim()
    auto keep = lftest::ok(pool.rent(std::uint64_t{4} << 20));
    for (int i = 0; i < 10; ++i) auto b = lftest::ok(pool.rent(4096 * static_cast<std::uint64_t>(i + 1)));
    { auto big = lftest::ok(pool.rent(std::uint64_t{100} << 20)); }
    CHECK(pool.stats().all.segment.current >= 3);
    pool.trim();
    const auto s = pool.stats();
    CHECK(s.all.segment.current == 1);  // the segment `keep` lives in
    CHECK(s.all.active.current == 1);
    // Its free pages went back too: what stays reserved is `keep` (its pages rounded out).
    CHECK(s.all.inactive_split_bytes.current < 4096);
    CHECK(s.all.reserved_bytes.current < (std::int64_t{4} << 20) + 8192);
  }
}

TEST_CASE("pool: trim() takes back the large blocks an idle thread keeps, and its small ones at its next call") {
  auto pool = lftest::ok(MemoryPool::create());
  const std::uint64_t big = std::uint64_t{32} << 20;
  std::mutex m;
  std::condition_variable cv;
  int stage = 0;  // 1: the worker keeps its blocks; 2: go on; 3: it made one more call
  auto wait_for = [&](int s) {
    std::unique_lock lock(m);
    cv.wait(lock, [&] { return stage >= s; });
  };
  auto set = [&](int s) {
    {
      std::lock_guard lock(m);
      stage = s;
    }
    cv.notify_all();
  };
  std::thread worker([&] {
    { auto b = pool.rent(big); }  // kept in this thread's cache, exactly as large as it was
    for (int i = 0; i < 4; ++i) auto b = pool.rent(4096);
    set(1);
    wait_for(2);
    // The next call returns what the thread kept first: its small blocks too.
    auto again = pool.rent(big);
    CHECK(again.has_value());
    set(3);
    wait_for(4);
  });
  wait_for(1);
  const auto before = pool.stats();
  CHECK(before.all.segment.current == 2);  // the large block's segment and a small one
  pool.trim();
  const auto after = pool.stats();
  // The large block went back at once where the kernel has membarrier (the worker is idle);
  // elsewhere it comes back with the worker's next call.
  const long commands = ::syscall(SYS_membarrier, MEMBARRIER_CMD_QUERY, 0, 0);
  if (commands > 0 && (commands & MEMBARRIER_CMD_PRIVATE_EXPEDITED) != 0) {
    CHECK(after.all.segment.current == 1);  // the small one, which the worker's stack still holds
  } else {
    WARN("no private expedited membarrier here: large blocks come back at the worker's next call");
  }
  set(2);
  wait_for(3);
  pool.trim();
  const auto later = pool.stats();
  // The worker's small blocks came back with its call, so their segment went at this trim; what
  // stays is the segment of the large buffer the worker holds.
  CHECK(later.all.segment.current == 1);
  CHECK(later.all.active.current == 1);
  CHECK(later.all.reserved_bytes.current == static_cast<std::int64_t>(big));
  set(4);
  worker.join();
  pool.trim();
  CHECK(pool.stats().all.reserved_bytes.current == 0);
}

TEST_CASE("pool: trim() while other threads rent and return loses nothing and overlaps nothing") {
  auto pool = lftest::ok(MemoryPool::create({.segment_bytes = std::uint64_t{8} << 20}));
  constexpr int kThreads = 4;
  constexpr int kOps = 3000;
  std::atomic<int> errors{0}, running{kThreads};
  std::atomic<std::uint64_t> trims{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t)
    threads.emplace_back([&, t] {
      std::mt19937_64 rng(static_cast<std::uint64_t>(t) + 100);
      std::vector<PooledBuffer> mine;
      for (int i = 0; i < kOps; ++i) {
        auto b = rent_and_check(pool, rng, 24, errors);  // 1 B .. 8 MiB: small and large blocks
        if (!b) continue;
        if (rng() % 2) {
          mine.push_back(std::move(*b));
          if (mine.size() > 6) mine.erase(mine.begin() + static_cast<long>(rng() % mine.size()));
        }
      }
      --running;
    });
  std::thread trimmer([&] {
    // Not back to back: a trim holds the lock through membarrier() and every free range's
    // madvise, and on a machine of many cores a trimmer that never pauses starves the workers.
    do {
      pool.trim();
      ++trims;
      std::this_thread::sleep_for(std::chrono::microseconds(200));
    } while (running > 0);
  });
  for (auto& t : threads) t.join();
  trimmer.join();
  CHECK(errors == 0);
  CHECK(trims > 0);
  const auto s = pool.stats();
  CHECK(s.all.allocation.current == 0);
  CHECK(s.all.allocated_bytes.current == 0);
  CHECK(s.all.allocation.allocated == static_cast<std::uint64_t>(kThreads) * kOps);
  pool.trim();
  CHECK(pool.stats().all.reserved_bytes.current == 0);
}

TEST_CASE("pool: host memory above the cap gives the pages of free ranges back to the system") {
  // Bytes of the segment's memfd that hold memory now (blocks the file system counts).
  auto backed = [](const PooledBuffer& b) {
    auto e = lftest::ok(b.segment().export_handle());
    struct stat st {};
    REQUIRE(::fstat(e.fd.get(), &st) == 0);
    return static_cast<std::int64_t>(st.st_blocks) * 512;
  };
  const std::int64_t mib = 1 << 20;
  auto pool = lftest::ok(MemoryPool::create({.max_cached_bytes = 4 << 20, .thread_cache_large_bytes = 0}));
  auto a = lftest::ok(pool.rent(16 * mib));
  auto b = lftest::ok(pool.rent(16 * mib));
  auto c = lftest::ok(pool.rent(16 * mib));
  REQUIRE(&a.segment() == &b.segment());
  REQUIRE(&b.segment() == &c.segment());
  for (auto* x : {&a, &b, &c}) std::memset(x->host_ptr(), 0x5a, x->size());
  CHECK(backed(a) >= 48 * mib);
  const auto before = pool.stats().all.reserved_bytes.current;
  b.reset();  // a free range in a segment still in use, above the cap: its pages go back
  CHECK(backed(a) <= 32 * mib + 64 * 1024);
  CHECK(pool.stats().all.reserved_bytes.current == before - 16 * mib);
  CHECK(pool.stats().all.inactive_split_bytes.current == 0);  // the segment's tail, never rented, holds nothing
  // Rented again: the same place, fresh pages, counted as reserved again; the neighbours keep
  // their bytes.
  auto d = lftest::ok(pool.rent(16 * mib));
  CHECK(d.offset() == 16 * static_cast<std::uint64_t>(mib));
  CHECK(pool.stats().all.reserved_bytes.current == before);
  CHECK(pool.stats().num_misses == 1);
  CHECK(static_cast<unsigned char>(d.host_ptr()[0]) == 0);
  std::memset(d.host_ptr(), 0x33, d.size());
  CHECK(static_cast<unsigned char>(a.host_ptr()[a.size() - 1]) == 0x5a);
  CHECK(static_cast<unsigned char>(c.host_ptr()[0]) == 0x5a);
  CHECK(backed(a) >= 48 * mib);
  a.reset();
  d.reset();
  c.reset();  // the segment is wholly free: it goes back with its fd
  const auto s = pool.stats();
  CHECK(s.all.segment.current == 0);
  CHECK(s.all.reserved_bytes.current == 0);
  CHECK(s.open_fds == 0);
}

TEST_CASE("pool: a pool as created keeps few touched host pages beside what is rented, and large blocks warm") {
  const std::int64_t mib = 1 << 20;
  auto pool = lftest::ok(MemoryPool::create());
  const auto cached = [&] {
    const auto s = pool.stats();
    return s.all.reserved_bytes.current - s.all.active_bytes.current;
  };
  SECTION("a new segment holds no memory until blocks are carved over it") {
    auto b = lftest::ok(pool.rent(3 * mib));
    CHECK(pool.stats().all.reserved_bytes.current == 3 * mib);
    CHECK(pool.stats().all.segment.current == 1);
  }
  SECTION("returned host blocks beyond half a segment and a share of what is out give their pages back") {
    std::vector<PooledBuffer> out;
    for (int i = 0; i < 40; ++i) {
      out.push_back(lftest::ok(pool.rent(static_cast<std::uint64_t>(3 * mib))));
      std::memset(out.back().host_ptr(), 0x5a, out.back().size());
    }
    for (std::size_t i = 0; i < out.size(); i += 2) out[i].reset();  // 60 MiB back, scattered
    const auto s = pool.stats();
    const auto keep = std::max<std::int64_t>(
        32 * mib, static_cast<std::int64_t>(0.05 * static_cast<double>(s.all.active_bytes.current)));
    // What the thread keeps for itself (large blocks up to 64 MiB) is on top.
    CHECK(cached() <= keep + 64 * mib);
    CHECK(s.all.reserved_bytes.current < 120 * mib);
    // Every byte still rented kept its contents.
    for (std::size_t i = 1; i < out.size(); i += 2) {
      CHECK(static_cast<unsigned char>(out[i].host_ptr()[0]) == 0x5a);
      CHECK(static_cast<unsigned char>(out[i].host_ptr()[out[i].size() - 1]) == 0x5a);
    }
  }
  SECTION("a block of a whole segment rented again and again stays warm") {
    const std::uint64_t seg = std::uint64_t{64} << 20;
    const void* first = nullptr;
    for (int i = 0; i < 5; ++i) {
      auto b = lftest::ok(pool.rent(seg));
      std::memset(b.host_ptr(), i, 4096);
      if (!first) first = b.host_ptr();
      CHECK(b.host_ptr() == first);
    }
    const auto s = pool.stats();
    CHECK(s.num_misses == 1);
    CHECK(s.num_device_alloc == 1);
  }
  SECTION("a large block the thread keeps serves a smaller large rent, pages and segment kept") {
    const void* first = nullptr;
    {
      auto b = lftest::ok(pool.rent(std::uint64_t{64} << 20));
      std::memset(b.host_ptr(), 0x5a, b.size());
      first = b.host_ptr();
    }
    auto c = lftest::ok(pool.rent(std::uint64_t{32} << 20));
    CHECK(c.host_ptr() == first);
    CHECK(static_cast<unsigned char>(c.host_ptr()[c.size() - 1]) == 0x5a);  // warm: the same pages
    CHECK(pool.stats().num_device_alloc == 1);
  }
  CHECK(lftest::err(MemoryPool::create({.host_page_share = -0.5})).code() == Errc::InvalidArgument);
}

TEST_CASE("pool: statistics come as JSON with PyTorch-style keys") {
  auto pool = lftest::ok(MemoryPool::create());
  auto a = lftest::ok(pool.rent(4096));
  auto b = lftest::ok(pool.rent(4096));
  auto c = lftest::ok(pool.rent(std::uint64_t{3} << 20));
  const auto j = nlohmann::json::parse(pool.stats().to_json());
  CHECK(j.at("allocation.all.current") == 3);
  CHECK(j.at("allocated_bytes.all.current") == 2 * 4096 + (std::uint64_t{3} << 20));
  CHECK(j.at("allocated_bytes.small_pool.current") == 2 * 4096);
  CHECK(j.at("allocated_bytes.large_pool.current") == std::uint64_t{3} << 20);
  CHECK(j.at("requested_bytes.all.current") == 2 * 4096 + (std::uint64_t{3} << 20));
  CHECK(j.at("reserved_bytes.all.current") >= j.at("active_bytes.all.current"));
  CHECK(j.at("active_bytes.all.current") >= j.at("allocated_bytes.all.current"));
  CHECK(j.at("segment.all.current") == 2);
  CHECK(j.at("allocation.cpu-shared.current") == 3);
  CHECK(j.at("size_class.4096.rents") == 2);
  CHECK(j.at("num_misses") == 2);
  CHECK(j.at("num_hits") == 1);
  CHECK(j.contains("fragmentation_bytes"));
  CHECK(j.contains("num_alloc_retries"));
  CHECK(j.contains("inactive_split_bytes.all.current"));
}

TEST_CASE("pool: threads rent, write, hand over and return concurrently without overlap or loss") {
  auto pool = lftest::ok(MemoryPool::create({.segment_bytes = std::uint64_t{8} << 20}));
  constexpr int kThreads = 6;
  constexpr int kOps = 4000;
  std::mutex handover_mutex;
  std::vector<PooledBuffer> handover;  // buffers one thread rents and another returns
  std::atomic<int> errors{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t)
    threads.emplace_back([&, t] {
      std::mt19937_64 rng(static_cast<std::uint64_t>(t));
      std::vector<PooledBuffer> mine;
      for (int i = 0; i < kOps; ++i) {
        auto b = rent_and_check(pool, rng, 22, errors);  // 1 B .. 2 MiB
        if (!b) continue;
        if (rng() % 4 == 0) {
          std::lock_guard lock(handover_mutex);
          handover.push_back(std::move(*b));
          if (handover.size() > 16) handover.erase(handover.begin());  // returned by whichever thread
        } else if (rng() % 2) {
          mine.push_back(std::move(*b));
          if (mine.size() > 8) mine.erase(mine.begin() + static_cast<long>(rng() % mine.size()));
        }
      }
    });
  for (auto& t : threads) t.join();
  CHECK(errors == 0);
  handover.clear();
  const auto s = pool.stats();
  CHECK(s.all.allocation.current == 0);
  CHECK(s.all.allocated_bytes.current == 0);
  CHECK(s.all.allocation.allocated == static_cast<std::uint64_t>(kThreads) * kOps);
  CHECK(s.reuse_rate() > 0.95);
}

TEST_CASE("pool: a pool closed with buffers still rented keeps them valid and frees everything after") {
  const auto fds_before = lftest::open_fds();
  PooledBuffer survivor;
  {
    auto pool = lftest::ok(MemoryPool::create());
    survivor = lftest::ok(pool.rent(10000));
    auto other = lftest::ok(pool.rent(std::uint64_t{5} << 20));
  }
  lftest::fill(survivor.bytes(), 7);
  CHECK(lftest::first_mismatch(survivor.bytes(), 7) == -1);
  auto ex = lftest::ok(survivor.export_handle());
  ex.fd.reset();
  survivor.reset();
  CHECK_FALSE(survivor);
  CHECK(lftest::open_fds() == fds_before);
  CHECK(lftest::err(survivor.export_handle()).code() == Errc::InvalidArgument);
}

TEST_CASE("pool: Vulkan memory is rented from exported segments and imports with exactly its bytes") {
  auto ctx = lftest::context_or_skip();
  if (!ctx.capabilities().memory_fd_export) lftest::skip("device cannot export opaque-fd memory");
  auto other = lftest::ok(VulkanContext::create({.device = ctx.capabilities().identity.device_uuid}));
  auto pool = lftest::ok(MemoryPool::create({.vulkan = ctx}));
  for (auto kind : {BufferKind::GpuDeviceLocal, BufferKind::GpuHostVisible}) {
    std::vector<PooledBuffer> live;
    for (std::uint64_t size : {std::uint64_t{300}, std::uint64_t{4096}, std::uint64_t{3} << 20}) {
      INFO(to_string(kind) << " size " << size);
      live.push_back(lftest::ok(pool.rent(size, kind)));
      auto& b = live.back();
      CHECK(b.kind() == kind);
      CHECK(b.gpu_buffer());
      // Write through a GPU copy into the buffer's place in the segment.
      auto staging = lftest::ok(GpuBuffer::allocate(ctx, {.size = size, .memory = GpuMemory::HostVisible}));
      lftest::fill(staging.bytes(), size);
      lftest::vk_copy(ctx, staging.buffer(), 0, b.gpu_buffer(), b.gpu_offset(), size);
      auto ex = lftest::ok(b.export_handle());
      CHECK(ex.descriptor.size == size);
      auto imported = lftest::ok(GpuBuffer::import(other, ex.descriptor, std::move(ex.fd)));
      CHECK(imported.size() == size);
      auto readback = lftest::ok(GpuBuffer::allocate(other, {.size = size, .memory = GpuMemory::HostVisible}));
      lftest::vk_copy(other, imported.buffer(), imported.offset(), readback.buffer(), 0, size);
      CHECK(lftest::first_mismatch(readback.bytes(), size) == -1);
    }
    const auto s = pool.stats();
    CHECK(s.num_device_alloc <= 4);
  }
  const auto j = nlohmann::json::parse(pool.stats().to_json());
  CHECK(j.at("allocation.gpu-device-local.allocated") == 3);
  CHECK(j.at("allocation.gpu-host-visible.allocated") == 3);
  CHECK(j.at("allocation.all.current") == 0);
}

namespace {
struct ThreadHolder {
  PooledBuffer buffer;
};
}  // namespace

TEST_CASE("pool: a buffer returned by a thread_local destructor after the thread's caches ended") {
  auto pool = lftest::ok(MemoryPool::create());
  std::thread([&] {
    // Constructed before the thread's first rent, so destroyed after the pool's thread caches.
    static thread_local ThreadHolder holder;
    holder.buffer = lftest::ok(pool.rent(4096));
    auto other = lftest::ok(pool.rent(std::uint64_t{2} << 20));
  }).join();
  const auto s = pool.stats();
  CHECK(s.all.allocation.current == 0);
  CHECK(s.all.active.current == 0);
  CHECK(s.all.allocation.freed == 2);
}

TEST_CASE("pool: statistics read while other threads rent and return never go negative") {
  auto pool = lftest::ok(MemoryPool::create());
  std::atomic<bool> stop{false};
  std::mutex m;
  std::vector<PooledBuffer> passing;  // rented by one thread, returned by the other
  std::thread renter([&] {
    while (!stop) {
      auto b = pool.rent(4096);
      if (!b) continue;
      std::lock_guard lock(m);
      if (passing.size() < 64) passing.push_back(std::move(*b));
    }
  });
  std::thread returner([&] {
    while (!stop) {
      std::lock_guard lock(m);
      passing.clear();
    }
  });
  bool negative = false;
  for (int i = 0; i < 2000 && !negative; ++i) {
    const auto s = pool.stats();
    negative = s.all.allocation.current < 0 || s.all.allocated_bytes.current < 0 || s.all.requested_bytes.current < 0;
  }
  stop = true;
  renter.join();
  returner.join();
  CHECK_FALSE(negative);
}

namespace {

/// Host memory standing in for device memory from an outside allocator (the CUDA adapter's, which
/// needs a GPU): what the pool does with such segments does not depend on where they came from.
class OutsideSegment final : public Buffer {
 public:
  OutsideSegment(CpuBuffer memory, BufferKind kind) : memory_(std::move(memory)), kind_(kind) {}
  [[nodiscard]] std::uint64_t size() const override { return memory_.size(); }
  [[nodiscard]] BufferKind kind() const override { return kind_; }
  [[nodiscard]] std::byte* host_ptr() const override { return memory_.host_ptr(); }
  [[nodiscard]] Result<Export> export_handle() const override { return memory_.export_handle(); }

 private:
  CpuBuffer memory_;
  BufferKind kind_;
};

}  // namespace

TEST_CASE("pool: device segments from an outside allocator are sub-allocated, and a wrong segment is refused") {
  int calls = 0;
  BufferKind give = BufferKind::GpuDeviceLocal;
  auto pool =
      lftest::ok(MemoryPool::create({.device_segments = [&](std::uint64_t bytes) -> Result<std::unique_ptr<Buffer>> {
        ++calls;
        LF_TRY(auto m, CpuBuffer::allocate({.size = bytes}));
        return std::make_unique<OutsideSegment>(std::move(m), give);
      }}));
  // No Vulkan device: GpuDeviceLocal comes from the allocator, GpuHostVisible still needs Vulkan.
  std::vector<PooledBuffer> live;
  for (int i = 0; i < 100; ++i) live.push_back(lftest::ok(pool.rent(8192, BufferKind::GpuDeviceLocal)));
  CHECK(calls == 1);
  CHECK(live.front().kind() == BufferKind::GpuDeviceLocal);
  CHECK(dynamic_cast<const OutsideSegment*>(&live.front().segment()) != nullptr);
  CHECK(pool.rent(8192, BufferKind::GpuHostVisible).error().code() == Errc::Unsupported);
  // The export names the buffer's range of the segment.
  auto ex = lftest::ok(live[7].export_handle());
  CHECK(ex.descriptor.offset == live[7].offset());
  CHECK(ex.descriptor.size == 8192);
  // A segment of another kind is a bug of the allocator, named as such; the pool goes on.
  give = BufferKind::CpuShared;
  auto wrong = pool.rent(std::uint64_t{200} << 20, BufferKind::GpuDeviceLocal);
  REQUIRE_FALSE(wrong);
  CHECK(wrong.error().code() == Errc::Internal);
  CHECK(wrong.error().message().find("device_segments") != std::string::npos);
  CHECK(pool.stats().num_alloc_retries == 0);  // a broken allocator is not retried at the cache's expense
  give = BufferKind::GpuDeviceLocal;
  CHECK(pool.rent(std::uint64_t{200} << 20, BufferKind::GpuDeviceLocal));
}

namespace {

/// A buffer rented from one pool serving as a segment of another.
class RentedSegment final : public Buffer {
 public:
  explicit RentedSegment(PooledBuffer b) : b_(std::move(b)) {}
  [[nodiscard]] std::uint64_t size() const override { return b_.size(); }
  [[nodiscard]] BufferKind kind() const override { return b_.kind(); }
  [[nodiscard]] std::byte* host_ptr() const override { return b_.host_ptr(); }
  [[nodiscard]] Result<Export> export_handle() const override { return b_.export_handle(); }

 private:
  PooledBuffer b_;
};

MemoryPool outside_pool() {
  return lftest::ok(MemoryPool::create({.device_segments = [](std::uint64_t bytes) -> Result<std::unique_ptr<Buffer>> {
    LF_TRY(auto m, CpuBuffer::allocate({.size = bytes}));
    return std::make_unique<OutsideSegment>(std::move(m), BufferKind::GpuDeviceLocal);
  }}));
}

}  // namespace

TEST_CASE("pool: a pool whose segments are rented from another pool rents and returns on threads new to both") {
  // In a child process: a thread that deadlocked could not be ended inside this one.
  const pid_t child = ::fork();
  REQUIRE(child >= 0);
  if (child == 0) {
    auto parent = outside_pool();
    PoolOptions o;
    o.thread_cache_bytes = 0;  // returns go to the segments, which go at once when free
    o.max_cached_bytes = 0;
    o.small_segment_bytes = std::uint64_t{1} << 20;
    o.device_segments = [&parent](std::uint64_t bytes) -> Result<std::unique_ptr<Buffer>> {
      LF_TRY(auto b, parent.rent(bytes, BufferKind::GpuDeviceLocal));  // under the child's lock
      return std::make_unique<RentedSegment>(std::move(b));
    };
    auto pool = MemoryPool::create(o);
    if (!pool) std::_Exit(2);
    PooledBuffer x;
    bool rented = false;
    std::thread([&] {
      auto b = pool->rent(4096, BufferKind::GpuDeviceLocal);
      rented = bool(b);
      if (b) x = std::move(*b);
    }).join();
    std::thread([&] { x.reset(); }).join();  // the segment, a parent's buffer, goes back under the child's lock
    const bool returned = pool->stats().all.segment.current == 0 && parent.stats().all.allocation.current == 0;
    std::_Exit(rented && returned ? 0 : 1);
  }
  int status = 0;
  if (!wait_child(child, status, std::chrono::seconds(10)))
    FAIL("the rent or the return did not end within 10 s (a thread waiting on a lock it holds)");
  REQUIRE(WIFEXITED(status));
  CHECK(WEXITSTATUS(status) == 0);
}

TEST_CASE("pool: a kind first rented after the thread's caches ended is listed in the statistics") {
  auto pool = outside_pool();
  static MemoryPool* late_pool = nullptr;
  static PooledBuffer kept;
  struct Late {
    ~Late() {
      if (auto b = late_pool->rent(4096, BufferKind::GpuDeviceLocal)) kept = std::move(*b);
    }
  };
  late_pool = &pool;
  std::thread([&] {
    static thread_local Late late;  // constructed first: destroyed after the thread's pool caches
    auto b = lftest::ok(pool.rent(4096));
  }).join();
  REQUIRE(kept);
  const auto s = pool.stats();
  const auto it = std::ranges::find_if(s.kinds, [](const auto& k) { return k.kind == BufferKind::GpuDeviceLocal; });
  REQUIRE(it != s.kinds.end());
  CHECK(it->stats.allocation.current == 1);
  CHECK(s.to_json().find("gpu-device-local") != std::string::npos);
  kept.reset();
  late_pool = nullptr;
}

TEST_CASE("pool: statistics never show a buffer rented whose block has gone back") {
  // Large returns above a zero cap drop their segment under the lock; the reader and the returning
  // thread share one CPU, so that the reader often runs between the two.
  PoolOptions o;
  o.max_cached_bytes = 0;
  auto pool = lftest::ok(MemoryPool::create(o));
  cpu_set_t one;
  CPU_ZERO(&one);
  CPU_SET(static_cast<unsigned>(std::max(0, ::sched_getcpu())), &one);
  std::atomic<bool> stop{false};
  std::thread worker([&] {
    (void)::pthread_setaffinity_np(::pthread_self(), sizeof one, &one);
    while (!stop)
      if (auto b = pool.rent(std::uint64_t{3} << 20)) b->host_ptr()[0] = std::byte{1};
  });
  cpu_set_t was;
  (void)::pthread_getaffinity_np(::pthread_self(), sizeof was, &was);
  (void)::pthread_setaffinity_np(::pthread_self(), sizeof one, &one);
  long inconsistent = 0, samples = 0;
  const auto end = std::chrono::steady_clock::now() + std::chrono::seconds(1);
  while (std::chrono::steady_clock::now() < end) {
    const auto s = pool.stats();
    ++samples;
    inconsistent += s.all.allocation.current > s.all.active.current ||
                    s.all.allocated_bytes.current > s.all.active_bytes.current || s.fragmentation_bytes() < 0;
  }
  stop = true;
  worker.join();
  (void)::pthread_setaffinity_np(::pthread_self(), sizeof was, &was);
  INFO(samples << " samples");
  CHECK(inconsistent == 0);
}

namespace {

std::set<std::string> files_in(const std::filesystem::path& dir) {
  std::set<std::string> out;
  for (const auto& e : std::filesystem::directory_iterator(dir)) out.insert(e.path().filename().string());
  return out;
}

/// A Unix socket file at `path` that nobody will ever accept on (bound and closed), or, with
/// `listening`, one whose connections are queued but never answered (its fd returned).
UniqueFd socket_file(const std::filesystem::path& path, bool listening) {
  UniqueFd fd(::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0));
  REQUIRE(fd);
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  std::strncpy(addr.sun_path, path.c_str(), sizeof addr.sun_path - 1);
  REQUIRE(::bind(fd.get(), reinterpret_cast<const sockaddr*>(&addr), sizeof addr) == 0);
  if (listening) REQUIRE(::listen(fd.get(), 4) == 0);
  if (!listening) fd.reset();
  return fd;
}

}  // namespace

TEST_CASE("pool: a pool with a stats label publishes its statistics, and its socket goes with it") {
  const auto dir = lftest::channel_dir();
  {
    auto pool = lftest::ok(MemoryPool::create({.stats_label = "unit-pool", .stats_directory = dir}));
    auto b = lftest::ok(pool.rent(1000));
    const std::string base = "pool-" + std::to_string(::getpid()) + "-unit-pool";
    CHECK(files_in(dir) == std::set<std::string>{base + ".lock", base + ".sock"});
    const auto pools = lftest::ok(read_published_pools(dir));
    REQUIRE(pools.size() == 1);
    CHECK(pools[0].pid == ::getpid());
    CHECK(pools[0].label == "unit-pool");
    INFO(pools[0].error);
    CHECK(pools[0].error.empty());
    CHECK(pools[0].report.find("\"allocation.all.current\": 1,") != std::string::npos);
    CHECK(pools[0].report == pool.stats().to_json());
    // One label per process: a second pool under it is refused, naming the label.
    auto again = MemoryPool::create({.stats_label = "unit-pool", .stats_directory = dir});
    REQUIRE(!again);
    CHECK(again.error().code() == Errc::InvalidArgument);
    CHECK(again.error().message().find("unit-pool") != std::string::npos);
  }
  CHECK(files_in(dir).empty());
  for (const char* bad : {".hidden", "a/b", "with space", "x\n",
                          "0123456789012345678901234567890123456789012345678901234567890123456789"})
    CHECK(lftest::err(MemoryPool::create({.stats_label = bad, .stats_directory = dir})).code() ==
          Errc::InvalidArgument);
  CHECK(files_in(dir).empty());
}

TEST_CASE("pool: reading published statistics removes dead processes' sockets and outlasts silent peers") {
  const auto dir = lftest::channel_dir();
  // A publication whose process is gone: its socket, and a lock file that nobody holds (or none).
  socket_file(dir / "pool-4242-left.sock", false);
  { std::ofstream(dir / "pool-4242-left.lock") << ""; }
  socket_file(dir / "pool-4243-nolock.sock", false);
  // A publication that takes connections but never answers (its lock held), and a plain file
  // with a publication's name: the first is listed with an error, the second left alone.
  const std::string mute = "pool-" + std::to_string(::getpid()) + "-mute";
  auto mute_socket = socket_file(dir / (mute + ".sock"), true);
  UniqueFd mute_lock(::open((dir / (mute + ".lock")).c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0600));
  REQUIRE(::flock(mute_lock.get(), LOCK_EX | LOCK_NB) == 0);
  { std::ofstream(dir / "pool-1-notasocket.sock") << "x"; }
  auto pool = lftest::ok(MemoryPool::create({.stats_label = "live", .stats_directory = dir}));
  CHECK(!std::filesystem::exists(dir / "pool-4242-left.sock"));  // a pool that starts clears them
  CHECK(!std::filesystem::exists(dir / "pool-4242-left.lock"));
  socket_file(dir / "pool-4242-left.sock", false);  // left again, found by the reader this time
  // A client that connects to the live pool and never reads holds nothing up.
  UniqueFd silent(::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0));
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  const auto live_path = dir / ("pool-" + std::to_string(::getpid()) + "-live.sock");
  std::strncpy(addr.sun_path, live_path.c_str(), sizeof addr.sun_path - 1);
  REQUIRE(::connect(silent.get(), reinterpret_cast<const sockaddr*>(&addr), sizeof addr) == 0);
  const auto t0 = std::chrono::steady_clock::now();
  const auto pools = lftest::ok(read_published_pools(dir, std::chrono::milliseconds(300)));
  CHECK(std::chrono::steady_clock::now() - t0 < std::chrono::seconds(3));
  REQUIRE(pools.size() == 2);  // by name: live, then mute
  CHECK(pools[0].label == "live");
  CHECK(pools[0].error.empty());
  CHECK(!pools[0].report.empty());
  CHECK(pools[1].label == "mute");
  CHECK(pools[1].report.empty());
  CHECK(pools[1].error.find("in time") != std::string::npos);
  CHECK(!std::filesystem::exists(dir / "pool-4242-left.sock"));
  CHECK(!std::filesystem::exists(dir / "pool-4243-nolock.sock"));
  CHECK(std::filesystem::exists(dir / "pool-1-notasocket.sock"));
  // A directory others can reach is refused, naming why.
  const auto open_dir = lftest::channel_dir();
  REQUIRE(::chmod(open_dir.c_str(), 0755) == 0);
  const auto refused = read_published_pools(open_dir);
  REQUIRE(!refused);
  CHECK(refused.error().code() == Errc::PermissionDenied);
  CHECK(lftest::ok(read_published_pools(dir / "missing")).empty());
}

TEST_CASE("pool: a forked child's copy of a publishing pool leaves the parent's publication alone") {
  const auto dir = lftest::channel_dir();
  const std::string base = "pool-" + std::to_string(::getpid()) + "-parent";
  std::optional<MemoryPool> pool;
  pool.emplace(lftest::ok(MemoryPool::create({.stats_label = "parent", .stats_directory = dir})));
  // The child only destroys its copy and exits. The server thread sits in poll() with nobody
  // connecting, so the child inherits no lock held; forking while a pool works is otherwise out
  // of bounds (architecture.md).
  const pid_t child = ::fork();
  REQUIRE(child >= 0);
  if (child == 0) {
    pool.reset();
    ::_exit(0);
  }
  REQUIRE(lftest::wait_exit(child) == 0);
  CHECK(files_in(dir) == std::set<std::string>{base + ".lock", base + ".sock"});
  const auto pools = lftest::ok(read_published_pools(dir));
  REQUIRE(pools.size() == 1);
  CHECK(pools[0].error.empty());
  pool.reset();
  CHECK(files_in(dir).empty());
}

namespace {

/// Takes every byte malloc can still give under the address-space limit, in a list threaded
/// through the blocks themselves (keeping them costs no further allocation); returns its head.
void* exhaust_heap() {
  void* head = nullptr;
  for (std::size_t size = std::size_t{1} << 20; size >= sizeof(void*); size /= 2)
    while (void* p = std::malloc(size)) {
      *static_cast<void**>(p) = head;
      head = p;
    }
  return head;
}

void give_heap_back(void* head) {
  while (head) {
    void* next = *static_cast<void**>(head);
    std::free(head);
    head = next;
  }
}

}  // namespace

TEST_CASE("pool: when memory runs out, returns keep their blocks carved and rents fail, losing nothing") {
#if defined(__SANITIZE_ADDRESS__)
  lftest::skip("AddressSanitizer reserves the address space that this test limits");
#endif
  // In a child process, whose address space is limited to what it has mapped: once a thread has
  // taken what its malloc arena still holds (exhaust_heap), its allocations fail, as when the
  // machine's memory runs out.
  const pid_t child = ::fork();
  REQUIRE(child >= 0);
  if (child == 0) {
    PoolOptions o;
    o.thread_cache_bytes = 0;  // every return goes to the segment's free ranges
    auto pool = MemoryPool::create(o);
    if (!pool) std::_Exit(2);
    constexpr int kBuffers = 64;
    std::vector<PooledBuffer> mine, theirs;
    mine.reserve(kBuffers);
    theirs.reserve(kBuffers);
    for (int i = 0; i < kBuffers; ++i) {
      auto b = pool->rent(4096);
      if (!b) std::_Exit(3);
      (i % 4 == 1 ? theirs : mine).push_back(std::move(*b));
    }
    // A thread with no cache of this pool yet: its returns must make one, which fails. It uses
    // another pool first and keeps it (glibc registers a thread's thread_local destructors at
    // their first use and aborts the process when it cannot; and that pool's going would free
    // memory the cache could take).
    std::atomic<int> step{0};
    std::thread other([&] {
      auto p = MemoryPool::create();
      if (!p || !p->rent(64)) std::_Exit(9);
      step.store(3);
      while (step.load() != 1) std::this_thread::yield();
      void* heap = exhaust_heap();  // this thread's arena
      theirs.clear();
      give_heap_back(heap);
      step.store(2);
    });
    while (step.load() != 3) std::this_thread::yield();
    rlimit limit{};
    std::ifstream statm("/proc/self/statm");
    std::uint64_t pages = 0;
    statm >> pages;
    limit.rlim_cur = limit.rlim_max = pages * static_cast<std::uint64_t>(::sysconf(_SC_PAGESIZE)) + (1 << 20);
    if (::setrlimit(RLIMIT_AS, &limit) != 0) std::_Exit(4);
    void* heap = exhaust_heap();
    if (std::malloc(sizeof(void*)) != nullptr) std::_Exit(5);  // the heap is not exhausted
    // Every other buffer: its neighbours are rented, so its free range needs new index entries.
    for (std::size_t i = 0; i < mine.size(); i += 2) mine[i].reset();
    // A rent that needs a new segment fails (its error's text may itself find no memory).
    bool refused = false;
    try {
      auto b = pool->rent(std::uint64_t{16} << 20);
      refused = !b && b.error().code() == Errc::OutOfMemory;
      if (!refused) std::fprintf(stderr, "rent: %s\n", b ? "ok" : b.error().message().c_str());
    } catch (const std::bad_alloc&) {
      refused = true;
    }
    if (!refused) std::_Exit(10);
    step.store(1);
    while (step.load() != 2) std::this_thread::yield();
    give_heap_back(heap);
    other.join();
    if (pool->stats().num_kept_carved == 0) std::_Exit(6);  // nothing failed: the test did not test
    // With memory back, the next returns take the kept blocks back with them.
    mine.clear();
    const auto after = pool->stats();
    if (after.all.allocation.current != 0) std::_Exit(7);  // every buffer counted as returned
    if (after.num_kept_carved != 0 || after.all.active.current != 0) std::_Exit(11);  // and its block free
    // The pool goes on working.
    for (int i = 0; i < kBuffers; ++i)
      if (auto b = pool->rent(4096); !b || b->size() != 4096) std::_Exit(8);
    std::_Exit(0);
  }
  int status = 0;
  if (!wait_child(child, status, std::chrono::seconds(30))) FAIL("the child did not end within 30 s");
  INFO("child status " << status);
  REQUIRE(WIFEXITED(status));
  CHECK(WEXITSTATUS(status) == 0);
}
