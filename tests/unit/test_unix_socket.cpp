// SPDX-License-Identifier: MIT
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <thread>

#include "lavaflow/core/detail/wire.hpp"
#include "support.hpp"

using namespace lavaflow;
using namespace std::chrono_literals;

TEST_CASE("messages carry payload and fds, and the fds arrive as new owners") {
  auto [a, b] = lftest::ok(socket_pair());
  UniqueFd f1(::memfd_create("one", MFD_CLOEXEC)), f2(::memfd_create("two", MFD_CLOEXEC));
  std::vector<std::byte> payload{std::byte{1}, std::byte{2}, std::byte{3}};
  int fds[] = {f1.get(), f2.get()};
  lftest::ok(send_message(a.get(), payload, fds));
  auto m = lftest::ok(recv_message(b.get(), 1000ms));
  CHECK(m.payload == payload);
  REQUIRE(m.fds.size() == 2);
  CHECK(m.fds[0].get() != f1.get());
  CHECK(lftest::fd_is_open(m.fds[0].get()));
}

TEST_CASE("timeouts, hang-ups and malformed frames are clear errors and leak no fd") {
  const int before = lftest::open_fds();
  {
    auto [a, b] = lftest::ok(socket_pair());
    auto t = lftest::err(recv_message(b.get(), 20ms));
    CHECK(t.code() == Errc::Timeout);

    // Garbage frames, some with fds attached.
    const char junk[] = "not a lava-flow frame";
    REQUIRE(::send(a.get(), junk, sizeof junk, 0) > 0);
    CHECK(lftest::err(recv_message(b.get(), 1000ms)).code() == Errc::Malformed);

    std::vector<std::byte> payload(10);
    UniqueFd f(::memfd_create("x", MFD_CLOEXEC));
    int fds[] = {f.get(), f.get(), f.get()};
    lftest::ok(send_message(a.get(), payload, fds));
    auto too_many = lftest::err(recv_message(b.get(), 1000ms, kMaxMessagePayload, 2));
    CHECK(too_many.code() == Errc::Malformed);
    CHECK(too_many.cause().find("3 fds") != std::string::npos);

    std::vector<std::byte> big(5000);
    lftest::ok(send_message(a.get(), big));
    CHECK(lftest::err(recv_message(b.get(), 1000ms, 4096)).code() == Errc::Malformed);

    // Header that lies about the payload length.
    wire::Writer w;
    w.put(std::uint32_t{0x4d464c46});
    w.put(std::uint32_t{100});
    w.put(std::uint32_t{0});
    auto lie = std::move(w).take();
    REQUIRE(::send(a.get(), lie.data(), lie.size(), 0) > 0);
    CHECK(lftest::err(recv_message(b.get(), 1000ms)).cause().find("announces 100") != std::string::npos);

    a.reset();
    CHECK(lftest::err(recv_message(b.get(), 1000ms)).code() == Errc::PeerLost);
    CHECK(lftest::err(send_message(b.get(), payload)).code() == Errc::PeerLost);
  }
  CHECK(lftest::open_fds() == before);
}

TEST_CASE("a receiver out of file descriptors is told so, not that the peer misbehaved") {
  auto [a, b] = lftest::ok(socket_pair());
  UniqueFd f(::memfd_create("x", MFD_CLOEXEC));
  int fds[] = {f.get(), f.get()};
  lftest::ok(send_message(a.get(), std::vector<std::byte>(4), fds));
  // In a child, so that the lowered limit cannot touch the rest of this process.
  const pid_t pid = ::fork();
  REQUIRE(pid >= 0);
  if (pid == 0) {
    const int open = lftest::open_fds();
    rlimit lim{static_cast<rlim_t>(open), static_cast<rlim_t>(open)};
    if (::setrlimit(RLIMIT_NOFILE, &lim) != 0) ::_exit(3);
    while (::fcntl(0, F_DUPFD_CLOEXEC, 0) >= 0) {  // take any free numbers below the limit
    }
    auto m = recv_message(b.get(), 1000ms);
    if (m) ::_exit(4);
    const bool named = m.error().cause().find("out of file descriptors") != std::string::npos;
    ::_exit(named && m.error().code() == Errc::System ? 0 : 5);
  }
  int status = 0;
  REQUIRE(::waitpid(pid, &status, 0) == pid);
  REQUIRE(WIFEXITED(status));
  CHECK(WEXITSTATUS(status) == 0);
}

TEST_CASE("abstract sockets: a listener, its connections and who made them") {
  const std::string name = "lavaflow-test-abstract-" + std::to_string(::getpid());
  auto listener = listen_abstract(name, 4);
  REQUIRE(listener);
  // The name is taken while the listener lives.
  auto second = listen_abstract(name, 4);
  REQUIRE_FALSE(second);
  CHECK(second.error().message().find("@" + name) != std::string::npos);

  auto client = connect_abstract(name, std::chrono::milliseconds(100));
  REQUIRE(client);
  UniqueFd server(::accept4(listener->get(), nullptr, nullptr, SOCK_CLOEXEC));
  REQUIRE(server);
  auto who = peer_credentials(server.get());
  REQUIRE(who);
  CHECK(who->pid == ::getpid());
  CHECK(who->uid == ::getuid());
  auto back = peer_credentials(client->get());
  REQUIRE(back);
  CHECK(back->pid == ::getpid());

  // Gone with its socket: nothing is left to remove, and a connection is refused at once.
  *listener = UniqueFd();
  const auto t0 = std::chrono::steady_clock::now();
  auto refused = connect_abstract(name, std::chrono::seconds(5));
  REQUIRE_FALSE(refused);
  CHECK(refused.error().code() == Errc::PeerLost);
  CHECK(std::chrono::steady_clock::now() - t0 < std::chrono::seconds(1));

  CHECK_FALSE(listen_abstract("", 1));
  CHECK_FALSE(listen_abstract(std::string(200, 'x'), 1));
  const std::string pid = std::to_string(::getpid());
  CHECK(listen_abstract(std::string(107 - pid.size(), 'y') + pid, 1).has_value());  // the longest name
}

TEST_CASE("abstract sockets: a connect to a full backlog waits for room, bounded or not") {
  const std::string name = "lavaflow-test-backlog-" + std::to_string(::getpid());
  auto listener = lftest::ok(listen_abstract(name, 1));
  std::vector<UniqueFd> filling;
  // The kernel takes backlog + 1 connections before a non-blocking connect answers EAGAIN.
  for (int i = 0; i < 8; ++i) {
    auto c = connect_abstract(name, std::chrono::milliseconds(0));
    if (!c) break;
    filling.push_back(std::move(*c));
  }
  auto t0 = std::chrono::steady_clock::now();
  CHECK_FALSE(connect_abstract(name, std::chrono::milliseconds(200)));
  CHECK(std::chrono::steady_clock::now() - t0 >= 190ms);
  // Unbounded: it waits until the listener makes room.
  std::thread drain([&] {
    std::this_thread::sleep_for(300ms);
    UniqueFd taken(::accept4(listener.get(), nullptr, nullptr, SOCK_CLOEXEC));
  });
  t0 = std::chrono::steady_clock::now();
  auto late = connect_abstract(name, std::chrono::nanoseconds::max());
  drain.join();
  CHECK(late.has_value());
  CHECK(std::chrono::steady_clock::now() - t0 >= 250ms);
}
