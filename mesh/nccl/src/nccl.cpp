// SPDX-License-Identifier: MIT
#include "lavaflow/mesh_nccl/nccl.hpp"

#include <cuda.h>
#include <nccl.h>

#include <algorithm>
#include <atomic>
#include <cstring>
#include <functional>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "cuda_util.hpp"
#include "lavaflow/core/detail/format.hpp"
#include "lavaflow/core/detail/wait.hpp"

namespace lavaflow::mesh {

namespace {

Error nccl_error(ncclResult_t r, std::string call) {
  const Errc code = r == ncclInvalidArgument || r == ncclInvalidUsage ? Errc::InvalidArgument
                    : r == ncclRemoteError                            ? Errc::PeerLost
                    : r == ncclSystemError                            ? Errc::System
                                                                      : Errc::Driver;
  const char* last = ncclGetLastError(nullptr);
  return Error(code, std::move(call),
               str_format("{}{}{}", ncclGetErrorString(r), last && *last ? ": " : "", last ? last : ""));
}

std::optional<ncclDataType_t> nccl_type(DType t) {
  switch (t) {
    case DType::F32:
      return ncclFloat32;
    case DType::F16:
      return ncclFloat16;
    case DType::BF16:
      return ncclBfloat16;
    case DType::I32:
      return ncclInt32;
    case DType::I64:
      return ncclInt64;
    case DType::U8:
      return ncclUint8;
  }
  return std::nullopt;
}

std::optional<ncclRedOp_t> nccl_op(ReduceOp op) {
  // NCCL's average of integers sums (wrapping) and then divides, truncating: the same as ours.
  switch (op) {
    case ReduceOp::Sum:
      return ncclSum;
    case ReduceOp::Product:
      return ncclProd;
    case ReduceOp::Min:
      return ncclMin;
    case ReduceOp::Max:
      return ncclMax;
    case ReduceOp::Average:
      return ncclAvg;
  }
  return std::nullopt;
}

/// A recorded event that is destroyed with the last Work that waits on it.
struct Event {
  cudaEvent_t event = nullptr;
  explicit Event(cudaEvent_t e) : event(e) {}
  Event(const Event&) = delete;
  Event& operator=(const Event&) = delete;
  ~Event() { (void)cudaEventDestroy(event); }
};

/// Groups up to this size connect every pair of ranks for sends and receives while opening.
constexpr std::uint32_t kWarmPeers = 8;

/// One call: how to enqueue it, and once it is enqueued the event after it (or why it failed).
struct Call {
  std::string name;
  Duration timeout;
  Deadline deadline;
  std::function<ncclResult_t()> enqueue;
  std::shared_ptr<Event> event;
  std::optional<Error> failed;
  bool ended = false;  ///< its event was seen complete before any abort
  Call(std::string n, Duration t, std::function<ncclResult_t()> e)
      : name(std::move(n)), timeout(t), deadline(t), enqueue(std::move(e)) {}
};

/// The NCCL communicator and what every call in flight shares with it. Every NCCL call on it is
/// made under `mutex`: a Work may be waited for on another thread than the one making calls.
struct NcclState {
  std::mutex mutex;
  /// The communicator the calls go to: `opened` itself, or a blocking one split from it.
  ncclComm_t comm = nullptr;
  /// The non-blocking communicator that opening made (bounded by the open timeout).
  ncclComm_t opened = nullptr;
  std::string group;
  int device = 0;
  cudaStream_t stream = nullptr;
  bool own_stream = false;
  Duration close_timeout{};
  /// cuMemGetAddressRange, looked up through the runtime (nothing links the driver itself); null
  /// where the driver lacks it, and then spans are not checked against their allocation.
  CUresult (*address_range)(CUdeviceptr*, std::size_t*, CUdeviceptr) = nullptr;
  /// The failure that ended the communicator: every later call fails with it at once.
  std::optional<Error> broken;
  /// Device memory for the barrier's element and the connections made while opening.
  void* scratch = nullptr;

