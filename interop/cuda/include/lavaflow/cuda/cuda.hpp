// SPDX-License-Identifier: MIT
#pragma once
/// @file
/// lavaflow::cuda — CUDA on lava-flow's Vulkan memory and semaphores (runtime API:
/// cudaImportExternalMemory, cudaImportExternalSemaphore), and the reverse direction: memory
/// allocated by CUDA (cuMemCreate, POSIX fd handle) imported by Vulkan.
///
/// Links only the CUDA runtime; driver entry points are looked up at run time, so programs start
/// (and report "no CUDA driver") on machines without an NVIDIA driver.
///
/// Calls that create CUDA objects make the interop's device current on the calling thread.

#include <cuda_runtime_api.h>

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "lavaflow/core/accelerators.hpp"
#include "lavaflow/core/buffer.hpp"
#include "lavaflow/core/error.hpp"
#include "lavaflow/core/gpu_buffer.hpp"
#include "lavaflow/core/gpu_image.hpp"
#include "lavaflow/core/gpu_semaphore.hpp"
#include "lavaflow/core/location.hpp"
#include "lavaflow/core/pool.hpp"
#include "lavaflow/core/unified_buffer.hpp"
#include "lavaflow/core/unique_fd.hpp"
#include "lavaflow/core/unique_handle.hpp"
#include "lavaflow/transports/channel.hpp"

namespace lavaflow::cuda {

/// A CUDA runtime error as a lava-flow Error naming the call.
[[nodiscard]] Error to_error(cudaError_t e, std::string call);
/// `cudaError_t` → Status.
[[nodiscard]] Status check(cudaError_t e, const char* call);

struct DeviceInfo {
  int ordinal = 0;
  std::string name;
  Uuid uuid{};  ///< equals Vulkan's deviceUUID for the same GPU
  int compute_major = 0, compute_minor = 0;
  std::uint64_t memory_bytes = 0;
  bool timeline_semaphore_interop = false;  ///< cudaDevAttrTimelineSemaphoreInteropSupported
  bool posix_fd_allocations = false;        ///< cuMemCreate with POSIX fd handles
  /// This process's CUDA work on the device goes through the MPS server: kernels of several
  /// processes run side by side. Without it the GPU time-slices between processes' contexts, so
  /// every hand-off between two processes' kernels waits for a context switch.
  bool mps = false;
};

/// The CUDA devices of this machine; Unsupported (with the runtime's reason) when there is no
/// driver or no device.
[[nodiscard]] Result<std::vector<DeviceInfo>> devices();
/// Adds the CUDA devices to the accelerator list (merged by UUID with what Vulkan saw); the
/// runtime's reason when there is no driver or device.
[[nodiscard]] Status add_devices(Accelerators& accelerators);

/// How one GPU's copies and kernels reach another GPU's memory in this host.
enum class PeerPath {
  None,    ///< no direct access: data between them goes through host memory
  PCIe,    ///< peer-to-peer over the PCIe fabric
  NVLink,  ///< NVLink (directly or through an NVSwitch)
};
using lavaflow::to_string;  // lava-flow's overloads stay visible beside this one
[[nodiscard]] std::string_view to_string(PeerPath p);

/// The link from CUDA device `from` to device `to` (ordinals), as CUDA, NVML and sysfs see it.
struct PeerLink {
  int from = 0, to = 0;
  PeerPath path = PeerPath::None;
  bool access = false;          ///< kernels on `from` can read and write `to`'s memory (cudaDeviceCanAccessPeer)
  bool native_atomics = false;  ///< atomics on `to`'s memory run over the link
  int performance_rank = 0;     ///< CUDA's relative rank of the link (lower is faster)
  /// Where the PCIe routes of the two GPUs meet: "switch <bdf>" (a bridge below the root port),
  /// "root complex <domain:bus>" or "different root complexes"; empty when sysfs does not say.
  std::string pcie_meet;
};
/// Every ordered pair of this host's CUDA devices. NVLink is told by NVML when the driver's
/// library is there; without it a pair with peer access counts as PCIe.
[[nodiscard]] Result<std::vector<PeerLink>> peer_links();
/// Lets kernels and copies on `device` reach `peer`'s memory directly (cudaDeviceEnablePeerAccess;
/// repeating it is fine). Unsupported when the pair has no peer access. Leaves `device` current on
/// the calling thread.
[[nodiscard]] Status enable_peer_access(int device, int peer);

/// Memory imported from Vulkan and mapped as a linear device pointer.
class ExternalBuffer {
 public:
  ExternalBuffer(ExternalBuffer&&) noexcept;
  ExternalBuffer& operator=(ExternalBuffer&&) noexcept;
  ~ExternalBuffer();
  /// The user's range (the exported range's offset is already applied).
  [[nodiscard]] void* data() const { return static_cast<char*>(base_) + offset_; }
  [[nodiscard]] std::uint64_t size() const { return size_; }

