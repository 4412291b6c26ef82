// SPDX-License-Identifier: MIT
// lavaflow-bench local: one-way latency (round trip / 2) and throughput of local channels between
// two processes pinned to different cores, next to baselines measured in the same run.
#include "local.hpp"

#include <linux/futex.h>
#include <sched.h>
#include <spawn.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
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

// ----- baselines: a forked child echoes over shared memory / futex / Unix socket --------------

struct PingPongWords {
  alignas(64) std::atomic<std::uint32_t> ping;
  alignas(64) std::atomic<std::uint32_t> pong;
};

void futex_wait(std::atomic<std::uint32_t>& w, std::uint32_t v) {
  ::syscall(SYS_futex, reinterpret_cast<std::uint32_t*>(&w), FUTEX_WAIT, v, nullptr, nullptr, 0);
}
void futex_wake(std::atomic<std::uint32_t>& w) {
  ::syscall(SYS_futex, reinterpret_cast<std::uint32_t*>(&w), FUTEX_WAKE, 1, nullptr, nullptr, 0);
}

Row shared_word_pingpong(const Config& cfg, bool use_futex) {
  void* mem = ::mmap(nullptr, sizeof(PingPongWords), PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
  auto* w = new (mem) PingPongWords{};
  const int iters = cfg.iterations;
  const pid_t child = ::fork();
  if (child == 0) {
    pin(cfg.cpu_b);
    for (std::uint32_t i = 1; i <= static_cast<std::uint32_t>(iters + cfg.warmup); ++i) {
      while (w->ping.load(std::memory_order_acquire) != i)
        if (use_futex) futex_wait(w->ping, i - 1);
      w->pong.store(i, std::memory_order_release);
      if (use_futex) futex_wake(w->pong);
    }
    std::_Exit(0);
  }
  pin(cfg.cpu_a);
  std::vector<double> one_way;
  one_way.reserve(static_cast<std::size_t>(iters));
  for (std::uint32_t i = 1; i <= static_cast<std::uint32_t>(iters + cfg.warmup); ++i) {
    const auto t0 = now_ns();
    w->ping.store(i, std::memory_order_release);
    if (use_futex) futex_wake(w->ping);
    while (w->pong.load(std::memory_order_acquire) != i)
      if (use_futex) futex_wait(w->pong, i - 1);
    if (i > static_cast<std::uint32_t>(cfg.warmup)) one_way.push_back(double(now_ns() - t0) / 2);
  }
  ::waitpid(child, nullptr, 0);
  ::munmap(mem, sizeof(PingPongWords));
  return summarize(use_futex ? "futex-pingpong" : "floor-cacheline", use_futex ? "block" : "poll", 4, one_way, false);
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
                 const std::string& tag) {
  std::vector<std::string> args{self,
                                "_echo",
                                tag,
                                transport,
                                mode == WaitMode::BusyPoll ? "poll" : "block",
                                std::to_string(cfg.cpu_b),
                                std::to_string(cfg.max_size)};
  std::vector<char*> argv;
  for (auto& a : args) argv.push_back(a.data());
  argv.push_back(nullptr);
  pid_t pid = -1;
  ::posix_spawn(&pid, self.c_str(), nullptr, nullptr, argv.data(), environ);
  return pid;
}

Result<std::vector<Row>> channel_rows(const Config& cfg, const std::string& self, const std::string& transport,
                                      WaitMode mode) {
  const std::string tag =
      str_format("bench-{}-{}-{}", ::getpid(), transport, mode == WaitMode::BusyPoll ? "poll" : "block");
  // 32 buffers: deep enough that a pipelined stream seldom finds the ring full (then the producer
  // re-reads the consumers' released counts: a cache-line transfer).
  ProducerOptions po{
      .slots = 32, .slot_size = cfg.max_size, .wait = mode, .transport = parse_transport(transport).value()};
  LF_TRY(auto ping, Producer::create(tag + "-ping", po));
  const pid_t child = spawn_echo(cfg, self, transport, mode, tag);
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
      for (int i = 0; i < iters + cfg.warmup; ++i) {
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
  LF_TRY(Loan l, ping->loan(10s));
  LF_TRY_STATUS(ping->publish(std::move(l), {.size = 1, .user_tag = kStop}));
  int status = 0;
  ::waitpid(child, &status, 0);
  return rows;
}

}  // namespace

int echo_main(int argc, char** argv) {
  // _echo TAG TRANSPORT poll|block CPU MAX_SIZE
  if (argc < 7) return 2;
  const std::string tag = argv[2];
  const auto transport = parse_transport(argv[3]);
  if (!transport) return 2;
  const WaitMode mode = std::string(argv[4]) == "poll" ? WaitMode::BusyPoll : WaitMode::Block;
  pin(std::atoi(argv[5]));
  const std::uint64_t max_size = std::strtoull(argv[6], nullptr, 10);
  auto ping = Consumer::open(tag + "-ping", {.wait = mode, .connect_timeout = 30s});
  if (!ping) {
    std::fprintf(stderr, "echo: %s\n", ping.error().message().c_str());
    return 1;
  }
  auto pong =
      Producer::create(tag + "-pong", {.slots = 8, .slot_size = max_size, .wait = mode, .transport = *transport});
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
  // The floor three times, the median kept: on a shared VM one measurement can land on a better or
  // worse moment than the channel rows it is compared with.
  std::vector<Row> floors{shared_word_pingpong(cfg, false), shared_word_pingpong(cfg, false),
                          shared_word_pingpong(cfg, false)};
  std::sort(floors.begin(), floors.end(), [](const Row& a, const Row& b) { return a.p50_ns < b.p50_ns; });
  rows.push_back(floors[1]);
  rows.push_back(shared_word_pingpong(cfg, true));
  rows.push_back(uds_pingpong(cfg, 64));
  std::vector<std::string> transports{"shm"};
  if (VulkanContext::create()) transports.push_back("vulkan");
  for (const auto& t : transports)
    for (auto mode : {WaitMode::BusyPoll, WaitMode::Block}) {
      LF_TRY(auto more, channel_rows(cfg, self, t, mode));
      rows.insert(rows.end(), more.begin(), more.end());
    }
  return rows;
}

}  // namespace lfbench
