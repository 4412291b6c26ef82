// SPDX-License-Identifier: MIT
// lavaflow-bench p2p — GB/s from GPU 0 to GPU 1, per size, three ways measured in one run:
//   p2p-lavaflow          a channel: a producer process on GPU 0 publishes ring buffers in GPU 0's
//                         memory; the consumer process imports each ring buffer into CUDA once and
//                         copies every message into its buffer on GPU 1 over the peer link, two
//                         copies in flight, releasing each message as its copy ends — the data
//                         never touches host memory. The copy runs on GPU 0 and writes GPU 1's
//                         memory: Vulkan memory imported into CUDA is mapped for its own device
//                         only, so GPU 1 cannot read it directly (a copy issued from GPU 1 goes
//                         through the host). Variant "copy-engine": cudaMemcpyPeerAsync on a
//                         GPU 0 stream; variant "kernel": a copy kernel on GPU 0; variant
//                         "gpu-ordered": cuda::ChannelImports::copy_to_peer, the copy ordered on
//                         the GPUs (waiting for the message and releasing its slot there), so
//                         no host thread waits for a copy.
//   p2p-cuda-memcpy-peer  cudaMemcpyPeerAsync between two cudaMalloc buffers inside one process
//                         with peer access on, the faster of a GPU 0 and a GPU 1 stream: the
//                         floor of the link
//   p2p-host-staged       the same bytes through pinned host memory, in chunks on two streams
//                         (device-to-host of one chunk overlapping host-to-device of the last)
//   p2p-unified           a UnifiedBytes on GPU 0 with a side on GPU 1 (cuda::PeerSide), written
//                         on GPU 0 and read on GPU 1 in turn: every acquire pulls the buffer over
//                         the link, ordered on the GPUs by the buffer's timeline and CUDA events
//                         (the write is an empty access kept on a GPU 0 stream, so no host thread
//                         waits between transfers)
// Each row moves the same number of transfers after a warm-up; GB/s = bytes / wall time.
#include "p2p.hpp"

#include <sys/socket.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <deque>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "cuda_kernels.hpp"
#include "gpu_common.hpp"
#include "lavaflow/lavaflow.hpp"

