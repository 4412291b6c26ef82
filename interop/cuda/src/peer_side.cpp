// SPDX-License-Identifier: MIT
// A UnifiedBytes' side on a second GPU: the copies are issued on a stream of the buffer's own GPU,
// which pushes from and pulls into memory it owns while the peer's cudaMalloc memory is mapped to
// it by peer access. Imported Vulkan memory is mapped for its own device only, so a copy issued
// on the peer's side would be staged through the host by the driver.
#include <chrono>
#include <optional>
#include <thread>

#include "lavaflow/core/detail/format.hpp"
#include "lavaflow/cuda/cuda.hpp"
#include "runtime.hpp"

namespace lavaflow::cuda {

namespace {

using detail::cuda_step;
using detail::KeepCurrentDevice;

/// How long the destructor and an error path wait for the copy stream: a copy waits on the
/// buffer's timeline, which device work that never signals would hold forever.
constexpr auto kStreamWait = std::chrono::seconds(10);

/// Waits up to kStreamWait for `stream` (on the current device) to run dry; false if it did not.
bool settle(cudaStream_t stream) {
  const auto give_up = std::chrono::steady_clock::now() + kStreamWait;
  cudaError_t e;
  while ((e = cudaStreamQuery(stream)) == cudaErrorNotReady && std::chrono::steady_clock::now() < give_up)
    std::this_thread::sleep_for(std::chrono::microseconds(100));
  (void)cudaGetLastError();
  return e != cudaErrorNotReady;
}

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
    // Copies still queued would use `memory` and the imports: freed only once they are done. If
    // they are not done in time (the buffer's device work never signalled), the stream and the
    // peer memory are left allocated rather than freed under them.
    bool idle = true;
    if (stream) {
      (void)cudaSetDevice(home);
      idle = settle(stream);
    }
    if (released) {
      (void)cudaSetDevice(peer);
      if (release_recorded) (void)cudaEventSynchronize(released);
      (void)cudaEventDestroy(released);
    }
    if (memory && idle) {
      (void)cudaSetDevice(peer);
      (void)cudaFree(memory);
    }
    (void)cudaSetDevice(home);
    if (copied) (void)cudaEventDestroy(copied);
    if (stream && idle) (void)cudaStreamDestroy(stream);
    if (!idle) {  // the queued copies use the imports too: they are left mapped, as the memory is
      if (home_memory) (void)new ExternalBuffer(std::move(*home_memory));
      if (timeline) (void)new ExternalSemaphore(std::move(*timeline));
    }
    (void)cudaGetLastError();  // nothing failed here is the caller's error
  }

  /// Queues on the home stream a copy between the sides inside the buffer access `a` (the home
  /// GPU is current): after the acquirer's last use of the peer copy and after what `a` waits for;
  /// `a`'s signal follows the copy. If a step fails, whatever was queued is let finish and `a` is
  /// signalled from the host (unless the GPU did), so the buffer is not left on a promise.
  Status copy(const DeviceAccess& a, bool to_peer, const char* call) {
    Status queued = [&]() -> Status {
      if (release_recorded)
        LF_TRY_STATUS(cuda_step(cudaStreamWaitEvent(stream, released, 0), "cudaStreamWaitEvent", call));
      LF_TRY_STATUS(timeline->wait(stream, a.wait.value));
      void* home_ptr = home_memory->data();
      LF_TRY_STATUS(cuda_step(to_peer ? cudaMemcpyPeerAsync(memory, peer, home_ptr, home, bytes, stream)
                                      : cudaMemcpyPeerAsync(home_ptr, home, memory, peer, bytes, stream),
                              "cudaMemcpyPeerAsync", call));
      LF_TRY_STATUS(timeline->signal(stream, a.signal.value));
      return cuda_step(cudaEventRecord(copied, stream), "cudaEventRecord", call);
    }();
    if (!queued) {
      current = false;
      // Before the host's signal, whatever was queued runs out: the GPU's signal may still come.
      // A stream that does not (it waits on a promise nobody keeps) leaves the access unsignalled.
      if (settle(stream)) (void)buffer->signal(a);
      return std::unexpected(queued.error().within(call));
    }
    copy_recorded = true;
    seen_writes = buffer->writes();
    current = true;
    return {};
  }

  /// Makes the peer current and checks that `s` is one of its streams (the null stream is the
  /// peer's default stream).
  Status peer_stream(cudaStream_t s, const char* call) const {
    return detail::stream_of(s, peer, "the peer copy", call);
  }
};

