// SPDX-License-Identifier: MIT
#pragma once
// Vulkan collectives of a group that spans hosts, hierarchical: each host's ranks run their phases
// over the host's shared segment (VulkanCollectives over the host's subgroup) and the ranks of
// each local index exchange between hosts through the staged path. Note 0019 gives the phases.
#include <cstdint>
#include <memory>

#include "lavaflow/mesh/vulkan.hpp"

namespace lavaflow::mesh::vulkan_hierarchy {

/// Collective over `group`'s ranks, numbered host by host on `hosts` hosts of the same number of
/// ranks (two or more). `staged`: the group's staged path, opened (it carries the calls too small
/// to gain from the hierarchy, and says why the group does not run on one host).
[[nodiscard]] Result<std::unique_ptr<VulkanCollectives>> open_vulkan_hierarchical(
    const VulkanContext& ctx, Communicator& group, std::unique_ptr<VulkanCollectives> staged, std::uint32_t hosts,
    VulkanCollectiveOptions options);

}  // namespace lavaflow::mesh::vulkan_hierarchy
