// SPDX-License-Identifier: MIT
// lavaflow-bench-device-collectives — run by `lavaflow-bench device-collectives` under
// lavaflow-launch: collectives on GPU buffers, every size from 8 B to --max-size (bytes per rank),
// all_reduce / all_gather / reduce_scatter / broadcast, f32 and bf16 (reductions in sum).
//   --backend vulkan  VulkanCollectives (reduction in a compute shader over the shared segment:
//                     "lavaflow-vulkan" on what open() chose, and "lavaflow-vulkan-host" on host
//                     memory when it chose the device's own) against the same calls staged
//                     through host memory and the native host collective ("staged": what a
//                     program without GPU collectives does).
//   --backend cuda    CudaCollectives (kernels over the peers' mapped staging), with and without
//                     CUDA graphs, against NCCL where built ("nccl", "nccl-graph") and against
//                     the staged path (cudaMemcpy, native host collective, cudaMemcpy);
//                     "lavaflow-staged": CudaCollectives on the path a group spanning hosts
//                     takes (pinned slots, pipelined pieces, the native host collective);
//                     "lavaflow-window": large calls in a registered window: all_gather and
//                     broadcast into it, which the peers write in place; reduce_scatter from it,
//                     which reads the peers' inputs where they are.
//   --hosts H         (cuda) the ranks on H simulated hosts, in rank order: "lavaflow" is then the
//                     hierarchical path (in-host phases as kernels, the hosts' exchange staged) and
//                     its baseline "lavaflow-staged" (every call staged whole); no graph rows.
// A row's p50/p99 are over rounds of calls; each round's time is the slowest rank's. busbw
// follows NCCL's convention: all_reduce size/t × 2(n−1)/n; all_gather and reduce_scatter
// n·size/t × (n−1)/n; broadcast size/t. Rows of calls enqueued on a stream (CUDA) also give the
// host's time to enqueue a call ("enqueue_ns"). Rank 0 prints a table, or with --json
// {"results":[{"name","op","dtype","size","ranks","p50_ns","p99_ns","busbw_gbps"[,"enqueue_ns"]}…],
// "ratios":[…]}.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "cli.hpp"
#include "lavaflow/core/detail/format.hpp"
#include "lavaflow/core/transfer.hpp"
#include "lavaflow/mesh/launch.hpp"
#include "lavaflow/mesh/vulkan.hpp"
#if LAVAFLOW_BENCH_DEVICE_CUDA
#include <cuda_runtime_api.h>

#include "lavaflow/mesh_cuda/cuda_collectives.hpp"
#endif
#if LAVAFLOW_BENCH_NCCL
#include <nccl.h>
#endif

using namespace lavaflow;
using namespace lavaflow::mesh;

