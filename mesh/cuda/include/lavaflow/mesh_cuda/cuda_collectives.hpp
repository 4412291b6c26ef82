// SPDX-License-Identifier: MIT
#pragma once
// Collectives on CUDA device memory as GPU kernels, for the ranks of a group on one host (one GPU
// per rank, or several ranks on one GPU). Each rank's staging lives in CUDA memory that every
// peer maps (CUDA IPC, peer access over NVLink/PCIe), and the kernels synchronise through flags in
// that memory: a call is enqueued on the caller's stream and returns at once, with no host round
// trip, and can be captured in a CUDA graph. Design note 0019 gives the algorithms.
#include <cuda_runtime_api.h>

#include <cstdint>
#include <memory>

#include "lavaflow/mesh/collectives.hpp"

namespace lavaflow::mesh {

struct CudaCollectiveOptions {
  /// The CUDA device of this rank; -1: the current one.
  int device = -1;
  /// Staging per rank and step: a power of two, 64 KiB … 256 MiB. Each rank holds two such
  /// buffers; larger steps mean fewer synchronisations per call, which large calls feel (see
  /// `lavaflow-bench device-collectives --chunk-bytes`).
  std::uint64_t chunk_bytes = 16 << 20;
  Duration attach_timeout = std::chrono::seconds(30);
};

/// One rank's CUDA collectives over `host`'s group, whose ranks must all run on this host.
/// Calls are collective and in the same order on every rank, each on one stream of its rank
/// (calls on a rank must not run concurrently: they share its staging). A call checks its
/// arguments and enqueues its kernel; the kernel waits for each peer at most CallOptions::timeout.
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
  /// CUDA IPC handles and maps every peer's. Unsupported when the group spans hosts, when the
  /// ranks sharing a GPU need more blocks of the kernel at once than it holds, or when a peer's
  /// memory cannot be mapped (naming the rank and why). `host` must outlive the result.
  [[nodiscard]] static Result<std::unique_ptr<CudaCollectives>> open(Communicator& host, CudaCollectiveOptions options);
  virtual ~CudaCollectives() = default;

  [[nodiscard]] virtual std::uint32_t rank() const = 0;
  [[nodiscard]] virtual std::uint32_t size() const = 0;
  [[nodiscard]] virtual int device() const = 0;

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

  /// The first failure of a call whose kernel has run, if any (does not wait for the GPU).
  [[nodiscard]] virtual Status check() const = 0;
};

}  // namespace lavaflow::mesh
