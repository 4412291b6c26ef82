// SPDX-License-Identifier: MIT
// GPU-resident hand-off between two processes on one GPU, measured on the GPU itself:
//
// gpu-pingpong: a kernel in process A writes a frame, process B's kernel — queued before the frame
//   exists — waits on the GPU, reads it and writes a reply of the same size that A's next kernel,
//   queued likewise, waits for. Each of A's kernels stamps the GPU's global timer as it starts, so
//   a round trip is the distance between two stamps; the rows give round trip / 2.
//     lavaflow      two channels (A→B, B→A); every wait and signal through cuda::ChannelImports on
//                   the channels' counters, reads queued ahead of publication (Consumer::upcoming),
//                   slots released on the GPU; the counters are timeline semaphores (variant
//                   "timeline") or the GPU flags of flag channels (variant "flag")
//     cuda-ipc      CUDA IPC memory and IPC events; an IPC event wait only sees records already
//                   made, so each host tells the other over a socket when it has recorded
//     same-process  the same ping-pong on two streams of one process, ordered by events (the floor)
//   The four take turns in three passes, a third of the rounds each.
// gpu-stream: A fills frames with a kernel, B verifies every word with a kernel; throughput and the
//   interval between B's checks, against the same fill + verify on two streams of one process.
//   Each side orders its frames in batches (cuda::ChannelImports): B queues one wait for the
//   batch's last frame and A and B each queue one signal per batch, the other frames' signals
//   deferred into it; variants "timeline" and "flag". The "-per-message" variants wait and signal
//   for every frame.
#include "gpu_handoff.hpp"

#include <sys/socket.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <string>
#include <vector>

#include "cuda_kernels.hpp"
#include "gpu_common.hpp"
#include "lavaflow/lavaflow.hpp"

