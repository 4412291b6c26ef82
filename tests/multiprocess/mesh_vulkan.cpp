// SPDX-License-Identifier: MIT
// Vulkan collectives in a job started by lavaflow-launch: every op × element type × reduce op on
// GpuBuffers of the first Vulkan device (lavapipe here), through the shared segment with the
// reduction in the compute shader, and staged through the host communicator; results checked
// against the reference on every rank.
//   lavaflow-launch -n N mesh_vulkan            every rank prints "mesh-vulkan rank R: OK"
//   lavaflow-launch -n N mesh_vulkan mismatch   rank 0 calls another op: every rank gets
//                                               InvalidArgument naming both calls
//   lavaflow-launch -n N mesh_vulkan exit       the last rank exits after one call: the others
//                                               get PeerLost naming it
//   lavaflow-launch -n N mesh_vulkan late       the last rank never calls: the others get Timeout
//                                               naming it within the call's timeout
//   lavaflow-launch -n N mesh_vulkan squat      rank 0's socket name is taken before open: device
//                                               memory, asked for, fails naming it; Auto falls
//                                               back to host memory on every rank and works
//   lavaflow-launch -n N mesh_vulkan stranger   a thread of rank 0 and a process of another pid
//                                               (neither a rank that needs the fd) connect to the
//                                               socket again and again during open and keep the
//                                               connections: they get nothing, every rank attaches
// Exit 77 when no device can import host memory (the test is then a visible skip).
#include <fcntl.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <cstdio>
#include <string>
#include <thread>
#include <vector>

#include "lavaflow/core/detail/format.hpp"
#include "lavaflow/core/transfer.hpp"
#include "lavaflow/core/unix_socket.hpp"
#include "lavaflow/mesh/launch.hpp"
#include "lavaflow/mesh/native.hpp"
#include "lavaflow/mesh/vulkan.hpp"
#include "mesh_reference.hpp"
#include "rank_checks.hpp"

using namespace lavaflow;
using namespace lavaflow::mesh;
using namespace lftest::mesh_ref;