 private:
  friend class Interop;
  ExternalBuffer(cudaExternalMemory_t m, void* base, std::uint64_t offset, std::uint64_t size)
      : memory_(m), base_(base), offset_(offset), size_(size) {}
  cudaExternalMemory_t memory_ = nullptr;
  void* base_ = nullptr;  // mapping of [0, offset + size)
  std::uint64_t offset_ = 0;
  std::uint64_t size_ = 0;
};

/// A 2D image imported from Vulkan as a CUDA mipmapped array (one level).
class ExternalArray {
 public:
  ExternalArray(ExternalArray&&) noexcept;
  ExternalArray& operator=(ExternalArray&&) noexcept;
  ~ExternalArray();
  [[nodiscard]] cudaMipmappedArray_t mipmapped() const { return mipmapped_; }
  /// Level 0, for surface objects and cudaMemcpy2DFromArray / ToArray.
  [[nodiscard]] cudaArray_t level0() const { return level0_; }

 private:
  friend class Interop;
  ExternalArray(cudaExternalMemory_t m, cudaMipmappedArray_t a, cudaArray_t l0)
      : memory_(m), mipmapped_(a), level0_(l0) {}
  cudaExternalMemory_t memory_ = nullptr;
  cudaMipmappedArray_t mipmapped_ = nullptr;
  cudaArray_t level0_ = nullptr;
};

/// A Vulkan semaphore imported into CUDA: waited on and signalled in stream order.
class ExternalSemaphore {
 public:
  ExternalSemaphore(ExternalSemaphore&&) noexcept;
  ExternalSemaphore& operator=(ExternalSemaphore&&) noexcept;
  ~ExternalSemaphore();
  [[nodiscard]] SemaphoreKind kind() const { return kind_; }
  /// Work after this in `stream` waits until the semaphore is signalled (timeline: reaches `value`).
  [[nodiscard]] Status wait(cudaStream_t stream, std::uint64_t value = 0) const;
  /// Signals after the work queued so far in `stream` (timeline: to `value`).
  [[nodiscard]] Status signal(cudaStream_t stream, std::uint64_t value = 0) const;
  [[nodiscard]] cudaExternalSemaphore_t get() const { return sem_; }

 private:
  friend class Interop;
  ExternalSemaphore(cudaExternalSemaphore_t s, SemaphoreKind k) : sem_(s), kind_(k) {}
  cudaExternalSemaphore_t sem_ = nullptr;
  SemaphoreKind kind_ = SemaphoreKind::Binary;
};

/// Device memory allocated by CUDA (cuMemCreate) that Vulkan can import: the reverse direction.
class ExportableAllocation {
 public:
  ExportableAllocation(ExportableAllocation&&) noexcept;
  ExportableAllocation& operator=(ExportableAllocation&&) noexcept;
  ~ExportableAllocation();
  [[nodiscard]] void* data() const { return reinterpret_cast<void*>(ptr_); }
  [[nodiscard]] std::uint64_t size() const { return size_; }
  [[nodiscard]] std::uint64_t allocation_size() const { return allocation_size_; }
  /// An fd and a descriptor under which `GpuBuffer::import(ctx, …)` takes this memory; refuses a
  /// context on another device, and an allocation imported from another process (Vulkan needs
  /// the real allocation size, which such an import cannot vouch for).
  [[nodiscard]] Result<Export> export_for(const VulkanContext& ctx) const;
  /// The allocation's POSIX fd for another CUDA process (Interop::import_allocation), which needs
  /// allocation_size() and size() with it.
  [[nodiscard]] Result<UniqueFd> export_fd() const;
  /// The CUDA device whose memory this is.
  [[nodiscard]] const Uuid& device() const { return device_; }

  struct Driver;  ///< driver entry points (private to the library)

