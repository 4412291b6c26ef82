// SPDX-License-Identifier: MIT
// lavaflow-bench interop (GPU machine): in one run
//  1. a CUDA copy kernel over Vulkan-imported memory vs over cudaMalloc memory, same size;
//  2. the cost of importing one Vulkan buffer into CUDA;
//  3. cross-process frame hand-off — one process writes a frame on the GPU and hands it over, the
//     other process's GPU reads it — through a lava-flow channel with the shared timeline
//     semaphore, next to the same hand-off with CUDA IPC memory and IPC events (notification over a
//     socket). Measured as ping-pong: hand-off latency = round trip / 2.
#include "interop.hpp"

#include <fcntl.h>
#include <spawn.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "cuda_kernels.hpp"
#include "lavaflow/core/detail/format.hpp"
#include "lavaflow/cuda/cuda.hpp"
#include "lavaflow/lavaflow.hpp"
#include "lavaflow/transports/local.hpp"

extern char** environ;

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

struct Result3 {
  std::string name;
  double p50_us = 0, p99_us = 0, avg_us = 0;
};

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

// ----- 3. hand-off: lava-flow channel

pid_t spawn_self(std::vector<std::string> args, int keep_fd = -1) {
  if (keep_fd >= 0) ::fcntl(keep_fd, F_SETFD, 0);
  std::vector<char*> argv;
  for (auto& a : args) argv.push_back(a.data());
  argv.push_back(nullptr);
  pid_t pid = -1;
  if (::posix_spawn(&pid, "/proc/self/exe", nullptr, nullptr, argv.data(), environ) != 0) return -1;
  return pid;
}

int wait_child(pid_t pid) {
  int st = 0;
  while (::waitpid(pid, &st, 0) < 0 && errno == EINTR) {
  }
  return WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
}

/// One side of the lava-flow ping-pong: writes (producer) on `out`, reads (consumer) on `in`.
struct LfSide {
  std::unique_ptr<Producer> out;
  std::unique_ptr<Consumer> in;
  std::optional<cuda::ExternalSemaphore> out_timeline;
  std::optional<cuda::ChannelImports> in_imports;
  std::unordered_map<const Buffer*, cuda::ExternalBuffer> out_imports;
};

Result<const cuda::ExternalBuffer*> loan_target(const cuda::Interop& cu, LfSide& s, Loan& loan) {
  auto it = s.out_imports.find(&loan.buffer());
  if (it == s.out_imports.end()) {
    LF_TRY(auto m, cu.import_buffer(loan.buffer()));
    it = s.out_imports.emplace(&loan.buffer(), std::move(m)).first;
  }
  return &it->second;
}

/// Writes a frame on the GPU into a loaned ring buffer and publishes it, ordered by the timeline.
Status gpu_publish(const cuda::Interop& cu, LfSide& s, const void* frame, std::uint64_t n, unsigned char key,
                   cudaStream_t stream) {
  LF_TRY(auto loan, s.out->loan(std::chrono::seconds(10)));
  LF_TRY(const auto* target, loan_target(cu, s, loan));
  if (cudaError_t e = lf_kernel_xor(target->data(), frame, key, n, stream); e != cudaSuccess)
    return std::unexpected(cuda::to_error(e, "copy kernel"));
  const auto sig = loan.gpu_signal();
  if (!sig) return fail(Errc::Unsupported, "hand-off", "channel has no shared timeline semaphore");
  if (!s.out_timeline) {
    LF_TRY(auto sem, cu.import_semaphore(*s.out->gpu_timeline()));
    s.out_timeline.emplace(std::move(sem));
  }
  LF_TRY_STATUS(s.out_timeline->signal(stream, sig->value));
  LF_TRY(auto info, s.out->publish(std::move(loan), {.size = n}));
  (void)info;
  return {};
}

/// Receives a frame and has the GPU read it (after the producer's GPU work, through the timeline).
Status gpu_receive(LfSide& s, void* scratch, cudaStream_t stream) {
  LF_TRY(auto r, s.in->receive(std::chrono::seconds(10)));
  LF_TRY(const auto* src, s.in_imports->buffer(r));
  LF_TRY_STATUS(s.in_imports->wait(*s.in, r, stream));
  if (cudaError_t e = lf_kernel_xor(scratch, src->data(), 0, r.info().size, stream); e != cudaSuccess)
    return std::unexpected(cuda::to_error(e, "read kernel"));
  return {};  // released when r ends: the next write to this slot is ordered after the pong
}

