// SPDX-License-Identifier: MIT
#pragma once
// Private to lavaflow::mpi: MPI calls as Status, and the wait loop of every remote-channel wait.
#include <poll.h>
#include <time.h>

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

/// Polls `done` (returns Result<bool>) until true or `timeout`: spinning, then (unless
/// busy-polling) sleeping 20 µs between tests — MPI has no blocking wait with a timeout.
/// The clock is read only every 16th test (the first read starts the timeout): a clock read costs
/// as much as a small message's hand-off on the fast path, and a spin loop's reaction time grows
/// with it.
/// `what` makes the timeout's message — only when it happens (formatting costs more than a message).
/// With a `watch`, a wait that lasts looks once a millisecond whether the peer's process has
/// exited: then what it sent before is taken in (a few more tests), and if that is not enough the
/// wait ends in Errc::PeerLost instead of running into its timeout.
template <class F, class W>
inline Status poll_until(F&& done, Duration timeout, WaitMode mode, Errc on_timeout, W&& what,
                         const PeerWatch* watch = nullptr) {
  LF_TRY(bool first, done());
  if (first) return {};
  if (timeout <= Duration::zero()) return fail(on_timeout, "lavaflow::mpi", what());
  Clock::time_point start{}, deadline{}, watched{};
  for (std::uint32_t tests = 1;; ++tests) {
    LF_TRY(bool ok, done());
    if (ok) return {};
    if (tests % 16 != 0 && mode == WaitMode::BusyPoll) continue;
    const auto now = Clock::now();
    if (start == Clock::time_point{}) {
      start = watched = now;
      deadline = Deadline(timeout, start).at();
    }
    if (watch && now - watched >= std::chrono::milliseconds(1)) {
      watched = now;
      if (exited(watch->exit)) {
        for (int k = 0; k < 1000; ++k) {
          LF_TRY(bool late, done());
          if (late) return {};
        }
        return fail(Errc::PeerLost, "lavaflow::mpi",
                    str_format("rank {} (pid {}) has exited: channel {} gets no answer from it", watch->rank,
                               watch->pid, watch->channel));
      }
    }
    if (now >= deadline) return fail(on_timeout, "lavaflow::mpi", what());
    if (mode != WaitMode::BusyPoll && now - start > std::chrono::microseconds(20)) {
      timespec ts{0, 20'000};
      ::nanosleep(&ts, nullptr);
    }
  }
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
  const auto end = Clock::now() + limit;
  int flag = 0;
  while (Clock::now() < end) {
    if (MPI_Test(&r, &flag, MPI_STATUS_IGNORE) != MPI_SUCCESS || flag) return;
    timespec ts{0, 50'000};
    ::nanosleep(&ts, nullptr);
  }
  cancel(r);
}

}  // namespace lavaflow::mpi::detail
