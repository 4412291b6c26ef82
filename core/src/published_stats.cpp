// SPDX-License-Identifier: MIT
#include "lavaflow/core/published_stats.hpp"

#include <poll.h>
#include <signal.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <charconv>
#include <cstring>
#include <optional>

#include "lavaflow/core/detail/format.hpp"
#include "lavaflow/core/detail/private_dir.hpp"
#include "stats_server.hpp"

namespace lavaflow {

namespace {

using Clock = std::chrono::steady_clock;

/// How long the server spends on one client before dropping it.
constexpr auto kAnswerBudget = std::chrono::milliseconds(200);

std::filesystem::path socket_name(std::int32_t pid, const std::string& label) {
  return str_format("pool-{}-{}.sock", pid, label);
}

/// The pid and label of a file named pool-<pid>-<label>.sock; nothing for any other name.
std::optional<std::pair<std::int32_t, std::string>> parse_socket_name(const std::string& name) {
  constexpr std::string_view prefix = "pool-", suffix = ".sock";
  if (name.size() <= prefix.size() + suffix.size() || !name.starts_with(prefix) || !name.ends_with(suffix))
    return std::nullopt;
  const std::string_view middle(name.data() + prefix.size(), name.size() - prefix.size() - suffix.size());
  const auto dash = middle.find('-');
  if (dash == std::string_view::npos || dash == 0) return std::nullopt;
  std::int32_t pid = 0;
  const auto [end, ec] = std::from_chars(middle.data(), middle.data() + dash, pid);
  if (ec != std::errc{} || end != middle.data() + dash || pid <= 0) return std::nullopt;
  std::string label(middle.substr(dash + 1));
  if (!check_stats_label(label)) return std::nullopt;
  return std::pair{pid, std::move(label)};
}

/// Whether process `pid` is gone (a process of another user that lives counts as living).
bool process_gone(std::int32_t pid) { return ::kill(pid, 0) != 0 && errno == ESRCH; }

Result<sockaddr_un> address_of(const std::filesystem::path& path) {
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  const std::string s = path.string();
  if (s.size() >= sizeof addr.sun_path)
    return fail(
        Errc::InvalidArgument, "stats socket",
        str_format("{}: {} bytes, longer than a Unix socket path may be ({})", s, s.size(), sizeof addr.sun_path - 1));
  std::memcpy(addr.sun_path, s.c_str(), s.size() + 1);
  return addr;
}

/// A connected stream socket to `path` (non-blocking), or the error of connect().
Result<UniqueFd> connect_to(const std::filesystem::path& path) {
  LF_TRY(const sockaddr_un addr, address_of(path));
  UniqueFd fd(::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0));
  if (!fd) return std::unexpected(from_errno(errno, "socket"));
  if (::connect(fd.get(), reinterpret_cast<const sockaddr*>(&addr), sizeof addr) != 0 && errno != EINPROGRESS)
    return std::unexpected(from_errno(errno, "connect", path.string()));
  return fd;
}

/// Whether a process listens on the socket at `addr` (a connection is taken or queued).
bool someone_listens(const sockaddr_un& addr) {
  UniqueFd fd(::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0));
  if (!fd) return false;
  return ::connect(fd.get(), reinterpret_cast<const sockaddr*>(&addr), sizeof addr) == 0 || errno == EAGAIN ||
         errno == EINPROGRESS;
}

int millis_left(Clock::time_point deadline) {
  const auto left = std::chrono::ceil<std::chrono::milliseconds>(deadline - Clock::now()).count();
  return static_cast<int>(std::clamp<long long>(left, 0, 1000));
}

/// Reads until the peer hangs up, at most kMaxPublishedReport bytes, before `deadline`.
Result<std::string> read_report(int fd, Clock::time_point deadline) {
  std::string out;
  char buf[16384];
  for (;;) {
    const ssize_t n = ::read(fd, buf, sizeof buf);
    if (n > 0) {
      if (out.size() + static_cast<std::size_t>(n) > kMaxPublishedReport)
        return fail(Errc::Malformed, "read_published_pools",
                    str_format("a report longer than {} bytes", kMaxPublishedReport));
      out.append(buf, static_cast<std::size_t>(n));
      continue;
    }
    if (n == 0) return out;
    if (errno == EINTR) continue;
    if (errno != EAGAIN) return std::unexpected(from_errno(errno, "read"));
    if (Clock::now() >= deadline)
      return fail(Errc::Timeout, "read_published_pools",
                  str_format("the report did not end in time ({} bytes so far)", out.size()));
    pollfd p{fd, POLLIN, 0};
    (void)::poll(&p, 1, std::max(1, millis_left(deadline)));
  }
}

}  // namespace

