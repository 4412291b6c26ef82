// SPDX-License-Identifier: MIT
#pragma once
// The NCCL backend of the mesh: a process group's collectives and point-to-point calls on CUDA
// device memory through NVIDIA's NCCL, behind the same Communicator as every other backend. The
// group's ranks meet through a communicator of another backend (the job's native or MPI group),
// which carries NCCL's unique id once; NCCL then runs on its own (NVLink, PCIe, the network).
#include <cuda_runtime_api.h>

#include <memory>

#include "lavaflow/mesh/collectives.hpp"
#include "lavaflow/mesh/mesh.hpp"

namespace lavaflow::mesh {

struct NcclOptions {
  /// This rank's CUDA device; -1: the current one. NCCL takes one device per rank: two ranks of a
  /// group on one device are refused by NCCL when the group opens.
  int device = -1;
  /// The stream every call is enqueued on (the caller's, so that the calls are ordered with its
  /// kernels; it must outlive the communicator and every Work); null: a non-blocking stream of the
  /// communicator's own, which is not ordered with the legacy default stream.
  cudaStream_t stream = nullptr;
  /// How long opening waits for the group's ranks (the unique id, then NCCL's own set-up), and how
  /// long closing lets NCCL flush before it aborts.
  Duration open_timeout = std::chrono::seconds(60);
  /// false: the calls go to a blocking NCCL communicator (split from the non-blocking one that
  /// opening makes), which enqueues a call in NCCL's own time. true: every call stays
  /// non-blocking, so no host call of the backend waits past its timeout, at the price of a
  /// thread that NCCL starts for each call (tens of microseconds a call).
  bool nonblocking = false;
};

/// Rank `bootstrap.rank()`'s NCCL communicator for the group of `bootstrap` (any backend; used only
/// while opening, to give every rank group rank 0's unique id). Collective over the group.
///
/// Buffers are CUDA device or managed memory of this rank's device: host memory (pageable or
/// pinned), another device's memory, spans that run past their allocation and send/recv that
/// overlap other than in NCCL's in-place layouts are refused before NCCL sees them, and such a
/// refusal leaves the communicator as it was. A collective checks its arguments, enqueues on the
/// stream and returns a Work that ends when the stream passes the call.
///
/// Timeouts: the backend has no thread of its own, so a call's timeout is enforced while its Work
/// is waited for or tested. Past it the NCCL communicator is aborted (NCCL cannot tell which rank
/// is missing, and its kernels would wait for ever): the call, every other call not yet seen to
/// end, and every later call fail, with Timeout naming the group. Any error NCCL reports ends the
/// communicator the same way. A call's time counts from when it is made, also while it waits
/// behind earlier work on the stream. Opening is bounded by `open_timeout`. NCCL connects ranks at
/// the first call that needs a connection, and a blocking communicator (the default) waits for the
/// peer's side on the calling thread there: opening makes the connections of a small all_reduce
/// (and, in groups of up to 8 ranks, of sends and receives between every pair) while every rank is
/// opening, on the bounded communicator first. A later call that needs a connection not made yet
/// (an algorithm NCCL picks only for larger calls, a send to a peer of a larger group) waits for
/// that peer without a bound if the peer is alive but never makes its call (a peer that exits
/// ends the wait with an error); with `nonblocking` that wait too ends at the call's timeout.
///
/// Sends and receives wait on the host until one of them is waited for or tested, or the next
/// collective is made, and then go to the stream together as one NCCL group (a send and the
/// receive that answers it, each alone on one stream, would wait for each other): work enqueued on
/// the stream before that does not see a receive's data. They match in order between two ranks
/// (NCCL carries no tags: only tag 0 is taken) and must have the same length: a mismatch ends both
/// at their timeout.
///
/// NCCL's arithmetic is its own: f16 and bf16 are reduced in their own type (the host backends
/// widen them to f32), Average on floating types multiplies each input by 1/n before summing, and
/// Min and Max return the number where one side is NaN (the host backends return NaN). For two
/// ranks and values that stay in range these give the host backends' results; for more ranks
/// f16/bf16 sums may differ by a few units in the last place. Integer Average sums with wrapping,
/// then divides with truncation, as the other backends do.
[[nodiscard]] Result<std::unique_ptr<Communicator>> open_nccl(Communicator& bootstrap, NcclOptions options = {});

/// Opens the groups whose backend is Nccl through `bootstrap` (which opens the same group on its
/// own backend, e.g. launched_communicators() or mpi_communicators(), for the unique id) and NCCL;
/// groups on other backends go to `bootstrap` itself.
[[nodiscard]] CommunicatorFactory nccl_communicators(CommunicatorFactory bootstrap, Backend bootstrap_backend,
                                                     NcclOptions options = {});

}  // namespace lavaflow::mesh