  NcclState() = default;
  NcclState(const NcclState&) = delete;
  NcclState& operator=(const NcclState&) = delete;
  ~NcclState() {
    // Every Work holds this state and waits for its call before it goes, so no call is in flight
    // here. Finalizing flushes NCCL's own work; one that does not end in time is aborted rather
    // than waited for.
    const DeviceScope on(device);
    // A blocking communicator's destruction waits for NCCL without a bound: with nothing in
    // flight, aborting it frees the same.
    if (comm && comm != opened) (void)ncclCommAbort(comm);
    if (opened) {
      const ncclResult_t finalized = ncclCommFinalize(opened);
      if (finalized == ncclSuccess ||
          (finalized == ncclInProgress && settle(opened, Deadline(close_timeout)) == ncclSuccess)) {
        if (ncclCommDestroy(opened) != ncclSuccess) (void)ncclCommAbort(opened);
      } else {
        (void)ncclCommAbort(opened);
      }
    }
    if (scratch) (void)cudaFree(scratch);
    if (own_stream && stream) (void)cudaStreamDestroy(stream);
  }

  /// Waits (under the lock) for a call on `c` that answered ncclInProgress (only a non-blocking
  /// communicator does) to settle: its result, or ncclInProgress still when `deadline` passes. An
  /// enqueue settles within tens of microseconds: the wait spins through that before it naps.
  static ncclResult_t settle(ncclComm_t c, const Deadline& deadline) {
    ncclResult_t state = ncclInProgress;
    (void)lavaflow::detail::wait_for(
        [&] {
          if (const ncclResult_t asked = ncclCommGetAsyncError(c, &state); asked != ncclSuccess) state = asked;
          return state != ncclInProgress;
        },
        lavaflow::detail::never_stop, lavaflow::detail::Nap{std::chrono::microseconds(50)}, WaitMode::SpinThenBlock,
        deadline.left(), {.clock_every = 16, .relax = false, .spin_for = std::chrono::milliseconds(1)},
        [] { return Error(Errc::Timeout, "ncclCommGetAsyncError", ""); });
    return state;
  }
  [[nodiscard]] ncclResult_t settle(const Deadline& deadline) const { return settle(comm, deadline); }

  /// Ends the communicator after a failure (under the lock): NCCL's kernels stop, and every call
  /// not yet seen to end fails with `why` (an aborted kernel ends early, so its event says nothing
  /// of its result), as do the sends and receives still waiting and every later call.
  void abort(Error why) {
    if (!broken) broken = std::move(why);
    // NCCL's clean-up makes its device current on this thread, which may be the user's.
    const DeviceScope on(device);
    if (comm && comm != opened) (void)ncclCommAbort(comm);
    if (opened) (void)ncclCommAbort(opened);
    comm = opened = nullptr;
    for (auto& c : pending) c->failed = *broken;
    pending.clear();
    for (auto& weak : in_flight)
      if (auto c = weak.lock(); c && !c->ended) c->failed = *broken;
    in_flight.clear();
  }

  [[nodiscard]] Status failed_before(const std::string& call) const {
    return fail(broken->code(), call,
                str_format("the communicator of group '{}' failed before: {}", group, broken->message()));
  }

  /// Enqueues `calls` (under the lock) in one NCCL group where there are several, and records one
  /// event after them; a failure is each call's.
  void run(const std::vector<std::shared_ptr<Call>>& calls) {
    if (calls.empty()) return;
    const DeviceScope on(device);
    auto failed = [&](Error e) {
      // An error from NCCL stays in a non-blocking communicator (every later call would fail with
      // it): end the communicator. The backend's own checks refuse arguments before NCCL sees them.
      abort(e);
      for (const auto& c : calls) c->failed = e;
    };
    const bool grouped = calls.size() > 1;
    ncclResult_t r = grouped ? ncclGroupStart() : ncclSuccess;
    for (std::size_t i = 0; i < calls.size() && r == ncclSuccess; ++i) r = calls[i]->enqueue();
    if (grouped) {
      // Ended whatever happened inside; an answer of ncclInProgress must settle before anything else.
      const ncclResult_t ended = ncclGroupEnd();
      const ncclResult_t settled = ended == ncclInProgress ? settle(calls.front()->deadline) : ended;
      if (r == ncclSuccess || r == ncclInProgress) r = settled;
    }
    if (r == ncclInProgress) r = settle(calls.front()->deadline);
    if (r == ncclInProgress)
      return failed(Error(Errc::Timeout, calls.front()->name, "NCCL did not take the call in time"));
    if (r != ncclSuccess) return failed(nccl_error(r, calls.front()->name));
    cudaEvent_t raw = nullptr;
    if (auto ok = cuda_ok(cudaEventCreateWithFlags(&raw, cudaEventDisableTiming), "cudaEventCreateWithFlags"); !ok)
      return failed(ok.error());
    auto event = std::make_shared<Event>(raw);
    if (auto ok = cuda_ok(cudaEventRecord(raw, stream), "cudaEventRecord"); !ok) return failed(ok.error());
    for (const auto& c : calls) {
      c->event = event;
      in_flight.push_back(c);
    }
  }

