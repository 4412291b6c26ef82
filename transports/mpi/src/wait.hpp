// SPDX-License-Identifier: MIT
#pragma once
// Private to lavaflow::mpi: MPI calls as Status, and waits on MPI through the library's one wait loop.
#include <poll.h>
#include <time.h>

#include "lavaflow/core/detail/wait.hpp"
#include "lavaflow/mpi/mpi.hpp"

namespace lavaflow::mpi::detail {

inline Status check(int rc, const char* call) {
  if (rc == MPI_SUCCESS) return {};
  return std::unexpected(to_error(rc, call));
}

/// A pidfd turns readable when its process exits.
inline bool exited(const UniqueFd& pidfd) {
  if (!pidfd) return false;
  pollfd p{pidfd.get(), POLLIN, 0};
  return ::poll(&p, 1, 0) > 0 && (p.revents & POLLIN) != 0;
}

/// The process of the rank at the other end of a channel, where this process can watch it
/// (Communicator::watch).
struct PeerWatch {
  UniqueFd exit;
  int rank = -1, channel = 0;
  std::int32_t pid = 0;
  PeerWatch() = default;
  PeerWatch(const Communicator& comm, int peer, int ch)
      : exit(comm.watch(peer)), rank(peer), channel(ch), pid(comm.location(peer).pid) {}
};

/// Polls `done` (returns Result<bool>) until true or `timeout`, through the library's one wait
/// loop (detail::wait_for): spinning, then (unless busy-polling) napping 20 µs between tests — MPI
/// has no blocking wait with a timeout. A busy poll reads the clock every 16th test (the first read
/// starts the timeout): a clock read costs as much as a small message's hand-off, and a spin
/// loop's reaction time grows with it; an MPI_Test costs more than a clock read, so other modes
/// read it every test.
/// `what` makes the timeout's message — only when it happens (formatting costs more than a message).
/// With a `watch`, a wait that lasts looks once a millisecond whether the peer's process has
/// exited: then what it sent before is taken in (a few more tests), and if that is not enough the
/// wait ends in Errc::PeerLost instead of running into its timeout.
template <class F, class W>
inline Status poll_until(F&& done, Duration timeout, WaitMode mode, Errc on_timeout, W&& what,
                         const PeerWatch* watch = nullptr) {
  auto peer_gone = [&]() -> Result<bool> {
    if (!watch || !exited(watch->exit)) return false;
    for (int k = 0; k < 1000; ++k) {
      LF_TRY(bool late, done());
      if (late) return true;
    }
    return fail(Errc::PeerLost, "lavaflow::mpi",
                str_format("rank {} (pid {}) has exited: channel {} gets no answer from it", watch->rank, watch->pid,
                           watch->channel));
  };
  const lavaflow::detail::SpinPlan plan{.clock_every = mode == WaitMode::BusyPoll ? 16u : 1u,
                                        .relax = false,
                                        .check_every = std::chrono::milliseconds(1)};
  return lavaflow::detail::wait_for(done, peer_gone, lavaflow::detail::Nap{std::chrono::microseconds(20)}, mode,
                                    timeout, plan, [&] { return Error(on_timeout, "lavaflow::mpi", what()); });
}

/// Whether MPI_Finalize has run: then no MPI call may be made (and no request is pending any more).
inline bool mpi_finalized() {
  int done = 0;
  MPI_Finalized(&done);
  return done != 0;
}

inline Result<bool> test(MPI_Request& r, MPI_Status* st, const char* call) {
  int flag = 0;
  LF_TRY_STATUS(check(MPI_Test(&r, &flag, st ? st : MPI_STATUS_IGNORE), call));
  return flag != 0;
}

inline void cancel(MPI_Request& r) {
  if (r == MPI_REQUEST_NULL) return;
  MPI_Cancel(&r);
  MPI_Wait(&r, MPI_STATUS_IGNORE);
}

/// Waits up to `limit` for `r`; cancels it when it does not complete (peer gone).
inline void finish_or_cancel(MPI_Request& r, Duration limit) {
  if (r == MPI_REQUEST_NULL) return;
  auto finished = [&] {
    int flag = 0;
    return MPI_Test(&r, &flag, MPI_STATUS_IGNORE) != MPI_SUCCESS || flag != 0;
  };
  const auto waited = lavaflow::detail::wait_for(finished, lavaflow::detail::never_stop,
                                                 lavaflow::detail::Nap{std::chrono::microseconds(50)}, WaitMode::Block,
                                                 limit, {}, [] { return Error(Errc::Timeout, "lavaflow::mpi", ""); });
  if (!waited) cancel(r);
}

}  // namespace lavaflow::mpi::detail
