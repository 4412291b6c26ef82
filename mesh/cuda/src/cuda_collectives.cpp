// SPDX-License-Identifier: MIT
#include "lavaflow/mesh_cuda/cuda_collectives.hpp"

#include <unistd.h>

#include <algorithm>
#include <bit>
#include <cstring>
#include <deque>
#include <optional>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "cuda_util.hpp"
#include "kernels.hpp"
#include "lavaflow/core/detail/format.hpp"
#include "lavaflow/core/location.hpp"
#include "lavaflow/mesh/native.hpp"

namespace lavaflow::mesh {

namespace {

namespace k = cuda_kernels;

/// Tells apart calls that would exchange differently: the same on every rank for the same call.
/// Its top bit is never set. Mixed from the numbers, not formatted: it is on every call's path.
std::uint32_t call_signature(std::uint32_t kind, std::uint32_t dtype, std::uint32_t op, std::uint64_t bytes,
                             std::uint32_t root) {
  std::uint64_t h = 0x9e3779b97f4a7c15ull;
  for (const std::uint64_t v :
       {std::uint64_t{kind}, std::uint64_t{dtype}, std::uint64_t{op}, bytes, std::uint64_t{root}}) {
    h = (h ^ v) * 0xff51afd7ed558ccdull;
    h ^= h >> 33;
  }
  return static_cast<std::uint32_t>(h) & 0x7fffffffu;
}

/// "CudaCollectives::all_reduce" and so on: the API call's name.
std::string_view call_name(std::uint32_t kind) {
  switch (kind) {
    case k::kAllReduce:
      return "CudaCollectives::all_reduce";
    case k::kAllGather:
      return "CudaCollectives::all_gather";
    case k::kReduceScatter:
      return "CudaCollectives::reduce_scatter";
    default:
      return "CudaCollectives::broadcast";
  }
}

std::string_view kind_name(std::uint32_t kind) { return call_name(kind).substr(sizeof("CudaCollectives::") - 1); }

/// What every rank publishes at open: where it runs and its staging's IPC handle.
struct Card {
  std::uint64_t host = 0;
  std::uint64_t chunk = 0;  ///< every rank locates its peers' staging with its own: they must agree
  std::int32_t pid = 0;
  std::int32_t ok = 0;
  cudaIpcMemHandle_t handle{};
  char device_uuid[16]{};
  std::int32_t resident_blocks = 0;  ///< blocks of the collectives' kernel that fit on the device at once
};

class Collectives final : public CudaCollectives {
 public:
  explicit Collectives(Communicator& host) : host_(host) {}

  ~Collectives() override {
    if (!region_) return;
    if (opened_) {
      // Peers may still read this rank's staging in kernels of theirs: every rank's work ends,
      // then all leave together. Both bounded: a lost peer must not hang the destructor, and then
      // this rank's memory is left mapped rather than freed under a peer that may still read it.
      (void)cudaSetDevice(device_);
      const Deadline d(std::chrono::seconds(10));
      while (cudaEventQuery(done_) == cudaErrorNotReady && !d.passed()) std::this_thread::yield();
      const bool ended = cudaEventQuery(done_) == cudaSuccess;
      if (!host_.barrier({.timeout = std::chrono::seconds(10)}).wait() || !ended) return;
    }
    for (std::uint32_t q = 0; q < n_; ++q)
      if (q != me_ && regions_[q]) (void)cudaIpcCloseMemHandle(regions_[q]);
    (void)cudaFree(region_);
    if (error_) (void)cudaFreeHost(error_);
    if (done_) (void)cudaEventDestroy(done_);
  }

