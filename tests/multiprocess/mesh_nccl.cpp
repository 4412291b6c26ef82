// SPDX-License-Identifier: MIT
// The mesh's NCCL backend in a job started by lavaflow-launch (rank r on CUDA device r): a group on
// Backend::Nccl opened through the job's native group, every op × element type × reduce op on
// device memory, in place and out of place, send/recv and barrier, checked against the reference
// on every rank; arguments NCCL would fault on are refused.
//   lavaflow-launch -n N mesh_nccl        every rank prints "mesh-nccl rank R: OK"
//   lavaflow-launch -n N mesh_nccl late   the last rank skips a call: the others' calls end with
//                                         Timeout naming the group, and later calls fail at once
//   lavaflow-launch -n N mesh_nccl late-nonblocking   the same with NcclOptions::nonblocking
// Exit 77 (a visible skip) with fewer CUDA devices than ranks (NCCL takes one device per rank).
#include <cuda_runtime_api.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <string>
#include <thread>

#include "device_bytes.hpp"
#include "lavaflow/core/detail/format.hpp"
#include "lavaflow/mesh/launch.hpp"
#include "lavaflow/mesh_nccl/nccl.hpp"
#include "mesh_reference.hpp"
#include "rank_checks.hpp"

using namespace lavaflow;
using namespace lavaflow::mesh;
using namespace lftest::mesh_ref;
using lftest::DeviceBytes;

