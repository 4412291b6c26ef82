// SPDX-License-Identifier: MIT
#pragma once
// Private to lavaflow::mpi: the wire format of remote channels — message trailers, the hello that
// opens a channel, the tags. No MPI here: the format is decoded (and fuzzed) without it.
#include <bit>
#include <cstdint>
#include <cstring>
#include <expected>
#include <span>
#include <string>

#include "lavaflow/core/detail/format.hpp"

namespace lavaflow::mpi::detail {

// Each message is one MPI message: the payload, then a trailer (wire version 5). The payload starts
// the ring buffer (page-aligned for the application and the GPU copy engine); the trailer follows
// it, so its length can depend on the message. The full trailer: 8 bytes (sequence, flags, magic)
// and an 8-byte field for each of total size (chunked), user tag and timestamp that the message
// has. A small message without user tag or timestamp (≤ kShortMax bytes) ends in a 2-byte short
// trailer instead: two marker bits and the low 14 bits of the sequence. Small messages stay
// small because MPI's fastest paths are narrow: Open MPI's shared-memory path takes ≤ 10 bytes
// (an 8-byte payload with a 2-byte trailer), MPICH over UCX ≤ 24 bytes (design note 0010).
constexpr std::uint16_t kVersion = 5;
constexpr std::uint16_t kDataMagic = 0x4c00 | kVersion;  // 'L', wire version
constexpr std::uint32_t kHelloMagic = 0x484d4c46;        // "FLMH"

// Trailer flags. kChunked: a message sent in chunks (publish_gpu): the data-tag message is the
// trailer alone, chunks 0 … n-1 follow on chunk_tag; bits 8-13 hold log2 of the chunk size.
// kEnd: the producer closed the channel; its sequence is the number of messages before it. It is
// a trailer alone with kHasTag, whose tag field holds the channel's incarnation (see Hello).
constexpr std::uint16_t kChunked = 1, kHasTag = 2, kHasTime = 4, kEnd = 8;
constexpr unsigned kMinChunkLog2 = 12, kMaxChunkLog2 = 30;
// From this size publish() sends the trailer on its own, before the payload (see publish()).
constexpr std::uint64_t kSeparateTrailer = 512u << 10;
// Up to this many bytes on the wire publish() sends with MPI_Send (see publish()).
constexpr int kBlockingSendMax = 256;
// The short trailer: a little-endian u16 whose top two bits are set (a full trailer ends in the
// magic, whose high byte is 'L' = 0x4c) and whose low 14 bits are the sequence's.
constexpr std::uint64_t kShortMax = 64;
constexpr std::uint16_t kShortMarker = 0xC000, kShortSeqMask = 0x3FFF;

struct TrailerEnd {   // the last 8 bytes of every full trailer
  std::uint32_t seq;  // low 32 bits of the sequence number
  std::uint16_t flags;
  std::uint16_t magic;
};
static_assert(sizeof(TrailerEnd) == 8);
constexpr std::size_t kMaxTrailer = 8 * 3 + sizeof(TrailerEnd);

/// A message's trailer, decoded: [total size if chunked][user tag][timestamp] then TrailerEnd, or
/// the 2-byte short form.
struct Trailer {
  std::uint16_t flags = 0;
  bool is_short = false;
  std::uint64_t seq = 0, total = 0, tag = 0, timestamp_ns = 0;
  /// The short form, for a message of `size` bytes with these flags (the producer's choice).
  static bool short_fits(std::uint64_t size, std::uint16_t flags) { return flags == 0 && size <= kShortMax; }
  [[nodiscard]] std::size_t length() const {
    return is_short ? 2 : sizeof(TrailerEnd) + 8 * static_cast<std::size_t>(std::popcount(flags & 7u));
  }
  /// The marker that ends incarnation `incarnation` of a channel after `messages` messages.
  static Trailer end(std::uint64_t messages, std::uint32_t incarnation) {
    Trailer t;
    t.flags = kEnd | kHasTag;
    t.seq = messages;
    t.tag = incarnation;
    return t;
  }
  /// Whether the sequence it carries (its low 14 or 32 bits) is that of message `expected`.
  [[nodiscard]] bool is_sequence(std::uint64_t expected) const {
    return seq == (is_short ? expected & kShortSeqMask : static_cast<std::uint32_t>(expected));
  }
  /// Writes it at `at` (length() bytes).
  void write(std::byte* at) const {
    if (is_short) {
      const std::uint16_t v = kShortMarker | static_cast<std::uint16_t>(seq & kShortSeqMask);
      std::memcpy(at, &v, 2);
      return;
    }
    auto put = [&](std::uint64_t v) {
      std::memcpy(at, &v, 8);
      at += 8;
    };
    if (flags & kChunked) put(total);
    if (flags & kHasTag) put(tag);
    if (flags & kHasTime) put(timestamp_ns);
    const TrailerEnd e{static_cast<std::uint32_t>(seq), flags, kDataMagic};
    std::memcpy(at, &e, sizeof e);
  }
  /// Reads the trailer that ends `msg`; the cause when it is not one.
  static std::expected<Trailer, std::string> read(std::span<const std::byte> msg) {
    if (msg.size() < 2) return std::unexpected(str_format("{} bytes: shorter than a message trailer", msg.size()));
    std::uint16_t last = 0;
    std::memcpy(&last, msg.data() + msg.size() - 2, 2);
    if ((last & kShortMarker) == kShortMarker) {
      Trailer t;
      t.is_short = true;
      t.seq = last & kShortSeqMask;
      if (msg.size() - 2 > kShortMax)
        return std::unexpected(
            str_format("{} payload bytes before a short trailer (at most {})", msg.size() - 2, kShortMax));
      return t;
    }
    if ((last & 0xff00) != (kDataMagic & 0xff00)) return std::unexpected(str_format("bad trailer magic {:#x}", last));
    if (msg.size() < sizeof(TrailerEnd))
      return std::unexpected(str_format("{} bytes: shorter than a message trailer", msg.size()));
    TrailerEnd e{};
    std::memcpy(&e, msg.data() + msg.size() - sizeof e, sizeof e);
    if (e.magic != kDataMagic)
      return std::unexpected(str_format("wire version {}, this build speaks {}", e.magic & 0xff, kVersion));
    const unsigned chunk_log2 = e.flags >> 8;
    if ((e.flags & ~0x3F0Fu) != 0 || ((e.flags & kChunked) != 0) != (chunk_log2 != 0) ||
        (chunk_log2 != 0 && (chunk_log2 < kMinChunkLog2 || chunk_log2 > kMaxChunkLog2)))
      return std::unexpected(str_format("unknown trailer flags {:#x}", e.flags));
    if ((e.flags & kEnd) != 0 && (e.flags != (kEnd | kHasTag) || msg.size() != sizeof(TrailerEnd) + 8))
      return std::unexpected(
          str_format("an end-of-channel marker with flags {:#x} in {} bytes (it stands alone)", e.flags, msg.size()));
    Trailer t;
    t.flags = e.flags;
    t.seq = e.seq;
    if (msg.size() < t.length())
      return std::unexpected(str_format("{} bytes: shorter than their {}-byte trailer", msg.size(), t.length()));
    const std::byte* at = msg.data() + msg.size() - t.length();
    auto get = [&] {
      std::uint64_t v;
      std::memcpy(&v, at, 8);
      at += 8;
      return v;
    };
    if (t.flags & kChunked) t.total = get();
    if (t.flags & kHasTag) t.tag = get();
    if (t.flags & kHasTime) t.timestamp_ns = get();
    return t;
  }
};

// A channel number can be opened again between the same two ranks. Each opening (incarnation)
// draws a random number that the producer announces in its Hello; the consumer's answer, its
// credits and the producer's end marker carry it, and one that carries another number was left
// over by an earlier opening (a close that crossed its peer's) and is dropped.
struct Hello {
  std::uint32_t magic;
  std::uint16_t version;
  std::uint16_t reserved;
  std::uint32_t slots;
  std::int32_t channel;
  std::uint64_t slot_size;
  std::uint32_t incarnation;
  std::uint32_t reserved2;
};

// The consumer's answer to a Hello is its incarnation (a u32). A credit: how many messages the
// consumer has released, or kClosedCredit when it closed its end.
struct Credit {
  std::uint64_t released;
  std::uint64_t incarnation;
};
constexpr std::uint64_t kClosedCredit = ~std::uint64_t{0};

inline int data_tag(int channel) { return channel * 8 + 0; }
inline int credit_tag(int channel) { return channel * 8 + 1; }
inline int hello_tag(int channel) { return channel * 8 + 2; }
inline int ack_tag(int channel) { return channel * 8 + 3; }
inline int chunk_tag(int channel) { return channel * 8 + 4; }  // the chunks of a chunked message

}  // namespace lavaflow::mpi::detail
