// SPDX-License-Identifier: MIT
// Channel behaviour with producer and consumer in one process (the socket, shared memory and
// futexes are real; cross-process runs are in tests/multiprocess).
#include <signal.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <fstream>
#include <set>
#include <thread>

#include "lavaflow/core/pool.hpp"
#include "support.hpp"

using namespace lavaflow;
using namespace std::chrono_literals;

namespace {

ProducerOptions popts(const std::filesystem::path& dir, TransportKind transport = TransportKind::Shm) {
  return {.slots = 4, .slot_size = 256, .transport = transport, .directory = dir};
}
ConsumerOptions copts(const std::filesystem::path& dir) { return {.connect_timeout = 5s, .directory = dir}; }
/// A flag channel over Vulkan of `slots` 4 KiB slots.
ProducerOptions flag_popts(const std::filesystem::path& dir, const VulkanContext& ctx, std::uint32_t slots) {
  auto o = popts(dir, TransportKind::Vulkan);
  o.slots = slots;
  o.slot_size = 4096;
  o.vulkan = &ctx;
  o.gpu_sync = GpuSyncKind::Flag;
  return o;
}

void publish(Producer& p, std::uint64_t tag, std::uint64_t size = 16) {
  auto loan = lftest::ok(p.loan(5s));
  std::vector<std::byte> data(size, static_cast<std::byte>(tag & 0xff));
  if (!loan.bytes().empty())
    std::memcpy(loan.bytes().data(), data.data(), size);
  else
    lftest::ok(upload(*p.vulkan(), loan.buffer(), data));  // device-local, unmapped
  lftest::ok(p.publish(std::move(loan), {.size = size, .user_tag = tag}));
}

/// The first byte of a received message, wherever its buffer lives.
std::byte first_byte(const Consumer& c, const Received& r) {
  if (!r.bytes().empty()) return r.bytes()[0];
  std::vector<std::byte> one(1);
  lftest::ok(download(*c.vulkan(), r.buffer(), one));
  return one[0];
}

}  // namespace

TEST_CASE("loan, publish, receive, release with header fields, on both transports") {
  auto ctx = VulkanContext::create();
  for (auto transport : {TransportKind::Shm, TransportKind::Vulkan}) {
    if (transport == TransportKind::Vulkan && !ctx) continue;
    INFO(to_string(transport));
    auto dir = lftest::channel_dir();
    auto o = popts(dir, transport);
    o.slots = 16;
    o.timestamps = true;
    o.vulkan = ctx ? &*ctx : nullptr;
    auto p = lftest::ok(Producer::create("frames", o));
    CHECK(p->route().transport == transport);
    CHECK_FALSE(p->route().reason.empty());
    auto c = lftest::ok(Consumer::open("frames", copts(dir)));
    CHECK(c->route().transport == transport);
    CHECK(c->producer_pid() == ::getpid());
    lftest::ok(p->wait_for_consumers(1, 5s));
    for (std::uint64_t i = 0; i < 10; ++i) publish(*p, 100 + i, 1 + i);
    for (std::uint64_t i = 0; i < 10; ++i) {
      auto r = lftest::ok(c->receive(5s));
      CHECK(r.info().sequence == i);
      CHECK(r.info().user_tag == 100 + i);
      CHECK(r.info().size == 1 + i);
      CHECK((r.bytes().empty() || r.bytes().size() == 1 + i));
      CHECK(first_byte(*c, r) == static_cast<std::byte>(100 + i));
      CHECK(r.info().timestamp_ns > 0);
      CHECK(r.missed() == 0);
    }
    lftest::ok(p->flush(5s));
  }
}

TEST_CASE("fan-out: every consumer sees every message") {
  auto dir = lftest::channel_dir();
  auto p = lftest::ok(Producer::create("fan", popts(dir)));
  std::vector<std::unique_ptr<Consumer>> cs;
  for (int i = 0; i < 3; ++i) cs.push_back(lftest::ok(Consumer::open("fan", copts(dir))));
  lftest::ok(p->wait_for_consumers(3, 5s));
  CHECK(p->consumer_count() == 3);
  std::vector<std::thread> readers;
  std::atomic<int> good{0};
  for (auto& c : cs)
    readers.emplace_back([&, cp = c.get()] {
      for (std::uint64_t i = 0; i < 1000; ++i) {
        auto r = cp->receive(10s);
        if (!r || r->info().sequence != i || r->info().user_tag != i) return;
      }
      ++good;
    });
  for (std::uint64_t i = 0; i < 1000; ++i) publish(*p, i);
  for (auto& t : readers) t.join();
  CHECK(good == 3);
}

TEST_CASE("consumers that join while the producer streams each see a gapless run of intact messages") {
  // A joining consumer starts at a head the producer's next scan of the ring cannot overwrite:
  // its run of messages has no gap, no message of another sequence and no torn bytes.
  auto dir = lftest::channel_dir();
  auto o = popts(dir);
  o.slot_size = 64;
  auto p = lftest::ok(Producer::create("join", o));
  auto steady = lftest::ok(Consumer::open("join", copts(dir)));
  lftest::ok(p->wait_for_consumers(1, 5s));
  std::atomic<bool> stop{false}, written{false};
  std::thread writer([&] {
    for (std::uint64_t i = 0; !stop.load(std::memory_order_relaxed); ++i) {
      auto loan = p->loan(5s);
      if (!loan) break;
      std::memset(loan->bytes().data(), static_cast<int>(i & 0xff), 64);
      if (!p->publish(std::move(*loan), {.size = 64, .user_tag = i})) break;
    }
    written = true;
  });
  std::thread drain([&] {  // keeps the ring moving until the writer is done
    while (!written.load(std::memory_order_relaxed)) (void)steady->receive(100ms);
  });
  int joins = 0, bad = 0;
  for (int attempt = 0; attempt < 100 && bad == 0 && !written; ++attempt) {
    auto c = Consumer::open("join", copts(dir));
    if (!c) {
      ++bad;
      break;
    }
    ++joins;
    std::optional<std::uint64_t> last;
    for (int k = 0; k < 20; ++k) {
      auto r = (*c)->receive(5s);
      if (!r || r->missed() != 0 || r->info().user_tag != r->info().sequence ||
          (last && r->info().sequence != *last + 1) ||
          r->bytes()[0] != static_cast<std::byte>(r->info().sequence & 0xff) ||
          r->bytes()[63] != static_cast<std::byte>(r->info().sequence & 0xff)) {
        ++bad;
        break;
      }
      last = r->info().sequence;
    }
  }
  stop = true;
  writer.join();
  drain.join();
  CHECK(joins == 100);
  CHECK(bad == 0);
}

