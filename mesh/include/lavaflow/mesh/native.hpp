// SPDX-License-Identifier: MIT
#pragma once
// The native backend: hierarchical collectives over lava-flow's own routing. The ranks of a group
// that share a host meet in one shared-memory segment and reduce directly in each other's staging
// buffers; when the group spans hosts, one leader per host exchanges the host's partial result with
// the other leaders over a HostLink (MPI in lavaflow::mesh_mpi), and the result fans back out
// inside the host. Design note 0016 gives the algorithms, the synchronisation and the timeouts.
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "lavaflow/mesh/collectives.hpp"

namespace lavaflow::mesh {

/// The exchange between the leaders of a group's hosts (one rank per host, hosts in index order).
/// Each start_* begins one exchange and returns at once; test() reports whether it has ended.
/// One exchange at a time.
class HostLink {
 public:
  virtual ~HostLink() = default;
  [[nodiscard]] virtual std::uint32_t hosts() const = 0;
  /// This leader's host index.
  [[nodiscard]] virtual std::uint32_t host() const = 0;
  /// `data` = op over every host's `data`; op is Sum, Product, Min or Max.
  [[nodiscard]] virtual Status start_all_reduce(std::span<std::byte> data, DType type, ReduceOp op) = 0;
  /// Host h's block, counts[h] bytes at offsets[h] of `all`, goes to every host; this host's
  /// block is already in place.
  [[nodiscard]] virtual Status start_all_gather(std::span<std::byte> all, std::span<const std::uint64_t> counts,
                                                std::span<const std::uint64_t> offsets) = 0;
  [[nodiscard]] virtual Status start_broadcast(std::span<std::byte> data, std::uint32_t root_host) = 0;
  /// With one rank per host, straight between the callers' buffers (send may be recv).
  [[nodiscard]] virtual Status start_direct_all_reduce(std::span<const std::byte> send, std::span<std::byte> recv,
                                                       DType type, ReduceOp op) = 0;
  [[nodiscard]] virtual Status start_direct_all_gather(std::span<const std::byte> send, std::span<std::byte> recv) = 0;
  /// recv = op over every host's block number host() of `send` (hosts() blocks of recv's size);
  /// Average included (one rank per host: the hosts are the ranks).
  [[nodiscard]] virtual Status start_direct_reduce_scatter(std::span<const std::byte> send, std::span<std::byte> recv,
                                                           DType type, ReduceOp op) = 0;
  [[nodiscard]] virtual Status start_barrier() = 0;
  /// true once the exchange has ended; its error if it failed.
  [[nodiscard]] virtual Result<bool> test() = 0;
  /// Gives up the exchange in flight (its deadline passed): receives that can be cancelled are,
  /// so that they write nothing later; the rest is left to the transport.
  virtual void abandon() = 0;
  /// The hosts whose messages of the exchange in flight have not arrived, for a timeout's message
  /// (before abandon()); empty when the transport cannot tell.
  [[nodiscard]] virtual std::vector<std::uint32_t> silent_hosts() const { return {}; }
};

struct NativeOptions {
  /// Names the host's shared segment: the same on every member of the group, different for every
  /// group and every job that may run at the same time on the host.
  std::string key;
  std::string group;                       ///< the group's name, for messages
  std::vector<std::uint32_t> world_ranks;  ///< group rank → world rank
  std::vector<std::uint32_t> hosts;        ///< group rank → host index (0 … hosts − 1)
  std::uint32_t rank = 0;                  ///< this rank's group rank
  std::unique_ptr<HostLink> link;          ///< leaders only (lowest group rank of each host), when hosts > 1
  std::unique_ptr<Communicator> remote;    ///< send/recv with ranks on other hosts (the same group)
  std::uint64_t chunk_bytes = 1 << 20;     ///< staging per rank and step: a power of two, 4 KiB … 64 MiB
  std::uint64_t arena_bytes = 0;           ///< per rank, for Communicator::allocate: a multiple of 4 KiB
  Duration attach_timeout = std::chrono::seconds(30);
};

/// A 64-bit hash of a name that every process computes alike (FNV-1a): segment keys and MPI tags.
[[nodiscard]] std::uint64_t name_hash(std::string_view name) noexcept;

/// Opens this rank's native communicator: collective over the group's ranks on this host, which
/// attach to one segment (created by the host's leader, unlinked as soon as all are attached, so
/// that nothing stays in /dev/shm after a crash).
///
/// Calls progress in the caller's thread: a call posts this rank's part at once; the rest happens
/// in Work::wait() or Work::test() (which also advance earlier calls still in flight). After a
/// failure (timeout, lost rank) the communicator is broken: later calls fail at once with the same
/// error, on every rank of the host.
[[nodiscard]] Result<std::unique_ptr<Communicator>> open_native(NativeOptions options);

}  // namespace lavaflow::mesh
