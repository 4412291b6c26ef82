// SPDX-License-Identifier: MIT
#include "lavaflow/core/unique_fd.hpp"

#include <dirent.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>

#include "lavaflow/core/detail/format.hpp"

namespace lavaflow {

Result<UniqueFd> UniqueFd::dup() const {
  if (!valid()) return fail(Errc::InvalidArgument, "UniqueFd::dup", "no file descriptor owned");
  int copy = ::fcntl(get(), F_DUPFD_CLOEXEC, 0);
  if (copy < 0) return std::unexpected(from_errno(errno, "fcntl(F_DUPFD_CLOEXEC)"));
  return UniqueFd(copy);
}

Status UniqueFd::set_cloexec() const {
  if (::fcntl(get(), F_SETFD, FD_CLOEXEC) < 0) return std::unexpected(from_errno(errno, "fcntl(FD_CLOEXEC)"));
  return {};
}

Status check_handle_fd(const UniqueFd& fd, const char* call) {
  struct stat st {};
  if (!fd.valid() || ::fstat(fd.get(), &st) < 0)
    return fail(Errc::InvalidArgument, call, str_format("fd {} is not an open file descriptor", fd.get()));
  if (S_ISFIFO(st.st_mode) || S_ISSOCK(st.st_mode) || S_ISDIR(st.st_mode))
    return fail(Errc::InvalidArgument, call,
                str_format("fd {} is a {}, not a memory or semaphore handle", fd.get(),
                           S_ISFIFO(st.st_mode)   ? "pipe"
                           : S_ISSOCK(st.st_mode) ? "socket"
                                                  : "directory"));
  return {};
}

Status check_memory_fd(const UniqueFd& fd, std::uint64_t size, const char* call, bool seal) {
  LF_TRY_STATUS(check_handle_fd(fd, call));
  struct stat st {};
  if (::fstat(fd.get(), &st) < 0) return std::unexpected(from_errno(errno, "fstat").within(call));
  if (!S_ISREG(st.st_mode)) return {};
  if (seal) {
    // Seal before measuring: once it cannot shrink, the size read below stays true.
    int seals = ::fcntl(fd.get(), F_GET_SEALS);
    if (seals >= 0 && !(seals & F_SEAL_SHRINK) && ::fcntl(fd.get(), F_ADD_SEALS, F_SEAL_SHRINK) == 0)
      seals |= F_SEAL_SHRINK;
    if (seals < 0 || !(seals & F_SEAL_SHRINK))
      return fail(Errc::PermissionDenied, call,
                  str_format("fd {} is a memory file that is not sealed against shrinking and cannot be sealed: the "
                             "peer could truncate it under the mapping",
                             fd.get()));
    if (::fstat(fd.get(), &st) < 0) return std::unexpected(from_errno(errno, "fstat").within(call));
  }
  if (static_cast<std::uint64_t>(st.st_size) < size)
    return fail(Errc::Malformed, call,
                str_format("fd holds {} bytes but the descriptor says {}: the descriptor does not match the allocation",
                           st.st_size, size));
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
