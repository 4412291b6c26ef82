// SPDX-License-Identifier: MIT
// Helper process for the CUDA tests.
//   lavaflow_cuda_peer consume DIR NAME COUNT
//     A channel consumer whose CUDA stream waits on the channel's timeline (no CPU wait for the
//     producer's GPU work) and reads every message on the GPU. Message i must hold
//     lftest::fill(…, i). Exit 0 when all COUNT verified and each ring buffer was imported once.
//   lavaflow_cuda_peer consume-peer DIR NAME COUNT
//     A consumer on CUDA device 1 of a channel whose ring is on device 0: each message is copied
//     to device 1 over the peer link (cudaMemcpyPeer), then checked there.
//   lavaflow_cuda_peer consume-peer-gpu DIR NAME COUNT
//     The same ordered on the GPUs (ChannelImports::copy_to_peer): no host thread waits for
//     either GPU; a kernel on device 1 checks every message, and the count of wrong words is
//     read once at the end.
//   lavaflow_cuda_peer import-allocation ALLOCATION_SIZE SIZE DEVICE [OFFSET LENGTH] SOCKET
//     Receives a CUDA allocation's fd (device 0) on SOCKET, checks that wrong sizes and a non-CUDA
//     fd are refused, maps SIZE bytes of it for DEVICE too, checks message 7 with a kernel on DEVICE
//     in the LENGTH bytes at OFFSET (all SIZE bytes without them) and writes message 8 there.
// Exit 77 when CUDA cannot run here.
#include <cuda_runtime_api.h>
#include <sys/mman.h>

#include <cstdio>
#include <memory>
#include <optional>
#include <string>

#include "cuda_kernels.hpp"
#include "lavaflow/core/unix_socket.hpp"
#include "lavaflow/cuda/cuda.hpp"
#include "lavaflow/transports/local.hpp"
#include "vk_helpers.hpp"

using namespace lavaflow;

