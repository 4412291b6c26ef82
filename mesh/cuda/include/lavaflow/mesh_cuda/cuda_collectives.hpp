// SPDX-License-Identifier: MIT
#pragma once
// Collectives on CUDA device memory. For the ranks of a group on one host (one GPU per rank, or
// several ranks on one GPU) they are GPU kernels: each rank's staging lives in CUDA memory that
// every peer maps (CUDA IPC, peer access over NVLink/PCIe), and the kernels synchronise through
// flags in that memory, so a call is enqueued on the caller's stream and returns at once, with no
// host round trip, and can be captured in a CUDA graph. A group that spans hosts is hierarchical
// where it can open its subgroups (CudaCollectiveOptions::open_group): each host's phases are
// those kernels, and only the exchange between hosts stages through pinned host memory; else, and
// for small calls, it stages whole through pinned host memory in pipelined pieces and the group's
// host collective carries the exchange (the native backend's hierarchical scheme). Design note
// 0019 gives the algorithms.
#include <cuda_runtime_api.h>

#include <cstdint>
#include <memory>
#include <string>

#include "lavaflow/mesh/collectives.hpp"

namespace lavaflow::mesh {

struct CudaCollectiveOptions {
  /// The CUDA device of this rank; -1: the current one.
  int device = -1;
  /// Staging per rank and step: a power of two, 64 KiB … 256 MiB. Each rank holds two such
  /// buffers; larger steps mean fewer synchronisations per call, which large calls feel (see
  /// `lavaflow-bench device-collectives --chunk-bytes`).
  std::uint64_t chunk_bytes = 16 << 20;
  /// Stage every call through this rank's pinned host memory (two slots of `chunk_bytes`) and the
  /// host communicator's collective, as a group that spans hosts does (chosen then whatever this
  /// says). Every rank must say the same.
  bool stage_through_host = false;
  Duration attach_timeout = std::chrono::seconds(30);
  /// For a group that spans hosts: opens the communicators of its subgroups (each host's ranks, and
  /// the ranks of each local index across hosts). Given, and with every host holding the same
  /// number of the group's ranks (two or more), calls are hierarchical: their in-host phases are
  /// kernels over the peers' mapped memory and only the exchange between hosts stages through host
  /// memory (see note 0019). Without it such a group stages every call whole.
  SubgroupOpener open_group;
  /// This rank's host, for tests that simulate hosts on one machine: ranks that name the same host
  /// share one. Empty: the machine's own (hostname and boot id).
  std::string host;
};

/// One rank's CUDA collectives over `host`'s group. Calls are collective and in the same order on
/// every rank, each on one stream of its rank (calls on a rank must not run concurrently: they
/// share its staging). A call checks its arguments and enqueues its kernel; the kernel waits for
/// each peer at most CallOptions::timeout.
///
/// Staged (a group spanning hosts, or `stage_through_host`): a call waits on the host for the
/// stream's work before it, carries its pieces through the host collective and returns once the
/// last piece's copy back is enqueued; it cannot be captured in a CUDA graph (Unsupported). Each
/// piece waits for the peers at most CallOptions::timeout; ranks whose calls differ get
/// InvalidArgument. A failure (a peer lost, late or making another call: the host communicator's
/// error) is the call's result, and check() and every later call report it.
///
/// Hierarchical (a group spanning hosts, opened with open_group): the same, but a call's in-host
/// phases are kernels and it waits on the host only around the exchange between hosts. Between a
/// phase of one level and the next, the ranks concerned tell each other on the host whether their
/// part succeeded and which call they make, so a failure on one host is every host's call's result
/// (PeerLost naming the rank), and so is a call that differs between hosts in type, op or length
/// where both take the hierarchical path (InvalidArgument naming both calls). Each phase waits as
/// the paths it uses do (an in-host phase the call's timeout, an exchange a timeout per staged
/// piece); a boundary waits for the phase before it on the peers, and one timeout and two seconds
/// more. Errors from a phase name the subgroup (e.g. "rank 1 of group 'world[2,3]'": the group's
/// rank 3). f16 and bf16 sums, products and averages cross the levels in f32 and round once;
/// averages divide once. Scratch device memory comes from a pool of the object's own, kept until
/// it ends: up to (size() + hosts) × bytes per call, 3 × size() × bytes for an f16 or bf16
/// reduce_scatter that sums (note 0019 gives each call's). Where the levels cannot be opened on
/// every rank, every call stages whole and path_reason() says why.
///
/// A failure in a kernel (a peer that does not arrive, a peer whose call differs, a peer that
/// failed) ends that call and every later one at once on the GPU, and check() reports it. A call
/// refused on some ranks only (arguments that differ between ranks) is not made there: the
/// others' kernels wait for it until their timeout, as with any rank that skips a call — give
/// every rank the same arguments. Calls on different streams are ordered by the class; replays of
/// calls captured in a CUDA graph are ordered only by the streams they run on: replay a graph on
/// the stream of the rank's calls around it, or order the streams with events, and destroy the
/// object after the replays have run.
class CudaCollectives {
 public:
  /// Collective over the group's ranks (through `host`): allocates this rank's staging, exchanges
  /// CUDA IPC handles and maps every peer's (staged: allocates its pinned slots). Unsupported when
  /// the ranks sharing a GPU need more blocks of the kernel at once than it holds, or when a
  /// peer's memory cannot be mapped (naming the rank and why); InvalidArgument when ranks open
  /// with different options. `host` must outlive the result.
  [[nodiscard]] static Result<std::unique_ptr<CudaCollectives>> open(Communicator& host, CudaCollectiveOptions options);
  virtual ~CudaCollectives() = default;