  Status init(const CudaCollectiveOptions& o) {
    constexpr const char* call = "CudaCollectives::open";
    n_ = host_.size();
    me_ = host_.rank();
    if (n_ > k::kMaxRanks)
      return fail(Errc::Unsupported, call, str_format("{} ranks (at most {} on one host)", n_, k::kMaxRanks));
    if (!std::has_single_bit(o.chunk_bytes) || o.chunk_bytes < (64u << 10) || o.chunk_bytes > (256u << 20))
      return fail(Errc::InvalidArgument, call,
                  str_format("chunk_bytes {} is not a power of two in 64 KiB … 256 MiB", o.chunk_bytes));
    chunk_ = o.chunk_bytes;
    Card mine;
    Status made = [&]() -> Status {
      device_ = o.device;
      if (device_ < 0) LF_TRY_STATUS(cuda_ok(cudaGetDevice(&device_), "cudaGetDevice"));
      LF_TRY_STATUS(cuda_ok(cudaSetDevice(device_), "cudaSetDevice"));
      cudaDeviceProp prop{};
      LF_TRY_STATUS(cuda_ok(cudaGetDeviceProperties(&prop, device_), "cudaGetDeviceProperties"));
      std::memcpy(mine.device_uuid, prop.uuid.bytes, sizeof mine.device_uuid);
      void* p = nullptr;
      const std::uint64_t control = k::kFlagBytes + k::ll_area_bytes(n_);
      LF_TRY_STATUS(cuda_ok(cudaMalloc(&p, control + 2 * chunk_), "cudaMalloc"));
      region_ = static_cast<unsigned char*>(p);
      // Epochs start at 0 and a call's is at least 1: no zeroed slot or LL word looks written.
      LF_TRY_STATUS(cuda_ok(cudaMemset(region_, 0, control), "cudaMemset"));
      LF_TRY_STATUS(cuda_ok(cudaIpcGetMemHandle(&mine.handle, region_), "cudaIpcGetMemHandle"));
      LF_TRY_STATUS(
          cuda_ok(cudaHostAlloc(reinterpret_cast<void**>(&error_), sizeof(k::ErrorRecord), cudaHostAllocMapped),
                  "cudaHostAlloc"));
      *error_ = {};
      LF_TRY_STATUS(cuda_ok(cudaEventCreateWithFlags(&done_, cudaEventDisableTiming), "cudaEventCreate"));
      // Loaded now, not at the first call: a lazy load while a peer's kernel waits can deadlock.
      LF_TRY_STATUS(cuda_ok(k::preload(), "cudaFuncGetAttributes"));
      LF_TRY_STATUS(cuda_ok(k::resident_blocks(device_, &mine.resident_blocks), "cudaOccupancyMaxActiveBlocks"));
      LF_TRY_STATUS(cuda_ok(cudaHostGetDevicePointer(reinterpret_cast<void**>(&error_device_), error_, 0),
                            "cudaHostGetDevicePointer"));
      return cuda_ok(cudaDeviceSynchronize(), "cudaDeviceSynchronize");
    }();
    auto here = HostIdentity::detect();
    mine.host = here ? name_hash(here->hostname + "/" + here->boot_id) : 0;
    mine.pid = static_cast<std::int32_t>(::getpid());
    mine.chunk = chunk_;
    mine.ok = made ? 1 : 0;
    std::vector<Card> cards(n_);
    auto exchanged = host_
                         .all_gather(std::as_bytes(std::span(&mine, 1)), std::as_writable_bytes(std::span(cards)),
                                     DType::U8, {.timeout = o.attach_timeout})
                         .wait();
    if (!exchanged) return std::unexpected(exchanged.error().within(call));
    if (!made) return std::unexpected(made.error().within(call));
    for (std::uint32_t q = 0; q < n_; ++q) {
      if (!cards[q].ok)
        return fail(Errc::PeerLost, call, str_format("rank {} of group '{}' failed to set up", q, host_.group()));
      if (cards[q].chunk != chunk_)
        return fail(Errc::InvalidArgument, call,
                    str_format("rank {} of group '{}' opened with chunk_bytes {}, this rank with {}", q, host_.group(),
                               cards[q].chunk, chunk_));
      if (cards[q].host != mine.host || !mine.host)
        return fail(Errc::Unsupported, call,
                    str_format("rank {} of group '{}' runs on another host: CUDA collectives need every rank on one "
                               "host (use the native backend across hosts)",
                               q, host_.group()));
      // A block waits for the same block of every peer: the blocks of all ranks on one GPU must be
      // resident together, or some wait for blocks that cannot start. Every rank takes the same
      // count from every card.
      std::int32_t sharing = 0;
      for (const auto& other : cards)
        sharing += std::memcmp(other.device_uuid, cards[q].device_uuid, sizeof other.device_uuid) == 0;
      if (cards[q].resident_blocks < sharing)
        return fail(Errc::Unsupported, call,
                    str_format("{} ranks of group '{}' share rank {}'s GPU, which holds {} blocks of the collectives' "
                               "kernel at once: fewer than one a rank",
                               sharing, host_.group(), q, cards[q].resident_blocks));
      blocks_ = std::min<std::uint32_t>(blocks_, static_cast<std::uint32_t>(cards[q].resident_blocks / sharing));
    }
    regions_.assign(n_, nullptr);
    regions_[me_] = region_;
    Status mapped;
    for (std::uint32_t q = 0; q < n_ && mapped; ++q) {
      if (q == me_) continue;
      void* p = nullptr;
      const auto e = cudaIpcOpenMemHandle(&p, cards[q].handle, cudaIpcMemLazyEnablePeerAccess);
      if (e != cudaSuccess)
        mapped = std::unexpected(cuda_ok(e, "cudaIpcOpenMemHandle")
                                     .error()
                                     .within(str_format("rank {} (pid {})'s staging", q, cards[q].pid)));
      else
        regions_[q] = static_cast<unsigned char*>(p);
    }
    // Every rank learns whether all could map all.
    const std::int32_t ok = mapped ? 1 : 0;
    std::vector<std::int32_t> all(n_);
    auto agreed = host_
                      .all_gather(std::as_bytes(std::span(&ok, 1)), std::as_writable_bytes(std::span(all)), DType::I32,
                                  {.timeout = o.attach_timeout})
                      .wait();
    if (!agreed) return std::unexpected(agreed.error().within(call));
    if (!mapped) return std::unexpected(mapped.error().within(call));
    for (std::uint32_t q = 0; q < n_; ++q)
      if (!all[q])
        return fail(Errc::Unsupported, call,
                    str_format("rank {} of group '{}' cannot map its peers' CUDA memory", q, host_.group()));
    opened_ = true;
    return {};
  }

