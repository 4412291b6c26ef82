// SPDX-License-Identifier: MIT
#include "lavaflow/core/transport.hpp"

#include "lavaflow/core/format.hpp"

namespace lavaflow {

Result<RouteDecision> choose_route(const TransportSet& set, const ProcessLocation& me,
                                   const std::optional<ProcessLocation>& peer, const TransportEnv& env,
                                   std::string_view forced) {
  constexpr const char* call = "choose_route";
  if (set.empty()) return fail(Errc::InvalidArgument, call, "no transports given (pass lavaflow::local_transports())");
  if (peer && detect_scope(me, *peer).scope == Scope::Remote) {
    bool any_remote = false;
    for (const auto& t : set) any_remote |= t->name() == "mpi";
    if (!any_remote)
      return fail(Errc::Unreachable, call,
                  str_format("peer is remote ({}) and the remote (MPI) transport is not built or not given",
                         detect_scope(me, *peer).reason));
  }
  std::string refusals;
  for (const auto& t : set) {
    if (!forced.empty() && t->name() != forced) continue;
    auto probe = t->can_connect(me, peer, env);
    if (probe.ok) {
      std::string why = forced.empty() ? probe.reason : str_format("forced; {}", probe.reason);
      if (!refusals.empty()) why += str_format(" (not taken: {})", refusals);
      return RouteDecision{t, std::move(why)};
    }
    if (!forced.empty())
      return fail(Errc::Unsupported, call, str_format("transport {} was forced but cannot connect: {}", forced, probe.reason));
    refusals += str_format("{}{}: {}", refusals.empty() ? "" : "; ", t->name(), probe.reason);
  }
  if (!forced.empty()) return fail(Errc::NotFound, call, str_format("no transport named {}", forced));
  return fail(Errc::Unsupported, call, str_format("no transport can connect: {}", refusals));
}

}  // namespace lavaflow
