// SPDX-License-Identifier: MIT
// The mesh layer without MPI: topologies and their groups, the device mesh, the shared host
// reduction, and every collective on the Mock backend (ranks as threads of this process).
#include <bit>
#include <catch2/catch.hpp>
#include <cmath>
#include <cstring>
#include <functional>
#include <thread>

#include "lavaflow/core/detail/format.hpp"
#include "lavaflow/mesh/mesh.hpp"
#include "lavaflow/mesh/mock.hpp"
#include "mesh_reference.hpp"
#include "support.hpp"

using namespace lavaflow;
using namespace lavaflow::mesh;
using namespace std::chrono_literals;
using namespace lftest::mesh_ref;

namespace {

std::vector<std::vector<std::uint32_t>> ranks_of(const std::vector<GroupSpec>& groups, const std::string& prefix) {
  std::vector<std::vector<std::uint32_t>> out;
  for (const auto& g : groups)
    if (g.name.starts_with(prefix)) out.push_back(g.ranks);
  return out;
}

/// Runs `body(rank)` on one thread per rank and returns what each returned (Catch2 asserts stay on
/// this thread).
template <class T>
std::vector<T> on_ranks(std::uint32_t n, const std::function<T(std::uint32_t)>& body) {
  std::vector<T> out(n);
  std::vector<std::thread> threads;
  for (std::uint32_t r = 0; r < n; ++r) threads.emplace_back([&, r] { out[r] = body(r); });
  for (auto& t : threads) t.join();
  return out;
}

}  // namespace

TEST_CASE("mesh topologies: validation names the product that does not fit, groups follow the layout") {
  CHECK(validate(DataParallel{}, 5).has_value());
  auto e = lftest::err(validate(Mixed{2, 2, 3}, 8));
  CHECK(e.code() == Errc::InvalidArgument);
  CHECK(e.message().find("tp × pp × dp = 2 × 2 × 3 = 12 does not match the world size 8") != std::string::npos);
  e = lftest::err(validate(TensorParallel{4, {2, 3}}, 8));
  CHECK(e.message().find("mesh shape 2 × 3 = 6 does not match the tensor-parallel degree 4") != std::string::npos);
  e = lftest::err(validate(TensorParallel{4, {2, 2}}, 6));
  CHECK(e.message().find("world size 6 is not a multiple of the tensor-parallel degree 4") != std::string::npos);
  e = lftest::err(validate(PipelineParallel{0}, 4));
  CHECK(e.message().find("pipeline stage count must be at least 1") != std::string::npos);
  CHECK(lftest::err(validate(DataParallel{}, 0)).code() == Errc::InvalidArgument);

  // 8 ranks as tp 2 × pp 2 × dp 2: rank = (replica × 2 + stage) × 2 + shard.
  const auto g = lftest::ok(topology_groups(Mixed{2, 2, 2}, 8));
  using V = std::vector<std::vector<std::uint32_t>>;
  CHECK(ranks_of(g, "tp_") == V{{0, 1}, {2, 3}, {4, 5}, {6, 7}});
  CHECK(ranks_of(g, "pp_") == V{{0, 2}, {1, 3}, {4, 6}, {5, 7}});
  CHECK(ranks_of(g, "dp_") == V{{0, 4}, {1, 5}, {2, 6}, {3, 7}});
  // Pipeline-parallel over 6 ranks: two pipelines of three stages; dp_j holds stage j.
  const auto p = lftest::ok(topology_groups(PipelineParallel{3}, 6));
  CHECK(ranks_of(p, "pp_") == V{{0, 1, 2}, {3, 4, 5}});
  CHECK(ranks_of(p, "dp_") == V{{0, 3}, {1, 4}, {2, 5}});
  CHECK(ranks_of(p, "tp_").empty());
  // Tensor-parallel degree 3 over 6 ranks (not a power of two).
  const auto t = lftest::ok(topology_groups(TensorParallel{3, {1, 3}}, 6));
  CHECK(ranks_of(t, "tp_") == V{{0, 1, 2}, {3, 4, 5}});
  CHECK(ranks_of(t, "dp_") == V{{0, 3}, {1, 4}, {2, 5}});
  CHECK(lftest::ok(topology_groups(DataParallel{}, 1)).empty());
}