  std::uint32_t rank() const override { return me_; }
  std::uint32_t size() const override { return n_; }
  int device() const override { return device_; }

  Status all_reduce(const void* send, void* recv, std::uint64_t bytes, DType type, ReduceOp op, cudaStream_t stream,
                    CallOptions options) override {
    return enqueue(k::kAllReduce, send, recv, bytes, type, op, 0, stream, options);
  }
  Status all_gather(const void* send, void* recv, std::uint64_t bytes, DType type, cudaStream_t stream,
                    CallOptions options) override {
    return enqueue(k::kAllGather, send, recv, bytes, type, ReduceOp::Sum, 0, stream, options);
  }
  Status reduce_scatter(const void* send, void* recv, std::uint64_t bytes, DType type, ReduceOp op, cudaStream_t stream,
                        CallOptions options) override {
    return enqueue(k::kReduceScatter, send, recv, bytes, type, op, 0, stream, options);
  }
  Status broadcast(void* buffer, std::uint64_t bytes, std::uint32_t root, DType type, cudaStream_t stream,
                   CallOptions options) override {
    return enqueue(k::kBroadcast, buffer, buffer, bytes, type, ReduceOp::Sum, root, stream, options);
  }

  Status check() const override {
    const unsigned long long packed = reinterpret_cast<const volatile k::ErrorRecord*>(error_)->packed;
    struct {
      std::uint32_t code, rank, call;
    } e{static_cast<std::uint32_t>(packed & 0xff), static_cast<std::uint32_t>((packed >> 8) & 0xffffff),
        static_cast<std::uint32_t>(packed >> 32)};
    if (e.code == k::kNone) return {};
    const auto known = std::ranges::find(recent_, e.call, &Recent::call);
    const std::string what = known != recent_.end()
                                 ? str_format("call {} of group '{}' ({} of {} bytes {})", e.call, host_.group(),
                                              kind_name(known->kind), known->bytes, to_string(known->type))
                                 : str_format("call {} of group '{}'", e.call, host_.group());
    const std::string call = "CudaCollectives";
    switch (e.code) {
      case k::kTimeout:
        return fail(Errc::Timeout, call, str_format("rank {} did not reach {} in time", e.rank, what));
      case k::kMismatch:
        return fail(Errc::InvalidArgument, call, str_format("rank {} made another call than {}", e.rank, what));
      case k::kCorrupt:
        return fail(Errc::Malformed, call,
                    str_format("rank {}'s flag holds a step no peer can be at during {}", e.rank, what));
      default:
        return fail(Errc::PeerLost, call, str_format("rank {} failed before {}", e.rank, what));
    }
  }

