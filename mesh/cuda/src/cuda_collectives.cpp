// SPDX-License-Identifier: MIT
#include "lavaflow/mesh_cuda/cuda_collectives.hpp"

#include <cuda.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <bit>
#include <cstddef>
#include <cstring>
#include <deque>
#include <initializer_list>
#include <optional>
#include <string>
#include <thread>
#include <tuple>
#include <utility>
#include <vector>

#include "calls.hpp"
#include "cuda_util.hpp"
#include "hierarchical.hpp"
#include "kernels.hpp"
#include "lavaflow/core/detail/format.hpp"
#include "lavaflow/core/location.hpp"
#include "lavaflow/mesh/native.hpp"
#include "staging.hpp"

namespace lavaflow::mesh {

namespace {

namespace k = cuda_kernels;

/// Tells apart calls that would exchange differently: the same on every rank for the same call.
/// Its top bit is never set. Mixed from the numbers, not formatted: it is on every call's path.
std::uint32_t call_signature(std::initializer_list<std::uint64_t> values) {
  std::uint64_t h = 0x9e3779b97f4a7c15ull;
  for (const std::uint64_t v : values) {
    h = (h ^ v) * 0xff51afd7ed558ccdull;
    h ^= h >> 33;
  }
  return static_cast<std::uint32_t>(h) & 0x7fffffffu;
}

using cuda_calls::call_name;
using cuda_calls::wait_event;

std::string_view kind_name(std::uint32_t kind) { return call_name(kind).substr(sizeof("CudaCollectives::") - 1); }

/// What every rank publishes at open: where it runs and how it opened.
struct Card {
  std::uint64_t host = 0;
  std::uint64_t chunk = 0;  ///< every rank locates its peers' staging with its own: they must agree
  std::int32_t pid = 0;
  std::int32_t ok = 0;
  std::int32_t stage = 0;    ///< asked to stage through host memory
  std::int32_t grouped = 0;  ///< given CudaCollectiveOptions::open_group
  char device_uuid[16]{};
};

/// What every rank publishes once the path is known (kernels): whether its staging is ready, the
/// handle that maps it, and how many blocks of the collectives' kernel fit on its device at once.
struct Staging {
  std::int32_t ok = 0;
  std::int32_t resident_blocks = 0;
  /// Ranks of an enclosing group whose kernels run on this rank's GPU beside this group's (the
  /// other simulated hosts of a hierarchical group); 0: only this group's.
  std::int32_t sharers = 0;
  cudaIpcMemHandle_t handle{};
};

/// How many of the group's ranks run on the GPU of `uuid`.
std::int32_t ranks_on(const std::vector<Card>& cards, const char (&uuid)[16]) {
  return static_cast<std::int32_t>(std::ranges::count_if(
      cards, [&](const Card& c) { return std::memcmp(c.device_uuid, uuid, sizeof c.device_uuid) == 0; }));
}

class Collectives final : public CudaCollectives {
 public:
  explicit Collectives(Communicator& host, std::int32_t sharers = 0) : host_(host), sharers_(sharers) {}

  ~Collectives() override {
    if (!error_) return;  // nothing was made
    (void)cudaSetDevice(device_);
    // Peers may still read this rank's staging in kernels of theirs, and this rank's copies may
    // still use its slots: every rank's work ends, then all leave together. Both bounded: a lost
    // peer must not hang the destructor, and then this rank's memory is left mapped rather than
    // freed under a peer (or a copy) that may still use it.
    const bool ended =
        !done_ || wait_event(done_, Deadline(std::chrono::seconds(10)), "~CudaCollectives", "calls did not end");
    // Every rank learns whether every rank's work ended, in the same exchanges on every rank, and
    // none unmaps or frees unless all did.
    if (opened_ && region_) {
      const Status mine = ended ? Status{} : fail(Errc::Timeout, "~CudaCollectives", "this rank's calls did not end");
      if (!agree(mine, std::chrono::seconds(10), "~CudaCollectives")) return;
    } else if (!ended) {
      return;
    }
    for (std::uint32_t q = 0; q < regions_.size(); ++q)
      if (q != me_ && regions_[q]) (void)cudaIpcCloseMemHandle(regions_[q]);
    for (const Window& w : windows_) unmap(w);
    // Freed once every peer has unmapped it, and so may the callers' windows be once this returns
    // (when an exchange fails, nothing is freed: a peer may still map it).
    if (opened_ && region_ && !host_.barrier({.timeout = std::chrono::seconds(10)}).wait()) return;
    if (region_) (void)cudaFree(region_);
    if (slots_) (void)cudaFreeHost(slots_);
    for (cudaEvent_t e : filled_)
      if (e) (void)cudaEventDestroy(e);
    if (error_) (void)cudaFreeHost(error_);
    if (done_) (void)cudaEventDestroy(done_);
  }

