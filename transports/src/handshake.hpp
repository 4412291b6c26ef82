// SPDX-License-Identifier: MIT
#pragma once
// Private: the channel handshake on the rendezvous socket, and its validating decoders (fuzzed by
// tests/fuzz/fuzz_handshake.cpp).
//   consumer → producer: Hello   {ProcessLocation}
//   producer → consumer: Welcome {consumer index, ring geometry, route, descriptors} + fds
//                        (control block, ring buffers, then the timeline and release timeline
//                        or the flag block and release block)
//                        Refuse  {reason}
#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <variant>
#include <vector>

#include "lavaflow/core/buffer.hpp"
#include "lavaflow/core/location.hpp"
#include "lavaflow/transports/channel.hpp"

namespace lavaflow::detail {

inline constexpr std::uint32_t kHandshakeMagic = 0x48434c46;  // "FLCH"
inline constexpr std::uint16_t kHandshakeVersion = 4;
inline constexpr std::uint32_t kMaxSlots = ProducerOptions::kMaxSlots;
/// A flag channel's counters are 64-bit words, each on its own cache line: the written counter in
/// a block every consumer maps, and each consumer's release counter in a block of its own.
inline constexpr std::uint64_t kFlagStride = 64;
inline constexpr std::uint32_t kMaxConsumers = 16;
inline constexpr std::uint64_t kFlagBlockSize = kFlagStride;
/// A consumer index's release block holds this many words; each admission at the index takes the
/// next, so GPU writes still queued by an earlier consumer there land in a word nobody reads.
inline constexpr std::uint32_t kReleaseWords = 4;
inline constexpr std::uint64_t kReleaseBlockSize = kFlagStride * kReleaseWords;
inline constexpr std::uint64_t kMaxSlotSize = std::uint64_t{1} << 40;

enum class MessageType : std::uint8_t { Hello = 1, Welcome = 2, Refuse = 3 };

struct Hello {
  ProcessLocation location;
};

struct Welcome {
  std::uint32_t consumer_index = 0;
  std::uint32_t slots = 0;
  std::uint64_t slot_size = 0;
  std::int32_t producer_pid = 0;
  std::string transport;
  std::string route_reason;
  ExportDescriptor control;
  std::vector<ExportDescriptor> ring;  ///< `slots` entries
  bool timeline = false;               ///< one more fd: the shared timeline semaphore
  /// One more fd (after the timeline): this consumer's release timeline, which its GPU signals when
  /// it is done reading a message and the producer's GPU waits on before reusing the slot.
  bool release_timeline = false;
  /// Flag channels, instead of the two timelines: two more fds, the GPU memory of the written
  /// counter (every consumer's) and of this consumer's release counter, the word at
  /// `release_offset` of its block.
  std::optional<ExportDescriptor> flag_block;
  std::optional<ExportDescriptor> release_block;
  std::uint64_t release_offset = 0;
};

struct Refuse {
  std::string reason;
};

[[nodiscard]] std::vector<std::byte> encode(const Hello& m);
[[nodiscard]] std::vector<std::byte> encode(const Welcome& m);
[[nodiscard]] std::vector<std::byte> encode(const Refuse& m);

using Handshake = std::variant<Hello, Welcome, Refuse>;
/// Validates everything: magic, version, type, lengths, counts, every descriptor, and that the
/// frame carried exactly the fds the message needs (`fd_count`).
[[nodiscard]] Result<Handshake> decode(std::span<const std::byte> bytes, std::size_t fd_count);

}  // namespace lavaflow::detail