PeerSide::PeerSide(std::unique_ptr<State> s) : s_(std::move(s)) {}
PeerSide::PeerSide(PeerSide&&) noexcept = default;
PeerSide& PeerSide::operator=(PeerSide&&) noexcept = default;
PeerSide::~PeerSide() = default;

int PeerSide::peer() const { return s_ ? s_->peer : -1; }
std::uint64_t PeerSide::size() const { return s_ ? s_->bytes : 0; }
bool PeerSide::direct() const { return s_ && s_->direct; }
std::uint64_t PeerSide::pulls() const { return s_ ? s_->pulls : 0; }
std::uint64_t PeerSide::pushes() const { return s_ ? s_->pushes : 0; }

Result<PeerSide> PeerSide::create(const Interop& home, UnifiedBytes& buffer, int peer) {
  constexpr const char* call = "cuda::PeerSide::create";
  KeepCurrentDevice keep;
  const int h = home.device().ordinal;
  int count = 0;
  LF_TRY_STATUS(cuda_step(cudaGetDeviceCount(&count), "cudaGetDeviceCount", call));
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
  if (!access && access.error().code() != Errc::Unsupported) return std::unexpected(access.error().within(call));
  s->direct = access.has_value();

  LF_TRY_STATUS(cuda_step(cudaSetDevice(peer), "cudaSetDevice", call));
  LF_TRY_STATUS(cuda_step(cudaMalloc(&s->memory, s->bytes), "cudaMalloc", call));
  LF_TRY_STATUS(cuda_step(cudaEventCreateWithFlags(&s->released, cudaEventDisableTiming), "cudaEventCreate", call));
  LF_TRY_STATUS(cuda_step(cudaSetDevice(h), "cudaSetDevice", call));
  LF_TRY_STATUS(cuda_step(cudaStreamCreateWithFlags(&s->stream, cudaStreamNonBlocking), "cudaStreamCreate", call));
  LF_TRY_STATUS(cuda_step(cudaEventCreateWithFlags(&s->copied, cudaEventDisableTiming), "cudaEventCreate", call));
  return PeerSide(std::move(s));
}

Result<void*> PeerSide::acquire(cudaStream_t stream, Access access) {
  constexpr const char* call = "cuda::PeerSide::acquire";
  if (!s_) return fail(Errc::InvalidArgument, call, "a moved-from PeerSide");
  auto& s = *s_;
  if (s.held) return fail(Errc::InvalidArgument, call, "the peer copy is acquired already: release it first");
  KeepCurrentDevice keep;
  LF_TRY_STATUS(s.peer_stream(stream, call));
  if (!s.current || s.buffer->writes() != s.seen_writes) {
    LF_TRY_STATUS(cuda_step(cudaSetDevice(s.home), "cudaSetDevice", call));
    LF_TRY(const auto a, s.buffer->device(Access::Read));  // from here its signal is this side's to give
    LF_TRY_STATUS(s.copy(a, true, call));
    ++s.pulls;
    LF_TRY_STATUS(cuda_step(cudaSetDevice(s.peer), "cudaSetDevice", call));  // the null stream is the peer's
  }
  // Whether or not it pulled now: the last copy that used the peer memory comes first.
  if (s.copy_recorded) LF_TRY_STATUS(cuda_step(cudaStreamWaitEvent(stream, s.copied, 0), "cudaStreamWaitEvent", call));
  s.held = true;
  s.writing = access != Access::Read;
  return s.memory;
}

Status PeerSide::release(cudaStream_t stream) {
  constexpr const char* call = "cuda::PeerSide::release";
  if (!s_) return fail(Errc::InvalidArgument, call, "a moved-from PeerSide");
  auto& s = *s_;
  if (!s.held) return fail(Errc::InvalidArgument, call, "the peer copy is not acquired");
  KeepCurrentDevice keep;
  LF_TRY_STATUS(s.peer_stream(stream, call));
  LF_TRY_STATUS(cuda_step(cudaEventRecord(s.released, stream), "cudaEventRecord", call));
  s.release_recorded = true;
  s.held = false;
  if (!s.writing) return {};
  s.writing = false;
  s.current = false;  // until the push is queued, the buffer does not hold the peer's bytes
  auto pushed = [&]() -> Status {
    LF_TRY_STATUS(cuda_step(cudaSetDevice(s.home), "cudaSetDevice", call));
    LF_TRY(const auto a, s.buffer->device(Access::Write));
    return s.copy(a, false, call);
  }();
  if (!pushed)
    return fail(pushed.error().code(), call,
                str_format("what GPU {} wrote since the acquire did not reach the buffer and is lost ({})", s.peer,
                           pushed.error().message()));
  ++s.pushes;
  return {};
}

}  // namespace lavaflow::cuda
