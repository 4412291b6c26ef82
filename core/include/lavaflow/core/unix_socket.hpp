// SPDX-License-Identifier: MIT
#pragma once
/// @file
/// Framed messages with attached fds (SCM_RIGHTS) over AF_UNIX SOCK_SEQPACKET sockets. Every
/// received frame is validated (magic, lengths, fd count) before use; received fds are owned by
/// UniqueFds at once, so a malformed frame leaks nothing.

#include <sys/types.h>

#include <chrono>
#include <cstddef>
#include <span>
#include <string_view>
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

/// The process at the other end of a connected socket, as the kernel recorded it (SO_PEERCRED).
struct PeerCredentials {
  pid_t pid = 0;
  uid_t uid = 0;
  gid_t gid = 0;
};
[[nodiscard]] Result<PeerCredentials> peer_credentials(int sock);

/// A SOCK_SEQPACKET socket (close-on-exec, non-blocking) listening on `name` in the abstract
/// namespace: no file to remove, the name is gone with the socket. Any process of the network
/// namespace may connect, so the listener checks who did (peer_credentials). AddressInUse-like
/// failures are Errc::System naming the name.
[[nodiscard]] Result<UniqueFd> listen_abstract(std::string_view name, int backlog);
/// A socket connected to the abstract `name` (close-on-exec, non-blocking), waiting at most
/// `timeout` while the listener's backlog is full. No listener: Errc::PeerLost at once.
[[nodiscard]] Result<UniqueFd> connect_abstract(std::string_view name, std::chrono::nanoseconds timeout);

/// Sends one frame: payload plus fds (borrowed: they stay open and owned by the caller).
[[nodiscard]] Status send_message(int sock, std::span<const std::byte> payload, std::span<const int> fds = {});

/// Receives one frame, waiting at most `timeout`. Errors: Timeout, PeerLost (hang-up), Malformed
/// (bad magic, length, more fds than `max_fds` or than announced, truncated frame).
[[nodiscard]] Result<SocketMessage> recv_message(int sock, std::chrono::milliseconds timeout,
                                                 std::size_t max_payload = kMaxMessagePayload,
                                                 std::size_t max_fds = kMaxMessageFds);

}  // namespace lavaflow