  /// Sends and receives made since the last flush go out together (under the lock).
  void flush() {
    if (broken || pending.empty()) return;
    const auto calls = std::move(pending);
    pending.clear();
    run(calls);
  }

  /// Sends and receives not yet enqueued, in the order they were made.
  std::vector<std::shared_ptr<Call>> pending;
  /// Calls enqueued and not yet seen to end (an abort fails them); pruned as they end.
  std::vector<std::weak_ptr<Call>> in_flight;
};

class NcclCommunicator final : public Communicator {
 public:
  NcclCommunicator(std::shared_ptr<NcclState> state, std::uint32_t rank, std::uint32_t size)
      : state_(std::move(state)), rank_(rank), size_(size) {}

  [[nodiscard]] const std::string& group() const override { return state_->group; }
  [[nodiscard]] std::uint32_t rank() const override { return rank_; }
  [[nodiscard]] std::uint32_t size() const override { return size_; }
  [[nodiscard]] std::string_view backend() const override { return "nccl"; }

  Work all_reduce(std::span<const std::byte> send, std::span<std::byte> recv, DType type, ReduceOp op,
                  CallOptions o) override {
    auto args = reduction("all_reduce", send.size(), type, op);
    if (!args) return Work::done(std::unexpected(args.error()));
    if (recv.size() != send.size())
      return bad("all_reduce",
                 str_format("send holds {} bytes and recv {}: they must be equal", send.size(), recv.size()));
    if (auto ok = layout("all_reduce", send, recv, recv.data(), "send is recv"); !ok) return Work::done(std::move(ok));
    if (auto ok = device_memory("all_reduce", {{send.data(), send.size(), "send"}, {recv.data(), recv.size(), "recv"}});
        !ok)
      return Work::done(std::move(ok));
    const auto [count, t, rop] = *args;
    return launch("all_reduce", o, [=, this] {
      return ncclAllReduce(send.data(), recv.data(), count, t, rop, state_->comm, state_->stream);
    });
  }

  Work all_gather(std::span<const std::byte> send, std::span<std::byte> recv, DType type, CallOptions o) override {
    auto t = element_type("all_gather", send.size(), type);
    if (!t) return Work::done(std::unexpected(t.error()));
    if (recv.size() != send.size() * size_)
      return bad("all_gather", str_format("recv holds {} bytes; {} ranks × {} bytes need {}", recv.size(), size_,
                                          send.size(), send.size() * size_));
    if (auto ok =
            layout("all_gather", send, recv, recv.data() + rank_ * send.size(), "send is this rank's block of recv");
        !ok)
      return Work::done(std::move(ok));
    if (auto ok = device_memory("all_gather", {{send.data(), send.size(), "send"}, {recv.data(), recv.size(), "recv"}});
        !ok)
      return Work::done(std::move(ok));
    const std::size_t count = send.size() / size_of(type);
    return launch("all_gather", o, [=, this, nt = *t] {
      return ncclAllGather(send.data(), recv.data(), count, nt, state_->comm, state_->stream);
    });
  }

  Work broadcast(std::span<std::byte> buffer, std::uint32_t root, DType type, CallOptions o) override {
    auto t = element_type("broadcast", buffer.size(), type);
    if (!t) return Work::done(std::unexpected(t.error()));
    if (root >= size_) return bad("broadcast", str_format("root {} is not a rank of a group of {}", root, size_));
    if (auto ok = device_memory("broadcast", {{buffer.data(), buffer.size(), "buffer"}}); !ok)
      return Work::done(std::move(ok));
    const std::size_t count = buffer.size() / size_of(type);
    return launch("broadcast", o, [=, this, nt = *t] {
      return ncclBroadcast(buffer.data(), buffer.data(), count, nt, static_cast<int>(root), state_->comm,
                           state_->stream);
    });
  }