namespace lfbench {

namespace {

/// Round trips measured after this many unmeasured ones (queues filled, caches and clocks warm).
constexpr int kWarmup = 50;
/// Ring buffers per ping-pong channel.
constexpr std::uint32_t kPingPongSlots = 4;

double percentile(std::vector<double> v, double q) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  return v[static_cast<std::size_t>(q * double(v.size() - 1))];
}

/// Runs every kernel once: modules load lazily, and loading one while a stream is blocked on a
/// wait for another process can deadlock.
Status load_kernels(cudaStream_t s) {
  DeviceMemory a, b, c;
  LF_TRY_STATUS(allocate(a, 4096));
  LF_TRY_STATUS(allocate(b, 4096));
  LF_TRY_STATUS(allocate(c, 64));
  GPU_OK(lf_kernel_relay(a.p, b.p, 4096, c.words(), s));
  GPU_OK(lf_kernel_fill_frame(a.p, 4096, 1, s));
  GPU_OK(lf_kernel_check_frame(a.p, 4096, 1, 0, c.words(), nullptr, c.words() + 1, s));
  GPU_OK(lf_kernel_stamp(c.words(), s));
  GPU_OK(cudaStreamSynchronize(s));
  return {};
}

Result<std::vector<unsigned long long>> read_words(const DeviceMemory& m, std::size_t n) {
  std::vector<unsigned long long> v(n);
  GPU_OK(cudaMemcpy(v.data(), m.p, n * sizeof(unsigned long long), cudaMemcpyDeviceToHost));
  return v;
}

/// Half of each round trip between consecutive stamps, past the warm-up.
std::vector<double> half_round_trips(const std::vector<unsigned long long>& stamps) {
  std::vector<double> h;
  for (std::size_t i = kWarmup; i + 1 < stamps.size(); ++i) h.push_back(double(stamps[i + 1] - stamps[i]) / 2);
  return h;
}

GpuRow pingpong_row(std::string name, std::string variant, std::uint64_t size, bool mps,
                    const std::vector<double>& halves) {
  GpuRow r{.name = std::move(name), .variant = std::move(variant), .size = size, .mps = mps};
  r.samples = halves.size();
  r.p50_ns = percentile(halves, 0.5);
  r.p99_ns = percentile(halves, 0.99);
  return r;
}

ProducerOptions gpu_producer(const VulkanContext& vk, const std::string& dir, std::uint64_t size, std::uint32_t slots,
                             GpuSyncKind sync = GpuSyncKind::Semaphore) {
  return {.slots = slots,
          .slot_size = size,
          .wait = WaitMode::BusyPoll,
          .host_wait_for_gpu_release = false,
          .gpu_sync = sync,
          .transport = TransportKind::Vulkan,
          .vulkan = &vk,
          .directory = dir};
}

ConsumerOptions gpu_consumer(const VulkanContext& vk, const std::string& dir) {
  return {
      .wait = WaitMode::BusyPoll, .host_wait_for_gpu = false, .connect_timeout = 30s, .vulkan = &vk, .directory = dir};
}

/// One side's writing half: loan, wait for the consumers' GPU reads of the slot, `write` on the
/// GPU, signal, publish — no CPU waits for a GPU.
template <class Write>
Status gpu_publish(Producer& out, cuda::ChannelImports& imports, cudaStream_t s, std::uint64_t size, Write write,
                   cuda::ChannelImports::Queue when) {
  LF_TRY(auto loan, out.loan(10s));
  LF_TRY(const auto* dst, imports.buffer(loan));
  LF_TRY_STATUS(imports.wait(s, loan));
  GPU_OK(write(dst->data()));
  LF_TRY_STATUS(imports.signal(s, loan, when));
  LF_TRY(auto info, out.publish(std::move(loan), {.size = size}));
  (void)info;
  return {};
}

/// Takes message `seq` on the CPU (its GPU read is queued already) and releases it on the GPU.
Status gpu_release(Consumer& in, cuda::ChannelImports& imports, cudaStream_t s, std::uint64_t seq,
                   cuda::ChannelImports::Queue when = cuda::ChannelImports::Queue::Now) {
  LF_TRY(auto r, in.receive(10s));
  if (r.info().sequence != seq)
    return fail(Errc::Malformed, "gpu hand-off",
                str_format("received message {}, expected {}", r.info().sequence, seq));
  return imports.release(s, r, when);
}

/// The device of this process's Vulkan context, for the peer (same GPU as the parent's).
Result<VulkanContext> peer_context() {
  auto devs = cuda::devices();
  if (!devs) return std::unexpected(devs.error());
  if (devs->empty()) return fail(Errc::NotFound, "gpu peer", "no CUDA device");
  return VulkanContext::create({.device = devs->front().uuid});
}

// ----- gpu-pingpong

/// The peer's mode for each kind of channel.
const char* pingpong_mode(GpuSyncKind kind) {
  return kind == GpuSyncKind::Flag ? "pingpong-flag" : "pingpong-lavaflow";
}
const char* variant_of(GpuSyncKind kind) { return kind == GpuSyncKind::Flag ? "flag" : "timeline"; }

Result<std::vector<double>> pingpong_lavaflow(const VulkanContext& vk, const cuda::Interop& cu, std::uint64_t size,
                                              int rounds, GpuSyncKind kind) {
  constexpr const char* call = "gpu-pingpong lavaflow";
  TempDir dir;
  if (dir.path().empty()) return std::unexpected(from_errno(errno, "mkdtemp"));
  const int total = rounds + kWarmup;
  Peer peer(spawn_self({"lavaflow-bench", "interop-peer", pingpong_mode(kind), dir.path(), std::to_string(size),
                        std::to_string(total)}));
  if (!peer.started()) return fail(Errc::System, "posix_spawn", "cannot start the peer process");
  LF_TRY(auto ping, Producer::create("ping", gpu_producer(vk, dir.path(), size, kPingPongSlots, kind)));
  if (ping->gpu_sync() != kind)
    return fail(Errc::Unsupported, call, str_format("the channel cannot order GPU work with {}s", variant_of(kind)));
  LF_TRY(auto pong, Consumer::open("pong", gpu_consumer(vk, dir.path())));
  LF_TRY_STATUS(ping->wait_for_consumers(1, 30s));
  StreamOwner s;
  LF_TRY_STATUS(create(s));
  cuda::ChannelImports out(cu), in(cu);
  LF_TRY_STATUS(load_kernels(s.s));
  DeviceMemory seed, stamps;
  LF_TRY_STATUS(allocate(seed, size));
  LF_TRY_STATUS(allocate(stamps, (total + 1) * sizeof(unsigned long long)));
  // Each round: the slot's release first (met long ago, normally), then the reply, so that once
  // the reply arrives only the kernel stands between it and the next frame.
  for (int i = 0; i < total; ++i) {
    LF_TRY(auto loan, ping->loan(10s));
    LF_TRY(const auto* dst, out.buffer(loan));
    LF_TRY_STATUS(out.wait(s.s, loan));
    const void* src = seed.p;
    if (i > 0) {  // the reply to round i - 1, queued before it exists
      LF_TRY(auto up, pong->upcoming(std::uint64_t(i - 1)));
      LF_TRY(const auto* b, in.buffer(up));
      LF_TRY_STATUS(in.wait(s.s, up));
      src = b->data();
    }
    GPU_OK(lf_kernel_relay(dst->data(), src, size, stamps.words() + i, s.s));
    LF_TRY_STATUS(out.signal(s.s, loan));
    LF_TRY(auto info, ping->publish(std::move(loan), {.size = size}));
    (void)info;
    if (i > 0) LF_TRY_STATUS(gpu_release(*pong, in, s.s, std::uint64_t(i - 1)));
  }
  LF_TRY(auto last, pong->upcoming(std::uint64_t(total - 1)));
  LF_TRY_STATUS(in.wait(s.s, last));
  GPU_OK(lf_kernel_stamp(stamps.words() + total, s.s));
  LF_TRY_STATUS(gpu_release(*pong, in, s.s, std::uint64_t(total - 1)));
  LF_TRY_STATUS(finish(s.s, 60s, call));
  LF_TRY(auto t, read_words(stamps, std::size_t(total) + 1));
  ping.reset();
  pong.reset();
  LF_TRY_STATUS(peer.join(call));
  return half_round_trips(t);
}

Status pingpong_lavaflow_peer(const std::string& dir, std::uint64_t size, int total, GpuSyncKind kind) {
  LF_TRY(auto vk, peer_context());
  LF_TRY(auto cu, cuda::Interop::create(vk));
  // Opened in the opposite order to the parent's: its ping exists (or comes), our pong is what
  // its consumer waits for.
  LF_TRY(auto ping, Consumer::open("ping", gpu_consumer(vk, dir)));
  LF_TRY(auto pong, Producer::create("pong", gpu_producer(vk, dir, size, kPingPongSlots, kind)));
  LF_TRY_STATUS(pong->wait_for_consumers(1, 30s));
  StreamOwner s;
  LF_TRY_STATUS(create(s));
  cuda::ChannelImports out(cu), in(cu);
  LF_TRY_STATUS(load_kernels(s.s));
  for (int i = 0; i < total; ++i) {
    LF_TRY(auto loan, pong->loan(10s));
    LF_TRY(const auto* dst, out.buffer(loan));
    LF_TRY_STATUS(out.wait(s.s, loan));
    LF_TRY(auto up, ping->upcoming(std::uint64_t(i)));
    LF_TRY(const auto* src, in.buffer(up));
    LF_TRY_STATUS(in.wait(s.s, up));
    GPU_OK(lf_kernel_relay(dst->data(), src->data(), size, nullptr, s.s));
    LF_TRY_STATUS(out.signal(s.s, loan));
    LF_TRY(auto info, pong->publish(std::move(loan), {.size = size}));
    (void)info;
    LF_TRY_STATUS(gpu_release(*ping, in, s.s, std::uint64_t(i)));
  }
  LF_TRY_STATUS(finish(s.s, 60s, "gpu-pingpong peer"));
  return pong->flush(30s);
}

struct IpcHandles {
  cudaIpcMemHandle_t ping, pong;
  cudaIpcEventHandle_t sent, replied;
};

Status send_byte(int fd) {
  const char c = 1;
  if (::send(fd, &c, 1, MSG_NOSIGNAL) != 1) return std::unexpected(from_errno(errno, "send"));
  return {};
}

Status recv_byte(int fd) {
  char c = 0;
  if (::recv(fd, &c, 1, MSG_WAITALL) != 1) return fail(Errc::PeerLost, "recv", "the peer closed the socket");
  return {};
}

Result<std::vector<double>> pingpong_cuda_ipc(std::uint64_t size, int rounds) {
  constexpr const char* call = "gpu-pingpong cuda-ipc";
  int sv[2];
  if (::socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv) != 0)
    return std::unexpected(from_errno(errno, "socketpair"));
  UniqueFd mine(sv[0]), theirs(sv[1]);
  const int total = rounds + kWarmup;
  DeviceMemory ping, pong, seed, stamps;
  LF_TRY_STATUS(allocate(ping, size));
  LF_TRY_STATUS(allocate(pong, size));
  LF_TRY_STATUS(allocate(seed, size));
  LF_TRY_STATUS(allocate(stamps, (total + 1) * sizeof(unsigned long long)));
  EventOwner sent, replied;
  GPU_OK(cudaEventCreateWithFlags(&sent.e, cudaEventDisableTiming | cudaEventInterprocess));
  GPU_OK(cudaEventCreateWithFlags(&replied.e, cudaEventDisableTiming | cudaEventInterprocess));
  IpcHandles h{};
  GPU_OK(cudaIpcGetMemHandle(&h.ping, ping.p));
  GPU_OK(cudaIpcGetMemHandle(&h.pong, pong.p));
  GPU_OK(cudaIpcGetEventHandle(&h.sent, sent.e));
  GPU_OK(cudaIpcGetEventHandle(&h.replied, replied.e));
  StreamOwner s;
  LF_TRY_STATUS(create(s));
  LF_TRY_STATUS(load_kernels(s.s));
  Peer peer(spawn_self({"lavaflow-bench", "interop-peer", "pingpong-cuda-ipc", std::to_string(theirs.get()),
                        std::to_string(size), std::to_string(total)},
                       theirs.get()));
  theirs.reset();
  if (!peer.started()) return fail(Errc::System, "posix_spawn", "cannot start the peer process");
  if (::send(mine.get(), &h, sizeof h, MSG_NOSIGNAL) != sizeof h) return std::unexpected(from_errno(errno, "send"));
  LF_TRY_STATUS(recv_byte(mine.get()));  // the peer opened the handles
  for (int i = 0; i < total; ++i) {
    if (i > 0) {
      LF_TRY_STATUS(recv_byte(mine.get()));  // the peer has recorded its reply to round i - 1
      GPU_OK(cudaStreamWaitEvent(s.s, replied.e, 0));
    }
    GPU_OK(lf_kernel_relay(ping.p, i > 0 ? pong.p : seed.p, size, stamps.words() + i, s.s));
    GPU_OK(cudaEventRecord(sent.e, s.s));
    LF_TRY_STATUS(send_byte(mine.get()));
  }
  LF_TRY_STATUS(recv_byte(mine.get()));
  GPU_OK(cudaStreamWaitEvent(s.s, replied.e, 0));
  GPU_OK(lf_kernel_stamp(stamps.words() + total, s.s));
  LF_TRY_STATUS(finish(s.s, 60s, call));
  LF_TRY(auto t, read_words(stamps, std::size_t(total) + 1));
  mine.reset();
  LF_TRY_STATUS(peer.join(call));
  return half_round_trips(t);
}

