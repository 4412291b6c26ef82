// SPDX-License-Identifier: MIT
#pragma once
// The Mock backend: a world of ranks inside one process (one thread each), with the same
// collectives, matching rules, timeouts and errors as the real backends, for unit tests of code
// that uses the mesh.
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "lavaflow/mesh/collectives.hpp"

namespace lavaflow::mesh {

class MockWorld : public std::enable_shared_from_this<MockWorld> {
 public:
  [[nodiscard]] static std::shared_ptr<MockWorld> create(std::uint32_t size);
  ~MockWorld();
  [[nodiscard]] std::uint32_t size() const { return size_; }
  /// World rank `world_rank`'s communicator for the group `name` of these world ranks (group rank
  /// i is ranks[i]); every member opens it with the same name and ranks.
  [[nodiscard]] Result<std::unique_ptr<Communicator>> communicator(const std::string& name,
                                                                   const std::vector<std::uint32_t>& ranks,
                                                                   std::uint32_t world_rank);

  struct Shared;  // the rendezvous state every communicator of this world uses

 private:
  explicit MockWorld(std::uint32_t size);
  std::uint32_t size_;
  std::shared_ptr<Shared> shared_;
};

}  // namespace lavaflow::mesh
