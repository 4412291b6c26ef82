// SPDX-License-Identifier: MIT
#pragma once
// Private to lavaflow::mpi: the channel ends over MPI, made behind a Producer or Consumer.
#include <memory>

#include "lavaflow/mpi/mpi.hpp"
#include "lavaflow/transports/detail/link.hpp"

namespace lavaflow::mpi::detail {

/// `end` brings the name and route; the rest of it comes from `o`. The producer announces the
/// channel at once and does not wait (its first loan waits for the answer); the consumer waits
/// up to o.connect_timeout for the announcement, then posts a receive on every ring buffer.
[[nodiscard]] Result<std::unique_ptr<Producer>> open_mpi_producer(const Communicator& comm, int consumer_rank,
                                                                  const ChannelOptions& o,
                                                                  lavaflow::detail::LinkedEnd end);
[[nodiscard]] Result<std::unique_ptr<Consumer>> open_mpi_consumer(const Communicator& comm, int producer_rank,
                                                                  const ChannelOptions& o,
                                                                  lavaflow::detail::LinkedEnd end);

}  // namespace lavaflow::mpi::detail
