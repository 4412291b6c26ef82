// SPDX-License-Identifier: MIT
#pragma once
/// @file
/// Framed messages with attached fds (SCM_RIGHTS) over AF_UNIX SOCK_SEQPACKET sockets. Every
/// received frame is validated (magic, lengths, fd count) before use; received fds are owned by
/// UniqueFds at once, so a malformed frame leaks nothing.

#include <chrono>
#include <cstddef>
#include <span>
#include <utility>
#include <vector>

#include "lavaflow/core/error.hpp"
#include "lavaflow/core/unique_fd.hpp"

namespace lavaflow {

struct SocketMessage {
  std::vector<std::byte> payload;
  std::vector<UniqueFd> fds;
};

inline constexpr std::size_t kMaxMessageFds = 128;  ///< per frame (the kernel allows 253)
inline constexpr std::size_t kMaxMessagePayload = 64 * 1024;

/// A connected pair of SOCK_SEQPACKET sockets (close-on-exec).
[[nodiscard]] Result<std::pair<UniqueFd, UniqueFd>> socket_pair();

/// Sends one frame: payload plus fds (borrowed: they stay open and owned by the caller).
[[nodiscard]] Status send_message(int sock, std::span<const std::byte> payload, std::span<const int> fds = {});

/// Receives one frame, waiting at most `timeout`. Errors: Timeout, PeerLost (hang-up), Malformed
/// (bad magic, length, more fds than `max_fds` or than announced, truncated frame).
[[nodiscard]] Result<SocketMessage> recv_message(int sock, std::chrono::milliseconds timeout,
                                                 std::size_t max_payload = kMaxMessagePayload,
                                                 std::size_t max_fds = kMaxMessageFds);

}  // namespace lavaflow