TEST_CASE("full ring: Block waits with a timeout, FailFast says would-block, DropOldest skips and reports the gap") {
  auto dir = lftest::channel_dir();
  SECTION("block") {
    auto p = lftest::ok(Producer::create("full", popts(dir)));
    auto c = lftest::ok(Consumer::open("full", copts(dir)));
    lftest::ok(p->wait_for_consumers(1, 5s));
    for (int i = 0; i < 4; ++i) publish(*p, i);
    auto t = lftest::err(p->loan(30ms));
    CHECK(t.code() == Errc::Timeout);
    CHECK(lftest::err(p->try_loan()).code() == Errc::WouldBlock);
    { auto r = lftest::ok(c->receive(1s)); }  // released at scope end
    CHECK(p->loan(1s).has_value());
  }
  SECTION("fail fast") {
    auto o = popts(dir);
    o.policy = FullPolicy::FailFast;
    auto p = lftest::ok(Producer::create("full", o));
    auto c = lftest::ok(Consumer::open("full", copts(dir)));
    lftest::ok(p->wait_for_consumers(1, 5s));
    for (int i = 0; i < 4; ++i) publish(*p, i);
    auto e = lftest::err(p->loan(10s));
    CHECK(e.code() == Errc::WouldBlock);
  }
  SECTION("drop oldest") {
    auto o = popts(dir);
    o.policy = FullPolicy::DropOldest;
    auto p = lftest::ok(Producer::create("full", o));
    auto c = lftest::ok(Consumer::open("full", copts(dir)));
    lftest::ok(p->wait_for_consumers(1, 5s));
    for (int i = 0; i < 10; ++i) publish(*p, i);  // never blocks: the 6 oldest are dropped
    auto r = lftest::ok(c->receive(1s));
    CHECK(r.info().sequence == 6);
    CHECK(r.missed() == 6);
    r.release();
    auto r2 = lftest::ok(c->receive(1s));
    CHECK(r2.info().sequence == 7);
    CHECK(r2.missed() == 0);
  }
}

TEST_CASE("releases may come out of order, and holding every slot is a clear error") {
  auto dir = lftest::channel_dir();
  auto p = lftest::ok(Producer::create("order", popts(dir)));
  auto c = lftest::ok(Consumer::open("order", copts(dir)));
  lftest::ok(p->wait_for_consumers(1, 5s));
  for (int i = 0; i < 4; ++i) publish(*p, i);
  std::vector<Received> held;
  for (int i = 0; i < 4; ++i) held.push_back(lftest::ok(c->receive(1s)));
  CHECK(lftest::err(c->receive(10ms)).code() == Errc::InvalidArgument);
  CHECK(lftest::err(p->loan(10ms)).code() == Errc::Timeout);
  held[2].release();
  held[1].release();
  CHECK(lftest::err(p->loan(10ms)).code() == Errc::Timeout);  // 0 still held: nothing frees
  held[0].release();
  CHECK(p->loan(1s).has_value());  // 0, 1, 2 released
}

TEST_CASE("typed channel carries trivially copyable values") {
  struct Pose {
    double x, y, z;
    std::uint32_t frame;
  };
  auto dir = lftest::channel_dir();
  auto o = popts(dir);
  TypedProducer<Pose> p(lftest::ok(Producer::create("pose", o)));
  TypedConsumer<Pose> c(lftest::ok(Consumer::open("pose", copts(dir))));
  lftest::ok(p.untyped().wait_for_consumers(1, 5s));
  lftest::ok(p.send({1.5, 2.5, 3.5, 7}));
  auto v = lftest::ok(c.receive(1s));
  CHECK(v.y == 2.5);
  CHECK(v.frame == 7);
}

TEST_CASE("timeouts: receive with nothing published, open with no producer") {
  auto dir = lftest::channel_dir();
  auto p = lftest::ok(Producer::create("quiet", popts(dir)));
  auto c = lftest::ok(Consumer::open("quiet", copts(dir)));
  for (auto mode : {WaitMode::BusyPoll, WaitMode::Block, WaitMode::SpinThenBlock}) {
    auto o = copts(dir);
    o.wait = mode;
    auto c2 = lftest::ok(Consumer::open("quiet", o));
    const auto t0 = std::chrono::steady_clock::now();
    CHECK(lftest::err(c2->receive(50ms)).code() == Errc::Timeout);
    CHECK(std::chrono::steady_clock::now() - t0 >= 50ms);
  }
  CHECK(lftest::err(c->try_receive()).code() == Errc::WouldBlock);
  auto o = copts(dir);
  o.connect_timeout = 50ms;
  auto e = lftest::err(Consumer::open("nobody-here", o));
  CHECK(e.code() == Errc::Timeout);
  CHECK(e.cause().find("nobody-here") != std::string::npos);
}

TEST_CASE("any start order: a consumer waits for its producer to appear") {
  auto dir = lftest::channel_dir();
  std::unique_ptr<Producer> p;
  std::thread later([&] {
    std::this_thread::sleep_for(100ms);
    p = lftest::ok(Producer::create("late", popts(dir)));
    lftest::ok(p->wait_for_consumers(1, 5s));
    publish(*p, 9);
  });
  auto c = lftest::ok(Consumer::open("late", copts(dir)));
  auto r = lftest::ok(c->receive(5s));
  CHECK(r.info().user_tag == 9);
  later.join();
}

TEST_CASE("names: validated, exclusive while a producer lives, reusable after, stale files replaced") {
  auto dir = lftest::channel_dir();
  CHECK(lftest::err(Producer::create("../escape", popts(dir))).code() == Errc::InvalidArgument);
  CHECK(lftest::err(Producer::create("", popts(dir))).code() == Errc::InvalidArgument);
  CHECK(lftest::err(Producer::create(std::string(65, 'a'), popts(dir))).code() == Errc::InvalidArgument);
  {
    auto p = lftest::ok(Producer::create("taken", popts(dir)));
    auto e = lftest::err(Producer::create("taken", popts(dir)));
    CHECK(e.code() == Errc::PermissionDenied);
    CHECK(e.cause().find("in use") != std::string::npos);
  }
  CHECK(Producer::create("taken", popts(dir)).has_value());
  // A stale socket file (as a crashed producer leaves) is replaced.
  { std::ofstream((dir / "stale.sock").string()) << "junk"; }
  auto p = lftest::ok(Producer::create("stale", popts(dir)));
  CHECK(Consumer::open("stale", copts(dir)).has_value());
}

TEST_CASE("a rendezvous directory other users can reach is refused") {
  auto dir = lftest::channel_dir();
  ::chmod(dir.c_str(), 0755);
  auto e = lftest::err(Producer::create("x", popts(dir)));
  CHECK(e.code() == Errc::PermissionDenied);
  CHECK(e.cause().find("0700") != std::string::npos);
}

TEST_CASE("bad options and impossible routes are clear errors") {
  auto dir = lftest::channel_dir();
  auto o = popts(dir);
  o.slots = 63;
  CHECK(lftest::err(Producer::create("bad", o)).code() == Errc::InvalidArgument);
  o = popts(dir, TransportKind::Vulkan);
  o.transports = {shm_transport()};
  CHECK(lftest::err(Producer::create("bad", o)).cause().find("vulkan was forced but not given") != std::string::npos);
  // Forcing Vulkan for a peer without the device.
  o = popts(dir, TransportKind::Vulkan);
  auto ctx = VulkanContext::create();
  o.vulkan = ctx ? &*ctx : nullptr;
  o.peer = lftest::ok(ProcessLocation::current());  // no devices listed
  auto forced = lftest::err(Producer::create("bad", o));
  CHECK(forced.code() == (ctx ? Errc::Unsupported : Errc::Unsupported));
  CHECK(forced.cause().find("forced") != std::string::npos);
  // A remote peer with no remote transport.
  o = popts(dir);
  o.transport.reset();
  o.peer = ProcessLocation::current_with({"elsewhere", "boot"});
  auto remote = lftest::err(Producer::create("bad", o));
  CHECK(remote.code() == Errc::Unreachable);
  CHECK(remote.cause().find("remote (MPI) transport is not built") != std::string::npos);
  // Too large a payload for the slot.
  auto p = lftest::ok(Producer::create("ok", popts(dir)));
  auto loan = lftest::ok(p->loan(1s));
  CHECK(lftest::err(p->publish(std::move(loan), {.size = 257})).code() == Errc::InvalidArgument);
}

