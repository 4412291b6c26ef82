// SPDX-License-Identifier: MIT
// lavaflow-bench-remote — run by `lavaflow-bench remote` under `mpiexec -n 2`. In one run, sizes
// 8 B … 4 MiB: raw MPI ping-pong latency (OSU osu_latency method: warm-up, then round trip / 2,
// average and p50) and raw MPI windowed bandwidth (osu_bw: windows of 64 MPI_Isend, one ack per
// window), next to a lava-flow remote channel (route forced to MPI) doing the same. Rank 0 prints a
// table, or with --json {"results":[{"name","kind","size","p50_ns","avg_ns","mb_per_s"}…]}.
#include <mpi.h>

#include "../common/plot.hpp"

#include <algorithm>
#include <bit>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "lavaflow/core/format.hpp"
#include "lavaflow/core/transfer.hpp"
#include "lavaflow/core/vulkan_context.hpp"
#include "lavaflow/mpi/mpi.hpp"

using namespace lavaflow;
using Clock = std::chrono::steady_clock;

namespace {

struct Row {
  std::string name, kind;
  std::uint64_t size = 0;
  double p50_ns = 0, avg_ns = 0, mb_per_s = 0;
};

constexpr int kWindow = 64;
constexpr std::uint64_t kMax = 4u << 20;

int iterations(std::uint64_t size) { return size <= 8192 ? 2000 : size <= (256u << 10) ? 300 : 60; }
int warmup(std::uint64_t size) { return size <= 8192 ? 200 : 10; }
double ns(Clock::duration d) { return std::chrono::duration<double, std::nano>(d).count(); }

Row summarize(std::string name, std::uint64_t size, std::vector<double>& half) {
  std::sort(half.begin(), half.end());
  double avg = 0;
  for (double h : half) avg += h / double(half.size());
  return Row{std::move(name), "latency", size, half[half.size() / 2], avg, 0};
}

Row raw_latency(MPI_Comm comm, int me, std::uint64_t size, std::vector<char>& buf) {
  std::vector<double> half;
  const int it = iterations(size), wu = warmup(size);
  for (int i = 0; i < it + wu; ++i) {
    const auto t0 = Clock::now();
    if (me == 0) {
      MPI_Send(buf.data(), static_cast<int>(size), MPI_BYTE, 1, 1, comm);
      MPI_Recv(buf.data(), static_cast<int>(size), MPI_BYTE, 1, 1, comm, MPI_STATUS_IGNORE);
    } else {
      MPI_Recv(buf.data(), static_cast<int>(size), MPI_BYTE, 0, 1, comm, MPI_STATUS_IGNORE);
      MPI_Send(buf.data(), static_cast<int>(size), MPI_BYTE, 0, 1, comm);
    }
    if (i >= wu) half.push_back(ns(Clock::now() - t0) / 2);
  }
  return summarize("mpi-raw", size, half);
}

Row raw_bandwidth(MPI_Comm comm, int me, std::uint64_t size, std::vector<char>& buf) {
  const int it = std::max(4, iterations(size) / 20), wu = 2;
  MPI_Request req[kWindow];
  char ack = 0;
  Clock::time_point t0;
  for (int i = 0; i < it + wu; ++i) {
    if (i == wu) t0 = Clock::now();
    if (me == 0) {
      for (auto& r : req) MPI_Isend(buf.data(), static_cast<int>(size), MPI_BYTE, 1, 2, comm, &r);
      MPI_Waitall(kWindow, req, MPI_STATUSES_IGNORE);
      MPI_Recv(&ack, 1, MPI_BYTE, 1, 3, comm, MPI_STATUS_IGNORE);
    } else {
      for (auto& r : req) MPI_Irecv(buf.data(), static_cast<int>(size), MPI_BYTE, 0, 2, comm, &r);
      MPI_Waitall(kWindow, req, MPI_STATUSES_IGNORE);
      MPI_Send(&ack, 1, MPI_BYTE, 0, 3, comm);
    }
  }
  const double secs = ns(Clock::now() - t0) / 1e9;
  return Row{"mpi-raw", "bandwidth", size, 0, 0, double(size) * kWindow * it / secs / 1e6};
}

Status lf_latency(const mpi::Communicator& c, std::uint64_t size, Row& out) {
  const int me = c.rank(), it = iterations(size), wu = warmup(size);
  const int ping = 100 + static_cast<int>(std::countr_zero(size)) * 2, pong = ping + 1;
  std::unique_ptr<mpi::RemoteProducer> p;
  std::unique_ptr<mpi::RemoteConsumer> q;
  // A ring a user would pick: deep for small messages (credits then go back once per 32 messages),
  // 2 buffers for large ones (a ping-pong holds one at a time; each new buffer costs MPI a
  // registration and a trip through DRAM).
  const mpi::RemoteOptions o{.slots = size <= 8192 ? 64u : 2u, .slot_size = size, .wait = WaitMode::BusyPoll};
  auto opt = [&](int ch) { auto x = o; x.channel = ch; return x; };
  LF_TRY(p, mpi::RemoteProducer::create(c, 1 - me, opt(me == 0 ? ping : pong)));
  LF_TRY(q, mpi::RemoteConsumer::open(c, 1 - me, opt(me == 0 ? pong : ping)));
  std::vector<double> half;
  for (int i = 0; i < it + wu; ++i) {
    const auto t0 = Clock::now();
    if (me == 0) {
      LF_TRY(auto loan, p->loan(std::chrono::seconds(30)));
      LF_TRY(auto info, p->publish(std::move(loan), {.size = size}));
      (void)info;
      LF_TRY(auto r, q->receive(std::chrono::seconds(30)));
    } else {
      LF_TRY(auto r, q->receive(std::chrono::seconds(30)));
      LF_TRY(auto loan, p->loan(std::chrono::seconds(30)));
      LF_TRY(auto info, p->publish(std::move(loan), {.size = size}));
      (void)info;
    }  // the ping is released after the pong is on its way
    if (i >= wu) half.push_back(ns(Clock::now() - t0) / 2);
  }
  q.reset();  // closing hands back the last credits; then the peer's flush can finish
  LF_TRY_STATUS(p->flush(std::chrono::seconds(30)));
  out = summarize("lavaflow-mpi", size, half);
  return {};
}

/// One channel from rank 0 (producer, `p`) to rank 1 (consumer, `q`).
Status open_one_way(const mpi::Communicator& c, const mpi::RemoteOptions& o, std::unique_ptr<mpi::RemoteProducer>& p,
                    std::unique_ptr<mpi::RemoteConsumer>& q) {
  if (c.rank() == 0) {
    LF_TRY(p, mpi::RemoteProducer::create(c, 1, o));
  } else {
    LF_TRY(q, mpi::RemoteConsumer::open(c, 0, o));
  }
  return {};
}

Status lf_bandwidth(const mpi::Communicator& c, std::uint64_t size, Row& out) {
  const int me = c.rank(), it = std::max(4, iterations(size) / 20), wu = 2;
  const int ch = 1000 + static_cast<int>(std::countr_zero(size));
  // A ring of about 1 MiB (4 to 64 buffers): the buffers stay in cache, as osu_bw's single buffer
  // does; a 64-deep ring of large buffers streams through DRAM at about half the rate here.
  const auto slots = static_cast<std::uint32_t>(std::clamp<std::uint64_t>((1u << 20) / size, 4, kWindow));
  const mpi::RemoteOptions o{.slots = slots, .slot_size = size, .wait = WaitMode::BusyPoll, .channel = ch};
  std::unique_ptr<mpi::RemoteProducer> p;
  std::unique_ptr<mpi::RemoteConsumer> q;
  LF_TRY_STATUS(open_one_way(c, o, p, q));
  char ack = 0;
  Clock::time_point t0;
  for (int i = 0; i < it + wu; ++i) {
    if (i == wu) t0 = Clock::now();
    if (me == 0) {
      for (int k = 0; k < kWindow; ++k) {
        LF_TRY(auto loan, p->loan(std::chrono::seconds(30)));
        LF_TRY(auto info, p->publish(std::move(loan), {.size = size}));
        (void)info;
      }
      MPI_Recv(&ack, 1, MPI_BYTE, 1, 3, c.comm(), MPI_STATUS_IGNORE);
    } else {
      for (int k = 0; k < kWindow; ++k) {
        LF_TRY(auto r, q->receive(std::chrono::seconds(30)));
      }
      MPI_Send(&ack, 1, MPI_BYTE, 0, 3, c.comm());
    }
  }
  const double secs = ns(Clock::now() - t0) / 1e9;
  if (p) LF_TRY_STATUS(p->flush(std::chrono::seconds(30)));
  out = Row{"lavaflow-mpi", "bandwidth", size, 0, 0, double(size) * kWindow * it / secs / 1e6};
  return {};
}

/// GPU buffer to GPU buffer through a remote channel (publish_gpu / receive_gpu): `size`-byte
/// messages staged through pinned ring buffers in `chunk`-sized pieces; chunk == size is the
/// unpipelined baseline (copy all, then send all, then upload all). MB/s on rank 0, after the
/// consumer has every message in its GPU buffer.
Status lf_gpu_staging(const mpi::Communicator& c, const VulkanContext& vk, std::uint64_t size, std::uint64_t chunk, Row& out) {
  const int it = 10, wu = 2;
  const mpi::RemoteOptions o{.slots = 2, .slot_size = size, .wait = WaitMode::BusyPoll,
                             .channel = 2000 + static_cast<int>(std::countr_zero(chunk)), .vulkan = &vk, .chunk = chunk};
  LF_TRY(auto gpu, GpuBuffer::allocate(vk, {.size = size, .memory = GpuMemory::DeviceLocal}));
  std::unique_ptr<mpi::RemoteProducer> p;
  std::unique_ptr<mpi::RemoteConsumer> q;
  LF_TRY_STATUS(open_one_way(c, o, p, q));
  Clock::time_point t0;
  for (int i = 0; i < it + wu; ++i) {
    if (i == wu) {
      if (p) LF_TRY_STATUS(p->flush(std::chrono::seconds(60)));
      MPI_Barrier(c.comm());
      t0 = Clock::now();
    }
    if (p) {
      LF_TRY(auto loan, p->loan(std::chrono::seconds(60)));
      LF_TRY(auto info, p->publish_gpu(std::move(loan), gpu, 0, size, {}));
      (void)info;
    } else {
      LF_TRY(auto info, q->receive_gpu(gpu, 0, std::chrono::seconds(60)));
      (void)info;
    }
  }
  if (p) LF_TRY_STATUS(p->flush(std::chrono::seconds(60)));
  const double secs = ns(Clock::now() - t0) / 1e9;
  out = Row{chunk == size ? "lavaflow-mpi-gpu-unchunked" : str_format("lavaflow-mpi-gpu-chunk-{}KiB", chunk >> 10), "gpu-staging", size, 0, 0,
            double(size) * it / secs / 1e6};
  return {};
}

}  // namespace

