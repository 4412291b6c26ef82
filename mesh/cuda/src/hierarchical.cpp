// SPDX-License-Identifier: MIT
#include "hierarchical.hpp"

#include <algorithm>
#include <array>
#include <cstddef>
#include <optional>
#include <span>
#include <thread>
#include <utility>

#include "calls.hpp"
#include "cuda_util.hpp"
#include "hierarchy.hpp"
#include "kernels.hpp"
#include "lavaflow/core/detail/format.hpp"
#include "staging.hpp"

namespace lavaflow::mesh::detail {

namespace {

namespace k = cuda_kernels;

/// Below these sizes (bytes per rank) a call takes the group's staged path whole: the hierarchy
/// costs a kernel per in-host phase and an exchange between hosts per local index, which a small
/// call feels more than it gains from carrying less through host memory (measured on simulated
/// hosts, 2 × 2 ranks on NVLink; see note 0019). An all_reduce also needs its elements to split
/// evenly among a host's ranks: it goes reduce_scatter → hosts' all_reduce of a share →
/// all_gather, each rank carrying only its share between hosts.
constexpr std::uint64_t kAllReduceFrom = 256 << 10;
constexpr std::uint64_t kAllGatherFrom = 16 << 10;
constexpr std::uint64_t kReduceScatterFrom = 64 << 10;
constexpr std::uint64_t kBroadcastFrom = 64 << 10;

bool integer(DType t) { return t == DType::I32 || t == DType::I64 || t == DType::U8; }

/// How a reduction crosses the two levels so that a call gives what one level gives: f16 and bf16
/// sums and products travel as f32 and round once at the end; averages sum at both levels and
/// divide once by the group's size (integers truncating, floats rounding once).
struct Carry {
  bool wide = false;  ///< the levels carry f32 (f16/bf16 sum, product, average)
  DType type;         ///< the levels' element type
  ReduceOp each;      ///< the levels' op
  std::uint32_t by;   ///< the divisor at the end (1: none)
  /// Whether a kernel ends the call (narrow or divide).
  bool finish() const { return wide || by != 1; }
};
Carry carry(DType type, ReduceOp op, std::uint32_t ranks) {
  const bool order = op == ReduceOp::Min || op == ReduceOp::Max;  // exact in any type
  const bool wide = !order && (type == DType::F16 || type == DType::BF16);
  const bool average = op == ReduceOp::Average;
  return {
      .wide = wide, .type = wide ? DType::F32 : type, .each = average ? ReduceOp::Sum : op, .by = average ? ranks : 1};
}

/// Whether [a, a + an) and [b, b + bn) share a byte.
bool overlap(const void* a, std::uint64_t an, const void* b, std::uint64_t bn) {
  const auto x = reinterpret_cast<std::uintptr_t>(a), y = reinterpret_cast<std::uintptr_t>(b);
  return x < y + bn && y < x + an;
}

using cuda_calls::call_name;
using cuda_calls::wait_event;

/// Device memory for one call from the communicator's pool, freed in the call's stream order when
/// it goes (the next call, on any stream, comes after that in stream order).
class Scratch {
 public:
  Scratch() = default;
  Scratch(const Scratch&) = delete;
  Scratch& operator=(const Scratch&) = delete;
  ~Scratch() { release(); }
  /// Back to the pool in stream order, after the work enqueued so far.
  void release() {
    if (p_) (void)cudaFreeAsync(p_, stream_);
    p_ = nullptr;
  }
  Status make(cudaMemPool_t pool, std::uint64_t bytes, cudaStream_t stream) {
    stream_ = stream;
    void* p = nullptr;
    LF_TRY_STATUS(cuda_ok(cudaMallocFromPoolAsync(&p, bytes, pool, stream), "cudaMallocFromPoolAsync"));
    p_ = static_cast<unsigned char*>(p);
    return {};
  }
  [[nodiscard]] unsigned char* get() const { return p_; }

 private:
  unsigned char* p_ = nullptr;
  cudaStream_t stream_ = nullptr;
};

class Hierarchical final : public CudaCollectives {
 public:
  Hierarchical(Communicator& group, std::unique_ptr<CudaCollectives> staged, std::vector<std::uint32_t> hosts,
               std::int32_t on_my_gpu)
      : group_(group),
        hosts_(std::move(hosts)),
        device_(staged->device()),
        on_my_gpu_(on_my_gpu),
        flat_(std::move(staged)) {}