TEST_CASE("device mesh: topology groups, groups by hand, membership, reshape and stats") {
  std::vector<RankInfo> ranks;
  for (int r = 0; r < 6; ++r)
    ranks.push_back({r < 4 ? "node-a" : "node-b", {{"GPU " + std::to_string(r), 80ull << 30}}});
  CHECK(lftest::err(DeviceMesh::create(6, ranks)).code() == Errc::InvalidArgument);
  auto m = lftest::ok(DeviceMesh::create(4, ranks, Backend::Mock));
  CHECK(m.world_size() == 6);
  CHECK(lftest::ok(m.get_group("world"))->ranks.size() == 6);

  lftest::ok(m.with_topology(Mixed{3, 1, 2}));
  CHECK(m.group_rank("tp_1") == 1u);  // tp_1 = {3, 4, 5}
  CHECK_FALSE(m.in_group("tp_0"));
  CHECK(m.group_rank("dp_1") == 1u);  // dp_1 = {1, 4}
  CHECK(lftest::err(m.get_group("tp_9")).code() == Errc::NotFound);

  CHECK(lftest::err(m.add_group({"odd", {0, 0}})).message().find("twice") != std::string::npos);
  CHECK(lftest::err(m.add_group({"far", {0, 6}})).message().find("rank 6 of a world of 6") != std::string::npos);
  CHECK(lftest::err(m.add_group({"world", {0}})).message().find("already exists") != std::string::npos);
  lftest::ok(m.add_group({"edges", {5, 0, 4}, Backend::Gloo}));
  CHECK(m.group_rank("edges") == 2u);

  // A topology that does not fit changes nothing; one that does replaces only its own groups.
  CHECK_FALSE(m.reshape(Mixed{4, 1, 2}).has_value());
  CHECK(m.in_group("tp_1"));
  lftest::ok(m.reshape(PipelineParallel{2}));
  CHECK_FALSE(m.get_group("tp_1").has_value());
  CHECK(lftest::ok(m.get_group("pp_2"))->ranks == std::vector<std::uint32_t>{4, 5});
  CHECK(m.in_group("edges"));
  CHECK(lftest::err(m.add_group({"pp_0", {1}})).code() == Errc::InvalidArgument);

  const auto s = m.stats();
  CHECK(s.ranks == 6);
  CHECK(s.hosts == 2);
  CHECK(s.ranks_per_host.at("node-a") == 4);
  CHECK(s.devices == 6);
  CHECK(s.memory_bytes == 6 * (80ull << 30));
  CHECK(s.backends == std::set<Backend>{Backend::Mock, Backend::Gloo});
  const auto text = m.describe();
  CHECK(text.find("pipeline-parallel (2 stages)") != std::string::npos);
  CHECK(text.find("group edges (gloo): ranks 5 0 4") != std::string::npos);
}

TEST_CASE("subgroups: group ranks become the group's world ranks, on its backend, ranks outside it refused") {
  std::vector<ProcessGroup> asked;
  const CommunicatorFactory record = [&](const ProcessGroup& g,
                                         std::uint32_t world_rank) -> Result<std::unique_ptr<Communicator>> {
    asked.push_back(g);
    CHECK(world_rank == 4);
    return fail(Errc::Unsupported, "test", "recorded");
  };
  const SubgroupOpener open = subgroups({"edges", {5, 0, 4}, Backend::Gloo}, 4, record);
  CHECK(lftest::err(open("edges[1,2]", {1, 2})).code() == Errc::Unsupported);
  REQUIRE(asked.size() == 1);
  CHECK(asked[0].name == "edges[1,2]");
  CHECK(asked[0].ranks == std::vector<std::uint32_t>{0, 4});
  CHECK(asked[0].backend == Backend::Gloo);
  const auto outside = lftest::err(open("edges[2,3]", {2, 3}));
  CHECK(outside.code() == Errc::InvalidArgument);
  CHECK(outside.message().find("names rank 3 of group 'edges' of 3") != std::string::npos);
  CHECK(asked.size() == 1);
}

