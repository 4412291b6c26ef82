// SPDX-License-Identifier: MIT
#pragma once
// Private to lavaflow::core: the socket that serves a pool's statistics (published_stats.hpp).
#include <filesystem>
#include <functional>
#include <memory>
#include <string>
#include <thread>

#include "lavaflow/core/error.hpp"
#include "lavaflow/core/unique_fd.hpp"

namespace lavaflow::detail {

/// Listens on pool-<pid>-<label>.sock in `directory` and gives every connecting process of this
/// user one report (`report()`, called on the server's thread), then hangs up. It reads nothing
/// from its clients, so one that says nothing cannot hold it up; a client that does not read
/// gets what fits in its socket's buffer within a short time, then is dropped. The socket file
/// goes with the server.
class StatsServer {
 public:
  [[nodiscard]] static Result<std::unique_ptr<StatsServer>> start(std::filesystem::path directory,
                                                                  const std::string& label,
                                                                  std::function<std::string()> report);
  StatsServer(const StatsServer&) = delete;
  StatsServer& operator=(const StatsServer&) = delete;
  ~StatsServer();

  [[nodiscard]] const std::filesystem::path& path() const { return path_; }

 private:
  StatsServer() = default;
  void serve();
  void answer(int client);

  std::filesystem::path path_;
  std::function<std::string()> report_;
  UniqueFd listen_, stop_;
  std::thread thread_;  // last: starts once the rest is set
};

}  // namespace lavaflow::detail