  ~Hierarchical() override {
    const DeviceScope on(device_);
    // The scratch is freed in stream order and the pool goes once it is; the inner communicators
    // wait for their peers as they end.
    if (done_) (void)wait_event(done_, Deadline(std::chrono::seconds(10)), "~CudaCollectives", "calls did not end");
    drop_levels();
    flat_.reset();
    if (pool_) (void)cudaMemPoolDestroy(pool_);
    if (phase_) (void)cudaEventDestroy(phase_);
    if (done_) (void)cudaEventDestroy(done_);
  }

  /// Opens the two levels. Where they cannot be opened on every rank (the opener fails, a peer
  /// cannot be mapped), every rank stays on the staged path and path_reason() says why; an error
  /// only when the group cannot agree on that.
  Status init(const CudaCollectiveOptions& o) {
    constexpr const char* call = "CudaCollectives::open";
    n_ = group_.size();
    me_ = group_.rank();
    chunk_ = o.chunk_bytes;
    hosts_n_ = 1 + *std::ranges::max_element(hosts_);
    per_host_ = n_ / hosts_n_;
    at_.assign(hosts_n_, {});
    for (std::uint32_t q = 0; q < n_; ++q) at_[hosts_[q]].push_back(q);
    h_ = hosts_[me_];
    j_ = static_cast<std::uint32_t>(std::ranges::find(at_[h_], me_) - at_[h_].begin());
    host_major_ = by_index_ = true;
    for (std::uint32_t h = 0; h < hosts_n_; ++h)
      for (std::uint32_t j = 0; j < per_host_; ++j) {
        host_major_ = host_major_ && at_[h][j] == h * per_host_ + j;
        by_index_ = by_index_ && at_[h][j] == j * hosts_n_ + h;
      }
    for (std::uint32_t h = 0; h < hosts_n_; ++h) across_ranks_.push_back(at_[h][j_]);
    LF_TRY(auto groups, hierarchy::open_subgroups(group_, o.open_group, at_[h_], across_ranks_, make_pool(),
                                                  o.attach_timeout, call));
    Status opened = groups.opened;
    if (opened) {
      local_group_ = std::move(groups.local);
      across_group_ = std::move(groups.across);
      CudaCollectiveOptions inner;
      inner.device = device_;
      inner.chunk_bytes = o.chunk_bytes;
      inner.attach_timeout = o.attach_timeout;
      inner.host = o.host;
      // Simulated hosts on one GPU run their in-host kernels side by side (under MPS): each
      // host's then takes only its share of the GPU.
      auto in_host = open_beside(*local_group_, inner, on_my_gpu_);
      auto between = CudaCollectives::open(*across_group_, inner);
      if (in_host) local_ = std::move(*in_host);
      if (between) across_ = std::move(*between);
      const Status mine = !in_host   ? Status(std::unexpected(in_host.error()))
                          : !between ? Status(std::unexpected(between.error()))
                                     : Status{};
      LF_TRY(opened, hierarchy::agreed(group_, mine, o.attach_timeout, call));
    }
    if (!opened) {
      drop_levels();
      reason_ = str_format("{}; not hierarchical: {}", flat_->path_reason(), opened.error().message());
      return {};
    }
    layered_ = true;
    reason_ = str_format(
        "{}: hierarchical over {} hosts of {} ranks — each host's phases are kernels over its ranks' mapped memory, "
        "and the ranks of each local index carry the exchange between hosts through pinned host memory",
        flat_->path_reason(), hosts_n_, per_host_);
    return {};
  }

  std::uint32_t rank() const override { return me_; }
  std::uint32_t size() const override { return n_; }
  int device() const override { return device_; }
  bool staged() const override { return true; }
  bool hierarchical() const override { return layered_; }
  const std::string& path_reason() const override { return reason_; }

