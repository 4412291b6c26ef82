// SPDX-License-Identifier: MIT
#pragma once
/// @file
/// A directory only this user can reach (the runtime directory's check), and the names lava-flow
/// gives its files there. Not for applications.

#include <filesystem>
#include <string>

#include "lavaflow/core/error.hpp"
#include "lavaflow/core/unique_fd.hpp"

namespace lavaflow::detail {

/// `dir` exists (made, with its parents, when `create`), is a directory of this user and has mode
/// 0700; PermissionDenied naming what is wrong otherwise.
[[nodiscard]] Status private_directory(const std::filesystem::path& dir, bool create);

/// `name` (a channel's name, a stats label: part of a file name) is 1 to 64 letters, digits, '-',
/// '_' or '.', not starting with '.'; InvalidArgument for `what`, naming the rule, otherwise.
[[nodiscard]] Status check_file_name(const std::string& name, const char* what);

/// The lock file at `path`, locked (flock, exclusive, not waiting): held while its owner lives and
/// let go by the kernel when it dies. An empty fd when another holds it. `create`: made when
/// missing (else NotFound). A lock file can be unlinked by its holder (or a reclaimer) between
/// our open and our flock; the lock is ours only if the path still names the file we locked,
/// else we try again on the new file.
[[nodiscard]] Result<UniqueFd> lock_file(const std::filesystem::path& path, bool create);

}  // namespace lavaflow::detail
