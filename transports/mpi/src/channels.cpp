// SPDX-License-Identifier: MIT
// Channels between MPI ranks (design note 0013): the Communicator routes each pair, and both ends
// are the lavaflow::Producer and Consumer of every other channel — a local channel on a local
// route, a channel end over an MPI link otherwise.
#include <utility>

#include "checks.hpp"
#include "lavaflow/core/detail/format.hpp"
#include "lavaflow/mpi/mpi.hpp"
#include "lavaflow/transports/detail/link.hpp"
#include "links.hpp"

namespace lavaflow::mpi {

namespace {

/// The name of the channel from `from` to `to`: every rank of the job derives the same one, and no
/// other job on the host does (job_key: rank 0's pid and the job's size). A local route meets at
/// it; over MPI it names the channel in messages.
std::string channel_name(const Communicator& comm, int from, int to, int channel) {
  return str_format("{}-rank{}-to-rank{}-c{}", comm.job_key(), from, to, channel);
}

/// The route both ends take: the Communicator's, unless the options force a transport.
Result<PairRoute> pick_route(const Communicator& comm, int from, int to, const ChannelOptions& o, const char* call) {
  LF_TRY_STATUS(detail::check_channel(o.channel, call));
  LF_TRY(PairRoute r, comm.route(from, to));
  if (!o.transport || *o.transport == r.transport) return r;
  if (*o.transport != TransportKind::Mpi && r.transport == TransportKind::Mpi)
    return fail(Errc::InvalidArgument, call,
                str_format("transport {} forced, but ranks {} and {} are not on one host ({})", to_string(*o.transport),
                           from, to, r.reason));
  return PairRoute{
      from, to, *o.transport,
      str_format("forced by the application (the route would be {}: {})", to_string(r.transport), r.reason)};
}

ChannelRoute channel_route(const PairRoute& r) {
  return {r.transport, str_format("ranks {} to {}: {}", r.from, r.to, r.reason)};
}

}  // namespace

Result<std::unique_ptr<Producer>> open_producer(const Communicator& comm, int consumer_rank, ChannelOptions o) {
  constexpr const char* call = "mpi::open_producer";
  LF_TRY_STATUS(detail::check_peer(comm, consumer_rank, call));
  LF_TRY(const PairRoute route, pick_route(comm, comm.rank(), consumer_rank, o, call));
  auto name = channel_name(comm, comm.rank(), consumer_rank, o.channel);
  if (route.transport == TransportKind::Mpi) {
    auto made = detail::open_mpi_producer(comm, consumer_rank, o, {.name = name, .route = channel_route(route)});
    if (!made) return std::unexpected(made.error().within(str_format("{}: channel to rank {}", call, consumer_rank)));
    return made;
  }
  auto made = Producer::create(name, {.slots = o.slots,
                                      .slot_size = o.slot_size,
                                      .max_consumers = 1,
                                      .policy = o.policy,
                                      .wait = o.wait,
                                      .timestamps = o.timestamps,
                                      .transport = route.transport,
                                      .vulkan = o.vulkan,
                                      .peer = comm.location(consumer_rank),
                                      .host = comm.location(comm.rank()).host,
                                      .await_consumers = 1});
  if (!made)
    return std::unexpected(made.error().within(str_format("{}: local channel to rank {}", call, consumer_rank)));
  lavaflow::detail::set_route(**made, channel_route(route));
  return made;
}

Result<std::unique_ptr<Consumer>> open_consumer(const Communicator& comm, int producer_rank, ChannelOptions o) {
  constexpr const char* call = "mpi::open_consumer";
  LF_TRY_STATUS(detail::check_peer(comm, producer_rank, call));
  LF_TRY(const PairRoute route, pick_route(comm, producer_rank, comm.rank(), o, call));
  auto name = channel_name(comm, producer_rank, comm.rank(), o.channel);
  if (route.transport == TransportKind::Mpi) {
    auto made = detail::open_mpi_consumer(comm, producer_rank, o, {.name = name, .route = channel_route(route)});
    if (!made) return std::unexpected(made.error().within(str_format("{}: channel from rank {}", call, producer_rank)));
    return made;
  }
  auto made = Consumer::open(name, {.wait = o.wait,
                                    .connect_timeout = o.connect_timeout,
                                    .vulkan = o.vulkan,
                                    .host = comm.location(comm.rank()).host});
  if (!made)
    return std::unexpected(
        made.error().within(str_format("{}: local channel {} from rank {}", call, name, producer_rank)));
  // The producer may have forced another transport: then its reason stands.
  if ((*made)->route().transport == route.transport) lavaflow::detail::set_route(**made, channel_route(route));
  return made;
}

}  // namespace lavaflow::mpi
