// SPDX-License-Identifier: MIT
#pragma once
// Jobs without MPI: ranks started on one host by lavaflow-launch, which tells each one its rank,
// the world size and a job key in its environment (LAVAFLOW_RANK, LAVAFLOW_WORLD_SIZE,
// LAVAFLOW_JOB). Their groups run on the native backend.
#include <cstdint>
#include <string>

#include "lavaflow/mesh/mesh.hpp"

namespace lavaflow::mesh {

struct LaunchedJob {
  std::uint32_t rank = 0, size = 1;
  std::string key;  ///< the same on every rank of the job, unique among jobs running at once
};

/// This process's place in a job started by lavaflow-launch; NotFound when it was not started by
/// it, Malformed (naming the variable) when the environment holds something else.
[[nodiscard]] Result<LaunchedJob> launched_job();

/// The job's mesh: every rank on this host, the devices given for this rank (others' are not
/// known without an exchange). Groups start with "world" on the native backend.
[[nodiscard]] Result<DeviceMesh> mesh_from_launch(const LaunchedJob& job, std::vector<DeviceInfo> devices = {});

/// Opens native communicators for the job's groups (collective over each group's ranks, opened in
/// the same order on every rank); groups on other backends are Unsupported.
[[nodiscard]] CommunicatorFactory launched_communicators(const LaunchedJob& job, std::uint64_t chunk_bytes = 1 << 20);

}  // namespace lavaflow::mesh
