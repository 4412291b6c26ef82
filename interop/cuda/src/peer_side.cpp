// SPDX-License-Identifier: MIT
// A UnifiedBytes' side on a second GPU: the copies are issued on a stream of the buffer's own GPU,
// which pushes from and pulls into memory it owns while the peer's cudaMalloc memory is mapped to
// it by peer access. Imported Vulkan memory is mapped for its own device only, so a copy issued
// on the peer's side would be staged through the host by the driver.
#include <optional>

#include "lavaflow/core/detail/format.hpp"
#include "lavaflow/cuda/cuda.hpp"

namespace lavaflow::cuda {

namespace {

/// Restores the calling thread's current device when it goes.
class KeepCurrentDevice {
 public:
  KeepCurrentDevice() { had_ = cudaGetDevice(&device_) == cudaSuccess; }
  KeepCurrentDevice(const KeepCurrentDevice&) = delete;
  KeepCurrentDevice& operator=(const KeepCurrentDevice&) = delete;
  ~KeepCurrentDevice() {
    if (had_) (void)cudaSetDevice(device_);
  }

 private:
  int device_ = 0;
  bool had_ = false;
};

}  // namespace

struct PeerSide::State {
  UnifiedBytes* buffer = nullptr;
  int home = 0, peer = 0;
  std::uint64_t bytes = 0;  // the buffer's size (its device side's range may be longer)
  bool direct = false;
  std::optional<ExternalBuffer> home_memory;  // the buffer's device side, imported
  std::optional<ExternalSemaphore> timeline;  // the buffer's timeline, imported
  void* memory = nullptr;                     // the copy, on the peer
  cudaStream_t stream = nullptr;              // on the home GPU: every copy
  cudaEvent_t copied = nullptr;               // on the home GPU: the last copy that used `memory`
  cudaEvent_t released = nullptr;             // on the peer: the acquirer's work up to its release
  bool copy_recorded = false, release_recorded = false;
  bool current = false;           // `memory` holds the buffer's bytes as of `seen_writes`
  std::uint64_t seen_writes = 0;  // UnifiedBytes::writes() when it did
  bool held = false, writing = false;
  std::uint64_t pulls = 0, pushes = 0;

  State() = default;
  State(const State&) = delete;
  State& operator=(const State&) = delete;
  ~State() {
    KeepCurrentDevice keep;
    if (stream) {
      (void)cudaSetDevice(home);
      (void)cudaStreamSynchronize(stream);
    }
    if (released) {
      (void)cudaSetDevice(peer);
      if (release_recorded) (void)cudaEventSynchronize(released);
      (void)cudaEventDestroy(released);
    }
    if (memory) {
      (void)cudaSetDevice(peer);
      (void)cudaFree(memory);
    }
    (void)cudaSetDevice(home);
    if (copied) (void)cudaEventDestroy(copied);
    if (stream) (void)cudaStreamDestroy(stream);
  }

  /// Queues on the home stream a copy between the sides inside the buffer access `a`: after the
  /// acquirer's last use of the peer copy and after what `a` waits for; `a`'s signal follows the
  /// copy. If anything fails to queue, `a` is signalled from the host so the buffer goes on.
  Status copy(const DeviceAccess& a, bool to_peer, const char* call) {
    Status queued = [&]() -> Status {
      if (release_recorded) LF_TRY_STATUS(check(cudaStreamWaitEvent(stream, released, 0), "cudaStreamWaitEvent"));
      LF_TRY_STATUS(timeline->wait(stream, a.wait.value));
      void* home_ptr = home_memory->data();
      LF_TRY_STATUS(check(to_peer ? cudaMemcpyPeerAsync(memory, peer, home_ptr, home, bytes, stream)
                                  : cudaMemcpyPeerAsync(home_ptr, home, memory, peer, bytes, stream),
                          "cudaMemcpyPeerAsync"));
      LF_TRY_STATUS(timeline->signal(stream, a.signal.value));
      return check(cudaEventRecord(copied, stream), "cudaEventRecord");
    }();
    if (!queued) {
      (void)buffer->signal(a);
      return fail(
          queued.error().code(), call,
          str_format("the copy {} GPU {} was not queued: {}", to_peer ? "to" : "from", peer, queued.error().message()));
    }
    copy_recorded = true;
    seen_writes = buffer->writes();
    current = true;
    return {};
  }

