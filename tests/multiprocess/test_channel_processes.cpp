// SPDX-License-Identifier: MIT
// Channels between real processes: streams of 1,000,000 checksummed messages (lavaflow-demo
// produce/consume), fan-out, kill -9 of either side, restart on the same name, another uid.
#include <signal.h>

#include <thread>

#include "payload.hpp"
#include "support.hpp"

using namespace lavaflow;
using namespace std::chrono_literals;
using Clock = std::chrono::steady_clock;

namespace {

using lftest::run;

struct Peer {
  UniqueFd sock;
  pid_t pid;
};

Peer peer(const std::string& mode, const std::string& name, const std::filesystem::path& dir, const std::string& arg) {
  auto [mine, theirs] = lftest::ok(socket_pair());
  pid_t pid = lftest::spawn(LAVAFLOW_TEST_PEER, {mode, name, dir.string(), arg}, theirs.get());
  return {std::move(mine), pid};
}

std::string text(const SocketMessage& m) {
  return std::string(reinterpret_cast<const char*>(m.payload.data()), m.payload.size());
}

void stream(const std::string& transport, int consumers, std::uint64_t count, std::uint64_t size) {
  if (transport == "vulkan" && !VulkanContext::create()) lftest::skip("no Vulkan device for the vulkan transport");
  auto dir = lftest::channel_dir();
  const std::string name = "stream";
  std::vector<pid_t> cs;
  // Consumers first: start order does not matter.
  for (int i = 0; i < consumers; ++i)
    cs.push_back(
        run({LAVAFLOW_DEMO, "consume", "--channel", name, "--count", std::to_string(count), "--dir", dir.string()}));
  pid_t p = run({LAVAFLOW_DEMO, "produce", "--channel", name, "--count", std::to_string(count), "--size",
                 std::to_string(size), "--transport", transport, "--consumers", std::to_string(consumers), "--slots",
                 "32", "--dir", dir.string()});
  CHECK(lftest::wait_exit(p) == 0);
  for (pid_t c : cs) CHECK(lftest::wait_exit(c) == 0);  // each verified sequence + checksum of every message
}

}  // namespace

TEST_CASE("1,000,000 messages through shm: none lost, duplicated, reordered or corrupt") {
  stream("shm", 1, 1'000'000, 64);
}
TEST_CASE("1,000,000 messages through Vulkan IPC: none lost, duplicated, reordered or corrupt") {
  stream("vulkan", 1, 1'000'000, 64);
}
TEST_CASE("1,000,000 messages fanned out to 3 consumer processes through shm") { stream("shm", 3, 1'000'000, 64); }
TEST_CASE("1,000,000 messages fanned out to 3 consumer processes through Vulkan IPC") {
  stream("vulkan", 3, 1'000'000, 64);
}
TEST_CASE("large messages (4 MiB) through both transports") {
  stream("shm", 1, 300, 4 << 20);
  stream("vulkan", 1, 300, 4 << 20);
}

TEST_CASE("producer killed with SIGKILL: published messages arrive first, then peer-lost within 100 ms") {
  auto dir = lftest::channel_dir();
  auto prod = peer("chan-produce", "victim", dir, "5");
  auto c = lftest::ok(Consumer::open("victim", {.connect_timeout = 10s, .directory = dir}));
  CHECK(text(lftest::ok(recv_message(prod.sock.get(), 30s))) == "published");
  for (std::uint64_t i = 0; i < 3; ++i) CHECK(lftest::ok(c->receive(1s)).info().sequence == i);
  REQUIRE(::kill(prod.pid, SIGKILL) == 0);
  CHECK(lftest::wait_exit(prod.pid) == 128 + SIGKILL);
  // Published before the death: still delivered, intact.
  for (std::uint64_t i = 3; i < 5; ++i) {
    auto r = lftest::ok(c->receive(1s));
    CHECK(r.info().sequence == i);
    CHECK(lfapp::checksum(r.bytes()) == r.info().user_tag);
  }
  auto e = lftest::err(c->receive(10s));
  CHECK(e.code() == Errc::PeerLost);
  CHECK(e.cause().find("hung up") != std::string::npos);
}