  Status init(const CudaCollectiveOptions& o) {
    constexpr const char* call = "CudaCollectives::open";
    n_ = host_.size();
    me_ = host_.rank();
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
      LF_TRY_STATUS(
          cuda_ok(cudaHostAlloc(reinterpret_cast<void**>(&error_), sizeof(k::ErrorRecord), cudaHostAllocMapped),
                  "cudaHostAlloc"));
      *error_ = {};
      LF_TRY_STATUS(cuda_ok(cudaEventCreateWithFlags(&done_, cudaEventDisableTiming), "cudaEventCreate"));
      return cuda_ok(cudaHostGetDevicePointer(reinterpret_cast<void**>(&error_device_), error_, 0),
                     "cudaHostGetDevicePointer");
    }();
    if (!o.host.empty()) {
      mine.host = name_hash("simulated/" + o.host);
    } else {
      auto here = HostIdentity::detect();
      mine.host = here ? name_hash(here->hostname + "/" + here->boot_id) : 0;
    }
    mine.pid = static_cast<std::int32_t>(::getpid());
    mine.chunk = chunk_;
    mine.stage = o.stage_through_host ? 1 : 0;
    mine.grouped = o.open_group ? 1 : 0;
    auto exchanged = exchange(mine, made, o.attach_timeout, call);
    if (!exchanged) return std::unexpected(exchanged.error());
    const std::vector<Card>& cards = *exchanged;
    on_my_gpu_ = ranks_on(cards, mine.device_uuid);
    reason_ = "every rank runs on this host: kernels over the peers' mapped staging";
    for (std::uint32_t q = 0; q < n_; ++q) {
      if (cards[q].chunk != chunk_ || cards[q].stage != mine.stage || cards[q].grouped != mine.grouped)
        return fail(Errc::InvalidArgument, call,
                    str_format("rank {} of group '{}' opened with chunk_bytes {}, stage_through_host {} and {} "
                               "open_group, this rank with {}, {} and {} open_group",
                               q, host_.group(), cards[q].chunk, cards[q].stage != 0, cards[q].grouped ? "an" : "no",
                               chunk_, mine.stage != 0, mine.grouped ? "an" : "no"));
      if ((cards[q].host != mine.host || !mine.host) && !staged_) {
        staged_ = true;
        reason_ = str_format(
            "rank {} of group '{}' runs on another host: every call stages through pinned host memory and the "
            "group's host collective",
            q, host_.group());
      }
    }
    if (mine.stage && !staged_) {
      staged_ = true;
      reason_ =
          "asked to stage through host memory: every call goes through pinned host memory and the group's "
          "host collective";
    }
    if (staged_ && !mine.stage && made) {
      // Across hosts: hierarchical where the subgroups can be opened and every host holds as many
      // of the group's ranks (the in-host phases split the data evenly among them).
      // Where it does, the staged path opened below still serves the calls too small for it.
      if (!o.open_group)
        reason_ += " (no open_group for in-host kernels)";
      else if (auto why = hosts_of(cards); !why.empty())
        reason_ += " (not hierarchical: " + why + ")";
    }
    return staged_ ? open_staged(o, call) : open_mapped(o, cards, call);
  }

  /// Group rank → host index (hosts numbered in the order of their lowest rank) when the group
  /// runs on several hosts; empty until init() finds it hierarchical.
  [[nodiscard]] const std::vector<std::uint32_t>& hosts() const { return hosts_; }
  /// The group's ranks on this rank's GPU, this one among them (known once init() has run).
  [[nodiscard]] std::int32_t on_my_gpu() const { return on_my_gpu_; }

  /// Fills hosts_ from the cards when a hierarchical path fits them; else says why it does not.
  std::string hosts_of(const std::vector<Card>& cards) {
    std::vector<std::uint64_t> seen;
    std::vector<std::uint32_t> index(n_), count;
    for (std::uint32_t q = 0; q < n_; ++q) {
      if (!cards[q].host) return str_format("rank {} does not know its host", q);
      auto at = std::ranges::find(seen, cards[q].host);
      if (at == seen.end()) {
        seen.push_back(cards[q].host);
        count.push_back(0);
        at = seen.end() - 1;
      }
      index[q] = static_cast<std::uint32_t>(at - seen.begin());
      ++count[index[q]];
    }
    for (std::size_t h = 0; h < count.size(); ++h) {
      if (count[h] != count[0]) return str_format("host {} holds {} of its ranks, host 0 {}", h, count[h], count[0]);
      if (count[h] > k::kMaxRanks) return str_format("{} ranks on a host (at most {})", count[h], k::kMaxRanks);
    }
    if (count[0] < 2) return "one rank per host: no in-host phase";
    hosts_ = std::move(index);
    return {};
  }

  /// Two pinned slots, each room for a piece of every rank and one more (all_gather and
  /// reduce_scatter carry n + 1 pieces of a slot), and an event per slot.
  Status open_staged(const CudaCollectiveOptions& o, const char* call) {
    slot_ = std::max<std::uint64_t>(chunk_, std::uint64_t{n_ + 1} * staging::kPartAlign);
    Status made = [&]() -> Status {
      LF_TRY_STATUS(
          cuda_ok(cudaHostAlloc(reinterpret_cast<void**>(&slots_), 2 * slot_, cudaHostAllocDefault), "cudaHostAlloc"));
      for (cudaEvent_t& e : filled_)
        LF_TRY_STATUS(cuda_ok(cudaEventCreateWithFlags(&e, cudaEventDisableTiming), "cudaEventCreate"));
      return {};
    }();
    LF_TRY_STATUS(agree(made, o.attach_timeout, call));
    opened_ = true;
    return {};
  }

