// SPDX-License-Identifier: MIT
// lavaflow-bench: benchmarks measured against a baseline in the same run.
//   alloc : allocate + export of exportable Vulkan buffers vs a plain vkAllocateMemory of the
//           same size and memory type, and each CPU strategy vs plain shared memory (median).
#include <sys/mman.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <functional>
#include <string>
#include <vector>

#include "../common/json.hpp"
#include "lavaflow/core/format.hpp"
#include "lavaflow/lavaflow.hpp"

using namespace lavaflow;
using Clock = std::chrono::steady_clock;

namespace {

struct Row {
  std::string name;
  std::string baseline;
  std::uint64_t size;
  double median_us;
  double baseline_us;
  std::string note;
};

double median_us(int reps, const std::function<bool()>& once) {
  std::vector<double> t;
  t.reserve(static_cast<std::size_t>(reps));
  for (int i = 0; i < reps; ++i) {
    const auto t0 = Clock::now();
    if (!once()) return -1;
    t.push_back(std::chrono::duration<double, std::micro>(Clock::now() - t0).count());
  }
  std::nth_element(t.begin(), t.begin() + static_cast<long>(t.size() / 2), t.end());
  return t[t.size() / 2];
}

std::string human(std::uint64_t n) {
  if (n >= (1u << 20)) return format("{} MiB", n >> 20);
  if (n >= 1024) return format("{} KiB", n >> 10);
  return format("{} B", n);
}

int bench_alloc(int reps, bool json) {
  std::vector<Row> rows;
  auto ctx = VulkanContext::create();
  if (!ctx) std::fprintf(stderr, "no Vulkan device (%s): GPU rows skipped\n", ctx.error().message().c_str());
  const std::uint64_t sizes[] = {4096, 1 << 20, 64 << 20};
  for (auto size : sizes) {
    if (ctx) {
      std::string err;
      // Baseline: plain vkAllocateMemory + free of the same size and memory type as lava-flow uses.
      auto probe = GpuBuffer::allocate(*ctx, {.size = size});
      if (!probe) {
        std::fprintf(stderr, "%s\n", probe.error().message().c_str());
        return 1;
      }
      const auto type = probe->descriptor().memory_type_index;
      const auto alloc_size = probe->descriptor().allocation_size;
      const double plain = median_us(reps, [&] {
        vk::raii::DeviceMemory m(ctx->device(), vk::MemoryAllocateInfo(alloc_size, type));
        return true;
      });
      const double lf = median_us(reps, [&] {
        auto b = GpuBuffer::allocate(*ctx, {.size = size});
        if (!b) { err = b.error().message(); return false; }
        auto e = b->export_handle();
        if (!e) { err = e.error().message(); return false; }
        return true;
      });
      if (lf < 0) {
        std::fprintf(stderr, "%s\n", err.c_str());
        return 1;
      }
      rows.push_back({"gpu-exportable", "vkAllocateMemory", size, lf, plain,
                      "buffer + dedicated export allocation + bind + map + vkGetMemoryFdKHR"});
    }
    const auto topo = CpuTopology::detect();
    const double shm = median_us(reps, [&] { return bool(CpuBuffer::allocate({.size = size, .strategy = CpuStrategy::SharedMemory}, topo)); });
    const double anon = median_us(reps, [&] {
      void* p = ::mmap(nullptr, size, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
      if (p == MAP_FAILED) return false;
      return ::munmap(p, size) == 0;
    });
    for (auto s : {CpuStrategy::SharedMemory, CpuStrategy::NumaBound, CpuStrategy::HugePages, CpuStrategy::GpuPinned}) {
      CpuBufferOptions o{.size = size, .strategy = s, .gpu = ctx ? &*ctx : nullptr};
      const auto choice = choose_cpu_strategy(topo, o);
      const double t = s == CpuStrategy::SharedMemory ? shm : median_us(reps, [&] {
        auto b = CpuBuffer::allocate(o, topo);
        return b && b->export_handle().has_value();
      });
      rows.push_back({format("cpu-{}", to_string(s)), "mmap(anonymous)", size, t, anon,
                      choice.strategy == s ? "" : "fell back: " + choice.reason});
    }
  }
  if (json) {
    lfapp::Json j;
    j.begin_object().begin_array("results");
    for (const auto& r : rows)
      j.begin_object()
          .field("name", r.name)
          .field("size", r.size)
          .field("median_us", r.median_us)
          .field("baseline", r.baseline)
          .field("baseline_median_us", r.baseline_us)
          .field("ratio", r.median_us / r.baseline_us)
          .field("note", r.note)
          .end_object();
    j.end_array().field("repetitions", reps).end_object();
    std::puts(j.str().c_str());
    return 0;
  }
  std::printf("lavaflow-bench alloc: median of %d, allocate + export (+ free), against a baseline of the same size\n", reps);
  if (ctx) std::printf("device: %s (%s)\n", ctx->capabilities().identity.name.c_str(), ctx->capabilities().driver_name.c_str());
  std::printf("%-22s %8s %12s %18s %12s %8s  %s\n", "what", "size", "median us", "baseline", "base us", "ratio", "note");
  for (const auto& r : rows)
    std::printf("%-22s %8s %12.1f %18s %12.1f %8.2f  %s\n", r.name.c_str(), human(r.size).c_str(), r.median_us,
                r.baseline.c_str(), r.baseline_us, r.median_us / r.baseline_us, r.note.c_str());
  return 0;
}

void usage() {
  std::puts(
      "usage: lavaflow-bench alloc [--reps N] [--json]\n"
      "  alloc   allocation + export time of exportable Vulkan buffers (4 KiB, 1 MiB, 64 MiB) next to a\n"
      "          plain vkAllocateMemory of the same size and memory type, and of each CPU strategy next\n"
      "          to an anonymous mmap; median of N (default 101) runs each.");
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 2 || !std::strcmp(argv[1], "--help") || !std::strcmp(argv[1], "-h")) {
    usage();
    return argc < 2 ? 2 : 0;
  }
  const std::string what = argv[1];
  int reps = 101;
  bool json = false;
  for (int i = 2; i < argc; ++i) {
    if (!std::strcmp(argv[i], "--json")) json = true;
    else if (!std::strcmp(argv[i], "--reps") && i + 1 < argc) reps = std::max(1, std::atoi(argv[++i]));
    else {
      std::fprintf(stderr, "lavaflow-bench: unknown argument %s\n", argv[i]);
      return 2;
    }
  }
  if (what == "alloc") return bench_alloc(reps, json);
  std::fprintf(stderr, "lavaflow-bench: unknown benchmark %s\n", what.c_str());
  usage();
  return 2;
}
