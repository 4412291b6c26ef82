// SPDX-License-Identifier: MIT
// lavaflow-bench interop (GPU machine): in one run
//  1. a CUDA copy kernel over Vulkan-imported memory vs over cudaMalloc memory, same size;
//  2. the cost of importing one Vulkan buffer into CUDA;
//  3. GPU-resident hand-off between two processes (gpu_handoff.cpp): gpu-pingpong and gpu-stream,
//     each next to its baselines.
#include "interop.hpp"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "cuda_kernels.hpp"
#include "gpu_handoff.hpp"
#include "lavaflow/core/detail/format.hpp"
#include "lavaflow/cuda/cuda.hpp"
#include "lavaflow/lavaflow.hpp"
#include "lavaflow/transports/local.hpp"

namespace lfbench {

using namespace lavaflow;

namespace {

#define BENCH_CUDA(expr)                                                                               \
  do {                                                                                                 \
    if (cudaError_t e_ = (expr); e_ != cudaSuccess) return std::unexpected(cuda::to_error(e_, #expr)); \
  } while (0)

double percentile(std::vector<double> v, double q) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  return v[static_cast<std::size_t>(q * double(v.size() - 1))];
}

// ----- 1. copy kernel bandwidth

struct CopyResult {
  double imported_gbs = 0, malloc_gbs = 0;
};

Result<CopyResult> copy_bandwidth(const VulkanContext& vk, const cuda::Interop& cu, std::uint64_t size, int reps) {
  LF_TRY(auto a, GpuBuffer::allocate(vk, {.size = size}));
  LF_TRY(auto b, GpuBuffer::allocate(vk, {.size = size}));
  LF_TRY(auto ia, cu.import_buffer(a));
  LF_TRY(auto ib, cu.import_buffer(b));
  void *ma = nullptr, *mb = nullptr;
  BENCH_CUDA(cudaMalloc(&ma, size));
  BENCH_CUDA(cudaMalloc(&mb, size));
  cudaEvent_t e0, e1;
  BENCH_CUDA(cudaEventCreate(&e0));
  BENCH_CUDA(cudaEventCreate(&e1));
  auto time_ms = [&](void* dst, const void* src) -> Result<float> {
    BENCH_CUDA(cudaEventRecord(e0));
    BENCH_CUDA(lf_kernel_copy16(dst, src, size, nullptr));
    BENCH_CUDA(cudaEventRecord(e1));
    BENCH_CUDA(cudaEventSynchronize(e1));
    float ms = 0;
    BENCH_CUDA(cudaEventElapsedTime(&ms, e0, e1));
    return ms;
  };
  std::vector<double> imp, mal;
  for (int i = 0; i < reps + 2; ++i) {  // interleaved, first two are warm-up
    LF_TRY(float t1, time_ms(ib.data(), ia.data()));
    LF_TRY(float t2, time_ms(mb, ma));
    if (i >= 2) {
      imp.push_back(t1);
      mal.push_back(t2);
    }
  }
  cudaFree(ma);
  cudaFree(mb);
  cudaEventDestroy(e0);
  cudaEventDestroy(e1);
  const double bytes = 2.0 * double(size);
  return CopyResult{bytes / (percentile(imp, 0.5) * 1e6), bytes / (percentile(mal, 0.5) * 1e6)};
}

// ----- 2. import cost

Result<double> import_cost_us(const VulkanContext& vk, const cuda::Interop& cu, std::uint64_t size, int reps) {
  LF_TRY(auto buf, GpuBuffer::allocate(vk, {.size = size}));
  std::vector<double> t;
  for (int i = 0; i < reps; ++i) {
    LF_TRY(auto ex, buf.export_handle());
    const auto t0 = Clock::now();
    LF_TRY(auto m, cu.import_buffer(ex.descriptor, std::move(ex.fd)));
    t.push_back(std::chrono::duration<double, std::micro>(Clock::now() - t0).count());
  }
  return percentile(t, 0.5);
}

}  // namespace

int bench_interop(const InteropOptions& o) {
  auto devs = cuda::devices();
  if (!devs || devs->empty()) {
    std::printf("lavaflow-bench interop: skipped, no CUDA device (%s)\n",
                devs ? "none found" : devs.error().message().c_str());
    return 77;
  }
  const auto& dev = devs->front();
  auto vk = VulkanContext::create({.device = dev.uuid});
  if (!vk) return std::fprintf(stderr, "interop: %s\n", vk.error().message().c_str()), 1;
  auto cu = cuda::Interop::create(*vk);
  if (!cu) return std::fprintf(stderr, "interop: %s\n", cu.error().message().c_str()), 1;
  auto progress = [&](const char* what) {
    if (!o.json) std::fprintf(stderr, "interop: %s...\n", what);
  };
  auto wanted = [&](const char* part) { return o.parts.empty() || o.parts.contains(part); };
  std::vector<GpuRow> rows;
  std::vector<std::string> errors;
  std::optional<CopyResult> copy;
  if (wanted("copy")) {
    progress("copy kernel");
    if (auto c = copy_bandwidth(*vk, *cu, o.size, 20))
      copy = *c;
    else
      errors.push_back(c.error().message());
  }
  std::optional<double> imp;
  if (wanted("import")) {
    progress("import cost");
    if (auto i = import_cost_us(*vk, *cu, 64 << 20, 200))
      imp = *i;
    else
      errors.push_back(i.error().message());
  }
  for (std::uint64_t size : {std::uint64_t{64}, std::uint64_t{1} << 20, std::uint64_t{16} << 20}) {
    if (!wanted("pingpong")) continue;
    progress(str_format("gpu-pingpong {} B", size).c_str());
    auto r = gpu_pingpong(*vk, *cu, size, o.rounds, dev.mps);
    if (!r)
      errors.push_back(r.error().message());
    else
      rows.insert(rows.end(), r->begin(), r->end());
  }
  // Both stream rows use the ring a GPU channel gets by default, unless told otherwise.
  const std::uint32_t slots = o.slots != 0 ? o.slots : ProducerOptions::kGpuSlots;
  for (std::uint64_t size : {std::uint64_t{1} << 20, std::uint64_t{16} << 20}) {
    if (!wanted("stream")) break;
    progress(str_format("gpu-stream {} B, {} slots, batches of {}", size, slots, o.batch).c_str());
    const int frames = size > (1u << 20) ? std::max(o.frames / 4, 16) : o.frames;
    auto r = gpu_stream(*vk, *cu, size, frames, slots, o.batch, dev.mps);
    if (!r)
      errors.push_back(r.error().message());
    else
      rows.insert(rows.end(), r->begin(), r->end());
  }
  for (const auto& e : errors) std::fprintf(stderr, "interop: %s\n", e.c_str());

  auto find = [&](std::string_view name, std::uint64_t size, std::string_view variant = {}) -> const GpuRow* {
    for (const auto& r : rows)
      if (r.name == name && r.size == size && (variant.empty() || r.variant == variant)) return &r;
    return nullptr;
  };
  struct Target {
    std::string what;
    double ratio = 0, limit = 0;
    bool at_most = true;
  };
  std::vector<Target> targets;
  if (copy)
    targets.push_back({"copy kernel: imported / cudaMalloc", copy->imported_gbs / copy->malloc_gbs, 0.97, false});
  // Each way of ordering the hand-off (timeline semaphores, GPU flags) against the same baselines.
  for (std::string_view variant : {"timeline", "flag"}) {
    if (auto* lf = find("gpu-pingpong-lavaflow", 64, variant), *same = find("gpu-pingpong-same-process", 64),
        *ipc = find("gpu-pingpong-cuda-ipc", 64);
        lf && same && ipc) {
      if (dev.mps) {
        targets.push_back({str_format("gpu-pingpong 64 B p50: lavaflow {} / same-process", variant),
                           lf->p50_ns / same->p50_ns, 1.2, true});
        targets.push_back({str_format("gpu-pingpong 64 B p50: lavaflow {} / cuda-ipc", variant),
                           lf->p50_ns / ipc->p50_ns, 0.8, true});
      } else {
        targets.push_back({str_format("gpu-pingpong 64 B p50: lavaflow {} / cuda-ipc", variant),
                           lf->p50_ns / ipc->p50_ns, 1.0, true});
      }
    }
    for (std::uint64_t size : {std::uint64_t{1} << 20, std::uint64_t{16} << 20}) {
      // Frames ordered in batches (the --batch rows) unless the run ordered them one by one only.
      const auto* lf = find("gpu-stream-lavaflow", size, variant);
      if (!lf) lf = find("gpu-stream-lavaflow", size, std::string(variant) + "-per-message");
      const auto* same = find("gpu-stream-same-process", size);
      if (!lf || !same) continue;
      const double limit = dev.mps ? (size > (1u << 20) ? 0.9 : 0.8) : 0.5;
      if (!dev.mps && size == (1u << 20)) continue;  // no target without MPS at 1 MiB
      targets.push_back({str_format("gpu-stream {} MiB GB/s: lavaflow {} / same-process", size >> 20, variant),
                         lf->gbps / same->gbps, limit, false});
    }
  }

  if (o.json) {
    nlohmann::ordered_json j{{"device", dev.name},
                             {"mps", dev.mps},
                             {"results", nlohmann::ordered_json::array()},
                             {"targets", nlohmann::ordered_json::array()}};
    if (copy)
      j["results"].push_back({{"name", "copy-kernel"},
                              {"size", o.size},
                              {"imported_gbps", copy->imported_gbs},
                              {"cudamalloc_gbps", copy->malloc_gbs},
                              {"mps", dev.mps}});
    if (imp)
      j["results"].push_back({{"name", "import-cuda"}, {"size", 64 << 20}, {"p50_ns", *imp * 1e3}, {"mps", dev.mps}});
    for (const auto& r : rows) {
      nlohmann::ordered_json row{{"name", r.name},       {"variant", r.variant}, {"size", r.size},
                                 {"samples", r.samples}, {"p50_ns", r.p50_ns},   {"p99_ns", r.p99_ns}};
      if (r.name.starts_with("gpu-stream")) {
        row["gbps"] = r.gbps;
        row["frames_per_s"] = r.frames_per_s;
        row["errors"] = r.errors;
      }
      row["mps"] = r.mps;
      j["results"].push_back(row);
    }
    for (const auto& t : targets)
      j["targets"].push_back({{"what", t.what},
                              {"ratio", t.ratio},
                              {"limit", t.limit},
                              {"at_most", t.at_most},
                              {"met", t.at_most ? t.ratio <= t.limit : t.ratio >= t.limit}});
    std::puts(j.dump().c_str());
  } else {
    std::printf("lavaflow-bench interop on %s (%s)\n", dev.name.c_str(),
                dev.mps ? "MPS active" : "no MPS: processes' GPU work is time-sliced");
    if (copy)
      std::printf("copy kernel, %s each way: Vulkan-imported %.1f GB/s, cudaMalloc %.1f GB/s\n",
                  str_format("{} MiB", o.size >> 20).c_str(), copy->imported_gbs, copy->malloc_gbs);
    if (imp) std::printf("import of one 64 MiB Vulkan buffer into CUDA: %.1f us (median of 200)\n", *imp);
    std::printf("%-26s %-10s %10s %12s %12s %10s %12s\n", "row", "variant", "size", "p50 ns", "p99 ns", "GB/s",
                "frames/s");
    for (const auto& r : rows)
      std::printf("%-26s %-10s %10llu %12.0f %12.0f %10.2f %12.0f%s\n", r.name.c_str(), r.variant.c_str(),
                  static_cast<unsigned long long>(r.size), r.p50_ns, r.p99_ns, r.gbps, r.frames_per_s,
                  r.errors ? str_format("  {} WRONG WORDS", r.errors).c_str() : "");
    for (const auto& t : targets)
      std::printf("target %-52s %.3f %s %.2f  %s\n", t.what.c_str(), t.ratio, t.at_most ? "<=" : ">=", t.limit,
                  (t.at_most ? t.ratio <= t.limit : t.ratio >= t.limit) ? "met" : "NOT MET");
  }
  bool wrong = false;
  for (const auto& r : rows) wrong |= r.errors != 0;
  return errors.empty() && !wrong ? 0 : 1;
}

}  // namespace lfbench
