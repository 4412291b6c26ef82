// SPDX-License-Identifier: MIT
#pragma once
/// @file
/// Move-only owner of a POSIX file descriptor (UniqueHandle). Every exported fd in lava-flow lives
/// in exactly one UniqueFd; handing it to an API that takes ownership is spelled `release()`.

#include "lavaflow/core/error.hpp"
#include "lavaflow/core/unique_handle.hpp"

namespace lavaflow {

class UniqueFd : public UniqueHandle<detail::FdTraits> {
 public:
  using UniqueHandle::UniqueHandle;

  /// A new owner of a duplicate (close-on-exec) of this fd.
  [[nodiscard]] Result<UniqueFd> dup() const;
  /// Keeps the fd out of exec'd children (fds that APIs hand out are often inheritable).
  [[nodiscard]] Status set_cloexec() const;
};

/// InvalidArgument unless `fd` is open and could be a memory or semaphore handle: pipes, sockets
/// and directories never are, and some drivers block reading one (llvmpipe's import does).
[[nodiscard]] Status check_handle_fd(const UniqueFd& fd, const char* call);

/// check_handle_fd, and where `fd` is a file (a memfd, as CPU buffers and some drivers' exported
/// memory are): Malformed unless it holds at least `size` bytes, and PermissionDenied unless
/// it is sealed against shrinking — sealed here when the file allows it — so that the peer that
/// sent it cannot truncate the memory under a mapping (a later access would be SIGBUS). Other
/// handles (NVIDIA's opaque fds are not files) carry no size to check: their driver validates
/// the import. `seal` false skips the seal check for files that cannot be sealed (hugetlbfs).
[[nodiscard]] Status check_memory_fd(const UniqueFd& fd, std::uint64_t size, const char* call, bool seal = true);

/// Number of open file descriptors of this process (from /proc/self/fd), for leak checks.
[[nodiscard]] Result<int> count_open_fds();

}  // namespace lavaflow
