// SPDX-License-Identifier: MIT
#pragma once
// The device mesh of an MPI job: its ranks, their hosts and devices, and the communicators of
// its groups on the native backend (shared memory inside a host, MPI between hosts' leaders) or
// on the MPI backend (the MPI library's own collectives).
#include "lavaflow/mesh/mesh.hpp"
#include "lavaflow/mpi/mpi.hpp"

namespace lavaflow::mesh {

/// The mesh of the job behind `comm`: rank i's host and devices are comm.location(i). Groups start
/// with "world", on `backend`.
[[nodiscard]] Result<DeviceMesh> mesh_from_mpi(const mpi::Communicator& comm, Backend backend = Backend::Native);

struct MpiGroupOptions {
  std::uint64_t chunk_bytes = 1 << 20;  ///< the native backend's staging per rank and step
  std::uint64_t arena_bytes = 0;        ///< the native backend's memory per rank for Communicator::allocate
  Duration open_timeout = std::chrono::seconds(30);
};

/// The backends mpi_communicators() opens in this build: native and mpi, and gloo where Gloo was
/// found.
[[nodiscard]] std::vector<Backend> mpi_backends();

/// Opens group communicators among the ranks of `comm` (which must outlive them) on the Native
/// and Mpi backends; other backends are Unsupported, naming the one asked for. Opening is
/// collective over the group's ranks: each of them opens the group, and opens its groups in the
/// same order as the others.
///
/// The native backend's leaders and the MPI backend call MPI from whichever thread waits on a
/// call: a program that also calls MPI from other threads initialises MPI_THREAD_MULTIPLE. The
/// Gloo backend runs Gloo's blocking calls on a thread per communicator and meets through files in
/// the temporary directory (which must be one that all of the group's hosts see).
[[nodiscard]] CommunicatorFactory mpi_communicators(const mpi::Communicator& comm, MpiGroupOptions options = {});

}  // namespace lavaflow::mesh