Status pingpong_cuda_ipc_peer(int fd, std::uint64_t size, int total) {
  IpcHandles h{};
  if (::recv(fd, &h, sizeof h, MSG_WAITALL) != sizeof h) return fail(Errc::PeerLost, "recv", "no handles");
  void *ping = nullptr, *pong = nullptr;
  GPU_OK(cudaIpcOpenMemHandle(&ping, h.ping, cudaIpcMemLazyEnablePeerAccess));
  GPU_OK(cudaIpcOpenMemHandle(&pong, h.pong, cudaIpcMemLazyEnablePeerAccess));
  cudaEvent_t sent = nullptr, replied = nullptr;
  GPU_OK(cudaIpcOpenEventHandle(&sent, h.sent));
  GPU_OK(cudaIpcOpenEventHandle(&replied, h.replied));
  StreamOwner s;
  LF_TRY_STATUS(create(s));
  LF_TRY_STATUS(load_kernels(s.s));
  LF_TRY_STATUS(send_byte(fd));
  for (int i = 0; i < total; ++i) {
    LF_TRY_STATUS(recv_byte(fd));  // round i is recorded
    GPU_OK(cudaStreamWaitEvent(s.s, sent, 0));
    GPU_OK(lf_kernel_relay(pong, ping, size, nullptr, s.s));
    GPU_OK(cudaEventRecord(replied, s.s));
    LF_TRY_STATUS(send_byte(fd));
  }
  LF_TRY_STATUS(finish(s.s, 60s, "gpu-pingpong cuda-ipc peer"));
  cudaIpcCloseMemHandle(ping);
  cudaIpcCloseMemHandle(pong);
  return {};
}

