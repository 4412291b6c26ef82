// SPDX-License-Identifier: MIT
// Real processes exchanging real memory: descriptor + fd over a Unix socket (SCM_RIGHTS).
#include <fcntl.h>
#include <spawn.h>
#include <unistd.h>

#include <nlohmann/json.hpp>

#include "lavaflow/core/pool.hpp"
#include "support.hpp"

using namespace lavaflow;
using namespace std::chrono_literals;

namespace {

std::string text(const SocketMessage& m) {
  return std::string(reinterpret_cast<const char*>(m.payload.data()), m.payload.size());
}

struct Peer {
  UniqueFd sock;
  pid_t pid;
};

Peer start(const std::string& mode) {
  auto [mine, theirs] = lftest::ok(socket_pair());
  pid_t pid = lftest::spawn(LAVAFLOW_TEST_PEER, {mode}, theirs.get());
  return {std::move(mine), pid};
}

}  // namespace

TEST_CASE("GPU buffer exported here is imported by another process, byte-exact both ways") {
  auto ctx = lftest::context_or_skip();
  if (!ctx.capabilities().memory_fd_export) lftest::skip("device cannot export opaque-fd memory");
  auto buf = lftest::ok(GpuBuffer::allocate(ctx, {.size = 3'000'017}));
  REQUIRE(lftest::gpu_fill(ctx, buf, 1).empty());
  auto ex = lftest::ok(buf.export_handle());
  auto peer = start("gpu-import");
  int fds[] = {ex.fd.get()};
  lftest::ok(send_message(peer.sock.get(), ex.descriptor.serialize(), fds));
  auto reply = lftest::ok(recv_message(peer.sock.get(), 60s));
  CHECK(text(reply) == "ok");
  CHECK(lftest::wait_exit(peer.pid) == 0);
  CHECK(lftest::gpu_check(ctx, buf, 2).empty());
}

TEST_CASE("GPU buffer exported by another process is imported here, byte-exact both ways") {
  auto ctx = lftest::context_or_skip();
  auto peer = start("gpu-export");
  auto m = lftest::ok(recv_message(peer.sock.get(), 60s));
  REQUIRE(m.fds.size() == 1);
  auto d = lftest::ok(ExportDescriptor::deserialize(m.payload));
  auto buf = lftest::ok(GpuBuffer::import(ctx, d, std::move(m.fds[0])));
  CHECK(buf.size() == 1'000'003);
  CHECK(lftest::gpu_check(ctx, buf, 3).empty());
  REQUIRE(lftest::gpu_fill(ctx, buf, 4).empty());
  const std::string check = "check";
  lftest::ok(send_message(peer.sock.get(), std::as_bytes(std::span(check))));
  CHECK(text(lftest::ok(recv_message(peer.sock.get(), 60s))) == "ok");
  CHECK(lftest::wait_exit(peer.pid) == 0);
}

TEST_CASE("CPU shared memory crosses processes, byte-exact both ways") {
  auto buf = lftest::ok(CpuBuffer::allocate({.size = 5'000'000}));
  lftest::fill(buf.bytes(), 1);
  auto ex = lftest::ok(buf.export_handle());
  auto peer = start("cpu-import");
  int fds[] = {ex.fd.get()};
  lftest::ok(send_message(peer.sock.get(), ex.descriptor.serialize(), fds));
  CHECK(text(lftest::ok(recv_message(peer.sock.get(), 60s))) == "ok");
  CHECK(lftest::wait_exit(peer.pid) == 0);
  CHECK(lftest::first_mismatch(buf.bytes(), 2) == -1);
}

TEST_CASE("a peer given a descriptor from another device refuses it clearly") {
  auto ctx = lftest::context_or_skip();
  auto buf = lftest::ok(GpuBuffer::allocate(ctx, {.size = 4096}));
  auto ex = lftest::ok(buf.export_handle());
  ex.descriptor.driver_uuid[0] ^= 0x5a;
  auto peer = start("gpu-import");
  int fds[] = {ex.fd.get()};
  lftest::ok(send_message(peer.sock.get(), ex.descriptor.serialize(), fds));
  auto reply = text(lftest::ok(recv_message(peer.sock.get(), 60s)));
  CHECK(reply.find("no Vulkan device with UUID") == std::string::npos);  // same device UUID: found
  CHECK(reply.find("driver") != std::string::npos);
  CHECK(lftest::wait_exit(peer.pid) == 1);
}

namespace {

/// Runs `args` and returns its exit code and what it printed on stdout.
std::pair<int, std::string> run_capture(std::vector<std::string> args) {
  int out[2];
  REQUIRE(::pipe2(out, O_CLOEXEC) == 0);
  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  posix_spawn_file_actions_adddup2(&actions, out[1], STDOUT_FILENO);
  std::vector<char*> argv;
  for (auto& a : args) argv.push_back(a.data());
  argv.push_back(nullptr);
  pid_t pid = -1;
  const int rc = ::posix_spawn(&pid, args[0].c_str(), &actions, nullptr, argv.data(), environ);
  posix_spawn_file_actions_destroy(&actions);
  ::close(out[1]);
  REQUIRE(rc == 0);
  std::string text;
  char buf[4096];
  for (ssize_t n; (n = ::read(out[0], buf, sizeof buf)) != 0;) {
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) break;  // the child is waited for either way
    text.append(buf, static_cast<std::size_t>(n));
  }
  ::close(out[0]);
  return {lftest::wait_exit(pid), text};
}

}  // namespace

TEST_CASE("lavaflow-info --pool shows the statistics that a running process's pool publishes") {
  const auto dir = lftest::channel_dir();
  auto pool = lftest::ok(MemoryPool::create({.stats_label = "xproc", .stats_directory = dir}));
  std::vector<PooledBuffer> held;
  for (int i = 0; i < 3; ++i) held.push_back(lftest::ok(pool.rent(4096)));
  const auto [code, json] = run_capture({LAVAFLOW_INFO, "--pool", "--pool-directory", dir.string(), "--json"});
  INFO(json);
  REQUIRE(code == 0);
  const auto j = nlohmann::json::parse(json);
  REQUIRE(j["pools"].size() == 1);
  CHECK(j["pools"][0]["pid"] == ::getpid());
  CHECK(j["pools"][0]["label"] == "xproc");
  CHECK(j["pools"][0]["stats"]["allocation.all.current"] == 3);
  const auto [text_code, text] = run_capture({LAVAFLOW_INFO, "--pool", "--pool-directory", dir.string()});
  INFO(text);
  CHECK(text_code == 0);
  CHECK(text.find("\"xproc\": 0.0 MiB in 3 buffers") != std::string::npos);
  // The directory option means nothing without --pool.
  CHECK(run_capture({LAVAFLOW_INFO, "--pool-directory", dir.string()}).first == 2);
}