namespace {

struct Row {
  std::string name, op, dtype;
  std::uint64_t size = 0;
  std::uint32_t ranks = 0;
  double p50_ns = 0, p99_ns = 0, busbw_gbps = 0;
  /// Calls enqueued on a stream: the host's time to enqueue one (p50 over rounds, the slowest
  /// rank's). Where it is near p50_ns the calls wait for the host, not the GPU.
  double enqueue_ns = 0;
};

enum class Op { AllReduce, AllGather, ReduceScatter, Broadcast };
constexpr Op kOps[] = {Op::AllReduce, Op::AllGather, Op::ReduceScatter, Op::Broadcast};
const char* op_name(Op op) {
  switch (op) {
    case Op::AllReduce:
      return "all_reduce";
    case Op::AllGather:
      return "all_gather";
    case Op::ReduceScatter:
      return "reduce_scatter";
    default:
      return "broadcast";
  }
}

int calls_for(std::uint64_t size) {
  if (size <= (64u << 10)) return 200;
  if (size <= (4u << 20)) return 40;
  return size <= (64u << 20) ? 8 : 3;
}

Row summarize(std::string name, Op op, DType t, std::uint64_t size, std::uint32_t n, std::vector<double> ns) {
  std::sort(ns.begin(), ns.end());
  const double p50 = ns[ns.size() / 2], p99 = ns[std::min(ns.size() - 1, ns.size() * 99 / 100)];
  const double per_rank = double(size) / p50;  // bytes per ns = GB/s
  double bus = per_rank;
  if (op == Op::AllReduce) bus = per_rank * 2.0 * (n - 1) / n;
  if (op == Op::AllGather || op == Op::ReduceScatter) bus = per_rank * (n - 1);
  return Row{std::move(name), op_name(op), std::string(to_string(t)), size, n, p50, p99, bus};
}

/// The slowest rank's value of each round (on every rank).
std::vector<double> slowest(Communicator& host, const std::vector<double>& mine) {
  std::vector<std::int64_t> v(mine.begin(), mine.end()), out(mine.size());
  if (!host.all_reduce(std::as_bytes(std::span(v)), std::as_writable_bytes(std::span(out)), DType::I64, ReduceOp::Max)
           .wait())
    return {};
  return {out.begin(), out.end()};
}

/// Bytes each buffer needs for `op` at `size` bytes per rank.
std::uint64_t send_bytes(Op op, std::uint64_t size, std::uint32_t n) {
  return op == Op::ReduceScatter ? size * n : size;
}
std::uint64_t recv_bytes(Op op, std::uint64_t size, std::uint32_t n) { return op == Op::AllGather ? size * n : size; }

/// Runs `call` (one collective, synchronous) `calls` times per round, 5 rounds after a warm-up.
template <class Call>
std::vector<double> time_sync(Communicator& host, int calls, Call&& call) {
  for (int w = 0; w < 2; ++w)
    if (!call()) return {};
  std::vector<double> mine;
  for (int round = 0; round < 5; ++round) {
    if (!host.barrier().wait()) return {};
    const auto t0 = std::chrono::steady_clock::now();
    for (int i = 0; i < calls; ++i)
      if (!call()) return {};
    mine.push_back(double(std::chrono::nanoseconds(std::chrono::steady_clock::now() - t0).count()) / calls);
  }
  return slowest(host, mine);
}

int run_vulkan(Communicator& host, const LaunchedJob& job, std::uint64_t max_size, std::vector<Row>& rows) {
  auto ctx = VulkanContext::create();
  if (!ctx) return std::printf("LAVAFLOW-SKIP: device-collectives: %s\n", ctx.error().message().c_str()), 77;
  auto shared = VulkanCollectives::open(*ctx, host, {.key = job.key + "-bench-vk"});
  auto staged = VulkanCollectives::open(*ctx, host, {.key = job.key + "-bench-vk-staged", .stage_through_host = true});
  if (!shared || !staged) {
    std::fprintf(stderr, "lavaflow-bench device-collectives: %s\n",
                 (shared ? staged.error() : shared.error()).message().c_str());
    return 1;
  }
  if (host.rank() == 0)
    std::fprintf(stderr, "lavaflow-bench device-collectives: vulkan segment: %s (%s)\n",
                 std::string(to_string((*shared)->segment())).c_str(), (*shared)->segment_reason().c_str());
  // Ranks on one device share its memory; the host-memory segment that any mix of devices uses
  // is measured beside it.
  std::unique_ptr<VulkanCollectives> hosted;
  if ((*shared)->segment() == VulkanSegment::DeviceMemory) {
    auto h =
        VulkanCollectives::open(*ctx, host, {.key = job.key + "-bench-vk-host", .segment = VulkanSegment::HostMemory});
    if (!h) return std::fprintf(stderr, "lavaflow-bench device-collectives: %s\n", h.error().message().c_str()), 1;
    hosted = std::move(*h);
  }
  const std::uint32_t n = host.size();
  for (std::uint64_t size = 8; size <= max_size; size = size * 4 > max_size && size < max_size ? max_size : size * 4) {
    auto send = GpuBuffer::allocate(*ctx, {.size = size * n});
    auto recv = GpuBuffer::allocate(*ctx, {.size = size * n});
    if (!send || !recv) return std::fprintf(stderr, "lavaflow-bench device-collectives: allocation failed\n"), 1;
    for (DType t : {DType::F32, DType::BF16})
      for (Op op : kOps) {
        if (t == DType::BF16 && (op == Op::AllGather || op == Op::Broadcast)) continue;  // the same bytes as f32
        auto one = [&](VulkanCollectives& c) {
          const auto s = device_span(*send, send_bytes(op, size, n));
          const auto r = device_span(*recv, recv_bytes(op, size, n));
          switch (op) {
            case Op::AllReduce:
              return c.all_reduce(s, r, t, ReduceOp::Sum).has_value();
            case Op::AllGather:
              return c.all_gather(s, r, t).has_value();
            case Op::ReduceScatter:
              return c.reduce_scatter(s, r, t, ReduceOp::Sum).has_value();
            default:
              return c.broadcast(r, 0, t).has_value();
          }
        };
        const int calls = std::max(1, calls_for(size) / 5);
        auto ours = time_sync(host, calls, [&] { return one(**shared); });
        auto base = time_sync(host, calls, [&] { return one(**staged); });
        auto in_host = hosted ? time_sync(host, calls, [&] { return one(*hosted); }) : std::vector<double>{};
        if (ours.empty() || base.empty() || (hosted && in_host.empty()))
          return std::fprintf(stderr, "lavaflow-bench device-collectives: %s failed\n", op_name(op)), 1;
        rows.push_back(summarize("lavaflow-vulkan", op, t, size, n, ours));
        if (hosted) rows.push_back(summarize("lavaflow-vulkan-host", op, t, size, n, in_host));
        rows.push_back(summarize("staged", op, t, size, n, base));
      }
    if (size == max_size) break;
  }
  return 0;
}

#if LAVAFLOW_BENCH_DEVICE_CUDA
/// Per call, each round: the stream's time, and the host's time to enqueue.
struct Streamed {
  std::vector<double> ns, enqueue_ns;
  [[nodiscard]] bool empty() const { return ns.empty(); }
};

Row summarize(std::string name, Op op, DType t, std::uint64_t size, std::uint32_t n, Streamed s) {
  Row r = summarize(std::move(name), op, t, size, n, std::move(s.ns));
  std::sort(s.enqueue_ns.begin(), s.enqueue_ns.end());
  r.enqueue_ns = s.enqueue_ns[s.enqueue_ns.size() / 2];
  return r;
}

/// Times `calls` enqueued calls per round on `stream` (one graph of them with `graph`).
template <class Enqueue>
Streamed time_stream(Communicator& host, cudaStream_t stream, int calls, bool graph, Enqueue&& enqueue) {
  for (int w = 0; w < 2; ++w)
    if (!enqueue()) return {};
  if (cudaStreamSynchronize(stream) != cudaSuccess) return {};
  cudaGraphExec_t exec = nullptr;
  if (graph) {
    cudaGraph_t g = nullptr;
    if (cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal) != cudaSuccess) return {};
    bool ok = true;
    for (int i = 0; i < calls; ++i) ok = ok && enqueue();
    if (cudaStreamEndCapture(stream, &g) != cudaSuccess || !ok) return {};
    const bool made = cudaGraphInstantiate(&exec, g, 0) == cudaSuccess;
    (void)cudaGraphDestroy(g);
    if (!made) return {};
  }
  cudaEvent_t start = nullptr, stop = nullptr;
  (void)cudaEventCreate(&start);
  (void)cudaEventCreate(&stop);
  std::vector<double> mine, enqueued;
  for (int round = 0; round < 5; ++round) {
    if (!host.barrier().wait()) break;
    const auto t0 = std::chrono::steady_clock::now();
    (void)cudaEventRecord(start, stream);
    bool ok = true;
    if (graph)
      ok = cudaGraphLaunch(exec, stream) == cudaSuccess;
    else
      for (int i = 0; i < calls; ++i) ok = ok && enqueue();
    (void)cudaEventRecord(stop, stream);
    enqueued.push_back(std::chrono::duration<double, std::nano>(std::chrono::steady_clock::now() - t0).count() / calls);
    if (!ok || cudaEventSynchronize(stop) != cudaSuccess) break;
    float ms = 0;
    (void)cudaEventElapsedTime(&ms, start, stop);
    mine.push_back(double(ms) * 1e6 / calls);
  }
  (void)cudaEventDestroy(start);
  (void)cudaEventDestroy(stop);
  if (exec) (void)cudaGraphExecDestroy(exec);
  if (mine.size() != 5) return {};
  Streamed s{slowest(host, mine), slowest(host, enqueued)};
  if (s.ns.empty() || s.enqueue_ns.empty()) return {};
  return s;
}

