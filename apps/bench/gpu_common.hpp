// SPDX-License-Identifier: MIT
#pragma once
// What lavaflow-bench's CUDA measurements share: owners for CUDA objects, a bounded stream wait,
// and the peer process (this program started again) with its private rendezvous directory.
#include <cuda_runtime_api.h>
#include <fcntl.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <filesystem>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "lavaflow/core/detail/format.hpp"
#include "lavaflow/core/duration.hpp"
#include "lavaflow/cuda/cuda.hpp"

extern char** environ;

namespace lfbench {

using namespace lavaflow;
using namespace std::chrono_literals;

#define GPU_OK(expr)                                                                                   \
  do {                                                                                                 \
    if (cudaError_t e_ = (expr); e_ != cudaSuccess) return std::unexpected(cuda::to_error(e_, #expr)); \
  } while (0)

struct DeviceMemory {
  void* p = nullptr;
  DeviceMemory() = default;
  DeviceMemory(const DeviceMemory&) = delete;
  DeviceMemory& operator=(const DeviceMemory&) = delete;
  ~DeviceMemory() {
    if (p) cudaFree(p);
  }
  [[nodiscard]] unsigned long long* words() const { return static_cast<unsigned long long*>(p); }
};

inline Status allocate(DeviceMemory& m, std::uint64_t bytes) {
  GPU_OK(cudaMalloc(&m.p, bytes));
  GPU_OK(cudaMemset(m.p, 0, bytes));
  return {};
}

struct StreamOwner {
  cudaStream_t s = nullptr;
  StreamOwner() = default;
  StreamOwner(const StreamOwner&) = delete;
  StreamOwner& operator=(const StreamOwner&) = delete;
  ~StreamOwner() {
    if (s) cudaStreamDestroy(s);
  }
};

inline Status create(StreamOwner& s) {
  GPU_OK(cudaStreamCreateWithFlags(&s.s, cudaStreamNonBlocking));
  return {};
}

struct EventOwner {
  cudaEvent_t e = nullptr;
  EventOwner() = default;
  EventOwner(EventOwner&& o) noexcept : e(std::exchange(o.e, nullptr)) {}
  EventOwner& operator=(EventOwner&&) = delete;
  ~EventOwner() {
    if (e) cudaEventDestroy(e);
  }
};

/// Waits for `s` with a deadline: a peer that died leaves our stream waiting on the GPU forever.
inline Status finish(cudaStream_t s, Duration timeout, const char* what) {
  const Deadline dl(timeout);
  for (;;) {
    const cudaError_t e = cudaStreamQuery(s);
    if (e == cudaSuccess) return {};
    if (e != cudaErrorNotReady) return std::unexpected(cuda::to_error(e, what));
    if (dl.passed()) return fail(Errc::Timeout, what, "the GPU work did not finish (a peer stopped signalling)");
    std::this_thread::sleep_for(100us);
  }
}

inline pid_t spawn_self(std::vector<std::string> args, int keep_fd = -1) {
  if (keep_fd >= 0) ::fcntl(keep_fd, F_SETFD, 0);
  std::vector<char*> argv;
  for (auto& a : args) argv.push_back(a.data());
  argv.push_back(nullptr);
  pid_t pid = -1;
  if (::posix_spawn(&pid, "/proc/self/exe", nullptr, nullptr, argv.data(), environ) != 0) return -1;
  return pid;
}

inline int wait_child(pid_t pid) {
  int st = 0;
  while (::waitpid(pid, &st, 0) < 0 && errno == EINTR) {
  }
  return WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
}

/// The peer process of one measurement: killed and reaped if the measurement fails first.
class Peer {
 public:
  explicit Peer(pid_t pid) : pid_(pid) {}
  Peer(const Peer&) = delete;
  Peer& operator=(const Peer&) = delete;
  ~Peer() {
    if (pid_ > 0) {
      ::kill(pid_, SIGKILL);
      wait_child(pid_);
    }
  }
  [[nodiscard]] bool started() const { return pid_ > 0; }
  Status join(const char* what) {
    const int rc = wait_child(std::exchange(pid_, -1));
    if (rc != 0) return fail(Errc::PeerLost, what, str_format("the peer process exited with {}", rc));
    return {};
  }

 private:
  pid_t pid_;
};

/// A private rendezvous directory for one measurement's channels, removed with everything in it.
class TempDir {
 public:
  TempDir() {
    char tmpl[] = "/tmp/lavaflow-bench-XXXXXX";
    if (::mkdtemp(tmpl)) path_ = tmpl;
  }
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;
  ~TempDir() {
    std::error_code ec;
    if (!path_.empty()) std::filesystem::remove_all(path_, ec);
  }
  [[nodiscard]] const std::string& path() const { return path_; }

 private:
  std::string path_;
};

}  // namespace lfbench