TEST_CASE("a consumer blocked in receive() learns of the producer's death within 100 ms") {
  auto dir = lftest::channel_dir();
  auto prod = peer("chan-produce", "blocked", dir, "0");
  auto c = lftest::ok(Consumer::open("blocked", {.wait = WaitMode::Block, .connect_timeout = 10s, .directory = dir}));
  CHECK(text(lftest::ok(recv_message(prod.sock.get(), 30s))) == "published");
  Clock::time_point returned;
  Result<Received> got = fail(Errc::Internal, "t", "not run");
  std::thread t([&] {
    got = c->receive(30s);
    returned = Clock::now();
  });
  std::this_thread::sleep_for(200ms);  // it is asleep in the futex now
  const auto killed = Clock::now();
  REQUIRE(::kill(prod.pid, SIGKILL) == 0);
  t.join();
  lftest::wait_exit(prod.pid);
  REQUIRE_FALSE(got);
  CHECK(got.error().code() == Errc::PeerLost);
  const auto ms = std::chrono::duration<double, std::milli>(returned - killed).count();
  INFO("peer-lost after " << ms << " ms");
  CHECK(ms < 100);
}

TEST_CASE("consumer killed with SIGKILL while holding a slot: its slots come back to the producer") {
  auto dir = lftest::channel_dir();
  auto p = lftest::ok(
      Producer::create("held", {.slots = 4, .slot_size = 4096, .transport = TransportKind::Shm, .directory = dir}));
  auto cons = peer("chan-hold", "held", dir, "-");
  lftest::ok(p->wait_for_consumers(1, 10s));
  for (int i = 0; i < 4; ++i) {
    auto loan = lftest::ok(p->loan(5s));
    lftest::ok(p->publish(std::move(loan), {.size = 8}));
  }
  CHECK(text(lftest::ok(recv_message(cons.sock.get(), 30s))) == "holding");
  CHECK(lftest::err(p->loan(50ms)).code() == Errc::Timeout);  // the ring is full for it
  REQUIRE(::kill(cons.pid, SIGKILL) == 0);
  lftest::wait_exit(cons.pid);
  const auto t0 = Clock::now();
  auto loan = p->loan(5s);  // blocked producer is released by the hang-up, not a timeout
  CHECK(loan.has_value());
  CHECK(Clock::now() - t0 < 1s);
  CHECK(p->consumer_count() == 0);
}

TEST_CASE("a new producer takes over the name of a killed one and consumers reconnect") {
  auto dir = lftest::channel_dir();
  auto prod = peer("chan-produce", "phoenix", dir, "1");
  auto c = lftest::ok(Consumer::open("phoenix", {.connect_timeout = 10s, .directory = dir}));
  CHECK(text(lftest::ok(recv_message(prod.sock.get(), 30s))) == "published");
  // While it lives, the name is taken.
  CHECK(lftest::err(Producer::create("phoenix", {.directory = dir})).code() == Errc::PermissionDenied);
  ::kill(prod.pid, SIGKILL);
  lftest::wait_exit(prod.pid);
  CHECK(std::filesystem::exists(dir / "phoenix.sock"));  // stale file left by the crash
  auto p2 = lftest::ok(
      Producer::create("phoenix", {.slots = 4, .slot_size = 64, .transport = TransportKind::Shm, .directory = dir}));
  CHECK(lftest::ok(c->receive(1s)).info().sequence == 0);  // the old stream's last message
  CHECK(lftest::err(c->receive(1s)).code() == Errc::PeerLost);
  auto c2 = lftest::ok(Consumer::open("phoenix", {.connect_timeout = 5s, .directory = dir}));
  lftest::ok(p2->wait_for_consumers(1, 5s));
  auto loan = lftest::ok(p2->loan(1s));
  lftest::ok(p2->publish(std::move(loan), {.size = 1, .user_tag = 77}));
  CHECK(lftest::ok(c2->receive(1s)).info().user_tag == 77);
}

TEST_CASE("a process of another uid is refused with a clear error") {
  if (::getuid() != 0) lftest::skip("needs root to run a client as nobody (uid 65534)");
  auto dir = lftest::channel_dir();
  auto p = lftest::ok(Producer::create("mine", {.transport = TransportKind::Shm, .directory = dir}));
  auto other = peer("chan-open-as-uid", "mine", dir, "65534");
  const auto answer = text(lftest::ok(recv_message(other.sock.get(), 30s)));
  CHECK(lftest::wait_exit(other.pid) == 0);
  INFO(answer);
  CHECK(answer.find("permission denied") != std::string::npos);
  CHECK(answer.find("uid 0") != std::string::npos);
  CHECK(p->consumer_count() == 0);
}
