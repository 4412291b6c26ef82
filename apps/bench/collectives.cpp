// SPDX-License-Identifier: MIT
// lavaflow-bench-collectives — run by `lavaflow-bench collectives` under `mpiexec -n N`. In one
// run, for every size from 8 B to --max-size (bytes per rank) and every op (all_reduce f32 sum,
// all_gather, reduce_scatter f32 sum): the lava-flow native backend on ordinary user memory and
// the MPI library's own collective (MPI_Allreduce, MPI_Allgather, MPI_Reduce_scatter_block) and,
// where built, Gloo (through lava-flow's Gloo backend) and NCCL (lava-flow's NCCL backend, on GPU
// buffers: a host's k-th rank on its CUDA device k, when every rank of a host has a device of its own), in
// rounds so that all see the same moments of a shared machine (lava-flow's and MPI's calls take
// turns one by one; Gloo and NCCL go in blocks). Every call is timed on
// every rank; a row's p50/p99 are over the slowest rank's time of each call. busbw follows NCCL's
// convention: all_reduce size/t × 2(n−1)/n; all_gather and reduce_scatter n·size/t × (n−1)/n.
// Rank 0 prints a table, or with --json {"results":[{"name","op","dtype","size","ranks","p50_ns",
// "p99_ns","busbw_gbps"}…],"targets":[…]}.
#include <mpi.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "cli.hpp"
#include "lavaflow/core/detail/format.hpp"
#include "lavaflow/mesh_mpi/mesh_mpi.hpp"
#include "plot.hpp"
#if LAVAFLOW_BENCH_NCCL
#include <cuda_runtime_api.h>

#include "lavaflow/mesh_nccl/nccl.hpp"
#endif

using namespace lavaflow;
using namespace lavaflow::mesh;

