// SPDX-License-Identifier: MIT
#include "lavaflow/mesh/mesh.hpp"

#include <algorithm>

#include "lavaflow/core/detail/format.hpp"

namespace lavaflow::mesh {

std::string_view to_string(Backend b) noexcept {
  switch (b) {
    case Backend::Native:
      return "native";
    case Backend::Mpi:
      return "mpi";
    case Backend::Gloo:
      return "gloo";
    case Backend::Nccl:
      return "nccl";
    case Backend::Mock:
      return "mock";
  }
  return "?";
}

Result<DeviceMesh> DeviceMesh::create(std::uint32_t rank, std::vector<RankInfo> ranks, Backend backend) {
  constexpr const char* call = "mesh::DeviceMesh::create";
  if (ranks.empty()) return fail(Errc::InvalidArgument, call, "a mesh needs at least one rank");
  if (rank >= ranks.size())
    return fail(Errc::InvalidArgument, call, str_format("rank {} is not in a world of {}", rank, ranks.size()));
  DeviceMesh m(rank, std::move(ranks), backend);
  ProcessGroup world{"world", {}, backend};
  for (std::uint32_t r = 0; r < m.world_size(); ++r) world.ranks.push_back(r);
  m.groups_.emplace(world.name, std::move(world));
  return m;
}

Status DeviceMesh::with_topology(const MeshTopology& topology) {
  LF_TRY(auto specs, topology_groups(topology, world_size()));
  for (const auto& s : specs)
    if (groups_.contains(s.name) && !topology_groups_.contains(s.name))
      return fail(Errc::InvalidArgument, "mesh::DeviceMesh::with_topology",
                  str_format("the topology's group '{}' would replace a group added by hand", s.name));
  for (const auto& name : topology_groups_) groups_.erase(name);
  topology_groups_.clear();
  for (auto& s : specs) {
    topology_groups_.insert(s.name);
    groups_.emplace(s.name, ProcessGroup{s.name, std::move(s.ranks), backend_});
  }
  topology_ = topology;
  return {};
}

Status DeviceMesh::add_group(ProcessGroup group) {
  constexpr const char* call = "mesh::DeviceMesh::add_group";
  if (group.name.empty()) return fail(Errc::InvalidArgument, call, "a group needs a name");
  if (groups_.contains(group.name))
    return fail(Errc::InvalidArgument, call, str_format("a group '{}' already exists", group.name));
  if (group.ranks.empty()) return fail(Errc::InvalidArgument, call, str_format("group '{}' has no ranks", group.name));
  std::vector<std::uint32_t> sorted = group.ranks;
  std::sort(sorted.begin(), sorted.end());
  if (std::adjacent_find(sorted.begin(), sorted.end()) != sorted.end())
    return fail(Errc::InvalidArgument, call, str_format("group '{}' names a rank twice", group.name));
  if (sorted.back() >= world_size())
    return fail(Errc::InvalidArgument, call,
                str_format("group '{}' names rank {} of a world of {}", group.name, sorted.back(), world_size()));
  auto name = group.name;
  groups_.emplace(std::move(name), std::move(group));
  return {};
}

Result<const ProcessGroup*> DeviceMesh::get_group(std::string_view name) const {
  auto it = groups_.find(name);
  if (it == groups_.end())
    return fail(Errc::NotFound, "mesh::DeviceMesh::get_group", str_format("no group '{}'", name));
  return &it->second;
}

std::optional<std::uint32_t> DeviceMesh::group_rank(std::string_view name) const {
  auto it = groups_.find(name);
  if (it == groups_.end()) return std::nullopt;
  const auto& r = it->second.ranks;
  const auto at = std::find(r.begin(), r.end(), rank_);
  if (at == r.end()) return std::nullopt;
  return static_cast<std::uint32_t>(at - r.begin());
}

bool DeviceMesh::in_group(std::string_view name) const { return group_rank(name).has_value(); }

std::vector<const ProcessGroup*> DeviceMesh::groups() const {
  std::vector<const ProcessGroup*> out;
  for (const auto& [name, g] : groups_) out.push_back(&g);
  return out;
}

MeshStats DeviceMesh::stats() const {
  MeshStats s;
  s.ranks = world_size();
  for (const auto& r : ranks_) {
    ++s.ranks_per_host[r.host];
    s.devices += static_cast<std::uint32_t>(r.devices.size());
    for (const auto& d : r.devices) s.memory_bytes += d.memory_bytes;
  }
  s.hosts = static_cast<std::uint32_t>(s.ranks_per_host.size());
  for (const auto& [name, g] : groups_) s.backends.insert(g.backend);
  return s;
}

std::string DeviceMesh::describe() const {
  const auto s = stats();
  std::string out =
      str_format("mesh: {} ranks on {} host(s), {} device(s), {}\n", s.ranks, s.hosts, s.devices, to_string(topology_));
  for (std::uint32_t r = 0; r < world_size(); ++r) {
    std::string devices;
    for (const auto& d : ranks_[r].devices) {
      if (!devices.empty()) devices += ", ";
      devices += d.name;
    }
    out += str_format("  rank {} on {}: {}\n", r, ranks_[r].host, devices.empty() ? "no devices" : devices);
  }
  for (const auto& [name, g] : groups_) {
    std::string members;
    for (auto r : g.ranks) {
      if (!members.empty()) members += ' ';
      members += std::to_string(r);
    }
    out += str_format("  group {} ({}): ranks {}\n", name, to_string(g.backend), members);
  }
  return out;
}

Result<std::unique_ptr<Communicator>> DeviceMesh::communicator(std::string_view group,
                                                               const CommunicatorFactory& open) const {
  LF_TRY(const ProcessGroup* g, get_group(group));
  if (!in_group(group))
    return fail(Errc::InvalidArgument, "mesh::DeviceMesh::communicator",
                str_format("rank {} is not a member of group '{}'", rank_, group));
  return open(*g, rank_);
}

SubgroupOpener subgroups(ProcessGroup group, std::uint32_t world_rank, CommunicatorFactory open) {
  return
      [group = std::move(group), world_rank, open = std::move(open)](
          const std::string& name, const std::vector<std::uint32_t>& ranks) -> Result<std::unique_ptr<Communicator>> {
        ProcessGroup sub{name, {}, group.backend};
        for (const std::uint32_t r : ranks) {
          if (r >= group.ranks.size())
            return fail(
                Errc::InvalidArgument, "mesh::subgroups",
                str_format("subgroup '{}' names rank {} of group '{}' of {}", name, r, group.name, group.ranks.size()));
          sub.ranks.push_back(group.ranks[r]);
        }
        return open(sub, world_rank);
      };
}

}  // namespace lavaflow::mesh
