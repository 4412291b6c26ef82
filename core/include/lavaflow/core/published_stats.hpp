// SPDX-License-Identifier: MIT
#pragma once
/// @file
/// Statistics a process offers to other processes of its user. A MemoryPool created with
/// PoolOptions::stats_label serves its statistics (PoolStats::to_json) on a Unix socket named
/// pool-<pid>-<label>.sock in the runtime directory while it lives (beside a lock file it holds);
/// read_published_pools() collects every such report (what `lavaflow-info --pool` shows).

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <string>
#include <vector>

#include "lavaflow/core/duration.hpp"
#include "lavaflow/core/error.hpp"

namespace lavaflow {

/// $XDG_RUNTIME_DIR/lavaflow when that directory belongs to this user, else /tmp/lavaflow-<uid>:
/// where channels meet and pools publish their statistics.
[[nodiscard]] std::filesystem::path runtime_directory();

/// The longest report read_published_pools() takes from one socket, and the most pools it reads.
inline constexpr std::size_t kMaxPublishedReport = std::size_t{4} << 20;
inline constexpr std::size_t kMaxPublishedPools = 256;

struct PublishedPool {
  std::int32_t pid = 0;
  std::string label;
  /// The pool's statistics as JSON, exactly as the socket sent them (another process's bytes:
  /// check them before use). Empty when `error` says why there is none.
  std::string report;
  std::string error;
};

/// Every pool publishing its statistics in `directory` (empty: runtime_directory()), by socket
/// name, all read within `timeout` (a pool whose report is not complete by then has an error).
/// Publications whose process is gone (its lock file no longer held) are removed; files that are
/// not a publication are left alone. An empty list when the directory does not exist;
/// PermissionDenied when it is not this user's alone.
[[nodiscard]] Result<std::vector<PublishedPool>> read_published_pools(const std::filesystem::path& directory = {},
                                                                      Duration timeout = std::chrono::seconds(2));

/// Whether `label` can name a publication: 1 to 64 letters, digits, '-', '_' or '.', not
/// starting with '.'; InvalidArgument naming the rule otherwise.
[[nodiscard]] Status check_stats_label(const std::string& label);

}  // namespace lavaflow
