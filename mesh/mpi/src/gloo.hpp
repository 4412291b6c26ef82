// SPDX-License-Identifier: MIT
#pragma once
// The Gloo backend's entry point (built when Gloo is found).
#include <memory>
#include <string>

#include "lavaflow/mesh/collectives.hpp"

namespace lavaflow::mesh::detail {

struct GlooOpen {
  std::string group;
  std::string directory;  ///< Gloo's FileStore: a directory every rank of the group sees
  std::uint32_t rank = 0, size = 1;
  bool one_host = true;  ///< listen on loopback
  Duration timeout = std::chrono::seconds(30);
  std::unique_ptr<Communicator> point_to_point;  ///< send and recv for the group
};

/// Rank `rank`'s Gloo communicator (collective over the group's ranks).
[[nodiscard]] Result<std::unique_ptr<Communicator>> open_gloo(GlooOpen options);

}  // namespace lavaflow::mesh::detail