std::filesystem::path runtime_directory() {
  if (const char* xdg = std::getenv("XDG_RUNTIME_DIR"); xdg && *xdg) {
    struct stat st {};
    if (::stat(xdg, &st) == 0 && st.st_uid == ::getuid()) return std::filesystem::path(xdg) / "lavaflow";
  }
  return std::filesystem::path("/tmp") / str_format("lavaflow-{}", ::getuid());
}

Status check_stats_label(const std::string& label) { return detail::check_file_name(label, "stats label"); }

Status detail::check_file_name(const std::string& name, const char* what) {
  if (name.empty() || name.size() > 64)
    return fail(Errc::InvalidArgument, what, str_format("\"{}\": must be 1 to 64 characters", name));
  for (char c : name)
    if (!(std::isalnum(static_cast<unsigned char>(c)) || c == '-' || c == '_' || c == '.'))
      return fail(Errc::InvalidArgument, what, str_format("\"{}\": only letters, digits, '-', '_', '.'", name));
  if (name[0] == '.') return fail(Errc::InvalidArgument, what, "must not start with '.'");
  return {};
}

Status detail::private_directory(const std::filesystem::path& dir, bool create) {
  if (create) {
    std::error_code ec;
    std::filesystem::create_directories(dir.parent_path(), ec);
    if (::mkdir(dir.c_str(), 0700) != 0 && errno != EEXIST)
      return std::unexpected(from_errno(errno, "mkdir", dir.string()));
  }
  struct stat st {};
  if (::lstat(dir.c_str(), &st) != 0) return std::unexpected(from_errno(errno, "lstat", dir.string()));
  if (!S_ISDIR(st.st_mode))
    return fail(Errc::PermissionDenied, "runtime directory", dir.string() + " is not a directory");
  if (st.st_uid != ::getuid())
    return fail(Errc::PermissionDenied, "runtime directory",
                str_format("{} belongs to uid {}, not to this user (uid {})", dir.string(), st.st_uid, ::getuid()));
  if (st.st_mode & 077)
    return fail(
        Errc::PermissionDenied, "runtime directory",
        str_format("{} is reachable by other users (mode {:04o}); it must be 0700", dir.string(), st.st_mode & 0777));
  return {};
}

std::vector<PublishedPool> read_published_pools(const std::filesystem::path& directory, Duration timeout) {
  const auto dir = directory.empty() ? runtime_directory() : directory;
  std::vector<PublishedPool> out;
  if (!detail::private_directory(dir, false)) return out;  // none, or not one to trust
  std::vector<std::string> names;
  std::error_code ec;
  for (const auto& entry : std::filesystem::directory_iterator(dir, ec)) names.push_back(entry.path().filename());
  std::sort(names.begin(), names.end());
  for (const auto& name : names) {
    auto parsed = parse_socket_name(name);
    if (!parsed) continue;
    const auto path = dir / name;
    struct stat st {};
    if (::lstat(path.c_str(), &st) != 0 || !S_ISSOCK(st.st_mode)) continue;
    if (process_gone(parsed->first)) {  // killed before its pool could remove the socket
      ::unlink(path.c_str());
      continue;
    }
    PublishedPool p{parsed->first, std::move(parsed->second), {}, {}};
    const auto deadline = Clock::now() + std::chrono::duration_cast<Clock::duration>(timeout);
    auto fd = connect_to(path);
    auto report = fd ? read_report(fd->get(), deadline) : Result<std::string>(std::unexpected(fd.error()));
    if (report)
      p.report = std::move(*report);
    else
      p.error = report.error().message();
    out.push_back(std::move(p));
  }
  return out;
}

// --- the server ------------------------------------------------------------------------------------