int main(int argc, char** argv) {
  MPI_Init(&argc, &argv);
  bool json = false;
  std::string plot;
  std::uint64_t max_size = kMax;
  for (int i = 1; i < argc; ++i) {
    json = json || std::strcmp(argv[i], "--json") == 0;
    if (std::strcmp(argv[i], "--plot") == 0 && i + 1 < argc) plot = argv[++i];
    if (std::strcmp(argv[i], "--max-size") == 0 && i + 1 < argc) max_size = std::clamp<std::uint64_t>(std::strtoull(argv[++i], nullptr, 10), 8, kMax);
  }
  int code = 0;
  {
    auto comm = mpi::Communicator::create();
    if (!comm || comm->size() != 2) {
      std::fprintf(stderr, "lavaflow-bench remote: needs exactly 2 MPI ranks (mpiexec -n 2)\n");
      MPI_Abort(MPI_COMM_WORLD, 2);
    }
    const int me = comm->rank();
    std::vector<char> buf(kMax);
    MPI_Comm raw;
    MPI_Comm_dup(MPI_COMM_WORLD, &raw);
    std::vector<Row> rows;
    for (std::uint64_t size = 8; size <= max_size; size *= 4) {
      MPI_Barrier(raw);
      rows.push_back(raw_latency(raw, me, size, buf));
      Row lf;
      if (auto ok = lf_latency(*comm, size, lf); !ok) {
        std::fprintf(stderr, "rank %d: %s\n", me, ok.error().message().c_str());
        MPI_Abort(MPI_COMM_WORLD, 1);
      }
      rows.push_back(lf);
      MPI_Barrier(raw);
      rows.push_back(raw_bandwidth(raw, me, size, buf));
      if (auto ok = lf_bandwidth(*comm, size, lf); !ok) {
        std::fprintf(stderr, "rank %d: %s\n", me, ok.error().message().c_str());
        MPI_Abort(MPI_COMM_WORLD, 1);
      }
      rows.push_back(lf);
    }
    // GPU staging (when both ranks have a Vulkan device): 64 MiB messages, pipelined chunks vs one piece.
    std::vector<Row> staging;
    {
      auto vk = VulkanContext::create();
      int have = vk ? 1 : 0, both = 0;
      MPI_Allreduce(&have, &both, 1, MPI_INT, MPI_MIN, raw);
      const std::uint64_t gsize = max_size >= (4u << 20) ? 64u << 20 : 16u << 20;
      for (std::uint64_t chunk : {std::uint64_t{1} << 20, std::uint64_t{4} << 20, gsize}) {
        if (!both) continue;
        Row r;
        if (auto ok = lf_gpu_staging(*comm, *vk, gsize, chunk, r); !ok) {
          std::fprintf(stderr, "rank %d: GPU staging: %s\n", me, ok.error().message().c_str());
          MPI_Abort(MPI_COMM_WORLD, 1);
        }
        staging.push_back(r);
      }
    }
    if (me == 0 && !plot.empty()) {  // latency vs size: raw MPI and the lava-flow channel
      std::vector<lfapp::PlotSeries> series{{"mpi-raw p50", {}, true}, {"lavaflow-mpi p50", {}, false}};
      for (const auto& r : rows)
        if (r.kind == "latency") series[r.name == "mpi-raw" ? 0 : 1].points.emplace_back(r.size, r.p50_ns);
      if (auto ok = lfapp::plot_vs_size(plot, "lavaflow-bench remote: one-way latency, route forced to MPI", "p50 latency (ns)", series); !ok) {
        std::fprintf(stderr, "lavaflow-bench remote: %s\n", ok.error().message().c_str());
        code = 1;
      } else {
        std::fprintf(stderr, "lavaflow-bench remote: plot written to %s\n", plot.c_str());
      }
    }
    if (me == 0) {
      if (json) {
        std::printf("{\"results\":[");
        for (std::size_t i = 0; i < rows.size(); ++i)
          std::printf("%s{\"name\":\"%s\",\"kind\":\"%s\",\"size\":%llu,\"p50_ns\":%.1f,\"avg_ns\":%.1f,\"mb_per_s\":%.1f}",
                      i ? "," : "", rows[i].name.c_str(), rows[i].kind.c_str(), static_cast<unsigned long long>(rows[i].size),
                      rows[i].p50_ns, rows[i].avg_ns, rows[i].mb_per_s);
        for (const auto& r : staging)
          std::printf(",{\"name\":\"%s\",\"kind\":\"%s\",\"size\":%llu,\"mb_per_s\":%.1f}", r.name.c_str(), r.kind.c_str(),
                      static_cast<unsigned long long>(r.size), r.mb_per_s);
        std::printf("]}\n");
      } else {
        std::printf("lavaflow-bench remote: 2 ranks, route forced to MPI; latency = round trip / 2 (OSU method), "
                    "bandwidth = windows of %d messages\n", kWindow);
        std::printf("%10s  %12s %12s %7s  %12s %12s %7s  %11s %11s %7s\n", "size", "raw p50 ns", "lf p50 ns", "ratio",
                    "raw avg ns", "lf avg ns", "ratio", "raw MB/s", "lf MB/s", "ratio");
        for (std::size_t i = 0; i + 3 < rows.size(); i += 4) {
          const auto &rl = rows[i], &ll = rows[i + 1], &rb = rows[i + 2], &lb = rows[i + 3];
          std::printf("%10llu  %12.0f %12.0f %7.2f  %12.0f %12.0f %7.2f  %11.0f %11.0f %7.2f\n",
                      static_cast<unsigned long long>(rl.size), rl.p50_ns, ll.p50_ns, ll.p50_ns / rl.p50_ns, rl.avg_ns,
                      ll.avg_ns, ll.avg_ns / rl.avg_ns, rb.mb_per_s, lb.mb_per_s, lb.mb_per_s / rb.mb_per_s);
        }
        std::printf("targets: latency <= 1.10 x raw at 8 B and <= 1.03 x at >= 64 KiB; bandwidth >= 0.95 x raw at >= 64 KiB\n");
        if (!staging.empty()) {
          std::printf("GPU buffer -> GPU buffer through the channel (publish_gpu / receive_gpu, pinned ring buffers):\n");
          for (const auto& r : staging)
            std::printf("  %-30s %llu-byte messages  %9.0f MB/s  (%.2f x unchunked)\n", r.name.c_str(), static_cast<unsigned long long>(r.size),
                        r.mb_per_s, r.mb_per_s / staging.back().mb_per_s);
        }
      }
    }
    MPI_Comm_free(&raw);
  }
  MPI_Finalize();
  return code;
}