 private:
  friend class Interop;
  ExportableAllocation(std::shared_ptr<const Driver> d, unsigned long long handle, unsigned long long ptr,
                       std::uint64_t size, std::uint64_t allocation_size, Uuid device, bool imported = false)
      : driver_(std::move(d)),
        handle_(handle),
        ptr_(ptr),
        size_(size),
        allocation_size_(allocation_size),
        device_(device),
        imported_(imported) {}
  std::shared_ptr<const Driver> driver_;
  unsigned long long handle_ = 0;  // CUmemGenericAllocationHandle
  unsigned long long ptr_ = 0;     // CUdeviceptr
  std::uint64_t size_ = 0, allocation_size_ = 0;
  Uuid device_{};
  bool imported_ = false;  // mapped from another process's fd: allocation_size_ is what it announced
};

/// The importer for one CUDA device, chosen by the exporter's UUID.
class Interop {
 public:
  /// The CUDA device whose UUID is `device_uuid`; NotFound/DeviceMismatch naming the devices seen.
  [[nodiscard]] static Result<Interop> create(const Uuid& device_uuid);
  /// The CUDA device under a Vulkan context.
  [[nodiscard]] static Result<Interop> create(const VulkanContext& vulkan);

  [[nodiscard]] const DeviceInfo& device() const { return info_; }
  /// Makes this device current on the calling thread.
  [[nodiscard]] Status make_current() const;

  /// Maps [desc.offset, +desc.size) of exported Vulkan memory. Consumes `fd` on success only.
  [[nodiscard]] Result<ExternalBuffer> import_buffer(const ExportDescriptor& desc, UniqueFd&& fd) const;
  [[nodiscard]] Result<ExternalBuffer> import_buffer(const lavaflow::Buffer& buffer) const;
  /// A Vulkan image as a mipmapped array (surface load/store allowed). Consumes `fd` on success only.
  [[nodiscard]] Result<ExternalArray> import_image(const ImageDescriptor& desc, UniqueFd&& fd) const;
  [[nodiscard]] Result<ExternalArray> import_image(const GpuImage& image) const;
  /// Imports a binary or timeline semaphore. Consumes `fd` on success only.
  [[nodiscard]] Result<ExternalSemaphore> import_semaphore(SemaphoreKind kind, UniqueFd&& fd) const;
  [[nodiscard]] Result<ExternalSemaphore> import_semaphore(const GpuSemaphore& semaphore) const;

  /// Allocates `size` bytes with cuMemCreate (POSIX fd handle), mapped read/write on this device.
  /// The driver allocates whole granules: `whole` makes size() every byte they hold (at least
  /// `size`, less lava-flow's tail padding), for a caller that sub-allocates the rest.
  [[nodiscard]] Result<ExportableAllocation> allocate_exportable(std::uint64_t size, bool whole = false) const;
  /// Maps another process's allocation (ExportableAllocation::export_fd) that lives on this device,
  /// read/write for this device and for each device in `peers` (ordinals; kernels and copies there
  /// reach it over the peer link). `allocation_size` is the length mapped: the driver refuses one
  /// beyond the real allocation, and a smaller one maps a prefix of it; `size` ≤ `allocation_size`.
  /// The fd stays the caller's. Leaves this device current on the calling thread.
  [[nodiscard]] Result<ExportableAllocation> import_allocation(int fd, std::uint64_t allocation_size,
                                                               std::uint64_t size,
                                                               const std::vector<int>& peers = {}) const;