  Status all_reduce(const void* send, void* recv, std::uint64_t bytes, DType type, ReduceOp op, cudaStream_t stream,
                    CallOptions o) override {
    return run(
        {k::kAllReduce, bytes, type, op, 0}, send, recv, stream,
        [&] { return bytes >= kAllReduceFrom && (bytes / size_of(type)) % per_host_ == 0; },
        [&](Status s) { return all_reduce_phases(std::move(s), send, recv, bytes, type, op, stream, o); },
        [&] { return flat_->all_reduce(send, recv, bytes, type, op, stream, o); });
  }
  Status all_gather(const void* send, void* recv, std::uint64_t bytes, DType type, cudaStream_t stream,
                    CallOptions o) override {
    return run(
        {k::kAllGather, bytes, type, ReduceOp::Sum, 0}, send, recv, stream, [&] { return bytes >= kAllGatherFrom; },
        [&](Status s) { return all_gather_phases(std::move(s), send, recv, bytes, type, stream, o); },
        [&] { return flat_->all_gather(send, recv, bytes, type, stream, o); });
  }
  Status reduce_scatter(const void* send, void* recv, std::uint64_t bytes, DType type, ReduceOp op, cudaStream_t stream,
                        CallOptions o) override {
    return run(
        {k::kReduceScatter, bytes, type, op, 0}, send, recv, stream, [&] { return bytes >= kReduceScatterFrom; },
        [&](Status s) { return reduce_scatter_phases(std::move(s), send, recv, bytes, type, op, stream, o); },
        [&] { return flat_->reduce_scatter(send, recv, bytes, type, op, stream, o); });
  }
  Status broadcast(void* buffer, std::uint64_t bytes, std::uint32_t root, DType type, cudaStream_t stream,
                   CallOptions o) override {
    return run(
        {k::kBroadcast, bytes, type, ReduceOp::Sum, root}, buffer, buffer, stream,
        [&] { return bytes >= kBroadcastFrom; },
        [&](Status s) { return broadcast_phases(std::move(s), buffer, bytes, root, type, stream, o); },
        [&] { return flat_->broadcast(buffer, bytes, root, type, stream, o); });
  }

  Status register_window(void*, std::uint64_t, CallOptions) override {
    return fail(Errc::Unsupported, "CudaCollectives::register_window",
                str_format("group '{}' spans hosts ({}): its peers on other hosts cannot map a window", group_.group(),
                           reason_));
  }
  Status deregister_window(void* base, CallOptions) override {
    return fail(Errc::NotFound, "CudaCollectives::deregister_window",
                str_format("no window of this rank starts at {}: a group that spans hosts has none", base));
  }

  Status check() const override {
    if (!failure_) return failure_;
    LF_TRY_STATUS(flat_->check());
    if (local_) LF_TRY_STATUS(local_->check());
    if (across_) LF_TRY_STATUS(across_->check());
    return {};
  }

 private:
  /// A call as every rank must make it: compared at each boundary between phases, since a call
  /// that differs between hosts could pair phases that look alike.
  struct Call {
    std::uint32_t kind;
    std::uint64_t bytes;
    DType type;
    ReduceOp op;
    std::uint32_t root;
    [[nodiscard]] std::string describe() const {
      return str_format("{} of {} bytes of {}{}", call_name(kind), bytes, to_string(type),
                        kind == k::kBroadcast   ? str_format(" from rank {}", root)
                        : kind == k::kAllGather ? std::string()
                                                : str_format(" ({})", to_string(op)));
    }
  };

  void drop_levels() {
    // The collectives before the communicators they run over.
    across_.reset();
    local_.reset();
    across_group_.reset();
    local_group_.reset();
  }

  /// The events, then the scratch pool: an error on this rank only.
  Status make_pool() {
    const DeviceScope on(device_);
    LF_TRY_STATUS(on.status());
    LF_TRY_STATUS(cuda_ok(cudaEventCreateWithFlags(&phase_, cudaEventDisableTiming), "cudaEventCreate"));
    LF_TRY_STATUS(cuda_ok(cudaEventCreateWithFlags(&done_, cudaEventDisableTiming), "cudaEventCreate"));
    cudaMemPoolProps props{};
    props.allocType = cudaMemAllocationTypePinned;
    props.location.type = cudaMemLocationTypeDevice;
    props.location.id = device_;
    LF_TRY_STATUS(cuda_ok(cudaMemPoolCreate(&pool_, &props), "cudaMemPoolCreate"));
    // Kept between calls: a call's scratch is the next call's, without a trip to the driver.
    std::uint64_t keep = UINT64_MAX;
    LF_TRY_STATUS(
        cuda_ok(cudaMemPoolSetAttribute(pool_, cudaMemPoolAttrReleaseThreshold, &keep), "cudaMemPoolSetAttribute"));
    int pitch = 0;
    LF_TRY_STATUS(cuda_ok(cudaDeviceGetAttribute(&pitch, cudaDevAttrMaxPitch, device_), "cudaDeviceGetAttribute"));
    max_pitch_ = static_cast<std::uint64_t>(pitch);
    return {};
  }

