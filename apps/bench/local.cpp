// SPDX-License-Identifier: MIT
// lavaflow-bench local: one-way latency (round trip / 2) and throughput of local channels between
// two processes pinned to different cores, next to baselines measured in the same run. The two
// baselines that targets compare with are measured by the shm channel's own two processes, in
// batches between the batches of the rows they judge — the cache-line floor between the busy-poll
// 64 B and 4 KiB round trips, the futex ping-pong between the blocking 64 B ones — so that both
// sides see the same moments of the machine (on a VM, which physical cores the two CPUs are moves
// between runs; a futex wake-up's cost moves with what else the host runs).
#include "local.hpp"

#include <linux/futex.h>
#include <sched.h>
#include <spawn.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "lavaflow/core/detail/format.hpp"
#include "lavaflow/lavaflow.hpp"
#include "lavaflow/transports/local.hpp"

namespace lfbench {

using namespace lavaflow;
using namespace std::chrono_literals;

namespace {

constexpr std::uint64_t kStop = ~0ull;
constexpr std::uint64_t kTouch = 1ull << 62;
constexpr std::uint64_t kStream = 1ull << 61;  // throughput run: echo only the last message
constexpr std::uint64_t kFloor = 1ull << 60;   // then this many rounds of the baseline (floor or futex)
constexpr std::uint64_t kSizeMask = (1ull << 40) - 1;

void pin(int cpu) {
  cpu_set_t set;
  CPU_ZERO(&set);
  CPU_SET(cpu, &set);
  (void)::sched_setaffinity(0, sizeof set, &set);
}

std::uint64_t touch(std::span<const std::byte> b) {
  std::uint64_t sum = 0;
  const std::size_t words = b.size() / 8;
  for (std::size_t i = 0; i < words; ++i) {
    std::uint64_t w;
    std::memcpy(&w, b.data() + i * 8, 8);
    sum += w;
  }
  return sum;
}

Row summarize(std::string name, std::string mode, std::uint64_t size, std::vector<double>& one_way, bool touched) {
  std::sort(one_way.begin(), one_way.end());
  Row r;
  r.name = std::move(name);
  r.mode = std::move(mode);
  r.size = size;
  r.touched = touched;
  r.samples = one_way.size();
  auto at = [&](double q) { return one_way[static_cast<std::size_t>(q * double(one_way.size() - 1))]; };
  r.p50_ns = one_way[one_way.size() / 2];
  r.p25_ns = at(0.25);
  r.p75_ns = at(0.75);
  r.p99_ns = at(0.99);
  r.max_ns = one_way.back();
  double sum = 0;
  for (double v : one_way) sum += v;
  r.avg_ns = sum / double(one_way.size());
  return r;
}

// ----- baselines: the cache-line floor and the futex ping-pong (in the shm channel's processes),
// and a Unix-socket ping-pong with a forked child ------------------------------------------------

void futex_wake(std::atomic<std::uint32_t>& w) {
  ::syscall(SYS_futex, reinterpret_cast<std::uint32_t*>(&w), FUTEX_WAKE, 1, nullptr, nullptr, 0);
}

/// The floor's lines. One cache line's transfer between two cores costs more or less according to
/// where the line's address is homed (the L3 slice or directory that tracks it): single lines at
/// different addresses differ steadily from one another, so a floor on one line is as much a draw
/// of its address as a measure. A channel's ring spreads its messages over as many lines as it has
/// slots, so the floor goes round that many lines too.
constexpr std::uint32_t kFloorLines = 32;
struct FloorLines {
  struct alignas(64) Line {
    std::atomic<std::uint32_t> v;
  };
  Line ping[kFloorLines];
  Line pong[kFloorLines];
  Line futex_ping, futex_pong;  // the futex ping-pong's words, beside the blocking rows
};

/// Maps the floor's lines from `fd`, which must hold them.
Result<UniqueMapping> map_floor(int fd) {
  struct stat st {};
  if (::fstat(fd, &st) != 0 || st.st_size < static_cast<off_t>(sizeof(FloorLines)))
    return fail(Errc::InvalidArgument, "lavaflow-bench _echo", str_format("fd {} does not hold the floor's lines", fd));
  void* mem = ::mmap(nullptr, sizeof(FloorLines), PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  if (mem == MAP_FAILED) return fail(Errc::System, "mmap", std::strerror(errno));
  return UniqueMapping(std::span(static_cast<std::byte*>(mem), sizeof(FloorLines)));
}

FloorLines& lines_of(const UniqueMapping& m) { return *reinterpret_cast<FloorLines*>(m.get().data()); }

/// The floor's lines in a memfd that the echo process inherits (its number on the echo's command
/// line), so that a channel's two processes also measure the floor.
struct Floor {
  UniqueFd fd;
  UniqueMapping mapping;

  static Result<Floor> create() {
    UniqueFd fd(::memfd_create("lavaflow-bench-floor", 0));  // no CLOEXEC: the echo inherits it
    if (!fd) return fail(Errc::System, "memfd_create", std::strerror(errno));
    if (::ftruncate(fd.get(), sizeof(FloorLines)) != 0) return fail(Errc::System, "ftruncate", std::strerror(errno));
    LF_TRY(UniqueMapping m, map_floor(fd.get()));
    new (m.get().data()) FloorLines{};
    return Floor{std::move(fd), std::move(m)};
  }
};

/// Spins until `word` holds `value`; false once the peer has stayed away for seconds (it died).
bool spin_until(const std::atomic<std::uint32_t>& word, std::uint32_t value) {
  constexpr std::uint64_t kGiveUpNs = 10'000'000'000;
  std::uint64_t since = 0;
  for (std::uint64_t n = 1; word.load(std::memory_order_acquire) != value; ++n) {
    if (n % (1u << 20) != 0) continue;  // the clock only now and then: it would slow the hand-off
    const std::uint64_t t = now_ns();
    if (since == 0)
      since = t;
    else if (t - since > kGiveUpNs)
      return false;
  }
  return true;
}

/// Waits until `word` holds `value`, sleeping on it; false once the peer has stayed away for
/// seconds (it died). The sleeps are timed, as the channel's own futex sleeps are (they look
/// again now and then), so that the baseline and the blocking rows sleep alike.
bool futex_until(std::atomic<std::uint32_t>& word, std::uint32_t value) {
  constexpr std::uint64_t kGiveUpNs = 10'000'000'000;
  std::uint64_t since = 0;
  while (word.load(std::memory_order_acquire) != value) {
    timespec nap{0, 100'000'000};  // a peer that died wakes nobody: look again now and then
    ::syscall(SYS_futex, reinterpret_cast<std::uint32_t*>(&word), FUTEX_WAIT, value - 1, &nap, nullptr, 0);
    if (word.load(std::memory_order_acquire) == value) break;
    const std::uint64_t t = now_ns();  // only when woken without the value: not on the measured path
    if (since == 0)
      since = t;
    else if (t - since > kGiveUpNs)
      return false;
  }
  return true;
}

/// The echo's half of `rounds` futex rounds after round `done`; false when the bench went away.
bool futex_echo(FloorLines& w, std::uint32_t done, std::uint32_t rounds) {
  for (std::uint32_t i = done + 1; i <= done + rounds; ++i) {
    if (!futex_until(w.futex_ping.v, i)) return false;
    w.futex_pong.v.store(i, std::memory_order_release);
    futex_wake(w.futex_pong.v);
  }
  return true;
}

/// The echo's half of `rounds` floor rounds after round `done`; false when the bench went away.
bool floor_echo(FloorLines& w, std::uint32_t done, std::uint32_t rounds) {
  for (std::uint32_t i = done + 1; i <= done + rounds; ++i) {
    if (!spin_until(w.ping[i % kFloorLines].v, i)) return false;
    w.pong[i % kFloorLines].v.store(i, std::memory_order_release);
  }
  return true;
}

Row uds_pingpong(const Config& cfg, std::uint64_t size) {
  int sv[2];
  ::socketpair(AF_UNIX, SOCK_SEQPACKET, 0, sv);
  ::setsockopt(sv[0], SOL_SOCKET, SO_SNDBUF, &size, sizeof(int));
  std::vector<char> buf(size);
  const pid_t child = ::fork();
  if (child == 0) {
    pin(cfg.cpu_b);
    ::close(sv[0]);
    for (int i = 0; i < cfg.iterations + cfg.warmup; ++i) {
      if (::recv(sv[1], buf.data(), size, MSG_WAITALL) <= 0) break;
      (void)!::send(sv[1], buf.data(), size, 0);
    }
    std::_Exit(0);
  }
  ::close(sv[1]);
  pin(cfg.cpu_a);
  std::vector<double> one_way;
  for (int i = 0; i < cfg.iterations + cfg.warmup; ++i) {
    const auto t0 = now_ns();
    (void)!::send(sv[0], buf.data(), size, 0);
    (void)!::recv(sv[0], buf.data(), size, MSG_WAITALL);
    if (i >= cfg.warmup) one_way.push_back(double(now_ns() - t0) / 2);
  }
  ::close(sv[0]);
  ::waitpid(child, nullptr, 0);
  return summarize("uds-pingpong", "block", size, one_way, true);
}

// ----- lava-flow: two channels, "ping" (A→B) and "pong" (B→A) ---------------------------------

pid_t spawn_echo(const Config& cfg, const std::string& self, const std::string& transport, WaitMode mode,
                 const std::string& tag, int floor_fd) {
  std::vector<std::string> args{self,
                                "_echo",
                                tag,
                                transport,
                                mode == WaitMode::BusyPoll ? "poll" : "block",
                                std::to_string(cfg.cpu_b),
                                std::to_string(cfg.max_size),
                                std::to_string(floor_fd)};
  std::vector<char*> argv;
  for (auto& a : args) argv.push_back(a.data());
  argv.push_back(nullptr);
  pid_t pid = -1;
  ::posix_spawn(&pid, self.c_str(), nullptr, nullptr, argv.data(), environ);
  return pid;
}

/// Round trips between two batches of the baseline, and the rounds of each batch (its first
/// rounds, which wake the echo from its receive, are not kept).
constexpr int kFloorEvery = 500, kFloorRounds = 500, kFloorWarmup = 20;

/// The rows of one transport and wait mode. With `floor` (shm), batches of the baseline go between
/// the round trips its targets judge, their one-way times appended to `baseline_ns`: busy-poll,
/// the cache-line floor between the 64 B and 4 KiB round trips; blocking, the futex ping-pong
/// between the 64 B ones.
Result<std::vector<Row>> channel_rows(const Config& cfg, const std::string& self, const std::string& transport,
                                      WaitMode mode, Floor* floor, std::vector<double>& baseline_ns) {
  const std::string tag =
      str_format("bench-{}-{}-{}", ::getpid(), transport, mode == WaitMode::BusyPoll ? "poll" : "block");
  // 32 buffers: deep enough that a pipelined stream seldom finds the ring full (then the producer
  // re-reads the consumers' released counts: a cache-line transfer).
  ProducerOptions po{
      .slots = 32, .slot_size = cfg.max_size, .wait = mode, .transport = parse_transport(transport).value()};
  LF_TRY(auto ping, Producer::create(tag + "-ping", po));
  const pid_t child = spawn_echo(cfg, self, transport, mode, tag, floor ? floor->fd.get() : -1);
  LF_TRY(auto pong, Consumer::open(tag + "-pong", {.wait = mode, .connect_timeout = 30s}));
  LF_TRY_STATUS(ping->wait_for_consumers(1, 30s));
  pin(cfg.cpu_a);
  const std::string name = "lavaflow-" + transport;
  const std::string mode_name = mode == WaitMode::BusyPoll ? "poll" : "block";
  std::vector<Row> rows;
  auto roundtrip = [&](std::uint64_t size, bool touched) -> Result<double> {
    const auto t0 = now_ns();
    LF_TRY(Loan l, ping->loan(10s));
    LF_TRY_STATUS(ping->publish(std::move(l), {.size = size, .user_tag = size | (touched ? kTouch : 0)}));
    LF_TRY(Received r, pong->receive(10s));
    if (touched) (void)touch(r.bytes());
    return double(now_ns() - t0) / 2;
  };
  const bool futex = mode != WaitMode::BusyPoll;
  std::uint32_t baseline_done = 0;
  auto baseline_batch = [&]() -> Status {
    LF_TRY(Loan l, ping->loan(10s));
    LF_TRY_STATUS(ping->publish(std::move(l), {.size = 1, .user_tag = kFloor | kFloorRounds}));
    FloorLines& w = lines_of(floor->mapping);
    for (int k = 0; k < kFloorRounds; ++k) {
      const std::uint32_t i = ++baseline_done;
      const auto t0 = now_ns();
      bool answered = false;
      if (futex) {
        w.futex_ping.v.store(i, std::memory_order_release);
        futex_wake(w.futex_ping.v);
        answered = futex_until(w.futex_pong.v, i);
      } else {
        w.ping[i % kFloorLines].v.store(i, std::memory_order_release);
        answered = spin_until(w.pong[i % kFloorLines].v, i);
      }
      if (!answered) return fail(Errc::PeerLost, "lavaflow-bench local", "the echo left the baseline's rounds");
      if (k >= kFloorWarmup) baseline_ns.push_back(double(now_ns() - t0) / 2);
    }
    return {};
  };
  bool mappable = true;  // device-local GPU rings have no host mapping: no touched variant there
  {
    LF_TRY(Loan probe, ping->loan(10s));
    mappable = !probe.bytes().empty();
  }
  for (std::uint64_t size : cfg.sizes) {
    for (bool touched : {false, true}) {
      if (touched && !mappable) continue;
      const int iters = std::max(50, static_cast<int>(cfg.iterations / std::max<std::uint64_t>(1, size / 65536)));
      std::vector<double> one_way;
      const bool with_baseline = floor && !touched && (size == 64 || (size == 4096 && !futex));
      for (int i = 0; i < iters + cfg.warmup; ++i) {
        if (with_baseline && i >= cfg.warmup && (i - cfg.warmup) % kFloorEvery == 0) LF_TRY_STATUS(baseline_batch());
        LF_TRY(double t, roundtrip(size, touched));
        if (i >= cfg.warmup) one_way.push_back(t);
      }
      auto row = summarize(name, mode_name, size, one_way, touched);
      // Pipelined throughput: stream messages, the echo answers only the last one.
      if (!touched) {
        const std::uint64_t n =
            std::max<std::uint64_t>(200, std::min<std::uint64_t>(cfg.stream_messages, (std::uint64_t{4} << 30) / size));
        const auto t0 = now_ns();
        for (std::uint64_t i = 0; i < n; ++i) {
          LF_TRY(Loan l, ping->loan(10s));
          LF_TRY_STATUS(
              ping->publish(std::move(l), {.size = size, .user_tag = size | kStream | (i + 1 == n ? kTouch : 0)}));
        }
        LF_TRY(Received done, pong->receive(30s));
        row.msgs_per_s = double(n) / (double(now_ns() - t0) / 1e9);
      }
      rows.push_back(row);
    }
  }
  if (floor && baseline_ns.empty()) LF_TRY_STATUS(baseline_batch());  // no row it judges was asked for
  LF_TRY(Loan l, ping->loan(10s));
  LF_TRY_STATUS(ping->publish(std::move(l), {.size = 1, .user_tag = kStop}));
  int status = 0;
  ::waitpid(child, &status, 0);
  return rows;
}

}  // namespace

int echo_main(int argc, char** argv) {
  // _echo TAG TRANSPORT poll|block CPU MAX_SIZE FLOOR_FD (-1: none)
  if (argc < 8) return 2;
  const std::string tag = argv[2];
  const auto transport = parse_transport(argv[3]);
  if (!transport) return 2;
  const WaitMode mode = std::string(argv[4]) == "poll" ? WaitMode::BusyPoll : WaitMode::Block;
  pin(std::atoi(argv[5]));
  const std::uint64_t max_size = std::strtoull(argv[6], nullptr, 10);
  UniqueMapping floor;
  if (const int fd = std::atoi(argv[7]); fd >= 0) {
    auto m = map_floor(fd);
    if (!m) {
      std::fprintf(stderr, "echo: %s\n", m.error().message().c_str());
      return 1;
    }
    floor = std::move(*m);
  }
  std::uint32_t floor_done = 0;
  auto ping = Consumer::open(tag + "-ping", {.wait = mode, .connect_timeout = 30s});
  if (!ping) {
    std::fprintf(stderr, "echo: %s\n", ping.error().message().c_str());
    return 1;
  }
  // As many buffers as the request ring: the replies go round as many cache lines as the floor's.
  auto pong =
      Producer::create(tag + "-pong", {.slots = 32, .slot_size = max_size, .wait = mode, .transport = *transport});
  if (!pong) {
    std::fprintf(stderr, "echo: %s\n", pong.error().message().c_str());
    return 1;
  }
  if (!(*pong)->wait_for_consumers(1, 30s)) return 1;
  volatile std::uint64_t sink = 0;
  for (;;) {
    auto r = (*ping)->receive(60s);
    if (!r) return 1;
    const std::uint64_t tag_v = r->info().user_tag;
    if (tag_v == kStop) return 0;
    if ((tag_v & kFloor) && floor) {
      const auto rounds = static_cast<std::uint32_t>(tag_v & kSizeMask);
      r->release();  // before the baseline's rounds
      const bool answered = mode == WaitMode::BusyPoll ? floor_echo(lines_of(floor), floor_done, rounds)
                                                       : futex_echo(lines_of(floor), floor_done, rounds);
      if (!answered) return 1;
      floor_done += rounds;
      continue;
    }
    if (tag_v & kTouch) sink = sink + touch(r->bytes());
    const bool stream = tag_v & kStream;
    const bool last = !stream || (tag_v & kTouch);
    const std::uint64_t size = tag_v & kSizeMask;
    if (!last) continue;  // the request is released as `r` goes out of scope
    // Reply first, then release the request (its release is not on the round trip).
    auto l = (*pong)->loan(10s);
    if (!l) return 1;
    if (!(*pong)->publish(std::move(*l), {.size = stream ? 1 : size})) return 1;
  }
}

Result<std::vector<Row>> run_local(const Config& cfg, const std::string& self) {
  std::vector<Row> rows;
  // Baselines first, before this process has any Vulkan state (they fork).
  rows.push_back(uds_pingpong(cfg, 64));
  LF_TRY(Floor floor, Floor::create());
  std::vector<std::string> transports{"shm"};
  if (VulkanContext::create()) transports.push_back("vulkan");
  for (const auto& t : transports)
    for (auto mode : {WaitMode::BusyPoll, WaitMode::Block}) {
      // The shm rows' two processes measure the baselines (see channel_rows): the cache-line floor,
      // first of the rows, and the futex ping-pong after it.
      const bool baseline = t == "shm";
      const bool poll = mode == WaitMode::BusyPoll;
      std::vector<double> baseline_ns;
      LF_TRY(auto more, channel_rows(cfg, self, t, mode, baseline ? &floor : nullptr, baseline_ns));
      rows.insert(rows.end(), more.begin(), more.end());
      if (baseline)
        rows.insert(rows.begin() + (poll ? 0 : 1), summarize(poll ? "floor-cacheline" : "futex-pingpong",
                                                             poll ? "poll" : "block", 4, baseline_ns, false));
    }
  return rows;
}

}  // namespace lfbench
