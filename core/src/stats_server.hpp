// SPDX-License-Identifier: MIT
#pragma once
// Private to lavaflow::core: the socket that serves a pool's statistics (published_stats.hpp).
#include <sys/types.h>

#include <chrono>
#include <filesystem>
#include <functional>
#include <memory>
#include <string>
#include <thread>

#include "lavaflow/core/error.hpp"
#include "lavaflow/core/unique_fd.hpp"

namespace lavaflow::detail {

/// Listens on pool-<pid>-<label>.sock in `directory`, holding pool-<pid>-<label>.lock locked, and
/// gives every connecting process of this user one report (`report()`, called on the server's
/// thread, at most every kReportEvery), then hangs up. It reads nothing from its clients, so one
/// that says nothing cannot hold it up; a client that does not read gets what fits in its
/// socket's buffer within a short time, then is dropped. Both files go with the server (not with
/// a forked child's copy of it).
class StatsServer {
 public:
  [[nodiscard]] static Result<std::unique_ptr<StatsServer>> start(std::filesystem::path directory,
                                                                  const std::string& label,
                                                                  std::function<std::string()> report);
  StatsServer(const StatsServer&) = delete;
  StatsServer& operator=(const StatsServer&) = delete;
  ~StatsServer();

  [[nodiscard]] const std::filesystem::path& path() const { return path_; }

  static constexpr int kClientsPerWake = 16;
  static constexpr std::chrono::milliseconds kReportEvery{50};

 private:
  StatsServer() = default;
  void serve();
  void answer(int client);
  [[nodiscard]] bool stopping() const;

  pid_t owner_ = 0;  // the process that started it
  std::filesystem::path path_, lock_path_;
  UniqueFd lock_;
  bool bound_ = false;  // path_ is our socket's
  std::function<std::string()> report_;
  std::string report_cache_;
  std::chrono::steady_clock::time_point report_at_{};
  UniqueFd listen_, stop_;
  std::thread thread_;  // last: starts once the rest is set
};

}  // namespace lavaflow::detail