 private:
  friend class ChannelImports;
  Interop(DeviceInfo info, std::shared_ptr<const ExportableAllocation::Driver> driver)
      : info_(std::move(info)), driver_(std::move(driver)) {}
  DeviceInfo info_;
  std::shared_ptr<const ExportableAllocation::Driver> driver_;
};

/// A channel's CUDA view, for its producer or a consumer: each ring buffer is imported once and
/// reused, and so is each of the channel's semaphores, so that CUDA streams order the hand-off
/// on the GPU with no CPU waiting for either GPU:
///
///   producer: loan → wait(stream, loan) → kernels write buffer(loan) → signal(stream, loan) → publish
///   consumer: receive → wait(stream, msg) → kernels read buffer(msg) → release(stream, msg) → drop msg
///
/// A GPU-resident consumer queues its reads ahead (Consumer::upcoming: wait(stream, upcoming),
/// kernels read buffer(upcoming)), then receives each message later and releases it on the GPU.
/// Run each kernel once before queuing a wait whose signal is not queued yet: CUDA loads modules
/// lazily (unless CUDA_MODULE_LOADING=EAGER), and a load while a stream of the process waits
/// like that can deadlock.
///
/// (Producers set ProducerOptions::host_wait_for_gpu_release = false and consumers
/// ConsumerOptions::host_wait_for_gpu = false, or the channel waits on the host for them.)
/// The channel's counters are timeline semaphores (imported as external semaphores) or, on flag
/// channels (GpuSyncKind::Flag), words in GPU memory that the stream writes and waits on with
/// stream memory operations — the faster of the two between CUDA processes.
/// Without GPU ordering (a driver that cannot export timelines, on a semaphore channel) wait()
/// has nothing to wait for, and signal() and release() are Unsupported: then synchronise the
/// stream before publishing or releasing. One ChannelImports serves one channel object; it must
/// not outlive it.
///
/// Batches. Every wait, signal and release is a GPU operation in the stream beside the kernels,
/// and between processes each costs the stream about as much as a small kernel. Two things let a
/// stream pay for one per batch of messages instead of one per message:
/// - A wait that the same stream already has queued for the same counter at an equal or higher
///   value is not queued again (the counters only move up). So a consumer that queues the wait for
///   the last message of a batch first (upcoming(last)) has the others' waits for free.
/// - signal() and release() with Queue::Deferred tell the channel at once (the message is
///   published, or its slot promised back) but queue the GPU operation later, as one that covers
///   every deferred one of that counter: at the next Queue::Now call on the counter, before the
///   next wait queued on the same stream, at flush(), or when the ChannelImports goes (which then
///   also waits for those streams). The peer waits for a deferred message until then — its GPU,
///   or its host where it waits there (ConsumerOptions::host_wait_for_gpu,
///   ProducerOptions::host_wait_for_gpu_release) — so end every batch with Queue::Now (or
///   flush()) and keep batches at most half the ring. A later call on the same counter from
///   another stream makes that stream wait for the first one's work so far, and its signal then
///   covers the deferred one. The default streams (null, cudaStreamLegacy, cudaStreamPerThread),
///   which name a different stream by thread or device, never defer.
/// Neither applies while a stream is being captured into a CUDA graph (the graph runs later, in
/// its own order): then every call queues its own operation, and a call that would have to queue
/// a signal deferred before the capture into it fails instead (flush() before capturing).
class ChannelImports {
 public:
  /// When signal() and release() queue their GPU operation.
  enum class Queue : std::uint8_t { Now, Deferred };
  explicit ChannelImports(const Interop& cuda) : cuda_(&cuda) {}
  /// Queues what is deferred (errors are dropped: call flush() to see them).
  ~ChannelImports();
  ChannelImports(ChannelImports&& o) noexcept;
  /// Queues what this one had deferred first.
  ChannelImports& operator=(ChannelImports&& o) noexcept;
  [[nodiscard]] Result<const ExternalBuffer*> buffer(const Received& message);
  [[nodiscard]] Result<const ExternalBuffer*> buffer(const Loan& loan);
  [[nodiscard]] Result<const ExternalBuffer*> buffer(const Consumer::Upcoming& message);
  /// Makes `stream` wait until an upcoming message is written (Consumer::upcoming).
  [[nodiscard]] Status wait(cudaStream_t stream, const Consumer::Upcoming& message);
  /// Makes `stream` wait until the message's producer-side GPU work is done (no-op when the
  /// message was not ordered through the channel's counters).
  [[nodiscard]] Status wait(cudaStream_t stream, const Received& message);
  /// Makes `stream` wait until every consumer's GPU is done with the slot's previous message.
  [[nodiscard]] Status wait(cudaStream_t stream, const Loan& loan);
  /// The message is written once the work queued in `stream` so far is done (Loan::gpu_signal).
  [[nodiscard]] Status signal(cudaStream_t stream, Loan& loan, Queue when = Queue::Now);
  /// The message's slot may be written again once the work queued in `stream` so far is done
  /// (Received::gpu_release); the message can then be dropped at once.
  [[nodiscard]] Status release(cudaStream_t stream, Received& message, Queue when = Queue::Now);
  /// Queues every deferred signal and release now (one that fails stays deferred).
  [[nodiscard]] Status flush();
  /// Counters with a signal deferred and not yet queued.
  [[nodiscard]] std::size_t deferred() const { return deferred_.size(); }
  /// Waits not queued because their stream already waited for as much.
  [[nodiscard]] std::uint64_t waits_skipped() const { return waits_skipped_; }
  /// Work after this in `stream` waits until the point is reached (either kind of GpuSync; one
  /// with a later promised value, GpuSync::ahead, waits for that instead).
  [[nodiscard]] Status wait(cudaStream_t stream, const GpuSync& sync);
  /// Raises the point once the work queued in `stream` so far is done. Prefer signal(loan) and
  /// release(message), which also tell the channel.
  [[nodiscard]] Status signal(cudaStream_t stream, const GpuSync& sync);
  /// Copies a received message into another GPU's memory over the peer link, ordered on the GPUs:
  /// `stream`, a stream of this Interop's GPU (the ring's), waits for the message's producer-side
  /// work, copies its bytes to `dst` (`dst_bytes` of CUDA device `dst_device`'s memory) and
  /// releases the message's slot after the copy; `dst_stream`, a stream of `dst_device`, waits
  /// for the copy. No host thread waits for either GPU, and the message can be dropped at once
  /// (a consumer opened with ConsumerOptions::host_wait_for_gpu = false does not wait in
  /// receive() either). The copy is issued on the ring's GPU: memory imported into CUDA is mapped
  /// for its own device only, and a copy the other GPU pulls is staged through host memory
  /// (docs/design/0020-p2p.md). Peer access from the ring's GPU to `dst_device`
  /// (enable_peer_access) makes it run at the link's speed. Unsupported, before anything is
  /// queued, on a channel without GPU ordering (timeline or flags): copy, synchronise `stream` and
  /// drop the message instead. Null streams are the devices' default streams. Leaves the calling
  /// thread's current device as it found it.
  [[nodiscard]] Status copy_to_peer(cudaStream_t stream, Received& message, void* dst, std::uint64_t dst_bytes,
                                    int dst_device, cudaStream_t dst_stream);
  [[nodiscard]] std::size_t imported() const { return cache_.size(); }

