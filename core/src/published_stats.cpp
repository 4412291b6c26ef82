// SPDX-License-Identifier: MIT
#include "lavaflow/core/published_stats.hpp"

#include <fcntl.h>
#include <poll.h>
#include <sys/eventfd.h>
#include <sys/file.h>
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
#include <set>

#include "lavaflow/core/detail/format.hpp"
#include "lavaflow/core/detail/private_dir.hpp"
#include "lavaflow/core/unix_socket.hpp"
#include "stats_server.hpp"

namespace lavaflow {

namespace {

using Clock = std::chrono::steady_clock;

/// How long the server spends on one client before dropping it.
constexpr auto kAnswerBudget = std::chrono::milliseconds(200);

/// The files of a publication: pool-<pid>-<label>.sock, and .lock, which its server holds locked
/// (flock) while it lives: the kernel lets go of the lock when the process dies, in whatever pid
/// namespace, so a lock nobody holds marks a publication whose process is gone.
std::string base_name(std::int32_t pid, const std::string& label) { return str_format("pool-{}-{}", pid, label); }

/// The pid and label of a file named pool-<pid>-<label><suffix>; nothing for any other name.
std::optional<std::pair<std::int32_t, std::string>> parse_name(const std::string& name, std::string_view suffix) {
  constexpr std::string_view prefix = "pool-";
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

void unlink_socket(const std::filesystem::path& path) {
  struct stat st {};
  if (::lstat(path.c_str(), &st) == 0 && S_ISSOCK(st.st_mode)) ::unlink(path.c_str());
}

/// Removes the publication `base` in `dir` when its server is gone (its lock free or missing);
/// true when it did.
bool reclaim_if_stale(const std::filesystem::path& dir, const std::string& base) {
  const auto lock_path = dir / (base + ".lock");
  auto lock = detail::lock_file(lock_path, false);
  if (lock && !*lock) return false;  // held: its server lives
  if (!lock && lock.error().code() != Errc::NotFound) return false;
  unlink_socket(dir / (base + ".sock"));
  if (lock) ::unlink(lock_path.c_str());  // we hold it, and the path names it
  return true;
}

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

Result<UniqueFd> detail::lock_file(const std::filesystem::path& path, bool create) {
  for (int attempt = 0; attempt < 16; ++attempt) {
    UniqueFd fd(::open(path.c_str(), O_RDWR | O_CLOEXEC | O_NOFOLLOW | (create ? O_CREAT : 0), 0600));
    if (!fd) return std::unexpected(from_errno(errno, "open", path.string()));
    if (::flock(fd.get(), LOCK_EX | LOCK_NB) != 0) {
      if (errno == EWOULDBLOCK) return UniqueFd();
      return std::unexpected(from_errno(errno, "flock", path.string()));
    }
    struct stat held {
    }, named{};
    if (::fstat(fd.get(), &held) != 0) return std::unexpected(from_errno(errno, "fstat", path.string()));
    if (::lstat(path.c_str(), &named) == 0 && named.st_dev == held.st_dev && named.st_ino == held.st_ino) return fd;
    if (!create) return UniqueFd();  // gone or replaced: nothing stale left to reclaim here
  }
  return fail(Errc::System, "lock_file", str_format("{} keeps being replaced under us", path.string()));
}

Result<std::vector<PublishedPool>> read_published_pools(const std::filesystem::path& directory, Duration timeout) {
  constexpr const char* call = "read_published_pools";
  const auto dir = directory.empty() ? runtime_directory() : directory;
  std::vector<PublishedPool> out;
  if (auto ok = detail::private_directory(dir, false); !ok) {
    if (ok.error().code() == Errc::NotFound) return out;  // nobody has published here yet
    return std::unexpected(ok.error().within(call));
  }
  std::vector<std::string> names;
  std::error_code ec;
  for (const auto& entry : std::filesystem::directory_iterator(dir, ec)) names.push_back(entry.path().filename());
  std::sort(names.begin(), names.end());
  const auto deadline = Clock::now() + std::chrono::duration_cast<Clock::duration>(timeout);
  for (const auto& name : names) {
    auto parsed = parse_name(name, ".sock");
    if (!parsed) continue;
    const auto path = dir / name;
    struct stat st {};
    if (::lstat(path.c_str(), &st) != 0 || !S_ISSOCK(st.st_mode)) continue;
    if (reclaim_if_stale(dir, base_name(parsed->first, parsed->second))) continue;  // its process is gone
    if (out.size() == kMaxPublishedPools) break;
    PublishedPool p{parsed->first, std::move(parsed->second), {}, {}};
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
  // Publications whose processes ended without removing them (killed).
  std::set<std::string> bases;  // each publication once, whichever of its files is left
  std::error_code ec;
  for (const auto& entry : std::filesystem::directory_iterator(dir, ec)) {
    const std::string name = entry.path().filename();
    auto parsed = parse_name(name, ".lock");
    if (!parsed) parsed = parse_name(name, ".sock");
    if (parsed) bases.insert(base_name(parsed->first, parsed->second));
  }
  for (const auto& base : bases) (void)reclaim_if_stale(dir, base);
  std::unique_ptr<StatsServer> s(new StatsServer());
  s->owner_ = ::getpid();
  const std::string base = base_name(s->owner_, label);
  s->path_ = dir / (base + ".sock");
  auto addr = address_of(s->path_);
  if (!addr) return std::unexpected(addr.error().within(call));
  s->lock_path_ = dir / (base + ".lock");
  auto lock = detail::lock_file(s->lock_path_, true);
  if (!lock) return std::unexpected(lock.error().within(call));
  s->lock_ = std::move(*lock);
  if (!s->lock_)
    return fail(Errc::InvalidArgument, call,
                str_format("another pool publishes its statistics as \"{}\" under pid {} ({})", label, s->owner_,
                           s->path_.string()));
  // The name is ours (we hold its lock): a socket file there is a dead publication's.
  unlink_socket(s->path_);
  s->listen_.reset(::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0));
  if (!s->listen_) return std::unexpected(from_errno(errno, "socket").within(call));
  if (::bind(s->listen_.get(), reinterpret_cast<const sockaddr*>(&*addr), sizeof *addr) != 0)
    return std::unexpected(from_errno(errno, "bind", s->path_.string()).within(call));
  s->bound_ = true;
  if (::listen(s->listen_.get(), 16) != 0) return std::unexpected(from_errno(errno, "listen").within(call));
  s->stop_.reset(::eventfd(0, EFD_CLOEXEC));
  if (!s->stop_) return std::unexpected(from_errno(errno, "eventfd").within(call));
  s->report_ = std::move(report);
  s->thread_ = std::thread([p = s.get()] { p->serve(); });
  return s;
}

detail::StatsServer::~StatsServer() {
  if (::getpid() != owner_) {
    // A forked child's copy: the thread, the socket and the lock are the parent's.
    if (thread_.joinable()) thread_.detach();
    return;
  }
  if (thread_.joinable()) {
    const std::uint64_t one = 1;
    (void)!::write(stop_.get(), &one, sizeof one);
    thread_.join();
  }
  if (bound_) ::unlink(path_.c_str());
  if (lock_) ::unlink(lock_path_.c_str());  // while still holding it
}

bool detail::StatsServer::stopping() const {
  pollfd p{stop_.get(), POLLIN, 0};
  return ::poll(&p, 1, 0) == 1;
}

void detail::StatsServer::serve() {
  for (;;) {
    pollfd p[2] = {{stop_.get(), POLLIN, 0}, {listen_.get(), POLLIN, 0}};
    if (::poll(p, 2, -1) < 0) {
      if (errno == EINTR) continue;
      return;
    }
    if (p[0].revents) return;
    // A few clients per wake-up, and a look at `stop_` before each: a process that connects
    // without end cannot keep the pool's destructor waiting.
    for (int k = 0; k < kClientsPerWake && !stopping(); ++k) {
      UniqueFd client(::accept4(listen_.get(), nullptr, nullptr, SOCK_CLOEXEC | SOCK_NONBLOCK));
      if (!client) break;  // EAGAIN: all taken; anything else: try again at the next wake-up
      answer(client.get());
    }
  }
}

void detail::StatsServer::answer(int client) {
  if (auto who = peer_credentials(client); !who || who->uid != ::getuid()) return;
  // Reports are made at most every kReportEvery: each one takes the pool's lock, and clients
  // that come in numbers must not slow the pool's own work.
  const auto now = Clock::now();
  if (report_at_ == Clock::time_point{} || now - report_at_ >= kReportEvery) {
    report_cache_ = report_();
    report_at_ = now;
  }
  const std::string& r = report_cache_;
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