  /// The arguments checked as the one-host path checks them, then the call: its phases where
  /// `layered()` says so, else `whole` (the group's staged path), ordered after this rank's last
  /// call and recorded for the next; a failure once anything was enqueued stays. Without the
  /// levels every call is `whole`, which orders its own calls.
  template <class Layered, class Phases, class Whole>
  Status run(const Call& call, const void* send, const void* recv, cudaStream_t stream, Layered&& layered,
             Phases&& phases, Whole&& whole) {
    LF_TRY_STATUS(cuda_calls::check_arguments(call.kind, send, recv, call.bytes, call.type, call.op, call.root, n_));
    if (!layered_) return whole();
    const std::string_view name = call_name(call.kind);
    Status s = check();
    if (s && call.bytes == 0) return {};
    const bool split = layered();
    const CaptureModeScope relaxed;
    cudaStreamCaptureStatus capturing = cudaStreamCaptureStatusNone;
    if (s) s = cuda_ok(cudaStreamIsCapturing(stream, &capturing), "cudaStreamIsCapturing");
    // Refused on this rank only: its stream stays usable and the object sound.
    const bool refused = s && capturing != cudaStreamCaptureStatusNone;
    if (refused)
      s = fail(Errc::Unsupported, std::string(name),
               str_format("group '{}' spans hosts ({}): a call waits on the host for the exchange between hosts "
                          "and cannot be captured in a CUDA graph",
                          group_.group(), reason_));
    const DeviceScope on(device_);
    if (s) s = on.status();
    // A call staged whole meets no peer on the way: a rank that cannot begin it just fails.
    if (!split && !s) return s;
    call_ = call;
    unsigned long long id = 0;
    bool begun = false;  // something may go onto the stream
    if (s) s = cuda_ok(cudaStreamGetId(stream, &id), "cudaStreamGetId");
    if (s) {
      begun = true;
      if (last_stream_ && *last_stream_ != id)
        s = cuda_ok(cudaStreamWaitEvent(stream, done_, 0), "cudaStreamWaitEvent");
    }
    // A rank that cannot even begin still passes the boundaries of a hierarchical call, so that
    // its peers hear why rather than wait out their timeouts.
    s = split ? phases(std::move(s)) : s ? whole() : s;
    if (begun) {
      // Recorded whatever happened, after the scratch's release: what was enqueued still uses it.
      const Status recorded = cuda_ok(cudaEventRecord(done_, stream), "cudaEventRecord");
      last_stream_ = id;
      if (s && !recorded) s = recorded;
    }
    if (!s && !refused) {
      s = std::unexpected(s.error().within(name));
      failure_ = s;
    }
    return s;
  }

  /// A boundary between phases: the ranks of `level` (group ranks `ranks`, in its order) tell each
  /// other whether their part of the call so far succeeded, and which call they make. Every one
  /// then goes on only where all did, and learns who failed. A peer may come up to `timeouts` of
  /// the call's timeouts later than this rank (its phase before the boundary took that long), so
  /// the wait is one timeout and two seconds more; a call without a timeout waits without one.
  Status boundary(Status mine, Communicator& level, const std::vector<std::uint32_t>& ranks, std::string_view part,
                  std::uint64_t timeouts, const CallOptions& o) {
    // Bounded where the longer wait still runs out (and cannot overflow).
    const bool bounded = o.timeout < kLongestTimeout / static_cast<Duration::rep>(timeouts + 2);
    const Duration wait =
        bounded ? o.timeout * static_cast<Duration::rep>(timeouts + 1) + std::chrono::seconds(2) : kForever;
    const std::array<std::int64_t, 4> word{
        mine ? 1 : 0,
        static_cast<std::int64_t>(call_.kind | std::uint32_t(call_.type) << 8 | std::uint32_t(call_.op) << 16),
        static_cast<std::int64_t>(call_.bytes), call_.root};
    std::vector<std::int64_t> all(word.size() * level.size());
    const Status told = level
                            .all_gather(std::as_bytes(std::span(word)), std::as_writable_bytes(std::span(all)),
                                        DType::I64, {.timeout = wait})
                            .wait();
    if (!mine) return mine;
    if (!told) return told;
    for (std::uint32_t q = 0; q < level.size(); ++q) {
      const std::int64_t* w = all.data() + q * word.size();
      if (!std::equal(word.begin() + 1, word.end(), w + 1)) {
        const Call theirs{static_cast<std::uint32_t>(w[1] & 0xff), static_cast<std::uint64_t>(w[2]),
                          static_cast<DType>(w[1] >> 8 & 0xff), static_cast<ReduceOp>(w[1] >> 16 & 0xff),
                          static_cast<std::uint32_t>(w[3])};
        return fail(Errc::InvalidArgument, "CudaCollectives",
                    str_format("rank {} of group '{}' makes another call ({}) than this rank ({})", ranks[q],
                               group_.group(), theirs.describe(), call_.describe()));
      }
    }
    for (std::uint32_t q = 0; q < level.size(); ++q)
      if (!all[q * word.size()])
        return fail(Errc::PeerLost, "CudaCollectives",
                    str_format("rank {} of group '{}' (host {}) failed in {} (its error says why)", ranks[q],
                               group_.group(), hosts_[ranks[q]], part));
    return {};
  }

