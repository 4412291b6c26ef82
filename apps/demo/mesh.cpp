// SPDX-License-Identifier: MIT
// lavaflow-demo mesh — under `mpiexec -n N`: every rank opens a channel to every other rank, each
// routed by lavaflow::mpi (same host: Vulkan IPC or shared memory; other host: MPI), streams COUNT
// messages with sequence numbers and checksums, and verifies what it receives. Then the job's device
// mesh (lavaflow::mesh_mpi): its topology, hosts, devices and groups, each group on its backend,
// and one all_reduce per group, checked on every rank. Rank 0 prints the route table, the mesh and
// the result; the exit status is non-zero on any loss, corruption or wrong sum.
#include "mesh.hpp"

#include <cstdio>
#include <cstring>
#include <memory>
#include <optional>
#include <vector>

#include "lavaflow/core/detail/format.hpp"
#include "lavaflow/lavaflow.hpp"
#include "lavaflow/mesh_mpi/mesh_mpi.hpp"
#include "lavaflow/mpi/mpi.hpp"
#include "payload.hpp"

namespace lfdemo {

using namespace lavaflow;

namespace {

struct Out {  // this rank → peer, whatever the route
  int peer = 0;
  std::unique_ptr<Producer> channel;
};
struct In {  // peer → this rank
  int peer = 0;
  std::unique_ptr<Consumer> channel;
};

Status send_one(Out& o, std::uint64_t seq, std::uint64_t size, std::vector<std::byte>& scratch,
                std::optional<Stager>& stager, const VulkanContext* vk) {
  constexpr auto kWait = std::chrono::seconds(60);
  scratch.resize(size);
  lfapp::fill_message(scratch, seq);
  const std::uint64_t sum = lfapp::checksum(scratch);
  LF_TRY(auto loan, o.channel->loan(kWait));
  if (auto b = loan.bytes(); !b.empty()) {
    std::memcpy(b.data(), scratch.data(), size);
  } else {  // a device-local Vulkan IPC ring (local route on a discrete GPU): upload
    if (!stager) {
      LF_TRY(auto s, Stager::create(*vk, o.channel->slot_size()));
      stager.emplace(std::move(s));
    }
    LF_TRY_STATUS(stager->upload(dynamic_cast<GpuBuffer&>(loan.buffer()), scratch));
  }
  LF_TRY(auto info, o.channel->publish(std::move(loan), {.size = size, .user_tag = sum}));
  (void)info;
  return {};
}

Status receive_one(In& in, std::uint64_t seq, std::vector<std::byte>& scratch, std::optional<Stager>& stager) {
  constexpr auto kWait = std::chrono::seconds(60);
  LF_TRY(auto r, in.channel->receive(kWait));
  std::span<const std::byte> view = r.bytes();
  if (view.empty() && r.info().size > 0) {  // device-local ring: download
    if (!stager) {
      LF_TRY(auto s, Stager::create(*in.channel->vulkan(), in.channel->slot_size()));
      stager.emplace(std::move(s));
    }
    scratch.resize(r.info().size);
    LF_TRY_STATUS(stager->download(dynamic_cast<GpuBuffer&>(r.buffer()), scratch));
    view = scratch;
  }
  if (r.info().sequence != seq)
    return fail(Errc::Malformed, "mesh",
                str_format("from rank {}: message {} where {} was expected", in.peer, r.info().sequence, seq));
  if (!lfapp::matches(view, seq) || lfapp::checksum(view) != r.info().user_tag)
    return fail(Errc::Malformed, "mesh",
                str_format("from rank {}: message {} is corrupt (checksum mismatch)", in.peer, seq));
  return {};
}

Status run(const mpi::Communicator& comm, const VulkanContext* vk, std::uint64_t count, std::uint64_t size,
           std::uint64_t& received) {
  const int me = comm.rank(), n = comm.size();
  std::vector<Out> outs;
  std::vector<In> ins;
  // One channel per ordered pair, routed by the Communicator (the same code on every route).
  // Producers first (none of them waits), then consumers (each finds its producer announced).
  const mpi::ChannelOptions o{.slots = 8, .slot_size = size, .vulkan = vk, .connect_timeout = std::chrono::seconds(60)};
  for (int j = 0; j < n; ++j) {
    if (j == me) continue;
    LF_TRY(auto p, mpi::open_producer(comm, j, o));
    outs.push_back({j, std::move(p)});
  }
  for (int i = 0; i < n; ++i) {
    if (i == me) continue;
    LF_TRY(auto c, mpi::open_consumer(comm, i, o));
    ins.push_back({i, std::move(c)});
  }
  std::vector<std::byte> out_scratch, in_scratch;
  std::optional<Stager> up, down;
  for (std::uint64_t k = 0; k < count; ++k) {
    for (auto& out : outs) LF_TRY_STATUS(send_one(out, k, size, out_scratch, up, vk));
    for (auto& in : ins) {
      LF_TRY_STATUS(receive_one(in, k, in_scratch, down));
      ++received;
    }
  }
  // Everything this rank expects has arrived: close its consumers (a remote one hands back its
  // last credits), then wait until every peer has released what this rank sent.
  ins.clear();
  for (auto& out : outs) LF_TRY_STATUS(out.channel->flush(std::chrono::seconds(60)));
  return {};
}

/// The mesh of this job: tensor-parallel pairs where the world is even, one group per backend over
/// the whole world, and one all_reduce (sum of group rank + 1, as f32) per group this rank is in.
/// Prints the mesh (rank 0) and each group's result (its rank 0). Returns the groups that failed here.
int run_mesh(const mpi::Communicator& comm) {
  using namespace lavaflow::mesh;
  auto m = mesh_from_mpi(comm);
  if (!m) {
    std::fprintf(stderr, "mesh rank %d: FAILED: %s\n", comm.rank(), m.error().message().c_str());
    return 1;
  }
  const auto n = static_cast<std::uint32_t>(comm.size());
  if (n % 2 == 0 && n >= 4) {
    if (auto ok = m->with_topology(Mixed{2, 1, n / 2}); !ok) std::fprintf(stderr, "%s\n", ok.error().message().c_str());
  } else if (n % 2 == 0) {
    if (auto ok = m->with_topology(TensorParallel{2, {1, 2}}); !ok)
      std::fprintf(stderr, "%s\n", ok.error().message().c_str());
  }
  std::vector<std::uint32_t> all;
  for (std::uint32_t r = 0; r < n; ++r) all.push_back(r);
  for (Backend b : mpi_backends())
    if (b != Backend::Native) (void)m->add_group({str_format("world-{}", to_string(b)), all, b});
  if (comm.rank() == 0) {
    std::printf("%s", m->describe().c_str());
    std::fflush(stdout);
  }
  MPI_Barrier(comm.comm());
  int failed = 0;
  const auto open = mpi_communicators(comm);
  for (const ProcessGroup* g : m->groups()) {  // the same order on every rank
    if (!m->in_group(g->name)) continue;
    auto c = m->communicator(g->name, open);
    if (!c) {
      std::fprintf(stderr, "mesh rank %d: FAILED: group %s: %s\n", comm.rank(), g->name.c_str(),
                   c.error().message().c_str());
      ++failed;
      continue;
    }
    const float mine = static_cast<float>((*c)->rank() + 1);
    float sum = 0;
    const float want = static_cast<float>((*c)->size() * ((*c)->size() + 1) / 2);
    const auto t0 = Clock::now();
    auto ok = (*c)->all_reduce(std::as_bytes(std::span(&mine, 1)), std::as_writable_bytes(std::span(&sum, 1)),
                               DType::F32, ReduceOp::Sum)
                  .wait();
    const double us = std::chrono::duration<double, std::micro>(Clock::now() - t0).count();
    if (!ok || sum != want) {
      std::fprintf(stderr, "mesh rank %d: FAILED: all_reduce on %s: %s\n", comm.rank(), g->name.c_str(),
                   ok ? str_format("sum {} where {} was due", sum, want).c_str() : ok.error().message().c_str());
      ++failed;
    } else if ((*c)->rank() == 0) {
      std::printf("  all_reduce on %s (%s, %u ranks): sum %g, checked on every rank (%.1f us here)\n", g->name.c_str(),
                  (*c)->backend().data(), (*c)->size(), sum, us);
      std::fflush(stdout);
    }
  }
  return failed;
}

}  // namespace

int mesh_main(int argc, char** argv, std::uint64_t count, std::uint64_t size) {
  MPI_Init(&argc, &argv);
  int code = 0;
  {
    auto vk = VulkanContext::create();
    auto comm = mpi::Communicator::create(MPI_COMM_WORLD, {.vulkan = vk ? &*vk : nullptr});
    if (!comm) {
      std::fprintf(stderr, "mesh: %s\n", comm.error().message().c_str());
      MPI_Abort(MPI_COMM_WORLD, 1);
    }
    if (comm->rank() == 0) {
      std::printf("lavaflow-demo mesh: %d ranks, %llu messages of %llu bytes on every ordered pair\n", comm->size(),
                  static_cast<unsigned long long>(count), static_cast<unsigned long long>(size));
      for (int r = 0; r < comm->size(); ++r)
        std::printf("  rank %d: host %s, pid %d\n", r, comm->location(r).host.hostname.c_str(), comm->location(r).pid);
      std::printf("route table (producer -> consumer: transport — reason)\n");
      for (const auto& p : comm->routes())
        std::printf("  route %d -> %d: %s — %s\n", p.from, p.to, to_string(p.transport).data(), p.reason.c_str());
      const auto gpu = mpi::gpu_awareness();
      std::printf("MPI and GPU memory: %s (%s); remote GPU buffers go through pinned host memory\n",
                  gpu.cuda ? "CUDA-aware" : "not CUDA-aware", gpu.how.c_str());
      std::fflush(stdout);
    }
    std::uint64_t received = 0;
    auto ok = run(*comm, vk ? &*vk : nullptr, count, size, received);
    if (!ok) std::fprintf(stderr, "mesh rank %d: FAILED: %s\n", comm->rank(), ok.error().message().c_str());
    MPI_Barrier(comm->comm());
    int failed = (ok ? 0 : 1) + run_mesh(*comm), failures = 0;
    unsigned long long got = received, total = 0;
    MPI_Reduce(&failed, &failures, 1, MPI_INT, MPI_SUM, 0, comm->comm());
    MPI_Reduce(&got, &total, 1, MPI_UNSIGNED_LONG_LONG, MPI_SUM, 0, comm->comm());
    if (comm->rank() == 0) {
      const unsigned long long want = static_cast<unsigned long long>(comm->size()) * (comm->size() - 1) * count;
      if (failures == 0 && total == want)
        std::printf("mesh: OK — %llu messages verified on %d channels (none lost, duplicated, reordered or corrupt)\n",
                    total, comm->size() * (comm->size() - 1));
      else
        std::printf("mesh: FAILED — %d rank(s) failed, %llu of %llu messages verified\n", failures, total, want);
    }
    code = failures == 0 ? 0 : 1;
    MPI_Bcast(&code, 1, MPI_INT, 0, comm->comm());
  }
  MPI_Finalize();
  return code;
}

}  // namespace lfdemo