namespace {

lftest::RankChecks checks{"mesh-nccl"};
void expect(bool ok, const std::string& what) { checks.expect(ok, what); }

/// "" when the call succeeded and `b` holds `want`; else the call's error or how `b` differs.
std::string outcome(const Status& s, const DeviceBytes& b, const std::vector<std::byte>& want) {
  if (!s) return ": " + s.error().message();
  const auto got = b.read();
  if (got == want) return "";
  std::size_t first = 0;
  while (first < std::min(got.size(), want.size()) && got[first] == want[first]) ++first;
  return str_format(": {} bytes, the first difference at byte {}", got.size(), first);
}

void every_op(Communicator& c) {
  const std::uint32_t n = c.size(), r = c.rank();
  for (DType t : kTypes)
    for (ReduceOp op : kOps)
      for (std::size_t count : {std::size_t{3}, std::size_t{40'001}}) {
        const std::string what = str_format("{} {} × {}", to_string(t), to_string(op), count);
        const auto mine = encode(inputs(r, count, t), t);
        const auto want = expected(n, count, t, op);
        DeviceBytes send(mine.size(), mine), recv(mine.size());
        std::string d = outcome(c.all_reduce(send.span(), recv.span(), t, op).wait(), recv, want);
        expect(d.empty(), "all_reduce " + what + d);
        d = outcome(c.all_reduce(send.span(), send.span(), t, op).wait(), send, want);
        expect(d.empty(), "in-place all_reduce " + what + d);

        // reduce_scatter: every rank sends n blocks of `count`, receives its block of the result.
        const auto all = encode(inputs(r, count * n, t), t);
        const auto sums = expected(n, count * n, t, op);
        const std::size_t block = count * size_of(t);
        DeviceBytes big(all.size(), all), mine_block(block);
        const std::vector<std::byte> want_block(sums.begin() + static_cast<std::ptrdiff_t>(r * block),
                                                sums.begin() + static_cast<std::ptrdiff_t>((r + 1) * block));
        d = outcome(c.reduce_scatter(big.span(), mine_block.span(), t, op).wait(), mine_block, want_block);
        expect(d.empty(), "reduce_scatter " + what + d);
        // In place: recv is this rank's block of send.
        const Status in_place = c.reduce_scatter(big.span(), big.span().subspan(r * block, block), t, op).wait();
        const auto after = big.read();
        expect(in_place && std::equal(want_block.begin(), want_block.end(),
                                      after.begin() + static_cast<std::ptrdiff_t>(r * block)),
               "in-place reduce_scatter " + what + (in_place ? "" : ": " + in_place.error().message()));
      }
  for (std::size_t count : {std::size_t{1}, std::size_t{100'003}}) {
    const auto mine = encode(inputs(r, count, DType::U8), DType::U8);
    const auto want = gathered(n, count, DType::U8);
    DeviceBytes send(count, mine), all(want.size());
    std::string d = outcome(c.all_gather(send.span(), all.span(), DType::U8).wait(), all, want);
    expect(d.empty(), str_format("all_gather of {} bytes{}", count, d));
    // In place: send is this rank's block of recv.
    std::vector<std::byte> only_mine(want.size());
    std::copy(mine.begin(), mine.end(), only_mine.begin() + static_cast<std::ptrdiff_t>(r * count));
    DeviceBytes in_place(want.size(), only_mine);
    d = outcome(c.all_gather(in_place.span().subspan(r * count, count), in_place.span(), DType::U8).wait(), in_place,
                want);
    expect(d.empty(), str_format("in-place all_gather of {} bytes{}", count, d));
    const std::uint32_t root = n - 1;
    const auto root_data = encode(inputs(root, count, DType::U8), DType::U8);
    DeviceBytes buf(count, r == root ? root_data : std::vector<std::byte>(count));
    d = outcome(c.broadcast(buf.span(), root, DType::U8).wait(), buf, root_data);
    expect(d.empty(), str_format("broadcast of {} bytes from rank {}{}", count, root, d));
  }
  // A ring of sends: each rank sends its data to the next and receives the previous one's.
  const std::size_t bytes = 65'537;
  const auto mine = encode(inputs(r, bytes, DType::U8), DType::U8);
  DeviceBytes out(bytes, mine), in(bytes);
  const std::uint32_t next = (r + 1) % n, prev = (r + n - 1) % n;
  Work sent = c.send(out.span(), next), got = c.recv(in.span(), prev);
  const Status s = sent.wait();
  const std::string d = outcome(got.wait(), in, encode(inputs(prev, bytes, DType::U8), DType::U8));
  expect(s && d.empty(), str_format("send to {} and recv from {}{}", next, prev, s ? d : ": " + s.error().message()));
  expect(static_cast<bool>(c.barrier().wait()), "barrier");
}

void refused(Communicator& c, int device, int devices) {
  DeviceBytes dev(64);
  std::vector<std::byte> host(64);
  auto is_refused = [](Work w, const char* what) {
    const Status s = w.wait();
    expect(!s && s.error().code() == Errc::InvalidArgument,
           str_format("{} refused{}", what, s ? " (it succeeded)" : ": " + s.error().message()));
  };
  is_refused(c.all_reduce(host, dev.span(), DType::F32, ReduceOp::Sum), "host memory");
  // Far past any rounding of the allocation's size.
  const std::size_t past = std::size_t{8} << 20;
  DeviceBytes small(4 << 20), wide(past);
  is_refused(c.all_reduce(std::span<const std::byte>(small.p, past), wide.span(), DType::F32, ReduceOp::Sum),
             "a span past its allocation");
  DeviceBytes four(4 * 64);
  is_refused(c.all_reduce(std::span<const std::byte>(four.p, 64), std::span<std::byte>(four.p + 32, 64), DType::F32,
                          ReduceOp::Sum),
             "overlapping send and recv");
  is_refused(c.all_gather(std::span<const std::byte>(four.p + 64 * ((c.rank() + 1) % c.size()), 64),
                          std::span<std::byte>(four.p, 64 * c.size()), DType::F32),
             "an all_gather send inside recv but not at this rank's block");
  {
    // Another device's memory (every rank sees every device).
    (void)cudaSetDevice((device + 1) % devices);
    DeviceBytes elsewhere(64);
    (void)cudaSetDevice(device);
    const Status s = c.all_reduce(elsewhere.span(), elsewhere.span(), DType::F32, ReduceOp::Sum).wait();
    expect(!s && s.error().code() == Errc::DeviceMismatch,
           str_format("another device's memory refused{}", s ? " (it succeeded)" : ": " + s.error().message()));
  }
  is_refused(c.all_reduce(dev.span().first(6), dev.span().first(6), DType::F32, ReduceOp::Sum), "a partial element");
  is_refused(c.all_reduce(dev.span(), dev.span().first(32), DType::F32, ReduceOp::Sum), "spans of different lengths");
  is_refused(c.broadcast(dev.span(), c.size(), DType::F32), "a root outside the group");
  is_refused(c.send(dev.span(), (c.rank() + 1) % c.size(), 5), "a tag NCCL cannot carry");
  is_refused(c.send(dev.span(), c.size()), "a peer outside the group");
  // Nothing of the above reached NCCL: the communicator still works.
  expect(static_cast<bool>(c.barrier().wait()), "a barrier after the refused calls");
}

}  // namespace

int main(int argc, char** argv) {
  const std::string mode = argc > 1 ? argv[1] : "all";
  auto job = launched_job();
  if (!job) {
    std::printf("mesh-nccl: FAILED: %s\n", job.error().message().c_str());
    return 1;
  }
  const std::uint32_t me = checks.rank = job->rank;
  int devices = 0;
  if (cudaGetDeviceCount(&devices) != cudaSuccess || devices < static_cast<int>(job->size)) {
    std::printf("LAVAFLOW-SKIP: mesh-nccl rank %u: SKIP: %d CUDA device(s) for %u ranks (NCCL takes one each)\n", me,
                devices, job->size);
    return 77;
  }
  const int device = static_cast<int>(me);
  (void)cudaSetDevice(device);
  auto mesh = mesh_from_launch(*job);
  std::vector<std::uint32_t> everyone(job->size);
  for (std::uint32_t r = 0; r < job->size; ++r) everyone[r] = r;
  Status grouped = mesh ? mesh->add_group({"gpus", everyone, Backend::Nccl}) : Status(std::unexpected(mesh.error()));
  const bool nonblocking = mode == "late-nonblocking";
  const auto open =
      nccl_communicators(launched_communicators(*job), Backend::Native, {.device = device, .nonblocking = nonblocking});
  auto c = grouped ? mesh->communicator("gpus", open) : std::unexpected(grouped.error());
  if (!c) {
    std::printf("mesh-nccl rank %u: FAILED: open: %s\n", me, c.error().message().c_str());
    return 1;
  }
  expect((*c)->backend() == "nccl" && (*c)->rank() == me && (*c)->size() == job->size, "the group's shape");

  if (mode == "late" || mode == "late-nonblocking") {
    DeviceBytes buf(64);
    const CallOptions quick{.timeout = std::chrono::seconds(3)};
    expect(static_cast<bool>((*c)->all_reduce(buf.span(), buf.span(), DType::F32, ReduceOp::Sum, quick).wait()),
           "the call before");
    if (me == job->size - 1) {
      std::this_thread::sleep_for(std::chrono::seconds(6));
      std::fflush(stdout);
      _exit(checks.failures ? 1 : 0);  // its communicator waits for a call the others aborted
    }
    // Two calls in flight without the last rank; the later one has the shorter timeout, and its
    // abort must fail the earlier one too (its kernel ends early, not done).
    DeviceBytes other(64);
    const auto t0 = Clock::now();
    Work first = (*c)->all_reduce(buf.span(), buf.span(), DType::F32, ReduceOp::Sum, {std::chrono::seconds(20)});
    const Status s = (*c)->all_reduce(other.span(), other.span(), DType::F32, ReduceOp::Sum, quick).wait();
    expect(!s && s.error().code() == Errc::Timeout && s.error().message().find("'gpus'") != std::string::npos,
           s ? "the call without the last rank succeeded" : "not a timeout naming the group: " + s.error().message());
    expect(Clock::now() - t0 < std::chrono::seconds(5), "the failure came within the call's timeout");
    const Status earlier = first.wait(std::chrono::seconds(2));
    expect(!earlier && earlier.error().code() == Errc::Timeout,
           earlier ? "the earlier call in flight succeeded after the abort" : "earlier: " + earlier.error().message());
    const auto t1 = Clock::now();
    const Status after = (*c)->barrier(quick).wait();
    expect(!after && Clock::now() - t1 < std::chrono::milliseconds(100), "a call after the abort fails at once");
    if (!checks.failures) std::printf("mesh-nccl rank %u: %s OK (%s)\n", me, mode.c_str(), s.error().message().c_str());
    std::fflush(stdout);
    _exit(checks.failures ? 1 : 0);
  }

  every_op(**c);
  refused(**c, device, devices);
  if (!checks.failures)
    std::printf("mesh-nccl rank %u: OK (%u ranks, device %d of %d)\n", me, job->size, device, devices);
  return checks.failures ? 1 : 0;
}