  /// After an in-host phase, before the exchange between hosts: the host waits for its phase (whose
  /// kernels end within the call's timeout, failed or not), then the ranks of this local index on
  /// every host pass the boundary, so that the exchange runs only where every host's part is whole.
  Status hosts_ready(Status s, cudaStream_t stream, const CallOptions& o) {
    if (s) s = cuda_ok(cudaEventRecord(phase_, stream), "cudaEventRecord");
    if (s) {
      constexpr std::string_view late = "the host's phase of the call did not end within its timeout";
      s = wait_event(phase_, Deadline(o.timeout), "cudaEventQuery", late);
      // The kernels time their own waits from their start on the GPU, a moment after this wait
      // began: a moment's grace lets a kernel that failed say why.
      if (!s && s.error().code() == Errc::Timeout)
        s = wait_event(phase_, Deadline(std::chrono::seconds(1)), "cudaEventQuery", late);
    }
    if (s) s = local_->check();
    return boundary(std::move(s), *across_group_, across_ranks_, "its host's phase of the call", 1, o);
  }

  /// After the exchange between hosts (of `bytes` a rank), before an in-host phase: the host's
  /// ranks pass the boundary, so that none enqueues a kernel that would wait for a peer whose
  /// exchange failed. An exchange waits for its peers up to a timeout per piece of the staged path.
  Status host_ready(Status s, std::uint64_t bytes, const CallOptions& o) {
    const std::uint64_t piece = staging::piece(bytes, chunk_ / (hosts_n_ + 1));
    return boundary(std::move(s), *local_group_, at_[h_], "the exchange between hosts", (bytes + piece - 1) / piece, o);
  }

  /// `count` elements of `type` at `from` as f32 in `into`, made for them.
  Status widen(Scratch& into, const void* from, std::uint64_t count, DType type, cudaStream_t stream) {
    LF_TRY_STATUS(into.make(pool_, count * sizeof(float), stream));
    return cuda_ok(
        k::widen(from, reinterpret_cast<float*>(into.get()), count, static_cast<std::uint32_t>(type), stream),
        "cudaLaunchKernel");
  }

  /// The end of a reduction carried per carry(): `from` (the levels' type) divided and rounded
  /// into `to` (the call's type); `to` may be `from` when the types are one.
  Status finished(const Carry& c, const void* from, void* to, std::uint64_t count, DType type, cudaStream_t stream) {
    if (integer(type))
      return cuda_ok(k::divide(to, count, static_cast<std::uint32_t>(type), c.by, stream), "cudaLaunchKernel");
    return cuda_ok(
        k::narrow(static_cast<const float*>(from), to, count, static_cast<std::uint32_t>(type), c.by, stream),
        "cudaLaunchKernel");
  }