Result<std::vector<double>> pingpong_same_process(std::uint64_t size, int rounds) {
  const int total = rounds + kWarmup;
  DeviceMemory ping, pong, seed, stamps;
  LF_TRY_STATUS(allocate(ping, size));
  LF_TRY_STATUS(allocate(pong, size));
  LF_TRY_STATUS(allocate(seed, size));
  LF_TRY_STATUS(allocate(stamps, (total + 1) * sizeof(unsigned long long)));
  StreamOwner a, b;
  LF_TRY_STATUS(create(a));
  LF_TRY_STATUS(create(b));
  LF_TRY_STATUS(load_kernels(a.s));
  EventOwner sent, replied;
  GPU_OK(cudaEventCreateWithFlags(&sent.e, cudaEventDisableTiming));
  GPU_OK(cudaEventCreateWithFlags(&replied.e, cudaEventDisableTiming));
  for (int i = 0; i < total; ++i) {
    if (i > 0) GPU_OK(cudaStreamWaitEvent(a.s, replied.e, 0));
    GPU_OK(lf_kernel_relay(ping.p, i > 0 ? pong.p : seed.p, size, stamps.words() + i, a.s));
    GPU_OK(cudaEventRecord(sent.e, a.s));
    GPU_OK(cudaStreamWaitEvent(b.s, sent.e, 0));
    GPU_OK(lf_kernel_relay(pong.p, ping.p, size, nullptr, b.s));
    GPU_OK(cudaEventRecord(replied.e, b.s));
  }
  GPU_OK(cudaStreamWaitEvent(a.s, replied.e, 0));
  GPU_OK(lf_kernel_stamp(stamps.words() + total, a.s));
  LF_TRY_STATUS(finish(a.s, 60s, "gpu-pingpong same-process"));
  LF_TRY(auto t, read_words(stamps, std::size_t(total) + 1));
  return half_round_trips(t);
}