Result<LfSide> open_side(const VulkanContext& vk, const cuda::Interop& cu, const std::string& dir,
                         const std::string& out, const std::string& in, std::uint64_t frame) {
  LfSide s;
  LF_TRY(
      s.out,
      Producer::create(
          out, {.slots = 4, .slot_size = frame, .transport = TransportKind::Vulkan, .vulkan = &vk, .directory = dir}));
  LF_TRY(s.in, Consumer::open(in, {.wait = WaitMode::BusyPoll,
                                   .host_wait_for_gpu = false,
                                   .connect_timeout = std::chrono::seconds(30),
                                   .vulkan = &vk,
                                   .directory = dir}));
  s.in_imports.emplace(cu);
  LF_TRY_STATUS(s.out->wait_for_consumers(1, std::chrono::seconds(30)));
  return s;
}

Result<Result3> handoff_lavaflow(const VulkanContext& vk, const cuda::Interop& cu, std::uint64_t frame, int rounds) {
  char tmpl[] = "/tmp/lavaflow-bench-XXXXXX";
  if (!::mkdtemp(tmpl)) return std::unexpected(from_errno(errno, "mkdtemp"));
  const std::string dir = tmpl;
  const pid_t child =
      spawn_self({"lavaflow-bench", "interop-peer", "lavaflow", dir, std::to_string(frame), std::to_string(rounds)});
  if (child < 0) return fail(Errc::System, "posix_spawn", "cannot start the peer process");
  auto side = open_side(vk, cu, dir, "ping", "pong", frame);
  if (!side) {
    ::kill(child, SIGKILL);
    wait_child(child);
    return std::unexpected(side.error());
  }
  void *src = nullptr, *scratch = nullptr;
  BENCH_CUDA(cudaMalloc(&src, frame));
  BENCH_CUDA(cudaMalloc(&scratch, frame));
  cudaStream_t stream;
  BENCH_CUDA(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  std::vector<double> half;
  for (int i = 0; i < rounds + 50; ++i) {
    const auto t0 = Clock::now();
    LF_TRY_STATUS(gpu_publish(cu, *side, src, frame, static_cast<unsigned char>(i), stream));
    LF_TRY_STATUS(gpu_receive(*side, scratch, stream));
    BENCH_CUDA(cudaStreamSynchronize(stream));
    if (i >= 50) half.push_back(std::chrono::duration<double, std::micro>(Clock::now() - t0).count() / 2);
  }
  cudaStreamDestroy(stream);
  cudaFree(src);
  cudaFree(scratch);
  side->out.reset();
  side->in.reset();
  const int rc = wait_child(child);
  std::filesystem::remove_all(dir);
  if (rc != 0) return fail(Errc::PeerLost, "hand-off", str_format("peer exited with {}", rc));
  double avg = 0;
  for (double h : half) avg += h / double(half.size());
  return Result3{"lavaflow-channel", percentile(half, 0.5), percentile(half, 0.99), avg};
}

// ----- 3b. hand-off: CUDA IPC memory + IPC events, notified over a socket

struct IpcHandles {
  cudaIpcMemHandle_t mem;
  cudaIpcEventHandle_t written, read;
};

Status send_byte(int fd) {
  const char c = 1;
  if (::send(fd, &c, 1, MSG_NOSIGNAL) != 1) return std::unexpected(from_errno(errno, "send"));
  return {};
}
Status recv_byte(int fd) {
  char c = 0;
  if (::recv(fd, &c, 1, MSG_WAITALL) != 1) return fail(Errc::PeerLost, "recv", "peer closed the socket");
  return {};
}

Result<Result3> handoff_cuda_ipc(std::uint64_t frame, int rounds) {
  int sv[2];
  if (::socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv) != 0)
    return std::unexpected(from_errno(errno, "socketpair"));
  UniqueFd mine(sv[0]), theirs(sv[1]);
  void *buf = nullptr, *src = nullptr, *scratch = nullptr;
  BENCH_CUDA(cudaMalloc(&buf, frame));
  BENCH_CUDA(cudaMalloc(&src, frame));
  BENCH_CUDA(cudaMalloc(&scratch, frame));
  cudaEvent_t written, read;
  BENCH_CUDA(cudaEventCreateWithFlags(&written, cudaEventDisableTiming | cudaEventInterprocess));
  BENCH_CUDA(cudaEventCreateWithFlags(&read, cudaEventDisableTiming | cudaEventInterprocess));
  IpcHandles h{};
  BENCH_CUDA(cudaIpcGetMemHandle(&h.mem, buf));
  BENCH_CUDA(cudaIpcGetEventHandle(&h.written, written));
  BENCH_CUDA(cudaIpcGetEventHandle(&h.read, read));
  const pid_t child = spawn_self({"lavaflow-bench", "interop-peer", "cuda-ipc", std::to_string(theirs.get()),
                                  std::to_string(frame), std::to_string(rounds)},
                                 theirs.get());
  theirs.reset();
  if (child < 0) return fail(Errc::System, "posix_spawn", "cannot start the peer process");
  if (::send(mine.get(), &h, sizeof h, MSG_NOSIGNAL) != sizeof h) return std::unexpected(from_errno(errno, "send"));
  LF_TRY_STATUS(recv_byte(mine.get()));  // peer opened the handles
  cudaStream_t stream;
  BENCH_CUDA(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  std::vector<double> half;
  for (int i = 0; i < rounds + 50; ++i) {
    const auto t0 = Clock::now();
    BENCH_CUDA(lf_kernel_xor(buf, src, static_cast<unsigned char>(i), frame, stream));
    BENCH_CUDA(cudaEventRecord(written, stream));
    LF_TRY_STATUS(send_byte(mine.get()));
    LF_TRY_STATUS(recv_byte(mine.get()));  // the peer has queued its read and recorded `read`
    BENCH_CUDA(cudaStreamWaitEvent(stream, read, 0));
    BENCH_CUDA(lf_kernel_xor(scratch, buf, 0, 16, stream));  // the pong: a tiny dependent read
    BENCH_CUDA(cudaStreamSynchronize(stream));
    if (i >= 50) half.push_back(std::chrono::duration<double, std::micro>(Clock::now() - t0).count() / 2);
  }
  mine.reset();
  const int rc = wait_child(child);
  cudaStreamDestroy(stream);
  cudaEventDestroy(written);
  cudaEventDestroy(read);
  cudaFree(buf);
  cudaFree(src);
  cudaFree(scratch);
  if (rc != 0) return fail(Errc::PeerLost, "hand-off", str_format("CUDA IPC peer exited with {}", rc));
  double avg = 0;
  for (double x : half) avg += x / double(half.size());
  return Result3{"cuda-ipc", percentile(half, 0.5), percentile(half, 0.99), avg};
}

}  // namespace

