// SPDX-License-Identifier: MIT
#pragma once
// Names the backends of this target share in their messages.
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "lavaflow/core/detail/format.hpp"

namespace lavaflow::mesh::detail {

enum class Kind : std::uint32_t { AllReduce = 1, AllGather, Broadcast, ReduceScatter, Barrier };

inline std::string_view to_string(Kind k) {
  switch (k) {
    case Kind::AllReduce:
      return "all_reduce";
    case Kind::AllGather:
      return "all_gather";
    case Kind::Broadcast:
      return "broadcast";
    case Kind::ReduceScatter:
      return "reduce_scatter";
    case Kind::Barrier:
      return "barrier";
  }
  return "?";
}

/// "rank 2 (world 5)" or "ranks 1, 2 (world 3, 5)": group ranks and their world ranks.
inline std::string ranks_text(const std::vector<std::uint32_t>& group_ranks, const std::vector<std::uint32_t>& world) {
  std::string g, w;
  for (std::uint32_t r : group_ranks) {
    if (!g.empty()) {
      g += ", ";
      w += ", ";
    }
    g += std::to_string(r);
    w += std::to_string(world[r]);
  }
  return str_format("{} {} (world {})", group_ranks.size() == 1 ? "rank" : "ranks", g, w);
}

}  // namespace lavaflow::mesh::detail
