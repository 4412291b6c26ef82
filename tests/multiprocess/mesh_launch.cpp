// SPDX-License-Identifier: MIT
// A job without MPI, started by lavaflow-launch: every collective on the native backend (world
// and tensor-parallel pairs), checked against the reference on every rank.
//   lavaflow-launch -n N mesh_launch          every rank prints "mesh-launch rank R: OK"
//   lavaflow-launch -n N mesh_launch exit     the last rank exits after one call; the others get
//                                             PeerLost naming it, and print "lost rank OK"
#include <unistd.h>

#include <cstdio>
#include <string>

#include "lavaflow/core/detail/format.hpp"
#include "lavaflow/mesh/launch.hpp"
#include "mesh_reference.hpp"

using namespace lavaflow;
using namespace lavaflow::mesh;
using namespace lftest::mesh_ref;

int main(int argc, char** argv) {
  const std::string mode = argc > 1 ? argv[1] : "all";
  auto job = launched_job();
  if (!job) {
    std::printf("mesh-launch: FAILED: %s\n", job.error().message().c_str());
    return 1;
  }
  auto mesh = mesh_from_launch(*job);
  if (mesh && job->size % 2 == 0) (void)mesh->with_topology(TensorParallel{2, {1, 2}});
  int failures = 0;
  auto expect = [&](bool ok, const std::string& what) {
    if (!ok && failures++ < 10) std::printf("mesh-launch rank %u: FAILED: %s\n", job->rank, what.c_str());
  };
  const auto open = launched_communicators(*job, 64 << 10);
  for (const ProcessGroup* g : mesh->groups()) {
    if (!mesh->in_group(g->name)) continue;
    auto c = mesh->communicator(g->name, open);
    expect(c.has_value(), c ? "" : c.error().message());
    if (!c) continue;
    Communicator& comm = **c;
    const std::uint32_t n = comm.size(), r = comm.rank();
    if (mode == "exit") {
      float x = 1, y = 0;
      auto one = [&] {
        return comm
            .all_reduce(std::as_bytes(std::span(&x, 1)), std::as_writable_bytes(std::span(&y, 1)), DType::F32,
                        ReduceOp::Sum, {.timeout = std::chrono::seconds(20)})
            .wait();
      };
      expect(one().has_value(), "the call before the exit");
      if (job->rank == job->size - 1) _exit(3);
      const auto s = one();
      expect(!s && s.error().code() == Errc::PeerLost &&
                 s.error().message().find(str_format("(world {})", job->size - 1)) != std::string::npos,
             s ? "the call without the exited rank succeeded" : "not PeerLost naming it: " + s.error().message());
      if (!failures) std::printf("mesh-launch rank %u: lost rank OK (%s)\n", job->rank, s.error().message().c_str());
      return failures ? 1 : 0;
    }
    for (DType t : kTypes)
      for (ReduceOp op : kOps)
        for (std::size_t count : {std::size_t{3}, std::size_t{40'001}}) {
          const auto mine = encode(inputs(r, count, t), t);
          std::vector<std::byte> out(mine.size());
          auto s = comm.all_reduce(mine, out, t, op).wait();
          expect(s && out == expected(n, count, t, op),
                 str_format("all_reduce {} {} {} on {}", to_string(t), to_string(op), count, g->name));
          const auto big = encode(inputs(r, count * n, t), t);
          const auto want = expected(n, count * n, t, op);
          std::vector<std::byte> block(mine.size());
          s = comm.reduce_scatter(big, block, t, op).wait();
          expect(
              s && std::equal(block.begin(), block.end(), want.begin() + static_cast<std::ptrdiff_t>(r * block.size())),
              str_format("reduce_scatter {} {} {} on {}", to_string(t), to_string(op), count, g->name));
        }
    const auto mine = encode(inputs(r, 5000, DType::I32), DType::I32);
    std::vector<std::byte> all(mine.size() * n);
    const auto want = gathered(n, 5000, DType::I32);
    expect(comm.all_gather(mine, all, DType::I32).wait() && all == want, "all_gather on " + g->name);
    auto buf = r == n - 1 ? mine : std::vector<std::byte>(mine.size());
    expect(comm.broadcast(buf, n - 1, DType::I32).wait() && buf == encode(inputs(n - 1, 5000, DType::I32), DType::I32),
           "broadcast on " + g->name);
    expect(comm.barrier().wait().has_value(), "barrier on " + g->name);
    std::vector<std::byte> in(mine.size());
    auto sent = comm.send(mine, (r + 1) % n, 1);
    expect(comm.recv(in, (r + n - 1) % n, 1).wait() && sent.wait() &&
               in == encode(inputs((r + n - 1) % n, 5000, DType::I32), DType::I32),
           "send/recv ring on " + g->name);
  }
  if (!failures) std::printf("mesh-launch rank %u: OK (%zu groups)\n", job->rank, mesh->groups().size());
  return failures ? 1 : 0;
}
