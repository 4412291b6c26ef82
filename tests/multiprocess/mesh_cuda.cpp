// SPDX-License-Identifier: MIT
// CUDA collectives in a job started by lavaflow-launch (rank r on CUDA device r mod the device
// count): every op × element type × reduce op as kernels over the peers' mapped staging, one-shot
// and two-shot, in place, captured in a CUDA graph and replayed; results checked against the
// reference on every rank; outputs in registered windows, which the peers write in place.
//   lavaflow-launch -n N mesh_cuda            every rank prints "mesh-cuda rank R: OK"
//   lavaflow-launch -n N mesh_cuda mismatch   rank 0 calls another op: every rank's check()
//                                             reports InvalidArgument naming a peer
//   lavaflow-launch -n N mesh_cuda exit       the last rank exits after one call: the others'
//                                             kernels stop at the call's timeout naming it
//   lavaflow-launch -n N mesh_cuda late       the last rank never calls: the same
//   lavaflow-launch -n N mesh_cuda staged     every call staged through pinned host memory and the
//                                             native host collective, as across hosts
//   lavaflow-launch -n N mesh_cuda staged-late  "late" on the staged path
//   lavaflow-launch -n N mesh_cuda staged-mismatch  "mismatch" on it, and calls of other lengths
//   lavaflow-launch -n 4 mesh_cuda hosts      "all" on two simulated hosts (ranks 0-1 and 2-3):
//                                             hierarchical, in-host phases as kernels
//   lavaflow-launch -n 4 mesh_cuda hosts-mixed  the same with hosts {0, 3} and {1, 2}
//   lavaflow-launch -n 4 mesh_cuda hosts-strided  the same with hosts {0, 2} and {1, 3}
//   lavaflow-launch -n 3 mesh_cuda hosts      hosts {0, 1} and {2}: unequal, staged whole
//   lavaflow-launch -n 4 mesh_cuda hosts-late   "late" on two simulated hosts
//   lavaflow-launch -n 4 mesh_cuda hosts-exit   "exit" on two simulated hosts
//   lavaflow-launch -n 4 mesh_cuda hosts-hang   "late" with the last rank away for 30 s and calls of
//                                             a second's timeout: the boundaries' waits end them
//   lavaflow-launch -n 4 mesh_cuda hosts-mismatch  the hosts make calls of different types
// Exit 77 (a visible skip) without a CUDA device.
#include <cuda_runtime_api.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <deque>
#include <memory>
#include <string>
#include <string_view>
#include <thread>

#include "device_bytes.hpp"
#include "lavaflow/core/detail/format.hpp"
#include "lavaflow/mesh/launch.hpp"
#include "lavaflow/mesh_cuda/cuda_collectives.hpp"
#include "mesh_reference.hpp"
#include "rank_checks.hpp"

using namespace lavaflow;
using namespace lavaflow::mesh;
using namespace lftest::mesh_ref;
using lftest::DeviceBytes;

