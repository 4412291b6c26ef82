// SPDX-License-Identifier: MIT
#pragma once
// Collectives on Vulkan buffers, with the reduction in a Vulkan compute shader: any vendor's GPU,
// and lavapipe. The ranks of a group that share a host meet in one segment that every rank's
// device binds, so each rank's GPU reads its peers' staging directly: the device's own exported
// memory when every rank runs on that one device (several processes on one GPU), else host shared
// memory that each device imports (VK_EXT_external_memory_host; any mix of vendors). A host
// Communicator of the same group (the native backend) orders the steps and brings timeouts,
// lost-rank detection and call matching. When the group spans hosts, each rank's GPU stages
// through its own pinned host memory, in pipelined pieces, and the host communicator carries the
// exchange (the native backend's hierarchical scheme). Design note 0019 gives the algorithms.
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vulkan/vulkan.hpp>

#include "lavaflow/core/gpu_buffer.hpp"
#include "lavaflow/core/vulkan_context.hpp"
#include "lavaflow/mesh/collectives.hpp"

namespace lavaflow::mesh {

/// A range of a Vulkan buffer on the collective's device, made with TRANSFER_SRC and TRANSFER_DST
/// usage (every lava-flow GpuBuffer is).
struct DeviceSpan {
  vk::Buffer buffer;
  std::uint64_t offset = 0;
  std::uint64_t size = 0;
};

/// The user's range of a GpuBuffer (or its first `bytes` bytes).
[[nodiscard]] DeviceSpan device_span(const GpuBuffer& buffer);
[[nodiscard]] DeviceSpan device_span(const GpuBuffer& buffer, std::uint64_t bytes);

/// The memory the ranks of one host share (a group that stages through the host shares none).
enum class VulkanSegment : std::uint8_t {
  /// DeviceMemory when every rank of the group runs on this host and this very device, the device
  /// exports and imports memory fds, and nothing stages; else HostMemory. When the device memory
  /// cannot be handed over (its socket name taken, ranks in other pid namespaces, a driver's
  /// refusal) every rank falls back to HostMemory together. segment_reason() says which and why.
  Auto,
  /// One exportable allocation on the shared device (opaque fd), made by rank 0 and imported by
  /// the others: staging stays in the GPU's own memory. open() fails — Unsupported where the
  /// ranks do not share one device that shares fds, InvalidArgument with stage_through_host —
  /// instead of falling back.
  DeviceMemory,
  /// Host shared memory imported by each rank's device: works for any mix of devices.
  HostMemory,
};
[[nodiscard]] std::string_view to_string(VulkanSegment s) noexcept;

struct VulkanCollectiveOptions {
  /// Names the host's shared segment (a /dev/shm object) and rank 0's abstract socket that hands
  /// the device memory over: the same on every rank of the group, different for every group and
  /// every job that may run at the same time on the host. Abstract socket names are public to the
  /// network namespace: a process that takes the name first makes Auto fall back to host memory
  /// (and DeviceMemory fail); it never gets the memory (rank 0 answers only the group's ranks,
  /// by pid and uid).
  std::string key;
  /// Staging per rank and step: a power of two, 4 KiB … 64 MiB (lowered to what the device can
  /// bind as one storage buffer); 0 chooses: 16 MiB in the device's own memory, where every step
  /// saved is a submission and a host synchronisation (a time slice when processes share a GPU),
  /// and 4 MiB of host memory otherwise.
  std::uint64_t chunk_bytes = 0;
  Duration attach_timeout = std::chrono::seconds(30);
  /// Stage through the host communicator even when every rank shares this host (what a group
  /// spanning hosts does; for tests and comparisons).
  bool stage_through_host = false;
  /// What the ranks of a host share (when they do not stage).
  VulkanSegment segment = VulkanSegment::Auto;
};

/// One rank's Vulkan collectives over `host`'s group. Calls are collective and in the same order
/// on every rank, as with Communicator (and matched the same way: a rank whose call differs gets
/// an error naming both calls). Each call returns when its result is in `recv` on the device;
/// the caller's earlier GPU work on its buffers must have completed, and later work may start at
/// once. Not thread-safe; the context's queue is used from the calling thread.
class VulkanCollectives {
 public:
  /// Collective over the group's ranks, which must all pass the same options: the ranks compare
  /// where they run, then attach to the host's segment — the device memory that rank 0 allocates
  /// and hands to each rank, or the /dev/shm object that rank 0 creates and unlinks as soon as
  /// every rank has mapped it — or, staging, each maps its own pinned host memory. Every step
  /// ends in an agreement, so the ranks succeed or fail together. `host` and `ctx` must outlive
  /// the result.
  [[nodiscard]] static Result<std::unique_ptr<VulkanCollectives>> open(const VulkanContext& ctx, Communicator& host,
                                                                       VulkanCollectiveOptions options);
  virtual ~VulkanCollectives() = default;

  [[nodiscard]] virtual std::uint32_t rank() const = 0;
  [[nodiscard]] virtual std::uint32_t size() const = 0;
  /// Whether the ranks share one host's segment (reduction on the GPU) or stage through the host
  /// communicator (the group spans hosts).
  [[nodiscard]] virtual bool shared_segment() const = 0;
  /// The shared segment's memory (HostMemory when staging: the rank's own pinned host memory).
  [[nodiscard]] virtual VulkanSegment segment() const = 0;
  /// Why open() chose that segment, in words.
  [[nodiscard]] virtual const std::string& segment_reason() const = 0;

  /// recv = op over every rank's send (the same length everywhere; send may be recv).
  [[nodiscard]] virtual Status all_reduce(DeviceSpan send, DeviceSpan recv, DType type, ReduceOp op,
                                          CallOptions options = {}) = 0;
  /// recv (size × send's length) = every rank's send, in rank order.
  [[nodiscard]] virtual Status all_gather(DeviceSpan send, DeviceSpan recv, DType type, CallOptions options = {}) = 0;
  /// recv (send's length ÷ size) = this rank's block of op over every rank's send.
  [[nodiscard]] virtual Status reduce_scatter(DeviceSpan send, DeviceSpan recv, DType type, ReduceOp op,
                                              CallOptions options = {}) = 0;
  /// Every rank's buffer becomes root's.
  [[nodiscard]] virtual Status broadcast(DeviceSpan buffer, std::uint32_t root, DType type,
                                         CallOptions options = {}) = 0;
};

}  // namespace lavaflow::mesh