 private:
  struct EventTraits {
    using handle_type = cudaEvent_t;
    static constexpr cudaEvent_t none() noexcept { return nullptr; }
    static bool empty(cudaEvent_t e) noexcept { return e == nullptr; }
    static bool same(cudaEvent_t a, cudaEvent_t b) noexcept { return a == b; }
    static void give_back(cudaEvent_t e) noexcept { (void)cudaEventDestroy(e); }
  };
  Result<const ExternalBuffer*> import(const lavaflow::Buffer& buffer);
  Result<unsigned long long> flag_address(const GpuSync& sync);  // CUdeviceptr of a flag
  Result<const ExternalSemaphore*> semaphore(const GpuSync& sync);
  /// A counter a stream waits on or signals: its semaphore, or its flag's device address.
  using CounterKey = const void*;
  Result<CounterKey> counter_key(const GpuSync& sync);
  /// `sync` to be signalled in `stream`, now or (Queue::Deferred) later.
  Status raise(cudaStream_t stream, const GpuSync& sync, Queue when);
  Status queue_signal(cudaStream_t stream, const GpuSync& sync);
  /// Queues the signals deferred on `stream` (refused while it is `captured`).
  Status queue_deferred(cudaStream_t stream, bool captured);
  /// Work queued in `later` from now on waits for the work queued in `earlier` so far.
  Status order_after(cudaStream_t earlier, cudaStream_t later);
  /// Queues what is deferred and waits for those streams (destruction, move-assignment).
  void settle() noexcept;
  struct Waited {  // the highest value a stream has queued a wait for, by counter
    unsigned long long stream_id;
    CounterKey counter;
    std::uint64_t value;
  };
  struct Deferred {  // a counter's signal promised but not queued yet
    cudaStream_t stream;
    CounterKey counter;
    GpuSync sync;
  };
  const Interop* cuda_;
  std::vector<Waited> waited_;
  std::vector<Deferred> deferred_;
  std::uint64_t waits_skipped_ = 0;
  std::unordered_map<const lavaflow::Buffer*, ExternalBuffer> cache_;
  std::unordered_map<const GpuSemaphore*, ExternalSemaphore> semaphores_;
  // copy_to_peer's last copy, on the ring's GPU. One serves every call: a stream's wait on an
  // event takes the record made before it, so recording it again later changes no wait queued.
  UniqueHandle<EventTraits> copied_;
  UniqueHandle<EventTraits> ordered_;  // order_after's
};

/// A MemoryPool whose GpuDeviceLocal buffers are exportable CUDA memory of `interop`'s device:
/// cuMemCreate segments (`options.segment_bytes` and `small_segment_bytes`, rounded up to whole
/// granules of the device, all of which the pool carves), sub-allocated like every pool's, so that renting costs a
/// free-list pop and a thousand buffers share a few allocations. Rent them with rent(size, BufferKind::GpuDeviceLocal)
/// and reach them through device_pointer(). Other kinds come from `options` as in any pool; where `options.vulkan` is
/// the same GPU, a rented CUDA buffer also exports for Vulkan importers (export_handle()). The pool keeps a copy of
/// `interop`.
[[nodiscard]] Result<MemoryPool> make_pool(const Interop& interop, PoolOptions options = {});

/// The device address of a buffer rented as GpuDeviceLocal from a make_pool() pool; null for any
/// other buffer.
[[nodiscard]] void* device_pointer(const PooledBuffer& buffer);

/// What another CUDA process needs to reach a pooled CUDA buffer: the fd of the allocation it
/// lives in, that allocation's size and mapped length (Interop::import_allocation(fd,
/// allocation_size, segment_size, …)), and the buffer's offset and size in it. The peer maps the
/// whole allocation: share pooled buffers only with processes that may see the pool's other
/// buffers in it (see PooledBuffer).
struct PooledExport {
  UniqueFd fd;
  std::uint64_t allocation_size = 0, segment_size = 0, offset = 0, size = 0;
};
[[nodiscard]] Result<PooledExport> export_pooled(const PooledBuffer& buffer);

/// A UnifiedBytes' side on a second GPU of the host: a copy in that GPU's memory, brought up to
/// date from the buffer's device side only when the buffer was written since (lazily, at the
/// next acquire), and whose changes go back to the device side when a write is released. The
/// copies go over the peer link, issued on a stream of the buffer's own GPU (the direction that
/// runs at link speed: see docs/design/0020-p2p.md) and ordered on the GPUs — by the buffer's
/// timeline towards its Vulkan and host sides, by CUDA events towards the caller's stream — so
/// no host thread waits for either GPU.
///
///   auto side = PeerSide::create(cuda0, buffer, 1);
///   void* p = side->acquire(stream1, Access::ReadWrite);   // stream1: a stream of GPU 1
///   kernels on stream1 use p
///   side->release(stream1);                               // the write goes home after them
///   buffer.host(Access::Read);                            // sees what GPU 1 wrote
///
/// The buffer must outlive the side, stay where it is (not moved from) and be made on `home`'s GPU
/// with a timeline the driver can export (UnifiedBytes::shareable_timeline). A host or Vulkan
/// write made while the side is acquired for writing is overwritten by the push. Release before
/// destroying: an unreleased write is lost. Calls leave the calling thread's current device as
/// they found it.
class PeerSide {
 public:
  /// `peer`: the ordinal of the second GPU. Peer access from the buffer's GPU to it is enabled
  /// where the pair has it; without it the driver stages the copies through host memory (direct()).
  [[nodiscard]] static Result<PeerSide> create(const Interop& home, UnifiedBytes& buffer, int peer);
  PeerSide(PeerSide&&) noexcept;
  PeerSide& operator=(PeerSide&&) noexcept;
  /// Waits for its copies (at most ten seconds: one waiting on device work that never signals
  /// keeps the peer memory and the stream allocated rather than freed under it), then frees the
  /// peer's memory. Work queued after an acquire that was never released is not waited for.
  ~PeerSide();

