// SPDX-License-Identifier: MIT
// lavaflow-bench-collectives — run by `lavaflow-bench collectives` under `mpiexec -n N`. In one
// run, for every size from 8 B to --max-size (bytes per rank) and every op (all_reduce f32 sum,
// all_gather, reduce_scatter f32 sum): the lava-flow native backend on ordinary user memory and
// the MPI library's own collective (MPI_Allreduce, MPI_Allgather, MPI_Reduce_scatter_block) and,
// where built, Gloo (through lava-flow's Gloo backend), in alternating blocks so that all see the
// same moments of a shared machine. Every call is timed on
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

int calls_for(std::uint64_t size) {
  if (size <= (64u << 10)) return 400;
  if (size <= (4u << 20)) return 40;
  return size <= (64u << 20) ? 6 : 3;
}

struct Buffers {
  std::vector<float> send, recv;
};

/// One call of `op` by lava-flow (comm) or MPI (comm == nullptr); false on an error.
bool once(Op op, Communicator* comm, Buffers& b, std::uint64_t size, int n) {
  const auto count = static_cast<int>(size / 4);
  auto bytes = [](std::vector<float>& v, std::size_t elems) {
    return std::as_writable_bytes(std::span(v.data(), elems));
  };
  const std::size_t c = size / 4;
  if (comm) {
    Work w;
    switch (op) {
      case Op::AllReduce:
        w = comm->all_reduce(bytes(b.send, c), bytes(b.recv, c), DType::F32, ReduceOp::Sum);
        break;
      case Op::AllGather:
        w = comm->all_gather(bytes(b.send, c), bytes(b.recv, c * n), DType::F32);
        break;
      case Op::ReduceScatter:
        w = comm->reduce_scatter(bytes(b.send, c * n), bytes(b.recv, c), DType::F32, ReduceOp::Sum);
        break;
    }
    return w.wait().has_value();
  }
  switch (op) {
    case Op::AllReduce:
      return MPI_Allreduce(b.send.data(), b.recv.data(), count, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD) == MPI_SUCCESS;
    case Op::AllGather:
      return MPI_Allgather(b.send.data(), count, MPI_FLOAT, b.recv.data(), count, MPI_FLOAT, MPI_COMM_WORLD) ==
             MPI_SUCCESS;
    case Op::ReduceScatter:
      return MPI_Reduce_scatter_block(b.send.data(), b.recv.data(), count, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD) ==
             MPI_SUCCESS;
  }
  return false;
}

/// Times `calls` calls, each on every rank; returns the slowest rank's time of each call (rank 0).
bool timed(Op op, Communicator* comm, Buffers& b, std::uint64_t size, int n, int calls, std::vector<double>& out) {
  std::vector<double> mine;
  for (int i = 0; i < calls; ++i) {
    const double t0 = MPI_Wtime();
    if (!once(op, comm, b, size, n)) return false;
    mine.push_back((MPI_Wtime() - t0) * 1e9);
  }
  std::vector<double> slowest(mine.size());
  MPI_Reduce(mine.data(), slowest.data(), static_cast<int>(mine.size()), MPI_DOUBLE, MPI_MAX, 0, MPI_COMM_WORLD);
  out.insert(out.end(), slowest.begin(), slowest.end());
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
    if (std::find(mpi_backends().begin(), mpi_backends().end(), Backend::Gloo) != mpi_backends().end()) {
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
    Buffers b;
    for (std::uint64_t size = 8; size <= max_size;
         size = size * 4 > max_size && size < max_size ? max_size : size * 4) {
      b.send.assign(size / 4 * static_cast<std::uint64_t>(n), 1.0f);
      b.recv.assign(size / 4 * static_cast<std::uint64_t>(n), 0.0f);
      for (Op op : {Op::AllReduce, Op::AllGather, Op::ReduceScatter}) {
        const int calls = calls_for(size);
        std::vector<double> ours, theirs, glooed;
        bool ok = true;
        for (int w = 0; w < 2 && ok; ++w)  // warm-up: pages touched, connections made
          ok = once(op, comm->get(), b, size, n) && once(op, nullptr, b, size, n) &&
               (!gloo || once(op, gloo.get(), b, size, n));
        for (int round = 0; round < 5 && ok; ++round)
          ok = timed(op, comm->get(), b, size, n, std::max(1, calls / 5), ours) &&
               timed(op, nullptr, b, size, n, std::max(1, calls / 5), theirs) &&
               (!gloo || timed(op, gloo.get(), b, size, n, std::max(1, calls / 5), glooed));
        if (!ok) {
          std::fprintf(stderr, "lavaflow-bench collectives: %s of %llu bytes failed\n", op_name(op),
                       static_cast<unsigned long long>(size));
          MPI_Abort(MPI_COMM_WORLD, 1);
        }
        if (rank == 0) {
          rows.push_back(summarize("lavaflow", op, size, n, ours));
          rows.push_back(summarize("mpi", op, size, n, theirs));
          if (gloo) rows.push_back(summarize("gloo", op, size, n, glooed));
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
            "lavaflow-bench collectives: %d ranks, f32 (sum), ordinary user memory, native backend vs MPI and Gloo\n",
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
          for (const char* name : {"lavaflow", "mpi", "gloo"}) {
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
