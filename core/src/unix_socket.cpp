// SPDX-License-Identifier: MIT
#include "lavaflow/core/unix_socket.hpp"

#include <fcntl.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/un.h>

#include <cerrno>
#include <cstddef>
#include <cstring>
#include <thread>

#include "lavaflow/core/detail/format.hpp"
#include "lavaflow/core/detail/wire.hpp"

namespace lavaflow {
namespace {

constexpr std::uint32_t kFrameMagic = 0x4d464c46;  // "FLFM"
constexpr std::size_t kHeader = 12;                // magic, payload length, fd count

Result<sockaddr_un> abstract_address(std::string_view name, socklen_t& len) {
  sockaddr_un a{};
  a.sun_family = AF_UNIX;
  // sun_path[0] stays NUL: the abstract namespace.
  if (name.empty() || name.size() > sizeof a.sun_path - 1)
    return fail(Errc::InvalidArgument, "abstract socket",
                str_format("name of {} bytes: not 1 … {}", name.size(), sizeof a.sun_path - 1));
  std::memcpy(a.sun_path + 1, name.data(), name.size());
  len = static_cast<socklen_t>(offsetof(sockaddr_un, sun_path) + 1 + name.size());
  return a;
}

}  // namespace

Result<PeerCredentials> peer_credentials(int sock) {
  ucred cred{};
  socklen_t len = sizeof cred;
  if (::getsockopt(sock, SOL_SOCKET, SO_PEERCRED, &cred, &len) != 0)
    return std::unexpected(from_errno(errno, "getsockopt(SO_PEERCRED)"));
  return PeerCredentials{cred.pid, cred.uid, cred.gid};
}

Result<UniqueFd> listen_abstract(std::string_view name, int backlog) {
  socklen_t len = 0;
  LF_TRY(const auto addr, abstract_address(name, len));
  UniqueFd fd(::socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC | SOCK_NONBLOCK, 0));
  if (!fd) return std::unexpected(from_errno(errno, "socket(AF_UNIX)"));
  if (::bind(fd.get(), reinterpret_cast<const sockaddr*>(&addr), len) != 0)
    return std::unexpected(from_errno(errno, "bind", str_format("abstract socket @{}", name)));
  if (::listen(fd.get(), backlog) != 0)
    return std::unexpected(from_errno(errno, "listen", str_format("abstract socket @{}", name)));
  return fd;
}

Result<UniqueFd> connect_abstract(std::string_view name, std::chrono::nanoseconds timeout) {
  socklen_t len = 0;
  LF_TRY(const auto addr, abstract_address(name, len));
  UniqueFd fd(::socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC | SOCK_NONBLOCK, 0));
  if (!fd) return std::unexpected(from_errno(errno, "socket(AF_UNIX)"));
  const auto now = std::chrono::steady_clock::now();
  // An unbounded timeout (or one past the clock's range) waits without end, not not at all.
  const auto until = timeout >= std::chrono::steady_clock::time_point::max() - now
                         ? std::chrono::steady_clock::time_point::max()
                         : now + std::chrono::duration_cast<std::chrono::steady_clock::duration>(timeout);
  for (;;) {
    if (::connect(fd.get(), reinterpret_cast<const sockaddr*>(&addr), len) == 0) return fd;
    if (errno == EINTR) continue;
    if (errno == ECONNREFUSED)
      return fail(Errc::PeerLost, "connect", str_format("nothing listens at abstract socket @{}", name));
    // A full backlog answers EAGAIN to a non-blocking connect: the listener has not caught up.
    if (errno != EAGAIN || std::chrono::steady_clock::now() >= until)
      return std::unexpected(from_errno(errno, "connect", str_format("abstract socket @{}", name)));
    std::this_thread::sleep_for(std::chrono::microseconds(200));
  }
}

Result<std::pair<UniqueFd, UniqueFd>> socket_pair() {
  int sv[2];
  if (::socketpair(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0, sv) != 0)
    return std::unexpected(from_errno(errno, "socketpair(AF_UNIX, SOCK_SEQPACKET)"));
  return std::pair{UniqueFd(sv[0]), UniqueFd(sv[1])};
}