  /// Every rank's record (`mine` with its `ok` set from `made`); this rank's failure first, then
  /// `code` naming the first rank whose `ok` is not set and what it `failed` at.
  template <class Record>
  Result<std::vector<Record>> exchange(Record mine, const Status& made, Duration timeout, const char* call,
                                       Errc code = Errc::PeerLost, std::string_view failed = "failed to set up") {
    mine.ok = made ? 1 : 0;
    std::vector<Record> all(n_);
    auto exchanged = host_
                         .all_gather(std::as_bytes(std::span(&mine, 1)), std::as_writable_bytes(std::span(all)),
                                     DType::U8, {.timeout = timeout})
                         .wait();
    if (!exchanged) return std::unexpected(exchanged.error().within(call));
    if (!made) return std::unexpected(made.error().within(call));
    for (std::uint32_t q = 0; q < n_; ++q)
      if (!all[q].ok) return fail(code, call, str_format("rank {} of group '{}' {}", q, host_.group(), failed));
    return all;
  }

  /// Every rank learns whether all succeeded at a step of opening (an exchange of `ok` alone).
  Status agree(const Status& mine, Duration timeout, const char* call, Errc code = Errc::PeerLost,
               std::string_view failed = "failed to set up") {
    struct Ok {
      std::int32_t ok = 0;
    };
    LF_TRY_STATUS(exchange(Ok{}, mine, timeout, call, code, failed));
    return {};
  }

  Status open_mapped(const CudaCollectiveOptions& o, const std::vector<Card>& cards, const char* call) {
    if (n_ > k::kMaxRanks)
      return fail(Errc::Unsupported, call, str_format("{} ranks (at most {} on one host)", n_, k::kMaxRanks));
    Staging mine;
    mine.sharers = sharers_;
    Status made = [&]() -> Status {
      // Loaded now, not at the first call: a lazy load while a peer's kernel waits can deadlock.
      LF_TRY_STATUS(cuda_ok(k::preload(), "cudaFuncGetAttributes"));
      LF_TRY_STATUS(cuda_ok(k::resident_blocks(device_, &mine.resident_blocks), "cudaOccupancyMaxActiveBlocks"));
      void* p = nullptr;
      const std::uint64_t control = k::kFlagBytes + k::ll_area_bytes(n_);
      LF_TRY_STATUS(cuda_ok(cudaMalloc(&p, control + 2 * chunk_), "cudaMalloc"));
      region_ = static_cast<unsigned char*>(p);
      // Epochs start at 0 and a call's is at least 1: no zeroed slot or LL word looks written.
      LF_TRY_STATUS(cuda_ok(cudaMemset(region_, 0, control), "cudaMemset"));
      LF_TRY_STATUS(cuda_ok(cudaIpcGetMemHandle(&mine.handle, region_), "cudaIpcGetMemHandle"));
      return cuda_ok(cudaDeviceSynchronize(), "cudaDeviceSynchronize");
    }();
    auto exchanged = exchange(mine, made, o.attach_timeout, call);
    if (!exchanged) return std::unexpected(exchanged.error());
    const std::vector<Staging>& all = *exchanged;
    int major = 0;
    early_launch_ =
        cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device_) == cudaSuccess && major >= 9;
    for (std::uint32_t q = 0; q < n_; ++q) {
      // A block waits for the same block of every peer: the blocks of all ranks on one GPU must be
      // resident together, or some wait for blocks that cannot start. Every rank takes the same
      // count from every rank's record.
      const std::int32_t sharing = std::max(ranks_on(cards, cards[q].device_uuid), all[q].sharers);
      if (all[q].resident_blocks < sharing)
        return fail(Errc::Unsupported, call,
                    str_format("{} ranks of group '{}' share rank {}'s GPU, which holds {} blocks of the collectives' "
                               "kernel at once: fewer than one a rank",
                               sharing, host_.group(), q, all[q].resident_blocks));
      blocks_ = std::min<std::uint32_t>(blocks_, static_cast<std::uint32_t>(all[q].resident_blocks / sharing));
      early_launch_ = early_launch_ && sharing == 1;
    }
    regions_.assign(n_, nullptr);
    regions_[me_] = region_;
    Status mapped;
    for (std::uint32_t q = 0; q < n_ && mapped; ++q) {
      if (q == me_) continue;
      void* p = nullptr;
      const auto e = cudaIpcOpenMemHandle(&p, all[q].handle, cudaIpcMemLazyEnablePeerAccess);
      if (e != cudaSuccess)
        mapped = std::unexpected(cuda_ok(e, "cudaIpcOpenMemHandle")
                                     .error()
                                     .within(str_format("rank {} (pid {})'s staging", q, cards[q].pid)));
      else
        regions_[q] = static_cast<unsigned char*>(p);
    }
    LF_TRY_STATUS(agree(mapped, o.attach_timeout, call, Errc::Unsupported, "cannot map its peers' CUDA memory"));
    k::Group group{};
    for (std::uint32_t q = 0; q < n_; ++q) group.regions[q] = regions_[q];
    LF_TRY_STATUS(agree(write_flags(offsetof(k::Flags, group), &group, sizeof group), o.attach_timeout, call));
    opened_ = true;
    return {};
  }

  std::uint32_t rank() const override { return me_; }
  std::uint32_t size() const override { return n_; }
  int device() const override { return device_; }
  bool staged() const override { return staged_; }
  bool hierarchical() const override { return false; }
  const std::string& path_reason() const override { return reason_; }

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

