// SPDX-License-Identifier: MIT
#pragma once
// lavaflow-info --pool: what it shows of a pool's published statistics (another process's JSON).
#include <cstdint>
#include <expected>
#include <nlohmann/json.hpp>
#include <string>
#include <string_view>

namespace lfinfo {

struct PoolSummary {
  std::int64_t allocated_bytes = 0;  ///< allocated_bytes.all.current
  std::int64_t allocations = 0;      ///< allocation.all.current
  std::int64_t reserved_bytes = 0;   ///< reserved_bytes.all.current
  std::int64_t reserved_peak = 0;    ///< reserved_bytes.all.peak
  std::int64_t segments = 0;         ///< segment.all.current
  double reuse_rate = 0;
  std::int64_t open_fds = 0;
  std::int64_t num_ooms = 0;
  nlohmann::ordered_json all;  ///< the whole report, parsed
};

/// Parses and checks a report (PoolStats::to_json): a flat JSON object of numbers with the keys
/// above, counts and sizes not negative, the reuse rate within 0..1. The cause otherwise.
[[nodiscard]] std::expected<PoolSummary, std::string> parse_pool_report(std::string_view json);

}  // namespace lfinfo