// ----- gpu-stream

/// What the verifying side reports: words found wrong (every frame), and over the frames after
/// the warm-up (ring buffers imported, pipeline full): their count, the global timer at the
/// start of the first one's check and at the end of the last, and the interval between checks.
struct StreamReport {
  std::uint64_t errors = 0;
  std::uint64_t frames = 0;
  std::uint64_t start_ns = 0, end_ns = 0;
  double p50_ns = 0, p99_ns = 0;
};

/// `check_stamps`: the start of each frame's check; `end_ns`: when the last check ended.
StreamReport report_from(std::uint64_t errors, const std::vector<unsigned long long>& check_stamps,
                         std::uint64_t end_ns) {
  const std::size_t warm = std::min<std::size_t>(kWarmup, check_stamps.size() / 4);
  std::vector<double> gaps;
  for (std::size_t i = warm + 1; i < check_stamps.size(); ++i)
    gaps.push_back(double(check_stamps[i] - check_stamps[i - 1]));
  return {errors, check_stamps.size() - warm, check_stamps[warm],
          end_ns, percentile(gaps, 0.5),      percentile(gaps, 0.99)};
}

GpuRow stream_row(std::string name, std::string variant, std::uint64_t size, bool mps, const StreamReport& r) {
  GpuRow row{.name = std::move(name), .variant = std::move(variant), .size = size, .mps = mps};
  const double ns = double(r.end_ns - r.start_ns);
  row.samples = r.frames;
  row.p50_ns = r.p50_ns;
  row.p99_ns = r.p99_ns;
  row.gbps = double(size) * double(r.frames) / ns;
  row.frames_per_s = double(r.frames) / ns * 1e9;
  row.errors = r.errors;
  return row;
}