TEST_CASE("routing by locations: common device -> Vulkan IPC, same host without -> shm") {
  auto ctx = lftest::context_or_skip();
  auto me = lftest::ok(ProcessLocation::current({ctx.capabilities().identity}));
  auto dir = lftest::channel_dir();
  auto peer_with = me;
  auto p1 = lftest::ok(Channel::create(&ctx, me, peer_with, {.directory = dir}));
  CHECK(p1->route().transport == TransportKind::Vulkan);
  CHECK(p1->route().reason.find("share device") != std::string::npos);
  auto peer_without = lftest::ok(ProcessLocation::current());
  auto p2 = lftest::ok(Channel::create(&ctx, me, peer_without, {.directory = dir}));
  CHECK(p2->route().transport == TransportKind::Shm);
  CHECK(p2->route().reason.find("not taken: vulkan") != std::string::npos);
  auto c = lftest::ok(Consumer::open(p2->name(), copts(dir)));
  CHECK(c->route().transport == TransportKind::Shm);
}

TEST_CASE("malformed bytes on the socket: the producer refuses and keeps serving, and a fake producer is refused") {
  auto dir = lftest::channel_dir();
  auto p = lftest::ok(Producer::create("junk", popts(dir)));
  const auto path = dir / "junk.sock";
  sockaddr_un a{};
  a.sun_family = AF_UNIX;
  std::strcpy(a.sun_path, path.c_str());
  for (int i = 0; i < 3; ++i) {
    UniqueFd s(::socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0));
    REQUIRE(::connect(s.get(), reinterpret_cast<sockaddr*>(&a), sizeof a) == 0);
    const char junk[] = "GET / HTTP/1.1\r\n\r\n";
    REQUIRE(::send(s.get(), junk, sizeof junk, 0) > 0);
    auto reply = lftest::ok(recv_message(s.get(), 2s));
    std::string text(reinterpret_cast<const char*>(reply.payload.data()), reply.payload.size());
    CHECK(text.find("bad frame magic") != std::string::npos);
  }
  CHECK(Consumer::open("junk", copts(dir)).has_value());

  // A fake producer that answers the Hello with garbage.
  UniqueFd listener(::socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0));
  sockaddr_un f{};
  f.sun_family = AF_UNIX;
  std::strcpy(f.sun_path, (dir / "fake.sock").c_str());
  REQUIRE(::bind(listener.get(), reinterpret_cast<sockaddr*>(&f), sizeof f) == 0);
  REQUIRE(::listen(listener.get(), 4) == 0);
  std::thread fake([&] {
    UniqueFd s(::accept(listener.get(), nullptr, nullptr));
    (void)recv_message(s.get(), 2s);
    std::vector<std::byte> garbage(40, std::byte{0x41});
    (void)send_message(s.get(), garbage);
    std::this_thread::sleep_for(100ms);
  });
  auto e = lftest::err(Consumer::open("fake", copts(dir)));
  CHECK(e.code() == Errc::Malformed);
  fake.join();
}