namespace {

lftest::RankChecks checks{"mesh-cuda"};
void expect(bool ok, const std::string& what) { checks.expect(ok, what); }

/// "" when equal, else where and how much `got` differs from `want`.
std::string difference(const std::vector<std::byte>& got, const std::vector<std::byte>& want) {
  if (got == want) return "";
  std::size_t first = got.size(), differ = 0;
  for (std::size_t i = 0; i < std::min(got.size(), want.size()); ++i)
    if (got[i] != want[i] && differ++ == 0) first = i;
  return str_format(": {} of {} bytes differ, the first at {} (got {}, want {})", differ, want.size(), first,
                    first < got.size() ? static_cast<int>(got[first]) : -1,
                    first < want.size() ? static_cast<int>(want[first]) : -1);
}

/// "" when the call succeeded and `b` holds `want`; else the call's error or where `b` differs.
std::string outcome(const Status& s, const DeviceBytes& b, const std::vector<std::byte>& want) {
  return s ? difference(b.read(want.size()), want) : ": " + s.error().message();
}

/// Waits for the stream and reports the collectives' state.
Status finish(CudaCollectives& c, cudaStream_t s) {
  if (cudaStreamSynchronize(s) != cudaSuccess) return fail(Errc::Driver, "cudaStreamSynchronize", "stream failed");
  return c.check();
}

/// all_gather of `count` bytes a rank, then a broadcast of as many from `root`, each checked.
void gather_and_broadcast(CudaCollectives& c, cudaStream_t st, std::size_t count, std::uint32_t root) {
  const std::uint32_t n = c.size(), r = c.rank();
  const auto mine = encode(inputs(r, count, DType::U8), DType::U8);
  const auto want = gathered(n, count, DType::U8);
  DeviceBytes send(count, mine), all(want.size());
  auto s = c.all_gather(send.p, all.p, count, DType::U8, st);
  if (s) s = finish(c, st);
  const std::string got = outcome(s, all, want);
  expect(got.empty(), str_format("all_gather of {} bytes{}", count, got));
  const auto root_data = encode(inputs(root, count, DType::U8), DType::U8);
  DeviceBytes buf(count, r == root ? root_data : std::vector<std::byte>(count));
  s = c.broadcast(buf.p, count, root, DType::U8, st);
  if (s) s = finish(c, st);
  const std::string broadcast = outcome(s, buf, root_data);
  expect(broadcast.empty(), str_format("broadcast of {} bytes{}", count, broadcast));
}

void every_op(CudaCollectives& c, cudaStream_t st) {
  const std::uint32_t n = c.size(), r = c.rank();
  DeviceBytes send_probe(64), recv_probe(64);
  for (DType t : kTypes)
    for (ReduceOp op : kOps)
      for (std::size_t count :
           {std::size_t{3}, std::size_t{40'001}, std::size_t{600'001}, std::size_t{c.hierarchical() ? 600'000u : 0u}}) {
        if (count == 0) continue;
        const std::string what = str_format("{} {} × {}", to_string(t), to_string(op), count);
        const auto mine = encode(inputs(r, count, t), t);
        DeviceBytes send(mine.size(), mine), recv(mine.size());
        auto s = c.all_reduce(send.p, recv.p, mine.size(), t, op, st);
        if (s) s = finish(c, st);
        expect(s && recv.read(mine.size()) == expected(n, count, t, op),
               "all_reduce " + what + (s ? "" : ": " + s.error().message()));
        s = c.all_reduce(send.p, send.p, mine.size(), t, op, st);
        if (s) s = finish(c, st);
        expect(s && send.read(mine.size()) == expected(n, count, t, op), "in-place all_reduce " + what);

        const auto big = encode(inputs(r, count * n, t), t);
        const auto want = expected(n, count * n, t, op);
        DeviceBytes bsend(big.size(), big);
        s = c.reduce_scatter(bsend.p, recv.p, mine.size(), t, op, st);
        if (s) s = finish(c, st);
        const auto block = recv.read(mine.size());
        expect(
            s && std::equal(block.begin(), block.end(), want.begin() + static_cast<std::ptrdiff_t>(r * block.size())),
            "reduce_scatter " + what + (s ? "" : ": " + s.error().message()));
      }
  for (std::size_t count : {std::size_t{1}, std::size_t{5000}, std::size_t{3'000'001}})
    gather_and_broadcast(c, st, count, n - 1);
  // NaN, signed zeros and ties: bit for bit what the host reduction gives.
  for (ReduceOp op : {ReduceOp::Sum, ReduceOp::Min, ReduceOp::Max}) {
    const bool nan = op != ReduceOp::Sum;
    const auto v = special_inputs(r, nan);
    const auto bytes = std::as_bytes(std::span(v));
    DeviceBytes send(bytes.size(), {bytes.begin(), bytes.end()});
    auto s = c.all_reduce(send.p, send.p, bytes.size(), DType::F32, op, st);
    if (s) s = finish(c, st);
    expect(s && send.read(bytes.size()) == special_expected(n, op, nan),
           str_format("all_reduce of NaN, ±0 and ties, {}", to_string(op)));
  }
  // Misaligned buffers are refused, not a GPU fault.
  const auto misaligned =
      c.all_reduce(static_cast<const std::byte*>(send_probe.p) + 2, recv_probe.p, 8, DType::F32, ReduceOp::Sum, st);
  expect(!misaligned && misaligned.error().code() == Errc::InvalidArgument, "a misaligned buffer refused");
  if (c.staged()) {
    // Staged calls wait on the host: a capture is refused, and the stream is still usable.
    DeviceBytes buf(64);
    cudaGraph_t graph = nullptr;
    const bool began = cudaStreamBeginCapture(st, cudaStreamCaptureModeThreadLocal) == cudaSuccess;
    const auto captured = c.all_reduce(buf.p, buf.p, 64, DType::F32, ReduceOp::Sum, st);
    const bool ended = cudaStreamEndCapture(st, &graph) == cudaSuccess;
    if (graph) (void)cudaGraphDestroy(graph);
    expect(began && ended && !captured && captured.error().code() == Errc::Unsupported,
           "a staged call under capture refused (Unsupported)");
  }
  // Captured once, replayed with new inputs: each replay is a new call on every rank (staged and
  // in LL lines).
  for (const std::size_t count : {std::size_t{200'000}, std::size_t{1'000}}) {
    if (c.staged()) break;
    DeviceBytes send(count * 4), recv(count * 4);
    cudaGraph_t graph = nullptr;
    cudaGraphExec_t exec = nullptr;
    bool captured = cudaStreamBeginCapture(st, cudaStreamCaptureModeThreadLocal) == cudaSuccess;
    const auto enq = c.all_reduce(send.p, recv.p, count * 4, DType::F32, ReduceOp::Sum, st);
    captured = cudaStreamEndCapture(st, &graph) == cudaSuccess && captured && enq;
    captured = captured && cudaGraphInstantiate(&exec, graph, 0) == cudaSuccess;
    expect(captured, str_format("all_reduce of {} floats captured in a CUDA graph", count));
    cudaStream_t other = nullptr;
    (void)cudaStreamCreateWithFlags(&other, cudaStreamNonBlocking);
    cudaEvent_t ordered = nullptr;
    (void)cudaEventCreateWithFlags(&ordered, cudaEventDisableTiming);
    for (std::uint32_t replay = 0; captured && replay < 3; ++replay) {
      auto v = inputs(r + replay, count, DType::F32);
      const auto bytes = encode(v, DType::F32);
      send.write(bytes);
      // Replay 1 runs on another stream right after a call on this one, ordered by an event as a
      // user orders replays with the rank's other calls.
      DeviceBytes eager_send(count * 4, encode(inputs(r, count, DType::F32), DType::F32)), eager_recv(count * 4);
      Status eager;
      if (replay == 1) {
        eager = c.all_reduce(eager_send.p, eager_recv.p, count * 4, DType::F32, ReduceOp::Sum, st);
        (void)cudaEventRecord(ordered, st);
        (void)cudaStreamWaitEvent(other, ordered, 0);
      }
      cudaStream_t on = replay == 1 ? other : st;
      auto s = cudaGraphLaunch(exec, on) == cudaSuccess ? finish(c, on) : fail(Errc::Driver, "cudaGraphLaunch", "");
      if (replay == 1) {
        if (eager) eager = finish(c, st);
        const std::string d = outcome(eager, eager_recv, expected(n, count, DType::F32, ReduceOp::Sum));
        expect(d.empty(), str_format("a call before replay {} on another stream{}", replay, d));
      }
      std::vector<double> acc(count, 0);
      for (std::uint32_t j = 0; j < n; ++j) {
        const auto in = inputs(j + replay, count, DType::F32);
        for (std::size_t e = 0; e < count; ++e) acc[e] += in[e];
      }
      const auto want = encode(acc, DType::F32);
      const std::string diff = outcome(s, recv, want);
      expect(diff.empty(), str_format("graph replay {} of {} floats{}", replay, count, diff));
    }
    if (exec) (void)cudaGraphExecDestroy(exec);
    if (graph) (void)cudaGraphDestroy(graph);
    (void)cudaEventDestroy(ordered);
    (void)cudaStreamDestroy(other);
  }
  DeviceBytes send(64), recv(64);
  const auto bad = c.all_reduce(send.p, recv.p, 6, DType::F32, ReduceOp::Sum, st);
  expect(!bad && bad.error().code() == Errc::InvalidArgument, "a partial element refused");
  const auto root = c.broadcast(send.p, 4, n, DType::F32, st);
  expect(!root && root.error().code() == Errc::InvalidArgument, "a root outside the group refused");
}

/// f16 and bf16 sums and averages whose partial sums round: rank 0 gives a large value and every
/// other rank one that a partial sum of two rounds away (to nearest even), so a call that rounds
/// anywhere but at the end parts from the reference, whichever ranks a level groups. Sizes for
/// the one-shot, two-shot and (on simulated hosts) hierarchical paths.
void rounded_once(CudaCollectives& c, cudaStream_t st) {
  const std::uint32_t n = c.size(), r = c.rank();
  for (const DType t : {DType::F16, DType::BF16})
    for (const ReduceOp op : {ReduceOp::Sum, ReduceOp::Average})
      for (const std::size_t count :
           {std::size_t{3}, std::size_t{600'000}, std::size_t{c.hierarchical() ? 3'000'000u : 0u}}) {
        if (count == 0) continue;
        // f16 holds whole numbers to 2048 and bf16 to 256: halves and ones there are ties.
        const double big = t == DType::F16 ? 1024 : 256, small = t == DType::F16 ? 0.5 : 1;
        const auto value = [&](std::uint32_t q) { return q == 0 ? big : small; };
        double sum = 0;
        for (std::uint32_t q = 0; q < n; ++q) sum += value(q);
        const auto want = encode(std::vector<double>(count, op == ReduceOp::Average ? sum / n : sum), t);
        const auto mine = encode(std::vector<double>(count, value(r)), t);
        DeviceBytes send(mine.size(), mine), recv(mine.size());
        auto s = c.all_reduce(send.p, recv.p, mine.size(), t, op, st);
        if (s) s = finish(c, st);
        std::string diff = outcome(s, recv, want);
        expect(diff.empty(),
               str_format("all_reduce of {} {} {} rounded once{}", count, to_string(t), to_string(op), diff));
        std::vector<std::byte> blocks;
        for (std::uint32_t q = 0; q < n; ++q) blocks.insert(blocks.end(), mine.begin(), mine.end());
        DeviceBytes bsend(blocks.size(), blocks);
        s = c.reduce_scatter(bsend.p, recv.p, mine.size(), t, op, st);
        if (s) s = finish(c, st);
        diff = outcome(s, recv, want);
        expect(diff.empty(),
               str_format("reduce_scatter of {} {} {} rounded once{}", count, to_string(t), to_string(op), diff));
      }
}

/// all_gather with its input at this rank's block of the output, and reduce_scatter with its
/// output at this rank's block of the input (as NCCL allows), f32, on every path's sizes.
void in_place_blocks(CudaCollectives& c, cudaStream_t st) {
  const std::uint32_t n = c.size(), r = c.rank();
  for (const std::size_t count : {std::size_t{1'000}, std::size_t{40'001}, std::size_t{600'000}}) {
    const std::size_t bytes = count * 4;
    const auto all = gathered(n, count, DType::F32);
    const auto mine = encode(inputs(r, count, DType::F32), DType::F32);
    std::vector<std::byte> start(all.size(), std::byte{0x7f});
    std::copy(mine.begin(), mine.end(), start.begin() + static_cast<std::ptrdiff_t>(r * bytes));
    DeviceBytes out(all.size(), start);
    auto s = c.all_gather(static_cast<std::byte*>(out.p) + r * bytes, out.p, bytes, DType::F32, st);
    if (s) s = finish(c, st);
    std::string diff = outcome(s, out, all);
    expect(diff.empty(), str_format("in-place all_gather of {} floats{}", count, diff));

    const auto big = encode(inputs(r, count * n, DType::F32), DType::F32);
    const auto sums = expected(n, count * n, DType::F32, ReduceOp::Sum);
    DeviceBytes io(big.size(), big);
    s = c.reduce_scatter(io.p, static_cast<std::byte*>(io.p) + r * bytes, bytes, DType::F32, ReduceOp::Sum, st);
    if (s) s = finish(c, st);
    const auto got = io.read(big.size());
    const bool same = s && std::equal(got.begin() + static_cast<std::ptrdiff_t>(r * bytes),
                                      got.begin() + static_cast<std::ptrdiff_t>((r + 1) * bytes),
                                      sums.begin() + static_cast<std::ptrdiff_t>(r * bytes));
    expect(same, str_format("in-place reduce_scatter of {} floats{}", count, s ? "" : ": " + s.error().message()));
  }
}

/// Calls one after another with no wait between them, the second on another stream: each finds
/// the staging (or the slots) the one before it left, in stream order.
void back_to_back(CudaCollectives& c, cudaStream_t st) {
  const std::uint32_t n = c.size(), r = c.rank();
  cudaStream_t other = nullptr;
  (void)cudaStreamCreateWithFlags(&other, cudaStreamNonBlocking);
  const std::size_t count = (std::size_t{3} << 20) / 4 + 7;  // several steps or pieces
  std::vector<std::vector<std::byte>> mine;
  for (std::uint32_t k = 0; k < 3; ++k) mine.push_back(encode(inputs(r + k, count, DType::F32), DType::F32));
  DeviceBytes a(mine[0].size(), mine[0]), b(mine[1].size(), mine[1]), d(mine[2].size(), mine[2]);
  DeviceBytes* bufs[] = {&a, &b, &d};
  Status s;
  for (std::uint32_t k = 0; k < 3 && s; ++k)
    s = c.all_reduce(bufs[k]->p, bufs[k]->p, mine[k].size(), DType::F32, ReduceOp::Sum, k == 1 ? other : st);
  if (s) s = finish(c, other);
  if (s) s = finish(c, st);
  for (std::uint32_t k = 0; k < 3; ++k) {
    std::vector<double> acc(count, 0);
    for (std::uint32_t j = 0; j < n; ++j) {
      const auto in = inputs(j + k, count, DType::F32);
      for (std::size_t e = 0; e < count; ++e) acc[e] += in[e];
    }
    const std::string diff = outcome(s, *bufs[k], encode(acc, DType::F32));
    expect(diff.empty(), str_format("back-to-back call {} (stream {}){}", k, k == 1 ? "other" : "same", diff));
  }
  (void)cudaStreamDestroy(other);
  // A call whose stream is destroyed as soon as it is enqueued: the next call, on another stream,
  // still comes after it (small calls: their kernels end fast, so a missed order would show).
  const std::size_t few = 1000;
  DeviceBytes chained(few * 4, encode(inputs(r, few, DType::F32), DType::F32));
  cudaStream_t gone = nullptr;
  (void)cudaStreamCreateWithFlags(&gone, cudaStreamNonBlocking);
  s = c.all_reduce(chained.p, chained.p, few * 4, DType::F32, ReduceOp::Sum, gone);
  (void)cudaStreamDestroy(gone);
  if (s) s = c.all_reduce(chained.p, chained.p, few * 4, DType::F32, ReduceOp::Sum, st);
  if (s) s = finish(c, st);
  std::vector<double> twice(few, 0);
  for (std::uint32_t j = 0; j < n; ++j) {
    const auto in = inputs(j, few, DType::F32);
    for (std::size_t e = 0; e < few; ++e) twice[e] += double(n) * in[e];
  }
  const std::string diff = outcome(s, chained, encode(twice, DType::F32));
  expect(diff.empty(), "a call after one whose stream was destroyed at once" + diff);
}

/// Small calls of many sizes one after another with no wait between them, a larger one among
/// them: each call runs as many blocks as its size needs, so the lines a call waits for sit where
/// earlier calls of other sizes left theirs, and only the call's epoch tells them apart.
void varying_sizes(CudaCollectives& c, cudaStream_t st) {
  const std::uint32_t n = c.size(), r = c.rank();
  const std::size_t counts[] = {16384, 2,    1024, 2,   512, 131072, 4, 256, 16384, 2, (std::size_t{3} << 20) / 4 + 7,
                                2,     8192, 3,    600, 2};
  // Call k's inputs are offset by 8k, so that a line of any other call would show in the result.
  auto input = [&](std::uint32_t rank, std::size_t k) {
    auto v = inputs(rank, counts[k], DType::F32);
    for (auto& e : v) e += 8.0 * double(k);
    return v;
  };
  std::deque<DeviceBytes> bufs;
  for (std::size_t k = 0; k < std::size(counts); ++k) bufs.emplace_back(counts[k] * 4, encode(input(r, k), DType::F32));
  Status s;
  for (std::size_t k = 0; k < std::size(counts) && s; ++k)
    s = c.all_reduce(bufs[k].p, bufs[k].p, counts[k] * 4, DType::F32, ReduceOp::Sum, st);
  if (s) s = finish(c, st);
  for (std::size_t k = 0; k < std::size(counts); ++k) {
    std::vector<double> acc(counts[k], 0);
    for (std::uint32_t j = 0; j < n; ++j) {
      const auto in = input(j, k);
      for (std::size_t e = 0; e < counts[k]; ++e) acc[e] += in[e];
    }
    const std::string diff = outcome(s, bufs[k], encode(acc, DType::F32));
    expect(diff.empty(), str_format("call {} of {} floats among calls of other sizes{}", k, counts[k], diff));
  }
}

/// all_reduce of about `bytes` per rank (plus a few elements: a short last step) for f32 sum,
/// bf16 average and i64 max, out of place and in place; `where` ends each check's name.
void all_reduce_steps(CudaCollectives& c, cudaStream_t st, std::size_t bytes, std::size_t extra,
                      std::string_view where) {
  const std::uint32_t n = c.size(), r = c.rank();
  for (const auto& [t, op] : {std::pair{DType::F32, ReduceOp::Sum}, std::pair{DType::BF16, ReduceOp::Average},
                              std::pair{DType::I64, ReduceOp::Max}}) {
    const std::size_t count = bytes / size_of(t) + extra;
    const auto mine = encode(inputs(r, count, t), t);
    const auto want = expected(n, count, t, op);
    DeviceBytes send(mine.size(), mine), recv(mine.size());
    auto s = c.all_reduce(send.p, recv.p, mine.size(), t, op, st);
    if (s) s = finish(c, st);
    std::string diff = outcome(s, recv, want);
    expect(diff.empty(), str_format("all_reduce {} {} × {}{}{}", to_string(t), to_string(op), count, where, diff));
    s = c.all_reduce(send.p, send.p, mine.size(), t, op, st);
    if (s) s = finish(c, st);
    diff = outcome(s, send, want);
    expect(diff.empty(),
           str_format("in-place all_reduce {} {} × {}{}{}", to_string(t), to_string(op), count, where, diff));
  }
}

/// Multi-step calls on a communicator with 4 MiB of staging, each with a shorter last step: one-shot
/// all_reduce over several steps, in place too, and the other ops' pushed steps.
void several_steps(CudaCollectives& c, cudaStream_t st) {
  const std::uint32_t n = c.size(), r = c.rank();
  all_reduce_steps(c, st, std::size_t{10} << 20, 3, "");
  const std::size_t count = (std::size_t{3} << 20) + 5;  // f32 elements per rank
  const auto big = encode(inputs(r, count * n, DType::F32), DType::F32);
  const auto sums = expected(n, count * n, DType::F32, ReduceOp::Sum);
  DeviceBytes bsend(big.size(), big), block(count * 4);
  auto s = c.reduce_scatter(bsend.p, block.p, count * 4, DType::F32, ReduceOp::Sum, st);
  if (s) s = finish(c, st);
  const std::vector<std::byte> want_block(sums.begin() + static_cast<std::ptrdiff_t>(r * count * 4),
                                          sums.begin() + static_cast<std::ptrdiff_t>((r + 1) * count * 4));
  const std::string diff = outcome(s, block, want_block);
  expect(diff.empty(), str_format("reduce_scatter of {} floats a rank{}", count, diff));
  gather_and_broadcast(c, st, (std::size_t{9} << 20) + 7, 0);
}

/// Outputs in a registered window that starts inside its allocation, which the peers write in
/// place (all_gather and broadcast of 16 MiB a rank and more, in whole vectors): at three offsets
/// and four sizes (those not in whole vectors take the staging), in place; reduce_scatter reading
/// its peers' inputs in the window; back to back with small
/// and staged calls, replayed from a CUDA graph, beside calls outside the window, after
/// deregistering and registering again; registrations refused on every rank for memory that
/// cannot be a window; and ranks whose outputs lie at different offsets refused before anything
/// is written. On the staged path a window is refused (Unsupported).
void windows(Communicator& host, const CudaCollectiveOptions& options, cudaStream_t st) {
  // Written in place from 16 MiB a rank (kWindowBytes) where the offset and an all_gather's size
  // are whole 16-byte vectors; other calls into a window take the staging.
  const std::size_t least = (std::size_t{16} << 20) + 48, most = least + (std::size_t{1} << 20) + 16, odd = least + 5;
  const std::size_t skew = 4096 + 16, odd_at = 4096 + 3;
  // Declared before the communicator, which the peers' mappings of it must not outlive. The window
  // starts inside its allocation: the peers map the allocation and find the window at its offset.
  const std::uint32_t n = host.size(), r = host.rank();
  const std::size_t lead = 4096, bytes = (n + 1) * most + skew;
  DeviceBytes memory(lead + bytes);
  std::byte* const window = memory.p + lead;
  auto opened = CudaCollectives::open(host, options);
  expect(static_cast<bool>(opened), opened ? "" : "open for windows: " + opened.error().message());
  if (!opened) return;
  CudaCollectives& c = **opened;
  const bool staged = c.staged();
  auto reg = c.register_window(window, bytes);
  if (staged) {
    expect(!reg && reg.error().code() == Errc::Unsupported,
           reg ? "a window on the staged path" : "not Unsupported: " + reg.error().message());
    return;
  }
  expect(static_cast<bool>(reg), reg ? "" : "register_window: " + reg.error().message());
  if (!reg) return;
  auto refused = [&](const Status& got, const std::string& what, std::string_view names) {
    expect(
        !got && got.error().code() == Errc::InvalidArgument && got.error().message().find(names) != std::string::npos,
        got ? what + " was registered"
            : what + ": not InvalidArgument naming '" + std::string(names) + "': " + got.error().message());
  };
  std::vector<std::byte> pageable(4096);
  DeviceBytes other(std::size_t{1} << 20);
  refused(c.register_window(pageable.data(), pageable.size()), "host memory", "not CUDA device memory");
  refused(c.register_window(other.p, other.n + (std::size_t{8} << 20)), "a window past its allocation",
          "run past their CUDA allocation");
  refused(c.register_window(window + 16, 4096), "a window inside another", "overlap window 0");
  refused(c.register_window(other.p, r == 0 ? 4096 : 8192), "windows of different sizes",
          r == 0 ? "registered a window of 8192 bytes" : "registered a window of 4096 bytes");
  auto read_at = [&](std::size_t at, std::size_t len) {
    std::vector<std::byte> out(len);
    (void)cudaMemcpy(out.data(), window + at, len, cudaMemcpyDeviceToHost);
    return out;
  };
  auto write_at = [&](std::size_t at, const std::vector<std::byte>& data) {
    (void)cudaMemcpy(window + at, data.data(), data.size(), cudaMemcpyHostToDevice);
    (void)cudaDeviceSynchronize();
  };
  auto clear = [&](int value) {
    (void)cudaMemset(window, value, bytes);
    (void)cudaDeviceSynchronize();
  };
  // An all_gather of `count` bytes a rank, from `from` bytes into the send buffer, into the
  // window at `at`, checked.
  auto gather_at = [&](std::size_t count, std::size_t at, std::size_t from, const std::string& where) {
    clear(0);
    const auto want = gathered(n, count, DType::U8);
    auto data = encode(inputs(r, count, DType::U8), DType::U8);
    data.insert(data.begin(), from, std::byte{0});
    DeviceBytes send(from + count, data);
    auto s = c.all_gather(send.p + from, window + at, count, DType::U8, st);
    if (s) s = finish(c, st);
    expect(s && read_at(at, want.size()) == want,
           "all_gather of " + where + (s ? difference(read_at(at, want.size()), want) : ": " + s.error().message()));
  };
  // Offsets in whole 16-byte vectors (in place), in 8- and 4-byte words and in bytes (through the
  // staging, whose copies take the widest words the pointers allow); at `skew` the send buffer
  // is off 16 bytes too.
  for (const std::size_t count : {std::size_t{600'001}, least, most, odd})
    for (const std::size_t at : {std::size_t{0}, skew, skew + 8, skew + 4, odd_at}) {
      const std::size_t from = at == skew ? 8 : 0;
      const std::string where = str_format("{} bytes at offset {} of a window (input at {})", count, at, from);
      gather_at(count, at, from, where);
      const std::uint32_t root = n - 1;
      const auto root_data = encode(inputs(root + 5, count, DType::U8), DType::U8);
      write_at(at, r == root ? root_data : std::vector<std::byte>(count));
      auto s = c.broadcast(window + at, count, root, DType::U8, st);
      if (s) s = finish(c, st);
      expect(s && read_at(at, count) == root_data, "broadcast of " + where + (s ? "" : ": " + s.error().message()));
    }
  {
    // In place: this rank's input is its block of the output.
    const auto want = gathered(n, least, DType::U8);
    clear(0);
    write_at(r * least, encode(inputs(r, least, DType::U8), DType::U8));
    auto s = c.all_gather(window + r * least, window, least, DType::U8, st);
    if (s) s = finish(c, st);
    expect(s && read_at(0, want.size()) == want,
           "in-place all_gather into a window" + (s ? std::string() : ": " + s.error().message()));
  }
  {
    // reduce_scatter reading the peers' inputs where they are, in three types and ops, from
    // offsets in whole vectors into ordinary memory and into the window; an all_reduce in the
    // window, which takes the staging.
    struct Case {
      DType type;
      ReduceOp op;
      std::size_t count, from;
    };
    for (const Case& k :
         {Case{DType::F32, ReduceOp::Sum, least / 4, 0}, Case{DType::BF16, ReduceOp::Average, least / 2, skew},
          Case{DType::I64, ReduceOp::Max, least / 8, skew}}) {
      clear(0);
      const std::size_t block = k.count * size_of(k.type);
      write_at(k.from, encode(inputs(r, k.count * n, k.type), k.type));
      DeviceBytes out(block);
      auto s = c.reduce_scatter(window + k.from, out.p, block, k.type, k.op, st);
      if (s) s = finish(c, st);
      const auto all = expected(n, k.count * n, k.type, k.op);
      const std::vector<std::byte> want(all.begin() + static_cast<std::ptrdiff_t>(r * block),
                                        all.begin() + static_cast<std::ptrdiff_t>((r + 1) * block));
      expect(s && out.read() == want,
             str_format("reduce_scatter of {} {} ({}) a rank from offset {} of a window{}", k.count, to_string(k.type),
                        to_string(k.op), k.from, outcome(s, out, want)));
    }
    const std::size_t count = least / 4 + 1, len = count * 4, to = (n * len + 31) & ~std::size_t{15};
    clear(0);
    write_at(0, encode(inputs(r, count * n, DType::F32), DType::F32));
    auto s = c.reduce_scatter(window, window + to, len, DType::F32, ReduceOp::Sum, st);  // not in whole vectors
    if (s) s = finish(c, st);
    const auto sums = expected(n, count * n, DType::F32, ReduceOp::Sum);
    const std::vector<std::byte> want(sums.begin() + static_cast<std::ptrdiff_t>(r * len),
                                      sums.begin() + static_cast<std::ptrdiff_t>((r + 1) * len));
    expect(s && read_at(to, len) == want, "reduce_scatter of a block not in whole vectors into a window" +
                                              (s ? difference(read_at(to, len), want) : ": " + s.error().message()));
    clear(0);
    write_at(skew, encode(inputs(r, count, DType::F32), DType::F32));
    s = c.all_reduce(window + skew, window + skew, len, DType::F32, ReduceOp::Sum, st);
    if (s) s = finish(c, st);
    const auto reduced = expected(n, count, DType::F32, ReduceOp::Sum);
    expect(
        s && read_at(skew, len) == reduced,
        "in-place all_reduce in a window" + (s ? difference(read_at(skew, len), reduced) : ": " + s.error().message()));
  }
  {
    // Back to back on one stream with no wait between: a call into the window, a small one, a
    // staged one and another into the window, each checked at the end.
    clear(0);
    const std::size_t after = n * least, small = 64;
    const std::uint32_t root = 0;
    const auto root_data = encode(inputs(root + 7, least, DType::U8), DType::U8);
    if (r == root) write_at(after, root_data);
    DeviceBytes send(least, encode(inputs(r, least, DType::U8), DType::U8));
    DeviceBytes tiny(small * 4, encode(inputs(r, small, DType::F32), DType::F32));
    DeviceBytes outside(n * 600'001);
    DeviceBytes part(600'001, encode(inputs(r + 3, 600'001, DType::U8), DType::U8));
    auto s = c.all_gather(send.p, window, least, DType::U8, st);
    if (s) s = c.all_reduce(tiny.p, tiny.p, small * 4, DType::F32, ReduceOp::Sum, st);
    if (s) s = c.all_gather(part.p, outside.p, 600'001, DType::U8, st);
    if (s) s = c.broadcast(window + after, least, root, DType::U8, st);
    if (s) s = finish(c, st);
    std::vector<std::byte> staged_want;
    for (std::uint32_t q = 0; q < n; ++q) {
      const auto p = encode(inputs(q + 3, 600'001, DType::U8), DType::U8);
      staged_want.insert(staged_want.end(), p.begin(), p.end());
    }
    expect(s && read_at(0, n * least) == gathered(n, least, DType::U8) &&
               tiny.read() == expected(n, small, DType::F32, ReduceOp::Sum) && outside.read() == staged_want &&
               read_at(after, least) == root_data,
           "calls in place, small and staged back to back" + (s ? std::string() : ": " + s.error().message()));
  }
  {
    // Captured once, replayed with new inputs: the window and offset are in the captured call.
    const std::size_t count = least + 16;
    DeviceBytes send(count);
    cudaGraph_t graph = nullptr;
    cudaGraphExec_t exec = nullptr;
    bool ok = cudaStreamBeginCapture(st, cudaStreamCaptureModeThreadLocal) == cudaSuccess;
    const auto s = c.all_gather(send.p, window + skew, count, DType::U8, st);
    ok = cudaStreamEndCapture(st, &graph) == cudaSuccess && s && ok;
    ok = ok && cudaGraphInstantiate(&exec, graph, 0) == cudaSuccess;
    for (std::uint32_t replay = 0; replay < 2 && ok; ++replay) {
      send.write(encode(inputs(r + 10 * replay, count, DType::U8), DType::U8));
      ok = cudaGraphLaunch(exec, st) == cudaSuccess && finish(c, st);
      std::vector<std::byte> want;
      for (std::uint32_t q = 0; q < n; ++q) {
        const auto part = encode(inputs(q + 10 * replay, count, DType::U8), DType::U8);
        want.insert(want.end(), part.begin(), part.end());
      }
      expect(ok && read_at(skew, want.size()) == want,
             str_format("graph replay {} of an all_gather into a window", replay));
    }
    if (exec) (void)cudaGraphExecDestroy(exec);
    if (graph) (void)cudaGraphDestroy(graph);
    expect(ok, "capture and replay of a call into a window");
  }
  gather_and_broadcast(c, st, 600'001, 0);  // outputs outside any window, through the staging
  {
    // Deregistered, the same memory is an ordinary output again; a second deregistration is
    // refused on every rank; registered again, it takes the freed row.
    auto ended = c.deregister_window(window);
    expect(static_cast<bool>(ended), ended ? "" : "deregister_window: " + ended.error().message());
    gather_at(least, 0, 0, "memory that was a window");
    auto twice = c.deregister_window(window);
    expect(!twice && twice.error().code() == Errc::NotFound,
           twice ? "a window deregistered twice" : "not NotFound: " + twice.error().message());
    auto back = c.register_window(window, bytes);
    expect(static_cast<bool>(back), back ? "" : "register_window again: " + back.error().message());
    gather_at(least, skew, 0, "a window registered again");
  }
  {
    // Rank 0's output at another offset than its peers': every rank stops before writing.
    clear(0x5a);
    DeviceBytes send(least, encode(inputs(r, least, DType::U8), DType::U8));
    auto s =
        c.all_gather(send.p, window + (r == 0 ? 0 : skew), least, DType::U8, st, {.timeout = std::chrono::seconds(5)});
    if (s) s = finish(c, st);
    expect(!s && s.error().code() == Errc::InvalidArgument,
           s ? "all_gathers at different offsets succeeded" : "not InvalidArgument: " + s.error().message());
    const auto untouched = read_at(0, bytes);
    expect(std::ranges::all_of(untouched, [](std::byte b) { return b == std::byte{0x5a}; }),
           "a window written by calls that did not match");
  }
}

}  // namespace

int main(int argc, char** argv) {
  const std::string mode = argc > 1 ? argv[1] : "all";
  auto job = launched_job();
  if (!job) {
    std::printf("mesh-cuda: FAILED: %s\n", job.error().message().c_str());
    return 1;
  }
  const std::uint32_t me = checks.rank = job->rank;
  int devices = 0;
  if (cudaGetDeviceCount(&devices) != cudaSuccess || devices == 0) {
    std::printf("LAVAFLOW-SKIP: mesh-cuda rank %u: SKIP: no CUDA device\n", me);
    return 77;
  }
  const int device = static_cast<int>(me % static_cast<std::uint32_t>(devices));
  (void)cudaSetDevice(device);
  auto mesh = mesh_from_launch(*job);
  auto host = mesh ? mesh->communicator("world", launched_communicators(*job)) : std::unexpected(mesh.error());
  if (!host) {
    std::printf("mesh-cuda rank %u: FAILED: %s\n", me, host.error().message().c_str());
    return 1;
  }
  const std::uint32_t n = (*host)->size();
  // "staged-late" is "late" with every call staged, "hosts-late" on two simulated hosts.
  const bool staged = mode.starts_with("staged");
  const bool hosts = mode.starts_with("hosts");
  const bool layout = mode == "hosts-mixed" || mode == "hosts-strided";
  const std::string base = mode.starts_with("staged-")             ? mode.substr(7)
                           : mode.starts_with("hosts-") && !layout ? mode.substr(6)
                                                                   : mode;
  // Options with `chunk` bytes of staging; on simulated hosts, each rank's host and the subgroups.
  auto options = [&, subgroups_of = hosts ? subgroups(**mesh->get_group("world"), me, launched_communicators(*job))
                                          : SubgroupOpener{}](std::uint64_t chunk) {
    CudaCollectiveOptions o{.device = device, .chunk_bytes = chunk, .stage_through_host = staged};
    if (hosts) {
      o.open_group = subgroups_of;
      // Host-major (0-1 | 2-3; with 3 ranks 0-1 | 2, unequal hosts: staged whole), mixed (0, 3 |
      // 1, 2: the blocks of a call change order between the phases), or strided (0, 2 | 1, 3:
      // local-index order is rank order).
      o.host = str_format("sim-{}", mode == "hosts-mixed"     ? (me == 1 || me == 2)
                                    : mode == "hosts-strided" ? me % 2
                                                              : me * 2 / n);
    }
    return o;
  };
  auto c = CudaCollectives::open(**host, options(1 << 20));
  if (!c) {
    std::printf("mesh-cuda rank %u: FAILED: open: %s\n", me, c.error().message().c_str());
    return 1;
  }
  cudaStream_t st = nullptr;
  (void)cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking);
  DeviceBytes buf(64, encode(inputs(me, 16, DType::F32), DType::F32));
  const CallOptions quick{.timeout = std::chrono::seconds(5)};

  if (hosts && base == "mismatch") {
    // Each host's ranks agree on their call, but the hosts differ (f32 on host 0, f16 on host 1):
    // the in-host phases succeed, and the boundary before the exchange between hosts refuses it on
    // every rank, naming both calls.
    const DType t = me * 2 / n == 0 ? DType::F32 : DType::F16;
    DeviceBytes big(std::size_t{1} << 20);
    auto s = (*c)->all_reduce(big.p, big.p, big.n, t, ReduceOp::Sum, st, quick);
    if (s) s = finish(**c, st);
    const std::string message = s ? std::string() : s.error().message();
    expect(!s && s.error().code() == Errc::InvalidArgument && message.find("makes another call") != std::string::npos &&
               message.find("f16") != std::string::npos && message.find("f32") != std::string::npos,
           s ? "calls that differ between hosts succeeded" : "not InvalidArgument naming both calls: " + message);
    expect(!(*c)->all_reduce(buf.p, buf.p, 64, DType::F32, ReduceOp::Sum, st, quick) && !(*c)->check(),
           "a call after a failure fails, and check() reports it");
    if (!checks.failures) std::printf("mesh-cuda rank %u: %s OK (%s)\n", me, mode.c_str(), message.c_str());
    return checks.failures ? 1 : 0;
  }
  if (base == "mismatch") {
    CudaCollectives* on = c->get();
    std::unique_ptr<CudaCollectives> fresh;
    if (staged) {
      // Calls of other lengths whose first pieces look alike: refused before any piece moves, on
      // every rank (the host communicator stays sound: the next open works).
      const std::size_t bytes = (std::size_t{8} << 20) + (me == 0 ? 256 : 0);
      DeviceBytes big(bytes);
      auto other = (*c)->all_reduce(big.p, big.p, bytes, DType::F32, ReduceOp::Sum, st, quick);
      expect(!other && other.error().code() == Errc::InvalidArgument,
             other ? "calls of 8 MiB + 256 and 8 MiB succeeded" : "not InvalidArgument: " + other.error().message());
      expect(!(*c)->all_reduce(buf.p, buf.p, 64, DType::F32, ReduceOp::Sum, st, quick) && !(*c)->check(),
             "a call after a failure fails, and check() reports it");
      auto again =
          CudaCollectives::open(**host, {.device = device, .chunk_bytes = 1 << 20, .stage_through_host = true});
      expect(static_cast<bool>(again), again ? "" : "open again: " + again.error().message());
      if (!again) return 1;
      fresh = std::move(*again);
      on = fresh.get();
    }
    // Large enough for every block to run: a block that starts after another of its rank found the
    // mismatch returns at once, and the peer's block waiting for it must still report a mismatch.
    DeviceBytes wide(std::size_t{64} << 10);
    auto s = me == 0 ? on->broadcast(wide.p, wide.n, 0, DType::F32, st, quick)
                     : on->all_reduce(wide.p, wide.p, wide.n, DType::F32, ReduceOp::Sum, st, quick);
    if (s) s = finish(*on, st);
    expect(!s && s.error().code() == Errc::InvalidArgument,
           s ? "mismatched calls succeeded" : "not InvalidArgument: " + s.error().message());
    expect(!on->all_reduce(buf.p, buf.p, 64, DType::F32, ReduceOp::Sum, st, quick), "a call after a failure fails");
    if (!checks.failures) std::printf("mesh-cuda rank %u: %s OK (%s)\n", me, mode.c_str(), s.error().message().c_str());
    return checks.failures ? 1 : 0;
  }
  if (base == "exit" || base == "late" || base == "hang") {
    // "hang": the last rank stays away longer than its peers' waits at the boundaries, whose
    // timeouts must then end their calls (with a call timeout of a second).
    const bool hang = base == "hang";
    // On simulated hosts a call large enough for the hierarchy (smaller ones are staged whole,
    // as in "staged-late").
    const std::size_t late_bytes = hosts ? std::size_t{8} << 20 : 64;
    DeviceBytes late_buf(late_bytes);
    auto first = (*c)->all_reduce(late_buf.p, late_buf.p, late_bytes, DType::F32, ReduceOp::Sum, st, quick);
    expect(first && finish(**c, st), "the call before");
    if (me == n - 1) {
      if (base == "exit") _exit(3);
      std::this_thread::sleep_for(std::chrono::seconds(hang ? 30 : 8));
      return 0;
    }
    const auto t0 = Clock::now();
    auto s = (*c)->all_reduce(late_buf.p, late_buf.p, late_bytes, DType::F32, ReduceOp::Sum, st,
                              hang ? CallOptions{.timeout = std::chrono::seconds(1)} : quick);
    if (s) s = finish(**c, st);
    if (!hosts) {
      expect(!s && s.error().code() == Errc::Timeout &&
                 s.error().message().find(str_format("rank {}", n - 1)) != std::string::npos,
             s ? "the call without the last rank succeeded" : "not a timeout naming it: " + s.error().message());
      expect(Clock::now() - t0 < std::chrono::seconds(7), "the failure came within the call's timeout");
    } else {
      // Host 1's other rank (2) and the last rank's peer across hosts (1) name it as rank 1 of the
      // subgroup they share with it; rank 0 hears from rank 2 that its host's phase failed.
      const std::string named = me == 0   ? "rank 2 of group 'world' (host 1) failed"
                                : me == 1 ? "group 'world[1,3]'"
                                          : "group 'world[2,3]'";
      const std::string message = s ? std::string() : s.error().message();
      expect(!s && (s.error().code() == Errc::Timeout || s.error().code() == Errc::PeerLost) &&
                 message.find(named) != std::string::npos && (me == 0 || message.find("rank 1") != std::string::npos),
             s ? "the call without the last rank succeeded"
               : str_format("not a timeout or lost peer naming '{}': {}", named, message));
      // The in-host phase waits at most the call's timeout. In "late" and "exit" the ranks that
      // wait for the last one at a boundary learn that it is gone when its process ends (at 8 s
      // at most). In "hang" it is still there at 30 s: the boundaries' own waits end the calls —
      // the longest, after the 4 MiB exchange of rank 2's index (a second per staged piece of
      // 1 MiB / 3, and three more), at about 18 s.
      expect(Clock::now() - t0 < std::chrono::seconds(hang ? 25 : 20),
             hang ? "the boundaries' waits did not end the call" : "the failure came once the late rank had gone");
    }
    if (!checks.failures) std::printf("mesh-cuda rank %u: %s OK (%s)\n", me, mode.c_str(), s.error().message().c_str());
    // The peers' staging stays mapped until the process ends: the destructor's barrier would wait
    // for the rank that left.
    std::fflush(stdout);
    _exit(checks.failures ? 1 : 0);
  }

  expect((*c)->staged() == (staged || hosts) && (*c)->hierarchical() == (hosts && n % 2 == 0),
         "the path: " + (*c)->path_reason());
  if (hosts && n % 2 == 0) {
    // A hierarchical call without a timeout: its boundaries wait without one too.
    const std::size_t count = 300'000;
    DeviceBytes data(count * 4, encode(inputs(me, count, DType::F32), DType::F32));
    auto s = (*c)->all_reduce(data.p, data.p, count * 4, DType::F32, ReduceOp::Sum, st, {.timeout = kForever});
    if (s) s = finish(**c, st);
    const std::string d = outcome(s, data, expected(n, count, DType::F32, ReduceOp::Sum));
    expect(d.empty(), "a hierarchical all_reduce without a timeout" + d);
  }
  if (hosts && n % 2 == 0) {
    // An opener that numbers the ranks against its list: every rank stays staged, saying why.
    auto reversed = options(1 << 20);
    reversed.open_group = [open = reversed.open_group](const std::string& name, std::vector<std::uint32_t> ranks) {
      std::ranges::reverse(ranks);
      return open(name, ranks);
    };
    auto misnumbered = CudaCollectives::open(**host, reversed);
    expect(misnumbered && !(*misnumbered)->hierarchical() &&
               (*misnumbered)->path_reason().find("as listed") != std::string::npos,
           misnumbered ? "not staged whole, saying so: " + (*misnumbered)->path_reason()
                       : "open with a misnumbering opener: " + misnumbered.error().message());
    if (misnumbered) {
      const std::size_t count = 300'000;
      DeviceBytes data(count * 4, encode(inputs(me, count, DType::F32), DType::F32));
      auto s = (*misnumbered)->all_reduce(data.p, data.p, count * 4, DType::F32, ReduceOp::Sum, st);
      if (s) s = finish(**misnumbered, st);
      const std::string d = outcome(s, data, expected(n, count, DType::F32, ReduceOp::Sum));
      expect(d.empty(), "an all_reduce staged whole after the levels failed to open" + d);
    }
  }
  if (mode == "staged") {
    // Ranks that open with different options are refused, every one of them.
    auto odd = CudaCollectives::open(**host, {.device = device, .chunk_bytes = 1 << 20, .stage_through_host = me == 0});
    expect(!odd && odd.error().code() == Errc::InvalidArgument &&
               odd.error().message().find("stage_through_host") != std::string::npos,
           odd ? "opening with stage_through_host on rank 0 only succeeded"
               : "not InvalidArgument naming stage_through_host: " + odd.error().message());
  }
  every_op(**c, st);
  rounded_once(**c, st);
  in_place_blocks(**c, st);
  back_to_back(**c, st);
  varying_sizes(**c, st);
  windows(**host, options(1 << 20), st);
  {
    // Destroyed right after a call whose stream is gone: the destructor's wait must not need that
    // stream, and the opens below then work. The buffer outlives it: freeing the buffer would wait
    // for the call first. (Freeing the staging waits for the device too, so this does not show a
    // missing wait; it shows that destruction goes through.)
    DeviceBytes big(std::size_t{3} << 20);
    auto brief = CudaCollectives::open(**host, options(1 << 20));
    expect(static_cast<bool>(brief), brief ? "" : "open a communicator to destroy: " + brief.error().message());
    if (brief) {
      cudaStream_t gone = nullptr;
      (void)cudaStreamCreateWithFlags(&gone, cudaStreamNonBlocking);
      expect(static_cast<bool>((*brief)->all_reduce(big.p, big.p, big.n, DType::F32, ReduceOp::Sum, gone)),
             "a call right before the communicator goes");
      (void)cudaStreamDestroy(gone);
    }
  }
  {
    auto wide = CudaCollectives::open(**host, options(4 << 20));
    expect(static_cast<bool>(wide), wide ? "" : "open with 4 MiB of staging: " + wide.error().message());
    if (wide) several_steps(**wide, st);
  }
  {
    // The default 16 MiB steps, where a large all_reduce is two-shot (with 4 MiB steps every
    // all_reduce is one-shot).
    auto wider = CudaCollectives::open(**host, options(16 << 20));
    expect(static_cast<bool>(wider), wider ? "" : "open with 16 MiB of staging: " + wider.error().message());
    // Two-shot for any number of ranks but one (each would receive more than the one-shot limit
    // per step).
    if (wider) all_reduce_steps(**wider, st, std::size_t{20} << 20, 9, " in 16 MiB steps");
  }
  if (!checks.failures) std::printf("mesh-cuda rank %u: OK (%u ranks, device %d of %d)\n", me, n, device, devices);
  return checks.failures ? 1 : 0;
}