/// Whether frame `i` of `frames` ends a batch of `batch`: its signal is queued, not deferred.
cuda::ChannelImports::Queue batch_end(int i, int frames, int batch) {
  return (i + 1) % batch == 0 || i + 1 == frames ? cuda::ChannelImports::Queue::Now
                                                 : cuda::ChannelImports::Queue::Deferred;
}

std::string stream_variant(GpuSyncKind kind, int batch) {
  return std::string(variant_of(kind)) + (batch == 1 ? "-per-message" : "");
}

Result<GpuRow> stream_lavaflow(const VulkanContext& vk, const cuda::Interop& cu, std::uint64_t size, int frames,
                               std::uint32_t slots, int batch, bool mps, GpuSyncKind kind) {
  constexpr const char* call = "gpu-stream lavaflow";
  TempDir dir;
  if (dir.path().empty()) return std::unexpected(from_errno(errno, "mkdtemp"));
  int sv[2];
  if (::socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv) != 0)
    return std::unexpected(from_errno(errno, "socketpair"));
  UniqueFd mine(sv[0]), theirs(sv[1]);
  Peer peer(spawn_self({"lavaflow-bench", "interop-peer", "stream-lavaflow", dir.path(), std::to_string(size),
                        std::to_string(frames), std::to_string(theirs.get()), std::to_string(batch)},
                       theirs.get()));
  theirs.reset();
  if (!peer.started()) return fail(Errc::System, "posix_spawn", "cannot start the peer process");
  LF_TRY(auto out, Producer::create("frames", gpu_producer(vk, dir.path(), size, slots, kind)));
  if (out->gpu_sync() != kind)
    return fail(Errc::Unsupported, call, str_format("the channel cannot order GPU work with {}s", variant_of(kind)));
  LF_TRY_STATUS(out->wait_for_consumers(1, 30s));
  StreamOwner s;
  LF_TRY_STATUS(create(s));
  cuda::ChannelImports imports(cu);
  LF_TRY_STATUS(load_kernels(s.s));
  for (int i = 0; i < frames; ++i)
    LF_TRY_STATUS(gpu_publish(
        *out, imports, s.s, size, [&](void* dst) { return lf_kernel_fill_frame(dst, size, std::uint64_t(i), s.s); },
        batch_end(i, frames, batch)));
  LF_TRY_STATUS(finish(s.s, 120s, call));
  LF_TRY_STATUS(out->flush(120s));
  StreamReport r;
  if (::recv(mine.get(), &r, sizeof r, MSG_WAITALL) != sizeof r)
    return fail(Errc::PeerLost, call, "the verifying process sent no report");
  out.reset();
  LF_TRY_STATUS(peer.join(call));
  return stream_row("gpu-stream-lavaflow", stream_variant(kind, batch), size, mps, r);
}