namespace {

/// Producer writes each message with a GPU copy (staging → ring buffer), consumer checks bytes.
void gpu_written_stream(bool use_timeline) {
  auto ctx = lftest::context_or_skip();
  auto dir = lftest::channel_dir();
  const std::uint64_t n = 4096;
  auto o = popts(dir, TransportKind::Vulkan);
  o.slot_size = n;
  o.vulkan = &ctx;
  auto p = lftest::ok(Producer::create("gpu", o));
  if (use_timeline && !p->has_gpu_timeline())
    lftest::skip("device " + ctx.capabilities().identity.name + " cannot export timeline semaphores as opaque fds");
  CHECK(p->route().reason.find(p->has_gpu_timeline() ? "timeline semaphore" : "fence") != std::string::npos);
  auto c = lftest::ok(Consumer::open("gpu", copts(dir)));
  CHECK(c->has_gpu_timeline() == p->has_gpu_timeline());
  lftest::ok(p->wait_for_consumers(1, 5s));
  auto staging = lftest::ok(GpuBuffer::allocate(ctx, {.size = n, .memory = GpuMemory::HostVisible}));
  for (std::uint64_t i = 0; i < 20; ++i) {
    lftest::fill(staging.bytes(), i);
    auto loan = lftest::ok(p->loan(5s));
    auto& dst = dynamic_cast<GpuBuffer&>(loan.buffer());
    if (use_timeline) {
      auto copy =
          lftest::submit_copy(ctx, staging.buffer(), 0, dst.buffer(), dst.offset(), n, std::nullopt, loan.gpu_signal());
      lftest::ok(p->publish(std::move(loan), {.size = n}));  // no CPU wait: the consumer's wait orders it
      auto r = lftest::ok(c->receive(5s));
      CHECK(lftest::gpu_check(*c->vulkan(), dynamic_cast<GpuBuffer&>(r.buffer()), i).empty());
      REQUIRE(ctx.device().waitForFences(*copy.fence, VK_TRUE, 5'000'000'000ull) == vk::Result::eSuccess);
    } else {
      auto copy = lftest::submit_copy(ctx, staging.buffer(), 0, dst.buffer(), dst.offset(), n);
      lftest::ok(p->publish(std::move(loan), *copy.fence, {.size = n}));
      auto r = lftest::ok(c->receive(5s));
      CHECK(lftest::gpu_check(*c->vulkan(), dynamic_cast<GpuBuffer&>(r.buffer()), i).empty());
    }
  }
}

}  // namespace

TEST_CASE("Vulkan transport: GPU writes are finished by a fence wait before the hand-off") {
  gpu_written_stream(false);
}

TEST_CASE("Vulkan transport: GPU writes are ordered by the shared timeline semaphore, no CPU wait") {
  gpu_written_stream(true);
}

TEST_CASE("Vulkan transport: a consumer's GPU work waits on the shared timeline") {
  auto ctx = lftest::context_or_skip();
  auto dir = lftest::channel_dir();
  auto o = popts(dir, TransportKind::Vulkan);
  o.slot_size = 4096;
  o.vulkan = &ctx;
  auto p = lftest::ok(Producer::create("gpuwait", o));
  if (!p->has_gpu_timeline())
    lftest::skip("device " + ctx.capabilities().identity.name + " cannot export timeline semaphores as opaque fds");
  auto co = copts(dir);
  co.host_wait_for_gpu = false;
  auto c = lftest::ok(Consumer::open("gpuwait", co));
  lftest::ok(p->wait_for_consumers(1, 5s));
  const auto& cctx = *c->vulkan();
  auto src = lftest::ok(GpuBuffer::allocate(ctx, {.size = 4096, .memory = GpuMemory::HostVisible}));
  auto out = lftest::ok(GpuBuffer::allocate(cctx, {.size = 4096, .memory = GpuMemory::HostVisible}));
  for (std::uint64_t i = 0; i < 20; ++i) {
    lftest::fill(src.bytes(), 100 + i);
    auto loan = lftest::ok(p->loan(5s));
    auto& dst = dynamic_cast<GpuBuffer&>(loan.buffer());
    auto w =
        lftest::submit_copy(ctx, src.buffer(), 0, dst.buffer(), dst.offset(), 4096, std::nullopt, loan.gpu_signal());
    lftest::ok(p->publish(std::move(loan), {.size = 4096}));
    auto r = lftest::ok(c->receive(5s));
    auto& in = dynamic_cast<GpuBuffer&>(r.buffer());
    auto rd = lftest::submit_copy(cctx, in.buffer(), in.offset(), out.buffer(), 0, 4096, r.gpu_wait());
    REQUIRE(cctx.device().waitForFences(*rd.fence, VK_TRUE, 5'000'000'000ull) == vk::Result::eSuccess);
    CHECK(lftest::first_mismatch(out.bytes(), 100 + i) == -1);
    REQUIRE(ctx.device().waitForFences(*w.fence, VK_TRUE, 5'000'000'000ull) == vk::Result::eSuccess);
  }
  // A message written without GPU ordering does not touch the semaphore: nothing to wait for.
  publish(*p, 7, 16);
  auto plain = lftest::ok(c->receive(5s));
  CHECK_FALSE(plain.gpu_wait().has_value());
}

TEST_CASE("Vulkan transport: a slot released on the consumer's GPU is reused only after that GPU signals") {
  auto ctx = lftest::context_or_skip();
  auto dir = lftest::channel_dir();
  auto o = popts(dir, TransportKind::Vulkan);
  o.slots = 1;
  o.slot_size = 4096;
  o.vulkan = &ctx;
  auto p = lftest::ok(Producer::create("gpurel", o));
  if (!p->has_gpu_timeline())
    lftest::skip("device " + ctx.capabilities().identity.name + " cannot export timeline semaphores as opaque fds");
  auto c = lftest::ok(Consumer::open("gpurel", copts(dir)));
  lftest::ok(p->wait_for_consumers(1, 5s));
  const GpuSemaphore* release = c->gpu_release_timeline();
  REQUIRE(release != nullptr);

  // Released on the GPU, dropped on the CPU at once: the slot is not free until the signal.
  publish(*p, 1, 16);
  {
    auto r = lftest::ok(c->receive(5s));
    auto sync = lftest::ok(r.gpu_release());
    CHECK(sync.value == r.info().sequence + 1);
    CHECK(sync.source == release);
  }
  auto early = p->loan(200ms);
  REQUIRE_FALSE(early.has_value());
  CHECK(early.error().code() == Errc::Timeout);
  CHECK(early.error().message().find("GPU did not finish reading") != std::string::npos);
  auto now_only = p->try_loan();  // never waits, on the ring or on a GPU
  REQUIRE_FALSE(now_only.has_value());
  CHECK(now_only.error().code() == Errc::WouldBlock);
  lftest::ok(release->signal(1));  // the consumer's read is done (signalled from its host here)
  { auto loan = lftest::ok(p->loan(1s)); }

  // A producer that writes on the GPU gets the wait to put in its own submission instead.
  auto o2 = popts(dir, TransportKind::Vulkan);
  o2.slots = 1;
  o2.slot_size = 4096;
  o2.vulkan = &ctx;
  o2.host_wait_for_gpu_release = false;
  auto p2 = lftest::ok(Producer::create("gpurel2", o2));
  auto c2 = lftest::ok(Consumer::open("gpurel2", copts(dir)));
  lftest::ok(p2->wait_for_consumers(1, 5s));
  publish(*p2, 2, 16);
  {
    auto r = lftest::ok(c2->receive(5s));
    (void)lftest::ok(r.gpu_release());
    auto again = lftest::ok(r.gpu_release());  // asking twice gives the same point
    CHECK(again.value == 1);
  }
  {
    auto loan = lftest::ok(p2->loan(1s));
    REQUIRE(loan.gpu_waits().size() == 1);
    CHECK(loan.gpu_waits()[0].value == 1);
    CHECK(loan.gpu_waits()[0].source != nullptr);  // the producer's own handle of that consumer's timeline
  }
  // Releases go in receive order.
  publish(*p2, 3, 16);
  {
    auto r = lftest::ok(c2->receive(5s));
    CHECK(lftest::ok(r.gpu_release()).value == 2);
    r.release();
    auto gone = r.gpu_release();
    REQUIRE_FALSE(gone.has_value());
    CHECK(gone.error().code() == Errc::InvalidArgument);
  }

  // A consumer that goes away owing releases (it died with GPU work in flight) does not leave the
  // producer's queue waiting forever: the producer signals what it owed.
  {
    auto loan = lftest::ok(p2->loan(1s));
    REQUIRE(loan.gpu_waits().size() == 1);
    const auto owed = loan.gpu_waits()[0];
    CHECK(owed.value == 2);
    CHECK(lftest::ok(owed.source->value()) < owed.value);
    c2.reset();
    const Deadline dl(5s);
    while (lftest::ok(owed.source->value()) < owed.value && !dl.passed()) std::this_thread::sleep_for(1ms);
    CHECK(lftest::ok(owed.source->value()) >= owed.value);
  }
}

TEST_CASE("Vulkan transport: a producer gone before its GPU wrote a message is PeerLost, and no GPU wait hangs") {
  auto ctx = lftest::context_or_skip();
  auto dir = lftest::channel_dir();
  auto o = popts(dir, TransportKind::Vulkan);
  o.slots = 4;
  o.slot_size = 4096;
  o.vulkan = &ctx;
  auto p = lftest::ok(Producer::create("gpulost", o));
  if (!p->has_gpu_timeline())
    lftest::skip("device " + ctx.capabilities().identity.name + " cannot export timeline semaphores as opaque fds");
  auto c = lftest::ok(Consumer::open("gpulost", copts(dir)));  // receive() waits on the host
  lftest::ok(p->wait_for_consumers(1, 5s));
  {
    auto loan = lftest::ok(p->loan(1s));
    REQUIRE(loan.gpu_signal_point().has_value());
    (void)loan.gpu_signal();  // promised, but its GPU never writes it
    lftest::ok(p->publish(std::move(loan), {.size = 16}));
  }
  p.reset();
  auto r = c->receive(5s);
  REQUIRE_FALSE(r.has_value());
  CHECK(r.error().code() == Errc::PeerLost);
  CHECK(r.error().message().find("before its GPU finished writing message 0") != std::string::npos);
  // GPU work queued after the producer went is let go at once.
  auto up = lftest::ok(c->upcoming(c->next_sequence()));
  CHECK(lftest::ok(c->gpu_timeline()->value()) >= up.gpu_wait.value);
}

TEST_CASE("Vulkan transport: fan-out tracks each consumer's GPU release, and GPU reads can be queued ahead") {
  auto ctx = lftest::context_or_skip();
  auto dir = lftest::channel_dir();
  auto o = popts(dir, TransportKind::Vulkan);
  o.slots = 2;
  o.slot_size = 4096;
  o.vulkan = &ctx;
  o.host_wait_for_gpu_release = false;
  auto p = lftest::ok(Producer::create("gpufan", o));
  if (!p->has_gpu_timeline())
    lftest::skip("device " + ctx.capabilities().identity.name + " cannot export timeline semaphores as opaque fds");
  auto a = lftest::ok(Consumer::open("gpufan", copts(dir)));
  auto b = lftest::ok(Consumer::open("gpufan", copts(dir)));
  lftest::ok(p->wait_for_consumers(2, 5s));
  CHECK(p->slots() == 2);

  // Queued ahead: where message 0 will be and the point its writer signals.
  auto up = lftest::ok(a->upcoming(a->next_sequence()));
  CHECK(up.sequence == 0);
  CHECK(up.gpu_wait.value == 1);
  CHECK(up.buffer != nullptr);

  publish(*p, 1, 16);
  publish(*p, 2, 16);
  {
    auto ra = lftest::ok(a->receive(5s));
    auto rb = lftest::ok(b->receive(5s));
    (void)lftest::ok(ra.gpu_release());  // a's GPU reads message 0; b finishes on its CPU
    CHECK(&ra.buffer() == up.buffer);
  }
  {
    auto ra = lftest::ok(a->receive(5s));
    auto rb = lftest::ok(b->receive(5s));
    (void)lftest::ok(ra.gpu_release());
    (void)lftest::ok(rb.gpu_release());  // both GPUs read message 1
  }
  CHECK(lftest::err(a->upcoming(0)).code() == Errc::InvalidArgument);  // already received
  // Two slots: message next + 2 would go where message next still is.
  CHECK(lftest::err(a->upcoming(a->next_sequence() + 2)).code() == Errc::InvalidArgument);
  CHECK(a->upcoming(a->next_sequence() + 1).has_value());
  {
    auto loan = lftest::ok(p->loan(1s));  // message 2 into slot 0: only a's release of 0 to wait for
    REQUIRE(loan.gpu_waits().size() == 1);
    CHECK(loan.gpu_waits()[0].value == 1);
    lftest::ok(p->publish(std::move(loan), {.size = 16}));
  }
  {
    auto loan = lftest::ok(p->loan(1s));  // message 3 into slot 1: both releases of 1
    REQUIRE(loan.gpu_waits().size() == 2);
    CHECK(loan.gpu_waits()[0].value == 2);
    CHECK(loan.gpu_waits()[1].value == 2);
    CHECK(loan.gpu_waits()[0].source != loan.gpu_waits()[1].source);
  }
}

namespace {

/// Connects to channel `name` in `dir` and says nothing.
UniqueFd silent_client(const std::filesystem::path& dir, const std::string& name) {
  UniqueFd s(::socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0));
  sockaddr_un a{};
  a.sun_family = AF_UNIX;
  std::strcpy(a.sun_path, (dir / (name + ".sock")).c_str());
  REQUIRE(::connect(s.get(), reinterpret_cast<sockaddr*>(&a), sizeof a) == 0);
  return s;
}

std::set<std::string> entries(const std::filesystem::path& dir) {
  std::set<std::string> out;
  for (const auto& e : std::filesystem::directory_iterator(dir)) out.insert(e.path().filename().string());
  return out;
}

}  // namespace

TEST_CASE("20 connections that never speak delay neither a real consumer nor the notice of a dead one") {
  auto dir = lftest::channel_dir();
  auto p = lftest::ok(Producer::create("crowded", popts(dir)));
  // The consumers bring their Vulkan context, so that opening times admission rather than the
  // enumeration of every driver's devices (slow on a GPU machine, and slower under load).
  auto vk = VulkanContext::create();
  auto o = copts(dir);
  if (vk) o.vulkan = &*vk;
  // What attaching costs with nobody in the way.
  auto t0 = std::chrono::steady_clock::now();
  {
    auto first = lftest::ok(Consumer::open("crowded", o));
    lftest::ok(p->wait_for_consumers(1, 5s));
  }
  const auto alone = std::chrono::steady_clock::now() - t0;
  while (p->consumer_count() != 0) std::this_thread::sleep_for(1ms);

  std::vector<UniqueFd> silent;
  for (int i = 0; i < 20; ++i) silent.push_back(silent_client(dir, "crowded"));
  std::this_thread::sleep_for(20ms);  // the producer has accepted them and waits for their Hello

  t0 = std::chrono::steady_clock::now();
  auto c = lftest::ok(Consumer::open("crowded", o));
  lftest::ok(p->wait_for_consumers(1, 5s));
  const auto crowded = std::chrono::steady_clock::now() - t0;
  CHECK(crowded < alone + 100ms);
  publish(*p, 7);
  CHECK(lftest::ok(c->receive(1s)).info().user_tag == 7);

  // A consumer that goes away is noticed while the silent ones still hang on.
  t0 = std::chrono::steady_clock::now();
  c.reset();
  while (p->consumer_count() != 0 && std::chrono::steady_clock::now() - t0 < 5s) std::this_thread::sleep_for(1ms);
  const auto notice = std::chrono::steady_clock::now() - t0;
  CHECK(p->consumer_count() == 0);
  CHECK(notice < 100ms);

  // The silent ones are hung up on after the Hello timeout; a socket that finally speaks junk is
  // refused without holding anyone up.
  char byte = 0;
  CHECK(::recv(silent.back().get(), &byte, 1, 0) == 0);  // blocks until the producer hangs up
  CHECK(Consumer::open("crowded", copts(dir)).has_value());
}

TEST_CASE("rendezvous files go with their channel: 1000 create/destroy cycles and killed producers leave nothing") {
  auto dir = lftest::channel_dir();
  const auto before = entries(dir);
  for (int i = 0; i < 1000; ++i) {
    auto p = lftest::ok(Producer::create("churn-" + std::to_string(i % 7), popts(dir)));
    if (i % 100 == 0) auto c = lftest::ok(Consumer::open(p->name(), copts(dir)));
  }
  CHECK(entries(dir) == before);

  // Producers killed before they could clean up: their names are reclaimed by the next producer.
  for (const char* name : {"victim-a", "victim-b"}) {
    int ready[2];
    REQUIRE(::pipe(ready) == 0);
    const pid_t pid = ::fork();
    REQUIRE(pid >= 0);
    if (pid == 0) {
      auto victim = Producer::create(name, popts(dir));
      const char ok = victim ? 1 : 0;
      (void)!::write(ready[1], &ok, 1);
      ::pause();
      ::_exit(0);
    }
    ::close(ready[1]);
    char ok = 0;
    REQUIRE(::read(ready[0], &ok, 1) == 1);
    ::close(ready[0]);
    REQUIRE(ok == 1);
    ::kill(pid, SIGKILL);
    REQUIRE(::waitpid(pid, nullptr, 0) == pid);
  }
  // The second victim's create already reclaimed the first's names; its own are left.
  CHECK(entries(dir) == std::set<std::string>{"victim-b.lock", "victim-b.sock"});
  // A consumer killed while connected leaves nothing of its own either.
  {
    // Forked before the producer starts its service thread: a child forked while another thread
    // holds a lock (the allocator's, a sanitizer's) can wait on it forever.
    int go[2];
    REQUIRE(::pipe(go) == 0);
    const pid_t pid = ::fork();
    REQUIRE(pid >= 0);
    if (pid == 0) {
      ::close(go[1]);
      char ready = 0;
      if (::read(go[0], &ready, 1) != 1) ::_exit(2);
      auto c = Consumer::open("victim-a", copts(dir));
      ::raise(SIGKILL);
    }
    ::close(go[0]);
    auto p = Producer::create("victim-a", popts(dir));  // reclaims both stale names
    if (p) CHECK(::write(go[1], "g", 1) == 1);
    ::close(go[1]);
    REQUIRE(::waitpid(pid, nullptr, 0) == pid);
    REQUIRE(p);
  }
  CHECK(entries(dir) == before);
}

TEST_CASE("a Loan or Received that outlives its channel object keeps its bytes valid, and frees them when dropped") {
  auto dir = lftest::channel_dir();
  auto p = lftest::ok(Producer::create("outlive", popts(dir)));
  auto c = lftest::ok(Consumer::open("outlive", copts(dir)));
  publish(*p, 1);
  publish(*p, 2);
  auto first = lftest::ok(c->receive(1s));
  auto second = lftest::ok(c->receive(1s));
  auto loan = lftest::ok(p->loan(1s));
  std::memset(loan.bytes().data(), 0x5a, loan.bytes().size());

  p.reset();  // the channel closes; the loan keeps the ring
  CHECK(loan.bytes().size() == 256);
  CHECK(loan.bytes()[255] == std::byte{0x5a});
  { Loan gone = std::move(loan); }  // frees what the producer left

  c.reset();  // two messages still held: their bytes stay as they were
  CHECK(first.bytes().size() == 16);
  CHECK(first.bytes()[0] == std::byte{1});
  first.release();
  CHECK(first.bytes().empty());
  CHECK(second.bytes()[15] == std::byte{2});
}

TEST_CASE("close() ends the channel at once while the objects, and pointers into their rings, stay valid") {
  auto dir = lftest::channel_dir();
  auto p = lftest::ok(Producer::create("closing", popts(dir)));
  auto c = lftest::ok(Consumer::open("closing", copts(dir)));
  auto c2 = lftest::ok(Consumer::open("closing", copts(dir)));
  lftest::ok(p->wait_for_consumers(2, 5s));
  publish(*p, 1);
  publish(*p, 2);
  auto held = lftest::ok(c->receive(1s));
  const std::byte* bytes = held.bytes().data();

  // A consumer that hangs up holding a message no longer holds the producer back.
  c->close();
  CHECK(c->closed());
  CHECK(lftest::err(c->receive(0s)).code() == Errc::InvalidArgument);
  CHECK(lftest::ok(c2->receive(1s)).info().user_tag == 1);
  CHECK(lftest::ok(c2->receive(1s)).info().user_tag == 2);
  lftest::ok(p->flush(5s));
  for (std::uint64_t tag = 3; tag < 7; ++tag) publish(*p, tag);  // the ring wraps over the held slot
  CHECK(bytes[0] == held.bytes()[0]);                            // still mapped
  held.release();

  // A closed producer: its consumers drain what was published, then PeerLost; the name is free.
  p->close();
  CHECK(p->closed());
  CHECK(lftest::err(p->loan(0s)).code() == Errc::InvalidArgument);
  for (std::uint64_t tag = 3; tag < 7; ++tag) CHECK(lftest::ok(c2->receive(1s)).info().user_tag == tag);
  CHECK(lftest::err(c2->receive(1s)).code() == Errc::PeerLost);
  auto again = lftest::ok(Producer::create("closing", popts(dir)));
  CHECK(std::filesystem::exists(dir / "closing.sock"));
}

TEST_CASE("busy-polling ends ping-pong and stream over many ring lengths, every message in order") {
  // The inline paths: a receive that spins on its slot before the message comes, and a producer
  // that re-reads the consumer's released count after the publish that fills its ring.
  auto dir = lftest::channel_dir();
  auto o = popts(dir);
  o.slots = 3;  // wraps often
  o.wait = WaitMode::BusyPoll;
  auto ping = lftest::ok(Producer::create("bp-ping", o));
  auto pong = lftest::ok(Producer::create("bp-pong", o));
  auto co = copts(dir);
  co.wait = WaitMode::BusyPoll;
  auto ping_in = lftest::ok(Consumer::open("bp-ping", co));
  auto pong_in = lftest::ok(Consumer::open("bp-pong", co));
  lftest::ok(ping->wait_for_consumers(1, 5s));
  lftest::ok(pong->wait_for_consumers(1, 5s));
  constexpr std::uint64_t kRounds = 20'000, kStream = 50'000;
  std::atomic<std::uint64_t> echo_errors{0};
  std::thread echo([&] {
    for (std::uint64_t i = 0; i < kRounds + kStream; ++i) {
      auto r = ping_in->receive(10s);
      if (!r || r->info().sequence != i || r->info().user_tag != i * 7 || r->info().size != 8 ||
          std::memcmp(r->bytes().data(), &i, 8) != 0) {
        ++echo_errors;
        return;
      }
      if (i >= kRounds) continue;  // the stream: nothing to answer
      auto l = pong->loan(10s);
      if (!l || !pong->publish(std::move(*l), {.size = 8, .user_tag = i})) {
        ++echo_errors;
        return;
      }
    }
  });
  for (std::uint64_t i = 0; i < kRounds; ++i) {
    auto l = lftest::ok(ping->loan(10s));
    std::memcpy(l.bytes().data(), &i, 8);
    lftest::ok(ping->publish(std::move(l), {.size = 8, .user_tag = i * 7}));
    auto r = lftest::ok(pong_in->receive(10s));
    REQUIRE(r.info().user_tag == i);
  }
  for (std::uint64_t i = kRounds; i < kRounds + kStream; ++i) {  // the ring full more often than not
    auto l = lftest::ok(ping->loan(10s));
    std::memcpy(l.bytes().data(), &i, 8);
    lftest::ok(ping->publish(std::move(l), {.size = 8, .user_tag = i * 7}));
  }
  echo.join();
  CHECK(echo_errors == 0);
  lftest::ok(ping->flush(5s));
  // No wait at all for a timeout of zero or less: Timeout, whatever the mode.
  CHECK(lftest::err(pong_in->receive(0s)).code() == Errc::Timeout);
  CHECK(lftest::err(pong_in->receive(-1ms)).code() == Errc::Timeout);
}

TEST_CASE("a message published just before its producer closes is received before PeerLost") {
  // The close may be seen in the same look as the message's absence: the wait looks once more.
  auto dir = lftest::channel_dir();
  for (auto mode : {WaitMode::BusyPoll, WaitMode::SpinThenBlock, WaitMode::Block}) {
    for (int round = 0; round < 200; ++round) {
      const std::string name = "last-" + std::to_string(round);
      auto p = lftest::ok(Producer::create(name, popts(dir)));
      auto co = copts(dir);
      co.wait = mode;
      auto c = lftest::ok(Consumer::open(name, co));
      lftest::ok(p->wait_for_consumers(1, 5s));
      std::thread last([&] {
        publish(*p, 42);
        p->close();
      });
      auto r = c->receive(5s);
      last.join();
      REQUIRE(r.has_value());
      CHECK(r->info().user_tag == 42);
      r->release();
      CHECK(lftest::err(c->receive(1s)).code() == Errc::PeerLost);
      CHECK(lftest::err(c->try_receive()).code() == Errc::PeerLost);
    }
  }
}

TEST_CASE("await_consumers: loans wait for the consumer, and once it has gone the channel is PeerLost") {
  auto dir = lftest::channel_dir();
  auto o = popts(dir);
  o.max_consumers = 1;
  o.await_consumers = 1;
  auto p = lftest::ok(Producer::create("p2p", o));
  CHECK(lftest::err(p->try_loan()).code() == Errc::WouldBlock);
  const auto t0 = std::chrono::steady_clock::now();
  auto late = lftest::err(p->loan(50ms));
  CHECK(late.code() == Errc::Timeout);
  CHECK(late.cause().find("0 of 1 consumers") != std::string::npos);
  CHECK(std::chrono::steady_clock::now() - t0 < 2s);
  {
    std::thread opener([&] {
      std::this_thread::sleep_for(50ms);
      auto c = lftest::ok(Consumer::open("p2p", copts(dir)));
      CHECK(lftest::ok(c->receive(5s)).info().user_tag == 7);
    });
    publish(*p, 7);  // waits for the consumer to attach
    opener.join();
  }
  // The consumer received the message and went away: the next loan says so instead of
  // publishing into a ring nobody reads.
  Error lost(Errc::Internal, "", "");
  for (auto end = std::chrono::steady_clock::now() + 5s; std::chrono::steady_clock::now() < end;) {
    auto loan = p->loan(100ms);
    if (!loan) {
      lost = loan.error();
      break;
    }
    lftest::ok(p->publish(std::move(*loan), {.size = 8}));
  }
  CHECK(lost.code() == Errc::PeerLost);
  CHECK(lost.cause().find("p2p") != std::string::npos);
}

// Flag channels keep the same protocol in GPU memory words instead of timeline semaphores. Only
// CUDA streams write and wait on them on the GPU (tests/interop, GPU tier); here the host stands
// in for both GPUs through signal_on_host, which is how the protocol runs on any Vulkan device.
TEST_CASE("flag channel: written and release counters in GPU memory order the hand-off and slot reuse") {
  auto ctx = lftest::context_or_skip();
  auto dir = lftest::channel_dir();
  auto o = flag_popts(dir, ctx, 2);
  auto p = lftest::ok(Producer::create("flags", o));
  REQUIRE(p->gpu_sync() == GpuSyncKind::Flag);
  CHECK_FALSE(p->has_gpu_timeline());
  CHECK(p->route().reason.find("GPU work ordered by flags") != std::string::npos);
  auto c = lftest::ok(Consumer::open("flags", copts(dir)));  // receive() waits on the host
  lftest::ok(p->wait_for_consumers(1, 5s));
  CHECK(c->gpu_sync() == GpuSyncKind::Flag);

  // Written: the consumer's receive waits until the producer's counter reaches the message.
  GpuSync written;
  {
    auto loan = lftest::ok(p->loan(1s));
    const auto signal = loan.gpu_signal();
    REQUIRE(signal.has_value());
    written = *signal;
    CHECK(written.kind() == GpuSyncKind::Flag);
    CHECK(written.value == 1);
    CHECK_FALSE(written.semaphore);
    CHECK(written.flag_offset % 8 == 0);
    lftest::ok(p->publish(std::move(loan), {.size = 16, .user_tag = 5}));
  }
  CHECK(lftest::ok(gpu_sync_value(written)) == 0);
  auto early = c->receive(100ms);
  REQUIRE_FALSE(early.has_value());
  CHECK(early.error().code() == Errc::Timeout);
  std::thread writer([&] {
    std::this_thread::sleep_for(50ms);
    lftest::ok(signal_on_host(written));  // the producer's "GPU" finishes the write
  });
  const auto t0 = Clock::now();
  auto r = lftest::ok(c->receive(5s));
  writer.join();
  CHECK(Clock::now() - t0 < 2s);
  CHECK(r.info().user_tag == 5);
  REQUIRE(r.gpu_wait().has_value());
  const auto seen = *r.gpu_wait();
  CHECK(seen.kind() == GpuSyncKind::Flag);
  CHECK(seen.value == 1);
  CHECK(lftest::ok(gpu_sync_value(seen)) == 1);  // the consumer's mapping of the same word

  // Release on the GPU: the slot comes back only once the consumer's counter says the read is done.
  auto rel = lftest::ok(r.gpu_release());
  CHECK(rel.kind() == GpuSyncKind::Flag);
  CHECK(rel.value == 1);
  CHECK(rel.flag_buffer != seen.flag_buffer);  // the consumer's own block, not the written counter's
  r.release();
  publish(*p, 6, 16);  // slot 1
  (void)lftest::ok(c->receive(5s));
  auto blocked = p->loan(100ms);  // slot 0 again: the consumer's GPU still reads message 0
  REQUIRE_FALSE(blocked.has_value());
  CHECK(blocked.error().message().find("GPU did not finish reading") != std::string::npos);
  lftest::ok(signal_on_host(rel));
  { auto loan = lftest::ok(p->loan(1s)); }

  // Signals only go up; waits are bounded; a flag that is not a word of its buffer is refused.
  lftest::ok(signal_on_host(GpuSync{.value = 0, .flag_buffer = rel.flag_buffer, .flag_offset = rel.flag_offset}));
  CHECK(lftest::ok(gpu_sync_value(rel)) == 1);
  CHECK(lftest::err(
            wait_on_host(GpuSync{.value = 9, .flag_buffer = rel.flag_buffer, .flag_offset = rel.flag_offset}, 20ms))
            .code() == Errc::Timeout);
  CHECK(lftest::err(gpu_sync_value(GpuSync{.flag_buffer = rel.flag_buffer, .flag_offset = 3})).code() ==
        Errc::InvalidArgument);
  CHECK(lftest::err(gpu_sync_value(GpuSync{.flag_buffer = rel.flag_buffer, .flag_offset = 1ull << 40})).code() ==
        Errc::InvalidArgument);
  CHECK(lftest::err(signal_on_host(GpuSync{.value = 1})).code() == Errc::InvalidArgument);  // neither kind
}

TEST_CASE("flag channel: a consumer's release counter is its own, and a reused index starts on a fresh word") {
  auto ctx = lftest::context_or_skip();
  auto dir = lftest::channel_dir();
  auto o = flag_popts(dir, ctx, 1);
  o.max_consumers = 2;
  auto p = lftest::ok(Producer::create("flagown", o));
  auto b = lftest::ok(Consumer::open("flagown", copts(dir)));
  auto d = lftest::ok(Consumer::open("flagown", copts(dir)));
  lftest::ok(p->wait_for_consumers(2, 5s));
  publish(*p, 1, 16);
  auto rb = lftest::ok(b->receive(5s));
  auto rd = lftest::ok(d->receive(5s));
  const auto b_rel = lftest::ok(rb.gpu_release());
  const auto d_rel = lftest::ok(rd.gpu_release());
  rb.release();
  rd.release();
  // Whatever b writes in the memory it was given, the producer still waits for d's read.
  lftest::ok(
      signal_on_host(GpuSync{.value = 1u << 30, .flag_buffer = b_rel.flag_buffer, .flag_offset = b_rel.flag_offset}));
  for (std::uint64_t at = 0; at + 8 <= b_rel.flag_buffer->size(); at += 8)
    lftest::ok(signal_on_host(GpuSync{.value = 1u << 30, .flag_buffer = b_rel.flag_buffer, .flag_offset = at}));
  auto blocked = p->loan(100ms);
  REQUIRE_FALSE(blocked.has_value());
  CHECK(blocked.error().message().find("GPU did not finish reading") != std::string::npos);
  lftest::ok(signal_on_host(d_rel));
  { auto loan = lftest::ok(p->loan(1s)); }

  // d goes; the next consumer takes its index, on a word of its own that starts at 0 (a GPU write
  // d still had queued would land on d's word, which nobody reads any more).
  const auto d_offset = d_rel.flag_offset;
  d.reset();
  const auto t0 = Clock::now();
  while (p->consumer_count() > 1 && Clock::now() - t0 < 5s) std::this_thread::sleep_for(5ms);
  REQUIRE(p->consumer_count() == 1);
  auto e = lftest::ok(Consumer::open("flagown", copts(dir)));
  lftest::ok(p->wait_for_consumers(2, 5s));
  publish(*p, 2, 16);
  auto re = lftest::ok(e->receive(5s));
  const auto e_rel = lftest::ok(re.gpu_release());
  CHECK(e_rel.flag_offset != d_offset);
  CHECK(lftest::ok(gpu_sync_value(e_rel)) == 0);
  CHECK(e_rel.value == 2);
}

TEST_CASE(
    "flag channel: a slot's release wait reaches ahead to promised releases, and reads queue at most 3/4 ring ahead") {
  auto ctx = lftest::context_or_skip();
  auto dir = lftest::channel_dir();
  auto o = flag_popts(dir, ctx, 8);
  o.host_wait_for_gpu_release = false;
  auto p = lftest::ok(Producer::create("flagahead", o));
  auto c = lftest::ok(Consumer::open("flagahead", copts(dir)));
  lftest::ok(p->wait_for_consumers(1, 5s));
  // Eight slots: GPU reads may be queued up to five messages beyond the oldest unreleased one, so
  // that no release the producer's GPU may wait for (a quarter of the ring ahead) is queued
  // behind a wait for a message that needs it.
  CHECK(c->upcoming(5).has_value());
  const auto far = lftest::err(c->upcoming(6));
  CHECK(far.code() == Errc::InvalidArgument);
  CHECK(far.cause().find("at most 5 ahead") != std::string::npos);
  for (std::uint64_t i = 0; i < 8; ++i) publish(*p, i, 16);
  for (std::uint64_t i = 0; i < 8; ++i) {
    auto r = lftest::ok(c->receive(5s));
    (void)lftest::ok(r.gpu_release());  // promised; nothing raises the counter here
  }
  // Message 8 goes where message 0 was: its read (release value 1) is what the slot needs, and the
  // releases promised since, up to 8 / 4 further, are what a wait may cover instead.
  auto loan = lftest::ok(p->loan(1s));
  REQUIRE(loan.gpu_waits().size() == 1);
  CHECK(loan.gpu_waits()[0].value == 1);
  CHECK(loan.gpu_waits()[0].ahead == 3);
}

TEST_CASE("flag channel: producer-side GPU waits, a dead consumer's owed releases, a dead producer's writes") {
  auto ctx = lftest::context_or_skip();
  auto dir = lftest::channel_dir();
  auto o = flag_popts(dir, ctx, 1);
  o.host_wait_for_gpu_release = false;
  auto p = lftest::ok(Producer::create("flagwait", o));
  auto c = lftest::ok(Consumer::open("flagwait", copts(dir)));
  lftest::ok(p->wait_for_consumers(1, 5s));
  publish(*p, 1, 16);  // not GPU-ordered: nothing to wait for
  {
    auto r = lftest::ok(c->receive(5s));
    CHECK_FALSE(r.gpu_wait().has_value());
    (void)lftest::ok(r.gpu_release());
  }
  // The producer's next loan of the slot carries the consumer's release as a flag wait.
  {
    auto loan = lftest::ok(p->loan(1s));
    REQUIRE(loan.gpu_waits().size() == 1);
    const auto owed = loan.gpu_waits()[0];
    CHECK(owed.kind() == GpuSyncKind::Flag);
    CHECK(owed.value == 1);
    CHECK(lftest::ok(gpu_sync_value(owed)) == 0);
    // The consumer goes away owing it: the producer raises it so that no queue of its own hangs.
    c.reset();
    lftest::ok(wait_on_host(owed, 5s));
  }

  // A producer that dies having promised a GPU write: the consumer's receive says PeerLost, and
  // the written counter is raised for the GPU work it queued ahead.
  auto o2 = o;
  o2.slots = 4;
  auto p2 = lftest::ok(Producer::create("flaglost", o2));
  auto c2 = lftest::ok(Consumer::open("flaglost", copts(dir)));
  lftest::ok(p2->wait_for_consumers(1, 5s));
  auto ahead = lftest::ok(c2->upcoming(1));
  CHECK(ahead.gpu_wait.kind() == GpuSyncKind::Flag);
  CHECK(ahead.gpu_wait.value == 2);
  {
    auto loan = lftest::ok(p2->loan(1s));
    (void)loan.gpu_signal();
    lftest::ok(p2->publish(std::move(loan), {.size = 16}));
  }
  p2.reset();
  auto r = c2->receive(5s);
  REQUIRE_FALSE(r.has_value());
  CHECK(r.error().code() == Errc::PeerLost);
  CHECK(r.error().message().find("before its GPU finished writing message 0") != std::string::npos);
  lftest::ok(wait_on_host(ahead.gpu_wait, 5s));
}

TEST_CASE("flag channel: asked for on a route without GPU memory, there is no GPU ordering") {
  auto dir = lftest::channel_dir();
  auto o = popts(dir, TransportKind::Shm);
  o.gpu_sync = GpuSyncKind::Flag;
  auto p = lftest::ok(Producer::create("flagshm", o));
  CHECK_FALSE(p->gpu_sync().has_value());
  auto loan = lftest::ok(p->loan(1s));
  CHECK_FALSE(loan.gpu_signal_point().has_value());
}

TEST_CASE("a ring rented from a pool carries messages, goes back with its producer, and the next channel reuses it") {
  auto ctx = VulkanContext::create();
  for (auto transport : {TransportKind::Shm, TransportKind::Vulkan}) {
    if (transport == TransportKind::Vulkan && !ctx) continue;
    INFO(to_string(transport));
    PoolOptions po;
    if (transport == TransportKind::Vulkan) po.vulkan = *ctx;
    auto pool = lftest::ok(MemoryPool::create(po));
    std::uint64_t allocations_after_first = 0;
    for (int round = 0; round < 3; ++round) {
      auto dir = lftest::channel_dir();
      auto o = popts(dir, transport);
      o.slot_size = 64 << 10;
      o.pool = &pool;
      o.vulkan = ctx ? &*ctx : nullptr;
      auto p = lftest::ok(Producer::create("pooled", o));
      CHECK(dynamic_cast<PooledBuffer*>(&lftest::ok(p->loan(5s)).buffer()) != nullptr);
      auto c = lftest::ok(Consumer::open("pooled", copts(dir)));
      lftest::ok(p->wait_for_consumers(1, 5s));
      for (std::uint64_t i = 0; i < 12; ++i) {  // three times round the ring of four
        publish(*p, 40 + i, 1000);
        auto r = lftest::ok(c->receive(5s));
        CHECK(r.info().user_tag == 40 + i);
        CHECK(first_byte(*c, r) == static_cast<std::byte>(40 + i));
      }
      lftest::ok(p->flush(5s));
      CHECK(pool.stats().all.allocation.current == 4);  // the ring, rented while the producer lives
      c.reset();
      p.reset();
      const auto s = pool.stats();
      CHECK(s.all.allocation.current == 0);
      if (round == 0) allocations_after_first = s.num_device_alloc;
      CHECK(s.num_device_alloc == allocations_after_first);
    }
  }
  {
    // A consumer still attached when the producer ends keeps what it holds: the ring is retired,
    // not rented again and overwritten.
    auto pool = lftest::ok(MemoryPool::create());
    auto dir = lftest::channel_dir();
    auto o = popts(dir, TransportKind::Shm);
    o.slot_size = 4096;
    o.pool = &pool;
    auto p = lftest::ok(Producer::create("pooled", o));
    auto c = lftest::ok(Consumer::open("pooled", copts(dir)));
    lftest::ok(p->wait_for_consumers(1, 5s));
    publish(*p, 0x40, 4096);
    auto held = lftest::ok(c->receive(5s));
    p.reset();
    std::vector<PooledBuffer> others;
    for (int i = 0; i < 8; ++i) {
      others.push_back(lftest::ok(pool.rent(4096)));
      std::memset(others.back().host_ptr(), 0xee, 4096);
    }
    CHECK(std::all_of(held.bytes().begin(), held.bytes().end(), [](std::byte b) { return b == std::byte{0x40}; }));
    CHECK(pool.stats().all.allocation.current == 8);  // the retired ring counts as returned
  }
  // A pool on another Vulkan context than the producer's cannot hold a Vulkan ring.
  if (ctx) {
    auto other = VulkanContext::create();
    auto pool = lftest::ok(MemoryPool::create({.vulkan = *other}));
    auto dir = lftest::channel_dir();
    auto o = popts(dir, TransportKind::Vulkan);
    o.pool = &pool;
    o.vulkan = &*ctx;
    auto p = Producer::create("pooled", o);
    REQUIRE_FALSE(p);
    CHECK(p.error().code() == Errc::InvalidArgument);
    CHECK(p.error().message().find("ProducerOptions::pool") != std::string::npos);
  }
}
