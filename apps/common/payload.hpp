// SPDX-License-Identifier: MIT
#pragma once
// Message payloads for the demo and tests: a pattern that depends on the sequence number, and a
// 64-bit checksum carried in the message's user tag. Word-wise, so 16 MiB messages stay cheap.
#include <cstdint>
#include <cstring>
#include <span>

#include "pattern.h"

namespace lfapp {

inline std::uint64_t pattern_word(std::uint64_t seq, std::uint64_t i) { return lf_message_word(seq, i); }

inline void fill_message(std::span<std::byte> b, std::uint64_t seq) {
  const std::size_t words = b.size() / 8;
  for (std::size_t i = 0; i < words; ++i) {
    const std::uint64_t w = pattern_word(seq, i);
    std::memcpy(b.data() + i * 8, &w, 8);
  }
  for (std::size_t i = words * 8; i < b.size(); ++i) b[i] = static_cast<std::byte>(pattern_word(seq, i) >> 56);
}

inline std::uint64_t checksum(std::span<const std::byte> b) {
  std::uint64_t h = 0xcbf29ce484222325ull ^ b.size();
  const std::size_t words = b.size() / 8;
  for (std::size_t i = 0; i < words; ++i) {
    std::uint64_t w;
    std::memcpy(&w, b.data() + i * 8, 8);
    h = (h ^ w) * 0x100000001b3ull;
    h ^= h >> 32;
  }
  for (std::size_t i = words * 8; i < b.size(); ++i) h = (h ^ static_cast<std::uint64_t>(b[i])) * 0x100000001b3ull;
  return h;
}

/// The number of 64-bit words (and tail bytes) of `b` that differ from message `seq`'s pattern.
inline std::uint64_t mismatches(std::span<const std::byte> b, std::uint64_t seq) {
  const std::size_t words = b.size() / 8;
  std::uint64_t bad = 0;
  for (std::size_t i = 0; i < words; ++i) {
    std::uint64_t w;
    std::memcpy(&w, b.data() + i * 8, 8);
    bad += w != pattern_word(seq, i);
  }
  for (std::size_t i = words * 8; i < b.size(); ++i) bad += b[i] != static_cast<std::byte>(pattern_word(seq, i) >> 56);
  return bad;
}

/// True when `b` holds exactly the pattern of message `seq`.
inline bool matches(std::span<const std::byte> b, std::uint64_t seq) {
  if (b.size() >= 8) {
    std::uint64_t w;
    std::memcpy(&w, b.data(), 8);
    if (w != pattern_word(seq, 0)) return false;
  }
  return true;
}

}  // namespace lfapp