namespace {

struct Row {
  std::string name, op;
  std::uint64_t size = 0;
  int ranks = 0;
  double p50_ns = 0, p99_ns = 0, busbw_gbps = 0;
};

enum class Op { AllReduce, AllGather, ReduceScatter };
const char* op_name(Op op) {
  return op == Op::AllReduce ? "all_reduce" : op == Op::AllGather ? "all_gather" : "reduce_scatter";
}

/// Timed calls of each backend at `size`: enough that the median of large calls (a few per round,
/// each at the mercy of the machine's memory bandwidth at that moment) is steady to a few percent.
int calls_for(std::uint64_t size) {
  if (size <= (64u << 10)) return 400;
  if (size <= (4u << 20)) return 60;
  return size <= (64u << 20) ? 24 : 12;
}

/// Room for every op at one size: `send` and `recv` of size × ranks bytes each (host or GPU memory).
struct Buffers {
  std::byte* send = nullptr;
  std::byte* recv = nullptr;
};

/// One call of `op` by lava-flow (comm) or MPI (comm == nullptr); false on an error.
bool once(Op op, Communicator* comm, Buffers& b, std::uint64_t size, int n) {
  const auto count = static_cast<int>(size / 4);
  const std::size_t bytes = size / 4 * 4, all = bytes * static_cast<std::size_t>(n);
  if (comm) {
    Work w;
    switch (op) {
      case Op::AllReduce:
        w = comm->all_reduce({b.send, bytes}, {b.recv, bytes}, DType::F32, ReduceOp::Sum);
        break;
      case Op::AllGather:
        w = comm->all_gather({b.send, bytes}, {b.recv, all}, DType::F32);
        break;
      case Op::ReduceScatter:
        w = comm->reduce_scatter({b.send, all}, {b.recv, bytes}, DType::F32, ReduceOp::Sum);
        break;
    }
    return w.wait().has_value();
  }
  switch (op) {
    case Op::AllReduce:
      return MPI_Allreduce(b.send, b.recv, count, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD) == MPI_SUCCESS;
    case Op::AllGather:
      return MPI_Allgather(b.send, count, MPI_FLOAT, b.recv, count, MPI_FLOAT, MPI_COMM_WORLD) == MPI_SUCCESS;
    case Op::ReduceScatter:
      return MPI_Reduce_scatter_block(b.send, b.recv, count, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD) == MPI_SUCCESS;
  }
  return false;
}

/// The NCCL rows' group and GPU buffers.
struct NcclRows {
  std::unique_ptr<Communicator> comm;
  Buffers gpu;
  NcclRows() = default;
  NcclRows(const NcclRows&) = delete;
  NcclRows& operator=(const NcclRows&) = delete;
  ~NcclRows() {
    comm.reset();
#if LAVAFLOW_BENCH_NCCL
    cudaFree(gpu.send);
    cudaFree(gpu.recv);
#endif
  }
};

#if LAVAFLOW_BENCH_NCCL
/// An NCCL group of every rank on GPU buffers, when every rank can have a CUDA device of its own
/// (a host's k-th rank takes its device k; ranks on one host must not share one): decided by all
/// ranks together. The buffers are `bytes` each (cudaMalloc).
std::unique_ptr<NcclRows> open_nccl_rows(Communicator& world, int rank, std::uint64_t bytes) {
  int devices = 0;
  if (cudaGetDeviceCount(&devices) != cudaSuccess) devices = 0;
  MPI_Comm host;
  MPI_Comm_split_type(MPI_COMM_WORLD, MPI_COMM_TYPE_SHARED, rank, MPI_INFO_NULL, &host);
  int on_host = 1, local = 0;
  MPI_Comm_size(host, &on_host);
  MPI_Comm_rank(host, &local);  // ranks of a host need not be numbered one after another
  MPI_Comm_free(&host);
  int can = devices >= on_host ? 1 : 0, all = 0;
  MPI_Allreduce(&can, &all, 1, MPI_INT, MPI_MIN, MPI_COMM_WORLD);
  if (!all) {
    if (rank == 0)
      std::fprintf(stderr, "lavaflow-bench collectives: NCCL rows skipped: a rank has no CUDA device of its own\n");
    return nullptr;
  }
  auto rows = std::make_unique<NcclRows>();
  const int device = local % devices;
  int ok = cudaSetDevice(device) == cudaSuccess &&
           cudaMalloc(reinterpret_cast<void**>(&rows->gpu.send), bytes) == cudaSuccess &&
           cudaMalloc(reinterpret_cast<void**>(&rows->gpu.recv), bytes) == cudaSuccess &&
           cudaMemset(rows->gpu.send, 0, bytes) == cudaSuccess;
  int every = 0;
  MPI_Allreduce(&ok, &every, 1, MPI_INT, MPI_MIN, MPI_COMM_WORLD);
  if (!every) {
    if (rank == 0) std::fprintf(stderr, "lavaflow-bench collectives: NCCL rows skipped: cudaMalloc failed\n");
    return nullptr;
  }
  auto c = open_nccl(world, {.device = device});
  if (!c) {
    std::fprintf(stderr, "lavaflow-bench collectives: %s\n", c.error().message().c_str());
    MPI_Abort(MPI_COMM_WORLD, 1);
  }
  rows->comm = std::move(*c);
  return rows;
}
#endif

/// Every rank's times of its calls, reduced to the slowest rank's time of each call on rank 0 and
/// appended to `out` there.
void slowest_into(const std::vector<double>& mine, std::vector<double>& out) {
  std::vector<double> slowest(mine.size());
  MPI_Reduce(mine.data(), slowest.data(), static_cast<int>(mine.size()), MPI_DOUBLE, MPI_MAX, 0, MPI_COMM_WORLD);
  out.insert(out.end(), slowest.begin(), slowest.end());
}

/// One call of `op` on every rank, timed; false on an error.
bool time_once(Op op, Communicator* comm, Buffers& b, std::uint64_t size, int n, std::vector<double>& mine) {
  const double t0 = MPI_Wtime();
  if (!once(op, comm, b, size, n)) return false;
  mine.push_back((MPI_Wtime() - t0) * 1e9);
  return true;
}

/// Times `calls` calls, each on every rank; returns the slowest rank's time of each call (rank 0).
bool timed(Op op, Communicator* comm, Buffers& b, std::uint64_t size, int n, int calls, std::vector<double>& out) {
  std::vector<double> mine;
  for (int i = 0; i < calls; ++i)
    if (!time_once(op, comm, b, size, n, mine)) return false;
  slowest_into(mine, out);
  return true;
}

/// Times `calls` calls of lava-flow (`comm`) and as many of MPI's collective, taking turns call by
/// call, the first of each pair alternating (from lava-flow when `ours_first`): both see the same
/// moments of the machine, whose memory bandwidth and cores' speed drift over milliseconds.
bool timed_turns(Op op, Communicator* comm, Buffers& b, std::uint64_t size, int n, int calls, bool ours_first,
                 std::vector<double>& ours, std::vector<double>& theirs) {
  std::vector<double> mine, other;
  for (int i = 0; i < calls; ++i) {
    const bool we_go_first = (i % 2 == 0) == ours_first;
    for (int turn = 0; turn < 2; ++turn) {
      const bool lavaflow = (turn == 0) == we_go_first;
      if (!time_once(op, lavaflow ? comm : nullptr, b, size, n, lavaflow ? mine : other)) return false;
    }
  }
  slowest_into(mine, ours);
  slowest_into(other, theirs);
  return true;
}

Row summarize(std::string name, Op op, std::uint64_t size, int n, std::vector<double>& t) {
  std::sort(t.begin(), t.end());
  const double p50 = t[t.size() / 2], p99 = t[std::min(t.size() - 1, t.size() * 99 / 100)];
  const double per_rank = double(size) / p50;  // bytes per ns = GB/s
  const double bus = op == Op::AllReduce ? per_rank * 2.0 * (n - 1) / n : per_rank * n * (n - 1) / n;
  return Row{std::move(name), op_name(op), size, n, p50, p99, bus};
}

}  // namespace