  Work reduce_scatter(std::span<const std::byte> send, std::span<std::byte> recv, DType type, ReduceOp op,
                      CallOptions o) override {
    auto args = reduction("reduce_scatter", recv.size(), type, op);
    if (!args) return Work::done(std::unexpected(args.error()));
    if (send.size() != recv.size() * size_)
      return bad("reduce_scatter", str_format("send holds {} bytes; {} ranks × recv's {} bytes need {}", send.size(),
                                              size_, recv.size(), recv.size() * size_));
    // In place, NCCL's layout is recv inside send (this rank's block): the same test, sides swapped.
    if (auto ok = layout("reduce_scatter", recv, send, send.data() + rank_ * recv.size(),
                         "recv is this rank's block of send");
        !ok)
      return Work::done(std::move(ok));
    if (auto ok =
            device_memory("reduce_scatter", {{send.data(), send.size(), "send"}, {recv.data(), recv.size(), "recv"}});
        !ok)
      return Work::done(std::move(ok));
    const auto [count, t, rop] = *args;
    return launch("reduce_scatter", o, [=, this] {
      return ncclReduceScatter(send.data(), recv.data(), count, t, rop, state_->comm, state_->stream);
    });
  }

  Work barrier(CallOptions o) override {
    // An all_reduce of one element: it ends on every rank only once every rank has made it.
    return launch("barrier", o, [st = state_.get()] {
      return ncclAllReduce(st->scratch, st->scratch, 1, ncclInt32, ncclSum, st->comm, st->stream);
    });
  }

  Work send(std::span<const std::byte> buffer, std::uint32_t peer, std::uint32_t tag, CallOptions o) override {
    if (auto ok = point_to_point("send", buffer.size(), peer, tag); !ok) return Work::done(std::move(ok));
    if (auto ok = device_memory("send", {{buffer.data(), buffer.size(), "buffer"}}); !ok)
      return Work::done(std::move(ok));
    return post(str_format("send to group rank {}", peer), o, [=, st = state_.get()] {
      return ncclSend(buffer.data(), buffer.size(), ncclUint8, static_cast<int>(peer), st->comm, st->stream);
    });
  }

  Work recv(std::span<std::byte> buffer, std::uint32_t peer, std::uint32_t tag, CallOptions o) override {
    if (auto ok = point_to_point("recv", buffer.size(), peer, tag); !ok) return Work::done(std::move(ok));
    if (auto ok = device_memory("recv", {{buffer.data(), buffer.size(), "buffer"}}); !ok)
      return Work::done(std::move(ok));
    return post(str_format("recv from group rank {}", peer), o, [=, st = state_.get()] {
      return ncclRecv(buffer.data(), buffer.size(), ncclUint8, static_cast<int>(peer), st->comm, st->stream);
    });
  }

 private:
  struct Reduction {
    std::size_t count;
    ncclDataType_t type;
    ncclRedOp_t op;
  };
  struct Span {
    const void* data;
    std::size_t bytes;
    const char* name;
  };

  /// Refuses send and recv that overlap other than with send at `in_place` (or not at all, for
  /// null): NCCL reads and writes them concurrently.
  static Status layout(std::string_view what, std::span<const std::byte> send, std::span<const std::byte> recv,
                       const std::byte* in_place, std::string_view in_place_rule) {
    const auto a = reinterpret_cast<std::uintptr_t>(send.data()), b = reinterpret_cast<std::uintptr_t>(recv.data());
    const bool overlap = !send.empty() && !recv.empty() && a < b + recv.size() && b < a + send.size();
    if (overlap && send.data() != in_place)
      return fail(Errc::InvalidArgument, call_name(what),
                  str_format("send and recv overlap; in place, {}", in_place_rule));
    return {};
  }

  static std::string call_name(std::string_view what) { return str_format("mesh::nccl::{}", what); }
  static Work bad(std::string_view what, std::string why) {
    return Work::done(fail(Errc::InvalidArgument, call_name(what), std::move(why)));
  }