Status stream_lavaflow_peer(const std::string& dir, std::uint64_t size, int frames, int fd, int batch) {
  LF_TRY(auto vk, peer_context());
  LF_TRY(auto cu, cuda::Interop::create(vk));
  LF_TRY(auto in, Consumer::open("frames", gpu_consumer(vk, dir)));
  StreamOwner s;
  LF_TRY_STATUS(create(s));
  cuda::ChannelImports imports(cu);
  LF_TRY_STATUS(load_kernels(s.s));
  DeviceMemory errors, stamps;
  LF_TRY_STATUS(allocate(errors, sizeof(unsigned long long)));
  LF_TRY_STATUS(allocate(stamps, (std::size_t(frames) + 1) * sizeof(unsigned long long)));
  const std::uint64_t first = in->next_sequence();
  for (int i = 0; i < frames; ++i) {
    LF_TRY(auto up, in->upcoming(first + std::uint64_t(i)));
    LF_TRY(const auto* src, imports.buffer(up));
    if (i % batch == 0) {  // one wait, for the batch's last frame, covers the batch
      LF_TRY(auto last, in->upcoming(first + std::uint64_t(std::min(i + batch, frames) - 1)));
      LF_TRY_STATUS(imports.wait(s.s, last));
    }
    LF_TRY_STATUS(imports.wait(s.s, up));  // covered already: nothing is queued
    GPU_OK(lf_kernel_check_frame(src->data(), size, std::uint64_t(i), 0, errors.words(), nullptr, stamps.words() + i,
                                 s.s));
    LF_TRY_STATUS(gpu_release(*in, imports, s.s, first + std::uint64_t(i), batch_end(i, frames, batch)));
  }
  GPU_OK(lf_kernel_stamp(stamps.words() + frames, s.s));
  LF_TRY_STATUS(finish(s.s, 120s, "gpu-stream peer"));
  LF_TRY(auto e, read_words(errors, 1));
  LF_TRY(auto t, read_words(stamps, std::size_t(frames) + 1));
  const std::uint64_t end = t.back();
  t.pop_back();
  const StreamReport r = report_from(e[0], t, end);
  if (::send(fd, &r, sizeof r, MSG_NOSIGNAL) != sizeof r) return std::unexpected(from_errno(errno, "send"));
  return {};
}

Result<GpuRow> stream_same_process(std::uint64_t size, int frames, std::uint32_t slots, bool mps) {
  std::vector<DeviceMemory> ring(slots);
  for (auto& b : ring) LF_TRY_STATUS(allocate(b, size));
  std::vector<EventOwner> filled(slots), checked(slots);
  for (std::uint32_t k = 0; k < slots; ++k) {
    GPU_OK(cudaEventCreateWithFlags(&filled[k].e, cudaEventDisableTiming));
    GPU_OK(cudaEventCreateWithFlags(&checked[k].e, cudaEventDisableTiming));
  }
  StreamOwner a, b;
  LF_TRY_STATUS(create(a));
  LF_TRY_STATUS(create(b));
  LF_TRY_STATUS(load_kernels(a.s));
  DeviceMemory errors, stamps;
  LF_TRY_STATUS(allocate(errors, sizeof(unsigned long long)));
  LF_TRY_STATUS(allocate(stamps, (std::size_t(frames) + 1) * sizeof(unsigned long long)));
  for (int i = 0; i < frames; ++i) {
    const std::uint32_t k = std::uint32_t(i) % slots;
    if (i >= int(slots)) GPU_OK(cudaStreamWaitEvent(a.s, checked[k].e, 0));
    GPU_OK(lf_kernel_fill_frame(ring[k].p, size, std::uint64_t(i), a.s));
    GPU_OK(cudaEventRecord(filled[k].e, a.s));
    GPU_OK(cudaStreamWaitEvent(b.s, filled[k].e, 0));
    GPU_OK(
        lf_kernel_check_frame(ring[k].p, size, std::uint64_t(i), 0, errors.words(), nullptr, stamps.words() + i, b.s));
    GPU_OK(cudaEventRecord(checked[k].e, b.s));
  }
  GPU_OK(lf_kernel_stamp(stamps.words() + frames, b.s));
  LF_TRY_STATUS(finish(b.s, 120s, "gpu-stream same-process"));
  LF_TRY(auto e, read_words(errors, 1));
  LF_TRY(auto t, read_words(stamps, std::size_t(frames) + 1));
  const std::uint64_t end = t.back();
  t.pop_back();
  return stream_row("gpu-stream-same-process", "event", size, mps, report_from(e[0], t, end));
}

}  // namespace