  Status register_window(void* base, std::uint64_t bytes, CallOptions options) override {
    constexpr const char* call = "CudaCollectives::register_window";
    if (staged_)
      return fail(Errc::Unsupported, call,
                  str_format("group '{}' stages through host memory ({}): its peers cannot map a window", host_.group(),
                             reason_));
    // What every rank publishes: its window's size, and the IPC handle and offset that map it.
    struct WindowCard {
      std::int32_t ok = 0;
      std::int32_t pid = 0;
      std::uint64_t bytes = 0;
      std::uint64_t offset = 0;  ///< of the window in its allocation, which the handle maps whole
      std::uint64_t slot = 0;    ///< the row it takes: the same on every rank
      cudaIpcMemHandle_t handle{};
    } mine;
    mine.pid = static_cast<std::int32_t>(::getpid());
    mine.bytes = bytes;
    const auto at = reinterpret_cast<std::uintptr_t>(base);
    // On this rank's device throughout: the peers' windows are mapped into its context.
    const DeviceScope on(device_);
    // The first free row: every rank registers and deregisters in the same order, so every rank
    // picks the same one.
    const std::size_t slot =
        static_cast<std::size_t>(std::ranges::find(windows_, std::uint64_t{0}, &Window::bytes) - windows_.begin());
    mine.slot = slot;
    Status made = [&]() -> Status {
      if (!on.status()) return std::unexpected(on.status().error().within(call));
      if (!base || bytes == 0) return fail(Errc::InvalidArgument, call, "an empty window");
      if (slot >= k::kMaxWindows)
        return fail(Errc::InvalidArgument, call,
                    str_format("{} windows are registered already, the most a communicator holds", k::kMaxWindows));
      if (bytes > UINTPTR_MAX - at)
        return fail(Errc::InvalidArgument, call, str_format("{} bytes from {} wrap the address space", bytes, base));
      for (std::size_t w = 0; w < windows_.size(); ++w)
        if (at < windows_[w].at + windows_[w].bytes && windows_[w].at < at + bytes)
          return fail(Errc::InvalidArgument, call,
                      str_format("{} bytes at {} overlap window {} ({} bytes at {:#x})", bytes, base, w,
                                 windows_[w].bytes, windows_[w].at));
      cudaPointerAttributes a{};
      if (cudaPointerGetAttributes(&a, base) != cudaSuccess || a.type != cudaMemoryTypeDevice || a.device != device_) {
        (void)cudaGetLastError();
        return fail(Errc::InvalidArgument, call,
                    str_format("{} is not CUDA device memory of this rank's device {}", base, device_));
      }
      // Through the runtime's entry point: linking the driver would tie the library to a machine
      // with one.
      using AddressRange = CUresult (*)(CUdeviceptr*, std::size_t*, CUdeviceptr);
      void* entry = nullptr;
      cudaDriverEntryPointQueryResult found{};
      if (cudaGetDriverEntryPointByVersion("cuMemGetAddressRange", &entry, 12000, cudaEnableDefault, &found) !=
              cudaSuccess ||
          found != cudaDriverEntryPointSuccess || !entry)
        return fail(Errc::Unsupported, call, "the CUDA driver offers no cuMemGetAddressRange");
      CUdeviceptr start = 0;
      std::size_t size = 0;
      if (reinterpret_cast<AddressRange>(entry)(&start, &size, static_cast<CUdeviceptr>(at)) != CUDA_SUCCESS)
        return fail(Errc::InvalidArgument, call, str_format("no CUDA allocation holds {}", base));
      if (bytes > start + size - at)
        return fail(Errc::InvalidArgument, call,
                    str_format("{} bytes at {} run past their CUDA allocation ({} bytes at {:#x})", bytes, base, size,
                               static_cast<std::uint64_t>(start)));
      mine.offset = at - start;
      if (const auto e = cudaIpcGetMemHandle(&mine.handle, reinterpret_cast<void*>(start)); e != cudaSuccess) {
        (void)cudaGetLastError();
        return fail(Errc::InvalidArgument, call,
                    str_format("cudaIpcGetMemHandle: {} (a window must be cudaMalloc memory)", cudaGetErrorString(e)));
      }
      return {};
    }();
    auto exchanged =
        exchange(mine, made, options.timeout, call, Errc::InvalidArgument, "could not register its window");
    if (!exchanged) return std::unexpected(exchanged.error());
    const std::vector<WindowCard>& all = *exchanged;
    for (std::uint32_t q = 0; q < n_; ++q) {
      if (all[q].bytes != bytes)
        return fail(Errc::InvalidArgument, call,
                    str_format("rank {} of group '{}' registered a window of {} bytes, this rank one of {}", q,
                               host_.group(), all[q].bytes, bytes));
      if (all[q].slot != slot)
        return fail(Errc::InvalidArgument, call,
                    str_format("rank {} of group '{}' holds other windows than this rank (its new window would be "
                               "number {}, here {}): register and deregister in the same order on every rank",
                               q, host_.group(), all[q].slot, slot));
    }
    Window w{at, bytes, true, std::vector<unsigned char*>(n_, nullptr)};
    for (const WindowCard& card : all) w.aligned = w.aligned && card.offset % 16 == 0;
    // This rank's row: where every rank's window is mapped here (its own is its own memory).
    Row row{};
    row[me_] = static_cast<unsigned char*>(base);
    Status mapped;
    for (std::uint32_t q = 0; q < n_ && mapped; ++q) {
      if (q == me_) continue;
      void* p = nullptr;
      if (const auto e = cudaIpcOpenMemHandle(&p, all[q].handle, cudaIpcMemLazyEnablePeerAccess); e != cudaSuccess)
        mapped = std::unexpected(
            cuda_ok(e, "cudaIpcOpenMemHandle").error().within(str_format("rank {} (pid {})'s window", q, all[q].pid)));
      else {
        w.opened[q] = static_cast<unsigned char*>(p);
        row[q] = w.opened[q] + all[q].offset;
      }
    }
    Status ready = agree(mapped, options.timeout, call, Errc::Unsupported, "cannot map its peers' windows");
    // No kernel reads this row before the next call.
    if (ready) ready = agree(write_flags(row_offset(slot), row.data(), sizeof row), options.timeout, call);
    if (!ready) {
      unmap(w);
      return std::unexpected(ready.error());
    }
    if (slot == windows_.size())
      windows_.push_back(std::move(w));
    else
      windows_[slot] = std::move(w);
    return {};
  }

