// SPDX-License-Identifier: MIT
#pragma once
// The device mesh: the job's ranks, the devices each one sees, the topology and its process
// groups, each group with its backend.
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <string_view>
#include <vector>

#include "lavaflow/mesh/collectives.hpp"
#include "lavaflow/mesh/topology.hpp"

namespace lavaflow::mesh {

enum class Backend : std::uint8_t { Native, Mpi, Gloo, Nccl, Mock };
[[nodiscard]] std::string_view to_string(Backend b) noexcept;

struct ProcessGroup {
  std::string name;
  std::vector<std::uint32_t> ranks;  ///< world ranks; group rank i is ranks[i]
  Backend backend = Backend::Native;
};

struct DeviceInfo {
  std::string name;
  std::uint64_t memory_bytes = 0;
};
/// What one rank brings to the mesh: where it runs and the devices it sees.
struct RankInfo {
  std::string host;
  std::vector<DeviceInfo> devices;
};

struct MeshStats {
  std::uint32_t ranks = 0, hosts = 0, devices = 0;
  std::uint64_t memory_bytes = 0;
  std::map<std::string, std::uint32_t> ranks_per_host;
  std::set<Backend> backends;  ///< of the mesh's groups
};

/// Opens rank `world_rank`'s communicator for a group (a backend's entry point).
using CommunicatorFactory =
    std::function<Result<std::unique_ptr<Communicator>>(const ProcessGroup& group, std::uint32_t world_rank)>;

/// Subgroups of `group` for rank `world_rank` (a member), opened through `open` on the group's
/// backend: group rank i stands for world rank group.ranks[i].
[[nodiscard]] SubgroupOpener subgroups(ProcessGroup group, std::uint32_t world_rank, CommunicatorFactory open);

class DeviceMesh {
 public:
  /// This rank's mesh over `ranks` (indexed by world rank, the same table on every rank). Starts
  /// data-parallel with one group, "world", on `backend`.
  [[nodiscard]] static Result<DeviceMesh> create(std::uint32_t rank, std::vector<RankInfo> ranks,
                                                 Backend backend = Backend::Native);

  [[nodiscard]] std::uint32_t rank() const { return rank_; }
  [[nodiscard]] std::uint32_t world_size() const { return static_cast<std::uint32_t>(ranks_.size()); }
  [[nodiscard]] const MeshTopology& topology() const { return topology_; }
  [[nodiscard]] const std::vector<RankInfo>& ranks() const { return ranks_; }

  /// Validates `topology` for this world and replaces the topology's groups (tp_i, pp_i, dp_i, on
  /// the mesh's backend) with its own; "world" and groups added by hand stay.
  [[nodiscard]] Status with_topology(const MeshTopology& topology);
  /// The same for a job that changes its parallelism: nothing changes when the new topology does
  /// not fit.
  [[nodiscard]] Status reshape(const MeshTopology& topology) { return with_topology(topology); }
  /// A group of its own: a new name, one or more distinct ranks of this world.
  [[nodiscard]] Status add_group(ProcessGroup group);
  [[nodiscard]] Result<const ProcessGroup*> get_group(std::string_view name) const;
  [[nodiscard]] bool in_group(std::string_view name) const;
  /// This rank's index in the group; empty when not a member (or no such group).
  [[nodiscard]] std::optional<std::uint32_t> group_rank(std::string_view name) const;
  [[nodiscard]] std::vector<const ProcessGroup*> groups() const;
  [[nodiscard]] MeshStats stats() const;
  /// The mesh as text: topology, hosts and devices, every group with its backend.
  [[nodiscard]] std::string describe() const;

  /// This rank's communicator for a group it is a member of, from the group's backend.
  [[nodiscard]] Result<std::unique_ptr<Communicator>> communicator(std::string_view group,
                                                                   const CommunicatorFactory& open) const;

 private:
  DeviceMesh(std::uint32_t rank, std::vector<RankInfo> ranks, Backend backend)
      : rank_(rank), ranks_(std::move(ranks)), backend_(backend) {}
  std::uint32_t rank_;
  std::vector<RankInfo> ranks_;
  Backend backend_;
  MeshTopology topology_ = DataParallel{};
  std::map<std::string, ProcessGroup, std::less<>> groups_;
  std::set<std::string, std::less<>> topology_groups_;  // the names with_topology made
};

}  // namespace lavaflow::mesh