int main(int argc, char** argv) {
  int provided = 0;
  MPI_Init_thread(&argc, &argv, MPI_THREAD_FUNNELED, &provided);
  CLI::App app{"lavaflow-bench-collectives: lava-flow native collectives vs MPI's, under mpiexec"};
  std::uint64_t max_size = 256u << 20;
  bool json = false;
  std::string plot;
  lfapp::add_whole(app, "--max-size", max_size, "largest size, bytes per rank", 8, 1u << 30);
  app.add_flag("--json", json, "JSON rows");
  app.add_option("--plot", plot, "bus bandwidth against size (PNG, gnuplot)");
  int rank = 0, n = 1;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &n);
  if (auto rc = lfapp::parse(app, argc, argv)) {
    MPI_Finalize();
    return *rc;
  }
  int code = 0;
  {
    auto job = mpi::Communicator::create();
    auto mesh = job ? mesh_from_mpi(*job) : Result<DeviceMesh>(std::unexpected(job.error()));
    auto comm = mesh ? mesh->communicator("world", mpi_communicators(*job, {.chunk_bytes = 4u << 20}))
                     : Result<std::unique_ptr<Communicator>>(std::unexpected(mesh.error()));
    if (!comm) {
      std::fprintf(stderr, "lavaflow-bench collectives: %s\n", comm.error().message().c_str());
      MPI_Abort(MPI_COMM_WORLD, 1);
    }
    // Gloo, where built: through lava-flow's Gloo backend (its calls run on the backend's thread).
    std::unique_ptr<Communicator> gloo;
    if (const auto built = mpi_backends(); std::find(built.begin(), built.end(), Backend::Gloo) != built.end()) {
      std::vector<std::uint32_t> all;
      for (int r = 0; r < n; ++r) all.push_back(static_cast<std::uint32_t>(r));
      auto g = mpi_communicators(*job)({"world-gloo", all, Backend::Gloo}, static_cast<std::uint32_t>(rank));
      if (!g) {
        std::fprintf(stderr, "lavaflow-bench collectives: %s\n", g.error().message().c_str());
        MPI_Abort(MPI_COMM_WORLD, 1);
      }
      gloo = std::move(*g);
    }
    std::vector<Row> rows;
    std::vector<float> send, recv;
    Buffers b;
    std::unique_ptr<NcclRows> nccl;
#if LAVAFLOW_BENCH_NCCL
    nccl = open_nccl_rows(**comm, rank, max_size / 4 * 4 * static_cast<std::uint64_t>(n));
#endif
    for (std::uint64_t size = 8; size <= max_size;
         size = size * 4 > max_size && size < max_size ? max_size : size * 4) {
      send.assign(size / 4 * static_cast<std::uint64_t>(n), 1.0f);
      recv.assign(size / 4 * static_cast<std::uint64_t>(n), 0.0f);
      b = {reinterpret_cast<std::byte*>(send.data()), reinterpret_cast<std::byte*>(recv.data())};
      for (Op op : {Op::AllReduce, Op::AllGather, Op::ReduceScatter}) {
        const int calls = calls_for(size);
        std::vector<double> ours, theirs, glooed, nccled;
        bool ok = true;
        for (int w = 0; w < 2 && ok; ++w)  // warm-up: pages touched, connections made
          ok = once(op, comm->get(), b, size, n) && once(op, nullptr, b, size, n) &&
               (!gloo || once(op, gloo.get(), b, size, n)) && (!nccl || once(op, nccl->comm.get(), nccl->gpu, size, n));
        // Gloo and NCCL leave their threads busy for a while after a call (Gloo's TCP loop, the
        // kernel's socket work), which slows whatever runs next on a machine with few cores: they
        // go first in each round, an untimed call of each host backend follows, then lava-flow and
        // MPI take turns call by call, each going first after them in as many rounds as the
        // other. The GPUs idle through the host rows of a round and clock down: NCCL's timed
        // calls follow untimed ones.
        constexpr int kRounds = 6;
        const int per_round = std::max(1, calls / kRounds);
        for (int round = 0; round < kRounds && ok; ++round) {
          ok = (!gloo || timed(op, gloo.get(), b, size, n, per_round, glooed)) &&
               (!nccl ||
                (once(op, nccl->comm.get(), nccl->gpu, size, n) && once(op, nccl->comm.get(), nccl->gpu, size, n) &&
                 timed(op, nccl->comm.get(), nccl->gpu, size, n, per_round, nccled))) &&
               once(op, comm->get(), b, size, n) && once(op, nullptr, b, size, n);
          ok = ok && timed_turns(op, comm->get(), b, size, n, per_round, round % 2 == 0, ours, theirs);
        }
        if (!ok) {
          std::fprintf(stderr, "lavaflow-bench collectives: %s of %llu bytes failed\n", op_name(op),
                       static_cast<unsigned long long>(size));
          MPI_Abort(MPI_COMM_WORLD, 1);
        }
        if (rank == 0) {
          rows.push_back(summarize("lavaflow", op, size, n, ours));
          rows.push_back(summarize("mpi", op, size, n, theirs));
          if (gloo) rows.push_back(summarize("gloo", op, size, n, glooed));
          if (nccl) rows.push_back(summarize("nccl", op, size, n, nccled));
        }
      }
      if (size == max_size) break;
    }
    if (rank == 0) {
      // The targets: all_reduce p50 at 8 B, and busbw at 16 MiB and up, against MPI.
      auto find = [&](const char* name, const char* op, std::uint64_t size) -> const Row* {
        for (const auto& r : rows)
          if (r.name == name && r.op == op && r.size == size) return &r;
        return nullptr;
      };
      nlohmann::json targets = nlohmann::json::array();
      if (auto* a = find("lavaflow", "all_reduce", 8); a)
        if (auto* m = find("mpi", "all_reduce", 8); m)
          targets.push_back({{"name", "all_reduce p50 at 8 B vs MPI"},
                             {"ratio", a->p50_ns / m->p50_ns},
                             {"target", "<= 1.0"},
                             {"met", a->p50_ns <= m->p50_ns}});
      if (auto* a = find("lavaflow", "all_reduce", 8); a)
        if (auto* g = find("gloo", "all_reduce", 8); g)
          targets.push_back({{"name", "all_reduce p50 at 8 B vs Gloo"},
                             {"ratio", a->p50_ns / g->p50_ns},
                             {"target", "<= 0.1"},
                             {"met", a->p50_ns <= 0.1 * g->p50_ns}});
      for (const auto& r : rows)
        if (r.name == "lavaflow" && r.op == "all_reduce" && r.size >= (16u << 20))
          if (auto* m = find("mpi", "all_reduce", r.size); m)
            targets.push_back({{"name", str_format("all_reduce busbw at {} MiB vs MPI", r.size >> 20)},
                               {"ratio", r.busbw_gbps / m->busbw_gbps},
                               {"target", ">= 1.5"},
                               {"met", r.busbw_gbps >= 1.5 * m->busbw_gbps}});
      if (json) {
        nlohmann::json out = {{"results", nlohmann::json::array()}, {"targets", targets}};
        for (const auto& r : rows)
          out["results"].push_back({{"name", r.name},
                                    {"op", r.op},
                                    {"dtype", "f32"},
                                    {"size", r.size},
                                    {"ranks", r.ranks},
                                    {"p50_ns", r.p50_ns},
                                    {"p99_ns", r.p99_ns},
                                    {"busbw_gbps", r.busbw_gbps}});
        std::puts(out.dump().c_str());
      } else {
        std::printf(
            "lavaflow-bench collectives: %d ranks, f32 (sum), ordinary user memory, native backend vs MPI and Gloo "
            "(NCCL: GPU buffers)\n",
            n);
        std::printf("%-15s %10s %-9s %12s %12s %10s\n", "op", "size", "name", "p50 us", "p99 us", "busbw GB/s");
        for (const auto& r : rows)
          std::printf("%-15s %10llu %-9s %12.2f %12.2f %10.3f\n", r.op.c_str(), static_cast<unsigned long long>(r.size),
                      r.name.c_str(), r.p50_ns / 1e3, r.p99_ns / 1e3, r.busbw_gbps);
        for (const auto& t : targets)
          std::printf("target %s: %.3f (%s) %s\n", t["name"].get<std::string>().c_str(), t["ratio"].get<double>(),
                      t["target"].get<std::string>().c_str(), t["met"].get<bool>() ? "MET" : "NOT MET");
      }
      if (!plot.empty()) {
        std::vector<lfapp::PlotSeries> series;
        for (const char* op : {"all_reduce", "all_gather", "reduce_scatter"})
          for (const char* name : {"lavaflow", "mpi", "gloo", "nccl"}) {
            lfapp::PlotSeries s{str_format("{} {}", name, op), {}, std::string(name) != "lavaflow"};
            for (const auto& r : rows)
              if (r.op == op && r.name == name) s.points.emplace_back(r.size, r.busbw_gbps);
            if (!s.points.empty()) series.push_back(std::move(s));
          }
        if (auto ok = lfapp::plot_vs_size(plot, str_format("collectives, {} ranks", n), "bus bandwidth (GB/s)", series);
            !ok) {
          std::fprintf(stderr, "lavaflow-bench collectives: %s\n", ok.error().message().c_str());
          code = 1;
        }
      }
    }
  }
  MPI_Finalize();
  return code;
}