  Status deregister_window(void* base, CallOptions options) override {
    constexpr const char* call = "CudaCollectives::deregister_window";
    const auto at = reinterpret_cast<std::uintptr_t>(base);
    const DeviceScope on(device_);
    const auto found = std::ranges::find_if(windows_, [&](const Window& w) { return w.bytes && w.at == at; });
    Status known = !on.status() ? std::unexpected(on.status().error().within(call))
                   : found != windows_.end()
                       ? Status{}
                       : fail(Errc::NotFound, call, str_format("no window of this rank starts at {}", base));
    // Three exchanges on every rank whatever happens here: first every rank has the window, then
    // every rank's calls have ended (a rank's calls write into its peers' windows, and its peers'
    // calls that write into its own end before its own do: a window call waits for the writes),
    // and only then does any rank unmap.
    LF_TRY_STATUS(agree(known, options.timeout, call, Errc::NotFound, "could not deregister the window it named"));
    const Status ended =
        wait_event(done_, Deadline(options.timeout), call, "this rank's last call did not end within the timeout");
    LF_TRY_STATUS(agree(ended, options.timeout, call, Errc::Timeout,
                        "did not end its calls in time: every rank keeps the window"));
    unmap(*found);
    // The row is cleared: a graph replayed after this (which the API forbids) faults rather than
    // writing through a row that another window takes later.
    const Row row{};
    const Status cleared =
        write_flags(row_offset(static_cast<std::size_t>(found - windows_.begin())), row.data(), sizeof row);
    *found = Window{};
    // Then every rank has unmapped its peers' windows: the memory may be freed once this returns.
    return agree(cleared, options.timeout, call);
  }