  /// `stream`'s device, which must be the peer.
  Status check_stream(cudaStream_t s, const char* call) const {
    int device = -1;
    LF_TRY_STATUS(check(cudaSetDevice(peer), "cudaSetDevice"));  // the null stream is the current device's
    LF_TRY_STATUS(check(cudaStreamGetDevice(s, &device), "cudaStreamGetDevice"));
    if (device != peer)
      return fail(Errc::InvalidArgument, call,
                  str_format("the stream belongs to CUDA device {}; the peer copy lives on device {}", device, peer));
    return {};
  }
};

PeerSide::PeerSide(std::unique_ptr<State> s) : s_(std::move(s)) {}
PeerSide::PeerSide(PeerSide&&) noexcept = default;
PeerSide& PeerSide::operator=(PeerSide&&) noexcept = default;
PeerSide::~PeerSide() = default;

int PeerSide::peer() const { return s_->peer; }
std::uint64_t PeerSide::size() const { return s_->bytes; }
bool PeerSide::direct() const { return s_->direct; }
std::uint64_t PeerSide::pulls() const { return s_->pulls; }
std::uint64_t PeerSide::pushes() const { return s_->pushes; }

Result<PeerSide> PeerSide::create(const Interop& home, UnifiedBytes& buffer, int peer) {
  constexpr const char* call = "cuda::PeerSide::create";
  KeepCurrentDevice keep;
  const int h = home.device().ordinal;
  int count = 0;
  LF_TRY_STATUS(check(cudaGetDeviceCount(&count), "cudaGetDeviceCount"));
  if (peer < 0 || peer >= count)
    return fail(Errc::InvalidArgument, call, str_format("no CUDA device {} (this host has {})", peer, count));
  if (peer == h)
    return fail(Errc::InvalidArgument, call, str_format("device {} is the buffer's own GPU, not a peer", peer));
  if (!buffer.shareable_timeline())
    return fail(Errc::Unsupported, call,
                "the buffer's Vulkan driver cannot export its timeline for CUDA to order the copies");
  auto s = std::make_unique<State>();
  s->buffer = &buffer;
  s->home = h;
  s->peer = peer;
  s->bytes = buffer.size();
  LF_TRY(auto memory, home.import_buffer(buffer.device_buffer()));
  s->home_memory.emplace(std::move(memory));
  LF_TRY(auto timeline, home.import_semaphore(*buffer.shareable_timeline()));
  s->timeline.emplace(std::move(timeline));
  const Status access = enable_peer_access(h, peer);
  if (!access && access.error().code() != Errc::Unsupported) return std::unexpected(access.error());
  s->direct = access.has_value();

  LF_TRY_STATUS(check(cudaSetDevice(peer), "cudaSetDevice"));
  LF_TRY_STATUS(check(cudaMalloc(&s->memory, s->bytes), "cudaMalloc"));
  LF_TRY_STATUS(check(cudaEventCreateWithFlags(&s->released, cudaEventDisableTiming), "cudaEventCreateWithFlags"));
  LF_TRY_STATUS(check(cudaSetDevice(h), "cudaSetDevice"));
  LF_TRY_STATUS(check(cudaStreamCreateWithFlags(&s->stream, cudaStreamNonBlocking), "cudaStreamCreateWithFlags"));
  LF_TRY_STATUS(check(cudaEventCreateWithFlags(&s->copied, cudaEventDisableTiming), "cudaEventCreateWithFlags"));
  return PeerSide(std::move(s));
}

Result<void*> PeerSide::acquire(cudaStream_t stream, Access access) {
  constexpr const char* call = "cuda::PeerSide::acquire";
  auto& s = *s_;
  if (s.held) return fail(Errc::InvalidArgument, call, "the peer copy is acquired already: release it first");
  KeepCurrentDevice keep;
  LF_TRY_STATUS(s.check_stream(stream, call));
  if (!s.current || s.buffer->writes() != s.seen_writes) {
    LF_TRY(const auto a, s.buffer->device(Access::Read));
    LF_TRY_STATUS(check(cudaSetDevice(s.home), "cudaSetDevice"));
    LF_TRY_STATUS(s.copy(a, true, call));
    ++s.pulls;
  }
  // Whether or not it pulled now: the last copy that used the peer memory comes first.
  if (s.copy_recorded) LF_TRY_STATUS(check(cudaStreamWaitEvent(stream, s.copied, 0), "cudaStreamWaitEvent"));
  s.held = true;
  s.writing = access != Access::Read;
  return s.memory;
}

Status PeerSide::release(cudaStream_t stream) {
  constexpr const char* call = "cuda::PeerSide::release";
  auto& s = *s_;
  if (!s.held) return fail(Errc::InvalidArgument, call, "the peer copy is not acquired");
  KeepCurrentDevice keep;
  LF_TRY_STATUS(s.check_stream(stream, call));
  LF_TRY_STATUS(check(cudaEventRecord(s.released, stream), "cudaEventRecord"));
  s.release_recorded = true;
  s.held = false;
  if (!s.writing) return {};
  s.writing = false;
  s.current = false;  // until the push is queued, the buffer does not hold the peer's bytes
  LF_TRY(const auto a, s.buffer->device(Access::Write));
  LF_TRY_STATUS(check(cudaSetDevice(s.home), "cudaSetDevice"));
  LF_TRY_STATUS(s.copy(a, false, call));
  ++s.pushes;
  return {};
}

}  // namespace lavaflow::cuda
