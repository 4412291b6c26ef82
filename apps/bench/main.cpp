// SPDX-License-Identifier: MIT
// lavaflow-bench: benchmarks measured against a baseline in the same run.
//   alloc : allocate + export of exportable Vulkan buffers vs a plain vkAllocateMemory of the
//           same size and memory type, and each CPU strategy vs plain shared memory (median).
#include <sched.h>
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <bit>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <functional>
#include <nlohmann/json.hpp>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "cli.hpp"
#include "interop.hpp"
#include "p2p.hpp"
#if LAVAFLOW_BENCH_INTEROP
#include "gpu_handoff.hpp"
#endif
#include "lavaflow/core/detail/format.hpp"
#include "lavaflow/lavaflow.hpp"
#include "local.hpp"
#include "plot.hpp"
#include "pool.hpp"
#include "python.hpp"
#include "run.hpp"

using namespace lavaflow;

namespace {

/// A program installed beside this one (the build tree keeps them together too): no build-tree
/// path is compiled into the binary.
std::string sibling(const char* name) {
  char self[4096] = {};
  const ssize_t n = ::readlink("/proc/self/exe", self, sizeof self - 1);
  if (n <= 0) return name;
  std::string path(self, static_cast<std::size_t>(n));
  return path.substr(0, path.rfind('/') + 1) + name;
}

#if LAVAFLOW_BENCH_COLLECTIVES
/// The physical cores this process may run on (distinct package and core ids of the CPUs in its
/// affinity mask): what an MPI launcher's `-bind-to core` places ranks on. 0 when the topology
/// cannot be read.
unsigned physical_cores() {
  cpu_set_t allowed;
  CPU_ZERO(&allowed);
  if (::sched_getaffinity(0, sizeof allowed, &allowed) != 0) return 0;
  std::set<std::pair<long, long>> cores;
  for (int cpu = 0; cpu < CPU_SETSIZE; ++cpu) {
    if (!CPU_ISSET(cpu, &allowed)) continue;
    auto id = [&](const char* what) {
      long v = -1;
      std::ifstream(str_format("/sys/devices/system/cpu/cpu{}/topology/{}", cpu, what)) >> v;
      return v;
    };
    const long package = id("physical_package_id"), core = id("core_id");
    if (package < 0 || core < 0) return 0;
    cores.emplace(package, core);
  }
  return static_cast<unsigned>(cores.size());
}
#endif

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
        if (!b) {
          err = b.error().message();
          return false;
        }
        auto e = b->export_handle();
        if (!e) {
          err = e.error().message();
          return false;
        }
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
    const double shm = median_us(
        reps, [&] { return bool(CpuBuffer::allocate({.size = size, .strategy = CpuStrategy::SharedMemory}, topo)); });
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
    nlohmann::ordered_json j{{"results", nlohmann::ordered_json::array()}};
    for (const auto& r : rows)
      j["results"].push_back({{"name", r.name},
                              {"size", r.size},
                              {"median_us", r.median_us},
                              {"baseline", r.baseline},
                              {"baseline_median_us", r.baseline_us},
                              {"ratio", r.median_us / r.baseline_us},
                              {"note", r.note}});
    j["repetitions"] = reps;
    std::puts(j.dump().c_str());
    return 0;
  }
  std::printf("lavaflow-bench alloc: median of %d, allocate + export (+ free), against a baseline of the same size\n",
              reps);
  if (ctx)
    std::printf("device: %s (%s)\n", ctx->capabilities().identity.name.c_str(),
                ctx->capabilities().driver_name.c_str());
  std::printf("%-22s %8s %12s %18s %12s %8s  %s\n", "what", "size", "median us", "baseline", "base us", "ratio",
              "note");
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
  const std::string cmd = str_format("{} -n 2 -bind-to core {} {} 64 4096 2>&1", LAVAFLOW_MPIEXEC,
                                     sibling("lavaflow-bench-mpi"), iterations);
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
    if (std::sscanf(
            line,
            "{\"name\":\"mpi-pingpong\",\"size\":%llu,\"p50_ns\":%lf,\"p99_ns\":%lf,\"max_ns\":%lf,\"avg_ns\":%lf}",
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
    if (r.name == name && (mode.empty() || r.mode == mode) && (size == 0 || r.size == size) && r.touched == touched)
      return &r;
  return nullptr;
}

int bench_local(lfbench::Config cfg, bool json, const std::string& plot) {
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
  const auto* shm16m = find(*rows, "lavaflow-shm", "poll", 16 << 20);
  const auto* shm64 = find(*rows, "lavaflow-shm", "poll", 64);
  const auto* shmblk = find(*rows, "lavaflow-shm", "block", 64);
  const auto* floor = find(*rows, "floor-cacheline", "", 0);
  const auto* futex = find(*rows, "futex-pingpong", "", 0);
  // The hot path's targets at 64 B and 4 KiB: within 1.2 cache-line transfers, at most half of
  // MPI's shared-memory ping-pong, and 12 M messages/s pipelined.
  for (std::uint64_t size : {64u, 4096u}) {
    const auto* shm = find(*rows, "lavaflow-shm", "poll", size);
    const auto* raw_mpi = find(*rows, "mpi-pingpong", "", size);
    if (shm && floor)
      targets.push_back(
          {str_format("shm poll {} B p50 / cache-line floor p50", size), shm->p50_ns / floor->p50_ns, 1.2, false});
    if (shm && raw_mpi)
      targets.push_back({str_format("shm poll {} B p50 / MPI ping-pong {} B p50", size, size),
                         shm->p50_ns / raw_mpi->p50_ns, 0.5, false});
  }
  if (shm64 && shm16m)
    targets.push_back({"shm poll 16 MiB untouched p50 / 64 B p50", shm16m->p50_ns / shm64->p50_ns, 2.0, false});
  if (shmblk && futex)
    targets.push_back({"shm block 64 B p50 / futex ping-pong p50", shmblk->p50_ns / futex->p50_ns, 1.3, false});
  if (shm64) targets.push_back({"shm poll 64 B pipelined, million msgs/s", shm64->msgs_per_s / 1e6, 12.0, true});

  if (!plot.empty()) {  // p50 one-way latency vs size, a line per transport, mode and variant
    std::vector<lfapp::PlotSeries> series;
    for (const auto& r : *rows) {
      const bool baseline = r.name.rfind("lavaflow-", 0) != 0;
      const std::string label =
          str_format("{}{}{}", r.name, r.mode.empty() || baseline ? "" : " " + r.mode, r.touched ? " touched" : "");
      auto it = std::find_if(series.begin(), series.end(), [&](const auto& s) { return s.label == label; });
      if (it == series.end()) it = series.insert(series.end(), {label, {}, baseline});
      it->points.emplace_back(r.size, r.p50_ns);
    }
    if (auto ok = lfapp::plot_vs_size(plot, "lavaflow-bench local: one-way latency p50 (round trip / 2)",
                                      "p50 latency (ns)", series);
        !ok) {
      std::fprintf(stderr, "lavaflow-bench local: %s\n", ok.error().message().c_str());
      return 1;
    }
    std::fprintf(stderr, "lavaflow-bench local: plot written to %s\n", plot.c_str());
  }

  if (json) {
    nlohmann::ordered_json j{{"results", nlohmann::ordered_json::array()},
                             {"targets", nlohmann::ordered_json::array()}};
    for (const auto& r : *rows) {
      nlohmann::ordered_json row{{"name", r.name},       {"mode", r.mode},       {"size", r.size},
                                 {"touched", r.touched}, {"samples", r.samples}, {"p50_ns", r.p50_ns},
                                 {"p99_ns", r.p99_ns},   {"max_ns", r.max_ns},   {"avg_ns", r.avg_ns}};
      if (r.p75_ns > 0) {  // the raw MPI rows come from another program, with no quartiles
        row["p25_ns"] = r.p25_ns;
        row["p75_ns"] = r.p75_ns;
      }
      if (r.msgs_per_s > 0) row["msgs_per_s"] = r.msgs_per_s;
      j["results"].push_back(std::move(row));
    }
    for (const auto& t : targets)
      j["targets"].push_back({{"what", t.what},
                              {"value", t.value},
                              {"limit", t.limit},
                              {"met", t.ge ? t.value >= t.limit : t.value <= t.limit}});
    if (!mpi_note.empty()) j["mpi_note"] = mpi_note;
    j["cpus"] = str_format("{},{}", cfg.cpu_a, cfg.cpu_b);
    std::puts(j.dump().c_str());
    return 0;
  }
  std::printf(
      "lavaflow-bench local: one-way latency = round trip / 2, processes pinned to CPUs %d and %d, %d round trips\n",
      cfg.cpu_a, cfg.cpu_b, cfg.iterations);
  std::printf("%-18s %-6s %9s %8s %10s %10s %11s %13s\n", "name", "mode", "size", "touched", "p50 ns", "p99 ns",
              "max ns", "msgs/s");
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

}  // namespace

int main(int argc, char** argv) {
  // Internal: the second process of `local` and `interop`, started by this program.
  if (argc > 1 && !std::strcmp(argv[1], "_echo")) return lfbench::echo_main(argc, argv);
#if LAVAFLOW_BENCH_INTEROP
  if (argc > 1 && !std::strcmp(argv[1], "interop-peer")) return lfbench::gpu_handoff_peer(argc, argv);
  if (argc > 1 && !std::strcmp(argv[1], "p2p-peer")) return lfbench::p2p_peer(argc, argv);
#endif

  CLI::App app{"lavaflow-bench: lava-flow's benchmarks, each next to a baseline measured in the same run.",
               "lavaflow-bench"};
  app.set_help_all_flag("--help-all", "help for every benchmark");
  app.require_subcommand(1, 1);
  const unsigned cpus = std::max(1u, std::thread::hardware_concurrency());

  bool json = false;
  std::string plot;
  int reps = 101;
  auto* alloc = app.add_subcommand(
      "alloc", "allocation + export of exportable Vulkan buffers and CPU strategies vs plain allocations");
  lfapp::add_whole(*alloc, "--reps", reps, "runs per size (median)", 1, 100'000);
  alloc->add_flag("--json", json, "JSON rows");

  lfbench::Config cfg;
  bool quick = false;
  std::vector<int> cpu_pair;
  auto* local = app.add_subcommand(
      "local", "local channels: latency and messages/s per transport, wait mode and size, with baselines");
  lfapp::add_whole(*local, "--iterations", cfg.iterations, "round trips per row", 100, 100'000'000);
  local->add_option("--cpus", cpu_pair, "the two CPUs to pin the processes to: A,B")
      ->delimiter(',')
      ->expected(2)
      ->check(CLI::Range(0, static_cast<int>(cpus) - 1));
  local->add_flag("--quick", quick, "fewer iterations and messages");
  local->add_flag("--json", json, "JSON rows and targets");
  local->add_option("--plot", plot, "latency against size (PNG, gnuplot)");

  std::uint64_t max_size = 4 << 20, ring_bytes = 512 << 10;
  bool no_staging = false;
  auto* remote = app.add_subcommand("remote", "remote channels over MPI vs raw MPI (starts itself under mpiexec -n 2)");
  lfapp::add_whole(*remote, "--max-size", max_size, "largest message", 8, 4 << 20);
  lfapp::add_whole(*remote, "--ring-bytes", ring_bytes, "bytes of the raw-MPI ring baseline", 8, 1 << 30);
  remote->add_flag("--no-staging", no_staging, "skip the GPU-buffer staging rows");
  remote->add_flag("--json", json, "JSON rows");
  remote->add_option("--plot", plot, "latency against size (PNG, gnuplot)");

  std::uint64_t ranks = 2, coll_max = 256u << 20;
  auto* collectives = app.add_subcommand(
      "collectives", "native collectives vs MPI's (starts itself under mpiexec -n --ranks; every rank on this host)");
  lfapp::add_whole(*collectives, "--ranks", ranks, "MPI ranks", 2, 64);
  lfapp::add_whole(*collectives, "--max-size", coll_max, "largest size, bytes per rank", 8, 1u << 30);
  collectives->add_flag("--json", json, "JSON rows");
  collectives->add_option("--plot", plot, "bus bandwidth against size (PNG, gnuplot)");

  std::uint64_t dev_ranks = 2, dev_max = 0;
  std::string dev_backend = "vulkan";
  auto* device_coll = app.add_subcommand(
      "device-collectives",
      "collectives on GPU buffers: Vulkan (compute-shader reduction) or CUDA (kernels, graphs, NCCL where built) "
      "vs the same calls staged through host memory (starts itself under lavaflow-launch -n --ranks)");
  lfapp::add_whole(*device_coll, "--ranks", dev_ranks, "ranks (processes on this host)", 2, 16);
  device_coll->add_option("--backend", dev_backend, "vulkan or cuda")->check(CLI::IsMember({"vulkan", "cuda"}));
  lfapp::add_whole(*device_coll, "--max-size", dev_max, "largest size, bytes per rank (0: the backend's default)", 0,
                   1u << 30);
  device_coll->add_flag("--json", json, "JSON rows");
  std::uint64_t dev_chunk = 0;
  lfapp::add_whole(*device_coll, "--chunk-bytes", dev_chunk,
                   "cuda: staging per rank and step, a power of two of 64 KiB - 256 MiB (0: the library's default)", 0,
                   256u << 20);
  bool dev_no_staged = false;
  device_coll->add_flag("--no-staged", dev_no_staged,
                        "cuda: leave out the staged rows (slow at large sizes; NCCL is the baseline where it runs)");
  std::uint64_t dev_hosts = 1;
  lfapp::add_whole(*device_coll, "--hosts", dev_hosts,
                   "cuda: simulated hosts, each holding as many of the ranks (in rank order): hierarchical calls "
                   "against the same group staged whole",
                   1, 8);

  lfbench::PoolBenchOptions pool_options;
  auto* pool = app.add_subcommand(
      "pool", "memory pool: host rent+return vs malloc, Vulkan warm rent vs fresh allocation, a churn trace");
  pool->add_flag("--quick", pool_options.quick, "fewer batches and a shorter trace");
  pool->add_flag("--json", pool_options.json, "JSON rows and targets");

  lfbench::PythonBenchOptions python_options;
  auto* python = app.add_subcommand(
      "python", "the Python layer's cost per message (receive, DLPack into NumPy/PyTorch, release) vs C++");
  python->add_flag("--quick", python_options.quick, "fewer messages");
  python->add_flag("--json", python_options.json, "JSON rows and the target");

  lfbench::InteropOptions io;
  auto* interop =
      app.add_subcommand("interop", "(CUDA GPU) kernels on imported memory and GPU frame hand-off vs CUDA IPC");
  lfapp::add_whole(*interop, "--size", io.size, "bytes the copy kernel moves", 1 << 20, 1ull << 36);
  lfapp::add_whole(*interop, "--rounds", io.rounds, "gpu-pingpong round trips per row", 10, 10'000'000);
  lfapp::add_whole(*interop, "--frames", io.frames, "gpu-stream frames at 1 MiB (a quarter at 16 MiB)", 16, 1'000'000);
  lfapp::add_whole(*interop, "--slots", io.slots, "gpu-stream ring buffers (0: the channel's default)", 0,
                   ProducerOptions::kMaxSlots);
  lfapp::add_whole(*interop, "--batch", io.batch, "gpu-stream frames per GPU wait and signal (at most half the ring)",
                   1, 31);
  interop->add_option("--parts", io.parts, "rows to measure (default: all)")
      ->delimiter(',')
      ->check(CLI::IsMember({"copy", "import", "pingpong", "stream"}));
  interop->add_flag("--json", io.json, "JSON rows");

  lfbench::P2POptions p2p_options;
  auto* p2p = app.add_subcommand(
      "p2p", "(two CUDA GPUs) GPU0 -> GPU1: a channel across processes vs cudaMemcpyPeer vs staging through the host");
  lfapp::add_whole(*p2p, "--min-size", p2p_options.min_size, "smallest transfer, bytes", 4096, 1ull << 34);
  lfapp::add_whole(*p2p, "--max-size", p2p_options.max_size, "largest transfer, bytes (sizes go x4)", 4096, 1ull << 34);
  p2p->add_flag("--json", p2p_options.json, "JSON rows");

  lfbench::RunOptions run_options;
  auto* run = app.add_subcommand(
      "run", "every suite that can run here, repeated, into DIR/run.json (rows + environment) and plots");
  run->add_option("--suites", run_options.suites, "suites to run (default: all)")
      ->delimiter(',')
      ->check(CLI::IsMember(lfbench::run_suites()));
  run->add_flag("--quick", run_options.quick, "each suite's quick form (fewer samples, smaller sizes)");
  lfapp::add_whole(*run, "--repeat", run_options.repeats, "runs of each suite (their spread is the noise)", 1, 50);
  run->add_option("--out", run_options.out, "directory for run.json and the plots")->required();

  lfbench::CompareCommand cmp;
  auto* compare = app.add_subcommand(
      "compare", "two run files, row by row: exit 1 when a row is worse by more than the threshold beyond the noise");
  compare->add_option("base", cmp.base, "the baseline run (run.json or its directory)")->required();
  compare->add_option("new", cmp.now, "the run to judge (run.json or its directory)")->required();
  compare->add_option("--threshold", cmp.threshold_percent, "percent worse that fails a row")
      ->check(lfapp::real(0, 1000))
      ->capture_default_str();
  compare->add_flag("--ratios-only", cmp.ratios_only, "only rows measured against a baseline in the same run");

  std::vector<std::string> report_runs;
  std::string report_out = "-";
  auto* report = app.add_subcommand("report", "a Markdown page of one or more runs: tables per suite and plots");
  report->add_option("runs", report_runs, "run directories (or run.json files)")->required();
  report->add_option("--out", report_out, "the Markdown file (default: standard output)");
  if (auto rc = lfapp::parse(app, argc, argv)) return *rc;

  if (run->parsed()) return lfbench::bench_run(run_options);
  if (compare->parsed()) return lfbench::bench_compare(cmp);
  if (report->parsed()) return lfbench::bench_report(report_runs, report_out);

  if (alloc->parsed()) return bench_alloc(reps, json);
  if (pool->parsed()) return lfbench::bench_pool(pool_options);
  if (python->parsed()) return lfbench::bench_python(python_options);
  if (local->parsed()) {
    if (quick) {
      cfg.iterations = 2000;
      cfg.warmup = 200;
      cfg.stream_messages = 100'000;
    }
    if (cpu_pair.size() == 2) {
      cfg.cpu_a = cpu_pair[0];
      cfg.cpu_b = cpu_pair[1];
    }
    return bench_local(cfg, json, plot);
  }
  if (remote->parsed()) {
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
  if (device_coll->parsed()) {
    if (dev_chunk && (!std::has_single_bit(dev_chunk) || dev_chunk < (64u << 10)))
      return std::fprintf(stderr,
                          "lavaflow-bench device-collectives: --chunk-bytes %llu is not a power of two of 64 KiB - "
                          "256 MiB\n",
                          static_cast<unsigned long long>(dev_chunk)),
             2;
    if (dev_ranks % dev_hosts || dev_ranks / dev_hosts < 2)
      return std::fprintf(
                 stderr,
                 "lavaflow-bench device-collectives: --hosts %llu does not split --ranks %llu into hosts of two "
                 "or more ranks each\n",
                 static_cast<unsigned long long>(dev_hosts), static_cast<unsigned long long>(dev_ranks)),
             2;
    // lavaflow-launch is installed beside lavaflow-bench, and in the build tree under apps/launch.
    std::string launch = sibling("lavaflow-launch");
    if (::access(launch.c_str(), X_OK) != 0) launch = sibling("../launch/lavaflow-launch");
    std::vector<std::string> args = {
        launch,      "-n",       std::to_string(dev_ranks), sibling("lavaflow-bench-device-collectives"),
        "--backend", dev_backend};
    if (dev_max) args.insert(args.end(), {"--max-size", std::to_string(dev_max)});
    if (json) args.emplace_back("--json");
    if (dev_no_staged) args.emplace_back("--no-staged");
    if (dev_chunk) args.insert(args.end(), {"--chunk-bytes", std::to_string(dev_chunk)});
    if (dev_hosts > 1) args.insert(args.end(), {"--hosts", std::to_string(dev_hosts)});
    std::vector<char*> raw;
    for (auto& a : args) raw.push_back(a.data());
    raw.push_back(nullptr);
    ::execv(raw[0], raw.data());
    std::fprintf(stderr, "lavaflow-bench device-collectives: cannot start %s: %s\n", raw[0], std::strerror(errno));
    return 1;
  }
  if (collectives->parsed()) {
#if LAVAFLOW_BENCH_COLLECTIVES
    std::vector<std::string> args;
    const bool under_mpi = std::getenv("PMI_RANK") || std::getenv("OMPI_COMM_WORLD_RANK");
    if (!under_mpi) {
      args = {LAVAFLOW_MPIEXEC, "-n", std::to_string(ranks)};
      // A rank per physical core where there are enough: unbound ranks that a blocking backend's
      // wake-ups (Gloo's) put on one core stay there for milliseconds, and every row timed
      // meanwhile measures the time-slicing instead of the collective. Every backend's rows run
      // bound, Gloo's worker and TCP threads on their rank's core too.
      if (ranks <= physical_cores()) args.insert(args.end(), {"-bind-to", "core"});
    }
    args.push_back(sibling("lavaflow-bench-collectives"));
    args.insert(args.end(), {"--max-size", std::to_string(coll_max)});
    if (json) args.emplace_back("--json");
    if (!plot.empty()) args.insert(args.end(), {"--plot", plot});
    std::vector<char*> raw;
    for (auto& s : args) raw.push_back(s.data());
    raw.push_back(nullptr);
    ::execv(raw[0], raw.data());
    std::fprintf(stderr, "lavaflow-bench collectives: cannot start %s: %s\n", raw[0], std::strerror(errno));
    return 1;
#else
    std::puts("lavaflow-bench collectives: skipped, the mesh's MPI part is not built (LAVAFLOW_WITH_MPI)");
    return 77;
#endif
  }
#if LAVAFLOW_BENCH_INTEROP
  if (p2p->parsed()) {
    if (p2p_options.min_size > p2p_options.max_size)
      return std::fprintf(stderr, "lavaflow-bench p2p: --min-size is above --max-size\n"), 2;
    return lfbench::bench_p2p(p2p_options);
  }
  return lfbench::bench_interop(io);
#else
  std::printf("lavaflow-bench %s: skipped, the CUDA adapter is not built (LAVAFLOW_WITH_CUDA)\n",
              p2p->parsed() ? "p2p" : "interop");
  return 77;
#endif
}