/// Calls of at least this size per rank run in a window in the "lavaflow-window" rows (smaller
/// calls take the staging or LL lines either way).
constexpr std::uint64_t kWindowFrom = 16 << 20;

int run_cuda(Communicator& host, const ProcessGroup& world, const LaunchedJob& job, std::uint64_t max_size,
             std::uint64_t chunk, bool with_staged, std::uint32_t hosts, std::vector<Row>& rows) {
  int devices = 0;
  if (cudaGetDeviceCount(&devices) != cudaSuccess || devices == 0)
    return std::printf("LAVAFLOW-SKIP: device-collectives: no CUDA device\n"), 77;
  const std::uint32_t n = host.size(), me = host.rank();
  const int device = static_cast<int>(me % static_cast<std::uint32_t>(devices));
  (void)cudaSetDevice(device);
  CudaCollectiveOptions options{.device = device};
  if (chunk) options.chunk_bytes = chunk;
  if (hosts > 1) {
    options.host = str_format("bench-{}", me * hosts / n);
    options.open_group = subgroups(world, me, launched_communicators(job, 4u << 20));
  }
  auto c = CudaCollectives::open(host, options);
  if (!c) return std::fprintf(stderr, "lavaflow-bench device-collectives: %s\n", c.error().message().c_str()), 1;
  // The path a group spanning hosts takes (pinned slots, pipelined pieces), on this host.
  auto piped = !with_staged ? decltype(c)(nullptr)
                            : CudaCollectives::open(host, CudaCollectiveOptions{.device = device,
                                                                                .chunk_bytes = chunk ? chunk : 16 << 20,
                                                                                .stage_through_host = true});
  if (!piped)
    return std::fprintf(stderr, "lavaflow-bench device-collectives: %s\n", piped.error().message().c_str()), 1;
  cudaStream_t stream = nullptr;
  (void)cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking);