  Status check() const override {
    if (!failure_) return failure_;
    const unsigned long long packed = reinterpret_cast<const volatile k::ErrorRecord*>(error_)->packed;
    const k::FailureWord e = k::unpack(static_cast<std::uint32_t>(packed));
    const auto number = static_cast<std::uint32_t>(packed >> 32);
    if (e.code == k::kNone) return {};
    const auto known = std::ranges::find(recent_, number, &Recent::call);
    const std::string what = known != recent_.end()
                                 ? str_format("call {} of group '{}' ({} of {} bytes {})", number, host_.group(),
                                              kind_name(known->kind), known->bytes, to_string(known->type))
                                 : str_format("call {} of group '{}'", number, host_.group());
    const std::string call = "CudaCollectives";
    switch (e.code) {
      case k::kTimeout:
        return fail(Errc::Timeout, call, str_format("rank {} did not reach {} in time", e.rank, what));
      case k::kMismatch:
        return fail(Errc::InvalidArgument, call, str_format("rank {} made another call than {}", e.rank, what));
      case k::kPeerMismatch:
        return fail(Errc::InvalidArgument, call,
                    str_format("rank {} found that rank {} made another call than {}", e.rank, e.third, what));
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
    LF_TRY_STATUS(cuda_calls::check_arguments(kind, send, recv, bytes, type, op, root, n_));
    LF_TRY_STATUS(check());
    const std::string_view call = call_name(kind);  // a string only for an error: this is every call's path
    if (bytes == 0) return {};
    const std::uint64_t reduced =
        kind == k::kAllReduce || kind == k::kReduceScatter ? static_cast<std::uint64_t>(op) : 0;
    std::uint32_t signature =
        call_signature({kind, static_cast<std::uint64_t>(type), reduced, bytes, kind == k::kBroadcast ? root : 0u});
    if (staged_) return staged_call({signature, kind, bytes, type, options.timeout, stream}, send, recv, op, root);
    k::Launch l{};
    l.kind = kind;
    l.dtype = static_cast<std::uint32_t>(type);
    l.op = static_cast<std::uint32_t>(op);
    l.ranks = n_;
    l.me = me_;
    l.root = root;
    l.call = ++calls_;
    l.blocks = blocks_;
    // Written by the peers in place: the window and the offset are part of the call, so that ranks
    // that disagree stop before any write.
    if (const InWindows w = windows_of(kind, send, recv, bytes); w.out || w.in) {
      l.window = w.out;
      l.window_in = w.in;
      signature = call_signature({signature, w.out, w.out_at, w.in, w.in_at});
    }
    l.signature = signature;
    l.group = &reinterpret_cast<const k::Flags*>(region_)->group;
    l.send = send;
    l.recv = recv;
    l.bytes = bytes;
    l.chunk = chunk_;
    l.timeout_ns = endless(options.timeout)
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
    unsigned long long id = 0;
    if (!captured) {
      if (auto s = follow_last(stream, id); !s) return std::unexpected(s.error().within(call));
    }
    auto s = cuda_ok(k::launch(l, stream, early_launch_), "cudaLaunchKernelEx");
    if (s && !captured) {
      s = cuda_ok(cudaEventRecord(done_, stream), "cudaEventRecord");
      last_stream_ = id;
    }
    if (!s) return std::unexpected(s.error().within(call));
    return {};
  }

  /// A registered window: where it is here, and the peers' mappings to close (where each rank's
  /// window lies in them is in the window's row of the flag area, which only the kernels read).
  struct Window {
    std::uintptr_t at = 0;
    std::uint64_t bytes = 0;             ///< 0: a free row
    bool aligned = false;                ///< every rank's window starts on 16 bytes (allocations start on more)
    std::vector<unsigned char*> opened;  ///< peers': the start of the allocation their handle maps
  };
  /// A window's row in the flag area (Flags::windows): every rank's window, mapped here.
  using Row = std::array<unsigned char*, k::kMaxRanks>;
  static_assert(sizeof(Row) == sizeof(k::Flags::windows[0]));
  static std::size_t row_offset(std::size_t slot) { return offsetof(k::Flags, windows) + slot * sizeof(Row); }

  /// Writes `bytes` of `data` into this rank's flag area at `offset` and waits for the whole
  /// device: a copy from pageable memory can return before it lands, and the callers' streams need
  /// not wait for the legacy stream.
  Status write_flags(std::size_t offset, const void* data, std::size_t bytes) {
    LF_TRY_STATUS(cuda_ok(cudaMemcpy(region_ + offset, data, bytes, cudaMemcpyHostToDevice), "cudaMemcpy"));
    return cuda_ok(cudaDeviceSynchronize(), "cudaDeviceSynchronize");
  }

  static void unmap(const Window& w) {
    for (unsigned char* p : w.opened)
      if (p) (void)cudaIpcCloseMemHandle(p);
  }

  /// The window (1 + its index; 0: none) holding `total` bytes at `p`, where every rank's copy
  /// starts on 16 bytes, and the offset in it.
  std::pair<std::uint32_t, std::uint64_t> window_at(const void* p, std::uint64_t total) const {
    const auto at = reinterpret_cast<std::uintptr_t>(p);
    for (std::size_t w = 0; w < windows_.size(); ++w)
      if (at >= windows_[w].at && total <= windows_[w].bytes && at - windows_[w].at <= windows_[w].bytes - total) {
        const std::uint64_t offset = at - windows_[w].at;
        if (!windows_[w].aligned || offset % 16 != 0) break;
        return {static_cast<std::uint32_t>(w + 1), offset};
      }
    return {0, 0};
  }

  /// The windows of a call that moves through them (1 + index, 0: none) and its buffers' offsets.
  struct InWindows {
    std::uint32_t out = 0, in = 0;
    std::uint64_t out_at = 0, in_at = 0;
  };
  /// Calls of at least kWindowBytes: an all_gather or broadcast whose output lies in a window is
  /// written by the peers in place; a reduce_scatter whose input does reads its peers' inputs where
  /// they are. Only where every rank's buffer (and an all_gather's or reduce_scatter's blocks in
  /// it) starts on 16 bytes — the kernels move the widest words every pointer allows, across the
  /// link too; a buffer off 16 bytes takes the staging. Decided from what is the same on every
  /// rank for the same call, so every rank decides alike.
  InWindows windows_of(std::uint32_t kind, const void* send, const void* recv, std::uint64_t bytes) const {
    if (bytes < k::kWindowBytes) return {};
    InWindows w;
    switch (kind) {
      case k::kAllGather:
        if (bytes % 16 == 0) std::tie(w.out, w.out_at) = window_at(recv, bytes * n_);
        break;
      case k::kBroadcast:
        std::tie(w.out, w.out_at) = window_at(recv, bytes);
        break;
      case k::kAllReduce:  // reading the peers' inputs measured no faster than the staging
        break;
      default:  // reduce_scatter
        if (bytes % 16 == 0) std::tie(w.in, w.in_at) = window_at(send, bytes * n_);
        break;
    }
    return w;
  }

  /// Makes `stream` wait for this rank's last call when that ran on another stream, and gives
  /// `stream`'s id for the next call to compare. Streams are told apart by id, not handle: CUDA may
  /// hand a destroyed stream's handle to a new stream, whose call must still wait.
  Status follow_last(cudaStream_t stream, unsigned long long& id) {
    LF_TRY_STATUS(cuda_ok(cudaStreamGetId(stream, &id), "cudaStreamGetId"));
    if (last_stream_ && *last_stream_ != id)
      LF_TRY_STATUS(cuda_ok(cudaStreamWaitEvent(stream, done_, 0), "cudaStreamWaitEvent"));
    return {};
  }

  /// A staged call, for its pieces: the signature the ranks compare, what it is (for messages),
  /// its timeout and the caller's stream.
  struct Called {
    std::uint32_t signature, kind;
    std::uint64_t bytes;
    DType type;
    Duration timeout;
    cudaStream_t stream;
  };

  /// A staged call: argument checks done, bytes > 0. Blocks until the last piece's copy back is
  /// enqueued; a failure once anything was started stays (check() and every later call report
  /// it), as the host communicator's does.
  Status staged_call(const Called& what, const void* send, void* recv, ReduceOp op, std::uint32_t root) {
    const std::string_view call = call_name(what.kind);
    const cudaStream_t stream = what.stream;
    // Relaxed for this thread: the event queries below are refused while another thread captures
    // in the global mode, and they touch no stream of a capture.
    const CaptureModeScope relaxed;
    cudaStreamCaptureStatus capturing = cudaStreamCaptureStatusNone;
    LF_TRY_STATUS(cuda_ok(cudaStreamIsCapturing(stream, &capturing), "cudaStreamIsCapturing"));
    if (capturing != cudaStreamCaptureStatusNone)
      return fail(Errc::Unsupported, std::string(call),
                  str_format("group '{}' stages through host memory ({}): a call waits on the host for its copies and "
                             "cannot be captured in a CUDA graph",
                             host_.group(), reason_));
    unsigned long long id = 0;
    auto s = follow_last(stream, id);
    if (s) s = staged_steps(what, send, recv, op, root);
    // Recorded whatever happened: what was enqueued still uses the slots, and the next call and
    // the destructor wait for it.
    const auto recorded = cuda_ok(cudaEventRecord(done_, stream), "cudaEventRecord");
    last_stream_ = id;
    if (s && !recorded) s = recorded;
    if (!s) {
      s = std::unexpected(s.error().within(call));
      failure_ = s;
    }
    return s;
  }

  Status staged_steps(const Called& what, const void* send, void* recv, ReduceOp op, std::uint32_t root) {
    const cudaStream_t stream = what.stream;
    const std::uint64_t bytes = what.bytes;
    const DType type = what.type;
    const DeviceScope on(device_);
    LF_TRY_STATUS(on.status());
    const auto* in = static_cast<const unsigned char*>(send);
    auto* out = static_cast<unsigned char*>(recv);
    // Either way between the caller's memory and a slot, on the caller's stream.
    auto copy = [&](unsigned char* to, const unsigned char* from, std::uint64_t n) {
      return cuda_ok(cudaMemcpyAsync(to, from, n, cudaMemcpyDefault, stream), "cudaMemcpyAsync");
    };
    auto host = [&](unsigned char* at, std::uint64_t n) { return std::span(reinterpret_cast<std::byte*>(at), n); };
    const std::uint64_t n = n_;
    Status s;
    switch (what.kind) {
      case k::kAllReduce:
        s = pipeline(
            bytes, staging::piece(bytes, slot_),
            [&](std::uint64_t at, std::uint64_t len, unsigned char* slot) { return copy(slot, in + at, len); },
            [&](std::uint64_t, std::uint64_t len, unsigned char* slot, Duration left) {
              return host_.all_reduce(host(slot, len), host(slot, len), type, op, {.timeout = left});
            },
            [&](std::uint64_t at, std::uint64_t len, unsigned char* slot) { return copy(out + at, slot, len); }, what);
        break;
      case k::kAllGather: {
        // A slot holds this rank's piece, then every rank's piece side by side after it.
        const std::uint64_t piece = staging::piece(bytes, slot_ / (n + 1));
        s = pipeline(
            bytes, piece,
            [&](std::uint64_t at, std::uint64_t len, unsigned char* slot) { return copy(slot, in + at, len); },
            [&](std::uint64_t, std::uint64_t len, unsigned char* slot, Duration left) {
              return host_.all_gather(host(slot, len), host(slot + piece, n * len), type, {.timeout = left});
            },
            [&](std::uint64_t at, std::uint64_t len, unsigned char* slot) -> Status {
              for (std::uint64_t r = 0; r < n; ++r)
                LF_TRY_STATUS(copy(out + r * bytes + at, slot + piece + r * len, len));
              return {};
            },
            what);
        break;
      }
      case k::kReduceScatter: {
        // A slot holds the same piece of every rank's block, packed, then this rank's result.
        const std::uint64_t piece = staging::piece(bytes, slot_ / (n + 1));
        s = pipeline(
            bytes, piece,
            [&](std::uint64_t at, std::uint64_t len, unsigned char* slot) -> Status {
              for (std::uint64_t r = 0; r < n; ++r) LF_TRY_STATUS(copy(slot + r * len, in + r * bytes + at, len));
              return {};
            },
            [&](std::uint64_t, std::uint64_t len, unsigned char* slot, Duration left) {
              return host_.reduce_scatter(host(slot, n * len), host(slot + n * piece, len), type, op,
                                          {.timeout = left});
            },
            [&](std::uint64_t at, std::uint64_t len, unsigned char* slot) {
              return copy(out + at, slot + n * piece, len);
            },
            what);
        break;
      }
      default:
        s = pipeline(
            bytes, staging::piece(bytes, slot_),
            [&](std::uint64_t at, std::uint64_t len, unsigned char* slot) {
              return me_ == root ? copy(slot, in + at, len) : Status{};
            },
            [&](std::uint64_t, std::uint64_t len, unsigned char* slot, Duration left) {
              return host_.broadcast(host(slot, len), root, type, {.timeout = left});
            },
            [&](std::uint64_t at, std::uint64_t len, unsigned char* slot) {
              return me_ != root ? copy(out + at, slot, len) : Status{};
            },
            what);
    }
    return s;
  }

  /// The ranks compare their calls' signatures: one piece's host collective sees its own length,
  /// kind and type only, and a call of other pieces would pair with a later call.
  Status same_call(const Called& c) {
    std::vector<std::uint32_t> all(n_);
    LF_TRY_STATUS(
        staging::carried(host_.all_gather(std::as_bytes(std::span(&c.signature, 1)),
                                          std::as_writable_bytes(std::span(all)), DType::I32, {.timeout = c.timeout})));
    for (std::uint32_t q = 0; q < n_; ++q)
      if (all[q] != c.signature)
        return fail(Errc::InvalidArgument, "CudaCollectives",
                    str_format("rank {} of group '{}' made another call than this rank's {} of {} bytes {}", q,
                               host_.group(), kind_name(c.kind), c.bytes, to_string(c.type)));
    return {};
  }

  /// The staged path, pipelined: piece i (`len` bytes of `total`, the last one shorter) goes
  /// GPU → slot i % 2 → host collective → GPU, all copies on the caller's stream, so that the
  /// copies of pieces i − 1 (back) and i + 1 (in) run while the host carries piece i. `in` and
  /// `out` enqueue the copies of piece (at, len) to and from a slot; `carry` starts its host
  /// collective. Piece i + 2 takes piece i's slot after piece i's copy back, in stream order.
  template <class In, class Carry, class Out>
  Status pipeline(std::uint64_t total, std::uint64_t len, In&& in, Carry&& carry, Out&& out, const Called& c) {
    const std::uint64_t pieces = (total + len - 1) / len;
    if (pieces > 1) LF_TRY_STATUS(same_call(c));
    const cudaStream_t stream = c.stream;
    auto bytes = [&](std::uint64_t i) { return std::min(len, total - i * len); };
    auto slot = [&](std::uint64_t i) { return slots_ + (i & 1) * slot_; };
    auto fill = [&](std::uint64_t i) -> Status {
      LF_TRY_STATUS(in(i * len, bytes(i), slot(i)));
      return cuda_ok(cudaEventRecord(filled_[i & 1], stream), "cudaEventRecord");
    };
    LF_TRY_STATUS(fill(0));
    if (pieces > 1) LF_TRY_STATUS(fill(1));
    for (std::uint64_t i = 0; i < pieces; ++i) {
      // Each piece waits for its peers at most the call's timeout, as each step of a kernel does.
      const Deadline d(c.timeout);
      // The stream runs the caller's work before the piece's copy into its slot.
      LF_TRY_STATUS(wait_event(filled_[i & 1], d, "cudaEventQuery",
                               "the stream did not reach the call's copy to host memory within its timeout (work "
                               "before it on the stream had not ended)"));
      LF_TRY_STATUS(staging::carried(carry(i * len, bytes(i), slot(i), d.left())));
      LF_TRY_STATUS(out(i * len, bytes(i), slot(i)));
      if (i + 2 < pieces) LF_TRY_STATUS(fill(i + 2));
    }
    return {};
  }

  Communicator& host_;
  std::uint32_t n_ = 1, me_ = 0;
  int device_ = 0;
  std::uint64_t chunk_ = 0;
  std::uint32_t blocks_ = k::kBlocks;  ///< blocks per kernel (fewer where ranks share a GPU)
  std::int32_t sharers_ = 0;           ///< see Staging::sharers
  std::int32_t on_my_gpu_ = 0;         ///< see on_my_gpu()
  bool early_launch_ = false;          ///< k::launch's `early`: compute capability 9.0+, no GPU shared by ranks
  unsigned char* region_ = nullptr;
  std::vector<unsigned char*> regions_;
  std::vector<Window> windows_;
  k::ErrorRecord* error_ = nullptr;  // written by the GPU: read through a volatile pointer
  bool opened_ = false;
  cudaEvent_t done_ = nullptr;                     ///< recorded after this rank's last call
  std::optional<unsigned long long> last_stream_;  ///< the id of that call's stream
  k::ErrorRecord* error_device_ = nullptr;
  std::uint32_t calls_ = 0;
  bool staged_ = false;
  std::string reason_;                ///< why staged_ is what it is
  std::vector<std::uint32_t> hosts_;  ///< see hosts()
  unsigned char* slots_ = nullptr;    ///< staged: two pinned slots of slot_ bytes
  std::uint64_t slot_ = 0;
  std::array<cudaEvent_t, 2> filled_{};  ///< staged: a piece's copy into slot i has ended
  Status failure_;                       ///< staged: the first failed call's error
  /// The last calls, for errors that name one (described only then: this is on every call's path).
  struct Recent {
    std::uint32_t call, kind;
    std::uint64_t bytes;
    DType type;
  };
  std::deque<Recent> recent_;
};

}  // namespace

Result<std::unique_ptr<CudaCollectives>> detail::open_beside(Communicator& host, CudaCollectiveOptions options,
                                                             std::int32_t sharers) {
  auto c = std::make_unique<Collectives>(host, sharers);
  LF_TRY_STATUS(c->init(options));
  if (!c->hosts().empty()) {
    std::vector<std::uint32_t> hosts = c->hosts();
    const std::int32_t on_my_gpu = c->on_my_gpu();
    return detail::open_hierarchical(host, std::move(c), std::move(hosts), on_my_gpu, std::move(options));
  }
  return std::unique_ptr<CudaCollectives>(std::move(c));
}

Result<std::unique_ptr<CudaCollectives>> CudaCollectives::open(Communicator& host, CudaCollectiveOptions options) {
  return detail::open_beside(host, std::move(options), 0);
}

}  // namespace lavaflow::mesh