  static Result<ncclDataType_t> element_type(std::string_view what, std::size_t bytes, DType type) {
    const auto t = nccl_type(type);
    if (!t)
      return fail(Errc::InvalidArgument, call_name(what),
                  str_format("unknown element type {}", static_cast<unsigned>(type)));
    if (bytes % size_of(type) != 0)
      return fail(Errc::InvalidArgument, call_name(what),
                  str_format("{} bytes are not a whole number of {} elements", bytes, to_string(type)));
    return *t;
  }

  static Result<Reduction> reduction(std::string_view what, std::size_t bytes, DType type, ReduceOp op) {
    LF_TRY(const ncclDataType_t t, element_type(what, bytes, type));
    const auto r = nccl_op(op);
    if (!r)
      return fail(Errc::InvalidArgument, call_name(what),
                  str_format("unknown reduce operation {}", static_cast<unsigned>(op)));
    return Reduction{bytes / size_of(type), t, *r};
  }

  Status point_to_point(std::string_view what, std::size_t bytes, std::uint32_t peer, std::uint32_t tag) const {
    if (peer >= size_)
      return fail(Errc::InvalidArgument, call_name(what),
                  str_format("peer {} is not a rank of a group of {}", peer, size_));
    if (tag != 0)
      return fail(Errc::InvalidArgument, call_name(what),
                  str_format("tag {}: NCCL matches sends and receives by their order and carries no tag (use 0)", tag));
    (void)bytes;
    return {};
  }

  /// Every non-empty span lies in one CUDA allocation of device or managed memory of this rank's
  /// device: NCCL's kernels would fault on pageable host memory, and a span past its allocation
  /// reads or writes whatever lies beyond. Pinned host memory is refused too: NCCL takes it only
  /// where it is registered for the device, which the backend does not check.
  Status device_memory(std::string_view what, std::initializer_list<Span> spans) const {
    const DeviceScope on(state_->device);  // the address-range query needs the device's context
    for (const auto& s : spans) {
      if (s.bytes == 0) continue;
      if (!s.data) return fail(Errc::InvalidArgument, call_name(what), str_format("{} is null", s.name));
      cudaPointerAttributes a{};
      if (cudaPointerGetAttributes(&a, s.data) != cudaSuccess) (void)cudaGetLastError();
      const bool device = a.type == cudaMemoryTypeDevice || a.type == cudaMemoryTypeManaged;
      if (!device)
        return fail(Errc::InvalidArgument, call_name(what),
                    str_format("{} ({}) is {}: the NCCL backend takes CUDA device or managed memory", s.name, s.data,
                               a.type == cudaMemoryTypeHost ? "pinned host memory" : "host memory"));
      if (a.type == cudaMemoryTypeDevice && a.device != state_->device)
        return fail(Errc::DeviceMismatch, call_name(what),
                    str_format("{} lies on CUDA device {}, and this rank's communicator on device {}", s.name, a.device,
                               state_->device));
      CUdeviceptr base = 0;
      std::size_t size = 0;
      const auto at = reinterpret_cast<CUdeviceptr>(s.data);
      if (state_->address_range && state_->address_range(&base, &size, at) == CUDA_SUCCESS &&
          at - base + s.bytes > size)
        return fail(Errc::InvalidArgument, call_name(what),
                    str_format("{} ({} bytes at offset {} of its allocation) runs past the allocation's {} bytes",
                               s.name, s.bytes, at - base, size));
    }
    return {};
  }

  /// Enqueues a collective on the stream (after any sends and receives waiting to go) and returns
  /// a Work that ends when the stream passes it, or the call fails, or its timeout aborts the
  /// communicator.
  Work launch(std::string_view what, const CallOptions& o, std::function<ncclResult_t()> enqueue) {
    auto call =
        std::make_shared<Call>(call_name(str_format("{} (call #{})", what, calls_++)), o.timeout, std::move(enqueue));
    if (auto ok = not_capturing(call->name); !ok) return Work::done(std::move(ok));
    std::lock_guard lock(state_->mutex);
    if (state_->broken) return Work::done(state_->failed_before(call->name));
    state_->flush();
    if (state_->broken) return Work::done(state_->failed_before(call->name));
    state_->run({call});
    if (call->failed) return Work::done(std::unexpected(*call->failed));
    return watch(call);
  }

