// SPDX-License-Identifier: MIT
#pragma once
/// @file
/// The narrow interface every channel transport implements: a "can I connect to this peer?" probe
/// that says why, and how the ring buffers are made (producer) and imported (consumer). Transports
/// are plain objects in a TransportSet the caller owns: no static registry.

#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "lavaflow/core/buffer.hpp"
#include "lavaflow/core/location.hpp"

namespace lavaflow {

class VulkanContext;

/// The transports a channel can take.
enum class TransportKind : std::uint8_t {
  Shm,     ///< CPU shared memory (memfd ring buffers): any two processes of one host
  Vulkan,  ///< Vulkan IPC (exported Vulkan allocations): processes of one host sharing a device
  Mpi,     ///< MPI point-to-point: ranks on any host
};

/// "shm", "vulkan", "mpi": how routes and flags spell a transport.
[[nodiscard]] std::string_view to_string(TransportKind kind) noexcept;
/// The inverse of to_string; InvalidArgument naming the choices for anything else.
[[nodiscard]] Result<TransportKind> parse_transport(std::string_view name);

/// What a transport may use on this side.
struct TransportEnv {
  /// null: none (a Vulkan transport reports it cannot connect). MPI: the device whose copy engine
  /// stages GPU messages, which makes its ring buffers pinned host memory of this device.
  const VulkanContext* vulkan = nullptr;
  /// MPI: a ring buffer of 256 KiB or more in transparent huge pages (ChannelOptions::huge_pages).
  bool huge_pages = true;
};

struct Probe {
  bool ok = false;
  std::string reason;
};

class Transport {
 public:
  virtual ~Transport() = default;
  [[nodiscard]] virtual TransportKind kind() const = 0;
  [[nodiscard]] std::string_view name() const { return to_string(kind()); }
  /// Can a producer at `me` serve a consumer at `peer`? `peer` unset: any consumer on this host.
  [[nodiscard]] virtual Probe can_connect(const ProcessLocation& me, const std::optional<ProcessLocation>& peer,
                                          const TransportEnv& env) const = 0;
  /// Producer side: one ring buffer of `size` bytes, exportable (shm, Vulkan) or, over MPI, this
  /// process's own memory that MPI sends from.
  [[nodiscard]] virtual Result<std::unique_ptr<Buffer>> allocate(const TransportEnv& env, std::uint64_t size) const = 0;
  /// Consumer side: the ring buffer `desc` describes. Shm and Vulkan import the producer's `fd`
  /// (consumed on success only); over MPI no fd crosses (`fd` must be empty) and the buffer is this
  /// process's memory of that shape, which MPI receives into.
  [[nodiscard]] virtual Result<std::unique_ptr<Buffer>> import(const TransportEnv& env, const ExportDescriptor& desc,
                                                               UniqueFd&& fd) const = 0;
};

/// Transports in preference order (first that can connect wins).
using TransportSet = std::vector<std::shared_ptr<const Transport>>;

struct RouteDecision {
  std::shared_ptr<const Transport> transport;  ///< null when none can connect
  std::string reason;                          ///< why this one, or why none
};

/// The routing decision, for every caller: the first transport of `set` that can connect (or
/// exactly `forced`, failing with its probe's reason when it cannot), with the reason.
[[nodiscard]] Result<RouteDecision> choose_route(const TransportSet& set, const ProcessLocation& me,
                                                 const std::optional<ProcessLocation>& peer, const TransportEnv& env,
                                                 std::optional<TransportKind> forced = {});

}  // namespace lavaflow
