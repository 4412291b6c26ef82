// SPDX-License-Identifier: MIT
#include "lavaflow/core/unique_fd.hpp"

#include <dirent.h>
#include <fcntl.h>
#include <unistd.h>

#include <cerrno>

namespace lavaflow {

void UniqueFd::reset(int fd) noexcept {
  if (fd_ >= 0 && fd_ != fd) ::close(fd_);  // close errors are not actionable: the fd is gone
  fd_ = fd;
}

Result<UniqueFd> UniqueFd::dup() const {
  if (fd_ < 0) return fail(Errc::InvalidArgument, "UniqueFd::dup", "no file descriptor owned");
  int copy = ::fcntl(fd_, F_DUPFD_CLOEXEC, 0);
  if (copy < 0) return std::unexpected(from_errno(errno, "fcntl(F_DUPFD_CLOEXEC)"));
  return UniqueFd(copy);
}

Status UniqueFd::set_cloexec() const {
  if (::fcntl(fd_, F_SETFD, FD_CLOEXEC) < 0) return std::unexpected(from_errno(errno, "fcntl(FD_CLOEXEC)"));
  return {};
}

Result<int> count_open_fds() {
  DIR* dir = ::opendir("/proc/self/fd");
  if (dir == nullptr) return std::unexpected(from_errno(errno, "opendir(/proc/self/fd)"));
  int n = 0;
  while (const dirent* e = ::readdir(dir)) {
    if (e->d_name[0] != '.') ++n;
  }
  ::closedir(dir);
  return n - 1;  // not counting the directory stream's own fd
}

}  // namespace lavaflow