  /// A send or receive waits, to go out in one NCCL group with the others waiting and with those
  /// made until a Work of them is waited for or a collective is made: a send and the receive that
  /// answers it on one stream would otherwise wait for each other for ever.
  Work post(std::string_view what, const CallOptions& o, std::function<ncclResult_t()> enqueue) {
    auto call =
        std::make_shared<Call>(call_name(str_format("{} (call #{})", what, calls_++)), o.timeout, std::move(enqueue));
    if (auto ok = not_capturing(call->name); !ok) return Work::done(std::move(ok));
    std::lock_guard lock(state_->mutex);
    if (state_->broken) return Work::done(state_->failed_before(call->name));
    state_->pending.push_back(call);
    return watch(call);
  }

  /// A Work waits on an event recorded after its call, which a stream being captured into a CUDA
  /// graph does not record: such calls are refused rather than reported done at once.
  Status not_capturing(const std::string& call) const {
    cudaStreamCaptureStatus capturing = cudaStreamCaptureStatusNone;
    if (cudaStreamIsCapturing(state_->stream, &capturing) != cudaSuccess) (void)cudaGetLastError();
    if (capturing != cudaStreamCaptureStatusNone)
      return fail(Errc::InvalidArgument, call,
                  "the stream is being captured into a CUDA graph: the NCCL backend's Works wait on events, which "
                  "capture does not record (use NCCL directly in graphs)");
    return {};
  }

  Work watch(const std::shared_ptr<Call>& call) {
    auto work = std::make_shared<Work::State>();
    std::weak_ptr<Work::State> weak = work;
    work->progress = [weak, call, state = state_, polls = std::uint64_t{0}]() mutable {
      auto w = weak.lock();
      if (!w || w->result) return;
      std::shared_ptr<Event> event;
      {
        std::lock_guard held(state->mutex);
        if (!call->event && !call->failed) state->flush();
        if (call->failed) return w->finish(std::unexpected(*call->failed));
        event = call->event;
      }
      const cudaError_t q = cudaEventQuery(event->event);
      {
        // Under the lock: an abort since the query fails the call even if its event is done.
        std::lock_guard held(state->mutex);
        if (call->failed) return w->finish(std::unexpected(*call->failed));
        if (q == cudaSuccess) {
          call->ended = true;
          std::erase_if(state->in_flight, [](const std::weak_ptr<Call>& c) {
            auto alive = c.lock();
            return !alive || alive->ended;
          });
          return w->finish({});
        }
        if (q != cudaErrorNotReady) {
          state->abort(cuda_ok(q, call->name).error());
          return w->finish(std::unexpected(*state->broken));
        }
      }
      // NCCL's own failures (a lost peer, a network error) show in its asynchronous state.
      if ((++polls & 255) == 0 || call->deadline.passed()) {
        std::lock_guard held(state->mutex);
        if (call->failed) return w->finish(std::unexpected(*call->failed));
        ncclResult_t async = ncclSuccess;
        if (state->comm && ncclCommGetAsyncError(state->comm, &async) == ncclSuccess && async != ncclSuccess &&
            async != ncclInProgress) {
          state->abort(nccl_error(async, call->name));
          return w->finish(std::unexpected(*state->broken));
        }
        if (call->deadline.passed()) {
          state->abort(Error(
              Errc::Timeout, call->name,
              str_format("group '{}' did not end the call within {} ms; NCCL cannot tell which rank is "
                         "missing, and its communicator was aborted (later calls fail)",
                         state->group, std::chrono::duration_cast<std::chrono::milliseconds>(call->timeout).count())));
          return w->finish(std::unexpected(*state->broken));
        }
      }
    };
    return Work(std::move(work));
  }

