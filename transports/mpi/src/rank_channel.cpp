// SPDX-License-Identifier: MIT
// Rank channels: one channel API between MPI ranks, routed per pair by the Communicator (design
// note 0013). A thin layer: each end holds the route's own channel (local Producer/Consumer or
// RemoteProducer/RemoteConsumer) and forwards to it.
#include <algorithm>
#include <chrono>
#include <utility>

#include "checks.hpp"
#include "lavaflow/core/detail/format.hpp"
#include "lavaflow/mpi/mpi.hpp"
#include "lavaflow/transports/local.hpp"

namespace lavaflow::mpi {

namespace {

/// The rendezvous name of the local channel from `from` to `to`: every rank of the job derives the
/// same one, and no other job on the host does (job_key: rank 0's pid and the job's size).
std::string local_name(const Communicator& comm, int from, int to, int channel) {
  return str_format("{}-{}-{}-c{}", comm.job_key(), from, to, channel);
}

/// The route both ends take: the Communicator's, unless the options force a transport.
Result<PairRoute> pick_route(const Communicator& comm, int from, int to, const RankChannelOptions& o,
                             const char* call) {
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

RemoteOptions remote_options(const RankChannelOptions& o) {
  return {.slots = o.slots,
          .slot_size = o.slot_size,
          .policy = o.policy,
          .wait = o.wait,
          .timestamps = o.timestamps,
          .channel = o.channel,
          .connect_timeout = o.connect_timeout,
          .vulkan = o.vulkan,
          .huge_pages = o.huge_pages};
}

}  // namespace

// ----- RankLoan, RankReceived

std::span<std::byte> RankLoan::bytes() const {
  return std::visit([](const auto& l) { return l.bytes(); }, loan_);
}
std::uint64_t RankLoan::sequence() const {
  return std::visit([](const auto& l) { return l.sequence(); }, loan_);
}

std::span<const std::byte> RankReceived::bytes() const {
  return std::visit([](const auto& r) { return r.bytes(); }, received_);
}
const MessageInfo& RankReceived::info() const {
  return std::visit([](const auto& r) -> const MessageInfo& { return r.info(); }, received_);
}
Status RankReceived::release() {
  if (auto* r = remote()) return r->release();
  local()->release();
  return {};
}

// ----- RankProducer

RankProducer::~RankProducer() = default;

Result<std::unique_ptr<RankProducer>> RankProducer::create(const Communicator& comm, int consumer_rank,
                                                           RankChannelOptions o) {
  constexpr const char* call = "mpi::RankProducer::create";
  LF_TRY_STATUS(detail::check_peer(comm, consumer_rank, call));
  auto p = std::unique_ptr<RankProducer>(new RankProducer);
  LF_TRY(p->route_, pick_route(comm, comm.rank(), consumer_rank, o, call));
  if (p->route_.transport == TransportKind::Mpi) {
    LF_TRY(p->remote_, RemoteProducer::create(comm, consumer_rank, remote_options(o)));
    return p;
  }
  auto made = Producer::create(local_name(comm, comm.rank(), consumer_rank, o.channel),
                               {.slots = o.slots,
                                .slot_size = o.slot_size,
                                .max_consumers = 1,
                                .policy = o.policy,
                                .wait = o.wait,
                                .timestamps = o.timestamps,
                                .transport = p->route_.transport,
                                .vulkan = o.vulkan,
                                .peer = comm.location(consumer_rank),
                                .host = comm.location(comm.rank()).host});
  if (!made)
    return std::unexpected(made.error().within(str_format("{}: local channel to rank {}", call, consumer_rank)));
  p->local_ = std::move(*made);
  return p;
}

/// Local route: the channel has its one consumer (the peer rank), or had it and lost it.
Status RankProducer::wait_for_consumer(Duration timeout) {
  if (local_->consumer_count() > 0) {
    consumer_seen_ = true;
    return {};
  }
  if (consumer_seen_)
    return fail(Errc::PeerLost, "mpi::RankProducer",
                str_format("rank {} closed channel {} (or died)", route_.to, local_->name()));
  auto ok = local_->wait_for_consumers(1, timeout);
  if (!ok) {
    if (ok.error().code() != Errc::Timeout) return ok;
    return fail(timeout == Duration::zero() ? Errc::WouldBlock : Errc::Timeout, "mpi::RankProducer",
                str_format("rank {} did not open channel {} in time", route_.to, local_->name()));
  }
  consumer_seen_ = true;
  return {};
}

Result<RankLoan> RankProducer::loan(Duration timeout) {
  if (remote_) {
    LF_TRY(auto l, remote_->loan(timeout));
    return RankLoan(std::move(l));
  }
  Duration left = timeout;
  if (!consumer_seen_ || local_->consumer_count() == 0) {  // not on the per-message path: no clock read there
    const Deadline deadline(timeout);
    LF_TRY_STATUS(wait_for_consumer(timeout));
    left = deadline.left();
  }
  LF_TRY(auto l, local_->loan(left));  // what the wait for the consumer left of the timeout
  return RankLoan(std::move(l));
}

Result<RankLoan> RankProducer::try_loan() {
  if (remote_) {
    LF_TRY(auto l, remote_->try_loan());
    return RankLoan(std::move(l));
  }
  LF_TRY_STATUS(wait_for_consumer(Duration::zero()));
  LF_TRY(auto l, local_->try_loan());
  return RankLoan(std::move(l));
}

Result<MessageInfo> RankProducer::publish(RankLoan&& loan, MessageInfo info) {
  if (remote_) {
    auto* l = loan.remote();
    if (!l)
      return fail(Errc::InvalidArgument, "mpi::RankProducer::publish", "a local channel's loan on a channel over MPI");
    return remote_->publish(std::move(*l), info);
  }
  auto* l = loan.local();
  if (!l)
    return fail(Errc::InvalidArgument, "mpi::RankProducer::publish", "a remote channel's loan on a local channel");
  return local_->publish(std::move(*l), info);
}

Status RankProducer::flush(Duration timeout) { return remote_ ? remote_->flush(timeout) : local_->flush(timeout); }
std::uint32_t RankProducer::slots() const { return remote_ ? remote_->slots() : local_->slots(); }
std::uint64_t RankProducer::slot_size() const { return remote_ ? remote_->slot_size() : local_->slot_size(); }

// ----- RankConsumer

RankConsumer::~RankConsumer() = default;

Result<std::unique_ptr<RankConsumer>> RankConsumer::open(const Communicator& comm, int producer_rank,
                                                         RankChannelOptions o) {
  constexpr const char* call = "mpi::RankConsumer::open";
  LF_TRY_STATUS(detail::check_peer(comm, producer_rank, call));
  auto c = std::unique_ptr<RankConsumer>(new RankConsumer);
  LF_TRY(c->route_, pick_route(comm, producer_rank, comm.rank(), o, call));
  if (c->route_.transport == TransportKind::Mpi) {
    LF_TRY(c->remote_, RemoteConsumer::open(comm, producer_rank, remote_options(o)));
    return c;
  }
  const auto name = local_name(comm, producer_rank, comm.rank(), o.channel);
  auto made = Consumer::open(name, {.wait = o.wait,
                                    .connect_timeout = o.connect_timeout,
                                    .vulkan = o.vulkan,
                                    .host = comm.location(comm.rank()).host});
  if (!made)
    return std::unexpected(
        made.error().within(str_format("{}: local channel {} from rank {}", call, name, producer_rank)));
  c->local_ = std::move(*made);
  if (c->local_->route().transport != c->route_.transport)  // the producer forced another transport
    c->route_ = PairRoute{producer_rank, comm.rank(), c->local_->route().transport,
                          "the producer's choice: " + c->local_->route().reason};
  return c;
}

Result<RankReceived> RankConsumer::receive(Duration timeout) {
  if (remote_) {
    LF_TRY(auto r, remote_->receive(timeout));
    return RankReceived(std::move(r));
  }
  LF_TRY(auto r, local_->receive(timeout));
  return RankReceived(std::move(r));
}

Result<RankReceived> RankConsumer::try_receive() {
  if (remote_) {
    LF_TRY(auto r, remote_->try_receive());
    return RankReceived(std::move(r));
  }
  LF_TRY(auto r, local_->try_receive());
  return RankReceived(std::move(r));
}

std::uint32_t RankConsumer::slots() const { return remote_ ? remote_->slots() : local_->slots(); }
std::uint64_t RankConsumer::slot_size() const { return remote_ ? remote_->slot_size() : local_->slot_size(); }

}  // namespace lavaflow::mpi
