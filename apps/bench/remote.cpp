// SPDX-License-Identifier: MIT
// lavaflow-bench-remote — run by `lavaflow-bench remote` under `mpiexec -n 2`. In one run, sizes
// 8 B … 4 MiB: raw MPI ping-pong latency (OSU osu_latency method: warm-up, then round trip / 2,
// average and p50) and raw MPI windowed bandwidth (osu_bw: windows of 64 MPI_Isend, one ack per
// window), next to a lava-flow remote channel (route forced to MPI) doing the same. Rank 0 prints a
// table, or with --json {"results":[{"name","kind","size","p50_ns","avg_ns","mb_per_s"}…]}.
#include <mpi.h>
#include <sys/mman.h>

#include <algorithm>
#include <bit>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <nlohmann/json.hpp>
#include <string>
#include <utility>
#include <vector>

#include "cli.hpp"
#include "lavaflow/core/detail/format.hpp"
#include "lavaflow/core/transfer.hpp"
#include "lavaflow/core/vulkan_context.hpp"
#include "lavaflow/mpi/mpi.hpp"
#include "plot.hpp"

using namespace lavaflow;

namespace {

struct Row {
  std::string name, kind;
  std::uint64_t size = 0;
  double p50_ns = 0, avg_ns = 0, mb_per_s = 0;
  std::uint32_t slots = 0;  // the channel's ring (lava-flow bandwidth rows)
};

constexpr int kWindow = 64;
constexpr std::uint64_t kMax = 4u << 20;
// Latency: warm-up, then kRounds blocks of raw MPI and lava-flow in turn — both see the same
// moments of a shared machine, so their ratio holds still while the machine's speed drifts.
constexpr int kRounds = 10;

int block(std::uint64_t size) { return size <= 8192 ? 300 : size <= (256u << 10) ? 40 : 8; }
int warmup(std::uint64_t size) { return size <= 8192 ? 500 : 10; }
double ns(Clock::duration d) { return std::chrono::duration<double, std::nano>(d).count(); }

Row summarize(std::string name, std::uint64_t size, std::vector<double>& half) {
  std::sort(half.begin(), half.end());
  double avg = 0;
  for (double h : half) avg += h / double(half.size());
  return Row{std::move(name), "latency", size, half[half.size() / 2], avg, 0};
}

/// The ring the channel uses for `size`-byte messages in the latency test — a ring a user would
/// pick: deep for small messages (credits then go back once per 32 messages), 2 buffers for large
/// ones (a ping-pong holds one at a time; each new buffer costs MPI a registration and a trip
/// through DRAM).
std::uint32_t latency_slots(std::uint64_t size) { return size <= 8192 ? 64u : 2u; }

/// The ring of the bandwidth test. Up to 1 MiB messages: about `ring_bytes` of buffers
/// (--ring-bytes, default 512 KiB; one buffer at least, 64 at most), so the ring stays in the cache
/// as osu_bw's single buffer does. Larger messages stream through DRAM anyway: two buffers, one
/// copied while the other is handed back. Every buffer of the ring is a distinct piece of memory
/// on both sides, where osu_bw sends from and receives into one buffer each side; the raw "ring"
/// baseline sends the same window through the same number of buffers.
std::uint32_t bandwidth_slots(std::uint64_t size, std::uint64_t ring_bytes) {
  if (size > (1u << 20)) return 2;
  return static_cast<std::uint32_t>(std::clamp<std::uint64_t>(ring_bytes / size, 1, kWindow));
}

/// Raw MPI ping-pong (osu_latency): `n` round trips, half of each appended to `half`.
void raw_pingpong(MPI_Comm comm, int me, std::uint64_t size, std::vector<char>& buf, int n, std::vector<double>* half) {
  for (int i = 0; i < n; ++i) {
    const auto t0 = Clock::now();
    if (me == 0) {
      MPI_Send(buf.data(), static_cast<int>(size), MPI_BYTE, 1, 1, comm);
      MPI_Recv(buf.data(), static_cast<int>(size), MPI_BYTE, 1, 1, comm, MPI_STATUS_IGNORE);
    } else {
      MPI_Recv(buf.data(), static_cast<int>(size), MPI_BYTE, 0, 1, comm, MPI_STATUS_IGNORE);
      MPI_Send(buf.data(), static_cast<int>(size), MPI_BYTE, 0, 1, comm);
    }
    if (half) half->push_back(ns(Clock::now() - t0) / 2);
  }
}

/// The same over two lava-flow channels (ping one way, pong the other): loan, publish, receive.
Status lf_pingpong(int me, Producer& p, Consumer& q, std::uint64_t size, int n, std::vector<double>* half) {
  for (int i = 0; i < n; ++i) {
    const auto t0 = Clock::now();
    if (me == 0) {
      LF_TRY(auto loan, p.loan(std::chrono::seconds(30)));
      LF_TRY(auto info, p.publish(std::move(loan), {.size = size}));
      (void)info;
      LF_TRY(auto r, q.receive(std::chrono::seconds(30)));
    } else {
      LF_TRY(auto r, q.receive(std::chrono::seconds(30)));
      LF_TRY(auto loan, p.loan(std::chrono::seconds(30)));
      LF_TRY(auto info, p.publish(std::move(loan), {.size = size}));
      (void)info;
    }  // the ping is released after the pong is on its way
    if (half) half->push_back(ns(Clock::now() - t0) / 2);
  }
  return {};
}

/// Latency of raw MPI and of a lava-flow channel, measured in alternating blocks.
Status latency(const mpi::Communicator& c, MPI_Comm raw, std::uint64_t size, std::vector<char>& buf, Row& raw_row,
               Row& lf_row) {
  const int me = c.rank();
  const int ping = 100 + static_cast<int>(std::countr_zero(size)) * 2, pong = ping + 1;
  std::unique_ptr<Producer> p;
  std::unique_ptr<Consumer> q;
  const mpi::ChannelOptions o{
      .slots = latency_slots(size), .slot_size = size, .wait = WaitMode::BusyPoll, .transport = TransportKind::Mpi};
  auto opt = [&](int ch) {
    auto x = o;
    x.channel = ch;
    return x;
  };
  LF_TRY(p, mpi::open_producer(c, 1 - me, opt(me == 0 ? ping : pong)));
  LF_TRY(q, mpi::open_consumer(c, 1 - me, opt(me == 0 ? pong : ping)));
  raw_pingpong(raw, me, size, buf, warmup(size), nullptr);
  LF_TRY_STATUS(lf_pingpong(me, *p, *q, size, warmup(size), nullptr));
  std::vector<double> raw_half, lf_half;
  for (int round = 0; round < kRounds; ++round) {
    raw_pingpong(raw, me, size, buf, block(size), &raw_half);
    LF_TRY_STATUS(lf_pingpong(me, *p, *q, size, block(size), &lf_half));
  }
  q.reset();  // closing hands back the last credits; then the peer's flush can finish
  LF_TRY_STATUS(p->flush(std::chrono::seconds(30)));
  raw_row = summarize("mpi-raw", size, raw_half);
  lf_row = summarize("lavaflow-mpi", size, lf_half);
  return {};
}

/// One channel from rank 0 (producer, `p`) to rank 1 (consumer, `q`).
Status open_one_way(const mpi::Communicator& c, const mpi::ChannelOptions& o, std::unique_ptr<Producer>& p,
                    std::unique_ptr<Consumer>& q) {
  if (c.rank() == 0) {
    LF_TRY(p, mpi::open_producer(c, 1, o));
  } else {
    LF_TRY(q, mpi::open_consumer(c, 0, o));
  }
  return {};
}

/// A page-aligned buffer of fresh anonymous memory, touched; `huge`: 2 MiB-aligned and advised into
/// transparent huge pages before the first touch, as the channel's ring is from 256 KiB (memory
/// from the malloc heap may already be in 4 KiB pages, which the advice does not change).
struct PageBuffer {
  UniqueMapping map;  // the whole mapping; `mem` is its first `align`-aligned byte
  char* mem = nullptr;
  explicit PageBuffer(std::uint64_t size, bool huge = false) {
    const std::uint64_t align = huge ? 2u << 20 : 4096u, bytes = (size + align - 1) / align * align;
    void* base = ::mmap(nullptr, bytes + align, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (base == MAP_FAILED) {
      std::perror("lavaflow-bench remote: mmap");
      MPI_Abort(MPI_COMM_WORLD, 1);
    }
    map.reset({static_cast<std::byte*>(base), bytes + align});
    const auto at = reinterpret_cast<std::uintptr_t>(base);
    mem = static_cast<char*>(base) + (align - at % align) % align;
    if (huge) (void)::madvise(mem, bytes, MADV_HUGEPAGE);
    std::memset(mem, 1, bytes);
  }
};

/// One window of raw MPI bandwidth (osu_bw): 64 MPI_Isend / MPI_Irecv, then a 1-byte ack; the k-th
/// message of the window uses buffer k % buffers.size().
void raw_window(MPI_Comm comm, int me, std::uint64_t size, const std::vector<PageBuffer>& buffers) {
  MPI_Request req[kWindow];
  char ack = 0;
  const std::size_t n = buffers.size();
  if (me == 0) {
    for (int k = 0; k < kWindow; ++k)
      MPI_Isend(buffers[k % n].mem, static_cast<int>(size), MPI_BYTE, 1, 2, comm, &req[k]);
    MPI_Waitall(kWindow, req, MPI_STATUSES_IGNORE);
    MPI_Recv(&ack, 1, MPI_BYTE, 1, 3, comm, MPI_STATUS_IGNORE);
  } else {
    for (int k = 0; k < kWindow; ++k)
      MPI_Irecv(buffers[k % n].mem, static_cast<int>(size), MPI_BYTE, 0, 2, comm, &req[k]);
    MPI_Waitall(kWindow, req, MPI_STATUSES_IGNORE);
    MPI_Send(&ack, 1, MPI_BYTE, 0, 3, comm);
  }
}

/// Raw MPI with the channel's flow control (the "credit" baseline): the same ring of buffers, at
/// most one message in flight per buffer, the receiver re-posting each buffer's receive after it
/// completes and returning its cumulative count every half ring (and at the end of the window).
/// What MPI itself gives a producer that may not overwrite a buffer before the consumer is done
/// with it — osu_bw has 64 messages in flight through one buffer each side.
void credit_window(MPI_Comm comm, int me, std::uint64_t size, const std::vector<PageBuffer>& buffers) {
  const std::size_t n = buffers.size();
  std::vector<MPI_Request> req(n, MPI_REQUEST_NULL);
  const std::uint64_t every = std::max<std::uint64_t>(1, n / 2);
  if (me == 0) {
    std::uint64_t credit = 0;
    for (std::uint64_t k = 0; k < kWindow; ++k) {
      while (k - credit >= n) MPI_Recv(&credit, 1, MPI_UINT64_T, 1, 4, comm, MPI_STATUS_IGNORE);
      MPI_Request& r = req[k % n];
      if (r != MPI_REQUEST_NULL) MPI_Wait(&r, MPI_STATUS_IGNORE);
      MPI_Isend(buffers[k % n].mem, static_cast<int>(size), MPI_BYTE, 1, 2, comm, &r);
    }
    MPI_Waitall(static_cast<int>(n), req.data(), MPI_STATUSES_IGNORE);
    while (credit < kWindow) MPI_Recv(&credit, 1, MPI_UINT64_T, 1, 4, comm, MPI_STATUS_IGNORE);
  } else {
    std::vector<std::uint64_t> counts;  // one per credit sent, alive until the window ends
    counts.reserve(kWindow);
    std::vector<MPI_Request> credits;
    for (std::uint64_t k = 0; k < std::min<std::uint64_t>(n, kWindow); ++k)
      MPI_Irecv(buffers[k].mem, static_cast<int>(size), MPI_BYTE, 0, 2, comm, &req[k]);
    for (std::uint64_t k = 0; k < kWindow; ++k) {
      MPI_Wait(&req[k % n], MPI_STATUS_IGNORE);
      if (k + n < kWindow) MPI_Irecv(buffers[k % n].mem, static_cast<int>(size), MPI_BYTE, 0, 2, comm, &req[k % n]);
      if ((k + 1) % every == 0 || k + 1 == kWindow) {
        counts.push_back(k + 1);
        credits.emplace_back();
        MPI_Isend(&counts.back(), 1, MPI_UINT64_T, 0, 4, comm, &credits.back());
      }
    }
    MPI_Waitall(static_cast<int>(credits.size()), credits.data(), MPI_STATUSES_IGNORE);
  }
}

/// The same window through a lava-flow channel (rank 0 publishes 64 messages, rank 1 receives them).
Status lf_window(MPI_Comm comm, Producer* p, Consumer* q, std::uint64_t size) {
  char ack = 0;
  if (p) {
    for (int k = 0; k < kWindow; ++k) {
      LF_TRY(auto loan, p->loan(std::chrono::seconds(30)));
      LF_TRY(auto info, p->publish(std::move(loan), {.size = size}));
      (void)info;
    }
    MPI_Recv(&ack, 1, MPI_BYTE, 1, 3, comm, MPI_STATUS_IGNORE);
  } else {
    for (int k = 0; k < kWindow; ++k) {
      LF_TRY(auto r, q->receive(std::chrono::seconds(30)));
    }
    MPI_Send(&ack, 1, MPI_BYTE, 0, 3, comm);
  }
  return {};
}

/// Windowed bandwidth, in kBandwidthRounds rounds; each round times raw MPI with one buffer a side
/// (osu_bw), raw MPI through a ring of distinct buffers (as many as the channel's), the channel,
/// raw MPI with one buffer a side in huge pages, and raw MPI through the ring with the channel's
/// flow control, one after the other. Each figure is the median over the rounds. Rows: mpi-raw,
/// mpi-raw-ring, lavaflow-mpi, mpi-raw-hugepages, mpi-raw-credit.
constexpr int kBandwidthRounds = 5, kBandwidthRows = 5;
Status bandwidth(const mpi::Communicator& c, MPI_Comm raw, std::uint64_t size, std::uint64_t ring_bytes, Row* rows) {
  const int me = c.rank();
  const int windows = size <= 8192 ? 20 : size <= (256u << 10) ? 5 : 2;
  const std::uint32_t slots = bandwidth_slots(size, ring_bytes);
  const mpi::ChannelOptions o{.slots = slots,
                              .slot_size = size,
                              .wait = WaitMode::BusyPoll,
                              .channel = 1000 + static_cast<int>(std::countr_zero(size)),
                              .transport = TransportKind::Mpi};
  std::unique_ptr<Producer> p;
  std::unique_ptr<Consumer> q;
  LF_TRY_STATUS(open_one_way(c, o, p, q));
  std::vector<PageBuffer> one, ring, huge;
  one.emplace_back(size);
  huge.emplace_back(size, true);
  for (std::uint32_t k = 0; k < slots; ++k) ring.emplace_back(size);
  std::vector<double> rates[kBandwidthRows];
  for (int round = -1; round < kBandwidthRounds; ++round) {  // round -1: warm-up
    for (int which = 0; which < kBandwidthRows; ++which) {
      MPI_Barrier(raw);
      const auto t0 = Clock::now();
      for (int w = 0; w < windows; ++w) {
        if (which == 2)
          LF_TRY_STATUS(lf_window(raw, p.get(), q.get(), size));
        else if (which == 4)
          credit_window(raw, me, size, ring);
        else
          raw_window(raw, me, size, which == 0 ? one : which == 1 ? ring : huge);
      }
      if (round >= 0) rates[which].push_back(double(size) * kWindow * windows / (ns(Clock::now() - t0) / 1e9) / 1e6);
    }
  }
  if (p) LF_TRY_STATUS(p->flush(std::chrono::seconds(30)));
  for (auto& r : rates) std::sort(r.begin(), r.end());
  auto median = [&](int which) { return rates[which][kBandwidthRounds / 2]; };
  const char* names[kBandwidthRows] = {"mpi-raw", "mpi-raw-ring", "lavaflow-mpi", "mpi-raw-hugepages",
                                       "mpi-raw-credit"};
  for (int which = 0; which < kBandwidthRows; ++which)
    rows[which] = Row{names[which], "bandwidth", size, 0, 0, median(which), which == 2 ? slots : 0};
  return {};
}

/// GPU buffer to GPU buffer through a remote channel (publish_gpu / receive_gpu): `size`-byte
/// messages staged through pinned ring buffers in `chunk`-sized pieces; chunk == size is the
/// unpipelined baseline (copy all, then send all, then upload all). MB/s on rank 0, after the
/// consumer has every message in its GPU buffer.
Status lf_gpu_staging(const mpi::Communicator& c, const VulkanContext& vk, std::uint64_t size, std::uint64_t chunk,
                      Row& out) {
  const int it = 10, wu = 2;
  const mpi::ChannelOptions o{.slots = 2,
                              .slot_size = size,
                              .wait = WaitMode::BusyPoll,
                              .channel = 2000 + static_cast<int>(std::countr_zero(chunk)),
                              .transport = TransportKind::Mpi,
                              .vulkan = &vk,
                              .chunk = chunk};
  LF_TRY(auto gpu, GpuBuffer::allocate(vk, {.size = size, .memory = GpuMemory::DeviceLocal}));
  std::unique_ptr<Producer> p;
  std::unique_ptr<Consumer> q;
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
      LF_TRY(auto info, mpi::publish_gpu(*p, std::move(loan), gpu, 0, size, {}));
      (void)info;
    } else {
      LF_TRY(auto info, mpi::receive_gpu(*q, gpu, 0, std::chrono::seconds(60)));
      (void)info;
    }
  }
  if (p) LF_TRY_STATUS(p->flush(std::chrono::seconds(60)));
  const double secs = ns(Clock::now() - t0) / 1e9;
  out = Row{chunk == size ? "lavaflow-mpi-gpu-unchunked" : str_format("lavaflow-mpi-gpu-chunk-{}KiB", chunk >> 10),
            "gpu-staging",
            size,
            0,
            0,
            double(size) * it / secs / 1e6};
  return {};
}

}  // namespace