  std::shared_ptr<NcclState> state_;
  std::uint32_t rank_, size_;
  std::atomic<std::uint64_t> calls_{0};
};

}  // namespace

Result<std::unique_ptr<Communicator>> open_nccl(Communicator& bootstrap, NcclOptions options) {
  constexpr const char* call = "mesh::open_nccl";
  const Deadline deadline(options.open_timeout);
  const std::uint32_t rank = bootstrap.rank(), size = bootstrap.size();
  int device = options.device;
  if (device < 0) LF_TRY_STATUS(cuda_ok(cudaGetDevice(&device), "cudaGetDevice"));
  int devices = 0;
  LF_TRY_STATUS(cuda_ok(cudaGetDeviceCount(&devices), "cudaGetDeviceCount"));
  if (device >= devices)
    return fail(Errc::InvalidArgument, call, str_format("CUDA device {} does not exist ({} devices)", device, devices));
  const DeviceScope on(device);

  // Group rank 0's unique id, through the bootstrap group. A rank that cannot make one still takes
  // part (with zeros), so that every rank learns of the failure instead of waiting for it.
  ncclUniqueId id{};
  std::vector<std::byte> wire(sizeof(id) + 1);
  ncclResult_t made = ncclSuccess;
  if (rank == 0) {
    made = ncclGetUniqueId(&id);
    std::memcpy(wire.data(), &id, sizeof(id));
    wire.back() = std::byte{made == ncclSuccess};
  }
  LF_TRY_STATUS(bootstrap.broadcast(wire, 0, DType::U8, {.timeout = deadline.left()}).wait(deadline.left()));
  if (made != ncclSuccess) return std::unexpected(nccl_error(made, "ncclGetUniqueId"));
  if (wire.back() != std::byte{1})
    return fail(Errc::Driver, call,
                str_format("group '{}': group rank 0 could not make NCCL's unique id", bootstrap.group()));
  std::memcpy(&id, wire.data(), sizeof(id));

  auto state = std::make_shared<NcclState>();
  state->group = bootstrap.group();
  state->device = device;
  state->close_timeout = options.open_timeout;
  void* range = nullptr;
  cudaDriverEntryPointQueryResult found{};
  if (cudaGetDriverEntryPointByVersion("cuMemGetAddressRange", &range, 12000, cudaEnableDefault, &found) ==
          cudaSuccess &&
      found == cudaDriverEntryPointSuccess)
    state->address_range = reinterpret_cast<decltype(state->address_range)>(range);
  if (options.stream) {
    state->stream = options.stream;
  } else {
    LF_TRY_STATUS(cuda_ok(cudaStreamCreateWithFlags(&state->stream, cudaStreamNonBlocking), "cudaStreamCreate"));
    state->own_stream = true;
  }
  // The scratch first: a rank that fails here leaves before NCCL, and the others' set-up times out.
  LF_TRY_STATUS(cuda_ok(cudaMalloc(&state->scratch, 2 * sizeof(std::int32_t)), "cudaMalloc"));
  LF_TRY_STATUS(cuda_ok(cudaMemset(state->scratch, 0, 2 * sizeof(std::int32_t)), "cudaMemset"));
  auto give_up = [&](Error e) -> Result<std::unique_ptr<Communicator>> {
    std::lock_guard lock(state->mutex);
    state->abort(e);
    return std::unexpected(std::move(e));
  };
  auto late = [&](std::string_view what) {
    return Error(Errc::Timeout, call,
                 str_format("group '{}': {} did not end within the open timeout (a rank is missing, or two ranks "
                            "share a device)",
                            state->group, what));
  };
  // NCCL connects ranks at their first call that needs it, which on a blocking communicator waits
  // for the peer on the calling thread. Opening makes the connections its small calls need (an
  // all_reduce, and in a small group sends and receives between every pair) while every rank is
  // known to be opening: on the non-blocking communicator first, bounded, then on the blocking one,
  // which shares its resources. Runs them on `c` and waits for them within the open timeout.
  auto warm = [&](ncclComm_t c) -> std::optional<Error> {
    const DeviceScope here(device);
    const bool peers = size <= kWarmPeers;
    auto* ints = static_cast<std::int32_t*>(state->scratch);
    ncclResult_t r = ncclGroupStart();
    if (r == ncclSuccess) r = ncclAllReduce(ints, ints, 1, ncclInt32, ncclSum, c, state->stream);
    for (std::uint32_t peer = 0; peers && peer < size && (r == ncclSuccess || r == ncclInProgress); ++peer) {
      if (peer == rank) continue;
      r = ncclSend(ints, 1, ncclInt32, static_cast<int>(peer), c, state->stream);
      if (r == ncclSuccess || r == ncclInProgress)
        r = ncclRecv(ints + 1, 1, ncclInt32, static_cast<int>(peer), c, state->stream);
    }
    const ncclResult_t ended = ncclGroupEnd();
    if (r == ncclSuccess || r == ncclInProgress) r = ended;
    if (r == ncclInProgress) r = NcclState::settle(c, deadline);
    if (r != ncclSuccess) return r == ncclInProgress ? late("NCCL's first calls") : nccl_error(r, call);
    cudaEvent_t done = nullptr;
    if (auto ok = cuda_ok(cudaEventCreateWithFlags(&done, cudaEventDisableTiming), "cudaEventCreateWithFlags"); !ok)
      return ok.error();
    const Event owned(done);
    if (auto ok = cuda_ok(cudaEventRecord(done, state->stream), "cudaEventRecord"); !ok) return ok.error();
    cudaError_t q = cudaErrorNotReady;
    (void)lavaflow::detail::wait_for(
        [&] { return (q = cudaEventQuery(done)) != cudaErrorNotReady; }, lavaflow::detail::never_stop,
        lavaflow::detail::Nap{std::chrono::microseconds(100)}, WaitMode::SpinThenBlock, deadline.left(),
        {.clock_every = 16, .relax = false, .spin_for = std::chrono::microseconds(100)},
        [] { return Error(Errc::Timeout, "cudaEventQuery", ""); });
    if (q == cudaErrorNotReady) return late("NCCL's first calls");
    if (q != cudaSuccess) return cuda_ok(q, call).error();
    return std::nullopt;
  };
  // Non-blocking: a rank that never arrives cannot hold this call past its timeout. Its resources
  // (connections among them) are shared with the communicator split from it.
  ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
  config.blocking = 0;
  config.splitShare = options.nonblocking ? 0 : 1;
  config.commName = state->group.c_str();  // names the group in NCCL's own logs
  ncclResult_t r = ncclCommInitRankConfig(&state->opened, static_cast<int>(size), id, static_cast<int>(rank), &config);
  state->comm = state->opened;
  if (r == ncclInProgress) r = state->settle(deadline);
  if (r != ncclSuccess) return give_up(r == ncclInProgress ? late("NCCL's set-up") : nccl_error(r, call));
  if (auto e = warm(state->opened)) return give_up(std::move(*e));
  if (!options.nonblocking) {
    // A non-blocking communicator starts a thread for every call it takes; the calls go to a
    // blocking one split from it instead. Splitting is a call of the non-blocking one, so it is
    // bounded by the same timeout.
    ncclConfig_t blocking = NCCL_CONFIG_INITIALIZER;
    blocking.blocking = 1;
    blocking.commName = state->group.c_str();
    ncclComm_t split = nullptr;
    r = ncclCommSplit(state->opened, 0, static_cast<int>(rank), &split, &blocking);
    // The split runs on a thread of NCCL's as the non-blocking communicator's call (which may
    // answer ncclSuccess at once): it settles there, and NCCL stores the new communicator when it
    // is made, before that.
    if (r == ncclSuccess || r == ncclInProgress) r = NcclState::settle(state->opened, deadline);
    const ncclComm_t child = std::atomic_ref<ncclComm_t>(split).load(std::memory_order_acquire);
    if (child) state->comm = child;
    if (r == ncclSuccess) r = child ? NcclState::settle(child, deadline) : ncclInternalError;
    if (r != ncclSuccess) {
      auto failed = give_up(r == ncclInProgress ? late("splitting NCCL's communicator") : nccl_error(r, call));
      // Aborting the parent ends the split's thread, which may store the child only then.
      if (const ncclComm_t stored = std::atomic_ref<ncclComm_t>(split).load(std::memory_order_acquire);
          stored && stored != child)
        (void)ncclCommAbort(stored);
      return failed;
    }
    if (auto e = warm(state->comm)) return give_up(std::move(*e));
  }
  return std::unique_ptr<Communicator>(std::make_unique<NcclCommunicator>(state, rank, size));
}

CommunicatorFactory nccl_communicators(CommunicatorFactory bootstrap, Backend bootstrap_backend, NcclOptions options) {
  return [bootstrap = std::move(bootstrap), bootstrap_backend, options](
             const ProcessGroup& group, std::uint32_t world_rank) -> Result<std::unique_ptr<Communicator>> {
    if (group.backend != Backend::Nccl) return bootstrap(group, world_rank);
    ProcessGroup through = group;
    through.backend = bootstrap_backend;
    LF_TRY(auto host, bootstrap(through, world_rank));
    return open_nccl(*host, options);
  };
}

}  // namespace lavaflow::mesh