#if LAVAFLOW_BENCH_NCCL
  ncclComm_t nccl = nullptr;
  ncclUniqueId id{};
  if (me == 0) (void)ncclGetUniqueId(&id);
  std::span<std::byte> idb(reinterpret_cast<std::byte*>(&id), sizeof id);
  if (!host.broadcast(idb, 0, DType::U8).wait() ||
      ncclCommInitRank(&nccl, static_cast<int>(n), id, static_cast<int>(me)) != ncclSuccess) {
    std::fprintf(stderr,
                 "lavaflow-bench device-collectives: NCCL did not start (one GPU per rank?): rows without it\n");
    nccl = nullptr;
  }
#endif
  // A registered window as large as the largest output or reduce_scatter input: the
  // "lavaflow-window" rows. Registered on every rank or refused on
  // every rank (after a failed cudaMalloc this rank registers nothing, which every rank hears of).
  void* window = nullptr;
  const bool windowed = max_size >= kWindowFrom && !(*c)->staged();
  if (windowed) {
    if (cudaMalloc(&window, max_size * n) != cudaSuccess) window = nullptr;
    auto s = (*c)->register_window(window, max_size * n);
    if (!s) return std::fprintf(stderr, "lavaflow-bench device-collectives: %s\n", s.error().message().c_str()), 1;
  }
  void *send = nullptr, *recv = nullptr;
  std::vector<std::byte> host_buf;
  for (std::uint64_t size = 8; size <= max_size; size = size * 4 > max_size && size < max_size ? max_size : size * 4) {
    (void)cudaFree(send);
    (void)cudaFree(recv);
    if (cudaMalloc(&send, size * n) != cudaSuccess || cudaMalloc(&recv, size * n) != cudaSuccess)
      return std::fprintf(stderr, "lavaflow-bench device-collectives: cudaMalloc of %llu bytes failed\n",
                          static_cast<unsigned long long>(size * n)),
             1;
    (void)cudaMemset(send, 0, size * n);
    host_buf.resize(size * n);
    for (DType t : {DType::F32, DType::BF16})
      for (Op op : kOps) {
        if (t == DType::BF16 && (op == Op::AllGather || op == Op::Broadcast)) continue;
        const std::uint64_t sb = send_bytes(op, size, n), rb = recv_bytes(op, size, n);
        auto call = [&](CudaCollectives& on) {
          switch (op) {
            case Op::AllReduce:
              return on.all_reduce(send, recv, size, t, ReduceOp::Sum, stream).has_value();
            case Op::AllGather:
              return on.all_gather(send, recv, size, t, stream).has_value();
            case Op::ReduceScatter:
              return on.reduce_scatter(send, recv, size, t, ReduceOp::Sum, stream).has_value();
            default:
              return on.broadcast(recv, size, 0, t, stream).has_value();
          }
        };
        auto ours = [&] { return call(**c); };
        const int calls = std::max(1, calls_for(size) / 5);
        auto plain = time_stream(host, stream, calls, false, ours);
        // A group spanning hosts waits on the host for the hosts' exchange: no graphs.
        auto graphed = (*c)->staged() ? Streamed{} : time_stream(host, stream, calls, true, ours);
        // Staged: the data through host memory and the native host collective.
        auto staged = !with_staged ? std::vector<double>{} : time_sync(host, calls, [&] {
          if (cudaMemcpy(host_buf.data(), send, sb, cudaMemcpyDeviceToHost) != cudaSuccess) return false;
          auto in = std::span(host_buf.data(), sb);
          auto out = std::span(host_buf.data(), rb);
          std::vector<std::byte> tmp;
          bool ok = false;
          switch (op) {
            case Op::AllReduce:
              ok = host.all_reduce(in, out, t, ReduceOp::Sum).wait().has_value();
              break;
            case Op::AllGather:
              tmp.assign(in.begin(), in.end());
              ok = host.all_gather(tmp, out, t).wait().has_value();
              break;
            case Op::ReduceScatter:
              tmp.resize(rb);
              ok = host.reduce_scatter(in, tmp, t, ReduceOp::Sum).wait().has_value();
              out = std::span(tmp);
              break;
            default:
              ok = host.broadcast(out, 0, t).wait().has_value();
          }
          return ok && cudaMemcpy(recv, out.data(), rb, cudaMemcpyHostToDevice) == cudaSuccess;
        });
        auto pipelined = !with_staged ? std::vector<double>{} : time_sync(host, calls, [&] {
          return call(**piped) && cudaStreamSynchronize(stream) == cudaSuccess;
        });
        if (plain.empty() || (graphed.empty() && !(*c)->staged()) ||
            (with_staged && (staged.empty() || pipelined.empty())) || !(*c)->check())
          return std::fprintf(stderr, "lavaflow-bench device-collectives: %s of %llu bytes failed: %s\n", op_name(op),
                              static_cast<unsigned long long>(size),
                              (*c)->check() ? "" : (*c)->check().error().message().c_str()),
                 1;
        rows.push_back(summarize("lavaflow", op, t, size, n, plain));
        if (!graphed.empty()) rows.push_back(summarize("lavaflow-graph", op, t, size, n, graphed));
        if (windowed && size >= kWindowFrom && op != Op::AllReduce) {
          auto in_window = [&] {
            auto* w = static_cast<std::byte*>(window);
            switch (op) {
              case Op::AllGather:
                return (*c)->all_gather(send, w, size, t, stream).has_value();
              case Op::ReduceScatter:
                return (*c)->reduce_scatter(w, recv, size, t, ReduceOp::Sum, stream).has_value();
              default:
                return (*c)->broadcast(w, size, 0, t, stream).has_value();
            }
          };
          auto wp = time_stream(host, stream, calls, false, in_window);
          auto wg = time_stream(host, stream, calls, true, in_window);
          if (wp.empty() || wg.empty() || !(*c)->check())
            return std::fprintf(stderr, "lavaflow-bench device-collectives: %s of %llu bytes in a window failed\n",
                                op_name(op), static_cast<unsigned long long>(size)),
                   1;
          rows.push_back(summarize("lavaflow-window", op, t, size, n, wp));
          rows.push_back(summarize("lavaflow-window-graph", op, t, size, n, wg));
        }
        if (with_staged) rows.push_back(summarize("staged", op, t, size, n, staged));
        if (with_staged) rows.push_back(summarize("lavaflow-staged", op, t, size, n, pipelined));
#if LAVAFLOW_BENCH_NCCL
        if (nccl) {
          const ncclDataType_t nt = t == DType::F32 ? ncclFloat32 : ncclBfloat16;
          const std::size_t count = size / size_of(t);
          auto theirs = [&] {
            switch (op) {
              case Op::AllReduce:
                return ncclAllReduce(send, recv, count, nt, ncclSum, nccl, stream) == ncclSuccess;
              case Op::AllGather:
                return ncclAllGather(send, recv, count, nt, nccl, stream) == ncclSuccess;
              case Op::ReduceScatter:
                return ncclReduceScatter(send, recv, count, nt, ncclSum, nccl, stream) == ncclSuccess;
              default:
                return ncclBroadcast(recv, recv, count, nt, 0, nccl, stream) == ncclSuccess;
            }
          };
          auto np = time_stream(host, stream, calls, false, theirs);
          auto ng = time_stream(host, stream, calls, true, theirs);
          if (!np.empty()) rows.push_back(summarize("nccl", op, t, size, n, np));
          if (!ng.empty()) rows.push_back(summarize("nccl-graph", op, t, size, n, ng));
        }
#endif
      }
    if (size == max_size) break;
  }
  (void)cudaFree(send);
  (void)cudaFree(recv);
  c->reset();  // the window stays mapped in the peers while the communicator lives
  (void)cudaFree(window);