  /// The peer copy (size() bytes on the peer GPU), current for the work queued in `stream` after
  /// this call: a pull is queued first when the buffer was written since the copy was made.
  /// `stream` belongs to the peer GPU (the null stream: the peer's default stream). One acquire
  /// at a time: release before the next.
  [[nodiscard]] Result<void*> acquire(cudaStream_t stream, Access access);
  /// The work queued in `stream` so far is the acquirer's last use of the copy; after a write
  /// access the copy is pushed to the buffer's device side once that work is done, and the
  /// buffer's next host or device access comes after the push. If the push cannot be queued, the
  /// error says the peer's write is lost; the buffer keeps its own bytes and goes on.
  [[nodiscard]] Status release(cudaStream_t stream);

  [[nodiscard]] int peer() const;
  [[nodiscard]] std::uint64_t size() const;
  /// Copies run over peer access (else the driver stages them through host memory).
  [[nodiscard]] bool direct() const;
  /// Copies queued so far: to the peer (pulls) and back to the buffer (pushes).
  [[nodiscard]] std::uint64_t pulls() const;
  [[nodiscard]] std::uint64_t pushes() const;

 private:
  struct State;
  explicit PeerSide(std::unique_ptr<State> s);
  std::unique_ptr<State> s_;
};

}  // namespace lavaflow::cuda
