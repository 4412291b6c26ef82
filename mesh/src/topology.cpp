// SPDX-License-Identifier: MIT
#include "lavaflow/mesh/topology.hpp"

#include "lavaflow/core/detail/format.hpp"

namespace lavaflow::mesh {

namespace {

constexpr const char* kCall = "mesh::validate";

Status positive(std::uint32_t v, const char* what) {
  if (v == 0) return fail(Errc::InvalidArgument, kCall, str_format("{} must be at least 1", what));
  return {};
}

Status divides(std::uint32_t part, std::uint32_t world, const char* what) {
  if (world % part != 0)
    return fail(Errc::InvalidArgument, kCall,
                str_format("world size {} is not a multiple of the {} {}", world, what, part));
  return {};
}

}  // namespace

Result<Mixed> layout(const MeshTopology& topology, std::uint32_t world) {
  if (world == 0) return fail(Errc::InvalidArgument, kCall, "world size must be at least 1");
  if (const auto* tp = std::get_if<TensorParallel>(&topology)) {
    LF_TRY_STATUS(positive(tp->degree, "tensor-parallel degree"));
    const std::uint64_t shape = std::uint64_t{tp->mesh_shape[0]} * tp->mesh_shape[1];
    if (shape != tp->degree)
      return fail(Errc::InvalidArgument, kCall,
                  str_format("mesh shape {} × {} = {} does not match the tensor-parallel degree {}", tp->mesh_shape[0],
                             tp->mesh_shape[1], shape, tp->degree));
    LF_TRY_STATUS(divides(tp->degree, world, "tensor-parallel degree"));
    return Mixed{tp->degree, 1, world / tp->degree};
  }
  if (const auto* pp = std::get_if<PipelineParallel>(&topology)) {
    LF_TRY_STATUS(positive(pp->stages, "pipeline stage count"));
    LF_TRY_STATUS(divides(pp->stages, world, "pipeline stage count"));
    return Mixed{1, pp->stages, world / pp->stages};
  }
  if (const auto* m = std::get_if<Mixed>(&topology)) {
    LF_TRY_STATUS(positive(m->tp, "tp"));
    LF_TRY_STATUS(positive(m->pp, "pp"));
    LF_TRY_STATUS(positive(m->dp, "dp"));
    const std::uint64_t product = std::uint64_t{m->tp} * m->pp * m->dp;
    if (product != world)
      return fail(Errc::InvalidArgument, kCall,
                  str_format("tp × pp × dp = {} × {} × {} = {} does not match the world size {}", m->tp, m->pp, m->dp,
                             product, world));
    return *m;
  }
  return Mixed{1, 1, world};  // DataParallel
}

Status validate(const MeshTopology& topology, std::uint32_t world) {
  LF_TRY_STATUS(layout(topology, world));
  return {};
}

std::string to_string(const MeshTopology& topology) {
  if (const auto* tp = std::get_if<TensorParallel>(&topology))
    return str_format("tensor-parallel (degree {}, mesh {} × {})", tp->degree, tp->mesh_shape[0], tp->mesh_shape[1]);
  if (const auto* pp = std::get_if<PipelineParallel>(&topology))
    return str_format("pipeline-parallel ({} stages)", pp->stages);
  if (const auto* m = std::get_if<Mixed>(&topology))
    return str_format("mixed (tp {}, pp {}, dp {})", m->tp, m->pp, m->dp);
  return "data-parallel";
}

Result<std::vector<GroupSpec>> topology_groups(const MeshTopology& topology, std::uint32_t world) {
  LF_TRY(const Mixed m, layout(topology, world));
  auto rank = [&](std::uint32_t replica, std::uint32_t stage, std::uint32_t shard) {
    return (replica * m.pp + stage) * m.tp + shard;
  };
  std::vector<GroupSpec> groups;
  if (m.tp > 1)
    for (std::uint32_t r = 0; r < m.dp; ++r)
      for (std::uint32_t s = 0; s < m.pp; ++s) {
        GroupSpec g{str_format("tp_{}", groups.size()), {}};
        for (std::uint32_t k = 0; k < m.tp; ++k) g.ranks.push_back(rank(r, s, k));
        groups.push_back(std::move(g));
      }
  const std::size_t first_pp = groups.size();
  if (m.pp > 1)
    for (std::uint32_t r = 0; r < m.dp; ++r)
      for (std::uint32_t k = 0; k < m.tp; ++k) {
        GroupSpec g{str_format("pp_{}", groups.size() - first_pp), {}};
        for (std::uint32_t s = 0; s < m.pp; ++s) g.ranks.push_back(rank(r, s, k));
        groups.push_back(std::move(g));
      }
  const std::size_t first_dp = groups.size();
  if (m.dp > 1)
    for (std::uint32_t s = 0; s < m.pp; ++s)
      for (std::uint32_t k = 0; k < m.tp; ++k) {
        GroupSpec g{str_format("dp_{}", groups.size() - first_dp), {}};
        for (std::uint32_t r = 0; r < m.dp; ++r) g.ranks.push_back(rank(r, s, k));
        groups.push_back(std::move(g));
      }
  return groups;
}

}  // namespace lavaflow::mesh