  [[nodiscard]] virtual std::uint32_t rank() const = 0;
  [[nodiscard]] virtual std::uint32_t size() const = 0;
  [[nodiscard]] virtual int device() const = 0;
  /// Whether calls pass through host memory (whole, or for the exchange between hosts), and why
  /// this path was taken. Such calls cannot be captured in a CUDA graph.
  [[nodiscard]] virtual bool staged() const = 0;
  /// Whether calls are hierarchical: in-host phases as kernels, the hosts' exchange staged.
  [[nodiscard]] virtual bool hierarchical() const = 0;
  [[nodiscard]] virtual const std::string& path_reason() const = 0;

  /// recv = op over every rank's send (`bytes` each; send may be recv).
  [[nodiscard]] virtual Status all_reduce(const void* send, void* recv, std::uint64_t bytes, DType type, ReduceOp op,
                                          cudaStream_t stream, CallOptions options = {}) = 0;
  /// recv (size × bytes) = every rank's send (`bytes`), in rank order.
  [[nodiscard]] virtual Status all_gather(const void* send, void* recv, std::uint64_t bytes, DType type,
                                          cudaStream_t stream, CallOptions options = {}) = 0;
  /// recv (`bytes`) = this rank's block of op over every rank's send (size × bytes).
  [[nodiscard]] virtual Status reduce_scatter(const void* send, void* recv, std::uint64_t bytes, DType type,
                                              ReduceOp op, cudaStream_t stream, CallOptions options = {}) = 0;
  /// Every rank's `bytes` at buffer become root's.
  [[nodiscard]] virtual Status broadcast(void* buffer, std::uint64_t bytes, std::uint32_t root, DType type,
                                         cudaStream_t stream, CallOptions options = {}) = 0;

  /// Registers this rank's CUDA memory [base, base + bytes) as a window, collectively: every rank
  /// registers one of the same size, in the same order. A large all_gather or broadcast (note 0019
  /// gives the size) whose output lies in a window at the same offset on every rank is written by
  /// the peers straight into that output: no staging and no steps — where every rank's window and
  /// the offset start on 16 bytes and an all_gather's `bytes` is a multiple of 16 (others take the
  /// staging). Likewise a large reduce_scatter whose input lies in a window (its `bytes` a
  /// multiple of 16): each rank reduces its block reading its peers' inputs where they are. (An
  /// all_reduce takes the staging: reading the peers' inputs measured no faster on NVLink.) A
  /// window buffer must lie so on every rank or on none (ranks that take different paths made
  /// different calls: InvalidArgument from check()). A send buffer not on 16 bytes is still
  /// correct there, but crosses the link in the narrower words (8, 4 or 1 bytes) its address
  /// allows. After a failed call into a window, peers that had seen every rank enter it may still
  /// be reading its input or writing its output until their kernels end: destroy the object
  /// (which waits for every rank's work) before reusing the memory.
  /// The memory must be `cudaMalloc` memory of this rank's device, which CUDA IPC maps,
  /// and stay allocated until deregister_window() or the object's end. InvalidArgument: memory
  /// that is not that, a window overlapping another, sizes that differ between ranks, more than 32
  /// windows at once. Unsupported: on the staged path (peers on other hosts cannot map it) or when
  /// a peer cannot map it. PeerLost/Timeout: a peer did not register in `options.timeout`.
  [[nodiscard]] virtual Status register_window(void* base, std::uint64_t bytes, CallOptions options = {}) = 0;
  /// Ends the window that starts at `base`, collectively (every rank its own, in the same order):
  /// waits for every rank's last call enqueued on a stream, and returns once every rank has unmapped
  /// its peers' windows — the memory may then be freed. Graphs holding calls into the window must
  /// not be replayed after it. NotFound on every rank when a rank has no window there (or cannot
  /// make its device current); Timeout on every rank when a rank's last call does not end in
  /// `options.timeout` (every rank keeps the window). The destructor also waits for every rank
  /// before it unmaps; when a peer is lost it leaves everything mapped, and windows must then stay
  /// allocated.
  [[nodiscard]] virtual Status deregister_window(void* base, CallOptions options = {}) = 0;

  /// The first failure of a call whose kernel has run, if any (does not wait for the GPU).
  [[nodiscard]] virtual Status check() const = 0;
};

}  // namespace lavaflow::mesh
