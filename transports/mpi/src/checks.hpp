// SPDX-License-Identifier: MIT
#pragma once
// Private to lavaflow::mpi: the argument checks remote channels and rank channels share.
#include "lavaflow/mpi/mpi.hpp"

namespace lavaflow::mpi::detail {

/// InvalidArgument unless `channel` is in 0 … kMaxChannel.
[[nodiscard]] Status check_channel(int channel, const char* call);
/// InvalidArgument unless `peer` is another rank of `comm`.
[[nodiscard]] Status check_peer(const Communicator& comm, int peer, const char* call);

}  // namespace lavaflow::mpi::detail