TEST_CASE("host reduction: every type and op against a reference, and f16 and bf16 round to nearest even") {
  for (DType t : kTypes)
    for (ReduceOp op : kOps) {
      INFO(to_string(t) << " " << to_string(op));
      constexpr std::size_t kCount = 3000;  // more than one chunk
      std::vector<std::vector<std::byte>> in;
      for (std::uint32_t r = 0; r < 3; ++r) in.push_back(encode(inputs(r, kCount, t), t));
      std::vector<std::span<const std::byte>> spans(in.begin(), in.end());
      std::vector<std::byte> out(in[0].size());
      lftest::ok(reduce(spans, out, t, op));
      CHECK(out == expected(3, kCount, t, op));
      lftest::ok(reduce(spans, in[1], t, op));  // into one of the inputs
      CHECK(in[1] == expected(3, kCount, t, op));
    }
  std::vector<std::byte> a(8), b(6);
  std::vector<std::span<const std::byte>> two{a, b};
  CHECK(lftest::err(reduce(two, a, DType::F32, ReduceOp::Sum)).code() == Errc::InvalidArgument);
  std::vector<std::byte> odd(6);
  std::vector<std::span<const std::byte>> one{odd};
  CHECK(lftest::err(reduce(one, odd, DType::I32, ReduceOp::Sum)).message().find("whole number") != std::string::npos);

  CHECK(to_f16(1.0f) == 0x3C00);
  CHECK(to_f16(65504.0f) == 0x7BFF);
  CHECK(to_f16(65520.0f) == 0x7C00);               // rounds up to infinity
  CHECK(to_f16(1.0f + 1.0f / 2048) == 0x3C00);     // halfway: to even
  CHECK(to_f16(1.0f + 3.0f / 2048) == 0x3C02);     // halfway: to even (up)
  CHECK(to_f16(std::ldexp(1.0f, -24)) == 0x0001);  // smallest subnormal
  CHECK(from_f16(0x0001) == std::ldexp(1.0f, -24));
  CHECK(std::isnan(from_f16(to_f16(std::nanf("")))));
  CHECK(to_bf16(1.0f) == 0x3F80);
  CHECK(to_bf16(std::bit_cast<float>(0x3F808000u)) == 0x3F80);  // halfway: to even
  CHECK(to_bf16(std::bit_cast<float>(0x3F818000u)) == 0x3F82);
  CHECK(std::isnan(from_bf16(to_bf16(std::nanf("")))));
  for (std::uint32_t h = 0; h < 0x7C00; ++h) REQUIRE(to_f16(from_f16(static_cast<std::uint16_t>(h))) == h);
}

TEST_CASE("wide reduction: f16 and bf16 partials in f32, rounded once when narrowed") {
  const std::uint16_t big = to_f16(40000.0f);
  std::vector<std::vector<std::byte>> in;
  for (int r = 0; r < 3; ++r) {
    std::vector<std::byte> v(4);
    std::memcpy(v.data(), &big, 2);
    const std::uint16_t small = to_f16(static_cast<float>(r + 1));
    std::memcpy(v.data() + 2, &small, 2);
    in.push_back(v);
  }
  std::vector<std::span<const std::byte>> spans(in.begin(), in.end());
  std::vector<float> wide(2);
  lftest::ok(reduce_wide(spans, wide, DType::F16, ReduceOp::Sum));
  CHECK(wide == std::vector<float>{120000.0f, 6.0f});  // past f16's range, not rounded
  std::vector<std::byte> out(4);
  narrow(wide, out, DType::F16, 3);  // an Average of three: 40000 and 2
  std::uint16_t h[2];
  std::memcpy(h, out.data(), 4);
  CHECK(h[0] == big);
  CHECK(from_f16(h[1]) == 2.0f);
  lftest::ok(reduce_wide(spans, wide, DType::F16, ReduceOp::Max));
  CHECK(wide == std::vector<float>{40000.0f, 3.0f});
  CHECK(lftest::err(reduce_wide(spans, wide, DType::F32, ReduceOp::Sum)).code() == Errc::InvalidArgument);
  std::vector<float> short_out(1);
  CHECK(lftest::err(reduce_wide(spans, short_out, DType::BF16, ReduceOp::Sum)).code() == Errc::InvalidArgument);
}