  /// Copies `bytes`-long blocks between rank order and local-index order (host h's rank j at
  /// j × hosts + h, as the in-host phases of all_gather and reduce_scatter lay them out).
  Status rearrange(unsigned char* to, const unsigned char* from, std::uint64_t bytes, bool to_ranks,
                   cudaStream_t stream) {
    const std::uint64_t stride = std::uint64_t{per_host_} * bytes;
    for (std::uint32_t j = 0; j < per_host_; ++j) {
      if (host_major_ && stride <= max_pitch_) {
        // Rank h × per_host + j: the host's blocks of this index lie `stride` apart in rank order.
        unsigned char* dst = to_ranks ? to + j * bytes : to + std::uint64_t{j} * hosts_n_ * bytes;
        const unsigned char* src = to_ranks ? from + std::uint64_t{j} * hosts_n_ * bytes : from + j * bytes;
        LF_TRY_STATUS(cuda_ok(cudaMemcpy2DAsync(dst, to_ranks ? stride : bytes, src, to_ranks ? bytes : stride, bytes,
                                                hosts_n_, cudaMemcpyDeviceToDevice, stream),
                              "cudaMemcpy2DAsync"));
        continue;
      }
      for (std::uint32_t h = 0; h < hosts_n_; ++h) {
        const std::uint64_t ranked = std::uint64_t{at_[h][j]} * bytes,
                            indexed = (std::uint64_t{j} * hosts_n_ + h) * bytes;
        LF_TRY_STATUS(cuda_ok(cudaMemcpyAsync(to + (to_ranks ? ranked : indexed), from + (to_ranks ? indexed : ranked),
                                              bytes, cudaMemcpyDeviceToDevice, stream),
                              "cudaMemcpyAsync"));
      }
    }
    return {};
  }

  /// Each host's ranks reduce and scatter, the ranks of each local index reduce their share
  /// between hosts, and each host's ranks gather the shares.
  Status all_reduce_phases(Status s, const void* send, void* recv, std::uint64_t bytes, DType type, ReduceOp op,
                           cudaStream_t stream, const CallOptions& o) {
    const Carry c = carry(type, op, n_);
    const std::uint64_t count = bytes / size_of(type), share = count / per_host_;
    const std::uint64_t wide_share = share * size_of(c.type), share_bytes = share * size_of(type);
    Scratch widened, part, out;
    const void* in = send;
    if (s && c.wide) {
      s = widen(widened, send, count, type, stream);
      in = widened.get();
    }
    if (s) s = part.make(pool_, wide_share, stream);
    if (s) s = local_->reduce_scatter(in, part.get(), wide_share, c.type, c.each, stream, o);
    widened.release();
    s = hosts_ready(std::move(s), stream, o);
    if (s) s = across_->all_reduce(part.get(), part.get(), wide_share, c.type, c.each, stream, o);
    unsigned char* mine = part.get();
    if (s && c.wide) {
      s = out.make(pool_, share_bytes, stream);
      mine = out.get();
    }
    if (s && c.finish()) s = finished(c, part.get(), mine, share, type, stream);
    s = host_ready(std::move(s), wide_share, o);
    if (!s) return s;
    return local_->all_gather(mine, recv, share_bytes, type, stream, o);
  }

  /// Between hosts first (each rank carries only its own block there), then every host's ranks
  /// gather what their indices brought.
  Status all_gather_phases(Status s, const void* send, void* recv, std::uint64_t bytes, DType type, cudaStream_t stream,
                           const CallOptions& o) {
    // The row of this index's blocks lies in the output where the blocks are then put back in
    // rank order from scratch, and where it does not cover the input.
    const bool in_output = !by_index_ && !overlap(send, bytes, recv, bytes * hosts_n_);
    Scratch row_scratch, all;
    if (s && !in_output) s = row_scratch.make(pool_, bytes * hosts_n_, stream);
    unsigned char* row = in_output ? static_cast<unsigned char*>(recv) : row_scratch.get();
    if (s) s = across_->all_gather(send, row, bytes, type, stream, o);
    s = host_ready(std::move(s), bytes, o);
    if (s && !by_index_) s = all.make(pool_, bytes * n_, stream);
    if (!s) return s;
    unsigned char* out = by_index_ ? static_cast<unsigned char*>(recv) : all.get();
    LF_TRY_STATUS(local_->all_gather(row, out, bytes * hosts_n_, type, stream, o));
    return by_index_ ? Status{} : rearrange(static_cast<unsigned char*>(recv), out, bytes, true, stream);
  }

