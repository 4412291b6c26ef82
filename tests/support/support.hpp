// SPDX-License-Identifier: MIT
#pragma once
// Test helpers: visible skips (exit code 77, which CTest reports as "Skipped"), Result checks,
// byte patterns, spawning helper processes, and a Vulkan buffer copy for GPU-side checks.
#include <fcntl.h>
#include <spawn.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <catch2/catch.hpp>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <span>
#include <string>
#include <vector>

#include "lavaflow/lavaflow.hpp"
#include "lavaflow/transports/local.hpp"
#include "vk_helpers.hpp"

template <>
struct Catch::StringMaker<lavaflow::TransportKind> {
  static std::string convert(lavaflow::TransportKind k) { return std::string(lavaflow::to_string(k)); }
};

namespace lftest {

inline constexpr int kSkipCode = 77;

/// The rendezvous directories this test process made (channel_dir), removed when it ends.
inline std::vector<std::filesystem::path>& made_channel_dirs() {
  static std::vector<std::filesystem::path> made;
  static struct Cleanup {
    ~Cleanup() {
      std::error_code ec;
      for (auto& d : made) std::filesystem::remove_all(d, ec);
    }
  } cleanup;
  return made;
}

/// Ends this test process as skipped, with the reason on stdout (CTest shows it).
[[noreturn]] inline void skip(const std::string& reason) {
  std::printf("LAVAFLOW-SKIP: %s\n", reason.c_str());
  std::fflush(stdout);
  // _Exit runs no destructors (a skip may come from a thread or a forked child): remove this
  // test's directories here.
  std::error_code ec;
  for (auto& d : made_channel_dirs()) std::filesystem::remove_all(d, ec);
  std::_Exit(kSkipCode);
}

template <class R>
decltype(auto) ok(R&& r) {
  if (!r) FAIL("unexpected error: " << r.error().message());
  if constexpr (!std::is_void_v<typename std::remove_cvref_t<R>::value_type>) return *std::forward<R>(r);
}

template <class R>
lavaflow::Error err(R&& r) {
  if (r) FAIL("expected an error, got success");
  return r.error();
}

/// A Vulkan context on the best device, or a visible skip when this machine has none.
inline lavaflow::VulkanContext context_or_skip(const lavaflow::VulkanContextOptions& o = {}) {
  auto ctx = lavaflow::VulkanContext::create(o);
  if (!ctx) skip("no usable Vulkan device: " + ctx.error().message());
  return std::move(*ctx);
}

/// A fresh private (0700) rendezvous directory for this test; removed with its contents at exit.
inline std::filesystem::path channel_dir() {
  static int n = 0;
  auto dir = std::filesystem::temp_directory_path() /
             ("lavaflow-test-" + std::to_string(::getpid()) + "-" + std::to_string(n++));
  std::filesystem::remove_all(dir);
  REQUIRE(::mkdir(dir.c_str(), 0700) == 0);
  made_channel_dirs().push_back(dir);
  return dir;
}

inline int open_fds() { return *lavaflow::count_open_fds(); }

/// The open-fd count once it is back at or under `before`, or the last count after two seconds.
/// Drivers' own threads (Mesa's shader cache writer, for one) open and close files on their own
/// schedule, so one sample can catch a file of theirs that is open for a moment; a leak stays.
inline int fds_settled(int before) {
  int now = open_fds();
  for (int i = 0; i < 200 && now > before; ++i) {
    ::usleep(10000);
    now = open_fds();
  }
  return now;
}

/// An open-fd count taken when no driver thread holds a file for a moment: the same count seen
/// three times in a row.
inline int steady_fds() {
  int last = open_fds(), same = 0;
  for (int i = 0; i < 200 && same < 2; ++i) {
    ::usleep(2000);
    const int now = open_fds();
    same = now == last ? same + 1 : 0;
    last = now;
  }
  return last;
}

inline bool fd_is_open(int fd) { return fd >= 0 && ::fcntl(fd, F_GETFD) >= 0; }

/// Starts `path args...` with `keep_fd` inherited (its number passed as the last argument).
inline pid_t spawn(const std::string& path, std::vector<std::string> args, int keep_fd) {
  int fl = ::fcntl(keep_fd, F_GETFD);
  ::fcntl(keep_fd, F_SETFD, fl & ~FD_CLOEXEC);
  args.insert(args.begin(), path);
  args.push_back(std::to_string(keep_fd));
  std::vector<char*> argv;
  for (auto& a : args) argv.push_back(a.data());
  argv.push_back(nullptr);
  pid_t pid = -1;
  const int rc = ::posix_spawn(&pid, path.c_str(), nullptr, nullptr, argv.data(), environ);
  ::fcntl(keep_fd, F_SETFD, fl);
  REQUIRE(rc == 0);
  return pid;
}

/// Starts `args[0] args[1]...` (no fds beyond the standard ones).
inline pid_t run(std::vector<std::string> args) {
  std::vector<char*> argv;
  for (auto& a : args) argv.push_back(a.data());
  argv.push_back(nullptr);
  pid_t pid = -1;
  REQUIRE(::posix_spawn(&pid, args[0].c_str(), nullptr, nullptr, argv.data(), environ) == 0);
  return pid;
}

inline int wait_exit(pid_t pid) {
  int status = 0;
  while (::waitpid(pid, &status, 0) < 0 && errno == EINTR) {
  }
  return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
}

/// Copies `bytes` from src to dst with a Vulkan transfer and waits (a real GPU-side access).
inline void vk_copy(const lavaflow::VulkanContext& ctx, vk::Buffer src, std::uint64_t src_off, vk::Buffer dst,
                    std::uint64_t dst_off, std::uint64_t bytes) {
  auto e = vk_copy_status(ctx, src, src_off, dst, dst_off, bytes);
  if (!e.empty()) FAIL("vk_copy: " << e);
}

}  // namespace lftest
