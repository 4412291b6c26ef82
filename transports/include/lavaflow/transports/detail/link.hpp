// SPDX-License-Identifier: MIT
#pragma once
/// @file
/// For transports that move messages themselves (the MPI route): a link is the part of a channel
/// end that sends or receives. The Producer or Consumer around it keeps everything else — the API,
/// the ring's Buffers, the rule that a Loan or Received outliving its channel keeps the ring alive
/// — so a user holds the same two types whatever the route. Not for applications.

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "lavaflow/transports/channel.hpp"

namespace lavaflow::detail {

/// The sending half of a channel end. Called by one thread at a time (the Producer's).
class ProducerLink {
 public:
  virtual ~ProducerLink() = default;
  /// A ring buffer free for writing, waiting at most `timeout` (WouldBlock for a zero timeout).
  [[nodiscard]] virtual Result<std::uint32_t> loan(Duration timeout) = 0;
  /// Sends the first `info.size` bytes (already checked against the slot size) of `slot` as the
  /// next message; returns `info` with its sequence and timestamp. On failure the slot is still
  /// loaned (the Loan gives it back).
  [[nodiscard]] virtual Result<MessageInfo> publish(std::uint32_t slot, MessageInfo info) = 0;
  /// A loaned slot dropped unpublished.
  virtual void give_back(std::uint32_t slot) = 0;
  /// Waits until the consumer has received and released every message sent.
  [[nodiscard]] virtual Status flush(Duration timeout) = 0;
  /// 1 once the consumer has opened its end, else 0.
  [[nodiscard]] virtual std::uint32_t consumer_count() = 0;
  /// The sequence the next published message gets.
  [[nodiscard]] virtual std::uint64_t next_sequence() const = 0;
  /// The channel ends (Producer::close or its end going): the consumer receives what was
  /// published, then PeerLost. Called again, nothing more happens.
  virtual void close() = 0;
};

/// The receiving half of a channel end. Called by one thread at a time (the Consumer's).
class ConsumerLink {
 public:
  virtual ~ConsumerLink() = default;
  /// The next message's slot and header, waiting at most `timeout`.
  [[nodiscard]] virtual Result<std::pair<std::uint32_t, MessageInfo>> receive(Duration timeout) = 0;
  /// The message in `slot` is done with. A failure to take the slot back into service is kept
  /// and reported by the next receive().
  virtual void release(std::uint32_t slot) = 0;
  [[nodiscard]] virtual std::uint64_t next_sequence() const = 0;
  /// This end leaves (Consumer::close, or its end going once no message is held): the producer's
  /// next wait on it ends in PeerLost. Messages still held may be released after it; they no
  /// longer count. Called again, nothing more happens.
  virtual void close() = 0;
};

/// What a Producer or Consumer over a link shows of itself.
struct LinkedEnd {
  std::string name;  ///< for messages and Producer::name()
  ChannelRoute route;
  std::uint32_t slots = 0;
  std::uint64_t slot_size = 0;
  FullPolicy policy = FullPolicy::Block;
  WaitMode wait = WaitMode::SpinThenBlock;
  bool timestamps = false;
  const VulkanContext* vulkan = nullptr;  ///< Producer/Consumer::vulkan()
  std::int32_t peer_pid = 0;              ///< Consumer::producer_pid()
  /// The ring's buffers by slot, `slot_size` bytes each: Loan::buffer() and Received::buffer().
  std::vector<std::unique_ptr<Buffer>> ring;
};

[[nodiscard]] std::unique_ptr<Producer> make_producer(LinkedEnd end, std::unique_ptr<ProducerLink> link);
[[nodiscard]] std::unique_ptr<Consumer> make_consumer(LinkedEnd end, std::unique_ptr<ConsumerLink> link);

/// The link under a channel end, null on a local route.
[[nodiscard]] ProducerLink* link_of(const Producer& producer);
[[nodiscard]] ConsumerLink* link_of(const Consumer& consumer);

/// A channel routed by its maker rather than by Producer::create (the MPI communicator chooses
/// every pair's route) reports the maker's reason.
void set_route(Producer& producer, ChannelRoute route);
void set_route(Consumer& consumer, ChannelRoute route);

/// Publishes `loan` through `send` instead of ProducerLink::publish (a transport's own way of
/// sending, e.g. staged from a GPU buffer), with the checks and bookkeeping of publish().
using LinkSend = std::function<Result<MessageInfo>(ProducerLink&, std::uint32_t slot)>;
[[nodiscard]] Result<MessageInfo> publish_linked(Producer& producer, Loan&& loan, const LinkSend& send);

}  // namespace lavaflow::detail