TEST_CASE("Mock backend: every collective, type and reduce op on 2, 3 and 4 ranks matches the reference") {
  for (std::uint32_t n : {2u, 3u, 4u}) {
    auto world = MockWorld::create(n);
    std::vector<std::uint32_t> all;
    for (std::uint32_t r = 0; r < n; ++r) all.push_back(r);
    constexpr std::size_t kCount = 12;  // divisible by 2, 3 and 4: reduce_scatter blocks
    auto results = on_ranks<std::string>(n, [&](std::uint32_t r) -> std::string {
      auto c = world->communicator("world", all, r);
      if (!c) return c.error().message();
      Communicator& comm = **c;
      for (DType t : kTypes) {
        const auto mine = encode(inputs(r, kCount, t), t);
        for (ReduceOp op : kOps) {
          const auto want = expected(n, kCount, t, op);
          std::vector<std::byte> out(mine.size());
          if (auto ok = comm.all_reduce(mine, out, t, op).wait(); !ok) return ok.error().message();
          if (out != want) return str_format("all_reduce {} {} differs", to_string(t), to_string(op));
          std::vector<std::byte> inplace = mine;  // in place
          if (auto ok = comm.all_reduce(inplace, inplace, t, op).wait(); !ok) return ok.error().message();
          if (inplace != want) return "in-place all_reduce differs";
          const std::size_t block = mine.size() / n;
          std::vector<std::byte> part(block);
          if (auto ok = comm.reduce_scatter(mine, part, t, op).wait(); !ok) return ok.error().message();
          if (!std::equal(part.begin(), part.end(), want.begin() + std::ptrdiff_t(r * block)))
            return "reduce_scatter block differs";
        }
        std::vector<std::byte> gathered(mine.size() * n);
        if (auto ok = comm.all_gather(mine, gathered, t).wait(); !ok) return ok.error().message();
        for (std::uint32_t q = 0; q < n; ++q)
          if (!std::equal(gathered.begin() + std::ptrdiff_t(q * mine.size()),
                          gathered.begin() + std::ptrdiff_t((q + 1) * mine.size()),
                          encode(inputs(q, kCount, t), t).begin()))
            return "all_gather block differs";
        std::vector<std::byte> b = mine;
        if (auto ok = comm.broadcast(b, n - 1, t).wait(); !ok) return ok.error().message();
        if (b != encode(inputs(n - 1, kCount, t), t)) return "broadcast differs";
      }
      if (auto ok = comm.barrier().wait(); !ok) return ok.error().message();
      return "";
    });
    for (std::uint32_t r = 0; r < n; ++r) {
      INFO(n << " ranks, rank " << r);
      CHECK(results[r] == "");
    }
  }
}

