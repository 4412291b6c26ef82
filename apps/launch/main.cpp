// SPDX-License-Identifier: MIT
// lavaflow-launch -n N [--timeout SECONDS] [--] PROGRAM [ARGS…] — starts N ranks of a job without
// MPI on this host: each is PROGRAM with LAVAFLOW_RANK, LAVAFLOW_WORLD_SIZE and LAVAFLOW_JOB in its
// environment (lavaflow::mesh::launched_job reads them). When a rank fails, the others have a few
// seconds to report it (the mesh names the lost rank) before they are stopped. Exit status: 0 when
// every rank exits 0, else the first failure's (128 + signal for a rank killed by one; 124 when
// --timeout ran out; 2 bad usage; 127 a program that cannot be started).
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <optional>
#include <random>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

#include "cli.hpp"
#include "lavaflow/core/detail/format.hpp"

namespace {

volatile sig_atomic_t g_stop_signal = 0;  // set by the handler: signal handlers can reach nothing else
void on_signal(int sig) { g_stop_signal = sig; }

void signal_all(const std::vector<pid_t>& pids, const std::vector<bool>& running, int sig) {
  for (std::size_t i = 0; i < pids.size(); ++i)
    if (running[i]) ::kill(pids[i], sig);
}

}  // namespace

int main(int argc, char** argv) {
  // The launcher's own options come first; the program starts at the first argument that is not
  // one of them (or after "--"), and everything from there is passed on untouched.
  int split = 1;
  std::vector<std::string> command;
  while (split < argc) {
    const std::string_view a = argv[split];
    if (a == "--") {
      for (int i = split + 1; i < argc; ++i) command.emplace_back(argv[i]);
      break;
    }
    if (!a.starts_with("-") || a == "-") {
      for (int i = split; i < argc; ++i) command.emplace_back(argv[i]);
      break;
    }
    const bool takes_value = (a == "-n" || a == "--ranks" || a == "--timeout");
    split += takes_value ? 2 : 1;
  }
  split = std::min(split, argc);
  CLI::App app{"lavaflow-launch: starts the ranks of a lava-flow job without MPI on this host"};
  std::uint64_t ranks = 2, timeout = 0;
  lfapp::add_whole(app, "-n,--ranks", ranks, "ranks to start", 1, 1024)->required();
  lfapp::add_whole(app, "--timeout", timeout, "seconds before every rank is stopped (0: none)", 0, 7 * 24 * 3600);
  app.footer("Usage: lavaflow-launch -n N [--timeout SECONDS] [--] PROGRAM [ARGS...]");
  if (auto rc = lfapp::parse(app, split, argv)) return *rc;
  if (command.empty()) {
    std::fprintf(stderr, "lavaflow-launch: no program to start (lavaflow-launch -n N PROGRAM [ARGS...])\n");
    return 2;
  }

  const std::string key = lavaflow::str_format("launch{}-{:x}", ::getpid(), std::random_device{}());
  struct sigaction sa {};
  sa.sa_handler = on_signal;
  ::sigaction(SIGINT, &sa, nullptr);
  ::sigaction(SIGTERM, &sa, nullptr);

  std::vector<pid_t> pids;
  std::vector<bool> running;
  for (std::uint64_t r = 0; r < ranks; ++r) {
    const pid_t pid = ::fork();
    if (pid < 0) {
      std::fprintf(stderr, "lavaflow-launch: fork: %s\n", std::strerror(errno));
      signal_all(pids, running, SIGKILL);
      return 1;
    }
    if (pid == 0) {
      ::setenv("LAVAFLOW_RANK", std::to_string(r).c_str(), 1);
      ::setenv("LAVAFLOW_WORLD_SIZE", std::to_string(ranks).c_str(), 1);
      ::setenv("LAVAFLOW_JOB", key.c_str(), 1);
      std::vector<char*> args;
      for (auto& a : command) args.push_back(a.data());
      args.push_back(nullptr);
      ::execvp(args[0], args.data());
      std::fprintf(stderr, "lavaflow-launch: rank %llu: cannot start %s: %s\n", static_cast<unsigned long long>(r),
                   args[0], std::strerror(errno));
      _exit(127);
    }
    pids.push_back(pid);
    running.push_back(true);
  }

  using Clock = std::chrono::steady_clock;
  const auto started = Clock::now();
  std::optional<Clock::time_point> failed_at;
  int status_out = 0;
  std::size_t left = pids.size();
  int stage = 0;  // 0 running; 1 asked to stop (SIGTERM); 2 killed
  while (left > 0) {
    int st = 0;
    const pid_t pid = ::waitpid(-1, &st, WNOHANG);
    if (pid > 0) {
      for (std::size_t i = 0; i < pids.size(); ++i) {
        if (pids[i] != pid) continue;
        running[i] = false;
        --left;
        const int code = WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
        if (code != 0 && !failed_at) {
          if (WIFEXITED(st)) {
            std::fprintf(stderr, "lavaflow-launch: rank %zu (pid %d) exited with status %d\n", i, pid, code);
          } else {
            std::fprintf(stderr, "lavaflow-launch: rank %zu (pid %d) was killed by signal %d (%s)\n", i, pid,
                         WTERMSIG(st), strsignal(WTERMSIG(st)));
          }
          status_out = code;
          failed_at = Clock::now();
        }
      }
      continue;
    }
    const auto now = Clock::now();
    if (g_stop_signal && stage == 0) {
      signal_all(pids, running, g_stop_signal);
      stage = 1;
      failed_at = now;
      status_out = 128 + g_stop_signal;
    }
    if (timeout && stage == 0 && now - started > std::chrono::seconds(timeout)) {
      std::fprintf(stderr, "lavaflow-launch: --timeout %llu s ran out: stopping %zu rank(s)\n",
                   static_cast<unsigned long long>(timeout), left);
      signal_all(pids, running, SIGTERM);
      stage = 1;
      failed_at = now;
      status_out = 124;
    }
    // After a failure the others have a few seconds to say what they saw, then they are stopped.
    if (failed_at && stage == 0 && now - *failed_at > std::chrono::seconds(5)) {
      signal_all(pids, running, SIGTERM);
      stage = 1;
    }
    if (failed_at && stage == 1 && now - *failed_at > std::chrono::seconds(10)) {
      signal_all(pids, running, SIGKILL);
      stage = 2;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  return status_out;
}