Result<std::vector<GpuRow>> gpu_pingpong(const VulkanContext& vk, const cuda::Interop& cu, std::uint64_t size,
                                         int rounds, bool mps) {
  if (size == 0 || size % 16 != 0)
    return fail(Errc::InvalidArgument, "gpu-pingpong", str_format("frame size {} is not a multiple of 16", size));
  // The rows in turn, in passes of a third of the rounds each, so that the floor and the rows it is
  // compared with see the same moments of the GPU (its clocks, and under MPS its other clients,
  // move between runs and within one).
  constexpr int kPasses = 3;
  const int per_pass = std::max(1, rounds / kPasses);
  std::vector<double> halves[4];
  for (int pass = 0; pass < kPasses; ++pass) {
    std::size_t k = 0;
    auto add = [&](Result<std::vector<double>> got) -> Status {
      if (!got) return std::unexpected(got.error());
      halves[k].insert(halves[k].end(), got->begin(), got->end());
      ++k;
      return {};
    };
    for (auto kind : {GpuSyncKind::Semaphore, GpuSyncKind::Flag})
      LF_TRY_STATUS(add(pingpong_lavaflow(vk, cu, size, per_pass, kind)));
    LF_TRY_STATUS(add(pingpong_cuda_ipc(size, per_pass)));
    LF_TRY_STATUS(add(pingpong_same_process(size, per_pass)));
  }
  return std::vector<GpuRow>{
      pingpong_row("gpu-pingpong-lavaflow", variant_of(GpuSyncKind::Semaphore), size, mps, halves[0]),
      pingpong_row("gpu-pingpong-lavaflow", variant_of(GpuSyncKind::Flag), size, mps, halves[1]),
      pingpong_row("gpu-pingpong-cuda-ipc", "ipc-event", size, mps, halves[2]),
      pingpong_row("gpu-pingpong-same-process", "event", size, mps, halves[3])};
}

Result<std::vector<GpuRow>> gpu_stream(const VulkanContext& vk, const cuda::Interop& cu, std::uint64_t size, int frames,
                                       std::uint32_t slots, int batch, bool mps) {
  if (size == 0 || size % 8 != 0)
    return fail(Errc::InvalidArgument, "gpu-stream", str_format("frame size {} is not a multiple of 8", size));
  if (slots == 0 || slots > 62) return fail(Errc::InvalidArgument, "gpu-stream", str_format("{} slots", slots));
  if (batch < 1 || std::uint32_t(batch) > slots / 2)
    return fail(Errc::InvalidArgument, "gpu-stream",
                str_format("batches of {} frames in a ring of {} (at most half the ring)", batch, slots));
  std::vector<GpuRow> rows;
  for (int b : {batch, 1}) {
    for (auto kind : {GpuSyncKind::Semaphore, GpuSyncKind::Flag}) {
      LF_TRY(auto lf, stream_lavaflow(vk, cu, size, frames, slots, b, mps, kind));
      rows.push_back(std::move(lf));
    }
    if (batch == 1) break;
  }
  LF_TRY(auto same, stream_same_process(size, frames, slots, mps));
  rows.push_back(std::move(same));
  return rows;
}

int gpu_handoff_peer(int argc, char** argv) {
  // lavaflow-bench interop-peer MODE ARG SIZE COUNT [FD]; started by this program only.
  if (argc < 6) return 2;
  const std::string mode = argv[2];
  const std::uint64_t size = std::stoull(argv[4]);
  const int count = std::stoi(argv[5]);
  Status ok = fail(Errc::InvalidArgument, "interop-peer", "unknown mode " + mode);
  for (auto kind : {GpuSyncKind::Semaphore, GpuSyncKind::Flag})
    if (mode == pingpong_mode(kind)) ok = pingpong_lavaflow_peer(argv[3], size, count, kind);
  if (mode == "pingpong-cuda-ipc") ok = pingpong_cuda_ipc_peer(std::stoi(argv[3]), size, count);
  if (mode == "stream-lavaflow" && argc == 8)
    ok = stream_lavaflow_peer(argv[3], size, count, std::stoi(argv[6]), std::stoi(argv[7]));
  if (!ok) {
    std::fprintf(stderr, "interop-peer %s: %s\n", mode.c_str(), ok.error().message().c_str());
    return 1;
  }
  return 0;
}

}  // namespace lfbench
