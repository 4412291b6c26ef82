// SPDX-License-Identifier: MIT
// A peer rank that dies: run under `mpiexec -n 2` with the launcher told to leave the survivor
// running (MPICH: -disable-auto-cleanup). Rank 1 takes two messages on a remote channel, sends one
// back and exits without MPI_Finalize. Rank 0's waits on it — a loan on the full ring, a receive, a
// flush — must end in Errc::PeerLost naming rank 1 within a few seconds of a 60-second timeout,
// after taking in the message rank 1 sent before it exited. Rank 0 prints "mpi-peer-exit: OK" and
// leaves without MPI_Finalize (whose barrier the dead rank would never join).
#include <mpi.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstring>
#include <string>

#include "expect.hpp"
#include "lavaflow/mpi/mpi.hpp"

using namespace lavaflow;
using namespace std::chrono_literals;
using Clock = std::chrono::steady_clock;

namespace {

using lftest::expect;
using lftest::failures;

/// `r` failed with PeerLost naming rank 1, and soon (the timeout is a minute).
template <class R>
void expect_lost(const R& r, Clock::time_point since, const std::string& what) {
  const double s = std::chrono::duration<double>(Clock::now() - since).count();
  const std::string got = r ? std::string("success") : r.error().message();
  expect(!r && r.error().code() == Errc::PeerLost && got.find("rank 1") != std::string::npos && s < 10,
         what + ": PeerLost naming rank 1 within 10 s (got '" + got + "' after " + std::to_string(s) + " s)");
  std::printf("%s: %s after %.3f s\n", what.c_str(), got.c_str(), s);
}

}  // namespace

int main(int argc, char** argv) {
  MPI_Init(&argc, &argv);
  auto comm = mpi::Communicator::create();
  if (!comm || comm->size() != 2) {
    std::fprintf(stderr, "mpi-peer-exit needs exactly 2 ranks\n");
    MPI_Abort(MPI_COMM_WORLD, 2);
  }
  const mpi::ChannelOptions out{.slots = 4, .slot_size = 64, .channel = 3, .transport = TransportKind::Mpi},
      back{.slots = 4, .slot_size = 64, .channel = 4, .transport = TransportKind::Mpi};
  if (comm->rank() == 1) {
    auto q = mpi::open_consumer(*comm, 0, out);
    auto p = mpi::open_producer(*comm, 0, back);
    if (!q || !p) _exit(3);
    for (int i = 0; i < 2; ++i) {
      auto r = (*q)->receive(60s);
      if (!r) _exit(4);
      r->release();
    }
    auto loan = (*p)->loan(60s);
    if (!loan) _exit(5);
    std::memcpy(loan->bytes().data(), "last", 4);
    if (!(*p)->publish(std::move(*loan), {.size = 4})) _exit(6);
    _exit(0);  // gone, without a word to MPI
  }
  expect(comm->watches(1), "rank 1 runs on this kernel: it is watched");
  expect(!comm->watches(0), "a rank does not watch itself");
  expect(bool(comm->check_alive(1)), "rank 1 is alive at first");
  auto p = mpi::open_producer(*comm, 1, out);
  auto q = mpi::open_consumer(*comm, 1, back);
  expect(p && q, "channels to and from rank 1");
  if (p && q) {
    // Rank 1 takes two messages and exits: the ring (4) fills and the next loan waits for a rank
    // that is gone.
    auto t0 = Clock::now();
    int sent = 0;
    for (;;) {
      auto loan = (*p)->loan(60s);
      if (!loan) {
        expect_lost(loan, t0, "loan on a full ring");
        break;
      }
      if (!(*p)->publish(std::move(*loan), {.size = 8})) break;
      ++sent;
    }
    expect(sent == 6, "6 messages sent before the ring stayed full (got " + std::to_string(sent) + ")");
    auto alive = comm->check_alive(1);
    expect(!alive && alive.error().code() == Errc::PeerLost, "check_alive(1) says PeerLost once it has exited");
    auto last = (*q)->receive(60s);
    expect(last && last->bytes().size() == 4 && std::memcmp(last->bytes().data(), "last", 4) == 0,
           "the message rank 1 sent before exiting is received");
    if (last) last->release();
    t0 = Clock::now();
    expect_lost((*q)->receive(60s), t0, "receive from the exited rank");
    t0 = Clock::now();
    expect_lost((*p)->flush(60s), t0, "flush towards the exited rank");
  }
  std::printf(failures == 0 ? "mpi-peer-exit: OK\n" : "mpi-peer-exit: FAILED (%d)\n", failures);
  std::fflush(stdout);
  std::fflush(stderr);
  _exit(failures == 0 ? 0 : 1);  // no MPI_Finalize: rank 1 will never join its barrier
}