#if LAVAFLOW_BENCH_NCCL
  if (nccl) (void)ncclCommDestroy(nccl);
#endif
  (void)cudaStreamDestroy(stream);
  return 0;
}
#endif

const Row* find(const std::vector<Row>& rows, const std::string& name, const Row& like) {
  for (const auto& r : rows)
    if (r.name == name && r.op == like.op && r.dtype == like.dtype && r.size == like.size) return &r;
  return nullptr;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"lavaflow-bench-device-collectives: collectives on GPU buffers, under lavaflow-launch"};
  std::string backend = "vulkan";
  std::uint64_t max_size = 0;
  bool json = false;
  app.add_option("--backend", backend, "vulkan or cuda")->check(CLI::IsMember({"vulkan", "cuda"}));
  lfapp::add_whole(app, "--max-size", max_size, "largest size, bytes per rank (default 16 MiB vulkan, 256 MiB cuda)", 8,
                   1u << 30);
  app.add_flag("--json", json, "JSON rows");
  std::uint64_t chunk = 0;
  lfapp::add_whole(app, "--chunk-bytes", chunk, "cuda: staging per rank and step (0: the library's default)", 0,
                   256u << 20);
  bool no_staged = false;
  app.add_flag("--no-staged", no_staged,
               "cuda: leave out the staged rows (slow at large sizes; NCCL is the baseline where it runs)");
  std::uint32_t hosts = 1;
  lfapp::add_whole(app, "--hosts", hosts, "cuda: simulated hosts (ranks in rank order)", 1, 8);
  if (auto rc = lfapp::parse(app, argc, argv)) return *rc;
  if (max_size == 0) max_size = backend == "vulkan" ? (16u << 20) : (256u << 20);
  auto job = launched_job();
  if (!job) {
    std::fprintf(stderr, "lavaflow-bench device-collectives: %s (run it through `lavaflow-bench device-collectives`)\n",
                 job.error().message().c_str());
    return 2;
  }
  auto mesh = mesh_from_launch(*job);
  auto host = mesh ? mesh->communicator("world", launched_communicators(*job, 4u << 20))
                   : Result<std::unique_ptr<Communicator>>(std::unexpected(mesh.error()));
  if (!host) return std::fprintf(stderr, "lavaflow-bench device-collectives: %s\n", host.error().message().c_str()), 1;
  std::vector<Row> rows;
  int rc = 0;
  if (backend == "vulkan") {
    rc = run_vulkan(**host, *job, max_size, rows);
  } else {
#if LAVAFLOW_BENCH_DEVICE_CUDA
    rc = run_cuda(**host, **mesh->get_group("world"), *job, max_size, chunk, !no_staged, hosts, rows);
#else
    std::printf("LAVAFLOW-SKIP: device-collectives: the CUDA collectives are not built (LAVAFLOW_WITH_CUDA)\n");
    rc = 77;
#endif
  }
  if (rc != 0 || job->rank != 0) return rc;
  // Ratios against the baselines of the same run: NCCL where it ran, else the staged path.
  nlohmann::json targets = nlohmann::json::array();
  for (const auto& r : rows) {
    if (r.name != "lavaflow" && r.name != "lavaflow-vulkan" && r.name != "lavaflow-vulkan-host" &&
        r.name != "lavaflow-graph" && r.name != "lavaflow-staged" && !r.name.starts_with("lavaflow-window"))
      continue;
    // The staged path's pipelining is measured against the plain staged calls.
    // With simulated hosts the hierarchical calls against the same group staged whole.
    const std::string base = r.name.ends_with("-graph")          ? "nccl-graph"
                             : r.name == "lavaflow-staged"       ? "staged"
                             : hosts > 1 && r.name == "lavaflow" ? "lavaflow-staged"
                             : find(rows, "nccl", r)             ? "nccl"
                                                                 : "staged";
    const Row* b = find(rows, base, r);
    if (!b) continue;
    targets.push_back({{"name", str_format("{} {} {} B {} vs {}", r.op, r.dtype, r.size, r.name, base)},
                       {"busbw_ratio", r.busbw_gbps / b->busbw_gbps},
                       {"p50_ratio", r.p50_ns / b->p50_ns}});
  }
  if (json) {
    nlohmann::json out = {{"results", nlohmann::json::array()}, {"ratios", targets}};
    for (const auto& r : rows) {
      out["results"].push_back({{"name", r.name},
                                {"op", r.op},
                                {"dtype", r.dtype},
                                {"size", r.size},
                                {"ranks", r.ranks},
                                {"p50_ns", r.p50_ns},
                                {"p99_ns", r.p99_ns},
                                {"busbw_gbps", r.busbw_gbps}});
      if (r.enqueue_ns > 0) out["results"].back()["enqueue_ns"] = r.enqueue_ns;
    }
    std::puts(out.dump().c_str());
    return 0;
  }
  std::printf("lavaflow-bench device-collectives: %u ranks, %s backend, sum\n", (*host)->size(), backend.c_str());
  std::printf("%-15s %-5s %10s %-15s %12s %12s %10s %11s\n", "op", "type", "size", "name", "p50 us", "p99 us",
              "busbw GB/s", "enqueue us");
  for (const auto& r : rows) {
    std::printf("%-15s %-5s %10llu %-15s %12.2f %12.2f %10.3f", r.op.c_str(), r.dtype.c_str(),
                static_cast<unsigned long long>(r.size), r.name.c_str(), r.p50_ns / 1e3, r.p99_ns / 1e3, r.busbw_gbps);
    if (r.enqueue_ns > 0)
      std::printf(" %11.2f\n", r.enqueue_ns / 1e3);
    else
      std::printf("\n");
  }
  return 0;
}
