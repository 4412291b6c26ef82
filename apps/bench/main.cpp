// SPDX-License-Identifier: MIT
// lavaflow-bench: benchmarks measured against a baseline in the same run.
//   alloc : allocate + export of exportable Vulkan buffers vs a plain vkAllocateMemory of the
//           same size and memory type, and each CPU strategy vs plain shared memory (median).
#include <sys/mman.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <cerrno>
#include <cstdlib>
#include <unistd.h>
#include <functional>
#include <string>
#include <vector>

#include "../common/json.hpp"
#include "../common/plot.hpp"
#include "interop.hpp"
#include "local.hpp"
#include "lavaflow/core/detail/format.hpp"
#include "lavaflow/lavaflow.hpp"

using namespace lavaflow;

namespace {

/// A program installed beside this one (the build tree keeps them together too): no build-tree
/// path is compiled into the binary.
[[maybe_unused]] std::string sibling(const char* name) {
  char self[4096] = {};
  const ssize_t n = ::readlink("/proc/self/exe", self, sizeof self - 1);
  if (n <= 0) return name;
  std::string path(self, static_cast<std::size_t>(n));
  return path.substr(0, path.rfind('/') + 1) + name;
}

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
  if (n >= (1u << 20)) return str_format("{} MiB", n >> 20);
  if (n >= 1024) return str_format("{} KiB", n >> 10);
  return str_format("{} B", n);
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
      rows.push_back({str_format("cpu-{}", to_string(s)), "mmap(anonymous)", size, t, anon,
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

// ---------------------------------------------------------------------------------------------
// local

/// Runs the raw MPI ping-pong under the installed mpiexec; empty when MPI is not built.
std::vector<lfbench::Row> mpi_rows(int iterations, std::string& note) {
  std::vector<lfbench::Row> rows;
#if LAVAFLOW_BENCH_MPI
  const std::string cmd =
      str_format("{} -n 2 -bind-to core {} {} 64 2>&1", LAVAFLOW_MPIEXEC, sibling("lavaflow-bench-mpi"), iterations);
  FILE* f = ::popen(cmd.c_str(), "r");
  if (!f) {
    note = "could not start mpiexec";
    return rows;
  }
  char line[512];
  while (std::fgets(line, sizeof line, f)) {
    lfbench::Row r;
    r.name = "mpi-pingpong";
    r.mode = "poll";
    unsigned long long size = 0;
    if (std::sscanf(line, "{\"name\":\"mpi-pingpong\",\"size\":%llu,\"p50_ns\":%lf,\"p99_ns\":%lf,\"max_ns\":%lf,\"avg_ns\":%lf}",
                    &size, &r.p50_ns, &r.p99_ns, &r.max_ns, &r.avg_ns) == 5) {
      r.size = size;
      r.samples = static_cast<std::size_t>(iterations);
      rows.push_back(r);
    } else {
      note += line;
    }
  }
  const int rc = ::pclose(f);
  if (rc != 0 && rows.empty()) note = "mpiexec failed: " + note;
#else
  (void)iterations;
  note = "MPI not built (LAVAFLOW_WITH_MPI)";
#endif
  return rows;
}

const lfbench::Row* find(const std::vector<lfbench::Row>& rows, std::string_view name, std::string_view mode,
                         std::uint64_t size, bool touched = false) {
  for (const auto& r : rows)
    if (r.name == name && (mode.empty() || r.mode == mode) && (size == 0 || r.size == size) && r.touched == touched) return &r;
  return nullptr;
}

int bench_local(int argc, char** argv) {
  lfbench::Config cfg;
  bool json = false;
  std::string plot;
  for (int i = 2; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--json") json = true;
    else if (a == "--plot" && i + 1 < argc) plot = argv[++i];
    else if (a == "--iterations" && i + 1 < argc) cfg.iterations = std::max(100, std::atoi(argv[++i]));
    else if (a == "--cpus" && i + 1 < argc) {
      if (std::sscanf(argv[++i], "%d,%d", &cfg.cpu_a, &cfg.cpu_b) != 2) {
        std::fprintf(stderr, "lavaflow-bench: --cpus wants A,B\n");
        return 2;
      }
    } else if (a == "--quick") {
      cfg.iterations = 2000;
      cfg.warmup = 200;
      cfg.stream_messages = 100'000;
    } else {
      std::fprintf(stderr, "lavaflow-bench: unknown argument %s\n", a.c_str());
      return 2;
    }
  }
  std::string mpi_note;
  auto mpi = mpi_rows(cfg.iterations, mpi_note);
  auto rows = lfbench::run_local(cfg, "/proc/self/exe");
  if (!rows) {
    std::fprintf(stderr, "lavaflow-bench local: %s\n", rows.error().message().c_str());
    return 1;
  }
  rows->insert(rows->end(), mpi.begin(), mpi.end());

  // Targets, as ratios within this run.
  struct Target {
    std::string what;
    double value, limit;
    bool ge;  // value must be >= limit (else <=)
  };
  std::vector<Target> targets;
  const auto* shm64 = find(*rows, "lavaflow-shm", "poll", 64);
  const auto* shm16m = find(*rows, "lavaflow-shm", "poll", 16 << 20);
  const auto* shmblk = find(*rows, "lavaflow-shm", "block", 64);
  const auto* floor = find(*rows, "floor-cacheline", "", 0);
  const auto* futex = find(*rows, "futex-pingpong", "", 0);
  const auto* mpi64 = find(*rows, "mpi-pingpong", "", 64);
  if (shm64 && floor) targets.push_back({"shm poll 64 B p50 / cache-line floor p50", shm64->p50_ns / floor->p50_ns, 1.5, false});
  if (shm64 && mpi64) targets.push_back({"shm poll 64 B p50 / MPI ping-pong 64 B p50", shm64->p50_ns / mpi64->p50_ns, 0.5, false});
  if (shm64 && shm16m) targets.push_back({"shm poll 16 MiB untouched p50 / 64 B p50", shm16m->p50_ns / shm64->p50_ns, 2.0, false});
  if (shmblk && futex) targets.push_back({"shm block 64 B p50 / futex ping-pong p50", shmblk->p50_ns / futex->p50_ns, 1.3, false});
  if (shm64) targets.push_back({"shm poll 64 B pipelined, million msgs/s", shm64->msgs_per_s / 1e6, 5.0, true});

  if (!plot.empty()) {  // p50 one-way latency vs size, a line per transport, mode and variant
    std::vector<lfapp::PlotSeries> series;
    for (const auto& r : *rows) {
      const bool baseline = r.name.rfind("lavaflow-", 0) != 0;
      const std::string label = str_format("{}{}{}", r.name, r.mode.empty() || baseline ? "" : " " + r.mode, r.touched ? " touched" : "");
      auto it = std::find_if(series.begin(), series.end(), [&](const auto& s) { return s.label == label; });
      if (it == series.end()) it = series.insert(series.end(), {label, {}, baseline});
      it->points.emplace_back(r.size, r.p50_ns);
    }
    if (auto ok = lfapp::plot_vs_size(plot, "lavaflow-bench local: one-way latency p50 (round trip / 2)", "p50 latency (ns)", series); !ok) {
      std::fprintf(stderr, "lavaflow-bench local: %s\n", ok.error().message().c_str());
      return 1;
    }
    std::fprintf(stderr, "lavaflow-bench local: plot written to %s\n", plot.c_str());
  }

  if (json) {
    lfapp::Json j;
    j.begin_object().begin_array("results");
    for (const auto& r : *rows) {
      j.begin_object()
          .field("name", r.name)
          .field("mode", r.mode)
          .field("size", r.size)
          .field("touched", r.touched)
          .field("samples", r.samples)
          .field("p50_ns", r.p50_ns)
          .field("p99_ns", r.p99_ns)
          .field("max_ns", r.max_ns)
          .field("avg_ns", r.avg_ns);
      if (r.msgs_per_s > 0) j.field("msgs_per_s", r.msgs_per_s);
      j.end_object();
    }
    j.end_array().begin_array("targets");
    for (const auto& t : targets)
      j.begin_object().field("what", t.what).field("value", t.value).field("limit", t.limit)
          .field("met", t.ge ? t.value >= t.limit : t.value <= t.limit).end_object();
    j.end_array();
    if (!mpi_note.empty()) j.field("mpi_note", mpi_note);
    j.field("cpus", str_format("{},{}", cfg.cpu_a, cfg.cpu_b)).end_object();
    std::puts(j.str().c_str());
    return 0;
  }
  std::printf("lavaflow-bench local: one-way latency = round trip / 2, processes pinned to CPUs %d and %d, %d round trips\n",
              cfg.cpu_a, cfg.cpu_b, cfg.iterations);
  std::printf("%-18s %-6s %9s %8s %10s %10s %11s %13s\n", "name", "mode", "size", "touched", "p50 ns", "p99 ns", "max ns", "msgs/s");
  for (const auto& r : *rows)
    std::printf("%-18s %-6s %9s %8s %10.0f %10.0f %11.0f %13s\n", r.name.c_str(), r.mode.c_str(), human(r.size).c_str(),
                r.touched ? "yes" : "no", r.p50_ns, r.p99_ns, r.max_ns,
                r.msgs_per_s > 0 ? str_format("{:.0f}", r.msgs_per_s).c_str() : "");
  if (!mpi_note.empty()) std::printf("MPI: %s\n", mpi_note.c_str());
  std::printf("\nTargets (ratios within this run)\n");
  for (const auto& t : targets)
    std::printf("  %-52s %8.3f  %s %.2f  %s\n", t.what.c_str(), t.value, t.ge ? ">=" : "<=", t.limit,
                (t.ge ? t.value >= t.limit : t.value <= t.limit) ? "met" : "NOT met");
  return 0;
}

void usage() {
  std::puts(
      "usage: lavaflow-bench alloc [--reps N] [--json]\n"
      "       lavaflow-bench local [--iterations N] [--cpus A,B] [--quick] [--json] [--plot FILE.png]\n"
      "  alloc   allocation + export time of exportable Vulkan buffers (4 KiB, 1 MiB, 64 MiB) next to a\n"
      "          plain vkAllocateMemory of the same size and memory type, and of each CPU strategy next\n"
      "          to an anonymous mmap; median of N (default 101) runs each.\n"
      "       lavaflow-bench remote [--max-size BYTES] [--ring-bytes BYTES] [--no-staging] [--json] [--plot FILE.png]\n"
      "  remote  (starts itself under mpiexec -n 2 when needed) raw MPI ping-pong latency and windowed bandwidth\n"
      "          (OSU methods), 8 B … 4 MiB, next to a lava-flow remote channel (route forced to MPI) doing the\n"
      "          same; bandwidth also against raw MPI through a ring of distinct buffers (--ring-bytes, default\n"
      "          512 KiB: the ring of messages up to 1 MiB; 2 buffers above); then GPU-buffer staging (64 MiB)\n"
      "          unless --no-staging.\n"
      "       lavaflow-bench interop [--size BYTES] [--frame BYTES] [--rounds N] [--json]\n"
      "  interop (CUDA GPU) a copy kernel over Vulkan-imported vs cudaMalloc memory (1 GiB), the cost of one\n"
      "          import, and cross-process GPU frame hand-off through a lava-flow channel vs CUDA IPC.\n"
      "  --plot FILE.png  latency against message size, one line per transport and baseline (gnuplot).");
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 2 || !std::strcmp(argv[1], "--help") || !std::strcmp(argv[1], "-h")) {
    usage();
    return argc < 2 ? 2 : 0;
  }
  const std::string what = argv[1];
  if (what == "_echo") return lfbench::echo_main(argc, argv);
  if (what == "local") return bench_local(argc, argv);
  if (what == "remote") {
#if LAVAFLOW_BENCH_REMOTE
    // Under mpiexec already (a PMI or OpenMPI rank variable is set): become the MPI program.
    // Otherwise start it under mpiexec -n 2.
    std::vector<std::string> args;
    const bool under_mpi = std::getenv("PMI_RANK") || std::getenv("OMPI_COMM_WORLD_RANK");
    if (!under_mpi) args = {LAVAFLOW_MPIEXEC, "-n", "2"};
    args.push_back(sibling("lavaflow-bench-remote"));
    for (int i = 2; i < argc; ++i) args.push_back(argv[i]);
    std::vector<char*> raw;
    for (auto& s : args) raw.push_back(s.data());
    raw.push_back(nullptr);
    ::execv(raw[0], raw.data());
    std::fprintf(stderr, "lavaflow-bench remote: cannot start %s: %s\n", raw[0], std::strerror(errno));
    return 1;
#else
    std::puts("lavaflow-bench remote: skipped, the MPI transport is not built (LAVAFLOW_WITH_MPI)");
    return 77;
#endif
  }
  if (what == "interop" || what == "interop-peer") {
#if LAVAFLOW_BENCH_INTEROP
    return what == "interop" ? lfbench::bench_interop(argc, argv) : lfbench::bench_interop_peer(argc, argv);
#else
    std::puts("lavaflow-bench interop: skipped, the CUDA adapter is not built (LAVAFLOW_WITH_CUDA)");
    return 77;
#endif
  }
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
