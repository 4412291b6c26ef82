// SPDX-License-Identifier: MIT
#include "lavaflow/mesh/launch.hpp"

#include <unistd.h>

#include <charconv>
#include <cstdlib>
#include <map>
#include <memory>

#include "lavaflow/core/detail/format.hpp"
#include "lavaflow/mesh/native.hpp"

namespace lavaflow::mesh {

namespace {

Result<std::uint32_t> number(const char* name, std::uint32_t max) {
  const char* v = std::getenv(name);
  if (!v)
    return fail(Errc::NotFound, "mesh::launched_job",
                str_format("{} is not set: not started by lavaflow-launch", name));
  std::uint32_t out = 0;
  const std::string_view s(v);
  auto [end, ec] = std::from_chars(s.data(), s.data() + s.size(), out);
  if (ec != std::errc() || end != s.data() + s.size() || out > max)
    return fail(Errc::Malformed, "mesh::launched_job",
                str_format("{}='{}' is not a number from 0 to {}", name, s, max));
  return out;
}

}  // namespace

Result<LaunchedJob> launched_job() {
  LaunchedJob job;
  LF_TRY(job.size, number("LAVAFLOW_WORLD_SIZE", 1024));
  LF_TRY(job.rank, number("LAVAFLOW_RANK", 1023));
  if (job.size == 0 || job.rank >= job.size)
    return fail(Errc::Malformed, "mesh::launched_job",
                str_format("LAVAFLOW_RANK={} is not a rank of LAVAFLOW_WORLD_SIZE={}", job.rank, job.size));
  const char* key = std::getenv("LAVAFLOW_JOB");
  if (!key)
    return fail(Errc::NotFound, "mesh::launched_job", "LAVAFLOW_JOB is not set: not started by lavaflow-launch");
  job.key = key;
  if (job.key.empty() || job.key.size() > 100 ||
      job.key.find_first_not_of("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789-_.") !=
          std::string::npos)
    return fail(Errc::Malformed, "mesh::launched_job",
                str_format("LAVAFLOW_JOB='{}' is not 1 to 100 letters, digits, '-', '_' or '.'", job.key));
  return job;
}

Result<DeviceMesh> mesh_from_launch(const LaunchedJob& job, std::vector<DeviceInfo> devices) {
  char host[256] = {};
  ::gethostname(host, sizeof host - 1);
  std::vector<RankInfo> ranks(job.size, RankInfo{host, {}});
  ranks[job.rank].devices = std::move(devices);
  return DeviceMesh::create(job.rank, std::move(ranks), Backend::Native);
}

CommunicatorFactory launched_communicators(const LaunchedJob& job, std::uint64_t chunk_bytes) {
  // Every rank opens its groups in the same order, so the n-th opening of a name is the same
  // group everywhere: the count keeps a group opened twice apart from its first segment.
  auto opened = std::make_shared<std::map<std::string, std::uint32_t>>();
  return [job, chunk_bytes, opened](const ProcessGroup& group,
                                    std::uint32_t world_rank) -> Result<std::unique_ptr<Communicator>> {
    constexpr const char* call = "mesh::launched_communicators";
    if (group.backend != Backend::Native)
      return fail(Errc::Unsupported, call,
                  str_format("group '{}' asks for the {} backend; a job started by lavaflow-launch opens native groups "
                             "(mpiexec starts jobs for the others)",
                             group.name, to_string(group.backend)));
    NativeOptions o;
    o.group = group.name;
    o.world_ranks = group.ranks;
    o.hosts.assign(group.ranks.size(), 0);
    o.chunk_bytes = chunk_bytes;
    bool member = false;
    for (std::uint32_t i = 0; i < group.ranks.size(); ++i) {
      if (group.ranks[i] >= job.size)
        return fail(Errc::InvalidArgument, call,
                    str_format("group '{}' names rank {} of a job of {}", group.name, group.ranks[i], job.size));
      if (group.ranks[i] == world_rank) {
        o.rank = i;
        member = true;
      }
    }
    if (!member)
      return fail(Errc::InvalidArgument, call, str_format("rank {} is not in group '{}'", world_rank, group.name));
    o.key = str_format("{}-{:x}-{}", job.key, name_hash(group.name), (*opened)[group.name]++);
    return open_native(std::move(o));
  };
}

}  // namespace lavaflow::mesh
