// SPDX-License-Identifier: MIT
#include "hierarchical.hpp"

#include <algorithm>
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

using cuda_calls::call_name;
using cuda_calls::wait_event;

using hierarchy::agree;

/// Device memory for one call from the communicator's pool, freed in the call's stream order when
/// it goes (the next call, on any stream, comes after that in stream order).
class Scratch {
 public:
  Scratch() = default;
  Scratch(const Scratch&) = delete;
  Scratch& operator=(const Scratch&) = delete;
  ~Scratch() {
    if (p_) (void)cudaFreeAsync(p_, stream_);
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
  Hierarchical(Communicator& group, std::unique_ptr<CudaCollectives> staged, std::vector<std::uint32_t> hosts)
      : group_(group), hosts_(std::move(hosts)), device_(staged->device()), flat_(std::move(staged)) {}

  ~Hierarchical() override {
    const DeviceScope on(device_);
    // The scratch is freed in stream order and the pool goes once it is; the inner communicators
    // wait for their peers as they end.
    if (done_) (void)wait_event(done_, Deadline(std::chrono::seconds(10)), "~CudaCollectives", "calls did not end");
    across_.reset();
    local_.reset();
    flat_.reset();
    if (pool_) (void)cudaMemPoolDestroy(pool_);
    if (phase_) (void)cudaEventDestroy(phase_);
    if (done_) (void)cudaEventDestroy(done_);
  }

  Status init(const CudaCollectiveOptions& o) {
    constexpr const char* call = "CudaCollectives::open";
    n_ = group_.size();
    me_ = group_.rank();
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
    std::vector<std::uint32_t> across;
    for (std::uint32_t h = 0; h < hosts_n_; ++h) across.push_back(at_[h][j_]);
    LF_TRY(auto groups,
           hierarchy::open_subgroups(group_, o.open_group, at_[h_], across, make_pool(), o.attach_timeout, call));
    local_group_ = std::move(groups.local);
    across_group_ = std::move(groups.across);
    CudaCollectiveOptions inner;
    inner.device = device_;
    inner.chunk_bytes = o.chunk_bytes;
    inner.attach_timeout = o.attach_timeout;
    inner.host = o.host;
    auto in_host = CudaCollectives::open(*local_group_, inner);
    auto between = CudaCollectives::open(*across_group_, inner);
    Status opened = !in_host   ? Status(std::unexpected(in_host.error()))
                    : !between ? Status(std::unexpected(between.error()))
                               : Status{};
    LF_TRY_STATUS(agree(group_, opened, o.attach_timeout, call));
    local_ = std::move(*in_host);
    across_ = std::move(*between);
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
  bool hierarchical() const override { return true; }
  const std::string& path_reason() const override { return reason_; }

  Status all_reduce(const void* send, void* recv, std::uint64_t bytes, DType type, ReduceOp op, cudaStream_t stream,
                    CallOptions o) override {
    return run(k::kAllReduce, send, recv, bytes, type, op, 0, stream, [&] {
      return bytes >= kAllReduceFrom && (bytes / size_of(type)) % per_host_ == 0
                 ? all_reduce_phases(send, recv, bytes, type, op, stream, o)
                 : flat_->all_reduce(send, recv, bytes, type, op, stream, o);
    });
  }
  Status all_gather(const void* send, void* recv, std::uint64_t bytes, DType type, cudaStream_t stream,
                    CallOptions o) override {
    return run(k::kAllGather, send, recv, bytes, type, ReduceOp::Sum, 0, stream, [&] {
      return bytes >= kAllGatherFrom ? all_gather_phases(send, recv, bytes, type, stream, o)
                                     : flat_->all_gather(send, recv, bytes, type, stream, o);
    });
  }
  Status reduce_scatter(const void* send, void* recv, std::uint64_t bytes, DType type, ReduceOp op, cudaStream_t stream,
                        CallOptions o) override {
    return run(k::kReduceScatter, send, recv, bytes, type, op, 0, stream, [&] {
      return bytes >= kReduceScatterFrom ? reduce_scatter_phases(send, recv, bytes, type, op, stream, o)
                                         : flat_->reduce_scatter(send, recv, bytes, type, op, stream, o);
    });
  }
  Status broadcast(void* buffer, std::uint64_t bytes, std::uint32_t root, DType type, cudaStream_t stream,
                   CallOptions o) override {
    return run(k::kBroadcast, buffer, buffer, bytes, type, ReduceOp::Sum, root, stream, [&]() -> Status {
      if (bytes < kBroadcastFrom) return flat_->broadcast(buffer, bytes, root, type, stream, o);
      const std::uint32_t host = hosts_[root];
      const auto index = static_cast<std::uint32_t>(std::ranges::find(at_[host], root) - at_[host].begin());
      if (j_ == index) LF_TRY_STATUS(across_->broadcast(buffer, bytes, host, type, stream, o));
      return local_->broadcast(buffer, bytes, index, type, stream, o);
    });
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
  Status make_pool() {
    const DeviceScope on(device_);
    LF_TRY_STATUS(on.status());
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
    LF_TRY_STATUS(cuda_ok(cudaEventCreateWithFlags(&phase_, cudaEventDisableTiming), "cudaEventCreate"));
    return cuda_ok(cudaEventCreateWithFlags(&done_, cudaEventDisableTiming), "cudaEventCreate");
  }

  /// The arguments checked as the one-host path checks them, then the call's phases, ordered after
  /// this rank's last call and recorded for the next; a failure once anything was enqueued stays.
  template <class Phases>
  Status run(std::uint32_t kind, const void* send, const void* recv, std::uint64_t bytes, DType type, ReduceOp op,
             std::uint32_t root, cudaStream_t stream, Phases&& phases) {
    LF_TRY_STATUS(cuda_calls::check_arguments(kind, send, recv, bytes, type, op, root, n_));
    LF_TRY_STATUS(check());
    const std::string_view name = call_name(kind);
    if (bytes == 0) return {};
    const CaptureModeScope relaxed;
    cudaStreamCaptureStatus capturing = cudaStreamCaptureStatusNone;
    LF_TRY_STATUS(cuda_ok(cudaStreamIsCapturing(stream, &capturing), "cudaStreamIsCapturing"));
    if (capturing != cudaStreamCaptureStatusNone)
      return fail(Errc::Unsupported, std::string(name),
                  str_format("group '{}' spans hosts ({}): a call waits on the host for the exchange between hosts "
                             "and cannot be captured in a CUDA graph",
                             group_.group(), reason_));
    const DeviceScope on(device_);
    LF_TRY_STATUS(on.status());
    unsigned long long id = 0;
    Status s = cuda_ok(cudaStreamGetId(stream, &id), "cudaStreamGetId");
    if (s && last_stream_ && *last_stream_ != id)
      s = cuda_ok(cudaStreamWaitEvent(stream, done_, 0), "cudaStreamWaitEvent");
    if (s) s = phases();
    // Recorded whatever happened, after the scratch's release: what was enqueued still uses it.
    const Status recorded = cuda_ok(cudaEventRecord(done_, stream), "cudaEventRecord");
    last_stream_ = id;
    if (s && !recorded) s = recorded;
    if (!s) {
      s = std::unexpected(s.error().within(name));
      failure_ = s;
    }
    return s;
  }

  /// After an in-host phase, before the exchange between hosts: the host waits for its phase (whose
  /// kernels end within the call's timeout, failed or not), then the ranks of this local index on
  /// every host tell each other whether theirs succeeded, so that the exchange runs only where every
  /// host's part is whole, and every rank learns of a failure on another host at once.
  Status hosts_ready(cudaStream_t stream, const CallOptions& o) {
    LF_TRY_STATUS(cuda_ok(cudaEventRecord(phase_, stream), "cudaEventRecord"));
    constexpr std::string_view late = "the host's phase of the call did not end within its timeout";
    Status mine = wait_event(phase_, Deadline(o.timeout), "cudaEventQuery", late);
    // The kernels time their own waits from their start on the GPU, a moment after this wait
    // began: a moment's grace lets a kernel that failed say why.
    if (!mine && mine.error().code() == Errc::Timeout)
      mine = wait_event(phase_, Deadline(std::chrono::seconds(1)), "cudaEventQuery", late);
    if (mine) mine = local_->check();
    const std::int32_t ok = mine ? 1 : 0;
    std::vector<std::int32_t> all(hosts_n_);
    const Status told = across_group_
                            ->all_gather(std::as_bytes(std::span(&ok, 1)), std::as_writable_bytes(std::span(all)),
                                         DType::I32, {.timeout = o.timeout})
                            .wait();
    if (!mine) return mine;
    if (!told) return told;
    for (std::uint32_t h = 0; h < hosts_n_; ++h)
      if (!all[h])
        return fail(Errc::PeerLost, "CudaCollectives",
                    str_format("rank {} of group '{}' (host {}) failed in its host's phase of the call (its host's "
                               "ranks report why)",
                               at_[h][j_], group_.group(), h));
    return {};
  }

  Status divided(void* data, std::uint64_t bytes, DType type, cudaStream_t stream) {
    return cuda_ok(k::divide(data, bytes / size_of(type), static_cast<std::uint32_t>(type), n_, stream),
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
  Status all_reduce_phases(const void* send, void* recv, std::uint64_t bytes, DType type, ReduceOp op,
                           cudaStream_t stream, const CallOptions& o) {
    // An integer Average sums in the element's width and divides once at the end, as on one host;
    // floating-point averages average per level (the same number of ranks on every host).
    const bool divide = op == ReduceOp::Average && integer(type);
    const ReduceOp each = divide ? ReduceOp::Sum : op;
    const std::uint64_t share = bytes / per_host_;
    Scratch part;
    LF_TRY_STATUS(part.make(pool_, share, stream));
    LF_TRY_STATUS(local_->reduce_scatter(send, part.get(), share, type, each, stream, o));
    LF_TRY_STATUS(hosts_ready(stream, o));
    LF_TRY_STATUS(across_->all_reduce(part.get(), part.get(), share, type, each, stream, o));
    if (divide) LF_TRY_STATUS(divided(part.get(), share, type, stream));
    return local_->all_gather(part.get(), recv, share, type, stream, o);
  }

  /// Between hosts first (each rank carries only its own block there), then every host's ranks
  /// gather what their indices brought.
  Status all_gather_phases(const void* send, void* recv, std::uint64_t bytes, DType type, cudaStream_t stream,
                           const CallOptions& o) {
    Scratch row;
    LF_TRY_STATUS(row.make(pool_, bytes * hosts_n_, stream));
    LF_TRY_STATUS(across_->all_gather(send, row.get(), bytes, type, stream, o));
    Scratch all;
    if (!by_index_) LF_TRY_STATUS(all.make(pool_, bytes * n_, stream));
    unsigned char* out = by_index_ ? static_cast<unsigned char*>(recv) : all.get();
    LF_TRY_STATUS(local_->all_gather(row.get(), out, bytes * hosts_n_, type, stream, o));
    return by_index_ ? Status{} : rearrange(static_cast<unsigned char*>(recv), out, bytes, true, stream);
  }

  /// Inside each host first (each index reduces the blocks of its own index on every host), then
  /// between hosts.
  Status reduce_scatter_phases(const void* send, void* recv, std::uint64_t bytes, DType type, ReduceOp op,
                               cudaStream_t stream, const CallOptions& o) {
    const bool divide = op == ReduceOp::Average && integer(type);
    const ReduceOp each = divide ? ReduceOp::Sum : op;
    const void* in = send;
    Scratch arranged;
    if (!by_index_) {
      LF_TRY_STATUS(arranged.make(pool_, bytes * n_, stream));
      LF_TRY_STATUS(rearrange(arranged.get(), static_cast<const unsigned char*>(send), bytes, false, stream));
      in = arranged.get();
    }
    Scratch row;
    LF_TRY_STATUS(row.make(pool_, bytes * hosts_n_, stream));
    LF_TRY_STATUS(local_->reduce_scatter(in, row.get(), bytes * hosts_n_, type, each, stream, o));
    LF_TRY_STATUS(hosts_ready(stream, o));
    LF_TRY_STATUS(across_->reduce_scatter(row.get(), recv, bytes, type, each, stream, o));
    if (divide) LF_TRY_STATUS(divided(recv, bytes, type, stream));
    return {};
  }

  Communicator& group_;
  std::vector<std::uint32_t> hosts_;  ///< group rank → host index
  int device_;
  std::uint32_t n_ = 0, me_ = 0, hosts_n_ = 0, per_host_ = 0;
  std::uint32_t h_ = 0, j_ = 0;                 ///< this rank's host and its index there
  std::vector<std::vector<std::uint32_t>> at_;  ///< [host][index] → group rank
  bool host_major_ = false;                     ///< rank h × per_host + j
  bool by_index_ = false;                       ///< rank j × hosts + h: local-index order is rank order
  std::uint64_t max_pitch_ = 0;
  // The subgroups' communicators outlive the collectives over them (members end in reverse).
  std::unique_ptr<Communicator> local_group_, across_group_;
  std::unique_ptr<CudaCollectives> local_, across_;
  std::unique_ptr<CudaCollectives> flat_;  ///< the group's staged path, for small calls
  cudaMemPool_t pool_ = nullptr;
  cudaEvent_t phase_ = nullptr;  ///< the end of an in-host phase, for hosts_ready()
  cudaEvent_t done_ = nullptr;   ///< recorded after this rank's last call
  std::optional<unsigned long long> last_stream_;
  Status failure_;
  std::string reason_;
};

}  // namespace

Result<std::unique_ptr<CudaCollectives>> open_hierarchical(Communicator& group, std::unique_ptr<CudaCollectives> staged,
                                                           std::vector<std::uint32_t> hosts,
                                                           CudaCollectiveOptions options) {
  auto c = std::make_unique<Hierarchical>(group, std::move(staged), std::move(hosts));
  LF_TRY_STATUS(c->init(options));
  return std::unique_ptr<CudaCollectives>(std::move(c));
}

}  // namespace lavaflow::mesh::detail
