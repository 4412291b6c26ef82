// SPDX-License-Identifier: MIT
// lavaflow-bench pool: the memory pool against what it replaces, in the same run.
//   pool-host / malloc          rent+return pair of host shared memory vs glibc malloc+free
//   pool-vulkan / vulkan-alloc-export   warm rent+return of exportable Vulkan memory vs a fresh
//                               allocation and export of the same size
//   pool-cuda / cuda-alloc-export       the same for the CUDA adapter's pool (cuMemCreate segments)
//                               against cuMemCreate and an fd export (builds with CUDA, a GPU)
//   pool-churn                  10^5 operations, sizes log-uniform 4 KiB..64 MiB, bounded live set:
//                               reuse, fragmentation at the peak, fds; on a pool as created and
//                               (variants "max_cached_bytes 32 MiB", "max_cached_share 0.05") on
//                               pools with a fixed cap and with a cap that follows the load
#include "pool.hpp"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <nlohmann/json.hpp>
#include <optional>
#include <random>
#include <string>
#include <tuple>
#include <vector>

#include "lavaflow/core/detail/format.hpp"
#include "lavaflow/lavaflow.hpp"
#if LAVAFLOW_BENCH_INTEROP
#include "lavaflow/cuda/cuda.hpp"
#endif

namespace lfbench {
namespace {

using namespace lavaflow;
using Clock = std::chrono::steady_clock;

/// Keeps the compiler from eliding an allocation whose pointer is otherwise unused.
inline void escape(void* p) { asm volatile("" : : "g"(p) : "memory"); }

struct Spread {
  double p25 = 0, p50 = 0, p75 = 0;
};

/// Quartiles of per-call times.
Spread quartiles(std::vector<double>& ns) {
  std::sort(ns.begin(), ns.end());
  auto at = [&](double q) { return ns[static_cast<std::size_t>(q * static_cast<double>(ns.size() - 1))]; };
  return {at(0.25), at(0.5), at(0.75)};
}

/// One batch of `per_batch` calls, appended to `ns` as per-call nanoseconds; false when a call failed.
bool time_batch(int per_batch, const std::function<bool()>& once, std::vector<double>& ns) {
  const auto t0 = Clock::now();
  for (int i = 0; i < per_batch; ++i)
    if (!once()) return false;
  ns.push_back(std::chrono::duration<double, std::nano>(Clock::now() - t0).count() / per_batch);
  return true;
}

/// Times `batches` batches of `per_batch` calls; per-call nanoseconds, quartiles over the batches.
Spread time_per_call(int batches, int per_batch, const std::function<bool()>& once) {
  std::vector<double> ns;
  for (int b = 0; b < batches; ++b)
    if (!time_batch(per_batch, once, ns)) return {-1, -1, -1};
  return quartiles(ns);
}

/// Times `a` and `b` as time_per_call does, a batch of each in turn (which goes first alternates),
/// so that both see the same moments of the machine: a core still raising its clock, or a
/// neighbour's burst, would otherwise fall on whichever ran first.
std::pair<Spread, Spread> time_alternating(int batches, int per_batch, const std::function<bool()>& a,
                                           const std::function<bool()>& b) {
  std::vector<double> ns[2];
  for (int r = 0; r < batches; ++r)
    for (int k = 0; k < 2; ++k) {
      const int which = (r + k) % 2;
      if (!time_batch(per_batch, which == 0 ? a : b, ns[which])) return {{-1, -1, -1}, {-1, -1, -1}};
    }
  return {quartiles(ns[0]), quartiles(ns[1])};
}

/// Open fds of this process (0 when /proc cannot say).
std::uint64_t process_fds() { return static_cast<std::uint64_t>(count_open_fds().value_or(0)); }

struct Row {
  std::string name;
  std::uint64_t size = 0;
  Spread ns;
};

struct Churn {
  std::uint64_t ops = 0;
  double reuse = 0, fragmentation = 0, waste = 0, seconds = 0;
  std::uint64_t max_fds = 0, segments = 0, peak_reserved = 0, peak_allocated = 0;
};

Churn churn(MemoryPool& pool, std::uint64_t ops, std::size_t live_max) {
  std::mt19937_64 rng(12345);
  const double lo = std::log(4096.0), hi = std::log(64.0 * 1024 * 1024);
  std::uniform_real_distribution<double> logsize(lo, hi);
  std::vector<PooledBuffer> live;
  Churn c;
  const std::uint64_t fds0 = process_fds();
  const auto before = pool.stats();
  std::int64_t allocated = 0, requested = 0, peak_requested = 0;
  std::int64_t peak_allocated = 0;
  const auto t0 = Clock::now();
  for (std::uint64_t i = 0; i < ops; ++i) {
    const bool rent = live.empty() || (live.size() < live_max && rng() % 2 == 0);
    if (rent) {
      const auto size = static_cast<std::uint64_t>(std::exp(logsize(rng)));
      auto b = pool.rent(size);
      if (!b) {
        std::fprintf(stderr, "pool-churn: %s\n", b.error().message().c_str());
        std::exit(1);
      }
      allocated += static_cast<std::int64_t>(b->capacity());
      requested += static_cast<std::int64_t>(b->size());
      live.push_back(std::move(*b));
    } else {
      const auto k = rng() % live.size();
      allocated -= static_cast<std::int64_t>(live[k].capacity());
      requested -= static_cast<std::int64_t>(live[k].size());
      std::swap(live[k], live.back());
      live.pop_back();
    }
    peak_requested = std::max(peak_requested, requested);
    peak_allocated = std::max(peak_allocated, allocated);
    if (i % 256 == 0 || i + 1 == ops) {
      const auto fds = process_fds();
      if (fds > fds0) c.max_fds = std::max(c.max_fds, fds - fds0);
    }
  }
  c.seconds = std::chrono::duration<double>(Clock::now() - t0).count();
  live.clear();
  const auto after = pool.stats();
  const auto hits = after.num_hits - before.num_hits, misses = after.num_misses - before.num_misses;
  c.ops = ops;
  c.reuse = static_cast<double>(hits) / static_cast<double>(std::max<std::uint64_t>(1, hits + misses));
  // The pool's reserved peak is exact (segments change under its lock); the pool is the trace's own.
  const std::int64_t peak_reserved = after.all.reserved_bytes.peak;
  // What the pool held at its largest beyond what the trace ever had rented at once.
  c.fragmentation =
      1.0 - static_cast<double>(peak_allocated) / static_cast<double>(std::max<std::int64_t>(1, peak_reserved));
  c.waste = 1.0 - static_cast<double>(peak_requested) / static_cast<double>(std::max<std::int64_t>(1, peak_allocated));
  c.segments = after.all.segment.peak;
  c.peak_reserved = static_cast<std::uint64_t>(peak_reserved);
  c.peak_allocated = static_cast<std::uint64_t>(peak_allocated);
  return c;
}

/// Rows `pooled` (a warm rent and return of GpuDeviceLocal from `pool`) and `fresh` (`allocate`: a
/// new exportable allocation and its export) for a few sizes; false, having said why, on a failure.
bool device_rows(std::vector<Row>& rows, const char* pooled, const char* fresh, MemoryPool& pool,
                 const std::function<Status(std::uint64_t)>& allocate, bool quick) {
  const int batches = quick ? 31 : 101, per_batch = quick ? 200 : 1000;
  for (std::uint64_t size : {std::uint64_t{4096}, std::uint64_t{1} << 20, std::uint64_t{64} << 20}) {
    std::string err;
    const auto warm = time_per_call(batches, per_batch, [&] {
      auto b = pool.rent(size, BufferKind::GpuDeviceLocal);
      if (!b) err = b.error().message();
      return bool(b);
    });
    const auto once = time_per_call(quick ? 5 : 21, 1, [&] {
      const Status s = allocate(size);
      if (!s) err = s.error().message();
      return bool(s);
    });
    if (warm.p50 < 0 || once.p50 < 0) {
      std::fprintf(stderr, "%s: %s\n", pooled, err.c_str());
      return false;
    }
    rows.push_back({pooled, size, warm});
    rows.push_back({fresh, size, once});
  }
  return true;
}

}  // namespace

int bench_pool(const PoolBenchOptions& o) {
  const int batches = o.quick ? 31 : 101;
  const int per_batch = o.quick ? 2000 : 10000;
  std::vector<Row> rows;
  auto pool = MemoryPool::create();
  if (!pool) {
    std::fprintf(stderr, "%s\n", pool.error().message().c_str());
    return 1;
  }
  const std::uint64_t host_sizes[] = {64, 4096, 65536, 1 << 20, 16 << 20};
  for (auto size : host_sizes) {
    std::string err;
    const auto [lf, base] = time_alternating(
        batches, per_batch,
        [&] {
          auto b = pool->rent(size);
          if (!b) {
            err = b.error().message();
            return false;
          }
          escape(b->host_ptr());
          return true;
        },
        [&] {
          void* p = std::malloc(size);
          escape(p);
          std::free(p);
          if (p == nullptr) err = str_format("malloc of {} bytes failed", size);
          return p != nullptr;
        });
    if (lf.p50 < 0) {
      std::fprintf(stderr, "pool-host / malloc: %s\n", err.c_str());
      return 1;
    }
    rows.push_back({"pool-host", size, lf});
    rows.push_back({"malloc", size, base});
  }

  auto ctx = VulkanContext::create();
  if (!ctx) {
    std::fprintf(stderr, "no Vulkan device (%s): Vulkan rows skipped\n", ctx.error().message().c_str());
  } else if (!ctx->capabilities().memory_fd_export) {
    std::fprintf(stderr, "the Vulkan device cannot export memory: Vulkan rows skipped\n");
  } else {
    auto p = MemoryPool::create({.vulkan = *ctx});
    if (!p) {
      std::fprintf(stderr, "%s\n", p.error().message().c_str());
      return 1;
    }
    const bool timed = device_rows(
        rows, "pool-vulkan", "vulkan-alloc-export", *p,
        [&](std::uint64_t size) -> Status {
          LF_TRY(auto b, GpuBuffer::allocate(*ctx, {.size = size}));
          LF_TRY(auto e, b.export_handle());
          return {};
        },
        o.quick);
    if (!timed) return 1;
  }
#if LAVAFLOW_BENCH_INTEROP
  // The CUDA adapter's pool (cuMemCreate segments) against a fresh exportable allocation and its fd.
  auto cuda_devices = cuda::devices();
  if (!cuda_devices || cuda_devices->empty()) {
    std::fprintf(stderr, "no CUDA device: CUDA rows skipped\n");
  } else if (auto cu = cuda::Interop::create(cuda_devices->front().uuid); !cu) {
    std::fprintf(stderr, "%s: CUDA rows skipped\n", cu.error().message().c_str());
  } else {
    auto p = cuda::make_pool(*cu);
    if (!p) {
      std::fprintf(stderr, "%s\n", p.error().message().c_str());
      return 1;
    }
    const bool timed = device_rows(
        rows, "pool-cuda", "cuda-alloc-export", *p,
        [&](std::uint64_t size) -> Status {
          LF_TRY(auto a, cu->allocate_exportable(size));
          LF_TRY(auto fd, a.export_fd());
          return {};
        },
        o.quick);
    if (!timed) return 1;
  }
#endif

  // The trace on a pool as created, and on pools with a cap on cached bytes (a fixed one; one that
  // follows the load), above which host memory gives the pages of free ranges back to the system.
  constexpr std::uint64_t kChurnCap = std::uint64_t{32} << 20;
  constexpr double kChurnShare = 0.05;
  struct Variant {
    std::string name;  // empty: the pool as created
    PoolOptions options;
    Churn result;
  };
  std::vector<Variant> churns;
  churns.push_back({"", {}, {}});
  churns.push_back({str_format("max_cached_bytes {} MiB", kChurnCap >> 20), {.max_cached_bytes = kChurnCap}, {}});
  churns.push_back({str_format("max_cached_share {}", kChurnShare), {.max_cached_share = kChurnShare}, {}});
  const std::uint64_t churn_ops = o.quick ? 20'000 : 100'000;
  std::optional<PoolStats> churn_stats;
  for (auto& v : churns) {
    auto churn_pool = MemoryPool::create(std::move(v.options));
    if (!churn_pool) {
      std::fprintf(stderr, "%s\n", churn_pool.error().message().c_str());
      return 1;
    }
    v.result = churn(*churn_pool, churn_ops, 64);
    if (!churn_stats) churn_stats = churn_pool->stats();
  }
  const Churn& ch = churns.front().result;

  auto find = [&](const std::string& name, std::uint64_t size) -> const Row* {
    for (const auto& r : rows)
      if (r.name == name && r.size == size) return &r;
    return nullptr;
  };
  nlohmann::json targets = nlohmann::json::array();
  for (auto size : host_sizes) {
    const auto* p = find("pool-host", size);
    const auto* m = find("malloc", size);
    targets.push_back({{"name", str_format("host rent+return at {} B vs malloc+free", size)},
                       {"ratio", p->ns.p50 / m->ns.p50},
                       {"value_ns", p->ns.p50},
                       {"target", "<= 1.0 and <= 50 ns"},
                       {"met", p->ns.p50 <= m->ns.p50 && p->ns.p50 <= 50}});
  }
  for (const auto& r : rows)
    for (const auto& [pooled, fresh, what] : {std::tuple{"pool-vulkan", "vulkan-alloc-export", "Vulkan"},
                                              std::tuple{"pool-cuda", "cuda-alloc-export", "CUDA"}})
      if (r.name == pooled)
        if (const auto* f = find(fresh, r.size))
          targets.push_back({{"name", str_format("{} warm rent at {} B vs fresh allocate+export", what, r.size)},
                             {"ratio", f->ns.p50 / r.ns.p50},
                             {"value_ns", r.ns.p50},
                             {"target", ">= 100x faster and <= 1 us"},
                             {"met", f->ns.p50 >= 100 * r.ns.p50 && r.ns.p50 <= 1000}});
  for (const auto& v : churns) {
    const std::string pool_name = v.name.empty() ? "a pool as created" : "a pool with " + v.name;
    const Churn& c = v.result;
    targets.push_back(
        {{"name", "churn reuse, " + pool_name}, {"ratio", c.reuse}, {"target", ">= 0.95"}, {"met", c.reuse >= 0.95}});
    targets.push_back({{"name", "churn fragmentation (1 - peak allocated / peak reserved), " + pool_name},
                       {"ratio", c.fragmentation},
                       {"target", "< 0.10"},
                       {"met", c.fragmentation < 0.10}});
  }
  targets.push_back(
      {{"name", "churn fds (max open during the trace vs segments)"},
       {"ratio", static_cast<double>(ch.max_fds) / static_cast<double>(std::max<std::uint64_t>(1, ch.segments))},
       {"target", "<= 1 (one fd per segment at most)"},
       {"met", ch.max_fds <= ch.segments}});

  if (o.json) {
    nlohmann::json out = {{"results", nlohmann::json::array()}, {"targets", targets}};
    for (const auto& r : rows)
      out["results"].push_back({{"suite", "pool"},
                                {"name", r.name},
                                {"size", r.size},
                                {"p50_ns", r.ns.p50},
                                {"p25_ns", r.ns.p25},
                                {"p75_ns", r.ns.p75}});
    for (const auto& v : churns) {
      const Churn& c = v.result;
      nlohmann::json row = {{"suite", "pool"},
                            {"name", "pool-churn"},
                            {"ops", c.ops},
                            {"reuse", c.reuse},
                            {"fragmentation", c.fragmentation},
                            {"size_class_waste", c.waste},
                            {"max_fds", c.max_fds},
                            {"segments", c.segments},
                            {"peak_reserved_bytes", c.peak_reserved},
                            {"peak_allocated_bytes", c.peak_allocated},
                            {"seconds", c.seconds}};
      if (!v.name.empty()) row["variant"] = v.name;
      out["results"].push_back(row);
    }
    out["pool_stats"] = nlohmann::json::parse(churn_stats->to_json());
    std::puts(out.dump().c_str());
    return 0;
  }
  std::printf("lavaflow-bench pool: per-call time, p50 [p25..p75] over %d batches\n", batches);
  std::printf("%-20s %10s %12s %24s\n", "name", "size", "p50 ns", "p25..p75 ns");
  for (const auto& r : rows)
    std::printf("%-20s %10llu %12.1f %11.1f..%-11.1f\n", r.name.c_str(), static_cast<unsigned long long>(r.size),
                r.ns.p50, r.ns.p25, r.ns.p75);
  for (const auto& v : churns) {
    const Churn& c = v.result;
    std::printf(
        "pool-churn%s: %llu ops in %.2f s, reuse %.4f, fragmentation %.4f (peak reserved %llu MiB, peak allocated "
        "%llu MiB), size-class waste %.4f, max fds %llu, segments %llu\n",
        v.name.empty() ? "" : (" (" + v.name + ")").c_str(), static_cast<unsigned long long>(c.ops), c.seconds, c.reuse,
        c.fragmentation, static_cast<unsigned long long>(c.peak_reserved >> 20),
        static_cast<unsigned long long>(c.peak_allocated >> 20), c.waste, static_cast<unsigned long long>(c.max_fds),
        static_cast<unsigned long long>(c.segments));
  }
  for (const auto& t : targets)
    std::printf("target %s: %.3f (%s) %s\n", t["name"].get<std::string>().c_str(), t["ratio"].get<double>(),
                t["target"].get<std::string>().c_str(), t["met"].get<bool>() ? "MET" : "NOT MET");
  return 0;
}

}  // namespace lfbench