  /// Inside each host first (each index reduces the blocks of its own index on every host), then
  /// between hosts.
  Status reduce_scatter_phases(Status s, const void* send, void* recv, std::uint64_t bytes, DType type, ReduceOp op,
                               cudaStream_t stream, const CallOptions& o) {
    const Carry c = carry(type, op, n_);
    const std::uint64_t count = bytes / size_of(type), wide_bytes = count * size_of(c.type);
    const void* in = send;
    Scratch arranged, widened, row, out;
    if (s && !by_index_) {
      s = arranged.make(pool_, bytes * n_, stream);
      if (s) s = rearrange(arranged.get(), static_cast<const unsigned char*>(send), bytes, false, stream);
      in = arranged.get();
    }
    if (s && c.wide) {
      s = widen(widened, in, count * n_, type, stream);
      in = widened.get();
      arranged.release();
    }
    if (s) s = row.make(pool_, wide_bytes * hosts_n_, stream);
    if (s) s = local_->reduce_scatter(in, row.get(), wide_bytes * hosts_n_, c.type, c.each, stream, o);
    arranged.release();
    widened.release();
    s = hosts_ready(std::move(s), stream, o);
    if (s && c.wide) s = out.make(pool_, wide_bytes, stream);
    void* result = c.wide ? static_cast<void*>(out.get()) : recv;
    if (s) s = across_->reduce_scatter(row.get(), result, wide_bytes, c.type, c.each, stream, o);
    if (s && c.finish()) s = finished(c, result, recv, count, type, stream);
    return s;
  }

  /// The root's index carries it between hosts; once that has succeeded, every host broadcasts
  /// from that index (its other ranks wait on the host for it rather than in a kernel).
  Status broadcast_phases(Status s, void* buffer, std::uint64_t bytes, std::uint32_t root, DType type,
                          cudaStream_t stream, const CallOptions& o) {
    const std::uint32_t host = hosts_[root];
    const auto index = static_cast<std::uint32_t>(std::ranges::find(at_[host], root) - at_[host].begin());
    if (s && j_ == index) s = across_->broadcast(buffer, bytes, host, type, stream, o);
    s = host_ready(std::move(s), bytes, o);
    if (!s) return s;
    return local_->broadcast(buffer, bytes, index, type, stream, o);
  }

  Communicator& group_;
  std::vector<std::uint32_t> hosts_;  ///< group rank → host index
  int device_;
  std::int32_t on_my_gpu_;  ///< the group's ranks on this rank's GPU
  std::uint32_t n_ = 0, me_ = 0, hosts_n_ = 0, per_host_ = 0;
  std::uint32_t h_ = 0, j_ = 0;                 ///< this rank's host and its index there
  std::vector<std::vector<std::uint32_t>> at_;  ///< [host][index] → group rank
  std::vector<std::uint32_t> across_ranks_;     ///< [host] → the group rank of this index there
  bool host_major_ = false;                     ///< rank h × per_host + j
  bool by_index_ = false;                       ///< rank j × hosts + h: local-index order is rank order
  bool layered_ = false;                        ///< the levels opened: calls large enough use them
  std::uint64_t max_pitch_ = 0;
  std::uint64_t chunk_ = 0;  ///< the staged exchange's slot (CudaCollectiveOptions::chunk_bytes)
  // The subgroups' communicators outlive the collectives over them (members end in reverse).
  std::unique_ptr<Communicator> local_group_, across_group_;
  std::unique_ptr<CudaCollectives> local_, across_;
  std::unique_ptr<CudaCollectives> flat_;  ///< the group's staged path, for small calls
  cudaMemPool_t pool_ = nullptr;
  cudaEvent_t phase_ = nullptr;  ///< the end of an in-host phase, for hosts_ready()
  cudaEvent_t done_ = nullptr;   ///< recorded after this rank's last call
  std::optional<unsigned long long> last_stream_;
  Call call_{};  ///< the call being made
  Status failure_;
  std::string reason_;
};

}  // namespace

Result<std::unique_ptr<CudaCollectives>> open_hierarchical(Communicator& group, std::unique_ptr<CudaCollectives> staged,
                                                           std::vector<std::uint32_t> hosts, std::int32_t on_my_gpu,
                                                           CudaCollectiveOptions options) {
  auto c = std::make_unique<Hierarchical>(group, std::move(staged), std::move(hosts), on_my_gpu);
  LF_TRY_STATUS(c->init(options));
  return std::unique_ptr<CudaCollectives>(std::move(c));
}

}  // namespace lavaflow::mesh::detail
