// SPDX-License-Identifier: MIT
// Collectives on real MPI ranks, on every backend an MPI job opens (native, mpi), checked against a
// reference computed on each rank from every rank's known input.
//   mesh_collectives [all]   every op × dtype × reduce op, in and out of place, sizes from one
//                            element to several staging chunks, on the world and on a subset
//                            group; send/recv; overlapping asynchronous calls; Vulkan and
//                            CUDA collectives over the world group (staged when it spans hosts)
//   mesh_collectives timeout the last rank joins late: every other rank gets Timeout naming it
//   mesh_collectives kill    the last rank exits mid-job: every other rank gets PeerLost naming it
//                            (run under an mpiexec that keeps survivors: Hydra's -disable-auto-cleanup)
// Prints "mesh-collectives: OK" on rank 0 when every rank passed.
#include <mpi.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <limits>
#include <string>
#include <thread>

#include "lavaflow/core/detail/format.hpp"
#include "lavaflow/core/transfer.hpp"
#include "lavaflow/mesh/vulkan.hpp"
#include "lavaflow/mesh_mpi/mesh_mpi.hpp"
#include "mesh_reference.hpp"
#if LAVAFLOW_TEST_MESH_CUDA
#include "device_bytes.hpp"
#include "lavaflow/mesh_cuda/cuda_collectives.hpp"
#endif

using namespace lavaflow;
using namespace lavaflow::mesh;
using namespace lftest::mesh_ref;