 private:
  Status enqueue(std::uint32_t kind, const void* send, void* recv, std::uint64_t bytes, DType type, ReduceOp op,
                 std::uint32_t root, cudaStream_t stream, CallOptions options) {
    const std::string_view call = call_name(kind);  // a string only for an error: this is every call's path
    if (static_cast<std::uint8_t>(type) > static_cast<std::uint8_t>(DType::U8) ||
        static_cast<std::uint8_t>(op) > static_cast<std::uint8_t>(ReduceOp::Average))
      return fail(Errc::InvalidArgument, std::string(call), "unknown element type or reduce op");
    if (bytes > UINT64_MAX / 2 / n_)  // the kernels address n × bytes
      return fail(Errc::InvalidArgument, std::string(call),
                  str_format("{} bytes per rank overflow {} ranks' buffers", bytes, n_));
    if (bytes % size_of(type))
      return fail(Errc::InvalidArgument, std::string(call),
                  str_format("{} bytes are not whole {} elements", bytes, to_string(type)));
    if (bytes && (!send || !recv)) return fail(Errc::InvalidArgument, std::string(call), "a null buffer");
    if ((reinterpret_cast<std::uintptr_t>(send) | reinterpret_cast<std::uintptr_t>(recv)) % size_of(type))
      return fail(Errc::InvalidArgument, std::string(call),
                  str_format("buffers not aligned to their {}-byte {} elements", size_of(type), to_string(type)));
    if (root >= n_)
      return fail(Errc::InvalidArgument, std::string(call), str_format("root {} is not a rank of {}", root, n_));
    LF_TRY_STATUS(check());
    if (bytes == 0) return {};
    k::Launch l{};
    l.kind = kind;
    l.dtype = static_cast<std::uint32_t>(type);
    l.op = static_cast<std::uint32_t>(op);
    l.ranks = n_;
    l.me = me_;
    l.root = root;
    l.call = ++calls_;
    l.blocks = blocks_;
    l.signature = call_signature(kind, l.dtype, kind == k::kAllReduce || kind == k::kReduceScatter ? l.op : 0, bytes,
                                 kind == k::kBroadcast ? root : 0);
    for (std::uint32_t q = 0; q < n_; ++q) l.regions[q] = regions_[q];
    l.send = send;
    l.recv = recv;
    l.bytes = bytes;
    l.chunk = chunk_;
    l.timeout_ns = options.timeout == kForever || options.timeout > std::chrono::hours(24 * 365)
                       ? UINT64_MAX
                       : static_cast<std::uint64_t>(std::max(options.timeout, Duration::zero()).count());
    l.error = error_device_;
    recent_.push_back({l.call, kind, bytes, type});
    if (recent_.size() > 256) recent_.pop_front();
    const DeviceScope on(device_);
    if (!on.status()) return std::unexpected(on.status().error().within(call));
    // Calls share this rank's staging and epochs: one on another stream waits for the last. A call
    // captured in a graph adds no event nodes (they cost a small call a fifth of its time): its
    // replays are ordered by the streams they run on, as the class comment asks of the caller.
    cudaStreamCaptureStatus capturing = cudaStreamCaptureStatusNone;
    (void)cudaStreamIsCapturing(stream, &capturing);
    const bool captured = capturing != cudaStreamCaptureStatusNone;
    if (!captured && last_stream_ && *last_stream_ != stream)
      LF_TRY_STATUS(cuda_ok(cudaStreamWaitEvent(stream, done_, 0), "cudaStreamWaitEvent"));
    auto s = cuda_ok(k::launch(l, stream), "cudaLaunchKernel");
    if (s && !captured) {
      s = cuda_ok(cudaEventRecord(done_, stream), "cudaEventRecord");
      last_stream_ = stream;
    }
    if (!s) return std::unexpected(s.error().within(call));
    return {};
  }

  Communicator& host_;
  std::uint32_t n_ = 1, me_ = 0;
  int device_ = 0;
  std::uint64_t chunk_ = 0;
  std::uint32_t blocks_ = k::kBlocks;  ///< blocks per kernel (fewer where ranks share a GPU)
  unsigned char* region_ = nullptr;
  std::vector<unsigned char*> regions_;
  k::ErrorRecord* error_ = nullptr;  // written by the GPU: read through a volatile pointer
  bool opened_ = false;
  cudaEvent_t done_ = nullptr;               ///< recorded after this rank's last call
  std::optional<cudaStream_t> last_stream_;  ///< the stream of that call
  k::ErrorRecord* error_device_ = nullptr;
  std::uint32_t calls_ = 0;
  /// The last calls, for errors that name one (described only then: this is on every call's path).
  struct Recent {
    std::uint32_t call, kind;
    std::uint64_t bytes;
    DType type;
  };
  std::deque<Recent> recent_;
};

}  // namespace

Result<std::unique_ptr<CudaCollectives>> CudaCollectives::open(Communicator& host, CudaCollectiveOptions options) {
  auto c = std::make_unique<Collectives>(host);
  LF_TRY_STATUS(c->init(options));
  return std::unique_ptr<CudaCollectives>(std::move(c));
}

}  // namespace lavaflow::mesh