TEST_CASE("Mock backend: subset groups, asynchronous calls that overlap, send and recv") {
  auto world = MockWorld::create(5);
  const std::vector<std::uint32_t> odd{1, 3};
  auto results = on_ranks<std::string>(5, [&](std::uint32_t r) -> std::string {
    auto w = world->communicator("world", {0, 1, 2, 3, 4}, r);
    if (!w) return w.error().message();
    std::int64_t one = 1, total = 0;
    // Two calls in flight at once, waited in reverse order: matched by call order, not timing.
    std::int64_t rank_sum = r, got = 0;
    auto first = (*w)->all_reduce(std::as_bytes(std::span(&one, 1)), std::as_writable_bytes(std::span(&total, 1)),
                                  DType::I64, ReduceOp::Sum);
    auto second = (*w)->all_reduce(std::as_bytes(std::span(&rank_sum, 1)), std::as_writable_bytes(std::span(&got, 1)),
                                   DType::I64, ReduceOp::Max);
    if (auto ok = second.wait(); !ok) return ok.error().message();
    if (auto ok = first.wait(); !ok) return ok.error().message();
    if (total != 5 || got != 4) return str_format("got {} and {}", total, got);
    if (r % 2 == 1) {  // a group of two of the five
      auto g = world->communicator("odd", odd, r);
      if (!g) return g.error().message();
      float x = float(r), y = 0;
      if (auto ok = (*g)->all_reduce(std::as_bytes(std::span(&x, 1)), std::as_writable_bytes(std::span(&y, 1)),
                                     DType::F32, ReduceOp::Average)
                        .wait();
          !ok)
        return ok.error().message();
      if (y != 2.0f) return str_format("average {}", y);
      // Point to point inside the group, both directions, tagged.
      const std::uint32_t peer = (*g)->rank() ^ 1u;
      std::uint32_t out = r * 100, in = 0;
      if (auto ok = (*g)->send(std::as_bytes(std::span(&out, 1)), peer, 7).wait(); !ok) return ok.error().message();
      if (auto ok = (*g)->recv(std::as_writable_bytes(std::span(&in, 1)), peer, 7).wait(); !ok)
        return ok.error().message();
      if (in != (r ^ 2u) * 100) return str_format("received {}", in);
    }
    return "";
  });
  for (std::uint32_t r = 0; r < 5; ++r) {
    INFO("rank " << r);
    CHECK(results[r] == "");
  }
  CHECK(lftest::err(world->communicator("odd", odd, 2)).message().find("not in group") != std::string::npos);
  CHECK(lftest::err(world->communicator("odd", {1, 4}, 1)).message().find("other ranks") != std::string::npos);
}

TEST_CASE("Mock backend: a rank that never comes is named within the timeout, and so is a mismatched call") {
  auto world = MockWorld::create(4);
  const std::vector<std::uint32_t> all{0, 1, 2, 3};
  const auto start = Clock::now();
  auto results = on_ranks<std::string>(4, [&](std::uint32_t r) -> std::string {
    auto c = world->communicator("world", all, r);
    if (!c) return c.error().message();
    if (r == 2) return "absent";  // never joins
    float x = 1, y = 0;
    auto ok = (*c)->all_reduce(std::as_bytes(std::span(&x, 1)), std::as_writable_bytes(std::span(&y, 1)), DType::F32,
                               ReduceOp::Sum, {.timeout = 200ms})
                  .wait();
    return ok ? "finished" : ok.error().message();
  });
  CHECK(Clock::now() - start < 5s);
  for (std::uint32_t r : {0u, 1u, 3u}) {
    INFO("rank " << r << ": " << results[r]);
    CHECK(results[r].find("rank 2 (world 2) of group 'world' did not join call #0 in time") != std::string::npos);
  }

  auto world2 = MockWorld::create(2);
  auto mismatch = on_ranks<std::string>(2, [&](std::uint32_t r) -> std::string {
    auto c = world2->communicator("pair", {0, 1}, r);
    if (!c) return c.error().message();
    std::int32_t x[2] = {1, 2}, y[4] = {};
    auto w = r == 0 ? (*c)->all_reduce(std::as_bytes(std::span(x)), std::as_writable_bytes(std::span(y).first(2)),
                                       DType::I32, ReduceOp::Sum, {.timeout = 2s})
                    : (*c)->all_gather(std::as_bytes(std::span(x)), std::as_writable_bytes(std::span(y)), DType::I32,
                                       {.timeout = 2s});
    auto ok = w.wait();
    return ok ? "finished" : ok.error().message();
  });
  for (const auto& m : mismatch) {
    INFO(m);
    CHECK(m.find("where another asked for") != std::string::npos);
  }
  std::uint32_t buf = 0;
  auto lone = lftest::ok(world2->communicator("lone", {0, 1}, 0));
  auto r = lone->recv(std::as_writable_bytes(std::span(&buf, 1)), 1, 0, {.timeout = 100ms}).wait();
  CHECK(lftest::err(r).message().find("nothing from rank 1 (world 1) of group 'lone'") != std::string::npos);
  CHECK(lftest::err(lone->broadcast(std::as_writable_bytes(std::span(&buf, 1)), 2, DType::U8).wait()).code() ==
        Errc::InvalidArgument);
}
