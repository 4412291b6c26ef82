// SPDX-License-Identifier: MIT
#pragma once
// CUDA collectives of a group that spans hosts, hierarchical: the ranks of each host run their
// phases as the one-host kernels (CudaCollectives over the host's subgroup), and the ranks of each
// local index exchange between hosts through the staged path (CudaCollectives over that
// subgroup). Note 0019 gives the phases of each call.
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "lavaflow/mesh_cuda/cuda_collectives.hpp"

namespace lavaflow::mesh::detail {

/// Collective over `group`'s ranks. `staged`: the group's staged path, opened (it carries the
/// calls too small to gain from the hierarchy, and says why the group does not run on one host);
/// `hosts`: group rank → host index, hosts numbered in the order of their lowest rank, each
/// holding the same number of ranks (two or more); `on_my_gpu`: the group's ranks on this rank's
/// GPU (more than its host's where simulated hosts share a GPU).
[[nodiscard]] Result<std::unique_ptr<CudaCollectives>> open_hierarchical(Communicator& group,
                                                                         std::unique_ptr<CudaCollectives> staged,
                                                                         std::vector<std::uint32_t> hosts,
                                                                         std::int32_t on_my_gpu,
                                                                         CudaCollectiveOptions options);

/// CudaCollectives::open, for a group whose kernels share their GPUs with `sharers` ranks in all
/// (this group's among them; 0: only this group's): each kernel then takes only its share of the
/// blocks that the GPU holds at once, so that every rank's blocks can be resident together.
[[nodiscard]] Result<std::unique_ptr<CudaCollectives>> open_beside(Communicator& host, CudaCollectiveOptions options,
                                                                   std::int32_t sharers);

}  // namespace lavaflow::mesh::detail
