// SPDX-License-Identifier: MIT
#pragma once
// How a job's ranks are cut into parallel groups. Ranks are laid out tensor-parallel fastest, then
// pipeline stage, then data-parallel replica: rank = (replica × pp + stage) × tp + shard.
#include <array>
#include <cstdint>
#include <string>
#include <variant>
#include <vector>

#include "lavaflow/core/error.hpp"

namespace lavaflow::mesh {

/// Every rank holds a full replica; one data-parallel group of the whole world.
struct DataParallel {};
/// Shards of `degree` ranks (arranged as mesh_shape, whose product is the degree), replicated
/// world / degree times.
struct TensorParallel {
  std::uint32_t degree = 1;
  std::array<std::uint32_t, 2> mesh_shape{1, 1};
};
/// Pipelines of `stages` ranks, replicated world / stages times.
struct PipelineParallel {
  std::uint32_t stages = 1;
};
/// tp × pp × dp ranks: tensor-parallel shards inside pipeline stages inside data-parallel replicas.
struct Mixed {
  std::uint32_t tp = 1, pp = 1, dp = 1;
};
using MeshTopology = std::variant<DataParallel, TensorParallel, PipelineParallel, Mixed>;

/// The topology as tp × pp × dp for `world_size` ranks: InvalidArgument, naming the product that
/// does not match, when it cannot be laid out on exactly that many ranks.
[[nodiscard]] Result<Mixed> layout(const MeshTopology& topology, std::uint32_t world_size);
[[nodiscard]] Status validate(const MeshTopology& topology, std::uint32_t world_size);
[[nodiscard]] std::string to_string(const MeshTopology& topology);

/// A topology's groups over ranks 0 … world − 1: `tp_i` (one per tensor-parallel shard set, when
/// tp > 1), `pp_i` (one per pipeline, stages in order, when pp > 1) and `dp_i` (ranks holding the
/// same shard of the same stage in every replica, when dp > 1; for a pipeline-only topology these
/// are its stages).
struct GroupSpec {
  std::string name;
  std::vector<std::uint32_t> ranks;
};
[[nodiscard]] Result<std::vector<GroupSpec>> topology_groups(const MeshTopology& topology, std::uint32_t world_size);

}  // namespace lavaflow::mesh