int bench_interop_peer(int argc, char** argv) {
  if (argc != 6) return 2;
  const std::string mode = argv[2];
  const std::uint64_t frame = std::stoull(argv[4]);
  const int rounds = std::stoi(argv[5]);
  auto run = [&]() -> Status {
    if (mode == "lavaflow") {
      LF_TRY(auto vk, VulkanContext::create());
      LF_TRY(auto cu, cuda::Interop::create(vk));
      // Open in the opposite order to the parent: its ping producer exists, our pong producer
      // is what the parent's consumer waits for.
      LfSide s;
      LF_TRY(s.in, Consumer::open("ping", {.wait = WaitMode::BusyPoll,
                                           .host_wait_for_gpu = false,
                                           .connect_timeout = std::chrono::seconds(30),
                                           .vulkan = &vk,
                                           .directory = argv[3]}));
      LF_TRY(s.out, Producer::create("pong", {.slots = 4,
                                              .slot_size = frame,
                                              .transport = TransportKind::Vulkan,
                                              .vulkan = &vk,
                                              .directory = argv[3]}));
      s.in_imports.emplace(cu);
      LF_TRY_STATUS(s.out->wait_for_consumers(1, std::chrono::seconds(30)));
      void *scratch = nullptr, *pong = nullptr;
      BENCH_CUDA(cudaMalloc(&scratch, frame));
      BENCH_CUDA(cudaMalloc(&pong, 64));
      cudaStream_t stream;
      BENCH_CUDA(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
      for (int i = 0; i < rounds + 50; ++i) {
        LF_TRY_STATUS(gpu_receive(s, scratch, stream));
        LF_TRY_STATUS(gpu_publish(cu, s, pong, 16, 0, stream));  // ordered after the read on the stream
      }
      BENCH_CUDA(cudaStreamSynchronize(stream));
      return s.out->flush(std::chrono::seconds(10));
    }
    if (mode == "cuda-ipc") {
      const int fd = std::stoi(argv[3]);
      IpcHandles h{};
      if (::recv(fd, &h, sizeof h, MSG_WAITALL) != sizeof h) return fail(Errc::PeerLost, "recv", "no handles");
      void* buf = nullptr;
      BENCH_CUDA(cudaIpcOpenMemHandle(&buf, h.mem, cudaIpcMemLazyEnablePeerAccess));
      cudaEvent_t written, read;
      BENCH_CUDA(cudaIpcOpenEventHandle(&written, h.written));
      BENCH_CUDA(cudaIpcOpenEventHandle(&read, h.read));
      void* scratch = nullptr;
      BENCH_CUDA(cudaMalloc(&scratch, frame));
      cudaStream_t stream;
      BENCH_CUDA(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
      LF_TRY_STATUS(send_byte(fd));
      for (int i = 0; i < rounds + 50; ++i) {
        LF_TRY_STATUS(recv_byte(fd));
        BENCH_CUDA(cudaStreamWaitEvent(stream, written, 0));
        BENCH_CUDA(lf_kernel_xor(scratch, buf, 0, frame, stream));
        BENCH_CUDA(cudaEventRecord(read, stream));
        LF_TRY_STATUS(send_byte(fd));
      }
      BENCH_CUDA(cudaStreamSynchronize(stream));
      cudaIpcCloseMemHandle(buf);
      return {};
    }
    return fail(Errc::InvalidArgument, "interop-peer", "unknown mode " + mode);
  };
  if (auto ok = run(); !ok) {
    std::fprintf(stderr, "interop-peer %s: %s\n", mode.c_str(), ok.error().message().c_str());
    return 1;
  }
  return 0;
}

int bench_interop(const InteropOptions& o) {
  const bool json = o.json;
  const std::uint64_t size = o.size, frame = o.frame;
  const int rounds = o.rounds;
  auto devs = cuda::devices();
  if (!devs || devs->empty()) {
    std::printf("lavaflow-bench interop: skipped, no CUDA device (%s)\n",
                devs ? "none found" : devs.error().message().c_str());
    return 77;
  }
  auto vk = VulkanContext::create({.device = devs->front().uuid});
  if (!vk) return std::fprintf(stderr, "interop: %s\n", vk.error().message().c_str()), 1;
  auto cu = cuda::Interop::create(*vk);
  if (!cu) return std::fprintf(stderr, "interop: %s\n", cu.error().message().c_str()), 1;
  auto copy = copy_bandwidth(*vk, *cu, size, 20);
  auto imp = import_cost_us(*vk, *cu, 64 << 20, 200);
  auto lf = handoff_lavaflow(*vk, *cu, frame, rounds);
  auto ipc = handoff_cuda_ipc(frame, rounds);
  for (auto* e : {copy ? nullptr : &copy.error(), imp ? nullptr : &imp.error(), lf ? nullptr : &lf.error(),
                  ipc ? nullptr : &ipc.error()})
    if (e) std::fprintf(stderr, "interop: %s\n", e->message().c_str());
  if (!copy || !imp || !lf || !ipc) return 1;
  if (json) {
    nlohmann::ordered_json j{{"device", devs->front().name},
                             {"copy_kernel",
                              {{"bytes", size},
                               {"imported_gb_s", copy->imported_gbs},
                               {"cudamalloc_gb_s", copy->malloc_gbs},
                               {"ratio", copy->imported_gbs / copy->malloc_gbs}}},
                             {"import_us_64MiB", *imp},
                             {"handoff", nlohmann::ordered_json::array()}};
    for (const auto* r : {&*lf, &*ipc})
      j["handoff"].push_back(
          {{"name", r->name}, {"frame", frame}, {"p50_us", r->p50_us}, {"p99_us", r->p99_us}, {"avg_us", r->avg_us}});
    j["handoff_p50_ratio"] = lf->p50_us / ipc->p50_us;
    std::puts(j.dump().c_str());
    return 0;
  }
  std::printf("lavaflow-bench interop on %s\n", devs->front().name.c_str());
  std::printf(
      "copy kernel, %s each way: Vulkan-imported %.1f GB/s, cudaMalloc %.1f GB/s -> ratio %.3f (target >= 0.97)\n",
      str_format("{} MiB", size >> 20).c_str(), copy->imported_gbs, copy->malloc_gbs,
      copy->imported_gbs / copy->malloc_gbs);
  std::printf("import of one 64 MiB Vulkan buffer into CUDA: %.1f us (median of 200)\n", *imp);
  std::printf("cross-process GPU frame hand-off, %llu-byte frames, %d rounds (round trip / 2):\n",
              static_cast<unsigned long long>(frame), rounds);
  for (const auto* r : {&*lf, &*ipc})
    std::printf("  %-18s p50 %7.1f us  p99 %7.1f us  avg %7.1f us\n", r->name.c_str(), r->p50_us, r->p99_us, r->avg_us);
  std::printf("  lava-flow / CUDA IPC at p50: %.2f (target <= 1.2)\n", lf->p50_us / ipc->p50_us);
  return 0;
}

}  // namespace lfbench