Status send_message(int sock, std::span<const std::byte> payload, std::span<const int> fds) {
  constexpr const char* call = "send_message";
  if (fds.size() > kMaxMessageFds)
    return fail(Errc::InvalidArgument, call, str_format("{} fds exceed the limit of {}", fds.size(), kMaxMessageFds));
  if (payload.size() > kMaxMessagePayload)
    return fail(Errc::InvalidArgument, call,
                str_format("{} payload bytes exceed the limit of {}", payload.size(), kMaxMessagePayload));
  wire::Writer w;
  w.put(kFrameMagic);
  w.put(static_cast<std::uint32_t>(payload.size()));
  w.put(static_cast<std::uint32_t>(fds.size()));
  auto header = std::move(w).take();
  iovec iov[2] = {{header.data(), header.size()}, {const_cast<std::byte*>(payload.data()), payload.size()}};
  msghdr msg{};
  msg.msg_iov = iov;
  msg.msg_iovlen = payload.empty() ? 1 : 2;
  std::vector<std::byte> control(CMSG_SPACE(sizeof(int) * fds.size()));
  if (!fds.empty()) {
    msg.msg_control = control.data();
    msg.msg_controllen = control.size();
    cmsghdr* c = CMSG_FIRSTHDR(&msg);
    c->cmsg_level = SOL_SOCKET;
    c->cmsg_type = SCM_RIGHTS;
    c->cmsg_len = CMSG_LEN(sizeof(int) * fds.size());
    std::memcpy(CMSG_DATA(c), fds.data(), sizeof(int) * fds.size());
  }
  for (;;) {
    const ssize_t n = ::sendmsg(sock, &msg, MSG_NOSIGNAL);
    if (n >= 0) {
      if (static_cast<std::size_t>(n) != header.size() + payload.size())
        return fail(Errc::System, call, "short send on a SOCK_SEQPACKET socket");
      return {};
    }
    if (errno == EINTR) continue;
    return std::unexpected(from_errno(errno, "sendmsg"));
  }
}

Result<SocketMessage> recv_message(int sock, std::chrono::milliseconds timeout, std::size_t max_payload,
                                   std::size_t max_fds) {
  constexpr const char* call = "recv_message";
  max_fds = std::min(max_fds, kMaxMessageFds);
  pollfd p{sock, POLLIN, 0};
  for (;;) {
    const int r = ::poll(&p, 1, static_cast<int>(std::min<long long>(timeout.count(), 1LL << 30)));
    if (r > 0) break;
    if (r == 0) return fail(Errc::Timeout, call, str_format("no message within {} ms", timeout.count()));
    if (errno != EINTR) return std::unexpected(from_errno(errno, "poll"));
  }
  std::vector<std::byte> buf(kHeader + max_payload + 1);  // +1 detects an oversized frame
  std::vector<std::byte> control(CMSG_SPACE(sizeof(int) * kMaxMessageFds));
  iovec iov{buf.data(), buf.size()};
  msghdr msg{};
  msg.msg_iov = &iov;
  msg.msg_iovlen = 1;
  msg.msg_control = control.data();
  msg.msg_controllen = control.size();
  ssize_t n;
  do n = ::recvmsg(sock, &msg, MSG_CMSG_CLOEXEC | MSG_DONTWAIT);
  while (n < 0 && errno == EINTR);
  if (n < 0) return std::unexpected(from_errno(errno, "recvmsg"));

  // Own every received fd first, whatever else is wrong with the frame.
  SocketMessage out;
  for (cmsghdr* c = CMSG_FIRSTHDR(&msg); c; c = CMSG_NXTHDR(&msg, c)) {
    if (c->cmsg_level != SOL_SOCKET || c->cmsg_type != SCM_RIGHTS) continue;
    const std::size_t count = (c->cmsg_len - CMSG_LEN(0)) / sizeof(int);
    for (std::size_t i = 0; i < count; ++i) {
      int fd;
      std::memcpy(&fd, CMSG_DATA(c) + i * sizeof(int), sizeof fd);
      out.fds.emplace_back(fd);
    }
  }
  if (n == 0) return fail(Errc::PeerLost, call, "peer closed the socket");
  if (msg.msg_flags & MSG_CTRUNC) {
    // The kernel also truncates when this process has no fd numbers left for what was attached.
    if (UniqueFd probe(::fcntl(sock, F_DUPFD_CLOEXEC, 0)); !probe && (errno == EMFILE || errno == ENFILE))
      return fail(Errc::System, call,
                  "this process is out of file descriptors: the fds the peer attached could not be received "
                  "(raise RLIMIT_NOFILE or close some)");
    return fail(Errc::Malformed, call, "too many fds attached (control data truncated)");
  }
  if (msg.msg_flags & MSG_TRUNC || static_cast<std::size_t>(n) > kHeader + max_payload)
    return fail(Errc::Malformed, call, str_format("frame larger than the {} byte limit", max_payload));
  wire::Reader r(std::span<const std::byte>(buf.data(), static_cast<std::size_t>(n)), call);
  LF_TRY(auto magic, r.get<std::uint32_t>());
  if (magic != kFrameMagic) return fail(Errc::Malformed, call, str_format("bad frame magic {:#x}", magic));
  LF_TRY(auto len, r.get<std::uint32_t>());
  LF_TRY(auto nfds, r.get<std::uint32_t>());
  if (len != r.remaining())
    return fail(Errc::Malformed, call, str_format("frame announces {} payload bytes, carries {}", len, r.remaining()));
  if (nfds > max_fds) return fail(Errc::Malformed, call, str_format("frame announces {} fds, limit {}", nfds, max_fds));
  if (nfds != out.fds.size())
    return fail(Errc::Malformed, call, str_format("frame announces {} fds, carries {}", nfds, out.fds.size()));
  out.payload.assign(buf.begin() + kHeader, buf.begin() + n);
  return out;
}

}  // namespace lavaflow