namespace lfbench {

namespace {

using Clock = std::chrono::steady_clock;

struct P2PRow {
  std::string name, variant;
  std::uint64_t size = 0;
  int transfers = 0;
  double gbps = 0;
};

/// Transfers per row: about 4 GiB moved, at least 4.
int transfers_for(std::uint64_t size) {
  return static_cast<int>(std::clamp<std::uint64_t>((4ull << 30) / size, 4, 400));
}
/// Unmeasured transfers first (imports, first touches, clocks up).
constexpr int kWarmup = 3;

double gbps(std::uint64_t size, int transfers, Clock::duration d) {
  return double(size) * transfers / double(std::chrono::nanoseconds(d).count());
}

struct Pinned {
  void* p = nullptr;
  Pinned() = default;
  Pinned(const Pinned&) = delete;
  Pinned& operator=(const Pinned&) = delete;
  ~Pinned() {
    if (p) cudaFreeHost(p);
  }
};

/// The faster of the copy issued on GPU 0 (push) and on GPU 1 (pull).
Result<P2PRow> memcpy_peer(std::uint64_t size, int transfers) {
  DeviceMemory src, dst;
  GPU_OK(cudaSetDevice(0));
  LF_TRY_STATUS(allocate(src, size));
  GPU_OK(cudaSetDevice(1));
  LF_TRY_STATUS(allocate(dst, size));
  P2PRow best{"p2p-cuda-memcpy-peer", "", size, transfers, 0};
  for (int device : {0, 1}) {
    GPU_OK(cudaSetDevice(device));
    StreamOwner s;
    LF_TRY_STATUS(create(s));
    for (int i = 0; i < kWarmup; ++i) GPU_OK(cudaMemcpyPeerAsync(dst.p, 1, src.p, 0, size, s.s));
    GPU_OK(cudaStreamSynchronize(s.s));
    const auto t0 = Clock::now();
    for (int i = 0; i < transfers; ++i) GPU_OK(cudaMemcpyPeerAsync(dst.p, 1, src.p, 0, size, s.s));
    GPU_OK(cudaStreamSynchronize(s.s));
    const double g = gbps(size, transfers, Clock::now() - t0);
    if (g > best.gbps) {
      best.gbps = g;
      best.variant = device == 0 ? "push" : "pull";
    }
  }
  return best;
}

Result<P2PRow> host_staged(std::uint64_t size, int transfers) {
  const std::uint64_t chunk = std::min<std::uint64_t>(size, 8u << 20);
  DeviceMemory src, dst;
  Pinned pinned[2];
  StreamOwner down, up;  // device → host on GPU 0, host → device on GPU 1
  EventOwner copied_out[2], copied_in[2];
  GPU_OK(cudaSetDevice(0));
  LF_TRY_STATUS(allocate(src, size));
  LF_TRY_STATUS(create(down));
  for (auto& e : copied_out) GPU_OK(cudaEventCreateWithFlags(&e.e, cudaEventDisableTiming));
  GPU_OK(cudaSetDevice(1));
  LF_TRY_STATUS(allocate(dst, size));
  LF_TRY_STATUS(create(up));
  for (auto& e : copied_in) GPU_OK(cudaEventCreateWithFlags(&e.e, cudaEventDisableTiming));
  for (auto& p : pinned) GPU_OK(cudaMallocHost(&p.p, chunk));
  bool used[2] = {false, false};
  std::uint64_t k = 0;
  auto transfer = [&]() -> Status {
    for (std::uint64_t off = 0; off < size; off += chunk, ++k) {
      const std::uint64_t len = std::min(chunk, size - off), b = k % 2;
      GPU_OK(cudaSetDevice(0));
      if (used[b]) GPU_OK(cudaStreamWaitEvent(down.s, copied_in[b].e, 0));  // the buffer's last upload is done
      GPU_OK(cudaMemcpyAsync(pinned[b].p, static_cast<char*>(src.p) + off, len, cudaMemcpyDeviceToHost, down.s));
      GPU_OK(cudaEventRecord(copied_out[b].e, down.s));
      GPU_OK(cudaSetDevice(1));
      GPU_OK(cudaStreamWaitEvent(up.s, copied_out[b].e, 0));
      GPU_OK(cudaMemcpyAsync(static_cast<char*>(dst.p) + off, pinned[b].p, len, cudaMemcpyHostToDevice, up.s));
      GPU_OK(cudaEventRecord(copied_in[b].e, up.s));
      used[b] = true;
    }
    return {};
  };
  for (int i = 0; i < kWarmup; ++i) LF_TRY_STATUS(transfer());
  GPU_OK(cudaStreamSynchronize(up.s));
  const auto t0 = Clock::now();
  for (int i = 0; i < transfers; ++i) LF_TRY_STATUS(transfer());
  GPU_OK(cudaStreamSynchronize(up.s));
  return P2PRow{"p2p-host-staged", "copy-engine", size, transfers, gbps(size, transfers, Clock::now() - t0)};
}

/// What the consumer process reports: nanoseconds over the measured transfers.
struct PeerReport {
  std::int64_t ns = 0;
  std::int32_t transfers = 0;
};

/// How the channel's consumer moves each message to GPU 1 (the p2p-lavaflow variants).
enum class P2PCopy { CopyEngine, Kernel, GpuOrdered };

const char* variant_of(P2PCopy how) {
  return how == P2PCopy::Kernel ? "kernel" : how == P2PCopy::GpuOrdered ? "gpu-ordered" : "copy-engine";
}

Result<P2PRow> lavaflow_p2p(const VulkanContext& vk0, std::uint64_t size, int transfers, P2PCopy how) {
  constexpr const char* call = "p2p-lavaflow";
  TempDir dir;
  if (dir.path().empty()) return std::unexpected(from_errno(errno, "mkdtemp"));
  int sv[2];
  if (::socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv) != 0)
    return std::unexpected(from_errno(errno, "socketpair"));
  UniqueFd mine(sv[0]), theirs(sv[1]);
  const int total = transfers + kWarmup;
  Peer peer(spawn_self({"lavaflow-bench", "p2p-peer", variant_of(how), dir.path(), std::to_string(size),
                        std::to_string(total), std::to_string(theirs.get())},
                       theirs.get()));
  theirs.reset();
  if (!peer.started()) return fail(Errc::System, "posix_spawn", "cannot start the peer process");
  // gpu-ordered: the producer's side is ordered on GPU 0 too, as a producer that writes with CUDA
  // would be: its stream waits for the consumer's release of a slot and signals the message (no
  // writes: the bytes are the ring's), and no host thread waits for a GPU.
  const bool ordered = how == P2PCopy::GpuOrdered;
  LF_TRY(auto out, Producer::create("p2p", {.slots = 4,
                                            .slot_size = size,
                                            .host_wait_for_gpu_release = !ordered,
                                            .transport = TransportKind::Vulkan,
                                            .vulkan = &vk0,
                                            .directory = dir.path()}));
  LF_TRY_STATUS(out->wait_for_consumers(1, 60s));
  std::optional<cuda::Interop> cu0;
  std::optional<cuda::ChannelImports> imports;
  StreamOwner s;
  if (ordered) {
    LF_TRY(cu0, cuda::Interop::create(vk0));
    imports.emplace(*cu0);
    GPU_OK(cudaSetDevice(0));
    LF_TRY_STATUS(create(s));
  }
  for (int i = 0; i < total; ++i) {
    LF_TRY(auto loan, out->loan(60s));
    if (ordered) {
      LF_TRY_STATUS(imports->wait(s.s, loan));
      LF_TRY_STATUS(imports->signal(s.s, loan));
    }
    LF_TRY(auto info, out->publish(std::move(loan), {.size = size}));
    (void)info;
  }
  if (ordered) GPU_OK(cudaStreamSynchronize(s.s));
  LF_TRY_STATUS(out->flush(120s));
  PeerReport r;
  const timeval wait_at_most{.tv_sec = 120, .tv_usec = 0};  // a consumer stuck on its GPU
  (void)::setsockopt(mine.get(), SOL_SOCKET, SO_RCVTIMEO, &wait_at_most, sizeof wait_at_most);
  if (::recv(mine.get(), &r, sizeof r, MSG_WAITALL) != sizeof r)
    return fail(Errc::PeerLost, call, "the consumer process sent no report");
  imports.reset();  // before the channel it imported from
  out.reset();
  LF_TRY_STATUS(peer.join(call));
  if (r.ns <= 0 || r.transfers != transfers) return fail(Errc::Malformed, call, "the consumer's report is wrong");
  return P2PRow{"p2p-lavaflow", variant_of(how), size, transfers, double(size) * transfers / double(r.ns)};
}

Result<P2PRow> unified_pull(const VulkanContext& vk0, std::uint64_t size, int transfers) {
  LF_TRY(auto cu0, cuda::Interop::create(vk0));
  LF_TRY(auto u, UnifiedBytes::create(vk0, size));
  if (!u.shareable_timeline())
    return fail(Errc::Unsupported, "p2p-unified", "the Vulkan driver cannot export the buffer's timeline");
  LF_TRY(auto timeline, cu0.import_semaphore(*u.shareable_timeline()));
  LF_TRY(auto side, cuda::PeerSide::create(cu0, u, 1));
  StreamOwner s0, s1;
  GPU_OK(cudaSetDevice(0));
  LF_TRY_STATUS(create(s0));
  GPU_OK(cudaSetDevice(1));
  LF_TRY_STATUS(create(s1));
  auto once = [&]() -> Status {
    LF_TRY(const auto write, u.device(Access::Write));
    LF_TRY_STATUS(timeline.wait(s0.s, write.wait.value));
    LF_TRY_STATUS(timeline.signal(s0.s, write.signal.value));
    LF_TRY_STATUS(side.acquire(s1.s, Access::Read));
    return side.release(s1.s);
  };
  for (int i = 0; i < kWarmup; ++i) LF_TRY_STATUS(once());
  GPU_OK(cudaStreamSynchronize(s1.s));
  LF_TRY_STATUS(u.synchronize());
  const auto t0 = Clock::now();
  for (int i = 0; i < transfers; ++i) LF_TRY_STATUS(once());
  GPU_OK(cudaStreamSynchronize(s1.s));
  LF_TRY_STATUS(u.synchronize());
  const auto elapsed = Clock::now() - t0;
  if (side.pulls() != static_cast<std::uint64_t>(transfers + kWarmup))
    return fail(Errc::Internal, "p2p-unified",
                str_format("{} pulls for {} transfers", side.pulls(), transfers + kWarmup));
  return P2PRow{"p2p-unified", "pull", size, transfers, gbps(size, transfers, elapsed)};
}

Status lavaflow_p2p_peer(P2PCopy how, const std::string& dir, std::uint64_t size, int total, int fd) {
  constexpr const char* call = "p2p-lavaflow consumer";
  LF_TRY(auto devs, cuda::devices());
  if (devs.size() < 2) return fail(Errc::NotFound, call, "fewer than two CUDA devices");
  // The ring lives in GPU 0's memory: import it there; GPU 0 writes it into GPU 1's memory.
  LF_TRY(auto vk0, VulkanContext::create({.device = devs[0].uuid}));
  LF_TRY(auto cu0, cuda::Interop::create(vk0));
  LF_TRY_STATUS(cuda::enable_peer_access(0, 1));
  const bool ordered = how == P2PCopy::GpuOrdered;
  LF_TRY(
      auto in,
      Consumer::open("p2p", {.host_wait_for_gpu = !ordered, .connect_timeout = 60s, .vulkan = &vk0, .directory = dir}));
  cuda::ChannelImports imports(cu0);
  DeviceMemory dst;
  StreamOwner s, s1;
  GPU_OK(cudaSetDevice(1));
  LF_TRY_STATUS(allocate(dst, size));
  LF_TRY_STATUS(create(s1));
  GPU_OK(cudaSetDevice(0));
  LF_TRY_STATUS(create(s));
  // The transfers after the warm-up, timed from `t0` to now.
  auto send_report = [&](Clock::time_point t0) -> Status {
    const PeerReport report{std::chrono::nanoseconds(Clock::now() - t0).count(), total - kWarmup};
    if (::send(fd, &report, sizeof report, MSG_NOSIGNAL) != sizeof report)
      return std::unexpected(from_errno(errno, "send"));
    return {};
  };
  if (ordered) {
    // Every copy waits for its message and releases its slot on GPU 0's stream; GPU 1's stream
    // waits for the copies. No host thread waits until the end.
    Clock::time_point t0{};
    for (int i = 0; i < total; ++i) {
      if (i == kWarmup) {
        GPU_OK(cudaStreamSynchronize(s.s));
        t0 = Clock::now();
      }
      LF_TRY(auto r, in->receive(60s));
      LF_TRY_STATUS(imports.copy_to_peer(s.s, r, dst.p, size, 1, s1.s));
    }
    GPU_OK(cudaSetDevice(1));
    GPU_OK(cudaStreamSynchronize(s1.s));
    return send_report(t0);
  }
  struct InFlight {
    Received message;
    EventOwner done;
  };
  std::deque<InFlight> inflight;
  auto retire = [&]() -> Status {
    GPU_OK(cudaEventSynchronize(inflight.front().done.e));
    inflight.pop_front();  // the message goes back to the producer
    return {};
  };
  Clock::time_point t0{};
  for (int i = 0; i < total; ++i) {
    if (i == kWarmup) {
      while (!inflight.empty()) LF_TRY_STATUS(retire());
      t0 = Clock::now();
    }
    LF_TRY(auto r, in->receive(60s));
    LF_TRY(const auto* src, imports.buffer(r));
    GPU_OK(cudaSetDevice(0));
    auto& f = inflight.emplace_back(InFlight{std::move(r), {}});
    GPU_OK(cudaEventCreateWithFlags(&f.done.e, cudaEventDisableTiming));
    if (how == P2PCopy::Kernel)
      GPU_OK(lf_kernel_copy16(dst.p, src->data(), size, s.s));
    else
      GPU_OK(cudaMemcpyPeerAsync(dst.p, 1, src->data(), 0, size, s.s));
    GPU_OK(cudaEventRecord(f.done.e, s.s));
    if (inflight.size() > 2) LF_TRY_STATUS(retire());
  }
  while (!inflight.empty()) LF_TRY_STATUS(retire());
  return send_report(t0);
}

}  // namespace

