// SPDX-License-Identifier: MIT
#pragma once
// Subgroups for collectives that go hierarchical across hosts (the CUDA collectives): their names
// and the agreement that ends each step of opening them.
#include <algorithm>
#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "lavaflow/core/detail/format.hpp"
#include "lavaflow/mesh/collectives.hpp"

namespace lavaflow::mesh::hierarchy {

/// "world[2,3]": a subgroup named by its ranks in the group, so that an error naming rank i of the
/// subgroup names the group's rank too.
inline std::string subgroup_name(const std::string& group, const std::vector<std::uint32_t>& ranks) {
  std::string name = group + "[";
  for (std::size_t i = 0; i < ranks.size(); ++i) name += (i ? "," : "") + std::to_string(ranks[i]);
  return name + "]";
}

/// Every rank of `c` learns whether all succeeded at a step of opening. The outer error: the
/// exchange itself failed (a rank lost or late: the group is unsound). Else the step's outcome,
/// a success on every rank or a failure on every rank: this rank's error, or the first rank that
/// failed, named.
inline Result<Status> agreed(Communicator& c, const Status& mine, Duration timeout, const char* call) {
  const std::int32_t ok = mine ? 1 : 0;
  std::vector<std::int32_t> all(c.size());
  const Status told = c.all_gather(std::as_bytes(std::span(&ok, 1)), std::as_writable_bytes(std::span(all)), DType::I32,
                                   {.timeout = timeout})
                          .wait();
  if (!told) return std::unexpected(told.error().within(call));
  if (!mine) return Status(std::unexpected(mine.error().within(call)));
  for (std::uint32_t q = 0; q < c.size(); ++q)
    if (!all[q]) return fail(Errc::PeerLost, call, str_format("rank {} of group '{}' failed to set up", q, c.group()));
  return Status{};
}

/// This rank's two subgroups, opened through `open` on every rank whatever the first gave (a rank
/// that skipped one would leave its peers waiting in it), then agreed over `group`: the ranks of
/// its host (`local`) and those of its index on every host (`across`), rank i of each being the
/// i-th of the list. The error: the agreement failed; `opened`: the agreed outcome (the
/// communicators are there only where it is a success).
struct Subgroups {
  std::unique_ptr<Communicator> local, across;
  Status opened;
};
inline Result<Subgroups> open_subgroups(Communicator& group, const SubgroupOpener& open,
                                        const std::vector<std::uint32_t>& local,
                                        const std::vector<std::uint32_t>& across, const Status& ready, Duration timeout,
                                        const char* call) {
  auto in_host = open(subgroup_name(group.group(), local), local);
  auto between = open(subgroup_name(group.group(), across), across);
  Status made = !ready     ? ready
                : !in_host ? Status(std::unexpected(in_host.error()))
                : !between ? Status(std::unexpected(between.error()))
                           : Status{};
  // The opener's contract: each communicator numbers the ranks as listed, this rank among them.
  auto numbered = [&](const Communicator& c, const std::vector<std::uint32_t>& ranks) -> Status {
    const auto at = static_cast<std::uint32_t>(std::ranges::find(ranks, group.rank()) - ranks.begin());
    if (c.size() == ranks.size() && c.rank() == at) return {};
    return fail(Errc::InvalidArgument, call,
                str_format("the opened communicator of '{}' has rank {} of {}, not rank {} of {} as listed", c.group(),
                           c.rank(), c.size(), at, ranks.size()));
  };
  if (made) made = numbered(**in_host, local);
  if (made) made = numbered(**between, across);
  LF_TRY(Status outcome, agreed(group, made, timeout, call));
  if (!outcome) return Subgroups{nullptr, nullptr, std::move(outcome)};
  return Subgroups{std::move(*in_host), std::move(*between), {}};
}

}  // namespace lavaflow::mesh::hierarchy