namespace {

struct Checker {
  int rank = 0;
  int failures = 0;
  std::uint64_t checks = 0;
  void expect(bool ok, const std::string& what) {
    ++checks;
    if (!ok && failures++ < 10) std::fprintf(stderr, "rank %d: FAILED: %s\n", rank, what.c_str());
  }
  void status(const Status& s, const std::string& what) {
    expect(s.has_value(), s ? what : what + ": " + s.error().message());
  }
};

std::string label(const Communicator& c, std::string_view op, DType t, ReduceOp o, std::size_t count) {
  return str_format("{} {} on '{}' ({}, {} elements, {})", c.backend(), op, c.group(), to_string(t), count,
                    to_string(o));
}

void check_reductions(Communicator& c, Checker& k, std::size_t count, DType t, ReduceOp op) {
  const std::uint32_t n = c.size(), r = c.rank();
  const std::size_t es = size_of(t);
  const auto mine = encode(inputs(r, count, t), t);
  const auto want = expected(n, count, t, op);
  // all_reduce, out of place and in place
  std::vector<std::byte> out(mine.size());
  k.status(c.all_reduce(mine, out, t, op).wait(), label(c, "all_reduce", t, op, count));
  k.expect(out == want, label(c, "all_reduce result", t, op, count));
  auto inplace = mine;
  k.status(c.all_reduce(inplace, inplace, t, op).wait(), label(c, "in-place all_reduce", t, op, count));
  k.expect(inplace == want, label(c, "in-place all_reduce result", t, op, count));
  if (inplace != want && t == DType::F32 && count < 10) {
    for (std::size_t i = 0; i < count; ++i) {
      float a, b;
      std::memcpy(&a, inplace.data() + 4 * i, 4);
      std::memcpy(&b, want.data() + 4 * i, 4);
      std::fprintf(stderr, "  [%zu] got %g want %g\n", i, a, b);
    }
  }
  // reduce_scatter: the send holds n blocks of `count` elements
  const auto big = encode(inputs(r, count * n, t), t);
  const auto big_want = expected(n, count * n, t, op);
  std::vector<std::byte> block(count * es);
  k.status(c.reduce_scatter(big, block, t, op).wait(), label(c, "reduce_scatter", t, op, count));
  k.expect(std::equal(block.begin(), block.end(), big_want.begin() + static_cast<std::ptrdiff_t>(r * count * es)),
           label(c, "reduce_scatter result", t, op, count));
}

/// reduce_scatter whose result lies over its input: in place (this rank's block of it), the
/// result is right — between hosts the blocks go in pieces (more than one here), and a result
/// written piece by piece must overwrite only input that has gone; anywhere else over the input
/// (another block, shifted by an element or by half a block), the native backend refuses the call.
void check_shifted_reduce_scatter(Communicator& c, Checker& k) {
  constexpr std::size_t kCount = 300'001;  // elements per block: 1.2 MB of f32
  const std::uint32_t n = c.size(), r = c.rank();
  const auto big = encode(inputs(r, kCount * n, DType::F32), DType::F32);
  const auto want = expected(n, kCount * n, DType::F32, ReduceOp::Sum);
  const std::size_t block = kCount * 4;
  std::vector<std::byte> buffer(big.size() + block);
  for (const std::size_t shift : {r * block, ((r + 1) % n) * block, std::size_t{4}, block / 2 / 4 * 4}) {
    std::memcpy(buffer.data(), big.data(), big.size());
    const std::span<std::byte> recv(buffer.data() + shift, block);
    const std::string what = str_format("{} reduce_scatter over its input, shifted {} bytes", c.backend(), shift);
    const Status s = c.reduce_scatter(std::span(buffer).first(big.size()), recv, DType::F32, ReduceOp::Sum).wait();
    if (shift == r * block) {
      k.status(s, what);
      k.expect(std::equal(recv.begin(), recv.end(), want.begin() + static_cast<std::ptrdiff_t>(r * block)),
               what + ": result");
    } else if (n > 1) {
      k.expect(!s && s.error().code() == Errc::InvalidArgument, what + ": refused");
    }
  }
}

/// Min and max with NaN in some ranks' inputs: NaN wins wherever one is, on every host backend
/// and layout, for f32, f16 and bf16, in small calls and in calls that take MPI's collectives
/// between hosts (NaN and the other values compared exactly; no zeros, whose sign the order of
/// combination picks).
void check_nan_wins(Communicator& c, Checker& k) {
  const std::uint32_t n = c.size(), r = c.rank();
  const float nan = std::numeric_limits<float>::quiet_NaN();
  auto values = [&](std::uint32_t rank, std::size_t count) {
    std::vector<float> v(count);
    for (std::size_t i = 0; i < count; ++i) {
      v[i] = 1.0f + static_cast<float>((i * 13 + rank * 7) % 101);
      if (i % 97 == rank % 97 || (i + rank) % 1009 == 5) v[i] = nan;  // first, middle and last ranks' NaNs
    }
    return v;
  };
  for (const DType t : {DType::F32, DType::F16, DType::BF16}) {
    const std::size_t es = size_of(t);
    auto bytes_of = [&](const std::vector<float>& v) {
      std::vector<std::byte> out(v.size() * es);
      for (std::size_t i = 0; i < v.size(); ++i) {
        const std::uint16_t h = t == DType::F16 ? to_f16(v[i]) : to_bf16(v[i]);
        std::memcpy(out.data() + i * es, t == DType::F32 ? static_cast<const void*>(&v[i]) : &h, es);
      }
      return out;
    };
    auto value = [&](const std::vector<std::byte>& b, std::size_t i) {
      if (t == DType::F32) {
        float f;
        std::memcpy(&f, b.data() + i * 4, 4);
        return f;
      }
      std::uint16_t h;
      std::memcpy(&h, b.data() + i * 2, 2);
      return t == DType::F16 ? from_f16(h) : from_bf16(h);
    };
    // Between hosts, 800 B: by recursive doubling; 40 001 elements: split among the hosts.
    for (const std::size_t count : {std::size_t{200}, std::size_t{40'001}})
      for (const ReduceOp op : {ReduceOp::Min, ReduceOp::Max}) {
        std::vector<std::vector<std::byte>> all;
        std::vector<std::span<const std::byte>> ins;
        for (std::uint32_t q = 0; q < n; ++q) all.push_back(bytes_of(values(q, count * n)));
        for (const auto& v : all) ins.push_back(v);
        std::vector<std::byte> want(count * n * es);
        k.status(reduce(ins, want, t, op), "the reference");
        auto same = [&](const std::vector<std::byte>& got, std::size_t from) {
          for (std::size_t i = 0; i < count; ++i) {
            const float g = value(got, i), w = value(want, from + i);
            if (std::isnan(g) != std::isnan(w) || (!std::isnan(g) && g != w)) return false;
          }
          return true;
        };
        const auto& mine = all[r];
        std::vector<std::byte> out(count * es);
        k.status(c.all_reduce(std::span(mine).first(count * es), out, t, op).wait(),
                 label(c, "all_reduce with NaN", t, op, count));
        k.expect(same(out, 0), label(c, "all_reduce with NaN: NaN wins", t, op, count));
        k.status(c.reduce_scatter(mine, out, t, op).wait(), label(c, "reduce_scatter with NaN", t, op, count));
        k.expect(same(out, r * count), label(c, "reduce_scatter with NaN: NaN wins", t, op, count));
      }
  }
}

// An f16 average whose sum does not fit in f16 (40000 on every rank; f16 ends at 65504): the
// division happens before the result is rounded to f16 — on one host, and across hosts, where
// each host's partial is divided before the hosts sum them (reduce_scatter and all_reduce).
void check_f16_average_range(Communicator& c, Checker& k) {
  constexpr std::size_t kCount = 5;
  const std::uint16_t v = to_f16(40000.0f);
  std::vector<std::uint16_t> send(kCount * c.size(), v), recv(kCount, 0);
  k.status(c.reduce_scatter(std::as_bytes(std::span(send)), std::as_writable_bytes(std::span(recv)), DType::F16,
                            ReduceOp::Average)
               .wait(),
           label(c, "reduce_scatter of large values", DType::F16, ReduceOp::Average, kCount));
  k.expect(recv == std::vector<std::uint16_t>(kCount, v),
           label(c, "reduce_scatter of large values: the average, not inf", DType::F16, ReduceOp::Average, kCount));
  std::vector<std::uint16_t> all(kCount, v);
  k.status(
      c.all_reduce(std::as_bytes(std::span(all)), std::as_writable_bytes(std::span(all)), DType::F16, ReduceOp::Average)
          .wait(),
      label(c, "all_reduce of large values", DType::F16, ReduceOp::Average, kCount));
  k.expect(all == std::vector<std::uint16_t>(kCount, v),
           label(c, "all_reduce of large values: the average, not inf", DType::F16, ReduceOp::Average, kCount));
}

void check_moves(Communicator& c, Checker& k, std::size_t count, DType t) {
  const std::uint32_t n = c.size(), r = c.rank();
  const std::size_t bytes = count * size_of(t);
  const auto mine = encode(inputs(r, count, t), t);
  std::vector<std::byte> all(bytes * n);
  const auto want = gathered(n, count, t);
  k.status(c.all_gather(mine, all, t).wait(), label(c, "all_gather", t, ReduceOp::Sum, count));
  k.expect(all == want, label(c, "all_gather result", t, ReduceOp::Sum, count));
  for (std::uint32_t root : {0u, n - 1}) {
    auto buf = r == root ? mine : std::vector<std::byte>(bytes, std::byte{0xEE});
    k.status(c.broadcast(buf, root, t).wait(), label(c, "broadcast", t, ReduceOp::Sum, count));
    k.expect(buf == encode(inputs(root, count, t), t), label(c, "broadcast result", t, ReduceOp::Sum, count));
  }
}

/// Calls that one rank joins late: the others' calls outlast the few microseconds a call spins on
/// the caller's stack and go on as queued work (on every layout: with one rank per host, after
/// the exchange was posted).
void check_late(Communicator& c, Checker& k) {
  const std::uint32_t n = c.size(), r = c.rank();
  constexpr std::size_t count = 5;
  const auto mine = encode(inputs(r, count, DType::I32), DType::I32);
  std::vector<std::byte> sum(mine.size()), all(mine.size() * n);
  if (r == n - 1) std::this_thread::sleep_for(std::chrono::milliseconds(20));
  Work reduced = c.all_reduce(mine, sum, DType::I32, ReduceOp::Sum);
  Work gather = c.all_gather(mine, all, DType::I32);
  k.status(reduced.wait(), label(c, "all_reduce with a late rank", DType::I32, ReduceOp::Sum, count));
  k.status(gather.wait(), label(c, "all_gather with a late rank", DType::I32, ReduceOp::Sum, count));
  k.expect(sum == expected(n, count, DType::I32, ReduceOp::Sum),
           label(c, "all_reduce with a late rank: result", DType::I32, ReduceOp::Sum, count));
  k.expect(all == gathered(n, count, DType::I32),
           label(c, "all_gather with a late rank: result", DType::I32, ReduceOp::Sum, count));
}

void check_point_to_point(Communicator& c, Checker& k) {
  const std::uint32_t n = c.size(), r = c.rank();
  for (std::size_t bytes : {std::size_t{100}, std::size_t{200'000}}) {
    const auto out = encode(inputs(r, bytes, DType::U8), DType::U8);
    std::vector<std::byte> in(bytes);
    auto s = c.send(out, (r + 1) % n, 7);
    auto v = c.recv(in, (r + n - 1) % n, 7);
    k.status(v.wait(), str_format("{} recv of {} bytes on '{}'", c.backend(), bytes, c.group()));
    k.status(s.wait(), str_format("{} send of {} bytes on '{}'", c.backend(), bytes, c.group()));
    k.expect(in == encode(inputs((r + n - 1) % n, bytes, DType::U8), DType::U8),
             str_format("{} recv of {} bytes on '{}': content", c.backend(), bytes, c.group()));
  }
}

/// all_reduce with the send in the group's shared memory (read where it is), out of place and in
/// place, from the flat path to several steps.
void check_zero_copy(Communicator& c, Checker& k) {
  for (DType t : {DType::F32, DType::BF16, DType::I64})
    for (std::size_t count : {std::size_t{7}, std::size_t{20'001}, std::size_t{100'003}}) {
      const std::size_t bytes = count * size_of(t);
      auto send = c.allocate(bytes);
      k.expect(send.has_value(), send ? "" : "allocate: " + send.error().message());
      if (!send) return;
      const auto mine = encode(inputs(c.rank(), count, t), t);
      const auto want = expected(c.size(), count, t, ReduceOp::Sum);
      std::memcpy(send->data(), mine.data(), bytes);
      std::vector<std::byte> out(bytes);
      k.status(c.all_reduce(*send, out, t, ReduceOp::Sum).wait(),
               label(c, "zero-copy all_reduce", t, ReduceOp::Sum, count));
      k.expect(out == want, label(c, "zero-copy all_reduce result", t, ReduceOp::Sum, count));
      k.expect(std::equal(mine.begin(), mine.end(), send->begin()),
               label(c, "zero-copy send kept", t, ReduceOp::Sum, count));
      k.status(c.all_reduce(*send, *send, t, ReduceOp::Sum).wait(),
               label(c, "in-place zero-copy all_reduce", t, ReduceOp::Sum, count));
      k.expect(std::equal(want.begin(), want.end(), send->begin()),
               label(c, "in-place zero-copy all_reduce result", t, ReduceOp::Sum, count));
    }
}

void check_overlap(Communicator& c, Checker& k) {
  // Three calls in flight at once, waited for in reverse order.
  constexpr std::size_t kCount = 100'000;
  std::vector<std::vector<std::byte>> ins, outs;
  std::vector<Work> works;
  for (int i = 0; i < 3; ++i) {
    ins.push_back(encode(inputs(c.rank() + i, kCount, DType::F32), DType::F32));
    outs.emplace_back(ins.back().size());
  }
  for (int i = 0; i < 3; ++i) works.push_back(c.all_reduce(ins[i], outs[i], DType::F32, ReduceOp::Max));
  for (int i = 2; i >= 0; --i) k.status(works[i].wait(), str_format("{} overlapping all_reduce {}", c.backend(), i));
  for (int i = 0; i < 3; ++i) {
    std::vector<double> acc = inputs(i, kCount, DType::F32);
    for (std::uint32_t j = 1; j < c.size(); ++j) {
      const auto v = inputs(j + i, kCount, DType::F32);
      for (std::size_t e = 0; e < kCount; ++e) acc[e] = std::max(acc[e], v[e]);
    }
    k.expect(outs[i] == encode(acc, DType::F32), str_format("{} overlapping all_reduce {} result", c.backend(), i));
  }
}

/// Vulkan collectives over the group (reduction in a compute shader on one host; across hosts
/// each rank stages through its pinned host memory, in pipelined pieces, and the group carries the
/// exchange). Skipped where no Vulkan device imports host memory.
void check_vulkan(Communicator& c, Checker& k, const mpi::Communicator& job) {
  auto ctx = VulkanContext::create();
  if (!ctx || !ctx->capabilities().memory_host_import) {
    if (c.rank() == 0) std::printf("mesh-collectives: vulkan collectives skipped: no device imports host memory\n");
    return;
  }
  // The key names the host's segment: unique to this job by rank 0's pid.
  std::int64_t pid = ::getpid();
  k.status(c.broadcast(std::as_writable_bytes(std::span(&pid, 1)), 0, DType::I64).wait(), "broadcast of a pid");
  auto vc = VulkanCollectives::open(*ctx, c, {.key = str_format("{}-vk-{}", c.group(), pid), .chunk_bytes = 64 << 10});
  k.status(vc ? Status{} : Status(std::unexpected(vc.error())), "opening Vulkan collectives");
  if (!vc) return;
  bool one_host = true;
  for (int q = 0; q < job.size(); ++q) one_host = one_host && job.location(q).host == job.location(0).host;
  k.expect((*vc)->shared_segment() == one_host, "Vulkan collectives: " + (*vc)->segment_reason());
  const std::uint32_t n = c.size(), r = c.rank();
  auto buffer = [&](const std::vector<std::byte>& bytes, std::uint64_t size) {
    auto b = GpuBuffer::allocate(*ctx, {.size = std::max<std::uint64_t>({size, bytes.size(), 1})});
    if (b && !bytes.empty()) k.status(upload(*ctx, *b, bytes), "upload");
    return b;
  };
  auto read = [&](const GpuBuffer& b, std::size_t bytes) {
    std::vector<std::byte> out(bytes);
    k.status(download(*ctx, b, out), "download");
    return out;
  };
  const std::string how = (*vc)->shared_segment() ? "shared" : "staged";
  // Sizes of one piece and of several, the last one short.
  for (std::size_t count : {std::size_t{3}, std::size_t{150'001}}) {
    for (auto [t, op] : {std::pair{DType::F32, ReduceOp::Sum}, std::pair{DType::BF16, ReduceOp::Average},
                         std::pair{DType::I64, ReduceOp::Max}}) {
      const std::string what = str_format("Vulkan {} {} {} × {}", how, to_string(t), to_string(op), count);
      const auto mine = encode(inputs(r, count, t), t);
      auto send = buffer(mine, 0), recv = buffer({}, mine.size());
      if (!send || !recv) return k.expect(false, "allocate");
      k.status((*vc)->all_reduce(device_span(*send), device_span(*recv, mine.size()), t, op), "all_reduce " + what);
      k.expect(read(*recv, mine.size()) == expected(n, count, t, op), "all_reduce result " + what);
      const auto big = encode(inputs(r, count * n, t), t);
      const auto want = expected(n, count * n, t, op);
      auto bsend = buffer(big, 0);
      if (!bsend) return k.expect(false, "allocate");
      k.status((*vc)->reduce_scatter(device_span(*bsend), device_span(*recv, mine.size()), t, op),
               "reduce_scatter " + what);
      const auto block = read(*recv, mine.size());
      k.expect(std::equal(block.begin(), block.end(), want.begin() + static_cast<std::ptrdiff_t>(r * block.size())),
               "reduce_scatter result " + what);
    }
    const auto mine = encode(inputs(r, count, DType::U8), DType::U8);
    const auto all = gathered(n, count, DType::U8);
    auto send = buffer(mine, 0), recv = buffer({}, all.size());
    if (!send || !recv) return k.expect(false, "allocate");
    k.status((*vc)->all_gather(device_span(*send), device_span(*recv, all.size()), DType::U8), "Vulkan all_gather");
    k.expect(read(*recv, all.size()) == all, str_format("Vulkan {} all_gather of {} bytes", how, count));
    const auto root = encode(inputs(n - 1, count, DType::U8), DType::U8);
    auto b = buffer(r == n - 1 ? root : std::vector<std::byte>(count), 0);
    if (!b) return k.expect(false, "allocate");
    k.status((*vc)->broadcast(device_span(*b), n - 1, DType::U8), "Vulkan broadcast");
    k.expect(read(*b, count) == root, str_format("Vulkan {} broadcast of {} bytes", how, count));
  }
}

/// CUDA collectives over the group (kernels on one host; across hosts each rank stages through its
/// pinned host memory, in pipelined pieces, and the group carries the exchange). Skipped without a
/// CUDA device, or in a build without them.
void check_cuda(Communicator& c, Checker& k, const mpi::Communicator& job) {
#if LAVAFLOW_TEST_MESH_CUDA
  using lftest::DeviceBytes;
  int devices = 0;
  if (cudaGetDeviceCount(&devices) != cudaSuccess || devices == 0) {
    (void)cudaGetLastError();
    if (c.rank() == 0) std::printf("mesh-collectives: CUDA collectives skipped: no CUDA device\n");
    return;
  }
  const std::uint32_t n = c.size(), r = c.rank();
  const int device = static_cast<int>(r % static_cast<std::uint32_t>(devices));
  (void)cudaSetDevice(device);
  // Several ranks on a GPU: smaller steps keep the kernels' staging small.
  auto cc = CudaCollectives::open(c, {.device = device, .chunk_bytes = 1 << 20});
  k.status(cc ? Status{} : Status(std::unexpected(cc.error())), "opening CUDA collectives");
  if (!cc) return;
  bool one_host = true;
  for (int q = 0; q < job.size(); ++q) one_host = one_host && job.location(q).host == job.location(0).host;
  k.expect((*cc)->staged() == !one_host, "CUDA collectives: " + (*cc)->path_reason());
  cudaStream_t st = nullptr;
  (void)cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking);
  auto done = [&](Status s) {
    if (s && cudaStreamSynchronize(st) != cudaSuccess) s = fail(Errc::Driver, "cudaStreamSynchronize", "");
    return s ? (*cc)->check() : s;
  };
  const std::string how = (*cc)->staged() ? "staged" : "kernels";
  if (r == 0) std::printf("mesh-collectives: CUDA collectives, %s: %s\n", how.c_str(), (*cc)->path_reason().c_str());
  // One piece, and several pieces with a short last one (1 MiB slots).
  for (std::size_t count : {std::size_t{3}, std::size_t{700'001}}) {
    for (auto [t, op] : {std::pair{DType::F32, ReduceOp::Sum}, std::pair{DType::BF16, ReduceOp::Average},
                         std::pair{DType::F16, ReduceOp::Sum}, std::pair{DType::I64, ReduceOp::Max}}) {
      const std::string what = str_format("CUDA {} {} {} × {}", how, to_string(t), to_string(op), count);
      const auto mine = encode(inputs(r, count, t), t);
      DeviceBytes send(mine.size(), mine), recv(mine.size());
      k.status(done((*cc)->all_reduce(send.p, recv.p, mine.size(), t, op, st)), "all_reduce " + what);
      k.expect(recv.read() == expected(n, count, t, op), "all_reduce result " + what);
      k.status(done((*cc)->all_reduce(send.p, send.p, mine.size(), t, op, st)), "in-place all_reduce " + what);
      k.expect(send.read() == expected(n, count, t, op), "in-place all_reduce result " + what);
      const auto big = encode(inputs(r, count * n, t), t);
      const auto want = expected(n, count * n, t, op);
      DeviceBytes bsend(big.size(), big);
      k.status(done((*cc)->reduce_scatter(bsend.p, recv.p, mine.size(), t, op, st)), "reduce_scatter " + what);
      const auto block = recv.read();
      k.expect(std::equal(block.begin(), block.end(), want.begin() + static_cast<std::ptrdiff_t>(r * block.size())),
               "reduce_scatter result " + what);
    }
    const auto mine = encode(inputs(r, count, DType::U8), DType::U8);
    const auto all = gathered(n, count, DType::U8);
    DeviceBytes send(mine.size(), mine), recv(all.size());
    k.status(done((*cc)->all_gather(send.p, recv.p, count, DType::U8, st)), "CUDA all_gather");
    k.expect(recv.read() == all, str_format("CUDA {} all_gather of {} bytes", how, count));
    const auto root = encode(inputs(n - 1, count, DType::U8), DType::U8);
    DeviceBytes b(count, r == n - 1 ? root : std::vector<std::byte>(count));
    k.status(done((*cc)->broadcast(b.p, count, n - 1, DType::U8, st)), "CUDA broadcast");
    k.expect(b.read() == root, str_format("CUDA {} broadcast of {} bytes", how, count));
  }
  (void)cudaStreamDestroy(st);
#else
  (void)job;
  if (c.rank() == 0) std::printf("mesh-collectives: CUDA collectives skipped: built without them\n");
  (void)k;
#endif
}

void run_all(const mpi::Communicator& job, Checker& k) {
  const auto n = static_cast<std::uint32_t>(job.size()), me = static_cast<std::uint32_t>(job.rank());
  auto open = mpi_communicators(job, {.chunk_bytes = 64 << 10, .arena_bytes = 8 << 20});
  for (Backend b : mpi_backends()) {
    std::vector<std::unique_ptr<Communicator>> comms;
    std::vector<std::uint32_t> all, part;
    for (std::uint32_t r = 0; r < n; ++r) all.push_back(r);
    // A subset group: the even ranks, or the odd ones (each rank is in one of the two).
    for (std::uint32_t r = me % 2; r < n; r += 2) part.push_back(r);
    for (auto& g : {ProcessGroup{str_format("world-{}", to_string(b)), all, b},
                    ProcessGroup{str_format("{}-{}", me % 2 ? "odd" : "even", to_string(b)), part, b}}) {
      auto c = open(g, me);
      k.status(c ? Status{} : Status(std::unexpected(c.error())), str_format("opening {}", g.name));
      if (c) comms.push_back(std::move(*c));
    }
    for (auto& c : comms) {
      for (DType t : kTypes)
        for (ReduceOp op : kOps)
          for (std::size_t count : {std::size_t{1}, std::size_t{7}, std::size_t{20'001}})
            check_reductions(*c, k, count, t, op);
      // Several staging chunks (64 KiB here), and a size that is not a multiple of the ranks.
      check_reductions(*c, k, 100'003, DType::F32, ReduceOp::Sum);
      check_reductions(*c, k, 70'001, DType::BF16, ReduceOp::Average);
      // Between hosts, reduce-scatters in 1 MiB pieces of each block: three hosts' blocks of this
      // all_reduce are 1 MiB, 1 MiB and 1 MiB + 4 B (one host takes a second piece the others
      // do not), and reduce_scatter's blocks take four pieces, the last of 4 B.
      check_reductions(*c, k, 786'433, DType::F32, ReduceOp::Sum);
      if (b == Backend::Native && c->size() == n) check_f16_average_range(*c, k);  // subsets: not worked out
      for (DType t : kTypes)
        for (std::size_t count : {std::size_t{1}, std::size_t{9}, std::size_t{50'001}}) check_moves(*c, k, count, t);
      k.status(c->barrier().wait(), str_format("{} barrier on '{}'", c->backend(), c->group()));
      check_nan_wins(*c, k);
      if (b == Backend::Native) check_shifted_reduce_scatter(*c, k);
      check_late(*c, k);
      check_point_to_point(*c, k);
      check_overlap(*c, k);
      if (b == Backend::Native) check_zero_copy(*c, k);
      if (b == Backend::Native && c->size() == n) check_vulkan(*c, k, job);
      if (b == Backend::Native && c->size() == n) check_cuda(*c, k, job);
    }
    if (me == 0)
      std::printf("mesh-collectives: %s: %zu groups checked (%u ranks)\n", to_string(b).data(), comms.size(), n);
  }
}

void run_timeout(const mpi::Communicator& job, Checker& k) {
  const auto n = static_cast<std::uint32_t>(job.size()), me = static_cast<std::uint32_t>(job.rank());
  // Whether the late rank is on a host of its own (the simulated hosts' runs).
  char name[256] = {}, last[256] = {};
  (void)::gethostname(name, sizeof name - 1);
  if (me == n - 1) std::memcpy(last, name, sizeof last);
  MPI_Bcast(last, sizeof last, MPI_CHAR, static_cast<int>(n - 1), job.comm());
  int alone = 1, mine = me == n - 1 || std::strcmp(name, last) != 0;
  MPI_Allreduce(&mine, &alone, 1, MPI_INT, MPI_MIN, job.comm());
  const bool across = alone != 0;
  auto open = mpi_communicators(job);
  std::vector<std::uint32_t> all;
  for (std::uint32_t r = 0; r < n; ++r) all.push_back(r);
  for (Backend b : mpi_backends()) {
    auto c = open({str_format("late-{}", to_string(b)), all, b}, me);
    k.status(c ? Status{} : Status(std::unexpected(c.error())), "opening the group");
    if (!c) return;
    // For the whole run: after a timeout MPI may still write into the timed-out call's buffers
    // (when the late rank joins), as design note 0016 says.
    static float xs[4], ys[4];
    float& x = xs[static_cast<int>(b)];
    float& y = ys[static_cast<int>(b)];
    x = 1;
    auto one = [&] {
      return (*c)->all_reduce(std::as_bytes(std::span(&x, 1)), std::as_writable_bytes(std::span(&y, 1)), DType::F32,
                              ReduceOp::Sum, {.timeout = std::chrono::milliseconds(800)});
    };
    if (me + 1 < n) {
      const auto t0 = Clock::now();
      auto s = one().wait();
      const auto took = Clock::now() - t0;
      // A Gloo rank that times out closes its connections: a peer may see that first.
      k.expect(!s && (s.error().code() == Errc::Timeout || (b == Backend::Gloo && s.error().code() == Errc::PeerLost)),
               str_format("{}: a call without rank {} ends in Timeout ({})", to_string(b), n - 1,
                          s ? "it succeeded" : s.error().message()));
      if (b == Backend::Native && !s)
        k.expect(s.error().message().find(str_format("rank {} (world {})", n - 1, n - 1)) != std::string::npos &&
                     s.error().message().find(str_format("late-{}", to_string(b))) != std::string::npos,
                 "the timeout names the missing rank and the group: " + s.error().message());
      k.expect(took < std::chrono::seconds(3), "the timeout came in time");
      MPI_Barrier(job.comm());
    } else {
      MPI_Barrier(job.comm());
      // Late: the native group is broken by now and says why; MPI's call completes the others'.
      // Between hosts nothing tells the late rank of its peers' timeout (they share no memory):
      // its exchange may still end with what they had sent before they gave up, and its next
      // call times out.
      auto s = one().wait(std::chrono::seconds(5));
      if (b == Backend::Native && !across)
        k.expect(!s && s.error().code() == Errc::Timeout, "the late rank learns the group timed out");
      if (b == Backend::Native && across)
        k.expect(s || s.error().code() == Errc::Timeout,
                 "the late rank's exchange ends or times out: " + (s ? std::string() : s.error().message()));
    }
    MPI_Barrier(job.comm());
  }
  if (me == 0) std::printf("mesh-collectives: timeouts name the missing rank\n");
}

int run_kill(const mpi::Communicator& job, Checker& k) {
  const auto n = static_cast<std::uint32_t>(job.size()), me = static_cast<std::uint32_t>(job.rank());
  auto open = mpi_communicators(job);
  std::vector<std::uint32_t> all;
  for (std::uint32_t r = 0; r < n; ++r) all.push_back(r);
  std::vector<std::unique_ptr<Communicator>> comms;
  for (Backend b : {Backend::Native, Backend::Mpi}) {
    auto c = open({str_format("doomed-{}", to_string(b)), all, b}, me);
    if (!c) {
      k.status(std::unexpected(c.error()), "opening the group");
      return 1;
    }
    comms.push_back(std::move(*c));
  }
  float x = 1, y = 0;
  for (auto& c : comms)
    k.status(c->all_reduce(std::as_bytes(std::span(&x, 1)), std::as_writable_bytes(std::span(&y, 1)), DType::F32,
                           ReduceOp::Sum)
                 .wait(),
             "the call before the exit");
  if (me == n - 1) _exit(0);  // gone, without a word
  for (auto& c : comms) {
    const auto t0 = Clock::now();
    auto s = c->all_reduce(std::as_bytes(std::span(&x, 1)), std::as_writable_bytes(std::span(&y, 1)), DType::F32,
                           ReduceOp::Sum, {.timeout = std::chrono::seconds(20)})
                 .wait();
    k.expect(!s && s.error().code() == Errc::PeerLost &&
                 s.error().message().find(str_format("rank {} (world {})", n - 1, n - 1)) != std::string::npos,
             str_format("{}: the exited rank is reported lost ({})", c->backend(),
                        s ? "the call succeeded" : s.error().message()));
    k.expect(Clock::now() - t0 < std::chrono::seconds(5), "reported in time");
  }
  // The survivors stay a moment, so that none of them is taken for lost by a slower one.
  std::this_thread::sleep_for(std::chrono::seconds(1));
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  int provided = 0;
  MPI_Init_thread(&argc, &argv, MPI_THREAD_MULTIPLE, &provided);
  const std::string mode = argc > 1 ? argv[1] : "all";
  Checker k;
  MPI_Comm_rank(MPI_COMM_WORLD, &k.rank);
  int failures = 0;
  {
    auto job = mpi::Communicator::create();
    if (!job) {
      std::fprintf(stderr, "mesh-collectives: FAILED: %s\n", job.error().message().c_str());
      MPI_Abort(MPI_COMM_WORLD, 1);
    }
    if (mode == "kill") {
      run_kill(*job, k);
      // The dead rank never joins MPI_Finalize's barrier: each survivor reports for itself.
      std::printf("mesh-collectives rank %d: %s (%llu checks)\n", k.rank, k.failures ? "FAILED" : "kill OK",
                  static_cast<unsigned long long>(k.checks));
      std::fflush(stdout);
      _exit(k.failures ? 1 : 0);
    }
    if (mode == "timeout") {
      run_timeout(*job, k);
    } else {
      run_all(*job, k);
    }
    MPI_Reduce(&k.failures, &failures, 1, MPI_INT, MPI_SUM, 0, job->comm());
    unsigned long long checks = k.checks, total = 0;
    MPI_Reduce(&checks, &total, 1, MPI_UNSIGNED_LONG_LONG, MPI_SUM, 0, job->comm());
    if (k.rank == 0 && failures) std::printf("mesh-collectives: FAILED (%d)\n", failures);
    if (k.rank == 0 && !failures) std::printf("mesh-collectives: OK (%llu checks)\n", total);
    MPI_Bcast(&failures, 1, MPI_INT, 0, job->comm());
  }
  MPI_Finalize();
  return failures ? 1 : 0;
}