int main(int argc, char** argv) {
  MPI_Init(&argc, &argv);
  bool json = false, no_staging = false;
  std::string plot;
  std::uint64_t max_size = kMax, ring_bytes = 512u << 10;
  CLI::App app{"lavaflow-bench-remote: lavaflow-bench remote's MPI program (run it as lavaflow-bench remote)",
               "lavaflow-bench remote"};
  lfapp::add_whole(app, "--max-size", max_size, "largest message", 8, kMax);
  lfapp::add_whole(app, "--ring-bytes", ring_bytes, "bytes of the raw-MPI ring baseline", 8, 1u << 30);
  app.add_flag("--no-staging", no_staging, "skip the GPU-buffer staging rows");
  app.add_flag("--json", json, "JSON rows");
  app.add_option("--plot", plot, "latency against size (PNG, gnuplot)");
  if (auto rc = lfapp::parse(app, argc, argv)) {
    MPI_Finalize();
    return *rc;
  }
  const bool staging = !no_staging;
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
    // Per size: raw latency, lf latency, then bandwidth: raw, raw ring, lf, raw in huge pages, raw with credits.
    std::vector<Row> rows;
    // 8 B … 8 KiB by fours, then every power of two to 4 MiB (the targets start at 64 KiB).
    for (std::uint64_t size = 8; size <= max_size; size *= size < 8192 ? 4 : 2) {
      MPI_Barrier(raw);
      Row r[2 + kBandwidthRows];
      auto ok = latency(*comm, raw, size, buf, r[0], r[1]);
      if (ok) ok = bandwidth(*comm, raw, size, ring_bytes, r + 2);
      if (!ok) {
        std::fprintf(stderr, "rank %d: %s\n", me, ok.error().message().c_str());
        MPI_Abort(MPI_COMM_WORLD, 1);
      }
      rows.insert(rows.end(), r, r + 2 + kBandwidthRows);
    }
    // GPU staging (when both ranks have a Vulkan device): 64 MiB messages, pipelined chunks vs one piece.
    std::vector<Row> staged;
    if (staging) {
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
        staged.push_back(r);
      }
    }
    if (me == 0 && !plot.empty()) {  // latency vs size: raw MPI and the lava-flow channel
      std::vector<lfapp::PlotSeries> series{{"mpi-raw p50", {}, true}, {"lavaflow-mpi p50", {}, false}};
      for (const auto& r : rows)
        if (r.kind == "latency") series[r.name == "mpi-raw" ? 0 : 1].points.emplace_back(r.size, r.p50_ns);
      if (auto ok = lfapp::plot_vs_size(plot, "lavaflow-bench remote: one-way latency, route forced to MPI",
                                        "p50 latency (ns)", series);
          !ok) {
        std::fprintf(stderr, "lavaflow-bench remote: %s\n", ok.error().message().c_str());
        code = 1;
      } else {
        std::fprintf(stderr, "lavaflow-bench remote: plot written to %s\n", plot.c_str());
      }
    }
    if (me == 0) {
      if (json) {
        nlohmann::ordered_json j{{"results", nlohmann::ordered_json::array()}};
        for (const auto& r : rows)
          j["results"].push_back({{"name", r.name},
                                  {"kind", r.kind},
                                  {"size", r.size},
                                  {"p50_ns", r.p50_ns},
                                  {"avg_ns", r.avg_ns},
                                  {"mb_per_s", r.mb_per_s}});
        for (const auto& r : staged)
          j["results"].push_back({{"name", r.name}, {"kind", r.kind}, {"size", r.size}, {"mb_per_s", r.mb_per_s}});
        std::puts(j.dump().c_str());
      } else {
        std::printf(
            "lavaflow-bench remote: 2 ranks, route forced to MPI; latency = round trip / 2 (OSU method, ns), raw and "
            "lf "
            "in %d alternating blocks; bandwidth = windows of %d messages (median of %d rounds): raw = one buffer a "
            "side "
            "(osu_bw), ring = raw MPI through as many distinct buffers as the channel's ring, huge = osu_bw from a "
            "buffer in huge pages, "
            "credit = raw MPI through the ring with the channel's flow control (at most one message in flight per "
            "buffer)\n",
            kRounds, kWindow, kBandwidthRounds);
        std::printf("%8s  %10s %10s %6s  %10s %10s %6s  %9s %9s %9s %9s %9s %6s %6s %6s %7s %5s\n", "size", "raw p50",
                    "lf p50", "ratio", "raw avg", "lf avg", "ratio", "raw MB/s", "ring MB/s", "huge MB/s", "cred MB/s",
                    "lf MB/s", "/raw", "/ring", "/huge", "/credit", "slots");
        constexpr std::size_t kPer = 2 + kBandwidthRows;
        for (std::size_t i = 0; i + kPer <= rows.size(); i += kPer) {
          const auto &rl = rows[i], &ll = rows[i + 1], &rb = rows[i + 2], &gb = rows[i + 3], &lb = rows[i + 4],
                     &hb = rows[i + 5], &cb = rows[i + 6];
          std::printf(
              "%8llu  %10.0f %10.0f %6.2f  %10.0f %10.0f %6.2f  %9.0f %9.0f %9.0f %9.0f %9.0f %6.2f %6.2f %6.2f %7.2f "
              "%5u\n",
              static_cast<unsigned long long>(rl.size), rl.p50_ns, ll.p50_ns, ll.p50_ns / rl.p50_ns, rl.avg_ns,
              ll.avg_ns, ll.avg_ns / rl.avg_ns, rb.mb_per_s, gb.mb_per_s, hb.mb_per_s, cb.mb_per_s, lb.mb_per_s,
              lb.mb_per_s / rb.mb_per_s, lb.mb_per_s / gb.mb_per_s, lb.mb_per_s / hb.mb_per_s,
              lb.mb_per_s / cb.mb_per_s, lb.slots);
        }
        std::printf(
            "targets: latency <= 1.10 x raw at 8 B and <= 1.03 x at >= 64 KiB; bandwidth >= 0.95 x raw at >= 64 KiB\n");
        if (!staged.empty()) {
          std::printf(
              "GPU buffer -> GPU buffer through the channel (publish_gpu / receive_gpu, pinned ring buffers):\n");
          for (const auto& r : staged)
            std::printf("  %-30s %llu-byte messages  %9.0f MB/s  (%.2f x unchunked)\n", r.name.c_str(),
                        static_cast<unsigned long long>(r.size), r.mb_per_s, r.mb_per_s / staged.back().mb_per_s);
        }
      }
    }
    MPI_Comm_free(&raw);
  }
  MPI_Finalize();
  return code;
}