int bench_p2p(const P2POptions& o) {
  auto devs = cuda::devices();
  if (!devs || devs->size() < 2) {
    std::printf("lavaflow-bench p2p: skipped, needs two CUDA devices (%s)\n",
                devs ? str_format("{} found", devs->size()).c_str() : devs.error().message().c_str());
    return 77;
  }
  auto links = cuda::peer_links();
  if (!links) return std::fprintf(stderr, "lavaflow-bench p2p: %s\n", links.error().message().c_str()), 1;
  const auto& l01 = *std::ranges::find_if(*links, [](const auto& l) { return l.from == 0 && l.to == 1; });
  const auto& l10 = *std::ranges::find_if(*links, [](const auto& l) { return l.from == 1 && l.to == 0; });
  if (!l01.access || !l10.access) {
    std::printf("lavaflow-bench p2p: skipped, GPUs 0 and 1 have no peer access (%s)\n", l01.pcie_meet.c_str());
    return 77;
  }
  for (auto [a, b] : {std::pair{0, 1}, std::pair{1, 0}})
    if (auto ok = cuda::enable_peer_access(a, b); !ok)
      return std::fprintf(stderr, "lavaflow-bench p2p: %s\n", ok.error().message().c_str()), 1;
  auto vk0 = VulkanContext::create({.device = (*devs)[0].uuid});
  if (!vk0) return std::fprintf(stderr, "lavaflow-bench p2p: %s\n", vk0.error().message().c_str()), 1;
  std::vector<P2PRow> rows;
  for (std::uint64_t size = o.min_size; size <= o.max_size; size *= 4) {
    const int n = transfers_for(size);
    for (auto row : {lavaflow_p2p(*vk0, size, n, P2PCopy::CopyEngine), memcpy_peer(size, n), host_staged(size, n),
                     lavaflow_p2p(*vk0, size, n, P2PCopy::Kernel), unified_pull(*vk0, size, n),
                     lavaflow_p2p(*vk0, size, n, P2PCopy::GpuOrdered)}) {
      if (!row) return std::fprintf(stderr, "lavaflow-bench p2p: %s\n", row.error().message().c_str()), 1;
      rows.push_back(std::move(*row));
    }
  }
  // The target: across processes ≥ 0.95 × cudaMemcpyPeer inside one process at ≥ 64 MiB.
  nlohmann::json targets = nlohmann::json::array();
  for (std::size_t i = 0; i + 5 < rows.size(); i += 6) {
    const double ratio = rows[i].gbps / rows[i + 1].gbps;
    targets.push_back({{"name", str_format("p2p-lavaflow / p2p-cuda-memcpy-peer at {} B", rows[i].size)},
                       {"size", rows[i].size},
                       {"ratio", ratio},
                       {"vs_host_staged", rows[i].gbps / rows[i + 2].gbps},
                       {"kernel_ratio", rows[i + 3].gbps / rows[i + 1].gbps},
                       {"unified_ratio", rows[i + 4].gbps / rows[i + 1].gbps},
                       {"ordered_ratio", rows[i + 5].gbps / rows[i + 1].gbps},
                       {"target", rows[i].size >= (64u << 20) ? ">= 0.95" : "none"},
                       {"met", rows[i].size < (64u << 20) || ratio >= 0.95}});
  }
  const std::string path =
      str_format("{} ({} both ways: {})", cuda::to_string(l01.path), l01.native_atomics ? "atomics" : "no atomics",
                 l01.pcie_meet.empty() ? "PCIe route unknown" : "PCIe meet at " + l01.pcie_meet);
  if (o.json) {
    nlohmann::json out = {{"link", path}, {"results", nlohmann::json::array()}, {"targets", targets}};
    for (const auto& r : rows)
      out["results"].push_back(
          {{"name", r.name}, {"variant", r.variant}, {"size", r.size}, {"transfers", r.transfers}, {"gbps", r.gbps}});
    std::puts(out.dump().c_str());
    return 0;
  }
  std::printf("lavaflow-bench p2p: GPU 0 (%s) -> GPU 1 (%s), link %s, performance rank %d\n", (*devs)[0].name.c_str(),
              (*devs)[1].name.c_str(), path.c_str(), l01.performance_rank);
  std::printf("%-22s %-12s %12s %10s %10s\n", "name", "variant", "size", "transfers", "GB/s");
  for (const auto& r : rows)
    std::printf("%-22s %-12s %12llu %10d %10.2f\n", r.name.c_str(), r.variant.c_str(),
                static_cast<unsigned long long>(r.size), r.transfers, r.gbps);
  std::printf("\nTargets (ratios within this run)\n");
  for (const auto& t : targets)
    std::printf("  %-55s %7.3f  %s  (%.1f x host-staged; kernel variant %.3f; unified buffer %.3f; gpu-ordered %.3f)\n",
                t["name"].get<std::string>().c_str(), t["ratio"].get<double>(),
                t["target"] == "none" ? "-" : (t["met"].get<bool>() ? "met" : "NOT met"),
                t["vs_host_staged"].get<double>(), t["kernel_ratio"].get<double>(), t["unified_ratio"].get<double>(),
                t["ordered_ratio"].get<double>());
  return 0;
}

int p2p_peer(int argc, char** argv) {
  // lavaflow-bench p2p-peer copy-engine|kernel|gpu-ordered DIR SIZE COUNT FD; started by this program only.
  if (argc != 7) return 2;
  const std::string how = argv[2];
  auto ok = lavaflow_p2p_peer(how == "kernel"        ? P2PCopy::Kernel
                              : how == "gpu-ordered" ? P2PCopy::GpuOrdered
                                                     : P2PCopy::CopyEngine,
                              argv[3], std::stoull(argv[4]), std::stoi(argv[5]), std::stoi(argv[6]));
  if (!ok) {
    std::fprintf(stderr, "p2p-peer: %s\n", ok.error().message().c_str());
    return 1;
  }
  return 0;
}

}  // namespace lfbench
