// SPDX-License-Identifier: MIT
#include "lavaflow/transports/transport.hpp"

#include "lavaflow/core/detail/format.hpp"

namespace lavaflow {

std::string_view to_string(TransportKind kind) noexcept {
  switch (kind) {
    case TransportKind::Shm:
      return "shm";
    case TransportKind::Vulkan:
      return "vulkan";
    case TransportKind::Mpi:
      return "mpi";
  }
  return "unknown";
}

Result<TransportKind> parse_transport(std::string_view name) {
  for (auto k : {TransportKind::Shm, TransportKind::Vulkan, TransportKind::Mpi})
    if (name == to_string(k)) return k;
  return fail(Errc::InvalidArgument, "transport", str_format("\"{}\": not one of shm, vulkan, mpi", name));
}

Result<RouteDecision> choose_route(const TransportSet& set, const ProcessLocation& me,
                                   const std::optional<ProcessLocation>& peer, const TransportEnv& env,
                                   std::optional<TransportKind> forced) {
  constexpr const char* call = "choose_route";
  if (set.empty()) return fail(Errc::InvalidArgument, call, "no transports to choose from");
  if (peer && detect_scope(me, *peer).scope == Scope::Remote) {
    bool any_remote = false;
    for (const auto& t : set) any_remote |= t->kind() == TransportKind::Mpi;
    if (!any_remote)
      return fail(Errc::Unreachable, call,
                  str_format("peer is remote ({}) and the remote (MPI) transport is not built or not given",
                             detect_scope(me, *peer).reason));
  }
  std::string refusals;
  for (const auto& t : set) {
    if (forced && t->kind() != *forced) continue;
    auto probe = t->can_connect(me, peer, env);
    if (probe.ok) {
      std::string why = forced ? str_format("forced; {}", probe.reason) : probe.reason;
      if (!refusals.empty()) why += str_format(" (not taken: {})", refusals);
      return RouteDecision{t, std::move(why)};
    }
    if (forced)
      return fail(Errc::Unsupported, call,
                  str_format("transport {} was forced but cannot connect: {}", to_string(*forced), probe.reason));
    refusals += str_format("{}{}: {}", refusals.empty() ? "" : "; ", t->name(), probe.reason);
  }
  if (forced)
    return fail(Errc::NotFound, call, str_format("transport {} was forced but not given", to_string(*forced)));
  return fail(Errc::Unsupported, call, str_format("no transport can connect: {}", refusals));
}

}  // namespace lavaflow