namespace {

lftest::RankChecks checks{"mesh-vulkan"};
void expect(bool ok, const std::string& what) { checks.expect(ok, what); }

Result<GpuBuffer> buffer_with(const VulkanContext& ctx, const std::vector<std::byte>& bytes, std::uint64_t size = 0) {
  LF_TRY(auto b, GpuBuffer::allocate(ctx, {.size = std::max<std::uint64_t>({size, bytes.size(), 1})}));
  if (!bytes.empty()) LF_TRY_STATUS(upload(ctx, b, bytes));
  return b;
}

std::vector<std::byte> read(const VulkanContext& ctx, const GpuBuffer& b, std::size_t n) {
  std::vector<std::byte> out(n);
  if (n) expect(download(ctx, b, out).has_value(), "download");
  return out;
}

void every_op(const VulkanContext& ctx, VulkanCollectives& vc, const char* how) {
  const std::uint32_t n = vc.size(), r = vc.rank();
  for (DType t : kTypes)
    for (ReduceOp op : kOps)
      for (std::size_t count : {std::size_t{3}, std::size_t{40'001}}) {
        const std::string what = str_format("{} {} {} × {}", how, to_string(t), to_string(op), count);
        const auto mine = encode(inputs(r, count, t), t);
        auto send = buffer_with(ctx, mine);
        auto recv = buffer_with(ctx, {}, mine.size());
        if (!send || !recv) return expect(false, "allocate");
        auto s = vc.all_reduce(device_span(*send, mine.size()), device_span(*recv, mine.size()), t, op);
        expect(s && read(ctx, *recv, mine.size()) == expected(n, count, t, op),
               "all_reduce " + what + (s ? "" : ": " + s.error().message()));
        // In place.
        s = vc.all_reduce(device_span(*send, mine.size()), device_span(*send, mine.size()), t, op);
        expect(s && read(ctx, *send, mine.size()) == expected(n, count, t, op), "in-place all_reduce " + what);

        const auto big = encode(inputs(r, count * n, t), t);
        const auto want = expected(n, count * n, t, op);
        auto bsend = buffer_with(ctx, big);
        if (!bsend) return expect(false, "allocate");
        s = vc.reduce_scatter(device_span(*bsend, big.size()), device_span(*recv, mine.size()), t, op);
        const auto block = read(ctx, *recv, mine.size());
        expect(
            s && std::equal(block.begin(), block.end(), want.begin() + static_cast<std::ptrdiff_t>(r * block.size())),
            "reduce_scatter " + what + (s ? "" : ": " + s.error().message()));
      }
  for (std::size_t count : {std::size_t{1}, std::size_t{5000}, std::size_t{300'001}}) {
    const auto mine = encode(inputs(r, count, DType::U8), DType::U8);
    const auto want = gathered(n, count, DType::U8);
    auto send = buffer_with(ctx, mine);
    auto all = buffer_with(ctx, {}, want.size());
    if (!send || !all) return expect(false, "allocate");
    auto s = vc.all_gather(device_span(*send, mine.size()), device_span(*all, want.size()), DType::U8);
    expect(s && read(ctx, *all, want.size()) == want, str_format("{} all_gather of {} bytes", how, count));
    const auto root_data = encode(inputs(n - 1, count, DType::U8), DType::U8);
    auto buf = buffer_with(ctx, r == n - 1 ? root_data : std::vector<std::byte>(count));
    if (!buf) return expect(false, "allocate");
    s = vc.broadcast(device_span(*buf, count), n - 1, DType::U8);
    expect(s && read(ctx, *buf, count) == root_data, str_format("{} broadcast of {} bytes", how, count));
  }
  // NaN, signed zeros and ties: bit for bit what the host reduction gives.
  for (ReduceOp op : {ReduceOp::Sum, ReduceOp::Min, ReduceOp::Max}) {
    const bool nan = op != ReduceOp::Sum;
    const auto v = special_inputs(r, nan);
    const auto bytes = std::as_bytes(std::span(v));
    auto send = buffer_with(ctx, {bytes.begin(), bytes.end()});
    if (!send) return expect(false, "allocate");
    const auto s = vc.all_reduce(device_span(*send, bytes.size()), device_span(*send, bytes.size()), DType::F32, op);
    expect(s && read(ctx, *send, bytes.size()) == special_expected(n, op, nan),
           str_format("{} all_reduce of NaN, ±0 and ties, {}", how, to_string(op)));
  }
  // Bad arguments are refused on the calling rank before any exchange.
  auto a = buffer_with(ctx, {}, 64);
  if (!a) return expect(false, "allocate");
  const auto bad = vc.all_reduce(device_span(*a, 64), device_span(*a, 60), DType::F32, ReduceOp::Sum);
  expect(!bad && bad.error().code() == Errc::InvalidArgument, "send and recv of different sizes refused");
  const auto odd = vc.all_gather(device_span(*a, 6), device_span(*a, 6 * n), DType::F32);
  expect(!odd && odd.error().code() == Errc::InvalidArgument, "a partial element refused");
}

}  // namespace

int main(int argc, char** argv) {
  const std::string mode = argc > 1 ? argv[1] : "all";
  auto job = launched_job();
  if (!job) {
    std::printf("mesh-vulkan: FAILED: %s\n", job.error().message().c_str());
    return 1;
  }
  const std::uint32_t me = checks.rank = job->rank;
  // In mode stranger, rank 0 forks (before it has threads) a process of another pid that connects
  // to its socket again and again and keeps the connections; it writes to a pipe if it ever gets
  // an answer, and ends with rank 0.
  UniqueFd told;
  pid_t stranger_pid = -1;
  if (mode == "stranger" && me == 0) {
    int fds[2];
    if (::pipe2(fds, O_CLOEXEC | O_NONBLOCK) != 0) return 1;
    told = UniqueFd(fds[0]);
    const pid_t parent = ::getpid();
    const std::string name = str_format("lavaflow-vkc-{:016x}-{}", name_hash(job->key + "-vk-" + mode), parent);
    stranger_pid = ::fork();
    if (stranger_pid == 0) {
      std::vector<UniqueFd> held;
      while (::getppid() == parent) {
        auto c = connect_abstract(name, std::chrono::milliseconds(5));
        if (!c) {
          std::this_thread::sleep_for(std::chrono::microseconds(200));
          continue;
        }
        if (recv_message(c->get(), std::chrono::milliseconds(1)).has_value()) (void)!::write(fds[1], "x", 1);
        if (held.size() < 64) held.push_back(std::move(*c));  // connections that never speak
      }
      _exit(0);
    }
    ::close(fds[1]);
  }
  auto ctx = VulkanContext::create();
  if (!ctx) {
    std::printf("LAVAFLOW-SKIP: mesh-vulkan rank %u: SKIP: %s\n", me, ctx.error().message().c_str());
    return 77;
  }
  if (!ctx->capabilities().memory_host_import) {
    std::printf("LAVAFLOW-SKIP: mesh-vulkan rank %u: SKIP: %s cannot import host memory\n", me,
                ctx->capabilities().identity.name.c_str());
    return 77;
  }
  auto mesh = mesh_from_launch(*job);
  auto host = mesh ? mesh->communicator("world", launched_communicators(*job)) : std::unexpected(mesh.error());
  if (!host) {
    std::printf("mesh-vulkan rank %u: FAILED: %s\n", me, host.error().message().c_str());
    return 1;
  }
  Communicator& comm = **host;
  const std::uint32_t n = comm.size();
  const auto& caps = ctx->capabilities();
  const bool shares_fds = caps.memory_fd_export && caps.memory_fd_import;
  if (mode == "squat" || mode == "stranger") {
    if (!shares_fds) {
      std::printf("LAVAFLOW-SKIP: mesh-vulkan rank %u: SKIP: %s cannot share memory fds\n", me,
                  caps.identity.name.c_str());
      return 77;
    }
    // Every rank learns rank 0's pid, which names its socket.
    const std::int32_t pid = ::getpid();
    std::vector<std::int32_t> pids(n);
    if (!comm.all_gather(std::as_bytes(std::span(&pid, 1)), std::as_writable_bytes(std::span(pids)), DType::I32).wait())
      return 1;
    const std::string key = job->key + "-vk-" + mode;
    const std::string name = str_format("lavaflow-vkc-{:016x}-{}", name_hash(key), pids[0]);
    const std::vector<std::byte> data = encode(inputs(me, 1000, DType::F32), DType::F32);
    auto works = [&](VulkanCollectives& c, const char* what) {
      auto b = buffer_with(*ctx, data);
      if (!b) return expect(false, "allocate");
      const auto s = c.all_reduce(device_span(*b), device_span(*b), DType::F32, ReduceOp::Sum);
      expect(s && read(*ctx, *b, data.size()) == expected(n, 1000, DType::F32, ReduceOp::Sum),
             str_format("all_reduce over {}", what));
    };
    if (mode == "squat") {
      Result<UniqueFd> squatter = me == 0 ? listen_abstract(name, 1) : Result<UniqueFd>(UniqueFd());
      expect(squatter.has_value(), "the squatter binds the name first");
      auto asked = VulkanCollectives::open(*ctx, comm, {.key = key, .segment = VulkanSegment::DeviceMemory});
      expect(
          !asked && asked.error().message().find(me == 0 ? "@" + name : "rank 0") != std::string::npos,
          asked ? "device memory with its name taken succeeded" : "not naming the cause: " + asked.error().message());
      auto fell = VulkanCollectives::open(*ctx, comm, {.key = key});
      expect(fell && (*fell)->segment() == VulkanSegment::HostMemory &&
                 (*fell)->segment_reason().find("host memory instead") != std::string::npos,
             fell ? "Auto did not fall back: " + (*fell)->segment_reason() : "open: " + fell.error().message());
      if (fell) works(**fell, "the fallback's host memory");
    } else {
      std::atomic<bool> done{false};
      std::atomic<int> answered{0}, tries{0};
      std::thread stranger;
      if (me == 0)
        stranger = std::thread([&] {
          std::vector<UniqueFd> held;
          while (!done) {
            ++tries;
            auto c = connect_abstract(name, std::chrono::milliseconds(5));
            if (!c) continue;
            if (recv_message(c->get(), std::chrono::milliseconds(1)).has_value()) ++answered;
            if (held.size() < 64) held.push_back(std::move(*c));  // connections that never speak
          }
        });
      auto vc = VulkanCollectives::open(*ctx, comm, {.key = key, .segment = VulkanSegment::DeviceMemory});
      done = true;
      if (stranger.joinable()) stranger.join();
      expect(vc.has_value(), vc ? "" : "open beside a stranger: " + vc.error().message());
      expect(answered == 0, "the stranger thread got an answer");
      if (stranger_pid > 0) {
        ::kill(stranger_pid, SIGKILL);
        ::waitpid(stranger_pid, nullptr, 0);
        char byte = 0;
        expect(::read(told.get(), &byte, 1) <= 0, "the stranger process got an answer");
      }
      if (vc) works(**vc, "device memory opened beside a stranger");
    }
    if (!checks.failures) std::printf("mesh-vulkan rank %u: %s OK (%u ranks)\n", me, mode.c_str(), n);
    return checks.failures ? 1 : 0;
  }
  auto vc = VulkanCollectives::open(*ctx, comm, {.key = job->key + "-vk", .chunk_bytes = 256 << 10});
  if (!vc) {
    std::printf("mesh-vulkan rank %u: FAILED: open: %s\n", me, vc.error().message().c_str());
    return 1;
  }
  expect((*vc)->shared_segment(), "ranks of one host share the segment");
  expect((*vc)->segment() == (shares_fds ? VulkanSegment::DeviceMemory : VulkanSegment::HostMemory),
         "ranks on one device share its memory where it can export: " + (*vc)->segment_reason());
  auto buf = buffer_with(*ctx, encode(inputs(me, 16, DType::F32), DType::F32));
  if (!buf) return 1;
  const auto span = device_span(*buf, 64);
  const CallOptions quick{.timeout = std::chrono::seconds(5)};

  if (mode == "mismatch") {
    const auto s = me == 0 ? (*vc)->broadcast(span, 0, DType::F32, quick)
                           : (*vc)->all_reduce(span, span, DType::F32, ReduceOp::Sum, quick);
    expect(!s && s.error().code() == Errc::InvalidArgument &&
               s.error().message().find("broadcast") != std::string::npos &&
               s.error().message().find("all_reduce") != std::string::npos,
           s ? "mismatched calls succeeded" : "not InvalidArgument naming both calls: " + s.error().message());
    const auto after = (*vc)->all_reduce(span, span, DType::F32, ReduceOp::Sum, quick);
    expect(!after, "a call after a failure fails at once");
    if (!checks.failures) std::printf("mesh-vulkan rank %u: mismatch OK (%s)\n", me, s.error().message().c_str());
    return checks.failures ? 1 : 0;
  }
  if (mode == "exit" || mode == "late") {
    expect((*vc)->all_reduce(span, span, DType::F32, ReduceOp::Sum, quick).has_value(), "the call before");
    if (me == n - 1) {
      if (mode == "exit") _exit(3);
      std::this_thread::sleep_for(std::chrono::seconds(8));  // outlives the others' calls
      return 0;
    }
    const auto t0 = Clock::now();
    const auto s = (*vc)->all_reduce(span, span, DType::F32, ReduceOp::Sum, quick);
    const Errc want = mode == "exit" ? Errc::PeerLost : Errc::Timeout;
    expect(
        !s && s.error().code() == want && s.error().message().find(str_format("rank {}", n - 1)) != std::string::npos,
        s ? "the call without the last rank succeeded" : "not the named failure: " + s.error().message());
    expect(Clock::now() - t0 < std::chrono::seconds(7), "the failure came within the call's timeout");
    if (!checks.failures)
      std::printf("mesh-vulkan rank %u: %s OK (%s)\n", me, mode.c_str(), s.error().message().c_str());
    return checks.failures ? 1 : 0;
  }

  every_op(*ctx, **vc, (*vc)->segment() == VulkanSegment::DeviceMemory ? "device memory" : "host memory");
  if ((*vc)->segment() == VulkanSegment::DeviceMemory) {
    auto hosted = VulkanCollectives::open(
        *ctx, comm, {.key = job->key + "-vk-host", .chunk_bytes = 128 << 10, .segment = VulkanSegment::HostMemory});
    expect(hosted && (*hosted)->segment() == VulkanSegment::HostMemory, "host memory when asked for");
    if (hosted) every_op(*ctx, **hosted, "host memory");
  }
  auto refused = VulkanCollectives::open(
      *ctx, comm,
      {.key = job->key + "-vk-refused", .stage_through_host = true, .segment = VulkanSegment::DeviceMemory});
  expect(!refused && refused.error().code() == Errc::InvalidArgument, "device memory while staging is refused");
  auto staged = VulkanCollectives::open(
      *ctx, comm, {.key = job->key + "-vk-staged", .chunk_bytes = 64 << 10, .stage_through_host = true});
  expect(staged.has_value(), staged ? "" : "open staged: " + staged.error().message());
  if (staged) {
    expect(!(*staged)->shared_segment(), "staging when asked to");
    every_op(*ctx, **staged, "staged");
  }
  if (!checks.failures)
    std::printf("mesh-vulkan rank %u: OK (%u ranks on %s)\n", me, n, ctx->capabilities().identity.name.c_str());
  return checks.failures ? 1 : 0;
}