namespace {

int failed(const char* what, const Error& e) {
  std::fprintf(stderr, "cuda_peer: %s: %s\n", what, e.message().c_str());
  return 1;
}

/// A consumer of a channel whose ring is on one CUDA device (`home`, where `cuda` imports it) that
/// works on the other (`mine`).
struct PeerConsumer {
  std::unique_ptr<Consumer> channel;
  std::optional<cuda::Interop> cuda;
  int home = 0, mine = 0;
};

/// Opens it, with peer access from the ring's device to ours: Vulkan memory imported into CUDA is
/// mapped for its own device only, so the ring's GPU writes into ours. 0, or the exit status.
int open_peer_consumer(const std::string& dir, const std::string& name, bool host_wait_for_gpu, PeerConsumer& out) {
  auto c = Consumer::open(
      name, {.host_wait_for_gpu = host_wait_for_gpu, .connect_timeout = std::chrono::seconds(20), .directory = dir});
  if (!c) return failed("open", c.error());
  if (!(*c)->vulkan()) return std::fprintf(stderr, "cuda_peer: channel is not on the Vulkan transport\n"), 1;
  auto cu = cuda::Interop::create(*(*c)->vulkan());
  if (!cu) return std::printf("LAVAFLOW-SKIP: %s\n", cu.error().message().c_str()), 77;
  out.home = cu->device().ordinal;
  out.mine = out.home == 0 ? 1 : 0;
  if (auto ok = cuda::enable_peer_access(out.home, out.mine); !ok) return failed("peer access", ok.error());
  out.channel = std::move(*c);
  out.cuda.emplace(std::move(*cu));
  return 0;
}

int consume_peer(const std::string& dir, const std::string& name, std::uint64_t count) {
  PeerConsumer p;
  if (const int rc = open_peer_consumer(dir, name, true, p)) return rc;
  const int home = p.home, mine = p.mine;
  cuda::ChannelImports imports(*p.cuda);
  void* dst = nullptr;
  if (cudaSetDevice(mine) != cudaSuccess || cudaMalloc(&dst, 1 << 20) != cudaSuccess) return 1;
  std::vector<std::byte> seen;
  for (std::uint64_t i = 0; i < count; ++i) {
    auto r = p.channel->receive(std::chrono::seconds(20));
    if (!r) return failed("receive", r.error());
    auto src = imports.buffer(*r);
    if (!src) return failed("import", src.error());
    seen.resize(r->info().size);
    // Issued on the ring's device: it pushes into ours over the link (see enable_peer_access above).
    if (cudaSetDevice(home) != cudaSuccess ||
        cudaMemcpyPeer(dst, mine, (*src)->data(), home, seen.size()) != cudaSuccess ||
        cudaMemcpy(seen.data(), dst, seen.size(), cudaMemcpyDeviceToHost) != cudaSuccess)
      return std::fprintf(stderr, "cuda_peer: peer copy failed\n"), 1;
    if (auto bad = lftest::first_mismatch(seen, i); bad >= 0)
      return std::fprintf(stderr, "cuda_peer: message %llu byte %lld differs on device %d\n",
                          static_cast<unsigned long long>(i), bad, mine),
             1;
  }
  std::printf("cuda_peer: %llu messages from device %d verified on device %d\n", static_cast<unsigned long long>(count),
              home, mine);
  return cudaFree(dst) == cudaSuccess ? 0 : 1;
}

int consume_peer_gpu(const std::string& dir, const std::string& name, std::uint64_t count) {
  PeerConsumer p;
  if (const int rc = open_peer_consumer(dir, name, false, p)) return rc;
  const int home = p.home, mine = p.mine;
  cuda::ChannelImports imports(*p.cuda);
  // Two destination buffers on our device, each reused once its check has run.
  constexpr int kRing = 2;
  constexpr std::uint64_t kBytes = 1 << 20;
  void* dst[kRing] = {};
  cudaEvent_t checked[kRing] = {};
  unsigned long long* errors = nullptr;
  cudaStream_t ours = nullptr, theirs = nullptr;
  bool ready = cudaSetDevice(mine) == cudaSuccess &&
               cudaStreamCreateWithFlags(&ours, cudaStreamNonBlocking) == cudaSuccess &&
               cudaMalloc(reinterpret_cast<void**>(&errors), sizeof *errors) == cudaSuccess &&
               cudaMemset(errors, 0, sizeof *errors) == cudaSuccess;
  for (int k = 0; k < kRing && ready; ++k)
    ready = cudaMalloc(&dst[k], kBytes) == cudaSuccess &&
            cudaEventCreateWithFlags(&checked[k], cudaEventDisableTiming) == cudaSuccess;
  // Both kernels run once before a stream waits on anything: modules load lazily, and loading one
  // while a stream is blocked on a wait can deadlock.
  ready = ready && lf_kernel_fill_frame(dst[0], 8, 0, ours) == cudaSuccess &&
          lf_kernel_check_frame(dst[0], 8, 0, 0, errors, nullptr, nullptr, ours) == cudaSuccess &&
          cudaStreamSynchronize(ours) == cudaSuccess && cudaSetDevice(home) == cudaSuccess &&
          cudaStreamCreateWithFlags(&theirs, cudaStreamNonBlocking) == cudaSuccess;
  if (!ready) return std::fprintf(stderr, "cuda_peer: CUDA setup failed\n"), 1;
  for (std::uint64_t i = 0; i < count; ++i) {
    auto r = p.channel->receive(std::chrono::seconds(20));
    if (!r) return failed("receive", r.error());
    if (r->info().sequence != i)
      return std::fprintf(stderr, "cuda_peer: message %llu out of order\n", static_cast<unsigned long long>(i)), 1;
    const int k = static_cast<int>(i % kRing);
    if (i == 0) {  // refusals, before anything is queued: the message stays whole
      auto none = imports.copy_to_peer(theirs, *r, nullptr, kBytes, mine, ours);
      auto short_dst = imports.copy_to_peer(theirs, *r, dst[k], r->info().size - 1, mine, ours);
      auto wrong_stream = imports.copy_to_peer(ours, *r, dst[k], kBytes, mine, ours);
      if (none || short_dst || wrong_stream ||
          short_dst.error().message().find("the destination") == std::string::npos ||
          wrong_stream.error().message().find("belongs to CUDA device") == std::string::npos)
        return std::fprintf(stderr, "cuda_peer: a wrong copy_to_peer was not refused\n"), 1;
    }
    if (cudaSetDevice(home) != cudaSuccess || cudaStreamWaitEvent(theirs, checked[k], 0) != cudaSuccess)
      return std::fprintf(stderr, "cuda_peer: event wait failed\n"), 1;
    if (auto ok = imports.copy_to_peer(theirs, *r, dst[k], kBytes, mine, ours); !ok)
      return failed("copy_to_peer", ok.error());
    // Dropped at once: the slot is released on the GPU after the copy.
    const std::uint64_t size = r->info().size;
    r->release();
    if (cudaSetDevice(mine) != cudaSuccess ||
        lf_kernel_check_frame(dst[k], size, i, 0, errors, nullptr, nullptr, ours) != cudaSuccess ||
        cudaEventRecord(checked[k], ours) != cudaSuccess)
      return std::fprintf(stderr, "cuda_peer: check failed to launch\n"), 1;
  }
  unsigned long long bad = 1;
  if (cudaSetDevice(mine) != cudaSuccess || cudaStreamSynchronize(ours) != cudaSuccess ||
      cudaMemcpy(&bad, errors, sizeof bad, cudaMemcpyDeviceToHost) != cudaSuccess)
    return std::fprintf(stderr, "cuda_peer: device %d failed\n", mine), 1;
  if (bad != 0) return std::fprintf(stderr, "cuda_peer: %llu words wrong on device %d\n", bad, mine), 1;
  std::printf("cuda_peer: %llu messages from device %d checked on device %d, ordered on the GPUs\n",
              static_cast<unsigned long long>(count), home, mine);
  return 0;
}

/// Maps `size` bytes of the allocation it is sent, reads message 7 in the `length` bytes at
/// `offset` of it (a pooled buffer's place in its segment) and writes message 8 there.
int import_allocation(std::uint64_t allocation_size, std::uint64_t size, int device, int sock, std::uint64_t offset,
                      std::uint64_t length) {
  auto msg = recv_message(sock, std::chrono::seconds(20));
  if (!msg) return failed("recv", msg.error());
  if (msg->fds.size() != 1) return std::fprintf(stderr, "cuda_peer: expected one fd\n"), 1;
  auto devs = cuda::devices();
  if (!devs || devs->empty()) return std::printf("LAVAFLOW-SKIP: no CUDA device\n"), 77;
  auto cu = cuda::Interop::create(devs->front().uuid);
  if (!cu) return failed("interop", cu.error());
  const int fd = msg->fds[0].get();
  // What a hostile sender could claim: a bigger allocation, a size beyond it, an fd of another kind.
  if (cu->import_allocation(fd, allocation_size * 2, size, {device}))
    return std::fprintf(stderr, "cuda_peer: a doubled allocation size was mapped\n"), 1;
  if (cu->import_allocation(fd, allocation_size, allocation_size + 1, {device}))
    return std::fprintf(stderr, "cuda_peer: a size beyond the allocation was accepted\n"), 1;
  UniqueFd other(::memfd_create("not-cuda", MFD_CLOEXEC));
  if (cu->import_allocation(other.get(), allocation_size, size))
    return std::fprintf(stderr, "cuda_peer: a memfd was taken for a CUDA allocation\n"), 1;
  auto mem = cu->import_allocation(fd, allocation_size, size, {device});
  if (!mem) return failed("import_allocation", mem.error());
  cudaStream_t s = nullptr;
  unsigned long long* errors = nullptr;
  unsigned long long bad = 1;
  if (cudaSetDevice(device) != cudaSuccess || cudaStreamCreate(&s) != cudaSuccess ||
      cudaMalloc(reinterpret_cast<void**>(&errors), sizeof *errors) != cudaSuccess ||
      cudaMemset(errors, 0, sizeof *errors) != cudaSuccess ||
      lf_kernel_check_frame(static_cast<std::byte*>(mem->data()) + offset, length, 7, 0, errors, nullptr, nullptr, s) !=
          cudaSuccess ||
      cudaMemcpy(&bad, errors, sizeof bad, cudaMemcpyDeviceToHost) != cudaSuccess)
    return std::fprintf(stderr, "cuda_peer: reading the allocation on device %d failed\n", device), 1;
  if (bad != 0) return std::fprintf(stderr, "cuda_peer: %llu words differ on device %d\n", bad, device), 1;
  if (lf_kernel_fill_frame(static_cast<std::byte*>(mem->data()) + offset, length, 8, s) != cudaSuccess ||
      cudaStreamSynchronize(s) != cudaSuccess)
    return std::fprintf(stderr, "cuda_peer: writing the allocation on device %d failed\n", device), 1;
  cudaFree(errors);
  cudaStreamDestroy(s);
  std::printf("cuda_peer: device %d read and wrote %llu bytes at %llu of device 0's allocation of %llu bytes\n", device,
              static_cast<unsigned long long>(length), static_cast<unsigned long long>(offset),
              static_cast<unsigned long long>(size));
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  const std::string mode = argc > 1 ? argv[1] : "";
  if (mode == "consume-peer" && argc == 5) return consume_peer(argv[2], argv[3], std::stoull(argv[4]));
  if (mode == "consume-peer-gpu" && argc == 5) return consume_peer_gpu(argv[2], argv[3], std::stoull(argv[4]));
  if (mode == "import-allocation" && (argc == 6 || argc == 8)) {
    const bool ranged = argc == 8;  // OFFSET LENGTH before the socket
    return import_allocation(std::stoull(argv[2]), std::stoull(argv[3]), std::stoi(argv[4]),
                             std::stoi(argv[ranged ? 7 : 5]), ranged ? std::stoull(argv[5]) : 0,
                             ranged ? std::stoull(argv[6]) : std::stoull(argv[3]));
  }
  if (argc != 5 || mode != "consume") {
    std::fprintf(stderr,
                 "usage: lavaflow_cuda_peer consume|consume-peer|consume-peer-gpu DIR NAME COUNT\n"
                 "       lavaflow_cuda_peer import-allocation ALLOCATION_SIZE SIZE DEVICE [OFFSET LENGTH] SOCKET\n");
    return 2;
  }
  const std::uint64_t count = std::stoull(argv[4]);
  auto c = Consumer::open(
      argv[3], {.host_wait_for_gpu = false, .connect_timeout = std::chrono::seconds(20), .directory = argv[2]});
  if (!c) return std::fprintf(stderr, "cuda_peer: %s\n", c.error().message().c_str()), 1;
  if (!(*c)->vulkan()) return std::fprintf(stderr, "cuda_peer: channel is not on the Vulkan transport\n"), 1;
  auto cu = cuda::Interop::create(*(*c)->vulkan());
  if (!cu) return std::printf("LAVAFLOW-SKIP: %s\n", cu.error().message().c_str()), 77;
  cuda::ChannelImports imports(*cu);
  cudaStream_t stream;
  if (cudaStreamCreate(&stream) != cudaSuccess) return 1;
  std::vector<std::byte> seen;
  std::uint64_t gpu_ordered = 0;
  for (std::uint64_t i = 0; i < count; ++i) {
    auto r = (*c)->receive(std::chrono::seconds(20));
    if (!r)
      return std::fprintf(stderr, "cuda_peer: message %llu: %s\n", static_cast<unsigned long long>(i),
                          r.error().message().c_str()),
             1;
    auto buf = imports.buffer(*r);
    if (!buf) return std::fprintf(stderr, "cuda_peer: %s\n", buf.error().message().c_str()), 1;
    gpu_ordered += r->gpu_wait().has_value();
    if (auto ok = imports.wait(stream, *r); !ok)
      return std::fprintf(stderr, "cuda_peer: %s\n", ok.error().message().c_str()), 1;
    seen.resize(r->info().size);
    if (cudaMemcpyAsync(seen.data(), (*buf)->data(), seen.size(), cudaMemcpyDeviceToHost, stream) != cudaSuccess ||
        cudaStreamSynchronize(stream) != cudaSuccess)
      return std::fprintf(stderr, "cuda_peer: CUDA copy failed\n"), 1;
    if (auto bad = lftest::first_mismatch(seen, i); bad >= 0)
      return std::fprintf(stderr, "cuda_peer: message %llu byte %lld differs\n", static_cast<unsigned long long>(i),
                          bad),
             1;
  }
  std::printf(
      "cuda_peer: %llu messages verified on the GPU (%llu ordered by the channel's GPU counters); %zu buffers "
      "imported for %u slots\n",
      static_cast<unsigned long long>(count), static_cast<unsigned long long>(gpu_ordered), imports.imported(),
      (*c)->slots());
  // Each ring buffer once, and a flag channel's block of GPU flags.
  const std::size_t flags = (*c)->gpu_sync() == GpuSyncKind::Flag ? 1 : 0;
  return imports.imported() <= (*c)->slots() + flags ? 0 : 1;
}