Result<std::unique_ptr<detail::StatsServer>> detail::StatsServer::start(std::filesystem::path directory,
                                                                        const std::string& label,
                                                                        std::function<std::string()> report) {
  constexpr const char* call = "MemoryPool::create (stats_label)";
  if (auto ok = check_stats_label(label); !ok) return std::unexpected(ok.error().within(call));
  const auto dir = directory.empty() ? runtime_directory() : directory;
  if (auto ok = private_directory(dir, true); !ok) return std::unexpected(ok.error().within(call));
  // Sockets of processes that were killed before their pools ended.
  std::error_code ec;
  for (const auto& entry : std::filesystem::directory_iterator(dir, ec)) {
    auto parsed = parse_socket_name(entry.path().filename());
    if (parsed && process_gone(parsed->first)) ::unlink(entry.path().c_str());
  }
  std::unique_ptr<StatsServer> s(new StatsServer());
  s->path_ = dir / socket_name(::getpid(), label);
  s->report_ = std::move(report);
  LF_TRY(const sockaddr_un addr, address_of(s->path_));
  // A socket of this name and pid: another pool of this process publishing under the label (it
  // takes the connection, or its queue is full), or one left by an earlier process that had this
  // pid (refused: nobody listens), which goes.
  if (someone_listens(addr))
    return fail(Errc::InvalidArgument, call,
                str_format("another pool of this process publishes its statistics as \"{}\"", label));
  ::unlink(s->path_.c_str());
  s->listen_.reset(::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0));
  if (!s->listen_) return std::unexpected(from_errno(errno, "socket").within(call));
  if (::bind(s->listen_.get(), reinterpret_cast<const sockaddr*>(&addr), sizeof addr) != 0)
    return std::unexpected(from_errno(errno, "bind", s->path_.string()).within(call));
  if (::listen(s->listen_.get(), 16) != 0) {
    const int err = errno;
    ::unlink(s->path_.c_str());
    return std::unexpected(from_errno(err, "listen").within(call));
  }
  s->stop_.reset(::eventfd(0, EFD_CLOEXEC));
  if (!s->stop_) {
    const int err = errno;
    ::unlink(s->path_.c_str());
    return std::unexpected(from_errno(err, "eventfd").within(call));
  }
  s->thread_ = std::thread([p = s.get()] { p->serve(); });
  return s;
}

detail::StatsServer::~StatsServer() {
  if (thread_.joinable()) {
    const std::uint64_t one = 1;
    (void)!::write(stop_.get(), &one, sizeof one);
    thread_.join();
  }
  if (listen_) ::unlink(path_.c_str());
}

void detail::StatsServer::serve() {
  for (;;) {
    pollfd p[2] = {{stop_.get(), POLLIN, 0}, {listen_.get(), POLLIN, 0}};
    if (::poll(p, 2, -1) < 0) {
      if (errno == EINTR) continue;
      return;
    }
    if (p[0].revents) return;
    for (;;) {
      UniqueFd client(::accept4(listen_.get(), nullptr, nullptr, SOCK_CLOEXEC | SOCK_NONBLOCK));
      if (!client) break;  // EAGAIN: all taken; anything else: try again at the next wake-up
      answer(client.get());
    }
  }
}

void detail::StatsServer::answer(int client) {
  ucred who{};
  socklen_t len = sizeof who;
  if (::getsockopt(client, SOL_SOCKET, SO_PEERCRED, &who, &len) != 0 || who.uid != ::getuid()) return;
  const std::string r = report_();
  const auto deadline = Clock::now() + kAnswerBudget;
  std::size_t sent = 0;
  while (sent < r.size()) {
    const ssize_t n = ::send(client, r.data() + sent, r.size() - sent, MSG_NOSIGNAL);
    if (n > 0) {
      sent += static_cast<std::size_t>(n);
      continue;
    }
    if (n < 0 && errno == EINTR) continue;
    if (n < 0 && errno != EAGAIN) return;
    if (Clock::now() >= deadline) return;  // a client that does not read is dropped
    pollfd p{client, POLLOUT, 0};
    (void)::poll(&p, 1, std::max(1, millis_left(deadline)));
  }
}

}  // namespace lavaflow
